/* AdamW on the host: fp32 master weights and moments, fp32 or bf16 gradients,
 * an optional bf16 copy of the new weights. torch.optim.AdamW semantics.
 *
 * Per element, with g = grad * grad_scale:
 *   p  = p * (1 - lr * weight_decay)                decoupled decay, first
 *   m  = beta1 * m + (1 - beta1) * g
 *   v  = beta2 * v + (1 - beta2) * g * g
 *   p  = p - (lr / bc1) * (m / (sqrt(v) / sqrt(bc2) + eps))
 *   w  = bf16_rne(p)                                if w_bf16 != NULL
 *
 * Every kernel evaluates exactly this sequence of fp32 operations (no fused
 * multiply-add, IEEE sqrt and division, the same derived constants from
 * mt_adamw_consts_of), so all kernels give bit-identical results (NaN
 * payloads aside), and the bf16 output equals mt_f32_to_bf16(p) for every p,
 * NaN and subnormal included. The build must not contract multiplies and
 * adds into FMAs (-std=c11 implies -ffp-contract=off); the tests check.
 *
 * w_bf16 may be the very array a bf16 grad came in (the gradient lands in the
 * bf16 weight block and is overwritten by the new weight): every kernel reads
 * grad[i] before it writes w_bf16[i]. Partial overlap is not supported.
 * Pointers need no alignment; n may be anything. */
#ifndef MT_ADAMW_H
#define MT_ADAMW_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/bf16.h"
#include "core/threadpool.h"

typedef enum mt_adamw_isa {
    MT_ADAMW_SCALAR = 0,
    MT_ADAMW_AVX2 = 1,
    MT_ADAMW_AVX512 = 2,
    MT_ADAMW_AVX512BF16 = 3,
    MT_ADAMW_ISA_COUNT = 4
} mt_adamw_isa;

typedef struct mt_adamw_hyper {
    float lr, beta1, beta2, eps, weight_decay;
    float bias_correction1;  /* 1 - beta1^t, t = 1-based step */
    float bias_correction2;  /* 1 - beta2^t */
    float grad_scale;        /* gradients are multiplied by this first (clipping) */
} mt_adamw_hyper;

typedef void (*mt_adamw_kernel_fn)(const mt_adamw_hyper *h, size_t n, float *master, float *m, float *v,
                                   const void *grad, int grad_is_bf16, uint16_t *w_bf16);

/* NULL when this CPU cannot run it (or isa is out of range). */
mt_adamw_kernel_fn mt_adamw_kernel(mt_adamw_isa isa);
/* The best kernel this CPU supports, from __builtin_cpu_supports. The library
 * reads no environment variable: a caller that wants another one asks
 * mt_adamw_kernel for it. */
mt_adamw_isa mt_adamw_best_isa(void);
/* "scalar", "avx2", "avx512", "avx512bf16"; "?" when out of range. */
const char *mt_adamw_isa_name(mt_adamw_isa isa);

/* The kernels themselves. Only call a SIMD one after mt_adamw_kernel() said
 * the CPU has it. */
void mt_adamw_kernel_scalar(const mt_adamw_hyper *h, size_t n, float *master, float *m, float *v,
                            const void *grad, int grad_is_bf16, uint16_t *w_bf16);
void mt_adamw_kernel_avx2(const mt_adamw_hyper *h, size_t n, float *master, float *m, float *v,
                          const void *grad, int grad_is_bf16, uint16_t *w_bf16);
void mt_adamw_kernel_avx512(const mt_adamw_hyper *h, size_t n, float *master, float *m, float *v,
                            const void *grad, int grad_is_bf16, uint16_t *w_bf16);
void mt_adamw_kernel_avx512bf16(const mt_adamw_hyper *h, size_t n, float *master, float *m, float *v,
                                const void *grad, int grad_is_bf16, uint16_t *w_bf16);

typedef struct mt_adamw_segment {       /* one tensor (or part) to update */
    float *master, *m, *v;
    const void *grad;                   /* n fp32 or n bf16 values */
    int grad_is_bf16;
    uint16_t *w_bf16;                   /* NULL: no bf16 copy; may equal grad */
    size_t n;
    float weight_decay;                 /* replaces h->weight_decay for this segment */
} mt_adamw_segment;

/* An elementwise job over segments, spread over a pool's threads (mt_adamw_apply's driver, also the lean
 * mode's): thread p of P owns the share mt_split_range(seg_len(s), P, p, align) of every segment s and runs
 * it in chunks of `chunk` elements (chunk a multiple of align); a thread that runs out of its own chunks
 * takes the ones its peers have not started yet. */
typedef struct mt_chunked {
    size_t n_segs;                                   /* below 2^24 */
    size_t align, chunk;
    size_t (*seg_len)(const void *ctx, size_t seg);
    void (*run)(void *ctx, size_t seg, size_t lo, size_t hi);
    void *ctx;
} mt_chunked;
void mt_apply_chunked(mt_pool *pool, const mt_chunked *job);

/* Shares and chunks of mt_adamw_apply, in elements. */
#define MT_ADAMW_ALIGN 64
#define MT_ADAMW_CHUNK 16384

/* Updates all segments. Thread p of a pool of P threads owns the share
 * mt_adamw_share(seg->n, P, p) of every segment and updates it in chunks of
 * MT_ADAMW_CHUNK elements; a thread that runs out of its own chunks takes
 * the ones its peers have not started yet. So with a stable pool each thread
 * keeps touching the same memory every step: first-touch state with the same
 * shares for NUMA locality. pool may be NULL (the caller does everything).
 * Results do not depend on the pool: the update is elementwise. n_segs must
 * be below 2^24; pools of more than 256 threads use 256 shares. */
void mt_adamw_apply(mt_pool *pool, mt_adamw_kernel_fn k, const mt_adamw_hyper *h, const mt_adamw_segment *segs,
                    size_t n_segs);
/* [*lo, *hi): the share of an n-element segment that thread `part` of an
 * n_threads pool owns in mt_adamw_apply (multiples of MT_ADAMW_ALIGN). */
void mt_adamw_share(size_t n, int n_threads, int part, size_t *lo, size_t *hi);

/* Sum of squares with double-precision accumulation (for the exact global
 * gradient norm), parallel over the pool (NULL ok), on the best ISA. The
 * input is cut into a fixed number of parts whatever the pool, and every ISA
 * adds in the same order, so the result is the same bits on every pool and
 * every machine. */
double mt_sumsq_f32(mt_pool *pool, const float *x, size_t n);
double mt_sumsq_bf16(mt_pool *pool, const uint16_t *x, size_t n);

/* ---- for the kernels ------------------------------------------------------ */

/* The fp32 constants every kernel uses, derived in double from the hyper-
 * parameters and rounded once, the way torch derives its Python scalars. */
typedef struct mt_adamw_consts {
    float decay;         /* 1 - lr * weight_decay */
    float beta1, omb1;   /* beta1, 1 - beta1 */
    float beta2, omb2;   /* beta2, 1 - beta2 */
    float inv_sqrt_bc2;  /* 1 / sqrt(bias_correction2) */
    float eps;
    float step;          /* lr / bias_correction1 */
    float grad_scale;
} mt_adamw_consts;

static inline mt_adamw_consts mt_adamw_consts_of(const mt_adamw_hyper *h)
{
    mt_adamw_consts c;
    c.decay = (float)(1.0 - (double)h->lr * (double)h->weight_decay);
    c.beta1 = h->beta1;
    c.omb1 = (float)(1.0 - (double)h->beta1);
    c.beta2 = h->beta2;
    c.omb2 = (float)(1.0 - (double)h->beta2);
    c.inv_sqrt_bc2 = (float)(1.0 / sqrt((double)h->bias_correction2));
    c.eps = h->eps;
    c.step = (float)((double)h->lr / (double)h->bias_correction1);
    c.grad_scale = h->grad_scale;
    return c;
}

/* Sum of squares of one part: element i goes to accumulator i % 32 (a square
 * of an fp32 value is exact in double, so only these additions round), and
 * mt_sumsq_reduce adds the accumulators up. The SIMD versions keep the 32
 * accumulators in vectors and finish their tail with mt_sumsq_tail. */
typedef double (*mt_sumsq_fn)(const void *x, int is_bf16, size_t n);
double mt_sumsq_part_scalar(const void *x, int is_bf16, size_t n);
double mt_sumsq_part_avx2(const void *x, int is_bf16, size_t n);
double mt_sumsq_part_avx512(const void *x, int is_bf16, size_t n);

static inline void mt_sumsq_tail(double acc[32], const void *x, int is_bf16, size_t i, size_t n)
{
    for (; i < n; i++) {
        double d = is_bf16 ? (double)mt_bf16_to_f32(((const uint16_t *)x)[i]) : (double)((const float *)x)[i];
        acc[i % 32] += d * d;
    }
}

static inline double mt_sumsq_reduce(const double acc[32])
{
    double t[8];
    for (int k = 0; k < 8; k++) t[k] = (acc[k] + acc[8 + k]) + (acc[16 + k] + acc[24 + k]);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

#endif
