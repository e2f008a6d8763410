/* The 8-bit block codes of AdamW's moments (src/optim/q8.h): every code
 * decodes and encodes back to itself, round-trip errors within the code's
 * half step, blocks of zeros, of a huge range and of one element, and NaN,
 * infinite or negative input refused without writing. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "optim/q8.h"
#include "rng.h"

static double uniform01(void) { return ((double)(next_u64() >> 11) + 0.5) / 9007199254740992.0; }

/* Every code is its own encoding: with the block's largest value the
 * largest code's, the scale is exactly 1. The signed code 0x80 (a negative
 * zero) has no encoding of its own: zero encodes as 0. */
Test(q8, every_code_encodes_to_itself)
{
    for (int c = 0; c < 256; c++) {
        float x[2] = {MT_Q8_MAX_SIGNED, mt_q8_value_signed((uint8_t)c)}, s = -1;
        uint8_t q[2];
        cr_assert_eq(mt_q8_encode_signed(x, 2, q, &s), 0);
        cr_assert_eq(s, 1.0f);
        cr_assert_eq(q[0], 0x7f, "the largest value is the largest code");
        cr_assert_eq(q[1], c == 0x80 ? 0 : c, "signed code %#x encodes to %#x", c, q[1]);
        const float r = mt_q8_value_sqrt((uint8_t)c);
        float v[2] = {MT_Q8_MAX_SQRT * MT_Q8_MAX_SQRT, r * r};
        cr_assert_eq(mt_q8_encode_sqrt(v, 2, q, &s), 0);
        cr_assert_eq(s, 1.0f);
        cr_assert_eq(q[1], c, "sqrt code %#x encodes to %#x", c, q[1]);
    }
    /* the codes are ordered like their values: encoding is monotone */
    for (int c = 1; c < 128; c++) cr_assert_gt(mt_q8_value_signed((uint8_t)c), mt_q8_value_signed((uint8_t)(c - 1)));
    for (int c = 1; c < 256; c++) cr_assert_gt(mt_q8_value_sqrt((uint8_t)c), mt_q8_value_sqrt((uint8_t)(c - 1)));
    cr_assert_eq(mt_q8_value_signed(0x7f), MT_Q8_MAX_SIGNED);
    cr_assert_eq(mt_q8_value_sqrt(0xff), MT_Q8_MAX_SQRT);
}

/* Random blocks, magnitudes log-uniform over 12 decades below the largest
 * (a moment's block spans orders of magnitude), random signs. Bounds: half a
 * step of the code, relative (2^-4 signed: 3 mantissa bits; 2^-5 on sqrt(v):
 * 4 bits) where the value is at least the smallest normal code (2^-14) times
 * the scale, else half the smallest subnormal step times the scale; plus
 * 2^-20 relative for the fp32 rounding of value / scale and of the scale
 * itself (a few ulps; the bound is far from the codes' steps). */
Test(q8, round_trip_within_half_a_step)
{
    seed(8);
    float x[MT_Q8_BLOCK], y[MT_Q8_BLOCK];
    uint8_t q[MT_Q8_BLOCK];
    double worst_rel = 0, worst_abs = 0;
    for (int blk = 0; blk < 400; blk++) {
        const size_t n = blk % 7 == 0 ? 1 + (size_t)(blk % MT_Q8_BLOCK) : MT_Q8_BLOCK; /* short last blocks too */
        const double top = pow(10.0, (double)(blk % 41) - 20); /* blocks from 1e-20 to 1e20 */
        for (size_t i = 0; i < n; i++) {
            const double mag = top * pow(10.0, -12.0 * uniform01());
            x[i] = (float)(uniform01() < 0.5 ? -mag : mag);
        }
        for (int kind = 0; kind < 2; kind++) {
            float s = 0;
            float in[MT_Q8_BLOCK];
            int finite = 1;
            for (size_t i = 0; i < n; i++) {
                in[i] = kind ? x[i] * x[i] : x[i]; /* v = m^2: its sqrt is |m| */
                finite &= isfinite(in[i]);
            }
            if (!finite) continue; /* m^2 past fp32's range (blocks of 1e19 and more) */
            cr_assert_eq(kind ? mt_q8_encode_sqrt(in, n, q, &s) : mt_q8_encode_signed(in, n, q, &s), 0);
            if (kind) mt_q8_decode_sqrt(q, n, s, y);
            else mt_q8_decode_signed(q, n, s, y);
            const int mbits = kind ? 4 : 3;
            for (size_t i = 0; i < n; i++) {
                const double want = kind ? sqrt((double)in[i]) : (double)in[i];
                const double got = kind ? sqrt((double)y[i]) : (double)y[i];
                const double err = fabs(got - want), normal = ldexp((double)s, -14);
                if (kind && (in[i] < FLT_MIN || y[i] < FLT_MIN) && in[i] != 0) {
                    continue; /* v an fp32 subnormal (below 1.2e-38), in or out: fp32 holds it to a few bits */
                } else if (want == 0) {
                    cr_assert_eq(got, 0.0, "zero decodes to zero");
                } else if (fabs(want) >= normal) {
                    const double rel = err / fabs(want);
                    worst_rel = fmax(worst_rel, rel);
                    cr_assert_leq(rel, ldexp(1.0, -mbits - 1) + ldexp(1.0, -20), "%s block %d [%zu]: %g for %g",
                                  kind ? "sqrt" : "signed", blk, i, got, want);
                } else {
                    const double bound = ldexp((double)s, -14 - mbits - 1) * (1 + ldexp(1.0, -20));
                    worst_abs = fmax(worst_abs, err / (double)s);
                    cr_assert_leq(err, bound, "%s block %d [%zu]: %g for %g", kind ? "sqrt" : "signed", blk, i, got,
                                  want);
                }
            }
        }
    }
    cr_log_info("worst relative error %.3g, worst absolute (in scales) %.3g", worst_rel, worst_abs);
    cr_assert_gt(worst_rel, ldexp(1.0, -6), "the random values reach the bound's order (the test tests)");
}

Test(q8, zeros_one_value_and_huge_ranges)
{
    float x[MT_Q8_BLOCK] = {0}, y[MT_Q8_BLOCK], s = -1;
    uint8_t q[MT_Q8_BLOCK];
    memset(q, 0xab, sizeof q);
    cr_assert_eq(mt_q8_encode_signed(x, MT_Q8_BLOCK, q, &s), 0);
    cr_assert_eq(s, 0.0f, "a block of zeros has scale 0");
    for (int i = 0; i < MT_Q8_BLOCK; i++) cr_assert_eq(q[i], 0);
    mt_q8_decode_signed(q, MT_Q8_BLOCK, s, y);
    for (int i = 0; i < MT_Q8_BLOCK; i++) cr_assert_eq(y[i], 0.0f);
    cr_assert_eq(mt_q8_encode_sqrt(x, MT_Q8_BLOCK, q, &s), 0);
    cr_assert_eq(s, 0.0f);
    /* -0 is zero */
    x[0] = -0.0f;
    cr_assert_eq(mt_q8_encode_signed(x, 1, q, &s), 0);
    cr_assert_eq(q[0], 0);
    /* one value: itself, up to the scale's rounding */
    x[0] = -3.7e-9f;
    cr_assert_eq(mt_q8_encode_signed(x, 1, q, &s), 0);
    mt_q8_decode_signed(q, 1, s, y);
    cr_assert(fabsf(y[0] - x[0]) <= 1e-6f * fabsf(x[0]), "%g for %g", y[0], x[0]);
    /* the fp32 extremes in one block: the largest exact, the smallest flushed to zero, no inf or NaN */
    x[0] = 3.0e38f, x[1] = -1.0e-38f, x[2] = 1.4e-45f, x[3] = -3.0e38f;
    cr_assert_eq(mt_q8_encode_signed(x, 4, q, &s), 0);
    mt_q8_decode_signed(q, 4, s, y);
    cr_assert(isfinite(s) && s > 0);
    for (int i = 0; i < 4; i++) cr_assert(isfinite(y[i]));
    cr_assert(fabsf(y[0] - x[0]) <= 1e-6f * x[0] && y[3] == -y[0]);
    cr_assert(y[1] == 0.0f && y[2] == 0.0f, "%g and %g are below the block's smallest step", y[1], y[2]);
    float v[3] = {3.0e38f, 1.0e-30f, 0.0f};
    cr_assert_eq(mt_q8_encode_sqrt(v, 3, q, &s), 0);
    mt_q8_decode_sqrt(q, 3, s, y);
    cr_assert(isfinite(y[0]) && fabsf(y[0] - v[0]) <= 1e-5f * v[0], "%g for %g", y[0], v[0]);
    cr_assert(y[1] == 0.0f && y[2] == 0.0f);
}

Test(q8, nan_inf_and_negative_are_refused_without_writing)
{
    const float bad[] = {NAN, INFINITY, -INFINITY};
    for (int b = 0; b < 3; b++) {
        float x[5] = {1, 2, 3, 4, 5}, s = 42;
        uint8_t q[5];
        memset(q, 0xab, sizeof q);
        x[3] = bad[b];
        cr_assert_eq(mt_q8_encode_signed(x, 5, q, &s), -1);
        cr_assert_eq(mt_q8_encode_sqrt(x, 5, q, &s), -1);
        cr_assert_eq(s, 42.0f);
        for (int i = 0; i < 5; i++) cr_assert_eq(q[i], 0xab);
    }
    float v[2] = {1.0f, -1e-30f}, s = 42;
    uint8_t q[2] = {0xab, 0xab};
    cr_assert_eq(mt_q8_encode_sqrt(v, 2, q, &s), -1, "a second moment is never negative");
    cr_assert(s == 42.0f && q[0] == 0xab);
}
