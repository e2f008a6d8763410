/* Grouped expert GEMMs on Hopper (grouped_gemm.h): wgmma fed by the bulk
 * tensor copy engine, a persistent grid walking a list of output tiles that
 * each block derives from the experts' offsets in device memory.
 *
 * One block: warpgroup 0 produces (one thread issues the copies), warpgroups
 * 1 and 2 consume, each computing 64 of the tile's BM = 128 rows against BN
 * (128 or 256) columns, over a ring of STAGES shared-memory stages of one
 * 64-wide slice of the reduction each (full/empty mbarriers per stage).
 *
 * The three products as one GEMM D[m, n] = sum_k A[m, k] B[k, n]:
 *   linear  (FWD) m: routed rows, n: N, k: K.  A = x (R, K) K-major, B = W_e (N, K) K-major
 *   dx      (DX)  m: routed rows, n: K, k: N.  A = dy (R, N) K-major, B = W_e (N, K) N-major (rows of k)
 *   dw      (DW)  m: N, n: K, k: e's rows.     A = dy_e (rows, N) M-major, B = x_e (rows, K) N-major
 * K-major tiles come as one box of [rows][64] bf16 (128 bytes a row, 128-byte swizzle); M- or N-major
 * ones as boxes of [64 reduction rows][64 columns], one per 64 columns, placed one after another. The
 * wgmma descriptors: K-major, rows 8 at a time 1024 bytes apart (SBO), 32 bytes per 16-wide k step;
 * MN-major, 64-column chunks 8192 bytes apart (LBO), 8 reduction rows 1024 apart (SBO), 2048 bytes
 * per k step.
 *
 * Tiles: FWD and DX, the row tiles of every expert (ceil(rows / 128) each, from a prefix sum that each
 * block makes in shared memory) times the column tiles, column tiles innermost (consecutive blocks
 * share A's rows); DW, every expert's (N / 128) x (K / BN) tiles, each reducing over the expert's rows
 * in slices of 64 (the last slice's rows past the expert are zeroed in shared memory: they belong to
 * the next expert). Rows past an expert's end in FWD and DX are computed and not stored; rows past R
 * and columns past N or K are the copy engine's zeros. */
#include "cuda/kernels/grouped_gemm.h"
#include "cuda/kernels/sm90.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

namespace {

enum { FWD = 0, DX = 1, DW = 2 };
constexpr int BM = 128, BK = 64, MAXE = 1024;
constexpr int THREADS = 384;

template <int BN> struct cfg {
    static constexpr int A_BYTES = BM * BK * 2;
    static constexpr int B_BYTES = BN * BK * 2;
    static constexpr int STAGES = BN == 256 ? 4 : 6;
    static constexpr int SMEM = 1024 /* alignment */ + STAGES * (A_BYTES + B_BYTES) + 2 * STAGES * 8 +
                                2 * (MAXE + 1) * 4;
};

struct tile {
    int e, m0, n0;  /* expert; first row (FWD, DX: a routed row; DW: a row of dW_e); first column */
    int rows;       /* FWD, DX: the tile's rows that are the expert's (the rest are not stored) */
    int k0, kiters; /* the reduction: first routed row (DW) and slices */
    int kvalid;     /* DW: rows of the expert in the last slice */
};

struct args {
    void *out;
    const __nv_bfloat16 *bias;
    float *db_unused;
    const int32_t *offs;
    int E, R, M, N, K; /* D is M x N over a reduction of K; for DW, M and N are dW_e's, K unused */
    int out_f32, accumulate;
    int ldo; /* elements per output row */
};

#ifdef MT_SM90A
using namespace mt_sm90;
template <int BN, int TA, int TB> using mma = wgmma_ss<BN, TA, TB>;

/* The experts' row ranges, clamped to 0..R, into shared memory; for FWD and DX also the prefix sums
 * of their row tiles (pre[e] the first tile of expert e, pre[E] the total). */
__device__ void load_offs(int *so, int *pre, const int32_t *offs, int E, int R, int tiles_of_rows)
{
    for (int e = threadIdx.x; e <= E; e += blockDim.x) so[e] = min(max((int)offs[e], 0), R);
    __syncthreads();
    if (threadIdx.x == 0) { /* monotone; one pass, E <= 1024 */
        int lo = 0;
        for (int e = 0; e <= E; e++) lo = so[e] = max(so[e], lo);
    }
    __syncthreads();
    if (!tiles_of_rows) return;
    if (threadIdx.x < 32) { /* a warp scans the per-expert tile counts */
        const int lane = threadIdx.x, per = (E + 31) / 32, e0 = lane * per;
        int sum = 0;
        for (int e = e0; e < min(e0 + per, E); e++) sum += (so[e + 1] - so[e] + BM - 1) / BM;
        int inc = sum;
        for (int o = 1; o < 32; o <<= 1) {
            const int v = __shfl_up_sync(0xffffffffu, inc, o);
            if (lane >= o) inc += v;
        }
        int run = inc - sum;
        for (int e = e0; e < min(e0 + per, E); e++) {
            pre[e] = run;
            run += (so[e + 1] - so[e] + BM - 1) / BM;
        }
        if (lane == 31) pre[E] = inc;
    }
    __syncthreads();
}

/* The expert whose row tiles hold tile index m (pre ascending, pre[0] = 0 <= m < pre[E]) */
__device__ __forceinline__ int find_expert(const int *pre, int E, int m)
{
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (pre[mid] <= m) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

template <int MODE, int BN>
__device__ __forceinline__ bool next_tile(tile &t, int idx, const int *so, const int *pre, const args &a)
{
    const int nt = (a.N + BN - 1) / BN;
    if (MODE == DW) {
        const int mt = (a.M + BM - 1) / BM;
        if (idx >= a.E * mt * nt) return false;
        t.e = idx / (mt * nt);
        const int rem = idx % (mt * nt);
        t.m0 = (rem / nt) * BM, t.n0 = (rem % nt) * BN;
        t.k0 = so[t.e];
        const int rows = so[t.e + 1] - so[t.e];
        t.kiters = (rows + BK - 1) / BK;
        t.kvalid = rows - (t.kiters - 1) * BK;
        t.rows = BM;
        return true;
    }
    if (idx >= pre[a.E] * nt) return false;
    const int m = idx / nt;
    t.e = find_expert(pre, a.E, m);
    t.m0 = so[t.e] + (m - pre[t.e]) * BM;
    t.rows = min(BM, so[t.e + 1] - t.m0);
    t.n0 = (idx % nt) * BN;
    t.k0 = 0;
    t.kiters = (a.K + BK - 1) / BK;
    t.kvalid = BK;
    return true;
}

#endif

template <int MODE, int BN>
__global__ void __launch_bounds__(THREADS, 1)
    gg_kernel(const __grid_constant__ CUtensorMap tmA, const __grid_constant__ CUtensorMap tmB, const args a)
{
#ifdef MT_SM90A
    using C = cfg<BN>;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sA = smem, *sB = smem + C::STAGES * C::A_BYTES;
    uint64_t *full = (uint64_t *)(sB + C::STAGES * C::B_BYTES), *empty = full + C::STAGES;
    int *so = (int *)(empty + C::STAGES), *pre = so + (MAXE + 1);

    if (threadIdx.x == 0) {
        for (int s = 0; s < C::STAGES; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 2);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    load_offs(so, pre, a.offs, a.E, a.R, MODE != DW);

    const int wg = threadIdx.x / 128;
    if (wg == 0) { /* the producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;");
        if (threadIdx.x != 0) return;
        int s = 0, ph = 0;
        tile t;
        for (int idx = blockIdx.x; next_tile<MODE, BN>(t, idx, so, pre, a); idx += gridDim.x) {
            for (int i = 0; i < t.kiters; i++) {
                mbar_wait(&empty[s], ph ^ 1);
                mbar_expect_tx(&full[s], C::A_BYTES + C::B_BYTES);
                uint8_t *dA = sA + s * C::A_BYTES, *dB = sB + s * C::B_BYTES;
                const int k = i * BK;
                if (MODE == FWD) {
                    tma2(dA, &tmA, &full[s], k, t.m0);
                    tma3(dB, &tmB, &full[s], k, t.n0, t.e);
                } else if (MODE == DX) {
                    tma2(dA, &tmA, &full[s], k, t.m0);
#pragma unroll
                    for (int q = 0; q < BN / 64; q++) tma3(dB + q * 8192, &tmB, &full[s], t.n0 + 64 * q, k, t.e);
                } else {
                    const int r = t.k0 + k;
#pragma unroll
                    for (int q = 0; q < BM / 64; q++) tma2(dA + q * 8192, &tmA, &full[s], t.m0 + 64 * q, r);
#pragma unroll
                    for (int q = 0; q < BN / 64; q++) tma2(dB + q * 8192, &tmB, &full[s], t.n0 + 64 * q, r);
                }
                if (++s == C::STAGES) s = 0, ph ^= 1;
            }
        }
        return;
    }

    /* the consumers */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 232;");
    const int cw = wg - 1;             /* which 64 rows of the tile */
    const int ct = threadIdx.x - 128;  /* 0..255 */
    const int lane = threadIdx.x % 32, warp = (threadIdx.x / 32) % 4;
    float d[BN / 2];
    int s = 0, ph = 0;
    tile t;
    for (int idx = blockIdx.x; next_tile<MODE, BN>(t, idx, so, pre, a); idx += gridDim.x) {
        if (t.kiters == 0) continue; /* DW: an expert without rows keeps its gradient */
        for (int i = 0; i < t.kiters; i++) {
            mbar_wait(&full[s], ph);
            uint8_t *tA = sA + s * C::A_BYTES, *tB = sB + s * C::B_BYTES;
            if (MODE == DW && i == t.kiters - 1 && t.kvalid < BK) {
                /* the slice's rows past the expert: zero in both operands (each 128-byte row keeps its
                 * 16-byte units within it under the swizzle) */
                const int nrow = BK - t.kvalid, chunks = BM / 64 + BN / 64;
                for (int u = ct; u < chunks * nrow * 8; u += 256) {
                    const int c = u / (nrow * 8), r = t.kvalid + (u / 8) % nrow, w = u % 8;
                    uint8_t *base = c < BM / 64 ? tA + c * 8192 : tB + (c - BM / 64) * 8192;
                    *(uint4 *)(base + r * 128 + w * 16) = make_uint4(0, 0, 0, 0);
                }
                asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
                asm volatile("bar.sync 1, 256;" ::: "memory");
            }
            wg_fence();
#pragma unroll
            for (int kk = 0; kk < BK / 16; kk++) {
                uint64_t da, db;
                if (MODE == DW) da = sdesc(saddr(tA + cw * 8192 + kk * 2048), 8192, 1024);
                else da = sdesc(saddr(tA + cw * 8192 + kk * 32), 16, 1024);
                if (MODE == FWD) db = sdesc(saddr(tB + kk * 32), 16, 1024);
                else db = sdesc(saddr(tB + kk * 2048), 8192, 1024);
                mma<BN, MODE == DW, MODE != FWD>::run(d, da, db, (i | kk) != 0);
            }
            wg_commit();
            wg_wait0();
            acc_fence(d);
            if (threadIdx.x % 128 == 0) mbar_arrive(&empty[s]);
            if (++s == C::STAGES) s = 0, ph ^= 1;
        }
        /* the epilogue: thread (warp, lane) holds rows 16 warp + lane/4 (+8), columns 8j + 2 (lane%4) (+1) */
        const int r_lo = cw * 64 + warp * 16 + lane / 4;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int rt = r_lo + 8 * h;
            const bool row_ok = MODE == DW ? t.m0 + rt < a.M : rt < t.rows;
            if (!row_ok) continue;
            const size_t orow = MODE == DW ? ((size_t)t.e * a.M + t.m0 + rt) : (size_t)(t.m0 + rt);
#pragma unroll
            for (int j = 0; j < BN / 8; j++) {
                const int n = t.n0 + 8 * j + 2 * (lane % 4);
                if (n >= a.N) continue;
                float v0 = d[4 * j + 2 * h], v1 = d[4 * j + 2 * h + 1];
                if (MODE == FWD && a.bias) {
                    const __nv_bfloat162 b2 = *(const __nv_bfloat162 *)(a.bias + (size_t)t.e * a.N + n);
                    v0 += __bfloat162float(b2.x), v1 += __bfloat162float(b2.y);
                }
                if (MODE == DW || a.out_f32) {
                    float2 *o = (float2 *)((float *)a.out + orow * a.ldo + n);
                    if (MODE == DW || a.accumulate) {
                        const float2 old = *o;
                        v0 += old.x, v1 += old.y;
                    }
                    *o = make_float2(v0, v1);
                } else {
                    __nv_bfloat162 *o = (__nv_bfloat162 *)((__nv_bfloat16 *)a.out + orow * a.ldo + n);
                    if (a.accumulate) {
                        const __nv_bfloat162 old = *o;
                        v0 += __bfloat162float(old.x), v1 += __bfloat162float(old.y);
                    }
                    *o = __floats2bfloat162_rn(v0, v1);
                }
            }
        }
    }
#else
    (void)tmA, (void)tmB, (void)a;
#endif
}

/* db_e[n] += the sum over e's rows of dy[r, n], in row order: one thread a column */
__global__ void colsum_kernel(float *db, const __nv_bfloat16 *dy, const int32_t *offs, int E, int R, int N)
{
    const int e = blockIdx.y, n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const int lo = min(max((int)offs[e], 0), R), hi = min(max((int)offs[e + 1], lo), R);
    if (lo == hi) return;
    float sum = 0.0f;
    for (int r = lo; r < hi; r++) sum += __bfloat162float(dy[(size_t)r * N + n]);
    db[(size_t)e * N + n] += sum;
}

} // namespace

struct mt_cu_gg {
    PFN_cuTensorMapEncodeTiled_v12000 encode;
    int n_sm;
    int attr_set[3][2]; /* cudaFuncSetAttribute done, per mode and tile width */
};

extern "C" mt_cu_gg *mt_cu_gg_create(char *why, size_t why_len)
{
    int dev = 0, major = 0, minor = 0, n_sm = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
        if (why) snprintf(why, why_len, "grouped GEMMs: no CUDA device");
        return NULL;
    }
    if (major != 9 || minor != 0) {
        if (why) snprintf(why, why_len, "grouped GEMMs: compute capability %d.%d, not 9.0", major, minor);
        return NULL;
    }
    const PFN_cuTensorMapEncodeTiled_v12000 encode = mt_sm90_tensor_map_encoder();
    if (!encode) {
        if (why) snprintf(why, why_len, "grouped GEMMs: the driver has no cuTensorMapEncodeTiled");
        return NULL;
    }
    mt_cu_gg *g = (mt_cu_gg *)calloc(1, sizeof *g);
    if (!g) {
        if (why) snprintf(why, why_len, "grouped GEMMs: out of host memory");
        return NULL;
    }
    g->encode = encode;
    g->n_sm = n_sm;
    return g;
}

extern "C" void mt_cu_gg_destroy(mt_cu_gg *g) { free(g); }

extern "C" int mt_cu_gg_fits(int K, int N) { return K >= 16 && N >= 16 && K % 8 == 0 && N % 8 == 0; }

/* A bf16 tensor map with the 128-byte swizzle: inner x rows (x depth), boxes of 64 x box_rows (x 1) */
static int tmap(const mt_cu_gg *g, CUtensorMap *m, const void *p, int inner, int rows, int depth, int box_rows)
{
    const cuuint64_t dims[3] = {(cuuint64_t)inner, (cuuint64_t)rows, (cuuint64_t)depth};
    const cuuint64_t strides[2] = {(cuuint64_t)inner * 2, (cuuint64_t)inner * rows * 2};
    const cuuint32_t box[3] = {64, (cuuint32_t)box_rows, 1}, es[3] = {1, 1, 1};
    return g->encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, depth > 1 ? 3 : 2, (void *)p, dims, strides, box, es,
                     CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                     CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? 0
               : -1;
}

/* The tile width of n output columns: 256 unless 128 pads less */
static int tile_n(int n) { return ((n + 127) / 128) * 128 < ((n + 255) / 256) * 256 ? 128 : 256; }

template <int MODE, int BN>
static int launch(mt_cu_gg *g, mt_cu_stream s, const CUtensorMap &A, const CUtensorMap &B, const args &a, int tiles)
{
    const int smem = cfg<BN>::SMEM;
    int &done = g->attr_set[MODE][BN == 256];
    if (!done) {
        if (cudaFuncSetAttribute(gg_kernel<MODE, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess)
            return -1;
        done = 1;
    }
    const int grid = tiles < g->n_sm ? (tiles > 0 ? tiles : 1) : g->n_sm;
    gg_kernel<MODE, BN><<<grid, THREADS, smem, (cudaStream_t)s>>>(A, B, a);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}

template <int MODE>
static int run(mt_cu_gg *g, mt_cu_stream s, const CUtensorMap &A, const CUtensorMap &B, args a, int tiles_hint)
{
    const int bn = tile_n(a.N);
    const int tiles = tiles_hint * ((a.N + bn - 1) / bn);
    return bn == 256 ? launch<MODE, 256>(g, s, A, B, a, tiles) : launch<MODE, 128>(g, s, A, B, a, tiles);
}

static int check(const mt_cu_gg *g, const int32_t *offs, int E, int R, int K, int N)
{
    return g && offs && E >= 1 && E <= MAXE && R >= 0 && mt_cu_gg_fits(K, N) ? 0 : -1;
}

extern "C" int mt_cu_gg_linear(mt_cu_gg *g, mt_cu_stream s, void *y, int out_f32, const void *x, const void *W,
                               const void *bias, const int32_t *offs, int E, int R, int K, int N, int accumulate)
{
    if (check(g, offs, E, R, K, N) || !y || !x || !W) return -1;
    if (R == 0) return 0;
    CUtensorMap A, B;
    const int bn = tile_n(N);
    if (tmap(g, &A, x, K, R, 1, BM) || tmap(g, &B, W, K, N, E, bn)) return -1;
    const args a = {y, (const __nv_bfloat16 *)bias, NULL, offs, E, R, R, N, K, out_f32, accumulate, N};
    return run<FWD>(g, s, A, B, a, R / BM + E);
}

extern "C" int mt_cu_gg_linear_dx(mt_cu_gg *g, mt_cu_stream s, void *dx, int out_f32, const void *dy, const void *W,
                                  const int32_t *offs, int E, int R, int K, int N, int accumulate)
{
    if (check(g, offs, E, R, K, N) || !dx || !dy || !W) return -1;
    if (R == 0) return 0;
    CUtensorMap A, B;
    /* D (rows, K) over a reduction of N: A = dy (R, N), B = W_e (N, K) read as 64 x 64 boxes */
    if (tmap(g, &A, dy, N, R, 1, BM) || tmap(g, &B, W, K, N, E, 64)) return -1;
    const args a = {dx, NULL, NULL, offs, E, R, R, K, N, out_f32, accumulate, K};
    return run<DX>(g, s, A, B, a, R / BM + E);
}

extern "C" int mt_cu_gg_linear_dw(mt_cu_gg *g, mt_cu_stream s, float *dW, float *db, const void *dy, const void *x,
                                  const int32_t *offs, int E, int R, int K, int N)
{
    if (check(g, offs, E, R, K, N) || !dW || !dy || !x) return -1;
    if (R == 0) return 0;
    CUtensorMap A, B;
    /* dW_e (N, K) over e's rows: A = dy (R, N) and B = x (R, K), both read as 64 x 64 boxes */
    if (tmap(g, &A, dy, N, R, 1, 64) || tmap(g, &B, x, K, R, 1, 64)) return -1;
    const args a = {dW, NULL, NULL, offs, E, R, N, K, 0, 1, 1, K};
    if (run<DW>(g, s, A, B, a, E * ((N + BM - 1) / BM))) return -1;
    if (!db) return 0;
    colsum_kernel<<<dim3((N + 255) / 256, E), 256, 0, (cudaStream_t)s>>>(db, (const __nv_bfloat16 *)dy, offs, E, R, N);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
