/* The lean mode's AdamW step (optim/lean.h) throughput on the host.
 *
 *   lean [--params N] [--threads LIST|max] [--iters K] [--isa NAME|all]
 *
 * N may be written 268435456, 1<<28 or 256M (K, M, G are powers of 1024).
 * Defaults: 256M parameters, threads 1, 2, 4, ... and the number of online
 * CPUs, 5 timed steps after one warm-up (the median is reported), every ISA
 * this CPU runs.
 *
 * The layout is the lean mode's: 16-bit weight codes, a bf16 gradient landing
 * zone, 8-bit codes of m and of v and an fp32 scale of each of the three per
 * block of 256 parameters (6.05 bytes per parameter). The blocks are shared out to the
 * pool in chunks of 64 (16384 parameters), first touched by the threads that
 * update them, the threads pinned to the first CPUs the process may use.
 * Bytes moved per parameter: the weight and both moment codes read and
 * written (2 * 4), the gradient read (2), the scales (2 * 3 * 4 / 256):
 * 10.09.
 *
 * Each step is followed by a pass that makes the same loads and stores with
 * no arithmetic to speak of ("floor ms"), the memory system's time for the
 * step's traffic; "x floor" puts the kernel against it. A last table times
 * the kernel on 64 blocks that stay in the L1/L2 caches: its arithmetic
 * alone, one thread. */
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

#include "core/bf16.h"
#include "core/threadpool.h"
#include "optim/lean.h"
#include "optim/q16.h"
#include "optim/q8.h"

#define MAX_RUNS 64
#define MAX_THREADS 1024
#define HUGE_PAGE ((size_t)2 << 20)
#define CHUNK_BLOCKS 64
#define BYTES_MOVED (2.0 * 4.0 + 2.0 + 24.0 / MT_Q8_BLOCK)

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
        fprintf(stderr, "lean: cannot map %zu bytes\n", r->len);
        exit(1);
    }
    char *p = (char *)(((uintptr_t)r->raw + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (madvise(p, n, MADV_HUGEPAGE) != 0) *huge_ok = 0;
    return p;
}

typedef struct {
    int16_t *w;
    uint16_t *g;
    uint8_t *qm, *qv;
    float *sw, *sm, *sv;
    size_t n, n_blocks;
    mt_lean_block_fn k;
    mt_adamw_hyper h;
    uint64_t step;
    float one; /* 1, not known to the compiler: the floor's loads and stores stay */
    atomic_int refused;
} lean_ctx;

static void block_range(const lean_ctx *c, size_t chunk, size_t *b0, size_t *b1)
{
    *b0 = chunk * CHUNK_BLOCKS;
    *b1 = *b0 + CHUNK_BLOCKS < c->n_blocks ? *b0 + CHUNK_BLOCKS : c->n_blocks;
}

static size_t block_len(const lean_ctx *c, size_t b)
{
    return c->n - b * MT_Q8_BLOCK < MT_Q8_BLOCK ? c->n - b * MT_Q8_BLOCK : MT_Q8_BLOCK;
}

/* first touch: weights ~0.02, gradients ~1e-3, moments zero */
static void touch_task(void *ctxp, size_t chunk, int thread)
{
    lean_ctx *c = ctxp;
    (void)thread;
    size_t b0, b1;
    block_range(c, chunk, &b0, &b1);
    for (size_t b = b0; b < b1; b++) {
        float w[MT_Q8_BLOCK];
        const size_t i0 = b * MT_Q8_BLOCK;
        for (size_t i = i0; i < i0 + block_len(c, b); i++) {
            const float x = (float)(((uint32_t)i * 2654435761u) >> 8) * 0x1p-24f - 0.5f; /* [-0.5, 0.5) */
            w[i - i0] = 0.04f * x;
            c->g[i] = mt_f32_to_bf16(2e-3f * x * x - 2e-4f);
            c->qm[i] = 0, c->qv[i] = 0;
        }
        mt_q16_encode(w, block_len(c, b), c->w + i0, &c->sw[b]);
        c->sm[b] = 0, c->sv[b] = 0;
    }
}

static void step_task(void *ctxp, size_t chunk, int thread)
{
    lean_ctx *c = ctxp;
    (void)thread;
    size_t b0, b1;
    block_range(c, chunk, &b0, &b1);
    int bad = 0;
    for (size_t b = b0; b < b1; b++) {
        const size_t i = b * MT_Q8_BLOCK;
        bad |= c->k(&c->h, 1234, c->step, i, block_len(c, b), c->w + i, c->sw + b, c->g + i, c->qm + i, c->sm + b,
                    c->qv + i, c->sv + b);
    }
    if (bad) atomic_store(&c->refused, 1);
}

/* The step's loads and stores, vectors of whatever width the compiler has:
 * w, qm, qv read and written, g read, the scales read and written. */
typedef uint16_t vh __attribute__((vector_size(64)));
typedef uint8_t vb __attribute__((vector_size(64)));

static void floor_task(void *ctxp, size_t chunk, int thread)
{
    lean_ctx *c = ctxp;
    (void)thread;
    size_t b0, b1;
    block_range(c, chunk, &b0, &b1);
    const uint16_t flip = (uint16_t)(c->one - 1.0f);
    for (size_t b = b0; b < b1; b++) {
        const size_t i0 = b * MT_Q8_BLOCK, len = block_len(c, b);
        size_t i = i0;
        for (; i + 64 <= i0 + len; i += 64) {
            vh w0, w1, g0, g1;
            vb m, v;
            memcpy(&w0, c->w + i, 64), memcpy(&w1, c->w + i + 32, 64);
            memcpy(&g0, c->g + i, 64), memcpy(&g1, c->g + i + 32, 64);
            memcpy(&m, c->qm + i, 64), memcpy(&v, c->qv + i, 64);
            w0 ^= g0 & flip, w1 ^= g1 & flip, m ^= (uint8_t)flip, v ^= (uint8_t)flip; /* the codes as raw bits */
            memcpy(c->w + i, &w0, 64), memcpy(c->w + i + 32, &w1, 64);
            memcpy(c->qm + i, &m, 64), memcpy(c->qv + i, &v, 64);
        }
        for (; i < i0 + len; i++)
            c->w[i] = (int16_t)(c->w[i] ^ (c->g[i] & flip)), c->qm[i] ^= (uint8_t)flip, c->qv[i] ^= (uint8_t)flip;
        c->sw[b] *= c->one, c->sm[b] *= c->one, c->sv[b] *= c->one;
    }
}

/* ---- arguments -------------------------------------------------------------- */

static void usage(void)
{
    fprintf(stderr, "usage: lean [--params N] [--threads LIST|max] [--iters K] [--isa NAME|all]\n"
                    "  N: 268435456, 1<<28 or 256M;  LIST: 1,2,4,16;  NAME: scalar, avx2, avx512, avx512bf16\n");
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

static mt_adamw_hyper hyper_at(uint64_t step)
{
    mt_adamw_hyper h = {1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 0, 0, 1.0f};
    h.bias_correction1 = 1.0f - powf(h.beta1, (float)step);
    h.bias_correction2 = 1.0f - powf(h.beta2, (float)step);
    return h;
}

/* One thread, 64 blocks over and over: the kernel's arithmetic alone. */
static double in_cache_gps(mt_lean_block_fn k)
{
    enum { NB = 64, N = NB * MT_Q8_BLOCK };
    static int16_t w[N];
    static uint16_t g[N];
    static uint8_t qm[N], qv[N];
    static float sw[NB], sm[NB], sv[NB];
    lean_ctx c = {.w = w, .g = g, .qm = qm, .qv = qv, .sw = sw, .sm = sm, .sv = sv, .n = N, .n_blocks = NB, .k = k};
    touch_task(&c, 0, 0);
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        const int steps = 200;
        const double t0 = now();
        for (int s = 1; s <= steps; s++) {
            c.step = (uint64_t)s;
            c.h = hyper_at(c.step);
            step_task(&c, 0, 0);
        }
        const double gps = (double)N * steps / (now() - t0) * 1e-9;
        if (gps > best) best = gps;
    }
    return best;
}

int main(int argc, char **argv)
{
    size_t n = (size_t)256 << 20;
    int iters = 5, runs[MAX_RUNS], n_runs = 0, isa_from = MT_ADAMW_SCALAR, isa_to = MT_ADAMW_ISA_COUNT - 1;

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
            if (n == 0) usage();
        } else if (!strcmp(a, "--iters")) {
            iters = atoi(val);
            if (iters < 1) usage();
        } else if (!strcmp(a, "--isa")) {
            if (strcmp(val, "all")) {
                int isa = MT_ADAMW_SCALAR;
                for (; isa < MT_ADAMW_ISA_COUNT; isa++)
                    if (!strcmp(val, mt_adamw_isa_name((mt_adamw_isa)isa))) break;
                if (isa == MT_ADAMW_ISA_COUNT) usage();
                isa_from = isa_to = isa;
            }
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
    if (isa_from == isa_to && !mt_lean_kernel((mt_adamw_isa)isa_from)) {
        fprintf(stderr, "lean: this CPU cannot run the %s kernel\n", mt_adamw_isa_name((mt_adamw_isa)isa_from));
        return 1;
    }
    if (n_cpus > 0) { /* the caller is pool thread 0: pin it like the others */
        cpu_set_t first;
        CPU_ZERO(&first);
        CPU_SET(cpus[0], &first);
        (void)sched_setaffinity(0, sizeof first, &first);
    }

    const size_t n_blocks = (n + MT_Q8_BLOCK - 1) / MT_Q8_BLOCK;
    const size_t n_chunks = (n_blocks + CHUNK_BLOCKS - 1) / CHUNK_BLOCKS;
    printf("lean: %zu params, %.2f B/param of state (%.2f GB), %d online CPUs\n", n, 6.0 + 12.0 / MT_Q8_BLOCK,
           (6.0 + 12.0 / MT_Q8_BLOCK) * (double)n * 1e-9, (int)online);
    printf("bytes moved/param = 2*(2+1+1) read and written (w, m and v codes) + 2 read (grad) + 24/256 (scales) = "
           "%.2f\n",
           BYTES_MOVED);
    printf("median of %d steps after 1 warm-up; GB/s = bytes moved * params / time\n", iters);
    printf("%-10s %8s %10s %10s %8s %9s %8s\n", "isa", "threads", "ms/step", "Gparam/s", "GB/s", "floor ms",
           "x floor");

    static volatile float one = 1.0f;
    double *ms = malloc(2 * (size_t)iters * sizeof *ms), *floor_ms = ms + iters;
    if (!ms) return 1;
    for (int isa = isa_from; isa <= isa_to; isa++) {
        const mt_lean_block_fn k = mt_lean_kernel((mt_adamw_isa)isa);
        if (!k || (isa == MT_ADAMW_AVX512BF16 && isa_from != isa_to)) continue; /* the AVX-512 kernel again */
        for (int r = 0; r < n_runs; r++) {
            int t = runs[r], huge_ok = 1;
            mt_pool *pool = mt_pool_create(t, n_cpus >= t ? cpus : NULL);
            if (!pool) {
                fprintf(stderr, "lean: cannot start %d threads\n", t);
                return 1;
            }
            region reg[4];
            static lean_ctx c;
            memset(&c, 0, sizeof c);
            c.n = n, c.n_blocks = n_blocks, c.k = k;
            c.w = map_huge(&reg[0], n * 2, &huge_ok);
            c.g = map_huge(&reg[1], n * 2, &huge_ok);
            c.qm = map_huge(&reg[2], n * 2, &huge_ok);
            c.qv = c.qm + n;
            c.sw = map_huge(&reg[3], n_blocks * 3 * sizeof(float), &huge_ok);
            c.sm = c.sw + n_blocks, c.sv = c.sm + n_blocks;
            mt_pool_run(pool, n_chunks, touch_task, &c);
            for (int it = -1; it < iters; it++) {
                c.step = (uint64_t)(it + 2);
                c.h = hyper_at(c.step);
                const double t0 = now();
                mt_pool_run(pool, n_chunks, step_task, &c);
                const double t1 = now();
                c.one = one;
                mt_pool_run(pool, n_chunks, floor_task, &c);
                const double t2 = now();
                if (it >= 0) ms[it] = 1e3 * (t1 - t0), floor_ms[it] = 1e3 * (t2 - t1);
            }
            mt_pool_destroy(pool);
            for (int i = 0; i < 4; i++) munmap(reg[i].raw, reg[i].len);
            if (atomic_load(&c.refused)) {
                fprintf(stderr, "lean: a block was refused\n");
                return 1;
            }
            const double med = median(ms, iters), gps = (double)n / (med * 1e-3) * 1e-9, fl = median(floor_ms, iters);
            printf("%-10s %8d %10.2f %10.3f %8.2f %9.2f %8.2f%s\n", mt_adamw_isa_name((mt_adamw_isa)isa), t, med, gps,
                   gps * BYTES_MOVED, fl, med / fl, huge_ok ? "" : "  (no huge pages)");
            fflush(stdout);
        }
    }
    printf("\nin cache (64 blocks, 1 thread, best of 5 x 200 steps)\n%-10s %10s\n", "isa", "Gparam/s");
    for (int isa = isa_from; isa <= isa_to; isa++) {
        const mt_lean_block_fn k = mt_lean_kernel((mt_adamw_isa)isa);
        if (!k || (isa == MT_ADAMW_AVX512BF16 && isa_from != isa_to)) continue;
        printf("%-10s %10.3f\n", mt_adamw_isa_name((mt_adamw_isa)isa), in_cache_gps(k));
    }
    free(ms);
    return 0;
}
