/* AdamW kernels: against a double-precision model of the formula, against
 * each other (bit for bit), in place, on odd lengths and unaligned pointers,
 * the parallel driver, the sums of squares and bf16 rounding ties.
 *
 * Kernels this CPU cannot run are skipped (and only those). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optim/adamw.h"
#include "core/bf16.h"
#include "core/threadpool.h"

/* ---- helpers ---------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{ /* splitmix64 */
    uint64_t z = (*s += UINT64_C(0x9e3779b97f4a7c15));
    z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
    return z ^ (z >> 31);
}

/* Uniform in [-1, 1). */
static float rng_unit(uint64_t *s) { return (float)((double)(rng_next(s) >> 11) * 0x1p-52 - 1.0); }

/* Uniform sign and mantissa, magnitude 2^-20 .. 2^4: a wide dynamic range. */
static float rng_wide(uint64_t *s) { return ldexpf(rng_unit(s), (int)(rng_next(s) % 25) - 20); }

static mt_adamw_kernel_fn kernel_or_skip(mt_adamw_isa isa)
{
    mt_adamw_kernel_fn k = mt_adamw_kernel(isa);
    if (!k) cr_skip_test("this CPU cannot run the %s kernel", mt_adamw_isa_name(isa));
    return k;
}

static mt_adamw_hyper hyper_at(int t, float weight_decay, float grad_scale)
{
    mt_adamw_hyper h;
    h.lr = 1e-2f;
    h.beta1 = 0.9f;
    h.beta2 = 0.999f;
    h.eps = 1e-8f;
    h.weight_decay = weight_decay;
    h.bias_correction1 = (float)(1.0 - pow(h.beta1, t));
    h.bias_correction2 = (float)(1.0 - pow(h.beta2, t));
    h.grad_scale = grad_scale;
    return h;
}

/* The arrays of one kernel call, each offset by `off` floats (or bf16s) from
 * an aligned allocation and framed by guard elements that must survive. */
#define GUARD 16
#define GUARD_BITS 0x5a5au

typedef struct {
    size_t n;
    float *master, *m, *v, *g32;
    uint16_t *g16, *w;
    void *base[6];
} bufs;

static void *guarded(bufs *b, int slot, size_t elem, size_t off)
{
    size_t bytes = (b->n + 2 * GUARD + 4) * elem;
    unsigned char *p = malloc(bytes);
    cr_assert(p);
    memset(p, (int)(GUARD_BITS & 0xff), bytes);
    b->base[slot] = p;
    return p + (GUARD + off) * elem;
}

static int guards_intact(const bufs *b)
{
    const size_t elem[6] = { 4, 4, 4, 4, 2, 2 };
    const void *data[6] = { b->master, b->m, b->v, b->g32, b->g16, b->w };
    for (int s = 0; s < 6; s++) {
        const unsigned char *lo = b->base[s], *hi = (const unsigned char *)data[s] + b->n * elem[s];
        const unsigned char *end = lo + (b->n + 2 * GUARD + 4) * elem[s];
        for (const unsigned char *q = lo; q < (const unsigned char *)data[s]; q++)
            if (*q != (GUARD_BITS & 0xff)) return 0;
        for (const unsigned char *q = hi; q < end; q++)
            if (*q != (GUARD_BITS & 0xff)) return 0;
    }
    return 1;
}

/* n elements, the arrays offset by off, off+1, ... (mod 4) elements, state
 * and grads drawn from seed (wide: a wide dynamic range). */
static bufs bufs_new(size_t n, size_t off, uint64_t seed, int wide)
{
    bufs b;
    b.n = n;
    b.master = guarded(&b, 0, 4, off % 4);
    b.m = guarded(&b, 1, 4, (off + 1) % 4);
    b.v = guarded(&b, 2, 4, (off + 2) % 4);
    b.g32 = guarded(&b, 3, 4, (off + 3) % 4);
    b.g16 = guarded(&b, 4, 2, (off + 1) % 4);
    b.w = guarded(&b, 5, 2, (off + 2) % 4);
    for (size_t i = 0; i < n; i++) {
        b.master[i] = wide ? rng_wide(&seed) : 0.05f * rng_unit(&seed);
        b.m[i] = wide ? rng_wide(&seed) : 0.0f;
        b.v[i] = wide ? fabsf(rng_wide(&seed)) : 0.0f;
        b.g32[i] = wide ? rng_wide(&seed) : rng_unit(&seed);
        b.g16[i] = mt_f32_to_bf16(wide ? rng_wide(&seed) : rng_unit(&seed));
        b.w[i] = 0;
    }
    return b;
}

static void bufs_free(bufs *b)
{
    for (int s = 0; s < 6; s++) free(b->base[s]);
}

static void regrad(bufs *b, uint64_t seed)
{
    for (size_t i = 0; i < b->n; i++) {
        b->g32[i] = rng_unit(&seed);
        b->g16[i] = mt_f32_to_bf16(rng_unit(&seed));
    }
}

static void call(mt_adamw_kernel_fn k, const mt_adamw_hyper *h, bufs *b, int bf16, int with_w)
{
    k(h, b->n, b->master, b->m, b->v, bf16 ? (const void *)b->g16 : (const void *)b->g32, bf16,
      with_w ? b->w : NULL);
}

static void assert_same_bits(const bufs *a, const bufs *b, const char *what)
{
    cr_assert(memcmp(a->master, b->master, a->n * 4) == 0, "%s: master differs (n=%zu)", what, a->n);
    cr_assert(memcmp(a->m, b->m, a->n * 4) == 0, "%s: m differs (n=%zu)", what, a->n);
    cr_assert(memcmp(a->v, b->v, a->n * 4) == 0, "%s: v differs (n=%zu)", what, a->n);
    cr_assert(memcmp(a->w, b->w, a->n * 2) == 0, "%s: w_bf16 differs (n=%zu)", what, a->n);
}

static void assert_w_is_rne_of_master(const float *master, const uint16_t *w, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(w[i], mt_f32_to_bf16(master[i]), "w_bf16[%zu] = %04x, master %a rounds to %04x", i, w[i],
                     (double)master[i], mt_f32_to_bf16(master[i]));
}

static const mt_adamw_isa all_isas[] = { MT_ADAMW_SCALAR, MT_ADAMW_AVX2, MT_ADAMW_AVX512, MT_ADAMW_AVX512BF16 };

/* ---- against the formula in double precision ---------------------------------
 * The reference keeps its own p, m, v in double over steps t = 1..5 from the
 * same grads. A kernel rounds each of ~15 fp32 operations per step to half an
 * ulp (2^-24 relative) and feeds its rounded state into the next step.
 * Tolerances, |kernel - reference| <= rel * |reference| + abs:
 *   v:      rel 1e-6, abs 0     (a sum of positive terms: ~3 roundings a step)
 *   m:      rel 1e-6, abs 1e-7  (beta1*m and (1-beta1)*g can cancel: the error
 *                                is relative to |g| <= 1, not to |m|)
 *   master: rel 1e-6, abs 5e-8  (p*decay and p - update round to 2^-24 of |p|
 *                                a step; each update, lr * O(1), is good to a
 *                                few 1e-7 of itself, ~1e-8 at lr 1e-2, and
 *                                five of them add up).
 * Measured on 200k elements: v 3e-7 relative; beyond rel 1e-6, m 2.5e-8 and
 * master 1.3e-8 absolute. */

static void reference_step(const mt_adamw_hyper *h, size_t n, double *p, double *m, double *v, const bufs *b,
                           int bf16)
{
    const double lr = h->lr, b1 = h->beta1, b2 = h->beta2, eps = h->eps;
    const double bc1 = h->bias_correction1, bc2 = h->bias_correction2;
    for (size_t i = 0; i < n; i++) {
        double g = (bf16 ? (double)mt_bf16_to_f32(b->g16[i]) : (double)b->g32[i]) * h->grad_scale;
        p[i] *= 1.0 - lr * h->weight_decay;
        m[i] = b1 * m[i] + (1.0 - b1) * g;
        v[i] = b2 * v[i] + (1.0 - b2) * g * g;
        p[i] -= lr / bc1 * m[i] / (sqrt(v[i]) / sqrt(bc2) + eps);
    }
}

static void assert_close(const char *what, size_t i, int t, double got, double want, double rel, double abs)
{
    cr_assert(fabs(got - want) <= rel * fabs(want) + abs, "step %d: %s[%zu] = %.9g, reference %.9g", t, what, i,
              got, want);
}

ParameterizedTestParameters(adamw, matches_double_reference)
{
    return cr_make_param_array(mt_adamw_isa, all_isas, sizeof all_isas / sizeof all_isas[0]);
}

ParameterizedTest(mt_adamw_isa *isa, adamw, matches_double_reference)
{
    mt_adamw_kernel_fn k = kernel_or_skip(*isa);
    const size_t n = 4099;
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        bufs b = bufs_new(n, 1, 42 + (uint64_t)bf16, 0);
        double *p = malloc(n * sizeof *p), *m = calloc(n, sizeof *m), *v = calloc(n, sizeof *v);
        cr_assert(p && m && v);
        for (size_t i = 0; i < n; i++) p[i] = b.master[i];
        for (int t = 1; t <= 5; t++) {
            mt_adamw_hyper h = hyper_at(t, 0.1f, t == 3 ? 0.25f : 1.0f);
            regrad(&b, (uint64_t)(100 * t + bf16));
            reference_step(&h, n, p, m, v, &b, bf16);
            call(k, &h, &b, bf16, 1);
            for (size_t i = 0; i < n; i++) {
                assert_close("master", i, t, b.master[i], p[i], 1e-6, 5e-8);
                assert_close("m", i, t, b.m[i], m[i], 1e-6, 1e-7);
                assert_close("v", i, t, b.v[i], v[i], 1e-6, 0);
            }
            assert_w_is_rne_of_master(b.master, b.w, n);
        }
        free(p);
        free(m);
        free(v);
        bufs_free(&b);
    }
}

/* ---- against each other --------------------------------------------------------
 * All kernels evaluate the same fp32 operations in the same order with IEEE
 * sqrt and division and no contraction: the results must be the same bits,
 * on every length (full vectors, masked or scalar tails, n = 0), with every
 * misalignment, and no element outside [0, n) may be touched. */

ParameterizedTestParameters(adamw, same_bits_as_scalar)
{
    return cr_make_param_array(mt_adamw_isa, all_isas, sizeof all_isas / sizeof all_isas[0]);
}

ParameterizedTest(mt_adamw_isa *isa, adamw, same_bits_as_scalar)
{
    mt_adamw_kernel_fn k = kernel_or_skip(*isa);
    static const size_t lens[] = { 0, 1, 7, 15, 16, 17, 31, 33, 63, 65, 1000, 4099 };
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (size_t off = 0; off < 4; off++)
            for (int mode = 0; mode < 4; mode++) { /* bf16 grads?, bf16 output? */
                int bf16 = mode & 1, with_w = mode >> 1;
                uint64_t seed = 1000 * li + 10 * off + (uint64_t)mode;
                bufs a = bufs_new(lens[li], off, seed, 1), b = bufs_new(lens[li], off, seed, 1);
                for (int t = 1; t <= 5; t++) {
                    mt_adamw_hyper h = hyper_at(t, t % 2 ? 0.01f : 0.0f, t == 2 ? 0.5f : 1.0f);
                    call(mt_adamw_kernel_scalar, &h, &a, bf16, with_w);
                    call(k, &h, &b, bf16, with_w);
                }
                assert_same_bits(&a, &b, mt_adamw_isa_name(*isa));
                cr_assert(guards_intact(&b), "%s wrote outside its arrays (n=%zu, offset %zu)",
                          mt_adamw_isa_name(*isa), lens[li], off);
                if (with_w) assert_w_is_rne_of_master(b.master, b.w, b.n);
                bufs_free(&a);
                bufs_free(&b);
            }
}

/* ---- bf16 grads arriving in the w_bf16 block ---------------------------------- */

ParameterizedTestParameters(adamw, in_place_bf16_grads)
{
    return cr_make_param_array(mt_adamw_isa, all_isas, sizeof all_isas / sizeof all_isas[0]);
}

ParameterizedTest(mt_adamw_isa *isa, adamw, in_place_bf16_grads)
{
    mt_adamw_kernel_fn k = kernel_or_skip(*isa);
    for (size_t n = 0; n < 100; n += 11) {
        bufs sep = bufs_new(n, 3, n, 0), inp = bufs_new(n, 3, n, 0);
        for (int t = 1; t <= 3; t++) {
            mt_adamw_hyper h = hyper_at(t, 0.1f, 1.0f);
            regrad(&sep, (uint64_t)t);
            memcpy(inp.w, sep.g16, n * 2); /* the grads land where the weights are */
            k(&h, n, sep.master, sep.m, sep.v, sep.g16, 1, sep.w);
            k(&h, n, inp.master, inp.m, inp.v, inp.w, 1, inp.w);
        }
        cr_assert(memcmp(sep.master, inp.master, n * 4) == 0 && memcmp(sep.m, inp.m, n * 4) == 0 &&
                      memcmp(sep.v, inp.v, n * 4) == 0 && memcmp(sep.w, inp.w, n * 2) == 0,
                  "in-place update differs from the separate one (n=%zu)", n);
        assert_w_is_rne_of_master(inp.master, inp.w, n);
        bufs_free(&sep);
        bufs_free(&inp);
    }
}

/* ---- weight decay and grad_scale ------------------------------------------------ */

ParameterizedTestParameters(adamw, weight_decay_and_grad_scale)
{
    return cr_make_param_array(mt_adamw_isa, all_isas, sizeof all_isas / sizeof all_isas[0]);
}

ParameterizedTest(mt_adamw_isa *isa, adamw, weight_decay_and_grad_scale)
{
    mt_adamw_kernel_fn k = kernel_or_skip(*isa);
    const size_t n = 333;

    /* Zero grads on zero moments: the update is exactly 0, what is left is
     * the decay. p unchanged with weight_decay 0, p * (1 - lr*wd) otherwise. */
    for (int decayed = 0; decayed <= 1; decayed++) {
        bufs b = bufs_new(n, 2, 7, 0);
        memset(b.g32, 0, n * 4);
        float *p0 = malloc(n * 4);
        cr_assert(p0);
        memcpy(p0, b.master, n * 4);
        mt_adamw_hyper h = hyper_at(1, decayed ? 0.1f : 0.0f, 1.0f);
        const float factor = mt_adamw_consts_of(&h).decay;
        cr_assert_float_eq(factor, 1.0 - 1e-2 * (decayed ? 0.1 : 0.0), 1e-7);
        call(k, &h, &b, 0, 1);
        for (size_t i = 0; i < n; i++) {
            float want = decayed ? p0[i] * factor : p0[i];
            cr_assert(memcmp(&b.master[i], &want, 4) == 0, "wd %g: master[%zu] = %a, want %a",
                      (double)h.weight_decay, i, (double)b.master[i], (double)want);
        }
        free(p0);
        bufs_free(&b);
    }

    /* grad_scale s on grads G is the same as grads fl(G * s) at scale 1, for
     * fp32 and bf16 grads alike. */
    for (int bf16 = 0; bf16 <= 1; bf16++) {
        const float s = 0.37f;
        bufs a = bufs_new(n, 1, 9, 0), b = bufs_new(n, 1, 9, 0);
        for (int t = 1; t <= 3; t++) {
            regrad(&a, (uint64_t)t);
            for (size_t i = 0; i < n; i++) b.g32[i] = (bf16 ? mt_bf16_to_f32(a.g16[i]) : a.g32[i]) * s;
            mt_adamw_hyper ha = hyper_at(t, 0.1f, s), hb = hyper_at(t, 0.1f, 1.0f);
            call(k, &ha, &a, bf16, 1);
            call(k, &hb, &b, 0, 1);
        }
        assert_same_bits(&a, &b, "pre-scaled grads");
        bufs_free(&a);
        bufs_free(&b);
    }
}

/* ---- bf16 rounding of the output: ties, subnormals, overflow, NaN ----------------
 * Zero grads on zero moments without decay leave every p exactly as it was,
 * so w_bf16 is the rounding of chosen bit patterns. */

ParameterizedTestParameters(adamw, bf16_rounding)
{
    return cr_make_param_array(mt_adamw_isa, all_isas, sizeof all_isas / sizeof all_isas[0]);
}

ParameterizedTest(mt_adamw_isa *isa, adamw, bf16_rounding)
{
    mt_adamw_kernel_fn k = kernel_or_skip(*isa);
    static const struct { uint32_t in; uint16_t out; } cases[] = {
        { 0x3f808000, 0x3f80 }, /* halfway, lower neighbour even: down */
        { 0x3f818000, 0x3f82 }, /* halfway, lower neighbour odd: up */
        { 0xbf808000, 0xbf80 }, /* the same, negative */
        { 0xbf818000, 0xbf82 },
        { 0x3f808001, 0x3f81 }, /* just above halfway */
        { 0x3f807fff, 0x3f80 }, /* just below halfway */
        { 0x3fff8000, 0x4000 }, /* a tie that carries into the exponent */
        { 0x7f7f8000, 0x7f80 }, /* a tie up into infinity */
        { 0x7f7f7fff, 0x7f7f }, /* largest that stays finite */
        { 0x00008000, 0x0000 }, /* subnormal ties */
        { 0x00018000, 0x0002 },
        { 0x80028000, 0x8002 },
        { 0x007fffff, 0x0080 }, /* the largest subnormal rounds up to the smallest normal */
        { 0x00000001, 0x0000 },
        { 0x80000000, 0x8000 }, /* -0 */
        { 0x7f800000, 0x7f80 }, /* inf */
    };
    const size_t nc = sizeof cases / sizeof cases[0], n = 77; /* full vectors and a tail */
    bufs b = bufs_new(n, 1, 5, 0);
    memset(b.g32, 0, n * 4);
    memset(b.m, 0, n * 4);
    memset(b.v, 0, n * 4);
    for (size_t i = 0; i < n; i++) memcpy(&b.master[i], &cases[(i * 7) % nc].in, 4);
    mt_adamw_hyper h = hyper_at(1, 0.0f, 1.0f);
    call(k, &h, &b, 0, 1);
    for (size_t i = 0; i < n; i++) {
        uint32_t bits;
        memcpy(&bits, &b.master[i], 4);
        cr_assert_eq(bits, cases[(i * 7) % nc].in, "master[%zu] changed: %08x", i, bits);
        cr_assert_eq(b.w[i], cases[(i * 7) % nc].out, "bf16(%08x) = %04x, want %04x", bits, b.w[i],
                     cases[(i * 7) % nc].out);
    }

    /* NaNs whose low bits would carry out of a plain rounding (a NaN grad, a
     * signalling NaN weight) stay NaN in bf16, quieted as mt_f32_to_bf16 does. */
    const uint32_t nan_grad = 0x7fffffff, nan_weight = 0xffbfffff;
    memcpy(&b.g32[5], &nan_grad, 4);
    memcpy(&b.master[9], &nan_weight, 4);
    call(k, &h, &b, 0, 1);
    cr_assert(isnan(b.master[5]) && isnan(b.master[9]) && !isnan(b.master[4]) && !isnan(b.master[6]));
    cr_assert((b.w[5] & 0x7fff) > 0x7f80 && (b.w[9] & 0x7fff) > 0x7f80, "bf16 NaNs: %04x %04x", b.w[5], b.w[9]);
    assert_w_is_rne_of_master(b.master, b.w, n);
    bufs_free(&b);
}

/* ---- the parallel driver ------------------------------------------------------ */

Test(adamw, apply_matches_direct_calls)
{
    mt_adamw_kernel_fn k = mt_adamw_kernel(mt_adamw_best_isa());
    /* sizes around the share alignment and the chunk, one empty */
    static const size_t lens[] = { 1000, 0, 3, 2 * MT_ADAMW_CHUNK + 5, 64, 3 * MT_ADAMW_CHUNK + 640, 129 };
    enum { NS = sizeof lens / sizeof lens[0] };
    bufs want[NS];
    mt_adamw_segment segs[NS];
    for (size_t s = 0; s < NS; s++) {
        want[s] = bufs_new(lens[s], s, s, 0);
        segs[s].weight_decay = s % 2 ? 0.1f : 0.0f;
        segs[s].grad_is_bf16 = s % 3 != 0;
    }
    /* segment 2 has no bf16 output, segment 5 gets its bf16 grads in place */
    memcpy(want[5].w, want[5].g16, lens[5] * 2);
    for (int t = 1; t <= 2; t++) {
        mt_adamw_hyper h = hyper_at(t, 123.0f, 0.8f); /* weight_decay comes from the segments */
        for (size_t s = 0; s < NS; s++) {
            mt_adamw_hyper hs = h;
            hs.weight_decay = segs[s].weight_decay;
            bufs *b = &want[s];
            const void *g = s == 5                ? (const void *)b->w
                            : segs[s].grad_is_bf16 ? (const void *)b->g16
                                                   : (const void *)b->g32;
            k(&hs, b->n, b->master, b->m, b->v, g, segs[s].grad_is_bf16, s == 2 ? NULL : b->w);
        }
    }

    for (int threads = 0; threads <= 3; threads++) { /* 0: no pool */
        mt_pool *pool = threads ? mt_pool_create(threads, NULL) : NULL;
        cr_assert(threads == 0 || pool);
        bufs got[NS];
        for (size_t s = 0; s < NS; s++) {
            got[s] = bufs_new(lens[s], s, s, 0);
            segs[s].master = got[s].master;
            segs[s].m = got[s].m;
            segs[s].v = got[s].v;
            segs[s].grad = segs[s].grad_is_bf16 ? (const void *)got[s].g16 : (const void *)got[s].g32;
            segs[s].w_bf16 = s == 2 ? NULL : got[s].w;
            segs[s].n = lens[s];
        }
        memcpy(got[5].w, got[5].g16, lens[5] * 2);
        segs[5].grad = got[5].w;
        for (int t = 1; t <= 2; t++) {
            mt_adamw_hyper h = hyper_at(t, 123.0f, 0.8f);
            mt_adamw_apply(pool, k, &h, segs, NS);
        }
        for (size_t s = 0; s < NS; s++) {
            assert_same_bits(&want[s], &got[s], "mt_adamw_apply");
            bufs_free(&got[s]);
        }
        mt_pool_destroy(pool);
    }
    for (size_t s = 0; s < NS; s++) bufs_free(&want[s]);
}

Test(adamw, shares_cover_segment)
{
    static const size_t lens[] = { 0, 1, 63, 64, 65, 1000, 100003 };
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int threads = 1; threads <= 5; threads++) {
            size_t next = 0;
            for (int p = 0; p < threads; p++) {
                size_t lo, hi;
                mt_adamw_share(lens[li], threads, p, &lo, &hi);
                cr_assert(lo == next && hi >= lo && (lo % MT_ADAMW_ALIGN == 0 || lo == lens[li]));
                next = hi;
            }
            cr_assert_eq(next, lens[li]);
        }
}

/* ---- sums of squares ------------------------------------------------------------
 * Squares of fp32 values are exact in double; a sum of n positive doubles is
 * within n * 2^-53 of exact in any order. Both the library and the loop
 * below are within that bound, so relative 1e-10 holds for n < 4.5e5. */

Test(adamw, sumsq)
{
    static const size_t lens[] = { 0, 1, 7, 65, 1000, 65537, 300001 };
    mt_pool *pools[3] = { mt_pool_create(1, NULL), mt_pool_create(2, NULL), mt_pool_create(3, NULL) };
    cr_assert(pools[0] && pools[1] && pools[2]);
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        size_t n = lens[li];
        float *x = malloc((n + 1) * 4);
        uint16_t *y = malloc((n + 1) * 2);
        cr_assert(x && y);
        uint64_t seed = n;
        double sx = 0, sy = 0;
        for (size_t i = 0; i < n; i++) {
            x[i + 1] = rng_wide(&seed); /* unaligned */
            y[i + 1] = mt_f32_to_bf16(rng_wide(&seed));
            sx += (double)x[i + 1] * x[i + 1];
            sy += (double)mt_bf16_to_f32(y[i + 1]) * mt_bf16_to_f32(y[i + 1]);
        }
        double fx = mt_sumsq_f32(NULL, x + 1, n), fy = mt_sumsq_bf16(NULL, y + 1, n);
        cr_assert(fabs(fx - sx) <= 1e-10 * sx, "sumsq_f32(n=%zu) = %.17g, loop %.17g", n, fx, sx);
        cr_assert(fabs(fy - sy) <= 1e-10 * sy, "sumsq_bf16(n=%zu) = %.17g, loop %.17g", n, fy, sy);
        if (n == 0) cr_assert(fx == 0.0 && fy == 0.0);
        for (int p = 0; p < 3; p++) { /* the same bits on every pool */
            cr_assert(mt_sumsq_f32(pools[p], x + 1, n) == fx, "n=%zu, %d threads", n, p + 1);
            cr_assert(mt_sumsq_bf16(pools[p], y + 1, n) == fy, "n=%zu, %d threads", n, p + 1);
        }
        free(x);
        free(y);
    }
    for (int p = 0; p < 3; p++) mt_pool_destroy(pools[p]);
}

/* Every ISA's part sum adds in the scalar order: the same bits, at every
 * length (full blocks of 32 and tails) and alignment. */

ParameterizedTestParameters(adamw, sumsq_same_bits_as_scalar)
{
    return cr_make_param_array(mt_adamw_isa, all_isas, sizeof all_isas / sizeof all_isas[0]);
}

ParameterizedTest(mt_adamw_isa *isa, adamw, sumsq_same_bits_as_scalar)
{
    kernel_or_skip(*isa);
    mt_sumsq_fn part = *isa == MT_ADAMW_SCALAR ? mt_sumsq_part_scalar
                       : *isa == MT_ADAMW_AVX2 ? mt_sumsq_part_avx2
                                               : mt_sumsq_part_avx512;
    const size_t max = 5000;
    float *x = malloc((max + 3) * 4);
    uint16_t *y = malloc((max + 3) * 2);
    cr_assert(x && y);
    uint64_t seed = 11;
    for (size_t i = 0; i < max + 3; i++) {
        x[i] = rng_wide(&seed);
        y[i] = mt_f32_to_bf16(rng_wide(&seed));
    }
    for (size_t n = 0; n <= max; n += n < 100 ? 1 : 977)
        for (size_t off = 0; off < 4; off++) {
            double want = mt_sumsq_part_scalar(x + off, 0, n), got = part(x + off, 0, n);
            cr_assert(memcmp(&want, &got, sizeof got) == 0, "%s, fp32, n=%zu: %a != %a", mt_adamw_isa_name(*isa),
                      n, got, want);
            want = mt_sumsq_part_scalar(y + off, 1, n);
            got = part(y + off, 1, n);
            cr_assert(memcmp(&want, &got, sizeof got) == 0, "%s, bf16, n=%zu: %a != %a", mt_adamw_isa_name(*isa),
                      n, got, want);
        }
    free(x);
    free(y);
}

/* ---- dispatch ---------------------------------------------------------------------- */

Test(adamw, dispatch)
{
    cr_assert_str_eq(mt_adamw_isa_name(MT_ADAMW_SCALAR), "scalar");
    cr_assert_str_eq(mt_adamw_isa_name(MT_ADAMW_AVX2), "avx2");
    cr_assert_str_eq(mt_adamw_isa_name(MT_ADAMW_AVX512), "avx512");
    cr_assert_str_eq(mt_adamw_isa_name(MT_ADAMW_AVX512BF16), "avx512bf16");
    cr_assert_str_eq(mt_adamw_isa_name(MT_ADAMW_ISA_COUNT), "?");
    cr_assert(mt_adamw_kernel(MT_ADAMW_SCALAR) == mt_adamw_kernel_scalar);
    cr_assert_null(mt_adamw_kernel(MT_ADAMW_ISA_COUNT));
    mt_adamw_isa best = mt_adamw_best_isa();
    cr_assert_not_null(mt_adamw_kernel(best));
    for (int isa = best + 1; isa < MT_ADAMW_ISA_COUNT; isa++) cr_assert_null(mt_adamw_kernel((mt_adamw_isa)isa));
}
