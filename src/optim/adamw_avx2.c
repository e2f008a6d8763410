/* AdamW, AVX2: 8 floats per vector, two vectors per iteration, the scalar
 * kernel's exact operation sequence (separate multiplies and adds, IEEE sqrt
 * and division), bf16 rounding in integer arithmetic, software prefetch. The
 * last n % 8 elements go to the scalar kernel, which computes the same bits.
 * Also the AVX2 sum of squares. */
#include <immintrin.h>

#include "optim/adamw.h"

/* Software prefetch this many elements ahead, as in adamw_avx512.c. */
#ifndef MT_ADAMW_AHEAD
#define MT_ADAMW_AHEAD 512
#endif

/* Round-to-nearest-even to bf16, NaNs quieted: mt_f32_to_bf16 on 8 lanes. */
static inline __m128i f32_to_bf16(__m256 x)
{
    const __m256i u = _mm256_castps_si256(x);
    const __m256i hi = _mm256_srli_epi32(u, 16);
    const __m256i lsb = _mm256_and_si256(hi, _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i abs = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(abs, _mm256_set1_epi32(0x7f800000));
    r = _mm256_blendv_epi8(r, _mm256_or_si256(hi, _mm256_set1_epi32(0x0040)), nan);
    /* every lane is below 0x10000: the unsigned saturating pack is exact */
    return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

/* Updates the 8 elements at i. grad is loaded before w is stored. */
static inline void update8(const mt_adamw_consts *c, size_t i, float *master, float *m, float *v,
                           const void *grad, int grad_is_bf16, uint16_t *w_bf16)
{
    __m256 g = grad_is_bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(
                                  _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)((const uint16_t *)grad + i))),
                                  16))
                            : _mm256_loadu_ps((const float *)grad + i);
    g = _mm256_mul_ps(g, _mm256_set1_ps(c->grad_scale));
    __m256 p = _mm256_mul_ps(_mm256_loadu_ps(master + i), _mm256_set1_ps(c->decay));
    __m256 mi = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(c->beta1), _mm256_loadu_ps(m + i)),
                              _mm256_mul_ps(_mm256_set1_ps(c->omb1), g));
    __m256 vi = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(c->beta2), _mm256_loadu_ps(v + i)),
                              _mm256_mul_ps(_mm256_set1_ps(c->omb2), _mm256_mul_ps(g, g)));
    __m256 denom = _mm256_add_ps(_mm256_mul_ps(_mm256_sqrt_ps(vi), _mm256_set1_ps(c->inv_sqrt_bc2)),
                                 _mm256_set1_ps(c->eps));
    p = _mm256_sub_ps(p, _mm256_mul_ps(_mm256_set1_ps(c->step), _mm256_div_ps(mi, denom)));
    _mm256_storeu_ps(master + i, p);
    _mm256_storeu_ps(m + i, mi);
    _mm256_storeu_ps(v + i, vi);
    if (w_bf16) _mm_storeu_si128((__m128i *)(w_bf16 + i), f32_to_bf16(p));
}

/* One line from byte `bytes` of a; the address is formed as an integer (it may
 * lie past the end of the array, which a prefetch does not mind). */
static inline void prefetch(const void *a, size_t bytes)
{
    _mm_prefetch((const char *)((uintptr_t)a + bytes), _MM_HINT_T0);
}

void mt_adamw_kernel_avx2(const mt_adamw_hyper *h, size_t n, float *master, float *m, float *v,
                          const void *grad, int grad_is_bf16, uint16_t *w_bf16)
{
    const mt_adamw_consts c = mt_adamw_consts_of(h);
    const int w_apart = w_bf16 && (const void *)w_bf16 != grad;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) { /* 16 floats: one line of each fp32 array, half a line of bf16 */
        const size_t j = i + MT_ADAMW_AHEAD;
        prefetch(master, j * 4);
        prefetch(m, j * 4);
        prefetch(v, j * 4);
        prefetch(grad, j * (grad_is_bf16 ? 2 : 4));
        if (w_apart) prefetch(w_bf16, j * 2);
        update8(&c, i, master, m, v, grad, grad_is_bf16, w_bf16);
        update8(&c, i + 8, master, m, v, grad, grad_is_bf16, w_bf16);
    }
    if (i + 8 <= n) {
        update8(&c, i, master, m, v, grad, grad_is_bf16, w_bf16);
        i += 8;
    }
    if (i < n)
        mt_adamw_kernel_scalar(h, n - i, master + i, m + i, v + i,
                               grad_is_bf16 ? (const void *)((const uint16_t *)grad + i)
                                            : (const void *)((const float *)grad + i),
                               grad_is_bf16, w_bf16 ? w_bf16 + i : NULL);
}

/* ---- sum of squares of one part (see mt_sumsq_fn) -----------------------------
 * Accumulator k of the 32 is lane k % 4 of a[k / 4]. d * d is exact in
 * double, so the fused multiply-add rounds exactly as the scalar a + d * d. */

/* a + (x[i..i+4) as doubles)^2, lane by lane */
static inline __m256d add_squares4(__m256d a, const void *x, int is_bf16, size_t i)
{
    __m128 f = is_bf16 ? _mm_castsi128_ps(_mm_slli_epi32(
                             _mm_cvtepu16_epi32(_mm_loadl_epi64((const __m128i *)((const uint16_t *)x + i))), 16))
                       : _mm_loadu_ps((const float *)x + i);
    __m256d d = _mm256_cvtps_pd(f);
    return _mm256_fmadd_pd(d, d, a);
}

double mt_sumsq_part_avx2(const void *x, int is_bf16, size_t n)
{
    __m256d a0 = _mm256_setzero_pd(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        const size_t j = i + MT_ADAMW_AHEAD;
        prefetch(x, j * (is_bf16 ? 2 : 4));
        if (!is_bf16) prefetch(x, j * 4 + 64);
        a0 = add_squares4(a0, x, is_bf16, i);
        a1 = add_squares4(a1, x, is_bf16, i + 4);
        a2 = add_squares4(a2, x, is_bf16, i + 8);
        a3 = add_squares4(a3, x, is_bf16, i + 12);
        a4 = add_squares4(a4, x, is_bf16, i + 16);
        a5 = add_squares4(a5, x, is_bf16, i + 20);
        a6 = add_squares4(a6, x, is_bf16, i + 24);
        a7 = add_squares4(a7, x, is_bf16, i + 28);
    }
    double acc[32];
    _mm256_storeu_pd(acc, a0);
    _mm256_storeu_pd(acc + 4, a1);
    _mm256_storeu_pd(acc + 8, a2);
    _mm256_storeu_pd(acc + 12, a3);
    _mm256_storeu_pd(acc + 16, a4);
    _mm256_storeu_pd(acc + 20, a5);
    _mm256_storeu_pd(acc + 24, a6);
    _mm256_storeu_pd(acc + 28, a7);
    mt_sumsq_tail(acc, x, is_bf16, i, n);
    return mt_sumsq_reduce(acc);
}
