/* The fp32 GEMM of the CPU backend: C = op(A) @ op(B) (+ C) (+ bias).
 *
 * Goto/BLIS structure. C is cut into tiles of at most MC x NC; a tile is one
 * task of the pool. A task walks the reduction in chunks of KC, packs the
 * chunk of op(A) into panels of MR rows and the chunk of op(B) into panels
 * of NR columns (zero-padded, contiguous in the order the micro-kernel reads
 * them; both fit in L2), and runs the register-tiled micro-kernel over
 * every MR x NR block of the tile, which adds its KC-long sums into C.
 *
 * Determinism: a C element gets its products summed in ascending k inside
 * each chunk, and the chunks added to C in ascending order; the chunk length
 * KC is a constant, so the tile sizes (chosen from the shape and the thread
 * count for load balance) never change a result.
 *
 * Micro-kernels, chosen at run time with __builtin_cpu_supports (the best
 * the CPU has; mt_cpu_gemm_isa takes a lower one as an argument):
 *   AVX-512F   12 x 32: 24 zmm accumulators, fused multiply-adds;
 *   AVX2+FMA    6 x 16: 12 ymm accumulators, fused multiply-adds;
 *   generic     4 x 8:  portable C (this file is built with -std=c11, under
 *                       which the compiler does not contract a*b+c).
 * The SIMD kernels are functions with a target attribute, so the library
 * itself needs no -m flags and runs on any x86-64. */
#include <string.h>

#include "cpu/cpu_ops.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define MT_GEMM_X86 1
#else
#define MT_GEMM_X86 0
#endif

#define KC 256     /* reduction chunk: fixed, it sets the summation order */
#define MC_MAX 288 /* tile rows: a multiple of every MR */
#define NC_MAX 256 /* tile columns: a multiple of every NR */
#define MR_MAX 12
#define NR_MAX 32

/* Adds (add != 0) or stores the MR x NR sums of a[kc][MR] x b[kc][NR] into c. */
typedef void (*kernel_fn)(int kc, const float *a, const float *b, float *c, size_t ldc, int add);
typedef struct { int mr, nr; kernel_fn fn; } gemm_kernel;

/* ---- micro-kernels ---------------------------------------------------------- */

static void kernel_generic(int kc, const float *a, const float *b, float *c, size_t ldc, int add)
{
    float acc[4][8] = {{0}};
    for (int k = 0; k < kc; k++, a += 4, b += 8)
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 8; j++) acc[i][j] += a[i] * b[j];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 8; j++) c[i * ldc + j] = add ? c[i * ldc + j] + acc[i][j] : acc[i][j];
}

#if MT_GEMM_X86
__attribute__((target("avx2,fma"))) static void kernel_avx2(int kc, const float *a, const float *b, float *c,
                                                            size_t ldc, int add)
{
    __m256 acc[6][2];
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int k = 0; k < kc; k++, a += 6, b += 16) {
        const __m256 b0 = _mm256_load_ps(b), b1 = _mm256_load_ps(b + 8);
#pragma GCC unroll 6
        for (int i = 0; i < 6; i++) {
            const __m256 ai = _mm256_broadcast_ss(a + i);
            acc[i][0] = _mm256_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 6
    for (int i = 0; i < 6; i++) {
        float *ci = c + i * ldc;
        if (add) {
            acc[i][0] = _mm256_add_ps(_mm256_loadu_ps(ci), acc[i][0]);
            acc[i][1] = _mm256_add_ps(_mm256_loadu_ps(ci + 8), acc[i][1]);
        }
        _mm256_storeu_ps(ci, acc[i][0]);
        _mm256_storeu_ps(ci + 8, acc[i][1]);
    }
}

__attribute__((target("avx512f"))) static void kernel_avx512(int kc, const float *a, const float *b, float *c,
                                                             size_t ldc, int add)
{
    __m512 acc[12][2];
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int k = 0; k < kc; k++, a += 12, b += 32) {
        const __m512 b0 = _mm512_load_ps(b), b1 = _mm512_load_ps(b + 16);
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) {
            const __m512 ai = _mm512_set1_ps(a[i]);
            acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
        }
    }
#pragma GCC unroll 12
    for (int i = 0; i < 12; i++) {
        float *ci = c + i * ldc;
        if (add) {
            acc[i][0] = _mm512_add_ps(_mm512_loadu_ps(ci), acc[i][0]);
            acc[i][1] = _mm512_add_ps(_mm512_loadu_ps(ci + 16), acc[i][1]);
        }
        _mm512_storeu_ps(ci, acc[i][0]);
        _mm512_storeu_ps(ci + 16, acc[i][1]);
    }
}
#endif

/* ---- kernel selection ------------------------------------------------------- */

mt_cpu_isa mt_cpu_isa_best(void)
{
#if MT_GEMM_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return MT_CPU_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return MT_CPU_ISA_AVX2;
#endif
    return MT_CPU_ISA_GENERIC;
}

static gemm_kernel kernel_for(mt_cpu_isa isa)
{
#if MT_GEMM_X86
    if (isa == MT_CPU_ISA_AVX512) return (gemm_kernel){12, 32, kernel_avx512};
    if (isa == MT_CPU_ISA_AVX2) return (gemm_kernel){6, 16, kernel_avx2};
#endif
    (void)isa;
    return (gemm_kernel){4, 8, kernel_generic};
}

/* ---- packing ------------------------------------------------------------------ */

typedef struct {
    int transA, transB, M, N, K;
    const float *A, *B;
    size_t lda, ldb, ldc;
    float *C;
    const float *bias;
    int accumulate;
    gemm_kernel kern;
    int nm, nn;         /* tiles along M and N */
    float *ws;          /* 64-byte aligned; per thread: the packed A and B chunks */
} gemm_args;

/* dst[0..n) = src[0..n) for the short rows of a panel (n <= NR_MAX): inline,
 * 4 floats at a time, where a call to memcpy would cost more than the copy.
 * The empty asm keeps GCC from turning the loop back into that call. */
static inline void copy_row(float *restrict dst, const float *restrict src, int n)
{
    int i = 0;
#if MT_GEMM_X86
    for (; i + 4 <= n; i += 4) {
        _mm_storeu_ps(dst + i, _mm_loadu_ps(src + i));
        __asm__("" : "+r"(dst));
    }
#endif
    for (; i < n; i++) {
        dst[i] = src[i];
        __asm__("" : "+r"(dst));
    }
}

/* dst[k*ld + r] = src[r*lds + k] for r < rows, k < kc: the packing of an
 * operand whose reduction index is the contiguous one. 4 x 4 blocks go
 * through SSE registers (x86-64 baseline). */
static void transpose_into(float *restrict dst, size_t ld, const float *restrict src, size_t lds, int rows, int kc)
{
    int r = 0;
#if MT_GEMM_X86
    for (; r + 4 <= rows; r += 4) {
        const float *s0 = src + r * lds, *s1 = s0 + lds, *s2 = s1 + lds, *s3 = s2 + lds;
        int k = 0;
        for (; k + 4 <= kc; k += 4) {
            __m128 a = _mm_loadu_ps(s0 + k), b = _mm_loadu_ps(s1 + k), c = _mm_loadu_ps(s2 + k),
                   d = _mm_loadu_ps(s3 + k);
            _MM_TRANSPOSE4_PS(a, b, c, d);
            _mm_storeu_ps(dst + (size_t)k * ld + r, a);
            _mm_storeu_ps(dst + (size_t)(k + 1) * ld + r, b);
            _mm_storeu_ps(dst + (size_t)(k + 2) * ld + r, c);
            _mm_storeu_ps(dst + (size_t)(k + 3) * ld + r, d);
        }
        for (; k < kc; k++) {
            float *dk = dst + (size_t)k * ld + r;
            dk[0] = s0[k], dk[1] = s1[k], dk[2] = s2[k], dk[3] = s3[k];
        }
    }
#endif
    for (; r < rows; r++)
        for (int k = 0; k < kc; k++) dst[(size_t)k * ld + r] = src[r * lds + k];
}

/* Rows [m0, m0+mc) x reduction [p0, p0+kc) of op(A) into panels of mr rows:
 * ap[panel][k][i], rows past mc zero. */
static void pack_a(float *restrict ap, const gemm_args *g, int m0, int mc, int p0, int kc)
{
    const int mr = g->kern.mr;
    for (int i0 = 0; i0 < mc; i0 += mr, ap += (size_t)mr * kc) {
        const int rows = mc - i0 < mr ? mc - i0 : mr;
        if (!g->transA) { /* A (M, K): element (m, k) at A[m*lda + k] */
            transpose_into(ap, (size_t)mr, g->A + (size_t)(m0 + i0) * g->lda + p0, g->lda, rows, kc);
            for (int i = rows; i < mr; i++)
                for (int k = 0; k < kc; k++) ap[(size_t)k * mr + i] = 0.0f;
        } else { /* A (K, M): element (m, k) at A[k*lda + m] */
            for (int k = 0; k < kc; k++) {
                const float *src = g->A + (size_t)(p0 + k) * g->lda + m0 + i0;
                float *dst = ap + (size_t)k * mr;
                copy_row(dst, src, rows);
                for (int i = rows; i < mr; i++) dst[i] = 0.0f;
            }
        }
    }
}

/* Reduction [p0, p0+kc) x columns [n0, n0+nc) of op(B) into panels of nr
 * columns: bp[panel][k][j], columns past nc zero. */
static void pack_b(float *restrict bp, const gemm_args *g, int n0, int nc, int p0, int kc)
{
    const int nr = g->kern.nr;
    for (int j0 = 0; j0 < nc; j0 += nr, bp += (size_t)nr * kc) {
        const int cols = nc - j0 < nr ? nc - j0 : nr;
        if (!g->transB) { /* B (K, N): element (k, n) at B[k*ldb + n] */
            for (int k = 0; k < kc; k++) {
                const float *src = g->B + (size_t)(p0 + k) * g->ldb + n0 + j0;
                float *dst = bp + (size_t)k * nr;
                copy_row(dst, src, cols);
                for (int j = cols; j < nr; j++) dst[j] = 0.0f;
            }
        } else { /* B (N, K): element (k, n) at B[n*ldb + k] */
            transpose_into(bp, (size_t)nr, g->B + (size_t)(n0 + j0) * g->ldb + p0, g->ldb, cols, kc);
            for (int j = cols; j < nr; j++)
                for (int k = 0; k < kc; k++) bp[(size_t)k * nr + j] = 0.0f;
        }
    }
}

/* ---- the tile task ------------------------------------------------------------ */

static size_t ws_floats_per_thread(void) { return (size_t)(MC_MAX + NC_MAX) * KC; }

static void gemm_tile(void *ctx, size_t task, int thread)
{
    const gemm_args *g = ctx;
    const int mr = g->kern.mr, nr = g->kern.nr;
    size_t lo, hi;
    mt_split_range((size_t)g->M, (size_t)g->nm, task / (size_t)g->nn, (size_t)mr, &lo, &hi);
    const int m0 = (int)lo, mc = (int)(hi - lo);
    mt_split_range((size_t)g->N, (size_t)g->nn, task % (size_t)g->nn, (size_t)nr, &lo, &hi);
    const int n0 = (int)lo, nc = (int)(hi - lo);
    if (mc == 0 || nc == 0) return;
    float *ap = g->ws + (size_t)thread * ws_floats_per_thread();
    float *bp = ap + (size_t)MC_MAX * KC;
    float *C = g->C + (size_t)m0 * g->ldc + n0;

    /* C = bias (or C += bias): the chunks below then all add. */
    int add = g->accumulate;
    if (g->bias) {
        for (int i = 0; i < mc; i++)
            for (int j = 0; j < nc; j++) C[i * g->ldc + j] = (add ? C[i * g->ldc + j] : 0.0f) + g->bias[n0 + j];
        add = 1;
    } else if (!add && g->K == 0) {
        for (int i = 0; i < mc; i++) memset(C + i * g->ldc, 0, (size_t)nc * sizeof(float));
    }

    _Alignas(64) float edge[MR_MAX * NR_MAX];
    for (int p0 = 0; p0 < g->K; p0 += KC, add = 1) {
        const int kc = g->K - p0 < KC ? g->K - p0 : KC;
        pack_a(ap, g, m0, mc, p0, kc);
        pack_b(bp, g, n0, nc, p0, kc);
        for (int i = 0; i < mc; i += mr) {
            const float *a = ap + (size_t)i * kc;
            for (int j = 0; j < nc; j += nr) {
                const float *b = bp + (size_t)j * kc;
                float *c = C + i * g->ldc + j;
                if (i + mr <= mc && j + nr <= nc) {
                    g->kern.fn(kc, a, b, c, g->ldc, add);
                } else { /* a partial block: through a full-size buffer, same arithmetic */
                    g->kern.fn(kc, a, b, edge, (size_t)nr, 0);
                    const int rows = mc - i < mr ? mc - i : mr, cols = nc - j < nr ? nc - j : nr;
                    for (int ii = 0; ii < rows; ii++)
                        for (int jj = 0; jj < cols; jj++)
                            c[ii * g->ldc + jj] = add ? c[ii * g->ldc + jj] + edge[ii * nr + jj] : edge[ii * nr + jj];
                }
            }
        }
    }
}

/* ---- entry points --------------------------------------------------------------- */

size_t mt_cpu_gemm_ws_bytes(void) { return ws_floats_per_thread() * sizeof(float); }

void mt_cpu_gemm_isa(mt_pool *p, void *ws, mt_cpu_isa isa, int transA, int transB, int M, int N, int K,
                     const float *A, size_t lda, const float *B, size_t ldb, float *C, size_t ldc, const float *bias,
                     int accumulate)
{
    if (M <= 0 || N <= 0) return;
    const mt_cpu_isa best = mt_cpu_isa_best();
    gemm_args g = {transA, transB, M, N, K < 0 ? 0 : K, A, B, lda, ldb, ldc, C, bias, accumulate,
                   kernel_for(isa < best ? isa : best), 0, 0, mt_cpu_ws_align(ws)};
    const int mr = g.kern.mr, nr = g.kern.nr;
    const int mblocks = (M + mr - 1) / mr, nblocks = (N + nr - 1) / nr;
    /* Fewest tiles that fit MC_MAX x NC_MAX, then more while the threads
     * would have fewer than ~3 tiles each (split the longer side). */
    g.nm = (mblocks + MC_MAX / mr - 1) / (MC_MAX / mr);
    g.nn = (nblocks + NC_MAX / nr - 1) / (NC_MAX / nr);
    const int want = mt_pool_size(p) > 1 ? 3 * mt_pool_size(p) : 1;
    while (g.nm * g.nn < want && (g.nm < mblocks || g.nn < nblocks)) {
        if (g.nn >= nblocks || (g.nm < mblocks && mblocks * mr / g.nm >= nblocks * nr / g.nn)) g.nm++;
        else g.nn++;
    }
    mt_pool_run(p, (size_t)g.nm * (size_t)g.nn, gemm_tile, &g);
}

void mt_cpu_gemm(mt_pool *p, void *ws, int transA, int transB, int M, int N, int K, const float *A, size_t lda,
                 const float *B, size_t ldb, float *C, size_t ldc, const float *bias, int accumulate)
{
    mt_cpu_gemm_isa(p, ws, mt_cpu_isa_best(), transA, transB, M, N, K, A, lda, B, ldb, C, ldc, bias, accumulate);
}
