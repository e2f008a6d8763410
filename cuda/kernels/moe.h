/* The CUDA backend's mixture-of-experts kernels: the routing of tokens to
 * experts and its backward, the gathers and sums between tokens and the
 * experts' sorted rows, and the load-balancing loss. The contracts are those
 * of the kernel table's moe_* entries (src/model/template.h) and of the CPU
 * ops they mirror (src/cpu/cpu_moe.h); conventions as kernels.h: device
 * pointers, an explicit stream, 0 or -1 (bad arguments, launch error), no
 * floating-point atomics (every sum in an order fixed by the shapes, so
 * results are the same every run). The experts' GEMMs are the cuBLASLt
 * wrapper's, but for those of a few outputs a row (GPT-OSS's down-projection
 * biases), which are here; nothing here copies to the host or waits: the
 * routing's offsets stay on the device, checked there (mt_cu_moe_check_offs).
 * Built without CUDA this header supplies stand-ins that fail every call. */
#ifndef MT_CUDA_MOE_H
#define MT_CUDA_MOE_H

#include "cuda/kernels/kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

struct mt_route; /* model/template.h */

/* The int32 of the routing check's flag (mt_cu_moe_check_offs) */
#define MT_CU_MOE_CHECK_INTS 3
/* The most outputs a row that mt_cu_moe_linear_small and mt_cu_moe_linear_dw_small take */
#define MT_CU_MOE_SMALL_N 8

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
/* The routing's check without a wait: offs (E+1) int32 as mt_cu_moe_route made them must start at 0, not
 * decrease and end at expect (T*k: every routed row placed; a non-finite router logit leaves a token
 * without experts). flag (MT_CU_MOE_CHECK_INTS int32, device memory, zeroed by its owner) records the
 * first bad routing it sees and keeps it through later calls, good or bad: flag[0] = 1, flag[1] the
 * rows placed (offs[E]; -1 where the offsets are not nondecreasing from 0), flag[2] expect. The owner
 * reads it where it waits anyway (the CUDA backend: at the step's end) and zeroes it again. One thread. */
int mt_cu_moe_check_offs(mt_cu_stream s, const int32_t *offs, int E, int expect, int32_t *flag);
/* The same flag for offsets that must equal earlier ones: a backward's recompute of a routing against the
 * forward's, whose copy on the host the backward's expert GEMMs were sized from (ref: host memory the
 * device can read, E + 1 int32). A difference makes flag[0] = 2, flag[1] the first expert whose offset
 * differs, flag[2] the recompute's offset there; a flag already set stays. One block. */
int mt_cu_moe_check_same(mt_cu_stream s, const int32_t *offs, const int32_t *ref, int E, int32_t *flag);
/* The grouped GEMM of the kernel table's moe_linear for N <= MT_CU_MOE_SMALL_N outputs a row, reading
 * offs on the device (no copy to the host): y[r, n] = dot(x[r, :K], W_e[n, :K]) (+ bias_e[n]) (+ y[r, n]
 * if accumulate) for every row r of expert e (offs[e] .. offs[e+1]-1, clamped to [0, R]; a row's expert
 * found by binary search in offs). x (R, K), W (E, N, K), bias (E, N) or NULL in dt; y (R, N) in ydt.
 * One warp per output: the products summed in fp32 (each lane's stride of K, then the lanes in a fixed
 * tree), then the bias and y added. Rows of no expert are not written. */
int mt_cu_moe_linear_small(mt_cu_stream s, mt_cu_dtype dt, mt_cu_dtype ydt, void *y, const void *x, const void *W,
                           const void *bias, const int32_t *offs, int E, int R, int K, int N, int accumulate);
/* moe_linear_dw's for N <= MT_CU_MOE_SMALL_N: dW_e[n, k] (fp32, (E, N, K)) += sum over the rows r of expert e
 * (clamped as above) of dy[r, n] * x[r, k], and if db, db_e[n] (fp32, (E, N)) += sum of dy[r, n]; each sum
 * in fp32 in ascending r by one thread, then added once: deterministic, no atomics. dy (R, N), x (R, K) in
 * dt. Experts without rows are left untouched. */
int mt_cu_moe_linear_dw_small(mt_cu_stream s, mt_cu_dtype dt, float *dW, float *db, const void *dy, const void *x,
                              const int32_t *offs, int E, int R, int K, int N);

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
static inline int mt_cu_moe_check_offs(mt_cu_stream s, const int32_t *offs, int E, int expect, int32_t *flag)
{
    (void)s, (void)offs, (void)E, (void)expect, (void)flag;
    return -1;
}
static inline int mt_cu_moe_check_same(mt_cu_stream s, const int32_t *offs, const int32_t *ref, int E, int32_t *flag)
{
    (void)s, (void)offs, (void)ref, (void)E, (void)flag;
    return -1;
}
static inline int mt_cu_moe_linear_small(mt_cu_stream s, mt_cu_dtype dt, mt_cu_dtype ydt, void *y, const void *x,
                                         const void *W, const void *bias, const int32_t *offs, int E, int R, int K,
                                         int N, int accumulate)
{
    (void)s, (void)dt, (void)ydt, (void)y, (void)x, (void)W, (void)bias, (void)offs, (void)E, (void)R, (void)K;
    (void)N, (void)accumulate;
    return -1;
}
static inline int mt_cu_moe_linear_dw_small(mt_cu_stream s, mt_cu_dtype dt, float *dW, float *db, const void *dy,
                                            const void *x, const int32_t *offs, int E, int R, int K, int N)
{
    (void)s, (void)dt, (void)dW, (void)db, (void)dy, (void)x, (void)offs, (void)E, (void)R, (void)K, (void)N;
    return -1;
}

#endif

#ifdef __cplusplus
}
#endif

#endif
