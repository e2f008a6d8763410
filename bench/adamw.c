/* AdamW step throughput on the host.
 *
 *   adamw [--params N] [--threads LIST|max] [--iters K] [--isa NAME] [--grad bf16|fp32]
 *
 * N may be written 1073741824, 1<<30 or 1G (K, M, G are powers of 1024).
 * Defaults: 1<<30 parameters, threads 1, 2, 4, ... and the number of online
 * CPUs, 5 timed steps after one warm-up (the median is reported), the best
 * ISA, bf16 grads that arrive in the bf16 weight block and are overwritten by
 * the new weights (the library's layout: 14 bytes of state per parameter).
 *
 * For each thread count the arrays are mmap'ed afresh, advised to use
 * transparent huge pages and first touched by the pool threads that update
 * them (mt_adamw_share), the threads pinned to the first CPUs the process may
 * use. Each step also times the sum of squares of the grads that the global
 * norm needs ("norm ms"), and a pass that reads and writes the same bytes as
 * the update, each thread its own share, with no arithmetic to speak of
 * ("floor ms"): the memory system's time for AdamW's traffic on this machine,
 * against which "x floor" puts the kernel. */
#define _GNU_SOURCE
#include <math.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "optim/adamw.h"
#include "core/bf16.h"
#include "core/threadpool.h"

#define MAX_RUNS 64
#define MAX_THREADS 1024
#define HUGE_PAGE ((size_t)2 << 20)

typedef struct {
    void *raw;
    size_t len;
} region;

/* n bytes aligned to a huge page, advised to use huge pages. */
static void *map_huge(region *r, size_t n, int *huge_ok)
{
    r->len = n + HUGE_PAGE;
    r->raw = mmap(NULL, r->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (r->raw == MAP_FAILED) {
        fprintf(stderr, "adamw: cannot map %zu bytes\n", r->len);
        exit(1);
    }
    char *p = (char *)(((uintptr_t)r->raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (madvise(p, n, MADV_HUGEPAGE) != 0) *huge_ok = 0;
    return p;
}

/* ---- first touch: share p of every array by pool thread p ------------------- */

typedef struct {
    float *master, *m, *v, *g32;
    uint16_t *w;
    size_t n;
    int n_threads;
    atomic_int taken[MAX_THREADS];
} touch_ctx;

static void touch_share(touch_ctx *c, int part)
{
    size_t lo, hi;
    mt_adamw_share(c->n, c->n_threads, part, &lo, &hi);
    for (size_t i = lo; i < hi; i++) {
        uint32_t hsh = (uint32_t)i * 2654435761u;
        float x = (float)(hsh >> 8) * 0x1p-24f - 0.5f; /* [-0.5, 0.5) */
        c->master[i] = 0.02f * x;
        c->m[i] = 0.0f;
        c->v[i] = 0.0f;
        if (c->g32) c->g32[i] = 1e-3f * x;
        c->w[i] = mt_f32_to_bf16(1e-3f * x);
    }
}

/* Like mt_adamw_apply: each thread its own share first, then any left. */
static void touch_task(void *ctxp, size_t task, int thread)
{
    touch_ctx *c = ctxp;
    (void)task;
    for (int i = 0; i < c->n_threads; i++) {
        int part = (thread + i) % c->n_threads;
        if (!atomic_exchange(&c->taken[part], 1)) touch_share(c, part);
    }
}

/* ---- the floor: AdamW's loads and stores without its arithmetic ------------- */

typedef struct {
    touch_ctx *c;
    float one, zero; /* 1 and 0, not known to the compiler: the loads and stores stay */
    atomic_int taken[MAX_THREADS];
} floor_ctx;

/* 16 floats or 32 bf16 values: vectors of whatever width the compiler has,
 * so that the floor is not held back by scalar code the kernels do not run. */
typedef float vf __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(64)));

static inline void rmw_f(float *p, vf one, vf add)
{
    vf x;
    memcpy(&x, p, sizeof x);
    x = x * one + add;
    memcpy(p, &x, sizeof x);
}

static void floor_share(floor_ctx *f, int part)
{
    touch_ctx *c = f->c;
    size_t lo, hi;
    mt_adamw_share(c->n, c->n_threads, part, &lo, &hi);
    const vf one = (vf){0} + f->one, zero = (vf){0} + f->zero;
    const vh flip = (vh){0} + (uint16_t)f->zero;
    size_t i = lo;
    for (; i + 32 <= hi; i += 32) { /* 32 parameters: two vectors of each fp32 array, one of bf16 */
        vf g0 = zero, g1 = zero;
        if (c->g32) { /* fp32 gradients: read, not written */
            memcpy(&g0, c->g32 + i, sizeof g0);
            memcpy(&g1, c->g32 + i + 16, sizeof g1);
            g0 *= zero, g1 *= zero;
        }
        rmw_f(c->master + i, one, g0);
        rmw_f(c->master + i + 16, one, g1);
        rmw_f(c->m + i, one, zero);
        rmw_f(c->m + i + 16, one, zero);
        rmw_f(c->v + i, one, zero);
        rmw_f(c->v + i + 16, one, zero);
        vh w; /* bf16 gradients (or nothing) read, the new weights written over them */
        memcpy(&w, c->w + i, sizeof w);
        w ^= flip;
        memcpy(c->w + i, &w, sizeof w);
    }
    for (; i < hi; i++) {
        c->master[i] = c->master[i] * f->one + (c->g32 ? c->g32[i] * f->zero : 0.0f);
        c->m[i] *= f->one;
        c->v[i] *= f->one;
        c->w[i] ^= (uint16_t)f->zero;
    }
}

/* The same shares as the update (mt_adamw_apply): each thread its own first. */
static void floor_task(void *ctxp, size_t task, int thread)
{
    floor_ctx *f = ctxp;
    (void)task;
    for (int i = 0; i < f->c->n_threads; i++) {
        int part = (thread + i) % f->c->n_threads;
        if (!atomic_exchange(&f->taken[part], 1)) floor_share(f, part);
    }
}

/* ---- arguments -------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: adamw [--params N] [--threads LIST|max] [--iters K] [--isa NAME] [--grad bf16|fp32]\n"
                    "  N: 1073741824, 1<<30 or 1G;  LIST: 1,2,4,16;  NAME: scalar, avx2, avx512, avx512bf16\n");
    exit(2);
}

static size_t parse_count(const char *s)
{
    char *end;
    unsigned long long x = strtoull(s, &end, 10);
    if (end == s) usage();
    if (end[0] == '<' && end[1] == '<') {
        unsigned long long sh = strtoull(end + 2, &end, 10);
        if (sh > 62) usage();
        x <<= sh;
    } else if (*end == 'K' || *end == 'M' || *end == 'G') {
        x <<= *end == 'K' ? 10 : *end == 'M' ? 20 : 30;
        end++;
    }
    if (*end) usage();
    return (size_t)x;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *x, int n)
{
    qsort(x, (size_t)n, sizeof x[0], cmp_double);
    return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    size_t n = (size_t)1 << 30;
    int iters = 5, grad_bf16 = 1, runs[MAX_RUNS], n_runs = 0;
    mt_adamw_isa isa = mt_adamw_best_isa();

    /* the CPUs this process may run on, in order */
    cpu_set_t allowed;
    int cpus[CPU_SETSIZE], n_cpus = 0;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &allowed)) cpus[n_cpus++] = c;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int max_threads = (int)(online < 1 ? 1 : online);
    if (n_cpus > 0 && n_cpus < max_threads) max_threads = n_cpus;
    if (max_threads > MAX_THREADS) max_threads = MAX_THREADS;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!val) usage();
        i++;
        if (!strcmp(a, "--params")) {
            n = parse_count(val);
        } else if (!strcmp(a, "--iters")) {
            iters = atoi(val);
            if (iters < 1) usage();
        } else if (!strcmp(a, "--grad")) {
            if (strcmp(val, "bf16") && strcmp(val, "fp32")) usage();
            grad_bf16 = !strcmp(val, "bf16");
        } else if (!strcmp(a, "--isa")) {
            for (isa = MT_ADAMW_SCALAR; isa < MT_ADAMW_ISA_COUNT; isa++)
                if (!strcmp(val, mt_adamw_isa_name(isa))) break;
            if (isa == MT_ADAMW_ISA_COUNT) usage();
        } else if (!strcmp(a, "--threads")) {
            for (const char *s = val; *s && n_runs < MAX_RUNS; s += *s == ',') {
                char *end;
                long t;
                if (!strncmp(s, "max", 3)) {
                    t = max_threads;
                    end = (char *)s + 3;
                } else {
                    t = strtol(s, &end, 10);
                }
                if (end == s || t < 1 || t > MAX_THREADS) usage();
                runs[n_runs++] = (int)t;
                s = end;
            }
        } else {
            usage();
        }
    }
    if (n_runs == 0) {
        for (int t = 1; t < max_threads; t *= 2) runs[n_runs++] = t;
        runs[n_runs++] = max_threads;
    }
    mt_adamw_kernel_fn k = mt_adamw_kernel(isa);
    if (!k) {
        fprintf(stderr, "adamw: this CPU cannot run the %s kernel\n", mt_adamw_isa_name(isa));
        return 1;
    }
    if (n_cpus > 0) { /* the caller is pool thread 0: pin it like the others */
        cpu_set_t first;
        CPU_ZERO(&first);
        CPU_SET(cpus[0], &first);
        (void)sched_setaffinity(0, sizeof first, &first);
    }

    const double state_b = grad_bf16 ? 14.0 : 18.0, moved_b = grad_bf16 ? 28.0 : 30.0;
    printf("adamw: %zu params, isa %s, %s, %.0f B/param of state (%.2f GB)\n", n, mt_adamw_isa_name(isa),
           grad_bf16 ? "bf16 grads in the w_bf16 block" : "fp32 grads, separate w_bf16", state_b,
           state_b * (double)n * 1e-9);
    if (grad_bf16)
        printf("bytes moved/param = 4*3 read + 4*3 written (master, m, v) + 2 read (grad) + 2 written (w) = 28\n");
    else
        printf("bytes moved/param = 4*3 read + 4*3 written (master, m, v) + 4 read (grad) + 2 written (w) = 30\n");
    printf("median of %d steps after 1 warm-up; GB/s = bytes moved * params / time\n", iters);
    printf("%8s %10s %10s %8s %9s %9s %8s\n", "threads", "ms/step", "Gparam/s", "GB/s", "norm ms", "floor ms",
           "x floor");

    static volatile float one = 1.0f, zero = 0.0f;
    static floor_ctx fc; /* its flags are 4 KiB */
    double *ms = malloc(3 * (size_t)iters * sizeof *ms), *norm_ms = ms + iters, *floor_ms = ms + 2 * (size_t)iters;
    if (!ms) return 1;
    for (int r = 0; r < n_runs; r++) {
        int t = runs[r], huge_ok = 1;
        mt_pool *pool = mt_pool_create(t, n_cpus >= t ? cpus : NULL);
        if (!pool) {
            fprintf(stderr, "adamw: cannot start %d threads\n", t);
            return 1;
        }
        /* fresh state for every pool, first touched by the threads that use it */
        region reg[5];
        touch_ctx tc;
        memset(&tc, 0, sizeof tc);
        tc.n = n;
        tc.n_threads = t;
        tc.master = map_huge(&reg[0], n * 4, &huge_ok);
        tc.m = map_huge(&reg[1], n * 4, &huge_ok);
        tc.v = map_huge(&reg[2], n * 4, &huge_ok);
        tc.w = map_huge(&reg[3], n * 2, &huge_ok);
        tc.g32 = grad_bf16 ? NULL : map_huge(&reg[4], n * 4, &huge_ok);
        mt_pool_run(pool, (size_t)t, touch_task, &tc);
        mt_adamw_segment seg = { tc.master, tc.m, tc.v, grad_bf16 ? (const void *)tc.w : (const void *)tc.g32,
                                 grad_bf16, tc.w, n, 0.1f };

        for (int it = -1; it < iters; it++) {
            int step = it + 2;
            double t0 = now();
            double sq = grad_bf16 ? mt_sumsq_bf16(pool, tc.w, n) : mt_sumsq_f32(pool, tc.g32, n);
            double t1 = now();
            mt_adamw_hyper h = { 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0, 0, 1.0f };
            h.bias_correction1 = 1.0f - powf(h.beta1, (float)step);
            h.bias_correction2 = 1.0f - powf(h.beta2, (float)step);
            h.grad_scale = sq > 1.0 ? (float)(1.0 / sqrt(sq)) : 1.0f; /* clip the global norm to 1 */
            mt_adamw_apply(pool, k, &h, &seg, 1);
            double t2 = now();
            fc.c = &tc, fc.one = one, fc.zero = zero;
            for (int i = 0; i < t; i++) atomic_store(&fc.taken[i], 0);
            mt_pool_run(pool, (size_t)t, floor_task, &fc);
            double t3 = now();
            if (it >= 0) {
                ms[it] = 1e3 * (t2 - t1);
                norm_ms[it] = 1e3 * (t1 - t0);
                floor_ms[it] = 1e3 * (t3 - t2);
            }
        }
        mt_pool_destroy(pool);
        for (int i = 0; i < (grad_bf16 ? 4 : 5); i++) munmap(reg[i].raw, reg[i].len);

        double med = median(ms, iters), gps = (double)n / (med * 1e-3) * 1e-9, fl = median(floor_ms, iters);
        printf("%8d %10.2f %10.3f %8.1f %9.2f %9.2f %8.2f%s\n", t, med, gps, gps * moved_b, median(norm_ms, iters), fl,
               med / fl, huge_ok ? "" : "  (no huge pages)");
        fflush(stdout);
    }
    free(ms);
    return 0;
}
