/* RoPE frequencies (rope.h). */
#include "model/rope.h"
#include "model/layout.h"

#include <math.h>

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
    for (int i = 0; i < D / 2; i++) {
        float f = 1.0f / powf(rp->theta, (float)(2 * i) / (float)D);
        if (rp->llama3) {
            const float wavelen = (1.0f / f) * two_pi;
            const float scaled = wavelen > low_wavelen ? f / rp->factor : f;
            if (!(wavelen < high_wavelen) && !(wavelen > low_wavelen)) {
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

void mt_rope_inv_freq_of(float *inv_freq, const mt_model_config *c, int local)
{
    mt_rope_params rp = {c->rope_theta, c->rope_scaling == MT_ROPE_SCALING_LLAMA3, c->rope_factor,
                         c->rope_low_freq_factor, c->rope_high_freq_factor, (int)c->rope_original_max_position,
                         c->rope_scaling == MT_ROPE_SCALING_LINEAR};
    if (local) { /* Gemma 3's sliding layers: their own base, never scaled */
        rp = (mt_rope_params){.theta = c->rope_local_base_freq != 0.0f ? c->rope_local_base_freq : c->rope_theta};
    }
    mt_rope_inv_freq(inv_freq, (int)c->head_dim, &rp);
}

int mt_rope_has_local(const mt_model_config *c)
{
    for (int l = 0; l < (int)c->num_hidden_layers; l++)
        if (mt_config_layer_local_rope(c, l)) return 1;
    return 0;
}
