/* The CUDA backend's mixture-of-experts kernels: the routing of tokens to
 * experts and its backward, the gathers and sums between tokens and the
 * experts' sorted rows, and the load-balancing loss. The contracts are those
 * of the kernel table's moe_* entries (src/model/template.h) and of the CPU
 * ops they mirror (src/cpu/cpu_moe.h); conventions as kernels.h: device
 * pointers, an explicit stream, 0 or -1 (bad arguments, launch error), no
 * floating-point atomics (every sum in an order fixed by the shapes, so
 * results are the same every run). The experts' GEMMs are the cuBLASLt
 * wrapper's; nothing here copies to the host or waits: the backend reads
 * offs back itself. Built without CUDA this header supplies stand-ins that
 * fail every call. */
#ifndef MT_CUDA_MOE_H
#define MT_CUDA_MOE_H

#include "cuda/kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mt_route; /* model/template.h */

#if defined(MT_HAVE_CUDA) || defined(__CUDACC__)

/* Routing of T tokens among E experts (E <= 1024, 1 <= k <= E) from logits (T, E) fp32, in the mode rt
 * (its bias a device pointer of bias_dt, or NULL; with rt->sigmoid and rt->n_group above 1, n_group
 * divides E and 1 <= topk_group <= n_group, else -1): probs, topw, topi, rows and slot_row as the kernel
 * table's moe_route; offs (E+1) int32 in DEVICE memory; stats (2E) fp32 or NULL. One warp per token for
 * the softmax (or sigmoid, the groups) and the top-k, then one block per expert counts its rows (and sums
 * its probabilities), one thread scans the counts into offs, and one block per expert writes its rows in
 * slot order. */
int mt_cu_moe_route(mt_cu_stream s, float *probs, float *topw, int32_t *topi, int32_t *rows, int32_t *slot_row,
                    int32_t *offs, float *stats, const float *logits, int T, int E, int k, const struct mt_route *rt,
                    mt_cu_dtype bias_dt);
/* The routing's backward into dlogits (T, E) fp32, as the kernel table's moe_route_bwd (rt's bias unused). */
int mt_cu_moe_route_bwd(mt_cu_stream s, float *dlogits, const float *dw, const float *probs, const float *topw,
                        const int32_t *topi, const float *stats, int L, float aux, int T, int E, int k,
                        const struct mt_route *rt);
/* dst[r, :] = src[rows[r] / k, :] for r < R; dst, src in dt */
int mt_cu_moe_gather(mt_cu_stream s, mt_cu_dtype dt, void *dst, const void *src, const int32_t *rows, int R, int k,
                     int C);
/* out[t, :] += sum_j (w ? w[t*k+j] : 1) * src[slot_row[t*k+j], :], summed in fp32 in slot order then
 * added to out; out in odt, src in sdt */
int mt_cu_moe_combine(mt_cu_stream s, mt_cu_dtype odt, void *out, mt_cu_dtype sdt, const void *src, const float *w,
                      const int32_t *slot_row, int T, int k, int C);
/* dw[rows[r]] = dot(x[r, :], y[r, :]) (fp32, summed in double), then x[r, :] and y[r, :] times
 * w[rows[r]] (fp32 products, rounded once to dt); x, y (R, n) in dt. dw NULL: no dot; y NULL: x alone
 * is scaled and dw is not written, as mt_cpu_moe_dot_scale */
int mt_cu_moe_dot_scale(mt_cu_stream s, mt_cu_dtype dt, float *dw, void *x, void *y, const float *w,
                        const int32_t *rows, int R, int n);
/* out[t, :] += sigmoid(z[t]) * src[t, :] (fp32, rounded once) for t < T; out, src (T, C) in dt, z fp32 */
int mt_cu_moe_shared_gate(mt_cu_stream s, mt_cu_dtype dt, void *out, const void *src, const float *z, int T, int C);
/* s = sigmoid(z[t]): dz[t] = dot(x[t, :], y[t, :]) * s * (1 - s) (summed in double), then x[t, :] and
 * y[t, :] times s; x, y (T, n) in dt */
int mt_cu_moe_shared_gate_bwd(mt_cu_stream s, mt_cu_dtype dt, float *dz, void *x, void *y, const float *z, int T,
                              int n);
/* *loss += scale * E * sum_e c_e p_e, c and p summed over the L rows of stats (L, 2E); loss a
 * device double */
int mt_cu_moe_aux_loss(mt_cu_stream s, double *loss, const float *stats, int L, int E, double scale);

#else

static inline int mt_cu_moe_route(mt_cu_stream s, float *probs, float *topw, int32_t *topi, int32_t *rows,
                                  int32_t *slot_row, int32_t *offs, float *stats, const float *logits, int T, int E,
                                  int k, const struct mt_route *rt, mt_cu_dtype bias_dt)
{
    (void)s, (void)probs, (void)topw, (void)topi, (void)rows, (void)slot_row, (void)offs, (void)stats, (void)logits;
    (void)T, (void)E, (void)k, (void)rt, (void)bias_dt;
    return -1;
}
static inline int mt_cu_moe_route_bwd(mt_cu_stream s, float *dlogits, const float *dw, const float *probs,
                                      const float *topw, const int32_t *topi, const float *stats, int L, float aux,
                                      int T, int E, int k, const struct mt_route *rt)
{
    (void)s, (void)dlogits, (void)dw, (void)probs, (void)topw, (void)topi, (void)stats, (void)L, (void)aux, (void)T;
    (void)E, (void)k, (void)rt;
    return -1;
}
static inline int mt_cu_moe_gather(mt_cu_stream s, mt_cu_dtype dt, void *dst, const void *src, const int32_t *rows,
                                   int R, int k, int C)
{
    (void)s, (void)dt, (void)dst, (void)src, (void)rows, (void)R, (void)k, (void)C;
    return -1;
}
static inline int mt_cu_moe_combine(mt_cu_stream s, mt_cu_dtype odt, void *out, mt_cu_dtype sdt, const void *src,
                                    const float *w, const int32_t *slot_row, int T, int k, int C)
{
    (void)s, (void)odt, (void)out, (void)sdt, (void)src, (void)w, (void)slot_row, (void)T, (void)k, (void)C;
    return -1;
}
static inline int mt_cu_moe_dot_scale(mt_cu_stream s, mt_cu_dtype dt, float *dw, void *x, void *y, const float *w,
                                      const int32_t *rows, int R, int n)
{
    (void)s, (void)dt, (void)dw, (void)x, (void)y, (void)w, (void)rows, (void)R, (void)n;
    return -1;
}
static inline int mt_cu_moe_shared_gate(mt_cu_stream s, mt_cu_dtype dt, void *out, const void *src, const float *z,
                                        int T, int C)
{
    (void)s, (void)dt, (void)out, (void)src, (void)z, (void)T, (void)C;
    return -1;
}
static inline int mt_cu_moe_shared_gate_bwd(mt_cu_stream s, mt_cu_dtype dt, float *dz, void *x, void *y,
                                            const float *z, int T, int n)
{
    (void)s, (void)dt, (void)dz, (void)x, (void)y, (void)z, (void)T, (void)n;
    return -1;
}
static inline int mt_cu_moe_aux_loss(mt_cu_stream s, double *loss, const float *stats, int L, int E, double scale)
{
    (void)s, (void)loss, (void)stats, (void)L, (void)E, (void)scale;
    return -1;
}

#endif

#ifdef __cplusplus
}
#endif

#endif
