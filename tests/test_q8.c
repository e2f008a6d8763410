/* The 8-bit block codes of AdamW's moments (src/optim/q8.h): every code
 * decodes and encodes back to itself, round-trip errors within the code's
 * half step, blocks of zeros, of a huge range and of one element, and NaN,
 * infinite or negative input refused without writing. The stochastically
 * rounded encoders: one of the two neighbouring codes, truncation at r = 0,
 * rounding up at r = 0xffff, unbiased, the same scale and refusals. */
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
    const uint16_t r[5] = {0, 0xffff, 0x8000, 1, 0x1234};
    for (int b = 0; b < 3; b++) {
        float x[5] = {1, 2, 3, 4, 5}, s = 42;
        uint8_t q[5];
        memset(q, 0xab, sizeof q);
        x[3] = bad[b];
        cr_assert_eq(mt_q8_encode_signed(x, 5, q, &s), -1);
        cr_assert_eq(mt_q8_encode_sqrt(x, 5, q, &s), -1);
        cr_assert_eq(mt_q8_encode_signed_sr(x, 5, r, q, &s), -1);
        cr_assert_eq(mt_q8_encode_sqrt_sr(x, 5, r, q, &s), -1);
        cr_assert_eq(s, 42.0f);
        for (int i = 0; i < 5; i++) cr_assert_eq(q[i], 0xab);
    }
    float v[2] = {1.0f, -1e-30f}, s = 42;
    uint8_t q[2] = {0xab, 0xab};
    cr_assert_eq(mt_q8_encode_sqrt(v, 2, q, &s), -1, "a second moment is never negative");
    cr_assert_eq(mt_q8_encode_sqrt_sr(v, 2, r, q, &s), -1);
    cr_assert(s == 42.0f && q[0] == 0xab && q[1] == 0xab);
}

/* ---- stochastic rounding ---------------------------------------------------------- */

static int encode(int sq, int sr, const float *x, size_t n, const uint16_t *r, uint8_t *q, float *s)
{
    if (sr) return sq ? mt_q8_encode_sqrt_sr(x, n, r, q, s) : mt_q8_encode_signed_sr(x, n, r, q, s);
    return sq ? mt_q8_encode_sqrt(x, n, q, s) : mt_q8_encode_signed(x, n, q, s);
}

static float value(int sq, unsigned mag)
{
    return sq ? mt_q8_value_sqrt((uint8_t)mag) : mt_q8_value_signed((uint8_t)mag);
}

/* Random blocks as above (12 decades below blocks of 1e-20 .. 1e20, zeros
 * among them). With the value in units of the scale a (|x| / s or
 * sqrt(v) / s, as the encoder computes it) and lo the largest code at most
 * a: r = 0 gives lo (truncation); r = 0xffff gives lo + 1 exactly when a is
 * at least 2^-16 of a step above lo (the resolution of 16 random bits; the
 * difference and its scaling by a power of two are exact in fp32), else lo;
 * random r gives one of those two, lo + 1 as often as the dropped
 * fractions add up to (within 4 standard deviations over all the values);
 * the rounding to nearest one of lo and lo + 1 too. The largest code is a
 * ceiling (a may pass its value by the scale's rounding). The scale is the
 * rounding to nearest's; the sign of m is kept, zero (and -0) is code 0
 * whatever r. */
Test(q8, stochastic_rounding_gives_a_neighbouring_code)
{
    seed(88);
    float x[MT_Q8_BLOCK], in[MT_Q8_BLOCK];
    uint8_t q0[MT_Q8_BLOCK], q1[MT_Q8_BLOCK], qr[MT_Q8_BLOCK], qn[MT_Q8_BLOCK];
    uint16_t r0[MT_Q8_BLOCK], r1[MT_Q8_BLOCK], rr[MT_Q8_BLOCK];
    for (int i = 0; i < MT_Q8_BLOCK; i++) r0[i] = 0, r1[i] = 0xffff;
    long ups = 0, random_up = 0, subnormal = 0, tiny = 0;
    double expected_up = 0, variance = 0; /* of the random bits' rounding up: a sum of Bernoulli trials */
    for (int blk = 0; blk < 400; blk++) {
        const size_t n = blk % 7 == 0 ? 1 + (size_t)(blk % MT_Q8_BLOCK) : MT_Q8_BLOCK;
        const double top = pow(10.0, (double)(blk % 41) - 20);
        for (size_t i = 0; i < n; i++) {
            const double mag = top * pow(10.0, -12.0 * uniform01());
            x[i] = i % 17 == 5 ? (i % 2 ? -0.0f : 0.0f) : (float)(uniform01() < 0.5 ? -mag : mag);
            rr[i] = (uint16_t)next_u64();
        }
        for (int sq = 0; sq < 2; sq++) {
            int finite = 1;
            for (size_t i = 0; i < n; i++) {
                in[i] = sq ? x[i] * x[i] : x[i];
                finite &= isfinite(in[i]);
            }
            if (!finite) continue;
            float s0 = -1, s1 = -2, sr = -3, sn = -4;
            cr_assert_eq(encode(sq, 1, in, n, r0, q0, &s0), 0);
            cr_assert_eq(encode(sq, 1, in, n, r1, q1, &s1), 0);
            cr_assert_eq(encode(sq, 1, in, n, rr, qr, &sr), 0);
            cr_assert_eq(encode(sq, 0, in, n, NULL, qn, &sn), 0);
            cr_assert(s0 == sn && s1 == sn && sr == sn, "the rounding to nearest's scale");
            const unsigned mask = sq ? 0xffu : 0x7fu;
            for (size_t i = 0; i < n; i++) {
                const char *kind = sq ? "sqrt" : "signed";
                if (in[i] == 0) {
                    cr_assert(q0[i] == 0 && q1[i] == 0 && qr[i] == 0, "%s block %d [%zu]: zero has one code", kind,
                              blk, i);
                    continue;
                }
                const float a = sq ? sqrtf(in[i]) / sn : fabsf(in[i]) / sn;
                const unsigned lo = q0[i] & mask;
                /* the sign kept (where the magnitude is not zero) */
                if (!sq) {
                    const unsigned neg = in[i] < 0 ? 0x80u : 0u;
                    cr_assert(q0[i] == (lo ? (lo | neg) : 0) && (q1[i] & 0x7fu ? (q1[i] & 0x80u) == neg : q1[i] == 0),
                              "signed block %d [%zu]: %#x %#x for %g", blk, i, q0[i], q1[i], in[i]);
                }
                const unsigned at_ffff = q1[i] & mask, rnd = qr[i] & mask, near = qn[i] & mask;
                if (lo == mask) { /* the largest code: nothing above it */
                    cr_assert(a >= value(sq, lo) && at_ffff == lo && rnd == lo && near == lo, "%s block %d [%zu]", kind,
                              blk, i);
                    continue;
                }
                cr_assert(value(sq, lo) <= a && a < value(sq, lo + 1), "%s block %d [%zu]: r = 0 gives %#x for %a",
                          kind, blk, i, lo, (double)a);
                const float step = value(sq, lo + 1) - value(sq, lo), dropped = a - value(sq, lo);
                const int up = dropped * 65536.0f >= step;
                cr_assert_eq(at_ffff, lo + (unsigned)up, "%s block %d [%zu]: r = 0xffff gives %#x for %a (code %#x)",
                             kind, blk, i, at_ffff, (double)a, lo);
                cr_assert(rnd == lo || rnd == lo + 1, "%s block %d [%zu]: %#x is no neighbour of %a", kind, blk, i,
                          rnd, (double)a);
                cr_assert(near == lo || near == lo + 1, "%s block %d [%zu]", kind, blk, i);
                cr_assert(rnd == lo || up, "only what rounds up at 0xffff rounds up at all");
                const double p = floor((double)dropped * 65536.0 / (double)step) / 65536.0;
                ups += up, random_up += rnd > lo, expected_up += p, variance += p * (1 - p);
                subnormal += lo < (sq ? 16u : 8u), tiny += dropped > 0 && !up;
            }
        }
    }
    cr_log_info("%ld rounded up at 0xffff, %ld with random bits (%.0f expected), %ld below 2^-16 of a step, "
                "%ld subnormal",
                ups, random_up, expected_up, tiny, subnormal);
    cr_assert(ups > 100000 && subnormal > 1000 && tiny > 0, "both ranges reached (the test tests)");
    cr_assert(fabs((double)random_up - expected_up) <= 4 * sqrt(variance),
              "random bits round up with probability the dropped fraction: %ld for %.1f (sd %.1f)", random_up,
              expected_up, sqrt(variance));
}

/* 0.3 of a step above a code, 20000 times with random bits: 30% round up
 * (the binomial's standard deviation is 0.0032, the bound 4 of them), the
 * rest down, for both codes, in the subnormal and normal ranges, across the
 * boundary between them and across a power of two (the carry into the
 * exponent), m negative too. The block's other value is the largest code's,
 * so the scale is 1 and the quotient is the value itself. */
Test(q8, stochastic_rounding_is_unbiased)
{
    seed(89);
    enum { N = 20000 };
    static const unsigned codes[2][5] = {{0x03, 0x07, 0x3a, 0x2f, 0x66}, {0x05, 0x0f, 0x9b, 0x4f, 0xfe}};
    for (int sq = 0; sq < 2; sq++)
        for (int c = 0; c < 5; c++)
            for (int neg = 0; neg < 2 - sq; neg++) {
                const unsigned lo = codes[sq][c];
                const float a = value(sq, lo) + 0.3f * (value(sq, lo + 1) - value(sq, lo));
                const float top = sq ? MT_Q8_MAX_SQRT : MT_Q8_MAX_SIGNED;
                float in[2] = {sq ? top * top : top, sq ? a * a : neg ? -a : a}, s;
                if (sq) cr_assert_eq(sqrtf(in[1]), a, "the square's root is the value");
                int up = 0;
                for (int i = 0; i < N; i++) {
                    const uint16_t r[2] = {(uint16_t)next_u64(), (uint16_t)next_u64()};
                    uint8_t q[2];
                    cr_assert_eq(encode(sq, 1, in, 2, r, q, &s), 0);
                    cr_assert_eq(s, 1.0f);
                    const unsigned want = neg ? 0x80u : 0u;
                    cr_assert((q[1] & 0x80u) == want || sq, "the sign kept");
                    const unsigned mag = sq ? q[1] : q[1] & 0x7fu;
                    cr_assert(mag == lo || mag == lo + 1, "%#x for %#x + 0.3", mag, lo);
                    up += mag == lo + 1;
                }
                cr_assert(fabs((double)up / N - 0.3) <= 4 * 0.0032, "%s code %#x%s: %d of %d rounded up",
                          sq ? "sqrt" : "signed", lo, neg ? " (negative)" : "", up, N);
            }
}

/* The rest of what the rounding to nearest's encoders promise: a block of
 * zeros has scale 0 and codes 0, whatever r; -0 is 0; the largest value is
 * the largest code, whatever r; a value a code holds exactly is that code. */
Test(q8, stochastic_rounding_keeps_the_codes_properties)
{
    float x[4] = {0.0f, -0.0f, 0.0f, 0.0f}, s = -1;
    uint8_t q[4] = {1, 2, 3, 4};
    const uint16_t r[4] = {0xffff, 0xffff, 0x8000, 1};
    cr_assert_eq(mt_q8_encode_signed_sr(x, 4, r, q, &s), 0);
    cr_assert(s == 0.0f && !q[0] && !q[1] && !q[2] && !q[3]);
    cr_assert_eq(mt_q8_encode_sqrt_sr(x, 4, r, q, &s), 0);
    cr_assert(s == 0.0f && !q[0] && !q[1] && !q[2] && !q[3]);
    for (int c = 0; c < 256; c++) {
        float m[2] = {-MT_Q8_MAX_SIGNED, mt_q8_value_signed((uint8_t)c)};
        cr_assert_eq(mt_q8_encode_signed_sr(m, 2, r, q, &s), 0);
        cr_assert(s == 1.0f && q[0] == 0xff && q[1] == (c == 0x80 ? 0 : c), "signed code %#x: %#x", c, q[1]);
        const float v0 = mt_q8_value_sqrt((uint8_t)c);
        float v[2] = {MT_Q8_MAX_SQRT * MT_Q8_MAX_SQRT, v0 * v0};
        cr_assert_eq(mt_q8_encode_sqrt_sr(v, 2, r, q, &s), 0);
        cr_assert(s == 1.0f && q[0] == 0xff && q[1] == c, "sqrt code %#x: %#x", c, q[1]);
    }
}
