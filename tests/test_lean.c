/* The lean mode's AdamW step (src/optim/lean.h): a block's step against a
 * float64 reference of the same algorithm; updates of a fraction of a weight
 * code's step move the weights as much as the exact ones on average, as
 * slowly decaying moments decay as the exact ones do (the codes' stochastic
 * rounding); NaN gradients refused without writing; the same inputs give the
 * same bits; the SIMD kernels give the scalar kernel's bits. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "optim/lean.h"
#include "optim/q16.h"
#include "optim/q8.h"
#include "rng.h"

static double uniform01(void) { return ((double)(next_u64() >> 11) + 0.5) / 9007199254740992.0; }
static double normal01(void) { return sqrt(-2.0 * log(uniform01())) * cos(6.283185307179586 * uniform01()); }

/* A block of 256 and a short one, five steps each, against the same
 * algorithm in float64 from the same decoded weights and moments.
 *
 * The fp32 update p differs from the exact one by at most 2^-20 times the
 * magnitudes it combines: a dozen roundings of at most 2^-24 each (the
 * constants, the gradient's scaling, the products, sums, sqrt and division),
 * the cancellation in m's sum counted at the size of its two terms, so the
 * slack is 2^-20 (|decayed weight| + |p| + step (|beta1 m0| +
 * |(1 - beta1) g|) / denominator). The new scale is the least power of two s with the block's
 * largest |p| <= 32767 s (to within that slack), and each weight code q is
 * p / s rounded down or up (stochastically), so |q s - exact| < s + slack:
 * the weights are held to the block's scale, 2^-16 to 2^-15 of its largest
 * weight, however small each weight is (bf16, the format before, held each
 * to 2^-8 of its own magnitude). Here the slack stays below a tenth of s
 * (it is largest where a small v makes the update large), so the bound is
 * within 10% of the format's own.
 *
 * The new moments decode within one code step of the exact ones (the codes
 * are stochastically rounded, to either neighbour: 2^-3 relative for m,
 * 2^-4 for sqrt(v), the smallest subnormal step times the scale below the
 * normal range; plus 2^-16 relative for the fp32 update and the scale's
 * rounding). */
Test(lean, step_against_a_float64_reference)
{
    seed(19);
    const mt_adamw_hyper h = {.lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                              .bias_correction1 = 0.0f, .bias_correction2 = 0.0f, .grad_scale = 0.7f};
    const size_t sizes[2] = {MT_Q8_BLOCK, 37};
    for (int k = 0; k < 2; k++) {
        const size_t n = sizes[k];
        int16_t wq[MT_Q8_BLOCK];
        uint16_t g[MT_Q8_BLOCK];
        uint8_t qm[MT_Q8_BLOCK], qv[MT_Q8_BLOCK];
        float w0[MT_Q8_BLOCK], m0[MT_Q8_BLOCK], v0[MT_Q8_BLOCK], sw, sm, sv;
        for (size_t i = 0; i < n; i++) {
            w0[i] = (float)(0.02 * normal01());
            m0[i] = (float)(1e-3 * normal01());
            v0[i] = (float)(1e-6 * uniform01() * uniform01());
        }
        cr_assert_eq(mt_q16_encode(w0, n, wq, &sw), 0);
        cr_assert_eq(mt_q8_encode_signed(m0, n, qm, &sm), 0);
        cr_assert_eq(mt_q8_encode_sqrt(v0, n, qv, &sv), 0);
        for (int t = 1; t <= 5; t++) {
            mt_adamw_hyper ht = h;
            ht.bias_correction1 = (float)(1 - pow(h.beta1, t));
            ht.bias_correction2 = (float)(1 - pow(h.beta2, t));
            for (size_t i = 0; i < n; i++) g[i] = mt_f32_to_bf16((float)(1e-3 * normal01()));
            /* the reference, from the weights and moments as the step decodes them */
            double rm[MT_Q8_BLOCK], rv[MT_Q8_BLOCK], rp[MT_Q8_BLOCK], slack[MT_Q8_BLOCK], amax = 0, amax_slack = 0;
            for (size_t i = 0; i < n; i++) {
                const double gi = (double)mt_bf16_to_f32(g[i]) * h.grad_scale;
                const double mi = (double)mt_q8_value_signed(qm[i]) * sm;
                const double si = (double)mt_q8_value_sqrt(qv[i]) * sv, vi = si * si;
                rm[i] = h.beta1 * mi + (1 - (double)h.beta1) * gi;
                rv[i] = h.beta2 * vi + (1 - (double)h.beta2) * gi * gi;
                const double bc1 = 1 - pow(h.beta1, t), bc2 = 1 - pow(h.beta2, t);
                const double pi = (double)wq[i] * sw * (1 - (double)h.lr * h.weight_decay);
                const double denom = sqrt(rv[i]) / sqrt(bc2) + h.eps;
                rp[i] = pi - (double)h.lr / bc1 * (rm[i] / denom);
                const double m_terms = fabs(h.beta1 * mi) + fabs((1 - (double)h.beta1) * gi);
                slack[i] = 0x1p-20 * (fabs(pi) + fabs(rp[i]) + (double)h.lr / bc1 * m_terms / denom);
                if (fabs(rp[i]) > amax) amax = fabs(rp[i]), amax_slack = slack[i];
            }
            cr_assert_eq(mt_lean_step_block(&ht, 11, (uint64_t)t, 1000, n, wq, &sw, g, qm, &sm, qv, &sv), 0);
            int e;
            cr_assert(frexpf(sw, &e) == 0.5f, "step %d: the scale %a is a power of two", t, (double)sw);
            cr_assert(amax - amax_slack <= MT_Q16_MAX * (double)sw && amax + amax_slack > MT_Q16_MAX * (double)sw / 2,
                      "step %d: %a is the least power of two that holds %.9g", t, (double)sw, amax);
            for (size_t i = 0; i < n; i++) {
                const double got = (double)wq[i] * sw;
                cr_assert_lt(fabs(got - rp[i]), sw + slack[i], "step %d [%zu]: %.9g is not a neighbour of %.9g", t, i,
                             got, rp[i]);
                const double m = (double)mt_q8_value_signed(qm[i]) * sm;
                const double s = (double)mt_q8_value_sqrt(qv[i]) * sv;
                const double em = fabs(m - rm[i]), es = fabs(s - sqrt(rv[i]));
                if (fabs(rm[i]) >= ldexp(sm, -14))
                    cr_assert_leq(em, fabs(rm[i]) * (0x1p-3 + 0x1p-16), "m [%zu]: %g for %g", i, m, rm[i]);
                else
                    cr_assert_leq(em, ldexp(sm, -17) * (1 + 0x1p-16) + fabs(rm[i]) * 0x1p-16, "m [%zu]", i);
                if (sqrt(rv[i]) >= ldexp(sv, -14))
                    cr_assert_leq(es, sqrt(rv[i]) * (0x1p-4 + 0x1p-16), "sqrt v [%zu]: %g for %g", i, s, sqrt(rv[i]));
                else
                    cr_assert_leq(es, ldexp(sv, -18) * (1 + 0x1p-16) + sqrt(rv[i]) * 0x1p-16, "sqrt v [%zu]", i);
            }
        }
    }
}

/* Updates of a tenth of a weight code's step: with beta1 = beta2 = 0, a
 * gradient of +-1 and eps below fp32's resolution at 1, the update is
 * exactly lr against the gradient's sign, and lr is 0.1 s for the block's
 * scale s = 2^-15 (held by element 0, 0.75, whose gradient is 0: its weight
 * stays). Rounded to nearest, every weight would stay where it is; rounded
 * stochastically, each code moves one step against its gradient with
 * probability 0.1 (0.9 of the step is dropped, up to the fp32 rounding of
 * lr and p, 2^-9 of a step) and stays otherwise: after 200 steps each has
 * moved Binomial(200, 0.1) steps, 20 on average with a standard deviation
 * of 4.2, and their mean over the 255 elements has a standard deviation of
 * 0.27: the bound, 1.5, is 5.6 of them. */
Test(lean, small_weight_updates_accumulate)
{
    enum { N = MT_Q8_BLOCK, T = 200 };
    const mt_adamw_hyper h = {.lr = 0.1f * 0x1p-15f, .beta1 = 0.0f, .beta2 = 0.0f, .eps = 1e-8f, .weight_decay = 0.0f,
                              .bias_correction1 = 1.0f, .bias_correction2 = 1.0f, .grad_scale = 1.0f};
    seed(41);
    int16_t wq[N], wq0[N];
    uint16_t g[N];
    uint8_t qm[N] = {0}, qv[N] = {0};
    float sw = 0x1p-15f, sm = 0, sv = 0;
    wq[0] = 24576, g[0] = 0; /* 0.75 */
    for (int i = 1; i < N; i++) {
        wq[i] = (int16_t)((int)(next_u64() % 40001) - 20000);
        g[i] = mt_f32_to_bf16(i % 2 ? 1.0f : -1.0f);
    }
    memcpy(wq0, wq, sizeof wq);
    for (int t = 1; t <= T; t++) {
        int16_t before[N];
        memcpy(before, wq, sizeof wq);
        cr_assert_eq(mt_lean_step_block(&h, 13, (uint64_t)t, 4096, N, wq, &sw, g, qm, &sm, qv, &sv), 0);
        cr_assert_eq(sw, 0x1p-15f, "step %d: the scale stays", t);
        cr_assert_eq(wq[0], 24576);
        for (int i = 1; i < N; i++) {
            const int moved = (before[i] - wq[i]) * (i % 2 ? 1 : -1);
            cr_assert(moved == 0 || moved == 1, "step %d [%d]: %d to %d, not a neighbour", t, i, before[i], wq[i]);
        }
    }
    double mean = 0;
    for (int i = 1; i < N; i++) mean += (double)((wq0[i] - wq[i]) * (i % 2 ? 1 : -1)) / (N - 1);
    cr_log_info("after %d steps of 0.1 of a code step: moved %.3f steps on average", T, mean);
    cr_assert(fabs(mean - 0.1 * T) <= 1.5, "moved %.3f code steps on average, not %g", mean, 0.1 * T);
}

/* A second moment decaying slowly, as a quiet parameter's does: v = 0.95 v a
 * step, sqrt(v) 2.5% a step, less than half a step of the v code (3.1% to
 * 1.6% of the value, by its mantissa). Rounded to nearest, every code in the
 * lower quarter of an octave (mantissa 0 to 3) would keep its value forever
 * (sqrt(0.95) c rounds back to c), and the other codes would fall to there
 * and stay; rounded stochastically, each sqrt(v) is a martingale: its
 * expectation decays as the exact recurrence's. m likewise: 0.9 m a step is
 * 0.8 to 1.5 steps of its 3-bit code, which rounding to nearest makes whole
 * steps, and none at all for the subnormal codes below 5.
 *
 * A block of 256: element 0 keeps a gradient of 1 and moments of 1 (0.95 +
 * 0.05 and 0.9 + 0.1 are 1 in fp32), so the block's scales stay where they
 * are (were every element to decay, every quotient by the scale would stay
 * the same and no code would need to move); 255 distinct gradients at the
 * first step (sqrt(v) / scale from 2^-4 to 1.9: normal codes throughout the
 * 200 steps), then 0. Over the 255 elements, the mean of sqrt(v) over the
 * exact sqrt(v) (0.95^(t/2) times that of the first step's codes) is within
 * 5% of 1 after 50 steps and within 10% after 100, 150 and 200, and the
 * mean of m over the exact m (0.9^t) within 7.5% after 50 (m reaches the
 * subnormal codes soon after). The means random-walk: over 200 seeds their
 * root mean square distances from 1 were 1.0% after 50 steps, 2.2% after
 * 200 (sqrt(v)) and 1.5% after 50 (m), the bounds 4.5 to 5 of them.
 *
 * Encoded to nearest instead (mt_q8_encode_signed and mt_q8_encode_sqrt in
 * mt_lean_step_block, tried), the test fails: the means after 50 steps are
 * 2.96 for sqrt(v) and 1.36 for m, and 139 for sqrt(v) after 200 (of
 * 0.95^-100 = 169 were it not to move at all). */
Test(lean, slowly_decaying_moments_decay_as_the_exact_ones)
{
    const mt_adamw_hyper h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.0f,
                              .bias_correction1 = 1.0f, .bias_correction2 = 1.0f, .grad_scale = 1.0f};
    enum { N = MT_Q8_BLOCK };
    int16_t wq[N] = {0};
    uint16_t g[N];
    uint8_t qm[N], qv[N];
    float m0[N] = {1.0f}, v0[N] = {1.0f}, sw = 0, sm, sv;
    cr_assert_eq(mt_q8_encode_signed(m0, N, qm, &sm), 0);
    cr_assert_eq(mt_q8_encode_sqrt(v0, N, qv, &sv), 0);
    g[0] = mt_f32_to_bf16(1.0f);
    for (int i = 1; i < N; i++) {
        g[i] = mt_f32_to_bf16((float)(0.15 * pow(29.0, (double)(i - 1) / (N - 2))) * (i % 2 ? 1.0f : -1.0f));
        cr_assert_neq(g[i] & 0x7fff, g[i - 1] & 0x7fff, "distinct gradients");
    }
    cr_assert_eq(mt_lean_step_block(&h, 3, 1, 512, N, wq, &sw, g, qm, &sm, qv, &sv), 0);
    double m1[N], s1[N];
    for (int i = 1; i < N; i++) {
        m1[i] = (double)mt_q8_value_signed(qm[i]) * sm, s1[i] = (double)mt_q8_value_sqrt(qv[i]) * sv;
        cr_assert(fabs(s1[i]) / sv >= 0x1p-5 && fabs(s1[i]) / sv <= MT_Q8_MAX_SQRT, "[%d]", i);
        g[i] = 0;
    }
    for (int t = 2; t <= 201; t++) {
        cr_assert_eq(mt_lean_step_block(&h, 3, (uint64_t)t, 512, N, wq, &sw, g, qm, &sm, qv, &sv), 0);
        const int after = t - 1;
        if (after % 50) continue;
        double mean_s = 0, mean_m = 0;
        for (int i = 1; i < N; i++) {
            mean_s += (double)mt_q8_value_sqrt(qv[i]) * sv / (s1[i] * pow(0.95, after / 2.0)) / (N - 1);
            mean_m += (double)mt_q8_value_signed(qm[i]) * sm / (m1[i] * pow(0.9, after)) / (N - 1);
        }
        cr_log_info("after %d steps: mean sqrt(v) / exact %.4f, m %.4f (scales %g %g)", after, mean_s, mean_m,
                    (double)sv, (double)sm);
        cr_assert(fabs(mean_s - 1) <= (after == 50 ? 0.05 : 0.1), "after %d steps sqrt(v) decayed to %.4f of the exact",
                  after, mean_s);
        if (after == 50) cr_assert(fabs(mean_m - 1) <= 0.075, "after 50 steps m decayed to %.4f of the exact", mean_m);
    }
}

Test(lean, nan_gradient_refused_without_writing_and_runs_repeat)
{
    const mt_adamw_hyper h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.0f,
                              .bias_correction1 = 0.1f, .bias_correction2 = 0.001f, .grad_scale = 1.0f};
    int16_t wq[8], wq2[8];
    uint16_t g[8];
    uint8_t qm[8] = {0}, qv[8] = {0}, qm2[8], qv2[8];
    float w0[8], sw, sm = 0, sv = 0, sw2, sm2, sv2;
    for (int i = 0; i < 8; i++) w0[i] = 0.1f * (float)i, g[i] = mt_f32_to_bf16(0.01f * (float)(i - 4));
    cr_assert_eq(mt_q16_encode(w0, 8, wq, &sw), 0);
    memcpy(wq2, wq, sizeof wq), sw2 = sw;
    cr_assert_eq(mt_lean_step_block(&h, 5, 1, 0, 8, wq, &sw, g, qm, &sm, qv, &sv), 0);
    memcpy(qm2, qm, 8), memcpy(qv2, qv, 8), sm2 = sm, sv2 = sv;
    uint8_t qa[8] = {0}, qb[8] = {0};
    float sa = 0, sb = 0;
    cr_assert_eq(mt_lean_step_block(&h, 5, 1, 0, 8, wq2, &sw2, g, qa, &sa, qb, &sb), 0);
    cr_assert(!memcmp(wq, wq2, sizeof wq) && sw == sw2 && !memcmp(qa, qm2, 8) && !memcmp(qb, qv2, 8) && sa == sm2 &&
                  sb == sv2,
              "the same inputs give the same bits");
    int16_t before[8];
    const float sw_before = sw;
    memcpy(before, wq, sizeof wq);
    g[3] = 0x7fc0; /* NaN */
    cr_assert_eq(mt_lean_step_block(&h, 5, 2, 0, 8, wq, &sw, g, qm, &sm, qv, &sv), -1);
    cr_assert(!memcmp(wq, before, sizeof wq) && sw == sw_before && !memcmp(qm, qm2, 8) && !memcmp(qv, qv2, 8) &&
                  sm == sm2 && sv == sv2,
              "nothing written");
}

/* ---- the SIMD kernels against the scalar one ------------------------------------
 * Every kernel mt_lean_kernel gives must compute the scalar kernel's bits:
 * weight codes, moment codes, scales and the return value, and nothing
 * written (nor anything outside [0, n) ever) when it returns -1. Blocks of
 * every kind of tail, gradients over many orders of magnitude (codes of both
 * ranges, subnormal codes, fp32 subnormal moments), zeros and negative
 * zeros, blocks of zeros (scale 0), a gradient whose square overflows (-1),
 * weights over any range fp32 holds, NaN and infinite weight scales (-1),
 * weight codes and moment codes of every value (0x80, a negative zero, and
 * the weight code -32768, which no encoder makes, among them), through
 * several steps each. */

static const mt_adamw_isa lean_isas[] = {MT_ADAMW_SCALAR, MT_ADAMW_AVX2, MT_ADAMW_AVX512, MT_ADAMW_AVX512BF16};

Test(lean, kernels_of_each_isa)
{
    cr_assert_eq(mt_lean_kernel(MT_ADAMW_SCALAR), mt_lean_step_block, "the scalar kernel is always there");
    cr_assert_null(mt_lean_kernel(MT_ADAMW_ISA_COUNT));
    cr_assert_null(mt_lean_kernel((mt_adamw_isa)-1));
    const mt_adamw_hyper h = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                              .bias_correction1 = 0.1f, .bias_correction2 = 0.05f, .grad_scale = 1.0f};
    for (int i = 0; i < MT_ADAMW_ISA_COUNT; i++) {
        const mt_lean_block_fn k = mt_lean_kernel((mt_adamw_isa)i);
        cr_assert_eq(k != NULL, mt_adamw_kernel((mt_adamw_isa)i) != NULL,
                     "a lean kernel for %s exactly when there is an AdamW one", mt_adamw_isa_name((mt_adamw_isa)i));
        if (!k) continue;
        /* an empty block: scales 0, as the scalar kernel's; more than a block: refused, nothing written */
        int16_t wq[MT_Q8_BLOCK + 1] = {1000};
        uint16_t g[MT_Q8_BLOCK + 1] = {0x3c00};
        uint8_t qm[MT_Q8_BLOCK + 1] = {1}, qv[MT_Q8_BLOCK + 1] = {2};
        float sw = 1.0f, sm = 1.0f, sv = 1.0f;
        cr_assert_eq(k(&h, 1, 1, 0, 0, wq, &sw, g, qm, &sm, qv, &sv), 0);
        cr_assert(sw == 0.0f && sm == 0.0f && sv == 0.0f && !signbit(sw) && !signbit(sm) && !signbit(sv) &&
                      wq[0] == 1000 && qm[0] == 1 && qv[0] == 2,
                  "%s: n = 0", mt_adamw_isa_name((mt_adamw_isa)i));
        sw = 1.0f, sm = 1.0f, sv = 1.0f;
        cr_assert_eq(k(&h, 1, 1, 0, MT_Q8_BLOCK + 1, wq, &sw, g, qm, &sm, qv, &sv), -1);
        cr_assert(sw == 1.0f && sm == 1.0f && sv == 1.0f && wq[0] == 1000 && qm[0] == 1 && qv[0] == 2,
                  "%s: n > MT_Q8_BLOCK", mt_adamw_isa_name((mt_adamw_isa)i));
    }
}

/* One block's arrays, n elements from `off` of a padded allocation whose
 * guard bytes must stay as they are. */
enum { GUARD = 40 };
typedef struct {
    size_t n;
    int16_t wq[MT_Q8_BLOCK + 2 * GUARD];
    uint16_t g[MT_Q8_BLOCK + 2 * GUARD];
    uint8_t qm[MT_Q8_BLOCK + 2 * GUARD], qv[MT_Q8_BLOCK + 2 * GUARD];
    float sw, sm, sv;
    size_t off;
} lean_block;

static void block_guards(lean_block *b, size_t off)
{
    b->off = off;
    memset(b->wq, 0xa5, sizeof b->wq), memset(b->g, 0x5a, sizeof b->g);
    memset(b->qm, 0xc3, sizeof b->qm), memset(b->qv, 0x3c, sizeof b->qv);
}

static int block_run(mt_lean_block_fn k, const mt_adamw_hyper *h, uint64_t sd, uint64_t step, uint64_t index0,
                     lean_block *b)
{
    return k(h, sd, step, index0, b->n, b->wq + b->off, &b->sw, b->g + b->off, b->qm + b->off, &b->sm,
             b->qv + b->off, &b->sv);
}

static int same_block(const lean_block *a, const lean_block *b)
{
    return !memcmp(a->wq, b->wq, sizeof a->wq) && !memcmp(a->g, b->g, sizeof a->g) &&
           !memcmp(a->qm, b->qm, sizeof a->qm) && !memcmp(a->qv, b->qv, sizeof a->qv) &&
           !memcmp(&a->sw, &b->sw, sizeof a->sw) && !memcmp(&a->sm, &b->sm, sizeof a->sm) &&
           !memcmp(&a->sv, &b->sv, sizeof a->sv);
}

static void report_difference(const lean_block *a, const lean_block *b, const char *isa, int trial, int t)
{
    for (size_t i = 0; i < MT_Q8_BLOCK + 2 * GUARD; i++) {
        cr_expect_eq(a->wq[i], b->wq[i], "%s, trial %d step %d: wq[%zd] %d, scalar %d", isa, trial, t,
                     (ptrdiff_t)i - (ptrdiff_t)a->off, b->wq[i], a->wq[i]);
        cr_expect_eq(a->qm[i], b->qm[i], "%s, trial %d step %d: qm[%zd] %#04x, scalar %#04x", isa, trial, t,
                     (ptrdiff_t)i - (ptrdiff_t)a->off, b->qm[i], a->qm[i]);
        cr_expect_eq(a->qv[i], b->qv[i], "%s, trial %d step %d: qv[%zd] %#04x, scalar %#04x", isa, trial, t,
                     (ptrdiff_t)i - (ptrdiff_t)a->off, b->qv[i], a->qv[i]);
    }
    cr_assert_fail("%s, trial %d step %d (n %zu): not the scalar kernel's bits (scales %a %a %a, scalar %a %a %a)",
                   isa, trial, t, a->n, (double)b->sw, (double)b->sm, (double)b->sv, (double)a->sw, (double)a->sm,
                   (double)a->sv);
}

/* A bf16 gradient of kind: 0 log-uniform over 12 decades, 1 the same with a
 * third zeros or negative zeros, 2 all zero, 3 log-uniform over 50 decades
 * (1e-35 .. 1e15: fp32 subnormal squares, codes at both ends; top unused). */
static uint16_t lean_grad(int kind, double top)
{
    const double sign = uniform01() < 0.5 ? -1.0 : 1.0;
    switch (kind) {
    case 0:
        return mt_f32_to_bf16((float)(sign * top * pow(10.0, -12.0 * uniform01())));
    case 1:
        if (uniform01() < 0.33) return sign < 0 ? 0x8000 : 0;
        return mt_f32_to_bf16((float)(sign * top * pow(10.0, -12.0 * uniform01())));
    case 2:
        return sign < 0 ? 0x8000 : 0;
    default:
        return mt_f32_to_bf16((float)(sign * pow(10.0, -35.0 + 50.0 * uniform01())));
    }
}

static mt_adamw_hyper lean_hyper(int t, float lr, float wd, float grad_scale, float eps, float beta2)
{
    mt_adamw_hyper h = {.lr = lr, .beta1 = 0.9f, .beta2 = beta2, .eps = eps, .weight_decay = wd,
                        .bias_correction1 = 0, .bias_correction2 = 0, .grad_scale = grad_scale};
    h.bias_correction1 = (float)(1 - pow(h.beta1, t));
    h.bias_correction2 = (float)(1 - pow(h.beta2, t));
    return h;
}

/* The weights of a block of `variant`: even variants encode values as the
 * format holds them (normal with a standard deviation wtop; variant 2 with
 * scale 0, a block of zeros and negative zeros; variant 4 log-uniform over
 * fp32's whole normal range, most codes 0 under a scale near 2^113), odd
 * ones take codes of every value with a power-of-two scale from fp32's
 * smallest subnormal to 2^113 (where -32768 decodes to -infinity), not a
 * power of two for variant 11, NaN or infinite for variant 3. */
static void lean_weights(int variant, double wtop, size_t n, int16_t *wq, float *sw)
{
    if (variant % 2 == 0) {
        float x[MT_Q8_BLOCK];
        for (size_t i = 0; i < n; i++) {
            const double sign = uniform01() < 0.5 ? -1.0 : 1.0;
            x[i] = (float)(variant == 4 ? sign * pow(10.0, -37.0 + 75.0 * uniform01()) : wtop * normal01());
        }
        cr_assert_eq(mt_q16_encode(x, n, wq, sw), 0);
        if (variant == 2) *sw = 0.0f;
        return;
    }
    for (size_t i = 0; i < n; i++) wq[i] = (int16_t)next_u64();
    *sw = ldexpf(1.0f, (int)(next_u64() % 263) - 149);
    if (variant == 11) *sw *= (float)(1.0 + uniform01());
    if (variant == 3) {
        static const float bad[] = {NAN, INFINITY, -INFINITY};
        *sw = bad[next_u64() % 3];
    }
}

ParameterizedTestParameters(lean, same_bits_as_scalar)
{
    return cr_make_param_array(mt_adamw_isa, lean_isas, sizeof lean_isas / sizeof lean_isas[0]);
}

ParameterizedTest(mt_adamw_isa *isa, lean, same_bits_as_scalar)
{
    const mt_lean_block_fn k = mt_lean_kernel(*isa);
    if (!k) cr_skip_test("this CPU cannot run the %s kernel", mt_adamw_isa_name(*isa));
    const char *name = mt_adamw_isa_name(*isa);
    static const size_t sizes[] = {1, 7, 16, 17, 255, 256, 8, 9, 31, 33, 100, 249};
    static lean_block a, b; /* the scalar kernel's and this one's */
    seed(23 + (uint64_t)*isa);
    int refused = 0, zero_scales = 0, zero_weights = 0, bad_scales = 0, sub_m = 0, sub_v = 0, neg_sub_m = 0;
    for (int trial = 0; trial < 48 * 12 * 5; trial++) {
        const size_t n = sizes[trial % 12];
        const int kind = (trial / 12) % 4, variant = (trial / 48) % 12; /* 12 of each size and kind */
        block_guards(&a, (size_t)trial % 5);
        a.n = n;
        const double top = pow(10.0, -20.0 + 25.0 * uniform01()); /* the block's largest gradient */
        lean_weights(variant, pow(10.0, -30.0 + 32.0 * uniform01()), n, a.wq + a.off, &a.sw);
        bad_scales += variant == 3;
        if (variant % 2 == 0) { /* moments from zero */
            memset(a.qm + a.off, 0, n), memset(a.qv + a.off, 0, n);
            a.sm = 0, a.sv = 0;
        } else { /* codes of every value, scales of any size */
            for (size_t i = 0; i < n; i++) a.qm[a.off + i] = (uint8_t)next_u64(), a.qv[a.off + i] = (uint8_t)next_u64();
            a.sm = (float)pow(10.0, -25.0 + 24.0 * uniform01());
            a.sv = (float)pow(10.0, -25.0 + 24.0 * uniform01());
        }
        const float wd = variant % 3 == 0 ? 0.0f : 0.1f, gs = variant % 4 == 1 ? 0.37f : variant == 6 ? 3.0f : 1.0f;
        /* eps 0, or as large as sqrt(v): the denominator's sum rounds in earnest */
        const float eps = variant == 8 ? 0.0f : variant >= 10 ? (float)(0.3 * top) : 1e-8f;
        const float lr = variant == 9 || variant == 11 ? 0.5f : 3e-3f;
        const uint64_t sd = next_u64(), index0 = variant == 7 ? UINT64_MAX - 100 : next_u64() >> (trial % 64);
        for (int t = 1; t <= 6; t++) {
            /* beta2 > 1: 1 - beta2 < 0, a negative v is refused */
            const mt_adamw_hyper h = lean_hyper(t, lr, wd, gs, eps, variant == 5 && kind == 0 ? 1.5f : 0.95f);
            uint16_t *g = a.g + a.off;
            for (size_t i = 0; i < n; i++) g[i] = lean_grad(t == 6 && kind == 2 ? 1 : kind, top);
            if (t == 4 && kind == 3) g[n - 1 - n / 3] = mt_f32_to_bf16(-3e19f); /* its square overflows */
            b = a;
            const int ra = block_run(mt_lean_step_block, &h, sd, (uint64_t)t, index0, &a);
            const int rb = block_run(k, &h, sd, (uint64_t)t, index0, &b);
            cr_assert_eq(rb, ra, "%s, trial %d step %d: returned %d, scalar %d", name, trial, t, rb, ra);
            if (!same_block(&a, &b)) report_difference(&a, &b, name, trial, t);
            refused += ra != 0;
            zero_scales += ra == 0 && a.sm == 0 && a.sv == 0;
            zero_weights += ra == 0 && a.sw == 0;
            for (size_t i = 0; ra == 0 && i < n; i++) {
                const unsigned cm = a.qm[a.off + i] & 0x7fu, cv = a.qv[a.off + i];
                sub_m += cm > 0 && cm < 8, sub_v += cv > 0 && cv < 16;
                neg_sub_m += cm > 0 && cm < 8 && a.qm[a.off + i] >= 0x80;
            }
        }
    }
    /* the inputs reached the paths they are there for */
    cr_assert_gt(refused, 0, "some block overflowed");
    cr_assert_gt(zero_scales, 0, "some block's moments were all zeros");
    cr_assert_gt(zero_weights, 0, "some block's weights were all zeros");
    cr_assert_gt(bad_scales, 0);
    cr_assert(sub_m > 0 && neg_sub_m > 0 && sub_v > 0, "subnormal codes: %d m (%d negative), %d v", sub_m, neg_sub_m,
              sub_v);
}

/* A NaN or infinite gradient anywhere (a full vector, the tail) makes every
 * kernel return -1 and leave the block as it was. */
ParameterizedTestParameters(lean, nan_or_inf_gradient_refused_like_scalar)
{
    return cr_make_param_array(mt_adamw_isa, lean_isas, sizeof lean_isas / sizeof lean_isas[0]);
}

ParameterizedTest(mt_adamw_isa *isa, lean, nan_or_inf_gradient_refused_like_scalar)
{
    const mt_lean_block_fn k = mt_lean_kernel(*isa);
    if (!k) cr_skip_test("this CPU cannot run the %s kernel", mt_adamw_isa_name(*isa));
    static const size_t sizes[] = {1, 7, 16, 17, 255, 256};
    static const uint16_t bad[] = {0x7fc0, 0xffc0, 0x7f81, 0x7f80, 0xff80};
    static lean_block a, before;
    seed(31);
    for (size_t si = 0; si < 6; si++)
        for (size_t bi = 0; bi < 5; bi++)
            for (int where = 0; where < 3; where++) {
                const size_t n = sizes[si];
                block_guards(&a, bi);
                a.n = n;
                lean_weights(0, 0.02, n, a.wq + a.off, &a.sw);
                for (size_t i = 0; i < n; i++) {
                    a.g[a.off + i] = lean_grad(0, 1e-3);
                    a.qm[a.off + i] = (uint8_t)next_u64(), a.qv[a.off + i] = (uint8_t)next_u64();
                }
                a.sm = 1e-4f, a.sv = 1e-3f;
                a.g[a.off + (where == 0 ? 0 : where == 1 ? n / 2 : n - 1)] = bad[bi];
                const mt_adamw_hyper h = lean_hyper(3, 1e-3f, 0.1f, 1.0f, 1e-8f, 0.95f);
                before = a;
                cr_assert_eq(block_run(mt_lean_step_block, &h, 1, 2, 3, &a), -1);
                cr_assert(same_block(&a, &before), "scalar: nothing written");
                cr_assert_eq(block_run(k, &h, 1, 2, 3, &a), -1, "%s, n %zu, gradient %#06x at %d",
                             mt_adamw_isa_name(*isa), n, bad[bi], where);
                cr_assert(same_block(&a, &before), "%s, n %zu: nothing written", mt_adamw_isa_name(*isa), n);
            }
}

/* A weight that is not finite with finite moments: every weight of a block
 * with a NaN or infinite scale (0 times infinity is NaN), or one weight that
 * overflows on its own: the largest code 32767 under the scale 2^113 is
 * 2^-15 below FLT_MAX, and an update of lr = 1e35 (beta1 = beta2 = 0: m is
 * the gradient, the update lr against its sign) away from zero takes it past
 * FLT_MAX (the other weights, codes below 30000, stay finite). Every kernel
 * returns -1 and leaves the block as it was; the same blocks with lr = 1e-3
 * (finite scales) are stepped. */
ParameterizedTestParameters(lean, nan_or_inf_weight_refused_like_scalar)
{
    return cr_make_param_array(mt_adamw_isa, lean_isas, sizeof lean_isas / sizeof lean_isas[0]);
}

ParameterizedTest(mt_adamw_isa *isa, lean, nan_or_inf_weight_refused_like_scalar)
{
    const mt_lean_block_fn k = mt_lean_kernel(*isa);
    if (!k) cr_skip_test("this CPU cannot run the %s kernel", mt_adamw_isa_name(*isa));
    const char *name = mt_adamw_isa_name(*isa);
    static const size_t sizes[] = {1, 7, 16, 17, 255, 256};
    static const float scales[] = {NAN, INFINITY, -INFINITY, 0x1p113f};
    static lean_block a, before;
    seed(37);
    for (size_t si = 0; si < 6; si++)
        for (size_t bi = 0; bi < 4; bi++)
            for (int where = 0; where < 3; where++) {
                const size_t n = sizes[si], at = where == 0 ? 0 : where == 1 ? n / 2 : n - 1;
                block_guards(&a, bi);
                a.n = n;
                for (size_t i = 0; i < n; i++) {
                    a.wq[a.off + i] = (int16_t)((int)(next_u64() % 60001) - 30000);
                    a.g[a.off + i] = lean_grad(0, 1e-3);
                    a.qm[a.off + i] = (uint8_t)next_u64(), a.qv[a.off + i] = (uint8_t)next_u64();
                }
                a.sw = scales[bi], a.sm = 1e-4f, a.sv = 1e-3f;
                const int sign = where == 1 ? -1 : 1;
                a.wq[a.off + at] = (int16_t)(sign * MT_Q16_MAX);
                a.g[a.off + at] = mt_f32_to_bf16(-1e-3f * (float)sign); /* the update away from zero */
                for (int big = 0; big < 2; big++) {
                    mt_adamw_hyper h = {.lr = big ? 1e35f : 1e-3f, .beta1 = 0.0f, .beta2 = 0.0f, .eps = 1e-8f,
                                        .weight_decay = 0.0f, .bias_correction1 = 1.0f, .bias_correction2 = 1.0f,
                                        .grad_scale = 1.0f};
                    const int want = big || isnan(a.sw) || isinf(a.sw) ? -1 : 0;
                    lean_block b;
                    before = a, b = a;
                    const int ra = block_run(mt_lean_step_block, &h, 1, 2, 3, &b);
                    cr_assert_eq(ra, want, "scalar, n %zu, scale %a, lr %g", n, (double)a.sw, (double)h.lr);
                    if (ra) cr_assert(same_block(&b, &before), "scalar: nothing written");
                    cr_assert_eq(block_run(k, &h, 1, 2, 3, &a), ra, "%s, n %zu, scale %a, lr %g", name, n,
                                 (double)a.sw, (double)h.lr);
                    if (!same_block(&b, &a)) report_difference(&b, &a, name, (int)(si * 100 + bi * 10 + where), big);
                    a = before;
                }
            }
}

/* Each kernel reads and writes the block and nothing else: blocks of every
 * length from 1 to 256 in heap allocations of exactly that length (a memory
 * checker reports a byte past the end), the results the scalar kernel's. */
ParameterizedTestParameters(lean, only_the_block_like_scalar)
{
    return cr_make_param_array(mt_adamw_isa, lean_isas, sizeof lean_isas / sizeof lean_isas[0]);
}

ParameterizedTest(mt_adamw_isa *isa, lean, only_the_block_like_scalar)
{
    const mt_lean_block_fn k = mt_lean_kernel(*isa);
    if (!k) cr_skip_test("this CPU cannot run the %s kernel", mt_adamw_isa_name(*isa));
    static lean_block a;
    seed(43);
    for (size_t n = 1; n <= MT_Q8_BLOCK; n++) {
        block_guards(&a, 0);
        a.n = n;
        lean_weights(0, 0.02, n, a.wq, &a.sw);
        for (size_t i = 0; i < n; i++)
            a.g[i] = lean_grad(0, 1e-3), a.qm[i] = (uint8_t)next_u64(), a.qv[i] = (uint8_t)next_u64();
        a.sm = 1e-4f, a.sv = 1e-3f;
        int16_t *wq = malloc(n * sizeof *wq);
        uint16_t *g = malloc(n * sizeof *g);
        uint8_t *qm = malloc(n), *qv = malloc(n);
        cr_assert(wq && g && qm && qv);
        memcpy(wq, a.wq, n * sizeof *wq), memcpy(g, a.g, n * sizeof *g), memcpy(qm, a.qm, n), memcpy(qv, a.qv, n);
        float sw = a.sw, sm = a.sm, sv = a.sv;
        const mt_adamw_hyper h = lean_hyper(2, 1e-3f, 0.1f, 1.0f, 1e-8f, 0.95f);
        cr_assert_eq(block_run(mt_lean_step_block, &h, 5, 2, 1000, &a), 0);
        cr_assert_eq(k(&h, 5, 2, 1000, n, wq, &sw, g, qm, &sm, qv, &sv), 0);
        cr_assert(!memcmp(wq, a.wq, n * sizeof *wq) && !memcmp(qm, a.qm, n) && !memcmp(qv, a.qv, n) && sw == a.sw &&
                      sm == a.sm && sv == a.sv,
                  "%s, n %zu: not the scalar kernel's bits", mt_adamw_isa_name(*isa), n);
        free(wq), free(g), free(qm), free(qv);
    }
}

/* Halfway between codes: with beta1 = beta2 = 0 the new m is the gradient
 * and sqrt(v) its magnitude, exactly; a block whose largest gradient is the
 * largest code's value has scale 1, so gradients halfway between two codes'
 * values (bf16 holds them) drop exactly half a step, and round up exactly
 * when the element's 16 random bits for that code are at least 0x8000: bits
 * 0..15 of mt_lean_random64 for m, 16..31 for v. Every pair of neighbouring
 * codes, the subnormal ones included, both signs for m. */
ParameterizedTestParameters(lean, halfway_like_scalar)
{
    return cr_make_param_array(mt_adamw_isa, lean_isas, sizeof lean_isas / sizeof lean_isas[0]);
}

ParameterizedTest(mt_adamw_isa *isa, lean, halfway_like_scalar)
{
    const mt_lean_block_fn k = mt_lean_kernel(*isa);
    if (!k) cr_skip_test("this CPU cannot run the %s kernel", mt_adamw_isa_name(*isa));
    const mt_adamw_hyper h = {.lr = 1e-3f, .beta1 = 0.0f, .beta2 = 0.0f, .eps = 1e-8f, .weight_decay = 0.0f,
                              .bias_correction1 = 1.0f, .bias_correction2 = 1.0f, .grad_scale = 1.0f};
    static lean_block a, b;
    int ups = 0;
    for (int sq = 0; sq < 2; sq++)
        for (uint64_t sd = 9; sd < 12; sd++) {
            block_guards(&a, 1);
            a.n = MT_Q8_BLOCK;
            uint16_t *g = a.g + a.off;
            int16_t *wq = a.wq + a.off;
            g[0] = mt_f32_to_bf16(sq ? MT_Q8_MAX_SQRT : MT_Q8_MAX_SIGNED);
            for (int c = 0; c < 255; c++) {
                const float lo = sq ? mt_q8_value_sqrt((uint8_t)c) : mt_q8_value_signed((uint8_t)(c % 127));
                const float hi = sq ? mt_q8_value_sqrt((uint8_t)(c + 1)) : mt_q8_value_signed((uint8_t)(c % 127 + 1));
                const float mid = 0.5f * (lo + hi);
                g[1 + c] = mt_f32_to_bf16(!sq && c >= 127 ? -mid : mid);
                cr_assert_eq(mt_bf16_to_f32(g[1 + c]), !sq && c >= 127 ? -mid : mid, "bf16 holds the midpoint");
            }
            for (int i = 0; i < MT_Q8_BLOCK; i++) wq[i] = (int16_t)(100 * (i - 128));
            a.sw = 0x1p-14f;
            memset(a.qm + a.off, 0, MT_Q8_BLOCK), memset(a.qv + a.off, 0, MT_Q8_BLOCK);
            a.sm = 0, a.sv = 0;
            b = a;
            const uint64_t index0 = 1000 * sd;
            cr_assert_eq(block_run(mt_lean_step_block, &h, sd, 1, index0, &a), 0);
            cr_assert_eq(sq ? a.sv : a.sm, 1.0f, "scale 1: the quotients are the midpoints themselves");
            for (int c = 0; c < 255; c++) {
                const uint64_t z = mt_lean_random64(sd, 1, index0 + 1 + (uint64_t)c);
                const unsigned r = (unsigned)(sq ? (z >> 16) & 0xffff : z & 0xffff);
                const unsigned got = sq ? a.qv[a.off + 1 + c] : a.qm[a.off + 1 + c] & 0x7fu;
                const unsigned lo = sq ? (unsigned)c : (unsigned)(c % 127);
                cr_assert_eq(got, r >= 0x8000 ? lo + 1 : lo, "halfway above code %#x, random bits %#x", lo, r);
                ups += got > lo;
            }
            cr_assert_eq(block_run(k, &h, sd, 1, index0, &b), 0);
            if (!same_block(&a, &b)) report_difference(&a, &b, mt_adamw_isa_name(*isa), sq, 1);
        }
    cr_assert(ups > 2 * 255 && ups < 4 * 255, "about half of 6 x 255 round up: %d", ups);
}

/* Weights halfway between codes: with beta1 = beta2 = 0, eps = 0 and the
 * bias corrections 1, the update is exactly lr = 0.5 against the gradient's
 * sign, so under the scale 1 the new weight is its code -+ 0.5: fp32 holds
 * it, and it rounds away from zero exactly when the element's weight bits
 * (48..63 of mt_lean_random64, mt_lean_random) are at least 0x8000. Element
 * 0, code 32767 moving down to 32766.5, keeps the scale at 1; the others
 * take codes of both signs and zero, gradients of both signs. */
ParameterizedTestParameters(lean, weights_halfway_like_scalar)
{
    return cr_make_param_array(mt_adamw_isa, lean_isas, sizeof lean_isas / sizeof lean_isas[0]);
}

ParameterizedTest(mt_adamw_isa *isa, lean, weights_halfway_like_scalar)
{
    const mt_lean_block_fn k = mt_lean_kernel(*isa);
    if (!k) cr_skip_test("this CPU cannot run the %s kernel", mt_adamw_isa_name(*isa));
    const mt_adamw_hyper h = {.lr = 0.5f, .beta1 = 0.0f, .beta2 = 0.0f, .eps = 0.0f, .weight_decay = 0.0f,
                              .bias_correction1 = 1.0f, .bias_correction2 = 1.0f, .grad_scale = 1.0f};
    static lean_block a, b;
    seed(47);
    int ups = 0;
    for (uint64_t sd = 9; sd < 15; sd++) {
        block_guards(&a, 3);
        a.n = MT_Q8_BLOCK;
        int16_t *wq = a.wq + a.off;
        uint16_t *g = a.g + a.off;
        wq[0] = MT_Q16_MAX, g[0] = mt_f32_to_bf16(1.0f);
        for (int i = 1; i < MT_Q8_BLOCK; i++) {
            wq[i] = (int16_t)(i < 8 ? 0 : (int)(next_u64() % 65533) - 32766);
            g[i] = mt_f32_to_bf16(next_u64() & 1 ? 1.0f : -1.0f);
        }
        memset(a.qm + a.off, 0, MT_Q8_BLOCK), memset(a.qv + a.off, 0, MT_Q8_BLOCK);
        a.sw = 1.0f, a.sm = 0, a.sv = 0;
        b = a;
        const uint64_t index0 = 1000 * sd;
        int16_t before[MT_Q8_BLOCK];
        memcpy(before, wq, sizeof before);
        cr_assert_eq(block_run(mt_lean_step_block, &h, sd, 1, index0, &a), 0);
        cr_assert_eq(a.sw, 1.0f, "scale 1: the codes are the weights themselves");
        for (int i = 0; i < MT_Q8_BLOCK; i++) {
            const double p = before[i] - (mt_bf16_to_f32(g[i]) > 0 ? 0.5 : -0.5);
            const int up = mt_lean_random(sd, 1, index0 + (uint64_t)i) >= 0x8000;
            const double mag = floor(fabs(p)) + up;
            cr_assert_eq(wq[i], (int16_t)(p < 0 ? -mag : mag), "[%d]: %g, random bits %#x", i, p,
                         mt_lean_random(sd, 1, index0 + (uint64_t)i));
            ups += up;
        }
        cr_assert_eq(block_run(k, &h, sd, 1, index0, &b), 0);
        if (!same_block(&a, &b)) report_difference(&a, &b, mt_adamw_isa_name(*isa), (int)sd, 1);
    }
    cr_assert(ups > 2 * 256 && ups < 4 * 256, "about half of 6 x 256 round away from zero: %d", ups);
}
