/* Rotary position embeddings: the frequencies every backend rotates by,
 * computed once on the host so that all backends use the same fp32 values. */
#ifndef MT_MODEL_ROPE_H
#define MT_MODEL_ROPE_H

#include "core/internal.h"

/* inv_freq[D/2] as transformers computes it in fp32 for D rotary dimensions:
 * 1 / theta ** (arange(0, D, 2) / D), then, if llama3, its
 * _compute_llama3_parameters with the four parameters below; if linear,
 * divided by factor (_compute_linear_scaling_rope_parameters); if yarn, its
 * ramp between those and the ones divided by factor
 * (_compute_yarn_parameters); if ext (longrope), 1 / (ext[i] * theta ** ...)
 * (_compute_longrope_parameters). */
typedef struct mt_rope_params {
    float theta;
    int llama3;
    float factor, low_freq_factor, high_freq_factor;
    int original_max_position;
    int linear;
    int yarn;
    float beta_fast, beta_slow; /* yarn: 0 means 32 and 1 */
    int no_truncate;            /* yarn: the correction range stays fractional */
    const float *ext;           /* longrope: the D/2 factors in force */
} mt_rope_params;
void mt_rope_inv_freq(float *inv_freq, int D, const mt_rope_params *rp);

/* The tables a backend holds: the model's, the sliding layers' own (Gemma 3's
 * rope_local_base_freq) and longrope's long factors' (in force for a
 * micro-batch whose positions pass original_max_position). */
typedef enum mt_rope_table { MT_ROPE_GLOBAL = 0, MT_ROPE_LOCAL = 1, MT_ROPE_LONG = 2, MT_ROPE_TABLES = 3 } mt_rope_table;

/* The frequencies of table t of a validated config: inv_freq[rotary dims / 2]. */
void mt_rope_inv_freq_of(float *inv_freq, const mt_model_config *cfg, mt_rope_table t);

/* Whether a validated config rotates any layer by table t (the global one always). */
int mt_rope_has_table(const mt_model_config *cfg, mt_rope_table t);

/* The factor cos and sin of table t are multiplied by (transformers'
 * attention_scaling): 1, or yarn's and longrope's attention factor. */
float mt_rope_attention_factor(const mt_model_config *cfg, mt_rope_table t);

/* Whether a micro-batch whose largest position is max_pos rotates by the
 * long table rather than the global one (longrope: max_pos + 1 >
 * original_max_position, as transformers' dynamic update decides per
 * forward). */
static inline int32_t mt_max_position(const int32_t *pos, size_t n)
{
    int32_t m = 0;
    for (size_t i = 0; i < n; i++) m = pos[i] > m ? pos[i] : m;
    return m;
}
static inline int mt_rope_uses_long(const mt_model_config *c, int32_t max_pos)
{
    return c->rope_scaling == MT_ROPE_SCALING_LONGROPE && (int64_t)max_pos + 1 > (int64_t)c->rope_original_max_position;
}

#endif
