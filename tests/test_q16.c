/* The 16-bit block codes of lean mode's weights (src/optim/q16.h): the
 * scale is the least power of two that holds the block, round trips within
 * half a step (a step is the scale), blocks of zeros, of a huge range and of
 * one element, NaN and infinities refused without writing; the
 * stochastically rounded encoder gives one of the two neighbouring codes,
 * truncates at r = 0, rounds up at r = 0xffff, is unbiased and keeps exact
 * values exact; the bf16 values are the codes' values rounded to nearest. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/bf16.h"
#include "optim/q16.h"
#include "rng.h"

static double uniform01(void) { return ((double)(next_u64() >> 11) + 0.5) / 9007199254740992.0; }

static int is_pow2(float s)
{
    int e;
    return frexpf(s, &e) == 0.5f;
}

/* The least power of two s with amax <= 32767 s: checked against its half,
 * for magnitudes across the whole fp32 range, at and around powers of two
 * and around 32767 times them, where the rule turns. */
Test(q16, scale_is_the_least_power_of_two_that_holds_the_block)
{
    cr_assert_eq(mt_q16_scale(0.0f), 0.0f, "a block of zeros has scale 0");
    const float probes[] = {1.0f, 32767.0f, 32767.5f, 32768.0f, 16383.75f, 16384.0f, 3.0e-5f, 0.02f, 1.0e30f, FLT_MAX,
                            FLT_MIN, 1.0e-40f /* subnormal */};
    for (size_t i = 0; i < sizeof probes / sizeof probes[0]; i++)
        for (int k = -3; k <= 3; k++) {
            const float a = k < 0 ? nextafterf(probes[i], 0.0f) : k > 0 ? nextafterf(probes[i], INFINITY) : probes[i];
            if (!isfinite(a) || a == 0) continue;
            const float s = mt_q16_scale(a);
            cr_assert(s > 0 && is_pow2(s), "scale of %a is %a: a power of two", a, s);
            cr_assert((double)a <= 32767.0 * s, "%a fits 32767 x %a", a, s);
            cr_assert(s == 0x1p-126f || (double)a > 32767.0 * (s / 2), "%a: %a is the least such scale", a, s);
        }
}

/* Random blocks of normally distributed weights with log-uniform spreads
 * (1e-20 to 1e20), some short: every value within half a step (the scale)
 * of its code's value, in fp64; the codes within [-32767, 32767]; the
 * largest magnitude's code at least 16384 (the scale is the least). The
 * decode is exact: code times a power of two. */
Test(q16, round_trip_within_half_a_step)
{
    seed(16);
    float x[MT_Q16_BLOCK], y[MT_Q16_BLOCK];
    int16_t q[MT_Q16_BLOCK];
    for (int blk = 0; blk < 400; blk++) {
        const size_t n = blk % 7 == 0 ? 1 + (size_t)(blk % MT_Q16_BLOCK) : MT_Q16_BLOCK;
        const double sd = pow(10.0, (double)(blk % 41) - 20);
        for (size_t i = 0; i < n; i++)
            x[i] = (float)(sd * sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()));
        float s;
        cr_assert_eq(mt_q16_encode(x, n, q, &s), 0);
        mt_q16_decode(q, n, s, y);
        int top = 0;
        for (size_t i = 0; i < n; i++) {
            cr_assert(q[i] >= -MT_Q16_MAX && q[i] <= MT_Q16_MAX);
            cr_assert_eq((double)y[i], (double)q[i] * (double)s, "the decode is exact");
            cr_assert(fabs((double)x[i] - (double)y[i]) <= 0.5 * s, "block %d: %a came back as %a (scale %a)", blk, x[i],
                      y[i], s);
            top = abs(q[i]) > top ? abs(q[i]) : top;
        }
        cr_assert(top >= 16384, "block %d: the largest code %d uses the 15 bits", blk, top);
    }
}

/* Zeros: scale 0, codes 0, decoding to zeros. One huge and many tiny values:
 * the huge one held to 2^-15 of itself, the tiny ones to zero. One element. */
Test(q16, zero_huge_range_and_single_blocks)
{
    float x[MT_Q16_BLOCK] = {0}, y[MT_Q16_BLOCK], s = -1;
    int16_t q[MT_Q16_BLOCK];
    memset(q, 0x55, sizeof q);
    cr_assert_eq(mt_q16_encode(x, MT_Q16_BLOCK, q, &s), 0);
    cr_assert_eq(s, 0.0f);
    mt_q16_decode(q, MT_Q16_BLOCK, s, y);
    for (int i = 0; i < MT_Q16_BLOCK; i++) cr_assert(q[i] == 0 && y[i] == 0.0f);
    for (int i = 0; i < MT_Q16_BLOCK; i++) x[i] = i % 2 ? 1e-30f : -3e-38f;
    x[17] = -2.5e30f;
    cr_assert_eq(mt_q16_encode(x, MT_Q16_BLOCK, q, &s), 0);
    mt_q16_decode(q, MT_Q16_BLOCK, s, y);
    cr_assert(fabs((double)y[17] - x[17]) <= 0x1p-15 * 2.5e30, "the large value: %a", y[17]);
    for (int i = 0; i < MT_Q16_BLOCK; i++)
        if (i != 17) cr_assert_eq(y[i], 0.0f, "element %d, far below a step, is zero", i);
    const float one = -0.0371f;
    cr_assert_eq(mt_q16_encode(&one, 1, q, &s), 0);
    /* 0.0371 / 2^-20 = 38902.2 is past the largest code; / 2^-19 = 19451.08 */
    cr_assert(s == 0x1p-19f && q[0] == -19451, "scale %a, code %d", s, q[0]);
}

/* A NaN or an infinity anywhere: -1, the codes and the scale untouched,
 * for both encoders. */
Test(q16, nan_and_infinity_refused_without_writing)
{
    const float bad[] = {NAN, -NAN, INFINITY, -INFINITY};
    uint16_t r[MT_Q16_BLOCK];
    for (int i = 0; i < MT_Q16_BLOCK; i++) r[i] = (uint16_t)(i * 257);
    for (size_t b = 0; b < 4; b++)
        for (int where = 0; where < MT_Q16_BLOCK; where += 85) {
            float x[MT_Q16_BLOCK];
            for (int i = 0; i < MT_Q16_BLOCK; i++) x[i] = 0.01f * (float)(i - 128);
            x[where] = bad[b];
            int16_t q[MT_Q16_BLOCK], q0[MT_Q16_BLOCK];
            memset(q, 0x3c, sizeof q), memcpy(q0, q, sizeof q);
            float s = 7.0f;
            cr_assert_eq(mt_q16_encode(x, MT_Q16_BLOCK, q, &s), -1);
            cr_assert_eq(mt_q16_encode_sr(x, MT_Q16_BLOCK, r, q, &s), -1);
            cr_assert(s == 7.0f && !memcmp(q, q0, sizeof q), "nothing written");
        }
}

/* The stochastic encoder: each code is the floor or the ceiling of x / s in
 * magnitude (same scale as rounding to nearest); r = 0 truncates toward
 * zero, r = 0xffff rounds up any fraction of at least 2^-16; values that are
 * codes already stay exact whatever r. */
Test(q16, stochastic_codes_are_neighbours)
{
    seed(61);
    float x[MT_Q16_BLOCK], y[MT_Q16_BLOCK];
    int16_t q[MT_Q16_BLOCK], qn[MT_Q16_BLOCK];
    uint16_t r[MT_Q16_BLOCK], r0[MT_Q16_BLOCK] = {0}, r1[MT_Q16_BLOCK];
    for (int i = 0; i < MT_Q16_BLOCK; i++) r1[i] = 0xffff;
    for (int blk = 0; blk < 200; blk++) {
        for (int i = 0; i < MT_Q16_BLOCK; i++) {
            x[i] = (float)((uniform01() - 0.5) * 0.1 * pow(10.0, -4.0 * uniform01()));
            r[i] = (uint16_t)next_u64();
        }
        float s, sn, s0, s1;
        cr_assert_eq(mt_q16_encode(x, MT_Q16_BLOCK, qn, &sn), 0);
        cr_assert_eq(mt_q16_encode_sr(x, MT_Q16_BLOCK, r, q, &s), 0);
        cr_assert_eq(s, sn, "the scale does not depend on the rounding");
        for (int i = 0; i < MT_Q16_BLOCK; i++) {
            const double t = fabs((double)x[i] / s);
            cr_assert(abs(q[i]) == (int)floor(t) || abs(q[i]) == (int)ceil(t), "%a / %a: code %d", x[i], s, q[i]);
            cr_assert(q[i] == 0 || (q[i] < 0) == (x[i] < 0), "the sign is kept");
        }
        cr_assert_eq(mt_q16_encode_sr(x, MT_Q16_BLOCK, r0, q, &s0), 0);
        for (int i = 0; i < MT_Q16_BLOCK; i++) cr_assert_eq(abs(q[i]), (int)floor(fabs((double)x[i] / s0)), "r = 0 truncates");
        cr_assert_eq(mt_q16_encode_sr(x, MT_Q16_BLOCK, r1, q, &s1), 0);
        for (int i = 0; i < MT_Q16_BLOCK; i++) {
            const double t = fabs((double)x[i] / s1);
            if (t - floor(t) >= 0x1p-16) cr_assert_eq(abs(q[i]), (int)floor(t) + 1, "r = 0xffff rounds up");
        }
        /* codes decoded are exact under either encoder: the same values again */
        mt_q16_decode(qn, MT_Q16_BLOCK, sn, y);
        cr_assert_eq(mt_q16_encode_sr(y, MT_Q16_BLOCK, r, q, &s), 0);
        for (int i = 0; i < MT_Q16_BLOCK; i++) cr_assert_eq((float)q[i] * s, y[i], "an exact value stays");
    }
}

/* Unbiased: a value a fraction f of a step above a code (either sign)
 * comes back, over 20000 draws of r, f above it in magnitude on average. The
 * mean of 20000 Bernoulli(f) has a standard deviation of at most 0.0036
 * steps; the bound, 0.02 steps, is over 5 of them (the truncation of f to 16
 * bits adds at most 2^-16). */
Test(q16, stochastic_rounding_is_unbiased)
{
    seed(62);
    const double fr[] = {0.001, 0.1, 0.37, 0.5, 0.93};
    for (size_t k = 0; k < sizeof fr / sizeof fr[0]; k++)
        for (int sign = -1; sign <= 1; sign += 2) {
            /* the block's largest value, 20, pins the scale to 2^-10 (20480 steps) */
            const float x[2] = {20.0f, (float)(sign * (1234.0 + fr[k]) * 0x1p-10)};
            const double want = fabs((double)x[1]) * 0x1p10; /* 1234 + f as the float holds it */
            double sum = 0;
            for (int t = 0; t < 20000; t++) {
                const uint16_t r[2] = {(uint16_t)next_u64(), (uint16_t)next_u64()};
                int16_t q[2];
                float s;
                cr_assert_eq(mt_q16_encode_sr(x, 2, r, q, &s), 0);
                cr_assert_eq(s, 0x1p-10f);
                cr_assert(sign * q[1] >= 1234 && sign * q[1] <= 1235, "code %d", q[1]);
                sum += sign * q[1];
            }
            const double mean = sum / 20000.0;
            cr_assert(fabs(mean - want) <= 0.02, "f %.3f, sign %d: mean code %.4f, want %.4f", fr[k], sign, mean, want);
        }
}

/* The bf16 values are the codes' exact values rounded to nearest even, block
 * by block, as the GPU computes them; _f32 widens those bf16 values. */
Test(q16, bf16_values_round_the_codes_values)
{
    seed(63);
    enum { NB = 3, NE = NB * MT_Q16_BLOCK - 100 };
    float x[NB * MT_Q16_BLOCK], sc[NB], w[NE];
    int16_t q[NB * MT_Q16_BLOCK];
    uint16_t h[NE];
    for (int b = 0; b < NB; b++) {
        const int n = b == NB - 1 ? MT_Q16_BLOCK - 100 : MT_Q16_BLOCK;
        for (int i = 0; i < n; i++) x[b * MT_Q16_BLOCK + i] = (float)((uniform01() - 0.5) * pow(10.0, b - 2));
        cr_assert_eq(mt_q16_encode(x + b * MT_Q16_BLOCK, (size_t)n, q + b * MT_Q16_BLOCK, &sc[b]), 0);
    }
    mt_q16_blocks_to_bf16(q, sc, NE, h);
    mt_q16_blocks_to_f32(q, sc, NE, w);
    for (int i = 0; i < NE; i++) {
        const float v = (float)q[i] * sc[i / MT_Q16_BLOCK];
        cr_assert_eq(h[i], mt_f32_to_bf16(v), "element %d", i);
        cr_assert_eq(w[i], mt_bf16_to_f32(h[i]), "element %d", i);
    }
    uint16_t one[MT_Q16_BLOCK];
    mt_q16_to_bf16(q + MT_Q16_BLOCK, MT_Q16_BLOCK, sc[1], one);
    cr_assert_eq(memcmp(one, h + MT_Q16_BLOCK, sizeof one), 0, "one block at a time gives the same");
}
