/* The experts' GEMMs of one MoE layer and micro-batch (16384 tokens), three
 * ways: the grouped Hopper kernels (cuda/kernels/grouped_gemm.h: one launch,
 * offsets on the device), cuBLAS's grouped GEMM (cuda/gemm/grouped_blas.h:
 * one call, sizes from offsets on the host), and a loop of one cuBLASLt GEMM
 * per expert sized from offsets on the host (its fallback),
 * for the forward (gate or up, and down), the input gradient and the weight
 * gradient. The routing is drawn at random with counts within +-50% of the
 * mean (a trained router is rarely more even). TFLOP/s = 2 R K N / time,
 * the time the median of 7 runs of enough calls to last ~40 ms, on the
 * default stream, the host clock around a device sync.
 * Usage: cuda_grouped_gemm [shape]   (qwen3-30b-a3b, mixtral-8x7b, gpt-oss-20b, deepseek-v2-lite) */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/bf16.h"
#include "cuda/gemm/gemm.h"
#include "cuda/gemm/grouped_blas.h"
#include "cuda/kernels/grouped_gemm.h"
#include "device/device.h"

static char why[256];

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *dalloc(size_t bytes)
{
    void *p = NULL;
    if (mt_device_malloc(&p, bytes, why, sizeof why) != 0 || !p) {
        fprintf(stderr, "cuda_grouped_gemm: %s\n", why);
        exit(1);
    }
    return p;
}

static void fill(void *d, size_t n, unsigned seed)
{
    uint16_t *h = malloc(n * 2);
    if (!h) exit(1);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        h[i] = mt_f32_to_bf16(((float)(seed >> 8) / 16777216.0f - 0.5f) * 0.1f);
    }
    if (mt_device_copy_h2d(d, h, n * 2, why, sizeof why)) exit(1);
    free(h);
}

typedef struct shape {
    const char *name;
    int E, k, C, FE;
} shape;

static const shape SHAPES[] = {
    {"qwen3-30b-a3b", 128, 8, 2048, 768},
    {"mixtral-8x7b", 8, 2, 4096, 14336},
    {"gpt-oss-20b", 32, 4, 2880, 2880},
    {"deepseek-v2-lite", 64, 6, 2048, 1408},
};

enum { GG = 0, LOOP = 1, GBLAS = 2 };
enum { OP_FWD, OP_DX, OP_DW };

typedef struct ctx {
    mt_cu_gg *gg;
    mt_gemm *lt;
    mt_gblas *gb;
    int E, R, K, N;
    int32_t *offs_h, *offs_d;
    void *A, *W, *out;
} ctx;

/* one call: op on the (K, N) product */
static int call(ctx *c, int how, int op)
{
    const size_t es = 2;
    if (how == GG) {
        if (op == OP_FWD) return mt_cu_gg_linear(c->gg, NULL, c->out, 0, c->A, c->W, NULL, c->offs_d, c->E, c->R, c->K, c->N, 0);
        if (op == OP_DX) return mt_cu_gg_linear_dx(c->gg, NULL, c->out, 1, c->A, c->W, c->offs_d, c->E, c->R, c->K, c->N, 0);
        return mt_cu_gg_linear_dw(c->gg, NULL, c->out, NULL, c->A, c->W, c->offs_d, c->E, c->R, c->K, c->N);
    }
    if (how == GBLAS) {
        if (op == OP_FWD)
            return mt_gblas_linear(c->gb, NULL, c->out, 0, c->A, c->W, c->offs_h, c->offs_d, c->E, c->R, c->K, c->N, 0,
                                   why, sizeof why);
        if (op == OP_DX)
            return mt_gblas_linear_dx(c->gb, NULL, c->out, 1, c->A, c->W, c->offs_h, c->offs_d, c->E, c->R, c->K, c->N,
                                      0, why, sizeof why);
        return mt_gblas_linear_dw(c->gb, NULL, c->out, c->A, c->W, c->offs_h, c->offs_d, c->E, c->R, c->K, c->N, why,
                                  sizeof why);
    }
    for (int e = 0; e < c->E; e++) {
        const int r0 = c->offs_h[e], n = c->offs_h[e + 1] - r0;
        if (!n) continue;
        int rc;
        if (op == OP_FWD) /* y = x W_e^T: x (n, K), W_e (N, K) */
            rc = mt_gemm_run(c->lt, NULL, 0, 1, n, c->N, c->K, MT_GEMM_BF16, (char *)c->A + (size_t)r0 * c->K * es,
                             (char *)c->W + (size_t)e * c->N * c->K * es, MT_GEMM_BF16,
                             (char *)c->out + (size_t)r0 * c->N * es, 0.0f, NULL, why, sizeof why);
        else if (op == OP_DX) /* dx = dy W_e: dy (n, N), W_e (N, K), dx f32 */
            rc = mt_gemm_run(c->lt, NULL, 0, 0, n, c->K, c->N, MT_GEMM_BF16, (char *)c->A + (size_t)r0 * c->N * es,
                             (char *)c->W + (size_t)e * c->N * c->K * es, MT_GEMM_F32,
                             (float *)c->out + (size_t)r0 * c->K, 0.0f, NULL, why, sizeof why);
        else /* dW_e += dy^T x: dy (n, N), x (n, K) */
            rc = mt_gemm_run(c->lt, NULL, 1, 0, c->N, c->K, n, MT_GEMM_BF16, (char *)c->A + (size_t)r0 * c->N * es,
                             (char *)c->W + (size_t)r0 * c->K * es, MT_GEMM_F32,
                             (float *)c->out + (size_t)e * c->N * c->K, 1.0f, NULL, why, sizeof why);
        if (rc) return rc;
    }
    return 0;
}

static int cmp(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double time_call(ctx *c, int how, int op)
{
    if (call(c, how, op) || mt_device_sync(why, sizeof why)) {
        fprintf(stderr, "cuda_grouped_gemm: call failed: %s\n", why);
        if (how == GBLAS) return 0; /* a product cuBLAS refuses: no figure */
        exit(1);
    }
    double t0 = now();
    int reps = 0;
    while (now() - t0 < 0.04) {
        call(c, how, op);
        mt_device_sync(why, sizeof why);
        reps++;
    }
    double runs[7];
    for (int i = 0; i < 7; i++) {
        t0 = now();
        for (int j = 0; j < reps; j++) call(c, how, op);
        mt_device_sync(why, sizeof why);
        runs[i] = (now() - t0) / reps;
    }
    qsort(runs, 7, sizeof runs[0], cmp);
    return runs[3];
}

int main(int argc, char **argv)
{
    const char *only = argc > 1 ? argv[1] : NULL;
    if (mt_device_count(why, sizeof why) <= 0) {
        fprintf(stderr, "cuda_grouped_gemm: no GPU: %s\n", why);
        return 1;
    }
    ctx c = {0};
    c.gg = mt_cu_gg_create(why, sizeof why);
    if (!c.gg) fprintf(stderr, "cuda_grouped_gemm: %s (the loop alone)\n", why);
    c.lt = mt_gemm_create(why, sizeof why);
    if (!c.lt) {
        fprintf(stderr, "cuda_grouped_gemm: %s\n", why);
        return 1;
    }
    void *gb_ptrs = dalloc(mt_gblas_ptr_bytes(1024)), *gb_ws = dalloc(MT_GBLAS_WORKSPACE_BYTES);
    c.gb = mt_gblas_create(gb_ptrs, 1024, gb_ws, MT_GBLAS_WORKSPACE_BYTES, why, sizeof why);
    if (!c.gb) fprintf(stderr, "cuda_grouped_gemm: %s (no cuBLAS grouped column)\n", why);
    const int T = 16384;
    printf("%-18s %-9s %6s %6s %7s %16s %16s %16s\n", "shape", "product", "K", "N", "rows", "grouped", "loop",
           "cublas grouped");
    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
        const shape *sh = &SHAPES[si];
        if (only && strcmp(only, sh->name)) continue;
        const int E = sh->E, R = T * sh->k;
        int32_t *offs = malloc((size_t)(E + 1) * 4);
        unsigned seed = 99u;
        double *w = malloc((size_t)E * sizeof *w), wsum = 0;
        for (int e = 0; e < E; e++) {
            seed = seed * 1664525u + 1013904223u;
            w[e] = 0.5 + (double)(seed >> 8) / 16777216.0, wsum += w[e];
        }
        offs[0] = 0;
        for (int e = 0; e < E; e++) offs[e + 1] = e == E - 1 ? R : offs[e] + (int)(R * w[e] / wsum);
        c.E = E, c.R = R, c.offs_h = offs;
        c.offs_d = dalloc((size_t)(E + 1) * 4);
        mt_device_copy_h2d(c.offs_d, offs, (size_t)(E + 1) * 4, why, sizeof why);
        const size_t big = (size_t)R * (sh->C > sh->FE ? sh->C : sh->FE);
        void *A = dalloc(big * 2), *B = dalloc(big * 2), *W = dalloc((size_t)E * sh->C * sh->FE * 2);
        void *out = dalloc((size_t)(big > (size_t)E * sh->C * sh->FE ? big : (size_t)E * sh->C * sh->FE) * 4);
        fill(A, big, 1), fill(B, big, 2), fill(W, (size_t)E * sh->C * sh->FE, 3);
        struct {
            const char *name;
            int op, K, N;
        } prods[] = {{"up", OP_FWD, sh->C, sh->FE}, {"down", OP_FWD, sh->FE, sh->C}, {"up_dx", OP_DX, sh->C, sh->FE},
                     {"down_dx", OP_DX, sh->FE, sh->C}, {"up_dw", OP_DW, sh->C, sh->FE}, {"down_dw", OP_DW, sh->FE, sh->C}};
        for (size_t p = 0; p < sizeof prods / sizeof prods[0]; p++) {
            c.K = prods[p].K, c.N = prods[p].N;
            c.A = A, c.out = out;
            c.W = prods[p].op == OP_DW ? B : W;
            const double flop = 2.0 * R * c.K * c.N;
            const double tl = time_call(&c, LOOP, prods[p].op);
            const double tg = c.gg && mt_cu_gg_fits(c.K, c.N) ? time_call(&c, GG, prods[p].op) : 0;
            const double tb = c.gb ? time_call(&c, GBLAS, prods[p].op) : 0;
            printf("%-18s %-9s %6d %6d %7d %7.3f ms %4.0f  %7.3f ms %4.0f  %7.3f ms %4.0f TFLOP/s\n", sh->name,
                   prods[p].name, c.K, c.N, R, tg * 1e3, tg > 0 ? flop / tg / 1e12 : 0, tl * 1e3, flop / tl / 1e12,
                   tb * 1e3, tb > 0 ? flop / tb / 1e12 : 0);
            fflush(stdout);
        }
        mt_device_free(A), mt_device_free(B), mt_device_free(W), mt_device_free(out), mt_device_free(c.offs_d);
        free(offs), free(w);
    }
    mt_gemm_destroy(c.lt);
    mt_cu_gg_destroy(c.gg);
    mt_gblas_destroy(c.gb);
    mt_device_free(gb_ptrs), mt_device_free(gb_ws);
    return 0;
}
