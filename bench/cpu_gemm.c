/* GFLOP/s of the CPU backend's GEMM in its three uses, at a few shapes of a
 * small model, with 1 and 2 threads (and the attention, forward and backward):
 *   fwd  y  = x @ W^T    (T x K) (N x K)^T
 *   dx   dx = dy @ W     (T x N) (N x K)
 *   dW   dW += dy^T @ x  (T x N)^T (T x K)
 * and the other layer ops' times.
 * Usage: cpu_gemm [isa]   isa: the micro-kernel of the three GEMM forms,
 *   0 generic, 1 AVX2, 2 AVX-512 (default and ceiling: the best the CPU has);
 *   the attention and the other ops always run as the library runs them. */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/cpu_ops.h"
#include "model/template.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static float *randn(size_t n)
{
    float *x = malloc(n * sizeof(float));
    if (!x) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    return x;
}

enum { FWD, DX, DW };

/* Best of a few runs of about 0.2 s each, in GFLOP/s. */
static double bench_gemm(mt_pool *p, void *ws, mt_cpu_isa isa, int form, int T, int K, int N)
{
    float *x = randn((size_t)T * K), *W = randn((size_t)N * K), *y = randn((size_t)T * N);
    double best = 0.0;
    for (int rep = 0; rep < 4; rep++) {
        int iters = 0;
        double t0 = now(), t1;
        do {
            if (form == FWD) mt_cpu_matmul_isa(p, ws, isa, y, x, W, NULL, T, K, N, 0);
            else if (form == DX) mt_cpu_matmul_bwd_isa(p, ws, isa, x, NULL, NULL, y, NULL, W, T, K, N, 0);
            else mt_cpu_matmul_bwd_isa(p, ws, isa, NULL, W, NULL, y, x, NULL, T, K, N, 0);
            iters++;
            t1 = now();
        } while (t1 - t0 < 0.2);
        const double gf = 2.0 * T * K * N * iters / (t1 - t0) * 1e-9;
        best = gf > best ? gf : best;
    }
    free(x);
    free(W);
    free(y);
    return best;
}

/* Forward + backward of causal attention, in GFLOP/s of the useful work
 * (the causal half): forward 2 matmuls, backward 5. */
static void bench_attention(mt_pool *p, void *ws, int B, int S, int H, int Hkv, int D)
{
    const size_t nq = (size_t)B * S * H * D, nkv = (size_t)B * S * Hkv * D;
    float *q = randn(nq), *k = randn(nkv), *v = randn(nkv), *out = randn(nq), *dout = randn(nq);
    float *dq = randn(nq), *dk = randn(nkv), *dv = randn(nkv), *lse = randn((size_t)B * H * S);
    const double useful = 2.0 * B * H * D * ((double)S * (S + 1) / 2);
    double best_f = 1e30, best_b = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = now();
        mt_cpu_attention(p, ws, out, lse, q, k, v, B, S, H, Hkv, D, 0.125f);
        double t1 = now();
        mt_cpu_attention_bwd(p, ws, dq, dk, dv, dout, out, lse, q, k, v, B, S, H, Hkv, D, 0.125f);
        double t2 = now();
        best_f = t1 - t0 < best_f ? t1 - t0 : best_f;
        best_b = t2 - t1 < best_b ? t2 - t1 : best_b;
    }
    printf("attention B=%d S=%d H=%d Hkv=%d D=%d threads=%d: fwd %.2f ms (%.1f GFLOP/s), bwd %.2f ms (%.1f GFLOP/s)\n",
           B, S, H, Hkv, D, mt_pool_size(p), best_f * 1e3, 2 * useful / best_f * 1e-9, best_b * 1e3,
           5 * useful / best_b * 1e-9);
    free(q); free(k); free(v); free(out); free(dout); free(dq); free(dk); free(dv); free(lse);
}

/* Milliseconds per call of the other ops at one layer's shapes:
 * T = 4096, C = 256, F = 768, H = Hkv = 4, D = 64, and cross-entropy on 1024 x 8192 logits. */
static void bench_others(mt_pool *p)
{
    const int T = 4096, C = 256, F = 768, H = 4, D = 64, n = 1024, V = 8192;
    float *x = randn((size_t)T * C), *y = randn((size_t)T * C), *dx = randn((size_t)T * C), *w = randn(C);
    float *rstd = randn(T), *g = randn((size_t)T * F), *u = randn((size_t)T * F), *o = randn((size_t)T * F);
    float *q = randn((size_t)T * H * D), *logits = randn((size_t)n * V), inv_freq[32];
    int32_t *pos = malloc((size_t)T * sizeof(int32_t));
    if (!pos) exit(1);
    for (int t = 0; t < T; t++) pos[t] = t % 256;
    const mt_rope_params rp = {.theta = 10000.0f};
    mt_rope_inv_freq(inv_freq, D, &rp);
    double t[8];
    t[0] = now();
    mt_cpu_rmsnorm(p, y, rstd, x, w, T, C, 1e-5f, 0.0f);
    t[1] = now();
    mt_cpu_rmsnorm_bwd(p, dx, w, y, x, w, rstd, T, C, 1e-5f, 0.0f);
    t[2] = now();
    mt_cpu_rope(p, q, pos, inv_freq, T, H, D, D, 1.0f, 0);
    t[3] = now();
    mt_cpu_glu(p, MT_GLU_SILU, o, g, u, (size_t)T * F);
    t[4] = now();
    mt_cpu_glu_bwd(p, MT_GLU_SILU, o, g, u, g, u, (size_t)T * F);
    t[5] = now();
    mt_cpu_cross_entropy(p, logits, pos, n, V, 1.0f, 0.0f, -100, NULL);
    t[6] = now();
    printf("ms: rmsnorm %.2f, rmsnorm_bwd %.2f, rope(q) %.2f, swiglu %.2f, swiglu_bwd %.2f, cross-entropy %.2f\n",
           (t[1] - t[0]) * 1e3, (t[2] - t[1]) * 1e3, (t[3] - t[2]) * 1e3, (t[4] - t[3]) * 1e3, (t[5] - t[4]) * 1e3,
           (t[6] - t[5]) * 1e3);
    free(x); free(y); free(dx); free(w); free(rstd); free(g); free(u); free(o); free(q); free(logits); free(pos);
}

int main(int argc, char **argv)
{
    const mt_cpu_isa best = mt_cpu_isa_best();
    const int want = argc > 1 ? atoi(argv[1]) : (int)best;
    const mt_cpu_isa isa = want < 0 ? MT_CPU_ISA_GENERIC : want < (int)best ? (mt_cpu_isa)want : best;
    static const char *const isa_name[] = {"generic", "AVX2", "AVX-512"};
    printf("GEMM kernel: %s\n", isa_name[isa]);
    static const int shapes[][3] = {{4096, 256, 768}, {4096, 768, 256}, {4096, 256, 256},
                                    {2048, 128, 512}, {8192, 256, 1024}};
    for (int nt = 1; nt <= 2; nt++) {
        mt_pool *p = mt_pool_create(nt, NULL);
        void *ws = malloc(mt_cpu_ws_size(nt, 1024));
        if (!p || !ws) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        printf("threads=%d\n%18s %10s %10s %10s   (GFLOP/s)\n", nt, "T x K x N", "fwd", "dx", "dW");
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int T = shapes[s][0], K = shapes[s][1], N = shapes[s][2];
            printf("%6d x%5d x%5d %10.1f %10.1f %10.1f\n", T, K, N, bench_gemm(p, ws, isa, FWD, T, K, N),
                   bench_gemm(p, ws, isa, DX, T, K, N), bench_gemm(p, ws, isa, DW, T, K, N));
        }
        bench_attention(p, ws, 16, 256, 4, 4, 64);
        bench_attention(p, ws, 4, 1024, 8, 2, 32);
        bench_others(p);
        free(ws);
        mt_pool_destroy(p);
    }
    return 0;
}
