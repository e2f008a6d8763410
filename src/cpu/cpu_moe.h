/* The CPU backend's mixture-of-experts operations (fp32, serial): the
 * routing of tokens to experts and its backward, the gathers and sums that
 * move rows between tokens and the experts' sorted rows, and the
 * load-balancing loss, and the experts' grouped GEMMs. The contracts are
 * those of the kernel table's moe_* entries (src/model/template.h); the
 * grouped GEMMs are the ordinary linear layers (cpu_ops.h) run once per
 * expert on its block of rows, on the pool. Every result is a fixed function
 * of the shapes and inputs (no reduction depends on threads), none
 * allocates, none can fail. E is at most 1024 (MT_MAX_EXPERTS,
 * mt_config_import's bound). */
#ifndef MT_CPU_MOE_H
#define MT_CPU_MOE_H

#include <stddef.h>
#include <stdint.h>

#include "core/threadpool.h"

struct mt_route; /* model/template.h */

/* rt as the kernel table's moe_route: rt->bias, where not NULL, is E f32 (this backend's activations);
 * rt->n_group (with rt->sigmoid, where above 1) divides E and 1 <= rt->topk_group <= rt->n_group. In the
 * softmax mode the bias and the groups are not used. */
void mt_cpu_moe_route(float *probs, float *topw, int32_t *topi, int32_t *rows, int32_t *slot_row, int32_t *offs,
                      float *stats, const float *logits, int T, int E, int k, const struct mt_route *rt);
void mt_cpu_moe_route_bwd(float *dlogits, const float *dw, const float *probs, const float *topw, const int32_t *topi,
                          const float *stats, int L, float aux, int T, int E, int k, const struct mt_route *rt);
void mt_cpu_moe_gather(float *dst, const float *src, const int32_t *rows, int R, int k, int C);
void mt_cpu_moe_combine(float *out, const float *src, const float *w, const int32_t *slot_row, int T, int k, int C);
/* For the R routed rows: dw[rows[r]] = dot(x[r, :], y[r, :]) (summed in double), then x[r, :] and y[r, :]
 * times w[rows[r]] (one fp32 product each); rows of n. dw NULL: no dot; y NULL: x alone is scaled, and dw
 * is not written (there is no dot without y). */
void mt_cpu_moe_dot_scale(float *dw, float *x, float *y, const float *w, const int32_t *rows, int R, int n);
/* out[t, :] += sigmoid(z[t]) * src[t, :] for t < T, rows of C */
void mt_cpu_moe_shared_gate(float *out, const float *src, const float *z, int T, int C);
/* s = sigmoid(z[t]): dz[t] = dot(x[t, :], y[t, :]) * s * (1 - s) (summed in double), then x[t, :] and
 * y[t, :] times s; rows of n */
void mt_cpu_moe_shared_gate_bwd(float *dz, float *x, float *y, const float *z, int T, int n);
/* E * sum_e c_e p_e over the L rows of stats (L, 2E): the load-balancing loss times N^2 */
double mt_cpu_moe_aux_sum(const float *stats, int L, int E);

/* The experts' GEMMs over the R routed rows sorted by expert (the kernel table's moe_linear,
 * moe_linear_dx and moe_linear_dw): for each expert e with rows, offs[e] .. offs[e+1]-1 clamped to
 * [0, R], one call of mt_cpu_matmul / mt_cpu_matmul_bwd on its block of rows and its block of the
 * stacked W (E, N, K), bias and db (E, N), dW (E, N, K), exactly as the linear layers of the kernel
 * table run it: the same bits as a loop over the experts calling those. Experts without rows run
 * nothing (dW, db untouched; rows of no expert not written). p, ws as cpu_ops.h's. */
void mt_cpu_moe_linear(mt_pool *p, void *ws, float *y, const float *x, const float *W, const float *bias,
                       const int32_t *offs, int E, int R, int K, int N, int accumulate);
void mt_cpu_moe_linear_dx(mt_pool *p, void *ws, float *dx, const float *dy, const float *W, const int32_t *offs,
                          int E, int R, int K, int N, int accumulate);
void mt_cpu_moe_linear_dw(mt_pool *p, void *ws, float *dW, float *db, const float *dy, const float *x,
                          const int32_t *offs, int E, int R, int K, int N);

#endif
