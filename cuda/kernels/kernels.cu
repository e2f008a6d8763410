// The CUDA backend's own kernels; the contracts are in kernels.h and the
// design in docs/cuda-kernels.md.
//
// Every kernel is a template over the element types of its activation
// tensors (bf16 or fp32) and a vector width (8 elements, one or two 16-byte
// accesses per thread, or 1 when the row lengths or the pointers do not
// allow it); the C wrappers at the end pick the instance. Arithmetic is in
// fp32, row statistics and losses in double. Where the CPU reference
// (src/cpu/cpu_ops.c) writes an expression that the compiler would contract into
// a fused multiply-add, the fp32 path spells the roundings out (__fmul_rn,
// __fadd_rn), so that given the same inputs it computes the same bits except
// where the order of a reduction differs.
//
// Reductions never use floating-point atomics: partial results go to scratch
// in a layout fixed by the shapes and are added in a fixed order, so every
// result is the same from run to run.
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/vec.cuh"
extern "C" {
#include "model/template.h" /* mt_glu_act */
}

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cooperative_groups.h>
#include <cub/device/device_radix_sort.cuh>

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <type_traits>

typedef __nv_bfloat16 bf16;
namespace cg = cooperative_groups;

namespace {

template <typename T> constexpr bool is_bf16 = std::is_same_v<T, bf16>;

// ---- block reductions ---------------------------------------------------------------
// Butterfly shuffles: every lane ends with the same bits (each step adds the
// same two values in either order), and the pattern is fixed by blockDim, so
// the result is deterministic. blockDim.x is a multiple of 32; sh holds 32
// values and may be reused by the next call (the leading barrier protects it).

template <typename R> __device__ __forceinline__ R warp_sum(R v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

template <typename R> __device__ __forceinline__ R block_sum(R v, R *sh)
{
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    return warp_sum(lane < nw ? sh[lane] : R(0));
}

__device__ __forceinline__ float block_max(float v, float *sh)
{
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = warp_max(v);
    __syncthreads();
    if (lane == 0) sh[wid] = v;
    __syncthreads();
    return warp_max(lane < nw ? sh[lane] : -INFINITY);
}

// ---- launch helpers -----------------------------------------------------------------------

template <typename T> struct tag { using type = T; };

// f(tag<bf16>) or f(tag<float>) for dt; -1 for an unknown dtype.
template <typename F> int with_dtype(mt_cu_dtype dt, F &&f)
{
    switch (dt) {
    case MT_CU_BF16: return f(tag<bf16>{});
    case MT_CU_F32: return f(tag<float>{});
    }
    return -1;
}

int launched(void) { return cudaGetLastError() == cudaSuccess ? 0 : -1; }

unsigned blocks_for(size_t n, unsigned threads) { return (unsigned)((n + threads - 1) / threads); }

// The start of caller scratch, rounded up to 256 bytes (scratch sizes add 256).
char *scratch_base(void *scratch) { return (char *)(((uintptr_t)scratch + 255) & ~(uintptr_t)255); }

size_t round256(size_t n) { return (n + 255) / 256 * 256; }

// ---- tuning (mt_cu_tuning) ----------------------------------------------------------------
// Every launcher with variants takes its tuning from the caller (NULL: these
// defaults, from bench/cuda_kernels -v on the H200; docs/cuda-kernels.md).

constexpr mt_cu_tuning TUNING_DEFAULT = MT_CU_TUNING_DEFAULT;

// ---- row kernels: how a row of C elements is spread over a block ----------------------------
// VEC elements per access (8, or 1 when C % 8 or the alignment forbids);
// each of at most ROW_THREADS threads holds E accesses of the row in
// registers, E the smallest of {1, 2, 4, 8} from emin up (VEC 8) or of {8, 32}
// (VEC 1) that fits: C <= 32768 when C % 8 == 0, else C <= 16384.

constexpr int ROW_THREADS = 512;

template <int N> using ic = std::integral_constant<int, N>;

// f(ic<E>, threads) for the row length C; -1 when C is too long.
template <int VEC, typename F> int with_row_cfg(int C, int emin, F &&f)
{
    const int nv = C / VEC;
    auto th = [nv](int e) {
        const int t = ((nv + e - 1) / e + 31) / 32 * 32;
        return t < 32 ? 32 : t;
    };
    if constexpr (VEC == 8) {
        if (emin <= 1 && th(1) <= ROW_THREADS) return f(ic<1>{}, th(1));
        if (emin <= 2 && th(2) <= ROW_THREADS) return f(ic<2>{}, th(2));
        if (emin <= 4 && th(4) <= ROW_THREADS) return f(ic<4>{}, th(4));
        if (th(8) <= ROW_THREADS) return f(ic<8>{}, th(8));
    } else {
        if (th(8) <= ROW_THREADS) return f(ic<8>{}, th(8));
        if (th(32) <= ROW_THREADS) return f(ic<32>{}, th(32));
    }
    return -1;
}

// ---- RMSNorm ------------------------------------------------------------------------------
// Row statistics (the mean of squares, and the backward's mean of g n) are
// reduced over the block in double. Each thread's own partial (at most 64
// terms) is summed in double in fp32 mode, which makes every product exact
// and the result as the CPU's to a rounding; in bf16 mode (x or w bf16) it
// is summed in fp32 and converted once: the fp32 -> fp64 conversions, one or
// two per element, otherwise cost more issue slots than the memory traffic
// leaves (they run at a quarter of the double-precision rate), and the
// fp32 partial is far more accurate than the bf16 values it serves.

template <typename TX, typename TW> using stat_t = std::conditional_t<is_bf16<TX> || is_bf16<TW>, float, double>;

template <typename TX, typename TW, int VEC, int E>
__global__ void __launch_bounds__(ROW_THREADS) rmsnorm_fwd_k(TW *__restrict__ y, float *__restrict__ rstd,
                                                             const TX *__restrict__ x, const TW *__restrict__ w, int C,
                                                             float eps, float woff)
{
    using A = stat_t<TX, TW>;
    __shared__ double sh[32];
    const size_t t = blockIdx.x;
    const TX *xr = x + t * C;
    TW *yr = y + t * C;
    const int nv = C / VEC;
    float v[E][VEC];
    A ss = 0;
#pragma unroll
    for (int e = 0; e < E; e++) {
        const int j = threadIdx.x + e * blockDim.x;
        if (j < nv) {
            load<VEC>(xr + (size_t)j * VEC, v[e]);
#pragma unroll
            for (int k = 0; k < VEC; k++) ss += (A)v[e][k] * (A)v[e][k];
        }
    }
    const double tot = block_sum((double)ss, sh);
    const float r = 1.0f / sqrtf((float)(tot / C) + eps);
    if (rstd && threadIdx.x == 0) rstd[t] = r;
#pragma unroll
    for (int e = 0; e < E; e++) {
        const int j = threadIdx.x + e * blockDim.x;
        if (j < nv) {
            float wv[VEC], o[VEC];
            load<VEC>(w + (size_t)j * VEC, wv);
#pragma unroll
            for (int k = 0; k < VEC; k++) // HF: w * (x * rstd); Gemma: (1 + w), woff 1 (0 + w is w)
                o[k] = __fmul_rn(__fadd_rn(woff, wv[k]), __fmul_rn(v[e][k], r));
            store<VEC>(yr + (size_t)j * VEC, o);
        }
    }
}

// Rows of at most 256 elements, C % 8 == 0 (the per-head q/k norms: rows of head_dim, tokens x heads of
// them): G lanes a row, G the row's 8-wide accesses rounded up to a power of two, ROWS_BLOCK / G rows a
// block, where rmsnorm_fwd_k spends a block of one warp on each row (524288 blocks of 32 threads, 16 of
// them busy, for 16384 tokens of Qwen3's 32 heads of 128). Lane j holds elements [8j, 8j + 8) as
// rmsnorm_fwd_k's thread j does, and the butterfly over the G lanes adds the same values in the same
// order as that block's sum (its lanes past G add zeros first): the same bits.
constexpr int ROWS_BLOCK = 256;

template <typename TX, typename TW, int G>
__global__ void __launch_bounds__(ROWS_BLOCK) rmsnorm_fwd_rows_k(TW *__restrict__ y, float *__restrict__ rstd,
                                                                 const TX *__restrict__ x, const TW *__restrict__ w,
                                                                 int T, int C, float eps, float woff)
{
    using A = stat_t<TX, TW>;
    const int lane = (int)threadIdx.x % G, nv = C / 8;
    const size_t t = (size_t)blockIdx.x * (ROWS_BLOCK / G) + threadIdx.x / G;
    const bool row = t < (size_t)T, mine = row && lane < nv;
    float v[8];
    A ss = 0;
    if (mine) {
        load<8>(x + t * C + (size_t)lane * 8, v);
#pragma unroll
        for (int k = 0; k < 8; k++) ss += (A)v[k] * (A)v[k];
    }
    double tot = (double)ss;
#pragma unroll
    for (int o = G / 2; o > 0; o >>= 1) tot += __shfl_xor_sync(0xffffffffu, tot, o); // every lane, rows past T too
    if (!row) return;
    const float r = 1.0f / sqrtf((float)(tot / C) + eps);
    if (rstd && lane == 0) rstd[t] = r;
    if (mine) {
        float wv[8], o[8];
        load<8>(w + (size_t)lane * 8, wv);
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] = __fmul_rn(__fadd_rn(woff, wv[k]), __fmul_rn(v[k], r));
        store<8>(y + t * C + (size_t)lane * 8, o);
    }
}

// Rows [blockIdx.x * R, + R) of the backward: dx += r (g - n m) per row with
// n = x r, g = dy (woff + w), m = mean(g n); the dw contributions dy n of the chunk's
// rows summed in ascending t into part[blockIdx.x, :]. PF: dx is loaded with
// x and dy, so that its latency overlaps the row's reductions.
template <typename TX, typename TW, int VEC, int E, bool PF>
__global__ void __launch_bounds__(ROW_THREADS) rmsnorm_bwd_k(float *__restrict__ dx, float *__restrict__ part,
                                                             const float *__restrict__ dy, const TX *__restrict__ x,
                                                             const TW *__restrict__ w, const float *__restrict__ rstd,
                                                             int T, int C, int R, float eps, float woff)
{
    using A = stat_t<TX, TW>;
    __shared__ double sh[32];
    const int nv = C / VEC;
    const int t0 = blockIdx.x * R, t1 = min(T, t0 + R);
    float acc[E][VEC];
#pragma unroll
    for (int e = 0; e < E; e++)
#pragma unroll
        for (int k = 0; k < VEC; k++) acc[e][k] = 0.0f;

    for (int t = t0; t < t1; t++) {
        const TX *xr = x + (size_t)t * C;
        const float *dyr = dy + (size_t)t * C;
        float *dxr = dx ? dx + (size_t)t * C : nullptr;
        float xv[E][VEC], dv[E][VEC], ov[PF ? E : 1][VEC];
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int j = threadIdx.x + e * blockDim.x;
            if (j < nv) {
                load<VEC>(xr + (size_t)j * VEC, xv[e]);
                load<VEC>(dyr + (size_t)j * VEC, dv[e]);
                if constexpr (PF)
                    if (dxr) load<VEC>(dxr + (size_t)j * VEC, ov[e]);
            }
        }
        float r;
        if (rstd) {
            r = rstd[t];
        } else {
            A ss = 0;
#pragma unroll
            for (int e = 0; e < E; e++)
                if (threadIdx.x + e * blockDim.x < nv)
#pragma unroll
                    for (int k = 0; k < VEC; k++) ss += (A)xv[e][k] * (A)xv[e][k];
            const double tot = block_sum((double)ss, sh);
            r = 1.0f / sqrtf((float)(tot / C) + eps);
        }
        A gn = 0;
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int j = threadIdx.x + e * blockDim.x;
            if (j < nv) {
                float wv[VEC];
                load<VEC>(w + (size_t)j * VEC, wv);
#pragma unroll
                for (int k = 0; k < VEC; k++)
                    gn += (A)__fmul_rn(dv[e][k], __fadd_rn(woff, wv[k])) * (A)__fmul_rn(xv[e][k], r);
            }
        }
        const float m = (float)(block_sum((double)gn, sh) / C);
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int j = threadIdx.x + e * blockDim.x;
            if (j < nv) {
                if (dxr) {
                    float wv[VEC], o[VEC];
                    load<VEC>(w + (size_t)j * VEC, wv);
                    if constexpr (PF) {
#pragma unroll
                        for (int k = 0; k < VEC; k++) o[k] = ov[e][k];
                    } else {
                        load<VEC>(dxr + (size_t)j * VEC, o);
                    }
#pragma unroll
                    for (int k = 0; k < VEC; k++) {
                        const float g = __fmul_rn(dv[e][k], __fadd_rn(woff, wv[k])), n = __fmul_rn(xv[e][k], r);
                        o[k] = __fadd_rn(o[k], __fmul_rn(r, __fsub_rn(g, __fmul_rn(n, m))));
                    }
                    store<VEC>(dxr + (size_t)j * VEC, o);
                }
#pragma unroll
                for (int k = 0; k < VEC; k++) acc[e][k] = __fadd_rn(acc[e][k], __fmul_rn(dv[e][k], __fmul_rn(xv[e][k], r)));
            }
        }
    }
    if (part) {
#pragma unroll
        for (int e = 0; e < E; e++) {
            const int j = threadIdx.x + e * blockDim.x;
            if (j < nv) store<VEC>(part + (size_t)blockIdx.x * C + (size_t)j * VEC, acc[e]);
        }
    }
}

// out[c] += sum over p = 0..P-1 of part[p, c]: 32 columns a block, 32 row
// groups (p = ty, ty + 32, ...) then the 32 group sums, each in a fixed order.
__global__ void __launch_bounds__(1024) colsum_finish_k(float *__restrict__ out, const float *__restrict__ part, int P,
                                                        int N)
{
    __shared__ float sh[32][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < N)
        for (int p = threadIdx.y; p < P; p += 32) s += part[(size_t)p * N + c];
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < N) {
        float tot = 0.0f;
#pragma unroll
        for (int i = 0; i < 32; i++) tot += sh[i][threadIdx.x];
        out[c] += tot;
    }
}

int colsum_finish(cudaStream_t s, float *out, const float *part, int P, int N)
{
    colsum_finish_k<<<blocks_for((size_t)N, 32), dim3(32, 32), 0, s>>>(out, part, P, N);
    return launched();
}

// Rows per block of the RMSNorm backward: at most `chunks` chunks for rows of 2048 elements or
// more, and chunks * 2048 / C for shorter ones. Each block walks its rows one after another (the
// dw partial's sum in row order), so the rows of a block are a chain of dependent loads: the per-head
// q/k norms (C = head_dim, T = tokens x heads: 524288 rows of 128 for a 16384-token micro-batch of
// Qwen3-30B-A3B) in 512 chunks of 1024 rows took 1.46 ms for 0.9 GB of traffic (H200, 12-06).
int rms_rows(int T, int C, int chunks)
{
    const long long n = (long long)chunks * (C < 2048 ? 2048 / (C > 0 ? C : 1) : 1);
    const long long parts = n < T ? n : T;
    return (int)((T + parts - 1) / (parts > 0 ? parts : 1));
}

// ---- RoPE ------------------------------------------------------------------------------------
// One thread per (t, VEC-wide slice of the pairs, group of heads): the VEC
// angles' sincosf once, then the heads of its group. The rotary dimensions
// are off .. off + rd - 1 of each head; pair i is (i, i + rd/2), or with IL
// (2i, 2i + 1): then a thread's VEC pairs are 2 VEC contiguous elements.

template <typename T, int VEC, bool IL>
__global__ void rope_k(T *x, const int32_t *__restrict__ pos, const float *__restrict__ inv_freq, int Tn, int nh, int D,
                       int off, int rd, float scale, int hpt, int inverse)
{
    const int half = rd / 2, nc = half / VEC, ng = (nh + hpt - 1) / hpt;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)Tn * ng * nc) return;
    const int j = (int)(idx % nc);
    const size_t rest = idx / nc;
    const int g = (int)(rest % ng);
    const size_t t = rest / ng;
    const float p = (float)pos[t];
    float c[VEC], sn[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) {
        sincosf(__fmul_rn(p, inv_freq[j * VEC + k]), &sn[k], &c[k]);
        c[k] = __fmul_rn(c[k], scale), sn[k] = __fmul_rn(sn[k], scale); // exact where scale is 1
        if (inverse) sn[k] = -sn[k];
    }
    const int h1 = min(nh, (g + 1) * hpt);
    for (int h = g * hpt; h < h1; h++) {
        T *xh = x + (t * nh + h) * (size_t)D + off + (size_t)j * VEC * (IL ? 2 : 1);
        float a[VEC], b[VEC], oa[VEC], ob[VEC];
        if constexpr (!IL) {
            load<VEC>(xh, a);
            load<VEC>(xh + half, b);
        } else if constexpr (VEC == 1) {
            load<1>(xh, a);
            load<1>(xh + 1, b);
        } else {
            float v[2 * VEC];
            load<2 * VEC>(xh, v);
#pragma unroll
            for (int k = 0; k < VEC; k++) a[k] = v[2 * k], b[k] = v[2 * k + 1];
        }
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            oa[k] = __fsub_rn(__fmul_rn(a[k], c[k]), __fmul_rn(b[k], sn[k]));
            ob[k] = __fadd_rn(__fmul_rn(b[k], c[k]), __fmul_rn(a[k], sn[k]));
        }
        if constexpr (!IL) {
            store<VEC>(xh, oa);
            store<VEC>(xh + half, ob);
        } else if constexpr (VEC == 1) {
            store<1>(xh, oa);
            store<1>(xh + 1, ob);
        } else {
            float v[2 * VEC];
#pragma unroll
            for (int k = 0; k < VEC; k++) v[2 * k] = oa[k], v[2 * k + 1] = ob[k];
            store<2 * VEC>(xh, v);
        }
    }
}

// ---- columns ----------------------------------------------------------------------------------
// One thread per (row, V-wide slice of the w columns). copy_cols moves bits
// (E: uint16_t for bf16, uint32_t for fp32; V 16 / sizeof(E) as one uint4, or
// 1); sum_cols adds its n source rows in ascending i in fp32 from 0.0f, as
// mt_cpu_sum_cols, and rounds once.

template <typename E, int V>
__global__ void copy_cols_k(E *__restrict__ dst, int dld, const E *__restrict__ src, int sld, int rows, int w, int rep)
{
    const int nc = w / V;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * nc) return;
    const size_t r = idx / nc, c = (size_t)(idx % nc) * V;
    E *d = dst + r * (size_t)dld + c;
    const E *sp = src + r / (size_t)rep * (size_t)sld + c;
    if constexpr (V == 1) *d = *sp;
    else *reinterpret_cast<uint4 *>(d) = *reinterpret_cast<const uint4 *>(sp);
}

template <typename T, int VEC>
__global__ void sum_cols_k(T *__restrict__ dst, int dld, const T *__restrict__ src, int sld, int rows, int w, int n)
{
    const int nc = w / VEC;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)rows * nc) return;
    const size_t r = idx / nc, c = (size_t)(idx % nc) * VEC;
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) acc[k] = 0.0f;
    for (int i = 0; i < n; i++) {
        float v[VEC];
        load<VEC>(src + (r * n + i) * (size_t)sld + c, v);
#pragma unroll
        for (int k = 0; k < VEC; k++) acc[k] = __fadd_rn(acc[k], v[k]);
    }
    store<VEC>(dst + r * (size_t)dld + c, acc);
}

// ---- elementwise -------------------------------------------------------------------------------
// Thread i < n / VEC handles elements [i VEC, i VEC + VEC); thread n / VEC the tail.

template <int VEC, typename F> __global__ void ew_k(F f, size_t n)
{
    const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x, nv = n / VEC;
    if (i < nv) {
        f.template apply<VEC>(i * VEC);
    } else if (VEC > 1 && i == nv) {
        for (size_t k = nv * VEC; k < n; k++) f.template apply<1>(k);
    }
}

template <typename F> int launch_ew(cudaStream_t s, const F &f, size_t n, bool vec)
{
    if (n == 0) return 0;
    if (vec) ew_k<8><<<blocks_for(n / 8 + 1, 256), 256, 0, s>>>(f, n);
    else ew_k<1><<<blocks_for(n, 256), 256, 0, s>>>(f, n);
    return launched();
}

template <typename TY, typename TX> struct convert_f {
    TY *y;
    const TX *x;
    template <int W> __device__ void apply(size_t i) const
    {
        float v[W];
        load<W>(x + i, v);
        store<W>(y + i, v);
    }
};

// The lean mode's weight codes, in place: int16 q becomes bf16(q * scale[i / 256]) (optim/q16.h: q * scale
// is exact, one rounding to bf16). An element's code and value share its two bytes, read and written by one
// thread.
struct q16_to_bf16_f {
    void *data;
    const float *scale;
    template <int W> __device__ void apply(size_t i) const
    {
        const int16_t *q = (const int16_t *)data + i;
        float v[W];
#pragma unroll
        for (int k = 0; k < W; k++) v[k] = __fmul_rn((float)q[k], scale[(i + k) / 256]);
        store<W>((bf16 *)data + i, v);
    }
};

template <typename TY, typename TA, typename TB> struct add_f {
    TY *y;
    const TA *a;
    const TB *b;
    template <int W> __device__ void apply(size_t i) const
    {
        float va[W], vb[W];
        load<W>(a + i, va);
        load<W>(b + i, vb);
#pragma unroll
        for (int k = 0; k < W; k++) va[k] = __fadd_rn(va[k], vb[k]);
        store<W>(y + i, va);
    }
};

template <typename T> struct scale_f {
    T *x;
    float alpha;
    template <int W> __device__ void apply(size_t i) const
    {
        float v[W];
        load<W>(x + i, v);
#pragma unroll
        for (int k = 0; k < W; k++) v[k] = __fmul_rn(v[k], alpha);
        store<W>(x + i, v);
    }
};

// exp(-g): full accuracy in fp32 mode; in bf16 mode the fast exponential and
// division (errors of a few fp32 ulp, far below bf16's rounding).
template <typename T> __device__ __forceinline__ float exp_neg(float g)
{
    if constexpr (is_bf16<T>) return __expf(-g);
    else return expf(-g);
}
template <typename T> __device__ __forceinline__ float div_(float a, float b)
{
    if constexpr (is_bf16<T>) return __fdividef(a, b);
    else return __fdiv_rn(a, b);
}

// The gated MLP's activations, each with the value (f) and, for the
// backward, the value and derivative (df) in the CPU's order of operations.
// SiLU: g / (1 + exp(-g)); its derivative from s = sigmoid(g):
// s (1 + g (1 - s)), its value there g s.
struct silu_act {
    template <typename T> __device__ __forceinline__ static float f(float g)
    {
        return div_<T>(g, __fadd_rn(1.0f, exp_neg<T>(g)));
    }
    template <typename T> __device__ __forceinline__ static void df(float g, float *a, float *da)
    {
        const float s = div_<T>(1.0f, __fadd_rn(1.0f, exp_neg<T>(g)));
        *da = __fmul_rn(s, __fadd_rn(1.0f, __fmul_rn(g, __fsub_rn(1.0f, s))));
        *a = __fmul_rn(g, s);
    }
};

// GeLU, its tanh form (mt_cpu_glu): t = tanh(k0 (g + k1 g g g)),
// gelu = 0.5 g (1 + t), gelu' = 0.5 (1 + t) + 0.5 g (1 - t^2) k0 (1 + 3 k1 g^2).
// tanhf in both dtypes (no fast tanh: its error is near bf16's half ulp).
constexpr float GELU_K0 = 0.7978845608028654f; // sqrt(2 / pi)
constexpr float GELU_K1 = 0.044715f;

__device__ __forceinline__ float gelu_t(float g)
{
    return tanhf(__fmul_rn(GELU_K0, __fadd_rn(g, __fmul_rn(__fmul_rn(__fmul_rn(GELU_K1, g), g), g))));
}

struct gelu_tanh_act {
    template <typename T> __device__ __forceinline__ static float f(float g)
    {
        return __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, gelu_t(g)));
    }
    template <typename T> __device__ __forceinline__ static void df(float g, float *a, float *da)
    {
        const float t = gelu_t(g);
        *a = __fmul_rn(__fmul_rn(0.5f, g), __fadd_rn(1.0f, t));
        const float b = __fmul_rn(__fmul_rn(__fmul_rn(__fmul_rn(0.5f, g), __fsub_rn(1.0f, __fmul_rn(t, t))), GELU_K0),
                                  __fadd_rn(1.0f, __fmul_rn(__fmul_rn(3.0f * GELU_K1, g), g)));
        *da = __fadd_rn(__fmul_rn(0.5f, __fadd_rn(1.0f, t)), b);
    }
};

// out = act(g) u
template <typename T, typename Act> struct glu_f {
    T *out;
    const T *gate, *up;
    template <int W> __device__ void apply(size_t i) const
    {
        float g[W], u[W];
        load<W>(gate + i, g);
        load<W>(up + i, u);
#pragma unroll
        for (int k = 0; k < W; k++) g[k] = __fmul_rn(Act::template f<T>(g[k]), u[k]);
        store<W>(out + i, g);
    }
};

// dgate = d u act'(g), dup = d act(g)
template <typename T, typename Act> struct glu_bwd_f {
    T *dgate, *dup;
    const T *dout, *gate, *up;
    template <int W> __device__ void apply(size_t i) const
    {
        float g[W], u[W], d[W], dg[W], du[W];
        load<W>(gate + i, g);
        load<W>(up + i, u);
        load<W>(dout + i, d);
#pragma unroll
        for (int k = 0; k < W; k++) {
            float a, da;
            Act::template df<T>(g[k], &a, &da);
            dg[k] = __fmul_rn(__fmul_rn(d[k], u[k]), da);
            du[k] = __fmul_rn(d[k], a);
        }
        store<W>(dgate + i, dg);
        store<W>(dup + i, du);
    }
};

// GPT-OSS's clamped SwiGLU (mt_cpu_glu's MT_GLU_GPTOSS), which clamps up as
// well as gate and so has functors of its own: g = min(gate, L),
// u = clamp(up, -L, L), s = sigmoid(alpha g) from exp_neg and div_ as
// silu_act's, out = (u + 1) (g s). fminf / fmaxf as the CPU's: a NaN input
// becomes the bound on both sides.
template <typename T> __device__ __forceinline__ float gptoss_sigmoid(float g)
{
    return div_<T>(1.0f, __fadd_rn(1.0f, exp_neg<T>(__fmul_rn(g, MT_GPTOSS_ALPHA))));
}

__device__ __forceinline__ float gptoss_up(float u) { return fminf(fmaxf(u, -MT_GPTOSS_LIMIT), MT_GPTOSS_LIMIT); }

template <typename T> struct gptoss_glu_f {
    T *out;
    const T *gate, *up;
    template <int W> __device__ void apply(size_t i) const
    {
        float g[W], u[W];
        load<W>(gate + i, g);
        load<W>(up + i, u);
#pragma unroll
        for (int k = 0; k < W; k++) {
            const float gc = fminf(g[k], MT_GPTOSS_LIMIT);
            g[k] = __fmul_rn(__fadd_rn(gptoss_up(u[k]), 1.0f), __fmul_rn(gc, gptoss_sigmoid<T>(gc)));
        }
        store<W>(out + i, g);
    }
};

// dgate = d (u + 1) (s + alpha g s (1 - s)) where gate <= L, dup = d g s
// where -L <= up <= L, else 0 (torch.clamp's gradient, ends included).
template <typename T> struct gptoss_glu_bwd_f {
    T *dgate, *dup;
    const T *dout, *gate, *up;
    template <int W> __device__ void apply(size_t i) const
    {
        float g[W], u[W], d[W], dg[W], du[W];
        load<W>(gate + i, g);
        load<W>(up + i, u);
        load<W>(dout + i, d);
#pragma unroll
        for (int k = 0; k < W; k++) {
            const float gc = fminf(g[k], MT_GPTOSS_LIMIT), s = gptoss_sigmoid<T>(gc);
            const float da =
                __fadd_rn(s, __fmul_rn(__fmul_rn(__fmul_rn(MT_GPTOSS_ALPHA, gc), s), __fsub_rn(1.0f, s)));
            dg[k] = g[k] <= MT_GPTOSS_LIMIT ? __fmul_rn(__fmul_rn(d[k], __fadd_rn(gptoss_up(u[k]), 1.0f)), da) : 0.0f;
            du[k] = u[k] >= -MT_GPTOSS_LIMIT && u[k] <= MT_GPTOSS_LIMIT ? __fmul_rn(d[k], __fmul_rn(gc, s)) : 0.0f;
        }
        store<W>(dgate + i, dg);
        store<W>(dup + i, du);
    }
};

// The soft-cap of the returned logits: x = tanh(x / cap) cap (mt_cpu_softcap).
struct softcap_f {
    float *x;
    float cap;
    template <int W> __device__ void apply(size_t i) const
    {
        float v[W];
        load<W>(x + i, v);
#pragma unroll
        for (int k = 0; k < W; k++) v[k] = __fmul_rn(tanhf(__fdiv_rn(v[k], cap)), cap);
        store<W>(x + i, v);
    }
};

// ---- attention sinks ------------------------------------------------------------------------------
// A row is one (b, s, h): out's D contiguous elements (rows in (b, s, h)
// order) and lse[b, h, s]. A group of P lanes (P a power of two, the row's
// VEC-wide accesses up to 32) takes a row, lane j of it the accesses j,
// j + P, ...; a warp takes 32 / P rows at a time. Every lane of a warp runs
// the same iterations, so the group shuffles use the full mask. The per-row
// scalars (the sink's share, the new lse, the weights of the backward) are
// in double, as the CPU's, so that in fp32 mode r and lse round to the
// CPU's floats but where the two libraries' exp / log1p differ across a
// rounding boundary.

constexpr int SINK_THREADS = 256;
constexpr int SINK_BWD_THREADS = 512;
constexpr int SINK_BWD_CLUSTER = 8; // blocks per head in the backward (the portable cluster size)

// Lanes per row for nv accesses: the power of two >= nv, at most 32.
int sink_lanes(int nv)
{
    int P = 1;
    while (P < nv && P < 32) P *= 2;
    return P;
}

// r = 1 / (1 + exp(k - a)) and log(exp(a) + exp(k)) from e = exp(-|k - a|) <= 1,
// so that neither overflows (a = -inf gives r = 0 and lse = k; k = -inf, r = 1).
__device__ __forceinline__ void sink_row(double a, double k, float *r, float *lse)
{
    const double e = exp(-fabs(k - a));
    *r = (float)(k <= a ? 1.0 / (1.0 + e) : e / (1.0 + e));
    *lse = (float)(fmax(a, k) + log1p(e));
}

// out *= r (one fp32 product, rounded once to T) and lse updated, one row per group.
template <typename T, int VEC>
__global__ void __launch_bounds__(SINK_THREADS) attn_sink_k(T *__restrict__ out, float *__restrict__ lse,
                                                            const T *__restrict__ sinks, size_t rows, int S, int H,
                                                            int D, int P)
{
    const int lane = threadIdx.x & 31, j0 = lane & (P - 1), nv = D / VEC;
    const size_t first = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32 * (32 / P);
    if (first >= rows) return; // the whole warp
    const size_t row = first + lane / P;
    float r = 0.0f;
    if (row < rows && j0 == 0) {
        const size_t t = row / H;
        const int h = (int)(row % H);
        float k[1];
        load<1>(sinks + h, k);
        float *l = lse + ((t / S) * H + h) * S + t % S;
        sink_row(*l, k[0], &r, l);
    }
    r = __shfl_sync(0xffffffffu, r, 0, P);
    if (row >= rows) return;
    T *o = out + row * D;
    for (int j = j0; j < nv; j += P) {
        float v[VEC];
        load<VEC>(o + (size_t)j * VEC, v);
#pragma unroll
        for (int k = 0; k < VEC; k++) v[k] = __fmul_rn(v[k], r);
        store<VEC>(o + (size_t)j * VEC, v);
    }
}

// One cluster of SINK_BWD_CLUSTER blocks per head h (a single block per
// head left most of the device idle; on an H100, bf16, 8 heads of 256 moved
// 94 GB/s that way and 730 GB/s so, GPT-OSS's 64 heads of 64 0.8 and
// 1.8 TB/s). Its
// rows t = b S + s in a fixed assignment: warp w of the cluster (block rank
// times warps per block plus the warp) takes t = (w + i W) 32/P + lane / P for
// i = 0, 1, ..., W the cluster's warps; each row's dot product of dout and
// out in fp32 (the group's lanes, then a butterfly over them), the leader's
// exp(sink - lse) dot summed in double in ascending i, then a block sum; rank
// 0 adds the blocks' sums in rank order (distributed shared memory) and
// stores dsink[h] - that. No atomics.
template <typename T, int VEC>
__global__ void __cluster_dims__(SINK_BWD_CLUSTER, 1, 1) __launch_bounds__(SINK_BWD_THREADS)
    attn_sink_bwd_k(float *__restrict__ dsink, const T *__restrict__ dout, const T *__restrict__ out,
                    const float *__restrict__ lse, const T *__restrict__ sinks, size_t BS, int S, int H, int D, int P)
{
    __shared__ double sh[32];
    __shared__ double blk;
    cg::cluster_group cluster = cg::this_cluster();
    const int rank = (int)cluster.block_rank(), h = blockIdx.x / SINK_BWD_CLUSTER;
    const int lane = threadIdx.x & 31, j0 = lane & (P - 1), nv = D / VEC, rpw = 32 / P, nw = blockDim.x / 32;
    float kf[1];
    load<1>(sinks + h, kf);
    const double k = kf[0];
    double acc = 0.0;
    const size_t step = (size_t)SINK_BWD_CLUSTER * nw * rpw;
    for (size_t t0 = (size_t)(rank * nw + threadIdx.x / 32) * rpw; t0 < BS; t0 += step) {
        const size_t t = t0 + lane / P;
        float dot = 0.0f;
        if (t < BS) {
            const size_t o = (t * H + h) * D;
            for (int j = j0; j < nv; j += P) {
                float a[VEC], b[VEC];
                load<VEC>(dout + o + (size_t)j * VEC, a);
                load<VEC>(out + o + (size_t)j * VEC, b);
#pragma unroll
                for (int q = 0; q < VEC; q++) dot = __fmaf_rn(a[q], b[q], dot);
            }
        }
        for (int m = P / 2; m > 0; m >>= 1) dot = __fadd_rn(dot, __shfl_xor_sync(0xffffffffu, dot, m));
        if (t < BS && j0 == 0) acc += exp(k - (double)lse[((t / S) * H + h) * S + t % S]) * (double)dot;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) blk = acc;
    cluster.sync(); // every block's sum is visible
    if (rank == 0 && threadIdx.x == 0) {
        double sum = 0.0;
        for (int q = 0; q < SINK_BWD_CLUSTER; q++) sum += *cluster.map_shared_rank(&blk, q);
        dsink[h] = __fsub_rn(dsink[h], (float)sum);
    }
    cluster.sync(); // no block leaves while rank 0 still reads its shared memory
}

// ---- attention temperature (Llama 4) -----------------------------------------------------------------
// One thread per (row, VEC-wide slice of the row): the row's factor by mt_cpu_attn_temperature_factor's
// steps, each rounding spelt out (log1p in double, rounded once: the correctly rounded log1pf, as the
// CPU's), then VEC products rounded once to T.

__device__ __forceinline__ float temperature_factor(int i, float floor_scale, float scale)
{
    const float p = __fadd_rn((float)i, 1.0f), q = floorf(__fdiv_rn(p, floor_scale));
    const float l = __double2float_rn(log1p((double)q));
    return __fadd_rn(__fmul_rn(l, scale), 1.0f);
}

template <typename T, int VEC>
__global__ void attn_temperature_k(T *x, int Tn, int seq_len, int n, float floor_scale, float scale)
{
    const int nc = n / VEC;
    const size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= (size_t)Tn * nc) return;
    const size_t t = idx / nc, c = (size_t)(idx % nc) * VEC;
    const float f = temperature_factor((int)(t % (size_t)seq_len), floor_scale, scale);
    T *xr = x + t * (size_t)n + c;
    float v[VEC];
    load<VEC>(xr, v);
#pragma unroll
    for (int k = 0; k < VEC; k++) v[k] = __fmul_rn(v[k], f);
    store<VEC>(xr, v);
}

// ---- embedding -----------------------------------------------------------------------------------

template <typename TO, typename TW, int VEC>
__global__ void embedding_k(TO *__restrict__ out, const int32_t *__restrict__ tok, const TW *__restrict__ wte, int C,
                            int V, float scale)
{
    const size_t t = blockIdx.x;
    const int id = tok[t], nv = C / VEC;
    const bool ok = id >= 0 && id < V;
    for (int j = threadIdx.x; j < nv; j += blockDim.x) {
        float v[VEC];
        if (ok) {
            load<VEC>(wte + (size_t)id * C + (size_t)j * VEC, v);
#pragma unroll
            for (int k = 0; k < VEC; k++) v[k] = __fmul_rn(v[k], scale); // x 1 is exact
        } else {
#pragma unroll
            for (int k = 0; k < VEC; k++) v[k] = 0.0f;
        }
        store<VEC>(out + t * C + (size_t)j * VEC, v);
    }
}

// Sort keys: the token, or V for one outside [0, V) or the padding row pad
// (skipped: nn.Embedding's padding_idx); values: t.
__global__ void embed_keys_k(unsigned *__restrict__ keys, int *__restrict__ vals, const int32_t *__restrict__ tok, int T,
                             int V, int pad)
{
    const int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= T) return;
    const int id = tok[t];
    keys[t] = id >= 0 && id < V && id != pad ? (unsigned)id : (unsigned)V;
    vals[t] = t;
}

// Block (i, y): if sorted position i starts a run of one token, columns
// [y * blockDim * VEC, ...) of that token's row: dwte += dout[t] * scale for the
// run's t in ascending order (the radix sort is stable).
template <int VEC>
__global__ void embedding_bwd_k(float *__restrict__ dwte, const unsigned *__restrict__ keys,
                                const int *__restrict__ vals, const float *__restrict__ dout, int T, int C, int V,
                                float scale)
{
    const int i = blockIdx.x;
    const unsigned key = keys[i];
    if (key >= (unsigned)V || (i > 0 && keys[i - 1] == key)) return;
    const int nv = C / VEC, j = blockIdx.y * blockDim.x + threadIdx.x;
    if (j >= nv) return;
    float *dst = dwte + (size_t)key * C + (size_t)j * VEC;
    float acc[VEC];
    load<VEC>(dst, acc);
    for (int q = i; q < T && keys[q] == key; q++) {
        float d[VEC];
        load<VEC>(dout + (size_t)vals[q] * C + (size_t)j * VEC, d);
#pragma unroll
        for (int k = 0; k < VEC; k++) acc[k] = __fadd_rn(acc[k], __fmul_rn(d[k], scale)); // x 1 is exact
    }
    store<VEC>(dst, acc);
}

int key_bits(int V) // bits that hold 0..V
{
    int b = 1;
    while (b < 32 && ((unsigned)V >> b) != 0) b++;
    return b;
}

// The scratch of the embedding backward: keys and values in and out (T each,
// 256-byte aligned), then CUB's temporary storage.
size_t embed_temp_bytes(int T, int end_bit)
{
    size_t bytes = 0;
    if (cub::DeviceRadixSort::SortPairs(nullptr, bytes, (const unsigned *)nullptr, (unsigned *)nullptr,
                                        (const int *)nullptr, (int *)nullptr, T, 0, end_bit) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return bytes;
}

// ---- cross-entropy ------------------------------------------------------------------------------------

constexpr int CE_MAX_THREADS = 1024;
constexpr int CE_UNROLL = 4;

// A soft-capped logit, as the CPU: tanh(x / cap) * cap (Gemma 2's final_logit_softcapping).
__device__ __forceinline__ float cap_logit(float x, float cap) { return __fmul_rn(tanhf(__fdiv_rn(x, cap)), cap); }

// One row: per thread an online (max, sum of exp) over its vectors, combined
// over the block in double; then dlogits = exp(x - M) * (dscale / S) - dscale
// at the target. row_loss[r] = M + log S - x[target] (0 for skipped rows).
// CAP: every logit read is first capped (cap_logit), in both passes, and the
// gradient is multiplied by 1 - (c / cap)^2; without it the kernel compiles
// as if the cap did not exist.
template <typename TD, int VEC, bool CAP>
__global__ void __launch_bounds__(CE_MAX_THREADS) ce_k(const float *logits, const int32_t *__restrict__ targets, int V,
                                                      float dscale, float cap, int ignore_index, TD *dl,
                                                      double *__restrict__ row_loss, int *__restrict__ row_ok, int reverse)
{
    __shared__ double shd[32];
    __shared__ float shf[32];
    const size_t r = blockIdx.x;
    const float *x = logits + r * V;
    TD *d = dl ? dl + r * V : nullptr;
    const int tgt = targets[r], nv = V / VEC;
    if (tgt == ignore_index || tgt < 0 || tgt >= V) {
        if (d) {
            float z[VEC];
#pragma unroll
            for (int k = 0; k < VEC; k++) z[k] = 0.0f;
            for (int j = threadIdx.x; j < nv; j += blockDim.x) store<VEC>(d + (size_t)j * VEC, z);
        }
        if (threadIdx.x == 0) row_loss[r] = 0.0, row_ok[r] = 0;
        return;
    }
    float m = -INFINITY;
    double s = 0.0;
    for (int j0 = threadIdx.x; j0 < nv; j0 += CE_UNROLL * blockDim.x) {
        float v[CE_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) {
            const int j = j0 + u * blockDim.x;
            if (j < nv) {
                load<VEC>(x + (size_t)j * VEC, v[u]);
                if constexpr (CAP)
#pragma unroll
                    for (int k = 0; k < VEC; k++) v[u][k] = cap_logit(v[u][k], cap);
            } else {
#pragma unroll
                for (int k = 0; k < VEC; k++) v[u][k] = -INFINITY;
            }
        }
        float mv = m;
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++)
#pragma unroll
            for (int k = 0; k < VEC; k++) mv = fmaxf(mv, v[u][k]);
        if (mv > m) {
            s *= (double)expf(m - mv); // m = -inf at first: exp = 0
            m = mv;
        }
        float part = 0.0f; // at most CE_UNROLL * VEC = 16 terms of at most 1
        for (int u = 0; u < CE_UNROLL; u++)
#pragma unroll
            for (int k = 0; k < VEC; k++) part += expf(v[u][k] - m); // exp(-inf) = 0 past the end
        s += (double)part;
    }
    const float M = block_max(m, shf);
    float xt = x[tgt]; // read before any thread overwrites the row (in place)
    if constexpr (CAP) xt = cap_logit(xt, cap);
    const double S = block_sum(m == -INFINITY ? 0.0 : s * exp((double)m - (double)M), shd);
    if (threadIdx.x == 0) {
        row_loss[r] = (double)M + log(S) - (double)xt;
        row_ok[r] = 1;
    }
    if (!d) return;
    const float f = (float)((double)dscale / S);
    // reverse: back to front, so that the row's end, read last by the first
    // pass, is read again while it may still be in L2
    const int j0 = reverse ? nv - 1 - (int)threadIdx.x : (int)threadIdx.x, dj = reverse ? -(int)blockDim.x : blockDim.x;
    for (int j = j0; j >= 0 && j < nv; j += dj) {
        float v[VEC];
        load<VEC>(x + (size_t)j * VEC, v);
        if constexpr (CAP) {
#pragma unroll
            for (int k = 0; k < VEC; k++) { // (softmax - onehot) dscale (1 - t^2), t = c / cap
                const float c = cap_logit(v[k], cap), t = __fdiv_rn(c, cap);
                v[k] = __fmul_rn(expf(c - M), f);
                if (j * VEC + k == tgt) v[k] = __fsub_rn(v[k], dscale);
                v[k] = __fmul_rn(v[k], __fsub_rn(1.0f, __fmul_rn(t, t)));
            }
        } else {
#pragma unroll
            for (int k = 0; k < VEC; k++) {
                v[k] = __fmul_rn(expf(v[k] - M), f);
                if (j * VEC + k == tgt) v[k] = __fsub_rn(v[k], dscale);
            }
        }
        store<VEC>(d + (size_t)j * VEC, v);
    }
}

// The same on a thread-block cluster of CL blocks per row (CL = the
// cluster's size): each block keeps its slice of the row (float4s) in shared
// memory, so the logits are read from memory once; the blocks' (max, sum)
// pairs are combined through distributed shared memory in rank order (every
// block computes the same M and S). Needs V % 4 == 0 and 16-byte alignment.
__global__ void __launch_bounds__(CE_MAX_THREADS) ce_cluster_k(const float *logits, const int32_t *__restrict__ targets,
                                                              int V, float dscale, int ignore_index, void *dl_,
                                                              int dl_bf16, double *__restrict__ row_loss,
                                                              int *__restrict__ row_ok)
{
    extern __shared__ float4 slice[];
    __shared__ double shd[32];
    __shared__ float shf[32];
    __shared__ float blk_m;
    __shared__ double blk_s;
    cg::cluster_group cluster = cg::this_cluster();
    const int CL = (int)cluster.num_blocks(), rank = (int)cluster.block_rank();
    const size_t r = blockIdx.x / CL;
    const int nv = V / 4, per = (nv + CL - 1) / CL, j0 = rank * per, j1 = min(nv, j0 + per), ns = max(0, j1 - j0);
    const float4 *x = reinterpret_cast<const float4 *>(logits + r * V) + j0;
    const int tgt = targets[r];
    auto put = [&](int j, const float (&v)[4]) { // dl[r, 4 (j0 + j) ...]
        if (dl_bf16) store<4>((bf16 *)dl_ + r * V + (size_t)(j0 + j) * 4, v);
        else store<4>((float *)dl_ + r * V + (size_t)(j0 + j) * 4, v);
    };
    if (tgt == ignore_index || tgt < 0 || tgt >= V) { // the same in every block of the cluster
        if (dl_) {
            const float z[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int j = threadIdx.x; j < ns; j += blockDim.x) put(j, z);
        }
        if (rank == 0 && threadIdx.x == 0) row_loss[r] = 0.0, row_ok[r] = 0;
        return;
    }
    const float xt = logits[r * V + tgt]; // before any block writes the row (in place)
    float m = -INFINITY;
    double s = 0.0;
    for (int jb = threadIdx.x; jb < ns; jb += CE_UNROLL * blockDim.x) {
        float v[CE_UNROLL][4];
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++) {
            const int j = jb + u * blockDim.x;
            if (j < ns) {
                const float4 a = x[j];
                slice[j] = a;
                v[u][0] = a.x, v[u][1] = a.y, v[u][2] = a.z, v[u][3] = a.w;
            } else {
#pragma unroll
                for (int k = 0; k < 4; k++) v[u][k] = -INFINITY;
            }
        }
        float mv = m;
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++)
#pragma unroll
            for (int k = 0; k < 4; k++) mv = fmaxf(mv, v[u][k]);
        if (mv > m) {
            s *= (double)expf(m - mv);
            m = mv;
        }
        float part = 0.0f;
#pragma unroll
        for (int u = 0; u < CE_UNROLL; u++)
#pragma unroll
            for (int k = 0; k < 4; k++) part += expf(v[u][k] - m);
        s += (double)part;
    }
    const float Mb = block_max(m, shf);
    const double Sb = block_sum(m == -INFINITY ? 0.0 : s * exp((double)m - (double)Mb), shd);
    if (threadIdx.x == 0) blk_m = Mb, blk_s = Sb;
    cluster.sync(); // every block's (M, S) is visible, and every block has read x[tgt]
    float M = -INFINITY;
    for (int q = 0; q < CL; q++) M = fmaxf(M, *cluster.map_shared_rank(&blk_m, q));
    double S = 0.0;
    for (int q = 0; q < CL; q++) {
        const float mq = *cluster.map_shared_rank(&blk_m, q);
        if (mq != -INFINITY) S += *cluster.map_shared_rank(&blk_s, q) * exp((double)mq - (double)M);
    }
    cluster.sync(); // no block leaves while another still reads its shared memory
    if (rank == 0 && threadIdx.x == 0) {
        row_loss[r] = (double)M + log(S) - (double)xt;
        row_ok[r] = 1;
    }
    if (!dl_) return;
    const float f = (float)((double)dscale / S);
    for (int j = threadIdx.x; j < ns; j += blockDim.x) {
        const float4 a = slice[j];
        float v[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[k] = __fmul_rn(expf(v[k] - M), f);
            if ((j0 + j) * 4 + k == tgt) v[k] = __fsub_rn(v[k], dscale);
        }
        put(j, v);
    }
}

// Blocks per row of the cluster variant: the fewest (a power of 2 up to 8)
// whose slices fit CE_SLICE_MAX bytes of shared memory; 0 when none does.
constexpr int CE_SLICE_MAX = 96 * 1024;
int ce_cluster_size(int V)
{
    const int nv = V / 4;
    for (int cl = 1; cl <= 8; cl *= 2)
        if ((size_t)((nv + cl - 1) / cl) * 16 <= CE_SLICE_MAX) return cl;
    return 0;
}

__global__ void __launch_bounds__(1024) ce_finish_k(const double *__restrict__ row_loss, const int *__restrict__ row_ok,
                                                    int n, double *loss_sum, int *count)
{
    __shared__ double shd[32];
    __shared__ int shi[32];
    double s = 0.0;
    int c = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += row_loss[i], c += row_ok[i];
    s = block_sum(s, shd);
    c = block_sum(c, shi);
    if (threadIdx.x == 0) {
        if (loss_sum) *loss_sum += s;
        if (count) *count += c;
    }
}

// ---- sum of squares ----------------------------------------------------------------------------------------

constexpr int SUMSQ_THREADS = 256;
constexpr int SUMSQ_MAX_BLOCKS = 1024;
constexpr int SUMSQ_UNROLL = 4;

int sumsq_blocks(size_t n)
{
    const size_t b = (n + (size_t)SUMSQ_THREADS * 64 - 1) / ((size_t)SUMSQ_THREADS * 64);
    return b < 1 ? 1 : b > SUMSQ_MAX_BLOCKS ? SUMSQ_MAX_BLOCKS : (int)b;
}

// Thread (b, i) sums vectors j = b * blockDim + i + k * stride; the leftover
// elements go to thread (0, 0); per-block partials in part[b].
template <int VEC> __global__ void __launch_bounds__(SUMSQ_THREADS) sumsq_k(const float *__restrict__ x, size_t n,
                                                                          double *__restrict__ part)
{
    __shared__ double sh[32];
    const size_t nv = n / VEC, stride = (size_t)gridDim.x * blockDim.x;
    size_t j = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    double acc = 0.0;
    for (; j + (SUMSQ_UNROLL - 1) * stride < nv; j += SUMSQ_UNROLL * stride) {
        float v[SUMSQ_UNROLL][VEC];
#pragma unroll
        for (int u = 0; u < SUMSQ_UNROLL; u++) load<VEC>(x + (j + u * stride) * VEC, v[u]);
#pragma unroll
        for (int u = 0; u < SUMSQ_UNROLL; u++)
#pragma unroll
            for (int k = 0; k < VEC; k++) acc = fma((double)v[u][k], (double)v[u][k], acc);
    }
    for (; j < nv; j += stride) {
        float v[VEC];
        load<VEC>(x + j * VEC, v);
#pragma unroll
        for (int k = 0; k < VEC; k++) acc = fma((double)v[k], (double)v[k], acc);
    }
    if (blockIdx.x == 0 && threadIdx.x == 0)
        for (size_t i = nv * VEC; i < n; i++) acc = fma((double)x[i], (double)x[i], acc);
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(SUMSQ_MAX_BLOCKS) sumsq_finish_k(double *out, const double *__restrict__ part, int G)
{
    __shared__ double sh[32];
    const double v = block_sum(threadIdx.x < (unsigned)G ? part[threadIdx.x] : 0.0, sh);
    if (threadIdx.x == 0) *out += v;
}

// ---- bias gradient --------------------------------------------------------------------------------------------
// Column partials: block (x, p) sums rows [p R, p R + R) of its columns.

constexpr int BIAS_THREADS = 256;

template <typename T, int VEC>
__global__ void __launch_bounds__(BIAS_THREADS) colsum_part_k(float *__restrict__ part, const T *__restrict__ dy, int Tn,
                                                              int N, int R)
{
    const int nv = N / VEC, j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= nv) return;
    const int p = blockIdx.y, t0 = p * R, t1 = min(Tn, t0 + R);
    float acc[VEC];
#pragma unroll
    for (int k = 0; k < VEC; k++) acc[k] = 0.0f;
#pragma unroll 4
    for (int t = t0; t < t1; t++) {
        float v[VEC];
        load<VEC>(dy + (size_t)t * N + (size_t)j * VEC, v);
#pragma unroll
        for (int k = 0; k < VEC; k++) acc[k] = __fadd_rn(acc[k], v[k]);
    }
    store<VEC>(part + (size_t)p * N + (size_t)j * VEC, acc);
}

// Rows per chunk from the shapes alone (not the vector width): about 1024
// blocks over the column blocks of an 8-wide pass, at most 65535 chunks.
int bias_rows(int T, int N)
{
    const int cb = (N + BIAS_THREADS * 8 - 1) / (BIAS_THREADS * 8);
    int P = (1024 + cb - 1) / cb;
    if (P > T) P = T;
    if (P < 1) P = 1;
    int R = (T + P - 1) / P;
    while ((T + R - 1) / R > 65535) R++;
    return R;
}

// ---- tuning: the checks ------------------------------------------------------------------------

// Whether mt_cu_tuning_set accepts value for knob (a flag takes any value: nonzero is 1).
bool knob_ok(mt_cu_knob knob, int value)
{
    switch (knob) {
    case MT_CU_TUNE_DEFAULTS: return true;
    case MT_CU_TUNE_RMS_FWD_EMIN:
    case MT_CU_TUNE_RMS_BWD_EMIN: return value == 1 || value == 2 || value == 4;
    case MT_CU_TUNE_RMS_BWD_PREFETCH:
    case MT_CU_TUNE_CE_REVERSE:
    case MT_CU_TUNE_CE_CLUSTER: return true;
    case MT_CU_TUNE_RMS_BWD_CHUNKS: return value >= 1;
    case MT_CU_TUNE_CE_THREADS: return value >= 32 && value <= CE_MAX_THREADS && value % 32 == 0;
    case MT_CU_TUNE_CE_SMEM: return value >= 0 && value <= 200 * 1024;
    }
    return false;
}

// The tuning a launcher runs with: the defaults for NULL; NULL when a field
// holds a value mt_cu_tuning_set would refuse (the launcher then fails).
const mt_cu_tuning *tuning_for(const mt_cu_tuning *t)
{
    if (!t) return &TUNING_DEFAULT;
    const bool ok = knob_ok(MT_CU_TUNE_RMS_FWD_EMIN, t->rms_fwd_emin) &&
                    knob_ok(MT_CU_TUNE_RMS_BWD_EMIN, t->rms_bwd_emin) &&
                    knob_ok(MT_CU_TUNE_RMS_BWD_CHUNKS, t->rms_bwd_chunks) &&
                    knob_ok(MT_CU_TUNE_CE_THREADS, t->ce_threads) && knob_ok(MT_CU_TUNE_CE_SMEM, t->ce_smem);
    return ok ? t : nullptr;
}

} // namespace

// ======================================== the C API ========================================

extern "C" {

size_t mt_cu_dtype_size(mt_cu_dtype dt) { return dt == MT_CU_BF16 ? 2 : 4; }

void mt_cu_tuning_default(mt_cu_tuning *t)
{
    if (t) *t = TUNING_DEFAULT;
}

int mt_cu_tuning_set(mt_cu_tuning *t, mt_cu_knob knob, int value)
{
    if (!t || !knob_ok(knob, value)) return -1;
    switch (knob) {
    case MT_CU_TUNE_DEFAULTS: *t = TUNING_DEFAULT; return 0;
    case MT_CU_TUNE_RMS_FWD_EMIN: t->rms_fwd_emin = value; return 0;
    case MT_CU_TUNE_RMS_BWD_EMIN: t->rms_bwd_emin = value; return 0;
    case MT_CU_TUNE_RMS_BWD_PREFETCH: t->rms_bwd_prefetch = value != 0; return 0;
    case MT_CU_TUNE_RMS_BWD_CHUNKS: t->rms_bwd_chunks = value; return 0;
    case MT_CU_TUNE_CE_THREADS: t->ce_threads = value; return 0;
    case MT_CU_TUNE_CE_SMEM: t->ce_smem = value; return 0;
    case MT_CU_TUNE_CE_REVERSE: t->ce_reverse = value != 0; return 0;
    case MT_CU_TUNE_CE_CLUSTER: t->ce_cluster = value != 0; return 0;
    }
    return -1;
}

// ---- RMSNorm ----

int mt_cu_rmsnorm(mt_cu_stream s, mt_cu_dtype dt, void *y, float *rstd, mt_cu_dtype xdt, const void *x,
                  const void *w, int T, int C, float eps, float woff, const mt_cu_tuning *tune)
{
    const mt_cu_tuning *tu = tuning_for(tune);
    if (!tu || T < 0 || C <= 0) return -1;
    if (T == 0) return 0;
    const bool vec = C % 8 == 0 && al16(x) && al16(y) && al16(w);
    return with_dtype(xdt, [&](auto tx) {
        using TX = typename decltype(tx)::type;
        return with_dtype(dt, [&](auto tw) {
            using TW = typename decltype(tw)::type;
            TW *yy = (TW *)y;
            const TX *xx = (const TX *)x;
            const TW *ww = (const TW *)w;
            auto go = [&](auto vtag) {
                constexpr int VEC = decltype(vtag)::value;
                return with_row_cfg<VEC>(C, tu->rms_fwd_emin, [&](auto etag, int threads) {
                    rmsnorm_fwd_k<TX, TW, VEC, decltype(etag)::value><<<T, threads, 0, s>>>(yy, rstd, xx, ww, C, eps, woff);
                    return launched();
                });
            };
            auto rows = [&](auto gtag) {
                constexpr int G = decltype(gtag)::value;
                rmsnorm_fwd_rows_k<TX, TW, G><<<blocks_for((size_t)T, ROWS_BLOCK / G), ROWS_BLOCK, 0, s>>>(
                    yy, rstd, xx, ww, T, C, eps, woff);
                return launched();
            };
            if (vec && C <= 256) {
                const int nv = C / 8;
                return nv <= 1 ? rows(ic<1>{}) : nv <= 2 ? rows(ic<2>{}) : nv <= 4 ? rows(ic<4>{})
                     : nv <= 8 ? rows(ic<8>{}) : nv <= 16 ? rows(ic<16>{}) : rows(ic<32>{});
            }
            return vec ? go(ic<8>{}) : go(ic<1>{});
        });
    });
}

size_t mt_cu_rmsnorm_bwd_scratch_bytes(int T, int C, const mt_cu_tuning *tune)
{
    const mt_cu_tuning *tu = tuning_for(tune);
    if (!tu) return 0;
    if (T <= 0 || C <= 0) return 256;
    const int R = rms_rows(T, C, tu->rms_bwd_chunks), P = (T + R - 1) / R;
    return round256((size_t)P * C * sizeof(float)) + 256;
}

int mt_cu_rmsnorm_bwd(mt_cu_stream s, float *dx, float *dw, const float *dy, mt_cu_dtype xdt, const void *x,
                      mt_cu_dtype dt, const void *w, const float *rstd, int T, int C, float eps, float woff,
                      void *scratch, const mt_cu_tuning *tune)
{
    const mt_cu_tuning *tu = tuning_for(tune);
    if (!tu || T < 0 || C <= 0 || (dw && !scratch)) return -1;
    if (T == 0 || (!dx && !dw)) return 0;
    const int R = rms_rows(T, C, tu->rms_bwd_chunks), P = (T + R - 1) / R;
    float *part = dw ? (float *)scratch_base(scratch) : nullptr;
    const bool vec = C % 8 == 0 && al16(x) && al16(w) && al16(dy) && (!dx || al16(dx));
    const int rc = with_dtype(xdt, [&](auto tx) {
        using TX = typename decltype(tx)::type;
        return with_dtype(dt, [&](auto tw) {
            using TW = typename decltype(tw)::type;
            const TX *xx = (const TX *)x;
            const TW *ww = (const TW *)w;
            auto go = [&](auto vtag) {
                constexpr int VEC = decltype(vtag)::value;
                return with_row_cfg<VEC>(C, tu->rms_bwd_emin, [&](auto etag, int threads) {
                    constexpr int E = decltype(etag)::value;
                    if (tu->rms_bwd_prefetch)
                        rmsnorm_bwd_k<TX, TW, VEC, E, true><<<P, threads, 0, s>>>(dx, part, dy, xx, ww, rstd, T, C, R, eps,
                                                                                    woff);
                    else
                        rmsnorm_bwd_k<TX, TW, VEC, E, false><<<P, threads, 0, s>>>(dx, part, dy, xx, ww, rstd, T, C, R, eps,
                                                                                    woff);
                    return launched();
                });
            };
            return vec ? go(ic<8>{}) : go(ic<1>{});
        });
    });
    if (rc != 0 || !dw) return rc;
    return colsum_finish(s, dw, part, P, C);
}

// ---- RoPE ----

int mt_cu_rope_at(mt_cu_stream s, mt_cu_dtype dt, void *x, const int32_t *pos, const float *inv_freq, int T, int nh,
                  int D, int off, int rd, int interleaved, float scale, int inverse)
{
    if (T < 0 || nh < 0 || D < 0 || D % 2 || off < 0 || rd < 0 || rd % 2 || rd > D - off) return -1;
    if (T == 0 || nh == 0 || rd == 0) return 0;
    const int half = rd / 2;
    const bool vec = half % 8 == 0 && D % 8 == 0 && off % 8 == 0 && al16(x);
    const int VEC = vec ? 8 : 1, nc = half / VEC;
    // about 4 heads per thread, fewer when that leaves too few threads
    int hpt = nh < 4 ? nh : 4;
    while (hpt > 1 && (size_t)T * nc * ((nh + hpt - 1) / hpt) < 200000) hpt /= 2;
    const size_t items = (size_t)T * nc * ((nh + hpt - 1) / hpt);
    return with_dtype(dt, [&](auto tt) {
        using TT = typename decltype(tt)::type;
        auto go = [&](auto vtag, auto il) {
            rope_k<TT, decltype(vtag)::value, decltype(il)::value><<<blocks_for(items, 256), 256, 0, s>>>(
                (TT *)x, pos, inv_freq, T, nh, D, off, rd, scale, hpt, inverse);
            return launched();
        };
        if (interleaved) return vec ? go(ic<8>{}, std::true_type{}) : go(ic<1>{}, std::true_type{});
        return vec ? go(ic<8>{}, std::false_type{}) : go(ic<1>{}, std::false_type{});
    });
}

int mt_cu_rope(mt_cu_stream s, mt_cu_dtype dt, void *x, const int32_t *pos, const float *inv_freq, int T, int nh,
               int D, int rd, float scale, int inverse)
{
    return mt_cu_rope_at(s, dt, x, pos, inv_freq, T, nh, D, 0, rd, 0, scale, inverse);
}

// ---- columns ----

int mt_cu_copy_cols(mt_cu_stream s, mt_cu_dtype dt, void *dst, int dld, int doff, const void *src, int sld, int soff,
                    int rows, int w, int rep)
{
    if (rows < 0 || w < 0 || rep <= 0 || doff < 0 || soff < 0 || dld < 0 || sld < 0) return -1;
    if (rows == 0 || w == 0) return 0;
    const size_t es = mt_cu_dtype_size(dt);
    if (es != 2 && es != 4) return -1;
    char *d = (char *)dst + (size_t)doff * es;
    const char *sp = (const char *)src + (size_t)soff * es;
    const int V = (int)(16 / es);
    const bool vec = w % V == 0 && dld % V == 0 && sld % V == 0 && al16(d) && al16(sp);
    auto go = [&](auto etag, auto vtag) {
        using E = typename decltype(etag)::type;
        constexpr int VV = decltype(vtag)::value;
        const size_t items = (size_t)rows * (w / VV);
        copy_cols_k<E, VV><<<blocks_for(items, 256), 256, 0, s>>>((E *)d, dld, (const E *)sp, sld, rows, w, rep);
        return launched();
    };
    if (es == 2) return vec ? go(tag<uint16_t>{}, ic<8>{}) : go(tag<uint16_t>{}, ic<1>{});
    return vec ? go(tag<uint32_t>{}, ic<4>{}) : go(tag<uint32_t>{}, ic<1>{});
}

int mt_cu_sum_cols(mt_cu_stream s, mt_cu_dtype dt, void *dst, int dld, int doff, const void *src, int sld, int soff,
                   int rows, int w, int n)
{
    if (rows < 0 || w < 0 || n < 0 || doff < 0 || soff < 0 || dld < 0 || sld < 0) return -1;
    if (rows == 0 || w == 0) return 0;
    return with_dtype(dt, [&](auto tt) {
        using TT = typename decltype(tt)::type;
        TT *d = (TT *)dst + doff;
        const TT *sp = (const TT *)src + soff;
        const bool vec = w % 8 == 0 && dld % 8 == 0 && sld % 8 == 0 && al16(d) && al16(sp);
        auto go = [&](auto vtag) {
            constexpr int VEC = decltype(vtag)::value;
            const size_t items = (size_t)rows * (w / VEC);
            sum_cols_k<TT, VEC><<<blocks_for(items, 256), 256, 0, s>>>(d, dld, sp, sld, rows, w, n);
            return launched();
        };
        return vec ? go(ic<8>{}) : go(ic<1>{});
    });
}

// ---- gated activations ----

int mt_cu_glu(mt_cu_stream s, mt_cu_dtype dt, int act, void *out, const void *gate, const void *up, size_t n)
{
    const bool vec = al16(out) && al16(gate) && al16(up);
    return with_dtype(dt, [&](auto tt) {
        using TT = typename decltype(tt)::type;
        if (act == MT_GLU_GELU_TANH)
            return launch_ew(s, glu_f<TT, gelu_tanh_act>{(TT *)out, (const TT *)gate, (const TT *)up}, n, vec);
        if (act == MT_GLU_GPTOSS)
            return launch_ew(s, gptoss_glu_f<TT>{(TT *)out, (const TT *)gate, (const TT *)up}, n, vec);
        return launch_ew(s, glu_f<TT, silu_act>{(TT *)out, (const TT *)gate, (const TT *)up}, n, vec);
    });
}

int mt_cu_glu_bwd(mt_cu_stream s, mt_cu_dtype dt, int act, void *dgate, void *dup, const void *dout, const void *gate,
                  const void *up, size_t n)
{
    const bool vec = al16(dgate) && al16(dup) && al16(dout) && al16(gate) && al16(up);
    return with_dtype(dt, [&](auto tt) {
        using TT = typename decltype(tt)::type;
        if (act == MT_GLU_GELU_TANH)
            return launch_ew(s, glu_bwd_f<TT, gelu_tanh_act>{(TT *)dgate, (TT *)dup, (const TT *)dout, (const TT *)gate,
                                                             (const TT *)up},
                             n, vec);
        if (act == MT_GLU_GPTOSS)
            return launch_ew(s, gptoss_glu_bwd_f<TT>{(TT *)dgate, (TT *)dup, (const TT *)dout, (const TT *)gate,
                                                     (const TT *)up},
                             n, vec);
        return launch_ew(s, glu_bwd_f<TT, silu_act>{(TT *)dgate, (TT *)dup, (const TT *)dout, (const TT *)gate,
                                                    (const TT *)up},
                         n, vec);
    });
}

// ---- attention sinks ----

int mt_cu_attn_sink(mt_cu_stream s, mt_cu_dtype dt, void *out, float *lse, const void *sinks, int B, int S, int H, int D)
{
    if (B < 0 || S < 0 || H < 0 || D <= 0 || !out || !lse || !sinks) return -1;
    const size_t rows = (size_t)B * S * H;
    if (rows == 0) return 0;
    const bool vec = D % 8 == 0 && al16(out);
    const int P = sink_lanes(vec ? D / 8 : D);
    const unsigned blocks = blocks_for((rows + 32 / P - 1) / (32 / P) * 32, SINK_THREADS);
    return with_dtype(dt, [&](auto tt) {
        using TT = typename decltype(tt)::type;
        if (vec)
            attn_sink_k<TT, 8><<<blocks, SINK_THREADS, 0, s>>>((TT *)out, lse, (const TT *)sinks, rows, S, H, D, P);
        else
            attn_sink_k<TT, 1><<<blocks, SINK_THREADS, 0, s>>>((TT *)out, lse, (const TT *)sinks, rows, S, H, D, P);
        return launched();
    });
}

int mt_cu_attn_sink_bwd(mt_cu_stream s, mt_cu_dtype dt, float *dsink, const void *dout, const void *out,
                        const float *lse, const void *sinks, int B, int S, int H, int D)
{
    if (B < 0 || S < 0 || H < 0 || D <= 0 || !dsink || !dout || !out || !lse || !sinks) return -1;
    const size_t BS = (size_t)B * S;
    if (BS == 0 || H == 0) return 0;
    const bool vec = D % 8 == 0 && al16(dout) && al16(out);
    const int P = sink_lanes(vec ? D / 8 : D);
    const unsigned blocks = (unsigned)H * SINK_BWD_CLUSTER;
    return with_dtype(dt, [&](auto tt) {
        using TT = typename decltype(tt)::type;
        if (vec)
            attn_sink_bwd_k<TT, 8><<<blocks, SINK_BWD_THREADS, 0, s>>>(dsink, (const TT *)dout, (const TT *)out, lse,
                                                                      (const TT *)sinks, BS, S, H, D, P);
        else
            attn_sink_bwd_k<TT, 1><<<blocks, SINK_BWD_THREADS, 0, s>>>(dsink, (const TT *)dout, (const TT *)out, lse,
                                                                      (const TT *)sinks, BS, S, H, D, P);
        return launched();
    });
}

// ---- attention temperature ----

int mt_cu_attn_temperature(mt_cu_stream s, mt_cu_dtype dt, void *x, int T, int seq_len, int n, float floor_scale,
                           float scale)
{
    if (T < 0 || n < 0 || seq_len <= 0) return -1;
    if (T == 0 || n == 0) return 0;
    const bool vec = n % 8 == 0 && al16(x);
    return with_dtype(dt, [&](auto tt) {
        using TT = typename decltype(tt)::type;
        auto go = [&](auto vtag) {
            constexpr int VEC = decltype(vtag)::value;
            const size_t items = (size_t)T * (n / VEC);
            attn_temperature_k<TT, VEC><<<blocks_for(items, 256), 256, 0, s>>>((TT *)x, T, seq_len, n, floor_scale,
                                                                              scale);
            return launched();
        };
        return vec ? go(ic<8>{}) : go(ic<1>{});
    });
}

// ---- embedding ----

int mt_cu_embedding(mt_cu_stream s, mt_cu_dtype dt, void *out, const int32_t *tokens, mt_cu_dtype wdt,
                    const void *wte, int T, int C, int V, float scale)
{
    if (T < 0 || C <= 0 || V <= 0) return -1;
    if (T == 0) return 0;
    const bool vec = C % 8 == 0 && al16(out) && al16(wte);
    const int nv = vec ? C / 8 : C;
    const int threads = nv >= 256 ? 256 : (nv + 31) / 32 * 32;
    return with_dtype(dt, [&](auto to) {
        using TO = typename decltype(to)::type;
        return with_dtype(wdt, [&](auto tw) {
            using TW = typename decltype(tw)::type;
            if (vec) embedding_k<TO, TW, 8><<<T, threads, 0, s>>>((TO *)out, tokens, (const TW *)wte, C, V, scale);
            else embedding_k<TO, TW, 1><<<T, threads, 0, s>>>((TO *)out, tokens, (const TW *)wte, C, V, scale);
            return launched();
        });
    });
}

size_t mt_cu_embedding_bwd_scratch_bytes(int T)
{
    if (T <= 0) return 256;
    const size_t temp = embed_temp_bytes(T, 32);
    if (temp == 0) return 0;
    return 4 * round256((size_t)T * 4) + round256(temp) + 256;
}

int mt_cu_embedding_bwd(mt_cu_stream s, float *dwte, const int32_t *tokens, const float *dout, int T, int C, int V,
                        float scale, int pad, void *scratch)
{
    if (T < 0 || C <= 0 || V <= 0 || !scratch) return -1;
    if (T == 0) return 0;
    char *p = scratch_base(scratch);
    const size_t a = round256((size_t)T * 4);
    unsigned *keys_in = (unsigned *)p, *keys = (unsigned *)(p + a);
    int *vals_in = (int *)(p + 2 * a), *vals = (int *)(p + 3 * a);
    void *temp = p + 4 * a;
    const int end_bit = key_bits(V);
    size_t temp_bytes = embed_temp_bytes(T, end_bit);
    if (temp_bytes == 0 || temp_bytes > round256(embed_temp_bytes(T, 32))) return -1;
    embed_keys_k<<<blocks_for((size_t)T, 256), 256, 0, s>>>(keys_in, vals_in, tokens, T, V, pad);
    if (launched() != 0) return -1;
    if (cub::DeviceRadixSort::SortPairs(temp, temp_bytes, keys_in, keys, vals_in, vals, T, 0, end_bit, s) !=
        cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    const bool vec = C % 4 == 0 && al16(dwte) && al16(dout);
    const int nv = vec ? C / 4 : C;
    const int threads = nv >= 256 ? 256 : (nv + 31) / 32 * 32;
    const dim3 grid((unsigned)T, blocks_for((size_t)nv, (unsigned)threads));
    if (vec) embedding_bwd_k<4><<<grid, threads, 0, s>>>(dwte, keys, vals, dout, T, C, V, scale);
    else embedding_bwd_k<1><<<grid, threads, 0, s>>>(dwte, keys, vals, dout, T, C, V, scale);
    return launched();
}

// ---- cross-entropy ----

size_t mt_cu_cross_entropy_scratch_bytes(int n)
{
    if (n <= 0) return 256;
    return round256((size_t)n * sizeof(double)) + round256((size_t)n * sizeof(int)) + 256;
}

int mt_cu_cross_entropy(mt_cu_stream s, const float *logits, const int32_t *targets, int n, int V, float dscale,
                        float softcap, int ignore_index, mt_cu_dtype dt, void *dlogits, double *loss_sum, int *count,
                        void *scratch, const mt_cu_tuning *tune)
{
    const mt_cu_tuning *tu = tuning_for(tune);
    if (!tu || n < 0 || V <= 0 || !scratch || !(softcap >= 0.0f) || isinf(softcap)) return -1;
    if (dlogits == (const void *)logits && dlogits && dt != MT_CU_F32) return -1;
    if (n == 0) return 0;
    double *row_loss = (double *)scratch_base(scratch);
    int *row_ok = (int *)((char *)row_loss + round256((size_t)n * sizeof(double)));
    const bool vec = V % 4 == 0 && al16(logits) && (!dlogits || al16(dlogits));
    const int nv = vec ? V / 4 : V;
    const int threads = nv >= tu->ce_threads ? tu->ce_threads : (nv + 31) / 32 * 32;
    const bool cap = softcap > 0.0f;
    const int CL = vec && tu->ce_cluster && !cap ? ce_cluster_size(V) : 0; // the cluster variant has no cap
    if (CL > 0) {
        const size_t slice = (size_t)((nv + CL - 1) / CL) * 16;
        if (cudaFuncSetAttribute(ce_cluster_k, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)slice) != cudaSuccess) {
            cudaGetLastError();
            return -1;
        }
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3((unsigned)n * (unsigned)CL);
        cfg.blockDim = dim3((unsigned)threads);
        cfg.dynamicSmemBytes = slice;
        cfg.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = (unsigned)CL;
        attr[0].val.clusterDim.y = 1;
        attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        if (cudaLaunchKernelEx(&cfg, ce_cluster_k, logits, targets, V, dscale, ignore_index, dlogits,
                               (int)(dt == MT_CU_BF16), row_loss, row_ok) != cudaSuccess) {
            cudaGetLastError();
            return -1;
        }
        if (launched() != 0) return -1;
        if (!loss_sum && !count) return 0;
        ce_finish_k<<<1, 1024, 0, s>>>(row_loss, row_ok, n, loss_sum, count);
        return launched();
    }
    const size_t smem = (size_t)tu->ce_smem; // only to limit the blocks per SM
    const int rc = with_dtype(dt, [&](auto td) {
        using TD = typename decltype(td)::type;
        auto go = [&](auto kern) {
            if (smem > 48 * 1024 && cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) !=
                                        cudaSuccess)
                return (cudaGetLastError(), -1);
            kern<<<n, threads, smem, s>>>(logits, targets, V, dscale, softcap, ignore_index, (TD *)dlogits, row_loss,
                                          row_ok, tu->ce_reverse);
            return launched();
        };
        if (cap) return vec ? go(ce_k<TD, 4, true>) : go(ce_k<TD, 1, true>);
        return vec ? go(ce_k<TD, 4, false>) : go(ce_k<TD, 1, false>);
    });
    if (rc != 0) return rc;
    if (!loss_sum && !count) return 0;
    ce_finish_k<<<1, 1024, 0, s>>>(row_loss, row_ok, n, loss_sum, count);
    return launched();
}

// ---- elementwise ----

int mt_cu_convert(mt_cu_stream s, mt_cu_dtype ydt, void *y, mt_cu_dtype xdt, const void *x, size_t n)
{
    const bool vec = al16(y) && al16(x);
    return with_dtype(ydt, [&](auto ty) {
        using TY = typename decltype(ty)::type;
        return with_dtype(xdt, [&](auto tx) {
            using TX = typename decltype(tx)::type;
            return launch_ew(s, convert_f<TY, TX>{(TY *)y, (const TX *)x}, n, vec);
        });
    });
}

int mt_cu_q16_to_bf16(mt_cu_stream s, void *data, const float *scale, size_t n)
{
    return launch_ew(s, q16_to_bf16_f{data, scale}, n, al16(data));
}

int mt_cu_add(mt_cu_stream s, mt_cu_dtype ydt, void *y, mt_cu_dtype adt, const void *a, mt_cu_dtype bdt, const void *b,
              size_t n)
{
    const bool vec = al16(y) && al16(a) && al16(b);
    return with_dtype(ydt, [&](auto ty) {
        using TY = typename decltype(ty)::type;
        return with_dtype(adt, [&](auto ta) {
            using TA = typename decltype(ta)::type;
            return with_dtype(bdt, [&](auto tb) {
                using TB = typename decltype(tb)::type;
                return launch_ew(s, add_f<TY, TA, TB>{(TY *)y, (const TA *)a, (const TB *)b}, n, vec);
            });
        });
    });
}

int mt_cu_softcap(mt_cu_stream s, float *x, size_t n, float cap)
{
    if (!(cap > 0.0f) || isinf(cap)) return -1;
    return launch_ew(s, softcap_f{x, cap}, n, al16(x));
}

int mt_cu_scale(mt_cu_stream s, mt_cu_dtype dt, void *x, float alpha, size_t n)
{
    const bool vec = al16(x);
    return with_dtype(dt, [&](auto tt) {
        using TT = typename decltype(tt)::type;
        return launch_ew(s, scale_f<TT>{(TT *)x, alpha}, n, vec);
    });
}

int mt_cu_zero(mt_cu_stream s, void *p, size_t bytes)
{
    if (bytes == 0) return 0;
    if (cudaMemsetAsync(p, 0, bytes, s) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    return 0;
}

// ---- reductions ----

size_t mt_cu_sumsq_scratch_bytes(void) { return (size_t)SUMSQ_MAX_BLOCKS * sizeof(double) + 256; }

int mt_cu_sumsq(mt_cu_stream s, double *out, const float *x, size_t n, void *scratch)
{
    if (!out || !scratch) return -1;
    if (n == 0) return 0;
    double *part = (double *)scratch_base(scratch);
    const int G = sumsq_blocks(n);
    if (al16(x)) sumsq_k<4><<<G, SUMSQ_THREADS, 0, s>>>(x, n, part);
    else sumsq_k<1><<<G, SUMSQ_THREADS, 0, s>>>(x, n, part);
    if (launched() != 0) return -1;
    sumsq_finish_k<<<1, SUMSQ_MAX_BLOCKS, 0, s>>>(out, part, G);
    return launched();
}

size_t mt_cu_bias_grad_scratch_bytes(int T, int N)
{
    if (T <= 0 || N <= 0) return 256;
    const int R = bias_rows(T, N), P = (T + R - 1) / R;
    return round256((size_t)P * N * sizeof(float)) + 256;
}

int mt_cu_bias_grad(mt_cu_stream s, float *db, mt_cu_dtype dt, const void *dy, int T, int N, void *scratch)
{
    if (T < 0 || N < 0 || !scratch) return -1;
    if (T == 0 || N == 0) return 0;
    const int R = bias_rows(T, N), P = (T + R - 1) / R;
    float *part = (float *)scratch_base(scratch);
    const bool vec = N % 8 == 0 && al16(dy);
    const int nv = vec ? N / 8 : N;
    const dim3 grid(blocks_for((size_t)nv, BIAS_THREADS), (unsigned)P);
    const int rc = with_dtype(dt, [&](auto tt) {
        using TT = typename decltype(tt)::type;
        if (vec) colsum_part_k<TT, 8><<<grid, BIAS_THREADS, 0, s>>>(part, (const TT *)dy, T, N, R);
        else colsum_part_k<TT, 1><<<grid, BIAS_THREADS, 0, s>>>(part, (const TT *)dy, T, N, R);
        return launched();
    });
    if (rc != 0) return rc;
    return colsum_finish(s, db, part, P, N);
}

} // extern "C"
