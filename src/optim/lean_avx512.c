/* The lean mode's AdamW step, AVX-512 (F, BW, VL, DQ): 16 parameters per
 * vector, masked loads and stores for the tail. The same bits as the scalar
 * mt_lean_step_block (lean.c), for every input:
 *
 * - the update is the scalar kernel's sequence of fp32 operations, each a
 *   separate multiply, add, IEEE sqrt or division (no fused multiply-add);
 * - decoding builds a code's value from its bit fields (the subnormal codes
 *   as an integer times an exact power of two), as exact as ldexpf, then
 *   multiplies by the scale once;
 * - encoding takes the same absmax (a maximum is exact), the same one
 *   division for the scale and per element, and rounds the quotient
 *   stochastically with the same integer arithmetic as q8.c's encode_mag_sr
 *   (below 2^-14: a multiply by an exact power of two and a conversion that
 *   truncates, as C's float to integer conversion does);
 * - the weights' codes likewise: decoded as q16.c does (an exact int16 to
 *   fp32 conversion, one multiply by the scale), the scale from the same
 *   absmax by mt_q16_scale itself, and q16.c's stochastic rounding of
 *   |p / s| (a multiply by the exact power of two 1 / s, floor, the
 *   fraction's top 16 bits by a truncating conversion, one add and shift);
 * - sqrt(v) is taken once per element and serves both the denominator and
 *   the code: sqrt is monotone, so the largest sqrt(v) is sqrtf of the
 *   largest v, the scale the scalar kernel computes;
 * - the random bits of parameter index0 + i (16 for each code, 16 for the
 *   weight) come from mt_lean_random64's hash in 64-bit lanes (VPMULLQ),
 *   element by element, whatever the lane.
 *
 * Two passes over the block, as the scalar kernel: the update into local
 * arrays with the blocks' absmaxes and finiteness, then (only if every
 * moment and weight is finite) the codes and the scales written out. */
#include <immintrin.h>
#include <string.h>

#include "optim/lean.h"
#include "optim/q16.h"
#include "optim/q8.h"

/* The value of each magnitude code (e << mbits | f, at most 8 bits) in units
 * of the scale: (2^mbits + f) 2^(e - 15 - mbits) for e > 0, f 2^(-14 - mbits)
 * for e = 0. The first is the float with exponent field e - 15 + 127 and the
 * mantissa f in its top mbits bits. */
static inline __m512 decode_mag(__m512i q, int mbits)
{
    const __m512 normal =
        _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(q, 23 - mbits), _mm512_set1_epi32(112 << 23)));
    const __m512 sub =
        _mm512_mul_ps(_mm512_cvtepi32_ps(q), _mm512_castsi512_ps(_mm512_set1_epi32((113 - mbits) << 23)));
    return _mm512_mask_blend_ps(_mm512_cmpge_epi32_mask(q, _mm512_set1_epi32(1 << mbits)), sub, normal);
}

/* q8.c's encode_mag_sr on 16 lanes of x >= 0 (or -0) with 16 random bits
 * r each. The code's exponent field e = x's exponent + 15; e >= 1: x's bits
 * less 112 << 23 are t, the code above its dropped 23 - mbits mantissa bits;
 * e < 1: x 2^(30 + mbits), exact (one multiply by a power of two is q8.c's
 * two), truncated to an integer, the code above 16 dropped bits. Either way
 * r is added to the top 16 dropped bits and the code is what is above them:
 * for e >= 1, (t + r 2^k) >> (k + 16), q8.c's form (k = 7 - mbits), equals
 * ((t >> k) + r) >> 16 (the bits of t below 2^k cannot carry: t's part above
 * them and r are integers in units of 2^k), so both ranges share one add and
 * one shift (a carry moves into the exponent, or from the subnormal codes
 * into the first normal one). */
static inline __m512i encode_mag_sr(__m512 x, __m512i r, int mbits, int max_code)
{
    const __m512i u = _mm512_castps_si512(x);
    const __m512i normal = _mm512_srli_epi32(_mm512_sub_epi32(u, _mm512_set1_epi32(112 << 23)), 7 - mbits);
    const __m512i sub =
        _mm512_cvttps_epi32(_mm512_mul_ps(x, _mm512_castsi512_ps(_mm512_set1_epi32((127 + 30 + mbits) << 23))));
    const __m512i f = _mm512_mask_blend_epi32(_mm512_cmpge_epi32_mask(u, _mm512_set1_epi32(113 << 23)), sub, normal);
    return _mm512_min_epi32(_mm512_srli_epi32(_mm512_add_epi32(f, r), 16), _mm512_set1_epi32(max_code));
}

/* a * b mod 2^64 in each lane */
static inline __m512i mul64(__m512i a, uint64_t b) { return _mm512_mullo_epi64(a, _mm512_set1_epi64((long long)b)); }

/* mt_lean_random64's finaliser on 8 lanes of z */
static inline __m512i mix64(__m512i z)
{
    z = mul64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), 0xBF58476D1CE4E5B9ull);
    z = mul64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), 0x94D049BB133111EBull);
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}

/* q16.c's mt_q16_encode_sr on 16 lanes of p with 16 random bits r each,
 * inv = 1 / s (an exact power of two, 0 for s = 0): |p inv| = fl + frac
 * exactly, up with probability frac in 16 bits, at most MT_Q16_MAX, then
 * p's sign (-0, or a magnitude rounded to 0, gives 0 either way). */
static inline __m512i encode_q16_sr(__m512 p, __m512i r, float inv)
{
    const __m512 y = _mm512_abs_ps(_mm512_mul_ps(p, _mm512_set1_ps(inv))), fl = _mm512_floor_ps(y);
    const __m512i frac16 = _mm512_cvttps_epi32(_mm512_mul_ps(_mm512_sub_ps(y, fl), _mm512_set1_ps(65536.0f)));
    const __m512i up = _mm512_srli_epi32(_mm512_add_epi32(frac16, r), 16);
    const __m512i mag = _mm512_min_epi32(_mm512_add_epi32(_mm512_cvttps_epi32(fl), up), _mm512_set1_epi32(MT_Q16_MAX));
    const __mmask16 neg = _mm512_test_epi32_mask(_mm512_castps_si512(p), _mm512_set1_epi32((int)0x80000000u));
    return _mm512_mask_sub_epi32(mag, neg, _mm512_setzero_si512(), mag);
}

typedef struct {
    mt_adamw_consts c;
    float sw, sm, sv;
} step_in;

/* The update of the 16 parameters at i (lanes of k): the new m, sqrt(v) and
 * weight into the local arrays; folds |m|, sqrt(v) (+0 for -0: only the bits
 * of a NaN, an infinity or a negative value reach 0x7f800000) and |p| into
 * the running unsigned maxima. */
static inline void update16(const step_in *s, size_t i, __mmask16 k, const int16_t *wq, const uint16_t *g,
                            const uint8_t *qm, const uint8_t *qv, float *m, float *sq, float *p, __m512i *max_m,
                            __m512i *max_sq, __m512i *max_p)
{
    const mt_adamw_consts *c = &s->c;
    const __m512i cm = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, qm + i));
    const __m512i cv = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(k, qv + i));
    const __m512 mag = decode_mag(_mm512_and_si512(cm, _mm512_set1_epi32(0x7f)), 3);
    const __m512 m0 = _mm512_mul_ps(
        _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(mag),
                                            _mm512_slli_epi32(_mm512_and_si512(cm, _mm512_set1_epi32(0x80)), 24))),
        _mm512_set1_ps(s->sm));
    const __m512 r0 = _mm512_mul_ps(decode_mag(cv, 4), _mm512_set1_ps(s->sv));
    const __m512 v0 = _mm512_mul_ps(r0, r0);
    __m512 gi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, g + i)), 16));
    gi = _mm512_mul_ps(gi, _mm512_set1_ps(c->grad_scale));
    const __m512i cw = _mm512_cvtepi16_epi32(_mm256_maskz_loadu_epi16(k, wq + i));
    const __m512 w0 = _mm512_mul_ps(_mm512_cvtepi32_ps(cw), _mm512_set1_ps(s->sw));
    const __m512 pi = _mm512_mul_ps(w0, _mm512_set1_ps(c->decay));
    const __m512 mi =
        _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(c->beta1), m0), _mm512_mul_ps(_mm512_set1_ps(c->omb1), gi));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(c->beta2), v0),
                                    _mm512_mul_ps(_mm512_set1_ps(c->omb2), _mm512_mul_ps(gi, gi)));
    const __m512 si = _mm512_sqrt_ps(vi);
    const __m512 denom = _mm512_add_ps(_mm512_mul_ps(si, _mm512_set1_ps(c->inv_sqrt_bc2)), _mm512_set1_ps(c->eps));
    const __m512 pn = _mm512_sub_ps(pi, _mm512_mul_ps(_mm512_set1_ps(c->step), _mm512_div_ps(mi, denom)));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(sq + i, si);
    _mm512_storeu_ps(p + i, pn);
    *max_m = _mm512_mask_max_epu32(*max_m, k, *max_m,
                                   _mm512_and_si512(_mm512_castps_si512(mi), _mm512_set1_epi32(0x7fffffff)));
    *max_sq = _mm512_mask_max_epu32(*max_sq, k, *max_sq,
                                    _mm512_castps_si512(_mm512_add_ps(si, _mm512_setzero_ps())));
    *max_p = _mm512_mask_max_epu32(*max_p, k, *max_p,
                                   _mm512_and_si512(_mm512_castps_si512(pn), _mm512_set1_epi32(0x7fffffff)));
}

int mt_lean_step_block_avx512(const mt_adamw_hyper *h, uint64_t seed, uint64_t step, uint64_t index0, size_t n,
                              int16_t *wq, float *sw, const uint16_t *g, uint8_t *qm, float *sm, uint8_t *qv,
                              float *sv)
{
    if (n > MT_Q8_BLOCK) return -1;
    const step_in s = {mt_adamw_consts_of(h), *sw, *sm, *sv};
    float m[MT_Q8_BLOCK], sq[MT_Q8_BLOCK], p[MT_Q8_BLOCK];
    __m512i max_m = _mm512_setzero_si512(), max_sq = max_m, max_p = max_m;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) update16(&s, i, 0xffff, wq, g, qm, qv, m, sq, p, &max_m, &max_sq, &max_p);
    const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1);
    if (tail) update16(&s, i, tail, wq, g, qm, qv, m, sq, p, &max_m, &max_sq, &max_p);

    /* every |m|, sqrt(v) and |p| finite (and v not negative), or nothing is written: the scalar kernel's
     * three refusals, in whatever order, return the same -1 */
    const uint32_t am = (uint32_t)_mm512_reduce_max_epu32(max_m), asq = (uint32_t)_mm512_reduce_max_epu32(max_sq);
    const uint32_t ap = (uint32_t)_mm512_reduce_max_epu32(max_p);
    if (am >= 0x7f800000u || asq >= 0x7f800000u || ap >= 0x7f800000u) return -1;
    float amax_m, amax_sq, amax_p;
    memcpy(&amax_m, &am, sizeof am);
    memcpy(&amax_sq, &asq, sizeof asq);
    memcpy(&amax_p, &ap, sizeof ap);
    const float sm2 = amax_m / MT_Q8_MAX_SIGNED, sv2 = amax_sq / MT_Q8_MAX_SQRT, sw2 = mt_q16_scale(amax_p);
    const float inv_w = sw2 > 0.0f ? 1.0f / sw2 : 0.0f; /* a power of two: p * inv_w is exact */

    /* the codes and the new weights */
    const uint64_t z0 = seed ^ (step * 0x9E3779B97F4A7C15ull);
    const uint64_t c2 = 0xD1B54A32D192ED03ull; /* index * c2: (index0 + i) * c2 + lane's offset * c2 */
    const __m512i z0v = _mm512_set1_epi64((long long)z0);
    /* the elements of the 64-bit lanes of za and zb: pairs, so that one shuffle of 32-bit lanes within each
     * 128-bit lane puts their halves in element order */
    const __m512i off_a = mul64(_mm512_setr_epi64(0, 1, 4, 5, 8, 9, 12, 13), c2);
    const __m512i off_b = mul64(_mm512_setr_epi64(2, 3, 6, 7, 10, 11, 14, 15), c2);
    for (i = 0; i < n; i += 16) {
        const __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : tail;
        /* one hash per element, mt_lean_random64, in 64-bit lanes (elements 0, 1, 4, 5, .. in za, 2, 3, 6,
         * 7, .. in zb); their low and high halves to 32-bit lanes in element order. Bits 0..15 round the m
         * code, 16..31 the v code, 48..63 the weight. */
        const __m512i idx = _mm512_set1_epi64((long long)((index0 + i) * c2));
        const __m512 za = _mm512_castsi512_ps(mix64(_mm512_xor_si512(z0v, _mm512_add_epi64(idx, off_a))));
        const __m512 zb = _mm512_castsi512_ps(mix64(_mm512_xor_si512(z0v, _mm512_add_epi64(idx, off_b))));
        const __m512i lo = _mm512_castps_si512(_mm512_shuffle_ps(za, zb, _MM_SHUFFLE(2, 0, 2, 0)));
        const __m512i hi = _mm512_castps_si512(_mm512_shuffle_ps(za, zb, _MM_SHUFFLE(3, 1, 3, 1)));
        const __m512i rm = _mm512_and_si512(lo, _mm512_set1_epi32(0xffff)), rv = _mm512_srli_epi32(lo, 16);
        const __m512i rw = _mm512_srli_epi32(hi, 16);

        const __m512 mi = _mm512_maskz_loadu_ps(k, m + i), si = _mm512_maskz_loadu_ps(k, sq + i);
        __m512i cm = _mm512_setzero_si512(), cv = cm;
        if (sm2 > 0.0f) {
            const __m512i mag = encode_mag_sr(_mm512_div_ps(_mm512_abs_ps(mi), _mm512_set1_ps(sm2)), rm, 3, 0x7f);
            /* the sign only with a nonzero magnitude: zero has one code */
            const __mmask16 neg = _mm512_test_epi32_mask(mag, mag) &
                                  _mm512_test_epi32_mask(_mm512_castps_si512(mi), _mm512_set1_epi32((int)0x80000000u));
            cm = _mm512_mask_or_epi32(mag, neg, mag, _mm512_set1_epi32(0x80));
        }
        if (sv2 > 0.0f) cv = encode_mag_sr(_mm512_div_ps(si, _mm512_set1_ps(sv2)), rv, 4, 0xff);
        _mm_mask_storeu_epi8(qm + i, k, _mm512_cvtepi32_epi8(cm));
        _mm_mask_storeu_epi8(qv + i, k, _mm512_cvtepi32_epi8(cv));

        const __m512i cw = encode_q16_sr(_mm512_maskz_loadu_ps(k, p + i), rw, inv_w);
        _mm256_mask_storeu_epi16(wq + i, k, _mm512_cvtepi32_epi16(cw));
    }
    *sw = sw2, *sm = sm2, *sv = sv2;
    return 0;
}
