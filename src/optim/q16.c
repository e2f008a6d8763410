/* 16-bit block codes of the lean mode's weights (q16.h). */
#include "optim/q16.h"
#include "core/bf16.h"

#include <math.h>

float mt_q16_scale(float amax)
{
    if (!(amax > 0.0f)) return 0.0f;
    int e;
    const float f = frexpf(amax, &e); /* amax = f 2^e, f in [0.5, 1) */
    /* 32767 2^(e-15) = 2^e (1 - 2^-15) holds amax unless f is above that */
    int k = f <= 32767.0f / 32768.0f ? e - 15 : e - 14;
    if (k < -126) k = -126;
    return ldexpf(1.0f, k);
}

/* The block's scale, or -1 for a value that is not finite. */
static int block_scale(const float *x, size_t n, float *scale)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return -1;
        amax = fmaxf(amax, fabsf(x[i]));
    }
    *scale = mt_q16_scale(amax);
    return 0;
}

int mt_q16_encode(const float *x, size_t n, int16_t *q, float *scale)
{
    float s;
    if (block_scale(x, n, &s)) return -1;
    const float inv = s > 0.0f ? 1.0f / s : 0.0f; /* a power of two: x * inv is exact */
    for (size_t i = 0; i < n; i++) {
        const long c = lrintf(x[i] * inv);
        q[i] = (int16_t)(c > MT_Q16_MAX ? MT_Q16_MAX : c < -MT_Q16_MAX ? -MT_Q16_MAX : c);
    }
    *scale = s;
    return 0;
}

int mt_q16_encode_sr(const float *x, size_t n, const uint16_t *r, int16_t *q, float *scale)
{
    float s;
    if (block_scale(x, n, &s)) return -1;
    const float inv = s > 0.0f ? 1.0f / s : 0.0f;
    for (size_t i = 0; i < n; i++) {
        /* |y| = fl + frac exactly (fl <= |y| < fl + 1 <= 32768); up with probability frac in 16 bits */
        const float y = fabsf(x[i] * inv), fl = floorf(y);
        const uint32_t frac16 = (uint32_t)((y - fl) * 65536.0f);
        uint32_t mag = (uint32_t)fl + ((frac16 + r[i]) >> 16);
        if (mag > MT_Q16_MAX) mag = MT_Q16_MAX;
        q[i] = (int16_t)(signbit(x[i]) ? -(int32_t)mag : (int32_t)mag);
    }
    *scale = s;
    return 0;
}

void mt_q16_decode(const int16_t *q, size_t n, float scale, float *x)
{
    for (size_t i = 0; i < n; i++) x[i] = (float)q[i] * scale;
}

void mt_q16_to_bf16(const int16_t *q, size_t n, float scale, uint16_t *out)
{
    for (size_t i = 0; i < n; i++) out[i] = mt_f32_to_bf16((float)q[i] * scale);
}

void mt_q16_blocks_to_bf16(const int16_t *q, const float *scale, size_t n, uint16_t *out)
{
    for (size_t b = 0; b < n; b += MT_Q16_BLOCK)
        mt_q16_to_bf16(q + b, n - b < MT_Q16_BLOCK ? n - b : MT_Q16_BLOCK, scale[b / MT_Q16_BLOCK], out + b);
}

void mt_q16_blocks_to_f32(const int16_t *q, const float *scale, size_t n, float *out)
{
    for (size_t i = 0; i < n; i++) out[i] = mt_bf16_to_f32(mt_f32_to_bf16((float)q[i] * scale[i / MT_Q16_BLOCK]));
}
