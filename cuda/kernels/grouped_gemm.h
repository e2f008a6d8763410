/* Grouped GEMMs of a mixture-of-experts layer on Hopper: every expert's
 * product over its block of routed rows in one launch, with the blocks'
 * bounds read from device memory (moe_route's offsets), so that nothing
 * comes back to the host inside a layer. Three products, those of the
 * kernel table's moe_linear, moe_linear_dx and moe_linear_dw
 * (src/model/template.h), for the R routed rows sorted by expert (expert e's
 * rows offs[e] .. offs[e+1]-1):
 *
 *   linear     y[r, :N]  = x[r, :K] W_e^T (+ bias_e) (+ y)      W (E, N, K)
 *   linear_dx  dx[r, :K] = dy[r, :N] W_e (+ dx)
 *   linear_dw  dW_e     += dy_e^T x_e, db_e += column sums of dy_e (f32)
 *
 * bf16 operands, fp32 accumulation (wgmma), the bulk tensor copy engine
 * feeding a ring of shared-memory stages, one producer warp and two
 * consumer warpgroups per block, a persistent grid. Each output element is
 * written by one block in an order fixed by the shapes: the same bits every
 * run. docs/moe.md describes the design and its measurements.
 *
 * Available on compute capability 9.0 only (the kernels are sm_90a code);
 * mt_cu_gg_create says so where it is not. Conventions as kernels.h: device
 * pointers, an explicit stream, 0 or -1. Built without CUDA this header
 * supplies stand-ins that fail. */
#ifndef MT_CUDA_GROUPED_GEMM_H
#define MT_CUDA_GROUPED_GEMM_H

#include "cuda/kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_cu_gg mt_cu_gg;

#if defined(MT_HAVE_CUDA) || defined(__CUDACC__)

/* The grouped GEMMs on the current device: NULL with the reason in why when it is not a compute
 * capability 9.0 GPU or the driver lacks the tensor-map entry point. */
mt_cu_gg *mt_cu_gg_create(char *why, size_t why_len);
void mt_cu_gg_destroy(mt_cu_gg *g); /* NULL ok */
/* Whether the products of these sizes can run here: row strides of whole 16-byte units (K, N multiples
 * of 8) and at least 16 of each (smaller ones are served better by plain kernels). */
int mt_cu_gg_fits(int K, int N);
/* The three products (bf16 x, W, dy, bias; y and dx bf16 or fp32 by out_f32; dW, db fp32), E <= 1024
 * experts, offs (E+1) int32 in device memory (clamped to 0..R, so that a bad routing reads and writes
 * nothing out of bounds). -1 on bad arguments or a launch error. */
int mt_cu_gg_linear(mt_cu_gg *g, mt_cu_stream s, void *y, int out_f32, const void *x, const void *W, const void *bias,
                    const int32_t *offs, int E, int R, int K, int N, int accumulate);
int mt_cu_gg_linear_dx(mt_cu_gg *g, mt_cu_stream s, void *dx, int out_f32, const void *dy, const void *W,
                       const int32_t *offs, int E, int R, int K, int N, int accumulate);
int mt_cu_gg_linear_dw(mt_cu_gg *g, mt_cu_stream s, float *dW, float *db, const void *dy, const void *x,
                       const int32_t *offs, int E, int R, int K, int N);

#else

static inline mt_cu_gg *mt_cu_gg_create(char *why, size_t why_len)
{
    (void)why, (void)why_len;
    return 0;
}
static inline void mt_cu_gg_destroy(mt_cu_gg *g) { (void)g; }
static inline int mt_cu_gg_fits(int K, int N)
{
    (void)K, (void)N;
    return 0;
}
static inline int mt_cu_gg_linear(mt_cu_gg *g, mt_cu_stream s, void *y, int out_f32, const void *x, const void *W,
                                  const void *bias, const int32_t *offs, int E, int R, int K, int N, int accumulate)
{
    (void)g, (void)s, (void)y, (void)out_f32, (void)x, (void)W, (void)bias, (void)offs, (void)E, (void)R, (void)K;
    (void)N, (void)accumulate;
    return -1;
}
static inline int mt_cu_gg_linear_dx(mt_cu_gg *g, mt_cu_stream s, void *dx, int out_f32, const void *dy,
                                     const void *W, const int32_t *offs, int E, int R, int K, int N, int accumulate)
{
    (void)g, (void)s, (void)dx, (void)out_f32, (void)dy, (void)W, (void)offs, (void)E, (void)R, (void)K, (void)N;
    (void)accumulate;
    return -1;
}
static inline int mt_cu_gg_linear_dw(mt_cu_gg *g, mt_cu_stream s, float *dW, float *db, const void *dy,
                                     const void *x, const int32_t *offs, int E, int R, int K, int N)
{
    (void)g, (void)s, (void)dW, (void)db, (void)dy, (void)x, (void)offs, (void)E, (void)R, (void)K, (void)N;
    return -1;
}

#endif

#ifdef __cplusplus
}
#endif

#endif
