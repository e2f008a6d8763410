/* The memory plan: bytes per tier for a model, a batch shape and a policy,
 * computed before anything is allocated. */
#ifndef MT_PLAN_H
#define MT_PLAN_H

#include "internal.h"
#include "layout.h"

/* Which backend a policy resolves to on this machine: MT_BACKEND_CPU or
 * MT_BACKEND_CUDA; MT_ERR_NO_DEVICE when the policy demands CUDA and there is
 * none. why receives the reason CUDA is not used (may be NULL). */
mt_status mt_resolve_backend(mt_err err, const mt_offload_policy *pol, mt_backend *out, char *why, size_t why_len);

/* Activation bytes of one micro-batch of T tokens: checkpoints per unit
 * input, and the working set of one layer's forward and backward. */
uint64_t mt_plan_checkpoint_bytes(const mt_model_config *cfg, uint64_t T);
uint64_t mt_plan_layer_work_bytes(const mt_model_config *cfg, uint64_t T);

/* Fills *p (all inputs validated; shape NULL: host state only) and checks it
 * against the budgets: MT_ERR_HOST_BUDGET / MT_ERR_GPU_BUDGET with a message
 * naming the bytes needed and available. */
mt_status mt_plan_compute(mt_err err, mt_memory_plan *p, const mt_model_config *cfg, const mt_offload_policy *pol,
                          const mt_batch_shape *shape, mt_backend backend, const mt_layout *lo);

#endif
