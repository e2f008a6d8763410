/* Mixture-of-experts operations on the CPU (cpu_moe.h). Serial: they touch
 * T*k rows of C at most once each, which is small beside the experts' GEMMs;
 * the grouped GEMMs (at the end) run each expert's block on the pool. */
#include "cpu/cpu_moe.h"
#include "cpu/cpu_ops.h"
#include "model/template.h"

#include <math.h>
#include <string.h>

static float sigmoid(float z);

/* The group limit on one token's choice scores c (E): the experts outside the topk_group of n_group groups
 * whose score is highest go to -inf; a group's score is the sum of its two best (two_best: DeepSeek-V3)
 * or its best (DeepSeek-V2's group_limited_greedy); a tie goes to the lower index. */
static void keep_groups(float *c, int E, const mt_route *rt, int two_best)
{
    const int n = rt->n_group, G = E / n; /* groups of G experts */
    float gs[MT_MAX_EXPERTS];
    unsigned char kept[MT_MAX_EXPERTS];
    for (int g = 0; g < n; g++) {
        float a = -INFINITY, b = -INFINITY;
        for (int e = g * G; e < (g + 1) * G; e++) {
            if (c[e] > a) b = a, a = c[e];
            else if (c[e] > b) b = c[e];
        }
        gs[g] = two_best && G > 1 ? a + b : a;
        kept[g] = 0;
    }
    for (int j = 0; j < rt->topk_group; j++) { /* the topk_group best */
        int best = -1;
        for (int g = 0; g < n; g++)
            if (!kept[g] && (best < 0 || gs[g] > gs[best])) best = g;
        kept[best] = 1;
    }
    for (int e = 0; e < E; e++)
        if (!kept[e / G]) c[e] = -INFINITY;
}

/* One token's routing in DeepSeek-V3's mode (mt_route's sigmoid): p (E) the scores of the logits z (E),
 * idx (k) the choice in descending order of choice score, w (k) the weights. */
static void route_sigmoid(float *p, float *w, int32_t *idx, const float *z, int E, int k, const mt_route *rt)
{
    const float *bias = rt->bias;
    float c[MT_MAX_EXPERTS]; /* the choice scores, -inf outside the chosen groups */
    for (int e = 0; e < E; e++) {
        p[e] = sigmoid(z[e]);
        c[e] = bias ? p[e] + bias[e] : p[e];
    }
    if (rt->n_group > 1) keep_groups(c, E, rt, 1);
    float s = 0.0f;
    for (int j = 0; j < k; j++) { /* as the softmax's choice, on the choice scores */
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int i = 0; i < j; i++) taken |= idx[i] == e;
            if (!taken && (best < 0 || c[e] > c[best])) best = e;
        }
        idx[j] = best;
        s += p[best];
    }
    for (int j = 0; j < k; j++) { /* the scores without the bias: / (sum + 1e-20), then * scale */
        float x = p[idx[j]];
        if (rt->norm) x /= s + 1e-20f;
        w[j] = x * rt->scale;
    }
}

void mt_cpu_moe_route(float *probs, float *topw, int32_t *topi, int32_t *rows, int32_t *slot_row, int32_t *offs,
                      float *stats, const float *logits, int T, int E, int k, const mt_route *rt)
{
    for (int t = 0; t < T; t++) {
        if (rt->sigmoid) {
            route_sigmoid(probs + (size_t)t * E, topw + (size_t)t * k, topi + (size_t)t * k, logits + (size_t)t * E, E,
                          k, rt);
            continue;
        }
        const float *z = logits + (size_t)t * E;
        float *p = probs + (size_t)t * E;
        float mx = z[0];
        for (int e = 1; e < E; e++) mx = fmaxf(mx, z[e]);
        double sum = 0.0;
        for (int e = 0; e < E; e++) sum += (double)(p[e] = expf(z[e] - mx));
        const float inv = (float)(1.0 / sum);
        for (int e = 0; e < E; e++) p[e] *= inv;
        /* the k largest, in descending order; a tie goes to the lower index (strictly greater wins); with
         * groups (DeepSeek-V2's group_limited_greedy) among the kept groups' experts */
        float c[MT_MAX_EXPERTS];
        const float *choice = p;
        if (rt->n_group > 1) {
            memcpy(c, p, (size_t)E * sizeof *c);
            keep_groups(c, E, rt, 0);
            choice = c;
        }
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= topi[(size_t)t * k + i] == e;
                if (!taken && (best < 0 || choice[e] > choice[best])) best = e;
            }
            topi[(size_t)t * k + j] = best;
            topw[(size_t)t * k + j] = p[best];
            s += p[best];
        }
        if (rt->norm)
            for (int j = 0; j < k; j++) topw[(size_t)t * k + j] /= s;
        if (rt->scale != 1.0f) /* no rounding at all where it is 1 */
            for (int j = 0; j < k; j++) topw[(size_t)t * k + j] *= rt->scale;
    }
    /* counting sort of the slots by expert, stable: offs[e] first counts, then is each expert's cursor */
    const int R = T * k;
    memset(offs, 0, (size_t)(E + 1) * sizeof *offs);
    for (int s = 0; s < R; s++) offs[topi[s] + 1]++;
    if (stats)
        for (int e = 0; e < E; e++) stats[e] = (float)offs[e + 1];
    for (int e = 0; e < E; e++) offs[e + 1] += offs[e];
    for (int s = 0; s < R; s++) {
        const int r = offs[topi[s]]++;
        rows[r] = s;
        slot_row[s] = r;
    }
    for (int e = E; e > 0; e--) offs[e] = offs[e - 1]; /* the cursors ended at the next expert's start */
    offs[0] = 0;
    if (stats)
        for (int e = 0; e < E; e++) {
            double ps = 0.0;
            for (int t = 0; t < T; t++) ps += probs[(size_t)t * E + e];
            stats[E + e] = (float)ps;
        }
}

void mt_cpu_moe_route_bwd(float *dlogits, const float *dw, const float *probs, const float *topw, const int32_t *topi,
                          const float *stats, int L, float aux, int T, int E, int k, const mt_route *rt)
{
    float cnt[1024]; /* each expert's routed rows over the L layers (E <= 1024, mt_config_import's bound) */
    for (int e = 0; e < E; e++) {
        cnt[e] = 0.0f;
        if (stats)
            for (int l = 0; l < L; l++) cnt[e] += stats[(size_t)l * 2 * E + e];
    }
    for (int t = 0; t < T; t++) {
        const float *p = probs + (size_t)t * E;
        float *g = dlogits + (size_t)t * E; /* first the gradient of the probabilities */
        for (int e = 0; e < E; e++) g[e] = aux * cnt[e];
        /* topw = a p / S over the k chosen (norm; a = scale): d p_m = (a d w_m - sum_j d w_j w_j) / S;
         * without norm d p_m = a d w_m. S is the forward's denominator: the sum, + 1e-20 with sigmoid */
        const float *gw = dw + (size_t)t * k, *w = topw + (size_t)t * k;
        const int32_t *idx = topi + (size_t)t * k;
        const float a = rt->scale;
        float S = 0.0f, dot = 0.0f;
        for (int j = 0; j < k; j++) S += p[idx[j]], dot += gw[j] * w[j];
        if (rt->sigmoid) S += 1e-20f;
        for (int j = 0; j < k; j++) g[idx[j]] += rt->norm ? (a * gw[j] - dot) / S : a * gw[j];
        if (rt->sigmoid) { /* p = sigmoid(z): dz = p (1 - p) g */
            for (int e = 0; e < E; e++) g[e] = p[e] * (1.0f - p[e]) * g[e];
            continue;
        }
        /* softmax: dz = p * (g - sum p g) */
        double pg = 0.0;
        for (int e = 0; e < E; e++) pg += (double)p[e] * g[e];
        for (int e = 0; e < E; e++) g[e] = p[e] * (g[e] - (float)pg);
    }
}

void mt_cpu_moe_gather(float *dst, const float *src, const int32_t *rows, int R, int k, int C)
{
    for (int r = 0; r < R; r++)
        memcpy(dst + (size_t)r * C, src + (size_t)(rows[r] / k) * C, (size_t)C * sizeof(float));
}

void mt_cpu_moe_combine(float *out, const float *src, const float *w, const int32_t *slot_row, int T, int k, int C)
{
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int j = 0; j < k; j++) {
                const size_t s = (size_t)t * k + j;
                acc += (w ? w[s] : 1.0f) * src[(size_t)slot_row[s] * C + c];
            }
            out[(size_t)t * C + c] += acc;
        }
}

void mt_cpu_moe_dot_scale(float *dw, float *x, float *y, const float *w, const int32_t *rows, int R, int n)
{
    for (int r = 0; r < R; r++) {
        float *xr = x + (size_t)r * n, *yr = y ? y + (size_t)r * n : NULL;
        if (dw && yr) {
            double dot = 0.0;
            for (int i = 0; i < n; i++) dot += (double)xr[i] * yr[i];
            dw[rows[r]] = (float)dot;
        }
        const float s = w[rows[r]];
        if (yr)
            for (int i = 0; i < n; i++) xr[i] *= s, yr[i] *= s;
        else
            for (int i = 0; i < n; i++) xr[i] *= s;
    }
}

/* torch.sigmoid in fp32 */
static float sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

void mt_cpu_moe_shared_gate(float *out, const float *src, const float *z, int T, int C)
{
    for (int t = 0; t < T; t++) {
        const float s = sigmoid(z[t]);
        for (int c = 0; c < C; c++) out[(size_t)t * C + c] += s * src[(size_t)t * C + c];
    }
}

void mt_cpu_moe_shared_gate_bwd(float *dz, float *x, float *y, const float *z, int T, int n)
{
    for (int t = 0; t < T; t++) {
        float *xt = x + (size_t)t * n, *yt = y + (size_t)t * n;
        double dot = 0.0;
        for (int i = 0; i < n; i++) dot += (double)xt[i] * yt[i];
        const float s = sigmoid(z[t]);
        dz[t] = (float)(dot * s * (1.0 - s));
        for (int i = 0; i < n; i++) xt[i] *= s, yt[i] *= s;
    }
}

double mt_cpu_moe_aux_sum(const float *stats, int L, int E)
{
    double sum = 0.0;
    for (int e = 0; e < E; e++) {
        double c = 0.0, p = 0.0;
        for (int l = 0; l < L; l++) c += stats[(size_t)l * 2 * E + e], p += stats[(size_t)l * 2 * E + E + e];
        sum += c * p;
    }
    return (double)E * sum;
}

/* ---- the experts' grouped GEMMs ---- */

/* Expert e's rows [*lo, *hi) from offs, clamped to [0, R] (the offsets this backend makes are always
 * in range; the clamp keeps the contract a GPU backend needs for a routing it has not checked yet) */
static int expert_rows(const int32_t *offs, int e, int R, int *lo, int *hi)
{
    *lo = MT_MIN(MT_MAX(offs[e], 0), R);
    *hi = MT_MIN(MT_MAX(offs[e + 1], *lo), R);
    return *hi - *lo;
}

void mt_cpu_moe_linear(mt_pool *p, void *ws, float *y, const float *x, const float *W, const float *bias,
                       const int32_t *offs, int E, int R, int K, int N, int accumulate)
{
    for (int e = 0; e < E; e++) {
        int lo, hi;
        const int n = expert_rows(offs, e, R, &lo, &hi);
        if (n > 0)
            mt_cpu_matmul(p, ws, y + (size_t)lo * N, x + (size_t)lo * K, W + (size_t)e * N * K,
                          bias ? bias + (size_t)e * N : NULL, n, K, N, accumulate);
    }
}

void mt_cpu_moe_linear_dx(mt_pool *p, void *ws, float *dx, const float *dy, const float *W, const int32_t *offs,
                          int E, int R, int K, int N, int accumulate)
{
    for (int e = 0; e < E; e++) {
        int lo, hi;
        const int n = expert_rows(offs, e, R, &lo, &hi);
        if (n > 0)
            mt_cpu_matmul_bwd(p, ws, dx + (size_t)lo * K, NULL, NULL, dy + (size_t)lo * N, NULL,
                              W + (size_t)e * N * K, n, K, N, accumulate);
    }
}

void mt_cpu_moe_linear_dw(mt_pool *p, void *ws, float *dW, float *db, const float *dy, const float *x,
                          const int32_t *offs, int E, int R, int K, int N)
{
    for (int e = 0; e < E; e++) {
        int lo, hi;
        const int n = expert_rows(offs, e, R, &lo, &hi);
        if (n > 0)
            mt_cpu_matmul_bwd(p, ws, NULL, dW + (size_t)e * N * K, db ? db + (size_t)e * N : NULL,
                              dy + (size_t)lo * N, x + (size_t)lo * K, NULL, n, K, N, 0);
    }
}
