/* The memory plan: bytes per tier for a model, a batch shape and a policy,
 * computed before anything is allocated. */
#ifndef MT_PLAN_H
#define MT_PLAN_H

#include "core/internal.h"
#include "model/layout.h"
#include "engine/backend.h"

/* Which backend a policy resolves to on this machine: MT_BACKEND_CPU or
 * MT_BACKEND_CUDA; MT_ERR_NO_DEVICE when the policy demands CUDA and there is
 * none. why receives the reason CUDA is not used (may be NULL). */
mt_status mt_resolve_backend(mt_err err, const mt_offload_policy *pol, mt_backend *out, char *why, size_t why_len);

/* Fills *p for request r (with_shape 0: the host state alone, r->shape
 * unused) on the resolved backend, asking the backend what it allocates,
 * and checks it against the budgets: MT_ERR_HOST_BUDGET / MT_ERR_GPU_BUDGET
 * with a message naming the bytes needed and available. */
/* The free memory of the policy's GPU, or the least of its GPUs' (several:
 * each holds a rank's share); 0 when unknown. */
uint64_t mt_plan_gpu_free(const mt_offload_policy *pol);
mt_status mt_plan_compute(mt_err err, mt_memory_plan *p, const mt_be_request *r, int with_shape, mt_backend backend);

#endif
