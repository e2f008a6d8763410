/* Mixture-of-experts models (Qwen3-MoE, Mixtral) on the CPU backend: the
 * routing ops against plain references, the experts' grouped GEMMs against a
 * loop over the experts, whole-model gradients against finite
 * differences with the load-balancing loss on and off, experts that get no
 * token (zero gradient, AdamW's moments still decaying as torch's do), the
 * layout against the parameter count, bit-identical resume, and the plan of
 * the Qwen3-30B-A3B shape. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <ftw.h>
#include <sys/stat.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu_moe.h"
#include "cpu/cpu_ops.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "engine/backend.h"
#include "model/template.h"

enum { V = 37 };

static unsigned lcg(unsigned *s) { return *s = *s * 1664525u + 1013904223u; }
static float uni(unsigned *s) { return ((float)(lcg(s) >> 8) / 16777216.0f) * 2.0f - 1.0f; }

/* ---- the ops ---------------------------------------------------------------------------- */

/* Routing of T tokens: probabilities against a float64 softmax (fp32 exp and one division, a few
 * ulp: 1e-6 relative), the top-k against a sort of those, the weights renormalised or not, the
 * routed rows grouped by expert in slot order with slot_row their inverse, and the statistics. */
static void route_check(int norm)
{
    enum { T = 13, E = 6, K = 3, R = T * K };
    float logits[T * E], probs[T * E], topw[R], stats[2 * E];
    int32_t topi[R], rows[R], slot_row[R];
    int32_t offs[E + 1];
    unsigned s = 5;
    for (int i = 0; i < T * E; i++) logits[i] = 3.0f * uni(&s);
    mt_cpu_moe_route(probs, topw, topi, rows, slot_row, offs, stats, logits, T, E, K,
                     &(mt_route){.norm = norm, .scale = 1});
    int count[E] = {0};
    double psum[E] = {0};
    for (int t = 0; t < T; t++) {
        double mx = -INFINITY, z = 0, p[E];
        for (int e = 0; e < E; e++) mx = fmax(mx, logits[t * E + e]);
        for (int e = 0; e < E; e++) z += p[e] = exp(logits[t * E + e] - mx);
        for (int e = 0; e < E; e++) {
            p[e] /= z;
            psum[e] += p[e];
            cr_assert(fabs(probs[t * E + e] - p[e]) <= 1e-6 * p[e], "p[%d][%d] %.9g vs %.9g", t, e, probs[t * E + e], p[e]);
        }
        double kept = 0;
        for (int j = 0; j < K; j++) { /* the j-th largest: exactly j others are larger */
            const int e = topi[t * K + j];
            int larger = 0;
            for (int f = 0; f < E; f++) larger += p[f] > p[e];
            cr_assert_eq(larger, j, "token %d: choice %d is expert %d, with %d larger", t, j, e, larger);
            kept += p[e];
            count[e]++;
        }
        for (int j = 0; j < K; j++) {
            const double want = p[topi[t * K + j]] / (norm ? kept : 1.0);
            cr_assert(fabs(topw[t * K + j] - want) <= 1e-6 * want, "w[%d][%d] %.9g vs %.9g", t, j, topw[t * K + j], want);
        }
    }
    cr_assert_eq(offs[0], 0);
    cr_assert_eq(offs[E], R);
    for (int e = 0; e < E; e++) {
        cr_assert_eq(offs[e + 1] - offs[e], count[e], "expert %d: %d rows, %d routed", e, offs[e + 1] - offs[e], count[e]);
        cr_assert_eq(stats[e], (float)count[e]);
        cr_assert(fabs(stats[E + e] - psum[e]) <= 1e-6 * psum[e] + 1e-7);
        for (int r = offs[e]; r < offs[e + 1]; r++) {
            cr_assert_eq(topi[rows[r]], e, "row %d of expert %d's block came from slot %d", r, e, rows[r]);
            if (r > offs[e]) cr_assert_lt(rows[r - 1], rows[r], "slot order within an expert's rows");
        }
    }
    for (int sl = 0; sl < R; sl++) cr_assert_eq(rows[slot_row[sl]], sl, "slot_row inverts rows");
}

Test(moe_ops, route_matches_reference_renormalised) { route_check(1); }
Test(moe_ops, route_matches_reference_plain) { route_check(0); }

/* The routing's backward against central differences of the function it differentiates,
 * f(z) = sum_j dw_j topw_j(z) + aux * sum_e c_e p_e(z), with the choice of experts held (steps of
 * 1e-3 on logits of size ~1 keep every token's choice; float64 differences of fp32 evaluations:
 * rounding ~1e-7 / 1e-3, so 2e-4 absolute + 1e-3 relative). */
static void route_bwd_check(int norm, float aux)
{
    enum { T = 7, E = 5, K = 2, R = T * K, L = 3 };
    float z[T * E], probs[T * E], topw[R], dw[R], dz[T * E], stats[L * 2 * E];
    int32_t topi[R], rows[R], slot_row[R];
    int32_t offs[E + 1];
    unsigned s = 9;
    for (int i = 0; i < T * E; i++) z[i] = 2.0f * uni(&s);
    for (int i = 0; i < R; i++) dw[i] = uni(&s);
    for (int i = 0; i < L * 2 * E; i++) stats[i] = (float)(lcg(&s) % 7);
    const mt_route rt = {.norm = norm, .scale = 1};
    mt_cpu_moe_route(probs, topw, topi, rows, slot_row, offs, NULL, z, T, E, K, &rt);
    mt_cpu_moe_route_bwd(dz, dw, probs, topw, topi, aux ? stats : NULL, L, aux, T, E, K, &rt);
    double c[E] = {0};
    for (int e = 0; e < E; e++)
        for (int l = 0; l < L; l++) c[e] += stats[l * 2 * E + e];
    for (int i = 0; i < T * E; i++) {
        const int t = i / E;
        double f[2];
        for (int side = 0; side < 2; side++) {
            float zz[E], p[E];
            memcpy(zz, z + t * E, sizeof zz);
            zz[i % E] += side ? -1e-3f : 1e-3f;
            double mx = -INFINITY, sum = 0, kept = 0;
            for (int e = 0; e < E; e++) mx = fmax(mx, zz[e]);
            for (int e = 0; e < E; e++) sum += p[e] = (float)exp(zz[e] - mx);
            for (int e = 0; e < E; e++) p[e] = (float)(p[e] / sum);
            for (int j = 0; j < K; j++) kept += p[topi[t * K + j]];
            f[side] = 0;
            for (int j = 0; j < K; j++) f[side] += dw[t * K + j] * p[topi[t * K + j]] / (norm ? kept : 1.0);
            for (int e = 0; e < E; e++) f[side] += aux * c[e] * p[e];
        }
        const double fd = (f[0] - f[1]) / 2e-3;
        cr_assert(fabs(dz[i] - fd) <= 2e-4 + 1e-3 * fabs(fd), "dz[%d][%d] %.7g, difference %.7g", t, i % E, dz[i], fd);
    }
}

Test(moe_ops, route_bwd_renormalised) { route_bwd_check(1, 0.0f); }
Test(moe_ops, route_bwd_plain_with_aux) { route_bwd_check(0, 0.37f); }
Test(moe_ops, route_bwd_renormalised_with_aux) { route_bwd_check(1, 0.37f); }

/* ---- DeepSeek-V3's routing (mt_route's sigmoid mode) ---- */

enum { DS_MAX_E = 64 };

/* The best of n values v not yet taken (strictly larger wins: a tie goes to the lower index), taken
 * then; *margin lowered to its lead over the best of the rest. */
static int ds_pick(const double *v, int *taken, int n, double *margin)
{
    int best = -1;
    for (int i = 0; i < n; i++)
        if (!taken[i] && (best < 0 || v[i] > v[best])) best = i;
    taken[best] = 1;
    for (int i = 0; i < n; i++)
        if (!taken[i]) *margin = fmin(*margin, v[best] - v[i]);
    return best;
}

/* transformers' DeepseekV3TopkRouter.forward for one token, in double from the formula: s (E) the scores
 * sigmoid(z); the choice scores c = s + bias (NULL: zeros); each of n_group groups (0: none) scored by the
 * sum of its two best c, the topk_group best kept (kept, n_group flags; one flag, set, without groups);
 * idx (k) the k best c among the kept groups' experts in descending order; w (k) their s divided by
 * their sum + 1e-20 where norm, times scale. Returns the smallest lead of a pick (group or expert) over
 * the best of the rest, which tells whether fp32 could choose otherwise. */
static double ds_route_ref(double *s, int *idx, double *w, int *kept, const float *z, const float *bias, int E, int k,
                           int n_group, int topk_group, int norm, double scale)
{
    const int ng = n_group > 1 ? n_group : 1, G = E / ng;
    double c[DS_MAX_E], gs[DS_MAX_E], margin = INFINITY;
    int taken[DS_MAX_E] = {0};
    for (int e = 0; e < E; e++) {
        s[e] = 1.0 / (1.0 + exp(-(double)z[e]));
        c[e] = s[e] + (bias ? (double)bias[e] : 0.0);
    }
    for (int g = 0; g < ng; g++) {
        double a = -INFINITY, b = -INFINITY;
        for (int e = g * G; e < (g + 1) * G; e++) {
            if (c[e] > a) b = a, a = c[e];
            else if (c[e] > b) b = c[e];
        }
        gs[g] = a + b;
        kept[g] = ng == 1;
    }
    for (int j = 0; ng > 1 && j < topk_group; j++) ds_pick(gs, kept, ng, &margin);
    for (int e = 0; e < E; e++)
        if (!kept[e / G]) c[e] = -INFINITY; /* transformers' masked_fill(-inf) */
    double sum = 0.0;
    for (int j = 0; j < k; j++) sum += s[idx[j] = ds_pick(c, taken, E, &margin)];
    for (int j = 0; j < k; j++) w[j] = s[idx[j]] / (norm ? sum + 1e-20 : 1.0) * scale;
    return margin;
}

/* DeepSeek-V3's routing against ds_route_ref: 24 tokens, E = 16 in 4 groups of 4, the 2 best groups,
 * k = 3, scale 2.5, logits within +-4 and a correction bias within +-0.3. Scores to 1e-6 relative (fp32
 * expf, an add and a division: a few ulp); the choice exactly (the fixture's decisions are checked to be
 * 1e-5 apart at least, far above fp32's ~1e-7 on choice scores below 1.3); the weights to 2e-6 relative
 * (the scores' error, a sum of 3, a division and the scale); rows, slot_row, offs and the statistics
 * (counts, sums of the scores) as for the softmax. The fixture exercises the bias and the groups: some
 * token chooses otherwise without the bias, and some token's plain top-k (no groups) would take an
 * expert of a group that is not kept. */
static void sigmoid_route_check(int norm)
{
    enum { T = 24, E = 16, NG = 4, TG = 2, K = 3, R = T * K, G = E / NG };
    const float scale = 2.5f;
    float z[T * E], bias[E], probs[T * E], topw[R], stats[2 * E];
    int32_t topi[R], rows[R], slot_row[R];
    int32_t offs[E + 1];
    unsigned sd = 17;
    for (int i = 0; i < T * E; i++) z[i] = 4.0f * uni(&sd);
    for (int e = 0; e < E; e++) bias[e] = 0.3f * uni(&sd);
    const mt_route rt = {.norm = norm, .sigmoid = 1, .n_group = NG, .topk_group = TG, .scale = scale, .bias = bias};
    mt_cpu_moe_route(probs, topw, topi, rows, slot_row, offs, stats, z, T, E, K, &rt);
    int count[E] = {0}, bias_matters = 0, groups_matter = 0;
    double ssum[E] = {0};
    for (int t = 0; t < T; t++) {
        double sc[E], w[K], s0[E], w0[K];
        int idx[K], kept[NG], idx0[K], kept0[NG], plain[K], kept1[1];
        const double margin = ds_route_ref(sc, idx, w, kept, z + t * E, bias, E, K, NG, TG, norm, scale);
        cr_assert_gt(margin, 1e-5, "token %d: decisions %.3g apart (the fixture)", t, margin);
        for (int e = 0; e < E; e++) {
            cr_assert(fabs(probs[t * E + e] - sc[e]) <= 1e-6 * sc[e], "s[%d][%d] %.9g vs %.9g", t, e, probs[t * E + e],
                      sc[e]);
            ssum[e] += sc[e];
        }
        for (int j = 0; j < K; j++) {
            cr_assert_eq(topi[t * K + j], idx[j], "token %d: choice %d is expert %d, the reference's %d", t, j,
                         topi[t * K + j], idx[j]);
            cr_assert(fabs(topw[t * K + j] - w[j]) <= 2e-6 * w[j], "w[%d][%d] %.9g vs %.9g", t, j, topw[t * K + j],
                      w[j]);
            count[idx[j]]++;
        }
        ds_route_ref(s0, idx0, w0, kept0, z + t * E, NULL, E, K, NG, TG, norm, scale);
        bias_matters |= memcmp(idx0, idx, sizeof idx) != 0;
        ds_route_ref(s0, plain, w0, kept1, z + t * E, bias, E, K, 0, 0, norm, scale);
        for (int j = 0; j < K; j++) groups_matter |= !kept[plain[j] / G];
    }
    cr_assert(bias_matters, "the bias changes some token's choice (the fixture)");
    cr_assert(groups_matter, "the group limit changes some token's choice (the fixture)");
    cr_assert_eq(offs[0], 0);
    cr_assert_eq(offs[E], R);
    for (int e = 0; e < E; e++) {
        cr_assert_eq(offs[e + 1] - offs[e], count[e], "expert %d: %d rows, %d routed", e, offs[e + 1] - offs[e],
                     count[e]);
        cr_assert_eq(stats[e], (float)count[e]);
        cr_assert(fabs(stats[E + e] - ssum[e]) <= 1e-6 * ssum[e], "expert %d: score sum %.9g vs %.9g", e, stats[E + e],
                  ssum[e]);
        for (int r = offs[e]; r < offs[e + 1]; r++) {
            cr_assert_eq(topi[rows[r]], e, "row %d of expert %d's block came from slot %d", r, e, rows[r]);
            if (r > offs[e]) cr_assert_lt(rows[r - 1], rows[r], "slot order within an expert's rows");
        }
    }
    for (int sl = 0; sl < R; sl++) cr_assert_eq(rows[slot_row[sl]], sl, "slot_row inverts rows");
}

/* DeepSeek-V2's group_limited_greedy (softmax scores, a group scored by its best expert, masked groups
 * out, no renormalisation, times routed_scaling_factor) against transformers' DeepseekV2TopkRouter written
 * out in double: 24 tokens, E = 16 in 4 groups, the 2 best, k = 3, scale 2.5. Probabilities and weights
 * to 2e-6 relative (fp32 expf and a double sum, a product), the choice exactly (decisions checked to be
 * 1e-5 apart); the group limit must change some token's choice (the fixture). */
Test(moe_ops, route_softmax_groups_deepseek_v2)
{
    enum { T = 24, E = 16, NG = 4, TG = 2, K = 3, R = T * K, G = E / NG };
    float z[T * E], probs[T * E], topw[R];
    int32_t topi[R], rows[R], slot_row[R];
    int32_t offs[E + 1];
    int groups_matter = 0;
    unsigned sd = 29;
    for (int i = 0; i < T * E; i++) z[i] = 3.0f * uni(&sd);
    const mt_route rt = {.norm = 0, .sigmoid = 0, .n_group = NG, .topk_group = TG, .scale = 2.5f, .bias = NULL};
    mt_cpu_moe_route(probs, topw, topi, rows, slot_row, offs, NULL, z, T, E, K, &rt);
    for (int t = 0; t < T; t++) {
        double p[E], gs[NG], c[E], mx = -INFINITY, sum = 0.0, margin = INFINITY;
        int kept[NG] = {0}, taken[E] = {0}, plain[E] = {0};
        for (int e = 0; e < E; e++) mx = fmax(mx, z[t * E + e]);
        for (int e = 0; e < E; e++) sum += p[e] = exp((double)z[t * E + e] - mx);
        for (int e = 0; e < E; e++) p[e] /= sum;
        for (int g = 0; g < NG; g++) {
            gs[g] = -INFINITY;
            for (int e = g * G; e < (g + 1) * G; e++) gs[g] = fmax(gs[g], p[e]);
        }
        for (int j = 0; j < TG; j++) ds_pick(gs, kept, NG, &margin);
        for (int e = 0; e < E; e++) c[e] = kept[e / G] ? p[e] : 0.0; /* transformers' masked_fill(0.0) */
        for (int j = 0; j < K; j++) {
            const int want = ds_pick(c, taken, E, &margin);
            cr_assert_eq(topi[t * K + j], want, "token %d: choice %d is expert %d, the reference's %d", t, j,
                         topi[t * K + j], want);
            cr_assert(fabs(topw[t * K + j] - 2.5 * p[want]) <= 2e-6 * 2.5 * p[want], "w[%d][%d] %.9g vs %.9g", t, j,
                      topw[t * K + j], 2.5 * p[want]);
            groups_matter |= ds_pick(p, plain, E, &(double){INFINITY}) != want;
        }
        cr_assert_gt(margin, 1e-5, "token %d: decisions %.3g apart (the fixture)", t, margin);
        for (int e = 0; e < E; e++)
            cr_assert(fabs(probs[t * E + e] - p[e]) <= 2e-6 * p[e], "p[%d][%d] %.9g vs %.9g", t, e, probs[t * E + e],
                      p[e]);
    }
    cr_assert(groups_matter, "the group limit changes some token's choice (the fixture)");
    cr_assert_eq(offs[E], R);
}

Test(moe_ops, route_sigmoid_groups_renormalised) { sigmoid_route_check(1); }
Test(moe_ops, route_sigmoid_groups_plain) { sigmoid_route_check(0); }

/* Two tokens made by hand, E = 8 in 4 groups of 2. First, with a bias of -0.9 on every expert, scores
 * 0.95 0.05 | 0.92 0.3 | 0.5 0.45 | 0.2 0.1 keep groups 1 and 0 (two best sums -0.58 and -0.8), and the
 * third choice is expert 3 (choice score -0.6): the experts of the other groups are out at -inf, as in
 * transformers 5 (masked_fill with 0 instead would take expert 4). Second, no bias, one group kept:
 * groups 0 and 2 tie (the same two scores) and group 0 is kept, its two experts tie and come in index
 * order: ties go to the lower index, of groups and of experts. */
Test(moe_ops, route_sigmoid_masks_and_ties)
{
    enum { E = 8, NG = 4 };
    const double s1[E] = {0.95, 0.05, 0.92, 0.3, 0.5, 0.45, 0.2, 0.1};
    float z[2][E], bias[E], probs[E], topw[3], stats[2 * E];
    int32_t topi[3], rows[3], slot_row[3];
    int32_t offs[E + 1];
    for (int e = 0; e < E; e++) z[0][e] = (float)log(s1[e] / (1.0 - s1[e])), bias[e] = -0.9f;
    const float z2[E] = {1.0f, 1.0f, -1.0f, -2.0f, 1.0f, 1.0f, 0.5f, -0.5f};
    memcpy(z[1], z2, sizeof z2);
    const mt_route r1 = {.norm = 1, .sigmoid = 1, .n_group = NG, .topk_group = 2, .scale = 1, .bias = bias};
    mt_cpu_moe_route(probs, topw, topi, rows, slot_row, offs, stats, z[0], 1, E, 3, &r1);
    cr_assert(topi[0] == 0 && topi[1] == 2 && topi[2] == 3, "chosen %d %d %d, want 0 2 3", topi[0], topi[1], topi[2]);
    const mt_route r2 = {.norm = 1, .sigmoid = 1, .n_group = NG, .topk_group = 1, .scale = 1};
    mt_cpu_moe_route(probs, topw, topi, rows, slot_row, offs, stats, z[1], 1, E, 2, &r2);
    cr_assert(topi[0] == 0 && topi[1] == 1, "chosen %d %d, want 0 1", topi[0], topi[1]);
    cr_assert_eq(topw[0], topw[1]);
}

/* The backward in DeepSeek-V3's mode (groups, bias, scale 2.5) against central differences of
 * f(z) = sum_j c_j topw_j(z) (+ aux * sum_e n_e s_e(z), n_e the routed rows summed over the statistics'
 * L rows, where they are given), c_j random: f in double from the formula with each token's choice held,
 * and mt_cpu_moe_route run on z +- h to check that the choice does hold there. Steps h = 1e-3 (a score
 * moves by 2.5e-4 at most, below the fixture's margins, which the check of the choice confirms):
 * central differences are off by h^2/6 f''' < 1e-6 (f''' is a few: the scale times the sigmoid's third
 * derivative, 1/8 at most, times sums of |c_j| <= 3), double's rounding adds ~1e-16 / h; the op is fp32
 * on terms of order 1 (a few ulp: ~1e-6): 1e-5 absolute + 1e-4 relative. */
static void sigmoid_route_bwd_check(int norm, float aux)
{
    enum { T = 9, E = 16, NG = 4, TG = 2, K = 3, R = T * K, L = 2 };
    const float scale = 2.5f, h = 1e-3f;
    float z[T * E], bias[E], probs[T * E], topw[R], dw[R], dz[T * E], stats[L * 2 * E];
    int32_t topi[R], rows[R], slot_row[R];
    int32_t offs[E + 1];
    unsigned sd = 23;
    for (int i = 0; i < T * E; i++) z[i] = 4.0f * uni(&sd);
    for (int e = 0; e < E; e++) bias[e] = 0.3f * uni(&sd);
    for (int i = 0; i < R; i++) dw[i] = uni(&sd);
    for (int i = 0; i < L * 2 * E; i++) stats[i] = (float)(lcg(&sd) % 7);
    const mt_route rt = {.norm = norm, .sigmoid = 1, .n_group = NG, .topk_group = TG, .scale = scale, .bias = bias};
    mt_cpu_moe_route(probs, topw, topi, rows, slot_row, offs, NULL, z, T, E, K, &rt);
    mt_cpu_moe_route_bwd(dz, dw, probs, topw, topi, aux ? stats : NULL, L, aux, T, E, K, &rt);
    double n[E] = {0};
    for (int e = 0; e < E; e++)
        for (int l = 0; l < L; l++) n[e] += stats[l * 2 * E + e];
    for (int i = 0; i < T * E; i++) {
        const int t = i / E;
        const int32_t *idx = topi + t * K;
        double f[2];
        for (int side = 0; side < 2; side++) {
            float zz[E], pp[E], ww[K];
            int32_t ii[K], rr[K], ss[K];
            int oo[E + 1];
            memcpy(zz, z + t * E, sizeof zz);
            zz[i % E] += side ? -h : h;
            mt_cpu_moe_route(pp, ww, ii, rr, ss, oo, NULL, zz, 1, E, K, &rt);
            cr_assert_eq(memcmp(ii, idx, sizeof ii), 0, "token %d: the choice holds at logit %d %+g", t, i % E,
                         side ? -h : h);
            double sc[E], sum = 0.0;
            for (int e = 0; e < E; e++) sc[e] = 1.0 / (1.0 + exp(-(double)zz[e]));
            for (int j = 0; j < K; j++) sum += sc[idx[j]];
            f[side] = 0.0;
            for (int j = 0; j < K; j++) f[side] += dw[t * K + j] * sc[idx[j]] / (norm ? sum + 1e-20 : 1.0) * scale;
            for (int e = 0; e < E; e++) f[side] += aux * n[e] * sc[e];
        }
        const double fd = (f[0] - f[1]) / (2.0 * h);
        cr_assert(fabs(dz[i] - fd) <= 1e-5 + 1e-4 * fabs(fd), "dz[%d][%d] %.7g, difference %.7g", t, i % E, dz[i], fd);
    }
}

Test(moe_ops, route_sigmoid_bwd_renormalised) { sigmoid_route_bwd_check(1, 0.0f); }
Test(moe_ops, route_sigmoid_bwd_plain) { sigmoid_route_bwd_check(0, 0.0f); }
Test(moe_ops, route_sigmoid_bwd_renormalised_with_aux) { sigmoid_route_bwd_check(1, 0.37f); }

/* gather, combine and dot_scale against their definitions (exact: copies, and sums in the order
 * the contract states). */
Test(moe_ops, gather_combine_dot_scale)
{
    enum { T = 5, K = 2, R = T * K, C = 3, E = 4 };
    float z[T * E], probs[T * E], topw[R], x[T * C], xs[R * C], out[T * C], dw[R], a[R * C], b[R * C];
    int32_t topi[R], rows[R], slot_row[R];
    int32_t offs[E + 1];
    unsigned s = 3;
    for (int i = 0; i < T * E; i++) z[i] = uni(&s);
    for (int i = 0; i < T * C; i++) x[i] = uni(&s);
    mt_cpu_moe_route(probs, topw, topi, rows, slot_row, offs, NULL, z, T, E, K, &(mt_route){.norm = 1, .scale = 1});
    mt_cpu_moe_gather(xs, x, rows, R, K, C);
    for (int r = 0; r < R; r++)
        cr_assert_eq(memcmp(xs + r * C, x + (rows[r] / K) * C, sizeof(float) * C), 0, "row %d is its token's", r);
    for (int i = 0; i < T * C; i++) out[i] = 1.0f;
    mt_cpu_moe_combine(out, xs, topw, slot_row, T, K, C);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            float acc = 0;
            for (int j = 0; j < K; j++) acc += topw[t * K + j] * x[t * C + c]; /* every routed row is its token's */
            cr_assert_eq(out[t * C + c], 1.0f + acc);
        }
    for (int i = 0; i < R * C; i++) a[i] = uni(&s), b[i] = uni(&s);
    float a0[R * C], b0[R * C];
    memcpy(a0, a, sizeof a), memcpy(b0, b, sizeof b);
    mt_cpu_moe_dot_scale(dw, a, b, topw, rows, R, C);
    for (int r = 0; r < R; r++) {
        double d = 0;
        for (int c = 0; c < C; c++) d += (double)a0[r * C + c] * b0[r * C + c];
        cr_assert_eq(dw[rows[r]], (float)d);
        for (int c = 0; c < C; c++) {
            cr_assert_eq(a[r * C + c], a0[r * C + c] * topw[rows[r]]);
            cr_assert_eq(b[r * C + c], b0[r * C + c] * topw[rows[r]]);
        }
    }
}

/* ---- the experts' grouped GEMMs (mt_cpu_moe_linear, _dx, _dw: the kernel table's moe_linear*) ---- */

/* GR rows among GE experts: experts 0, 3 and 6 without rows (the first, one between, the last), expert 4
 * of a single row, and the last 4 rows of no expert (offs[E] < R: not written). K and N are not
 * multiples of the GEMM's tiles. */
enum { GE = 7, GR = 53, GK = 37, GN = 45 };
static const int32_t g_offs[GE + 1] = {0, 0, 17, 30, 30, 31, 49, 49};

static float *g_vec(size_t n, unsigned *s)
{
    float *v = malloc(n * sizeof *v);
    cr_assert(v);
    for (size_t i = 0; i < n; i++) v[i] = uni(s);
    return v;
}

static float *g_copy(const float *v, size_t n)
{
    float *c = malloc(n * sizeof *c);
    cr_assert(c);
    memcpy(c, v, n * sizeof *c);
    return c;
}

/* Higham's bound on a float sum of n terms (+ the two of a bias and an accumulated value): gamma_{n+2} */
static double g_gamma(int n) { return (n + 2) * ldexp(1.0, -24) / (1 - (n + 2) * ldexp(1.0, -24)); }

static int g_expert_of(int r)
{
    for (int e = 0; e < GE; e++)
        if (r >= g_offs[e] && r < g_offs[e + 1]) return e;
    return -1;
}

/* On a pool of 2 (the GEMMs split their work; the bits do not depend on it). The grouped call against
 * a loop over the experts calling mt_cpu_matmul as the kernel table's linear does: the same code on
 * the same blocks, so bit for bit, and the rows of no expert untouched. Then against a float64
 * reference of the definition, within Higham's bound gamma_{K+2} * sum |terms| (fp32 sums of K products,
 * a bias and the accumulated value, in whatever order and fused or not): that checks the blocks the
 * test's loop and the library's both take. */
static void grouped_linear_check(int with_bias, int accumulate)
{
    unsigned s = 101u + 2u * (unsigned)with_bias + (unsigned)accumulate;
    mt_pool *p = mt_pool_create(2, NULL);
    void *ws = malloc(mt_cpu_ws_size(2, 0));
    cr_assert(p && ws);
    float *x = g_vec((size_t)GR * GK, &s), *W = g_vec((size_t)GE * GN * GK, &s), *b = g_vec((size_t)GE * GN, &s);
    float *y0 = g_vec((size_t)GR * GN, &s), *y = g_copy(y0, (size_t)GR * GN), *ref = g_copy(y0, (size_t)GR * GN);
    const float *bias = with_bias ? b : NULL;
    mt_cpu_moe_linear(p, ws, y, x, W, bias, g_offs, GE, GR, GK, GN, accumulate);
    for (int e = 0; e < GE; e++) {
        const int n = g_offs[e + 1] - g_offs[e];
        if (n)
            mt_cpu_matmul(p, ws, ref + (size_t)g_offs[e] * GN, x + (size_t)g_offs[e] * GK, W + (size_t)e * GN * GK,
                          bias ? bias + (size_t)e * GN : NULL, n, GK, GN, accumulate);
    }
    cr_assert_eq(memcmp(y, ref, sizeof(float) * GR * GN), 0, "bias %d acc %d: the loop's bits", with_bias, accumulate);
    for (int r = 0; r < GR; r++) {
        const int e = g_expert_of(r);
        for (int n = 0; n < GN; n++) {
            const float got = y[r * GN + n];
            if (e < 0) {
                cr_assert_eq(got, y0[r * GN + n], "row %d of no expert written", r);
                continue;
            }
            double want = accumulate ? y0[r * GN + n] : 0.0, mag = fabs(want);
            if (bias) want += bias[e * GN + n], mag += fabs(bias[e * GN + n]);
            for (int k = 0; k < GK; k++) {
                const double t = (double)x[r * GK + k] * W[((size_t)e * GN + n) * GK + k];
                want += t, mag += fabs(t);
            }
            cr_assert(fabs(got - want) <= g_gamma(GK) * mag, "y[%d, %d] (expert %d) %.9g vs %.9g", r, n, e, got, want);
        }
    }
    free(x), free(W), free(b), free(y0), free(y), free(ref), free(ws);
    mt_pool_destroy(p);
}

Test(moe_ops, grouped_linear) { grouped_linear_check(0, 0); }
Test(moe_ops, grouped_linear_bias) { grouped_linear_check(1, 0); }
Test(moe_ops, grouped_linear_accumulate) { grouped_linear_check(0, 1); }
Test(moe_ops, grouped_linear_bias_accumulate) { grouped_linear_check(1, 1); }

/* dx = dy W_e (+ dx) as grouped_linear_check: bit for bit the loop of mt_cpu_matmul_bwd that the kernel
 * table's linear_dx runs, rows of no expert untouched, and within gamma_{N+2} of the float64 definition */
static void grouped_linear_dx_check(int accumulate)
{
    unsigned s = 211u + (unsigned)accumulate;
    mt_pool *p = mt_pool_create(2, NULL);
    void *ws = malloc(mt_cpu_ws_size(2, 0));
    cr_assert(p && ws);
    float *dy = g_vec((size_t)GR * GN, &s), *W = g_vec((size_t)GE * GN * GK, &s);
    float *dx0 = g_vec((size_t)GR * GK, &s), *dx = g_copy(dx0, (size_t)GR * GK), *ref = g_copy(dx0, (size_t)GR * GK);
    mt_cpu_moe_linear_dx(p, ws, dx, dy, W, g_offs, GE, GR, GK, GN, accumulate);
    for (int e = 0; e < GE; e++) {
        const int n = g_offs[e + 1] - g_offs[e];
        if (n)
            mt_cpu_matmul_bwd(p, ws, ref + (size_t)g_offs[e] * GK, NULL, NULL, dy + (size_t)g_offs[e] * GN, NULL,
                              W + (size_t)e * GN * GK, n, GK, GN, accumulate);
    }
    cr_assert_eq(memcmp(dx, ref, sizeof(float) * GR * GK), 0, "acc %d: the loop's bits", accumulate);
    for (int r = 0; r < GR; r++) {
        const int e = g_expert_of(r);
        for (int k = 0; k < GK; k++) {
            const float got = dx[r * GK + k];
            if (e < 0) {
                cr_assert_eq(got, dx0[r * GK + k], "row %d of no expert written", r);
                continue;
            }
            double want = accumulate ? dx0[r * GK + k] : 0.0, mag = fabs(want);
            for (int n = 0; n < GN; n++) {
                const double t = (double)dy[r * GN + n] * W[((size_t)e * GN + n) * GK + k];
                want += t, mag += fabs(t);
            }
            cr_assert(fabs(got - want) <= g_gamma(GN) * mag, "dx[%d, %d] (expert %d) %.9g vs %.9g", r, k, e, got, want);
        }
    }
    free(dy), free(W), free(dx0), free(dx), free(ref), free(ws);
    mt_pool_destroy(p);
}

Test(moe_ops, grouped_linear_dx) { grouped_linear_dx_check(0); }
Test(moe_ops, grouped_linear_dx_accumulate) { grouped_linear_dx_check(1); }

/* dW_e += dy_e^T x_e and db_e += the column sums of dy_e, into gradients that hold values already (as
 * across micro-batches): bit for bit the loop of mt_cpu_matmul_bwd that linear_dw runs, the blocks of
 * the experts without rows (0, 3, 6) untouched, and within gamma_{rows+2} of the float64 definition
 * (the expert's rows and the value before). */
static void grouped_linear_dw_check(int with_db)
{
    unsigned s = 307u + (unsigned)with_db;
    mt_pool *p = mt_pool_create(2, NULL);
    void *ws = malloc(mt_cpu_ws_size(2, 0));
    cr_assert(p && ws);
    float *dy = g_vec((size_t)GR * GN, &s), *x = g_vec((size_t)GR * GK, &s);
    float *dW0 = g_vec((size_t)GE * GN * GK, &s), *dW = g_copy(dW0, (size_t)GE * GN * GK);
    float *ref = g_copy(dW0, (size_t)GE * GN * GK);
    float *db0 = g_vec((size_t)GE * GN, &s), *db = g_copy(db0, (size_t)GE * GN), *dbref = g_copy(db0, (size_t)GE * GN);
    mt_cpu_moe_linear_dw(p, ws, dW, with_db ? db : NULL, dy, x, g_offs, GE, GR, GK, GN);
    for (int e = 0; e < GE; e++) {
        const int n = g_offs[e + 1] - g_offs[e];
        if (n)
            mt_cpu_matmul_bwd(p, ws, NULL, ref + (size_t)e * GN * GK, with_db ? dbref + (size_t)e * GN : NULL,
                              dy + (size_t)g_offs[e] * GN, x + (size_t)g_offs[e] * GK, NULL, n, GK, GN, 0);
    }
    cr_assert_eq(memcmp(dW, ref, sizeof(float) * GE * GN * GK), 0, "db %d: dW, the loop's bits", with_db);
    cr_assert_eq(memcmp(db, with_db ? dbref : db0, sizeof(float) * GE * GN), 0, "db %d: db", with_db);
    for (int e = 0; e < GE; e++) {
        const int r0 = g_offs[e], r1 = g_offs[e + 1];
        for (int n = 0; n < GN; n++) {
            double bw = db0[e * GN + n], bmag = fabs(bw);
            for (int r = r0; r < r1; r++) bw += dy[r * GN + n], bmag += fabs(dy[r * GN + n]);
            if (with_db)
                cr_assert(fabs(db[e * GN + n] - bw) <= g_gamma(r1 - r0) * bmag, "db[%d, %d] %.9g vs %.9g", e, n,
                          db[e * GN + n], bw);
            for (int k = 0; k < GK; k++) {
                const size_t i = ((size_t)e * GN + n) * GK + k;
                if (r0 == r1) {
                    cr_assert_eq(dW[i], dW0[i], "expert %d without rows: dW untouched", e);
                    continue;
                }
                double want = dW0[i], mag = fabs(want);
                for (int r = r0; r < r1; r++) {
                    const double t = (double)dy[r * GN + n] * x[r * GK + k];
                    want += t, mag += fabs(t);
                }
                cr_assert(fabs(dW[i] - want) <= g_gamma(r1 - r0) * mag, "dW[%d][%d, %d] %.9g vs %.9g", e, n, k, dW[i],
                          want);
            }
        }
    }
    free(dy), free(x), free(dW0), free(dW), free(ref), free(db0), free(db), free(dbref), free(ws);
    mt_pool_destroy(p);
}

Test(moe_ops, grouped_linear_dw) { grouped_linear_dw_check(0); }
Test(moe_ops, grouped_linear_dw_bias) { grouped_linear_dw_check(1); }

/* GPT-OSS's bias cases, N = 1: rbd[r] = dot(ys[r], b_e) with the biases (E, C) read as (E, 1, C), and
 * db_e += w^T ys as moe_linear_dw of one output, against the loop of mt_cpu_matmul / _bwd bit for bit */
Test(moe_ops, grouped_linear_one_output)
{
    unsigned s = 401u;
    float *ys = g_vec((size_t)GR * GK, &s), *bias = g_vec((size_t)GE * GK, &s), *wrow = g_vec((size_t)GR, &s);
    float *rbd0 = g_vec((size_t)GR, &s), *rbd = g_copy(rbd0, GR), *ref = g_copy(rbd0, GR);
    float *g0 = g_vec((size_t)GE * GK, &s), *g = g_copy(g0, (size_t)GE * GK), *gref = g_copy(g0, (size_t)GE * GK);
    void *ws = malloc(mt_cpu_ws_size(1, 0));
    cr_assert(ws);
    mt_cpu_moe_linear(NULL, ws, rbd, ys, bias, NULL, g_offs, GE, GR, GK, 1, 0);
    mt_cpu_moe_linear_dw(NULL, ws, g, NULL, wrow, ys, g_offs, GE, GR, GK, 1);
    for (int e = 0; e < GE; e++) {
        const int n = g_offs[e + 1] - g_offs[e];
        if (!n) continue;
        mt_cpu_matmul(NULL, ws, ref + g_offs[e], ys + (size_t)g_offs[e] * GK, bias + (size_t)e * GK, NULL, n, GK, 1, 0);
        mt_cpu_matmul_bwd(NULL, ws, NULL, gref + (size_t)e * GK, NULL, wrow + g_offs[e], ys + (size_t)g_offs[e] * GK,
                          NULL, n, GK, 1, 0);
    }
    cr_assert_eq(memcmp(rbd, ref, sizeof(float) * GR), 0, "rbd");
    cr_assert_eq(memcmp(g, gref, sizeof(float) * GE * GK), 0, "bias gradient");
    for (int r = g_offs[GE]; r < GR; r++) cr_assert_eq(rbd[r], rbd0[r], "row %d of no expert written", r);
    free(ys), free(bias), free(wrow), free(rbd0), free(rbd), free(ref), free(g0), free(g), free(gref), free(ws);
}

/* ---- models ------------------------------------------------------------------------------- */

/* A small Qwen3-MoE (q/k norms; experts of width 16; layer 1 dense through mlp_only_layers) or
 * Mixtral (every layer sparse, always renormalised; a sliding window of 4). */
static mt_model_config moe_cfg(mt_arch arch, int experts, int topk, int aux, int precision)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.arch = arch;
    c.vocab_size = V;
    c.hidden_size = 24;
    c.intermediate_size = 40;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 4;
    c.num_key_value_heads = 2;
    c.max_position_embeddings = 64;
    c.initializer_range = 0.2f;
    c.seed = 7;
    c.precision = (uint32_t)precision;
    c.num_experts = (uint32_t)experts;
    c.num_experts_per_tok = (uint32_t)topk;
    c.moe_intermediate_size = 16;
    c.norm_topk_prob = 1;
    c.output_router_logits = (uint32_t)(aux != 0);
    c.router_aux_loss_coef = aux ? 0.5f : 0.0f; /* large, so that its gradient is a sizeable part */
    if (arch == MT_ARCH_QWEN3_MOE) {
        c.mlp_only_layers[0] = 1u << 1;
    } else {
        c.intermediate_size = 16;
        c.sliding_window = 4;
    }
    return c;
}

static mt_model *make(const mt_model_config *c)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    cr_assert_eq(mt_model_create(&m, c, &p), MT_OK, "%s", mt_last_errmsg());
    return m;
}

static void fill(int32_t *tok, int32_t *tg, int n, unsigned seed)
{
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((lcg(&seed) >> 16) % V);
    for (int i = 0; i < n; i++) tg[i] = i % 5 == 0 ? MT_IGNORE_INDEX : tok[(i + 1) % n];
}

static mt_batch batch_of(const int32_t *tok, const int32_t *tg, int b, int s, int m)
{
    mt_batch x;
    mt_batch_init(&x);
    x.micro_batch_size = (uint32_t)b, x.seq_len = (uint32_t)s, x.num_micro_batches = (uint32_t)m;
    x.tokens = tok, x.targets = tg;
    return x;
}

static uint64_t targets_of(const int32_t *tg, int n)
{
    uint64_t c = 0;
    for (int i = 0; i < n; i++) c += tg[i] != MT_IGNORE_INDEX;
    return c;
}

/* The training loss (cross-entropy and, with output_router_logits, the load-balancing loss) and
 * its gradients, left in the fp32 gradient blocks. */
static double train_loss(mt_model *m, const mt_batch *b, uint64_t nt)
{
    double loss, norm;
    cr_assert_eq(mt_engine_grads(m, b, nt, &loss, &norm, NULL), MT_OK, "%s", mt_model_errmsg(m));
    return loss;
}

/* Whole-model gradient check in fp32, as tests/test_engine.c's: for every tensor (the stacked
 * experts as one) the analytic derivative along a random direction against the central difference
 * of the training loss, 2e-3 absolute + 2% relative. The routing is piecewise: a step that changes
 * some token's choice of experts makes the loss jump (by ~4e-3 here), so eps is 3e-4, where no
 * token of these seeds changes its choice (at 1e-3 one of the all-sparse models' tokens does, and
 * the difference is off by ~2); fp32 rounding of a loss of ~3.9 is ~1e-3 in the difference. Two
 * micro-batches: the load-balancing loss is their mean. */
static void gradient_check(mt_model_config c)
{
    mt_model *m = make(&c);
    /* biases start at zero: random values, so that every term they take part in is exercised */
    for (int ui = 0; ui < m->layout.n_units; ui++)
        for (int ti = 0; ti < m->layout.units[ui].n_tensors; ti++) {
            const mt_tensor_desc *td = &m->layout.units[ui].tensors[ti];
            float *w = mt_tile_master(&m->tiles.tile[ui], &m->layout.units[ui]) + td->offset;
            unsigned seed = 7u + (unsigned)(ui * 16 + ti);
            for (uint64_t i = 0; (mt_role_is_bias(td->role) || mt_role_is_frozen(td->role)) && i < td->numel; i++)
                w[i] = 0.3f * uni(&seed);
        }
    enum { B = 2, S = 6, M = 2, N = B * S * M };
    const float eps = 3e-4f;
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 3);
    mt_batch b = batch_of(tok, tg, B, S, M);
    const uint64_t nt = targets_of(tg, N);
    train_loss(m, &b, nt);
    uint64_t P = 0;
    for (int ui = 0; ui < m->layout.n_units; ui++) P += m->layout.units[ui].padded;
    float *grads = malloc(P * sizeof *grads);
    for (int ui = 0, off = 0; ui < m->layout.n_units; off += (int)m->layout.units[ui].padded, ui++)
        memcpy(grads + off, mt_tile_grad_f32(&m->tiles.tile[ui], &m->layout.units[ui]),
               m->layout.units[ui].padded * sizeof *grads);
    int checked = 0, experts = 0;
    for (int ui = 0, off = 0; ui < m->layout.n_units; off += (int)m->layout.units[ui].padded, ui++) {
        const mt_unit_desc *u = &m->layout.units[ui];
        for (int ti = 0; ti < u->n_tensors; ti++) {
            const mt_tensor_desc *td = &u->tensors[ti];
            float *w = mt_tile_master(&m->tiles.tile[ui], u) + td->offset;
            const float *g = grads + off + td->offset;
            if (mt_role_is_frozen(td->role)) { /* DeepSeek-V3's correction bias: moves the choice, takes no gradient */
                for (uint64_t i = 0; i < td->numel; i++) cr_assert_eq(g[i], 0.0f, "%s[%llu] has a gradient", td->name,
                                                                      (unsigned long long)i);
                continue;
            }
            float *d = malloc(td->numel * sizeof *d), *w0 = malloc(td->numel * sizeof *w0);
            double gd = 0;
            unsigned seed = 99u + (unsigned)(ui * 16 + ti);
            for (uint64_t i = 0; i < td->numel; i++) gd += (double)g[i] * (d[i] = uni(&seed));
            memcpy(w0, w, td->numel * sizeof *w);
            for (uint64_t i = 0; i < td->numel; i++) w[i] = w0[i] + eps * d[i];
            const double lp = train_loss(m, &b, nt);
            for (uint64_t i = 0; i < td->numel; i++) w[i] = w0[i] - eps * d[i];
            const double lm = train_loss(m, &b, nt);
            memcpy(w, w0, td->numel * sizeof *w);
            const double fd = (lp - lm) / (2.0 * eps);
            cr_assert(fabs(fd - gd) <= 2e-3 + 2e-2 * fabs(fd), "%s: analytic %.6g, finite difference %.6g", td->name,
                      gd, fd);
            cr_assert(fabs(gd) > 1e-4, "%s carries gradient (%.3g)", td->name, gd);
            checked++;
            experts += td->experts != 0 && !mt_role_is_bias(td->role);
            free(d);
            free(w0);
        }
    }
    const int sparse = mt_config_sparse_layers(&c);
    cr_assert_eq(experts, 3 * sparse, "every sparse layer's stacked experts were checked");
    cr_assert_gt(checked, 3 * sparse + 10);
    free(grads);
    mt_model_destroy(m);
}

Test(moe, gradient_check_qwen3_moe, .timeout = 240) { gradient_check(moe_cfg(MT_ARCH_QWEN3_MOE, 4, 2, 0, MT_PRECISION_FP32)); }
Test(moe, gradient_check_qwen3_moe_aux, .timeout = 240)
{
    gradient_check(moe_cfg(MT_ARCH_QWEN3_MOE, 4, 2, 1, MT_PRECISION_FP32));
}
Test(moe, gradient_check_qwen3_moe_plain_topk_aux, .timeout = 240)
{
    mt_model_config c = moe_cfg(MT_ARCH_QWEN3_MOE, 4, 2, 1, MT_PRECISION_FP32);
    c.norm_topk_prob = 0;
    gradient_check(c);
}
/* Qwen2-MoE: the shared expert (width 24) and its sigmoid gate beside the routed experts, q/k/v biases,
 * the top-k not renormalised, every even layer sliding (its config's rule), the load-balancing loss */
Test(moe, gradient_check_qwen2_moe_shared_gate, .timeout = 240)
{
    mt_model_config c = moe_cfg(MT_ARCH_QWEN3_MOE, 4, 2, 1, MT_PRECISION_FP32);
    c.arch = MT_ARCH_QWEN2_MOE, c.attention_bias = 1, c.norm_topk_prob = 0;
    c.shared_expert_intermediate_size = 24, c.shared_expert_gate = 1;
    c.sliding_window = 4, c.sliding_window_pattern = 2;
    gradient_check(c);
}
Test(moe, gradient_check_mixtral_aux_window, .timeout = 240) { gradient_check(moe_cfg(MT_ARCH_MIXTRAL, 4, 2, 1, MT_PRECISION_FP32)); }
/* GPT-OSS: attention sinks, q/k/v/o biases (the sinks give k's bias a gradient: the softmax is no longer
 * blind to a shift of a row's scores), every other layer sliding, the router's and the experts' biases, the
 * clamped SwiGLU, the load-balancing loss. The biases start at zero as transformers starts them; they are
 * moved to random values first so that each term of the gradient they take part in is exercised. */
Test(moe, gradient_check_gpt_oss, .timeout = 240)
{
    mt_model_config c = moe_cfg(MT_ARCH_MIXTRAL, 4, 2, 1, MT_PRECISION_FP32);
    c.arch = MT_ARCH_GPT_OSS, c.attention_bias = 1, c.sliding_window_pattern = 2;
    gradient_check(c);
}

/* A small DeepSeek-V3: multi-head latent attention (q from a rank-12 latent, keys and values from a rank-8
 * one, heads of 6 + 4 with RoPE on the last 4, interleaved, values 5 wide so that the value heads are
 * narrower than the q/k ones), YaRN with mscale_all_dim (the softmax scale's factor) and q_a/kv_a/o biases;
 * 8 experts in 4 groups, a token's 3 chosen from its 2 best groups by sigmoid score plus the correction
 * bias (set non-zero), weighed by score, renormalised and times 2.5; two shared experts (one MLP of 32);
 * layer 0 dense (first_k_dense_replace 1). */
static mt_model_config deepseek_cfg(void)
{
    mt_model_config c = moe_cfg(MT_ARCH_QWEN3_MOE, 8, 3, 0, MT_PRECISION_FP32);
    c.arch = MT_ARCH_DEEPSEEK_V3, c.num_key_value_heads = c.num_attention_heads, c.attention_bias = 1;
    c.mlp_only_layers[0] = 1u << 0;
    c.kv_lora_rank = 8, c.q_lora_rank = 12, c.qk_nope_head_dim = 6, c.qk_rope_head_dim = 4, c.v_head_dim = 5;
    c.rope_interleave = 1, c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.5f;
    c.moe_scoring = MT_MOE_SCORING_SIGMOID, c.shared_expert_intermediate_size = 32;
    c.rope_scaling = MT_ROPE_SCALING_YARN, c.rope_factor = 4.0f, c.rope_original_max_position = 4;
    c.rope_mscale = 1.0f, c.rope_mscale_all_dim = 1.0f;
    /* sigmoid scores sit near 0.5 and their gaps are small: with seed 7, eps 3e-4 moves a token to other
     * experts (the difference jumps to ~8); seed 10's routings stay put up to eps 1e-3 */
    c.seed = 10;
    return c;
}

Test(moe, gradient_check_deepseek_v3, .timeout = 240) { gradient_check(deepseek_cfg()); }
/* q_proj from the hidden state (q_lora_rank null, DeepSeek-V2-Lite's shape), RoPE's pairs (i, i + 2), the
 * weights not renormalised, no group limit, no biases */
Test(moe, gradient_check_deepseek_v3_plain, .timeout = 240)
{
    mt_model_config c = deepseek_cfg();
    c.q_lora_rank = 0, c.rope_interleave = 0, c.norm_topk_prob = 0, c.n_group = 0, c.topk_group = 0;
    c.attention_bias = 0, c.v_head_dim = 10;
    gradient_check(c);
}

/* DeepSeek-V2: the same attention (q_proj), softmax scores chosen among the 2 best of 4 groups (each group
 * scored by its best expert), never renormalised, times 2.5; two shared experts; layer 0 dense */
Test(moe, gradient_check_deepseek_v2, .timeout = 240)
{
    mt_model_config c = deepseek_cfg();
    c.arch = MT_ARCH_DEEPSEEK_V2, c.moe_scoring = MT_MOE_SCORING_SOFTMAX, c.norm_topk_prob = 0, c.q_lora_rank = 0;
    gradient_check(c);
}

/* Llama 4: layers 0 and 1 with RoPE (interleaved pairs) attending in chunks of 4 of the 6 positions, their
 * q and k L2-normed after it; layer 2 without RoPE, attending fully, q scaled by the attention temperature
 * (floor 2 and scale 0.5, so that positions 0..5 get four different factors); layer 1 dense (Maverick's
 * interleaving); each token's expert chosen by logit, its weight sigmoid(logit) scaling the expert's input,
 * a shared expert as wide as each routed one (no biases, as Llama 4: on the NoPE layer k's would take no
 * gradient, every score of a row moving by q . b_k, which the softmax ignores). */
static mt_model_config llama4_cfg(int topk)
{
    mt_model_config c = moe_cfg(MT_ARCH_QWEN3_MOE, 4, topk, 0, MT_PRECISION_FP32);
    c.arch = MT_ARCH_LLAMA4, c.norm_topk_prob = 0;
    c.mlp_only_layers[0] = 1u << 1;
    c.moe_scoring = MT_MOE_SCORING_SIGMOID, c.moe_input_weighted = 1;
    c.shared_expert_intermediate_size = c.moe_intermediate_size;
    c.attention_chunk_size = 4, c.qk_l2_norm = 1, c.nope_layers[0] = 1u << 2;
    c.attn_temperature_floor = 2.0f, c.attn_temperature_scale = 0.5f;
    return c;
}

Test(moe, gradient_check_llama4, .timeout = 240) { gradient_check(llama4_cfg(1)); }
/* two experts a token: the input-weighted rows of one token in two experts, added back */
Test(moe, gradient_check_llama4_top2, .timeout = 240) { gradient_check(llama4_cfg(2)); }

/* ---- experts without tokens ------------------------------------------------------------------ */

/* The block of expert e of stacked tensor t in the fp32 block `base` of its unit. */
static float *block_of(float *base, const mt_tensor_desc *t, uint32_t e)
{
    return base + t->offset + (uint64_t)e * (t->numel / t->experts);
}

static int all_zero(const float *x, uint64_t n)
{
    for (uint64_t i = 0; i < n; i++)
        if (x[i] != 0.0f) return 0;
    return 1;
}

/* Three tokens routed to one of 8 experts each (k = 1, weights not renormalised, so that the router
 * learns) leave at least 5 experts of every sparse layer without a token. Such an expert's gradient
 * is exactly zero, and AdamW still updates it as torch.optim.AdamW does a parameter whose gradient is
 * zero (transformers 5 holds the experts as one tensor, so every expert has a gradient): m and v
 * decay by beta1 and beta2 (checked to 1 ulp-ish, 1e-6 relative: the optimizer's own roundings), and
 * an expert that was routed before moves on its momentum. */
Test(moe, experts_without_tokens, .timeout = 60)
{
    mt_model_config c = moe_cfg(MT_ARCH_QWEN3_MOE, 8, 1, 1, MT_PRECISION_FP32);
    c.norm_topk_prob = 0;
    mt_model *m = make(&c);
    enum { N = 3 };
    int32_t tok[N], tg[N];
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 1e-2f, o.beta1 = 0.9f, o.beta2 = 0.95f, o.weight_decay = 0.0f, o.grad_clip = 0.0f;
    fill(tok, tg, N, 21);
    tg[0] = tok[1];
    mt_batch a = batch_of(tok, tg, 1, N, 1);
    cr_assert_eq(mt_step(m, &a, &o, NULL), MT_OK, "%s", mt_model_errmsg(m));
    /* a second batch that leaves some expert routed by the first without a token */
    int found = 0;
    for (unsigned seed = 100; seed < 200 && !found; seed++) {
        fill(tok, tg, N, seed);
        tg[0] = tok[1];
        mt_batch b = batch_of(tok, tg, 1, N, 1);
        double loss, norm;
        cr_assert_eq(mt_engine_grads(m, &b, N, &loss, &norm, NULL), MT_OK, "%s", mt_model_errmsg(m));
        for (int ui = 1; ui <= (int)c.num_hidden_layers && !found; ui++) {
            const mt_unit_desc *u = &m->layout.units[ui];
            const mt_tile *tl = &m->tiles.tile[ui];
            int routed = 0, idle = 0;
            for (int ti = 0; ti < u->n_tensors; ti++) {
                const mt_tensor_desc *t = &u->tensors[ti];
                if (t->role != MT_T_EXP_DOWN) continue;
                const uint64_t n = t->numel / t->experts;
                for (uint32_t e = 0; e < t->experts; e++) {
                    const int zero = all_zero(block_of(mt_tile_grad_f32(tl, u), t, e), n);
                    routed += !zero, idle += zero;
                }
            }
            cr_assert_leq(routed, N, "at most one expert a token");
            cr_assert_geq(idle, 8 - N);
            for (int ti = 0; ti < u->n_tensors && !found; ti++) {
                const mt_tensor_desc *t = &u->tensors[ti];
                if (!t->experts) continue;
                const uint64_t n = t->numel / t->experts;
                for (uint32_t e = 0; e < t->experts && !found; e++) {
                    float *g = block_of(mt_tile_grad_f32(tl, u), t, e), *m0 = block_of(mt_tile_m(tl, u), t, e);
                    if (!all_zero(g, n) || all_zero(m0, n)) continue;
                    found = 1;
                    /* every matrix of this expert has no gradient */
                    for (int tj = 0; tj < u->n_tensors; tj++)
                        if (u->tensors[tj].experts)
                            cr_assert(all_zero(block_of(mt_tile_grad_f32(tl, u), &u->tensors[tj], e), n),
                                      "%s: expert %u", u->tensors[tj].name, e);
                    float *mm = malloc(n * 4), *vv = malloc(n * 4), *ww = malloc(n * 4);
                    memcpy(mm, m0, n * 4);
                    memcpy(vv, block_of(mt_tile_v(tl, u), t, e), n * 4);
                    memcpy(ww, block_of(mt_tile_master(tl, u), t, e), n * 4);
                    cr_assert_eq(mt_step(m, &b, &o, NULL), MT_OK, "%s", mt_model_errmsg(m));
                    const float *m1 = block_of(mt_tile_m(tl, u), t, e), *v1 = block_of(mt_tile_v(tl, u), t, e);
                    const float *w1 = block_of(mt_tile_master(tl, u), t, e);
                    int moved = 0;
                    for (uint64_t i = 0; i < n; i++) {
                        cr_assert(fabsf(m1[i] - o.beta1 * mm[i]) <= 1e-6f * fabsf(mm[i]), "%s[%u]: m %g after %g",
                                  t->name, e, m1[i], mm[i]);
                        cr_assert(fabsf(v1[i] - o.beta2 * vv[i]) <= 1e-6f * fabsf(vv[i]), "%s[%u]: v %g after %g",
                                  t->name, e, v1[i], vv[i]);
                        moved += w1[i] != ww[i];
                    }
                    cr_assert_gt(moved, 0, "%s: expert %u moves on its momentum", t->name, e);
                    free(mm), free(vv), free(ww);
                }
            }
        }
    }
    cr_assert(found, "some batch leaves an expert of the first batch without a token");
    mt_model_destroy(m);
}

/* ---- layout, resume, plan ----------------------------------------------------------------------- */

/* The layout's units hold what mt_layout_count_params counts, a sparse layer at most
 * MT_MAX_UNIT_TENSORS tensors (attention with biases and q/k norms, the router, three stacks). */
Test(moe, layout_counts_its_parameters)
{
    mt_model_config cs[4] = {moe_cfg(MT_ARCH_QWEN3_MOE, 4, 2, 1, MT_PRECISION_BF16),
                             moe_cfg(MT_ARCH_MIXTRAL, 8, 2, 0, MT_PRECISION_FP32),
                             moe_cfg(MT_ARCH_QWEN3_MOE, 16, 4, 0, MT_PRECISION_FP32),
                             moe_cfg(MT_ARCH_QWEN3_MOE, 4, 2, 1, MT_PRECISION_BF16)};
    cs[2].decoder_sparse_step = 2, cs[2].mlp_only_layers[0] = 0, cs[2].attention_bias = 1;
    cs[3].num_hidden_layers = 5, cs[3].mlp_only_layers[0] = 0x15; /* layers 0, 2, 4 dense */
    for (int k = 0; k < 4; k++) {
        mt_model *m = make(&cs[k]);
        uint64_t n = 0;
        int sparse = 0;
        for (int ui = 0; ui < m->layout.n_units; ui++) {
            const mt_unit_desc *u = &m->layout.units[ui];
            uint64_t un = 0;
            int router = 0;
            for (int ti = 0; ti < u->n_tensors; ti++) un += u->tensors[ti].numel, router |= u->tensors[ti].role == MT_T_ROUTER;
            cr_assert_eq(un, u->numel);
            n += un;
            if (u->kind == MT_UNIT_LAYER) {
                cr_assert_eq(router, mt_config_layer_sparse(&m->cfg, u->layer), "layer %d", u->layer);
                sparse += router;
            }
        }
        cr_assert_eq(sparse, mt_config_sparse_layers(&m->cfg));
        cr_assert_eq(n, m->layout.num_params);
        cr_assert_eq(n, mt_layout_count_params(&m->cfg), "config %d: layout %llu, count %llu", k,
                     (unsigned long long)n, (unsigned long long)mt_layout_count_params(&m->cfg));
        mt_model_destroy(m);
    }
    cr_assert_eq(mt_config_sparse_layers(&cs[2]), 1, "decoder_sparse_step 2 of 3 layers: layer 1");
    cr_assert_eq(mt_config_sparse_layers(&cs[3]), 2);
}

static int rm_entry(const char *p, const struct stat *sb, int f, struct FTW *w)
{
    (void)sb, (void)f, (void)w;
    return remove(p);
}

static void train(mt_model *m, int steps, unsigned *seed)
{
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 5e-3f;
    enum { N = 2 * 8 * 2 };
    int32_t tok[N], tg[N];
    for (int s = 0; s < steps; s++) {
        fill(tok, tg, N, (*seed)++);
        mt_batch b = batch_of(tok, tg, 2, 8, 2);
        cr_assert_eq(mt_step(m, &b, &o, NULL), MT_OK, "%s", mt_model_errmsg(m));
    }
}

/* Four steps straight and two + a resume checkpoint + two in a fresh model give the same bits:
 * every expert's weights and moments go through the checkpoint as per-expert tensors. */
static void resume_check(mt_model_config c)
{
    mt_model *ref = make(&c);
    unsigned sr = 1;
    train(ref, 4, &sr);
    mt_model *a = make(&c);
    unsigned sa = 1;
    train(a, 2, &sa);
    char dir[] = "/tmp/mt_moe_ckpt_XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    mt_checkpoint_info info;
    mt_checkpoint_info_init(&info);
    cr_assert_eq(mt_checkpoint_save(a, dir, &info), MT_OK, "%s", mt_model_errmsg(a));
    mt_model_destroy(a);
    mt_model_config c2 = c;
    c2.seed = 1234;
    mt_model *b = make(&c2);
    cr_assert_eq(mt_checkpoint_load(b, dir, &info), MT_OK, "%s", mt_model_errmsg(b));
    train(b, 2, &sa);
    for (int u = 0; u < ref->layout.n_units; u++) {
        const mt_unit_desc *d = &ref->layout.units[u];
        const mt_tile *x = &ref->tiles.tile[u], *y = &b->tiles.tile[u];
        cr_assert_eq(memcmp(mt_tile_master(x, d), mt_tile_master(y, d), d->padded * 4), 0, "unit %d master", u);
        cr_assert_eq(memcmp(mt_tile_m(x, d), mt_tile_m(y, d), d->padded * 4), 0, "unit %d m", u);
        cr_assert_eq(memcmp(mt_tile_v(x, d), mt_tile_v(y, d), d->padded * 4), 0, "unit %d v", u);
    }
    mt_model_destroy(ref);
    mt_model_destroy(b);
    nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

Test(moe, resume_is_bit_identical_qwen3_moe, .timeout = 60) { resume_check(moe_cfg(MT_ARCH_QWEN3_MOE, 4, 2, 1, MT_PRECISION_BF16)); }
Test(moe, resume_is_bit_identical_mixtral, .timeout = 60) { resume_check(moe_cfg(MT_ARCH_MIXTRAL, 4, 2, 1, MT_PRECISION_FP32)); }

/* mt_plan of the Qwen3-30B-A3B shape in bf16: 30,532,122,624 parameters in 50 units, 2 + 4 + 8
 * bytes a parameter for the streamed weights, the master and the moments (padding: each tensor
 * rounded to 128 elements, under 1e-5 of the total here), each layer unit 622 M parameters. */
Test(moe, plan_qwen3_30b_a3b)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.arch = MT_ARCH_QWEN3_MOE;
    c.vocab_size = 151936, c.hidden_size = 2048, c.intermediate_size = 6144, c.num_hidden_layers = 48;
    c.num_attention_heads = 32, c.num_key_value_heads = 4, c.head_dim = 128, c.max_position_embeddings = 40960;
    c.num_experts = 128, c.num_experts_per_tok = 8, c.moe_intermediate_size = 768, c.norm_topk_prob = 1;
    c.rms_norm_eps = 1e-6f, c.rope_theta = 1e6f;
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = MT_BACKEND_CPU;
    p.host_budget_bytes = (uint64_t)1 << 40;
    mt_memory_plan plan;
    mt_memory_plan_init(&plan);
    cr_assert_eq(mt_plan(&plan, &c, &p, NULL), MT_OK, "%s", mt_last_errmsg());
    const uint64_t P = 30532122624ull;
    cr_assert_eq(plan.num_params, P);
    cr_assert_eq(plan.num_units, 50);
    const uint64_t layer = 2 * 2048 + 4096 * 2048 + 2 * 512 * 2048 + 2048 * 4096 + 2 * 128 + 128 * 2048 +
                           128ull * 3 * 768 * 2048;
    cr_assert_eq(plan.largest_unit_params, layer, "a layer unit: %llu", (unsigned long long)plan.largest_unit_params);
    cr_assert(plan.weight_bytes >= 2 * P && plan.weight_bytes <= 2 * P + P / 50000);
    cr_assert(plan.master_bytes >= 4 * P && plan.master_bytes <= 4 * P + P / 25000);
    cr_assert(plan.optim_bytes >= 8 * P && plan.optim_bytes <= 8 * P + P / 12500);
    cr_assert_eq(plan.grad_bytes, 0, "bf16 mode lands gradients in the weight block");
}

/* The load-balancing loss's value, independently of the routing code's own arithmetic: with the
 * routers' weights zero every probability is 1/E, every token picks experts 0 .. k-1 (ties go to the
 * lower index) and transformers' formula gives E * sum_{e<k} (N/N) (1/E) = k whatever the shapes
 * (tokens_per_expert is a mean over the N rows of (k, E) one-hots, summed over k). mt_step's loss is
 * then mt_eval's cross-entropy plus the coefficient times k, for each micro-batch and so for their
 * mean; without output_router_logits the two are equal. (Relative 1e-6: the two runs' cross-entropies
 * are the same computation, the loss ~3.6.) */
Test(moe, aux_loss_of_a_uniform_router_is_k)
{
    for (int aux = 0; aux < 2; aux++) {
        mt_model_config c = moe_cfg(MT_ARCH_QWEN3_MOE, 6, 3, aux, MT_PRECISION_FP32);
        mt_model *m = make(&c);
        for (int ui = 0; ui < m->layout.n_units; ui++) {
            const mt_unit_desc *u = &m->layout.units[ui];
            for (int ti = 0; ti < u->n_tensors; ti++)
                if (u->tensors[ti].role == MT_T_ROUTER)
                    memset(mt_tile_master(&m->tiles.tile[ui], u) + u->tensors[ti].offset, 0, u->tensors[ti].numel * 4);
        }
        enum { B = 2, S = 7, M = 3, N = B * S * M };
        int32_t tok[N], tg[N];
        fill(tok, tg, N, 17);
        mt_batch b = batch_of(tok, tg, B, S, M);
        mt_eval_stats es;
        mt_eval_stats_init(&es);
        cr_assert_eq(mt_eval(m, &b, &es), MT_OK, "%s", mt_model_errmsg(m));
        const double step_loss = train_loss(m, &b, targets_of(tg, N));
        const double want = es.loss + (aux ? (double)c.router_aux_loss_coef * c.num_experts_per_tok : 0.0);
        cr_assert(fabs(step_loss - want) <= 1e-6 * want, "aux %d: step loss %.9g, cross-entropy %.9g + %g x %u", aux,
                  step_loss, es.loss, (double)c.router_aux_loss_coef, c.num_experts_per_tok);
        mt_model_destroy(m);
    }
}

/* The plan of an MoE model and shape is what a step then reserves (the routed rows' buffers and the
 * routing statistics included), as tests/test_backend.c checks for dense models. */
Test(moe, cpu_plan_is_the_allocation)
{
    const int shapes[][3] = {{1, 16, 1}, {2, 32, 3}};
    for (int k = 0; k < 2; k++) {
        mt_model_config c = moe_cfg(k ? MT_ARCH_MIXTRAL : MT_ARCH_QWEN3_MOE, 8, 2, 1, k ? MT_PRECISION_FP32 : MT_PRECISION_BF16);
        mt_offload_policy p;
        mt_offload_policy_init(&p);
        p.backend = MT_BACKEND_CPU;
        p.optimizer_threads = 2;
        p.log_level = MT_LOG_ERROR;
        mt_batch_shape bs;
        mt_batch_shape_init(&bs);
        bs.micro_batch_size = (uint32_t)shapes[k][0], bs.seq_len = (uint32_t)shapes[k][1];
        bs.num_micro_batches = (uint32_t)shapes[k][2];
        mt_memory_plan plan;
        mt_memory_plan_init(&plan);
        cr_assert_eq(mt_plan(&plan, &c, &p, &bs), MT_OK, "%s", mt_last_errmsg());
        mt_model *m = NULL;
        cr_assert_eq(mt_model_create(&m, &c, &p), MT_OK, "%s", mt_last_errmsg());
        const int n = shapes[k][0] * shapes[k][1] * shapes[k][2];
        int32_t *tok = malloc((size_t)n * sizeof *tok), *tg = malloc((size_t)n * sizeof *tg);
        fill(tok, tg, n, 5);
        mt_batch b = batch_of(tok, tg, shapes[k][0], shapes[k][1], shapes[k][2]);
        mt_optim_config o;
        mt_optim_config_init(&o);
        cr_assert_eq(mt_step(m, &b, &o, NULL), MT_OK, "%s", mt_model_errmsg(m));
        const mt_be_needs *h = &m->be->held;
        cr_assert_eq(plan.host_pageable_bytes + plan.host_pinned_bytes, m->layout.tile_bytes + h->host_bytes,
                     "config %d: planned %llu, allocated %llu", k,
                     (unsigned long long)(plan.host_pageable_bytes + plan.host_pinned_bytes),
                     (unsigned long long)(m->layout.tile_bytes + h->host_bytes));
        cr_assert_eq(plan.activation_bytes + plan.workspace_bytes, h->host_bytes);
        free(tok), free(tg);
        mt_model_destroy(m);
    }
}

/* A micro-batch whose routed rows (tokens x k) pass 2^31 is refused before anything runs: the
 * experts' GEMMs and the routing count rows in int. */
Test(moe, too_many_routed_rows_are_refused)
{
    mt_model_config c = moe_cfg(MT_ARCH_QWEN3_MOE, 1024, 1024, 0, MT_PRECISION_FP32);
    c.max_position_embeddings = 1u << 22;
    c.moe_intermediate_size = 1;
    c.num_hidden_layers = 1, c.mlp_only_layers[0] = 0;
    mt_model *m = make(&c);
    int32_t tok[1] = {0};
    mt_batch b = batch_of(tok, tok, 1, (1 << 21) + 1, 1); /* never read: refused first */
    mt_step_stats st;
    mt_step_stats_init(&st);
    mt_optim_config o;
    mt_optim_config_init(&o);
    cr_assert_eq(mt_step(m, &b, &o, &st), MT_ERR_INVALID_ARGUMENT);
    cr_assert(strstr(mt_model_errmsg(m), "routed to 1024 experts"), "%s", mt_model_errmsg(m));
    cr_assert_eq(mt_model_step_count(m), 0);
    mt_model_destroy(m);
}

/* Llama 4's chunks as the attention kernels take them (mt_window_starts with window -N): each query's first key
 * is the later of its document's first token and its chunk's, N * floor(i / N) counted in the sequence, as
 * transformers' chunked mask counts (kv_idx // N == q_idx // N); a sliding window's rule is unchanged */
Test(moe, window_starts_chunks)
{
    enum { S = 11 };
    const int32_t docs[2 * S] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, /* one document */
                                 0, 0, 0, 3, 3, 3, 3, 3, 3, 9, 9}; /* documents from 0, 3 and 9 */
    int32_t win[2 * S];
    mt_window_starts(win, docs, 2, S, -4);
    static const int32_t want[2 * S] = {0, 0, 0, 0, 4, 4, 4, 4, 8, 8, 8, 0, 0, 0, 3, 4, 4, 4, 4, 8, 9, 9};
    for (int t = 0; t < 2 * S; t++) cr_assert_eq(win[t], want[t], "token %d: first key %d, want %d", t, win[t], want[t]);
    mt_window_starts(win, docs, 2, S, 4);
    for (int t = 0; t < 2 * S; t++) cr_assert_eq(win[t], MT_MAX(docs[t], t % S - 3), "a sliding window of 4: token %d", t);
}
