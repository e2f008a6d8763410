/* 8-bit block codes of AdamW's moments (q8.h). */
#include "optim/q8.h"

#include <math.h>
#include <string.h>

/* The magnitude code (e << mbits | f) of x >= 0, at most the largest code. */
static uint32_t encode_mag(float x, int mbits, uint32_t max_code)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const int e = (int)((u >> 23) & 0xff) - 127 + 15; /* the code's exponent field */
    uint32_t q;
    if (e >= 1) {
        const int shift = 23 - mbits;
        const uint32_t mant = u & 0x7fffffu, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        q = ((uint32_t)e << mbits) | (mant >> shift);
        if (rem > half || (rem == half && (q & 1u))) q++; /* a carry moves into the exponent, as it should */
    } else {
        /* below 2^-14: f = x / (2^-14 / 2^mbits), rounded to nearest even (exact scaling by a power
         * of two; f = 2^mbits is the code of 2^-14, the first normal) */
        q = (uint32_t)lrintf(ldexpf(x, 14 + mbits));
    }
    return q > max_code ? max_code : q;
}

/* encode_mag with stochastic rounding: the magnitude rounded up with probability equal to the dropped
 * fraction of a code step, from 16 uniform bits r. Above 2^-14, x's bits less 112 << 23 are the code
 * above its 23 - mbits (>= 16) dropped mantissa bits: r added at the top of the dropped bits carries into
 * the kept ones (and on into the exponent) with that probability. Below, f = x 2^(14 + mbits) (exact:
 * a power of two; f < 2^mbits) in units of 2^-16 of the subnormal step is truncated to an integer (the
 * scaling by 2^16 exact again, the integer below 2^20), then r is added to it: the bits of x below 2^-16
 * of a step are dropped without rounding. Both ways the probability of rounding up is the dropped
 * fraction truncated to 16 bits, so the expected code value is x to within 2^-16 of a step (low). r = 0
 * truncates; r = 0xffff rounds up whatever reaches 2^-16 of a step. */
static uint32_t encode_mag_sr(float x, int mbits, uint32_t max_code, uint32_t r)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    const int e = (int)((u >> 23) & 0xff) - 127 + 15;
    uint32_t q;
    if (e >= 1) {
        const int shift = 23 - mbits;
        const uint32_t t = ((uint32_t)e << 23) | (u & 0x7fffffu);
        q = (t + (r << (shift - 16))) >> shift;
    } else {
        const uint32_t f16 = (uint32_t)(ldexpf(x, 14 + mbits) * 65536.0f);
        q = (f16 + r) >> 16;
    }
    return q > max_code ? max_code : q;
}

static float decode_mag(uint32_t q, int mbits)
{
    const uint32_t e = q >> mbits, f = q & ((1u << mbits) - 1);
    if (e == 0) return ldexpf((float)f, -14 - mbits);
    return ldexpf((float)((1u << mbits) + f), (int)e - 15 - mbits);
}

float mt_q8_value_signed(uint8_t q)
{
    const float m = decode_mag(q & 0x7fu, 3);
    return q & 0x80u ? -m : m;
}

float mt_q8_value_sqrt(uint8_t q) { return decode_mag(q, 4); }

/* The block's scale (-1 for a NaN, an infinity or, sqrt, a negative value), then the codes, rounded to
 * nearest even (r NULL) or stochastically with r[i]. */
static int encode_signed(const float *x, size_t n, const uint16_t *r, uint8_t *q, float *scale)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(x[i])) return -1;
        amax = fmaxf(amax, fabsf(x[i]));
    }
    const float s = amax / MT_Q8_MAX_SIGNED;
    *scale = s;
    for (size_t i = 0; i < n; i++) {
        uint32_t mag = 0;
        if (s > 0.0f) {
            const float a = fabsf(x[i]) / s;
            mag = r ? encode_mag_sr(a, 3, 0x7fu, r[i]) : encode_mag(a, 3, 0x7fu);
        }
        q[i] = (uint8_t)(mag | (mag && x[i] < 0.0f ? 0x80u : 0u)); /* zero has one code */
    }
    return 0;
}

static int encode_sqrt(const float *v, size_t n, const uint16_t *r, uint8_t *q, float *scale)
{
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i]) || v[i] < 0.0f) return -1;
        amax = fmaxf(amax, v[i]);
    }
    const float s = sqrtf(amax) / MT_Q8_MAX_SQRT;
    *scale = s;
    for (size_t i = 0; i < n; i++) {
        uint32_t mag = 0;
        if (s > 0.0f) {
            const float a = sqrtf(v[i]) / s;
            mag = r ? encode_mag_sr(a, 4, 0xffu, r[i]) : encode_mag(a, 4, 0xffu);
        }
        q[i] = (uint8_t)mag;
    }
    return 0;
}

int mt_q8_encode_signed(const float *x, size_t n, uint8_t *q, float *scale)
{
    return encode_signed(x, n, NULL, q, scale);
}

int mt_q8_encode_sqrt(const float *v, size_t n, uint8_t *q, float *scale) { return encode_sqrt(v, n, NULL, q, scale); }

int mt_q8_encode_signed_sr(const float *x, size_t n, const uint16_t *r, uint8_t *q, float *scale)
{
    return encode_signed(x, n, r, q, scale);
}

int mt_q8_encode_sqrt_sr(const float *v, size_t n, const uint16_t *r, uint8_t *q, float *scale)
{
    return encode_sqrt(v, n, r, q, scale);
}

void mt_q8_decode_signed(const uint8_t *q, size_t n, float scale, float *x)
{
    for (size_t i = 0; i < n; i++) x[i] = mt_q8_value_signed(q[i]) * scale;
}

void mt_q8_decode_sqrt(const uint8_t *q, size_t n, float scale, float *v)
{
    for (size_t i = 0; i < n; i++) {
        const float r = mt_q8_value_sqrt(q[i]) * scale;
        v[i] = r * r;
    }
}
