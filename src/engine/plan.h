/* The memory plan: bytes per tier for a model, a batch shape and a policy,
 * computed before anything is allocated. */
#ifndef MT_PLAN_H
#define MT_PLAN_H

#include "core/internal.h"
#include "model/layout.h"

/* Which backend a policy resolves to on this machine: MT_BACKEND_CPU or
 * MT_BACKEND_CUDA; MT_ERR_NO_DEVICE when the policy demands CUDA and there is
 * none. why receives the reason CUDA is not used (may be NULL). */
mt_status mt_resolve_backend(mt_err err, const mt_offload_policy *pol, mt_backend *out, char *why, size_t why_len);

/* The CUDA backend's MLP runs in pieces of tokens: all T, or equal pieces (a
 * multiple of 128 tokens) that keep each (tokens, F) buffer of es-byte
 * elements within MT_MLP_PIECE_BYTES. Its head computes the logits in chunks
 * of MT_LOGITS_CHUNK_BYTES of fp32. The plan counts their buffers by the
 * same rules. */
#define MT_MLP_PIECE_BYTES ((uint64_t)2 << 30)
#define MT_LOGITS_CHUNK_BYTES ((uint64_t)256 << 20)
uint64_t mt_plan_mlp_piece_tokens(uint64_t T, uint64_t F, uint64_t es);

/* Activation bytes of one micro-batch of T tokens: checkpoints per unit
 * input; and the working set of one layer's forward and backward with
 * n_micro micro-batches, as the backend lays it out. */
uint64_t mt_plan_checkpoint_bytes(const mt_model_config *cfg, uint64_t T);
uint64_t mt_plan_layer_work_bytes(const mt_model_config *cfg, uint64_t T, uint32_t n_micro, mt_backend backend);

/* Fills *p (all inputs validated; shape NULL: host state only) and checks it
 * against the budgets: MT_ERR_HOST_BUDGET / MT_ERR_GPU_BUDGET with a message
 * naming the bytes needed and available. */
mt_status mt_plan_compute(mt_err err, mt_memory_plan *p, const mt_model_config *cfg, const mt_offload_policy *pol,
                          const mt_batch_shape *shape, mt_backend backend, const mt_layout *lo);

#endif
