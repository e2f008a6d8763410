/* The GPU attention (cuda/kernels/attention.h) against the CPU reference
 * (mt_cpu_attention / mt_cpu_attention_bwd, src/cpu/cpu_ops.h) on the same
 * random inputs (normal, std 1), shapes whose S is no multiple of the tiles.
 *
 * bf16 mode: the inputs are rounded to bf16 and the CPU gets the rounded
 * values, so both compute the same function; the GPU then rounds P (in P V
 * and P^T dO), dS (in dS K and dS^T Q) and its outputs to bf16, each a
 * relative error of at most 2^-9 per element. Summed over many terms of
 * mixed sign these give ~2^-9 relative to the typical magnitude of an output
 * (measured on an H200: relative L2 and mean errors 1.8e-3 to 2.4e-3, max
 * error at most 4e-3 of max |cpu|, over all shapes and outputs). Tolerances: max |gpu - cpu| <= 2e-2 * max |cpu| (a 5x margin
 * over ~2^-9 of the largest element), ||gpu - cpu||_2 <= 1e-2 ||cpu||_2 and
 * mean |gpu - cpu| <= 1e-2 mean |cpu|. A wrong index or a lost tile is off by
 * O(1). lse is computed from fp32 scores in both modes: 1e-4 * max |cpu|.
 * The backward gets the CPU forward's out (rounded to bf16 in bf16 mode) and
 * lse on both sides.
 *
 * fp32 mode: everything fp32 on both sides, only the order of the sums and
 * exp implementations differ (~1e-6 relative): max error <= 1e-4 * max |cpu|,
 * the same for the L2 norm.
 *
 * The reference scale of each comparison is floored at 1e-2 (max |cpu|,
 * rms and mean): the outputs here are O(1), so the floor only acts where an
 * output vanishes identically, as dq does at S = 1 (the softmax over one key
 * has zero gradient: dS = P (dP - D_i) with dP = D_i, and both sides hold the
 * rounding noise of O(10) terms, ~1e-7 in fp32, ~1e-6 in bf16).
 *
 * Outputs are poisoned (all bits set: NaN) before each GPU call, so an
 * element the GPU did not write fails. Every suite test that needs a GPU
 * skips when there is none (fails under MT_REQUIRE_GPU=1, tests/gpu.h); the
 * argument checks run everywhere. Device memory goes through the device
 * layer (src/device/device.h). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/bf16.h"
#include "cpu/cpu_ops.h"
#include "model/template.h"
#include "gpu.h"

#ifdef MT_HAVE_CUDA
#include "cuda/kernels/attention.h"
#include "cuda/kernels/cudnn_attention.h"
#include "device/device.h"
#include "rng.h"

/* ---- helpers ------------------------------------------------------------------ */


static double uniform01(void) { return ((double)(next_u64() >> 11) + 0.5) / 9007199254740992.0; }

/* n normal floats (Box-Muller), std 1; rounded to bf16 values when bf16. */
static float *randn(size_t n, int bf16)
{
    float *x = malloc(n * sizeof(float));
    cr_assert(x);
    for (size_t i = 0; i < n; i += 2) {
        const double r = sqrt(-2.0 * log(uniform01())), t = 6.283185307179586 * uniform01();
        x[i] = (float)(r * cos(t));
        if (i + 1 < n) x[i + 1] = (float)(r * sin(t));
    }
    if (bf16)
        for (size_t i = 0; i < n; i++) x[i] = mt_bf16_to_f32(mt_f32_to_bf16(x[i]));
    return x;
}

static char why[256]; /* the device layer's reason for a failed call */

static void need_gpu(void)
{
    if (mt_device_count(why, sizeof why) <= 0) MT_GPU_MISSING("%s", why);
}

/* Device memory of bytes, the test failed if there is none. */
static void *dev_alloc(size_t bytes)
{
    void *d;
    cr_assert_eq(mt_device_malloc(&d, bytes, why, sizeof why), 0, "%s", why);
    return d;
}

static void dev_sync(void) { cr_assert_eq(mt_device_sync(why, sizeof why), 0, "%s", why); }

/* A device copy of x[0..n) as dtype. */
static void *upload(const float *x, size_t n, int dtype)
{
    void *d;
    if (dtype == MT_CUATTN_FP32) {
        d = dev_alloc(n * 4);
        cr_assert_eq(mt_device_copy_h2d(d, x, n * 4, why, sizeof why), 0, "%s", why);
    } else {
        uint16_t *h = malloc(n * 2);
        cr_assert(h);
        for (size_t i = 0; i < n; i++) h[i] = mt_f32_to_bf16(x[i]);
        d = dev_alloc(n * 2);
        cr_assert_eq(mt_device_copy_h2d(d, h, n * 2, why, sizeof why), 0, "%s", why);
        free(h);
    }
    return d;
}

/* n elements of dtype, all bits set (NaN in both dtypes). */
static void *alloc_poisoned(size_t n, size_t elem)
{
    void *d = dev_alloc(n * elem);
    cr_assert_eq(mt_device_memset(d, 0xff, n * elem, why, sizeof why), 0, "%s", why);
    return d;
}

/* The device array as floats (malloc'ed). */
static float *download(const void *d, size_t n, int dtype)
{
    float *x = malloc(n * sizeof(float));
    cr_assert(x);
    if (dtype == MT_CUATTN_FP32) {
        cr_assert_eq(mt_device_copy_d2h(x, d, n * 4, why, sizeof why), 0, "%s", why);
    } else {
        uint16_t *h = malloc(n * 2);
        cr_assert(h);
        cr_assert_eq(mt_device_copy_d2h(h, d, n * 2, why, sizeof why), 0, "%s", why);
        for (size_t i = 0; i < n; i++) x[i] = mt_bf16_to_f32(h[i]);
        free(h);
    }
    return x;
}

#define REF_FLOOR 1e-2 /* see the top of the file */

/* got against ref: max abs error <= tol * max(max|ref|, REF_FLOOR), L2 and
 * mean errors <= tol_norm times those of ref (floored likewise); NaN fails. */
static void compare(const char *what, const float *got, const float *ref, size_t n, double tol, double tol_norm)
{
    double max_err = 0, max_ref = 0, se = 0, sr = 0, ae = 0, ar = 0;
    size_t nan = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)got[i] - ref[i]), r = fabs((double)ref[i]);
        if (!(e == e)) {
            if (nan++ == 0) worst = i;
            continue;
        }
        if (e > max_err) {
            max_err = e;
            if (!nan) worst = i;
        }
        if (r > max_ref) max_ref = r;
        se += e * e;
        sr += r * r;
        ae += e;
        ar += r;
    }
    const double dn = (double)(n > 0 ? n : 1);
    const double rms_ref = fmax(sqrt(sr / dn), REF_FLOOR), mean_ref = fmax(ar / dn, REF_FLOOR);
    const double rel_l2 = sqrt(se / dn) / rms_ref, rel_mean = ae / dn / mean_ref;
    const double scale_ref = fmax(max_ref, REF_FLOOR);
    fprintf(stderr, "  %-26s max|err| %.3e (%.2e of max|ref| %.3f)  rel L2 %.2e  rel mean %.2e  NaN %zu\n", what,
            max_err, max_err / scale_ref, max_ref, rel_l2, rel_mean, nan);
    cr_expect(nan == 0, "%s: %zu NaN (first at %zu)", what, nan, worst);
    cr_expect(max_err <= tol * scale_ref, "%s: max error %g at %zu (got %g, ref %g) > %g * %g", what, max_err,
              worst, (double)got[worst], (double)ref[worst], tol, scale_ref);
    cr_expect(rel_l2 <= tol_norm, "%s: relative L2 error %g > %g", what, rel_l2, tol_norm);
    cr_expect(rel_mean <= tol_norm, "%s: relative mean error %g > %g", what, rel_mean, tol_norm);
}

typedef struct {
    int B, S, H, Hkv, D;
} shape;

/* Forward and backward of one shape in one dtype against the CPU; with
 * docs, documents packed into each sequence (lengths 1, 37, 70, 5, 90, ...
 * in turn, the last cut by the end). */
/* docs: 0 one document a sequence, 1 documents packed (lengths lens[]), WINDOWED those documents under a
 * sliding window of 37 keys (mt_window_starts), which the kernels take as they take document starts */
enum { WINDOWED = 2, WINDOW = 37 };

/* Each token's first key for docs (NULL for 0): documents of lengths 1, 37, 70, 5, 90, 12 in turn (the last
 * cut by the end), and for WINDOWED the sliding window over them (malloc'ed) */
static int32_t *make_starts(int B, int S, int docs)
{
    if (!docs) return NULL;
    int32_t *st = malloc((size_t)B * S * sizeof *st);
    cr_assert(st);
    static const int lens[] = {1, 37, 70, 5, 90, 12};
    for (int b = 0, d = 0; b < B; b++)
        for (int i = 0, first = 0, left = lens[d]; i < S; i++, left--) {
            if (i && left == 0) first = i, d = (d + 1) % 6, left = lens[d];
            st[(size_t)b * S + i] = first;
        }
    if (docs == WINDOWED) mt_window_starts(st, st, B, S, WINDOW); /* in place: each entry reads only itself */
    return st;
}

/* softcap > 0: Gemma 2's soft-capped scores, through mt_cuattn_*_softcap against
 * mt_cpu_attention_docs(..., softcap); 0: the plain calls. */
static void check_cap(shape sh, int dtype, uint64_t s, int docs, float softcap)
{
    need_gpu();
    const int B = sh.B, S = sh.S, H = sh.H, Hkv = sh.Hkv, D = sh.D, bf = dtype == MT_CUATTN_BF16;
    const size_t nq = (size_t)B * S * H * D, nkv = (size_t)B * S * Hkv * D, nl = (size_t)B * H * S;
    const size_t elem = bf ? 2 : 4;
    const float scale = 1.0f / sqrtf((float)D);
    const double tol = bf ? 2e-2 : 1e-4, tol_norm = bf ? 1e-2 : 1e-4, tol_lse = 1e-4;
    fprintf(stderr, "%s B=%d S=%d H=%d Hkv=%d D=%d docs %d softcap %g\n", bf ? "bf16" : "fp32", B, S, H, Hkv, D, docs,
            softcap);

    seed(s);
    float *q = randn(nq, bf), *k = randn(nkv, bf), *v = randn(nkv, bf), *dout = randn(nq, bf);
    float *out = malloc(nq * 4), *lse = malloc(nl * 4), *dq = malloc(nq * 4), *dk = malloc(nkv * 4),
          *dv = malloc(nkv * 4);
    void *ws = malloc(mt_cpu_ws_size(1, S));
    int32_t *st = make_starts(B, S, docs);
    cr_assert(out && lse && dq && dk && dv && ws);
    mt_cpu_attention_docs(NULL, ws, out, lse, q, k, v, st, B, S, H, Hkv, D, scale, softcap);
    float *out_in = malloc(nq * 4); /* the forward output both backwards get */
    cr_assert(out_in);
    for (size_t i = 0; i < nq; i++) out_in[i] = bf ? mt_bf16_to_f32(mt_f32_to_bf16(out[i])) : out[i];
    mt_cpu_attention_bwd_docs(NULL, ws, dq, dk, dv, dout, out_in, lse, q, k, v, st, B, S, H, Hkv, D, scale, softcap);

    void *gq = upload(q, nq, dtype), *gk = upload(k, nkv, dtype), *gv = upload(v, nkv, dtype);
    void *gout = alloc_poisoned(nq, elem), *glse = alloc_poisoned(nl, 4);
    void *gst = NULL;
    if (st) {
        gst = dev_alloc((size_t)B * S * 4);
        cr_assert_eq(mt_device_copy_h2d(gst, st, (size_t)B * S * 4, why, sizeof why), 0, "%s", why);
    }
    int rc = softcap > 0.0f
                 ? mt_cuattn_forward_softcap(NULL, dtype, gout, glse, gq, gk, gv, gst, B, S, H, Hkv, D, scale, softcap)
                 : mt_cuattn_forward_docs(NULL, dtype, gout, glse, gq, gk, gv, gst, B, S, H, Hkv, D, scale);
    cr_assert_eq(rc, 0, "forward: %s", mt_cuattn_strerror(rc));
    dev_sync();
    float *r_out = download(gout, nq, dtype), *r_lse = download(glse, nl, MT_CUATTN_FP32);
    compare("forward out", r_out, out, nq, tol, tol_norm);
    compare("forward lse", r_lse, lse, nl, tol_lse, tol_lse);
    if (bf) { /* the mma.sync forward by name: it stays tested on Hopper when the calls above run the Hopper kernel */
        void *mout = alloc_poisoned(nq, elem), *mlse = alloc_poisoned(nl, 4);
        rc = mt_cuattn_forward_mma(NULL, dtype, mout, mlse, gq, gk, gv, gst, B, S, H, Hkv, D, scale, softcap);
        cr_assert_eq(rc, 0, "mma.sync forward: %s", mt_cuattn_strerror(rc));
        dev_sync();
        float *m_out = download(mout, nq, dtype), *m_lse = download(mlse, nl, MT_CUATTN_FP32);
        compare("mma.sync forward out", m_out, out, nq, tol, tol_norm);
        compare("mma.sync forward lse", m_lse, lse, nl, tol_lse, tol_lse);
        mt_device_free(mout), mt_device_free(mlse);
        free(m_out), free(m_lse);
    }

    void *gdout = upload(dout, nq, dtype), *gout_in = upload(out_in, nq, dtype), *glse_in = upload(lse, nl, 1);
    void *gdq = alloc_poisoned(nq, elem), *gdk = alloc_poisoned(nkv, elem), *gdv = alloc_poisoned(nkv, elem);
    const size_t wsb = mt_cuattn_workspace_bytes(B, S, H, Hkv, D);
    void *gws = dev_alloc(wsb);
    rc = softcap > 0.0f ? mt_cuattn_backward_softcap(NULL, dtype, gdq, gdk, gdv, gdout, gout_in, glse_in, gq, gk, gv,
                                                     gst, B, S, H, Hkv, D, scale, softcap, gws, wsb)
                        : mt_cuattn_backward_docs(NULL, dtype, gdq, gdk, gdv, gdout, gout_in, glse_in, gq, gk, gv, gst,
                                                  B, S, H, Hkv, D, scale, gws, wsb);
    cr_assert_eq(rc, 0, "backward: %s", mt_cuattn_strerror(rc));
    dev_sync();
    float *r_dq = download(gdq, nq, dtype), *r_dk = download(gdk, nkv, dtype), *r_dv = download(gdv, nkv, dtype);
    compare("backward dq", r_dq, dq, nq, tol, tol_norm);
    compare("backward dk", r_dk, dk, nkv, tol, tol_norm);
    compare("backward dv", r_dv, dv, nkv, tol, tol_norm);

    void *dev[] = {gq, gk, gv, gout, glse, gdout, gout_in, glse_in, gdq, gdk, gdv, gws, gst};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) mt_device_free(dev[i]);
    float *host[] = {q, k, v, dout, out, lse, dq, dk, dv, out_in, r_out, r_lse, r_dq, r_dk, r_dv};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    free(ws);
    free(st);
}

static void check(shape sh, int dtype, uint64_t s, int docs) { check_cap(sh, dtype, s, docs, 0.0f); }
static void check_shape(shape sh, int dtype, uint64_t s) { check(sh, dtype, s, 0); }

static const shape GQA_SMALL = {2, 77, 4, 2, 64}, MHA_128 = {1, 256, 8, 8, 128}, MQA_LONG = {1, 1000, 4, 1, 64},
                   D32 = {2, 130, 6, 2, 32}, ONE = {2, 1, 4, 2, 64}, QWEN = {3, 17, 28, 4, 128};

/* ---- tests -------------------------------------------------------------------- */

Test(cuda_attention, bf16_gqa_s77_d64) { check_shape(GQA_SMALL, MT_CUATTN_BF16, 1); }
Test(cuda_attention, bf16_mha_s256_d128) { check_shape(MHA_128, MT_CUATTN_BF16, 2); }
Test(cuda_attention, bf16_mqa_s1000_d64) { check_shape(MQA_LONG, MT_CUATTN_BF16, 3); }
Test(cuda_attention, bf16_gqa_s130_d32) { check_shape(D32, MT_CUATTN_BF16, 4); }
/* One position; the Qwen2.5-7B head layout (28 query heads on 4 kv heads) on a short sequence. */
Test(cuda_attention, bf16_edges)
{
    check_shape(ONE, MT_CUATTN_BF16, 9);
    check_shape(QWEN, MT_CUATTN_BF16, 10);
}
Test(cuda_attention, fp32_edges)
{
    check_shape(ONE, MT_CUATTN_FP32, 11);
    check_shape(QWEN, MT_CUATTN_FP32, 12);
}
Test(cuda_attention, fp32_gqa_s77_d64) { check_shape(GQA_SMALL, MT_CUATTN_FP32, 5); }
Test(cuda_attention, fp32_mha_s256_d128) { check_shape(MHA_128, MT_CUATTN_FP32, 6); }
Test(cuda_attention, fp32_mqa_s1000_d64) { check_shape(MQA_LONG, MT_CUATTN_FP32, 7); }
Test(cuda_attention, fp32_gqa_s130_d32) { check_shape(D32, MT_CUATTN_FP32, 8); }

/* Head sizes between the kernels' tiles run padded (16 in the 32 tile, 80
 * and 96 in the 128 tile) and 256 in its own; the same tolerances. */
static const shape D16 = {2, 90, 4, 2, 16}, D80 = {1, 200, 6, 2, 80}, D96 = {2, 131, 4, 4, 96},
                   D256 = {1, 150, 4, 1, 256}, D8 = {1, 40, 2, 1, 8};
Test(cuda_attention, bf16_gqa_s90_d16) { check_shape(D16, MT_CUATTN_BF16, 11); }
Test(cuda_attention, bf16_gqa_s200_d80) { check_shape(D80, MT_CUATTN_BF16, 12); }
Test(cuda_attention, bf16_mha_s131_d96) { check_shape(D96, MT_CUATTN_BF16, 13); }
Test(cuda_attention, bf16_mqa_s150_d256) { check_shape(D256, MT_CUATTN_BF16, 14); }
Test(cuda_attention, bf16_s40_d8) { check_shape(D8, MT_CUATTN_BF16, 15); }
Test(cuda_attention, fp32_gqa_s90_d16) { check_shape(D16, MT_CUATTN_FP32, 16); }
Test(cuda_attention, fp32_gqa_s200_d80) { check_shape(D80, MT_CUATTN_FP32, 17); }
Test(cuda_attention, fp32_mha_s131_d96) { check_shape(D96, MT_CUATTN_FP32, 18); }
Test(cuda_attention, fp32_mqa_s150_d256) { check_shape(D256, MT_CUATTN_FP32, 19); }

/* Documents packed into the sequences: one-token documents, documents across
 * query and key blocks, a block whose rows start in different documents;
 * against the CPU's packed attention, with the same tolerances. */
static const shape DOCS_LONG = {2, 300, 4, 2, 64}, DOCS_128 = {1, 260, 8, 8, 128}, DOCS_96 = {2, 190, 4, 1, 96};
Test(cuda_attention, bf16_docs_s300_d64) { check(DOCS_LONG, MT_CUATTN_BF16, 21, 1); }
Test(cuda_attention, bf16_docs_s260_d128) { check(DOCS_128, MT_CUATTN_BF16, 22, 1); }
Test(cuda_attention, bf16_docs_s190_d96) { check(DOCS_96, MT_CUATTN_BF16, 23, 1); }
Test(cuda_attention, fp32_docs_s300_d64) { check(DOCS_LONG, MT_CUATTN_FP32, 24, 1); }
Test(cuda_attention, fp32_docs_s190_d96) { check(DOCS_96, MT_CUATTN_FP32, 25, 1); }
/* sliding windows over the same documents: starts that move on every query */
Test(cuda_attention, bf16_window_s300_d64) { check(DOCS_LONG, MT_CUATTN_BF16, 26, WINDOWED); }
Test(cuda_attention, bf16_window_s260_d128) { check(DOCS_128, MT_CUATTN_BF16, 27, WINDOWED); }
Test(cuda_attention, fp32_window_s190_d96) { check(DOCS_96, MT_CUATTN_FP32, 28, WINDOWED); }

/* Soft-capped scores (Gemma 2): c = cap tanh(scale q.k / cap) before the
 * softmax, at the head sizes of the kernels' tiles 64, 128 and 256 (Gemma 2's
 * own), in both dtypes, alone, over packed documents and under a sliding
 * window. Cap 50 is Gemma 2's attn_logit_softcapping (on these N(0, 1)
 * scores it changes little); cap 1.5 saturates the tanh, so that a missing or
 * misplaced cap (or 1 - t^2 in the backward) is off by O(1). The same
 * tolerances: the tanh adds a few fp32 ulp on each side. */
static const shape CAP_64 = {2, 150, 4, 2, 64}, CAP_128 = {1, 200, 8, 4, 128}, CAP_256 = {1, 150, 4, 2, 256};
Test(cuda_attention, bf16_softcap_d64)
{
    check_cap(CAP_64, MT_CUATTN_BF16, 41, 0, 1.5f);
    check_cap(CAP_64, MT_CUATTN_BF16, 42, 1, 50.0f);
    check_cap(CAP_64, MT_CUATTN_BF16, 43, WINDOWED, 1.5f);
}
Test(cuda_attention, bf16_softcap_d128)
{
    check_cap(CAP_128, MT_CUATTN_BF16, 44, 0, 50.0f);
    check_cap(CAP_128, MT_CUATTN_BF16, 45, WINDOWED, 1.5f);
}
Test(cuda_attention, bf16_softcap_d256)
{
    check_cap(CAP_256, MT_CUATTN_BF16, 46, 0, 1.5f);
    check_cap(CAP_256, MT_CUATTN_BF16, 47, 1, 1.5f);
    check_cap(CAP_256, MT_CUATTN_BF16, 48, WINDOWED, 50.0f);
}
Test(cuda_attention, fp32_softcap_d64)
{
    check_cap(CAP_64, MT_CUATTN_FP32, 51, 0, 1.5f);
    check_cap(CAP_64, MT_CUATTN_FP32, 52, WINDOWED, 1.5f);
}
Test(cuda_attention, fp32_softcap_d128)
{
    check_cap(CAP_128, MT_CUATTN_FP32, 53, 0, 1.5f);
    check_cap(CAP_128, MT_CUATTN_FP32, 54, 1, 50.0f);
}
Test(cuda_attention, fp32_softcap_d256)
{
    check_cap(CAP_256, MT_CUATTN_FP32, 55, 0, 50.0f);
    check_cap(CAP_256, MT_CUATTN_FP32, 56, WINDOWED, 1.5f);
}

/* softcap 0 runs the kernels compiled without the cap: the same bits as the
 * plain calls, forward and backward, with and without window starts. */
Test(cuda_attention, softcap_zero_is_the_plain_path)
{
    need_gpu();
    const shape sh = {2, 300, 4, 2, 128};
    const size_t nq = (size_t)sh.B * sh.S * sh.H * sh.D, nkv = (size_t)sh.B * sh.S * sh.Hkv * sh.D,
                 nl = (size_t)sh.B * sh.H * sh.S;
    const float scale = 1.0f / sqrtf((float)sh.D);
    int32_t *st = malloc((size_t)sh.B * sh.S * sizeof *st);
    cr_assert(st);
    for (int b = 0; b < sh.B; b++)
        for (int i = 0; i < sh.S; i++) st[(size_t)b * sh.S + i] = 0;
    mt_window_starts(st, st, sh.B, sh.S, WINDOW);
    void *gst = dev_alloc((size_t)sh.B * sh.S * 4);
    cr_assert_eq(mt_device_copy_h2d(gst, st, (size_t)sh.B * sh.S * 4, why, sizeof why), 0, "%s", why);
    for (int dtype = 0; dtype < 2; dtype++)
        for (int win = 0; win < 2; win++) {
            const size_t elem = dtype == MT_CUATTN_BF16 ? 2 : 4;
            const int32_t *docs = win ? gst : NULL;
            void *t[4]; /* q, k, v, dout */
            const size_t n[4] = {nq, nkv, nkv, nq};
            for (int i = 0; i < 4; i++) {
                t[i] = dev_alloc(n[i] * elem);
                cr_assert_eq(mt_cuattn_fill_random(NULL, dtype, t[i], n[i], 300 + (uint64_t)i, 1.0f), 0);
            }
            const size_t wsb = mt_cuattn_workspace_bytes(sh.B, sh.S, sh.H, sh.Hkv, sh.D);
            void *ws = dev_alloc(wsb);
            unsigned char *h[2][5];
            const size_t bytes[5] = {nq * elem, nl * 4, nq * elem, nkv * elem, nkv * elem};
            for (int run = 0; run < 2; run++) { /* 0: the plain calls, 1: softcap 0 */
                void *g[5]; /* out, lse, dq, dk, dv */
                for (int i = 0; i < 5; i++) g[i] = alloc_poisoned(bytes[i], 1);
                int rc = run ? mt_cuattn_forward_softcap(NULL, dtype, g[0], g[1], t[0], t[1], t[2], docs, sh.B, sh.S,
                                                         sh.H, sh.Hkv, sh.D, scale, 0.0f)
                             : mt_cuattn_forward_docs(NULL, dtype, g[0], g[1], t[0], t[1], t[2], docs, sh.B, sh.S,
                                                      sh.H, sh.Hkv, sh.D, scale);
                cr_assert_eq(rc, 0, "forward: %s", mt_cuattn_strerror(rc));
                rc = run ? mt_cuattn_backward_softcap(NULL, dtype, g[2], g[3], g[4], t[3], g[0], g[1], t[0], t[1], t[2],
                                                      docs, sh.B, sh.S, sh.H, sh.Hkv, sh.D, scale, 0.0f, ws, wsb)
                         : mt_cuattn_backward_docs(NULL, dtype, g[2], g[3], g[4], t[3], g[0], g[1], t[0], t[1], t[2],
                                                   docs, sh.B, sh.S, sh.H, sh.Hkv, sh.D, scale, ws, wsb);
                cr_assert_eq(rc, 0, "backward: %s", mt_cuattn_strerror(rc));
                dev_sync();
                for (int i = 0; i < 5; i++) {
                    h[run][i] = malloc(bytes[i]);
                    cr_assert(h[run][i]);
                    cr_assert_eq(mt_device_copy_d2h(h[run][i], g[i], bytes[i], why, sizeof why), 0, "%s", why);
                    mt_device_free(g[i]);
                }
            }
            const char *names[5] = {"out", "lse", "dq", "dk", "dv"};
            for (int i = 0; i < 5; i++) {
                cr_expect(memcmp(h[0][i], h[1][i], bytes[i]) == 0, "%s window %d: %s differs with softcap 0",
                          dtype ? "fp32" : "bf16", win, names[i]);
                free(h[0][i]), free(h[1][i]);
            }
            for (int i = 0; i < 4; i++) mt_device_free(t[i]);
            mt_device_free(ws);
        }
    mt_device_free(gst);
    free(st);
}

/* Two forwards and two backwards on the same inputs give the same bits. */
Test(cuda_attention, deterministic)
{
    need_gpu();
    const shape sh = {2, 1024, 8, 2, 128}; /* S a multiple of 128: every cuDNN 9 backward takes it */
    const size_t nq = (size_t)sh.B * sh.S * sh.H * sh.D, nkv = (size_t)sh.B * sh.S * sh.Hkv * sh.D,
                 nl = (size_t)sh.B * sh.H * sh.S;
    const float scale = 1.0f / sqrtf((float)sh.D);
    for (int dtype = 0; dtype < 2; dtype++) {
        const size_t elem = dtype == MT_CUATTN_BF16 ? 2 : 4;
        void *t[5]; /* q, k, v, dout, out */
        const size_t n[5] = {nq, nkv, nkv, nq, nq};
        for (int i = 0; i < 5; i++) {
            t[i] = dev_alloc(n[i] * elem);
            if (i < 4) cr_assert_eq(mt_cuattn_fill_random(NULL, dtype, t[i], n[i], 100 + (uint64_t)i, 1.0f), 0);
        }
        const size_t wsb = mt_cuattn_workspace_bytes(sh.B, sh.S, sh.H, sh.Hkv, sh.D);
        void *lse = dev_alloc(nl * 4), *ws = dev_alloc(wsb);
        void *g[2][3];
        unsigned char *h[2][5];
        for (int run = 0; run < 2; run++) {
            for (int i = 0; i < 3; i++) g[run][i] = alloc_poisoned(i ? nkv : nq, elem);
            cr_assert_eq(mt_device_memset(t[4], 0xff, nq * elem, why, sizeof why), 0, "%s", why);
            cr_assert_eq(mt_device_memset(lse, 0xff, nl * 4, why, sizeof why), 0, "%s", why);
            cr_assert_eq(mt_cuattn_forward(NULL, dtype, t[4], lse, t[0], t[1], t[2], sh.B, sh.S, sh.H, sh.Hkv, sh.D,
                                           scale),
                         0);
            cr_assert_eq(mt_cuattn_backward(NULL, dtype, g[run][0], g[run][1], g[run][2], t[3], t[4], lse, t[0],
                                            t[1], t[2], sh.B, sh.S, sh.H, sh.Hkv, sh.D, scale, ws, wsb),
                         0);
            dev_sync();
            const size_t bytes[5] = {nq * elem, nkv * elem, nkv * elem, nq * elem, nl * 4};
            const void *src[5] = {g[run][0], g[run][1], g[run][2], t[4], lse};
            for (int i = 0; i < 5; i++) {
                h[run][i] = malloc(bytes[i]);
                cr_assert(h[run][i]);
                cr_assert_eq(mt_device_copy_d2h(h[run][i], src[i], bytes[i], why, sizeof why), 0, "%s", why);
            }
            const char *names[5] = {"dq", "dk", "dv", "out", "lse"};
            if (run == 1)
                for (int i = 0; i < 5; i++)
                    cr_expect(memcmp(h[0][i], h[1][i], bytes[i]) == 0, "%s: %s differs between two runs",
                              dtype ? "fp32" : "bf16", names[i]);
        }
        for (int run = 0; run < 2; run++)
            for (int i = 0; i < 5; i++) {
                if (i < 3) mt_device_free(g[run][i]);
                free(h[run][i]);
            }
        for (int i = 0; i < 5; i++) mt_device_free(t[i]);
        mt_device_free(lse);
        mt_device_free(ws);
    }
}

/* Argument checks happen before any CUDA call: they run without a GPU. The
 * pointers are never dereferenced. */
Test(cuda_attention, argument_checks)
{
    char *base = (char *)(uintptr_t)0x10000;
    void *p = base, *odd = base + 8;
    float *l = (float *)(void *)base;
    const float sc = 0.125f;
    cr_expect_eq(mt_cuattn_forward(NULL, 0, p, l, p, p, p, 1, 8, 4, 2, 44, sc), MT_CUATTN_EHEADDIM);
    cr_expect_eq(mt_cuattn_forward(NULL, 1, p, l, p, p, p, 1, 8, 4, 2, 264, sc), MT_CUATTN_EHEADDIM);
    cr_expect_eq(mt_cuattn_forward(NULL, 1, p, l, p, p, p, 1, 8, 4, 2, 0, sc), MT_CUATTN_EHEADDIM);
    for (int D = 1; D <= 300; D++)
        cr_expect_eq(mt_cuattn_head_dim_ok(D), D % 8 == 0 && D <= 256, "head size %d", D);
    cr_expect_eq(mt_cuattn_forward(NULL, 0, p, l, p, p, p, 1, 8, 6, 4, 64, sc), MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_forward(NULL, 2, p, l, p, p, p, 1, 8, 4, 2, 64, sc), MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_forward(NULL, 0, p, l, p, p, p, 1, 8, 4, 2, 64, 0.0f), MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_forward(NULL, 0, p, l, p, p, p, -1, 8, 4, 2, 64, sc), MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_forward(NULL, 0, NULL, l, p, p, p, 1, 8, 4, 2, 64, sc), MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_forward(NULL, 0, p, l, odd, p, p, 1, 8, 4, 2, 64, sc), MT_CUATTN_EALIGN);
    cr_expect_eq(mt_cuattn_forward(NULL, 0, p, l, p, p, p, 0, 8, 4, 2, 64, sc), MT_CUATTN_OK); /* nothing to do */
    cr_expect_eq(mt_cuattn_forward(NULL, 0, p, l, p, p, p, 1, 0, 4, 2, 64, sc), MT_CUATTN_OK);
    const size_t wsb = mt_cuattn_workspace_bytes(1, 8, 4, 2, 64);
    cr_expect_geq(wsb, (size_t)1 * 8 * 4 * sizeof(float));
    cr_expect_eq(mt_cuattn_backward(NULL, 0, p, p, p, p, p, l, p, p, p, 1, 8, 4, 2, 64, sc, p, wsb - 1),
                 MT_CUATTN_EWORKSPACE);
    /* the soft-cap: 0 or a finite positive value */
    cr_expect_eq(mt_cuattn_forward_softcap(NULL, 0, p, l, p, p, p, NULL, 1, 8, 4, 2, 64, sc, -1.0f), MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_forward_softcap(NULL, 0, p, l, p, p, p, NULL, 1, 8, 4, 2, 64, sc, NAN), MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_forward_softcap(NULL, 0, p, l, p, p, p, NULL, 1, 8, 4, 2, 64, sc, INFINITY),
                 MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_forward_softcap(NULL, 0, p, l, p, p, p, NULL, 0, 8, 4, 2, 64, sc, 50.0f), MT_CUATTN_OK);
    cr_expect_eq(mt_cuattn_backward_softcap(NULL, 0, p, p, p, p, p, l, p, p, p, NULL, 1, 8, 4, 2, 64, sc, -2.0f, p, wsb),
                 MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_backward(NULL, 0, p, p, p, p, p, l, p, p, p, 1, 8, 4, 2, 64, sc, NULL, wsb),
                 MT_CUATTN_EWORKSPACE);
    cr_expect_eq(mt_cuattn_backward(NULL, 0, p, p, odd, p, p, l, p, p, p, 1, 8, 4, 2, 64, sc, p, wsb),
                 MT_CUATTN_EALIGN);
    cr_expect_eq(mt_cuattn_backward(NULL, 0, p, p, p, p, p, l, p, p, p, 1, 8, 4, 2, 36, sc, p, wsb),
                 MT_CUATTN_EHEADDIM);
    for (int c = 0; c >= -9; c--) cr_expect(mt_cuattn_strerror(c) != NULL && mt_cuattn_strerror(c)[0] != '\0');
}

/* ---- cuDNN fused attention (cuda/kernels/cudnn_attention.h) ----------------------
 * The same comparison against the CPU, bf16 only, through cuDNN's fused SDPA
 * engines. Skips where libcudnn.so.9 cannot be loaded (the library works
 * without it: the hand-written kernels above serve). The cuDNN kernels keep P
 * and dS in bf16 for their products like ours, so the same tolerances hold. */

static mt_cudnn_attn *cudnn_or_skip_det(int deterministic)
{
    need_gpu();
    char w[256] = "";
    mt_cudnn_attn *a = mt_cudnn_attn_create(deterministic, w, sizeof w);
    if (!a) cr_skip_test("cuDNN not available: %s", w);
    fprintf(stderr, "cuDNN %zu, backward %s\n", mt_cudnn_attn_version(a),
            mt_cudnn_attn_deterministic(a) ? "deterministic" : "non-deterministic");
    cr_assert_eq(mt_cudnn_attn_deterministic(a), deterministic);
    return a;
}

static mt_cudnn_attn *cudnn_or_skip(void) { return cudnn_or_skip_det(1); }

/* Forward and backward of one shape against the CPU; returns 0, or
 * MT_CUDNN_EUNSUPPORTED (after saying so) where cuDNN has no engine and
 * may_refuse is set. */
static int check_cudnn(mt_cudnn_attn *a, shape sh, uint64_t s, int may_refuse)
{
    const int B = sh.B, S = sh.S, H = sh.H, Hkv = sh.Hkv, D = sh.D;
    const size_t nq = (size_t)B * S * H * D, nkv = (size_t)B * S * Hkv * D, nl = (size_t)B * H * S;
    const float scale = 1.0f / sqrtf((float)D);
    const double tol = 2e-2, tol_norm = 1e-2, tol_lse = 1e-4;
    char w[512] = "";
    fprintf(stderr, "cudnn bf16 B=%d S=%d H=%d Hkv=%d D=%d\n", B, S, H, Hkv, D);
    size_t fws = 0, bws = 0;
    int rc = mt_cudnn_attn_forward_workspace(a, B, S, H, Hkv, D, &fws, w, sizeof w);
    if (rc == MT_CUDNN_EUNSUPPORTED && may_refuse) {
        fprintf(stderr, "  refused (the hand-written kernels serve this shape): %s\n", w);
        return rc;
    }
    cr_assert_eq(rc, 0, "forward workspace query: %s", w);
    /* a known limit: before 9.16 the backward takes no S that is not a
     * multiple of 128 (a padding mask would be needed); it must say so */
    const int bwd_refused = mt_cudnn_attn_version(a) < 91600 && S % 128 != 0;
    rc = mt_cudnn_attn_backward_workspace(a, B, S, H, Hkv, D, &bws, w, sizeof w);
    if (bwd_refused) {
        cr_assert_eq(rc, MT_CUDNN_EUNSUPPORTED, "backward at S %d on cuDNN %zu: %d", S, mt_cudnn_attn_version(a), rc);
        cr_assert(strstr(w, "S % 128"), "%s", w);
        fprintf(stderr, "  backward refused as documented (the kernels serve it): %s\n", w);
    } else if (rc == MT_CUDNN_EUNSUPPORTED && may_refuse) {
        fprintf(stderr, "  refused (the hand-written kernels serve this shape): %s\n", w);
        return rc;
    } else {
        cr_assert_eq(rc, 0, "backward workspace query: %s", w);
    }
    fprintf(stderr, "  workspace: forward %zu bytes, backward %zu bytes\n", fws, bws);
    /* what a backend reserves before it can ask must cover what the plans take */
    const size_t fb = mt_cudnn_attn_forward_workspace_bound(B, S, H, Hkv, D),
                 bb = mt_cudnn_attn_backward_workspace_bound(B, S, H, Hkv, D, mt_cudnn_attn_deterministic(a));
    cr_expect(fws <= fb, "forward workspace %zu > the bound %zu", fws, fb);
    cr_expect(bws <= bb, "backward workspace %zu > the bound %zu", bws, bb);

    seed(s);
    float *q = randn(nq, 1), *k = randn(nkv, 1), *v = randn(nkv, 1), *dout = randn(nq, 1);
    float *out = malloc(nq * 4), *lse = malloc(nl * 4), *dq = malloc(nq * 4), *dk = malloc(nkv * 4),
          *dv = malloc(nkv * 4), *out_in = malloc(nq * 4);
    void *ws = malloc(mt_cpu_ws_size(1, S));
    cr_assert(out && lse && dq && dk && dv && out_in && ws);
    mt_cpu_attention(NULL, ws, out, lse, q, k, v, B, S, H, Hkv, D, scale);
    for (size_t i = 0; i < nq; i++) out_in[i] = mt_bf16_to_f32(mt_f32_to_bf16(out[i]));
    mt_cpu_attention_bwd(NULL, ws, dq, dk, dv, dout, out_in, lse, q, k, v, B, S, H, Hkv, D, scale);

    const int bf = MT_CUATTN_BF16;
    void *gq = upload(q, nq, bf), *gk = upload(k, nkv, bf), *gv = upload(v, nkv, bf);
    void *gout = alloc_poisoned(nq, 2), *glse = alloc_poisoned(nl, 4);
    void *gws = dev_alloc((fws > bws ? fws : bws) + 16);
    rc = mt_cudnn_attn_forward(a, NULL, gout, glse, gq, gk, gv, B, S, H, Hkv, D, scale, gws, fws, w, sizeof w);
    cr_assert_eq(rc, 0, "forward: %s", w);
    dev_sync();
    float *r_out = download(gout, nq, bf), *r_lse = download(glse, nl, MT_CUATTN_FP32);
    compare("cudnn forward out", r_out, out, nq, tol, tol_norm);
    compare("cudnn forward lse", r_lse, lse, nl, tol_lse, tol_lse);

    void *gdout = upload(dout, nq, bf), *gout_in = upload(out_in, nq, bf), *glse_in = upload(lse, nl, 1);
    void *gdq = alloc_poisoned(nq, 2), *gdk = alloc_poisoned(nkv, 2), *gdv = alloc_poisoned(nkv, 2);
    float *r_dq = NULL, *r_dk = NULL, *r_dv = NULL;
    if (!bwd_refused) {
        rc = mt_cudnn_attn_backward(a, NULL, gdq, gdk, gdv, gdout, gout_in, glse_in, gq, gk, gv, B, S, H, Hkv, D,
                                    scale, gws, bws, w, sizeof w);
        cr_assert_eq(rc, 0, "backward: %s", w);
        dev_sync();
        r_dq = download(gdq, nq, bf), r_dk = download(gdk, nkv, bf), r_dv = download(gdv, nkv, bf);
        compare("cudnn backward dq", r_dq, dq, nq, tol, tol_norm);
        compare("cudnn backward dk", r_dk, dk, nkv, tol, tol_norm);
        compare("cudnn backward dv", r_dv, dv, nkv, tol, tol_norm);
    }

    void *dev[] = {gq, gk, gv, gout, glse, gdout, gout_in, glse_in, gdq, gdk, gdv, gws};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) mt_device_free(dev[i]);
    float *host[] = {q, k, v, dout, out, lse, dq, dk, dv, out_in, r_out, r_lse, r_dq, r_dk, r_dv};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    free(ws);
    return 0;
}

Test(cuda_attention, cudnn_bf16_gqa_s77_d64)
{
    mt_cudnn_attn *a = cudnn_or_skip();
    check_cudnn(a, GQA_SMALL, 21, 0);
    check_cudnn(a, GQA_SMALL, 22, 0); /* the cached plans, new data */
    mt_cudnn_attn_destroy(a);
}
Test(cuda_attention, cudnn_bf16_mha_s256_d128)
{
    mt_cudnn_attn *a = cudnn_or_skip();
    check_cudnn(a, MHA_128, 23, 0);
    mt_cudnn_attn_destroy(a);
}
Test(cuda_attention, cudnn_bf16_qwen_s17_d128)
{
    mt_cudnn_attn *a = cudnn_or_skip();
    check_cudnn(a, QWEN, 24, 0);
    const shape q200 = {1, 200, 28, 4, 128};
    check_cudnn(a, q200, 25, 0);
    mt_cudnn_attn_destroy(a);
}
Test(cuda_attention, cudnn_bf16_mqa_s1000_d64)
{
    mt_cudnn_attn *a = cudnn_or_skip();
    check_cudnn(a, MQA_LONG, 26, 0);
    mt_cudnn_attn_destroy(a);
}
/* The non-deterministic backward (dQ added with atomics into a buffer of
 * ours): the same answers within the same tolerances. */
Test(cuda_attention, cudnn_bf16_nondeterministic)
{
    mt_cudnn_attn *a = cudnn_or_skip_det(0);
    check_cudnn(a, MHA_128, 32, 0);
    check_cudnn(a, GQA_SMALL, 33, 0);
    const shape q256 = {2, 256, 28, 4, 128};
    check_cudnn(a, q256, 34, 0);
    mt_cudnn_attn_destroy(a);
}

/* Head sizes where cuDNN may or may not have an engine: a refusal is reported,
 * an answer must be right. */
Test(cuda_attention, cudnn_bf16_other_head_sizes)
{
    mt_cudnn_attn *a = cudnn_or_skip();
    check_cudnn(a, D32, 27, 1);
    check_cudnn(a, D80, 28, 1);
    check_cudnn(a, D96, 29, 1);
    check_cudnn(a, D256, 30, 1);
    check_cudnn(a, ONE, 31, 1);
    mt_cudnn_attn_destroy(a);
}

/* Without a GPU: the installed cuDNN accepts every operation of the graphs
 * (types, shapes, broadcasts of grouped heads), for the shapes above. Skips
 * where cuDNN cannot be loaded. */
Test(cuda_attention, cudnn_ops_build_without_a_gpu)
{
    const shape shapes[] = {GQA_SMALL, MHA_128, MQA_LONG, QWEN, D32, D96, D256};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape sh = shapes[i];
        char w[512] = "";
        size_t version = 0;
        const int rc = mt_cudnn_attn_check_ops(sh.B, sh.S, sh.H, sh.Hkv, sh.D, &version, w, sizeof w);
        if (rc && !version) cr_skip_test("cuDNN not available: %s", w);
        cr_expect_eq(rc, 0, "cuDNN %zu, B=%d S=%d H=%d Hkv=%d D=%d: %s", version, sh.B, sh.S, sh.H, sh.Hkv, sh.D, w);
    }
    char w[256] = "";
    cr_expect_eq(mt_cudnn_attn_check_ops(1, 8, 6, 4, 64, NULL, w, sizeof w), MT_CUDNN_EINVAL);
    cr_expect_eq(mt_cudnn_attn_check_ops(1, 8, 4, 2, 44, NULL, w, sizeof w), MT_CUDNN_EUNSUPPORTED);
}

/* The rules known before a plan is built (no GPU needed), and the workspace
 * bounds' arithmetic: the deterministic backward's (B, H, S, S) bf16 term. */
Test(cuda_attention, cudnn_shape_rules_and_bounds)
{
    char w[256] = "";
    cr_expect_eq(mt_cudnn_attn_shape_ok(91400, 0, 77, 8, 2, 64, w, sizeof w), 0, "%s", w);
    cr_expect_eq(mt_cudnn_attn_shape_ok(91400, 1, 77, 8, 2, 64, w, sizeof w), MT_CUDNN_EUNSUPPORTED);
    cr_expect(strstr(w, "S % 128") != NULL, "%s", w);
    cr_expect_eq(mt_cudnn_attn_shape_ok(91400, 1, 256, 8, 2, 64, w, sizeof w), 0, "%s", w);
    cr_expect_eq(mt_cudnn_attn_shape_ok(91600, 1, 77, 8, 2, 64, w, sizeof w), 0, "%s", w);
    cr_expect_eq(mt_cudnn_attn_shape_ok(91600, 0, 256, 8, 2, 44, w, sizeof w), MT_CUDNN_EUNSUPPORTED);
    cr_expect(strstr(w, "head size 44") != NULL, "%s", w);
    cr_expect_eq(mt_cudnn_attn_shape_ok(91600, 0, 256, 8, 2, 264, w, sizeof w), MT_CUDNN_EUNSUPPORTED);
    cr_expect_eq(mt_cudnn_attn_shape_ok(91600, 0, 256, 6, 4, 64, w, sizeof w), MT_CUDNN_EUNSUPPORTED);
    cr_expect_eq(mt_cudnn_attn_shape_ok(91001, 0, 256, 8, 2, 64, w, sizeof w), MT_CUDNN_EUNSUPPORTED);
    cr_expect(strstr(w, "9.10") != NULL, "%s", w);
    const size_t det = mt_cudnn_attn_backward_workspace_bound(1, 4096, 28, 4, 128, 1),
                 nondet = mt_cudnn_attn_backward_workspace_bound(1, 4096, 28, 4, 128, 0);
    cr_expect_eq(det - nondet, (size_t)28 * 4096 * 4096 * 2);
    cr_expect_geq(nondet, (size_t)28 * 4096 * 128 * 4 + (size_t)28 * 4096 * 4);
    /* S rounds up to the engines' 128-row tiles */
    cr_expect_eq(mt_cudnn_attn_backward_workspace_bound(1, 4000, 28, 4, 128, 1), det);
}

/* Two backwards on the same inputs give the same bits (the default,
 * deterministic plans). */
Test(cuda_attention, cudnn_deterministic)
{
    mt_cudnn_attn *a = cudnn_or_skip();
    const shape sh = {2, 1024, 8, 2, 128}; /* S a multiple of 128: every cuDNN 9 backward takes it */
    const size_t nq = (size_t)sh.B * sh.S * sh.H * sh.D, nkv = (size_t)sh.B * sh.S * sh.Hkv * sh.D,
                 nl = (size_t)sh.B * sh.H * sh.S;
    const float scale = 1.0f / sqrtf((float)sh.D);
    char w[512] = "";
    size_t fws = 0, bws = 0;
    cr_assert_eq(mt_cudnn_attn_forward_workspace(a, sh.B, sh.S, sh.H, sh.Hkv, sh.D, &fws, w, sizeof w), 0, "%s", w);
    cr_assert_eq(mt_cudnn_attn_backward_workspace(a, sh.B, sh.S, sh.H, sh.Hkv, sh.D, &bws, w, sizeof w), 0, "%s", w);
    void *t[5];
    const size_t n[5] = {nq, nkv, nkv, nq, nq};
    for (int i = 0; i < 5; i++) {
        t[i] = dev_alloc(n[i] * 2);
        if (i < 4) cr_assert_eq(mt_cuattn_fill_random(NULL, MT_CUATTN_BF16, t[i], n[i], 200 + (uint64_t)i, 1.0f), 0);
    }
    void *lse = dev_alloc(nl * 4), *ws = dev_alloc((fws > bws ? fws : bws) + 16);
    cr_assert_eq(mt_cudnn_attn_forward(a, NULL, t[4], lse, t[0], t[1], t[2], sh.B, sh.S, sh.H, sh.Hkv, sh.D, scale,
                                       ws, fws, w, sizeof w),
                 0, "%s", w);
    unsigned char *h[2][3];
    const size_t bytes[3] = {nq * 2, nkv * 2, nkv * 2};
    for (int run = 0; run < 2; run++) {
        void *g[3];
        for (int i = 0; i < 3; i++) g[i] = alloc_poisoned(i ? nkv : nq, 2);
        cr_assert_eq(mt_cudnn_attn_backward(a, NULL, g[0], g[1], g[2], t[3], t[4], lse, t[0], t[1], t[2], sh.B, sh.S,
                                            sh.H, sh.Hkv, sh.D, scale, ws, bws, w, sizeof w),
                     0, "%s", w);
        dev_sync();
        for (int i = 0; i < 3; i++) {
            h[run][i] = malloc(bytes[i]);
            cr_assert(h[run][i]);
            cr_assert_eq(mt_device_copy_d2h(h[run][i], g[i], bytes[i], why, sizeof why), 0, "%s", why);
            mt_device_free(g[i]);
        }
    }
    const char *names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        cr_expect(memcmp(h[0][i], h[1][i], bytes[i]) == 0, "cudnn %s differs between two runs", names[i]);
        free(h[0][i]);
        free(h[1][i]);
    }
    for (int i = 0; i < 5; i++) mt_device_free(t[i]);
    mt_device_free(lse);
    mt_device_free(ws);
    mt_cudnn_attn_destroy(a);
}

/* ---- the Hopper kernels (attention_sm90.cu) ----------------------------------
 * The forward and the backward against the CPU with the bf16 tolerances of
 * the file's top: the same products (bf16 inputs, fp32 accumulation, P and dS
 * rounded to bf16 before their products), summed in another order. The
 * backward's blocks are 128 keys by 64 queries, so the same S cover one to
 * eight key blocks and one to sixteen query blocks; its workspace starts as
 * garbage (all bits set). Its tiles are 128 queries by 128 keys:
 * S 1 and 17 fill part of one block, 77 a block with rows and keys past S,
 * 256 two blocks exactly, 1000 eight blocks (both stages of the key ring
 * used four times each, the causal mask on each block's diagonal and keys
 * past S in the last); one to seven query heads a kv head; B up to 3. */
static void need_sm90(void)
{
    need_gpu();
    if (!mt_cuattn_sm90_device_ok()) MT_GPU_MISSING("the device is not compute capability 9.0 (Hopper)");
}

/* docs as check_cap's; softcap > 0 Gemma 2's cap. The backward runs where the Hopper backward takes the
 * case (D 64 and 128, one document a sequence, no cap). */
static void check_sm90_ex(shape sh, uint64_t s, int docs, float softcap)
{
    need_sm90();
    const int B = sh.B, S = sh.S, H = sh.H, Hkv = sh.Hkv, D = sh.D;
    const size_t nq = (size_t)B * S * H * D, nkv = (size_t)B * S * Hkv * D, nl = (size_t)B * H * S;
    const float scale = 1.0f / sqrtf((float)D);
    fprintf(stderr, "sm90 bf16 B=%d S=%d H=%d Hkv=%d D=%d docs %d softcap %g\n", B, S, H, Hkv, D, docs, softcap);
    seed(s);
    float *q = randn(nq, 1), *k = randn(nkv, 1), *v = randn(nkv, 1);
    float *out = malloc(nq * 4), *lse = malloc(nl * 4);
    void *ws = malloc(mt_cpu_ws_size(1, S));
    int32_t *st = make_starts(B, S, docs);
    cr_assert(out && lse && ws);
    mt_cpu_attention_docs(NULL, ws, out, lse, q, k, v, st, B, S, H, Hkv, D, scale, softcap);
    void *gq = upload(q, nq, MT_CUATTN_BF16), *gk = upload(k, nkv, MT_CUATTN_BF16), *gv = upload(v, nkv, MT_CUATTN_BF16);
    void *gout = alloc_poisoned(nq, 2), *glse = alloc_poisoned(nl, 4);
    void *gst = NULL;
    if (st) {
        gst = dev_alloc((size_t)B * S * 4);
        cr_assert_eq(mt_device_copy_h2d(gst, st, (size_t)B * S * 4, why, sizeof why), 0, "%s", why);
    }
    const int rc = mt_cuattn_sm90_forward_ex(NULL, gout, glse, gq, gk, gv, gst, B, S, H, Hkv, D, scale, softcap);
    cr_assert_eq(rc, 0, "sm90 forward: %s", mt_cuattn_strerror(rc));
    dev_sync();
    float *r_out = download(gout, nq, MT_CUATTN_BF16), *r_lse = download(glse, nl, MT_CUATTN_FP32);
    compare("sm90 forward out", r_out, out, nq, 2e-2, 1e-2);
    compare("sm90 forward lse", r_lse, lse, nl, 1e-4, 1e-4);

    mt_device_free(gst);
    free(st);
    if (!mt_cuattn_sm90_bwd_head_dim_ok(D) || docs || softcap > 0.0f) { /* the forward alone */
        void *dev[] = {gq, gk, gv, gout, glse};
        for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) mt_device_free(dev[i]);
        float *host[] = {q, k, v, out, lse, r_out, r_lse};
        for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
        free(ws);
        return;
    }
    /* the backward, given the CPU forward's out (rounded to bf16) and lse, as the mma.sync tests */
    float *dout = randn(nq, 1), *dq = malloc(nq * 4), *dk = malloc(nkv * 4), *dv = malloc(nkv * 4);
    cr_assert(dq && dk && dv);
    for (size_t i = 0; i < nq; i++) out[i] = mt_bf16_to_f32(mt_f32_to_bf16(out[i]));
    mt_cpu_attention_bwd_docs(NULL, ws, dq, dk, dv, dout, out, lse, q, k, v, NULL, B, S, H, Hkv, D, scale, 0.0f);
    void *gdout = upload(dout, nq, MT_CUATTN_BF16), *gout_in = upload(out, nq, MT_CUATTN_BF16),
         *glse_in = upload(lse, nl, MT_CUATTN_FP32);
    void *gdq = alloc_poisoned(nq, 2), *gdk = alloc_poisoned(nkv, 2), *gdv = alloc_poisoned(nkv, 2);
    const size_t wsb = mt_cuattn_sm90_workspace_bytes(B, S, H, Hkv, D);
    cr_assert_gt(wsb, 0);
    void *gws = alloc_poisoned(wsb, 1); /* garbage in the workspace: the kernels must not read it unwritten */
    const int rb = mt_cuattn_sm90_backward(NULL, gdq, gdk, gdv, gdout, gout_in, glse_in, gq, gk, gv, B, S, H, Hkv, D,
                                           scale, gws, wsb);
    cr_assert_eq(rb, 0, "sm90 backward: %s", mt_cuattn_strerror(rb));
    dev_sync();
    float *r_dq = download(gdq, nq, MT_CUATTN_BF16), *r_dk = download(gdk, nkv, MT_CUATTN_BF16),
          *r_dv = download(gdv, nkv, MT_CUATTN_BF16);
    compare("sm90 backward dq", r_dq, dq, nq, 2e-2, 1e-2);
    compare("sm90 backward dk", r_dk, dk, nkv, 2e-2, 1e-2);
    compare("sm90 backward dv", r_dv, dv, nkv, 2e-2, 1e-2);

    void *dev[] = {gq, gk, gv, gout, glse, gdout, gout_in, glse_in, gdq, gdk, gdv, gws};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++) mt_device_free(dev[i]);
    float *host[] = {q, k, v, out, lse, r_out, r_lse, dout, dq, dk, dv, r_dq, r_dk, r_dv};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++) free(host[i]);
    free(ws);
}

static void check_sm90(shape sh, uint64_t s) { check_sm90_ex(sh, s, 0, 0.0f); }

Test(cuda_attention, sm90_fwd_gqa_s77_d64) { check_sm90(GQA_SMALL, 41); }
Test(cuda_attention, sm90_fwd_mha_s256_d128) { check_sm90(MHA_128, 42); }
Test(cuda_attention, sm90_fwd_mqa_s1000_d64) { check_sm90(MQA_LONG, 43); }
Test(cuda_attention, sm90_fwd_edges)
{
    check_sm90(ONE, 44);
    check_sm90(QWEN, 45);
}
Test(cuda_attention, sm90_fwd_gqa_s1000_d128)
{
    const shape sh = {2, 1000, 8, 2, 128};
    check_sm90(sh, 46);
}

/* Head sizes 192 (DeepSeek's latent attention pads v to it) and 256 (Gemma) run the forward in key blocks of
 * 112 and 80: several blocks cross a query block's diagonal, and the first one visited can hold no key a
 * row sees (its rows' maxima stay -inf until the next). */
Test(cuda_attention, sm90_fwd_d192)
{
    const shape sh = {1, 300, 4, 1, 192};
    check_sm90(sh, 47);
}
Test(cuda_attention, sm90_fwd_d256)
{
    const shape sh = {2, 200, 4, 2, 256};
    check_sm90(sh, 48);
}

/* Documents, sliding windows over them and the soft cap (the forward): key blocks before a query block's
 * first key are skipped, blocks that cross a row's first key are masked; at each head size (key blocks of
 * 128, 112 and 80 against the documents of 1 to 90 tokens), alone and together. */
Test(cuda_attention, sm90_fwd_docs)
{
    check_sm90_ex(DOCS_LONG, 51, 1, 0.0f);
    check_sm90_ex(DOCS_128, 52, 1, 0.0f);
    const shape d192 = {1, 300, 4, 1, 192}, d256 = {2, 200, 4, 2, 256};
    check_sm90_ex(d192, 53, 1, 0.0f);
    check_sm90_ex(d256, 54, 1, 0.0f);
}
Test(cuda_attention, sm90_fwd_window)
{
    check_sm90_ex(DOCS_LONG, 55, WINDOWED, 0.0f);
    check_sm90_ex(DOCS_128, 56, WINDOWED, 0.0f);
    const shape d256 = {2, 200, 4, 2, 256}, long_ = {1, 1000, 4, 2, 128};
    check_sm90_ex(d256, 57, WINDOWED, 0.0f);
    check_sm90_ex(long_, 58, WINDOWED, 0.0f);
}
Test(cuda_attention, sm90_fwd_softcap)
{
    check_sm90_ex(MHA_128, 59, 0, 50.0f);
    const shape d256 = {2, 200, 4, 2, 256};
    check_sm90_ex(d256, 60, 0, 50.0f);
    check_sm90_ex(d256, 61, WINDOWED, 50.0f);
    check_sm90_ex(GQA_SMALL, 62, 1, 2.0f); /* a cap that bites: scores of O(1) against 2 */
}

/* Two forwards, and two backwards, on the same inputs give the same bits. */
Test(cuda_attention, sm90_deterministic)
{
    need_sm90();
    const shape sh = {2, 1000, 8, 2, 128};
    const size_t nq = (size_t)sh.B * sh.S * sh.H * sh.D, nkv = (size_t)sh.B * sh.S * sh.Hkv * sh.D,
                 nl = (size_t)sh.B * sh.H * sh.S;
    void *t[3];
    const size_t n[3] = {nq, nkv, nkv};
    for (int i = 0; i < 3; i++) {
        t[i] = dev_alloc(n[i] * 2);
        cr_assert_eq(mt_cuattn_fill_random(NULL, MT_CUATTN_BF16, t[i], n[i], 300 + (uint64_t)i, 1.0f), 0);
    }
    unsigned char *h[2][2];
    const size_t bytes[2] = {nq * 2, nl * 4};
    for (int run = 0; run < 2; run++) {
        void *g[2] = {alloc_poisoned(nq, 2), alloc_poisoned(nl, 4)};
        cr_assert_eq(mt_cuattn_sm90_forward(NULL, g[0], g[1], t[0], t[1], t[2], sh.B, sh.S, sh.H, sh.Hkv, sh.D,
                                            1.0f / sqrtf((float)sh.D)),
                     0);
        dev_sync();
        for (int i = 0; i < 2; i++) {
            h[run][i] = malloc(bytes[i]);
            cr_assert(h[run][i]);
            cr_assert_eq(mt_device_copy_d2h(h[run][i], g[i], bytes[i], why, sizeof why), 0, "%s", why);
            mt_device_free(g[i]);
        }
    }
    cr_expect(memcmp(h[0][0], h[1][0], bytes[0]) == 0, "sm90 out differs between two runs");
    cr_expect(memcmp(h[0][1], h[1][1], bytes[1]) == 0, "sm90 lse differs between two runs");
    for (int i = 0; i < 2; i++) free(h[0][i]), free(h[1][i]);

    /* the backward twice: dq's sums cross key blocks (in the semaphores' order), dk's and dv's the group's
     * heads; the same bits both times */
    void *out = dev_alloc(nq * 2), *lse = dev_alloc(nl * 4), *dout = dev_alloc(nq * 2);
    const float scale = 1.0f / sqrtf((float)sh.D);
    cr_assert_eq(mt_cuattn_sm90_forward(NULL, out, lse, t[0], t[1], t[2], sh.B, sh.S, sh.H, sh.Hkv, sh.D, scale), 0);
    cr_assert_eq(mt_cuattn_fill_random(NULL, MT_CUATTN_BF16, dout, nq, 310, 1.0f), 0);
    const size_t wsb = mt_cuattn_sm90_workspace_bytes(sh.B, sh.S, sh.H, sh.Hkv, sh.D);
    void *ws = dev_alloc(wsb);
    unsigned char *g[2][3];
    const size_t gb[3] = {nq * 2, nkv * 2, nkv * 2};
    for (int run = 0; run < 2; run++) {
        void *d[3] = {alloc_poisoned(nq, 2), alloc_poisoned(nkv, 2), alloc_poisoned(nkv, 2)};
        cr_assert_eq(mt_cuattn_sm90_backward(NULL, d[0], d[1], d[2], dout, out, lse, t[0], t[1], t[2], sh.B, sh.S,
                                             sh.H, sh.Hkv, sh.D, scale, ws, wsb),
                     0);
        dev_sync();
        for (int i = 0; i < 3; i++) {
            g[run][i] = malloc(gb[i]);
            cr_assert(g[run][i]);
            cr_assert_eq(mt_device_copy_d2h(g[run][i], d[i], gb[i], why, sizeof why), 0, "%s", why);
            mt_device_free(d[i]);
        }
    }
    const char *names[3] = {"dq", "dk", "dv"};
    for (int i = 0; i < 3; i++) {
        cr_expect(memcmp(g[0][i], g[1][i], gb[i]) == 0, "sm90 %s differs between two runs", names[i]);
        free(g[0][i]), free(g[1][i]);
    }
    mt_device_free(out), mt_device_free(lse), mt_device_free(dout), mt_device_free(ws);
    for (int i = 0; i < 3; i++) mt_device_free(t[i]);
}

/* The argument checks come before any device call: they run without a GPU. Nothing is launched, so the
 * pointers need not be device memory. */
Test(cuda_attention, sm90_argument_checks)
{
    _Alignas(16) static unsigned char buf[256];
    void *p = buf;
    float *l = (float *)buf;
    cr_expect_eq(mt_cuattn_sm90_forward(NULL, p, l, p, p, p, 1, 8, 4, 3, 64, 0.125f), MT_CUATTN_EINVAL); /* H % Hkv */
    cr_expect_eq(mt_cuattn_sm90_forward(NULL, p, l, p, p, p, 1, 8, 4, 2, 64, 0.0f), MT_CUATTN_EINVAL);  /* scale */
    cr_expect_eq(mt_cuattn_sm90_forward(NULL, NULL, l, p, p, p, 1, 8, 4, 2, 64, 0.125f), MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_sm90_forward(NULL, p, l, p, p, p, 1, 8, 4, 2, 96, 0.125f), MT_CUATTN_EUNSUPPORTED);
    cr_expect_eq(mt_cuattn_sm90_workspace_bytes(1, 8, 4, 2, 192), 0);
    cr_expect_eq(mt_cuattn_sm90_forward_ex(NULL, p, l, p, p, p, NULL, 1, 8, 4, 2, 64, 0.125f, -1.0f), MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_sm90_forward_ex(NULL, p, l, p, p, p, NULL, 1, 8, 4, 2, 64, 0.125f, INFINITY),
                 MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_sm90_forward_ex(NULL, p, l, p, p, p, (const int32_t *)(buf + 2), 1, 8, 4, 2, 64, 0.125f,
                                           0.0f),
                 MT_CUATTN_EALIGN);
    cr_expect_eq(mt_cuattn_sm90_forward(NULL, buf + 8, l, p, p, p, 1, 8, 4, 2, 64, 0.125f), MT_CUATTN_EALIGN);
    cr_expect_eq(mt_cuattn_sm90_forward(NULL, p, l, p, p, p, 0, 8, 4, 2, 64, 0.125f), MT_CUATTN_OK); /* empty */
    cr_expect_eq(mt_cuattn_sm90_forward(NULL, p, l, p, p, p, 70000, 1 << 20, 32, 8, 128, 0.125f), MT_CUATTN_ETOOBIG);
    const size_t wsb = mt_cuattn_sm90_workspace_bytes(1, 8, 4, 2, 64);
    cr_expect_gt(wsb, 0);
    cr_expect_eq(mt_cuattn_sm90_workspace_bytes(1, 8, 4, 2, 96), 0);
    /* linear in S: twice the rows, twice the bytes (S a multiple of 64, each part rounded to 256 bytes) */
    cr_expect_eq(mt_cuattn_sm90_workspace_bytes(2, 4096, 32, 8, 128), 2 * mt_cuattn_sm90_workspace_bytes(1, 4096, 32, 8, 128));
    cr_expect_eq(mt_cuattn_sm90_backward(NULL, p, p, p, p, p, l, p, p, p, 1, 8, 4, 3, 64, 0.125f, p, wsb),
                 MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_sm90_backward(NULL, p, p, p, p, p, NULL, p, p, p, 1, 8, 4, 2, 64, 0.125f, p, wsb),
                 MT_CUATTN_EINVAL);
    cr_expect_eq(mt_cuattn_sm90_backward(NULL, p, p, p, p, p, l, p, p, p, 1, 8, 4, 2, 96, 0.125f, p, wsb),
                 MT_CUATTN_EUNSUPPORTED);
    cr_expect_eq(mt_cuattn_sm90_backward(NULL, p, buf + 8, p, p, p, l, p, p, p, 1, 8, 4, 2, 64, 0.125f, p, wsb),
                 MT_CUATTN_EALIGN);
    cr_expect_eq(mt_cuattn_sm90_backward(NULL, p, p, p, p, p, l, p, p, p, 1, 8, 4, 2, 64, 0.125f, p, wsb - 1),
                 MT_CUATTN_EWORKSPACE);
    cr_expect_eq(mt_cuattn_sm90_backward(NULL, p, p, p, p, p, l, p, p, p, 1, 8, 4, 2, 64, 0.125f, NULL, wsb),
                 MT_CUATTN_EWORKSPACE);
    cr_expect_eq(mt_cuattn_sm90_backward(NULL, p, p, p, p, p, l, p, p, p, 0, 8, 4, 2, 64, 0.125f, NULL, 0),
                 MT_CUATTN_OK);
    cr_expect(mt_cuattn_sm90_head_dim_ok(64) && mt_cuattn_sm90_head_dim_ok(128) && mt_cuattn_sm90_head_dim_ok(192) &&
              mt_cuattn_sm90_head_dim_ok(256));
    cr_expect(!mt_cuattn_sm90_head_dim_ok(96) && !mt_cuattn_sm90_head_dim_ok(32) && !mt_cuattn_sm90_head_dim_ok(0));
    cr_expect(mt_cuattn_sm90_bwd_head_dim_ok(64) && mt_cuattn_sm90_bwd_head_dim_ok(128));
    cr_expect(!mt_cuattn_sm90_bwd_head_dim_ok(192) && !mt_cuattn_sm90_bwd_head_dim_ok(256));
    cr_expect_eq(mt_cuattn_sm90_backward(NULL, p, p, p, p, p, l, p, p, p, 1, 8, 4, 2, 256, 0.125f, p, wsb),
                 MT_CUATTN_EUNSUPPORTED);
    cr_expect_str_not_empty(mt_cuattn_strerror(MT_CUATTN_EUNSUPPORTED));
    cr_expect_str_neq(mt_cuattn_strerror(MT_CUATTN_EUNSUPPORTED), mt_cuattn_strerror(-1000));
}

#else /* built without CUDA */

Test(cuda_attention, built_without_cuda) { MT_GPU_MISSING("this library was built without CUDA"); }

#endif
