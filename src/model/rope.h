/* Rotary position embeddings: the frequencies every backend rotates by,
 * computed once on the host so that all backends use the same fp32 values. */
#ifndef MT_MODEL_ROPE_H
#define MT_MODEL_ROPE_H

#include "core/internal.h"

/* inv_freq[D/2] as transformers computes it in fp32:
 * 1 / theta ** (arange(0, D, 2) / D), then, if llama3, its
 * _compute_llama3_parameters with the four parameters below; if linear,
 * divided by factor (_compute_linear_scaling_rope_parameters). */
typedef struct mt_rope_params {
    float theta;
    int llama3;
    float factor, low_freq_factor, high_freq_factor;
    int original_max_position;
    int linear;
} mt_rope_params;
void mt_rope_inv_freq(float *inv_freq, int D, const mt_rope_params *rp);

/* The frequencies of a validated config: inv_freq[head_dim / 2]; local: those
 * of the sliding layers (mt_config_layer_local_rope). */
void mt_rope_inv_freq_of(float *inv_freq, const mt_model_config *cfg, int local);

/* Whether any layer of a validated config rotates by the sliding layers' own
 * frequencies: a backend then holds their table too. */
int mt_rope_has_local(const mt_model_config *cfg);

#endif
