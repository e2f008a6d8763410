/* The CPU backend's layer operations, fp32, forward and backward (see
 * cpu_ops.h for the shapes and the contracts). The matmuls and the attention
 * run on the packed GEMM of cpu_gemm.c; the rest are loops over rows or
 * elements split into contiguous ranges, one task per range.
 *
 * Every task owns a disjoint set of outputs and computes each of them in an
 * order fixed by the shapes: no atomics, no partial sums combined in an
 * order that depends on the threads. */
#include <math.h>
#include <string.h>

#include "core/bf16.h"
#include "cpu/cpu_ops.h"
#include "model/template.h"

#define ATT_BQ 48 /* query rows per attention block (a multiple of every GEMM MR) */

/* ---- scratch and task splitting ------------------------------------------- */

/* Per thread: the GEMM buffers, then two blocks of ATT_BQ x S floats
 * (scores / probabilities and their gradients) for the attention. */
static size_t ws_thread_bytes(int S)
{
    size_t att = (size_t)2 * ATT_BQ * (size_t)(S > 0 ? S : 0) * sizeof(float);
    return mt_cpu_gemm_ws_bytes() + (att + 63) / 64 * 64;
}

size_t mt_cpu_ws_size(int n_threads, int S)
{
    return 64 + (size_t)(n_threads > 1 ? n_threads : 1) * ws_thread_bytes(S);
}

/* Tasks for `work` units of cheap work: one per thread, fewer when there is
 * too little work to be worth waking them (at least min_work per task). */
static size_t n_tasks(mt_pool *p, size_t work, size_t min_work)
{
    size_t n = work / min_work, t = (size_t)mt_pool_size(p);
    return n < 1 ? 1 : n > t ? t : n;
}

/* ---- vector helpers ------------------------------------------------------------
 * GCC vector extensions, 8 floats wide (one ymm register; two xmm in the
 * default clone). Wider vectors would not do: GCC splits a comparison of a
 * vector wider than the ISA's into scalar code. Only IEEE adds, multiplies,
 * divides and integer operations (no contraction under -std=c11), so every
 * clone gives the same bits; a tail goes through the same code as a
 * zero-padded vector. */
#define VW 8
#define VCLONES __attribute__((target_clones("avx2", "default")))
#define VINLINE static inline __attribute__((always_inline))
typedef float vf __attribute__((vector_size(VW * 4)));
typedef int32_t vi __attribute__((vector_size(VW * 4)));
typedef uint32_t vu __attribute__((vector_size(VW * 4)));
typedef double vd __attribute__((vector_size(VW * 4)));

/* m ? a : b for a comparison m */
#define VSEL(m, a, b) ((vf)(((m) & (vi)(a)) | (~(m) & (vi)(b))))

/* *v = x[0..w), zeros after */
VINLINE void vload(vf *v, const float *x, int w)
{
    if (w == VW) {
        memcpy(v, x, sizeof *v);
    } else {
        *v = (vf){0};
        memcpy(v, x, (size_t)w * sizeof(float));
    }
}

/* x[0..w) = *v */
VINLINE void vstore(float *x, const vf *v, int w)
{
    if (w == VW) memcpy(x, v, sizeof *v);
    else memcpy(x, v, (size_t)w * sizeof(float));
}

/* *v = exp(*v): Cephes' expf (range reduction by ln 2 in two parts, a degree-6
 * polynomial, the exponent put in by integer arithmetic), within 2 ulp for
 * inputs in [-87.3, 88]; inputs are clamped to that range. */
VINLINE void vexp(vf *v)
{
    const vf zero = {0}, lo = zero - 87.33654f, hi = zero + 88.0f;
    vf x = *v;
    x = VSEL(x < lo, lo, x);
    x = VSEL(x > hi, hi, x);
    const vf t = x * 1.44269504088896341f + 12582912.0f; /* round(x / ln 2) in the low mantissa bits */
    const vf n = t - 12582912.0f;
    const vf r = (x - n * 0.693359375f) - n * -2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const vu pow2n = ((vu)t - 0x4B400000u + 127u) << 23;
    *v = p * (vf)pow2n;
}

/* The largest of x[0..n), n >= 1 (NaNs skipped). */
VCLONES static float vec_max(const float *x, int n)
{
    vf m = (vf){0} - INFINITY;
    int j = 0;
    for (; j + VW <= n; j += VW) {
        vf v;
        vload(&v, x + j, VW);
        m = VSEL(v > m, v, m);
    }
    float r = m[0];
    for (int l = 1; l < VW; l++) r = m[l] > r ? m[l] : r;
    for (; j < n; j++) r = x[j] > r ? x[j] : r;
    return r;
}

/* y = exp(x * mul - sub) over n (y may be x); returns the sum of y, added in
 * double over 8 lanes combined in a fixed order, then the tail. */
VCLONES static double vec_exp(float *y, const float *x, float mul, float sub, int n)
{
    vd a0 = {0}, a1 = {0};
    int j = 0;
    for (; j + VW <= n; j += VW) {
        vf v;
        vload(&v, x + j, VW);
        v = v * mul - sub;
        vexp(&v);
        vstore(y + j, &v, VW);
        a0 += __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3), vd);
        a1 += __builtin_convertvector(__builtin_shufflevector(v, v, 4, 5, 6, 7), vd);
    }
    a0 += a1;
    double sum = (a0[0] + a0[2]) + (a0[1] + a0[3]);
    if (j < n) {
        vf v;
        vload(&v, x + j, n - j);
        v = v * mul - sub;
        vexp(&v);
        vstore(y + j, &v, n - j);
        for (int l = 0; l < n - j; l++) sum += v[l];
    }
    return sum;
}

/* x *= f over n */
VCLONES static void vec_scale(float *x, float f, int n)
{
    for (int j = 0; j < n; j += VW) {
        const int w = n - j < VW ? n - j : VW;
        vf v;
        vload(&v, x + j, w);
        v = v * f;
        vstore(x + j, &v, w);
    }
}

/* ds = p * (ds - di) * scale over n: the softmax backward, dP in, dS out */
VCLONES static void vec_dsoftmax(float *ds, const float *p, float di, float scale, int n)
{
    for (int j = 0; j < n; j += VW) {
        const int w = n - j < VW ? n - j : VW;
        vf vp, vd_;
        vload(&vp, p + j, w);
        vload(&vd_, ds + j, w);
        vd_ = vp * (vd_ - di) * scale;
        vstore(ds + j, &vd_, w);
    }
}

/* ---- linear layers --------------------------------------------------------- */

void mt_cpu_matmul_isa(mt_pool *p, void *ws, mt_cpu_isa isa, float *y, const float *x, const float *W, const float *b,
                       int T, int K, int N, int accumulate)
{
    /* y (T, N) = x (T, K) @ W^T, W stored (N, K) */
    mt_cpu_gemm_isa(p, ws, isa, 0, 1, T, N, K, x, (size_t)K, W, (size_t)K, y, (size_t)N, b, accumulate);
}

void mt_cpu_matmul(mt_pool *p, void *ws, float *y, const float *x, const float *W, const float *b, int T, int K,
                   int N, int accumulate)
{
    mt_cpu_matmul_isa(p, ws, mt_cpu_isa_best(), y, x, W, b, T, K, N, accumulate);
}

typedef struct {
    float *db;
    const float *dy;
    int T, N;
    size_t nt;
} bias_args;

/* db[n] += dy[0, n] + dy[1, n] + ... for the columns of one range. */
static void bias_bwd_task(void *ctx, size_t task, int thread)
{
    const bias_args *a = ctx;
    size_t lo, hi;
    mt_split_range((size_t)a->N, a->nt, task, 16, &lo, &hi);
    for (int t = 0; t < a->T; t++) {
        const float *restrict dyt = a->dy + (size_t)t * a->N;
        float *restrict db = a->db;
        for (size_t n = lo; n < hi; n++) db[n] += dyt[n];
    }
}

void mt_cpu_matmul_bwd_isa(mt_pool *p, void *ws, mt_cpu_isa isa, float *dx, float *dW, float *db, const float *dy,
                           const float *x, const float *W, int T, int K, int N, int dx_accumulate)
{
    /* dx (T, K) = dy (T, N) @ W (N, K) */
    if (dx) mt_cpu_gemm_isa(p, ws, isa, 0, 0, T, K, N, dy, (size_t)N, W, (size_t)K, dx, (size_t)K, NULL, dx_accumulate);
    /* dW (N, K) += dy^T (N, T) @ x (T, K): the reduction over T in ascending t */
    if (dW) mt_cpu_gemm_isa(p, ws, isa, 1, 0, N, K, T, dy, (size_t)N, x, (size_t)K, dW, (size_t)K, NULL, 1);
    if (db && N > 0) {
        bias_args a = {db, dy, T, N, n_tasks(p, (size_t)T * N, 1 << 16)};
        a.nt = a.nt < ((size_t)N + 15) / 16 ? a.nt : ((size_t)N + 15) / 16;
        mt_pool_run(p, a.nt, bias_bwd_task, &a);
    }
}

void mt_cpu_matmul_bwd(mt_pool *p, void *ws, float *dx, float *dW, float *db, const float *dy, const float *x,
                       const float *W, int T, int K, int N, int dx_accumulate)
{
    mt_cpu_matmul_bwd_isa(p, ws, mt_cpu_isa_best(), dx, dW, db, dy, x, W, T, K, N, dx_accumulate);
}

/* ---- RMSNorm ---------------------------------------------------------------- */

/* rsqrt(mean(x^2) + eps) of one row x (C), the squares summed in double over
 * eight fixed lanes (so the dependency chain is short) combined in order. */
static float row_rstd(const float *x, int C, float eps)
{
    double acc[8] = {0};
    int c = 0;
    for (; c + 8 <= C; c += 8)
        for (int l = 0; l < 8; l++) acc[l] += (double)x[c + l] * x[c + l];
    for (; c < C; c++) acc[0] += (double)x[c] * x[c];
    const double ss = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    return 1.0f / sqrtf((float)(ss / C) + eps);
}

typedef struct {
    float *y, *rstd, *dx, *dw;
    const float *x, *w, *dy;
    const float *rstd_in;
    int T, C;
    float eps, woff;
    size_t nt;
} norm_args;

static void rmsnorm_task(void *ctx, size_t task, int thread)
{
    const norm_args *a = ctx;
    size_t lo, hi;
    mt_split_range((size_t)a->T, a->nt, task, 1, &lo, &hi);
    for (size_t t = lo; t < hi; t++) {
        const float *x = a->x + t * a->C; /* (C) */
        float *y = a->y + t * a->C;       /* (C) */
        const float r = row_rstd(x, a->C, a->eps);
        /* HF: weight * (x * rstd); Gemma: (x * rstd) * (1 + weight), the same product with woff 1 */
        for (int c = 0; c < a->C; c++) y[c] = (a->woff + a->w[c]) * (x[c] * r);
        if (a->rstd) a->rstd[t] = r;
    }
}

void mt_cpu_rmsnorm(mt_pool *p, float *y, float *rstd, const float *x, const float *w, int T, int C, float eps,
                    float woff)
{
    norm_args a = {.y = y, .rstd = rstd, .x = x, .w = w, .T = T, .C = C, .eps = eps, .woff = woff};
    a.nt = n_tasks(p, (size_t)T * C, 1 << 14);
    mt_pool_run(p, a.nt, rmsnorm_task, &a);
}

/* With n = x * r and g = dy * (woff + w):  dx += r * (g - n * mean(g * n)), per row. */
static void rmsnorm_bwd_dx_task(void *ctx, size_t task, int thread)
{
    const norm_args *a = ctx;
    const int C = a->C;
    size_t lo, hi;
    mt_split_range((size_t)a->T, a->nt, task, 1, &lo, &hi);
    for (size_t t = lo; t < hi; t++) {
        const float *x = a->x + t * C, *dy = a->dy + t * C; /* (C) */
        float *dx = a->dx + t * C;                           /* (C) */
        const float r = a->rstd_in ? a->rstd_in[t] : row_rstd(x, C, a->eps);
        double gn = 0.0;
        for (int c = 0; c < C; c++) gn += (double)(dy[c] * (a->woff + a->w[c])) * (double)(x[c] * r);
        const float m = (float)(gn / C);
        for (int c = 0; c < C; c++) dx[c] += r * (dy[c] * (a->woff + a->w[c]) - (x[c] * r) * m);
    }
}

/* dw[c] += sum over t, ascending, of dy[t, c] * n[t, c], for one range of channels. */
static void rmsnorm_bwd_dw_task(void *ctx, size_t task, int thread)
{
    const norm_args *a = ctx;
    const int C = a->C;
    size_t lo, hi;
    mt_split_range((size_t)C, a->nt, task, 16, &lo, &hi);
    for (int t = 0; t < a->T; t++) {
        const float *x = a->x + (size_t)t * C, *dy = a->dy + (size_t)t * C;
        const float r = a->rstd_in ? a->rstd_in[t] : row_rstd(x, C, a->eps);
        for (size_t c = lo; c < hi; c++) a->dw[c] += dy[c] * (x[c] * r);
    }
}

void mt_cpu_rmsnorm_bwd(mt_pool *p, float *dx, float *dw, const float *dy, const float *x, const float *w,
                        const float *rstd, int T, int C, float eps, float woff)
{
    norm_args a = {.dx = dx, .dw = dw, .x = x, .w = w, .dy = dy, .rstd_in = rstd, .T = T, .C = C, .eps = eps,
                   .woff = woff};
    if (dx) {
        a.nt = n_tasks(p, (size_t)T * C, 1 << 14);
        mt_pool_run(p, a.nt, rmsnorm_bwd_dx_task, &a);
    }
    if (dw && C > 0) {
        a.nt = n_tasks(p, (size_t)T * C, 1 << 14);
        a.nt = a.nt < ((size_t)C + 15) / 16 ? a.nt : ((size_t)C + 15) / 16;
        mt_pool_run(p, a.nt, rmsnorm_bwd_dw_task, &a);
    }
}

/* ---- RoPE ---------------------------------------------------------------------- */

typedef struct {
    float *x;
    const int32_t *pos;
    const float *inv_freq;
    int T, nh, D, off, rd, il, inverse;
    float scale;
    size_t nt;
} rope_args;

static void rope_task(void *ctx, size_t task, int thread)
{
    const rope_args *a = ctx;
    const int half = a->rd / 2;
    size_t lo, hi;
    mt_split_range((size_t)a->T, a->nt, task, 1, &lo, &hi);
    for (size_t t = lo; t < hi; t++) {
        float *xt = a->x + t * a->nh * a->D + a->off; /* (nh, D), from each head's first rotary dimension */
        for (int i = 0; i < half; i++) {
            const float ang = (float)a->pos[t] * a->inv_freq[i];
            const float c = cosf(ang) * a->scale, s = (a->inverse ? -sinf(ang) : sinf(ang)) * a->scale;
            const int i0 = a->il ? 2 * i : i, i1 = a->il ? 2 * i + 1 : i + half; /* pair i */
            for (int h = 0; h < a->nh; h++) {
                float *xh = xt + (size_t)h * a->D;
                const float x0 = xh[i0], x1 = xh[i1];
                xh[i0] = x0 * c - x1 * s;
                xh[i1] = x1 * c + x0 * s;
            }
        }
    }
}

void mt_cpu_rope_at(mt_pool *p, float *x, const int32_t *pos, const float *inv_freq, int T, int nh, int D, int off,
                    int rd, int interleaved, float scale, int inverse)
{
    rope_args a = {x, pos, inv_freq, T, nh, D, off, rd, interleaved != 0, inverse, scale,
                   n_tasks(p, (size_t)T * nh * rd, 1 << 14)};
    mt_pool_run(p, a.nt, rope_task, &a);
}

void mt_cpu_rope(mt_pool *p, float *x, const int32_t *pos, const float *inv_freq, int T, int nh, int D, int rd,
                 float scale, int inverse)
{
    mt_cpu_rope_at(p, x, pos, inv_freq, T, nh, D, 0, rd, 0, scale, inverse);
}

/* ---- attention ----------------------------------------------------------------- */

typedef struct {
    float *out, *lse, *dq, *dk, *dv;
    const float *q, *k, *v, *dout, *out_in, *lse_in;
    const int32_t *doc_start; /* (B, S) or NULL: the first key each query may see */
    int B, S, H, Hkv, D, nqb;
    float scale, softcap;
    float *ws;        /* 64-byte aligned */
    size_t ws_stride; /* floats per thread */
} att_args;

/* One block of query rows [i0, i0 + rows) of head h in batch b against keys
 * [0, i0 + rows): scores and probabilities in sc (rows, nk), nk = i0 + rows. */
static void att_fwd_task(void *ctx, size_t task, int thread)
{
    const att_args *a = ctx;
    const int H = a->H, Hkv = a->Hkv, D = a->D, S = a->S;
    const int qb = (int)(task % (size_t)a->nqb), h = (int)(task / (size_t)a->nqb % (size_t)H);
    const int b = (int)(task / ((size_t)a->nqb * H)), g = h / (H / Hkv);
    const int i0 = qb * ATT_BQ, rows = S - i0 < ATT_BQ ? S - i0 : ATT_BQ;
    const int32_t *st = a->doc_start ? a->doc_start + (size_t)b * S : NULL;
    /* keys [k0, i0 + rows): no row of the block sees a key before its first row's document */
    const int k0 = st ? st[i0] : 0, nk = i0 + rows - k0;
    float *gws = a->ws + (size_t)thread * a->ws_stride;
    float *sc = gws + mt_cpu_gemm_ws_bytes() / sizeof(float);         /* (rows, nk) */
    const size_t ldq = (size_t)H * D, ldkv = (size_t)Hkv * D;
    const float *q = a->q + ((size_t)(b * S + i0) * H + h) * D;       /* (rows, D), stride ldq */
    const float *k = a->k + ((size_t)(b * S + k0) * Hkv + g) * D;     /* (nk, D), stride ldkv */
    const float *v = a->v + ((size_t)(b * S + k0) * Hkv + g) * D;     /* (nk, D), stride ldkv */
    float *out = a->out + ((size_t)(b * S + i0) * H + h) * D;         /* (rows, D), stride ldq */
    float *lse = a->lse + ((size_t)b * H + h) * S + i0;               /* (rows) */

    mt_cpu_gemm(NULL, gws, 0, 1, rows, nk, D, q, ldq, k, ldkv, sc, (size_t)nk, NULL, 0);
    for (int r = 0; r < rows; r++) {
        float *s = sc + (size_t)r * nk;
        const int lo = st ? st[i0 + r] - k0 : 0; /* the row's keys: [lo, n) of the block's */
        const int n = i0 + r + 1 - k0;           /* causal */
        float mul = a->scale;
        if (a->softcap > 0.0f) { /* Gemma 2: cap * tanh(scale * s / cap), in transformers' order */
            for (int j = lo; j < n; j++) s[j] = tanhf(s[j] * a->scale / a->softcap) * a->softcap;
            mul = 1.0f;
        }
        const float m = vec_max(s + lo, n - lo) * mul; /* mul > 0 */
        const double sum = vec_exp(s + lo, s + lo, mul, m, n - lo);
        vec_scale(s + lo, (float)(1.0 / sum), n - lo);
        memset(s, 0, (size_t)lo * sizeof(float));
        memset(s + n, 0, (size_t)(nk - n) * sizeof(float));
        lse[r] = m + (float)log(sum);
    }
    mt_cpu_gemm(NULL, gws, 0, 0, rows, D, nk, sc, (size_t)nk, v, ldkv, out, ldq, NULL, 0);
}

void mt_cpu_attention_docs(mt_pool *p, void *ws, float *out, float *lse, const float *q, const float *k,
                           const float *v, const int32_t *doc_start, int B, int S, int H, int Hkv, int D, float scale,
                           float softcap)
{
    if (B <= 0 || S <= 0 || H <= 0) return;
    att_args a = {.out = out, .lse = lse, .q = q, .k = k, .v = v, .doc_start = doc_start, .B = B, .S = S, .H = H,
                  .Hkv = Hkv, .D = D, .nqb = (S + ATT_BQ - 1) / ATT_BQ, .scale = scale, .softcap = softcap,
                  .ws = mt_cpu_ws_align(ws),
                  .ws_stride = ws_thread_bytes(S) / sizeof(float)};
    mt_pool_run(p, (size_t)B * H * a.nqb, att_fwd_task, &a);
}

void mt_cpu_attention(mt_pool *p, void *ws, float *out, float *lse, const float *q, const float *k, const float *v,
                      int B, int S, int H, int Hkv, int D, float scale)
{
    mt_cpu_attention_docs(p, ws, out, lse, q, k, v, NULL, B, S, H, Hkv, D, scale, 0.0f);
}

/* All of kv head g in batch b: dk and dv rows are owned by this task and
 * summed over the query heads of the group, then the query blocks, in order.
 * Per block: P = exp(scale * q k^T - lse), dP = dout v^T,
 * dS = P * (dP - rowsum(dout * out)) * scale, dq = dS k, dk += dS^T q, dv += P^T dout. */
static void att_bwd_task(void *ctx, size_t task, int thread)
{
    const att_args *a = ctx;
    const int H = a->H, Hkv = a->Hkv, D = a->D, S = a->S, rep = H / Hkv;
    const int b = (int)(task / (size_t)Hkv), g = (int)(task % (size_t)Hkv);
    float *gws = a->ws + (size_t)thread * a->ws_stride;
    float *pb = gws + mt_cpu_gemm_ws_bytes() / sizeof(float); /* P (rows, nk) */
    float *ds = pb + (size_t)ATT_BQ * S;                         /* dP, then dS (rows, nk) */
    const size_t ldq = (size_t)H * D, ldkv = (size_t)Hkv * D;
    const size_t kv0 = ((size_t)b * S * Hkv + g) * D;
    const float *k = a->k + kv0, *v = a->v + kv0; /* (S, D), stride ldkv */
    float *dk = a->dk + kv0, *dv = a->dv + kv0;    /* (S, D), stride ldkv */

    for (int j = 0; j < S; j++) {
        memset(dk + j * ldkv, 0, (size_t)D * sizeof(float));
        memset(dv + j * ldkv, 0, (size_t)D * sizeof(float));
    }
    const int32_t *st = a->doc_start ? a->doc_start + (size_t)b * S : NULL;
    for (int h = g * rep; h < (g + 1) * rep; h++) {
        for (int i0 = 0; i0 < S; i0 += ATT_BQ) {
            const int rows = S - i0 < ATT_BQ ? S - i0 : ATT_BQ;
            const int k0 = st ? st[i0] : 0, nk = i0 + rows - k0; /* the block's keys [k0, i0 + rows) */
            const size_t q0 = ((size_t)(b * S + i0) * H + h) * D;
            const float *q = a->q + q0, *dout = a->dout + q0, *out = a->out_in + q0; /* (rows, D), stride ldq */
            float *dq = a->dq + q0;                                                   /* (rows, D), stride ldq */
            const float *lse = a->lse_in + ((size_t)b * H + h) * S + i0;              /* (rows) */
            const float *kb = k + (size_t)k0 * ldkv, *vb = v + (size_t)k0 * ldkv;
            float *dkb = dk + (size_t)k0 * ldkv, *dvb = dv + (size_t)k0 * ldkv;

            mt_cpu_gemm(NULL, gws, 0, 1, rows, nk, D, q, ldq, kb, ldkv, pb, (size_t)nk, NULL, 0);
            mt_cpu_gemm(NULL, gws, 0, 1, rows, nk, D, dout, ldq, vb, ldkv, ds, (size_t)nk, NULL, 0);
            for (int r = 0; r < rows; r++) {
                float *pr = pb + (size_t)r * nk, *dsr = ds + (size_t)r * nk;
                const int lo = st ? st[i0 + r] - k0 : 0, n = i0 + r + 1 - k0; /* the row's keys [lo, n) */
                double di = 0.0;
                for (int d = 0; d < D; d++) di += (double)dout[r * ldq + d] * out[r * ldq + d];
                if (a->softcap > 0.0f) {
                    /* c = cap tanh(u / cap) of u = scale s: dS gets dc/du = 1 - tanh^2 */
                    for (int j = lo; j < n; j++) {
                        const float t = tanhf(pr[j] * a->scale / a->softcap);
                        const float pj = expf(t * a->softcap - lse[r]);
                        dsr[j] = pj * (dsr[j] - (float)di) * (1.0f - t * t) * a->scale;
                        pr[j] = pj;
                    }
                } else {
                    vec_exp(pr + lo, pr + lo, a->scale, lse[r], n - lo);
                    vec_dsoftmax(dsr + lo, pr + lo, (float)di, a->scale, n - lo);
                }
                memset(pr, 0, (size_t)lo * sizeof(float));
                memset(dsr, 0, (size_t)lo * sizeof(float));
                memset(pr + n, 0, (size_t)(nk - n) * sizeof(float));
                memset(dsr + n, 0, (size_t)(nk - n) * sizeof(float));
            }
            mt_cpu_gemm(NULL, gws, 0, 0, rows, D, nk, ds, (size_t)nk, kb, ldkv, dq, ldq, NULL, 0);
            mt_cpu_gemm(NULL, gws, 1, 0, nk, D, rows, ds, (size_t)nk, q, ldq, dkb, ldkv, NULL, 1);
            mt_cpu_gemm(NULL, gws, 1, 0, nk, D, rows, pb, (size_t)nk, dout, ldq, dvb, ldkv, NULL, 1);
        }
    }
}

void mt_cpu_attention_bwd_docs(mt_pool *p, void *ws, float *dq, float *dk, float *dv, const float *dout,
                               const float *out, const float *lse, const float *q, const float *k, const float *v,
                               const int32_t *doc_start, int B, int S, int H, int Hkv, int D, float scale,
                               float softcap)
{
    if (B <= 0 || S <= 0 || H <= 0) return;
    att_args a = {.dq = dq, .dk = dk, .dv = dv, .q = q, .k = k, .v = v, .dout = dout, .out_in = out, .lse_in = lse,
                  .doc_start = doc_start, .B = B, .S = S, .H = H, .Hkv = Hkv, .D = D,
                  .nqb = (S + ATT_BQ - 1) / ATT_BQ, .scale = scale, .softcap = softcap, .ws = mt_cpu_ws_align(ws),
                  .ws_stride = ws_thread_bytes(S) / sizeof(float)};
    mt_pool_run(p, (size_t)B * Hkv, att_bwd_task, &a);
}

void mt_cpu_attention_bwd(mt_pool *p, void *ws, float *dq, float *dk, float *dv, const float *dout, const float *out,
                          const float *lse, const float *q, const float *k, const float *v, int B, int S, int H,
                          int Hkv, int D, float scale)
{
    mt_cpu_attention_bwd_docs(p, ws, dq, dk, dv, dout, out, lse, q, k, v, NULL, B, S, H, Hkv, D, scale, 0.0f);
}

/* ---- gated activations: SwiGLU and GeGLU ------------------------------------------- */

typedef struct {
    float *out, *dgate, *dup;
    const float *gate, *up, *dout;
    size_t n, nt;
    int act; /* MT_GLU_SILU or MT_GLU_GELU_TANH */
} glu_args;

/* out = g / (1 + exp(-g)) * u over n */
VCLONES static void vec_swiglu(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t j = 0; j < n; j += VW) {
        const int w = n - j < VW ? (int)(n - j) : VW;
        vf g, u, e;
        vload(&g, gate + j, w);
        vload(&u, up + j, w);
        e = -g;
        vexp(&e);
        g = g / (1.0f + e) * u;
        vstore(out + j, &g, w);
    }
}

/* dgate = dout * u * silu'(g), dup = dout * silu(g) over n, with
 * s = sigmoid(g) and silu'(g) = s (1 + g (1 - s)) */
VCLONES static void vec_swiglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up,
                                   size_t n)
{
    for (size_t j = 0; j < n; j += VW) {
        const int w = n - j < VW ? (int)(n - j) : VW;
        vf g, u, d, s;
        vload(&g, gate + j, w);
        vload(&u, up + j, w);
        vload(&d, dout + j, w);
        s = -g;
        vexp(&s);
        s = 1.0f / (1.0f + s);
        const vf dg = d * u * (s * (1.0f + g * (1.0f - s))), du = d * (g * s);
        vstore(dgate + j, &dg, w);
        vstore(dup + j, &du, w);
    }
}

#define GELU_K0 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_K1 0.044715f

/* out = 0.5 g (1 + tanh(k0 (g + k1 g^3))) * u, as torch's gelu(approximate="tanh") */
static void geglu(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i], t = tanhf(GELU_K0 * (g + GELU_K1 * g * g * g));
        out[i] = 0.5f * g * (1.0f + t) * up[i];
    }
}

/* d gelu / dg = 0.5 (1 + t) + 0.5 g (1 - t^2) k0 (1 + 3 k1 g^2) */
static void geglu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float g = gate[i], t = tanhf(GELU_K0 * (g + GELU_K1 * g * g * g));
        const float gelu = 0.5f * g * (1.0f + t);
        const float dgelu = 0.5f * (1.0f + t) + 0.5f * g * (1.0f - t * t) * GELU_K0 * (1.0f + 3.0f * GELU_K1 * g * g);
        dgate[i] = dout[i] * up[i] * dgelu;
        dup[i] = dout[i] * gelu;
    }
}

/* GPT-OSS: g = min(gate, L), u = clamp(up, -L, L), out = (u + 1) g sigmoid(alpha g), in transformers' order
 * of roundings (sigmoid(g alpha), times g, then times u + 1) */
static void gptoss_glu(float *out, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float g = fminf(gate[i], MT_GPTOSS_LIMIT), u = fminf(fmaxf(up[i], -MT_GPTOSS_LIMIT), MT_GPTOSS_LIMIT);
        const float s = 1.0f / (1.0f + expf(-(g * MT_GPTOSS_ALPHA)));
        out[i] = (u + 1.0f) * (g * s);
    }
}

/* d/dg g sigmoid(alpha g) = s + alpha g s (1 - s); torch.clamp passes the gradient where the input is
 * inside its bounds, ends included */
static void gptoss_glu_bwd(float *dgate, float *dup, const float *dout, const float *gate, const float *up, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const float gi = gate[i], ui = up[i];
        const float g = fminf(gi, MT_GPTOSS_LIMIT), u = fminf(fmaxf(ui, -MT_GPTOSS_LIMIT), MT_GPTOSS_LIMIT);
        const float s = 1.0f / (1.0f + expf(-(g * MT_GPTOSS_ALPHA)));
        const float glu = g * s, dglu = s + MT_GPTOSS_ALPHA * g * s * (1.0f - s);
        dgate[i] = gi <= MT_GPTOSS_LIMIT ? dout[i] * (u + 1.0f) * dglu : 0.0f;
        dup[i] = ui >= -MT_GPTOSS_LIMIT && ui <= MT_GPTOSS_LIMIT ? dout[i] * glu : 0.0f;
    }
}

static void glu_task(void *ctx, size_t task, int thread)
{
    const glu_args *a = ctx;
    size_t lo, hi;
    mt_split_range(a->n, a->nt, task, 16, &lo, &hi);
    (a->act == MT_GLU_GELU_TANH ? geglu : a->act == MT_GLU_GPTOSS ? gptoss_glu : vec_swiglu)(a->out + lo, a->gate + lo,
                                                                                          a->up + lo, hi - lo);
}

static void glu_bwd_task(void *ctx, size_t task, int thread)
{
    const glu_args *a = ctx;
    size_t lo, hi;
    mt_split_range(a->n, a->nt, task, 16, &lo, &hi);
    (a->act == MT_GLU_GELU_TANH ? geglu_bwd : a->act == MT_GLU_GPTOSS ? gptoss_glu_bwd : vec_swiglu_bwd)(
        a->dgate + lo, a->dup + lo, a->dout + lo, a->gate + lo, a->up + lo, hi - lo);
}

void mt_cpu_glu(mt_pool *p, int act, float *out, const float *gate, const float *up, size_t n)
{
    glu_args a = {.out = out, .gate = gate, .up = up, .n = n, .nt = n_tasks(p, n, 1 << 14), .act = act};
    mt_pool_run(p, a.nt, glu_task, &a);
}

void mt_cpu_glu_bwd(mt_pool *p, int act, float *dgate, float *dup, const float *dout, const float *gate,
                    const float *up, size_t n)
{
    glu_args a = {.dgate = dgate, .dup = dup, .dout = dout, .gate = gate, .up = up, .n = n,
                  .nt = n_tasks(p, n, 1 << 14), .act = act};
    mt_pool_run(p, a.nt, glu_bwd_task, &a);
}

/* ---- attention sinks ----------------------------------------------------------- */

void mt_cpu_attn_sink(float *out, float *lse, const float *sinks, int B, int S, int H, int D)
{
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int s = 0; s < S; s++) {
                float *l = lse + ((size_t)b * H + h) * S + s, *o = out + (((size_t)b * S + s) * H + h) * D;
                const double m = fmax((double)*l, (double)sinks[h]);
                const float r = (float)(1.0 / (1.0 + exp((double)sinks[h] - (double)*l)));
                for (int d = 0; d < D; d++) o[d] *= r;
                *l = (float)(m + log(exp((double)*l - m) + exp((double)sinks[h] - m)));
            }
}

void mt_cpu_attn_sink_bwd(float *dsink, const float *dout, const float *out, const float *lse, const float *sinks,
                          int B, int S, int H, int D)
{
    for (int h = 0; h < H; h++) {
        double acc = 0.0;
        for (int b = 0; b < B; b++)
            for (int s = 0; s < S; s++) {
                const size_t row = (((size_t)b * S + s) * H + h) * D;
                double dot = 0.0;
                for (int d = 0; d < D; d++) dot += (double)dout[row + d] * out[row + d];
                acc += exp((double)sinks[h] - (double)lse[((size_t)b * H + h) * S + s]) * dot;
            }
        dsink[h] -= (float)acc;
    }
}

void mt_cpu_softcap(float *x, size_t n, float cap)
{
    for (size_t i = 0; i < n; i++) x[i] = tanhf(x[i] / cap) * cap;
}

/* ---- attention temperature (Llama 4) --------------------------------------------------- */

float mt_cpu_attn_temperature_factor(int i, float floor_scale, float scale)
{
    const float p = (float)i + 1.0f, q = floorf(p / floor_scale);
    const float l = (float)log1p((double)q); /* the correctly rounded log1pf (cpu_ops.h) */
    return l * scale + 1.0f;                 /* two fp32 roundings: no contraction under -std=c11 */
}

typedef struct {
    float *x;
    int T, seq_len, n;
    float floor_scale, scale;
    size_t nt;
} temp_args;

static void temperature_task(void *ctx, size_t task, int thread)
{
    const temp_args *a = ctx;
    size_t lo, hi;
    mt_split_range((size_t)a->T, a->nt, task, 1, &lo, &hi);
    for (size_t t = lo; t < hi; t++) {
        const float f = mt_cpu_attn_temperature_factor((int)(t % (size_t)a->seq_len), a->floor_scale, a->scale);
        float *restrict xr = a->x + t * (size_t)a->n;
        for (int c = 0; c < a->n; c++) xr[c] *= f;
    }
}

void mt_cpu_attn_temperature(mt_pool *p, float *x, int T, int seq_len, int n, float floor_scale, float scale)
{
    if (T <= 0 || n <= 0 || seq_len <= 0) return;
    temp_args a = {.x = x, .T = T, .seq_len = seq_len, .n = n, .floor_scale = floor_scale, .scale = scale,
                   .nt = n_tasks(p, (size_t)T * n, 1 << 15)};
    mt_pool_run(p, a.nt, temperature_task, &a);
}

/* ---- embedding ------------------------------------------------------------------ */

typedef struct {
    float *out, *dwte;
    const int32_t *tokens;
    const float *wte, *dout;
    int T, C;
    float scale;
    int pad; /* embedding_bwd: the padding row, -1 none */
    size_t nt;
} emb_args;

static void embedding_task(void *ctx, size_t task, int thread)
{
    const emb_args *a = ctx;
    size_t lo, hi;
    mt_split_range((size_t)a->T, a->nt, task, 1, &lo, &hi);
    for (size_t t = lo; t < hi; t++) {
        float *restrict dst = a->out + t * a->C;
        const float *restrict src = a->wte + (size_t)a->tokens[t] * a->C;
        for (int c = 0; c < a->C; c++) dst[c] = src[c] * a->scale; /* x 1 is exact */
    }
}

/* One range of channels, all tokens in ascending t. */
static void embedding_bwd_task(void *ctx, size_t task, int thread)
{
    const emb_args *a = ctx;
    size_t lo, hi;
    mt_split_range((size_t)a->C, a->nt, task, 16, &lo, &hi);
    for (int t = 0; t < a->T; t++) {
        if (a->tokens[t] == a->pad) continue; /* nn.Embedding's padding_idx: no gradient */
        float *restrict dst = a->dwte + (size_t)a->tokens[t] * a->C;
        const float *restrict src = a->dout + (size_t)t * a->C;
        for (size_t c = lo; c < hi; c++) dst[c] += src[c] * a->scale;
    }
}

void mt_cpu_embedding(mt_pool *p, float *out, const int32_t *tokens, const float *wte, int T, int C, float scale)
{
    emb_args a = {.out = out, .tokens = tokens, .wte = wte, .T = T, .C = C, .scale = scale,
                  .nt = n_tasks(p, (size_t)T * C, 1 << 15)};
    mt_pool_run(p, a.nt, embedding_task, &a);
}

void mt_cpu_embedding_bwd(mt_pool *p, float *dwte, const int32_t *tokens, const float *dout, int T, int C, int V,
                          float scale, int pad)
{
    (void)V;
    if (C <= 0) return;
    emb_args a = {.dwte = dwte, .tokens = tokens, .dout = dout, .T = T, .C = C, .scale = scale, .pad = pad,
                  .nt = n_tasks(p, (size_t)T * C, 1 << 15)};
    a.nt = a.nt < ((size_t)C + 15) / 16 ? a.nt : ((size_t)C + 15) / 16;
    mt_pool_run(p, a.nt, embedding_bwd_task, &a);
}

/* ---- cross-entropy --------------------------------------------------------------- */

#define CE_CHUNKS 64 /* fixed row chunks: the loss is summed per chunk, then over chunks */

typedef struct {
    float *logits;
    const int32_t *targets;
    int n, V, ignore_index;
    float dscale, softcap;
    double loss[CE_CHUNKS];
    int count[CE_CHUNKS];
} ce_args;

static void ce_task(void *ctx, size_t task, int thread)
{
    ce_args *a = ctx;
    size_t lo, hi;
    mt_split_range((size_t)a->n, CE_CHUNKS, task, 1, &lo, &hi);
    double loss = 0.0;
    int count = 0;
    for (size_t r = lo; r < hi; r++) {
        float *x = a->logits + r * a->V; /* (V) */
        const int32_t tgt = a->targets[r];
        if (tgt == a->ignore_index) {
            memset(x, 0, (size_t)a->V * sizeof(float));
            continue;
        }
        const float cap = a->softcap;
        if (cap > 0.0f) /* Gemma 2: logits / cap, tanh, * cap, in transformers' order */
            for (int i = 0; i < a->V; i++) x[i] = tanhf(x[i] / cap) * cap;
        const float m = vec_max(x, a->V), xt = x[tgt];
        if (cap > 0.0f) {
            /* the gradient through the cap: (softmax - onehot) * dscale * (1 - tanh^2) */
            double sum = 0.0;
            for (int i = 0; i < a->V; i++) sum += exp((double)x[i] - m);
            loss += (double)m + log(sum) - (double)xt;
            count++;
            for (int i = 0; i < a->V; i++) {
                const float t = x[i] / cap, pi = (float)(exp((double)x[i] - m) / sum);
                x[i] = (pi - (i == tgt ? 1.0f : 0.0f)) * a->dscale * (1.0f - t * t);
            }
            continue;
        }
        const double sum = vec_exp(x, x, 1.0f, m, a->V);
        loss += (double)m + log(sum) - (double)xt;
        count++;
        vec_scale(x, (float)(a->dscale / sum), a->V); /* softmax * dscale */
        x[tgt] -= a->dscale;
    }
    a->loss[task] = loss;
    a->count[task] = count;
}

double mt_cpu_cross_entropy(mt_pool *p, float *logits, const int32_t *targets, int n, int V, float dscale,
                            float softcap, int ignore_index, int *count)
{
    ce_args a = {.logits = logits, .targets = targets, .n = n, .V = V, .ignore_index = ignore_index, .dscale = dscale,
                 .softcap = softcap};
    mt_pool_run(p, CE_CHUNKS, ce_task, &a);
    double loss = 0.0;
    int c = 0;
    for (int i = 0; i < CE_CHUNKS; i++) {
        loss += a.loss[i];
        c += a.count[i];
    }
    if (count) *count = c;
    return loss;
}

/* ---- add ---------------------------------------------------------------------------- */

typedef struct {
    float *y;
    const float *a, *b;
    size_t n, nt;
} add_args;

static void add_task(void *ctx, size_t task, int thread)
{
    const add_args *a = ctx;
    size_t lo, hi;
    mt_split_range(a->n, a->nt, task, 16, &lo, &hi);
    for (size_t i = lo; i < hi; i++) a->y[i] = a->a[i] + a->b[i];
}

void mt_cpu_add(mt_pool *p, float *y, const float *a, const float *b, size_t n)
{
    add_args args = {y, a, b, n, n_tasks(p, n, 1 << 15)};
    mt_pool_run(p, args.nt, add_task, &args);
}

/* ---- columns (multi-head latent attention's pieces of keys and values) ---------------- */

typedef struct {
    float *dst;
    const float *src;
    int dld, doff, sld, soff, rows, w, k; /* k: copy_cols' rep, sum_cols' n */
    size_t nt;
} cols_args;

static void copy_cols_task(void *ctx, size_t task, int thread)
{
    const cols_args *a = ctx;
    size_t lo, hi;
    mt_split_range((size_t)a->rows, a->nt, task, 1, &lo, &hi);
    for (size_t r = lo; r < hi; r++)
        memcpy(a->dst + r * a->dld + a->doff, a->src + r / (size_t)a->k * a->sld + a->soff, (size_t)a->w * sizeof(float));
}

static void sum_cols_task(void *ctx, size_t task, int thread)
{
    const cols_args *a = ctx;
    size_t lo, hi;
    mt_split_range((size_t)a->rows, a->nt, task, 1, &lo, &hi);
    for (size_t r = lo; r < hi; r++) {
        float *d = a->dst + r * a->dld + a->doff;
        const float *s = a->src + r * (size_t)a->k * a->sld + a->soff; /* (n, sld): rows r n .. r n + n - 1 */
        for (int j = 0; j < a->w; j++) {
            float acc = 0.0f;
            for (int i = 0; i < a->k; i++) acc += s[(size_t)i * a->sld + j];
            d[j] = acc;
        }
    }
}

void mt_cpu_copy_cols(mt_pool *p, float *dst, int dld, int doff, const float *src, int sld, int soff, int rows, int w,
                      int rep)
{
    if (rows <= 0 || w <= 0 || rep <= 0) return;
    cols_args a = {dst, src, dld, doff, sld, soff, rows, w, rep, n_tasks(p, (size_t)rows * w, 1 << 15)};
    mt_pool_run(p, a.nt, copy_cols_task, &a);
}

void mt_cpu_sum_cols(mt_pool *p, float *dst, int dld, int doff, const float *src, int sld, int soff, int rows, int w,
                     int n)
{
    if (rows <= 0 || w <= 0) return;
    cols_args a = {dst, src, dld, doff, sld, soff, rows, w, n, n_tasks(p, (size_t)rows * w * (n > 1 ? n : 1), 1 << 15)};
    mt_pool_run(p, a.nt, sum_cols_task, &a);
}

/* ---- precision changes ------------------------------------------------------------- */

typedef struct {
    void *y;
    const void *x;
    int y_bf16, x_bf16;
    size_t n, nt;
} convert_args;

static void convert_task(void *ctx, size_t task, int thread)
{
    const convert_args *a = ctx;
    size_t lo, hi;
    mt_split_range(a->n, a->nt, task, 16, &lo, &hi);
    if (a->x_bf16 && !a->y_bf16) {
        const uint16_t *x = a->x;
        float *y = a->y;
        for (size_t i = lo; i < hi; i++) y[i] = mt_bf16_to_f32(x[i]);
    } else if (!a->x_bf16 && a->y_bf16) {
        const float *x = a->x;
        uint16_t *y = a->y;
        for (size_t i = lo; i < hi; i++) y[i] = mt_f32_to_bf16(x[i]);
    } else {
        const size_t es = a->x_bf16 ? 2 : 4;
        memcpy((char *)a->y + lo * es, (const char *)a->x + lo * es, (hi - lo) * es);
    }
}

void mt_cpu_convert(mt_pool *p, void *y, int y_bf16, const void *x, int x_bf16, size_t n)
{
    convert_args args = {y, x, y_bf16 != 0, x_bf16 != 0, n, n_tasks(p, n, 1 << 16)};
    mt_pool_run(p, args.nt, convert_task, &args);
}
