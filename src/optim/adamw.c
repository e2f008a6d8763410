/* AdamW: the portable kernel, the dispatcher, the parallel driver and the
 * sums of squares for the gradient norm. The SIMD kernels live in
 * adamw_avx2.c, adamw_avx512.c and adamw_avx512bf16.c. */
#include "optim/adamw.h"

#include <stdatomic.h>

/* ---- the portable kernel ---------------------------------------------------
 * The reference sequence of operations the SIMD kernels reproduce. This file
 * is built with -std=c11, under which the compiler does not contract a*b+c
 * into a fused multiply-add, so every operation below rounds once. */

void mt_adamw_kernel_scalar(const mt_adamw_hyper *h, size_t n, float *master, float *m, float *v,
                            const void *grad, int grad_is_bf16, uint16_t *w_bf16)
{
    const mt_adamw_consts c = mt_adamw_consts_of(h);
    const float *g32 = grad;
    const uint16_t *g16 = grad;
    for (size_t i = 0; i < n; i++) {
        float g = (grad_is_bf16 ? mt_bf16_to_f32(g16[i]) : g32[i]) * c.grad_scale;
        float p = master[i] * c.decay;
        float mi = c.beta1 * m[i] + c.omb1 * g;
        float vi = c.beta2 * v[i] + c.omb2 * (g * g);
        float denom = sqrtf(vi) * c.inv_sqrt_bc2 + c.eps;
        p = p - c.step * (mi / denom);
        master[i] = p;
        m[i] = mi;
        v[i] = vi;
        if (w_bf16) w_bf16[i] = mt_f32_to_bf16(p); /* grad[i] was read above */
    }
}

/* ---- dispatch ------------------------------------------------------------- */

static int cpu_has(mt_adamw_isa isa)
{
    __builtin_cpu_init();
    switch (isa) {
    case MT_ADAMW_SCALAR:
        return 1;
    case MT_ADAMW_AVX2:
        return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case MT_ADAMW_AVX512: /* the file is built with F, BW, VL and DQ */
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
               __builtin_cpu_supports("fma");
    case MT_ADAMW_AVX512BF16:
        return cpu_has(MT_ADAMW_AVX512) && __builtin_cpu_supports("avx512bf16");
    default:
        return 0;
    }
}

mt_adamw_kernel_fn mt_adamw_kernel(mt_adamw_isa isa)
{
    static const mt_adamw_kernel_fn kernels[MT_ADAMW_ISA_COUNT] = {
        mt_adamw_kernel_scalar, mt_adamw_kernel_avx2, mt_adamw_kernel_avx512, mt_adamw_kernel_avx512bf16,
    };
    if ((unsigned)isa >= MT_ADAMW_ISA_COUNT || !cpu_has(isa)) return NULL;
    return kernels[isa];
}

mt_adamw_isa mt_adamw_best_isa(void)
{
    for (int isa = MT_ADAMW_ISA_COUNT - 1; isa > MT_ADAMW_SCALAR; isa--)
        if (cpu_has((mt_adamw_isa)isa)) return (mt_adamw_isa)isa;
    return MT_ADAMW_SCALAR;
}

const char *mt_adamw_isa_name(mt_adamw_isa isa)
{
    static const char *const names[MT_ADAMW_ISA_COUNT] = { "scalar", "avx2", "avx512", "avx512bf16" };
    return (unsigned)isa < MT_ADAMW_ISA_COUNT ? names[isa] : "?";
}

/* ---- the parallel driver ---------------------------------------------------
 * Each share has a cursor: the segment it is in (high bits) and the next
 * chunk of the owner's share of that segment (low bits). Threads claim chunks
 * by compare-and-swap, their own share first, then their peers' in turn. */

#define CHUNK_BITS 40
#define CHUNK_MASK ((UINT64_C(1) << CHUNK_BITS) - 1)
#define MAX_SHARES 256 /* threads beyond this only help */

typedef struct {
    const mt_chunked *job;
    int n_shares;
    _Atomic uint64_t cursor[MAX_SHARES];
} apply_ctx;

void mt_adamw_share(size_t n, int n_threads, int part, size_t *lo, size_t *hi)
{
    mt_split_range(n, n_threads < 1 ? 1 : (size_t)n_threads, (size_t)part, MT_ADAMW_ALIGN, lo, hi);
}

/* Claims the next chunk of share `owner`: segment *s, elements [*lo, *hi).
 * Returns 0 when that share is done. */
static int claim(apply_ctx *c, int owner, size_t *s, size_t *lo, size_t *hi)
{
    const mt_chunked *j = c->job;
    uint64_t cur = atomic_load_explicit(&c->cursor[owner], memory_order_relaxed);
    for (;;) {
        size_t seg = (size_t)(cur >> CHUNK_BITS), chunk = (size_t)(cur & CHUNK_MASK), a = 0, b = 0;
        for (; seg < j->n_segs; seg++, chunk = 0) { /* skip finished or empty shares */
            mt_split_range(j->seg_len(j->ctx, seg), (size_t)c->n_shares, (size_t)owner, j->align, &a, &b);
            if (a + chunk * j->chunk < b) break;
        }
        if (seg >= j->n_segs) return 0;
        uint64_t next = ((uint64_t)seg << CHUNK_BITS) | (chunk + 1);
        if (atomic_compare_exchange_weak_explicit(&c->cursor[owner], &cur, next, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *s = seg;
            *lo = a + chunk * j->chunk;
            *hi = b - *lo < j->chunk ? b : *lo + j->chunk;
            return 1;
        }
    }
}

/* One task per pool thread; whichever task a thread gets, it drains every
 * share it can, starting with its own. */
static void apply_task(void *ctxp, size_t task, int thread)
{
    apply_ctx *c = ctxp;
    (void)task;
    for (int i = 0; i < c->n_shares; i++) {
        int owner = (thread + i) % c->n_shares;
        size_t s, lo, hi;
        while (claim(c, owner, &s, &lo, &hi)) c->job->run(c->job->ctx, s, lo, hi);
    }
}

void mt_apply_chunked(mt_pool *pool, const mt_chunked *job)
{
    int n_threads = mt_pool_size(pool);
    apply_ctx c;
    c.job = job;
    c.n_shares = n_threads < MAX_SHARES ? n_threads : MAX_SHARES;
    for (int i = 0; i < c.n_shares; i++) atomic_init(&c.cursor[i], 0);
    mt_pool_run(pool, (size_t)n_threads, apply_task, &c);
}

typedef struct {
    mt_adamw_kernel_fn k;
    const mt_adamw_hyper *h;
    const mt_adamw_segment *segs;
} adamw_job;

static size_t adamw_len(const void *ctx, size_t s) { return ((const adamw_job *)ctx)->segs[s].n; }

static void adamw_run(void *ctx, size_t s, size_t lo, size_t hi)
{
    const adamw_job *j = ctx;
    const mt_adamw_segment *sg = &j->segs[s];
    mt_adamw_hyper h = *j->h;
    h.weight_decay = sg->weight_decay;
    const void *g = sg->grad_is_bf16 ? (const void *)((const uint16_t *)sg->grad + lo)
                                     : (const void *)((const float *)sg->grad + lo);
    j->k(&h, hi - lo, sg->master + lo, sg->m + lo, sg->v + lo, g, sg->grad_is_bf16,
         sg->w_bf16 ? sg->w_bf16 + lo : NULL);
}

void mt_adamw_apply(mt_pool *pool, mt_adamw_kernel_fn k, const mt_adamw_hyper *h, const mt_adamw_segment *segs,
                    size_t n_segs)
{
    adamw_job a = {k, h, segs};
    const mt_chunked job = {n_segs, MT_ADAMW_ALIGN, MT_ADAMW_CHUNK, adamw_len, adamw_run, &a};
    mt_apply_chunked(pool, &job);
}

/* ---- sums of squares ---------------------------------------------------------
 * A fixed cut into SUMSQ_PARTS parts, each summed by mt_sumsq_fn's rule, the
 * parts added in order: the same bits on any pool and any ISA. */

#define SUMSQ_PARTS 256
#define SUMSQ_SERIAL 65536 /* below this many elements the pool is not worth waking */

double mt_sumsq_part_scalar(const void *x, int is_bf16, size_t n)
{
    double acc[32] = { 0 };
    mt_sumsq_tail(acc, x, is_bf16, 0, n);
    return mt_sumsq_reduce(acc);
}

typedef struct {
    mt_sumsq_fn part_fn;
    const void *x;
    int is_bf16;
    size_t n;
    double part[SUMSQ_PARTS];
} sumsq_ctx;

static void sumsq_task(void *ctxp, size_t task, int thread)
{
    sumsq_ctx *c = ctxp;
    size_t lo, hi;
    (void)thread;
    mt_split_range(c->n, SUMSQ_PARTS, task, MT_ADAMW_ALIGN, &lo, &hi);
    const void *x = c->is_bf16 ? (const void *)((const uint16_t *)c->x + lo) : (const void *)((const float *)c->x + lo);
    c->part[task] = c->part_fn(x, c->is_bf16, hi - lo);
}

static double sumsq(mt_pool *pool, const void *x, int is_bf16, size_t n)
{
    sumsq_ctx c;
    switch (mt_adamw_best_isa()) {
    case MT_ADAMW_AVX512BF16:
    case MT_ADAMW_AVX512:
        c.part_fn = mt_sumsq_part_avx512;
        break;
    case MT_ADAMW_AVX2:
        c.part_fn = mt_sumsq_part_avx2;
        break;
    default:
        c.part_fn = mt_sumsq_part_scalar;
    }
    c.x = x;
    c.is_bf16 = is_bf16;
    c.n = n;
    mt_pool_run(n < SUMSQ_SERIAL ? NULL : pool, SUMSQ_PARTS, sumsq_task, &c);
    double s = 0;
    for (int i = 0; i < SUMSQ_PARTS; i++) s += c.part[i];
    return s;
}

double mt_sumsq_f32(mt_pool *pool, const float *x, size_t n) { return sumsq(pool, x, 0, n); }

double mt_sumsq_bf16(mt_pool *pool, const uint16_t *x, size_t n) { return sumsq(pool, x, 1, n); }
