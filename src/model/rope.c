/* RoPE frequencies (rope.h). */
#include "model/rope.h"
#include "model/layout.h"

#include <math.h>

/* yarn's correction range: transformers' find_correction_range, in double as Python computes it. */
static void yarn_range(double *low, double *high, const mt_rope_params *rp, int D)
{
    const double bf = rp->beta_fast > 0.0f ? rp->beta_fast : 32.0, bs = rp->beta_slow > 0.0f ? rp->beta_slow : 1.0;
    const double pi2 = 2.0 * 3.14159265358979323846, base = rp->theta, orig = rp->original_max_position;
    double lo = (D * log(orig / (bf * pi2))) / (2.0 * log(base));
    double hi = (D * log(orig / (bs * pi2))) / (2.0 * log(base));
    if (!rp->no_truncate) lo = floor(lo), hi = ceil(hi);
    *low = lo > 0.0 ? lo : 0.0;
    *high = hi < D - 1 ? hi : D - 1;
}

void mt_rope_inv_freq(float *inv_freq, int D, const mt_rope_params *rp)
{
    /* The fp32 tensor operations of transformers, one rounding each: a
     * Python scalar meets a float32 tensor as a float32, and s / t is
     * t.reciprocal() * s. */
    const float two_pi = (float)(2.0 * 3.14159265358979323846);
    const float old_len = (float)rp->original_max_position;
    const float low_wavelen = (float)((double)rp->original_max_position / rp->low_freq_factor);
    const float high_wavelen = (float)((double)rp->original_max_position / rp->high_freq_factor);
    const float span = (float)((double)rp->high_freq_factor - (double)rp->low_freq_factor);
    double ylo = 0.0, yhi = 0.0;
    if (rp->yarn) {
        yarn_range(&ylo, &yhi, rp, D);
        if (ylo == yhi) yhi += 0.001; /* linear_ramp_factor's guard */
    }
    for (int i = 0; i < D / 2; i++) {
        const float pos_freq = powf(rp->theta, (float)(2 * i) / (float)D);
        float f = 1.0f / pos_freq;
        if (rp->ext) f = 1.0f / (rp->ext[i] * pos_freq);
        if (rp->yarn) {
            /* ramp = clamp((i - low) / (high - low), 0, 1); extrapolation weight 1 - ramp */
            float ramp = ((float)i - (float)ylo) / (float)(yhi - ylo);
            ramp = ramp < 0.0f ? 0.0f : ramp > 1.0f ? 1.0f : ramp;
            const float ef = 1.0f - ramp;
            const float interp = 1.0f / (rp->factor * pos_freq), extrap = 1.0f / pos_freq;
            f = interp * (1.0f - ef) + extrap * ef;
        }
        if (rp->llama3) {
            const float wavelen = (1.0f / f) * two_pi;
            const float scaled = wavelen > low_wavelen ? f / rp->factor : f;
            /* high_freq_factor = low_freq_factor (Llama 4 Scout's 1 and 1) leaves no band between: there
             * transformers' smoothing divides by zero, on no frequency but one exactly at the edge */
            if (span > 0.0f && !(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
                const float smooth = ((1.0f / wavelen) * old_len - rp->low_freq_factor) / span;
                f = (1.0f - smooth) * scaled / rp->factor + smooth * scaled;
            } else {
                f = scaled;
            }
        }
        if (rp->linear) f /= rp->factor;
        inv_freq[i] = f;
    }
}

void mt_rope_inv_freq_of(float *inv_freq, const mt_model_config *c, mt_rope_table t)
{
    const uint32_t s = c->rope_scaling;
    mt_rope_params rp = {
        .theta = c->rope_theta, .llama3 = s == MT_ROPE_SCALING_LLAMA3, .factor = c->rope_factor,
        .low_freq_factor = c->rope_low_freq_factor, .high_freq_factor = c->rope_high_freq_factor,
        .original_max_position = (int)c->rope_original_max_position, .linear = s == MT_ROPE_SCALING_LINEAR,
        .yarn = s == MT_ROPE_SCALING_YARN, .beta_fast = c->rope_beta_fast, .beta_slow = c->rope_beta_slow,
        .no_truncate = c->rope_no_truncate != 0,
        .ext = s != MT_ROPE_SCALING_LONGROPE ? NULL : t == MT_ROPE_LONG ? c->rope_long_factor : c->rope_short_factor,
    };
    if (t == MT_ROPE_LOCAL) { /* Gemma 3's sliding layers: their own base, never scaled */
        rp = (mt_rope_params){.theta = c->rope_local_base_freq != 0.0f ? c->rope_local_base_freq : c->rope_theta};
    }
    mt_rope_inv_freq(inv_freq, (int)mt_config_rotary_dims(c), &rp);
}

int mt_rope_has_table(const mt_model_config *c, mt_rope_table t)
{
    if (t == MT_ROPE_GLOBAL) return 1;
    if (t == MT_ROPE_LONG) return c->rope_scaling == MT_ROPE_SCALING_LONGROPE;
    for (int l = 0; l < (int)c->num_hidden_layers; l++)
        if (mt_config_layer_local_rope(c, l)) return 1;
    return 0;
}

/* yarn's get_mscale */
static double mscale(double scale, double m) { return scale <= 1.0 ? 1.0 : 0.1 * m * log(scale) + 1.0; }

float mt_rope_attention_factor(const mt_model_config *c, mt_rope_table t)
{
    if (t == MT_ROPE_LOCAL) return 1.0f;
    if (c->rope_attention_factor > 0.0f &&
        (c->rope_scaling == MT_ROPE_SCALING_YARN || c->rope_scaling == MT_ROPE_SCALING_LONGROPE))
        return c->rope_attention_factor;
    const double factor = c->rope_factor;
    if (c->rope_scaling == MT_ROPE_SCALING_YARN) {
        if (c->rope_mscale > 0.0f && c->rope_mscale_all_dim > 0.0f)
            return (float)(mscale(factor, c->rope_mscale) / mscale(factor, c->rope_mscale_all_dim));
        return (float)mscale(factor, 1.0);
    }
    if (c->rope_scaling == MT_ROPE_SCALING_LONGROPE)
        return factor <= 1.0 ? 1.0f : (float)sqrt(1.0 + log(factor) / log((double)c->rope_original_max_position));
    return 1.0f;
}
