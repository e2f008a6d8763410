/* Mixture-of-experts operations on the CPU (cpu_moe.h). Serial: they touch
 * T*k rows of C at most once each, which is small beside the experts' GEMMs. */
#include "cpu/cpu_moe.h"

#include <math.h>
#include <string.h>

void mt_cpu_moe_route(float *probs, float *topw, int32_t *topi, int32_t *rows, int32_t *slot_row, int *offs,
                      float *stats, const float *logits, int T, int E, int k, int norm)
{
    for (int t = 0; t < T; t++) {
        const float *z = logits + (size_t)t * E;
        float *p = probs + (size_t)t * E;
        float mx = z[0];
        for (int e = 1; e < E; e++) mx = fmaxf(mx, z[e]);
        double sum = 0.0;
        for (int e = 0; e < E; e++) sum += (double)(p[e] = expf(z[e] - mx));
        const float inv = (float)(1.0 / sum);
        for (int e = 0; e < E; e++) p[e] *= inv;
        /* the k largest, in descending order; a tie goes to the lower index (strictly greater wins) */
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= topi[(size_t)t * k + i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            topi[(size_t)t * k + j] = best;
            topw[(size_t)t * k + j] = p[best];
            s += p[best];
        }
        if (norm)
            for (int j = 0; j < k; j++) topw[(size_t)t * k + j] /= s;
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
                          const float *stats, int L, float aux, int T, int E, int k, int norm)
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
        /* topw = p / S over the k chosen (norm): d p_m = (d w_m - sum_j d w_j w_j) / S */
        const float *gw = dw + (size_t)t * k, *w = topw + (size_t)t * k;
        const int32_t *idx = topi + (size_t)t * k;
        float S = 0.0f, dot = 0.0f;
        for (int j = 0; j < k; j++) S += p[idx[j]], dot += gw[j] * w[j];
        for (int j = 0; j < k; j++) g[idx[j]] += norm ? (gw[j] - dot) / S : gw[j];
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
        float *xr = x + (size_t)r * n, *yr = y + (size_t)r * n;
        double dot = 0.0;
        for (int i = 0; i < n; i++) dot += (double)xr[i] * yr[i];
        dw[rows[r]] = (float)dot;
        const float s = w[rows[r]];
        for (int i = 0; i < n; i++) xr[i] *= s, yr[i] *= s;
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
