/* The GEMMs of one decoder layer's step, as the CUDA backend issues them
 * (cuda/cuda_backend.cu: layer_forward, mlp and layer_backward), each timed
 * with the algorithm the library uses (cuBLASLt's first heuristic choice)
 * and with each of the other candidates cuBLASLt offers, so that the gain of
 * choosing per shape by measurement is known before building it.
 *
 *   gemm [--preset 7b|qwen7b] [--tokens T] [--candidates N] [--iters K]
 *
 * Defaults: 7b (Llama-2-7B), T = 16384 tokens (a 4 x 4096 micro-batch), 8
 * candidates, 10 timed calls after 2 warm-up calls; the median. Operands
 * random (std 1), bf16 with fp32 accumulation; outputs bf16, or fp32 where
 * the backend accumulates in fp32 (input gradients of the residual stream,
 * weight gradients). FLOPs 2 M N K. Timing by the host clock around each
 * call and a stream synchronisation (each product takes >= 0.1 ms here). */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef MT_HAVE_CUDA
#include "../cuda/attention.h" /* device memory helpers */
#include "../cuda/gemm.h"

typedef struct product {
    const char *name;
    int transA, transB, M, N, K; /* as mt_gemm_run takes them */
    int c_type;
    float beta;
} product;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of one product with candidate c (-1: the library's choice). */
static double time_one(mt_gemm *g, const product *p, int c, int iters, void *A, void *B, void *C, int *n_found)
{
    double t[64];
    char why[160];
    for (int i = -2; i < iters; i++) {
        const double t0 = now_s();
        const int rc = c < 0 ? mt_gemm_run(g, NULL, p->transA, p->transB, p->M, p->N, p->K, MT_GEMM_BF16, A, B,
                                           p->c_type, C, p->beta, NULL, why, sizeof why)
                             : mt_gemm_run_candidate(g, NULL, c, n_found, p->transA, p->transB, p->M, p->N, p->K,
                                                     MT_GEMM_BF16, A, B, p->c_type, C, p->beta, NULL, why, sizeof why);
        if (rc || mt_cuattn_sync(NULL)) return -1;
        if (i >= 0) t[i] = 1e3 * (now_s() - t0);
    }
    qsort(t, (size_t)iters, sizeof *t, cmp);
    return t[iters / 2];
}

int main(int argc, char **argv)
{
    const char *pre = "7b";
    int T = 16384, n_cand = 8, iters = 10;
    for (int i = 1; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(argv[i], "--preset") && v) pre = argv[++i];
        else if (!strcmp(argv[i], "--tokens") && v) T = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--candidates") && v) n_cand = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--iters") && v) iters = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: gemm [--preset 7b|qwen7b] [--tokens T] [--candidates N] [--iters K]\n");
            return 2;
        }
    }
    int C, F, Q, KV;
    if (!strcmp(pre, "7b")) C = 4096, F = 11008, Q = 4096, KV = 4096;
    else if (!strcmp(pre, "qwen7b")) C = 3584, F = 18944, Q = 3584, KV = 512;
    else {
        fprintf(stderr, "gemm: unknown preset %s\n", pre);
        return 2;
    }
    if (T < 1 || n_cand < 0 || n_cand > 16 || iters < 1 || iters > 64) {
        fprintf(stderr, "gemm: bad arguments\n");
        return 2;
    }
    if (mt_cuattn_device_count() < 1) {
        fprintf(stderr, "gemm: no CUDA device\n");
        return 1;
    }
    enum { BF = MT_GEMM_BF16, F32 = MT_GEMM_F32 };
    /* forward: y = x W^T (trans B); input gradient: dx = dy W; weight gradient: dW += dy^T x (trans A), fp32 */
    const product P[] = {
        {"fwd q (x Wq^T)", 0, 1, T, Q, C, BF, 0},
        {"fwd k, v", 0, 1, T, KV, C, BF, 0},
        {"fwd o (h += att Wo^T)", 0, 1, T, C, Q, BF, 1},
        {"fwd o, beta 0", 0, 1, T, C, Q, BF, 0},
        {"fwd gate, up", 0, 1, T, F, C, BF, 0},
        {"fwd down (out += a Wd^T)", 0, 1, T, C, F, BF, 1},
        {"fwd down, beta 0", 0, 1, T, C, F, BF, 0},
        {"dx down (da = dy Wd)", 0, 0, T, F, C, BF, 0},
        {"dw down (+= dy^T a)", 1, 0, C, F, T, F32, 1},
        {"dx gate, up (dxn += dg Wg)", 0, 0, T, C, F, F32, 1},
        {"dw gate, up", 1, 0, F, C, T, F32, 1},
        {"dx o (datt = dy Wo)", 0, 0, T, Q, C, BF, 0},
        {"dw o", 1, 0, C, Q, T, F32, 1},
        {"dx q (dxn = dq Wq)", 0, 0, T, C, Q, F32, 0},
        {"dx k, v (dxn += dk Wk)", 0, 0, T, C, KV, F32, 1},
        {"dw q", 1, 0, Q, C, T, F32, 1},
        {"dw k, v", 1, 0, KV, C, T, F32, 1},
    };
    const int n = (int)(sizeof P / sizeof P[0]);
    size_t a_max = 0, b_max = 0, c_max = 0;
    for (int i = 0; i < n; i++) {
        const size_t a = (size_t)P[i].M * P[i].K, b = (size_t)P[i].K * P[i].N, c = (size_t)P[i].M * P[i].N;
        a_max = a > a_max ? a : a_max, b_max = b > b_max ? b : b_max, c_max = c > c_max ? c : c_max;
    }
    void *A, *B, *Cm;
    char why[256] = "";
    mt_gemm *g = mt_gemm_create(why, sizeof why);
    if (!g || mt_cuattn_malloc(&A, a_max * 2) || mt_cuattn_malloc(&B, b_max * 2) || mt_cuattn_malloc(&Cm, c_max * 4)) {
        fprintf(stderr, "gemm: %s\n", g ? "out of GPU memory" : why);
        return 1;
    }
    if (mt_cuattn_fill_random(NULL, MT_CUATTN_BF16, A, a_max, 1, 1.0f) ||
        mt_cuattn_fill_random(NULL, MT_CUATTN_BF16, B, b_max, 2, 1.0f) ||
        mt_cuattn_memset(Cm, 0, c_max * 4)) {
        fprintf(stderr, "gemm: cannot fill the operands\n");
        return 1;
    }
    char dev[128] = "";
    mt_cuattn_device_name(dev, sizeof dev);
    printf("%s, %s shape, %d tokens: C %d, F %d, Q %d, KV %d; median of %d calls\n", dev, pre, T, C, F, Q, KV, iters);
    printf("%-28s %6s %6s %6s %4s %4s %9s %8s | %-9s %8s\n", "product", "M", "N", "K", "out", "beta", "ms", "TFLOP/s",
           "best cand", "TFLOP/s");
    double lib_total = 0, best_total = 0;
    for (int i = 0; i < n; i++) {
        const product *p = &P[i];
        const double flop = 2.0 * p->M * p->N * (double)p->K;
        int found = 0;
        const double ms = time_one(g, p, -1, iters, A, B, Cm, &found);
        if (ms < 0) {
            printf("%-28s failed\n", p->name);
            continue;
        }
        double best = ms;
        int best_c = 0;
        for (int c = 0; c < n_cand; c++) {
            int f = 0;
            const double t = time_one(g, p, c, iters, A, B, Cm, &f);
            if (t > 0 && t < best) best = t, best_c = c;
            if (c + 1 >= f) break;
        }
        lib_total += ms, best_total += best;
        printf("%-28s %6d %6d %6d %4s %4.0f %9.3f %8.1f | %-9d %8.1f\n", p->name, p->M, p->N, p->K,
               p->c_type == BF ? "bf16" : "fp32", (double)p->beta, ms, flop / ms / 1e9, best_c, flop / best / 1e9);
    }
    printf("all products once: %.3f ms with the library's choice, %.3f ms with the best candidate (%.1f%% less)\n",
           lib_total, best_total, 100 * (lib_total - best_total) / lib_total);
    mt_cuattn_free(A), mt_cuattn_free(B), mt_cuattn_free(Cm);
    mt_gemm_destroy(g);
    return 0;
}
#else
int main(void)
{
    fprintf(stderr, "gemm: built without CUDA\n");
    return 1;
}
#endif
