/* The scheduler's internals that tests and the model reach. */
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

#endif
