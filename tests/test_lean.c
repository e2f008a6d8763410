/* The lean mode's AdamW step (src/optim/lean.h): stochastic rounding to bf16
 * is unbiased and only ever picks a neighbour; a block's step against a
 * float64 reference of the same algorithm; NaN gradients refused without
 * writing; the same inputs give the same bits. */
#include <criterion/criterion.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/bf16.h"
#include "optim/lean.h"
#include "optim/q8.h"
#include "rng.h"

static double uniform01(void) { return ((double)(next_u64() >> 11) + 0.5) / 9007199254740992.0; }
static double normal01(void) { return sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()); }

/* the bf16 neighbours of x: below and above (equal when x is one) */
static void neighbours(double x, float *lo, float *hi)
{
    const float f = (float)x;
    uint16_t b = mt_f32_to_bf16(f);
    float r = mt_bf16_to_f32(b);
    if ((double)r > x) b = (uint16_t)(f > 0 ? b - 1 : b + 1);
    *lo = mt_bf16_to_f32(b);
    *hi = (double)*lo == x ? *lo : mt_bf16_to_f32((uint16_t)(*lo >= 0 ? b + 1 : b - 1));
    if (*lo > *hi) { const float t = *lo; *lo = *hi, *hi = t; }
}

/* 0.3 of an ulp above 1 (the ulp is 2^-7 there): over 20000 parameters 30%
 * round up; the binomial's standard deviation is 0.0032, the bound 4 of
 * them. Values bf16 holds are kept; negative values mirror. */
Test(lean, stochastic_rounding_is_unbiased)
{
    const float x = 1.0f + 0.3f * 0x1p-7f;
    int up = 0;
    enum { N = 20000 };
    for (int i = 0; i < N; i++) {
        const uint16_t b = mt_bf16_round_stochastic(x, mt_lean_random(7, 3, (uint64_t)i));
        cr_assert(b == 0x3f80 || b == 0x3f81, "%#x is no neighbour of %g", b, x);
        up += b == 0x3f81;
        const uint16_t n = mt_bf16_round_stochastic(-x, mt_lean_random(7, 3, (uint64_t)i));
        cr_assert_eq(n, (uint16_t)(b | 0x8000u), "-x rounds as x, mirrored");
    }
    cr_assert(fabs((double)up / N - 0.3) <= 4 * 0.0032, "%d of %d rounded up", up, N);
    for (int i = 0; i < 1000; i++) {
        cr_assert_eq(mt_bf16_round_stochastic(1.5f, mt_lean_random(1, 2, (uint64_t)i)), 0x3fc0);
        cr_assert_eq(mt_bf16_round_stochastic(0.0f, mt_lean_random(1, 2, (uint64_t)i)), 0);
    }
    const uint16_t nan = mt_bf16_round_stochastic(NAN, 0xffff);
    cr_assert(((nan >> 7) & 0xff) == 0xff && (nan & 0x7f), "NaN stays NaN (%#x)", nan);
    cr_assert_eq(mt_bf16_round_stochastic(INFINITY, 0xffff), 0x7f80);
    cr_assert(mt_lean_random(1, 2, 3) != mt_lean_random(1, 2, 4) || mt_lean_random(1, 2, 3) != mt_lean_random(1, 3, 3),
              "the bits depend on the parameter and the step");
}

/* A block of 256 and a short one, five steps each, against the same
 * algorithm in float64 from the same decoded moments: the new weight is one
 * of the two bf16 neighbours of the exact one (fp32's rounding of the update,
 * ~1e-7 relative, moves it across a neighbour only within that distance:
 * allowed), and the new moments decode within half a code step of the exact
 * ones (2^-4 relative for m, 2^-5 for sqrt(v), half the smallest subnormal
 * step times the scale below the normal range; plus 2^-16 relative for the
 * fp32 update and the scale's rounding). */
Test(lean, step_against_a_float64_reference)
{
    seed(19);
    const mt_adamw_hyper h = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                              .bias_correction1 = 0.0f, .bias_correction2 = 0.0f, .grad_scale = 0.7f};
    const size_t sizes[2] = {MT_Q8_BLOCK, 37};
    for (int k = 0; k < 2; k++) {
        const size_t n = sizes[k];
        uint16_t w[MT_Q8_BLOCK], g[MT_Q8_BLOCK];
        uint8_t qm[MT_Q8_BLOCK], qv[MT_Q8_BLOCK];
        float m0[MT_Q8_BLOCK], v0[MT_Q8_BLOCK], sm, sv;
        for (size_t i = 0; i < n; i++) {
            w[i] = mt_f32_to_bf16((float)(0.02 * normal01()));
            m0[i] = (float)(1e-3 * normal01());
            v0[i] = (float)(1e-6 * uniform01() * uniform01());
        }
        cr_assert_eq(mt_q8_encode_signed(m0, n, qm, &sm), 0);
        cr_assert_eq(mt_q8_encode_sqrt(v0, n, qv, &sv), 0);
        for (int t = 1; t <= 5; t++) {
            mt_adamw_hyper ht = h;
            ht.bias_correction1 = (float)(1 - pow(h.beta1, t));
            ht.bias_correction2 = (float)(1 - pow(h.beta2, t));
            for (size_t i = 0; i < n; i++) g[i] = mt_f32_to_bf16((float)(1e-3 * normal01()));
            /* the reference, from the moments as the step decodes them */
            double rm[MT_Q8_BLOCK], rv[MT_Q8_BLOCK], rp[MT_Q8_BLOCK];
            for (size_t i = 0; i < n; i++) {
                const double gi = (double)mt_bf16_to_f32(g[i]) * h.grad_scale;
                const double mi = (double)mt_q8_value_signed(qm[i]) * sm;
                const double si = (double)mt_q8_value_sqrt(qv[i]) * sv, vi = si * si;
                rm[i] = h.beta1 * mi + (1 - (double)h.beta1) * gi;
                rv[i] = h.beta2 * vi + (1 - (double)h.beta2) * gi * gi;
                const double bc1 = 1 - pow(h.beta1, t), bc2 = 1 - pow(h.beta2, t);
                rp[i] = (double)mt_bf16_to_f32(w[i]) * (1 - (double)h.lr * h.weight_decay) -
                        (double)h.lr / bc1 * (rm[i] / (sqrt(rv[i]) / sqrt(bc2) + h.eps));
            }
            cr_assert_eq(mt_lean_step_block(&ht, 11, (uint64_t)t, 1000, n, w, g, qm, &sm, qv, &sv), 0);
            for (size_t i = 0; i < n; i++) {
                float lo, hi;
                neighbours(rp[i], &lo, &hi);
                const float got = mt_bf16_to_f32(w[i]), slack = (float)(fabs(rp[i]) * 1e-6);
                cr_assert(got >= lo - slack && got <= hi + slack, "step %d [%zu]: %g is not a neighbour of %.9g", t, i,
                          got, rp[i]);
                const double m = (double)mt_q8_value_signed(qm[i]) * sm;
                const double s = (double)mt_q8_value_sqrt(qv[i]) * sv;
                const double em = fabs(m - rm[i]), es = fabs(s - sqrt(rv[i]));
                if (fabs(rm[i]) >= ldexp(sm, -14))
                    cr_assert_leq(em, fabs(rm[i]) * (0x1p-4 + 0x1p-16), "m [%zu]: %g for %g", i, m, rm[i]);
                else
                    cr_assert_leq(em, ldexp(sm, -18) * (1 + 0x1p-16) + fabs(rm[i]) * 0x1p-16, "m [%zu]", i);
                if (sqrt(rv[i]) >= ldexp(sv, -14))
                    cr_assert_leq(es, sqrt(rv[i]) * (0x1p-5 + 0x1p-16), "sqrt v [%zu]: %g for %g", i, s, sqrt(rv[i]));
                else
                    cr_assert_leq(es, ldexp(sv, -19) * (1 + 0x1p-16) + sqrt(rv[i]) * 0x1p-16, "sqrt v [%zu]", i);
            }
        }
    }
}

Test(lean, nan_gradient_refused_without_writing_and_runs_repeat)
{
    const mt_adamw_hyper h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f,
                              .bias_correction1 = 0.1f, .bias_correction2 = 0.001f, .grad_scale = 1.0f};
    uint16_t w[8], g[8], w2[8];
    uint8_t qm[8] = {0}, qv[8] = {0}, qm2[8], qv2[8];
    float sm = 0, sv = 0, sm2, sv2;
    for (int i = 0; i < 8; i++) w[i] = mt_f32_to_bf16(0.1f * (float)i), g[i] = mt_f32_to_bf16(0.01f * (float)(i - 4));
    memcpy(w2, w, sizeof w);
    cr_assert_eq(mt_lean_step_block(&h, 5, 1, 0, 8, w, g, qm, &sm, qv, &sv), 0);
    memcpy(qm2, qm, 8), memcpy(qv2, qv, 8), sm2 = sm, sv2 = sv;
    uint8_t qa[8] = {0}, qb[8] = {0};
    float sa = 0, sb = 0;
    cr_assert_eq(mt_lean_step_block(&h, 5, 1, 0, 8, w2, g, qa, &sa, qb, &sb), 0);
    cr_assert(!memcmp(w, w2, sizeof w) && !memcmp(qa, qm2, 8) && !memcmp(qb, qv2, 8) && sa == sm2 && sb == sv2,
              "the same inputs give the same bits");
    uint16_t before[8];
    memcpy(before, w, sizeof w);
    g[3] = 0x7fc0; /* NaN */
    cr_assert_eq(mt_lean_step_block(&h, 5, 2, 0, 8, w, g, qm, &sm, qv, &sv), -1);
    cr_assert(!memcmp(w, before, sizeof w) && !memcmp(qm, qm2, 8) && !memcmp(qv, qv2, 8) && sm == sm2 && sv == sv2,
              "nothing written");
}
