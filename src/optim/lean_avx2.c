/* The lean mode's AdamW step, AVX2: 8 parameters per vector. The same bits
 * as the scalar mt_lean_step_block (lean.c) for every input, by the same
 * arguments as lean_avx512.c (which says them in full): the scalar
 * sequence of separate fp32 operations, the moments' codes decoded and
 * encoded (stochastically rounded) through their bit fields, the weights'
 * through q16.c's arithmetic, exact maxima, and mt_lean_random64's hash per
 * element, its 64-bit multiplies made of 32 x 32 -> 64-bit ones (AVX2 has
 * no 64-bit multiply). The last n % 8 parameters go through the same vector
 * code from and to small zero-padded copies, their pad lanes kept out of the
 * maxima. */
#include <immintrin.h>
#include <string.h>

#include "optim/lean.h"
#include "optim/q16.h"
#include "optim/q8.h"

/* q8.c's decode_mag on 8 lanes: the float with exponent field e + 112 and
 * mantissa f for e > 0, f 2^(-14 - mbits) (exact) for e = 0. */
static inline __m256 decode_mag(__m256i q, int mbits)
{
    const __m256 normal =
        _mm256_castsi256_ps(_mm256_add_epi32(_mm256_slli_epi32(q, 23 - mbits), _mm256_set1_epi32(112 << 23)));
    const __m256 sub =
        _mm256_mul_ps(_mm256_cvtepi32_ps(q), _mm256_castsi256_ps(_mm256_set1_epi32((113 - mbits) << 23)));
    return _mm256_blendv_ps(sub, normal,
                            _mm256_castsi256_ps(_mm256_cmpgt_epi32(q, _mm256_set1_epi32((1 << mbits) - 1))));
}

/* q8.c's encode_mag_sr on 8 lanes of x >= 0 (or -0) with 16 random bits r
 * each, the normal and subnormal ranges to 16 bits below the code's, then
 * one add and shift: see lean_avx512.c. */
static inline __m256i encode_mag_sr(__m256 x, __m256i r, int mbits, int max_code)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i normal = _mm256_srli_epi32(_mm256_sub_epi32(u, _mm256_set1_epi32(112 << 23)), 7 - mbits);
    const __m256i sub =
        _mm256_cvttps_epi32(_mm256_mul_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32((127 + 30 + mbits) << 23))));
    const __m256i f = _mm256_blendv_epi8(sub, normal, _mm256_cmpgt_epi32(u, _mm256_set1_epi32((113 << 23) - 1)));
    return _mm256_min_epi32(_mm256_srli_epi32(_mm256_add_epi32(f, r), 16), _mm256_set1_epi32(max_code));
}

/* q16.c's mt_q16_encode_sr on 8 lanes of p with 16 random bits r each, inv
 * = 1 / s (an exact power of two, 0 for s = 0): see lean_avx512.c. The
 * magnitude negated (two's complement: xor with the sign mask, then less
 * it) where p's sign bit is set. */
static inline __m256i encode_q16_sr(__m256 p, __m256i r, float inv)
{
    const __m256 y = _mm256_and_ps(_mm256_mul_ps(p, _mm256_set1_ps(inv)),
                                   _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
    const __m256 fl = _mm256_floor_ps(y);
    const __m256i frac16 = _mm256_cvttps_epi32(_mm256_mul_ps(_mm256_sub_ps(y, fl), _mm256_set1_ps(65536.0f)));
    const __m256i up = _mm256_srli_epi32(_mm256_add_epi32(frac16, r), 16);
    const __m256i mag = _mm256_min_epi32(_mm256_add_epi32(_mm256_cvttps_epi32(fl), up), _mm256_set1_epi32(MT_Q16_MAX));
    const __m256i neg = _mm256_srai_epi32(_mm256_castps_si256(p), 31);
    return _mm256_sub_epi32(_mm256_xor_si256(mag, neg), neg);
}

/* a * b mod 2^64 in each lane: lo(a) lo(b) + (hi(a) lo(b) + lo(a) hi(b)) 2^32 */
static inline __m256i mul64(__m256i a, uint64_t b)
{
    const __m256i lo = _mm256_set1_epi64x((long long)b), hi = _mm256_set1_epi64x((long long)(b >> 32));
    const __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), lo), _mm256_mul_epu32(a, hi));
    return _mm256_add_epi64(_mm256_mul_epu32(a, lo), _mm256_slli_epi64(cross, 32));
}

/* mt_lean_random64's finaliser on 4 lanes of z */
static inline __m256i mix64(__m256i z)
{
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), 0xBF58476D1CE4E5B9ull);
    z = mul64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), 0x94D049BB133111EBull);
    return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
}

/* 8 int32 lanes below 2^16 to 16-bit values, in order */
static inline __m128i pack16(__m256i x)
{
    return _mm_packus_epi32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
}

static inline __m256 load_bf16(const uint16_t *a)
{
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)a)), 16));
}

typedef struct {
    mt_adamw_consts c;
    float sw, sm, sv;
} step_in;

/* The update of 8 parameters from wq, g, qm, qv (8 each): the new m, sqrt(v)
 * and weight to m, sq, p; |m|, sqrt(v) (+0 for -0: only the bits of a NaN,
 * an infinity or a negative value reach 0x7f800000) and |p| of the lanes of
 * `valid` folded into the running unsigned maxima. */
static inline void update8(const step_in *s, __m256i valid, const int16_t *wq, const uint16_t *g, const uint8_t *qm,
                           const uint8_t *qv, float *m, float *sq, float *p, __m256i *max_m, __m256i *max_sq,
                           __m256i *max_p)
{
    const mt_adamw_consts *c = &s->c;
    const __m256i cm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qm));
    const __m256i cv = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)qv));
    const __m256 mag = decode_mag(_mm256_and_si256(cm, _mm256_set1_epi32(0x7f)), 3);
    const __m256 m0 = _mm256_mul_ps(
        _mm256_castsi256_ps(_mm256_or_si256(_mm256_castps_si256(mag),
                                            _mm256_slli_epi32(_mm256_and_si256(cm, _mm256_set1_epi32(0x80)), 24))),
        _mm256_set1_ps(s->sm));
    const __m256 r0 = _mm256_mul_ps(decode_mag(cv, 4), _mm256_set1_ps(s->sv));
    const __m256 v0 = _mm256_mul_ps(r0, r0);
    const __m256 gi = _mm256_mul_ps(load_bf16(g), _mm256_set1_ps(c->grad_scale));
    const __m256i cw = _mm256_cvtepi16_epi32(_mm_loadu_si128((const __m128i *)wq));
    const __m256 w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(cw), _mm256_set1_ps(s->sw));
    const __m256 pi = _mm256_mul_ps(w0, _mm256_set1_ps(c->decay));
    const __m256 mi =
        _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(c->beta1), m0), _mm256_mul_ps(_mm256_set1_ps(c->omb1), gi));
    const __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(c->beta2), v0),
                                    _mm256_mul_ps(_mm256_set1_ps(c->omb2), _mm256_mul_ps(gi, gi)));
    const __m256 si = _mm256_sqrt_ps(vi);
    const __m256 denom = _mm256_add_ps(_mm256_mul_ps(si, _mm256_set1_ps(c->inv_sqrt_bc2)), _mm256_set1_ps(c->eps));
    const __m256 pn = _mm256_sub_ps(pi, _mm256_mul_ps(_mm256_set1_ps(c->step), _mm256_div_ps(mi, denom)));
    _mm256_storeu_ps(m, mi);
    _mm256_storeu_ps(sq, si);
    _mm256_storeu_ps(p, pn);
    const __m256i abs_m = _mm256_and_si256(_mm256_castps_si256(mi), _mm256_set1_epi32(0x7fffffff));
    *max_m = _mm256_max_epu32(*max_m, _mm256_and_si256(abs_m, valid));
    *max_sq = _mm256_max_epu32(*max_sq,
                               _mm256_and_si256(_mm256_castps_si256(_mm256_add_ps(si, _mm256_setzero_ps())), valid));
    const __m256i abs_p = _mm256_and_si256(_mm256_castps_si256(pn), _mm256_set1_epi32(0x7fffffff));
    *max_p = _mm256_max_epu32(*max_p, _mm256_and_si256(abs_p, valid));
}

static inline uint32_t reduce_max(__m256i x)
{
    __m128i y = _mm_max_epu32(_mm256_castsi256_si128(x), _mm256_extracti128_si256(x, 1));
    y = _mm_max_epu32(y, _mm_shuffle_epi32(y, _MM_SHUFFLE(1, 0, 3, 2)));
    y = _mm_max_epu32(y, _mm_shuffle_epi32(y, _MM_SHUFFLE(2, 3, 0, 1)));
    return (uint32_t)_mm_cvtsi128_si32(y);
}

typedef struct {
    float sm2, sv2;
    float inv_w;        /* 1 / the weights' new scale, 0 for scale 0 */
    uint64_t z0;        /* seed ^ step * C1 of mt_lean_random */
    __m256i off_a;      /* (0, 1, 4, 5) * C2: the index terms of 4 of the 8 elements */
    __m256i off_b;      /* (2, 3, 6, 7) * C2: of the other 4 */
} out_in;

#define LEAN_C2 0xD1B54A32D192ED03ull

/* The codes of the 8 parameters numbered index.. from m, sq, p: 8 bytes of m
 * codes and 8 of v codes into qq, 8 weight codes into w8. */
static inline void finish8(const out_in *o, uint64_t index, const float *m, const float *sq, const float *p,
                           __m128i *qq, __m128i *w8)
{
    /* one hash per element, mt_lean_random64, in 64-bit lanes (elements 0, 1, 4, 5 in za, 2, 3, 6, 7 in zb,
     * so that one shuffle within 128-bit lanes puts their halves in element order): the low and high
     * halves in 32-bit lanes. Bits 0..15 round the m code, 16..31 the v code, 48..63 the weight. */
    const __m256i base = _mm256_set1_epi64x((long long)(index * LEAN_C2)), z0 = _mm256_set1_epi64x((long long)o->z0);
    const __m256 za = _mm256_castsi256_ps(mix64(_mm256_xor_si256(z0, _mm256_add_epi64(base, o->off_a))));
    const __m256 zb = _mm256_castsi256_ps(mix64(_mm256_xor_si256(z0, _mm256_add_epi64(base, o->off_b))));
    const __m256i lo = _mm256_castps_si256(_mm256_shuffle_ps(za, zb, _MM_SHUFFLE(2, 0, 2, 0)));
    const __m256i hi = _mm256_castps_si256(_mm256_shuffle_ps(za, zb, _MM_SHUFFLE(3, 1, 3, 1)));
    const __m256i rm = _mm256_and_si256(lo, _mm256_set1_epi32(0xffff)), rv = _mm256_srli_epi32(lo, 16);
    const __m256i rw = _mm256_srli_epi32(hi, 16);

    const __m256 mi = _mm256_loadu_ps(m), si = _mm256_loadu_ps(sq);
    __m256i cm = _mm256_setzero_si256(), cv = cm;
    if (o->sm2 > 0.0f) {
        const __m256 abs_m = _mm256_and_ps(mi, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)));
        const __m256i mag = encode_mag_sr(_mm256_div_ps(abs_m, _mm256_set1_ps(o->sm2)), rm, 3, 0x7f);
        /* the sign only with a nonzero magnitude: zero has one code */
        const __m256i neg = _mm256_and_si256(_mm256_srai_epi32(_mm256_castps_si256(mi), 31),
                                             _mm256_cmpgt_epi32(mag, _mm256_setzero_si256()));
        cm = _mm256_or_si256(mag, _mm256_and_si256(neg, _mm256_set1_epi32(0x80)));
    }
    if (o->sv2 > 0.0f) cv = encode_mag_sr(_mm256_div_ps(si, _mm256_set1_ps(o->sv2)), rv, 4, 0xff);
    *qq = _mm_packus_epi16(pack16(cm), pack16(cv));

    /* the codes are within +-MT_Q16_MAX: the signed saturating pack keeps them as they are */
    const __m256i cw = encode_q16_sr(_mm256_loadu_ps(p), rw, o->inv_w);
    *w8 = _mm_packs_epi32(_mm256_castsi256_si128(cw), _mm256_extracti128_si256(cw, 1));
}

int mt_lean_step_block_avx2(const mt_adamw_hyper *h, uint64_t seed, uint64_t step, uint64_t index0, size_t n,
                            int16_t *wq, float *sw, const uint16_t *g, uint8_t *qm, float *sm, uint8_t *qv, float *sv)
{
    if (n > MT_Q8_BLOCK) return -1;
    const step_in s = {mt_adamw_consts_of(h), *sw, *sm, *sv};
    float m[MT_Q8_BLOCK], sq[MT_Q8_BLOCK], p[MT_Q8_BLOCK];
    __m256i max_m = _mm256_setzero_si256(), max_sq = max_m, max_p = max_m;
    const __m256i all = _mm256_set1_epi32(-1);
    const size_t full = n & ~(size_t)7, rest = n - full;
    for (size_t i = 0; i < full; i += 8)
        update8(&s, all, wq + i, g + i, qm + i, qv + i, m + i, sq + i, p + i, &max_m, &max_sq, &max_p);
    if (rest) {
        int16_t tw[8] = {0};
        uint16_t tg[8] = {0};
        uint8_t tm[8] = {0}, tv[8] = {0};
        memcpy(tw, wq + full, rest * 2), memcpy(tg, g + full, rest * 2);
        memcpy(tm, qm + full, rest), memcpy(tv, qv + full, rest);
        const __m256i valid =
            _mm256_cmpgt_epi32(_mm256_set1_epi32((int)rest), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        update8(&s, valid, tw, tg, tm, tv, m + full, sq + full, p + full, &max_m, &max_sq, &max_p);
    }

    /* every |m|, sqrt(v) and |p| finite (and v not negative), or nothing is written: the scalar kernel's
     * three refusals, in whatever order, return the same -1 */
    const uint32_t am = reduce_max(max_m), asq = reduce_max(max_sq), ap = reduce_max(max_p);
    if (am >= 0x7f800000u || asq >= 0x7f800000u || ap >= 0x7f800000u) return -1;
    float amax_m, amax_sq, amax_p;
    memcpy(&amax_m, &am, sizeof am);
    memcpy(&amax_sq, &asq, sizeof asq);
    memcpy(&amax_p, &ap, sizeof ap);
    out_in o;
    o.sm2 = amax_m / MT_Q8_MAX_SIGNED, o.sv2 = amax_sq / MT_Q8_MAX_SQRT;
    const float sw2 = mt_q16_scale(amax_p);
    o.inv_w = sw2 > 0.0f ? 1.0f / sw2 : 0.0f; /* a power of two: p * inv_w is exact */
    o.z0 = seed ^ (step * 0x9E3779B97F4A7C15ull);
    o.off_a = _mm256_setr_epi64x(0, (long long)LEAN_C2, (long long)(4 * LEAN_C2), (long long)(5 * LEAN_C2));
    o.off_b = _mm256_setr_epi64x((long long)(2 * LEAN_C2), (long long)(3 * LEAN_C2), (long long)(6 * LEAN_C2),
                                 (long long)(7 * LEAN_C2));

    /* the codes and the new weights */
    __m128i qq, w8;
    for (size_t i = 0; i < full; i += 8) {
        finish8(&o, index0 + i, m + i, sq + i, p + i, &qq, &w8);
        _mm_storel_epi64((__m128i *)(qm + i), qq);
        _mm_storel_epi64((__m128i *)(qv + i), _mm_unpackhi_epi64(qq, qq));
        _mm_storeu_si128((__m128i *)(wq + i), w8);
    }
    if (rest) {
        uint8_t tq[16];
        int16_t tw[8];
        finish8(&o, index0 + full, m + full, sq + full, p + full, &qq, &w8);
        _mm_storeu_si128((__m128i *)tq, qq);
        _mm_storeu_si128((__m128i *)tw, w8);
        memcpy(qm + full, tq, rest), memcpy(qv + full, tq + 8, rest), memcpy(wq + full, tw, rest * 2);
    }
    *sw = sw2, *sm = o.sm2, *sv = o.sv2;
    return 0;
}
