/* The scheduler's internals that the public calls, the model and tests reach. */
#ifndef MT_ENGINE_H
#define MT_ENGINE_H

#include "engine/model.h"

/* Forward and backward of a checked batch with n_targets unmasked targets:
 * leaves the gradients in the tiles (bf16 mode: in the weight blocks) and
 * returns the mean loss and the global gradient norm; *t_head (may be NULL)
 * receives the time the head started. */
mt_status mt_engine_grads(mt_model *m, const mt_batch *b, uint64_t n_targets, double *loss, double *norm,
                          double *t_head);

/* Makes the model's CUDA device current on the calling thread; returns the
 * device that was, for mt_device_restore (-1 on the CPU backend). */
int mt_engine_enter(const mt_model *m);

/* The public calls' work (src/engine/api.c makes the device current and
 * restores it): one optimizer step, an evaluation, the logits of tokens. */
mt_status mt_engine_step(mt_model *m, const mt_batch *batch, const mt_optim_config *opt, mt_step_stats *stats);
mt_status mt_engine_eval(mt_model *m, const mt_batch *batch, mt_eval_stats *stats);
mt_status mt_engine_logits(mt_model *m, const int32_t *tokens, uint32_t n_seq, uint32_t seq_len, float *out);

/* Frees what the scheduler made for m: the backend, the trace and the visit
 * list (mt_model_destroy). */
void mt_engine_fini(mt_model *m);

#endif
