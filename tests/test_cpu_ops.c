/* The CPU backend's layer operations (src/cpu/cpu_ops.h):
 * - forwards against double-precision references written here;
 * - backwards against central finite differences of the forwards: with
 *   L = sum(out * R) for a fixed random R (accumulated in double), every
 *   input element (a random subset of 150 for the larger ones) is moved by
 *   +-h and (L+ - L-) / (2h) compared with the analytic gradient;
 * - bit-identical results with pools of 1, 2 and 3 threads.
 *
 * Finite-difference tolerance: |analytic - numeric| <= 1e-3 * max(1, |numeric|).
 * With h = 1e-2 the central difference has a truncation error of about
 * h^2 |f'''| / 6 ~ 2e-5 for the smooth ops here (exactly 0 for the linear
 * ones: matmul, rope, embedding), and a rounding error of about
 * u * |the part of L that moved| / h ~ 6e-8 * 10 / 1e-2 ~ 6e-5, since the
 * forward is fp32 (u = 2^-24) and only the outputs that depend on the moved
 * input change. 1e-3 leaves a margin of ~10 over both; a wrong gradient
 * (a missing term, a wrong index) is off by O(1). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "cpu/cpu_moe.h"
#include "cpu/cpu_ops.h"
#include "model/template.h"
#include "rng.h"

#define FD_H 1e-2
#define FD_TOL 1e-3
#define FD_SAMPLES 150

/* ---- helpers ------------------------------------------------------------------ */


static float uniform(void) { return (float)((double)(next_u64() >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f; }

/* n floats, uniform in [-scale, scale) */
static float *rand_vec(size_t n, float scale)
{
    float *x = malloc(n * sizeof(float));
    cr_assert(x);
    for (size_t i = 0; i < n; i++) x[i] = uniform() * scale;
    return x;
}

static float *copy_vec(const float *x, size_t n)
{
    float *y = malloc(n * sizeof(float));
    cr_assert(y);
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double dot_d(const float *a, const float *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * b[i];
    return s;
}

static void *ws_alloc(int n_threads, int S)
{
    void *ws = malloc(mt_cpu_ws_size(n_threads, S));
    cr_assert(ws);
    return ws;
}

/* The forward under test, as L(inputs) = sum(out * R) in double. */
typedef double (*loss_fn)(void *ctx);

/* Central differences of L with respect to x[0..n) (all of them, or
 * FD_SAMPLES at random) against grad. */
static void fd_check(const char *what, loss_fn L, void *ctx, float *x, const float *grad, size_t n)
{
    const size_t m = n <= FD_SAMPLES ? n : FD_SAMPLES;
    for (size_t s = 0; s < m; s++) {
        const size_t i = n <= FD_SAMPLES ? s : (size_t)(next_u64() % n);
        const float x0 = x[i], xp = (float)(x0 + FD_H), xm = (float)(x0 - FD_H);
        x[i] = xp;
        const double lp = L(ctx);
        x[i] = xm;
        const double lm = L(ctx);
        x[i] = x0;
        const double num = (lp - lm) / ((double)xp - (double)xm);
        cr_expect(fabs(grad[i] - num) <= FD_TOL * fmax(1.0, fabs(num)), "%s[%zu]: analytic %.7g, numeric %.7g", what,
                  i, grad[i], num);
    }
}

static void expect_same(const char *what, const float *a, const float *b, size_t n, int threads)
{
    cr_expect(memcmp(a, b, n * sizeof(float)) == 0, "%s: %d threads differ from 1 thread", what, threads);
}

/* ---- matmul ------------------------------------------------------------------------ */

/* y = (acc ? y0 : 0) + b + x W^T against double, within Higham's bound for a
 * float sum of K products: |err| <= gamma_{K+2} * sum |terms|, gamma_n = n u / (1 - n u).
 * isa < 0: mt_cpu_matmul (the library's choice), else mt_cpu_matmul_isa. */
static void check_matmul_fwd(int isa, int T, int K, int N, int with_bias, int accumulate)
{
    float *x = rand_vec((size_t)T * K, 1.0f), *W = rand_vec((size_t)N * K, 1.0f), *b = rand_vec((size_t)N, 1.0f);
    float *y = rand_vec((size_t)T * N, 1.0f), *y0 = copy_vec(y, (size_t)T * N);
    void *ws = ws_alloc(1, 0);
    if (isa < 0) mt_cpu_matmul(NULL, ws, y, x, W, with_bias ? b : NULL, T, K, N, accumulate);
    else mt_cpu_matmul_isa(NULL, ws, (mt_cpu_isa)isa, y, x, W, with_bias ? b : NULL, T, K, N, accumulate);
    const double u = ldexp(1.0, -24), gamma = (K + 2) * u / (1 - (K + 2) * u);
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double ref = accumulate ? y0[t * N + n] : 0.0, mag = fabs(ref);
            if (with_bias) ref += b[n], mag += fabs(b[n]);
            for (int k = 0; k < K; k++) {
                ref += (double)x[t * K + k] * W[n * K + k];
                mag += fabs((double)x[t * K + k] * W[n * K + k]);
            }
            cr_expect(fabs(y[t * N + n] - ref) <= gamma * mag,
                      "isa %d %dx%dx%d bias %d acc %d: y[%d,%d] = %.8g, ref %.8g", isa, T, K, N, with_bias, accumulate,
                      t, n, y[t * N + n], ref);
        }
    free(x); free(W); free(b); free(y); free(y0); free(ws);
}

static void matmul_fwd_shapes(int isa)
{
    check_matmul_fwd(isa, 5, 7, 3, 0, 0);
    check_matmul_fwd(isa, 5, 7, 3, 1, 1);
    check_matmul_fwd(isa, 1, 1, 1, 1, 0);
    check_matmul_fwd(isa, 129, 65, 47, 1, 0);
    check_matmul_fwd(isa, 129, 65, 47, 1, 1);
    check_matmul_fwd(isa, 129, 65, 47, 0, 1);
    check_matmul_fwd(isa, 37, 600, 70, 1, 1); /* K over several reduction chunks */
    check_matmul_fwd(isa, 37, 600, 70, 0, 0);
    check_matmul_fwd(isa, 400, 33, 300, 0, 0); /* several tiles both ways */
    check_matmul_fwd(isa, 3, 0, 5, 1, 0);      /* K = 0: y = b */
}

Test(cpu_ops, matmul_forward)
{
    seed(1);
    matmul_fwd_shapes(-1);
}

/* Every micro-kernel this CPU has (the generic one always). */
Test(cpu_ops, matmul_forward_every_isa)
{
    seed(2);
    for (int isa = MT_CPU_ISA_GENERIC; isa <= MT_CPU_ISA_AVX512; isa++) {
        if (isa > (int)mt_cpu_isa_best()) continue;
        matmul_fwd_shapes(isa);
    }
}

/* The three GEMM forms through mt_cpu_gemm directly, with row strides wider
 * than the rows, against double. */
Test(cpu_ops, gemm_strided)
{
    seed(3);
    const int M = 50, N = 37, K = 29, pad = 5;
    void *ws = ws_alloc(2, 0);
    mt_pool *p = mt_pool_create(2, NULL);
    cr_assert(p);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            const size_t lda = (size_t)(ta ? M : K) + pad, ldb = (size_t)(tb ? K : N) + pad, ldc = (size_t)N + pad;
            float *A = rand_vec((ta ? K : M) * lda, 1.0f), *B = rand_vec((tb ? N : K) * ldb, 1.0f);
            float *C = rand_vec(M * ldc, 1.0f), *C0 = copy_vec(C, M * ldc);
            mt_cpu_gemm(p, ws, ta, tb, M, N, K, A, lda, B, ldb, C, ldc, NULL, 1);
            for (int m = 0; m < M; m++)
                for (int n = 0; n < (int)ldc; n++) {
                    if (n >= N) { /* the padding is not written */
                        cr_expect(C[m * ldc + n] == C0[m * ldc + n]);
                        continue;
                    }
                    double ref = C0[m * ldc + n];
                    for (int k = 0; k < K; k++)
                        ref += (double)(ta ? A[k * lda + m] : A[m * lda + k]) * (tb ? B[n * ldb + k] : B[k * ldb + n]);
                    cr_expect(fabs(C[m * ldc + n] - ref) <= 1e-5 * (1 + fabs(ref)), "ta %d tb %d C[%d,%d]", ta, tb, m, n);
                }
            free(A); free(B); free(C); free(C0);
        }
    mt_pool_destroy(p);
    free(ws);
}

typedef struct {
    float *x, *W, *b, *y, *R;
    int T, K, N;
    void *ws;
} mm_ctx;

static double mm_loss(void *c)
{
    mm_ctx *m = c;
    mt_cpu_matmul(NULL, m->ws, m->y, m->x, m->W, m->b, m->T, m->K, m->N, 0);
    return dot_d(m->y, m->R, (size_t)m->T * m->N);
}

Test(cpu_ops, matmul_backward_fd)
{
    seed(4);
    const int T = 9, K = 13, N = 11;
    mm_ctx m = {rand_vec(T * K, 1), rand_vec(N * K, 1), rand_vec(N, 1), rand_vec(T * N, 1), rand_vec(T * N, 1),
                T, K, N, ws_alloc(1, 0)};
    /* gradients accumulate into non-zero buffers: dx +=, dW +=, db += */
    float *dx0 = rand_vec(T * K, 1), *dW0 = rand_vec(N * K, 1), *db0 = rand_vec(N, 1);
    float *dx = copy_vec(dx0, T * K), *dW = copy_vec(dW0, N * K), *db = copy_vec(db0, N);
    mt_cpu_matmul_bwd(NULL, m.ws, dx, dW, db, m.R, m.x, m.W, T, K, N, 1);
    for (int i = 0; i < T * K; i++) dx[i] -= dx0[i];
    for (int i = 0; i < N * K; i++) dW[i] -= dW0[i];
    for (int i = 0; i < N; i++) db[i] -= db0[i];
    fd_check("dx", mm_loss, &m, m.x, dx, T * K);
    fd_check("dW", mm_loss, &m, m.W, dW, N * K);
    fd_check("db", mm_loss, &m, m.b, db, N);

    /* dx_accumulate = 0 overwrites; NULL outputs are skipped */
    float *dx2 = rand_vec(T * K, 1);
    mt_cpu_matmul_bwd(NULL, m.ws, dx2, NULL, NULL, m.R, NULL, m.W, T, K, N, 0);
    fd_check("dx (overwrite)", mm_loss, &m, m.x, dx2, T * K);
    free(m.x); free(m.W); free(m.b); free(m.y); free(m.R); free(m.ws);
    free(dx0); free(dW0); free(db0); free(dx); free(dW); free(db); free(dx2);
}

/* Larger shapes, where the GEMM tiles and reduction chunks are in play:
 * dW against a double reference of dy^T x (the reduction over T = 700 spans
 * several chunks), dx against dy W, db against column sums. */
Test(cpu_ops, matmul_backward_reference)
{
    seed(5);
    const int T = 700, K = 70, N = 90;
    float *x = rand_vec(T * K, 1), *W = rand_vec(N * K, 1), *dy = rand_vec(T * N, 1);
    float *dx = rand_vec(T * K, 1), *dW = calloc(N * K, sizeof(float)), *db = calloc(N, sizeof(float));
    void *ws = ws_alloc(2, 0);
    mt_pool *p = mt_pool_create(2, NULL);
    cr_assert(p && dW && db);
    mt_cpu_matmul_bwd(p, ws, dx, dW, db, dy, x, W, T, K, N, 0);
    const double u = ldexp(1.0, -24);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < K; k++) {
            double ref = 0, mag = 0;
            for (int t = 0; t < T; t++) ref += (double)dy[t * N + n] * x[t * K + k], mag += fabs((double)dy[t * N + n] * x[t * K + k]);
            cr_expect(fabs(dW[n * K + k] - ref) <= (T + 2) * u * mag, "dW[%d,%d]", n, k);
        }
    for (int t = 0; t < T; t += 7)
        for (int k = 0; k < K; k++) {
            double ref = 0, mag = 0;
            for (int n = 0; n < N; n++) ref += (double)dy[t * N + n] * W[n * K + k], mag += fabs((double)dy[t * N + n] * W[n * K + k]);
            cr_expect(fabs(dx[t * K + k] - ref) <= (N + 2) * u * mag, "dx[%d,%d]", t, k);
        }
    for (int n = 0; n < N; n++) {
        double ref = 0, mag = 0;
        for (int t = 0; t < T; t++) ref += dy[t * N + n], mag += fabs(dy[t * N + n]);
        cr_expect(fabs(db[n] - ref) <= (T + 2) * u * mag, "db[%d]", n);
    }
    mt_pool_destroy(p);
    free(x); free(W); free(dy); free(dx); free(dW); free(db); free(ws);
}

/* ---- RMSNorm ----------------------------------------------------------------------- */

Test(cpu_ops, rmsnorm_forward)
{
    seed(6);
    const int T = 17, C = 77;
    const float eps = 1e-5f;
    float *x = rand_vec(T * C, 2), *w = rand_vec(C, 1), *y = rand_vec(T * C, 1), *rstd = rand_vec(T, 1);
    mt_cpu_rmsnorm(NULL, y, rstd, x, w, T, C, eps, 0.0f);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[t * C + c] * x[t * C + c];
        const double r = 1.0 / sqrt(ss / C + eps);
        cr_expect(fabs(rstd[t] - r) <= 1e-6 * r, "rstd[%d] %.8g ref %.8g", t, rstd[t], r);
        for (int c = 0; c < C; c++) {
            const double ref = (double)x[t * C + c] * r * w[c];
            cr_expect(fabs(y[t * C + c] - ref) <= 1e-6 * (1 + fabs(ref)), "y[%d,%d]", t, c);
        }
    }
    free(x); free(w); free(y); free(rstd);
}

/* Gemma's norm: y = x r (1 + w), against double */
Test(cpu_ops, rmsnorm_forward_offset)
{
    seed(60);
    const int T = 17, C = 77;
    const float eps = 1e-6f;
    float *x = rand_vec(T * C, 2), *w = rand_vec(C, 1), *y = rand_vec(T * C, 1), *rstd = rand_vec(T, 1);
    mt_cpu_rmsnorm(NULL, y, rstd, x, w, T, C, eps, 1.0f);
    for (int t = 0; t < T; t++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[t * C + c] * x[t * C + c];
        const double r = 1.0 / sqrt(ss / C + eps);
        cr_expect(fabs(rstd[t] - r) <= 1e-6 * r, "rstd[%d] %.8g ref %.8g", t, rstd[t], r);
        for (int c = 0; c < C; c++) {
            const double ref = (double)x[t * C + c] * r * (1.0 + (double)w[c]);
            cr_expect(fabs(y[t * C + c] - ref) <= 1e-6 * (1 + fabs(ref)), "y[%d,%d] %.8g ref %.8g", t, c, y[t * C + c],
                      ref);
        }
    }
    free(x); free(w); free(y); free(rstd);
}

typedef struct {
    float *x, *w, *y, *R;
    int T, C;
    float eps, woff;
} norm_ctx;

static double norm_loss(void *c)
{
    norm_ctx *n = c;
    mt_cpu_rmsnorm(NULL, n->y, NULL, n->x, n->w, n->T, n->C, n->eps, n->woff);
    return dot_d(n->y, n->R, (size_t)n->T * n->C);
}

/* woff 1: dx through dy (1 + w); dw as without the offset */
Test(cpu_ops, rmsnorm_backward_offset_fd)
{
    seed(61);
    const int T = 6, C = 37;
    norm_ctx n = {rand_vec(T * C, 1), rand_vec(C, 1), rand_vec(T * C, 1), rand_vec(T * C, 1), T, C, 1e-6f, 1.0f};
    float *dx = rand_vec(T * C, 1), *dw = rand_vec(C, 1), *dx0 = copy_vec(dx, T * C), *dw0 = copy_vec(dw, C);
    mt_cpu_rmsnorm_bwd(NULL, dx, dw, n.R, n.x, n.w, NULL, T, C, n.eps, n.woff);
    for (int i = 0; i < T * C; i++) dx[i] -= dx0[i];
    for (int i = 0; i < C; i++) dw[i] -= dw0[i];
    fd_check("dx", norm_loss, &n, n.x, dx, T * C);
    fd_check("dw", norm_loss, &n, n.w, dw, C);
    free(n.x); free(n.w); free(n.y); free(n.R); free(dx); free(dw); free(dx0); free(dw0);
}

Test(cpu_ops, rmsnorm_backward_fd)
{
    seed(7);
    const int T = 6, C = 37;
    norm_ctx n = {rand_vec(T * C, 1), rand_vec(C, 1), rand_vec(T * C, 1), rand_vec(T * C, 1), T, C, 1e-5f, 0.0f};
    float *rstd = rand_vec(T, 1);
    mt_cpu_rmsnorm(NULL, n.y, rstd, n.x, n.w, T, C, n.eps, 0.0f);
    float *dx0 = rand_vec(T * C, 1), *dw0 = rand_vec(C, 1);
    float *dx = copy_vec(dx0, T * C), *dw = copy_vec(dw0, C);
    mt_cpu_rmsnorm_bwd(NULL, dx, dw, n.R, n.x, n.w, rstd, T, C, n.eps, 0.0f);
    /* without the saved rstd: recomputed, the same bits */
    float *dx2 = copy_vec(dx0, T * C), *dw2 = copy_vec(dw0, C);
    mt_cpu_rmsnorm_bwd(NULL, dx2, dw2, n.R, n.x, n.w, NULL, T, C, n.eps, 0.0f);
    expect_same("dx (rstd recomputed)", dx, dx2, T * C, 1);
    expect_same("dw (rstd recomputed)", dw, dw2, C, 1);
    for (int i = 0; i < T * C; i++) dx[i] -= dx0[i];
    for (int i = 0; i < C; i++) dw[i] -= dw0[i];
    fd_check("dx", norm_loss, &n, n.x, dx, T * C);
    fd_check("dw", norm_loss, &n, n.w, dw, C);
    free(n.x); free(n.w); free(n.y); free(n.R); free(rstd);
    free(dx0); free(dw0); free(dx); free(dw); free(dx2); free(dw2);
}

/* ---- RoPE ---------------------------------------------------------------------------- */

static int32_t *rand_pos(int T, int max)
{
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    cr_assert(pos);
    for (int t = 0; t < T; t++) pos[t] = (int32_t)(next_u64() % (uint64_t)max);
    return pos;
}

Test(cpu_ops, rope_forward)
{
    seed(8);
    const int T = 11, nh = 3, D = 16;
    const mt_rope_params rp = {.theta = 10000.0f};
    float inv_freq[8];
    mt_rope_inv_freq(inv_freq, D, &rp);
    int32_t *pos = rand_pos(T, 5000);
    float *x = rand_vec(T * nh * D, 1), *y = copy_vec(x, T * nh * D);
    mt_cpu_rope(NULL, y, pos, inv_freq, T, nh, D, D, 1.0f, 0);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++)
            for (int i = 0; i < D / 2; i++) {
                const double a = (double)((float)pos[t] * inv_freq[i]); /* the angle is a float product, as in HF */
                const float *xh = x + (t * nh + h) * D, *yh = y + (t * nh + h) * D;
                const double r0 = xh[i] * cos(a) - xh[i + D / 2] * sin(a);
                const double r1 = xh[i + D / 2] * cos(a) + xh[i] * sin(a);
                cr_expect(fabs(yh[i] - r0) <= 1e-6 && fabs(yh[i + D / 2] - r1) <= 1e-6, "t %d h %d i %d", t, h, i);
            }
    /* the inverse undoes it (to rounding) */
    mt_cpu_rope(NULL, y, pos, inv_freq, T, nh, D, D, 1.0f, 1);
    for (int i = 0; i < T * nh * D; i++) cr_expect(fabs(y[i] - x[i]) <= 1e-6, "roundtrip [%d]", i);
    free(pos); free(x); free(y);
}

/* Part of each head (rd of D dimensions) with cos and sin scaled: the first rd rotate by the scaled
 * rotation, the rest pass untouched; the inverse undoes it up to scale^2. */
Test(cpu_ops, rope_partial_scaled)
{
    seed(18);
    const int T = 9, nh = 2, D = 32, rd = 24;
    const float scale = 1.2247449f;
    const mt_rope_params rp = {.theta = 10000.0f};
    float inv_freq[12];
    mt_rope_inv_freq(inv_freq, rd, &rp);
    int32_t *pos = rand_pos(T, 5000);
    float *x = rand_vec(T * nh * D, 1), *y = copy_vec(x, T * nh * D);
    mt_cpu_rope(NULL, y, pos, inv_freq, T, nh, D, rd, scale, 0);
    for (int t = 0; t < T; t++)
        for (int h = 0; h < nh; h++) {
            const float *xh = x + (t * nh + h) * D, *yh = y + (t * nh + h) * D;
            for (int i = 0; i < rd / 2; i++) {
                const double a = (double)((float)pos[t] * inv_freq[i]);
                const double r0 = scale * (xh[i] * cos(a) - xh[i + rd / 2] * sin(a));
                const double r1 = scale * (xh[i + rd / 2] * cos(a) + xh[i] * sin(a));
                cr_expect(fabs(yh[i] - r0) <= 2e-6 && fabs(yh[i + rd / 2] - r1) <= 2e-6, "t %d h %d i %d", t, h, i);
            }
            for (int i = rd; i < D; i++) cr_expect_eq(yh[i], xh[i], "dimension %d past the rotary ones moved", i);
        }
    mt_cpu_rope(NULL, y, pos, inv_freq, T, nh, D, rd, scale, 1);
    for (int i = 0; i < T * nh * D; i++) {
        const float want = i % D < rd ? x[i] * scale * scale : x[i];
        cr_expect(fabs(y[i] - want) <= 4e-6, "roundtrip [%d]: %.9g, want %.9g", i, y[i], want);
    }
    free(pos); free(x); free(y);
}

/* YaRN's and LongRoPE's frequencies against transformers' formulas written out in double (the library
 * follows its fp32 tensor roundings, so within a few ulp), and the attention factors they imply. */
Test(cpu_ops, rope_yarn_longrope_inv_freq)
{
    const int D = 32;
    float f[16];
    /* yarn: factor 8, original 256, beta 8 / 2 (the ramp over pairs 2.8 .. 5.2), truncate off, theta 10000 */
    const mt_rope_params yarn = {.theta = 10000.0f, .factor = 8.0f, .original_max_position = 256, .yarn = 1,
                                 .beta_fast = 8.0f, .beta_slow = 2.0f, .no_truncate = 1};
    mt_rope_inv_freq(f, D, &yarn);
    const double pi2 = 2 * 3.14159265358979323846;
    const double low = fmax(0.0, D * log(256 / (8 * pi2)) / (2 * log(10000.0)));
    const double high = fmin(D - 1.0, D * log(256 / (2 * pi2)) / (2 * log(10000.0)));
    int mixed = 0;
    for (int i = 0; i < D / 2; i++) {
        const double pf = pow(10000.0, 2.0 * i / D), ramp = fmin(1.0, fmax(0.0, (i - low) / (high - low)));
        const double want = (1 / (8 * pf)) * ramp + (1 / pf) * (1 - ramp);
        mixed += ramp > 0 && ramp < 1;
        cr_expect(fabs(f[i] - want) <= 4e-7 * want, "yarn inv_freq[%d] %.9g, want %.9g", i, f[i], want);
    }
    cr_expect_gt(mixed, 0, "the ramp of this test mixes some pair");
    /* truncated (the default): the range rounded outward to whole dimensions */
    const mt_rope_params yarn_t = {.theta = 10000.0f, .factor = 8.0f, .original_max_position = 16, .yarn = 1};
    mt_rope_inv_freq(f, D, &yarn_t);
    const double lo_t = fmax(0.0, floor(D * log(16 / (32 * pi2)) / (2 * log(10000.0))));
    const double hi_t = fmin(D - 1.0, ceil(D * log(16 / (1 * pi2)) / (2 * log(10000.0))));
    for (int i = 0; i < D / 2; i++) {
        const double pf = pow(10000.0, 2.0 * i / D), ramp = fmin(1.0, fmax(0.0, (i - lo_t) / (hi_t - lo_t)));
        const double want = (1 / (8 * pf)) * ramp + (1 / pf) * (1 - ramp);
        cr_expect(fabs(f[i] - want) <= 4e-7 * want, "truncated yarn inv_freq[%d] %.9g, want %.9g", i, f[i], want);
    }
    /* longrope: 1 / (ext[i] theta^(2i/D)) */
    float ext[16];
    for (int i = 0; i < 16; i++) ext[i] = 1.0f + 0.5f * (float)i;
    const mt_rope_params lr = {.theta = 10000.0f, .ext = ext};
    mt_rope_inv_freq(f, D, &lr);
    for (int i = 0; i < D / 2; i++) {
        const double want = 1 / (ext[i] * pow(10000.0, 2.0 * i / D));
        cr_expect(fabs(f[i] - want) <= 4e-7 * want, "longrope inv_freq[%d] %.9g, want %.9g", i, f[i], want);
    }
    /* the attention factors: yarn 0.1 ln s + 1, or the mscale ratio; longrope sqrt(1 + ln s / ln original) */
    mt_model_config c;
    mt_model_config_init(&c);
    c.rope_scaling = MT_ROPE_SCALING_YARN, c.rope_factor = 4.0f, c.rope_original_max_position = 16;
    cr_expect(fabs(mt_rope_attention_factor(&c, MT_ROPE_GLOBAL) - (0.1 * log(4.0) + 1)) <= 1e-7);
    c.rope_mscale = 0.707f, c.rope_mscale_all_dim = 1.0f;
    const double ratio = (0.1 * 0.707f * log(4.0) + 1) / (0.1 * log(4.0) + 1);
    cr_expect(fabs(mt_rope_attention_factor(&c, MT_ROPE_GLOBAL) - ratio) <= 1e-7);
    cr_expect_eq(mt_rope_attention_factor(&c, MT_ROPE_LOCAL), 1.0f, "the sliding layers' table is never scaled");
    c.rope_attention_factor = 1.5f;
    cr_expect_eq(mt_rope_attention_factor(&c, MT_ROPE_GLOBAL), 1.5f, "a given factor wins");
    c.rope_attention_factor = 0.0f, c.rope_mscale = c.rope_mscale_all_dim = 0.0f;
    c.rope_scaling = MT_ROPE_SCALING_LONGROPE, c.rope_original_max_position = 4096, c.rope_factor = 32.0f;
    cr_expect(fabs(mt_rope_attention_factor(&c, MT_ROPE_GLOBAL) - sqrt(1 + log(32.0) / log(4096.0))) <= 1e-7);
    /* longrope's table by the micro-batch's largest position: long once max + 1 passes the original length */
    cr_expect(!mt_rope_uses_long(&c, 4095) && mt_rope_uses_long(&c, 4096));
    c.rope_scaling = MT_ROPE_SCALING_NONE;
    cr_expect_eq(mt_rope_attention_factor(&c, MT_ROPE_GLOBAL), 1.0f);
    cr_expect(!mt_rope_uses_long(&c, 1 << 20));
}

/* The shared expert's gate: out += sigmoid(z) src, and its backward against finite differences of
 * L = sum_t dot(R_t, sigmoid(z_t) y_t) through z (x_t = R_t Wd: here R itself, as da = dy Wd). */
Test(cpu_ops, moe_shared_gate)
{
    seed(19);
    const int T = 5, C = 7;
    float *out = rand_vec(T * C, 1), *src = rand_vec(T * C, 1), *z = rand_vec(T, 3), *o0 = copy_vec(out, T * C);
    mt_cpu_moe_shared_gate(out, src, z, T, C);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            const double s = 1 / (1 + exp(-(double)z[t]));
            cr_expect(fabs(out[t * C + c] - (o0[t * C + c] + s * src[t * C + c])) <= 1e-6, "t %d c %d", t, c);
        }
    float *x = rand_vec(T * C, 1), *y = rand_vec(T * C, 1), *x0 = copy_vec(x, T * C), *y0 = copy_vec(y, T * C);
    float dz[5];
    mt_cpu_moe_shared_gate_bwd(dz, x, y, z, T, C);
    for (int t = 0; t < T; t++) {
        const double s = 1 / (1 + exp(-(double)z[t]));
        double dot = 0, dplus = 0, dminus = 0;
        const double h = 1e-3;
        const double sp = 1 / (1 + exp(-((double)z[t] + h))), sm = 1 / (1 + exp(-((double)z[t] - h)));
        for (int c = 0; c < C; c++) {
            dot += (double)x0[t * C + c] * y0[t * C + c];
            cr_expect(fabs(x[t * C + c] - s * x0[t * C + c]) <= 1e-6 && fabs(y[t * C + c] - s * y0[t * C + c]) <= 1e-6);
        }
        dplus = sp * dot, dminus = sm * dot;
        cr_expect(fabs(dz[t] - (dplus - dminus) / (2 * h)) <= 1e-4 * (1 + fabs(dz[t])), "dz[%d] %.7g, fd %.7g", t,
                  dz[t], (dplus - dminus) / (2 * h));
        cr_expect(fabs(dz[t] - dot * s * (1 - s)) <= 1e-6 * (1 + fabs(dz[t])));
    }
    free(out), free(src), free(z), free(o0), free(x), free(y), free(x0), free(y0);
}

/* moe_dot_scale with dw NULL (no dot) and / or y NULL (x alone scaled): x and y as the full call
 * leaves them, bit for bit, and dw not written where it is NULL or where y is. */
Test(cpu_ops, moe_dot_scale_optional)
{
    seed(20);
    enum { R = 6, n = 9 };
    const int32_t rows[R] = {3, 0, 5, 1, 4, 2};
    float *w = rand_vec(R, 2), *x0 = rand_vec(R * n, 1), *y0 = rand_vec(R * n, 1);
    float *xa = copy_vec(x0, R * n), *ya = copy_vec(y0, R * n), dwa[R];
    mt_cpu_moe_dot_scale(dwa, xa, ya, w, rows, R, n);
    for (int r = 0; r < R; r++) {
        cr_assert_eq(dwa[rows[r]], (float)dot_d(x0 + r * n, y0 + r * n, n), "the full call's dot of row %d", r);
        for (int i = 0; i < n; i++)
            cr_assert(xa[r * n + i] == x0[r * n + i] * w[rows[r]] && ya[r * n + i] == y0[r * n + i] * w[rows[r]]);
    }
    for (int mode = 0; mode < 3; mode++) { /* 0: dw NULL; 1: y NULL; 2: both NULL */
        float *x = copy_vec(x0, R * n), *y = copy_vec(y0, R * n), dw[R];
        for (int r = 0; r < R; r++) dw[r] = -7.0f; /* a sentinel */
        mt_cpu_moe_dot_scale(mode == 1 ? dw : NULL, x, mode == 0 ? y : NULL, w, rows, R, n);
        cr_assert(memcmp(x, xa, sizeof(float) * R * n) == 0, "mode %d: x scaled as by the full call", mode);
        cr_assert(memcmp(y, mode == 0 ? ya : y0, sizeof(float) * R * n) == 0, "mode %d: y scaled, or untouched", mode);
        for (int r = 0; r < R; r++) cr_assert_eq(dw[r], -7.0f, "mode %d: dw[%d] not written", mode, r);
        free(x), free(y);
    }
    free(w), free(x0), free(y0), free(xa), free(ya);
}

/* Llama 4's attention temperature, the test's own reading of transformers' formula in fp32:
 * (log1p(floor((i + 1) / floor_scale)) * scale + 1) with log1p rounded once to fp32. */
static float temp_factor_ref(int i, float floor_scale, float scale)
{
    const float p = (float)i + 1.0f;
    const float q = floorf(p / floor_scale);
    const float l = (float)log1p((double)q);
    return l * scale + 1.0f;
}

/* attn_temperature on T = 2 sequences of S = 13 positions (not a multiple of floor_scale 4: factors
 * f(q) for q = 0, 1, 2, 3), rows of n: each element x * f(t % S), exactly, the first floor_scale - 1
 * positions of each sequence unchanged (q = 0: f = 1), the second sequence's factors the first's; the
 * factor within 1 ulp of glibc's log1pf form and 2u of the exact real one; twice is x f f (and within 2
 * roundings of x f^2); linear, so its own adjoint (the backward is the same call): dot(R, A x) and
 * dot(A R, x) agree to rounding; and a pool of 3 threads gives the serial bits. */
Test(cpu_ops, attn_temperature)
{
    seed(21);
    const int S = 13, T = 2 * S, n = 7;
    const float fs = 4.0f, sc = 0.1f;
    float *x0 = rand_vec((size_t)T * n, 2), *x = copy_vec(x0, (size_t)T * n);
    mt_cpu_attn_temperature(NULL, x, T, S, n, fs, sc);
    int distinct = 0;
    float last = 0.0f;
    for (int t = 0; t < T; t++) {
        const int i = t < S ? t : t - S; /* the position in its sequence */
        const float f = temp_factor_ref(i, fs, sc);
        cr_assert_eq(mt_cpu_attn_temperature_factor(i, fs, sc), f, "factor of position %d", i);
        if (t < S && f != last) distinct++, last = f;
        const double exact = 1.0 + (double)sc * log1p(floor((i + 1.0) / fs));
        cr_assert(fabs(f - exact) <= 2 * 5.9604644775390625e-08 * exact, "f(%d) = %.9g, exact %.12g", i, f, exact);
        const float lib = log1pf(floorf(((float)i + 1.0f) / fs)) * sc + 1.0f;
        cr_assert(fabsf(f - lib) <= 1.2e-7f, "f(%d) = %.9g within an ulp of the log1pf form %.9g", i, f, lib);
        for (int c = 0; c < n; c++)
            cr_assert_eq(x[t * n + c], x0[t * n + c] * f, "x[%d, %d] %.9g, want %.9g", t, c, x[t * n + c],
                         x0[t * n + c] * f);
        if (i < 3) cr_assert(memcmp(x + t * n, x0 + t * n, sizeof(float) * n) == 0, "row %d: f = 1", t);
    }
    cr_assert_eq(distinct, 4, "the factors of q = 0, 1, 2, 3");
    cr_assert(memcmp(x + S * n, x0 + S * n, sizeof(float) * 3 * n) == 0, "the second sequence starts over");
    cr_assert(x[(S - 1) * n] != x0[(S - 1) * n], "the last row of a sequence is scaled");
    /* twice */
    mt_cpu_attn_temperature(NULL, x, T, S, n, fs, sc);
    for (int t = 0; t < T; t++) {
        const float f = temp_factor_ref(t % S, fs, sc);
        for (int c = 0; c < n; c++) {
            const float v = x0[t * n + c];
            cr_assert_eq(x[t * n + c], v * f * f, "twice: x[%d, %d]", t, c);
            const double want = (double)v * f * f; /* x f^2 with f^2 exact */
            cr_assert(fabs(x[t * n + c] - want) <= 2 * 5.9604644775390625e-08 * fabs(want), "twice vs f^2");
        }
    }
    /* self-adjoint: dot(R, A x0) = dot(A R, x0), each side within n T u of the exact sum */
    float *r = rand_vec((size_t)T * n, 1), *ar = copy_vec(r, (size_t)T * n), *ax = copy_vec(x0, (size_t)T * n);
    mt_cpu_attn_temperature(NULL, ar, T, S, n, fs, sc);
    mt_cpu_attn_temperature(NULL, ax, T, S, n, fs, sc);
    double absum = 0;
    for (int e = 0; e < T * n; e++) absum += fabs((double)r[e] * ax[e]);
    cr_assert(fabs(dot_d(r, ax, (size_t)T * n) - dot_d(ar, x0, (size_t)T * n)) <= 4 * 5.9604644775390625e-08 * absum,
              "the backward is the same call");
    /* threads: rows split over 3 tasks */
    const int S2 = 300, T2 = 2 * S2, n2 = 200;
    float *y = rand_vec((size_t)T2 * n2, 2), *y1 = copy_vec(y, (size_t)T2 * n2);
    mt_pool *p = mt_pool_create(3, NULL);
    cr_assert(p);
    mt_cpu_attn_temperature(p, y, T2, S2, n2, 8.0f, 0.1f);
    mt_cpu_attn_temperature(NULL, y1, T2, S2, n2, 8.0f, 0.1f);
    cr_assert(memcmp(y, y1, sizeof(float) * T2 * n2) == 0, "3 threads give the serial bits");
    mt_pool_destroy(p);
    free(x0), free(x), free(r), free(ar), free(ax), free(y), free(y1);
}

typedef struct {
    float *x, *y, *R, *inv_freq;
    int32_t *pos;
    int T, nh, D;
} rope_ctx;

static double rope_loss(void *c)
{
    rope_ctx *r = c;
    const size_t n = (size_t)r->T * r->nh * r->D;
    memcpy(r->y, r->x, n * sizeof(float));
    mt_cpu_rope(NULL, r->y, r->pos, r->inv_freq, r->T, r->nh, r->D, r->D, 1.0f, 0);
    return dot_d(r->y, r->R, n);
}

/* The backward is the inverse rotation: <R x, y> = <x, R^T y>, and it matches
 * finite differences. */
Test(cpu_ops, rope_backward)
{
    seed(9);
    const int T = 7, nh = 2, D = 12, n = T * nh * D;
    const mt_rope_params rp = {.theta = 500000.0f};
    float inv_freq[6];
    mt_rope_inv_freq(inv_freq, D, &rp);
    rope_ctx r = {rand_vec(n, 1), rand_vec(n, 1), rand_vec(n, 1), inv_freq, rand_pos(T, 100000), T, nh, D};
    float *rx = copy_vec(r.x, n), *rty = copy_vec(r.R, n);
    mt_cpu_rope(NULL, rx, r.pos, inv_freq, T, nh, D, D, 1.0f, 0);
    mt_cpu_rope(NULL, rty, r.pos, inv_freq, T, nh, D, D, 1.0f, 1);
    const double lhs = dot_d(rx, r.R, n), rhs = dot_d(r.x, rty, n);
    cr_expect(fabs(lhs - rhs) <= 1e-5 * (1 + fabs(lhs)), "<Rx,y> %.9g vs <x,R^T y> %.9g", lhs, rhs);
    fd_check("dx", rope_loss, &r, r.x, rty, n);
    free(r.x); free(r.y); free(r.R); free(r.pos); free(rx); free(rty);
}

/* Multi-head latent attention's RoPE (DeepSeek-V2/V3): heads of D = 24 whose first 16 dimensions
 * (qk_nope_head_dim) pass untouched, bit for bit, and whose last 8 (qk_rope_head_dim) turn in pairs
 * (16 + 2i, 16 + 2i + 1) (rope_interleave) or (16 + i, 16 + i + 4), pair i by inv_freq[i], against the
 * rotation written out in double (scaled or not); the inverse undoes the unscaled one. Swapping the two
 * pairings, or turning the first rotary dimensions of the head, fails every check here. */
Test(cpu_ops, rope_offset_interleaved)
{
    seed(23);
    const int T = 13, nh = 3, D = 24, off = 16, rd = 8, n = T * nh * D;
    const mt_rope_params rp = {.theta = 10000.0f};
    float inv_freq[4];
    mt_rope_inv_freq(inv_freq, rd, &rp);
    int32_t *pos = rand_pos(T, 5000); /* positions of a packed batch: not 0 .. T-1 */
    for (int il = 0; il < 2; il++)
        for (int si = 0; si < 2; si++) {
            const float scale = si ? 1.2247449f : 1.0f;
            float *x = rand_vec(n, 1), *y = copy_vec(x, n);
            mt_cpu_rope_at(NULL, y, pos, inv_freq, T, nh, D, off, rd, il, scale, 0);
            for (int t = 0; t < T; t++)
                for (int h = 0; h < nh; h++) {
                    const float *xh = x + (t * nh + h) * D, *yh = y + (t * nh + h) * D;
                    cr_expect(memcmp(xh, yh, off * sizeof(float)) == 0, "il %d: t %d h %d: an unrotated dim moved",
                              il, t, h);
                    for (int i = 0; i < rd / 2; i++) {
                        const int i0 = off + (il ? 2 * i : i), i1 = off + (il ? 2 * i + 1 : i + rd / 2);
                        const double a = (double)((float)pos[t] * inv_freq[i]);
                        const double r0 = scale * (xh[i0] * cos(a) - xh[i1] * sin(a));
                        const double r1 = scale * (xh[i1] * cos(a) + xh[i0] * sin(a));
                        cr_expect(fabs(yh[i0] - r0) <= 2e-6 && fabs(yh[i1] - r1) <= 2e-6,
                                  "il %d scale %g: t %d h %d pair %d: %.9g %.9g, want %.9g %.9g", il, scale, t, h, i,
                                  yh[i0], yh[i1], r0, r1);
                    }
                }
            if (scale == 1.0f) { /* the inverse undoes it (to rounding), and leaves the first 16 as they were */
                mt_cpu_rope_at(NULL, y, pos, inv_freq, T, nh, D, off, rd, il, 1.0f, 1);
                for (int i = 0; i < n; i++) {
                    if (i % D < off) cr_expect(memcmp(&x[i], &y[i], sizeof(float)) == 0, "il %d: [%d] moved", il, i);
                    else cr_expect(fabs(y[i] - x[i]) <= 1e-6, "il %d roundtrip [%d]: %.9g, want %.9g", il, i, y[i], x[i]);
                }
            }
            free(x), free(y);
        }
    /* split over 3 threads (by token): the same bits */
    const int Tb = 3000, nb = Tb * nh * D;
    int32_t *posb = rand_pos(Tb, 100000);
    float *xb = rand_vec(nb, 1), *y1 = copy_vec(xb, nb), *y3 = copy_vec(xb, nb);
    mt_pool *p = mt_pool_create(3, NULL);
    cr_assert(p);
    mt_cpu_rope_at(NULL, y1, posb, inv_freq, Tb, nh, D, off, rd, 1, 1.0f, 0);
    mt_cpu_rope_at(p, y3, posb, inv_freq, Tb, nh, D, off, rd, 1, 1.0f, 0);
    expect_same("rope interleaved", y1, y3, nb, 3);
    mt_pool_destroy(p);
    free(pos), free(posb), free(xb), free(y1), free(y3);
}

/* A model without latent attention (kv_lora_rank 0) rotates from dimension 0 in halves whatever its
 * rope_interleave says, and mt_cpu_rope_at there (with a partial rotary factor and a scale, both ways)
 * gives the bits of the kernel before offsets, whose loop is written out here. With kv_lora_rank the
 * config places RoPE after qk_nope_head_dim, qk_rope_head_dim wide, interleaved where rope_interleave. */
Test(cpu_ops, rope_offset_zero_unchanged)
{
    mt_model_config c;
    mt_model_config_init(&c);
    c.head_dim = 32, c.partial_rotary_factor = 0.75f, c.rope_interleave = 1;
    c.qk_nope_head_dim = 16, c.qk_rope_head_dim = 8, c.kv_lora_rank = 0;
    cr_expect_eq(mt_config_rotary_offset(&c), 0u);
    cr_expect_eq(mt_config_rotary_dims(&c), 24u);
    cr_expect(!mt_config_rope_interleaved(&c), "rope_interleave counts only with kv_lora_rank");
    seed(24);
    const int T = 9, nh = 2, D = (int)c.head_dim, rd = (int)mt_config_rotary_dims(&c), n = T * nh * D;
    const float scale = 1.2247449f;
    const mt_rope_params rp = {.theta = 10000.0f};
    float inv_freq[12];
    mt_rope_inv_freq(inv_freq, rd, &rp);
    int32_t *pos = rand_pos(T, 5000);
    for (int inverse = 0; inverse < 2; inverse++) {
        float *x = rand_vec(n, 1), *y = copy_vec(x, n), *y0 = copy_vec(x, n), *want = copy_vec(x, n);
        for (int t = 0; t < T; t++) /* the kernel as it was */
            for (int i = 0; i < rd / 2; i++) {
                const float ang = (float)pos[t] * inv_freq[i];
                const float cs = cosf(ang) * scale, sn = (inverse ? -sinf(ang) : sinf(ang)) * scale;
                for (int h = 0; h < nh; h++) {
                    float *xh = want + (t * nh + h) * D;
                    const float x0 = xh[i], x1 = xh[i + rd / 2];
                    xh[i] = x0 * cs - x1 * sn;
                    xh[i + rd / 2] = x1 * cs + x0 * sn;
                }
            }
        mt_cpu_rope_at(NULL, y, pos, inv_freq, T, nh, D, (int)mt_config_rotary_offset(&c), rd,
                       mt_config_rope_interleaved(&c), scale, inverse);
        mt_cpu_rope(NULL, y0, pos, inv_freq, T, nh, D, rd, scale, inverse);
        cr_expect(memcmp(y, want, n * sizeof(float)) == 0, "inverse %d: offset 0, halves: not the former bits",
                  inverse);
        cr_expect(memcmp(y0, want, n * sizeof(float)) == 0, "inverse %d: mt_cpu_rope: not the former bits", inverse);
        free(x), free(y), free(y0), free(want);
    }
    c.kv_lora_rank = 64, c.head_dim = 24;
    cr_expect_eq(mt_config_rotary_offset(&c), 16u);
    cr_expect_eq(mt_config_rotary_dims(&c), 8u);
    cr_expect(mt_config_rope_interleaved(&c));
    c.rope_interleave = 0;
    cr_expect(!mt_config_rope_interleaved(&c));
    free(pos);
}

/* ---- columns (multi-head latent attention's pieces) --------------------------------------------- */

/* copy_cols (sum 0; k = rep) or sum_cols (sum 1; k = n) on rows of w columns, from soff of rows sld
 * apart into doff of rows dld apart (both wider than w), against loops: the copy exact, the sum added in
 * ascending i from 0 in fp32, exactly; every other element of dst untouched. And the same bits with a
 * pool of 3 threads. */
static void check_cols(int sum, int rows, int w, int dld, int doff, int sld, int soff, int k)
{
    const int srows = sum ? rows * k : (rows + k - 1) / k;
    const size_t nd = (size_t)rows * dld, ns = (size_t)srows * sld;
    float *src = rand_vec(ns, 2), *dst = rand_vec(nd, 1), *d3 = copy_vec(dst, nd), *want = copy_vec(dst, nd);
    /* magnitudes from 2^-12 to 2^12: sums of such values round, and differently in another order (values
     * of rand_vec alone, multiples of 2^-22 below 2, mostly add exactly whatever the order) */
    for (size_t i = 0; i < ns; i++) src[i] = ldexpf(src[i], (int)(next_u64() % 25) - 12);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < w; j++) {
            float acc = 0.0f;
            if (sum)
                for (int i = 0; i < k; i++) acc += src[((size_t)r * k + i) * sld + soff + j];
            want[(size_t)r * dld + doff + j] = sum ? acc : src[(size_t)(r / k) * sld + soff + j];
        }
    mt_pool *p = mt_pool_create(3, NULL);
    cr_assert(p);
    if (sum) {
        mt_cpu_sum_cols(NULL, dst, dld, doff, src, sld, soff, rows, w, k);
        mt_cpu_sum_cols(p, d3, dld, doff, src, sld, soff, rows, w, k);
    } else {
        mt_cpu_copy_cols(NULL, dst, dld, doff, src, sld, soff, rows, w, k);
        mt_cpu_copy_cols(p, d3, dld, doff, src, sld, soff, rows, w, k);
    }
    mt_pool_destroy(p);
    for (size_t i = 0; i < nd; i++)
        cr_assert(memcmp(&dst[i], &want[i], sizeof(float)) == 0, "%s rows %d w %d k %d: dst[%zu, %zu] = %.9g, want %.9g",
                  sum ? "sum_cols" : "copy_cols", rows, w, k, i / dld, i % dld, dst[i], want[i]);
    expect_same(sum ? "sum_cols" : "copy_cols", dst, d3, nd, 3);
    free(src), free(dst), free(d3), free(want);
}

Test(cpu_ops, copy_cols)
{
    seed(25);
    check_cols(0, 12, 5, 11, 4, 9, 3, 1);  /* row for row */
    check_cols(0, 12, 5, 11, 4, 9, 3, 3);  /* each source row to 3 rows (3 heads share a key part) */
    check_cols(0, 13, 8, 24, 16, 9, 1, 3); /* rows not a multiple of rep: the last source row twice */
    check_cols(0, 20000, 8, 24, 16, 72, 64, 4); /* long enough to be split over the threads */
}

Test(cpu_ops, sum_cols)
{
    seed(26);
    check_cols(1, 12, 5, 11, 4, 9, 3, 3);
    check_cols(1, 7, 8, 8, 0, 24, 16, 1);  /* n 1: a copy */
    check_cols(1, 10000, 8, 10, 2, 24, 16, 3); /* split over the threads */
}

/* inv_freq against transformers' formulas evaluated in double. */
Test(cpu_ops, rope_inv_freq)
{
    const int D = 64;
    float f[32];
    const mt_rope_params plain = {.theta = 10000.0f};
    mt_rope_inv_freq(f, D, &plain);
    for (int i = 0; i < D / 2; i++) {
        const double ref = 1.0 / pow(10000.0, (2.0 * i) / D);
        cr_expect(fabs(f[i] - ref) <= 1e-6 * ref, "default inv_freq[%d] %.9g ref %.9g", i, f[i], ref);
    }
    const mt_rope_params l3 = {.theta = 500000.0f, .llama3 = 1, .factor = 8.0f, .low_freq_factor = 1.0f,
                               .high_freq_factor = 4.0f, .original_max_position = 8192};
    mt_rope_inv_freq(f, D, &l3);
    const double lo_wl = 8192.0 / 1.0, hi_wl = 8192.0 / 4.0;
    int n_low = 0, n_mid = 0, n_high = 0;
    for (int i = 0; i < D / 2; i++) {
        const double inv = 1.0 / pow(500000.0, (2.0 * i) / D), wl = 2 * 3.14159265358979323846 / inv;
        double ref;
        if (wl < hi_wl) ref = inv, n_high++;
        else if (wl > lo_wl) ref = inv / 8.0, n_low++;
        else {
            const double s = (8192.0 / wl - 1.0) / (4.0 - 1.0);
            ref = (1 - s) * inv / 8.0 + s * inv;
            n_mid++;
        }
        cr_expect(fabs(f[i] - ref) <= 2e-6 * ref, "llama3 inv_freq[%d] %.9g ref %.9g", i, f[i], ref);
    }
    cr_expect(n_low > 0 && n_mid > 0 && n_high > 0, "all three bands covered: %d %d %d", n_low, n_mid, n_high);
}

/* ---- attention -------------------------------------------------------------------------- */

/* Naive causal attention in double: out (B,S,H,D), lse (B,H,S). */
static void attention_ref(double *out, double *lse, const float *q, const float *k, const float *v, int B, int S,
                          int H, int Hkv, int D, float scale)
{
    double *s = malloc((size_t)S * sizeof(double));
    cr_assert(s);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int g = h / (H / Hkv);
            for (int i = 0; i < S; i++) {
                const float *qi = q + ((size_t)(b * S + i) * H + h) * D;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const float *kj = k + ((size_t)(b * S + j) * Hkv + g) * D;
                    s[j] = 0;
                    for (int d = 0; d < D; d++) s[j] += (double)qi[d] * kj[d];
                    s[j] *= scale;
                    m = fmax(m, s[j]);
                }
                for (int j = 0; j <= i; j++) sum += exp(s[j] - m);
                lse[((size_t)b * H + h) * S + i] = m + log(sum);
                double *o = out + ((size_t)(b * S + i) * H + h) * D;
                for (int d = 0; d < D; d++) o[d] = 0;
                for (int j = 0; j <= i; j++) {
                    const float *vj = v + ((size_t)(b * S + j) * Hkv + g) * D;
                    const double pj = exp(s[j] - m) / sum;
                    for (int d = 0; d < D; d++) o[d] += pj * vj[d];
                }
            }
        }
    free(s);
}

static void check_attention_fwd(int B, int S, int H, int Hkv, int D)
{
    const size_t nq = (size_t)B * S * H * D, nkv = (size_t)B * S * Hkv * D, nl = (size_t)B * H * S;
    const float scale = 1.0f / sqrtf((float)D);
    float *q = rand_vec(nq, 2), *k = rand_vec(nkv, 2), *v = rand_vec(nkv, 1);
    float *out = rand_vec(nq, 1), *lse = rand_vec(nl, 1);
    double *ro = malloc(nq * sizeof(double)), *rl = malloc(nl * sizeof(double));
    void *ws = ws_alloc(2, S);
    mt_pool *p = mt_pool_create(2, NULL);
    cr_assert(ro && rl && p);
    mt_cpu_attention(p, ws, out, lse, q, k, v, B, S, H, Hkv, D, scale);
    attention_ref(ro, rl, q, k, v, B, S, H, Hkv, D, scale);
    /* outputs are convex combinations of values in [-1, 1]: fp32 error ~1e-7 */
    for (size_t i = 0; i < nq; i++) cr_expect(fabs(out[i] - ro[i]) <= 2e-6, "S %d out[%zu] %.8g ref %.8g", S, i, out[i], ro[i]);
    for (size_t i = 0; i < nl; i++)
        cr_expect(fabs(lse[i] - rl[i]) <= 2e-6 * fmax(1, fabs(rl[i])), "S %d lse[%zu] %.8g ref %.8g", S, i, lse[i], rl[i]);
    mt_pool_destroy(p);
    free(q); free(k); free(v); free(out); free(lse); free(ro); free(rl); free(ws);
}

Test(cpu_ops, attention_forward)
{
    seed(10);
    check_attention_fwd(2, 7, 4, 2, 8);    /* GQA */
    check_attention_fwd(2, 33, 2, 2, 16);  /* MHA */
    check_attention_fwd(1, 100, 4, 1, 12); /* MQA, several query blocks, the last partial */
    check_attention_fwd(1, 1, 2, 2, 4);
}

typedef struct {
    float *q, *k, *v, *out, *lse, *R;
    int B, S, H, Hkv, D;
    float scale;
    void *ws;
} att_ctx;

static double att_loss(void *c)
{
    att_ctx *a = c;
    mt_cpu_attention(NULL, a->ws, a->out, a->lse, a->q, a->k, a->v, a->B, a->S, a->H, a->Hkv, a->D, a->scale);
    return dot_d(a->out, a->R, (size_t)a->B * a->S * a->H * a->D);
}

static void check_attention_bwd(int B, int S, int H, int Hkv, int D)
{
    const size_t nq = (size_t)B * S * H * D, nkv = (size_t)B * S * Hkv * D;
    att_ctx a = {rand_vec(nq, 2), rand_vec(nkv, 2), rand_vec(nkv, 1), rand_vec(nq, 1), rand_vec((size_t)B * H * S, 1),
                 rand_vec(nq, 1), B, S, H, Hkv, D, 1.0f / sqrtf((float)D), ws_alloc(1, S)};
    float *dq = rand_vec(nq, 1), *dk = rand_vec(nkv, 1), *dv = rand_vec(nkv, 1); /* overwritten */
    att_loss(&a);
    mt_cpu_attention_bwd(NULL, a.ws, dq, dk, dv, a.R, a.out, a.lse, a.q, a.k, a.v, B, S, H, Hkv, D, a.scale);
    fd_check("dq", att_loss, &a, a.q, dq, nq);
    fd_check("dk", att_loss, &a, a.k, dk, nkv);
    fd_check("dv", att_loss, &a, a.v, dv, nkv);
    free(a.q); free(a.k); free(a.v); free(a.out); free(a.lse); free(a.R); free(a.ws);
    free(dq); free(dk); free(dv);
}

Test(cpu_ops, attention_backward_fd)
{
    seed(11);
    check_attention_bwd(2, 7, 4, 2, 8);   /* GQA */
    check_attention_bwd(1, 33, 4, 2, 8);  /* GQA */
    check_attention_bwd(2, 7, 2, 2, 8);   /* MHA */
    check_attention_bwd(1, 33, 3, 3, 4);  /* MHA */
    check_attention_bwd(1, 100, 2, 1, 6); /* MQA, several query blocks */
}

/* Soft-capped scores (Gemma 2): the naive reference in double with c = cap tanh(u / cap),
 * u = scale q.k, before the softmax; lse of the c. */
static void attention_cap_ref(double *out, double *lse, const float *q, const float *k, const float *v, int B, int S,
                              int H, int Hkv, int D, float scale, float cap)
{
    double *s = malloc((size_t)S * sizeof(double));
    cr_assert(s);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const int g = h / (H / Hkv);
            for (int i = 0; i < S; i++) {
                const float *qi = q + ((size_t)(b * S + i) * H + h) * D;
                double m = -INFINITY, sum = 0;
                for (int j = 0; j <= i; j++) {
                    const float *kj = k + ((size_t)(b * S + j) * Hkv + g) * D;
                    double u = 0;
                    for (int d = 0; d < D; d++) u += (double)qi[d] * kj[d];
                    s[j] = cap * tanh(u * scale / cap);
                    m = fmax(m, s[j]);
                }
                for (int j = 0; j <= i; j++) sum += exp(s[j] - m);
                lse[((size_t)b * H + h) * S + i] = m + log(sum);
                double *o = out + ((size_t)(b * S + i) * H + h) * D;
                for (int d = 0; d < D; d++) o[d] = 0;
                for (int j = 0; j <= i; j++) {
                    const float *vj = v + ((size_t)(b * S + j) * Hkv + g) * D;
                    const double pj = exp(s[j] - m) / sum;
                    for (int d = 0; d < D; d++) o[d] += pj * vj[d];
                }
            }
        }
    free(s);
}

/* q, k in [-4, 4): scores u up to ~D 16 scale, far past the caps used, so the tanh saturates */
static void check_attention_cap_fwd(int B, int S, int H, int Hkv, int D, float cap)
{
    const size_t nq = (size_t)B * S * H * D, nkv = (size_t)B * S * Hkv * D, nl = (size_t)B * H * S;
    const float scale = 1.0f / sqrtf((float)D);
    float *q = rand_vec(nq, 4), *k = rand_vec(nkv, 4), *v = rand_vec(nkv, 1);
    float *out = rand_vec(nq, 1), *lse = rand_vec(nl, 1);
    double *ro = malloc(nq * sizeof(double)), *rl = malloc(nl * sizeof(double));
    void *ws = ws_alloc(2, S);
    mt_pool *p = mt_pool_create(2, NULL);
    cr_assert(ro && rl && p);
    mt_cpu_attention_docs(p, ws, out, lse, q, k, v, NULL, B, S, H, Hkv, D, scale, cap);
    attention_cap_ref(ro, rl, q, k, v, B, S, H, Hkv, D, scale, cap);
    /* as without the cap (outputs convex combinations of values in [-1, 1]); tanhf adds ~1 ulp of |c| <= cap */
    for (size_t i = 0; i < nq; i++)
        cr_expect(fabs(out[i] - ro[i]) <= 2e-6, "S %d cap %g out[%zu] %.8g ref %.8g", S, cap, i, out[i], ro[i]);
    for (size_t i = 0; i < nl; i++)
        cr_expect(fabs(lse[i] - rl[i]) <= 2e-6 * fmax(1, fabs(rl[i])), "S %d cap %g lse[%zu] %.8g ref %.8g", S, cap, i,
                  lse[i], rl[i]);
    /* the cap holds: lse <= cap + log(keys) */
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++)
                cr_expect(lse[((size_t)b * H + h) * S + i] <= cap + log(i + 1.0) + 1e-5, "lse above the cap");
    mt_pool_destroy(p);
    free(q); free(k); free(v); free(out); free(lse); free(ro); free(rl); free(ws);
}

Test(cpu_ops, attention_softcap_forward)
{
    seed(62);
    check_attention_cap_fwd(2, 7, 4, 2, 8, 2.0f);     /* GQA */
    check_attention_cap_fwd(2, 33, 2, 2, 16, 5.0f);   /* MHA */
    check_attention_cap_fwd(1, 100, 4, 1, 12, 50.0f); /* MQA, several query blocks; Gemma 2's cap */
    check_attention_cap_fwd(1, 1, 2, 2, 4, 2.0f);
}

typedef struct {
    att_ctx a;
    float cap;
} att_cap_ctx;

static double att_cap_loss(void *c)
{
    att_cap_ctx *x = c;
    att_ctx *a = &x->a;
    mt_cpu_attention_docs(NULL, a->ws, a->out, a->lse, a->q, a->k, a->v, NULL, a->B, a->S, a->H, a->Hkv, a->D,
                          a->scale, x->cap);
    return dot_d(a->out, a->R, (size_t)a->B * a->S * a->H * a->D);
}

static void check_attention_cap_bwd(int B, int S, int H, int Hkv, int D, float cap)
{
    const size_t nq = (size_t)B * S * H * D, nkv = (size_t)B * S * Hkv * D;
    att_cap_ctx x = {{rand_vec(nq, 2), rand_vec(nkv, 2), rand_vec(nkv, 1), rand_vec(nq, 1),
                      rand_vec((size_t)B * H * S, 1), rand_vec(nq, 1), B, S, H, Hkv, D, 1.0f / sqrtf((float)D),
                      ws_alloc(1, S)},
                     cap};
    att_ctx *a = &x.a;
    float *dq = rand_vec(nq, 1), *dk = rand_vec(nkv, 1), *dv = rand_vec(nkv, 1); /* overwritten */
    att_cap_loss(&x);
    mt_cpu_attention_bwd_docs(NULL, a->ws, dq, dk, dv, a->R, a->out, a->lse, a->q, a->k, a->v, NULL, B, S, H, Hkv, D,
                              a->scale, cap);
    fd_check("dq", att_cap_loss, &x, a->q, dq, nq);
    fd_check("dk", att_cap_loss, &x, a->k, dk, nkv);
    fd_check("dv", att_cap_loss, &x, a->v, dv, nkv);
    free(a->q); free(a->k); free(a->v); free(a->out); free(a->lse); free(a->R); free(a->ws);
    free(dq); free(dk); free(dv);
}

Test(cpu_ops, attention_softcap_backward_fd)
{
    seed(63);
    check_attention_cap_bwd(2, 7, 4, 2, 8, 0.5f);    /* GQA, a cap the scores (|u| up to ~2.8) saturate */
    check_attention_cap_bwd(1, 33, 4, 2, 8, 1.0f);   /* GQA */
    check_attention_cap_bwd(1, 33, 3, 3, 4, 50.0f);  /* MHA, Gemma 2's cap */
    check_attention_cap_bwd(1, 100, 2, 1, 6, 1.0f);  /* MQA, several query blocks */
}

/* ---- attention sinks ----------------------------------------------------------------------- */

/* GPT-OSS's attention as transformers' eager implementation writes it, in double: each causal
 * softmax row of head h gets the logit sinks[h] appended (in its max and its sum) and the sink's
 * column is dropped after. out (B,S,H,D), lse (B,H,S) over the scores and the sink; q, k, v
 * (B,S,H,D) (one kv head per query head). */
static void attention_sink_ref(double *out, double *lse, const double *q, const double *k, const double *v,
                               const double *sinks, int B, int S, int H, int D, double scale)
{
    double *s = malloc((size_t)S * sizeof(double));
    cr_assert(s);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < S; i++) {
                const double *qi = q + ((size_t)(b * S + i) * H + h) * D;
                double m = sinks[h];
                for (int j = 0; j <= i; j++) {
                    const double *kj = k + ((size_t)(b * S + j) * H + h) * D;
                    s[j] = 0;
                    for (int d = 0; d < D; d++) s[j] += qi[d] * kj[d];
                    s[j] *= scale;
                    m = fmax(m, s[j]);
                }
                double sum = exp(sinks[h] - m);
                for (int j = 0; j <= i; j++) sum += exp(s[j] - m);
                lse[((size_t)b * H + h) * S + i] = m + log(sum);
                double *o = out + ((size_t)(b * S + i) * H + h) * D;
                for (int d = 0; d < D; d++) o[d] = 0;
                for (int j = 0; j <= i; j++) {
                    const double *vj = v + ((size_t)(b * S + j) * H + h) * D;
                    for (int d = 0; d < D; d++) o[d] += exp(s[j] - m) / sum * vj[d];
                }
            }
    free(s);
}

enum { SK_B = 1, SK_S = 5, SK_H = 2, SK_D = 3, SK_N = SK_B * SK_S * SK_H * SK_D, SK_NL = SK_B * SK_H * SK_S };

typedef struct {
    double q[SK_N], k[SK_N], v[SK_N], sinks[SK_H], out[SK_N], lse[SK_NL];
    const float *dout;
    double scale;
} sink_ctx;

/* L = sum(dout * out) of the reference */
static double sink_loss(sink_ctx *c)
{
    attention_sink_ref(c->out, c->lse, c->q, c->k, c->v, c->sinks, SK_B, SK_S, SK_H, SK_D, c->scale);
    double L = 0;
    for (int i = 0; i < SK_N; i++) L += c->dout[i] * c->out[i];
    return L;
}

/* dL/dx[i] by central differences of the reference, step 1e-3 */
static double sink_fd(sink_ctx *c, double *x, int i)
{
    const double x0 = x[i];
    x[i] = x0 + 1e-3;
    const double lp = sink_loss(c);
    x[i] = x0 - 1e-3;
    const double lm = sink_loss(c);
    x[i] = x0;
    return (lp - lm) / 2e-3;
}

/* analytic a against the central difference num (the tolerance is derived below) */
#define SINK_FD_OK(a, num) (fabs((a) - (num)) <= 1e-4 * fmax(fabs(num), 1e-2))

/* The library's sink (mt_cpu_attention, then mt_cpu_attn_sink on its out and lse) against
 * the softmax with the sink's logit appended; its gradient (mt_cpu_attn_sink_bwd), and
 * mt_cpu_attention_bwd run from the sunk out and lse (template.h's claim), against central
 * differences of that reference. The differences are of the double reference, not of the fp32
 * path: its rounding noise, ~u |L| / h ~ 1e-4, would be as large as the tolerance. Truncation
 * (h^2 / 6 |L'''| ~ 1e-7 here) and the fp32 analytic side (~1e-7 of the gradients' terms, which
 * are O(0.1)) are far below the tolerance, 1e-4 relative with a floor of 1e-2 where a gradient
 * nearly cancels (seen: within 1e-6 relative); a wrong term is off by O(1). */
Test(cpu_ops, attn_sink_matches_softmax_with_sink)
{
    seed(67);
    const float scale = 1.0f / sqrtf((float)SK_D);
    float *q = rand_vec(SK_N, 2), *k = rand_vec(SK_N, 2), *v = rand_vec(SK_N, 1), *sinks = rand_vec(SK_H, 2);
    float *dout = rand_vec(SK_N, 1), *out = rand_vec(SK_N, 1), *lse = rand_vec(SK_NL, 1);
    float *dq = rand_vec(SK_N, 1), *dk = rand_vec(SK_N, 1), *dv = rand_vec(SK_N, 1); /* overwritten */
    sink_ctx c = {.dout = dout, .scale = scale};
    for (int i = 0; i < SK_N; i++) c.q[i] = q[i], c.k[i] = k[i], c.v[i] = v[i];
    for (int h = 0; h < SK_H; h++) c.sinks[h] = sinks[h];
    void *ws = ws_alloc(1, SK_S);

    mt_cpu_attention(NULL, ws, out, lse, q, k, v, SK_B, SK_S, SK_H, SK_H, SK_D, scale);
    mt_cpu_attn_sink(out, lse, sinks, SK_B, SK_S, SK_H, SK_D);
    sink_loss(&c);
    for (int i = 0; i < SK_N; i++)
        cr_expect(fabs(out[i] - c.out[i]) <= 1e-5, "out[%d] %.8g ref %.8g", i, out[i], c.out[i]);
    for (int i = 0; i < SK_NL; i++)
        cr_expect(fabs(lse[i] - c.lse[i]) <= 1e-5 * fmax(1, fabs(c.lse[i])), "lse[%d] %.8g ref %.8g", i, lse[i],
                  c.lse[i]);

    /* dsink is added into */
    const float start[SK_H] = {0.25f, -0.5f};
    float dsink[SK_H];
    memcpy(dsink, start, sizeof dsink);
    mt_cpu_attn_sink_bwd(dsink, dout, out, lse, sinks, SK_B, SK_S, SK_H, SK_D);
    for (int h = 0; h < SK_H; h++) {
        const double num = sink_fd(&c, c.sinks, h), got = (double)dsink[h] - start[h];
        cr_expect(SINK_FD_OK(got, num), "dsink[%d]: analytic %.7g, numeric %.7g", h, got, num);
    }

    mt_cpu_attention_bwd(NULL, ws, dq, dk, dv, dout, out, lse, q, k, v, SK_B, SK_S, SK_H, SK_H, SK_D, scale);
    for (int i = 0; i < SK_N; i++) {
        const double nq = sink_fd(&c, c.q, i), nk = sink_fd(&c, c.k, i), nv = sink_fd(&c, c.v, i);
        cr_expect(SINK_FD_OK(dq[i], nq), "dq[%d]: analytic %.7g, numeric %.7g", i, dq[i], nq);
        cr_expect(SINK_FD_OK(dk[i], nk), "dk[%d]: analytic %.7g, numeric %.7g", i, dk[i], nk);
        cr_expect(SINK_FD_OK(dv[i], nv), "dv[%d]: analytic %.7g, numeric %.7g", i, dv[i], nv);
    }
    free(q); free(k); free(v); free(sinks); free(dout); free(out); free(lse); free(dq); free(dk); free(dv); free(ws);
}

/* ---- SwiGLU ---------------------------------------------------------------------------- */

typedef struct {
    float *gate, *up, *out, *R;
    size_t n;
} swiglu_ctx;

static double swiglu_loss(void *c)
{
    swiglu_ctx *s = c;
    mt_cpu_glu(NULL, MT_GLU_SILU, s->out, s->gate, s->up, s->n);
    return dot_d(s->out, s->R, s->n);
}

Test(cpu_ops, swiglu)
{
    seed(12);
    const size_t n = 300;
    swiglu_ctx s = {rand_vec(n, 6), rand_vec(n, 2), rand_vec(n, 1), rand_vec(n, 1), n};
    swiglu_loss(&s);
    for (size_t i = 0; i < n; i++) {
        const double g = s.gate[i], ref = g / (1 + exp(-g)) * s.up[i];
        cr_expect(fabs(s.out[i] - ref) <= 1e-6 * (1 + fabs(ref)), "out[%zu] %.8g ref %.8g", i, s.out[i], ref);
    }
    float *dgate = rand_vec(n, 1), *dup = rand_vec(n, 1);
    mt_cpu_glu_bwd(NULL, MT_GLU_SILU, dgate, dup, s.R, s.gate, s.up, n);
    fd_check("dgate", swiglu_loss, &s, s.gate, dgate, n);
    fd_check("dup", swiglu_loss, &s, s.up, dup, n);
    free(s.gate); free(s.up); free(s.out); free(s.R); free(dgate); free(dup);
}

/* ---- GeGLU ----------------------------------------------------------------------------- */

static double geglu_loss(void *c)
{
    swiglu_ctx *s = c;
    mt_cpu_glu(NULL, MT_GLU_GELU_TANH, s->out, s->gate, s->up, s->n);
    return dot_d(s->out, s->R, s->n);
}

/* gelu's tanh form against double: 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) u */
Test(cpu_ops, geglu)
{
    seed(64);
    const size_t n = 300;
    swiglu_ctx s = {rand_vec(n, 6), rand_vec(n, 2), rand_vec(n, 1), rand_vec(n, 1), n};
    s.gate[0] = -6.0f, s.gate[1] = 0.0f, s.gate[2] = 6.0f; /* both tails and the middle */
    geglu_loss(&s);
    for (size_t i = 0; i < n; i++) {
        const double g = s.gate[i], t = tanh(0.7978845608028654 * (g + 0.044715 * g * g * g));
        const double ref = 0.5 * g * (1 + t) * s.up[i];
        /* fp32: tanhf within an ulp or two; 1 + t cancels near g << 0, an absolute error of ~u |g u| */
        cr_expect(fabs(s.out[i] - ref) <= 1e-6 * (1 + fabs(ref)), "out[%zu] %.8g ref %.8g (g %g)", i, s.out[i], ref, g);
    }
    float *dgate = rand_vec(n, 1), *dup = rand_vec(n, 1);
    mt_cpu_glu_bwd(NULL, MT_GLU_GELU_TANH, dgate, dup, s.R, s.gate, s.up, n);
    /* the analytic derivative in double too: d gelu / dg = 0.5 (1 + t) + 0.5 g (1 - t^2) k0 (1 + 3 k1 g^2) */
    for (size_t i = 0; i < n; i++) {
        const double g = s.gate[i], t = tanh(0.7978845608028654 * (g + 0.044715 * g * g * g));
        const double dg = 0.5 * (1 + t) + 0.5 * g * (1 - t * t) * 0.7978845608028654 * (1 + 3 * 0.044715 * g * g);
        const double ref = (double)s.R[i] * s.up[i] * dg;
        cr_expect(fabs(dgate[i] - ref) <= 1e-6 * (1 + fabs(ref)), "dgate[%zu] %.8g ref %.8g", i, dgate[i], ref);
    }
    fd_check("dgate", geglu_loss, &s, s.gate, dgate, n);
    fd_check("dup", geglu_loss, &s, s.up, dup, n);
    free(s.gate); free(s.up); free(s.out); free(s.R); free(dgate); free(dup);
}

/* ---- GPT-OSS's clamped SwiGLU ---------------------------------------------------------- */

static double gptoss_loss(void *c)
{
    swiglu_ctx *s = c;
    mt_cpu_glu(NULL, MT_GLU_GPTOSS, s->out, s->gate, s->up, s->n);
    return dot_d(s->out, s->R, s->n);
}

/* mt_cpu_glu's out and mt_cpu_glu_bwd's dgate, dup at (gate, up), from r = dL/dout, against
 * the formula in double: out = (u + 1) g sigmoid(alpha g), g = min(gate, L),
 * u = clamp(up, -L, L); dgate where gate <= L, dup where -L <= up <= L (ends included), else
 * exactly 0. fp32 errors: exp's relative error grows with |alpha g| (up to ~17u at gate -10),
 * where out and dup are tiny, hence their floor 1e-6; where s ~ 1, 1 - s keeps only its
 * absolute accuracy, a few u, scaled by alpha |g| in the derivative: dgate within
 * 1e-6 (1 + alpha |g|) |r (u + 1)|. */
static void check_gptoss_point(const char *what, size_t i, float gate, float up, float r, float out, float dgate,
                               float dup)
{
    const double L = MT_GPTOSS_LIMIT, a = MT_GPTOSS_ALPHA;
    const double g = fmin(gate, L), u = fmin(fmax(up, -L), L), s = 1 / (1 + exp(-a * g));
    const double o = (u + 1) * g * s, dg = r * (u + 1) * (s + a * g * s * (1 - s)), du = r * g * s;
    cr_expect(fabs(out - o) <= 1e-6 * (1 + fabs(o)), "%s %zu: out %.8g ref %.8g (gate %.8g up %.8g)", what, i, out, o,
              gate, up);
    if (gate <= L)
        cr_expect(fabs(dgate - dg) <= 1e-6 * (1 + a * fabs(g)) * fabs(r * (u + 1)),
                  "%s %zu: dgate %.8g ref %.8g (gate %.8g up %.8g)", what, i, dgate, dg, gate, up);
    else
        cr_expect(dgate == 0.0f, "%s %zu: dgate %g beyond the clamp (gate %.8g)", what, i, dgate, gate);
    if (up >= -L && up <= L)
        cr_expect(fabs(dup - du) <= 1e-6 * (1 + fabs(du)), "%s %zu: dup %.8g ref %.8g (gate %.8g up %.8g)", what, i,
                  dup, du, gate, up);
    else
        cr_expect(dup == 0.0f, "%s %zu: dup %g beyond the clamp (up %.8g)", what, i, dup, up);
}

/* Against the formula in double on [-10, 10) (both clamps reached), at the bounds and one float
 * beyond them, and central differences (FD_TOL) with no input within 5 FD_H of a bound, where
 * the difference would straddle the kink. */
Test(cpu_ops, gptoss_glu)
{
    seed(68);
    const size_t n = 300;
    swiglu_ctx s = {rand_vec(n, 10), rand_vec(n, 10), rand_vec(n, 1), rand_vec(n, 1), n};
    const float L = MT_GPTOSS_LIMIT;
    int beyond_g = 0, beyond_u = 0;
    for (size_t i = 0; i < n; i++) {
        if (fabsf(s.gate[i] - L) < 5 * FD_H) s.gate[i] -= 10 * FD_H;
        if (fabsf(fabsf(s.up[i]) - L) < 5 * FD_H) s.up[i] -= copysignf(10 * FD_H, s.up[i]);
        beyond_g += s.gate[i] > L, beyond_u += fabsf(s.up[i]) > L;
    }
    cr_assert(beyond_g > 0 && beyond_u > 0, "the draw reaches beyond the clamps");
    float *dgate = rand_vec(n, 1), *dup = rand_vec(n, 1);
    gptoss_loss(&s);
    mt_cpu_glu_bwd(NULL, MT_GLU_GPTOSS, dgate, dup, s.R, s.gate, s.up, n);
    for (size_t i = 0; i < n; i++)
        check_gptoss_point("element", i, s.gate[i], s.up[i], s.R[i], s.out[i], dgate[i], dup[i]);
    fd_check("dgate", gptoss_loss, &s, s.gate, dgate, n);
    fd_check("dup", gptoss_loss, &s, s.up, dup, n);

    /* at the bounds (the gradients pass) and one float beyond them (they do not) */
    const float bg[] = {L, L, -L, nextafterf(L, 8.0f), 1.0f}, bu[] = {L, -L, L, 1.0f, nextafterf(-L, -8.0f)};
    const float br[] = {0.5f, -0.75f, 1.0f, 0.5f, -0.5f};
    float bo[5], bdg[5], bdu[5];
    mt_cpu_glu(NULL, MT_GLU_GPTOSS, bo, bg, bu, 5);
    mt_cpu_glu_bwd(NULL, MT_GLU_GPTOSS, bdg, bdu, br, bg, bu, 5);
    for (size_t i = 0; i < 5; i++) {
        check_gptoss_point("bound", i, bg[i], bu[i], br[i], bo[i], bdg[i], bdu[i]);
        cr_expect((bdg[i] == 0.0f) == (i == 3) && (bdu[i] == 0.0f) == (i == 4), "bound %zu: dgate %g dup %g", i,
                  bdg[i], bdu[i]);
    }
    free(s.gate); free(s.up); free(s.out); free(s.R); free(dgate); free(dup);
}

Test(cpu_ops, softcap)
{
    seed(65);
    const size_t n = 1000;
    float *x = rand_vec(n, 200), *x0 = copy_vec(x, n);
    mt_cpu_softcap(x, n, 30.0f);
    for (size_t i = 0; i < n; i++) {
        const double ref = 30.0 * tanh(x0[i] / 30.0);
        cr_expect(fabs(x[i] - ref) <= 4e-7 * 30.0, "x[%zu] %.8g ref %.8g", i, x[i], ref);
        cr_expect(fabsf(x[i]) <= 30.0f, "x[%zu] = %g past the cap", i, x[i]);
    }
    free(x); free(x0);
}

/* ---- embedding ------------------------------------------------------------------------ */

typedef struct {
    float *wte, *out, *R;
    int32_t *tokens;
    int T, C;
    float scale;
} emb_ctx;

static double emb_loss(void *c)
{
    emb_ctx *e = c;
    mt_cpu_embedding(NULL, e->out, e->tokens, e->wte, e->T, e->C, e->scale);
    return dot_d(e->out, e->R, (size_t)e->T * e->C);
}

/* Gemma: out = wte[tok] * sqrt(C), one fp32 product; dwte += dout * the same */
Test(cpu_ops, embedding_scaled)
{
    seed(66);
    const int T = 12, C = 10, V = 7;
    int32_t tokens[12] = {3, 1, 3, 3, 0, 6, 1, 2, 3, 5, 0, 3};
    emb_ctx e = {rand_vec(V * C, 1), rand_vec(T * C, 1), rand_vec(T * C, 1), tokens, T, C, sqrtf((float)C)};
    emb_loss(&e);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++)
            cr_expect(e.out[t * C + c] == e.wte[tokens[t] * C + c] * e.scale, "out[%d,%d]", t, c);
    float *d0 = rand_vec(V * C, 1), *dwte = copy_vec(d0, V * C);
    mt_cpu_embedding_bwd(NULL, dwte, tokens, e.R, T, C, V, e.scale, -1);
    for (int i = 0; i < V * C; i++) dwte[i] -= d0[i];
    for (int c = 0; c < C; c++) cr_expect(dwte[4 * C + c] == 0.0f, "unused row changed");
    fd_check("dwte", emb_loss, &e, e.wte, dwte, V * C);
    free(e.wte); free(e.out); free(e.R); free(d0); free(dwte);
}

/* nn.Embedding(padding_idx=p): the lookups of token p add nothing to row p; every other row gets
 * exactly what it gets without a padding row (the same sums in the same order), and the forward
 * still reads row p */
Test(cpu_ops, embedding_padding_row)
{
    seed(14);
    const int T = 12, C = 10, V = 7, pad = 3;
    int32_t tokens[12] = {3, 1, 3, 3, 0, 6, 1, 2, 3, 5, 0, 3}; /* the padding row looked up five times */
    float *dout = rand_vec(T * C, 1), *d0 = rand_vec(V * C, 1);
    float *with = copy_vec(d0, V * C), *without = copy_vec(d0, V * C);
    mt_cpu_embedding_bwd(NULL, with, tokens, dout, T, C, V, 1.0f, pad);
    mt_cpu_embedding_bwd(NULL, without, tokens, dout, T, C, V, 1.0f, -1);
    for (int v = 0; v < V; v++)
        for (int c = 0; c < C; c++) {
            const float want = v == pad ? d0[v * C + c] : without[v * C + c];
            cr_assert(memcmp(&with[v * C + c], &want, sizeof want) == 0, "dwte[%d,%d] %.9g, want %.9g", v, c,
                      with[v * C + c], want);
        }
    cr_assert(memcmp(with + pad * C, without + pad * C, C * sizeof(float)) != 0, "the test's pad row is looked up");
    float *wte = rand_vec(V * C, 1), *out = rand_vec(T * C, 1);
    mt_cpu_embedding(NULL, out, tokens, wte, T, C, 1.0f);
    cr_assert(memcmp(out, wte + pad * C, C * sizeof(float)) == 0, "the forward reads the padding row");
    free(dout); free(d0); free(with); free(without); free(wte); free(out);
}

Test(cpu_ops, embedding)
{
    seed(13);
    const int T = 12, C = 10, V = 7;
    int32_t tokens[12] = {3, 1, 3, 3, 0, 6, 1, 2, 3, 5, 0, 3}; /* repeats; token 4 unused */
    emb_ctx e = {rand_vec(V * C, 1), rand_vec(T * C, 1), rand_vec(T * C, 1), tokens, T, C, 1.0f};
    emb_loss(&e);
    for (int t = 0; t < T; t++) cr_expect(memcmp(e.out + t * C, e.wte + tokens[t] * C, C * sizeof(float)) == 0);
    float *d0 = rand_vec(V * C, 1), *dwte = copy_vec(d0, V * C);
    mt_cpu_embedding_bwd(NULL, dwte, tokens, e.R, T, C, V, 1.0f, -1);
    for (int i = 0; i < V * C; i++) dwte[i] -= d0[i];
    for (int c = 0; c < C; c++) cr_expect(dwte[4 * C + c] == 0.0f, "unused row changed");
    fd_check("dwte", emb_loss, &e, e.wte, dwte, V * C);
    free(e.wte); free(e.out); free(e.R); free(d0); free(dwte);
}

/* ---- cross-entropy -------------------------------------------------------------------- */

typedef struct {
    float *logits, *work;
    int32_t *targets;
    int n, V;
    float dscale, softcap;
} ce_ctx;

static double ce_loss(void *c) /* L = dscale * sum of losses: its gradient is dlogits */
{
    ce_ctx *e = c;
    memcpy(e->work, e->logits, (size_t)e->n * e->V * sizeof(float));
    return e->dscale * mt_cpu_cross_entropy(NULL, e->work, e->targets, e->n, e->V, e->dscale, e->softcap, -100, NULL);
}

/* Gemma 2's final soft-cap: the loss of c = cap tanh(x / cap) against double,
 * dlogits = (softmax(c) - onehot) dscale (1 - tanh^2) against double and
 * finite differences. Logits up to 3 caps: the tanh saturates. */
static void check_ce_softcap(float cap, uint64_t sd)
{
    seed(sd);
    const int n = 9, V = 37;
    int32_t targets[9] = {0, 36, -100, 5, 5, -100, 17, 2, 30};
    ce_ctx e = {rand_vec(n * V, 3 * cap), rand_vec(n * V, 1), targets, n, V, 0.25f, cap};
    float *g = copy_vec(e.logits, n * V);
    int count = -1;
    const double loss = mt_cpu_cross_entropy(NULL, g, targets, n, V, e.dscale, cap, -100, &count);
    cr_expect(count == 7, "count %d", count);
    double ref = 0;
    for (int r = 0; r < n; r++) {
        const float *x = e.logits + r * V;
        double c[37], m = -INFINITY, sum = 0;
        for (int j = 0; j < V; j++) c[j] = cap * tanh(x[j] / cap), m = fmax(m, c[j]);
        for (int j = 0; j < V; j++) sum += exp(c[j] - m);
        if (targets[r] == -100) {
            for (int j = 0; j < V; j++) cr_expect(g[r * V + j] == 0.0f, "ignored row %d not zero", r);
            continue;
        }
        ref += m + log(sum) - c[targets[r]];
        for (int j = 0; j < V; j++) {
            const double t = tanh(x[j] / cap), d = (exp(c[j] - m) / sum - (j == targets[r])) * e.dscale * (1 - t * t);
            cr_expect(fabs(g[r * V + j] - d) <= 1e-7, "cap %g dlogits[%d,%d] %.8g ref %.8g", cap, r, j, g[r * V + j], d);
        }
    }
    /* each capped logit within ~1 ulp of cap: the loss within a few 1e-7 cap per row */
    cr_expect(fabs(loss - ref) <= 1e-6 * fabs(ref) + 1e-6 * cap * count, "cap %g loss %.10g ref %.10g", cap, loss, ref);
    fd_check("dlogits", ce_loss, &e, e.logits, g, n * V);
    free(e.logits); free(e.work); free(g);
}

Test(cpu_ops, cross_entropy_softcap)
{
    check_ce_softcap(30.0f, 67); /* Gemma 2's */
    check_ce_softcap(2.0f, 68);
}

Test(cpu_ops, cross_entropy)
{
    seed(14);
    const int n = 9, V = 37;
    int32_t targets[9] = {0, 36, -100, 5, 5, -100, 17, 2, 30};
    ce_ctx e = {rand_vec(n * V, 4), rand_vec(n * V, 1), targets, n, V, 0.25f, 0.0f};
    float *g = copy_vec(e.logits, n * V);
    int count = -1;
    const double loss = mt_cpu_cross_entropy(NULL, g, targets, n, V, e.dscale, 0.0f, -100, &count);
    cr_expect(count == 7, "count %d", count);
    double ref = 0;
    for (int r = 0; r < n; r++) {
        const float *x = e.logits + r * V;
        double m = -INFINITY, sum = 0;
        for (int j = 0; j < V; j++) m = fmax(m, x[j]);
        for (int j = 0; j < V; j++) sum += exp(x[j] - m);
        if (targets[r] == -100) {
            for (int j = 0; j < V; j++) cr_expect(g[r * V + j] == 0.0f, "ignored row %d not zero", r);
            continue;
        }
        ref += m + log(sum) - x[targets[r]];
        for (int j = 0; j < V; j++) {
            const double d = (exp(x[j] - m) / sum - (j == targets[r])) * e.dscale;
            cr_expect(fabs(g[r * V + j] - d) <= 1e-7, "dlogits[%d,%d] %.8g ref %.8g", r, j, g[r * V + j], d);
        }
    }
    cr_expect(fabs(loss - ref) <= 1e-6 * fabs(ref), "loss %.10g ref %.10g", loss, ref);
    fd_check("dlogits", ce_loss, &e, e.logits, g, n * V);
    free(e.logits); free(e.work); free(g);
}

Test(cpu_ops, add)
{
    seed(15);
    const size_t n = 1000;
    float *a = rand_vec(n, 1), *b = rand_vec(n, 1), *y = rand_vec(n, 1);
    mt_cpu_add(NULL, y, a, b, n);
    for (size_t i = 0; i < n; i++) cr_expect(y[i] == a[i] + b[i]);
    mt_cpu_add(NULL, a, a, b, n); /* in place */
    cr_expect(memcmp(a, y, n * sizeof(float)) == 0);
    free(a); free(b); free(y);
}

/* Every pair of precisions, on a pool of 3 threads over 200001 elements (not
 * a multiple of any chunk): each element is the scalar conversion's result,
 * so bf16 -> fp32 -> bf16 is the identity and the copies are exact. */
Test(cpu_ops, convert)
{
    seed(16);
    const size_t n = 200001;
    mt_pool *p = mt_pool_create(3, NULL);
    float *x = rand_vec(n, 3), *y = malloc(n * sizeof *y);
    uint16_t *h = malloc(n * sizeof *h), *h2 = malloc(n * sizeof *h2);
    cr_assert(p && y && h && h2);
    mt_cpu_convert(p, h, 1, x, 0, n);
    for (size_t i = 0; i < n; i++) cr_assert_eq(h[i], mt_f32_to_bf16(x[i]), "fp32 -> bf16 at %zu", i);
    mt_cpu_convert(p, y, 0, h, 1, n);
    for (size_t i = 0; i < n; i++) cr_assert_eq(y[i], mt_bf16_to_f32(h[i]), "bf16 -> fp32 at %zu", i);
    mt_cpu_convert(p, h2, 1, y, 0, n);
    cr_assert(memcmp(h2, h, n * sizeof *h) == 0, "bf16 -> fp32 -> bf16 is the identity");
    memset(h2, 0, n * sizeof *h2);
    mt_cpu_convert(p, h2, 1, h, 1, n);
    cr_assert(memcmp(h2, h, n * sizeof *h) == 0, "bf16 copy");
    mt_cpu_convert(p, y, 0, x, 0, n);
    cr_assert(memcmp(y, x, n * sizeof *x) == 0, "fp32 copy");
    free(x), free(y), free(h), free(h2);
    mt_pool_destroy(p);
}

/* ---- thread-count independence ------------------------------------------------------------ */

/* Runs every op with pools of 1, 2 and 3 threads on shapes large enough to be
 * split, and compares the bits. */
Test(cpu_ops, threads_bit_identical)
{
    enum { NP = 3 };
    const int T = 300, K = 130, N = 200, C = 512, Tn = 200;
    const int B = 2, S = 100, H = 4, Hkv = 2, D = 16, V = 1000, nce = 60;
    const size_t ne = 100003, nq = (size_t)B * S * H * D, nkv = (size_t)B * S * Hkv * D;
    seed(16);
    float *x = rand_vec(T * K, 1), *W = rand_vec(N * K, 1), *b = rand_vec(N, 1), *dy = rand_vec(T * N, 1);
    float *xn = rand_vec(Tn * C, 1), *wn = rand_vec(C, 1), *dyn = rand_vec(Tn * C, 1);
    float *q = rand_vec(nq, 2), *k = rand_vec(nkv, 2), *v = rand_vec(nkv, 1), *dout = rand_vec(nq, 1);
    float *g = rand_vec(ne, 4), *u = rand_vec(ne, 1), *logits = rand_vec((size_t)nce * V, 4);
    int32_t *pos = rand_pos(T, 4096), *tok = rand_pos(T, 50), *tgt = rand_pos(nce, V);
    tgt[3] = tgt[10] = -100;
    float inv_freq[32];
    const mt_rope_params rp = {.theta = 10000.0f};
    mt_rope_inv_freq(inv_freq, 64, &rp);

    float *res[NP][22];
    double loss[NP];
    for (int pi = 0; pi < NP; pi++) {
        mt_pool *p = mt_pool_create(pi + 1, NULL);
        void *ws = ws_alloc(pi + 1, S);
        cr_assert(p);
        float **r = res[pi];
        r[0] = rand_vec(T * N, 1), r[1] = rand_vec(T * K, 1), r[2] = rand_vec(N * K, 1), r[3] = rand_vec(N, 1);
        /* the same starting values for the accumulating outputs */
        for (int i = 0; i < N * K; i++) r[2][i] = 0.5f;
        for (int i = 0; i < N; i++) r[3][i] = 0.25f;
        mt_cpu_matmul(p, ws, r[0], x, W, b, T, K, N, 0);
        mt_cpu_matmul_bwd(p, ws, r[1], r[2], r[3], dy, x, W, T, K, N, 0);
        r[4] = rand_vec(Tn * C, 1), r[5] = rand_vec(Tn, 1), r[6] = calloc((size_t)Tn * C, sizeof(float)), r[7] = calloc(C, sizeof(float));
        mt_cpu_rmsnorm(p, r[4], r[5], xn, wn, Tn, C, 1e-5f, 0.0f);
        mt_cpu_rmsnorm_bwd(p, r[6], r[7], dyn, xn, wn, NULL, Tn, C, 1e-5f, 0.0f);
        r[8] = copy_vec(xn, (size_t)Tn * C); /* as (Tn, C / 64, 64) */
        mt_cpu_rope(p, r[8], pos, inv_freq, Tn, C / 64, 64, 64, 1.0f, 0);
        r[9] = rand_vec(nq, 1), r[10] = rand_vec((size_t)B * H * S, 1);
        r[11] = rand_vec(nq, 1), r[12] = rand_vec(nkv, 1), r[13] = rand_vec(nkv, 1);
        mt_cpu_attention(p, ws, r[9], r[10], q, k, v, B, S, H, Hkv, D, 0.25f);
        mt_cpu_attention_bwd(p, ws, r[11], r[12], r[13], dout, r[9], r[10], q, k, v, B, S, H, Hkv, D, 0.25f);
        r[14] = rand_vec(ne, 1), r[15] = rand_vec(ne, 1), r[16] = rand_vec(ne, 1);
        mt_cpu_glu(p, MT_GLU_SILU, r[14], g, u, ne);
        mt_cpu_glu_bwd(p, MT_GLU_SILU, r[15], r[16], u, g, u, ne);
        r[17] = rand_vec((size_t)T * K, 1), r[18] = calloc((size_t)50 * K, sizeof(float));
        mt_cpu_embedding(p, r[17], tok, x, T, K, 1.0f);
        mt_cpu_embedding_bwd(p, r[18], tok, x, T, K, 50, 1.0f, -1);
        r[19] = copy_vec(logits, (size_t)nce * V);
        loss[pi] = mt_cpu_cross_entropy(p, r[19], tgt, nce, V, 0.5f, 0.0f, -100, NULL);
        r[20] = rand_vec(ne, 1);
        mt_cpu_add(p, r[20], g, u, ne);
        r[21] = NULL;
        mt_pool_destroy(p);
        free(ws);
    }
    static const char *names[] = {"matmul y", "matmul dx", "matmul dW", "matmul db", "rmsnorm y", "rmsnorm rstd",
                                  "rmsnorm dx", "rmsnorm dw", "rope", "attention out", "attention lse",
                                  "attention dq", "attention dk", "attention dv", "swiglu", "swiglu dgate",
                                  "swiglu dup", "embedding", "embedding dwte", "cross-entropy dlogits", "add"};
    const size_t sizes[] = {(size_t)T * N, (size_t)T * K, (size_t)N * K, N, (size_t)Tn * C, Tn, (size_t)Tn * C, C,
                            (size_t)Tn * C, nq, (size_t)B * H * S, nq, nkv, nkv, ne, ne, ne,
                            (size_t)T * K, (size_t)50 * K, (size_t)nce * V, ne};
    for (int pi = 1; pi < NP; pi++) {
        for (int i = 0; i < 21; i++) expect_same(names[i], res[0][i], res[pi][i], sizes[i], pi + 1);
        cr_expect(memcmp(&loss[0], &loss[pi], sizeof(double)) == 0, "cross-entropy loss: %d threads differ", pi + 1);
    }
    for (int pi = 0; pi < NP; pi++)
        for (int i = 0; i < 21; i++) free(res[pi][i]);
    free(x); free(W); free(b); free(dy); free(xn); free(wn); free(dyn); free(q); free(k); free(v); free(dout);
    free(g); free(u); free(logits); free(pos); free(tok); free(tgt);
}

/* Documents packed into a sequence (doc_start) give, for each document, the
 * outputs, log-sum-exps and gradients of that document run alone: both
 * compute the same sums over the same keys; only the GEMMs' blocking of
 * those sums differs, so the results agree to fp32 rounding (measured
 * ~1e-7; bound 1e-5 of the largest value). Documents of 1 token, ones that
 * straddle a query block (ATT_BQ) and a last one cut by the sequence's end. */
static void copy_rows(float *dst, const float *src, int rows, int width, size_t src_ld)
{
    for (int r = 0; r < rows; r++) memcpy(dst + (size_t)r * width, src + (size_t)r * src_ld, (size_t)width * sizeof(float));
}

static double max_abs(const float *x, size_t n)
{
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

Test(cpu_ops, attention_documents_equal_separate_runs)
{
    enum { B = 2, S = 150, H = 4, Hkv = 2, D = 16 };
    /* first tokens of the documents of each sequence */
    static const int starts[B][6] = {{0, 13, 14, 70, 131, -1}, {0, 64, 65, 140, -1, -1}};
    const size_t nq = (size_t)B * S * H * D, nkv = (size_t)B * S * Hkv * D, nl = (size_t)B * H * S;
    const float scale = 1.0f / sqrtf((float)D);
    seed(77);
    float *q = rand_vec(nq, 2), *k = rand_vec(nkv, 2), *v = rand_vec(nkv, 1), *dout = rand_vec(nq, 1);
    float *out = rand_vec(nq, 1), *lse = rand_vec(nl, 1), *dq = rand_vec(nq, 1), *dk = rand_vec(nkv, 1),
          *dv = rand_vec(nkv, 1);
    int32_t *st = malloc((size_t)B * S * sizeof *st);
    cr_assert(st);
    for (int b = 0; b < B; b++)
        for (int d = 0; d < 6 && starts[b][d] >= 0; d++)
            for (int i = starts[b][d]; i < S && (d == 5 || starts[b][d + 1] < 0 || i < starts[b][d + 1]); i++)
                st[b * S + i] = starts[b][d];
    void *ws = ws_alloc(2, S);
    mt_pool *p = mt_pool_create(2, NULL);
    mt_cpu_attention_docs(p, ws, out, lse, q, k, v, st, B, S, H, Hkv, D, scale, 0.0f);
    mt_cpu_attention_bwd_docs(p, ws, dq, dk, dv, dout, out, lse, q, k, v, st, B, S, H, Hkv, D, scale, 0.0f);
    const double big = fmax(max_abs(dq, nq), fmax(max_abs(dk, nkv), max_abs(dv, nkv)));
    int docs = 0;
    for (int b = 0; b < B; b++)
        for (int d = 0; d < 6 && starts[b][d] >= 0; d++, docs++) {
            const int s0 = starts[b][d], n = (d < 5 && starts[b][d + 1] >= 0 ? starts[b][d + 1] : S) - s0;
            const size_t wq = (size_t)H * D, wk = (size_t)Hkv * D;
            float *q1 = malloc(n * wq * 4), *k1 = malloc(n * wk * 4), *v1 = malloc(n * wk * 4), *do1 = malloc(n * wq * 4);
            float *o1 = malloc(n * wq * 4), *l1 = malloc((size_t)H * n * 4), *dq1 = malloc(n * wq * 4),
                  *dk1 = malloc(n * wk * 4), *dv1 = malloc(n * wk * 4);
            cr_assert(q1 && k1 && v1 && do1 && o1 && l1 && dq1 && dk1 && dv1);
            const size_t rq = (size_t)(b * S + s0), rk = rq;
            copy_rows(q1, q + rq * wq, n, (int)wq, wq);
            copy_rows(k1, k + rk * wk, n, (int)wk, wk);
            copy_rows(v1, v + rk * wk, n, (int)wk, wk);
            copy_rows(do1, dout + rq * wq, n, (int)wq, wq);
            mt_cpu_attention(p, ws, o1, l1, q1, k1, v1, 1, n, H, Hkv, D, scale);
            mt_cpu_attention_bwd(p, ws, dq1, dk1, dv1, do1, o1, l1, q1, k1, v1, 1, n, H, Hkv, D, scale);
            for (int i = 0; i < n; i++) {
                for (size_t e = 0; e < wq; e++) {
                    cr_assert(fabs(out[(rq + i) * wq + e] - o1[i * wq + e]) <= 1e-5, "doc %d out row %d", docs, i);
                    cr_assert(fabs(dq[(rq + i) * wq + e] - dq1[i * wq + e]) <= 1e-5 * big, "doc %d dq row %d", docs, i);
                }
                for (size_t e = 0; e < wk; e++) {
                    cr_assert(fabs(dk[(rk + i) * wk + e] - dk1[i * wk + e]) <= 1e-5 * big, "doc %d dk row %d", docs, i);
                    cr_assert(fabs(dv[(rk + i) * wk + e] - dv1[i * wk + e]) <= 1e-5 * big, "doc %d dv row %d", docs, i);
                }
                for (int h = 0; h < H; h++)
                    cr_assert(fabs(lse[((size_t)b * H + h) * S + s0 + i] - l1[(size_t)h * n + i]) <= 1e-5,
                              "doc %d lse row %d", docs, i);
            }
            free(q1), free(k1), free(v1), free(do1), free(o1), free(l1), free(dq1), free(dk1), free(dv1);
        }
    cr_assert_eq(docs, 9);
    mt_pool_destroy(p);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv), free(st), free(ws);
}

/* A sliding window (mt_window_starts: a query sees the last W keys of its
 * document, itself included) gives each query the output, log-sum-exp and
 * gradients of that query run alone on exactly those keys: the attention of
 * the keys [s0, i] on its own, of which query i is the last row (it sees
 * them all), with dout zero but in that row, so that its backward gives row
 * i's dq and the part of dk, dv that query i sends to those keys; the parts
 * summed over the queries are dk and dv. Sums over the same keys in another
 * order: fp32 rounding (bound 1e-5 of the largest value, as above). With a
 * document boundary inside some windows, and windows cut by the sequence's
 * start. */
Test(cpu_ops, attention_window_equals_each_query_on_its_keys)
{
    enum { B = 2, S = 90, H = 4, Hkv = 2, D = 16, W = 11 };
    static const int starts[B][3] = {{0, 40, -1}, {0, 5, 61}};
    const size_t nq = (size_t)B * S * H * D, nkv = (size_t)B * S * Hkv * D, nl = (size_t)B * H * S;
    const size_t wq = (size_t)H * D, wk = (size_t)Hkv * D;
    const float scale = 1.0f / sqrtf((float)D);
    seed(78);
    float *q = rand_vec(nq, 2), *k = rand_vec(nkv, 2), *v = rand_vec(nkv, 1), *dout = rand_vec(nq, 1);
    float *out = rand_vec(nq, 1), *lse = rand_vec(nl, 1), *dq = rand_vec(nq, 1), *dk = rand_vec(nkv, 1),
          *dv = rand_vec(nkv, 1), *dk_sum = calloc(nkv, 4), *dv_sum = calloc(nkv, 4);
    int32_t *doc = malloc((size_t)B * S * sizeof *doc), *st = malloc((size_t)B * S * sizeof *st);
    cr_assert(doc && st && dk_sum && dv_sum);
    for (int b = 0; b < B; b++)
        for (int d = 0; d < 3 && starts[b][d] >= 0; d++)
            for (int i = starts[b][d]; i < S && (d == 2 || starts[b][d + 1] < 0 || i < starts[b][d + 1]); i++)
                doc[b * S + i] = starts[b][d];
    mt_window_starts(st, doc, B, S, W);
    void *ws = ws_alloc(2, S);
    mt_pool *p = mt_pool_create(2, NULL);
    mt_cpu_attention_docs(p, ws, out, lse, q, k, v, st, B, S, H, Hkv, D, scale, 0.0f);
    mt_cpu_attention_bwd_docs(p, ws, dq, dk, dv, dout, out, lse, q, k, v, st, B, S, H, Hkv, D, scale, 0.0f);
    const double big = fmax(max_abs(dq, nq), fmax(max_abs(dk, nkv), max_abs(dv, nkv)));
    float *q1 = malloc(W * wq * 4), *k1 = malloc(W * wk * 4), *v1 = malloc(W * wk * 4), *do1 = malloc(W * wq * 4),
          *o1 = malloc(W * wq * 4), *l1 = malloc((size_t)H * W * 4), *dq1 = malloc(W * wq * 4),
          *dk1 = malloc(W * wk * 4), *dv1 = malloc(W * wk * 4);
    cr_assert(q1 && k1 && v1 && do1 && o1 && l1 && dq1 && dk1 && dv1);
    int cut = 0; /* windows shorter than W */
    for (int b = 0; b < B; b++)
        for (int i = 0; i < S; i++) {
            const int s0 = st[b * S + i], n = i - s0 + 1;
            cr_assert(n >= 1 && n <= W && s0 >= doc[b * S + i], "the window of %d", i);
            cut += n < W;
            const size_t r0 = (size_t)b * S + s0;
            copy_rows(q1, q + r0 * wq, n, (int)wq, wq);
            copy_rows(k1, k + r0 * wk, n, (int)wk, wk);
            copy_rows(v1, v + r0 * wk, n, (int)wk, wk);
            memset(do1, 0, (size_t)n * wq * 4);
            copy_rows(do1 + (size_t)(n - 1) * wq, dout + (r0 + n - 1) * wq, 1, (int)wq, wq);
            mt_cpu_attention(p, ws, o1, l1, q1, k1, v1, 1, n, H, Hkv, D, scale);
            mt_cpu_attention_bwd(p, ws, dq1, dk1, dv1, do1, o1, l1, q1, k1, v1, 1, n, H, Hkv, D, scale);
            const size_t ri = (size_t)b * S + i;
            for (size_t e = 0; e < wq; e++) {
                cr_assert(fabs(out[ri * wq + e] - o1[(size_t)(n - 1) * wq + e]) <= 1e-5, "out of %d:%d", b, i);
                cr_assert(fabs(dq[ri * wq + e] - dq1[(size_t)(n - 1) * wq + e]) <= 1e-5 * big, "dq of %d:%d", b, i);
            }
            for (int h = 0; h < H; h++)
                cr_assert(fabs(lse[((size_t)b * H + h) * S + i] - l1[(size_t)h * n + n - 1]) <= 1e-5, "lse %d:%d", b, i);
            for (int r = 0; r < n; r++)
                for (size_t e = 0; e < wk; e++) {
                    dk_sum[(r0 + r) * wk + e] += dk1[(size_t)r * wk + e];
                    dv_sum[(r0 + r) * wk + e] += dv1[(size_t)r * wk + e];
                }
        }
    for (size_t e = 0; e < nkv; e++) {
        cr_assert(fabs(dk[e] - dk_sum[e]) <= 1e-5 * big, "dk[%zu] %g, the queries' parts %g", e, dk[e], dk_sum[e]);
        cr_assert(fabs(dv[e] - dv_sum[e]) <= 1e-5 * big, "dv[%zu] %g, the queries' parts %g", e, dv[e], dv_sum[e]);
    }
    /* cut: the first W - 1 queries of each of the four documents of 40 or more, all 5 of the other */
    cr_assert_eq(cut, 4 * (W - 1) + 5, "windows cut by a sequence's or a document's start");
    mt_pool_destroy(p);
    free(q1), free(k1), free(v1), free(do1), free(o1), free(l1), free(dq1), free(dk1), free(dv1);
    free(q), free(k), free(v), free(dout), free(out), free(lse), free(dq), free(dk), free(dv), free(dk_sum), free(dv_sum);
    free(st), free(doc), free(ws);
}
