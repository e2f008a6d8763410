/* Throughput of the GPU attention (cuda/kernels/attention.h).
 *
 *   cuda_attention [--S LIST] [--D LIST] [--bh N] [--H N] [--Hkv N] [--iters K] [--dtype bf16|fp32]
 *                  [--impl kernels|mma|sm90|cudnn [--nondeterministic]] [--window W]
 *
 * LISTs are comma-separated. Defaults: S 1024,2048,4096,8192; D 64,128;
 * B*H = 128 with H = 32 query heads (B = 4) and Hkv = H (no grouping); 20
 * timed calls after 3 warm-up calls, the median reported; bf16; the
 * library's own kernels as the calls choose them (the Hopper forward where it
 * runs, attention.h). --impl mma: the mma.sync kernels whatever the device;
 * --impl sm90: the Hopper kernels alone (mt_cuattn_sm90_forward and
 * _backward; a shape they do not take fails). The backward column of
 * kernels and mma is the mma.sync kernels'. --impl cudnn times cuDNN's fused attention instead
 * (cuda/kernels/cudnn_attention.h, bf16 only; a shape cuDNN refuses is
 * reported as such), with its deterministic backward unless
 * --nondeterministic. --window W: a sliding window of W keys (the kernels
 * only, which take it as each query's first key, mt_window_starts).
 *
 * FLOPs counted (causal, the usual convention): forward 4*B*H*S*S*D/2
 * (Q K^T and P V over half the matrix; with a window, over the S*W - W*W/2
 * query-key pairs it leaves), backward 2.5 times that (the five
 * products of the flash-attention-2 backward; this implementation does two
 * more, recomputing Q K^T and dO V^T in its separate dq pass, which the
 * count leaves out). Inputs are random (roughly normal, std 1), written on
 * the device; timing is by the host clock around each call followed by a
 * stream synchronisation. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef MT_HAVE_CUDA
#include "cuda/kernels/attention.h"
#include "cuda/kernels/cudnn_attention.h"
#include "device/device.h"
#include "model/template.h"

#define MAX_LIST 16

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static int parse_list(const char *s, int *out)
{
    int n = 0;
    while (*s && n < MAX_LIST) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static char cudnn_why[512];

static void check(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "cuda_attention: %s: %s\n", what, cudnn_why[0] ? cudnn_why : mt_cuattn_strerror(rc));
        exit(1);
    }
}

static char why[256]; /* the device layer's reason for a failed call */

/* A device-layer call's result: on failure, says why and exits. */
static void device_ok(int rc, const char *what)
{
    if (rc != 0) {
        fprintf(stderr, "cuda_attention: %s: %s\n", what, why);
        exit(1);
    }
}

typedef struct {
    int dtype, B, S, H, Hkv, D;
    float scale;
    void *q, *k, *v, *out, *dout, *dq, *dk, *dv, *ws;
    float *lse;
    int32_t *st;           /* with a window: each query's first key (device), else NULL */
    size_t wsb, fws, bws;  /* workspace: allocated; cuDNN's forward and backward needs */
    mt_cudnn_attn *cudnn; /* NULL: the library's kernels */
    int impl;             /* the library's: 0 as the calls choose, 1 mma.sync, 2 the Hopper forward */
} problem;

static int run_fwd(problem *p)
{
    if (p->cudnn)
        return mt_cudnn_attn_forward(p->cudnn, NULL, p->out, p->lse, p->q, p->k, p->v, p->B, p->S, p->H, p->Hkv, p->D,
                                     p->scale, p->ws, p->fws, cudnn_why, sizeof cudnn_why);
    if (p->impl == 1)
        return mt_cuattn_forward_mma(NULL, p->dtype, p->out, p->lse, p->q, p->k, p->v, p->st, p->B, p->S, p->H,
                                     p->Hkv, p->D, p->scale, 0.0f);
    if (p->impl == 2)
        return mt_cuattn_sm90_forward(NULL, p->out, p->lse, p->q, p->k, p->v, p->B, p->S, p->H, p->Hkv, p->D,
                                      p->scale);
    return mt_cuattn_forward_docs(NULL, p->dtype, p->out, p->lse, p->q, p->k, p->v, p->st, p->B, p->S, p->H, p->Hkv,
                                  p->D, p->scale);
}

static int run_bwd(problem *p)
{
    if (p->cudnn)
        return mt_cudnn_attn_backward(p->cudnn, NULL, p->dq, p->dk, p->dv, p->dout, p->out, p->lse, p->q, p->k, p->v,
                                      p->B, p->S, p->H, p->Hkv, p->D, p->scale, p->ws, p->bws, cudnn_why,
                                      sizeof cudnn_why);
    if (p->impl == 2)
        return mt_cuattn_sm90_backward(NULL, p->dq, p->dk, p->dv, p->dout, p->out, p->lse, p->q, p->k, p->v, p->B,
                                       p->S, p->H, p->Hkv, p->D, p->scale, p->ws, p->wsb);
    return mt_cuattn_backward_docs(NULL, p->dtype, p->dq, p->dk, p->dv, p->dout, p->out, p->lse, p->q, p->k, p->v,
                                   p->st, p->B, p->S, p->H, p->Hkv, p->D, p->scale, p->ws, p->wsb);
}

/* median seconds per call */
static double time_it(int (*fn)(problem *), problem *p, int iters)
{
    double t[256];
    if (iters > 256) iters = 256;
    for (int i = 0; i < 3; i++) check(fn(p), "warm-up");
    device_ok(mt_device_sync(why, sizeof why), "sync");
    for (int i = 0; i < iters; i++) {
        const double t0 = now_s();
        check(fn(p), "call");
        device_ok(mt_device_sync(why, sizeof why), "sync");
        t[i] = now_s() - t0;
    }
    qsort(t, (size_t)iters, sizeof t[0], cmp_double);
    return t[iters / 2];
}

int main(int argc, char **argv)
{
    int Ss[MAX_LIST] = {1024, 2048, 4096, 8192}, nS = 4, Ds[MAX_LIST] = {64, 128}, nD = 2;
    int bh = 128, H = 32, Hkv = -1, iters = 20, dtype = 0, use_cudnn = 0, nondet = 0, window = 0, impl = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--S") && val) nS = parse_list(argv[++i], Ss);
        else if (!strcmp(a, "--D") && val) nD = parse_list(argv[++i], Ds);
        else if (!strcmp(a, "--bh") && val) bh = atoi(argv[++i]);
        else if (!strcmp(a, "--H") && val) H = atoi(argv[++i]);
        else if (!strcmp(a, "--Hkv") && val) Hkv = atoi(argv[++i]);
        else if (!strcmp(a, "--iters") && val) iters = atoi(argv[++i]);
        else if (!strcmp(a, "--dtype") && val) dtype = !strcmp(argv[++i], "fp32");
        else if (!strcmp(a, "--impl") && val) {
            const char *n = argv[++i];
            use_cudnn = !strcmp(n, "cudnn");
            impl = !strcmp(n, "mma") ? 1 : !strcmp(n, "sm90") ? 2 : 0;
            if (!use_cudnn && !impl && strcmp(n, "kernels")) impl = -1;
        }
        else if (!strcmp(a, "--nondeterministic")) nondet = 1;
        else if (!strcmp(a, "--window") && val) window = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: cuda_attention [--S LIST] [--D LIST] [--bh N] [--H N] [--Hkv N] [--iters K] "
                            "[--dtype bf16|fp32] [--impl kernels|mma|sm90|cudnn] [--nondeterministic] [--window W]\n");
            return 2;
        }
    }
    if (Hkv < 0) Hkv = H;
    if (nS <= 0 || nD <= 0 || H <= 0 || Hkv <= 0 || H % Hkv || bh % H || iters <= 0 || window < 0 ||
        impl < 0 || (window && (use_cudnn || impl == 2)) || (impl == 2 && dtype)) {
        fprintf(stderr, "cuda_attention: bad arguments (B*H must be a multiple of H, H of Hkv; --window is for the "
                        "library's mma.sync kernels; --impl sm90 is bf16 only)\n");
        return 2;
    }
    if (mt_device_count(why, sizeof why) <= 0) {
        fprintf(stderr, "cuda_attention: %s\n", why);
        return 1;
    }
    char name[128];
    if (mt_device_name(mt_device_current(), name, sizeof name) != 0) {
        fprintf(stderr, "cuda_attention: cannot describe the current device\n");
        return 1;
    }
    mt_cudnn_attn *cudnn = NULL;
    if (use_cudnn) {
        if (dtype) {
            fprintf(stderr, "cuda_attention: --impl cudnn is bf16 only\n");
            return 2;
        }
        if (!(cudnn = mt_cudnn_attn_create(!nondet, cudnn_why, sizeof cudnn_why))) {
            fprintf(stderr, "cuda_attention: cuDNN: %s\n", cudnn_why);
            return 1;
        }
        printf("cuDNN %zu, %s backward\n", mt_cudnn_attn_version(cudnn),
               mt_cudnn_attn_deterministic(cudnn) ? "deterministic" : "non-deterministic");
    }
    printf("%s, %s, B*H = %d (H %d, Hkv %d), median of %d calls, %s", name, dtype ? "fp32" : "bf16", bh, H, Hkv,
           iters,
           cudnn         ? "cuDNN"
           : impl == 2   ? "the library's Hopper kernels"
           : impl == 1   ? "the library's mma.sync kernels"
                         : "the library's kernels as the calls choose them");
    if (window) printf(", a sliding window of %d keys", window);
    printf("\n");
    printf("%5s %6s | %9s %9s | %9s %9s | %s\n", "D", "S", "fwd ms", "TFLOP/s", "bwd ms", "TFLOP/s", "workspace GiB");
    for (int di = 0; di < nD; di++)
        for (int si = 0; si < nS; si++) {
            problem p = {.dtype = dtype, .B = bh / H, .S = Ss[si], .H = H, .Hkv = Hkv, .D = Ds[di], .cudnn = cudnn,
                         .impl = impl};
            p.scale = 1.0f / sqrtf((float)p.D);
            if (cudnn && (mt_cudnn_attn_forward_workspace(cudnn, p.B, p.S, p.H, p.Hkv, p.D, &p.fws, cudnn_why,
                                                          sizeof cudnn_why) ||
                          mt_cudnn_attn_backward_workspace(cudnn, p.B, p.S, p.H, p.Hkv, p.D, &p.bws, cudnn_why,
                                                           sizeof cudnn_why))) {
                printf("%5d %6d | refused by cuDNN: %s\n", p.D, p.S, cudnn_why);
                cudnn_why[0] = '\0';
                continue;
            }
            const size_t elem = dtype ? 4 : 2;
            const size_t nq = (size_t)p.B * p.S * p.H * p.D, nkv = (size_t)p.B * p.S * p.Hkv * p.D;
            void **bufs[] = {&p.q, &p.out, &p.dout, &p.dq, &p.k, &p.v, &p.dk, &p.dv};
            for (int i = 0; i < 8; i++) {
                const size_t n = i < 4 ? nq : nkv;
                device_ok(mt_device_malloc(bufs[i], n * elem, why, sizeof why), "malloc");
                check(mt_cuattn_fill_random(NULL, dtype, *bufs[i], n, 1000 + (uint64_t)i, 1.0f), "fill");
            }
            void *lse;
            device_ok(mt_device_malloc(&lse, (size_t)p.B * p.H * p.S * 4, why, sizeof why), "malloc");
            p.lse = lse;
            if (window) { /* each query's first key: the later of 0 and i - W + 1 */
                int32_t *h = calloc((size_t)p.B * p.S, sizeof *h);
                void *st;
                if (!h) return 1;
                mt_window_starts(h, h, p.B, p.S, window);
                device_ok(mt_device_malloc(&st, (size_t)p.B * p.S * 4, why, sizeof why), "malloc");
                device_ok(mt_device_copy_h2d(st, h, (size_t)p.B * p.S * 4, why, sizeof why), "copy");
                free(h);
                p.st = st;
            }
            p.wsb = impl == 2 ? mt_cuattn_sm90_workspace_bytes(p.B, p.S, p.H, p.Hkv, p.D)
                              : mt_cuattn_workspace_bytes(p.B, p.S, p.H, p.Hkv, p.D);
            if (p.fws > p.wsb) p.wsb = p.fws;
            if (p.bws > p.wsb) p.wsb = p.bws;
            if (p.wsb == 0) p.wsb = 256; /* the Hopper forward alone needs none */
            if (mt_device_malloc(&p.ws, p.wsb, why, sizeof why) != 0) {
                printf("%5d %6d | workspace of %.2f GiB does not fit: %s\n", p.D, p.S, (double)p.wsb / (1 << 30), why);
                for (int i = 0; i < 8; i++) mt_device_free(*bufs[i]);
                mt_device_free(p.lse);
                mt_device_free(p.st);
                continue;
            }
            check(run_fwd(&p), "forward"); /* real out and lse for the backward */
            const double W = window && window < p.S ? window : p.S;
            const double flop = 4.0 * bh * (p.S * W - W * W / 2) * p.D;
            const double tf = time_it(run_fwd, &p, iters);
            if (impl == 2 && !mt_cuattn_sm90_bwd_head_dim_ok(p.D)) /* a forward without its Hopper backward */
                printf("%5d %6d | %9.3f %9.1f | %9s %9s | %.2f\n", p.D, p.S, tf * 1e3, flop / tf * 1e-12, "-", "-",
                       (double)p.wsb / (1 << 30));
            else {
                const double tb = time_it(run_bwd, &p, iters);
                printf("%5d %6d | %9.3f %9.1f | %9.3f %9.1f | %.2f\n", p.D, p.S, tf * 1e3, flop / tf * 1e-12, tb * 1e3,
                       2.5 * flop / tb * 1e-12, (double)p.wsb / (1 << 30));
            }
            fflush(stdout);
            for (int i = 0; i < 8; i++) mt_device_free(*bufs[i]);
            mt_device_free(p.lse);
            mt_device_free(p.ws);
            mt_device_free(p.st);
        }
    mt_cudnn_attn_destroy(cudnn);
    return 0;
}

#else

int main(void)
{
    fprintf(stderr, "cuda_attention: built without CUDA\n");
    return 1;
}

#endif
