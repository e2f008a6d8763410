/* The grouped expert GEMMs on Hopper (cuda/kernels/grouped_gemm.h) against a
 * reference in double over the same bf16 inputs (suite cuda_grouped). Skips
 * on a machine without a compute capability 9.0 GPU (fails under
 * MT_REQUIRE_GPU=1 where there is no GPU at all, tests/gpu.h).
 *
 * The experts' row counts cover what the tiling must get right: an expert
 * without rows (its output rows and gradient untouched), one row, a tile's
 * 128 and one either side of it, a few hundred; rows past the last expert
 * (offs[E] < R: written by nobody). K and N are multiples of 8 but not of 64
 * (the copy engine's zero fill at both edges) and pick both tile widths.
 *
 * Tolerances: fp32 outputs are sums of at most a few hundred products of
 * bf16 values, each product exact in fp32 and the sum rounded once per
 * term: within 1e-5 of the norm of |terms| per element (K u24 * 2 bounds it
 * far below that). bf16 outputs add one rounding (2^-8 relative) on top. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/bf16.h"
#include "cuda/kernels/grouped_gemm.h"
#include "device/device.h"
#include "gpu.h"

static char why[256];

static mt_cu_gg *need_gg(void)
{
    if (mt_device_count(why, sizeof why) <= 0) MT_GPU_MISSING("%s", why);
    mt_cu_gg *g = mt_cu_gg_create(why, sizeof why);
    if (!g) cr_skip_test("%s", why); /* a GPU, but not a Hopper one: the loop serves it */
    return g;
}

static void *up(const void *h, size_t bytes)
{
    void *d = NULL;
    cr_assert(mt_device_malloc(&d, bytes ? bytes : 4, why, sizeof why) == 0 && d, "%s", why);
    if (h && bytes) cr_assert(mt_device_copy_h2d(d, h, bytes, why, sizeof why) == 0, "%s", why);
    return d;
}

static void down(void *h, const void *d, size_t bytes)
{
    cr_assert(mt_device_copy_d2h(h, d, bytes, why, sizeof why) == 0, "%s", why);
}

static unsigned lcg(unsigned *s) { return *s = *s * 1664525u + 1013904223u; }
static float uni(unsigned *s) { return ((float)(lcg(s) >> 8) / 16777216.0f) * 2.0f - 1.0f; }

/* n random bf16 values, and the same as floats */
static uint16_t *rand_bf16(size_t n, unsigned *s, float **as_f32)
{
    uint16_t *h = malloc(n * sizeof *h);
    float *f = malloc(n * sizeof *f);
    cr_assert(h && f);
    for (size_t i = 0; i < n; i++) h[i] = mt_f32_to_bf16(uni(s)), f[i] = mt_bf16_to_f32(h[i]);
    *as_f32 = f;
    return h;
}

#define POISON 12345.0f
/* the poison as an output of that type holds it */
static float poison_as(int out_f32) { return out_f32 ? POISON : mt_bf16_to_f32(mt_f32_to_bf16(POISON)); }

typedef struct layout {
    int E, R, K, N;
    int32_t offs[16];
} layout;

/* counts of rows per expert; R leaves rows past the last one */
static layout make_layout(int K, int N, const int *counts, int E, int spare)
{
    layout l = {.E = E, .K = K, .N = N};
    l.offs[0] = 0;
    for (int e = 0; e < E; e++) l.offs[e + 1] = l.offs[e] + counts[e];
    l.R = l.offs[E] + spare;
    return l;
}

static int expert_of(const layout *l, int r)
{
    for (int e = 0; e < l->E; e++)
        if (r >= l->offs[e] && r < l->offs[e + 1]) return e;
    return -1;
}

/* y = x W_e^T (+ bias) (+ y), in fp32 or bf16 */
static void check_linear(const layout *l, int out_f32, int with_bias, int accumulate)
{
    mt_cu_gg *g = need_gg();
    const int E = l->E, R = l->R, K = l->K, N = l->N;
    unsigned s = 7u + (unsigned)(K * 3 + N + out_f32 * 5 + with_bias * 11 + accumulate * 13);
    float *xf, *wf, *bf, *y0f;
    uint16_t *x = rand_bf16((size_t)R * K, &s, &xf), *w = rand_bf16((size_t)E * N * K, &s, &wf);
    uint16_t *b = rand_bf16((size_t)E * N, &s, &bf), *y0 = rand_bf16((size_t)R * N, &s, &y0f);
    float *y0_32 = malloc((size_t)R * N * sizeof(float));
    for (size_t i = 0; i < (size_t)R * N; i++) y0_32[i] = (expert_of(l, (int)(i / N)) < 0) ? POISON : y0f[i];
    for (size_t i = 0; i < (size_t)R * N; i++)
        if (expert_of(l, (int)(i / N)) < 0) y0[i] = mt_f32_to_bf16(POISON);
    void *dx = up(x, (size_t)R * K * 2), *dw = up(w, (size_t)E * N * K * 2), *db = up(b, (size_t)E * N * 2);
    void *doffs = up(l->offs, (size_t)(E + 1) * 4);
    void *dy = out_f32 ? up(y0_32, (size_t)R * N * 4) : up(y0, (size_t)R * N * 2);
    cr_assert_eq(mt_cu_gg_linear(g, NULL, dy, out_f32, dx, dw, with_bias ? db : NULL, doffs, E, R, K, N, accumulate),
                 0);
    cr_assert(mt_device_sync(why, sizeof why) == 0, "%s", why);
    float *got = malloc((size_t)R * N * sizeof(float));
    if (out_f32) down(got, dy, (size_t)R * N * 4);
    else {
        uint16_t *h = malloc((size_t)R * N * 2);
        down(h, dy, (size_t)R * N * 2);
        for (size_t i = 0; i < (size_t)R * N; i++) got[i] = mt_bf16_to_f32(h[i]);
        free(h);
    }
    for (int r = 0; r < R; r++) {
        const int e = expert_of(l, r);
        for (int n = 0; n < N; n++) {
            const float v = got[(size_t)r * N + n];
            if (e < 0) {
                cr_assert_eq(v, poison_as(out_f32), "row %d of no expert written (column %d: %g)", r, n, v);
                continue;
            }
            double ref = 0, mag = 0;
            for (int k = 0; k < K; k++) {
                const double t = (double)xf[(size_t)r * K + k] * wf[((size_t)e * N + n) * K + k];
                ref += t, mag += fabs(t);
            }
            if (with_bias) ref += bf[(size_t)e * N + n], mag += fabs(bf[(size_t)e * N + n]);
            if (accumulate) {
                const double o = out_f32 ? y0_32[(size_t)r * N + n] : y0f[(size_t)r * N + n];
                ref += o, mag += fabs(o);
            }
            const double tol = 1e-5 * mag + (out_f32 ? 0 : fabs(ref) / 256.0);
            cr_assert(fabs(v - ref) <= tol, "y[%d, %d] (expert %d) %.8g, reference %.8g (tolerance %.3g)", r, n, e,
                      v, ref, tol);
        }
    }
    free(got), free(x), free(w), free(b), free(y0), free(xf), free(wf), free(bf), free(y0f), free(y0_32);
    mt_device_free(dx), mt_device_free(dw), mt_device_free(db), mt_device_free(doffs), mt_device_free(dy);
    mt_cu_gg_destroy(g);
}

/* dx = dy W_e (+ dx) */
static void check_dx(const layout *l, int out_f32, int accumulate)
{
    mt_cu_gg *g = need_gg();
    const int E = l->E, R = l->R, K = l->K, N = l->N;
    unsigned s = 17u + (unsigned)(K * 5 + N + out_f32 * 3 + accumulate);
    float *dyf, *wf, *x0f;
    uint16_t *dyh = rand_bf16((size_t)R * N, &s, &dyf), *w = rand_bf16((size_t)E * N * K, &s, &wf);
    uint16_t *x0 = rand_bf16((size_t)R * K, &s, &x0f);
    for (size_t i = 0; i < (size_t)R * K; i++)
        if (expert_of(l, (int)(i / K)) < 0) x0[i] = mt_f32_to_bf16(POISON), x0f[i] = POISON;
    void *ddy = up(dyh, (size_t)R * N * 2), *dw = up(w, (size_t)E * N * K * 2), *doffs = up(l->offs, (size_t)(E + 1) * 4);
    void *ddx = out_f32 ? up(x0f, (size_t)R * K * 4) : up(x0, (size_t)R * K * 2);
    cr_assert_eq(mt_cu_gg_linear_dx(g, NULL, ddx, out_f32, ddy, dw, doffs, E, R, K, N, accumulate), 0);
    cr_assert(mt_device_sync(why, sizeof why) == 0, "%s", why);
    float *got = malloc((size_t)R * K * sizeof(float));
    if (out_f32) down(got, ddx, (size_t)R * K * 4);
    else {
        uint16_t *h = malloc((size_t)R * K * 2);
        down(h, ddx, (size_t)R * K * 2);
        for (size_t i = 0; i < (size_t)R * K; i++) got[i] = mt_bf16_to_f32(h[i]);
        free(h);
    }
    for (int r = 0; r < R; r++) {
        const int e = expert_of(l, r);
        for (int k = 0; k < K; k++) {
            const float v = got[(size_t)r * K + k];
            if (e < 0) {
                cr_assert_eq(v, poison_as(out_f32), "row %d of no expert written (column %d: %g)", r, k, v);
                continue;
            }
            double ref = 0, mag = 0;
            for (int n = 0; n < N; n++) {
                const double t = (double)dyf[(size_t)r * N + n] * wf[((size_t)e * N + n) * K + k];
                ref += t, mag += fabs(t);
            }
            if (accumulate) ref += x0f[(size_t)r * K + k], mag += fabs(x0f[(size_t)r * K + k]);
            const double tol = 1e-5 * mag + (out_f32 ? 0 : fabs(ref) / 256.0);
            cr_assert(fabs(v - ref) <= tol, "dx[%d, %d] (expert %d) %.8g, reference %.8g (tolerance %.3g)", r, k, e,
                      v, ref, tol);
        }
    }
    free(got), free(dyh), free(w), free(x0), free(dyf), free(wf), free(x0f);
    mt_device_free(ddy), mt_device_free(dw), mt_device_free(doffs), mt_device_free(ddx);
    mt_cu_gg_destroy(g);
}

/* dW_e += dy_e^T x_e, db_e += column sums of dy_e: the accumulators start from random values, and an
 * expert without rows keeps its own */
static void check_dw(const layout *l, int with_db)
{
    mt_cu_gg *g = need_gg();
    const int E = l->E, R = l->R, K = l->K, N = l->N;
    unsigned s = 23u + (unsigned)(K * 7 + N + with_db);
    float *dyf, *xf, *junk;
    uint16_t *dyh = rand_bf16((size_t)R * N, &s, &dyf), *x = rand_bf16((size_t)R * K, &s, &xf);
    /* rows past the last expert hold large values: a kernel that sums them is caught */
    for (size_t i = (size_t)l->offs[E] * N; i < (size_t)R * N; i++) dyh[i] = mt_f32_to_bf16(POISON);
    uint16_t *w0h = rand_bf16((size_t)E * N * K, &s, &junk);
    float *w0 = malloc((size_t)E * N * K * 4), *b0 = malloc((size_t)E * N * 4);
    for (size_t i = 0; i < (size_t)E * N * K; i++) w0[i] = junk[i];
    for (size_t i = 0; i < (size_t)E * N; i++) b0[i] = uni(&s);
    void *ddy = up(dyh, (size_t)R * N * 2), *dxx = up(x, (size_t)R * K * 2), *doffs = up(l->offs, (size_t)(E + 1) * 4);
    float *dW = up(w0, (size_t)E * N * K * 4), *db = up(b0, (size_t)E * N * 4);
    cr_assert_eq(mt_cu_gg_linear_dw(g, NULL, dW, with_db ? db : NULL, ddy, dxx, doffs, E, R, K, N), 0);
    cr_assert(mt_device_sync(why, sizeof why) == 0, "%s", why);
    float *got = malloc((size_t)E * N * K * 4), *gotb = malloc((size_t)E * N * 4);
    down(got, dW, (size_t)E * N * K * 4);
    down(gotb, db, (size_t)E * N * 4);
    for (int e = 0; e < E; e++)
        for (int n = 0; n < N; n++) {
            for (int k = 0; k < K; k++) {
                double ref = w0[((size_t)e * N + n) * K + k], mag = fabs(ref);
                for (int r = l->offs[e]; r < l->offs[e + 1]; r++) {
                    const double t = (double)dyf[(size_t)r * N + n] * xf[(size_t)r * K + k];
                    ref += t, mag += fabs(t);
                }
                const float v = got[((size_t)e * N + n) * K + k];
                cr_assert(fabs(v - ref) <= 1e-5 * mag, "dW[%d][%d, %d] %.8g, reference %.8g (rows %d)", e, n, k, v,
                          ref, l->offs[e + 1] - l->offs[e]);
            }
            double rb = b0[(size_t)e * N + n], mb = fabs(rb);
            if (with_db)
                for (int r = l->offs[e]; r < l->offs[e + 1]; r++) rb += dyf[(size_t)r * N + n], mb += fabs(dyf[(size_t)r * N + n]);
            cr_assert(fabs(gotb[(size_t)e * N + n] - rb) <= 1e-5 * mb, "db[%d][%d] %.8g, reference %.8g", e, n,
                      gotb[(size_t)e * N + n], rb);
        }
    free(got), free(gotb), free(dyh), free(x), free(dyf), free(xf), free(junk), free(w0h), free(w0), free(b0);
    mt_device_free(ddy), mt_device_free(dxx), mt_device_free(doffs), mt_device_free(dW), mt_device_free(db);
    mt_cu_gg_destroy(g);
}

static const int COUNTS[] = {129, 0, 1, 128, 127, 300, 64};
#define NE (int)(sizeof COUNTS / sizeof COUNTS[0])

/* N 136 takes the 256-wide tiles (both pad to 256), N 392 the 128-wide ones (384 + 128 against 512) */
Test(cuda_grouped, linear_bf16_bias) { layout l = make_layout(200, 136, COUNTS, NE, 37); check_linear(&l, 0, 1, 0); }
Test(cuda_grouped, linear_f32_accumulate) { layout l = make_layout(200, 392, COUNTS, NE, 37); check_linear(&l, 1, 0, 1); }
Test(cuda_grouped, linear_bf16_accumulate_wide) { layout l = make_layout(72, 392, COUNTS, NE, 0); check_linear(&l, 0, 1, 1); }
Test(cuda_grouped, dx_f32) { layout l = make_layout(136, 200, COUNTS, NE, 37); check_dx(&l, 1, 0); }
Test(cuda_grouped, dx_f32_accumulate) { layout l = make_layout(392, 72, COUNTS, NE, 5); check_dx(&l, 1, 1); }
Test(cuda_grouped, dx_bf16) { layout l = make_layout(392, 136, COUNTS, NE, 0); check_dx(&l, 0, 0); }
Test(cuda_grouped, dw) { layout l = make_layout(200, 136, COUNTS, NE, 37); check_dw(&l, 0); }
Test(cuda_grouped, dw_db_wide) { layout l = make_layout(392, 200, COUNTS, NE, 37); check_dw(&l, 1); }

/* A bad routing (offsets out of order, past R): nothing is read or written out of bounds, and the call
 * still succeeds (the backend reports the routing itself) */
Test(cuda_grouped, bad_offsets_stay_in_bounds)
{
    mt_cu_gg *g = need_gg();
    const int E = 3, R = 40, K = 64, N = 64;
    const int32_t offs[4] = {-5, 30, 10, 1000};
    unsigned s = 5u;
    float *xf, *wf;
    uint16_t *x = rand_bf16((size_t)R * K, &s, &xf), *w = rand_bf16((size_t)E * N * K, &s, &wf);
    void *dx = up(x, (size_t)R * K * 2), *dw = up(w, (size_t)E * N * K * 2), *doffs = up(offs, sizeof offs);
    void *dy = up(NULL, (size_t)R * N * 4);
    cr_assert_eq(mt_cu_gg_linear(g, NULL, dy, 1, dx, dw, NULL, doffs, E, R, K, N, 0), 0);
    cr_assert(mt_device_sync(why, sizeof why) == 0, "%s", why);
    free(x), free(w), free(xf), free(wf);
    mt_device_free(dx), mt_device_free(dw), mt_device_free(doffs), mt_device_free(dy);
    mt_cu_gg_destroy(g);
}
