/* Mixture-of-experts on the GPU: the CUDA kernels of cuda/kernels/moe.h
 * against the CPU ops of src/cpu/cpu_moe.h (suite cuda_kernels, tests moe_*),
 * and Qwen3-MoE and Mixtral steps on the CUDA backend against the CPU
 * backend (suite cuda_backend, tests moe_*). Each test skips on a machine
 * without a CUDA device (fails under MT_REQUIRE_GPU=1, tests/gpu.h).
 *
 * Tolerances, in units of u = 2^-24 where fp32: the routing's softmax uses
 * CUDA's expf (<= 2 ulp) against glibc's (< 1 ulp) and sums the exponentials
 * in double in another order, then rounds 1/sum and the product: each
 * probability within 5u + 2u + 1u, checked to 16u; the choice of experts is
 * then exact (the logits here are drawn with gaps far above that), the
 * routing weights (the k probabilities, their fp32 sum and a division) within
 * 48u, the rows and counts identical. The
 * backward's sums run in other orders over at most E terms of similar size:
 * 1e-5 of the row's largest. Gathers copy (exact); the combine's sums use the
 * CPU's roundings in the same order (fp32: exact; bf16 out: one rounding);
 * dot products are summed in double on both sides (fp32: within 2u). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "cpu/cpu_moe.h"
#include "cpu/cpu_ops.h"
#include "cuda/kernels/moe.h"
#include "device/device.h"
#include "engine/engine.h"
#include "engine/backend.h"
#include "model/template.h"
#include "gpu.h"

#define U24 5.9604644775390625e-08 /* 2^-24 */

static char why[256];

#define NEED_GPU()                                                                                                     \
    do {                                                                                                               \
        if (mt_device_count(why, sizeof why) <= 0) MT_GPU_MISSING("%s", why);                                          \
    } while (0)

static void *up(const void *h, size_t bytes)
{
    void *d = NULL;
    cr_assert(mt_device_malloc(&d, bytes ? bytes : 4, why, sizeof why) == 0 && d, "%s", why);
    if (h && bytes) cr_assert(mt_device_copy_h2d(d, h, bytes, why, sizeof why) == 0, "%s", why); /* NULL: space only */
    return d;
}

static void down(void *h, const void *d, size_t bytes)
{
    cr_assert(mt_device_copy_d2h(h, d, bytes, why, sizeof why) == 0, "%s", why);
}

static unsigned lcg(unsigned *s) { return *s = *s * 1664525u + 1013904223u; }
static float uni(unsigned *s) { return ((float)(lcg(s) >> 8) / 16777216.0f) * 2.0f - 1.0f; }

/* Logits whose probabilities are well apart: a random permutation of 0, h, 2h, .. per row plus a
 * jitter of at most h / 4, h = 0.37 or less so that the row spans at most 50 (no probability near
 * fp32's underflow, where the two expf could differ in denormals): no two within h / 2. */
static void spread_logits(float *z, int T, int E, unsigned *s)
{
    const float h = fminf(0.37f, 50.0f / (float)E);
    for (int t = 0; t < T; t++) {
        for (int e = 0; e < E; e++) z[t * E + e] = h * (float)e + 0.25f * h * uni(s);
        for (int e = E - 1; e > 0; e--) {
            const int j = (int)(lcg(s) % (unsigned)(e + 1));
            const float x = z[t * E + e];
            z[t * E + e] = z[t * E + j], z[t * E + j] = x;
        }
    }
}

/* ---- kernels ---------------------------------------------------------------------------- */

static void route_check(int T, int E, int k, int norm)
{
    NEED_GPU();
    const int R = T * k;
    unsigned s = 11u + (unsigned)(T * 7 + E);
    float *z = malloc((size_t)T * E * 4), *p = malloc((size_t)T * E * 4), *w = malloc((size_t)R * 4);
    float *gp = malloc((size_t)T * E * 4), *gw = malloc((size_t)R * 4), st[2 * 1024], gst[2 * 1024];
    int32_t *ti = malloc((size_t)R * 4), *rows = malloc((size_t)R * 4), *sr = malloc((size_t)R * 4);
    int32_t *gti = malloc((size_t)R * 4), *grows = malloc((size_t)R * 4), *gsr = malloc((size_t)R * 4);
    int32_t offs[1025], goffs[1025];
    spread_logits(z, T, E, &s);
    const mt_route rt = {.norm = norm, .scale = 1};
    mt_cpu_moe_route(p, w, ti, rows, sr, offs, st, z, T, E, k, &rt);
    float *dz = up(z, (size_t)T * E * 4), *dp = up(NULL, (size_t)T * E * 4), *dw = up(NULL, (size_t)R * 4);
    float *dst = up(NULL, 2 * (size_t)E * 4);
    int32_t *dti = up(NULL, (size_t)R * 4), *drows = up(NULL, (size_t)R * 4), *dsr = up(NULL, (size_t)R * 4);
    int32_t *doffs = up(NULL, ((size_t)E + 1) * 4);
    cr_assert_eq(mt_cu_moe_route(NULL, dp, dw, dti, drows, dsr, doffs, dst, dz, T, E, k, &rt, MT_CU_F32), 0);
    down(gp, dp, (size_t)T * E * 4), down(gw, dw, (size_t)R * 4), down(gst, dst, 2 * (size_t)E * 4);
    down(gti, dti, (size_t)R * 4), down(grows, drows, (size_t)R * 4), down(gsr, dsr, (size_t)R * 4);
    down(goffs, doffs, ((size_t)E + 1) * 4);
    for (int i = 0; i < T * E; i++) cr_assert(fabsf(gp[i] - p[i]) <= 16 * U24 * p[i], "p[%d] %.9g vs %.9g", i, gp[i], p[i]);
    cr_assert_eq(memcmp(gti, ti, (size_t)R * 4), 0, "T %d E %d k %d: the same experts", T, E, k);
    for (int i = 0; i < R; i++) cr_assert(fabsf(gw[i] - w[i]) <= 48 * U24 * w[i], "w[%d] %.9g vs %.9g", i, gw[i], w[i]);
    cr_assert_eq(memcmp(goffs, offs, ((size_t)E + 1) * 4), 0, "offsets");
    cr_assert_eq(memcmp(grows, rows, (size_t)R * 4), 0, "rows in slot order within each expert");
    cr_assert_eq(memcmp(gsr, sr, (size_t)R * 4), 0, "slot_row");
    for (int e = 0; e < E; e++) {
        cr_assert_eq(gst[e], st[e], "count of expert %d", e);
        cr_assert(fabsf(gst[E + e] - st[E + e]) <= 4e-6f * st[E + e] + 1e-7f, "probability sum of expert %d", e);
    }
    /* the backward, with and without the load-balancing term (L = 1: stats as the layer's) */
    float *g = malloc((size_t)R * 4), *dl = malloc((size_t)T * E * 4), *gdl = malloc((size_t)T * E * 4);
    for (int i = 0; i < R; i++) g[i] = uni(&s);
    float *dg = up(g, (size_t)R * 4), *ddl = up(NULL, (size_t)T * E * 4);
    for (int aux = 0; aux < 2; aux++) {
        mt_cpu_moe_route_bwd(dl, g, p, w, ti, aux ? st : NULL, 1, 0.3f, T, E, k, &rt);
        cr_assert_eq(mt_cu_moe_route_bwd(NULL, ddl, dg, dp, dw, dti, aux ? dst : NULL, 1, 0.3f, T, E, k, &rt), 0);
        down(gdl, ddl, (size_t)T * E * 4);
        for (int t = 0; t < T; t++) {
            float mx = 0;
            for (int e = 0; e < E; e++) mx = fmaxf(mx, fabsf(dl[t * E + e]));
            for (int e = 0; e < E; e++)
                cr_assert(fabsf(gdl[t * E + e] - dl[t * E + e]) <= 1e-5f * mx + 1e-12f, "aux %d: dz[%d][%d] %.9g vs %.9g",
                          aux, t, e, gdl[t * E + e], dl[t * E + e]);
        }
    }
    free(z), free(p), free(w), free(gp), free(gw), free(ti), free(rows), free(sr), free(gti), free(grows), free(gsr);
    free(g), free(dl), free(gdl);
    mt_device_free(dz), mt_device_free(dp), mt_device_free(dw), mt_device_free(dst), mt_device_free(dti);
    mt_device_free(drows), mt_device_free(dsr), mt_device_free(doffs), mt_device_free(dg), mt_device_free(ddl);
}

/* Shapes: a few tokens among many experts (most get none), E above a warp (several experts a lane),
 * k = 1, and the 30B-A3B's 128 experts top-8 over more tokens than a block's pass (placement: 4096
 * slots a pass; 1100 x 8 = 8800 slots, three passes, the last one partial) */
Test(cuda_kernels, moe_route)
{
    route_check(5, 64, 2, 1);
    route_check(37, 8, 2, 1);
    route_check(300, 128, 8, 1);
    route_check(300, 128, 8, 0);
    route_check(1100, 128, 8, 1);
    route_check(70, 40, 1, 0);
    route_check(1, 1024, 3, 1);
}

/* ---- DeepSeek-V3's routing (mt_route's sigmoid mode) ---- */

/* The best of n values v not yet taken (a tie: the lower index), taken then; *margin lowered to its lead
 * over the best of the rest. */
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

/* The smallest lead of a decision of DeepSeek-V3's routing of one token (transformers'
 * DeepseekV3TopkRouter), in double from its fp32 logits z (E) and bias (E): of each kept group (the sum
 * of its two best choice scores) over the groups not yet picked, of each chosen expert over the rest of
 * the kept groups' experts. A token whose decisions are that far apart routes alike on both sides. */
static double ds_margin(const float *z, const float *bias, int E, int k, int n_group, int topk_group)
{
    const int ng = n_group > 1 ? n_group : 1, G = E / ng;
    double c[1024], gs[1024], margin = INFINITY;
    int kept[1024], taken[1024] = {0};
    for (int e = 0; e < E; e++) c[e] = 1.0 / (1.0 + exp(-(double)z[e])) + bias[e];
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
        if (!kept[e / G]) c[e] = -INFINITY;
    for (int j = 0; j < k; j++) ds_pick(c, taken, E, &margin);
    return margin;
}

/* The CUDA routing in DeepSeek-V3's mode (sigmoid scores, the correction bias in fp32 or bf16, groups,
 * scale 2.5) against the CPU op on the same values (the CPU's bias the bf16 values in fp32). Logits
 * within +-4, a bias within +-0.5; a token whose decisions are within 1e-5 of each other (ds_margin) is
 * drawn again, so that the two sides' scores, which differ by a few ulp (CUDA's expf, <= 2 ulp against
 * glibc's, then the same add and division: 16u checked, as the softmax's), choose alike: the experts
 * exactly, the weights (a sum of k scores in the same order, a division, the scale) within 48u, the rows,
 * offsets and counts identical, the score sums 4e-6 relative. Then the backward, without and with the
 * statistics' term, to 1e-5 of each row's largest (a few fp32 roundings on each side). The fixture
 * exercises the bias and the groups: without either some token's experts differ (on the CPU). */
static void sigmoid_route_check(int T, int E, int k, int n_group, int topk_group, int norm, int bias_bf16)
{
    NEED_GPU();
    const int R = T * k;
    unsigned s = 101u + (unsigned)(T * 7 + E + n_group);
    float *z = malloc((size_t)T * E * 4), *p = malloc((size_t)T * E * 4), *w = malloc((size_t)R * 4);
    float *gp = malloc((size_t)T * E * 4), *gw = malloc((size_t)R * 4), st[2 * 1024], gst[2 * 1024], bias[1024];
    int32_t *ti = malloc((size_t)R * 4), *rows = malloc((size_t)R * 4), *sr = malloc((size_t)R * 4);
    int32_t *gti = malloc((size_t)R * 4), *grows = malloc((size_t)R * 4), *gsr = malloc((size_t)R * 4);
    int32_t *ti2 = malloc((size_t)R * 4);
    int32_t offs[1025], goffs[1025];
    uint16_t bias16[1024];
    for (int e = 0; e < E; e++) {
        bias[e] = 0.5f * uni(&s);
        bias16[e] = mt_f32_to_bf16(bias[e]);
        if (bias_bf16) bias[e] = mt_bf16_to_f32(bias16[e]);
    }
    for (int t = 0; t < T; t++) {
        int tries = 0;
        do {
            for (int e = 0; e < E; e++) z[(size_t)t * E + e] = 4.0f * uni(&s);
            cr_assert_lt(++tries, 1000, "token %d: no decisive draw", t);
        } while (ds_margin(z + (size_t)t * E, bias, E, k, n_group, topk_group) < 1e-5);
    }
    const mt_route rt = {.norm = norm, .sigmoid = 1, .n_group = n_group, .topk_group = topk_group, .scale = 2.5f,
                         .bias = bias};
    mt_cpu_moe_route(p, w, ti, rows, sr, offs, st, z, T, E, k, &rt);
    /* the fixture: the bias and the groups change some token's experts */
    mt_route other = rt;
    other.bias = NULL;
    mt_cpu_moe_route(gp, gw, ti2, grows, gsr, goffs, NULL, z, T, E, k, &other);
    cr_assert_neq(memcmp(ti2, ti, (size_t)R * 4), 0, "the bias changes some choice");
    if (n_group > 1) {
        other = rt, other.n_group = 0;
        mt_cpu_moe_route(gp, gw, ti2, grows, gsr, goffs, NULL, z, T, E, k, &other);
        cr_assert_neq(memcmp(ti2, ti, (size_t)R * 4), 0, "the groups change some choice");
    }
    float *dz = up(z, (size_t)T * E * 4), *dp = up(NULL, (size_t)T * E * 4), *dw = up(NULL, (size_t)R * 4);
    float *dst = up(NULL, 2 * (size_t)E * 4);
    void *dbias = bias_bf16 ? up(bias16, (size_t)E * 2) : up(bias, (size_t)E * 4);
    int32_t *dti = up(NULL, (size_t)R * 4), *drows = up(NULL, (size_t)R * 4), *dsr = up(NULL, (size_t)R * 4);
    int32_t *doffs = up(NULL, ((size_t)E + 1) * 4);
    mt_route grt = rt;
    grt.bias = dbias;
    cr_assert_eq(mt_cu_moe_route(NULL, dp, dw, dti, drows, dsr, doffs, dst, dz, T, E, k, &grt,
                                 bias_bf16 ? MT_CU_BF16 : MT_CU_F32),
                 0);
    down(gp, dp, (size_t)T * E * 4), down(gw, dw, (size_t)R * 4), down(gst, dst, 2 * (size_t)E * 4);
    down(gti, dti, (size_t)R * 4), down(grows, drows, (size_t)R * 4), down(gsr, dsr, (size_t)R * 4);
    down(goffs, doffs, ((size_t)E + 1) * 4);
    for (int i = 0; i < T * E; i++)
        cr_assert(fabsf(gp[i] - p[i]) <= 16 * U24 * p[i], "s[%d] %.9g vs %.9g", i, gp[i], p[i]);
    for (int i = 0; i < R; i++)
        cr_assert_eq(gti[i], ti[i], "T %d E %d k %d groups %d/%d: slot %d's expert %d vs %d", T, E, k, topk_group,
                     n_group, i, gti[i], ti[i]);
    for (int i = 0; i < R; i++) cr_assert(fabsf(gw[i] - w[i]) <= 48 * U24 * w[i], "w[%d] %.9g vs %.9g", i, gw[i], w[i]);
    cr_assert_eq(memcmp(goffs, offs, ((size_t)E + 1) * 4), 0, "offsets");
    cr_assert_eq(memcmp(grows, rows, (size_t)R * 4), 0, "rows in slot order within each expert");
    cr_assert_eq(memcmp(gsr, sr, (size_t)R * 4), 0, "slot_row");
    for (int e = 0; e < E; e++) {
        cr_assert_eq(gst[e], st[e], "count of expert %d", e);
        cr_assert(fabsf(gst[E + e] - st[E + e]) <= 4e-6f * st[E + e] + 1e-7f, "score sum of expert %d", e);
    }
    float *g = malloc((size_t)R * 4), *dl = malloc((size_t)T * E * 4), *gdl = malloc((size_t)T * E * 4);
    for (int i = 0; i < R; i++) g[i] = uni(&s);
    float *dg = up(g, (size_t)R * 4), *ddl = up(NULL, (size_t)T * E * 4);
    for (int aux = 0; aux < 2; aux++) {
        mt_cpu_moe_route_bwd(dl, g, p, w, ti, aux ? st : NULL, 1, 0.3f, T, E, k, &rt);
        cr_assert_eq(mt_cu_moe_route_bwd(NULL, ddl, dg, dp, dw, dti, aux ? dst : NULL, 1, 0.3f, T, E, k, &grt), 0);
        down(gdl, ddl, (size_t)T * E * 4);
        for (int t = 0; t < T; t++) {
            float mx = 0;
            for (int e = 0; e < E; e++) mx = fmaxf(mx, fabsf(dl[t * E + e]));
            for (int e = 0; e < E; e++)
                cr_assert(fabsf(gdl[t * E + e] - dl[t * E + e]) <= 1e-5f * mx + 1e-12f,
                          "aux %d: dz[%d][%d] %.9g vs %.9g", aux, t, e, gdl[t * E + e], dl[t * E + e]);
        }
    }
    free(z), free(p), free(w), free(gp), free(gw), free(ti), free(rows), free(sr), free(gti), free(grows), free(gsr);
    free(ti2), free(g), free(dl), free(gdl);
    mt_device_free(dz), mt_device_free(dp), mt_device_free(dw), mt_device_free(dst), mt_device_free(dbias);
    mt_device_free(dti), mt_device_free(drows), mt_device_free(dsr), mt_device_free(doffs), mt_device_free(dg);
    mt_device_free(ddl);
}

/* DeepSeek-V3's shape (256 experts in 8 groups, the 4 best groups, k = 8) over more tokens than a block's
 * pass, renormalised or not, the bias in fp32 and bf16 */
Test(cuda_kernels, moe_route_sigmoid_deepseek_v3)
{
    sigmoid_route_check(300, 256, 8, 8, 4, 1, 0);
    sigmoid_route_check(300, 256, 8, 8, 4, 1, 1);
    sigmoid_route_check(300, 256, 8, 8, 4, 0, 1);
}

/* Small: 16 experts in 4 groups of 4, k = 3; more groups than a warp's lanes (64 groups of 16 among 1024
 * experts, 40 kept: several groups a lane, two words of kept bits and more); no groups, the bias alone */
Test(cuda_kernels, moe_route_sigmoid_shapes)
{
    sigmoid_route_check(37, 16, 3, 4, 2, 1, 0);
    sigmoid_route_check(37, 16, 3, 4, 2, 0, 1);
    sigmoid_route_check(20, 1024, 8, 64, 40, 1, 1);
    sigmoid_route_check(50, 64, 6, 0, 0, 1, 0);
}

/* DeepSeek-V2's group_limited_greedy on the GPU (softmax scores, groups scored by their best, not
 * renormalised, times 2.5) against the CPU op: 200 tokens, 64 experts in 8 groups, the 3 best, k = 6;
 * a token whose group or expert decisions lie within 1e-5 (relative to its largest probability) is drawn
 * again. The experts exactly, the probabilities within 16u and the weights within 48u (as the softmax's
 * test), the rows and offsets identical; the backward to 1e-5 of each row's largest. */
Test(cuda_kernels, moe_route_softmax_groups_deepseek_v2)
{
    NEED_GPU();
    enum { T = 200, E = 64, NG = 8, TG = 3, K = 6, R = T * K, G = E / NG };
    static float z[T * E], p[T * E], w[R], gp[T * E], gw[R], g[R], dl[T * E], gdl[T * E];
    static int32_t ti[R], rows[R], sr[R], gti[R], grows[R], gsr[R], ti2[R];
    int32_t offs[E + 1], goffs[E + 1];
    unsigned s = 4242;
    const mt_route rt = {.norm = 0, .sigmoid = 0, .n_group = NG, .topk_group = TG, .scale = 2.5f, .bias = NULL};
    for (int t = 0; t < T; t++)
        for (int tries = 0;; tries++) {
            cr_assert_lt(tries, 1000, "token %d: no decisive draw", t);
            for (int e = 0; e < E; e++) z[t * E + e] = 4.0f * uni(&s);
            float pp[E], pw[K], gm[NG], c[E];
            int32_t pi[K], pr[K], ps[K];
            int po[E + 1];
            mt_cpu_moe_route(pp, pw, pi, pr, ps, po, NULL, z + t * E, 1, E, K, &rt);
            float mx = 0, margin = INFINITY;
            for (int e = 0; e < E; e++) mx = fmaxf(mx, pp[e]);
            for (int q = 0; q < NG; q++) {
                gm[q] = 0;
                for (int e = q * G; e < (q + 1) * G; e++) gm[q] = fmaxf(gm[q], pp[e]);
            }
            for (int a = 0; a < NG; a++) /* group scores apart, expert probabilities apart */
                for (int b = 0; b < a; b++) margin = fminf(margin, fabsf(gm[a] - gm[b]));
            for (int e = 0; e < E; e++) c[e] = pp[e];
            for (int a = 0; a < E; a++)
                for (int b = 0; b < a; b++) margin = fminf(margin, fabsf(c[a] - c[b]));
            if (margin > 1e-5f * mx) break;
        }
    mt_cpu_moe_route(p, w, ti, rows, sr, offs, NULL, z, T, E, K, &rt);
    mt_route plain = rt;
    plain.n_group = 0, plain.topk_group = 0;
    mt_cpu_moe_route(gp, gw, ti2, grows, gsr, goffs, NULL, z, T, E, K, &plain);
    cr_assert_neq(memcmp(ti2, ti, sizeof ti), 0, "the groups change some choice (the fixture)");
    float *dz = up(z, sizeof z), *dp = up(NULL, sizeof p), *dw = up(NULL, sizeof w);
    int32_t *dti = up(NULL, sizeof ti), *drows = up(NULL, sizeof rows), *dsr = up(NULL, sizeof sr);
    int32_t *doffs = up(NULL, sizeof offs);
    cr_assert_eq(mt_cu_moe_route(NULL, dp, dw, dti, drows, dsr, doffs, NULL, dz, T, E, K, &rt, MT_CU_F32), 0);
    down(gp, dp, sizeof gp), down(gw, dw, sizeof gw), down(gti, dti, sizeof gti), down(grows, drows, sizeof grows);
    down(gsr, dsr, sizeof gsr), down(goffs, doffs, sizeof goffs);
    for (int i = 0; i < T * E; i++) cr_assert(fabsf(gp[i] - p[i]) <= 16 * U24 * p[i], "p[%d] %.9g vs %.9g", i, gp[i], p[i]);
    for (int i = 0; i < R; i++) cr_assert_eq(gti[i], ti[i], "slot %d's expert %d vs %d", i, gti[i], ti[i]);
    for (int i = 0; i < R; i++) cr_assert(fabsf(gw[i] - w[i]) <= 48 * U24 * w[i], "w[%d] %.9g vs %.9g", i, gw[i], w[i]);
    cr_assert_eq(memcmp(goffs, offs, sizeof offs), 0, "offsets");
    cr_assert_eq(memcmp(grows, rows, sizeof rows), 0, "rows");
    cr_assert_eq(memcmp(gsr, sr, sizeof sr), 0, "slot_row");
    for (int i = 0; i < R; i++) g[i] = uni(&s);
    float *dg = up(g, sizeof g), *ddl = up(NULL, sizeof dl);
    mt_cpu_moe_route_bwd(dl, g, p, w, ti, NULL, 1, 0.0f, T, E, K, &rt);
    cr_assert_eq(mt_cu_moe_route_bwd(NULL, ddl, dg, dp, dw, dti, NULL, 1, 0.0f, T, E, K, &rt), 0);
    down(gdl, ddl, sizeof gdl);
    for (int t = 0; t < T; t++) {
        float mx = 0;
        for (int e = 0; e < E; e++) mx = fmaxf(mx, fabsf(dl[t * E + e]));
        for (int e = 0; e < E; e++)
            cr_assert(fabsf(gdl[t * E + e] - dl[t * E + e]) <= 1e-5f * mx + 1e-12f, "dz[%d][%d] %.9g vs %.9g", t, e,
                      gdl[t * E + e], dl[t * E + e]);
    }
    mt_device_free(dz), mt_device_free(dp), mt_device_free(dw), mt_device_free(dti), mt_device_free(drows);
    mt_device_free(dsr), mt_device_free(doffs), mt_device_free(dg), mt_device_free(ddl);
}

/* tests/test_moe.c's tokens made by hand (moe_ops/route_sigmoid_masks_and_ties): experts outside the
 * kept groups at -inf behind negative choice scores; ties of groups and of experts to the lower index */
Test(cuda_kernels, moe_route_sigmoid_masks_and_ties)
{
    NEED_GPU();
    enum { E = 8 };
    const double s1[E] = {0.95, 0.05, 0.92, 0.3, 0.5, 0.45, 0.2, 0.1};
    float z[2 * E], bias[E];
    for (int e = 0; e < E; e++) z[e] = (float)log(s1[e] / (1.0 - s1[e])), bias[e] = -0.9f;
    const float z2[E] = {1.0f, 1.0f, -1.0f, -2.0f, 1.0f, 1.0f, 0.5f, -0.5f};
    memcpy(z + E, z2, sizeof z2);
    float *dz = up(z, sizeof z), *dbias = up(bias, sizeof bias), *dp = up(NULL, E * 4), *dw = up(NULL, 3 * 4);
    int32_t *dti = up(NULL, 3 * 4), *drows = up(NULL, 3 * 4), *dsr = up(NULL, 3 * 4), *doffs = up(NULL, (E + 1) * 4);
    int32_t gti[3];
    mt_route rt = {.norm = 1, .sigmoid = 1, .n_group = 4, .topk_group = 2, .scale = 1, .bias = dbias};
    cr_assert_eq(mt_cu_moe_route(NULL, dp, dw, dti, drows, dsr, doffs, NULL, dz, 1, E, 3, &rt, MT_CU_F32), 0);
    down(gti, dti, 3 * 4);
    cr_assert(gti[0] == 0 && gti[1] == 2 && gti[2] == 3, "chosen %d %d %d, want 0 2 3", gti[0], gti[1], gti[2]);
    rt.topk_group = 1, rt.bias = NULL;
    cr_assert_eq(mt_cu_moe_route(NULL, dp, dw, dti, drows, dsr, doffs, NULL, dz + E, 1, E, 2, &rt, MT_CU_F32), 0);
    down(gti, dti, 2 * 4);
    cr_assert(gti[0] == 0 && gti[1] == 1, "chosen %d %d, want 0 1", gti[0], gti[1]);
    mt_device_free(dz), mt_device_free(dbias), mt_device_free(dp), mt_device_free(dw), mt_device_free(dti);
    mt_device_free(drows), mt_device_free(dsr), mt_device_free(doffs);
}

/* gather, combine and dot_scale in both activation types against the CPU ops on the same values; C 200
 * takes the 16-byte paths of gather and combine, C 203 the element-wise ones */
static void rows_check(int dt_bf16, int C)
{
    NEED_GPU();
    enum { T = 29, E = 6, K = 3, R = T * K };
    const mt_cu_dtype dt = dt_bf16 ? MT_CU_BF16 : MT_CU_F32;
    const size_t es = dt_bf16 ? 2 : 4;
    unsigned s = 5;
    float z[T * E], p[T * E], w[R], st[2 * E];
    int32_t ti[R], rows[R], sr[R];
    int32_t offs[E + 1];
    spread_logits(z, T, E, &s);
    mt_cpu_moe_route(p, w, ti, rows, sr, offs, st, z, T, E, K, &(mt_route){.norm = 1, .scale = 1});
    float *x = malloc((size_t)T * C * 4), *xs = malloc((size_t)R * C * 4), *out = malloc((size_t)T * C * 4);
    float *got = malloc((size_t)R * C * 4);
    for (int i = 0; i < T * C; i++) x[i] = mt_bf16_to_f32(mt_f32_to_bf16(uni(&s)));
    /* device copies in dt */
    void *hbuf = malloc((size_t)R * C * 4);
#define TO_DT(src, n)                                                                                                  \
    do {                                                                                                               \
        for (size_t i_ = 0; i_ < (size_t)(n); i_++) {                                                                 \
            if (dt_bf16) ((uint16_t *)hbuf)[i_] = mt_f32_to_bf16((src)[i_]);                                          \
            else ((float *)hbuf)[i_] = (src)[i_];                                                                      \
        }                                                                                                              \
    } while (0)
#define FROM_DT(dst, n)                                                                                                \
    do {                                                                                                               \
        for (size_t i_ = 0; i_ < (size_t)(n); i_++)                                                                   \
            (dst)[i_] = dt_bf16 ? mt_bf16_to_f32(((uint16_t *)hbuf)[i_]) : ((float *)hbuf)[i_];                       \
    } while (0)
    TO_DT(x, T * C);
    void *dx = up(hbuf, (size_t)T * C * es), *dxs = up(NULL, (size_t)R * C * es);
    int32_t *drows = up(rows, sizeof rows), *dsr = up(sr, sizeof sr);
    float *dw = up(w, sizeof w);
    mt_cpu_moe_gather(xs, x, rows, R, K, C);
    cr_assert_eq(mt_cu_moe_gather(NULL, dt, dxs, dx, drows, R, K, C), 0);
    down(hbuf, dxs, (size_t)R * C * es);
    FROM_DT(got, R * C);
    cr_assert_eq(memcmp(got, xs, (size_t)R * C * 4), 0, "%s gather copies rows", dt_bf16 ? "bf16" : "fp32");
    /* combine into out = 1 (act), and into an fp32 buffer from fp32 rows without weights */
    for (int i = 0; i < T * C; i++) out[i] = 1.0f;
    TO_DT(out, T * C);
    void *dout = up(hbuf, (size_t)T * C * es);
    mt_cpu_moe_combine(out, xs, w, sr, T, K, C);
    cr_assert_eq(mt_cu_moe_combine(NULL, dt, dout, dt, dxs, dw, dsr, T, K, C), 0);
    down(hbuf, dout, (size_t)T * C * es);
    FROM_DT(got, T * C);
    for (int i = 0; i < T * C; i++) {
        const float want = dt_bf16 ? mt_bf16_to_f32(mt_f32_to_bf16(out[i])) : out[i];
        cr_assert(fabsf(got[i] - want) <= (dt_bf16 ? 3.90625e-03f * fabsf(want) : 0.0f), "combine[%d] %.9g vs %.9g", i,
                  got[i], want);
    }
    float *of = calloc((size_t)T * C, 4), *gof = malloc((size_t)T * C * 4);
    float *df = up(of, (size_t)T * C * 4), *dxf = up(xs, (size_t)R * C * 4);
    mt_cpu_moe_combine(of, xs, NULL, sr, T, K, C);
    cr_assert_eq(mt_cu_moe_combine(NULL, MT_CU_F32, df, MT_CU_F32, dxf, NULL, dsr, T, K, C), 0);
    down(gof, df, (size_t)T * C * 4);
    cr_assert_eq(memcmp(gof, of, (size_t)T * C * 4), 0, "fp32 combine: the CPU's sums in the CPU's order");
    /* dot_scale on (R, C) rows: x the gathered rows, y their reverse */
    float *y = malloc((size_t)R * C * 4), *d = malloc((size_t)R * 4), *gd = malloc((size_t)R * 4);
    for (int i = 0; i < R * C; i++) y[i] = xs[R * C - 1 - i];
    TO_DT(y, R * C);
    void *dy = up(hbuf, (size_t)R * C * es);
    float *dd = up(NULL, (size_t)R * 4);
    float *x2 = malloc((size_t)R * C * 4);
    memcpy(x2, xs, (size_t)R * C * 4);
    mt_cpu_moe_dot_scale(d, x2, y, w, rows, R, C);
    cr_assert_eq(mt_cu_moe_dot_scale(NULL, dt, dd, dxs, dy, dw, drows, R, C), 0);
    down(gd, dd, (size_t)R * 4);
    for (int i = 0; i < R; i++) cr_assert(fabsf(gd[i] - d[i]) <= 2 * U24 * fabsf(d[i]) + 1e-7f, "dw[%d]", i);
    down(hbuf, dy, (size_t)R * C * es);
    FROM_DT(got, R * C);
    for (int i = 0; i < R * C; i++) {
        const float want = dt_bf16 ? mt_bf16_to_f32(mt_f32_to_bf16(y[i])) : y[i];
        cr_assert(fabsf(got[i] - want) <= (dt_bf16 ? 3.90625e-03f * fabsf(want) : 0.0f), "scaled y[%d]", i);
    }
#undef TO_DT
#undef FROM_DT
    free(x), free(xs), free(out), free(got), free(hbuf), free(of), free(gof), free(y), free(d), free(gd), free(x2);
    mt_device_free(dx), mt_device_free(dxs), mt_device_free(drows), mt_device_free(dsr), mt_device_free(dw);
    mt_device_free(dout), mt_device_free(df), mt_device_free(dxf), mt_device_free(dy), mt_device_free(dd);
}

Test(cuda_kernels, moe_rows_fp32) { rows_check(0, 200), rows_check(0, 203); }
Test(cuda_kernels, moe_rows_bf16) { rows_check(1, 200), rows_check(1, 203); }

/* dot_scale at the widths of each of its paths (bf16: one, two, four and eight groups of eight a thread,
 * and past them; fp32: up to four, and past them; widths not a multiple of 8), with and without the dot
 * and y: each against the element-wise kernel on the same rows (reached through rows that are not 16-byte
 * aligned), whose scaled rows it must match bit for bit and whose dot within one float ulp (the same
 * exact double products summed in another order), and the dot against the CPU op within 2^-23. */
static void dot_scale_paths(int dt_bf16, int n, int with_y, int with_dw)
{
    enum { R = 5 };
    const mt_cu_dtype dt = dt_bf16 ? MT_CU_BF16 : MT_CU_F32;
    const size_t es = dt_bf16 ? 2 : 4, rowb = (size_t)R * n * es;
    unsigned s = 11u + (unsigned)n;
    const int32_t rows[R] = {3, 0, 4, 1, 2};
    float w[R], *x = malloc((size_t)R * n * 4), *y = malloc((size_t)R * n * 4), d[R];
    for (int i = 0; i < R; i++) w[i] = uni(&s) * 2.0f;
    for (int i = 0; i < R * n; i++) {
        x[i] = mt_bf16_to_f32(mt_f32_to_bf16(uni(&s)));
        y[i] = mt_bf16_to_f32(mt_f32_to_bf16(uni(&s)));
    }
    unsigned char *hx = malloc(rowb), *hy = malloc(rowb), *got[2][2];
    for (int i = 0; i < R * n; i++) {
        if (dt_bf16) ((uint16_t *)hx)[i] = mt_f32_to_bf16(x[i]), ((uint16_t *)hy)[i] = mt_f32_to_bf16(y[i]);
        else ((float *)hx)[i] = x[i], ((float *)hy)[i] = y[i];
    }
    float gd[2][R];
    int32_t *drows = up(rows, sizeof rows);
    float *dw = up(w, sizeof w);
    for (int path = 0; path < 2; path++) { /* 0: aligned rows, 1: rows one element past a 16-byte boundary */
        unsigned char *bx = up(NULL, rowb + 16), *by = up(NULL, rowb + 16);
        const size_t off = path ? es : 0;
        cr_assert(mt_device_copy_h2d(bx + off, hx, rowb, why, sizeof why) == 0, "%s", why);
        cr_assert(mt_device_copy_h2d(by + off, hy, rowb, why, sizeof why) == 0, "%s", why);
        float *dd = up(NULL, sizeof(float) * R);
        cr_assert(mt_device_memset(dd, 0, sizeof(float) * R, why, sizeof why) == 0, "%s", why);
        cr_assert_eq(mt_cu_moe_dot_scale(NULL, dt, with_dw ? dd : NULL, bx + off, with_y ? by + off : NULL, dw,
                                         drows, R, n),
                     0);
        got[path][0] = malloc(rowb), got[path][1] = malloc(rowb);
        down(got[path][0], bx + off, rowb), down(got[path][1], by + off, rowb), down(gd[path], dd, sizeof gd[path]);
        mt_device_free(bx), mt_device_free(by), mt_device_free(dd);
    }
    const char *tag = dt_bf16 ? "bf16" : "fp32";
    cr_assert_eq(memcmp(got[0][0], got[1][0], rowb), 0, "%s n %d: scaled x as the element-wise kernel's", tag, n);
    cr_assert_eq(memcmp(got[0][1], got[1][1], rowb), 0, "%s n %d: y as the element-wise kernel's", tag, n);
    if (!with_y) cr_assert_eq(memcmp(got[0][1], hy, rowb), 0, "%s n %d: y untouched without it", tag, n);
    mt_cpu_moe_dot_scale(with_dw ? d : NULL, x, with_y ? y : NULL, w, rows, R, n);
    for (int r = 0; r < R && with_dw && with_y; r++) {
        const float a = gd[0][rows[r]], b = gd[1][rows[r]];
        cr_assert(fabsf(a - b) <= 2 * U24 * fabsf(b), "%s n %d: dw[%d] %.9g against %.9g", tag, n, r, a, b);
        cr_assert(fabsf(a - d[rows[r]]) <= 2 * U24 * fabsf(d[rows[r]]), "%s n %d: dw[%d] against the CPU", tag, n, r);
    }
    for (int i = 0; i < R * n; i++) { /* the CPU's fp32 products, rounded to bf16 where the rows are */
        const float gx = dt_bf16 ? mt_bf16_to_f32(((uint16_t *)got[0][0])[i]) : ((float *)got[0][0])[i];
        const float wx = dt_bf16 ? mt_bf16_to_f32(mt_f32_to_bf16(x[i])) : x[i];
        cr_assert(gx == wx, "%s n %d: x[%d] %.9g, the CPU %.9g", tag, n, i, gx, wx);
    }
    for (int p = 0; p < 2; p++) free(got[p][0]), free(got[p][1]);
    free(x), free(y), free(hx), free(hy);
    mt_device_free(drows), mt_device_free(dw);
}

Test(cuda_kernels, moe_dot_scale_paths)
{
    NEED_GPU();
    const int bf16_n[] = {200, 2056, 4104, 14336, 16392, 203}, f32_n[] = {200, 2056, 8192, 8200, 203};
    for (size_t i = 0; i < sizeof bf16_n / sizeof *bf16_n; i++) {
        dot_scale_paths(1, bf16_n[i], 1, 1);
        dot_scale_paths(1, bf16_n[i], 0, 0);
    }
    for (size_t i = 0; i < sizeof f32_n / sizeof *f32_n; i++) {
        dot_scale_paths(0, f32_n[i], 1, 1);
        dot_scale_paths(0, f32_n[i], 1, 0);
    }
}

/* The load-balancing loss: E * sum_e c_e p_e over L rows, added to the device's loss sum */
Test(cuda_kernels, moe_aux_loss)
{
    NEED_GPU();
    enum { L = 5, E = 300 };
    static float st[L * 2 * E];
    unsigned s = 3;
    for (int i = 0; i < L * 2 * E; i++) st[i] = (float)(lcg(&s) % 50);
    const double want = 1.0 + 0.25 * mt_cpu_moe_aux_sum(st, L, E);
    double one = 1.0, got = 0;
    float *dst = up(st, sizeof st);
    double *dl = up(&one, sizeof one);
    cr_assert_eq(mt_cu_moe_aux_loss(NULL, dl, dst, L, E, 0.25), 0);
    down(&got, dl, sizeof got);
    cr_assert(fabs(got - want) <= 1e-12 * want, "%.17g vs %.17g", got, want); /* integer-valued sums: exact */
    mt_device_free(dst), mt_device_free(dl);
}

/* The shared expert's gate against the CPU's, fp32 (the gate's sigmoid within a few ulp: expf differs
 * between the libraries) and bf16 (one rounding of the result) */
static void shared_gate_check(int bf)
{
    NEED_GPU();
    enum { T = 37, C = 300 };
    const mt_cu_dtype dt = bf ? MT_CU_BF16 : MT_CU_F32;
    const size_t es = bf ? 2 : 4, n = (size_t)T * C;
    unsigned s = 11;
    float *out = malloc(n * 4), *src = malloc(n * 4), *x = malloc(n * 4), *y = malloc(n * 4), *z = malloc(T * 4);
    float *got = malloc(n * 4), dz[T], gdz[T];
    void *h = malloc(n * 4);
    for (size_t i = 0; i < n; i++) out[i] = uni(&s), src[i] = uni(&s), x[i] = uni(&s), y[i] = uni(&s);
    for (int t = 0; t < T; t++) z[t] = 6.0f * uni(&s);
    /* in bf16 both sides start from the bf16 values */
    float *arrs[4] = {out, src, x, y};
    for (int a = 0; bf && a < 4; a++)
        for (size_t i = 0; i < n; i++) arrs[a][i] = mt_bf16_to_f32(mt_f32_to_bf16(arrs[a][i]));
    void *dev[4];
    for (int a = 0; a < 4; a++) {
        if (bf)
            for (size_t i = 0; i < n; i++) ((uint16_t *)h)[i] = mt_f32_to_bf16(arrs[a][i]);
        dev[a] = up(bf ? h : (void *)arrs[a], n * es);
    }
    float *dzv = up(z, T * 4), *ddz = up(NULL, T * 4);
    mt_cpu_moe_shared_gate(out, src, z, T, C);
    cr_assert_eq(mt_cu_moe_shared_gate(NULL, dt, dev[0], dev[1], dzv, T, C), 0);
    mt_cpu_moe_shared_gate_bwd(dz, x, y, z, T, C);
    cr_assert_eq(mt_cu_moe_shared_gate_bwd(NULL, dt, ddz, dev[2], dev[3], dzv, T, C), 0);
    down(gdz, ddz, T * 4);
    for (int t = 0; t < T; t++)
        cr_assert(fabsf(gdz[t] - dz[t]) <= 8 * U24 * fabsf(dz[t]) + 1e-7f, "dz[%d] %.9g vs %.9g", t, gdz[t], dz[t]);
    const float *want[3] = {out, x, y};
    const int which[3] = {0, 2, 3};
    for (int a = 0; a < 3; a++) {
        down(bf ? h : got, dev[which[a]], n * es);
        for (size_t i = 0; bf && i < n; i++) got[i] = mt_bf16_to_f32(((uint16_t *)h)[i]);
        for (size_t i = 0; i < n; i++) {
            const float w = bf ? mt_bf16_to_f32(mt_f32_to_bf16(want[a][i])) : want[a][i];
            cr_assert(fabsf(got[i] - w) <= (bf ? 3.90625e-03f : 8 * U24) * fabsf(w) + 1e-7f, "array %d [%zu] %.9g vs %.9g",
                      a, i, got[i], w);
        }
    }
    for (int a = 0; a < 4; a++) mt_device_free(dev[a]);
    mt_device_free(dzv), mt_device_free(ddz);
    free(out), free(src), free(x), free(y), free(z), free(got), free(h);
}

Test(cuda_kernels, moe_shared_gate_fp32) { shared_gate_check(0); }
Test(cuda_kernels, moe_shared_gate_bf16) { shared_gate_check(1); }

/* ---- the experts' GEMMs of a few outputs a row (GPT-OSS's biases) and the routing's check ---- */

/* SR rows among SE experts: experts 0, 3 and 6 without rows (the first, one between, the last), expert 4
 * of one row, the last 4 rows of no expert (not written) */
enum { SE = 7, SR = 53, SK = 300 };
static const int32_t s_offs[SE + 1] = {0, 0, 17, 30, 30, 31, 49, 49};

static int s_expert_of(int r)
{
    for (int e = 0; e < SE; e++)
        if (r >= s_offs[e] && r < s_offs[e + 1]) return e;
    return -1;
}

/* Higham's bound on a float sum of n terms (+ a bias and an accumulated value): gamma_{n+2} */
static double s_gamma(int n) { return (n + 2) * U24 / (1 - (n + 2) * U24); }

/* n floats as dt on the device (bf16: the values must be bf16 already, as the CPU's reference reads them) */
static void *up_dt(const float *v, size_t n, int bf)
{
    if (!bf) return up(v, n * 4);
    uint16_t *h = malloc(n * 2);
    for (size_t i = 0; i < n; i++) h[i] = mt_f32_to_bf16(v[i]);
    void *d = up(h, n * 2);
    free(h);
    return d;
}

static void down_dt(float *v, const void *d, size_t n, int bf)
{
    if (!bf) {
        down(v, d, n * 4);
        return;
    }
    uint16_t *h = malloc(n * 2);
    down(h, d, n * 2);
    for (size_t i = 0; i < n; i++) v[i] = mt_bf16_to_f32(h[i]);
    free(h);
}

static float *rand_vals(size_t n, unsigned *s, int bf)
{
    float *v = malloc(n * 4);
    for (size_t i = 0; i < n; i++) v[i] = bf ? mt_bf16_to_f32(mt_f32_to_bf16(uni(s))) : uni(s);
    return v;
}

/* mt_cu_moe_linear_small against mt_cpu_moe_linear on the same values (bf16: values that are bf16
 * already). Both are fp32 sums of K products, a bias and the accumulated value, each within Higham's
 * gamma_{K+2} * sum |terms| of the exact value, in different orders: so within twice that of each other;
 * a bf16 output is compared with the CPU's value rounded to bf16, which the two roundings can put one
 * bf16 ulp apart (2^-7 of the value at most) beyond that. Rows of no expert keep their values. */
static void linear_small_check(int bf, int y_f32, int N, int with_bias, int accumulate)
{
    NEED_GPU();
    const int ybf = bf && !y_f32;
    unsigned s = 900u + (unsigned)(N * 16 + bf * 8 + y_f32 * 4 + with_bias * 2 + accumulate);
    float *x = rand_vals((size_t)SR * SK, &s, bf), *W = rand_vals((size_t)SE * N * SK, &s, bf);
    float *b = rand_vals((size_t)SE * N, &s, bf), *y0 = rand_vals((size_t)SR * N, &s, ybf);
    float *ref = malloc((size_t)SR * N * 4), *got = malloc((size_t)SR * N * 4);
    memcpy(ref, y0, (size_t)SR * N * 4);
    void *ws = malloc(mt_cpu_ws_size(1, 0));
    mt_cpu_moe_linear(NULL, ws, ref, x, W, with_bias ? b : NULL, s_offs, SE, SR, SK, N, accumulate);
    void *dx = up_dt(x, (size_t)SR * SK, bf), *dW = up_dt(W, (size_t)SE * N * SK, bf);
    void *db = up_dt(b, (size_t)SE * N, bf);
    void *dy = up_dt(y0, (size_t)SR * N, ybf);
    int32_t *doffs = up(s_offs, sizeof s_offs);
    const mt_cu_dtype dt = bf ? MT_CU_BF16 : MT_CU_F32, ydt = ybf ? MT_CU_BF16 : MT_CU_F32;
    cr_assert_eq(mt_cu_moe_linear_small(NULL, dt, ydt, dy, dx, dW, with_bias ? db : NULL, doffs, SE, SR, SK, N,
                                        accumulate), 0);
    down_dt(got, dy, (size_t)SR * N, ybf);
    for (int r = 0; r < SR; r++) {
        const int e = s_expert_of(r);
        for (int n = 0; n < N; n++) {
            const size_t i = (size_t)r * N + n;
            if (e < 0) {
                cr_assert_eq(got[i], y0[i], "row %d of no expert written", r);
                continue;
            }
            double mag = (accumulate ? fabs(y0[i]) : 0.0) + (with_bias ? fabs(b[e * N + n]) : 0.0);
            for (int k = 0; k < SK; k++) mag += fabs((double)x[(size_t)r * SK + k] * W[((size_t)e * N + n) * SK + k]);
            const double want = ybf ? mt_bf16_to_f32(mt_f32_to_bf16(ref[i])) : ref[i];
            const double tol = 2 * s_gamma(SK) * mag + (ybf ? 7.8125e-03 * fabs(want) : 0.0);
            cr_assert(fabs(got[i] - want) <= tol, "bf16 %d y_f32 %d N %d bias %d acc %d: y[%d, %d] %.9g vs %.9g", bf,
                      y_f32, N, with_bias, accumulate, r, n, got[i], want);
        }
    }
    free(x), free(W), free(b), free(y0), free(ref), free(got), free(ws);
    mt_device_free(dx), mt_device_free(dW), mt_device_free(db), mt_device_free(dy), mt_device_free(doffs);
}

/* N = 1 into fp32 (GPT-OSS's rbd), a few outputs, N = 8 (the largest), bias and accumulate */
Test(cuda_kernels, moe_linear_small_fp32)
{
    linear_small_check(0, 1, 1, 0, 0);
    linear_small_check(0, 0, 3, 1, 0);
    linear_small_check(0, 0, 8, 1, 1);
    linear_small_check(0, 1, 5, 0, 1);
}

Test(cuda_kernels, moe_linear_small_bf16)
{
    linear_small_check(1, 1, 1, 0, 0);
    linear_small_check(1, 0, 1, 1, 0);
    linear_small_check(1, 0, 8, 1, 1);
    linear_small_check(1, 1, 4, 1, 1);
}

/* mt_cu_moe_linear_dw_small against mt_cpu_moe_linear_dw on the same values, into gradients that hold
 * values already: each an fp32 sum of an expert's rows (at most 18) and the value before, within
 * gamma_{rows+2} * sum |terms| of the exact value, so within twice that of each other; the experts
 * without rows untouched, bit for bit. */
static void linear_dw_small_check(int bf, int N, int with_db)
{
    NEED_GPU();
    unsigned s = 1300u + (unsigned)(N * 4 + bf * 2 + with_db);
    float *dy = rand_vals((size_t)SR * N, &s, bf), *x = rand_vals((size_t)SR * SK, &s, bf);
    float *g0 = rand_vals((size_t)SE * N * SK, &s, 0), *b0 = rand_vals((size_t)SE * N, &s, 0);
    float *g = malloc((size_t)SE * N * SK * 4), *b = malloc((size_t)SE * N * 4);
    float *gref = malloc((size_t)SE * N * SK * 4), *bref = malloc((size_t)SE * N * 4);
    memcpy(gref, g0, (size_t)SE * N * SK * 4), memcpy(bref, b0, (size_t)SE * N * 4);
    void *ws = malloc(mt_cpu_ws_size(1, 0));
    mt_cpu_moe_linear_dw(NULL, ws, gref, with_db ? bref : NULL, dy, x, s_offs, SE, SR, SK, N);
    void *ddy = up_dt(dy, (size_t)SR * N, bf), *dx = up_dt(x, (size_t)SR * SK, bf);
    float *dg = up(g0, (size_t)SE * N * SK * 4), *dbias = up(b0, (size_t)SE * N * 4);
    int32_t *doffs = up(s_offs, sizeof s_offs);
    cr_assert_eq(mt_cu_moe_linear_dw_small(NULL, bf ? MT_CU_BF16 : MT_CU_F32, dg, with_db ? dbias : NULL, ddy, dx,
                                           doffs, SE, SR, SK, N), 0);
    down(g, dg, (size_t)SE * N * SK * 4), down(b, dbias, (size_t)SE * N * 4);
    for (int e = 0; e < SE; e++) {
        const int r0 = s_offs[e], r1 = s_offs[e + 1];
        for (int n = 0; n < N; n++) {
            const size_t j = (size_t)e * N + n;
            if (r0 == r1 || !with_db) {
                cr_assert_eq(b[j], b0[j], "db[%d, %d] untouched", e, n);
            } else {
                double mag = fabs(b0[j]);
                for (int r = r0; r < r1; r++) mag += fabs(dy[(size_t)r * N + n]);
                cr_assert(fabs(b[j] - bref[j]) <= 2 * s_gamma(r1 - r0) * mag, "db[%d, %d] %.9g vs %.9g", e, n, b[j],
                          bref[j]);
            }
            for (int k = 0; k < SK; k++) {
                const size_t i = j * SK + k;
                if (r0 == r1) {
                    cr_assert_eq(g[i], g0[i], "expert %d without rows: dW untouched", e);
                    continue;
                }
                double mag = fabs(g0[i]);
                for (int r = r0; r < r1; r++) mag += fabs((double)dy[(size_t)r * N + n] * x[(size_t)r * SK + k]);
                cr_assert(fabs(g[i] - gref[i]) <= 2 * s_gamma(r1 - r0) * mag,
                          "bf16 %d N %d: dW[%d][%d, %d] %.9g vs %.9g", bf, N, e, n, k, g[i], gref[i]);
            }
        }
    }
    free(dy), free(x), free(g0), free(b0), free(g), free(b), free(gref), free(bref), free(ws);
    mt_device_free(ddy), mt_device_free(dx), mt_device_free(dg), mt_device_free(dbias), mt_device_free(doffs);
}

Test(cuda_kernels, moe_linear_dw_small)
{
    linear_dw_small_check(0, 1, 0); /* GPT-OSS's down-projection biases: one output, no db */
    linear_dw_small_check(0, 6, 1);
    linear_dw_small_check(1, 1, 0);
    linear_dw_small_check(1, 8, 1);
}

/* Offsets out of range (what a routing that failed its check could leave before the step's end reports
 * it): the kernels clamp every expert's rows to [0, R], so nothing past R rows is written and nothing
 * faults (the copy back would report it) */
Test(cuda_kernels, moe_linear_small_clamps_rows)
{
    NEED_GPU();
    enum { E = 3, R = 40, G = 8, K = 70, N = 2 };
    const int32_t bad[E + 1] = {-4, 20, 10, 90};
    unsigned s = 17;
    float *x = rand_vals((size_t)R * K, &s, 0), *W = rand_vals((size_t)E * N * K, &s, 0);
    float *y0 = rand_vals((size_t)(R + G) * N, &s, 0), *y = malloc((size_t)(R + G) * N * 4);
    float *g0 = rand_vals((size_t)E * N * K, &s, 0), *g = malloc((size_t)E * N * K * 4);
    float *dx = up(x, (size_t)R * K * 4), *dW = up(W, (size_t)E * N * K * 4), *dy = up(y0, (size_t)(R + G) * N * 4);
    float *dg = up(g0, (size_t)E * N * K * 4);
    int32_t *doffs = up(bad, sizeof bad);
    cr_assert_eq(mt_cu_moe_linear_small(NULL, MT_CU_F32, MT_CU_F32, dy, dx, dW, NULL, doffs, E, R, K, N, 1), 0);
    cr_assert_eq(mt_cu_moe_linear_dw_small(NULL, MT_CU_F32, dg, NULL, dy, dx, doffs, E, R, K, N), 0);
    down(y, dy, (size_t)(R + G) * N * 4), down(g, dg, (size_t)E * N * K * 4);
    cr_assert_eq(memcmp(y + (size_t)R * N, y0 + (size_t)R * N, (size_t)G * N * 4), 0, "rows past R written");
    for (size_t i = 0; i < (size_t)E * N * K; i++) cr_assert(isfinite(g[i]), "dW[%zu] %g", i, g[i]);
    free(x), free(W), free(y0), free(y), free(g0), free(g);
    mt_device_free(dx), mt_device_free(dW), mt_device_free(dy), mt_device_free(dg), mt_device_free(doffs);
}

/* The contract of mt_cu_moe_check_offs, on the host: the flag after a check of offs (flag as before) */
static void check_offs_ref(int32_t *flag, const int32_t *offs, int E, int expect)
{
    if (flag[0]) return;
    int mono = offs[0] == 0;
    for (int e = 0; e < E && mono; e++) mono = offs[e + 1] >= offs[e];
    if (mono && offs[E] == expect) return;
    flag[0] = 1, flag[1] = mono ? offs[E] : -1, flag[2] = expect;
}

/* The routing's check on the device against its definition on the host: a routing on the GPU with a
 * non-finite logit (the token's probabilities are all NaN, so it takes no expert: R - k rows placed)
 * is recorded, a good one is not, the first bad one stays through later checks, and hand-made offsets
 * that decrease or start past 0 are recorded with -1 rows placed */
Test(cuda_kernels, moe_check_offs)
{
    NEED_GPU();
    enum { T = 37, E = 8, K = 2, R = T * K, NI = MT_CU_MOE_CHECK_INTS };
    unsigned s = 23;
    float z[T * E];
    spread_logits(z, T, E, &s);
    float *dz = up(z, sizeof z), *dp = up(NULL, sizeof z), *dw = up(NULL, R * 4);
    int32_t *dti = up(NULL, R * 4), *drows = up(NULL, R * 4), *dsr = up(NULL, R * 4), *doffs = up(NULL, (E + 1) * 4);
    const int32_t zero[NI] = {0};
    int32_t *dflag = up(zero, sizeof zero), flag[NI], want[NI] = {0}, offs[E + 1];
    const mt_route rt = {.norm = 1, .scale = 1};
    /* a good routing: nothing recorded */
    cr_assert_eq(mt_cu_moe_route(NULL, dp, dw, dti, drows, dsr, doffs, NULL, dz, T, E, K, &rt, MT_CU_F32), 0);
    cr_assert_eq(mt_cu_moe_check_offs(NULL, doffs, E, R, dflag), 0);
    down(flag, dflag, sizeof flag), down(offs, doffs, sizeof offs);
    check_offs_ref(want, offs, E, R);
    cr_assert_eq(memcmp(flag, want, sizeof flag), 0, "a good routing: flag %d %d %d", flag[0], flag[1], flag[2]);
    cr_assert_eq(flag[0], 0);
    /* token 5 with a NaN logit: all R - k other rows placed */
    z[5 * E + 3] = NAN;
    float *dz2 = up(z, sizeof z);
    cr_assert_eq(mt_cu_moe_route(NULL, dp, dw, dti, drows, dsr, doffs, NULL, dz2, T, E, K, &rt, MT_CU_F32), 0);
    cr_assert_eq(mt_cu_moe_check_offs(NULL, doffs, E, R, dflag), 0);
    down(flag, dflag, sizeof flag), down(offs, doffs, sizeof offs);
    check_offs_ref(want, offs, E, R);
    cr_assert_eq(memcmp(flag, want, sizeof flag), 0, "NaN logit: flag %d %d %d", flag[0], flag[1], flag[2]);
    cr_assert(flag[0] == 1 && flag[1] == R - K && flag[2] == R, "NaN logit: flag %d %d %d", flag[0], flag[1], flag[2]);
    /* later checks, bad or good, keep the first */
    const int32_t decreasing[E + 1] = {0, 5, 3, 9, 9, 20, 30, 40, R};
    int32_t *dbad = up(decreasing, sizeof decreasing);
    cr_assert_eq(mt_cu_moe_check_offs(NULL, dbad, E, R, dflag), 0);
    cr_assert_eq(mt_cu_moe_check_offs(NULL, doffs, E, R - K, dflag), 0); /* good for that count */
    down(flag, dflag, sizeof flag);
    check_offs_ref(want, decreasing, E, R);
    cr_assert_eq(memcmp(flag, want, sizeof flag), 0, "the first stays: flag %d %d %d", flag[0], flag[1], flag[2]);
    /* zeroed again (as the backend's sync does): offsets that decrease, then ones that start past 0 */
    const int32_t late[E + 1] = {2, 5, 6, 9, 9, 20, 30, 40, R};
    int32_t *dlate = up(late, sizeof late);
    for (int c = 0; c < 2; c++) {
        int32_t *dflag2 = up(zero, sizeof zero), w2[NI] = {0};
        cr_assert_eq(mt_cu_moe_check_offs(NULL, c ? dlate : dbad, E, R, dflag2), 0);
        down(flag, dflag2, sizeof flag);
        check_offs_ref(w2, c ? late : decreasing, E, R);
        cr_assert_eq(memcmp(flag, w2, sizeof flag), 0, "case %d: flag %d %d %d", c, flag[0], flag[1], flag[2]);
        cr_assert(flag[0] == 1 && flag[1] == -1 && flag[2] == R, "case %d", c);
        mt_device_free(dflag2);
    }
    mt_device_free(dz), mt_device_free(dz2), mt_device_free(dp), mt_device_free(dw), mt_device_free(dti);
    mt_device_free(drows), mt_device_free(dsr), mt_device_free(doffs), mt_device_free(dflag), mt_device_free(dbad);
    mt_device_free(dlate);
}

/* ---- the backend -------------------------------------------------------------------------- */

enum { V = 97 };

/* A Qwen3-MoE (q/k norms, layer 1 dense) or Mixtral (every layer sparse, a window of 24) of head
 * dimension 64 (the CUDA attention's), with the load-balancing loss on. */
static mt_model_config moe_cfg(mt_arch arch, int precision)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.arch = arch;
    c.vocab_size = V;
    c.hidden_size = 128;
    c.intermediate_size = 160;
    c.num_hidden_layers = 3;
    c.num_attention_heads = 2;
    c.num_key_value_heads = 1;
    c.head_dim = 64;
    c.max_position_embeddings = 256;
    c.initializer_range = 0.1f;
    c.seed = 5;
    c.precision = (uint32_t)precision;
    c.num_experts = 8;
    c.num_experts_per_tok = 2;
    c.moe_intermediate_size = 48; /* rows of 96 bytes in bf16: expert blocks off 256-byte alignment */
    c.norm_topk_prob = 1;
    c.output_router_logits = 1;
    c.router_aux_loss_coef = 0.1f;
    if (arch == MT_ARCH_QWEN3_MOE) c.mlp_only_layers[0] = 1u << 1;
    else c.sliding_window = 24, c.moe_intermediate_size = c.intermediate_size = 48;
    if (arch == MT_ARCH_GPT_OSS) c.attention_bias = 1, c.sliding_window_pattern = 2; /* layer 1 full: cuDNN's */
    if (arch == MT_ARCH_DEEPSEEK_V3 || arch == MT_ARCH_DEEPSEEK_V2) {
        /* latent attention (heads of 48 + 16 = 64, values 32 wide, q from a latent of 48 for V3), groups,
         * the scale, two shared experts, layer 0 dense; no window */
        const int v3 = arch == MT_ARCH_DEEPSEEK_V3;
        c.sliding_window = 0, c.num_key_value_heads = c.num_attention_heads, c.head_dim = 0, c.attention_bias = v3;
        c.kv_lora_rank = 32, c.q_lora_rank = v3 ? 48 : 0, c.qk_nope_head_dim = 48, c.qk_rope_head_dim = 16;
        c.v_head_dim = 32, c.rope_interleave = 1, c.n_group = 4, c.topk_group = 2, c.routed_scaling_factor = 2.5f;
        c.moe_scoring = v3 ? MT_MOE_SCORING_SIGMOID : MT_MOE_SCORING_SOFTMAX, c.norm_topk_prob = v3;
        c.output_router_logits = 0, c.router_aux_loss_coef = 0.0f, c.mlp_only_layers[0] = 1;
        c.shared_expert_intermediate_size = 2 * c.moe_intermediate_size;
    }
    if (arch == MT_ARCH_LLAMA4) {
        /* layer 0 with RoPE in chunks of 32 of the 77 positions, q/k L2-normed; layer 1 without RoPE, the
         * temperature at a floor of 8 (ten factors over 77 positions); the weight on the experts' input, a
         * shared expert; no window */
        c.sliding_window = 0, c.norm_topk_prob = 0, c.output_router_logits = 0, c.router_aux_loss_coef = 0.0f;
        c.moe_scoring = MT_MOE_SCORING_SIGMOID, c.moe_input_weighted = 1;
        c.shared_expert_intermediate_size = c.moe_intermediate_size;
        c.attention_chunk_size = 32, c.qk_l2_norm = 1, c.nope_layers[0] = 1u << 1;
        c.attn_temperature_floor = 8.0f, c.attn_temperature_scale = 0.5f;
    }
    return c;
}

static mt_model *make_with(const mt_model_config *c, int backend, mt_attention attention)
{
    mt_offload_policy p;
    mt_offload_policy_init(&p);
    p.backend = (uint32_t)backend;
    p.attention = (uint32_t)attention;
    p.log_level = MT_LOG_ERROR;
    mt_model *m = NULL;
    mt_status st = mt_model_create(&m, c, &p);
    if (st == MT_ERR_NO_DEVICE) MT_GPU_MISSING("no CUDA device: %s", mt_last_errmsg());
    cr_assert_eq(st, MT_OK, "%s", mt_last_errmsg());
    return m;
}

static mt_model *make(const mt_model_config *c, int backend) { return make_with(c, backend, MT_ATTENTION_AUTO); }

/* Routing clear of ties by construction (as tools/fixtures/make_fixtures.py's decisive_routing): the
 * embedding's first E channels carry each token's k experts (2 in those, damped elsewhere), the
 * attention's and MLPs' output rows into those channels are damped (x0.02: at initializer_range 0.1
 * their outputs are about a unit per channel and would bury the marks) and each router reads mostly its
 * own channel (6), so a token's k experts lead the others by several units of logit. Random routers put some token's k-th and next experts within 1e-5 of each other among a few
 * hundred routings, and the GPU's bf16 then chose another expert than the CPU's fp32: the comparison
 * measured the tie, not the arithmetic. The same weights on both models (set before any step). */
static void set_weight(mt_model *m, int unit, const mt_tensor_desc *t, uint64_t i, float x)
{
    const mt_unit_desc *u = &m->layout.units[unit];
    mt_tile_master(&m->tiles.tile[unit], u)[t->offset + i] = x;
    uint16_t *w = mt_tile_weights_bf16(&m->tiles.tile[unit], u);
    if (w) w[t->offset + i] = mt_f32_to_bf16(x);
}

static void decisive_routing(mt_model *m)
{
    const uint32_t E = m->cfg.num_experts, k = m->cfg.num_experts_per_tok, C = m->cfg.hidden_size;
    unsigned s = 77;
    for (int unit = 0; unit < m->layout.n_units; unit++) {
        const mt_unit_desc *u = &m->layout.units[unit];
        for (int ti = 0; ti < u->n_tensors; ti++) {
            const mt_tensor_desc *t = &u->tensors[ti];
            const float *w = mt_tile_master(&m->tiles.tile[unit], u) + t->offset;
            if (t->role == MT_T_EMBED) {
                for (uint32_t v = 0; v < t->rows; v++) {
                    for (uint32_t e = 0; e < E; e++) set_weight(m, unit, t, (uint64_t)v * C + e, 0.25f * w[(uint64_t)v * C + e]);
                    for (uint32_t j = 0, e = lcg(&s) % E; j < k; j++, e = (e + 1 + lcg(&s) % (E - 1)) % E)
                        set_weight(m, unit, t, (uint64_t)v * C + e, w[(uint64_t)v * C + e] + 2.0f);
                }
            } else if (t->role == MT_T_ROUTER) {
                for (uint32_t e = 0; e < E; e++)
                    for (uint32_t c = 0; c < C; c++)
                        set_weight(m, unit, t, (uint64_t)e * C + c, 0.01f * uni(&s) + (c == e ? 6.0f : 0.0f));
            } else if (t->role == MT_T_SINKS) { /* GPT-OSS: sinks with a sizeable share of each softmax */
                for (uint64_t i = 0; i < t->numel; i++) set_weight(m, unit, t, i, 1.0f + uni(&s));
            } else if (mt_role_is_bias(t->role)) { /* not only zeros; none into the routing channels */
                const int out = t->role == MT_T_O_BIAS || t->role == MT_T_EXP_DOWN_BIAS;
                for (uint64_t i = 0; i < t->numel; i++) set_weight(m, unit, t, i, out && i % C < E ? 0.0f : 0.1f * uni(&s));
            } else if (t->role == MT_T_O || t->role == MT_T_DOWN || t->role == MT_T_EXP_DOWN) {
                /* rows of C outputs (each expert's block of C rows for the stacked down projections) */
                for (uint64_t r = 0; r < t->rows; r++)
                    if (r % C < E)
                        for (uint64_t i = r * t->cols; i < (r + 1) * t->cols; i++) set_weight(m, unit, t, i, 0.02f * w[i]);
            }
        }
    }
}

static void fill(int32_t *tok, int32_t *tg, int n, unsigned seed)
{
    for (int i = 0; i < n; i++) tok[i] = (int32_t)((seed = seed * 1103515245u + 12345u) >> 16) % V;
    for (int i = 0; i < n; i++) tg[i] = i % 7 == 3 ? MT_IGNORE_INDEX : tok[(i + 1) % n];
}

/* One step's gradients on both backends from the same weights, as tests/test_cuda_backend.c's
 * step_matches_cpu: fp32, the loss to 1e-5 relative and every tensor's gradient (the stacked experts
 * of a layer as one) to 1e-4 of its largest; the routing is the same on both sides unless two
 * probabilities are within ~1e-6, which decisive_routing rules out. bf16: the GPU rounds the router's
 * input and the experts' activations (~1% in the logits, far below decisive_routing's margins, so both
 * route alike); bounds: loss 1%, norm 3%, each tensor's relative L2 error 10%, and 25% for the stacked
 * experts and the router (their blocks sum few rows, so bf16's rounding weighs more) and GPT-OSS's sinks
 * (a head's gradient is -sum over the rows of p_sink dot(dO, O), terms of both signs from the GPU's bf16 dO
 * and O: two numbers, each what is left of a cancelling sum; measured 0.15 at layer 0, the deepest, with
 * cuDNN's attention and with the kernels alike, against 3e-6 in fp32). */
static void step_matches_cpu_path(mt_arch arch, int precision, mt_attention attention, mt_expert_gemm path)
{
    mt_model_config c = moe_cfg(arch, precision);
    mt_model *gpu = make_with(&c, MT_BACKEND_CUDA, attention), *cpu = make(&c, MT_BACKEND_CPU);
    gpu->expert_gemm = path;
    decisive_routing(gpu), decisive_routing(cpu);
    enum { B = 2, S = 77, M = 2, N = B * S * M };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 3);
    mt_batch b;
    mt_batch_init(&b);
    b.micro_batch_size = B, b.seq_len = S, b.num_micro_batches = M, b.tokens = tok, b.targets = tg;
    uint64_t nt = 0;
    for (int i = 0; i < N; i++) nt += tg[i] != MT_IGNORE_INDEX;
    double lg, ng, lc, nc;
    cr_assert_eq(mt_engine_grads(gpu, &b, nt, &lg, &ng, NULL), MT_OK, "%s", mt_model_errmsg(gpu));
    cr_assert_eq(mt_engine_grads(cpu, &b, nt, &lc, &nc, NULL), MT_OK, "%s", mt_model_errmsg(cpu));
    const int fp32 = precision == MT_PRECISION_FP32;
    cr_log_info("loss %.7f vs %.7f, norm %.6f vs %.6f", lg, lc, ng, nc);
    cr_assert(fabs(lg - lc) <= (fp32 ? 1e-5 : 1e-2) * fabs(lc), "loss %.7f (GPU) vs %.7f (CPU)", lg, lc);
    cr_assert(fabs(ng - nc) <= (fp32 ? 1e-4 : 3e-2) * nc, "norm %.6f (GPU) vs %.6f (CPU)", ng, nc);
    for (int u = 0; u < gpu->layout.n_units; u++) {
        const mt_unit_desc *d = &gpu->layout.units[u];
        for (int i = 0; i < d->n_tensors; i++) {
            const mt_tensor_desc *td = &d->tensors[i];
            double mx = 0, md = 0, dd = 0, bb = 0;
            for (uint64_t e = td->offset; e < td->offset + td->numel; e++) {
                float a, r;
                if (d->grad_bytes) {
                    a = mt_tile_grad_f32(&gpu->tiles.tile[u], d)[e], r = mt_tile_grad_f32(&cpu->tiles.tile[u], d)[e];
                } else {
                    a = mt_bf16_to_f32(mt_tile_weights_bf16(&gpu->tiles.tile[u], d)[e]);
                    r = mt_bf16_to_f32(mt_tile_weights_bf16(&cpu->tiles.tile[u], d)[e]);
                }
                const double df = (double)a - r;
                mx = fmax(mx, fabs(r)), md = fmax(md, fabs(df)), dd += df * df, bb += (double)r * r;
            }
            const double max_rel = mx > 0 ? md / mx : md, l2 = bb > 0 ? sqrt(dd / bb) : sqrt(dd);
            cr_log_info("  %-52s max %.3g, relative L2 %.3g", td->name, max_rel, l2);
            if (fp32)
                cr_assert(max_rel <= 1e-4, "%s: gradients differ by %.3g of the largest", td->name, max_rel);
            else /* every tensor's figure is logged before the test fails */
                cr_expect(l2 <= (td->experts || td->role == MT_T_ROUTER || td->role == MT_T_SINKS ? 0.25 : 0.1),
                          "%s: relative L2 %.3g", td->name, l2);
        }
    }
    mt_model_destroy(gpu);
    mt_model_destroy(cpu);
}

static void step_matches_cpu_with(mt_arch arch, int precision, mt_attention attention)
{
    step_matches_cpu_path(arch, precision, attention, MT_EXPERT_GEMM_AUTO);
}
static void step_matches_cpu(mt_arch arch, int precision) { step_matches_cpu_with(arch, precision, MT_ATTENTION_AUTO); }

/* The backward's expert products on each path the backend chooses between by shape (the fixtures' short
 * row blocks take the kernel for dx and the loop, sized from the forward's routing on the host, for dW):
 * every product on the grouped kernel, every product on the loop. GPT-OSS: the biases' gradients too. */
Test(cuda_backend, moe_qwen3_moe_backward_on_the_kernel_bf16)
{
    step_matches_cpu_path(MT_ARCH_QWEN3_MOE, MT_PRECISION_BF16, MT_ATTENTION_AUTO, MT_EXPERT_GEMM_KERNEL);
}
Test(cuda_backend, moe_qwen3_moe_backward_on_the_loop_bf16)
{
    step_matches_cpu_path(MT_ARCH_QWEN3_MOE, MT_PRECISION_BF16, MT_ATTENTION_AUTO, MT_EXPERT_GEMM_LOOP);
}
Test(cuda_backend, moe_gpt_oss_backward_on_the_loop_bf16)
{
    step_matches_cpu_path(MT_ARCH_GPT_OSS, MT_PRECISION_BF16, MT_ATTENTION_AUTO, MT_EXPERT_GEMM_LOOP);
}

Test(cuda_backend, moe_qwen3_moe_step_matches_cpu_fp32) { step_matches_cpu(MT_ARCH_QWEN3_MOE, MT_PRECISION_FP32); }
Test(cuda_backend, moe_qwen3_moe_step_matches_cpu_bf16) { step_matches_cpu(MT_ARCH_QWEN3_MOE, MT_PRECISION_BF16); }
Test(cuda_backend, moe_mixtral_step_matches_cpu_fp32) { step_matches_cpu(MT_ARCH_MIXTRAL, MT_PRECISION_FP32); }
Test(cuda_backend, moe_mixtral_step_matches_cpu_bf16) { step_matches_cpu(MT_ARCH_MIXTRAL, MT_PRECISION_BF16); }
/* GPT-OSS: sinks after the kernels' (sliding layers) and cuDNN's (the full layer) attention, the biases,
 * the clamped SwiGLU */
Test(cuda_backend, moe_gpt_oss_step_matches_cpu_fp32) { step_matches_cpu(MT_ARCH_GPT_OSS, MT_PRECISION_FP32); }
Test(cuda_backend, moe_gpt_oss_step_matches_cpu_bf16) { step_matches_cpu(MT_ARCH_GPT_OSS, MT_PRECISION_BF16); }
/* DeepSeek-V3 and -V2: latent attention (the key's shared part copied to every head, values narrower than
 * the heads), sigmoid or softmax routing within groups, shared experts, a dense first layer */
Test(cuda_backend, moe_deepseek_v3_step_matches_cpu_fp32) { step_matches_cpu(MT_ARCH_DEEPSEEK_V3, MT_PRECISION_FP32); }
Test(cuda_backend, moe_deepseek_v3_step_matches_cpu_bf16) { step_matches_cpu(MT_ARCH_DEEPSEEK_V3, MT_PRECISION_BF16); }
Test(cuda_backend, moe_deepseek_v2_step_matches_cpu_fp32) { step_matches_cpu(MT_ARCH_DEEPSEEK_V2, MT_PRECISION_FP32); }
/* Llama 4: chunked attention with the L2 norms after RoPE, a NoPE layer with the temperature, the routing
 * weight on the experts' input, the shared expert */
Test(cuda_backend, moe_llama4_step_matches_cpu_fp32) { step_matches_cpu(MT_ARCH_LLAMA4, MT_PRECISION_FP32); }
Test(cuda_backend, moe_llama4_step_matches_cpu_bf16) { step_matches_cpu(MT_ARCH_LLAMA4, MT_PRECISION_BF16); }
/* the same with the library's kernels on the full layer too */
Test(cuda_backend, moe_gpt_oss_step_matches_cpu_bf16_kernels)
{
    step_matches_cpu_with(MT_ARCH_GPT_OSS, MT_PRECISION_BF16, MT_ATTENTION_KERNELS);
}

/* Steps on the GPU are the same bits run to run (no atomics in the routing, the same GEMMs). */
Test(cuda_backend, moe_steps_are_bit_identical)
{
    mt_model_config c = moe_cfg(MT_ARCH_QWEN3_MOE, MT_PRECISION_BF16);
    mt_model *a = make(&c, MT_BACKEND_CUDA), *b = make(&c, MT_BACKEND_CUDA);
    enum { N = 2 * 64 * 2 };
    int32_t tok[N], tg[N];
    mt_optim_config o;
    mt_optim_config_init(&o);
    o.lr = 3e-3f;
    for (int s = 0; s < 3; s++) {
        fill(tok, tg, N, 100u + (unsigned)s);
        mt_batch x;
        mt_batch_init(&x);
        x.micro_batch_size = 2, x.seq_len = 64, x.num_micro_batches = 2, x.tokens = tok, x.targets = tg;
        mt_step_stats sa, sb;
        mt_step_stats_init(&sa), mt_step_stats_init(&sb);
        cr_assert_eq(mt_step(a, &x, &o, &sa), MT_OK, "%s", mt_model_errmsg(a));
        cr_assert_eq(mt_step(b, &x, &o, &sb), MT_OK, "%s", mt_model_errmsg(b));
        cr_assert_eq(memcmp(&sa.loss, &sb.loss, sizeof sa.loss), 0, "step %d loss", s);
    }
    mt_optimizer_drain(&a->opt);
    mt_optimizer_drain(&b->opt);
    for (int u = 0; u < a->layout.n_units; u++)
        cr_assert_eq(memcmp(a->tiles.tile[u].base, b->tiles.tile[u].base, a->layout.units[u].tile_bytes), 0, "unit %d", u);
    mt_model_destroy(a);
    mt_model_destroy(b);
}

/* A router that gives NaN logits (a NaN weight in layer 1's: every token's probabilities are NaN, so no
 * row of that layer is placed) fails the step with the routing's message, found by the device-side check
 * and reported when the step synchronises (no wait inside the layer); the flag is zeroed there, so the
 * next step, with the weight mended, succeeds. Layer 0 routes well first, so the rows the unplaced
 * layer's gathers read are in range. */
Test(cuda_backend, moe_bad_routing_is_reported)
{
    mt_model_config c = moe_cfg(MT_ARCH_MIXTRAL, MT_PRECISION_FP32);
    mt_model *m = make(&c, MT_BACKEND_CUDA);
    enum { B = 2, S = 64, M = 2, N = B * S * M };
    int32_t tok[N], tg[N];
    fill(tok, tg, N, 5);
    mt_batch b;
    mt_batch_init(&b);
    b.micro_batch_size = B, b.seq_len = S, b.num_micro_batches = M, b.tokens = tok, b.targets = tg;
    uint64_t nt = 0;
    for (int i = 0; i < N; i++) nt += tg[i] != MT_IGNORE_INDEX;
    const int unit = 2; /* decoder layer 1 */
    const mt_unit_desc *u = &m->layout.units[unit];
    const mt_tensor_desc *router = NULL;
    for (int i = 0; i < u->n_tensors; i++)
        if (u->tensors[i].role == MT_T_ROUTER) router = &u->tensors[i];
    cr_assert(router, "layer 1 has a router");
    const float keep = mt_tile_master(&m->tiles.tile[unit], u)[router->offset + 3];
    set_weight(m, unit, router, 3, NAN);
    double loss, norm;
    cr_assert_neq(mt_engine_grads(m, &b, nt, &loss, &norm, NULL), MT_OK, "a step routed on NaN logits");
    char want[128];
    snprintf(want, sizeof want, "expert routing: 0 of %d routed rows placed (non-finite router logits?)",
             B * S * (int)c.num_experts_per_tok);
    cr_assert(strstr(mt_model_errmsg(m), want), "the message: %s", mt_model_errmsg(m));
    set_weight(m, unit, router, 3, keep);
    cr_assert_eq(mt_engine_grads(m, &b, nt, &loss, &norm, NULL), MT_OK, "after the mend: %s", mt_model_errmsg(m));
    cr_assert(isfinite(loss) && isfinite(norm), "loss %g, norm %g", loss, norm);
    mt_model_destroy(m);
}

/* The plan of an MoE model and shape on the CUDA backend is what a step reserves: device bytes
 * (the routed rows' buffers, the statistics, the experts' offsets in the arena) and host bytes, as
 * tests/test_backend.c checks for dense models. */
Test(cuda_backend, moe_plan_is_the_allocation)
{
    for (int k = 0; k < 2; k++) {
        mt_model_config c = moe_cfg(k ? MT_ARCH_MIXTRAL : MT_ARCH_QWEN3_MOE, k ? MT_PRECISION_FP32 : MT_PRECISION_BF16);
        mt_offload_policy p;
        mt_offload_policy_init(&p);
        p.backend = MT_BACKEND_CUDA;
        p.optimizer_threads = 2;
        p.log_level = MT_LOG_ERROR;
        p.gpu_budget_bytes = (uint64_t)8 << 30;
        mt_batch_shape bs;
        mt_batch_shape_init(&bs);
        bs.micro_batch_size = 2, bs.seq_len = 64, bs.num_micro_batches = 2;
        mt_memory_plan plan;
        mt_memory_plan_init(&plan);
        cr_assert_eq(mt_plan(&plan, &c, &p, &bs), MT_OK, "%s", mt_last_errmsg());
        mt_model *m = NULL;
        mt_status st = mt_model_create(&m, &c, &p);
        if (st == MT_ERR_NO_DEVICE) MT_GPU_MISSING("no CUDA device: %s", mt_last_errmsg());
        cr_assert_eq(st, MT_OK, "%s", mt_last_errmsg());
        enum { N = 2 * 64 * 2 };
        int32_t tok[N], tg[N];
        fill(tok, tg, N, 7);
        mt_batch b;
        mt_batch_init(&b);
        b.micro_batch_size = 2, b.seq_len = 64, b.num_micro_batches = 2, b.tokens = tok, b.targets = tg;
        mt_optim_config o;
        mt_optim_config_init(&o);
        cr_assert_eq(mt_step(m, &b, &o, NULL), MT_OK, "%s", mt_model_errmsg(m));
        const mt_be_needs *h = &m->be->held;
        cr_assert_eq(plan.gpu_bytes, h->device_bytes, "config %d: device bytes planned %llu, allocated %llu", k,
                     (unsigned long long)plan.gpu_bytes, (unsigned long long)h->device_bytes);
        cr_assert_eq(plan.activation_bytes, h->checkpoint_bytes);
        cr_assert_eq(plan.host_pinned_bytes + plan.host_pageable_bytes,
                     m->layout.tile_bytes + h->host_bytes + h->pinned_bytes);
        mt_model_destroy(m);
    }
}
