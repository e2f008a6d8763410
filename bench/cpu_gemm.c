/* GFLOP/s of the CPU backend's GEMM in its three uses, at a few shapes of a
 * small model, with 1 and 2 threads (and the attention, forward and backward):
 *   fwd  y  = x @ W^T    (T x K) (N x K)^T
 *   dx   dx = dy @ W     (T x N) (N x K)
 *   dW   dW += dy^T @ x  (T x N)^T (T x K)
 * Usage: cpu_gemm [isa]   isa: 0 generic, 1 AVX2, 2 AVX-512 (default: the best). */
#define _POSIX_C_SOURCE 199309L
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu_ops.h"

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
static double bench_gemm(mt_pool *p, void *ws, int form, int T, int K, int N)
{
    float *x = randn((size_t)T * K), *W = randn((size_t)N * K), *y = randn((size_t)T * N);
    double best = 0.0;
    for (int rep = 0; rep < 4; rep++) {
        int iters = 0;
        double t0 = now(), t1;
        do {
            if (form == FWD) mt_cpu_matmul(p, ws, y, x, W, NULL, T, K, N, 0);
            else if (form == DX) mt_cpu_matmul_bwd(p, ws, x, NULL, NULL, y, NULL, W, T, K, N, 0);
            else mt_cpu_matmul_bwd(p, ws, NULL, W, NULL, y, x, NULL, T, K, N, 0);
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

int main(int argc, char **argv)
{
    const mt_cpu_isa isa = mt_cpu_gemm_set_isa(argc > 1 ? (mt_cpu_isa)atoi(argv[1]) : MT_CPU_ISA_AVX512);
    static const char *isa_name[] = {"generic", "AVX2", "AVX-512"};
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
            printf("%6d x%5d x%5d %10.1f %10.1f %10.1f\n", T, K, N, bench_gemm(p, ws, FWD, T, K, N),
                   bench_gemm(p, ws, DX, T, K, N), bench_gemm(p, ws, DW, T, K, N));
        }
        bench_attention(p, ws, 16, 256, 4, 4, 64);
        bench_attention(p, ws, 4, 1024, 8, 2, 32);
        free(ws);
        mt_pool_destroy(p);
    }
    return 0;
}
