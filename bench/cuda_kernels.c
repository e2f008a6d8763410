/* Bandwidth of the CUDA backend's own kernels (cuda/kernels/kernels.h) at the shapes
 * of a 7-8B model's micro-batch: T = 16384 tokens, C = 4096, 32 heads of
 * 128, F = 14336, V = 152064 (Qwen2's vocabulary), in both activation
 * dtypes. Each line: the bytes a kernel must move (each input read once,
 * each output written once; the RMSNorm backward's dx is read and written),
 * the time per call (the best of 5 runs of enough calls to last ~50 ms,
 * timed on the host around back-to-back launches on the default stream),
 * and GB/s = bytes / time, with the fraction of the H200's 4.8 TB/s.
 * Usage: cuda_kernels [-v] [-s] [filter]
 *   -v      also the kernels' variants (mt_cu_tuning)
 *   -s      instead, every kernel once at small awkward shapes, in buffers of
 *           exact size: for compute-sanitizer
 *   filter  only the lines whose name contains it */
#define _POSIX_C_SOURCE 199309L
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda/kernels/kernels.h"
#include "model/template.h"
#include "device/device.h"

#define PEAK_GBS 4800.0

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static char why[256]; /* the device layer's reason for a failed call */

static void *dalloc(size_t bytes)
{
    void *p;
    if (mt_device_malloc(&p, bytes, why, sizeof why) != 0 || !p) {
        fprintf(stderr, "cuda_kernels: %s\n", bytes ? why : "an allocation of 0 bytes");
        exit(1);
    }
    return p;
}

/* A blocking copy to the device; exits on failure. */
static void h2d(void *dst, const void *src, size_t bytes)
{
    if (mt_device_copy_h2d(dst, src, bytes, why, sizeof why) != 0) {
        fprintf(stderr, "cuda_kernels: %s\n", why);
        exit(1);
    }
}

/* Waits for the device: 0, or -1 when its work failed (the reason in why). */
static int dsync(void) { return mt_device_sync(why, sizeof why); }

/* Fills n floats of device memory (as fp32 or bf16 bits) with values in [lo, hi). */
static void dfill(void *d, mt_cu_dtype dt, size_t n, float lo, float hi)
{
    const size_t chunk = (size_t)1 << 22;
    float *h = malloc(chunk * sizeof(float));
    if (!h) exit(1);
    uint64_t s = 12345;
    for (size_t i0 = 0; i0 < n; i0 += chunk) {
        const size_t m = n - i0 < chunk ? n - i0 : chunk;
        for (size_t i = 0; i < m; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            h[i] = lo + (hi - lo) * (float)((double)(s >> 40) / (double)(1ull << 24));
        }
        void *dst = (char *)d + i0 * mt_cu_dtype_size(dt);
        if (dt == MT_CU_BF16) {
            uint16_t *b = (uint16_t *)h; /* in place, front to back: b[i] is written after h[i] is read */
            for (size_t i = 0; i < m; i++) {
                uint32_t u;
                memcpy(&u, &h[i], 4);
                b[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
            }
        }
        h2d(dst, h, m * mt_cu_dtype_size(dt));
    }
    free(h);
}

typedef int (*bench_fn)(void *ctx);

static const char *filter;
static int variants; /* also time the variants (mt_cu_tuning) */

/* Times fn and prints a line. */
static void run(const char *name, bench_fn fn, void *ctx, double bytes)
{
    if (filter && !strstr(name, filter)) return;
    if (fn(ctx) != 0 || dsync() != 0) {
        printf("%-44s FAILED\n", name);
        return;
    }
    double t0 = now();
    fn(ctx);
    dsync();
    const double one = now() - t0;
    int iters = (int)(0.05 / (one > 1e-6 ? one : 1e-6));
    iters = iters < 3 ? 3 : iters > 2000 ? 2000 : iters;
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        t0 = now();
        for (int i = 0; i < iters; i++) fn(ctx);
        if (dsync() != 0) {
            printf("%-44s FAILED\n", name);
            return;
        }
        const double t = (now() - t0) / iters;
        best = t < best ? t : best;
    }
    const double gbs = bytes / best * 1e-9;
    printf("%-44s %9.1f us %8.1f GB/s %5.1f%%\n", name, best * 1e6, gbs, 100.0 * gbs / PEAK_GBS);
    fflush(stdout);
}

/* ---- the cases ------------------------------------------------------------------- */

enum { T = 16384, C = 4096, NH = 32, HD = 128, F = 14336, V = 152064, CE_ROWS = 1024 };

typedef struct {
    mt_cu_dtype dt, xdt;
    void *x, *y, *w, *dy, *dx, *dw, *rstd, *scratch, *pos, *inv, *a, *b, *c, *d, *e, *tok, *loss;
    size_t n;
    mt_cu_tuning tune; /* the variant timed (RMSNorm, cross-entropy) */
} ctx_t;

static int f_rmsnorm(void *p)
{
    ctx_t *c = p;
    return mt_cu_rmsnorm(NULL, c->dt, c->y, c->rstd, c->xdt, c->x, c->w, T, C, 1e-5f, 0.0f, &c->tune);
}
static int f_rmsnorm_bwd(void *p)
{
    ctx_t *c = p;
    return mt_cu_rmsnorm_bwd(NULL, c->dx, c->dw, c->dy, c->xdt, c->x, c->dt, c->w, c->rstd, T, C, 1e-5f, 0.0f, c->scratch,
                             &c->tune);
}
static int f_rope(void *p)
{
    ctx_t *c = p;
    return mt_cu_rope(NULL, c->dt, c->x, c->pos, c->inv, T, NH, HD, HD, 1.0f, 0);
}
static int f_swiglu(void *p)
{
    ctx_t *c = p;
    return mt_cu_glu(NULL, c->dt, MT_GLU_SILU, c->c, c->a, c->b, c->n);
}
static int f_swiglu_bwd(void *p)
{
    ctx_t *c = p;
    return mt_cu_glu_bwd(NULL, c->dt, MT_GLU_SILU, c->d, c->e, c->c, c->a, c->b, c->n);
}
static int f_to_bf16(void *p)
{
    ctx_t *c = p;
    return mt_cu_convert(NULL, MT_CU_BF16, c->b, MT_CU_F32, c->a, c->n);
}
static int f_to_f32(void *p)
{
    ctx_t *c = p;
    return mt_cu_convert(NULL, MT_CU_F32, c->a, MT_CU_BF16, c->b, c->n);
}
static int f_add(void *p)
{
    ctx_t *c = p;
    return mt_cu_add(NULL, MT_CU_F32, c->c, MT_CU_F32, c->a, MT_CU_BF16, c->b, c->n);
}
static int f_scale(void *p)
{
    ctx_t *c = p;
    return mt_cu_scale(NULL, MT_CU_F32, c->a, 1.0f, c->n);
}
static int f_embed(void *p)
{
    ctx_t *c = p;
    return mt_cu_embedding(NULL, c->dt, c->y, c->tok, c->dt, c->w, T, C, V, 1.0f);
}
static int f_embed_bwd(void *p)
{
    ctx_t *c = p;
    return mt_cu_embedding_bwd(NULL, c->dw, c->tok, c->dy, T, C, V, 1.0f, -1, c->scratch);
}
static int f_ce(void *p)
{
    ctx_t *c = p;
    return mt_cu_cross_entropy(NULL, c->x, c->tok, CE_ROWS, V, 1.0f / 16384, 0.0f, -100, c->dt, c->y, c->loss, NULL,
                               c->scratch, &c->tune);
}
static int f_sumsq(void *p)
{
    ctx_t *c = p;
    return mt_cu_sumsq(NULL, c->loss, c->a, c->n, c->scratch);
}
static int f_bias(void *p)
{
    ctx_t *c = p;
    return mt_cu_bias_grad(NULL, c->dw, c->dt, c->dy, T, C, c->scratch);
}

static void bench_norm_rope(mt_cu_dtype dt, mt_cu_dtype xdt)
{
    const size_t n = (size_t)T * C, es = mt_cu_dtype_size(dt), xs = mt_cu_dtype_size(xdt);
    ctx_t c = {.dt = dt, .xdt = xdt};
    c.x = dalloc(n * xs), c.y = dalloc(n * es), c.w = dalloc(C * es), c.rstd = dalloc(T * 4);
    c.dy = dalloc(n * 4), c.dx = dalloc(n * 4), c.dw = dalloc(C * 4);
    mt_cu_tuning_default(&c.tune);
    mt_cu_tuning_set(&c.tune, MT_CU_TUNE_RMS_BWD_CHUNKS, 4096); /* the most scratch any variant needs */
    c.scratch = dalloc(mt_cu_rmsnorm_bwd_scratch_bytes(T, C, &c.tune));
    mt_cu_tuning_default(&c.tune);
    dfill(c.x, xdt, n, -2, 2), dfill(c.w, dt, C, 0.5f, 1.5f), dfill(c.dy, MT_CU_F32, n, -1, 1);
    dfill(c.dx, MT_CU_F32, n, -1, 1), dfill(c.dw, MT_CU_F32, C, -1, 1);
    const char *xn = xdt == MT_CU_BF16 ? "bf16" : "f32", *wn = dt == MT_CU_BF16 ? "bf16" : "f32";
    char name[96];
    /* the default first, then the variants (mt_cu_tuning) when asked for */
    const int emins[] = {0, 1, 2, 4};
    for (int ei = 0; ei < (variants ? 4 : 1); ei++) {
        if (emins[ei]) mt_cu_tuning_set(&c.tune, MT_CU_TUNE_RMS_FWD_EMIN, emins[ei]);
        snprintf(name, sizeof name, "rmsnorm x %s -> y %s  %dx%d", xn, wn, T, C);
        if (emins[ei]) snprintf(name + strlen(name), sizeof name - strlen(name), " [emin %d]", emins[ei]);
        run(name, f_rmsnorm, &c, (double)n * (xs + es) + T * 4.0);
    }
    mt_cu_tuning_default(&c.tune);
    snprintf(name, sizeof name, "rmsnorm_bwd x %s w %s (dy,dx f32)", xn, wn);
    run(name, f_rmsnorm_bwd, &c, (double)n * (xs + 4 + 8));
    if (variants) {
        const int chunks[] = {512, 1024, 2048};
        for (int emin = 1; emin <= 2; emin++)
            for (int pf = 0; pf < 2; pf++)
                for (int ci = 0; ci < 3; ci++) {
                    mt_cu_tuning_set(&c.tune, MT_CU_TUNE_RMS_BWD_EMIN, emin);
                    mt_cu_tuning_set(&c.tune, MT_CU_TUNE_RMS_BWD_PREFETCH, pf);
                    mt_cu_tuning_set(&c.tune, MT_CU_TUNE_RMS_BWD_CHUNKS, chunks[ci]);
                    snprintf(name, sizeof name, "rmsnorm_bwd x %s w %s [emin %d pf %d chunks %d]", xn, wn, emin, pf,
                             chunks[ci]);
                    run(name, f_rmsnorm_bwd, &c, (double)n * (xs + 4 + 8));
                }
        mt_cu_tuning_default(&c.tune);
    }
    if (dt == xdt) { /* RoPE on q: (T, 32, 128), x reused */
        const size_t nq = (size_t)T * NH * HD;
        int32_t *pos = malloc(T * sizeof(int32_t));
        float inv[HD / 2];
        for (int t = 0; t < T; t++) pos[t] = t % 4096;
        for (int i = 0; i < HD / 2; i++) inv[i] = 1.0f / powf(10000.0f, (float)(2 * i) / HD);
        c.pos = dalloc(T * sizeof(int32_t)), c.inv = dalloc(sizeof inv);
        h2d(c.pos, pos, T * sizeof(int32_t));
        h2d(c.inv, inv, sizeof inv);
        snprintf(name, sizeof name, "rope %s  %dx%dx%d", dt == MT_CU_BF16 ? "bf16" : "f32", T, NH, HD);
        run(name, f_rope, &c, (double)nq * es * 2);
        free(pos);
        mt_device_free(c.pos), mt_device_free(c.inv);
    }
    mt_device_free(c.x), mt_device_free(c.y), mt_device_free(c.w), mt_device_free(c.rstd), mt_device_free(c.dy);
    mt_device_free(c.dx), mt_device_free(c.dw), mt_device_free(c.scratch);
}

static void bench_swiglu(mt_cu_dtype dt)
{
    const size_t n = (size_t)T * F, es = mt_cu_dtype_size(dt);
    ctx_t c = {.dt = dt, .n = n};
    c.a = dalloc(n * es), c.b = dalloc(n * es), c.c = dalloc(n * es), c.d = dalloc(n * es), c.e = dalloc(n * es);
    dfill(c.a, dt, n, -6, 6), dfill(c.b, dt, n, -2, 2), dfill(c.c, dt, n, -1, 1);
    char name[96];
    snprintf(name, sizeof name, "swiglu %s  %dx%d", dt == MT_CU_BF16 ? "bf16" : "f32", T, F);
    run(name, f_swiglu, &c, (double)n * es * 3);
    dfill(c.c, dt, n, -1, 1);
    snprintf(name, sizeof name, "swiglu_bwd %s", dt == MT_CU_BF16 ? "bf16" : "f32");
    run(name, f_swiglu_bwd, &c, (double)n * es * 5);
    mt_device_free(c.a), mt_device_free(c.b), mt_device_free(c.c), mt_device_free(c.d), mt_device_free(c.e);
}

static void bench_elementwise(void)
{
    const size_t n = (size_t)T * C;
    ctx_t c = {.n = n};
    c.a = dalloc(n * 4), c.b = dalloc(n * 2), c.c = dalloc(n * 4);
    dfill(c.a, MT_CU_F32, n, -1, 1), dfill(c.b, MT_CU_BF16, n, -1, 1);
    run("convert f32 -> bf16  16384x4096", f_to_bf16, &c, (double)n * 6);
    run("convert bf16 -> f32", f_to_f32, &c, (double)n * 6);
    run("add f32 = f32 + bf16", f_add, &c, (double)n * 10);
    run("scale f32 in place", f_scale, &c, (double)n * 8);
    mt_device_free(c.a), mt_device_free(c.b), mt_device_free(c.c);
}

static void bench_embedding(void)
{
    const size_t n = (size_t)T * C;
    ctx_t c = {.dt = MT_CU_BF16};
    int32_t *tok = malloc(T * sizeof(int32_t));
    uint64_t s = 7;
    for (int t = 0; t < T; t++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        tok[t] = (int32_t)((s >> 33) % V);
    }
    c.tok = dalloc(T * sizeof(int32_t));
    h2d(c.tok, tok, T * sizeof(int32_t));
    c.w = dalloc((size_t)V * C * 2), c.y = dalloc(n * 2), c.dy = dalloc(n * 4), c.dw = dalloc((size_t)V * C * 4);
    c.scratch = dalloc(mt_cu_embedding_bwd_scratch_bytes(T));
    mt_cu_zero(NULL, c.w, (size_t)V * C * 2), dfill(c.dy, MT_CU_F32, n, -1, 1); /* values do not matter */
    mt_cu_zero(NULL, c.dw, (size_t)V * C * 4);
    run("embedding bf16  16384 of 152064x4096", f_embed, &c, (double)n * 4);
    /* dout read, and each touched dwte row read and written (random tokens: ~all distinct) */
    run("embedding_bwd f32 (sort + per-token rows)", f_embed_bwd, &c, (double)n * 12);
    free(tok);
    mt_device_free(c.tok), mt_device_free(c.w), mt_device_free(c.y), mt_device_free(c.dy), mt_device_free(c.dw);
    mt_device_free(c.scratch);
}

static void bench_ce(mt_cu_dtype dt)
{
    const size_t n = (size_t)CE_ROWS * V;
    ctx_t c = {.dt = dt};
    mt_cu_tuning_default(&c.tune);
    int32_t *tg = malloc(CE_ROWS * sizeof(int32_t));
    for (int r = 0; r < CE_ROWS; r++) tg[r] = (r * 7919) % V;
    c.tok = dalloc(CE_ROWS * sizeof(int32_t));
    h2d(c.tok, tg, CE_ROWS * sizeof(int32_t));
    c.x = dalloc(n * 4), c.y = dalloc(n * mt_cu_dtype_size(dt)), c.loss = dalloc(sizeof(double));
    c.scratch = dalloc(mt_cu_cross_entropy_scratch_bytes(CE_ROWS));
    dfill(c.x, MT_CU_F32, n, -8, 8);
    mt_cu_zero(NULL, c.loss, sizeof(double));
    char name[96];
    snprintf(name, sizeof name, "cross_entropy -> %s  %dx%d", dt == MT_CU_BF16 ? "bf16" : "f32", CE_ROWS, V);
    run(name, f_ce, &c, (double)n * (4 + mt_cu_dtype_size(dt))); /* logits read once (the second pass: L2) */
    if (variants) {
        const int threads[] = {512, 1024};
        for (int cl = 0; cl < 2; cl++)
            for (int ti = 0; ti < 2; ti++)
                for (int rev = 0; rev < 2 - cl; rev++) {
                    mt_cu_tuning_set(&c.tune, MT_CU_TUNE_CE_CLUSTER, cl);
                    mt_cu_tuning_set(&c.tune, MT_CU_TUNE_CE_THREADS, threads[ti]);
                    mt_cu_tuning_set(&c.tune, MT_CU_TUNE_CE_REVERSE, rev);
                    snprintf(name, sizeof name, "cross_entropy -> %s [cluster %d threads %d rev %d]",
                             dt == MT_CU_BF16 ? "bf16" : "f32", cl, threads[ti], rev);
                    run(name, f_ce, &c, (double)n * (4 + mt_cu_dtype_size(dt)));
                }
        mt_cu_tuning_default(&c.tune);
    }
    free(tg);
    mt_device_free(c.tok), mt_device_free(c.x), mt_device_free(c.y), mt_device_free(c.loss), mt_device_free(c.scratch);
}

static void bench_reductions(void)
{
    ctx_t c = {.dt = MT_CU_BF16, .n = (size_t)1 << 30};
    c.a = dalloc(c.n * 4), c.loss = dalloc(sizeof(double)), c.scratch = dalloc(mt_cu_sumsq_scratch_bytes());
    mt_cu_zero(NULL, c.a, c.n * 4); /* values do not matter */
    run("sumsq f32  2^30", f_sumsq, &c, (double)c.n * 4);
    mt_device_free(c.a), mt_device_free(c.loss), mt_device_free(c.scratch);
    c.dy = dalloc((size_t)T * C * 2), c.dw = dalloc(C * 4), c.scratch = dalloc(mt_cu_bias_grad_scratch_bytes(T, C));
    dfill(c.dy, MT_CU_BF16, (size_t)T * C, -1, 1);
    run("bias_grad bf16  16384x4096", f_bias, &c, (double)T * C * 2);
    mt_device_free(c.dy), mt_device_free(c.dw), mt_device_free(c.scratch);
}

/* ---- smoke: every kernel and path once at small awkward shapes, in buffers of
 * exactly the sizes the contracts give (for compute-sanitizer) ------------------ */

static int smoke_fails;

static void chk(int rc, const char *what)
{
    if (rc != 0 || dsync() != 0) {
        printf("smoke: %s FAILED\n", what);
        smoke_fails++;
    }
}

/* n elements of dt at an offset of off elements into an allocation of exactly n + off */
static void *sbuf(mt_cu_dtype dt, size_t n, size_t off)
{
    char *p = dalloc((n + off) * mt_cu_dtype_size(dt));
    dfill(p, dt, n + off, -1, 1);
    return p + off * mt_cu_dtype_size(dt);
}
static void sfree(void *p, mt_cu_dtype dt, size_t off) { mt_device_free((char *)p - off * mt_cu_dtype_size(dt)); }

static void smoke(void)
{
    const mt_cu_dtype dts[] = {MT_CU_BF16, MT_CU_F32};
    for (int di = 0; di < 2; di++) {
        const mt_cu_dtype dt = dts[di];
        const int Cs[] = {96, 100, 4096, 24000};
        for (int ci = 0; ci < 4; ci++) {
            const int Tn = 37, Cn = Cs[ci];
            const size_t n = (size_t)Tn * Cn;
            void *x = sbuf(dt, n, 0), *y = sbuf(dt, n, 0), *w = sbuf(dt, Cn, 0), *r = sbuf(MT_CU_F32, Tn, 0);
            void *dy = sbuf(MT_CU_F32, n, 0), *dx = sbuf(MT_CU_F32, n, 0), *dw = sbuf(MT_CU_F32, Cn, 0);
            void *scr = dalloc(mt_cu_rmsnorm_bwd_scratch_bytes(Tn, Cn, NULL));
            chk(mt_cu_rmsnorm(NULL, dt, y, r, dt, x, w, Tn, Cn, 1e-5f, 0.0f, NULL), "rmsnorm");
            chk(mt_cu_rmsnorm_bwd(NULL, dx, dw, dy, dt, x, dt, w, r, Tn, Cn, 1e-5f, 0.0f, scr, NULL), "rmsnorm_bwd");
            chk(mt_cu_rmsnorm_bwd(NULL, dx, dw, dy, dt, x, dt, w, NULL, Tn, Cn, 1e-5f, 0.0f, scr, NULL),
                "rmsnorm_bwd no rstd");
            chk(mt_cu_rmsnorm_bwd(NULL, dx, NULL, dy, dt, x, dt, w, r, Tn, Cn, 1e-5f, 0.0f, NULL, NULL),
                "rmsnorm_bwd dx only");
            void *bscr = dalloc(mt_cu_bias_grad_scratch_bytes(Tn, Cn));
            chk(mt_cu_bias_grad(NULL, dw, dt, x, Tn, Cn, bscr), "bias_grad");
            mt_device_free(bscr);
            sfree(x, dt, 0), sfree(y, dt, 0), sfree(w, dt, 0), sfree(r, MT_CU_F32, 0), sfree(dy, MT_CU_F32, 0);
            sfree(dx, MT_CU_F32, 0), sfree(dw, MT_CU_F32, 0), mt_device_free(scr);
        }
        const int Ds[] = {128, 6, 80};
        for (int i = 0; i < 3; i++) {
            const int Tn = 7, nh = 3, D = Ds[i];
            int32_t pos[7] = {0, 1, 2, 100, 4000, 131071, 200000};
            float inv[64];
            for (int k = 0; k < D / 2; k++) inv[k] = 1.0f / powf(10000.0f, (float)(2 * k) / D);
            void *x = sbuf(dt, (size_t)Tn * nh * D, 0), *dp = dalloc(sizeof pos), *di_ = dalloc((size_t)D / 2 * 4);
            h2d(dp, pos, sizeof pos), h2d(di_, inv, (size_t)D / 2 * 4);
            chk(mt_cu_rope(NULL, dt, x, dp, di_, Tn, nh, D, D, 1.0f, 0), "rope");
            chk(mt_cu_rope(NULL, dt, x, dp, di_, Tn, nh, D, D, 1.0f, 1), "rope inverse");
            sfree(x, dt, 0), mt_device_free(dp), mt_device_free(di_);
        }
        for (size_t off = 0; off < 2; off++) {
            const size_t n = 1003;
            void *a = sbuf(dt, n, off), *b = sbuf(dt, n, off), *c = sbuf(dt, n, off), *d = sbuf(dt, n, off);
            void *f = sbuf(MT_CU_F32, n, off), *e = sbuf(dt, n, off);
            chk(mt_cu_glu(NULL, dt, MT_GLU_SILU, c, a, b, n), "swiglu");
            chk(mt_cu_glu_bwd(NULL, dt, MT_GLU_SILU, d, e, c, a, b, n), "swiglu_bwd");
            chk(mt_cu_convert(NULL, dt, a, MT_CU_F32, f, n), "convert");
            chk(mt_cu_convert(NULL, MT_CU_F32, f, dt, b, n), "convert back");
            chk(mt_cu_add(NULL, MT_CU_F32, f, MT_CU_F32, f, dt, a, n), "add");
            chk(mt_cu_scale(NULL, dt, a, 0.5f, n), "scale");
            void *sum = dalloc(sizeof(double)), *sscr = dalloc(mt_cu_sumsq_scratch_bytes());
            mt_cu_zero(NULL, sum, sizeof(double));
            chk(mt_cu_sumsq(NULL, sum, f, n, sscr), "sumsq");
            mt_device_free(sum), mt_device_free(sscr);
            sfree(a, dt, off), sfree(b, dt, off), sfree(c, dt, off), sfree(d, dt, off), sfree(e, dt, off);
            sfree(f, MT_CU_F32, off);
        }
        const int eCs[] = {96, 98};
        for (int i = 0; i < 2; i++) {
            const int Tn = 37, Cn = eCs[i], Vn = 1000;
            int32_t tok[37];
            for (int t = 0; t < Tn; t++) tok[t] = (t * 7) % 5 + (t == 3 ? Vn - 1 : 0) - (t == 4 ? 100 : 0);
            void *dt_ = dalloc(sizeof tok), *wte = sbuf(dt, (size_t)Vn * Cn, 0), *out = sbuf(dt, (size_t)Tn * Cn, 0);
            void *dwte = sbuf(MT_CU_F32, (size_t)Vn * Cn, 0), *dout = sbuf(MT_CU_F32, (size_t)Tn * Cn, 0);
            void *escr = dalloc(mt_cu_embedding_bwd_scratch_bytes(Tn));
            h2d(dt_, tok, sizeof tok);
            chk(mt_cu_embedding(NULL, dt, out, dt_, dt, wte, Tn, Cn, Vn, 1.0f), "embedding");
            chk(mt_cu_embedding_bwd(NULL, dwte, dt_, dout, Tn, Cn, Vn, 1.0f, -1, escr), "embedding_bwd");
            mt_device_free(dt_), sfree(wte, dt, 0), sfree(out, dt, 0), sfree(dwte, MT_CU_F32, 0);
            sfree(dout, MT_CU_F32, 0), mt_device_free(escr);
        }
        const int Vs[] = {1000, 1001, 32000, 152064, 3};
        mt_cu_tuning tu;
        mt_cu_tuning_default(&tu);
        for (int cl = 0; cl < 2; cl++)
            for (int i = 0; i < 5; i++) {
                mt_cu_tuning_set(&tu, MT_CU_TUNE_CE_CLUSTER, cl);
                const int nr = 5, Vn = Vs[i];
                int32_t tg[5] = {0, -100, Vn - 1, 1 % Vn, 2 % Vn};
                void *dtg = dalloc(sizeof tg), *lg = sbuf(MT_CU_F32, (size_t)nr * Vn, 0);
                void *dl = sbuf(dt, (size_t)nr * Vn, 0), *ls = dalloc(sizeof(double)), *cnt = dalloc(sizeof(int));
                void *cscr = dalloc(mt_cu_cross_entropy_scratch_bytes(nr));
                h2d(dtg, tg, sizeof tg);
                chk(mt_cu_cross_entropy(NULL, lg, dtg, nr, Vn, 0.1f, 0.0f, -100, dt, dl, ls, cnt, cscr, &tu),
                    "cross_entropy");
                chk(mt_cu_cross_entropy(NULL, lg, dtg, nr, Vn, 0.1f, 0.0f, -100, dt, NULL, ls, NULL, cscr, &tu),
                    "ce loss only");
                if (dt == MT_CU_F32)
                    chk(mt_cu_cross_entropy(NULL, lg, dtg, nr, Vn, 0.1f, 0.0f, -100, dt, lg, ls, cnt, cscr, &tu),
                        "ce in place");
                mt_device_free(dtg), sfree(lg, MT_CU_F32, 0), sfree(dl, dt, 0), mt_device_free(ls), mt_device_free(cnt);
                mt_device_free(cscr);
            }
    }
    printf("smoke: %s\n", smoke_fails ? "FAILED" : "ok");
}

int main(int argc, char **argv)
{
    int a = 1, do_smoke = 0;
    if (a < argc && strcmp(argv[a], "-v") == 0) variants = 1, a++;
    if (a < argc && strcmp(argv[a], "-s") == 0) do_smoke = 1, a++;
    filter = a < argc ? argv[a] : NULL;
    if (mt_device_count(why, sizeof why) <= 0) {
        printf("cuda_kernels: %s\n", why);
        return 0;
    }
    if (do_smoke) {
        smoke();
        return smoke_fails != 0;
    }
    printf("%-44s %12s %13s %6s\n", "kernel, shape", "time", "bandwidth", "of peak");
    bench_norm_rope(MT_CU_BF16, MT_CU_BF16);
    bench_norm_rope(MT_CU_BF16, MT_CU_F32);
    bench_norm_rope(MT_CU_F32, MT_CU_F32);
    bench_swiglu(MT_CU_BF16);
    bench_swiglu(MT_CU_F32);
    bench_elementwise();
    bench_embedding();
    bench_ce(MT_CU_BF16);
    bench_ce(MT_CU_F32);
    bench_reductions();
    return 0;
}
