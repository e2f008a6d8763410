/* The CUDA backend's own kernels (cuda/kernels/kernels.h) against the CPU reference
 * ops (src/cpu/cpu_ops.h), in both activation dtypes, on awkward shapes (row
 * lengths that are and are not multiples of 8, rows long enough for every
 * register layout, token counts that are multiples of nothing), plus
 * run-to-run determinism of every reduction. Each test skips on a machine
 * without a CUDA device (fails under MT_REQUIRE_GPU=1, tests/gpu.h). Device
 * memory goes through the device layer (src/device/device.h).
 *
 * bf16 mode: the inputs are rounded to bf16 first and the CPU reference is
 * run in fp32 on the rounded values, so the only differences are the GPU's
 * fp32 arithmetic and the final rounding of its output to bf16. bf16 keeps
 * 8 significant bits, so rounding v to nearest moves it by at most half an
 * ulp, 2^-8 |v| (2^-9 of the binade's top); BF16_TOL below is that bound
 * plus the fp32 part's own tolerance.
 *
 * fp32 mode tolerances are stated at each check, in units of u = 2^-24 (half
 * an fp32 ulp relative): the kernels spell out the CPU's rounding steps
 * (no fused multiply-adds where the CPU has none), so what differs is the
 * library exp / sin / cos (CUDA's expf, sincosf: <= 2 ulp; the CPU's
 * Cephes expf <= 2 ulp, glibc's cosf / sinf < 1 ulp) and the order of
 * reductions. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels/kernels.h"
#include "cuda/kernels/moe.h"
#include "model/template.h"
#include "device/device.h"
#include "optim/adamw.h"
#include "core/bf16.h"
#include "cpu/cpu_moe.h"
#include "cpu/cpu_ops.h"
#include "gpu.h"
#include "rng.h"

#define U24 5.9604644775390625e-08 /* 2^-24 */
#define BF16_TOL 3.90625e-03       /* 2^-8 */

static char why[256]; /* the device layer's reason for a failed call */

#define NEED_GPU()                                                                                                     \
    do {                                                                                                               \
        if (mt_device_count(why, sizeof why) <= 0) MT_GPU_MISSING("%s", why);                                          \
    } while (0)

/* Blocking copies; a failure fails the test with the device layer's reason. */
#define H2D(dst, src, bytes) cr_assert(mt_device_copy_h2d(dst, src, bytes, why, sizeof why) == 0, "%s", why)
#define D2H(dst, src, bytes) cr_assert(mt_device_copy_d2h(dst, src, bytes, why, sizeof why) == 0, "%s", why)

/* ---- helpers ------------------------------------------------------------------ */


/* uniform in [lo, hi) */
static float uni(float lo, float hi)
{
    return lo + (hi - lo) * (float)((double)(next_u64() >> 40) / (double)(1ull << 24));
}

static void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    cr_assert(p, "out of host memory");
    return p;
}

/* Device memory of bytes (> 0); a failure fails the test. */
static void *dev_alloc(size_t bytes)
{
    void *d;
    cr_assert(mt_device_malloc(&d, bytes, why, sizeof why) == 0 && d, "%zu bytes: %s", bytes, why);
    return d;
}

static const char *dtn(mt_cu_dtype dt) { return dt == MT_CU_BF16 ? "bf16" : "f32"; }

/* A tensor on both sides: ref holds the values as the CPU sees them (rounded
 * to bf16 when dt is bf16), dev the same values in dt on the device. `off`
 * elements of padding before the data (1 shifts it off 16-byte alignment,
 * which selects the kernels' scalar paths). */
typedef struct {
    float *ref;
    void *base, *dev;
    mt_cu_dtype dt;
    size_t n;
} tensor;

static void t_upload(tensor *t)
{
    const size_t es = mt_cu_dtype_size(t->dt);
    if (t->dt == MT_CU_BF16) {
        uint16_t *h = xmalloc(t->n * 2);
        for (size_t i = 0; i < t->n; i++) h[i] = mt_f32_to_bf16(t->ref[i]);
        H2D(t->dev, h, t->n * es);
        free(h);
    } else {
        H2D(t->dev, t->ref, t->n * es);
    }
}

/* n values uniform in [lo, hi), rounded to dt */
static tensor t_rand(mt_cu_dtype dt, size_t n, float lo, float hi, size_t off)
{
    const size_t es = mt_cu_dtype_size(dt);
    tensor t = {xmalloc(n * sizeof(float)), NULL, NULL, dt, n};
    for (size_t i = 0; i < n; i++) {
        const float v = uni(lo, hi);
        t.ref[i] = dt == MT_CU_BF16 ? mt_bf16_to_f32(mt_f32_to_bf16(v)) : v;
    }
    t.base = dev_alloc((n + off) * es);
    t.dev = (char *)t.base + off * es;
    t_upload(&t);
    return t;
}

/* The device values as floats (a new array). */
static float *t_fetch(const tensor *t)
{
    float *out = xmalloc(t->n * sizeof(float));
    if (t->dt == MT_CU_BF16) {
        uint16_t *h = xmalloc(t->n * 2);
        D2H(h, t->dev, t->n * 2);
        for (size_t i = 0; i < t->n; i++) out[i] = mt_bf16_to_f32(h[i]);
        free(h);
    } else {
        D2H(out, t->dev, t->n * 4);
    }
    return out;
}

static void t_free(tensor *t)
{
    free(t->ref);
    mt_device_free(t->base);
    memset(t, 0, sizeof *t);
}

static void *dev_upload(const void *h, size_t bytes)
{
    void *d = dev_alloc(bytes);
    H2D(d, h, bytes);
    return d;
}

static void *dev_scratch(size_t bytes)
{
    cr_assert(bytes > 0, "scratch size");
    return dev_alloc(bytes);
}

/* The tolerance of a bf16 output on top of the fp32 one. */
static double out_tol(mt_cu_dtype dt, double ref, double f32_tol)
{
    return (dt == MT_CU_BF16 ? BF16_TOL * fabs(ref) : 0.0) + f32_tol;
}

/* ---- RMSNorm ------------------------------------------------------------------ */

typedef struct { int T, C; } shape2;

/* Row lengths: two multiples of 8 (one a register per thread, one at the
 * 4096 of real models), not a multiple of 8 (the scalar path), and long rows
 * that need 4 and 8 vectors per thread. */
static const shape2 norm_shapes[] = {{37, 96}, {37, 4096}, {13, 100}, {3, 12288}, {3, 24000}, {2, 5003}};
static const mt_cu_dtype norm_dts[][2] = {{MT_CU_F32, MT_CU_F32}, {MT_CU_BF16, MT_CU_BF16}, {MT_CU_F32, MT_CU_BF16}};

/* bf16 mode (x or w in bf16): each thread sums its part of a row's squares
 * (at most 64 terms) in fp32 before the double reduction: within 63u of
 * those terms, so the mean of squares within 63u relative (all terms are
 * positive) and rstd within 32u + the 2 roundings of the fp32 mode. */
static int bf16_mode(mt_cu_dtype xdt, mt_cu_dtype dt) { return xdt == MT_CU_BF16 || dt == MT_CU_BF16; }

/* woff 1: Gemma's norms, whose weights (near 0, either sign) store the scale minus one. */
static void check_rmsnorm_fwd(int T, int C, mt_cu_dtype xdt, mt_cu_dtype dt, const mt_cu_tuning *tu, float woff)
{
    const float eps = 1e-5f;
    const size_t n = (size_t)T * C;
    tensor x = t_rand(xdt, n, -2.0f, 2.0f, 0), w = t_rand(dt, (size_t)C, woff - 0.5f, woff + 0.5f, 0);
    if (woff != 0.0f) /* stored as w - 1: the weights of a scale near 1 */
        for (int c = 0; c < C; c++) w.ref[c] -= woff; /* exact for these values, in both dtypes */
    t_upload(&w);
    tensor y = t_rand(dt, n, 0.0f, 0.0f, 0), r = t_rand(MT_CU_F32, (size_t)T, 0.0f, 0.0f, 0);
    float *yref = xmalloc(n * sizeof(float)), *rref = xmalloc((size_t)T * sizeof(float));
    mt_cpu_rmsnorm(NULL, yref, rref, x.ref, w.ref, T, C, eps, woff);
    cr_assert(mt_cu_rmsnorm(NULL, dt, y.dev, r.dev, xdt, x.dev, w.dev, T, C, eps, woff, tu) == 0);
    float *yg = t_fetch(&y), *rg = t_fetch(&r);
    /* rstd, fp32 mode: the mean of squares is summed in double on both sides
     * (in another order: a relative difference near 1e-16), then rounded and
     * inverted by the same fp32 steps: equal but for a rounding-boundary
     * case, so 2 ulp (4u). bf16 mode: 36u (above), so 40u. */
    const double rtol = bf16_mode(xdt, dt) ? 40 * U24 : 4 * U24;
    for (int t = 0; t < T; t++)
        cr_assert(fabs(rg[t] - rref[t]) <= rtol * rref[t], "%dx%d x %s y %s: rstd[%d] %.9g vs %.9g", T, C, dtn(xdt),
                  dtn(dt), t, rg[t], rref[t]);
    /* y = (woff + w) (x r): the same sum and two products, so y's relative
     * error is r's plus two roundings: 8u (fp32 mode), 48u plus bf16's
     * rounding (bf16 mode). */
    for (size_t i = 0; i < n; i++) {
        const double tol = out_tol(dt, yref[i], (bf16_mode(xdt, dt) ? 48 : 8) * U24 * fabs(yref[i]));
        cr_assert(fabs(yg[i] - yref[i]) <= tol, "%dx%d x %s y %s woff %g: y[%zu] = %.9g, ref %.9g", T, C, dtn(xdt),
                  dtn(dt), woff, i, yg[i], yref[i]);
    }
    free(yref), free(rref), free(yg), free(rg);
    t_free(&x), t_free(&w), t_free(&y), t_free(&r);
}

Test(cuda_kernels, rmsnorm_forward)
{
    NEED_GPU();
    seed(1);
    const int emins[] = {0, 1, 4}; /* every register layout: the default (NULL: 2), then the others */
    mt_cu_tuning tu;
    mt_cu_tuning_default(&tu);
    for (int ei = 0; ei < 3; ei++) {
        if (emins[ei]) cr_assert(mt_cu_tuning_set(&tu, MT_CU_TUNE_RMS_FWD_EMIN, emins[ei]) == 0);
        for (size_t si = 0; si < sizeof norm_shapes / sizeof *norm_shapes; si++)
            for (size_t di = 0; di < 3; di++)
                check_rmsnorm_fwd(norm_shapes[si].T, norm_shapes[si].C, norm_dts[di][0], norm_dts[di][1],
                                  emins[ei] ? &tu : NULL, 0.0f);
    }
    /* rows of at most 256 (several rows a block, G lanes a row): 1 to 32 lanes, a last block part
     * full, the per-head q/k norms of Qwen3 (128) and Gemma 3 (256) */
    const shape2 rows[] = {{77, 8}, {300, 16}, {129, 32}, {4099, 64}, {4099, 128}, {1000, 256}, {33, 200}};
    for (size_t si = 0; si < sizeof rows / sizeof *rows; si++)
        for (size_t di = 0; di < 3; di++) {
            check_rmsnorm_fwd(rows[si].T, rows[si].C, norm_dts[di][0], norm_dts[di][1], NULL, 0.0f);
            check_rmsnorm_fwd(rows[si].T, rows[si].C, norm_dts[di][0], norm_dts[di][1], NULL, 1.0f);
        }
}

/* Gemma's (1 + w) against mt_cpu_rmsnorm(..., 1.0f), every shape and dtype pair */
Test(cuda_kernels, rmsnorm_forward_offset)
{
    NEED_GPU();
    seed(21);
    for (size_t si = 0; si < sizeof norm_shapes / sizeof *norm_shapes; si++)
        for (size_t di = 0; di < 3; di++)
            check_rmsnorm_fwd(norm_shapes[si].T, norm_shapes[si].C, norm_dts[di][0], norm_dts[di][1], NULL, 1.0f);
}

/* One backward case: dx and dw accumulate onto random values. with_rstd 0
 * recomputes rstd on both sides. */
static void check_rmsnorm_bwd_off(int T, int C, mt_cu_dtype xdt, mt_cu_dtype dt, int with_rstd,
                                  const mt_cu_tuning *tu, float woff)
{
    const float eps = 1e-6f;
    const size_t n = (size_t)T * C;
    tensor x = t_rand(xdt, n, -2.0f, 2.0f, 0), w = t_rand(dt, (size_t)C, woff - 0.5f, woff + 0.5f, 0);
    if (woff != 0.0f) { /* as in the forward: the stored weights are the scale minus woff */
        for (int c = 0; c < C; c++) w.ref[c] -= woff;
        t_upload(&w);
    }
    tensor dy = t_rand(MT_CU_F32, n, -1.0f, 1.0f, 0), dx = t_rand(MT_CU_F32, n, -1.0f, 1.0f, 0);
    tensor dw = t_rand(MT_CU_F32, (size_t)C, -1.0f, 1.0f, 0), r = t_rand(MT_CU_F32, (size_t)T, 0.0f, 0.0f, 0);
    float *dx0 = xmalloc(n * sizeof(float)), *dw0 = xmalloc((size_t)C * sizeof(float));
    memcpy(dx0, dx.ref, n * sizeof(float));
    memcpy(dw0, dw.ref, (size_t)C * sizeof(float));
    float *y = xmalloc(n * sizeof(float));
    mt_cpu_rmsnorm(NULL, y, r.ref, x.ref, w.ref, T, C, eps, woff);
    t_upload(&r); /* the CPU's rstd, so that the backward is tested alone */
    mt_cpu_rmsnorm_bwd(NULL, dx.ref, dw.ref, dy.ref, x.ref, w.ref, with_rstd ? r.ref : NULL, T, C, eps, woff);

    void *scratch = dev_scratch(mt_cu_rmsnorm_bwd_scratch_bytes(T, C, tu));
    cr_assert(mt_cu_rmsnorm_bwd(NULL, dx.dev, dw.dev, dy.dev, xdt, x.dev, dt, w.dev, with_rstd ? r.dev : NULL, T, C,
                                eps, woff, scratch, tu) == 0);
    float *dxg = t_fetch(&dx), *dwg = t_fetch(&dw);
    double *mag = calloc((size_t)C, sizeof(double));
    cr_assert(mag);
    for (int t = 0; t < T; t++) {
        /* dx += r (g - n m), g = dy (woff + w), n = x r, m = mean(g n).
         * fp32 mode: m in double on both sides (another order), equal or
         * 1 ulp apart, every other step the same rounding: within 16u of the
         * magnitudes involved.
         * bf16 mode: each thread's part of g n (<= 64 terms) is summed in
         * fp32, so m is within 63u mean|g n| (+ the above), which moves dx
         * by r |n| that much; with rstd recomputed, r within 36u (see the
         * forward), which moves each term by ~2 x 36u: 96u of the magnitudes. */
        const float rr = r.ref[t];
        double gn = 0.0, gn_abs = 0.0;
        for (int c = 0; c < C; c++) {
            const double term = (double)(dy.ref[t * C + c] * (woff + w.ref[c])) * (double)(x.ref[t * C + c] * rr);
            gn += term, gn_abs += fabs(term);
        }
        const double m = gn / C, m_tol = bf16_mode(xdt, dt) ? 64 * U24 * gn_abs / C : 0.0;
        const double k = bf16_mode(xdt, dt) && !with_rstd ? 96 : 16;
        for (int c = 0; c < C; c++) {
            const size_t i = (size_t)t * C + c;
            const double g = dy.ref[i] * (woff + w.ref[c]), nn = x.ref[i] * rr;
            const double scale = fabs(dx0[i]) + fabs(rr) * (fabs(g) + fabs(nn * m));
            cr_assert(fabs(dxg[i] - dx.ref[i]) <= k * U24 * scale + fabs(rr * nn) * m_tol,
                      "%dx%d x %s w %s rstd %d woff %g: dx[%d,%d] = %.9g, ref %.9g", T, C, dtn(xdt), dtn(dt), with_rstd,
                      woff, t, c, dxg[i], dx.ref[i]);
            mag[c] += fabs((double)dy.ref[i] * nn);
        }
    }
    /* dw: T + 1 terms (the products dy (x r) rounded alike on both sides)
     * summed in different orders; any order is within (T) u sum|terms| of
     * the exact sum, so the two within twice that. A recomputed rstd (bf16
     * mode: 36u) moves every product by as much: 40u more. */
    for (int c = 0; c < C; c++) {
        const double tol = (2.0 * T + (with_rstd ? 0 : 40)) * U24 * (fabs(dw0[c]) + mag[c]);
        cr_assert(fabs(dwg[c] - dw.ref[c]) <= tol, "%dx%d x %s w %s: dw[%d] = %.9g, ref %.9g", T, C, dtn(xdt), dtn(dt),
                  c, dwg[c], dw.ref[c]);
    }
    /* determinism: again from the same start, the same bits */
    H2D(dx.dev, dx0, n * sizeof(float));
    H2D(dw.dev, dw0, (size_t)C * sizeof(float));
    cr_assert(mt_cu_rmsnorm_bwd(NULL, dx.dev, dw.dev, dy.dev, xdt, x.dev, dt, w.dev, with_rstd ? r.dev : NULL, T, C,
                                eps, woff, scratch, tu) == 0);
    float *dxg2 = t_fetch(&dx), *dwg2 = t_fetch(&dw);
    cr_assert(memcmp(dxg, dxg2, n * sizeof(float)) == 0, "%dx%d: dx differs between two runs", T, C);
    cr_assert(memcmp(dwg, dwg2, (size_t)C * sizeof(float)) == 0, "%dx%d: dw differs between two runs", T, C);
    free(dx0), free(dw0), free(y), free(dxg), free(dwg), free(dxg2), free(dwg2), free(mag);
    mt_device_free(scratch);
    t_free(&x), t_free(&w), t_free(&dy), t_free(&dx), t_free(&dw), t_free(&r);
}

static void check_rmsnorm_bwd(int T, int C, mt_cu_dtype xdt, mt_cu_dtype dt, int with_rstd, const mt_cu_tuning *tu)
{
    check_rmsnorm_bwd_off(T, C, xdt, dt, with_rstd, tu, 0.0f);
}

/* Gemma's (1 + w): dx through dy (1 + w), dw as without the offset */
Test(cuda_kernels, rmsnorm_backward_offset)
{
    NEED_GPU();
    seed(22);
    for (size_t si = 0; si < sizeof norm_shapes / sizeof *norm_shapes; si++)
        for (size_t di = 0; di < 3; di++)
            check_rmsnorm_bwd_off(norm_shapes[si].T, norm_shapes[si].C, norm_dts[di][0], norm_dts[di][1], 1, NULL,
                                  1.0f);
    check_rmsnorm_bwd_off(4099, 96, MT_CU_BF16, MT_CU_BF16, 0, NULL, 1.0f);
    check_rmsnorm_bwd_off(37, 256, MT_CU_F32, MT_CU_F32, 0, NULL, 1.0f); /* Gemma 3's q/k norms: rows of D 256 */
}

Test(cuda_kernels, rmsnorm_backward)
{
    NEED_GPU();
    seed(2);
    for (size_t si = 0; si < sizeof norm_shapes / sizeof *norm_shapes; si++)
        for (size_t di = 0; di < 3; di++)
            check_rmsnorm_bwd(norm_shapes[si].T, norm_shapes[si].C, norm_dts[di][0], norm_dts[di][1], 1, NULL);
    /* several rows per block (T > 2048), rstd recomputed */
    check_rmsnorm_bwd(4099, 96, MT_CU_BF16, MT_CU_BF16, 1, NULL);
    check_rmsnorm_bwd(2053, 104, MT_CU_F32, MT_CU_F32, 0, NULL);
    check_rmsnorm_bwd(37, 4096, MT_CU_BF16, MT_CU_BF16, 0, NULL);
    /* the per-head q/k norms: many short rows (512 tokens x 32 heads of 128), 16 times the chunks */
    check_rmsnorm_bwd(16384, 128, MT_CU_BF16, MT_CU_BF16, 1, NULL);
    check_rmsnorm_bwd(16384, 64, MT_CU_BF16, MT_CU_F32, 1, NULL);
}

Test(cuda_kernels, rmsnorm_backward_variants)
{
    NEED_GPU();
    seed(12);
    const int chunks[] = {1024, 2048, 512, 1}, emins[] = {1, 2, 4};
    mt_cu_tuning tu;
    mt_cu_tuning_default(&tu);
    for (int ei = 0; ei < 3; ei++)
        for (int pf = 0; pf < 2; pf++)
            for (int ci = 0; ci < 4; ci++) {
                cr_assert(mt_cu_tuning_set(&tu, MT_CU_TUNE_RMS_BWD_EMIN, emins[ei]) == 0);
                cr_assert(mt_cu_tuning_set(&tu, MT_CU_TUNE_RMS_BWD_PREFETCH, pf) == 0);
                cr_assert(mt_cu_tuning_set(&tu, MT_CU_TUNE_RMS_BWD_CHUNKS, chunks[ci]) == 0);
                check_rmsnorm_bwd(4099, 96, MT_CU_BF16, MT_CU_BF16, 1, &tu);
                check_rmsnorm_bwd(37, 4096, MT_CU_F32, MT_CU_BF16, ci == 3, &tu);
                check_rmsnorm_bwd(13, 4096, MT_CU_F32, MT_CU_F32, 1, &tu);
            }
}

/* The knobs' checks and the scratch size run on the host: no device needed. */
Test(cuda_kernels, tuning)
{
#ifndef MT_HAVE_CUDA
    MT_GPU_MISSING("this library was built without CUDA");
#else
    const mt_cu_tuning d = MT_CU_TUNING_DEFAULT;
    mt_cu_tuning t;
    memset(&t, 0xff, sizeof t);
    mt_cu_tuning_default(&t);
    cr_assert(memcmp(&t, &d, sizeof t) == 0);
    cr_expect(t.rms_fwd_emin == 2 && t.rms_bwd_emin == 1 && t.rms_bwd_prefetch == 0 && t.rms_bwd_chunks == 512 &&
                  t.ce_threads == 1024 && t.ce_smem == 0 && t.ce_reverse == 1 && t.ce_cluster == 0,
              "the documented defaults");
    /* refused values leave the struct as it was */
    cr_expect(mt_cu_tuning_set(&t, MT_CU_TUNE_RMS_BWD_CHUNKS, 0) == -1);
    cr_expect(mt_cu_tuning_set(&t, MT_CU_TUNE_RMS_BWD_EMIN, 3) == -1);
    cr_expect(mt_cu_tuning_set(&t, MT_CU_TUNE_RMS_FWD_EMIN, 8) == -1);
    cr_expect(mt_cu_tuning_set(&t, MT_CU_TUNE_CE_THREADS, 48) == -1);
    cr_expect(mt_cu_tuning_set(&t, MT_CU_TUNE_CE_THREADS, 2048) == -1);
    cr_expect(mt_cu_tuning_set(&t, MT_CU_TUNE_CE_SMEM, -1) == -1);
    cr_expect(mt_cu_tuning_set(&t, (mt_cu_knob)99, 0) == -1);
    cr_expect(mt_cu_tuning_set(NULL, MT_CU_TUNE_CE_REVERSE, 0) == -1);
    cr_expect(memcmp(&t, &d, sizeof t) == 0);
    /* accepted ones change their field alone; flags become 0 or 1 */
    cr_assert(mt_cu_tuning_set(&t, MT_CU_TUNE_CE_CLUSTER, 7) == 0);
    cr_expect(t.ce_cluster == 1);
    cr_assert(mt_cu_tuning_set(&t, MT_CU_TUNE_RMS_BWD_CHUNKS, 1) == 0);
    cr_expect(t.rms_bwd_chunks == 1 && t.rms_fwd_emin == d.rms_fwd_emin && t.ce_threads == d.ce_threads);
    /* the backward's scratch follows its tuning: one chunk, one row of partials */
    cr_expect(mt_cu_rmsnorm_bwd_scratch_bytes(4096, 64, &t) < mt_cu_rmsnorm_bwd_scratch_bytes(4096, 64, NULL));
    cr_expect(mt_cu_rmsnorm_bwd_scratch_bytes(4096, 64, &d) == mt_cu_rmsnorm_bwd_scratch_bytes(4096, 64, NULL));
    cr_assert(mt_cu_tuning_set(&t, MT_CU_TUNE_DEFAULTS, 0) == 0);
    cr_expect(memcmp(&t, &d, sizeof t) == 0);
    /* a struct filled by hand with a refused value: no scratch size */
    t.rms_bwd_chunks = 0;
    cr_expect(mt_cu_rmsnorm_bwd_scratch_bytes(4096, 64, &t) == 0);
#endif
}

/* ---- RoPE ------------------------------------------------------------------ */

/* Dimensions off .. off + rd - 1 of each head turn, in pairs (i, i + rd/2) or, where il, (2i, 2i + 1)
 * (multi-head latent attention); the rest pass untouched. */
static void check_rope_at(int T, int nh, int D, int off, int rd, int il, float scale, mt_cu_dtype dt, int inverse)
{
    const size_t n = (size_t)T * nh * D;
    tensor x = t_rand(dt, n, -1.0f, 1.0f, 0);
    int32_t *pos = xmalloc((size_t)T * sizeof(int32_t));
    for (int t = 0; t < T; t++) pos[t] = (int32_t)(next_u64() % 8192);
    /* large angles: 131071 and 200000 rad at inv_freq[0] = 1 (CUDA's sincosf
     * takes its slow argument reduction beyond 105615) */
    pos[0] = 0;
    if (T > 1) pos[1] = 131071;
    if (T > 2) pos[2] = 200000;
    float *inv = xmalloc((size_t)(rd / 2) * sizeof(float));
    const mt_rope_params rp = {.theta = 500000.0f, .llama3 = 1, .factor = 8.0f, .low_freq_factor = 1.0f,
                              .high_freq_factor = 4.0f, .original_max_position = 8192};
    mt_rope_inv_freq(inv, rd, &rp);
    void *dpos = dev_upload(pos, (size_t)T * sizeof(int32_t)), *dinv = dev_upload(inv, (size_t)(rd / 2) * sizeof(float));
    float *x0 = xmalloc(n * sizeof(float));
    memcpy(x0, x.ref, n * sizeof(float));
    mt_cpu_rope_at(NULL, x.ref, pos, inv, T, nh, D, off, rd, il, scale, inverse);
    if (off == 0 && !il) cr_assert(mt_cu_rope(NULL, dt, x.dev, dpos, dinv, T, nh, D, rd, scale, inverse) == 0);
    else cr_assert(mt_cu_rope_at(NULL, dt, x.dev, dpos, dinv, T, nh, D, off, rd, il, scale, inverse) == 0);
    float *g = t_fetch(&x);
    const int half = rd / 2;
    for (size_t i = 0; i < n; i++) {
        const size_t d = i % (size_t)D;
        if (d < (size_t)off || d >= (size_t)(off + rd)) { /* outside the rotary dimensions: untouched, on both sides */
            cr_assert(g[i] == x0[i] && x.ref[i] == x0[i], "D %d off %d rd %d: x[%zu] moved", D, off, rd, i);
            continue;
        }
        /* out = (x0 c -+ x1 s) scale: cos and sin within 3 ulp (<= 3u each,
         * |c|,|s| <= 1) between the libraries, and the same roundings plus
         * the scale's two: within 10u scale (|x_i| + |x_pair|). */
        const size_t k = d - (size_t)off;
        const size_t pair = il ? (k % 2 ? i - 1 : i + 1) : k < (size_t)half ? i + half : i - half;
        const double tol = out_tol(dt, x.ref[i], 10 * U24 * scale * (fabs(x0[i]) + fabs(x0[pair])));
        cr_assert(fabs(g[i] - x.ref[i]) <= tol,
                  "T %d nh %d D %d off %d rd %d il %d %s inverse %d: x[%zu] = %.9g, ref %.9g (pos %d)", T, nh, D, off,
                  rd, il, dtn(dt), inverse, i, g[i], x.ref[i], pos[i / ((size_t)nh * D)]);
    }
    free(pos), free(inv), free(x0), free(g);
    mt_device_free(dpos), mt_device_free(dinv);
    t_free(&x);
}

static void check_rope_part(int T, int nh, int D, int rd, float scale, mt_cu_dtype dt, int inverse)
{
    check_rope_at(T, nh, D, 0, rd, 0, scale, dt, inverse);
}

static void check_rope(int T, int nh, int D, mt_cu_dtype dt, int inverse) { check_rope_part(T, nh, D, D, 1.0f, dt, inverse); }

Test(cuda_kernels, rope)
{
    NEED_GPU();
    seed(3);
    for (int dti = 0; dti < 2; dti++)
        for (int inv = 0; inv < 2; inv++) {
            const mt_cu_dtype dt = dti ? MT_CU_BF16 : MT_CU_F32;
            check_rope(37, 3, 128, dt, inv);
            check_rope(37, 5, 64, dt, inv);
            check_rope(300, 1, 16, dt, inv);
            check_rope(11, 2, 6, dt, inv); /* half = 3: the scalar path */
            check_rope(5, 9, 80, dt, inv);
            check_rope(3203, 30, 128, dt, inv); /* 4 heads per thread, the last group short */
            /* part of each head (Phi-4-mini's 96 of 128; 24 of 32: half 12, the scalar path), scaled (yarn's and
             * longrope's attention factor) */
            check_rope_part(37, 3, 128, 96, 1.2247449f, dt, inv);
            check_rope_part(300, 4, 32, 24, 0.9671f, dt, inv);
            check_rope_part(5, 2, 64, 16, 1.0f, dt, inv);
        }
}

/* Multi-head latent attention's RoPE against mt_cpu_rope_at: the last rd dimensions of each head after
 * off unrotated ones, interleaved (DeepSeek's rope_interleave) or in halves, with the tolerance of the
 * rope test above, and the first off dimensions untouched bit for bit. */
Test(cuda_kernels, rope_offset_interleaved)
{
    NEED_GPU();
    seed(31);
    for (int dti = 0; dti < 2; dti++)
        for (int inv = 0; inv < 2; inv++)
            for (int il = 0; il < 2; il++) {
                const mt_cu_dtype dt = dti ? MT_CU_BF16 : MT_CU_F32;
                check_rope_at(37, 3, 192, 128, 64, il, 1.0f, dt, inv);  /* DeepSeek-V3's 128 + 64: the 8-wide path */
                check_rope_at(300, 4, 24, 16, 8, il, 1.0f, dt, inv);    /* 16 + 8: half 4, the scalar path */
                check_rope_at(5, 9, 72, 4, 64, il, 0.9671f, dt, inv);   /* off 4: not 16-byte aligned, scalar; scaled */
                check_rope_at(3203, 30, 48, 16, 32, il, 1.2247449f, dt, inv); /* 4 heads per thread */
            }
    cr_expect(mt_cu_rope_at(NULL, MT_CU_F32, NULL, NULL, NULL, 4, 2, 24, 20, 8, 1, 1.0f, 0) == -1, "off + rd > D");
    cr_expect(mt_cu_rope_at(NULL, MT_CU_F32, NULL, NULL, NULL, 4, 2, 24, -2, 8, 0, 1.0f, 0) == -1, "a negative off");
}

/* ---- columns (multi-head latent attention) ------------------------------------------------------ */

/* copy_cols (sum 0, k = rep) or sum_cols (sum 1, k = n) against mt_cpu_copy_cols / mt_cpu_sum_cols on
 * the same values, both exactly: the copy moves bits, and the sum adds the same fp32 values in the same
 * order (ascending i, from 0, one rounding each) as the CPU, then rounds once to dt, as the reference's
 * fp32 result is rounded here; so the tolerance is 0 in both dtypes. Every element of dst outside the w
 * columns keeps its value. base_off shifts both buffers by an element (off 16-byte alignment). */
static void check_cols_cu(int sum, int rows, int w, int dld, int doff, int sld, int soff, int k, mt_cu_dtype dt,
                          size_t base_off)
{
    const int srows = sum ? rows * k : (rows + k - 1) / k;
    const size_t nd = (size_t)rows * dld, ns = (size_t)srows * sld;
    tensor src = t_rand(dt, ns, -2.0f, 2.0f, base_off), dst = t_rand(dt, nd, -1.0f, 1.0f, base_off);
    /* magnitudes from 2^-12 to 2^12 (exact scalings of dt values): their sums round, and differently in
     * another order, which the plain uniform values mostly would not */
    for (size_t i = 0; i < ns; i++) src.ref[i] = ldexpf(src.ref[i], (int)(next_u64() % 25) - 12);
    t_upload(&src);
    if (sum) {
        mt_cpu_sum_cols(NULL, dst.ref, dld, doff, src.ref, sld, soff, rows, w, k);
        if (dt == MT_CU_BF16) /* the sums rounded once to bf16 (the other elements are bf16 already) */
            for (size_t i = 0; i < nd; i++) dst.ref[i] = mt_bf16_to_f32(mt_f32_to_bf16(dst.ref[i]));
        cr_assert(mt_cu_sum_cols(NULL, dt, dst.dev, dld, doff, src.dev, sld, soff, rows, w, k) == 0);
    } else {
        mt_cpu_copy_cols(NULL, dst.ref, dld, doff, src.ref, sld, soff, rows, w, k);
        cr_assert(mt_cu_copy_cols(NULL, dt, dst.dev, dld, doff, src.dev, sld, soff, rows, w, k) == 0);
    }
    float *g = t_fetch(&dst);
    for (size_t i = 0; i < nd; i++)
        cr_assert(memcmp(&g[i], &dst.ref[i], sizeof(float)) == 0,
                  "%s %s rows %d w %d k %d off %zu: dst[%zu, %zu] = %.9g, ref %.9g", sum ? "sum_cols" : "copy_cols",
                  dtn(dt), rows, w, k, base_off, i / dld, i % dld, g[i], dst.ref[i]);
    free(g);
    t_free(&src), t_free(&dst);
}

Test(cuda_kernels, copy_cols)
{
    NEED_GPU();
    seed(32);
    for (int dti = 0; dti < 2; dti++) {
        const mt_cu_dtype dt = dti ? MT_CU_BF16 : MT_CU_F32;
        /* DeepSeek-V3's shared key part: kv_a's last 64 of 576 into each of 16 heads' last 64 of 192 */
        check_cols_cu(0, 37 * 16, 64, 192, 128, 576, 512, 16, dt, 0);
        check_cols_cu(0, 37 * 16, 64, 192, 128, 576, 512, 16, dt, 1); /* misaligned: the scalar path */
        check_cols_cu(0, 300, 128, 192, 0, 256, 128, 1, dt, 0);      /* row for row (a value head's part) */
        check_cols_cu(0, 13, 5, 11, 4, 9, 3, 3, dt, 0);             /* odd widths and strides; rows % rep != 0 */
        check_cols_cu(0, 12, 5, 11, 4, 9, 3, 1, dt, 0);
    }
    cr_expect(mt_cu_copy_cols(NULL, MT_CU_F32, NULL, 8, 0, NULL, 8, 0, 4, 8, 0) == -1, "rep 0");
}

Test(cuda_kernels, sum_cols)
{
    NEED_GPU();
    seed(33);
    for (int dti = 0; dti < 2; dti++) {
        const mt_cu_dtype dt = dti ? MT_CU_BF16 : MT_CU_F32;
        /* the shared key part's gradient: 16 heads' last 64 of 192 summed into 64 of 576 */
        check_cols_cu(1, 37, 64, 576, 512, 192, 128, 16, dt, 0);
        check_cols_cu(1, 37, 64, 576, 512, 192, 128, 16, dt, 1); /* misaligned: the scalar path */
        check_cols_cu(1, 12, 5, 11, 4, 9, 3, 3, dt, 0);
        check_cols_cu(1, 2000, 8, 16, 8, 24, 16, 3, dt, 0);
    }
    cr_expect(mt_cu_sum_cols(NULL, MT_CU_F32, NULL, 8, 0, NULL, 8, 0, 4, 8, -1) == -1, "n < 0");
}

/* ---- SwiGLU ------------------------------------------------------------------ */

static void check_swiglu(size_t n, mt_cu_dtype dt, size_t off)
{
    tensor g = t_rand(dt, n, -8.0f, 8.0f, off), u = t_rand(dt, n, -2.0f, 2.0f, off), d = t_rand(dt, n, -1.0f, 1.0f, off);
    tensor out = t_rand(dt, n, 0, 0, off), dg = t_rand(dt, n, 0, 0, off), du = t_rand(dt, n, 0, 0, off);
    mt_cpu_glu(NULL, MT_GLU_SILU, out.ref, g.ref, u.ref, n);
    mt_cpu_glu_bwd(NULL, MT_GLU_SILU, dg.ref, du.ref, d.ref, g.ref, u.ref, n);
    cr_assert(mt_cu_glu(NULL, dt, MT_GLU_SILU, out.dev, g.dev, u.dev, n) == 0);
    cr_assert(mt_cu_glu_bwd(NULL, dt, MT_GLU_SILU, dg.dev, du.dev, d.dev, g.dev, u.dev, n) == 0);
    float *og = t_fetch(&out), *dgg = t_fetch(&dg), *dug = t_fetch(&du);
    /* fp32 mode: exp within 2 ulp on each side, then the same division and
     * products: the forward within 16u relative. The backward's 1 - s loses
     * the relative accuracy of s (|ds| <= ~8u), scaled by g: within 32u of
     * |d u| (1 + |g|) and 32u of |d g|. bf16 mode uses the fast exp (<= 11 ulp
     * for |g| <= 8) and division (2 ulp): 4 times those. */
    const double k = dt == MT_CU_BF16 ? 4.0 : 1.0;
    for (size_t i = 0; i < n; i++) {
        const double gi = g.ref[i], ui = u.ref[i], di = d.ref[i];
        cr_assert(fabs(og[i] - out.ref[i]) <= out_tol(dt, out.ref[i], k * 16 * U24 * fabs(out.ref[i])),
                  "n %zu %s off %zu: out[%zu] = %.9g, ref %.9g", n, dtn(dt), off, i, og[i], out.ref[i]);
        cr_assert(fabs(dgg[i] - dg.ref[i]) <= out_tol(dt, dg.ref[i], k * 32 * U24 * fabs(di * ui) * (1 + fabs(gi))),
                  "n %zu %s off %zu: dgate[%zu] = %.9g, ref %.9g", n, dtn(dt), off, i, dgg[i], dg.ref[i]);
        cr_assert(fabs(dug[i] - du.ref[i]) <= out_tol(dt, du.ref[i], k * 32 * U24 * fabs(di * gi)),
                  "n %zu %s off %zu: dup[%zu] = %.9g, ref %.9g", n, dtn(dt), off, i, dug[i], du.ref[i]);
    }
    /* in place: dgate over dout, dup over up */
    cr_assert(mt_cu_glu_bwd(NULL, dt, MT_GLU_SILU, d.dev, u.dev, d.dev, g.dev, u.dev, n) == 0);
    float *dgi = t_fetch(&d), *dui = t_fetch(&u);
    cr_assert(memcmp(dgi, dgg, n * sizeof(float)) == 0, "in-place dgate differs");
    cr_assert(memcmp(dui, dug, n * sizeof(float)) == 0, "in-place dup differs");
    free(og), free(dgg), free(dug), free(dgi), free(dui);
    t_free(&g), t_free(&u), t_free(&d), t_free(&out), t_free(&dg), t_free(&du);
}

Test(cuda_kernels, swiglu)
{
    NEED_GPU();
    seed(4);
    for (int dti = 0; dti < 2; dti++) {
        const mt_cu_dtype dt = dti ? MT_CU_BF16 : MT_CU_F32;
        check_swiglu((size_t)37 * 4096 + 5, dt, 0); /* vectors and a tail */
        check_swiglu((size_t)37 * 96, dt, 1);       /* misaligned: scalar */
        check_swiglu(7, dt, 0);                     /* the tail alone */
    }
}

/* ---- GeGLU ------------------------------------------------------------------------ */

static void check_geglu(size_t n, mt_cu_dtype dt, size_t off)
{
    tensor g = t_rand(dt, n, -8.0f, 8.0f, off), u = t_rand(dt, n, -2.0f, 2.0f, off), d = t_rand(dt, n, -1.0f, 1.0f, off);
    tensor out = t_rand(dt, n, 0, 0, off), dg = t_rand(dt, n, 0, 0, off), du = t_rand(dt, n, 0, 0, off);
    mt_cpu_glu(NULL, MT_GLU_GELU_TANH, out.ref, g.ref, u.ref, n);
    mt_cpu_glu_bwd(NULL, MT_GLU_GELU_TANH, dg.ref, du.ref, d.ref, g.ref, u.ref, n);
    cr_assert(mt_cu_glu(NULL, dt, MT_GLU_GELU_TANH, out.dev, g.dev, u.dev, n) == 0);
    cr_assert(mt_cu_glu_bwd(NULL, dt, MT_GLU_GELU_TANH, dg.dev, du.dev, d.dev, g.dev, u.dev, n) == 0);
    float *og = t_fetch(&out), *dgg = t_fetch(&dg), *dug = t_fetch(&du);
    /* The argument of tanh is the same fp32 expression on both sides (no
     * fused multiply-adds on either), so t differs only by the two tanhf
     * (CUDA's <= 2 ulp, glibc's <= 1): within 4u |t| <= 4u absolute. Where
     * t is near -1 (g << 0), 1 + t cancels, so the error is absolute:
     * gelu = 0.5 g (1 + t) within 2u |g| + 3 roundings (8u |gelu|);
     * out = gelu u within 2u |g u| + 16u |out|.
     * gelu' = 0.5 (1 + t) + 0.5 g (1 - t^2) k0 (1 + 3 k1 g^2): 1 - t^2
     * within 8u, so gelu' within 2u + 4u |g| (1 + 0.14 g^2) + 16u |gelu'|;
     * dgate = d u gelu' within |d u| that + 16u |dgate|; dup = d gelu
     * within 2u |d g| + 16u |dup|. */
    for (size_t i = 0; i < n; i++) {
        const double gi = g.ref[i], ui = u.ref[i], di = d.ref[i];
        const double dgelu_tol = (2 + 4 * fabs(gi) * (1 + 0.14 * gi * gi)) * U24;
        cr_assert(fabs(og[i] - out.ref[i]) <= out_tol(dt, out.ref[i], 16 * U24 * fabs(out.ref[i]) + 2 * U24 * fabs(gi * ui)),
                  "n %zu %s off %zu: out[%zu] = %.9g, ref %.9g (g %.9g)", n, dtn(dt), off, i, og[i], out.ref[i], gi);
        cr_assert(fabs(dgg[i] - dg.ref[i]) <=
                      out_tol(dt, dg.ref[i], 16 * U24 * fabs(dg.ref[i]) + fabs(di * ui) * dgelu_tol),
                  "n %zu %s off %zu: dgate[%zu] = %.9g, ref %.9g (g %.9g)", n, dtn(dt), off, i, dgg[i], dg.ref[i], gi);
        cr_assert(fabs(dug[i] - du.ref[i]) <= out_tol(dt, du.ref[i], 16 * U24 * fabs(du.ref[i]) + 2 * U24 * fabs(di * gi)),
                  "n %zu %s off %zu: dup[%zu] = %.9g, ref %.9g (g %.9g)", n, dtn(dt), off, i, dug[i], du.ref[i], gi);
    }
    /* in place: dgate over dout, dup over up (as the backend runs it) */
    cr_assert(mt_cu_glu_bwd(NULL, dt, MT_GLU_GELU_TANH, d.dev, u.dev, d.dev, g.dev, u.dev, n) == 0);
    float *dgi = t_fetch(&d), *dui = t_fetch(&u);
    cr_assert(memcmp(dgi, dgg, n * sizeof(float)) == 0, "in-place dgate differs");
    cr_assert(memcmp(dui, dug, n * sizeof(float)) == 0, "in-place dup differs");
    free(og), free(dgg), free(dug), free(dgi), free(dui);
    t_free(&g), t_free(&u), t_free(&d), t_free(&out), t_free(&dg), t_free(&du);
}

Test(cuda_kernels, geglu)
{
    NEED_GPU();
    seed(26);
    for (int dti = 0; dti < 2; dti++) {
        const mt_cu_dtype dt = dti ? MT_CU_BF16 : MT_CU_F32;
        check_geglu((size_t)37 * 2304 + 5, dt, 0); /* vectors and a tail */
        check_geglu((size_t)37 * 96, dt, 1);       /* misaligned: scalar */
        check_geglu(7, dt, 0);                     /* the tail alone */
    }
}

/* ---- GPT-OSS's clamped SwiGLU ------------------------------------------------------ */

static void check_gptoss_glu(size_t n, mt_cu_dtype dt, size_t off)
{
    /* beyond +-7 on both inputs, so the clamps and their zero gradients run */
    tensor g = t_rand(dt, n, -10.0f, 10.0f, off), u = t_rand(dt, n, -10.0f, 10.0f, off),
           d = t_rand(dt, n, -1.0f, 1.0f, off);
    tensor out = t_rand(dt, n, 0, 0, off), dg = t_rand(dt, n, 0, 0, off), du = t_rand(dt, n, 0, 0, off);
    /* the bounds themselves, exact in bf16: the gradients pass there (inclusive); at the start,
     * so the vector path meets them where there is one */
    const float bounds[][2] = {{7.0f, 7.0f}, {7.0f, -7.0f}, {-7.0f, 7.0f}, {-7.0f, -7.0f}};
    for (size_t i = 0; i < 4 && i < n; i++) g.ref[i] = bounds[i][0], u.ref[i] = bounds[i][1];
    t_upload(&g), t_upload(&u);
    mt_cpu_glu(NULL, MT_GLU_GPTOSS, out.ref, g.ref, u.ref, n);
    mt_cpu_glu_bwd(NULL, MT_GLU_GPTOSS, dg.ref, du.ref, d.ref, g.ref, u.ref, n);
    cr_assert(mt_cu_glu(NULL, dt, MT_GLU_GPTOSS, out.dev, g.dev, u.dev, n) == 0);
    cr_assert(mt_cu_glu_bwd(NULL, dt, MT_GLU_GPTOSS, dg.dev, du.dev, d.dev, g.dev, u.dev, n) == 0);
    float *og = t_fetch(&out), *dgg = t_fetch(&dg), *dug = t_fetch(&du);
    /* Both sides clamp the same floats to the same g and u and compute u + 1
     * identically, so only s = sigmoid(1.702 g) differs. fp32 mode: exp
     * within 2 ulp on each side (8u apart), 1 + e and the division add a
     * rounding each: s within 12u relative, and out = (u + 1) (g s) (two
     * more roundings) within 16u relative; we allow 32u. The backward's
     * 1 - s loses s's relative accuracy (12u absolute), scaled by
     * 1.702 |g|: dglu = s + 1.702 g s (1 - s) (|dglu| <= 1.1) within
     * 12u (1 + 1.702 |g|) + 4u, so dgate within 32u |d (u + 1)| (1 + 1.702 |g|);
     * dup = d (g s) within 16u relative, allowed 32u. bf16 mode uses the fast
     * exp (2 + floor(1.173 |x|) ulp: <= 21 ulp for |1.702 g| <= 17.02)
     * and division (2 ulp): s within ~53u, 4 times the fp32 tolerances.
     * Beyond the bounds the gradients are exact zeros on both sides. */
    const double k = dt == MT_CU_BF16 ? 4.0 : 1.0;
    for (size_t i = 0; i < n; i++) {
        const double gi = fmin(g.ref[i], MT_GPTOSS_LIMIT), ui = fmin(fmax(u.ref[i], -MT_GPTOSS_LIMIT), MT_GPTOSS_LIMIT);
        const double di = d.ref[i];
        cr_assert(fabs(og[i] - out.ref[i]) <= out_tol(dt, out.ref[i], k * 32 * U24 * fabs(out.ref[i])),
                  "n %zu %s off %zu: out[%zu] = %.9g, ref %.9g (gate %.9g up %.9g)", n, dtn(dt), off, i, og[i],
                  out.ref[i], g.ref[i], u.ref[i]);
        cr_assert(fabs(dgg[i] - dg.ref[i]) <=
                      out_tol(dt, dg.ref[i], k * 32 * U24 * fabs(di * (ui + 1)) * (1 + MT_GPTOSS_ALPHA * fabs(gi))),
                  "n %zu %s off %zu: dgate[%zu] = %.9g, ref %.9g (gate %.9g up %.9g)", n, dtn(dt), off, i, dgg[i],
                  dg.ref[i], g.ref[i], u.ref[i]);
        cr_assert(fabs(dug[i] - du.ref[i]) <= out_tol(dt, du.ref[i], k * 32 * U24 * fabs(du.ref[i])),
                  "n %zu %s off %zu: dup[%zu] = %.9g, ref %.9g (gate %.9g up %.9g)", n, dtn(dt), off, i, dug[i],
                  du.ref[i], g.ref[i], u.ref[i]);
        if (g.ref[i] > MT_GPTOSS_LIMIT) cr_assert(dgg[i] == 0.0f, "dgate[%zu] = %.9g beyond the clamp", i, dgg[i]);
        if (fabsf(u.ref[i]) > MT_GPTOSS_LIMIT) cr_assert(dug[i] == 0.0f, "dup[%zu] = %.9g beyond the clamp", i, dug[i]);
    }
    /* in place: dgate over dout, dup over up (as the backend runs it) */
    cr_assert(mt_cu_glu_bwd(NULL, dt, MT_GLU_GPTOSS, d.dev, u.dev, d.dev, g.dev, u.dev, n) == 0);
    float *dgi = t_fetch(&d), *dui = t_fetch(&u);
    cr_assert(memcmp(dgi, dgg, n * sizeof(float)) == 0, "in-place dgate differs");
    cr_assert(memcmp(dui, dug, n * sizeof(float)) == 0, "in-place dup differs");
    free(og), free(dgg), free(dug), free(dgi), free(dui);
    t_free(&g), t_free(&u), t_free(&d), t_free(&out), t_free(&dg), t_free(&du);
}

Test(cuda_kernels, gptoss_glu)
{
    NEED_GPU();
    seed(27);
    for (int dti = 0; dti < 2; dti++) {
        const mt_cu_dtype dt = dti ? MT_CU_BF16 : MT_CU_F32;
        check_gptoss_glu((size_t)37 * 2880 + 5, dt, 0); /* vectors and a tail (GPT-OSS's F = 2880) */
        check_gptoss_glu((size_t)37 * 96, dt, 1);       /* misaligned: scalar */
        check_gptoss_glu(7, dt, 0);                     /* the tail alone */
    }
}

/* ---- attention sinks ------------------------------------------------------------------ */

/* ~N(0, 1): Box-Muller on two uniforms */
static float gauss(void)
{
    const double a = 1.0 - uni(0.0f, 1.0f), b = uni(0.0f, 1.0f);
    return (float)(sqrt(-2.0 * log(a)) * cos(6.283185307179586 * b));
}

static void check_attn_sink(int B, int S, int H, int D, mt_cu_dtype dt, size_t off)
{
    const size_t n = (size_t)B * S * H * D, nl = (size_t)B * H * S;
    tensor out = t_rand(dt, n, -2.0f, 2.0f, off), dout = t_rand(dt, n, -1.0f, 1.0f, off);
    /* lse >= the row's largest score: a few units either side of 0 in a trained model; with the sinks
     * below, r = 1 / (1 + exp(sink - lse)) spans about 0.01 to 0.99 */
    tensor lse = t_rand(MT_CU_F32, nl, -2.0f, 6.0f, 0), sk = t_rand(dt, (size_t)H, 0, 0, 0);
    tensor ds = t_rand(MT_CU_F32, (size_t)H, -1.0f, 1.0f, 0); /* nonzero: dsink is added into */
    for (int h = 0; h < H; h++) sk.ref[h] = dt == MT_CU_BF16 ? mt_bf16_to_f32(mt_f32_to_bf16(gauss())) : gauss();
    t_upload(&sk);
    float *ds0 = xmalloc((size_t)H * sizeof(float));
    memcpy(ds0, ds.ref, (size_t)H * sizeof(float));

    /* backward first, on the inputs as drawn (the forward changes out and lse in place) */
    mt_cpu_attn_sink_bwd(ds.ref, dout.ref, out.ref, lse.ref, sk.ref, B, S, H, D);
    cr_assert(mt_cu_attn_sink_bwd(NULL, dt, ds.dev, dout.dev, out.dev, lse.dev, sk.dev, B, S, H, D) == 0);
    float *dsg = t_fetch(&ds);
    /* Each row's dot of D products in fp32 (any order) is within D u sum|dout out| of the
     * exact one; the CPU's is in double. The weights exp(sink - lse) are double on both
     * sides (relative 1e-15), the rows summed in double: the sum is within
     * D u sum_rows w |dout||out| (M below), then rounded to float on both sides (u |acc|
     * each) and subtracted from dsink (u |dsink| each). Wrong or missing rows are off by
     * about w sqrt(D) |dout out|, orders of magnitude above that. */
    for (int h = 0; h < H; h++) {
        double M = 0.0;
        for (int b = 0; b < B; b++)
            for (int s = 0; s < S; s++) {
                const size_t row = (((size_t)b * S + s) * H + h) * D;
                double a = 0.0;
                for (int j = 0; j < D; j++) a += fabs((double)dout.ref[row + j] * out.ref[row + j]);
                M += exp((double)sk.ref[h] - lse.ref[((size_t)b * H + h) * S + s]) * a;
            }
        const double acc = (double)ds0[h] - ds.ref[h];
        cr_assert(fabs(dsg[h] - ds.ref[h]) <= (D + 1) * U24 * M + 2 * U24 * (fabs(acc) + fabs(ds.ref[h])),
                  "B %d S %d H %d D %d %s off %zu: dsink[%d] = %.9g, ref %.9g (from %.9g)", B, S, H, D, dtn(dt), off,
                  h, dsg[h], ds.ref[h], ds0[h]);
    }
    /* deterministic: the same bits from the same start */
    H2D(ds.dev, ds0, (size_t)H * sizeof(float));
    cr_assert(mt_cu_attn_sink_bwd(NULL, dt, ds.dev, dout.dev, out.dev, lse.dev, sk.dev, B, S, H, D) == 0);
    float *dsg2 = t_fetch(&ds);
    cr_assert(memcmp(dsg, dsg2, (size_t)H * sizeof(float)) == 0, "B %d S %d H %d D %d %s: two runs differ", B, S, H,
              D, dtn(dt));

    mt_cpu_attn_sink(out.ref, lse.ref, sk.ref, B, S, H, D);
    cr_assert(mt_cu_attn_sink(NULL, dt, out.dev, lse.dev, sk.dev, B, S, H, D) == 0);
    float *og = t_fetch(&out), *lg = t_fetch(&lse);
    /* r and the new lse are double expressions rounded to float on both sides, apart by a
     * few double ulps (the libraries' exp, log1p / log), so their floats are equal or one
     * ulp (2u relative) apart; out = o r rounded once on each side: within 4u |out| to
     * first order, allowed 8u. lse within one ulp, 2u |lse|, allowed 4u, plus the double
     * difference itself where lse is near 0 (2^-50 of the operands). bf16: the output's
     * rounding on top (out_tol). */
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs(og[i] - out.ref[i]) <= out_tol(dt, out.ref[i], 8 * U24 * fabs(out.ref[i])),
                  "B %d S %d H %d D %d %s off %zu: out[%zu] = %.9g, ref %.9g", B, S, H, D, dtn(dt), off, i, og[i],
                  out.ref[i]);
    for (size_t i = 0; i < nl; i++) {
        const int h = (int)(i / S % H);
        const double scale = fabs(lse.ref[i]) + fabs(sk.ref[h]) + 1;
        cr_assert(fabs(lg[i] - lse.ref[i]) <= 4 * U24 * fabs(lse.ref[i]) + 0x1p-50 * scale,
                  "B %d S %d H %d D %d %s off %zu: lse[%zu] = %.9g, ref %.9g", B, S, H, D, dtn(dt), off, i, lg[i],
                  lse.ref[i]);
    }
    free(dsg), free(dsg2), free(og), free(lg), free(ds0);
    t_free(&out), t_free(&dout), t_free(&lse), t_free(&sk), t_free(&ds);
}

Test(cuda_kernels, attn_sink)
{
    NEED_GPU();
    seed(28);
    for (int dti = 0; dti < 2; dti++) {
        const mt_cu_dtype dt = dti ? MT_CU_BF16 : MT_CU_F32;
        check_attn_sink(2, 37, 5, 64, dt, 0);  /* GPT-OSS's head size; 5 heads: partial warps */
        check_attn_sink(2, 37, 5, 128, dt, 0);
        check_attn_sink(2, 37, 7, 256, dt, 0); /* a whole warp per row */
        check_attn_sink(2, 37, 3, 72, dt, 0);  /* 9 accesses: groups of 16 lanes, 7 idle */
        check_attn_sink(2, 37, 5, 64, dt, 1);  /* misaligned: scalar, a row over 32 lanes twice */
        check_attn_sink(2, 37, 5, 36, dt, 0);  /* D % 8 != 0: scalar */
        check_attn_sink(1, 1, 1, 8, dt, 0);    /* one row */
        check_attn_sink(3, 600, 2, 64, dt, 0); /* many rows per warp of the backward */
    }
}

/* ---- embedding ------------------------------------------------------------------ */

/* scale: 1, or Gemma's sqrt(C) (rounded to bf16, as the model's bf16 mode uses it). */
static void check_embedding_padded(int T, int C, int V, mt_cu_dtype dt, mt_cu_dtype wdt, float scale, int pad)
{
    int32_t *tok = xmalloc((size_t)T * sizeof(int32_t));
    for (int t = 0; t < T; t++) { /* half from a few ids: long runs of repeats */
        const uint64_t range = (next_u64() & 1) && V > 7 ? 7 : (uint64_t)V;
        tok[t] = (int32_t)(next_u64() % range);
    }
    tok[0] = V - 1;
    tensor wte = t_rand(wdt, (size_t)V * C, -1.0f, 1.0f, 0), out = t_rand(dt, (size_t)T * C, 0, 0, 0);
    void *dtok = dev_upload(tok, (size_t)T * sizeof(int32_t));
    cr_assert(mt_cu_embedding(NULL, dt, out.dev, dtok, wdt, wte.dev, T, C, V, scale) == 0);
    float *og = t_fetch(&out);
    /* a copy times scale, converted: exact (bf16 -> fp32 exactly, one fp32
     * product as the CPU's, fp32 -> bf16 rounded alike; x 1 is exact) */
    float *cpu = xmalloc((size_t)T * C * sizeof(float));
    mt_cpu_embedding(NULL, cpu, tok, wte.ref, T, C, scale);
    for (int t = 0; t < T; t++)
        for (int c = 0; c < C; c++) {
            float want = wte.ref[(size_t)tok[t] * C + c] * scale;
            cr_assert(want == cpu[(size_t)t * C + c], "the CPU's embedding: one fp32 product");
            if (dt == MT_CU_BF16) want = mt_bf16_to_f32(mt_f32_to_bf16(want));
            cr_assert(og[(size_t)t * C + c] == want, "T %d C %d V %d out %s wte %s scale %g: out[%d,%d]", T, C, V,
                      dtn(dt), dtn(wdt), scale, t, c);
        }
    free(og), free(cpu);

    /* backward: for every row the same float products (dout * scale, rounded)
     * and additions in the same order as the CPU (built without fused
     * multiply-adds): bit-identical */
    tensor dwte = t_rand(MT_CU_F32, (size_t)V * C, -1.0f, 1.0f, 0), dout = t_rand(MT_CU_F32, (size_t)T * C, -1, 1, 0);
    float *dwte0 = xmalloc((size_t)V * C * sizeof(float));
    memcpy(dwte0, dwte.ref, (size_t)V * C * sizeof(float));
    mt_cpu_embedding_bwd(NULL, dwte.ref, tok, dout.ref, T, C, V, scale, pad);
    void *scratch = dev_scratch(mt_cu_embedding_bwd_scratch_bytes(T));
    cr_assert(mt_cu_embedding_bwd(NULL, dwte.dev, dtok, dout.dev, T, C, V, scale, pad, scratch) == 0);
    float *g = t_fetch(&dwte);
    if (pad >= 0) /* the padding row as it was (the CPU's skips it too: checked in tests/test_cpu_ops.c) */
        cr_assert(memcmp(g + (size_t)pad * C, dwte0 + (size_t)pad * C, (size_t)C * sizeof(float)) == 0,
                  "T %d C %d V %d: the padding row %d changed", T, C, V, pad);
    for (size_t i = 0; i < (size_t)V * C; i++)
        cr_assert(memcmp(&g[i], &dwte.ref[i], sizeof(float)) == 0, "T %d C %d V %d scale %g: dwte[%zu] = %.9g, CPU %.9g",
                  T, C, V, scale, i, g[i], dwte.ref[i]);
    free(g), free(dwte0), free(tok);
    mt_device_free(scratch), mt_device_free(dtok);
    t_free(&wte), t_free(&out), t_free(&dwte), t_free(&dout);
}

static void check_embedding_scaled(int T, int C, int V, mt_cu_dtype dt, mt_cu_dtype wdt, float scale)
{
    check_embedding_padded(T, C, V, dt, wdt, scale, -1);
}

static void check_embedding(int T, int C, int V, mt_cu_dtype dt, mt_cu_dtype wdt)
{
    check_embedding_scaled(T, C, V, dt, wdt, 1.0f);
}

/* nn.Embedding's padding_idx: a frequent token (runs of repeats from ids 0..6) and the last id
 * (tok[0]) as the padding row; the other rows bit-identical to the CPU's */
Test(cuda_kernels, embedding_padding_row)
{
    NEED_GPU();
    seed(24);
    check_embedding_padded(300, 4096, 1000, MT_CU_F32, MT_CU_F32, 1.0f, 3);
    check_embedding_padded(300, 96, 32000, MT_CU_BF16, MT_CU_BF16, mt_bf16_to_f32(mt_f32_to_bf16(sqrtf(96))), 0);
    check_embedding_padded(257, 98, 1000, MT_CU_F32, MT_CU_BF16, 1.0f, 999); /* scalar path; tok[0] = V - 1 */
}

/* Gemma: out = wte[tok] * bf16(sqrt(C)), dwte += dout * the same */
Test(cuda_kernels, embedding_scaled)
{
    NEED_GPU();
    seed(23);
    const mt_cu_dtype pairs[][2] = {{MT_CU_F32, MT_CU_F32}, {MT_CU_BF16, MT_CU_BF16}, {MT_CU_F32, MT_CU_BF16}};
    for (int p = 0; p < 3; p++) {
        check_embedding_scaled(300, 2304, 1000, pairs[p][0], pairs[p][1], mt_bf16_to_f32(mt_f32_to_bf16(sqrtf(2304))));
        check_embedding_scaled(300, 96, 32000, pairs[p][0], pairs[p][1], mt_bf16_to_f32(mt_f32_to_bf16(sqrtf(96))));
        check_embedding_scaled(257, 98, 1000, pairs[p][0], pairs[p][1], sqrtf(98)); /* scalar path, fp32 scale */
    }
}

Test(cuda_kernels, embedding)
{
    NEED_GPU();
    seed(5);
    const mt_cu_dtype pairs[][2] = {{MT_CU_F32, MT_CU_F32}, {MT_CU_BF16, MT_CU_BF16}, {MT_CU_F32, MT_CU_BF16}};
    for (int p = 0; p < 3; p++) {
        check_embedding(300, 4096, 1000, pairs[p][0], pairs[p][1]);
        check_embedding(300, 96, 32000, pairs[p][0], pairs[p][1]);
        check_embedding(257, 98, 1000, pairs[p][0], pairs[p][1]); /* C % 4 != 0: scalar */
    }
    check_embedding(1, 8, 1, MT_CU_F32, MT_CU_F32);
}

Test(cuda_kernels, embedding_tokens_out_of_range)
{
    NEED_GPU();
    seed(6);
    const int T = 4, C = 16, V = 10;
    const int32_t tok[4] = {3, -1, 10, 3};
    tensor wte = t_rand(MT_CU_F32, (size_t)V * C, -1, 1, 0), out = t_rand(MT_CU_F32, (size_t)T * C, 5, 6, 0);
    tensor dwte = t_rand(MT_CU_F32, (size_t)V * C, -1, 1, 0), dout = t_rand(MT_CU_F32, (size_t)T * C, -1, 1, 0);
    void *dtok = dev_upload(tok, sizeof tok), *scratch = dev_scratch(mt_cu_embedding_bwd_scratch_bytes(T));
    cr_assert(mt_cu_embedding(NULL, MT_CU_F32, out.dev, dtok, MT_CU_F32, wte.dev, T, C, V, 1.0f) == 0);
    cr_assert(mt_cu_embedding_bwd(NULL, dwte.dev, dtok, dout.dev, T, C, V, 1.0f, -1, scratch) == 0);
    float *o = t_fetch(&out), *g = t_fetch(&dwte);
    for (int c = 0; c < C; c++) {
        cr_assert(o[C + c] == 0.0f && o[2 * C + c] == 0.0f, "a token out of range gives a zero row");
        cr_assert(o[c] == wte.ref[3 * C + c]);
        cr_assert(g[3 * C + c] == (dwte.ref[3 * C + c] + dout.ref[c]) + dout.ref[3 * C + c]);
    }
    for (int v = 0; v < V; v++)
        if (v != 3)
            for (int c = 0; c < C; c++) cr_assert(g[v * C + c] == dwte.ref[v * C + c], "row %d untouched", v);
    free(o), free(g);
    mt_device_free(dtok), mt_device_free(scratch);
    t_free(&wte), t_free(&out), t_free(&dwte), t_free(&dout);
}

/* ---- cross-entropy ------------------------------------------------------------------ */

enum { CE_SEPARATE, CE_IN_PLACE, CE_LOSS_ONLY };

/* softcap > 0: Gemma 2's final_logit_softcapping, c = cap tanh(x / cap) before the loss. */
static void check_ce_cap(int n, int V, mt_cu_dtype dt, int mode, const mt_cu_tuning *tu, float softcap)
{
    const float dscale = 1.0f / 29.0f;
    const int ignore = -100;
    tensor lg = t_rand(MT_CU_F32, (size_t)n * V, -4.0f, 4.0f, 0);
    int32_t *tg = xmalloc((size_t)n * sizeof(int32_t));
    for (int r = 0; r < n; r++) {
        tg[r] = (next_u64() % 5 == 0) ? ignore : (int32_t)(next_u64() % (uint64_t)V);
        if (r % 3 == 0) lg.ref[(size_t)r * V + next_u64() % (uint64_t)V] = 30.0f; /* a confident row */
    }
    tg[0] = ignore;
    if (n > 1) tg[1] = V - 1;
    t_upload(&lg);
    float *ref = xmalloc((size_t)n * V * sizeof(float));
    memcpy(ref, lg.ref, (size_t)n * V * sizeof(float));
    int count_ref = 0;
    /* with a cap: each row's largest capped logit, for the tolerances below */
    double *cmax = xmalloc((size_t)n * sizeof(double));
    for (int r = 0; r < n; r++) {
        cmax[r] = 0.0;
        for (int v = 0; v < V; v++) {
            const double x = fabs(lg.ref[(size_t)r * V + v]);
            cmax[r] = fmax(cmax[r], softcap > 0.0f ? softcap * tanh(x / softcap) : 0.0);
        }
    }
    const double loss_ref = mt_cpu_cross_entropy(NULL, ref, tg, n, V, dscale, softcap, ignore, &count_ref);

    void *dtg = dev_upload(tg, (size_t)n * sizeof(int32_t));
    const double loss0 = 1.5; /* the sums accumulate */
    const int count0 = 3;
    void *dloss = dev_upload(&loss0, sizeof loss0), *dcount = dev_upload(&count0, sizeof count0);
    void *scratch = dev_scratch(mt_cu_cross_entropy_scratch_bytes(n));
    tensor dl = {NULL, NULL, NULL, dt, (size_t)n * V};
    void *dst = NULL;
    if (mode == CE_IN_PLACE) {
        dl.dev = lg.dev;
        dst = lg.dev;
    } else if (mode == CE_SEPARATE) {
        dl.base = dl.dev = dev_scratch((size_t)n * V * mt_cu_dtype_size(dt));
        dst = dl.dev;
    }
    cr_assert(mt_cu_cross_entropy(NULL, lg.dev, dtg, n, V, dscale, softcap, ignore, dt, dst, dloss, dcount, scratch,
                                  tu) == 0);
    double loss;
    int count;
    D2H(&loss, dloss, sizeof loss);
    D2H(&count, dcount, sizeof count);
    cr_assert(count == count0 + count_ref, "n %d V %d: count %d, want %d", n, V, count, count0 + count_ref);
    /* each row's loss M + log S - x[target]: M and x[target] exact; S a sum
     * of exps each within 4 ulp (8u) of the CPU's, so log S within about 8u
     * (absolute); 16u per row, plus the double sums' own rounding. */
    double ltol = 16 * U24 * count_ref + 1e-12 * fabs(loss_ref);
    /* the cap: tanhf within 2 ulp on each side (CUDA's and glibc's), the
     * division and product rounded alike: each capped logit c within 8u |c|
     * of the CPU's, which moves M, x[target] and every exp's argument by at
     * most 8u max|c|: 32u max|c| per row */
    if (softcap > 0.0f)
        for (int r = 0; r < n; r++)
            if (tg[r] != ignore) ltol += 32 * U24 * cmax[r];
    cr_assert(fabs((loss - loss0) - loss_ref) <= ltol, "n %d V %d %s cap %g: loss %.12g, ref %.12g", n, V, dtn(dt),
              softcap, loss - loss0, loss_ref);
    float *g = NULL;
    if (mode != CE_LOSS_ONLY) {
        g = t_fetch(&dl);
        /* p = exp(x - M) * (dscale / S): the same x - M, exp within 4 ulp
         * between the libraries and dscale / S within a few: 16u relative;
         * at the target p - dscale: 16u of dscale. Ignored rows: zeros. */
        for (int r = 0; r < n; r++)
            for (int v = 0; v < V; v++) {
                const size_t i = (size_t)r * V + v;
                const double mag = fabs(ref[i]) + (v == tg[r] ? dscale : 0.0);
                double tol = 16 * U24 * mag;
                if (softcap > 0.0f) {
                    /* the cap moves p's exponent by 16u max|c| + 8u|c| (above): 24u max|c| relative;
                     * t = c / cap within 8u |t|, so 1 - t^2 within 16u t^2 (absolute), relative
                     * 16u t^2 / (1 - t^2) of the gradient; and the CPU's p in double, one more rounding */
                    const double t = tanh((double)lg.ref[i] / softcap);
                    tol = (24 + 24 * cmax[r]) * U24 * mag + 16 * U24 * mag * t * t / fmax(1.0 - t * t, 1e-30);
                }
                cr_assert(fabs(g[i] - ref[i]) <= out_tol(dt, ref[i], tol),
                          "n %d V %d %s mode %d cap %g: dlogits[%d,%d] = %.9g, ref %.9g (target %d)", n, V, dtn(dt),
                          mode, softcap, r, v, g[i], ref[i], tg[r]);
                if (tg[r] == ignore) cr_assert(g[i] == 0.0f);
            }
    }
    /* determinism (not in place: the logits are gone) */
    if (mode != CE_IN_PLACE) {
        const double zero = 0.0;
        H2D(dloss, &zero, sizeof zero);
        cr_assert(mt_cu_cross_entropy(NULL, lg.dev, dtg, n, V, dscale, softcap, ignore, dt, dst, dloss, NULL, scratch,
                                      tu) == 0);
        double loss2;
        D2H(&loss2, dloss, sizeof loss2);
        cr_assert(loss0 + loss2 == loss, "n %d V %d: the loss differs between runs", n, V);
        if (g) {
            float *g2 = t_fetch(&dl);
            cr_assert(memcmp(g, g2, (size_t)n * V * sizeof(float)) == 0, "dlogits differ between runs");
            free(g2);
        }
    }
    free(g), free(tg), free(ref), free(cmax);
    if (mode == CE_SEPARATE) mt_device_free(dl.base);
    mt_device_free(dtg), mt_device_free(dloss), mt_device_free(dcount), mt_device_free(scratch);
    t_free(&lg);
}

static void check_ce(int n, int V, mt_cu_dtype dt, int mode, const mt_cu_tuning *tu)
{
    check_ce_cap(n, V, dt, mode, tu, 0.0f);
}

/* Gemma 2's logit soft-cap (30), and a tighter one (5) whose tanh saturates
 * on the confident rows' logit of 30; the cluster variant has no cap, so
 * asking for it runs the row kernel (the last case). */
Test(cuda_kernels, cross_entropy_softcap)
{
    NEED_GPU();
    seed(24);
    const int Vs[] = {1000, 32000, 1001};
    const float caps[] = {30.0f, 5.0f};
    for (int ci = 0; ci < 2; ci++)
        for (int vi = 0; vi < 3; vi++) {
            check_ce_cap(37, Vs[vi], MT_CU_F32, CE_SEPARATE, NULL, caps[ci]);
            check_ce_cap(37, Vs[vi], MT_CU_F32, CE_IN_PLACE, NULL, caps[ci]);
            check_ce_cap(37, Vs[vi], MT_CU_BF16, CE_SEPARATE, NULL, caps[ci]);
            check_ce_cap(37, Vs[vi], MT_CU_F32, CE_LOSS_ONLY, NULL, caps[ci]);
        }
    mt_cu_tuning tu;
    mt_cu_tuning_default(&tu);
    cr_assert(mt_cu_tuning_set(&tu, MT_CU_TUNE_CE_CLUSTER, 1) == 0);
    check_ce_cap(5, 256000, MT_CU_BF16, CE_SEPARATE, &tu, 30.0f); /* Gemma's vocabulary */
}

/* ---- soft-cap of the returned logits -------------------------------------------------- */

static void check_softcap(size_t n, size_t off, float cap)
{
    tensor x = t_rand(MT_CU_F32, n, -4.0f * cap, 4.0f * cap, off);
    cr_assert(mt_cu_softcap(NULL, x.dev, n, cap) == 0);
    mt_cpu_softcap(x.ref, n, cap);
    float *g = t_fetch(&x);
    /* tanhf within 2 ulp on each side, the division and product rounded alike: 8u relative */
    for (size_t i = 0; i < n; i++)
        cr_assert(fabs(g[i] - x.ref[i]) <= 8 * U24 * fabs(x.ref[i]) + 1e-30, "n %zu off %zu cap %g: x[%zu] = %.9g, ref %.9g",
                  n, off, cap, i, g[i], x.ref[i]);
    free(g);
    t_free(&x);
}

Test(cuda_kernels, softcap)
{
    NEED_GPU();
    seed(25);
    check_softcap(100003, 0, 30.0f); /* vectors and a tail */
    check_softcap(100003, 1, 50.0f); /* misaligned: scalar */
    check_softcap(3, 0, 30.0f);
}

Test(cuda_kernels, cross_entropy)
{
    NEED_GPU();
    seed(7);
    const int Vs[] = {1000, 32000, 1001};
    for (int vi = 0; vi < 3; vi++) {
        check_ce(37, Vs[vi], MT_CU_F32, CE_SEPARATE, NULL);
        check_ce(37, Vs[vi], MT_CU_F32, CE_IN_PLACE, NULL);
        check_ce(37, Vs[vi], MT_CU_BF16, CE_SEPARATE, NULL);
        check_ce(37, Vs[vi], MT_CU_F32, CE_LOSS_ONLY, NULL);
    }
    check_ce(1, 3, MT_CU_F32, CE_SEPARATE, NULL);
}

Test(cuda_kernels, cross_entropy_variants)
{
    NEED_GPU();
    seed(13);
    const int threads[] = {512, 1024, 64};
    mt_cu_tuning tu;
    mt_cu_tuning_default(&tu);
    for (int cl = 0; cl < 2; cl++)
        for (int ti = 0; ti < 3; ti++)
            for (int rev = 0; rev < 2; rev++) {
                cr_assert(mt_cu_tuning_set(&tu, MT_CU_TUNE_CE_CLUSTER, cl) == 0);
                cr_assert(mt_cu_tuning_set(&tu, MT_CU_TUNE_CE_THREADS, threads[ti]) == 0);
                cr_assert(mt_cu_tuning_set(&tu, MT_CU_TUNE_CE_REVERSE, rev) == 0);
                cr_assert(mt_cu_tuning_set(&tu, MT_CU_TUNE_CE_SMEM, rev && !cl ? 120 * 1024 : 0) == 0);
                check_ce(37, 32000, MT_CU_BF16, CE_SEPARATE, &tu);
                check_ce(37, 32000, MT_CU_F32, CE_IN_PLACE, &tu);
                check_ce(37, 1000, MT_CU_F32, CE_LOSS_ONLY, &tu);
                check_ce(37, 1001, MT_CU_F32, CE_SEPARATE, &tu);
                if (ti == 1 && rev == 1) { /* Qwen2's vocabulary: 8 blocks a row in the cluster variant */
                    check_ce(5, 152064, MT_CU_BF16, CE_SEPARATE, &tu);
                    check_ce(5, 152064, MT_CU_F32, CE_IN_PLACE, &tu);
                }
            }
}

/* ---- elementwise ------------------------------------------------------------------ */

static void check_elementwise(size_t n, size_t off)
{
    /* convert: bf16 rounding to nearest even as the host's; widening exact */
    tensor f = t_rand(MT_CU_F32, n, -3, 3, off), b = t_rand(MT_CU_BF16, n, -3, 3, off);
    tensor fo = t_rand(MT_CU_F32, n, 0, 0, off), bo = t_rand(MT_CU_BF16, n, 0, 0, off);
    cr_assert(mt_cu_convert(NULL, MT_CU_BF16, bo.dev, MT_CU_F32, f.dev, n) == 0);
    cr_assert(mt_cu_convert(NULL, MT_CU_F32, fo.dev, MT_CU_BF16, b.dev, n) == 0);
    float *bg = t_fetch(&bo), *fg = t_fetch(&fo);
    for (size_t i = 0; i < n; i++) {
        cr_assert(bg[i] == mt_bf16_to_f32(mt_f32_to_bf16(f.ref[i])), "n %zu off %zu: to bf16 [%zu]", n, off, i);
        cr_assert(fg[i] == b.ref[i], "n %zu off %zu: to fp32 [%zu]", n, off, i);
    }
    free(bg), free(fg);
    /* add: fp32 sums, exact; y = fp32 residual + bf16 branch, and bf16 = bf16 + fp32 */
    cr_assert(mt_cu_add(NULL, MT_CU_F32, fo.dev, MT_CU_F32, f.dev, MT_CU_BF16, b.dev, n) == 0);
    cr_assert(mt_cu_add(NULL, MT_CU_BF16, bo.dev, MT_CU_BF16, b.dev, MT_CU_F32, f.dev, n) == 0);
    fg = t_fetch(&fo), bg = t_fetch(&bo);
    for (size_t i = 0; i < n; i++) {
        const float s = f.ref[i] + b.ref[i];
        cr_assert(fg[i] == s, "n %zu off %zu: add f32 [%zu]", n, off, i);
        cr_assert(bg[i] == mt_bf16_to_f32(mt_f32_to_bf16(s)), "n %zu off %zu: add bf16 [%zu]", n, off, i);
    }
    free(bg), free(fg);
    /* in place y = y + b, and scale */
    cr_assert(mt_cu_add(NULL, MT_CU_F32, f.dev, MT_CU_F32, f.dev, MT_CU_BF16, b.dev, n) == 0);
    cr_assert(mt_cu_scale(NULL, MT_CU_F32, f.dev, 0.37f, n) == 0);
    cr_assert(mt_cu_scale(NULL, MT_CU_BF16, b.dev, -1.7f, n) == 0);
    fg = t_fetch(&f), bg = t_fetch(&b);
    for (size_t i = 0; i < n; i++) {
        cr_assert(fg[i] == (f.ref[i] + b.ref[i]) * 0.37f, "n %zu off %zu: add in place, scale [%zu]", n, off, i);
        cr_assert(bg[i] == mt_bf16_to_f32(mt_f32_to_bf16(b.ref[i] * -1.7f)), "n %zu off %zu: scale bf16 [%zu]", n,
                  off, i);
    }
    free(bg), free(fg);
    cr_assert(mt_cu_zero(NULL, fo.dev, n * sizeof(float)) == 0);
    fg = t_fetch(&fo);
    for (size_t i = 0; i < n; i++) cr_assert(fg[i] == 0.0f);
    free(fg);
    t_free(&f), t_free(&b), t_free(&fo), t_free(&bo);
}

Test(cuda_kernels, elementwise)
{
    NEED_GPU();
    seed(8);
    check_elementwise(100003, 0);
    check_elementwise(100003, 1);
    check_elementwise(5, 0);
    cr_assert(mt_cu_convert(NULL, MT_CU_F32, NULL, MT_CU_F32, NULL, 0) == 0, "n = 0 does nothing");
}

/* ---- reductions ------------------------------------------------------------------ */

static void check_sumsq(size_t n, size_t off)
{
    tensor x = t_rand(MT_CU_F32, n, -1.5f, 1.5f, off);
    const double start = 2.5;
    void *out = dev_upload(&start, sizeof start), *scratch = dev_scratch(mt_cu_sumsq_scratch_bytes());
    cr_assert(mt_cu_sumsq(NULL, out, x.dev, n, scratch) == 0);
    double got, got2;
    D2H(&got, out, sizeof got);
    long double ref = 0;
    for (size_t i = 0; i < n; i++) ref += (long double)x.ref[i] * x.ref[i];
    /* every square exact in double, n additions in double: within n 2^-53
     * relative in the worst case, far less in practice; 1e-12 covers
     * n <= 2^40 at a typical sqrt(n) growth and catches any lost element */
    cr_assert(fabs((got - start) - (double)ref) <= 1e-12 * (double)ref + 1e-300, "n %zu: %.17g vs %.17Lg", n,
              got - start, ref);
    const double cpu = mt_sumsq_f32(NULL, x.ref, n);
    cr_assert(fabs((got - start) - cpu) <= 1e-12 * cpu + 1e-300, "n %zu: %.17g vs the CPU's %.17g", n, got - start,
              cpu);
    H2D(out, &start, sizeof start);
    cr_assert(mt_cu_sumsq(NULL, out, x.dev, n, scratch) == 0);
    D2H(&got2, out, sizeof got2);
    cr_assert(memcmp(&got, &got2, sizeof got) == 0, "n %zu: two runs differ", n);
    mt_device_free(out), mt_device_free(scratch);
    t_free(&x);
}

Test(cuda_kernels, sumsq)
{
    NEED_GPU();
    seed(9);
    check_sumsq(10000019, 0);
    check_sumsq(10000019, 1);
    check_sumsq(5, 0);
    check_sumsq(1000, 3);
}

static void check_bias(int T, int N, mt_cu_dtype dt)
{
    tensor dy = t_rand(dt, (size_t)T * N, -1, 1, 0), db = t_rand(MT_CU_F32, (size_t)N, -1, 1, 0);
    float *db0 = xmalloc((size_t)N * sizeof(float));
    memcpy(db0, db.ref, (size_t)N * sizeof(float));
    mt_cpu_matmul_bwd(NULL, NULL, NULL, NULL, db.ref, dy.ref, NULL, NULL, T, 1, N, 0);
    void *scratch = dev_scratch(mt_cu_bias_grad_scratch_bytes(T, N));
    cr_assert(mt_cu_bias_grad(NULL, db.dev, dt, dy.dev, T, N, scratch) == 0);
    float *g = t_fetch(&db);
    /* T + 1 terms in two orders: within 2 T u sum|terms| of each other */
    for (int c = 0; c < N; c++) {
        double mag = fabs(db0[c]);
        for (int t = 0; t < T; t++) mag += fabs(dy.ref[(size_t)t * N + c]);
        cr_assert(fabs(g[c] - db.ref[c]) <= 2.0 * T * U24 * mag, "T %d N %d %s: db[%d] = %.9g, ref %.9g", T, N, dtn(dt),
                  c, g[c], db.ref[c]);
    }
    H2D(db.dev, db0, (size_t)N * sizeof(float));
    cr_assert(mt_cu_bias_grad(NULL, db.dev, dt, dy.dev, T, N, scratch) == 0);
    float *g2 = t_fetch(&db);
    cr_assert(memcmp(g, g2, (size_t)N * sizeof(float)) == 0, "T %d N %d: two runs differ", T, N);
    free(g), free(g2), free(db0);
    mt_device_free(scratch);
    t_free(&dy), t_free(&db);
}

Test(cuda_kernels, bias_grad)
{
    NEED_GPU();
    seed(10);
    for (int dti = 0; dti < 2; dti++) {
        const mt_cu_dtype dt = dti ? MT_CU_BF16 : MT_CU_F32;
        check_bias(37, 96, dt);
        check_bias(2053, 4104, dt);
        check_bias(300, 100, dt); /* N % 8 != 0: scalar */
        check_bias(1, 1, dt);
    }
}

Test(cuda_kernels, bad_arguments)
{
    NEED_GPU();
    char scratch_dummy;
    cr_expect(mt_cu_rmsnorm(NULL, MT_CU_F32, NULL, NULL, MT_CU_F32, NULL, NULL, 4, 40000, 1e-5f, 0.0f, NULL) == -1,
              "rows longer than 32768");
    cr_expect(mt_cu_rmsnorm(NULL, (mt_cu_dtype)7, NULL, NULL, MT_CU_F32, NULL, NULL, 4, 64, 1e-5f, 0.0f, NULL) == -1,
              "unknown dtype");
    cr_expect(mt_cu_rope(NULL, MT_CU_F32, NULL, NULL, NULL, 4, 2, 7, 7, 1.0f, 0) == -1, "odd head dim");
    cr_expect(mt_cu_rmsnorm_bwd(NULL, NULL, (float *)&scratch_dummy, NULL, MT_CU_F32, NULL, MT_CU_F32, NULL, NULL, 4,
                                64, 1e-5f, 0.0f, NULL, NULL) == -1,
              "dw without scratch");
    float *lg = dev_alloc(64 * sizeof(float));
    cr_expect(mt_cu_cross_entropy(NULL, lg, NULL, 1, 64, 1.0f, 0.0f, -100, MT_CU_BF16, lg, NULL, NULL, &scratch_dummy,
                                  NULL) == -1,
              "bf16 gradients cannot overwrite fp32 logits");
    cr_expect(mt_cu_cross_entropy(NULL, lg, NULL, 1, 64, 1.0f, -1.0f, -100, MT_CU_F32, NULL, NULL, NULL, &scratch_dummy,
                                  NULL) == -1,
              "a negative soft-cap");
    cr_expect(mt_cu_softcap(NULL, lg, 64, 0.0f) == -1, "a soft-cap of 0");
    /* a tuning filled by hand with values mt_cu_tuning_set refuses: nothing is launched */
    mt_cu_tuning bad;
    mt_cu_tuning_default(&bad);
    bad.rms_fwd_emin = 3;
    cr_expect(mt_cu_rmsnorm(NULL, MT_CU_F32, lg, NULL, MT_CU_F32, lg, lg, 1, 64, 1e-5f, 0.0f, &bad) == -1, "bad emin");
    mt_cu_tuning_default(&bad);
    bad.rms_bwd_chunks = 0;
    cr_expect(mt_cu_rmsnorm_bwd(NULL, lg, NULL, lg, MT_CU_F32, lg, MT_CU_F32, lg, NULL, 1, 64, 1e-5f, 0.0f, NULL, &bad) == -1,
              "no row chunks");
    mt_cu_tuning_default(&bad);
    bad.ce_threads = 2048;
    cr_expect(mt_cu_cross_entropy(NULL, lg, NULL, 1, 64, 1.0f, 0.0f, -100, MT_CU_F32, NULL, NULL, NULL, &scratch_dummy,
                                  &bad) == -1,
              "too many threads");
    mt_device_free(lg);
    cr_expect(mt_device_sync(why, sizeof why) == 0, "no error left behind: %s", why);
}

/* ---- attention temperature (Llama 4) ------------------------------------------------------------ */

/* mt_cu_attn_temperature against mt_cpu_attn_temperature on the same (dt-rounded) values, with
 * tolerance 0 in both dtypes. The factor is made by the same fp32 steps on both sides (no fused
 * multiply-add; log1p in double rounded once to fp32, which for integer arguments below 2^24 is the
 * correctly rounded log1pf given any double log1p within 5 ulp: cpu_ops.h), and each element is one
 * fp32 product x * f on both sides; in bf16 mode the kernel rounds that fp32 product to bf16 on store,
 * and the reference here rounds the CPU's fp32 product to bf16 the same way (as transformers' fp32
 * product then .to(bf16)). So any difference is a bug. T = 2 sequences (3 at Llama 4's floor_scale),
 * rows a multiple of 8 (8-wide path) or not, aligned or shifted by an element (scalar path), and one
 * row for each q up to 2^20 for the GPU's log1p. */
static void check_temperature(int S, int nseq, int n, float fs, float sc, mt_cu_dtype dt, size_t off)
{
    const int T = S * nseq;
    const size_t ne = (size_t)T * n;
    tensor x = t_rand(dt, ne, -4.0f, 4.0f, off);
    mt_cpu_attn_temperature(NULL, x.ref, T, S, n, fs, sc);
    if (dt == MT_CU_BF16)
        for (size_t i = 0; i < ne; i++) x.ref[i] = mt_bf16_to_f32(mt_f32_to_bf16(x.ref[i]));
    cr_assert(mt_cu_attn_temperature(NULL, dt, x.dev, T, S, n, fs, sc) == 0);
    float *g = t_fetch(&x);
    for (size_t i = 0; i < ne; i++)
        cr_assert(memcmp(&g[i], &x.ref[i], sizeof(float)) == 0,
                  "%s S %d n %d floor %g off %zu: x[%zu, %zu] = %.9g, ref %.9g", dtn(dt), S, n, fs, off, i / n, i % n,
                  g[i], x.ref[i]);
    free(g);
    t_free(&x);
}

Test(cuda_kernels, attn_temperature)
{
    NEED_GPU();
    seed(40);
    for (int dti = 0; dti < 2; dti++) {
        const mt_cu_dtype dt = dti ? MT_CU_BF16 : MT_CU_F32;
        check_temperature(13, 2, 40, 4.0f, 0.1f, dt, 0);    /* q = 0..3; the 8-wide path */
        check_temperature(13, 2, 40, 4.0f, 0.1f, dt, 1);    /* misaligned: the scalar path */
        check_temperature(13, 2, 37, 4.0f, 0.1f, dt, 0);    /* n % 8 != 0 */
        check_temperature(1000, 2, 64, 3.0f, 0.25f, dt, 0); /* a floor_scale that divides inexactly */
        check_temperature(20000, 3, 8, 8192.0f, 0.1f, dt, 0); /* Llama 4's: q = 0, 1, 2 */
    }
    /* every factor up to q = 2^20 (one row per q, n 8): the GPU's log1p against the CPU's */
    check_temperature(1 << 20, 1, 8, 1.0f, 0.1f, MT_CU_F32, 0);
    cr_expect(mt_cu_attn_temperature(NULL, MT_CU_F32, NULL, 4, 0, 8, 4.0f, 0.1f) == -1, "seq_len 0");
    cr_expect(mt_cu_attn_temperature(NULL, MT_CU_F32, NULL, 0, 4, 8, 4.0f, 0.1f) == 0, "no rows");
}

/* ---- moe_dot_scale with its optional operands ---------------------------------------------------- */

/* mt_cu_moe_dot_scale with dw NULL, y NULL, both or neither against mt_cpu_moe_dot_scale on the same
 * (dt-rounded) values: x and y exactly (one fp32 product each on both sides, the CPU's rounded here to
 * dt as the kernel's store rounds it); dw, where written, within 2u plus the reordering of the double
 * sums (the GPU's tree against the CPU's ascending sum: the products are exact in double, and each sum
 * is within n 2^-53 of sum |x y|); where dw is NULL or y is, the sentinel in dw kept, and where y is
 * NULL its buffer unchanged. n = 300 > the block's 256 threads. */
static void check_dot_scale_opt(mt_cu_dtype dt, int with_dw, int with_y)
{
    enum { R = 7, n = 300 };
    const int32_t rows[R] = {4, 0, 6, 2, 5, 1, 3};
    tensor x = t_rand(dt, (size_t)R * n, -2.0f, 2.0f, 0), y = t_rand(dt, (size_t)R * n, -2.0f, 2.0f, 0);
    tensor w = t_rand(MT_CU_F32, R, -1.5f, 1.5f, 0), dw = t_rand(MT_CU_F32, R, 0.0f, 0.0f, 0);
    for (int r = 0; r < R; r++) dw.ref[r] = -7.0f; /* a sentinel */
    t_upload(&dw);
    float *y0 = xmalloc(sizeof(float) * R * n);
    memcpy(y0, y.ref, sizeof(float) * R * n);
    double absum[R] = {0};
    for (int r = 0; r < R; r++)
        for (int i = 0; i < n; i++) absum[r] += fabs((double)x.ref[r * n + i] * y.ref[r * n + i]);
    int32_t *drows = dev_upload(rows, sizeof rows);
    mt_cpu_moe_dot_scale(with_dw ? dw.ref : NULL, x.ref, with_y ? y.ref : NULL, w.ref, rows, R, n);
    cr_assert(mt_cu_moe_dot_scale(NULL, dt, with_dw ? dw.dev : NULL, x.dev, with_y ? y.dev : NULL, w.dev, drows, R,
                                  n) == 0);
    if (dt == MT_CU_BF16)
        for (int i = 0; i < R * n; i++)
            x.ref[i] = mt_bf16_to_f32(mt_f32_to_bf16(x.ref[i])), y.ref[i] = mt_bf16_to_f32(mt_f32_to_bf16(y.ref[i]));
    float *gx = t_fetch(&x), *gy = t_fetch(&y), *gd = t_fetch(&dw);
    cr_assert(memcmp(gx, x.ref, sizeof(float) * R * n) == 0, "%s dw %d y %d: x", dtn(dt), with_dw, with_y);
    cr_assert(memcmp(gy, with_y ? y.ref : y0, sizeof(float) * R * n) == 0, "%s dw %d y %d: y", dtn(dt), with_dw,
              with_y);
    for (int r = 0; r < R; r++) {
        const int e = rows[r];
        if (with_dw && with_y)
            cr_assert(fabs(gd[e] - dw.ref[e]) <= 2 * U24 * fabs(dw.ref[e]) + 1e-13 * absum[r], "%s dw[%d] %.9g vs %.9g",
                      dtn(dt), e, gd[e], dw.ref[e]);
        else
            cr_assert(gd[e] == -7.0f, "%s dw %d y %d: dw[%d] not written", dtn(dt), with_dw, with_y, e);
    }
    free(gx), free(gy), free(gd), free(y0);
    mt_device_free(drows);
    t_free(&x), t_free(&y), t_free(&w), t_free(&dw);
}

Test(cuda_kernels, moe_dot_scale_optional)
{
    NEED_GPU();
    seed(41);
    for (int dti = 0; dti < 2; dti++)
        for (int m = 0; m < 4; m++) check_dot_scale_opt(dti ? MT_CU_BF16 : MT_CU_F32, m & 1, m >> 1);
}
