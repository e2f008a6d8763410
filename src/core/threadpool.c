/* Fixed thread pool: one generation counter, one condition variable to wake
 * workers, an atomic task counter that they drain, and a count of workers
 * still busy for the caller to wait on. */
#define _GNU_SOURCE
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

struct mt_pool {
    int n_threads;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t wake;   /* workers wait here for a new generation */
    pthread_cond_t done;   /* the caller waits here for busy == 0 */
    unsigned generation;   /* guarded by mu; bumped per mt_pool_run */
    int stop;              /* guarded by mu */
    /* the current job */
    mt_pool_fn fn;
    void *ctx;
    size_t n_tasks;
    atomic_size_t next;
    atomic_int busy;
};

typedef struct { mt_pool *pool; int id; } worker_arg;

/* Subnormal floats make x86 arithmetic take microcode assists, tens of
 * times slower: a confident softmax fills the gradients of the logits with
 * them and training slowed to half speed. Pool work runs with
 * flush-to-zero and denormals-are-zero; the caller's own mode is restored
 * after each run. */
#if defined(__x86_64__) || defined(__i386__)
#define FTZ_DAZ 0x8040u
static unsigned fast_float_mode(void)
{
    unsigned old = _mm_getcsr();
    _mm_setcsr(old | FTZ_DAZ);
    return old;
}
static void restore_float_mode(unsigned old) { _mm_setcsr(old); }
#else
static unsigned fast_float_mode(void) { return 0; }
static void restore_float_mode(unsigned old) { (void)old; }
#endif

static void drain(mt_pool *p, int thread)
{
    for (;;) {
        size_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= p->n_tasks) break;
        p->fn(p->ctx, t, thread);
    }
}

static void *worker_main(void *argp)
{
    worker_arg a = *(worker_arg *)argp;
    free(argp);
    mt_pool *p = a.pool;
    unsigned seen = 0;
    (void)fast_float_mode(); /* the library's own thread: for good */
    for (;;) {
        pthread_mutex_lock(&p->mu);
        while (p->generation == seen && !p->stop) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) { pthread_mutex_unlock(&p->mu); break; }
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p, a.id);
        if (atomic_fetch_sub_explicit(&p->busy, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

static void pin_to(pthread_t t, int cpu)
{
    if (cpu < 0 || cpu >= CPU_SETSIZE) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    (void)pthread_setaffinity_np(t, sizeof set, &set); /* best effort */
}

mt_pool *mt_pool_create(int n_threads, const int *cpus)
{
    if (n_threads < 1) n_threads = 1;
    mt_pool *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->n_threads = 1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof *p->threads);
        if (!p->threads) { mt_pool_destroy(p); return NULL; }
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) { mt_pool_destroy(p); return NULL; }
        a->pool = p;
        a->id = i;
        if (pthread_create(&p->threads[i - 1], NULL, worker_main, a) != 0) {
            free(a);
            mt_pool_destroy(p);
            return NULL;
        }
        p->n_threads = i + 1;
        if (cpus) pin_to(p->threads[i - 1], cpus[i]);
    }
    return p;
}

void mt_pool_destroy(mt_pool *p)
{
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n_threads; i++) pthread_join(p->threads[i - 1], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

int mt_pool_size(const mt_pool *p) { return p ? p->n_threads : 1; }

void mt_pool_run(mt_pool *p, size_t n_tasks, mt_pool_fn fn, void *ctx)
{
    if (n_tasks == 0) return;
    const unsigned mode = fast_float_mode();
    if (!p || p->n_threads == 1 || n_tasks == 1) {
        for (size_t t = 0; t < n_tasks; t++) fn(ctx, t, 0);
        restore_float_mode(mode);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->n_tasks = n_tasks;
    atomic_store(&p->next, 0);
    atomic_store(&p->busy, p->n_threads - 1);
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    pthread_mutex_lock(&p->mu);
    while (atomic_load(&p->busy) != 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
    restore_float_mode(mode);
}

void mt_split_range(size_t n, size_t n_parts, size_t p, size_t align, size_t *lo, size_t *hi)
{
    if (align == 0) align = 1;
    size_t blocks = (n + align - 1) / align;
    size_t per = blocks / n_parts, extra = blocks % n_parts;
    size_t b0 = p * per + (p < extra ? p : extra);
    size_t b1 = b0 + per + (p < extra ? 1 : 0);
    *lo = b0 * align < n ? b0 * align : n;
    *hi = b1 * align < n ? b1 * align : n;
}
