// Fused causal attention with grouped-query heads: forward and backward,
// flash-attention 2 style (cuda/kernels/attention.h for the contract,
// docs/attention.md for the algorithm and the measurements).
//
// B = batch, S = sequence, H = query heads, Hkv = kv heads, D = head dim.
// q, out, dout, dq (B, S, H, D); k, v, dk, dv (B, S, Hkv, D); lse, Di (B, H, S).
//
// bf16 kernels: mma.sync m16n8k16 (bf16 in, fp32 accumulate), operands
// staged in shared memory by cp.async (rows padded by 16 bytes, so the
// ldmatrix reads of 8 rows hit 8 distinct bank groups), two stages deep.
// Every warp owns whole rows of the output tile (32 in the forward, 16 in the
// backward passes), so no reduction crosses warps.
// fp32 kernels: plain CUDA-core loops over shared-memory tiles.
// No kernel uses atomics: each output element is summed by one thread in an
// order fixed by the shapes (bit-reproducible).
#include "cuda/kernels/attention.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

typedef __nv_bfloat16 bf16;

constexpr float LOG2E = 1.4426950408889634f;
constexpr unsigned FULL = 0xffffffffu;

// ---------------------------------------------------------------------------
// CUDA kernels: primitives

__device__ __forceinline__ uint32_t smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

// 16 bytes global -> shared, asynchronously; zeros instead when !valid.
__device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(n)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// Four 8x8 b16 matrices; lanes 8i..8i+7 give the row addresses of matrix i,
// register i receives matrix i (row lane/4, elements 2*(lane%4), +1).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
// The same, each matrix transposed.
__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], const bf16 *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// c (16x8 fp32) += a (16x16 bf16, row) * b (16x8 bf16, col).
// Fragments (g = lane/4, t = lane%4): a0 (g, 2t..2t+1), a1 (g+8, 2t..), a2 (g, 2t+8..), a3 (g+8, 2t+8..);
// b0 (k = 2t..2t+1, n = g), b1 (k = 2t+8.., n = g); c0, c1 (g, 2t..2t+1), c2, c3 (g+8, 2t..2t+1).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1)
{
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats to bf16x2 (round to nearest even), lo in the low half.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    union {
        __nv_bfloat162 h;
        uint32_t u;
    } v;
    v.h = __floats2bfloat162_rn(lo, hi);
    return v.u;
}

__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// Soft-capped scores (Gemma 2): the raw score s = q.k becomes c = cap tanh(u / cap) with u = s scale,
// the CPU's order (tanhf(s * scale / cap) * cap); every kernel with CAP then takes c in place of u
// (so the softmax's own scale is 1) and, in the backward, multiplies dS by dc/du = 1 - t^2. Without
// CAP (a template flag) the kernels compile as if the cap did not exist.
__device__ __forceinline__ float cap_tanh(float s, float scale, float cap) { return tanhf(__fdiv_rn(__fmul_rn(s, scale), cap)); }

// A tile of ROWS rows x D bf16 from global rows row0.. (row stride ld
// elements) into shared memory (row stride D + 8), rows >= S and columns >=
// dh (the head's own size, a multiple of 8 up to the tile's D) zero-filled.
template <int ROWS, int D, int THREADS>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *g, size_t ld, int row0, int S, int dh, int tid)
{
    constexpr int CPR = D / 8, LD = D + 8, N = ROWS * CPR;
    static_assert(N % THREADS == 0, "tile size must be a multiple of the block");
#pragma unroll
    for (int it = 0; it < N / THREADS; ++it) {
        const int c = tid + it * THREADS, r = c / CPR, cc = c % CPR, i = row0 + r;
        const bool ok = i < S && cc * 8 < dh; // columns past the head's dh are zeros
        cp_async16(s + r * LD + cc * 8, g + (size_t)(ok ? i : 0) * ld + cc * 8, ok);
    }
}

// ldmatrix lane offsets (row, column) inside a 16x16 tile:
//  A operand (row-major 16x16) and the B operand of a k-major tile read with
//  .trans: matrices (rows 0-7, cols 0-7), (8-15, 0-7), (0-7, 8-15), (8-15, 8-15);
//  B operand of an n-major tile ([n][k], non-transposed): (n 0-7, k 0-7),
//  (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15): b0, b1 of n-tile 0, then of n-tile 1.
__device__ __forceinline__ int lda_row(int lane) { return (lane & 7) + ((lane >> 3) & 1) * 8; }
__device__ __forceinline__ int lda_col(int lane) { return (lane >> 4) * 8; }
__device__ __forceinline__ int ldb_row(int lane) { return (lane & 7) + (lane >> 4) * 8; }
__device__ __forceinline__ int ldb_col(int lane) { return ((lane >> 3) & 1) * 8; }

// acc[16 x 8*NT] += A(16 x D, rows a_rows of sA) * B^T where B is NT*8 rows of sB
// ([n][k] layout, row stride LD): the Q K^T pattern.
template <int D, int NT>
__device__ __forceinline__ void mma_abt(float (&acc)[NT][4], const bf16 *sA, const bf16 *sB, int lane)
{
    constexpr int LD = D + 8;
    const bf16 *pa = sA + lda_row(lane) * LD + lda_col(lane);
    const bf16 *pb = sB + ldb_row(lane) * LD + ldb_col(lane);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[4];
        ldsm_x4(a, pa + kk * 16);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            uint32_t b[4];
            ldsm_x4(b, pb + np * 16 * LD + kk * 16);
            mma_bf16(acc[2 * np], a, b[0], b[1]);
            mma_bf16(acc[2 * np + 1], a, b[2], b[3]);
        }
    }
}

// acc[16 x D] += P(16 x 16*KT, in registers as accumulator fragments p[2*KT][4],
// rounded to bf16) * V(16*KT x D, k-major rows of sV, row stride LD): the P V pattern.
template <int D, int KT>
__device__ __forceinline__ void mma_pv(float (&acc)[D / 8][4], const float (&p)[2 * KT][4], const bf16 *sV, int lane)
{
    constexpr int LD = D + 8;
    const bf16 *pv = sV + lda_row(lane) * LD + lda_col(lane);
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
        const uint32_t a[4] = {pack_bf16(p[2 * kk][0], p[2 * kk][1]), pack_bf16(p[2 * kk][2], p[2 * kk][3]),
                               pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                               pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            uint32_t b[4];
            ldsm_x4_t(b, pv + kk * 16 * LD + dp * 16);
            mma_bf16(acc[2 * dp], a, b[0], b[1]);
            mma_bf16(acc[2 * dp + 1], a, b[2], b[3]);
        }
    }
}

// ---------------------------------------------------------------------------
// CUDA kernels: bf16 forward
//
// Grid (B*H, ceil(S/BM)); block y = 0 takes the last query block (the one
// with the most keys) so the long blocks start first. 4 warps of 32 query
// rows each (two m16 tiles, which share every K and V fragment read from
// shared memory). Keys in blocks of BN, ascending; the online softmax keeps,
// per row, the running max m (raw score units), the sum l of exp2((s - m) *
// scale * log2 e) (each thread its partial over its columns) and O
// unnormalised. A warp whose rows all precede a key block skips it (its
// probabilities there would be exactly 0 and its state unchanged).

constexpr int FWD_WARPS = 4, FWD_BN = 64, FWD_THREADS = 32 * FWD_WARPS;
// m16 tiles per warp: two up to D 128; one at D 256, where two would hold
// 2 x 128 accumulators of O per thread and spill
template <int D> __host__ __device__ constexpr int fwd_mt() { return D > 128 ? 1 : 2; }
template <int D> __host__ __device__ constexpr int fwd_bm() { return 16 * fwd_mt<D>() * FWD_WARPS; }

template <int D> constexpr int fwd_smem_bytes() { return (fwd_bm<D>() + 4 * FWD_BN) * (D + 8) * 2; }

// acc[mt][16 x 8*NT] += A_mt(16 x D) * B^T for MT m-tiles of 16 rows at sA,
// sA + 16 LD, ...: every B fragment is read once for all MT tiles.
template <int D, int MT, int NT>
__device__ __forceinline__ void mma_abt_m(float (&acc)[MT][NT][4], const bf16 *sA, const bf16 *sB, int lane)
{
    constexpr int LD = D + 8;
    const bf16 *pa = sA + lda_row(lane) * LD + lda_col(lane);
    const bf16 *pb = sB + ldb_row(lane) * LD + ldb_col(lane);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) ldsm_x4(a[mt], pa + mt * 16 * LD + kk * 16);
#pragma unroll
        for (int np = 0; np < NT / 2; ++np) {
            uint32_t b[4];
            ldsm_x4(b, pb + np * 16 * LD + kk * 16);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma_bf16(acc[mt][2 * np], a[mt], b[0], b[1]);
                mma_bf16(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// acc[mt][16 x D] += P_mt(16 x 16*KT) * V(16*KT x D), as mma_pv for MT m-tiles.
template <int D, int MT, int KT>
__device__ __forceinline__ void mma_pv_m(float (&acc)[MT][D / 8][4], const float (&p)[MT][2 * KT][4],
                                         const bf16 *sV, int lane)
{
    constexpr int LD = D + 8;
    const bf16 *pv = sV + lda_row(lane) * LD + lda_col(lane);
#pragma unroll
    for (int kk = 0; kk < KT; ++kk) {
        uint32_t a[MT][4];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
            a[mt][0] = pack_bf16(p[mt][2 * kk][0], p[mt][2 * kk][1]);
            a[mt][1] = pack_bf16(p[mt][2 * kk][2], p[mt][2 * kk][3]);
            a[mt][2] = pack_bf16(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
            a[mt][3] = pack_bf16(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int dp = 0; dp < D / 16; ++dp) {
            uint32_t b[4];
            ldsm_x4_t(b, pv + kk * 16 * LD + dp * 16);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                mma_bf16(acc[mt][2 * dp], a[mt], b[0], b[1]);
                mma_bf16(acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
            }
        }
    }
}

// With documents (or a sliding window): the end of the queries that see any key before kend. Query i
// sees the keys [st[i], i] and st is nondecreasing, so they are the queries before the first i with
// st[i] >= kend; S without documents. A key block's dK and dV stop there: later query blocks would
// only add zeros.
__device__ __forceinline__ int queries_seeing(const int32_t *st, int S, int kend)
{
    if (!st) return S;
    int lo = 0, hi = S;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (st[mid] >= kend) hi = mid;
        else lo = mid + 1;
    }
    return lo;
}

template <int D, bool PAD, bool DOCS, bool CAP>
__global__ void __launch_bounds__(FWD_THREADS, 2)
    fwd_bf16_kernel(bf16 *__restrict__ out, float *__restrict__ lse, const bf16 *__restrict__ q,
                    const bf16 *__restrict__ k, const bf16 *__restrict__ v, const int32_t *__restrict__ doc_start, int S,
                    int H, int Hkv, int dh_arg, float scale, float cap)
{
    const int dh = PAD ? dh_arg : D; // the head's own size: the tile's D unless padded
    constexpr int BM = fwd_bm<D>(), BN = FWD_BN, MT = fwd_mt<D>(), LD = D + 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(smem); // (BM, LD)
    bf16 *sK = sQ + BM * LD;                   // 2 x (BN, LD)
    bf16 *sV = sK + 2 * BN * LD;               // 2 x (BN, LD)

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int b = blockIdx.x / H, h = blockIdx.x % H, g = h / (H / Hkv);
    const int m0 = (gridDim.y - 1 - blockIdx.y) * BM;
    const size_t ldq = (size_t)H * dh, ldkv = (size_t)Hkv * dh;
    const bf16 *qg = q + ((size_t)b * S * H + h) * dh;   // (S, D), row stride ldq
    const bf16 *kg = k + ((size_t)b * S * Hkv + g) * dh; // (S, D), row stride ldkv
    const bf16 *vg = v + ((size_t)b * S * Hkv + g) * dh;
    const int nkb = (min(S, m0 + BM) - 1) / BN + 1; // key blocks this query block sees
    const float mul = CAP ? 1.f : scale; // scores held in raw units, or capped ones (already scaled)
    const float sl2 = mul * LOG2E;
    // documents: the rows' first keys, nondecreasing, so no row of the block sees a key before st[m0]
    // (a template flag: without documents the kernel compiles as if they did not exist)
    const int32_t *st = DOCS ? doc_start + (size_t)b * S : nullptr;
    const int kb0 = st ? st[m0] / BN : 0;

    load_tile<BM, D, FWD_THREADS>(sQ, qg, ldq, m0, S, dh, tid);
    load_tile<BN, D, FWD_THREADS>(sK, kg, ldkv, kb0 * BN, S, dh, tid);
    load_tile<BN, D, FWD_THREADS>(sV, vg, ldkv, kb0 * BN, S, dh, tid);
    cp_async_commit();

    float o[MT][D / 8][4];
    float mrow[MT][2], lrow[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
        for (int j = 0; j < D / 8; ++j) o[mt][j][0] = o[mt][j][1] = o[mt][j][2] = o[mt][j][3] = 0.f;
        mrow[mt][0] = mrow[mt][1] = -INFINITY;
        lrow[mt][0] = lrow[mt][1] = 0.f;
    }
    const int wrow0 = m0 + warp * 16 * MT; // the warp's first query row
    const int r0 = wrow0 + (lane >> 2);    // this thread's rows: r0 + 16 mt, r0 + 16 mt + 8
    const int c0 = 2 * (lane & 3);         // and columns c0, c0 + 1 of each n-tile
    const bf16 *sQw = sQ + warp * 16 * MT * LD;
    int rs[MT][2]; // the first key of each of this thread's rows (0 without documents)
    int wlast = 0; // the latest first key of the warp's rows
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) rs[mt][r] = st ? st[min(r0 + mt * 16 + r * 8, S - 1)] : 0;
    if (st) wlast = st[min(wrow0 + 16 * MT - 1, S - 1)];

    for (int it = kb0; it < nkb; ++it) {
        const int buf = (it - kb0) & 1;
        if (it + 1 < nkb) {
            load_tile<BN, D, FWD_THREADS>(sK + (buf ^ 1) * BN * LD, kg, ldkv, (it + 1) * BN, S, dh, tid);
            load_tile<BN, D, FWD_THREADS>(sV + (buf ^ 1) * BN * LD, vg, ldkv, (it + 1) * BN, S, dh, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();

        const int n0 = it * BN;
        if (n0 <= wrow0 + 16 * MT - 1) { // else every key of the block follows every row of the warp
            float s[MT][BN / 8][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < BN / 8; ++j) s[mt][j][0] = s[mt][j][1] = s[mt][j][2] = s[mt][j][3] = 0.f;
            mma_abt_m<D, MT, BN / 8>(s, sQw, sK + buf * BN * LD, lane);
            if constexpr (CAP) { // before the mask: masked scores become -inf, not -cap
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) s[mt][j][e] = cap_tanh(s[mt][j][e], scale, cap) * cap;
            }

            // the causal diagonal (or the end of the keys), or a document's start, crosses the warp's rows
            if (n0 + BN - 1 > wrow0 || n0 < wlast) {
#pragma unroll
                for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                    for (int j = 0; j < BN / 8; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) {
                            const int key = n0 + j * 8 + c0 + (e & 1);
                            if (key > r0 + mt * 16 + (e >> 1) * 8 || key < rs[mt][e >> 1]) s[mt][j][e] = -INFINITY;
                        }
            }

#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    float mx = mrow[mt][r];
#pragma unroll
                    for (int j = 0; j < BN / 8; ++j) mx = fmaxf(mx, fmaxf(s[mt][j][2 * r], s[mt][j][2 * r + 1]));
                    mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 1));
                    mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, 2));
                    const float mref = mx == -INFINITY ? 0.f : mx; // no key yet: every key so far is another document's
                    const float alpha = ex2((mrow[mt][r] - mref) * sl2);
                    const float msc = mref * sl2;
                    mrow[mt][r] = mx;
                    float sum = 0.f;
#pragma unroll
                    for (int j = 0; j < BN / 8; ++j) {
                        s[mt][j][2 * r] = ex2(fmaf(s[mt][j][2 * r], sl2, -msc));
                        s[mt][j][2 * r + 1] = ex2(fmaf(s[mt][j][2 * r + 1], sl2, -msc));
                        sum += s[mt][j][2 * r] + s[mt][j][2 * r + 1];
                    }
                    lrow[mt][r] = lrow[mt][r] * alpha + sum;
#pragma unroll
                    for (int j = 0; j < D / 8; ++j) {
                        o[mt][j][2 * r] *= alpha;
                        o[mt][j][2 * r + 1] *= alpha;
                    }
                }

            mma_pv_m<D, MT, BN / 16>(o, s, sV + buf * BN * LD, lane);
        }
        __syncthreads(); // every warp is done with buf before it is refilled
    }

#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float l = lrow[mt][r];
            l += __shfl_xor_sync(FULL, l, 1);
            l += __shfl_xor_sync(FULL, l, 2);
            const int row = r0 + mt * 16 + r * 8;
            if (row < S) {
                const float inv = 1.f / l;
                bf16 *op = out + (((size_t)b * S + row) * H + h) * dh + c0;
#pragma unroll
                for (int j = 0; j < D / 8; ++j)
                    if (j * 8 < dh)
                        *reinterpret_cast<uint32_t *>(op + j * 8) =
                            pack_bf16(o[mt][j][2 * r] * inv, o[mt][j][2 * r + 1] * inv);
                if ((lane & 3) == 0) lse[((size_t)b * H + h) * S + row] = mrow[mt][r] * mul + logf(l);
            }
        }
}

// ---------------------------------------------------------------------------
// CUDA kernels: bf16 backward
//
// D_i = rowsum(dout * out) first (bwd_di_kernel). Then two passes, each
// owning its outputs:
//  dq:   grid (B*H, ceil(S/BQ)); a block owns BQ query rows of one head and
//        walks its key blocks in ascending order: S = Q K^T, P = exp2(S*scale*log2e
//        - lse*log2e), dP = dO V^T, dS = P (dP - D_i), dQ += dS K.
//  dkdv: grid (B*Hkv, ceil(S/BK)); a block owns BK key rows of one kv head and
//        walks the query heads of its group, and for each the query blocks
//        from the diagonal on, in order: S^T = K Q^T, P^T, dV += P^T dO,
//        dP^T = V dO^T, dS^T = P^T (dP^T - D_i), dK += dS^T Q.
// Both work on transposed-or-not tiles so that each warp owns 16 output rows.

constexpr int BWD_B = 64, BWD_THREADS = 128; // query rows and key rows per tile, both passes

template <int D> constexpr int bwd_dq_smem_bytes() { return (2 * BWD_B + 4 * BWD_B) * (D + 8) * 2; }
template <int D> constexpr int bwd_dkdv_smem_bytes() { return (2 * BWD_B + 4 * BWD_B) * (D + 8) * 2 + 6 * BWD_B * 4; }

template <int D, bool PAD, bool DOCS, bool CAP>
__global__ void __launch_bounds__(BWD_THREADS, 2)
    bwd_dq_bf16_kernel(bf16 *__restrict__ dq, const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                       const bf16 *__restrict__ v, const bf16 *__restrict__ dout, const float *__restrict__ lse,
                       const float *__restrict__ Di, const int32_t *__restrict__ doc_start, int S, int H, int Hkv,
                       int dh_arg, float scale, float cap)
{
    const int dh = PAD ? dh_arg : D; // the head's own size: the tile's D unless padded
    constexpr int BM = BWD_B, BN = BWD_B, LD = D + 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sQ = reinterpret_cast<bf16 *>(smem); // (BM, LD)
    bf16 *sO = sQ + BM * LD;                   // dout (BM, LD)
    bf16 *sK = sO + BM * LD;                   // 2 x (BN, LD)
    bf16 *sV = sK + 2 * BN * LD;               // 2 x (BN, LD)

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int b = blockIdx.x / H, h = blockIdx.x % H, g = h / (H / Hkv);
    const int m0 = (gridDim.y - 1 - blockIdx.y) * BM;
    const size_t ldq = (size_t)H * dh, ldkv = (size_t)Hkv * dh;
    const bf16 *qg = q + ((size_t)b * S * H + h) * dh;
    const bf16 *og = dout + ((size_t)b * S * H + h) * dh;
    const bf16 *kg = k + ((size_t)b * S * Hkv + g) * dh;
    const bf16 *vg = v + ((size_t)b * S * Hkv + g) * dh;
    const int nkb = (min(S, m0 + BM) - 1) / BN + 1;
    const float sl2 = scale * LOG2E;
    const int32_t *st = DOCS ? doc_start + (size_t)b * S : nullptr; // (a template flag, as in the forward)
    const int kb0 = st ? st[m0] / BN : 0; // no row of the block sees a key before st[m0]

    load_tile<BM, D, BWD_THREADS>(sQ, qg, ldq, m0, S, dh, tid);
    load_tile<BM, D, BWD_THREADS>(sO, og, ldq, m0, S, dh, tid);
    load_tile<BN, D, BWD_THREADS>(sK, kg, ldkv, kb0 * BN, S, dh, tid);
    load_tile<BN, D, BWD_THREADS>(sV, vg, ldkv, kb0 * BN, S, dh, tid);
    cp_async_commit();

    const int wrow0 = m0 + warp * 16, r0 = wrow0 + (lane >> 2), c0 = 2 * (lane & 3);
    const int rs[2] = {st ? st[min(r0, S - 1)] : 0, st ? st[min(r0 + 8, S - 1)] : 0};
    const int wlast = st ? st[min(wrow0 + 15, S - 1)] : 0;
    float lse2[2], di[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r0 + r * 8;
        const size_t idx = ((size_t)b * H + h) * S + row;
        lse2[r] = row < S ? lse[idx] * LOG2E : 0.f;
        di[r] = row < S ? Di[idx] : 0.f;
    }
    float acc[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;

    for (int it = kb0; it < nkb; ++it) {
        const int buf = (it - kb0) & 1;
        if (it + 1 < nkb) {
            load_tile<BN, D, BWD_THREADS>(sK + (buf ^ 1) * BN * LD, kg, ldkv, (it + 1) * BN, S, dh, tid);
            load_tile<BN, D, BWD_THREADS>(sV + (buf ^ 1) * BN * LD, vg, ldkv, (it + 1) * BN, S, dh, tid);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16 *cK = sK + buf * BN * LD, *cV = sV + buf * BN * LD;

        float s[BN / 8][4], dp[BN / 8][4];
#pragma unroll
        for (int j = 0; j < BN / 8; ++j) {
            s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.f;
            dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
        }
        mma_abt<D, BN / 8>(s, sQ + warp * 16 * LD, cK, lane);
        mma_abt<D, BN / 8>(dp, sO + warp * 16 * LD, cV, lane);

        const int n0 = it * BN;
        const bool diag = n0 + BN - 1 > wrow0 || n0 < wlast;
#pragma unroll
        for (int j = 0; j < BN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int r = e >> 1, key = n0 + j * 8 + c0 + (e & 1);
                if constexpr (CAP) { // P = exp(c - lse), dS = P (dP - D_i) (1 - t^2)
                    const float t = cap_tanh(s[j][e], scale, cap);
                    float p = ex2(fmaf(t * cap, LOG2E, -lse2[r]));
                    if (diag && (key > r0 + r * 8 || key < rs[r])) p = 0.f;
                    dp[j][e] = p * (dp[j][e] - di[r]) * (1.f - t * t);
                } else {
                    float p = ex2(fmaf(s[j][e], sl2, -lse2[r]));
                    if (diag && (key > r0 + r * 8 || key < rs[r])) p = 0.f;
                    dp[j][e] = p * (dp[j][e] - di[r]); // dS
                }
            }
        mma_pv<D, BN / 16>(acc, dp, cK, lane);
        __syncthreads();
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int row = r0 + r * 8;
        if (row < S) {
            bf16 *p = dq + (((size_t)b * S + row) * H + h) * dh + c0;
#pragma unroll
            for (int j = 0; j < D / 8; ++j)
                if (j * 8 < dh)
                    *reinterpret_cast<uint32_t *>(p + j * 8) =
                        pack_bf16(acc[j][2 * r] * scale, acc[j][2 * r + 1] * scale);
        }
    }
}

template <int D, bool PAD, bool DOCS, bool CAP>
__global__ void __launch_bounds__(BWD_THREADS, 2)
    bwd_dkdv_bf16_kernel(bf16 *__restrict__ dk, bf16 *__restrict__ dv, const bf16 *__restrict__ q,
                         const bf16 *__restrict__ k, const bf16 *__restrict__ v, const bf16 *__restrict__ dout,
                         const float *__restrict__ lse, const float *__restrict__ Di,
                         const int32_t *__restrict__ doc_start, int S, int H, int Hkv, int dh_arg, float scale,
                         float cap)
{
    const int dh = PAD ? dh_arg : D; // the head's own size: the tile's D unless padded
    constexpr int BM = BWD_B, BN = BWD_B, LD = D + 8;
    extern __shared__ __align__(128) unsigned char smem[];
    bf16 *sK = reinterpret_cast<bf16 *>(smem); // (BN, LD)
    bf16 *sV = sK + BN * LD;                   // (BN, LD)
    bf16 *sQ = sV + BN * LD;                   // 2 x (BM, LD)
    bf16 *sO = sQ + 2 * BM * LD;               // dout, 2 x (BM, LD)
    float *sL = reinterpret_cast<float *>(sO + 2 * BM * LD); // 2 x BM: lse * log2 e (+inf past S)
    float *sD = sL + 2 * BM;                                  // 2 x BM: D_i (0 past S)
    int *sSt = reinterpret_cast<int *>(sD + 2 * BM);          // 2 x BM: the queries' first keys (documents)

    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int b = blockIdx.x / Hkv, g = blockIdx.x % Hkv, rep = H / Hkv;
    const int n0 = blockIdx.y * BN; // block y = 0: the keys with the most queries, first
    const int32_t *st = DOCS ? doc_start + (size_t)b * S : nullptr; // (a template flag, as in the forward)
    const int mstart = n0 / BM, nmb = (queries_seeing(st, S, n0 + BN) + BM - 1) / BM;
    const int per_head = nmb - mstart, total = rep * per_head;
    const size_t ldq = (size_t)H * dh, ldkv = (size_t)Hkv * dh;
    const bf16 *kg = k + ((size_t)b * S * Hkv + g) * dh;
    const bf16 *vg = v + ((size_t)b * S * Hkv + g) * dh;
    const float sl2 = scale * LOG2E;

    // iteration it: head h = g*rep + it / per_head, query block mstart + it % per_head
    auto issue = [&](int it, int buf) {
        const int h = g * rep + it / per_head, qm0 = (mstart + it % per_head) * BM;
        const size_t off = ((size_t)b * S * H + h) * dh;
        load_tile<BM, D, BWD_THREADS>(sQ + buf * BM * LD, q + off, ldq, qm0, S, dh, tid);
        load_tile<BM, D, BWD_THREADS>(sO + buf * BM * LD, dout + off, ldq, qm0, S, dh, tid);
    };
    // threads 0..BM-1 fetch lse, BM..2BM-1 fetch D_i of iteration it's query rows
    auto fetch_row = [&](int it) -> float {
        const int h = g * rep + it / per_head, qi = (mstart + it % per_head) * BM + (tid & (BM - 1));
        const size_t idx = ((size_t)b * H + h) * S + qi;
        if (tid < BM) return qi < S ? lse[idx] * LOG2E : INFINITY;
        return qi < S ? Di[idx] : 0.f;
    };
    static_assert(BWD_THREADS == 2 * BM, "one thread per lse and per D_i value");
    // threads 0..BM-1 also fetch the first key of iteration it's query rows
    auto fetch_start = [&](int it) -> int {
        const int qi = (mstart + it % per_head) * BM + (tid & (BM - 1));
        return st && qi < S ? st[qi] : 0;
    };

    load_tile<BN, D, BWD_THREADS>(sK, kg, ldkv, n0, S, dh, tid);
    load_tile<BN, D, BWD_THREADS>(sV, vg, ldkv, n0, S, dh, tid);
    issue(0, 0);
    cp_async_commit();
    {
        const float x = fetch_row(0);
        if (tid < BM) {
            sL[tid] = x;
            if (DOCS) sSt[tid] = fetch_start(0);
        }
        else sD[tid - BM] = x;
    }

    float dka[D / 8][4], dva[D / 8][4];
#pragma unroll
    for (int j = 0; j < D / 8; ++j) {
        dka[j][0] = dka[j][1] = dka[j][2] = dka[j][3] = 0.f;
        dva[j][0] = dva[j][1] = dva[j][2] = dva[j][3] = 0.f;
    }
    const int wkey0 = n0 + warp * 16, k0 = wkey0 + (lane >> 2), c0 = 2 * (lane & 3); // keys k0, k0 + 8
    const bf16 *sKw = sK + warp * 16 * LD, *sVw = sV + warp * 16 * LD;

    for (int it = 0; it < total; ++it) {
        const int buf = it & 1;
        float next = 0.f;
        int next_st = 0;
        if (it + 1 < total) {
            issue(it + 1, buf ^ 1);
            next = fetch_row(it + 1);
            if (DOCS && tid < BM) next_st = fetch_start(it + 1);
        }
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();
        const bf16 *cQ = sQ + buf * BM * LD, *cO = sO + buf * BM * LD;
        const float *cL = sL + buf * BM, *cD = sD + buf * BM;
        const int *cSt = sSt + buf * BM;
        const int qm0 = (mstart + it % per_head) * BM;

        float pt[BM / 8][4]; // S^T, then P^T: (16 keys, BM queries) per warp
#pragma unroll
        for (int j = 0; j < BM / 8; ++j) pt[j][0] = pt[j][1] = pt[j][2] = pt[j][3] = 0.f;
        mma_abt<D, BM / 8>(pt, sKw, cQ, lane);
        const bool diag = wkey0 + 15 > qm0;
        float dct[CAP ? BM / 8 : 1][4]; // CAP: dc/du = 1 - t^2 of each score, for dS
#pragma unroll
        for (int j = 0; j < BM / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                const int qi = j * 8 + c0 + (e & 1), key = k0 + (e >> 1) * 8;
                float p;
                if constexpr (CAP) {
                    const float t = cap_tanh(pt[j][e], scale, cap);
                    dct[j][e] = 1.f - t * t;
                    p = ex2(fmaf(t * cap, LOG2E, -cL[qi]));
                } else {
                    p = ex2(fmaf(pt[j][e], sl2, -cL[qi]));
                }
                if ((diag && key > qm0 + qi) || (st && key < cSt[qi])) p = 0.f;
                pt[j][e] = p;
            }
        mma_pv<D, BM / 16>(dva, pt, cO, lane);

        float dp[BM / 8][4]; // dP^T, then dS^T
#pragma unroll
        for (int j = 0; j < BM / 8; ++j) dp[j][0] = dp[j][1] = dp[j][2] = dp[j][3] = 0.f;
        mma_abt<D, BM / 8>(dp, sVw, cO, lane);
#pragma unroll
        for (int j = 0; j < BM / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
                if constexpr (CAP) dp[j][e] = pt[j][e] * (dp[j][e] - cD[j * 8 + c0 + (e & 1)]) * dct[j][e];
                else dp[j][e] = pt[j][e] * (dp[j][e] - cD[j * 8 + c0 + (e & 1)]);
            }
        mma_pv<D, BM / 16>(dka, dp, cQ, lane);

        if (it + 1 < total) { // buf ^ 1 was last read in iteration it - 1, before its closing barrier
            if (tid < BM) {
                sL[(buf ^ 1) * BM + tid] = next;
                if (DOCS) sSt[(buf ^ 1) * BM + tid] = next_st;
            }
            else sD[(buf ^ 1) * BM + tid - BM] = next;
        }
        __syncthreads();
    }

#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int key = k0 + r * 8;
        if (key < S) {
            const size_t off = (((size_t)b * S + key) * Hkv + g) * dh + c0;
#pragma unroll
            for (int j = 0; j < D / 8; ++j) {
                if (j * 8 >= dh) break;
                *reinterpret_cast<uint32_t *>(dk + off + j * 8) =
                    pack_bf16(dka[j][2 * r] * scale, dka[j][2 * r + 1] * scale);
                *reinterpret_cast<uint32_t *>(dv + off + j * 8) = pack_bf16(dva[j][2 * r], dva[j][2 * r + 1]);
            }
        }
    }
}

// D_i = sum_d dout[b,i,h,d] * out[b,i,h,d] in fp32, one warp per (b, i, h),
// the lanes' partial sums combined by a fixed butterfly.
__device__ __forceinline__ float2 load2(const bf16 *p)
{
    return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(p));
}
__device__ __forceinline__ float2 load2(const float *p) { return *reinterpret_cast<const float2 *>(p); }

template <typename T>
__global__ void __launch_bounds__(256)
    bwd_di_kernel(float *__restrict__ Di, const T *__restrict__ dout, const T *__restrict__ out, int S, int H, int D,
                  size_t rows)
{
    const size_t row = (size_t)blockIdx.x * 8 + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const T *a = dout + row * D, *c = out + row * D;
    float sum = 0.f;
    for (int d = 2 * lane; d < D; d += 64) {
        const float2 x = load2(a + d), y = load2(c + d);
        sum = fmaf(x.x, y.x, sum);
        sum = fmaf(x.y, y.y, sum);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(FULL, sum, o);
    if (lane == 0) {
        const size_t bi = row / H; // b * S + i
        const int h = (int)(row % H);
        Di[(bi / S * H + h) * S + bi % S] = sum;
    }
}

// ---------------------------------------------------------------------------
// CUDA kernels: fp32 (reference mode)
//
// 256 threads; tiles of 16 rows (queries, or keys for dk/dv) against 64
// columns. Thread t computes the 4 dot products (row t/16, columns t%16 +
// 16u) of a tile and owns output columns t%16 + 16u of row t/16. Shared rows
// read across threads are padded to D + 1 floats.

constexpr int F_R = 16, F_C = 64, F_THREADS = 256;

template <int D> constexpr int f_fwd_smem_bytes() { return ((F_R + F_C) * (D + 1) + F_C * D + F_R * (F_C + 1) + 3 * F_R) * 4; }
template <int D> constexpr int f_bwd_smem_bytes() { return (2 * (F_R + F_C) * (D + 1) + 2 * F_R * (F_C + 1) + 3 * F_C) * 4; }

// rows [row0, row0 + n) of a (S, dh) matrix with row stride ld into s (row stride lds, D columns), zeros
// past S and past dh
template <int D>
__device__ __forceinline__ void f_load(float *s, int lds, const float *g, size_t ld, int row0, int n, int S, int dh,
                                       int tid)
{
    for (int x = tid; x < n * D; x += F_THREADS) {
        const int r = x / D, col = x % D, i = row0 + r;
        s[r * lds + col] = i < S && col < dh ? g[(size_t)i * ld + col] : 0.f;
    }
}

template <int D> __device__ __forceinline__ float f_dot(const float *a, const float *b)
{
    float acc = 0.f;
#pragma unroll 16
    for (int d = 0; d < D; ++d) acc = fmaf(a[d], b[d], acc);
    return acc;
}

template <int D, bool PAD, bool CAP>
__global__ void __launch_bounds__(F_THREADS)
    fwd_f32_kernel(float *__restrict__ out, float *__restrict__ lse, const float *__restrict__ q,
                   const float *__restrict__ k, const float *__restrict__ v, const int32_t *__restrict__ doc_start, int S,
                   int H, int Hkv, int dh_arg, float scale_arg, float cap)
{
    // CAP: the capped scores are already scaled, so the softmax's scale is 1
    const float scale = CAP ? 1.f : scale_arg;
    const int dh = PAD ? dh_arg : D; // the head's own size: the tile's D unless padded
    constexpr int LDP = D + 1, LDS = F_C + 1;
    extern __shared__ __align__(128) unsigned char smem[];
    float *sQ = reinterpret_cast<float *>(smem); // (F_R, LDP)
    float *sK = sQ + F_R * LDP;                  // (F_C, LDP)
    float *sV = sK + F_C * LDP;                  // (F_C, D)
    float *sP = sV + F_C * D;                    // (F_R, LDS)
    float *sM = sP + F_R * LDS, *sL = sM + F_R, *sA = sL + F_R;

    const int tid = threadIdx.x, row = tid >> 4, c = tid & 15;
    const int b = blockIdx.x / H, h = blockIdx.x % H, g = h / (H / Hkv);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * F_R, qi = q0 + row;
    const size_t ldq = (size_t)H * dh, ldkv = (size_t)Hkv * dh;
    const float *kg = k + ((size_t)b * S * Hkv + g) * dh, *vg = v + ((size_t)b * S * Hkv + g) * dh;
    const int nkt = (min(S, q0 + F_R) - 1) / F_C + 1;
    const int32_t *st = doc_start ? doc_start + (size_t)b * S : nullptr;
    const int kt0 = st ? st[q0] / F_C : 0;          // no row of the block sees a key before st[q0]
    const int first = st && qi < S ? st[qi] : 0; // this row's first key

    f_load<D>(sQ, LDP, q + ((size_t)b * S * H + h) * dh, ldq, q0, F_R, S, dh, tid);
    if (tid < F_R) {
        sM[tid] = -INFINITY;
        sL[tid] = 0.f;
    }
    float o[D / 16];
#pragma unroll
    for (int u = 0; u < D / 16; ++u) o[u] = 0.f;

    for (int t = kt0; t < nkt; ++t) {
        const int k0 = t * F_C;
        __syncthreads();
        f_load<D>(sK, LDP, kg, ldkv, k0, F_C, S, dh, tid);
        f_load<D>(sV, D, vg, ldkv, k0, F_C, S, dh, tid);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int j = c + 16 * u, key = k0 + j;
            float s = f_dot<D>(sQ + row * LDP, sK + j * LDP);
            if constexpr (CAP) s = cap_tanh(s, scale_arg, cap) * cap;
            sP[row * LDS + j] = key <= qi && key < S && key >= first ? s : -INFINITY;
        }
        __syncthreads();
        { // softmax: warp w updates rows 2w and 2w + 1
            const int w = tid >> 5, lane = tid & 31;
            for (int rr = 0; rr < 2; ++rr) {
                const int r = 2 * w + rr;
                const float x0 = sP[r * LDS + lane], x1 = sP[r * LDS + lane + 32];
                float mx = fmaxf(x0, x1);
#pragma unroll
                for (int o2 = 16; o2 > 0; o2 >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, o2));
                const float mold = sM[r], mnew = fmaxf(mold, mx);
                const float mref = mnew == -INFINITY ? 0.f : mnew;
                const float p0 = expf((x0 - mref) * scale), p1 = expf((x1 - mref) * scale);
                float sum = p0 + p1;
#pragma unroll
                for (int o2 = 16; o2 > 0; o2 >>= 1) sum += __shfl_xor_sync(FULL, sum, o2);
                const float alpha = expf((mold - mref) * scale);
                sP[r * LDS + lane] = p0;
                sP[r * LDS + lane + 32] = p1;
                __syncwarp();
                if (lane == 0) {
                    sM[r] = mnew;
                    sL[r] = sL[r] * alpha + sum;
                    sA[r] = alpha;
                }
            }
        }
        __syncthreads();
        const float alpha = sA[row];
#pragma unroll
        for (int u = 0; u < D / 16; ++u) {
            const int d = c + 16 * u;
            float acc = o[u] * alpha;
            for (int j = 0; j < F_C; ++j) acc = fmaf(sP[row * LDS + j], sV[j * D + d], acc);
            o[u] = acc;
        }
    }
    if (qi < S) {
        const float l = sL[row];
        float *op = out + (((size_t)b * S + qi) * H + h) * dh;
#pragma unroll
        for (int u = 0; u < D / 16; ++u)
            if (c + 16 * u < dh) op[c + 16 * u] = o[u] / l;
        if (c == 0) lse[((size_t)b * H + h) * S + qi] = sM[row] * scale + logf(l);
    }
}

template <int D, bool PAD, bool CAP>
__global__ void __launch_bounds__(F_THREADS)
    bwd_dq_f32_kernel(float *__restrict__ dq, const float *__restrict__ q, const float *__restrict__ k,
                      const float *__restrict__ v, const float *__restrict__ dout, const float *__restrict__ lse,
                      const float *__restrict__ Di, const int32_t *__restrict__ doc_start, int S, int H, int Hkv,
                       int dh_arg, float scale, float cap)
{
    const int dh = PAD ? dh_arg : D; // the head's own size: the tile's D unless padded
    constexpr int LDP = D + 1, LDS = F_C + 1;
    extern __shared__ __align__(128) unsigned char smem[];
    float *sQ = reinterpret_cast<float *>(smem); // (F_R, LDP)
    float *sO = sQ + F_R * LDP;                  // dout (F_R, LDP)
    float *sK = sO + F_R * LDP;                  // (F_C, LDP)
    float *sV = sK + F_C * LDP;                  // (F_C, LDP)
    float *sS = sV + F_C * LDP;                  // dS (F_R, LDS)

    const int tid = threadIdx.x, row = tid >> 4, c = tid & 15;
    const int b = blockIdx.x / H, h = blockIdx.x % H, g = h / (H / Hkv);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * F_R, qi = q0 + row;
    const size_t ldq = (size_t)H * dh, ldkv = (size_t)Hkv * dh;
    const float *kg = k + ((size_t)b * S * Hkv + g) * dh, *vg = v + ((size_t)b * S * Hkv + g) * dh;
    const int nkt = (min(S, q0 + F_R) - 1) / F_C + 1;
    const int32_t *st = doc_start ? doc_start + (size_t)b * S : nullptr;
    const int kt0 = st ? st[q0] / F_C : 0;          // no row of the block sees a key before st[q0]
    const int first = st && qi < S ? st[qi] : 0; // this row's first key
    const size_t qoff = ((size_t)b * S * H + h) * dh;

    f_load<D>(sQ, LDP, q + qoff, ldq, q0, F_R, S, dh, tid);
    f_load<D>(sO, LDP, dout + qoff, ldq, q0, F_R, S, dh, tid);
    const size_t ridx = ((size_t)b * H + h) * S + qi;
    const float lrow = qi < S ? lse[ridx] : 0.f, drow = qi < S ? Di[ridx] : 0.f;
    float acc[D / 16];
#pragma unroll
    for (int u = 0; u < D / 16; ++u) acc[u] = 0.f;

    for (int t = kt0; t < nkt; ++t) {
        const int k0 = t * F_C;
        __syncthreads();
        f_load<D>(sK, LDP, kg, ldkv, k0, F_C, S, dh, tid);
        f_load<D>(sV, LDP, vg, ldkv, k0, F_C, S, dh, tid);
        __syncthreads();
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int j = c + 16 * u, key = k0 + j;
            const float s = f_dot<D>(sQ + row * LDP, sK + j * LDP);
            const float dp = f_dot<D>(sO + row * LDP, sV + j * LDP);
            if constexpr (CAP) { // P = exp(c - lse), dS = P (dP - D_i) (1 - t^2)
                const float t = cap_tanh(s, scale, cap);
                const float p = key <= qi && key < S && key >= first ? expf(t * cap - lrow) : 0.f;
                sS[row * LDS + j] = p * (dp - drow) * (1.f - t * t);
            } else {
                const float p = key <= qi && key < S && key >= first ? expf(s * scale - lrow) : 0.f;
                sS[row * LDS + j] = p * (dp - drow);
            }
        }
        __syncthreads();
#pragma unroll
        for (int u = 0; u < D / 16; ++u) {
            const int d = c + 16 * u;
            float a = acc[u];
            for (int j = 0; j < F_C; ++j) a = fmaf(sS[row * LDS + j], sK[j * LDP + d], a);
            acc[u] = a;
        }
    }
    if (qi < S) {
        float *p = dq + (((size_t)b * S + qi) * H + h) * dh;
#pragma unroll
        for (int u = 0; u < D / 16; ++u)
            if (c + 16 * u < dh) p[c + 16 * u] = acc[u] * scale;
    }
}

template <int D, bool PAD, bool CAP>
__global__ void __launch_bounds__(F_THREADS)
    bwd_dkdv_f32_kernel(float *__restrict__ dk, float *__restrict__ dv, const float *__restrict__ q,
                        const float *__restrict__ k, const float *__restrict__ v, const float *__restrict__ dout,
                        const float *__restrict__ lse, const float *__restrict__ Di,
                        const int32_t *__restrict__ doc_start, int S, int H, int Hkv, int dh_arg, float scale,
                        float cap)
{
    const int dh = PAD ? dh_arg : D; // the head's own size: the tile's D unless padded
    constexpr int LDP = D + 1, LDS = F_C + 1;
    extern __shared__ __align__(128) unsigned char smem[];
    float *sK = reinterpret_cast<float *>(smem); // (F_R, LDP)
    float *sV = sK + F_R * LDP;                  // (F_R, LDP)
    float *sQ = sV + F_R * LDP;                  // (F_C, LDP)
    float *sO = sQ + F_C * LDP;                  // dout (F_C, LDP)
    float *sP = sO + F_C * LDP;                  // P^T (F_R, LDS)
    float *sS = sP + F_R * LDS;                  // dS^T (F_R, LDS)
    float *sL = sS + F_R * LDS, *sD = sL + F_C;  // (F_C) each
    int *sSt = reinterpret_cast<int *>(sD + F_C); // (F_C): the queries' first keys (documents)

    const int tid = threadIdx.x, row = tid >> 4, c = tid & 15;
    const int b = blockIdx.x / Hkv, g = blockIdx.x % Hkv, rep = H / Hkv;
    const int32_t *st = doc_start ? doc_start + (size_t)b * S : nullptr;
    const int k0 = blockIdx.y * F_R, key = k0 + row;
    const size_t ldq = (size_t)H * dh, ldkv = (size_t)Hkv * dh;
    const size_t kvoff = ((size_t)b * S * Hkv + g) * dh;

    f_load<D>(sK, LDP, k + kvoff, ldkv, k0, F_R, S, dh, tid);
    f_load<D>(sV, LDP, v + kvoff, ldkv, k0, F_R, S, dh, tid);
    float dka[D / 16], dva[D / 16];
#pragma unroll
    for (int u = 0; u < D / 16; ++u) dka[u] = dva[u] = 0.f;

    const int qend = queries_seeing(st, S, k0 + F_R);
    for (int h = g * rep; h < (g + 1) * rep; ++h) {
        const size_t qoff = ((size_t)b * S * H + h) * dh;
        for (int q0 = k0 / F_C * F_C; q0 < qend; q0 += F_C) {
            __syncthreads();
            f_load<D>(sQ, LDP, q + qoff, ldq, q0, F_C, S, dh, tid);
            f_load<D>(sO, LDP, dout + qoff, ldq, q0, F_C, S, dh, tid);
            if (tid < F_C) {
                const int qi = q0 + tid;
                const size_t idx = ((size_t)b * H + h) * S + qi;
                sL[tid] = qi < S ? lse[idx] : 0.f;
                sD[tid] = qi < S ? Di[idx] : 0.f;
                sSt[tid] = st && qi < S ? st[qi] : 0;
            }
            __syncthreads();
#pragma unroll
            for (int u = 0; u < 4; ++u) {
                const int j = c + 16 * u, qi = q0 + j;
                const float s = f_dot<D>(sK + row * LDP, sQ + j * LDP);
                const float dp = f_dot<D>(sV + row * LDP, sO + j * LDP);
                if constexpr (CAP) { // as in the dq pass
                    const float t = cap_tanh(s, scale, cap);
                    const float p = qi < S && key <= qi && key >= sSt[j] ? expf(t * cap - sL[j]) : 0.f;
                    sP[row * LDS + j] = p;
                    sS[row * LDS + j] = p * (dp - sD[j]) * (1.f - t * t);
                } else {
                    const float p = qi < S && key <= qi && key >= sSt[j] ? expf(s * scale - sL[j]) : 0.f;
                    sP[row * LDS + j] = p;
                    sS[row * LDS + j] = p * (dp - sD[j]);
                }
            }
            __syncthreads();
#pragma unroll
            for (int u = 0; u < D / 16; ++u) {
                const int d = c + 16 * u;
                float a = dva[u], e = dka[u];
                for (int j = 0; j < F_C; ++j) {
                    a = fmaf(sP[row * LDS + j], sO[j * LDP + d], a);
                    e = fmaf(sS[row * LDS + j], sQ[j * LDP + d], e);
                }
                dva[u] = a;
                dka[u] = e;
            }
        }
    }
    if (key < S) {
        const size_t off = (((size_t)b * S + key) * Hkv + g) * dh;
#pragma unroll
        for (int u = 0; u < D / 16; ++u) {
            if (c + 16 * u >= dh) break;
            dk[off + c + 16 * u] = dka[u] * scale;
            dv[off + c + 16 * u] = dva[u];
        }
    }
}

// Roughly normal values: a sum of four uniforms from a hash of (seed, index).
__device__ __forceinline__ uint64_t mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

template <typename T>
__global__ void fill_random_kernel(T *p, size_t n, uint64_t seed, float stddev)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const uint64_t z = mix64(seed * 0x9E3779B97F4A7C15ull + i + 1);
        float s = 0.f;
#pragma unroll
        for (int u = 0; u < 4; ++u) s += (float)((z >> (16 * u)) & 0xffff) * (1.f / 65536.f) - 0.5f;
        const float x = s * 1.7320508f * stddev; // var(sum of 4 U(-1/2, 1/2)) = 1/3
        if constexpr (sizeof(T) == 2) p[i] = __float2bfloat16_rn(x);
        else p[i] = x;
    }
}

// ---------------------------------------------------------------------------
// kernel launchers

bool misaligned(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) != 0; }

// The kernels' tile for head size D: the smallest of 32, 64, 128 and 256 that
// holds it; the columns past D are zeros in shared memory and never stored.
int tile_of(int D) { return D <= 32 ? 32 : D <= 64 ? 64 : D <= 128 ? 128 : 256; }

// 0 when the shape is supported (the grids: x = B*H, y = ceil(S/16) at most, for the fp32 kernels)
int check_shape(int dtype, int B, int S, int H, int Hkv, int D, float scale)
{
    if (dtype != MT_CUATTN_BF16 && dtype != MT_CUATTN_FP32) return MT_CUATTN_EINVAL;
    if (B < 0 || S < 0 || H <= 0 || Hkv <= 0 || H % Hkv != 0 || !(scale > 0.f) || isinf(scale))
        return MT_CUATTN_EINVAL;
    if (!mt_cuattn_head_dim_ok(D)) return MT_CUATTN_EHEADDIM;
    if ((long long)B * H > 0x7fffffffLL || (S + F_R - 1) / F_R > 65535) return MT_CUATTN_ETOOBIG;
    return MT_CUATTN_OK;
}

template <typename K> int set_smem(K kernel, int bytes)
{
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) != cudaSuccess) {
        cudaGetLastError();
        return MT_CUATTN_ECONFIG;
    }
    return MT_CUATTN_OK;
}

int launched()
{
    return cudaGetLastError() == cudaSuccess ? MT_CUATTN_OK : MT_CUATTN_ELAUNCH;
}

// Each launcher runs the kernels with the cap (CAP) when cap > 0, else the
// ones compiled without it: the path of uncapped attention is unchanged.

template <int D, bool PAD, bool DOCS, bool CAP>
int fwd_bf16_run(cudaStream_t st, void *out, float *lse, const void *q, const void *k, const void *v,
                 const int32_t *doc, int B, int S, int H, int Hkv, int dh, float scale, float cap)
{
    constexpr int smem = fwd_smem_bytes<D>();
    const dim3 grid(B * H, (S + fwd_bm<D>() - 1) / fwd_bm<D>());
    if (int e = set_smem(fwd_bf16_kernel<D, PAD, DOCS, CAP>, smem)) return e;
    fwd_bf16_kernel<D, PAD, DOCS, CAP><<<grid, FWD_THREADS, smem, st>>>(
        (bf16 *)out, lse, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, doc, S, H, Hkv, dh, scale, cap);
    return launched();
}

template <int D, bool PAD>
int fwd_bf16(cudaStream_t st, void *out, float *lse, const void *q, const void *k, const void *v,
             const int32_t *doc, int B, int S, int H, int Hkv, int dh, float scale, float cap)
{
    if (cap > 0.f)
        return doc ? fwd_bf16_run<D, PAD, true, true>(st, out, lse, q, k, v, doc, B, S, H, Hkv, dh, scale, cap)
                   : fwd_bf16_run<D, PAD, false, true>(st, out, lse, q, k, v, doc, B, S, H, Hkv, dh, scale, cap);
    return doc ? fwd_bf16_run<D, PAD, true, false>(st, out, lse, q, k, v, doc, B, S, H, Hkv, dh, scale, cap)
               : fwd_bf16_run<D, PAD, false, false>(st, out, lse, q, k, v, doc, B, S, H, Hkv, dh, scale, cap);
}

template <int D, bool PAD, bool CAP>
int fwd_f32_run(cudaStream_t st, void *out, float *lse, const void *q, const void *k, const void *v,
                const int32_t *doc, int B, int S, int H, int Hkv, int dh, float scale, float cap)
{
    constexpr int smem = f_fwd_smem_bytes<D>();
    if (int e = set_smem(fwd_f32_kernel<D, PAD, CAP>, smem)) return e;
    const dim3 grid(B * H, (S + F_R - 1) / F_R);
    fwd_f32_kernel<D, PAD, CAP><<<grid, F_THREADS, smem, st>>>((float *)out, lse, (const float *)q, (const float *)k,
                                                               (const float *)v, doc, S, H, Hkv, dh, scale, cap);
    return launched();
}

template <int D, bool PAD>
int fwd_f32(cudaStream_t st, void *out, float *lse, const void *q, const void *k, const void *v,
            const int32_t *doc, int B, int S, int H, int Hkv, int dh, float scale, float cap)
{
    return cap > 0.f ? fwd_f32_run<D, PAD, true>(st, out, lse, q, k, v, doc, B, S, H, Hkv, dh, scale, cap)
                     : fwd_f32_run<D, PAD, false>(st, out, lse, q, k, v, doc, B, S, H, Hkv, dh, scale, cap);
}

template <int D, bool PAD, bool DOCS, bool CAP>
int bwd_bf16_run(cudaStream_t st, void *dq, void *dk, void *dv, const void *dout, const float *lse, const float *Di,
                 const void *q, const void *k, const void *v, const int32_t *doc, int B, int S, int H, int Hkv, int dh,
                 float scale, float cap)
{
    constexpr int smem_dq = bwd_dq_smem_bytes<D>(), smem_kv = bwd_dkdv_smem_bytes<D>();
    if (int e = set_smem(bwd_dq_bf16_kernel<D, PAD, DOCS, CAP>, smem_dq)) return e;
    if (int e = set_smem(bwd_dkdv_bf16_kernel<D, PAD, DOCS, CAP>, smem_kv)) return e;
    const int nb = (S + BWD_B - 1) / BWD_B;
    bwd_dq_bf16_kernel<D, PAD, DOCS, CAP><<<dim3(B * H, nb), BWD_THREADS, smem_dq, st>>>(
        (bf16 *)dq, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, (const bf16 *)dout, lse, Di, doc, S, H, Hkv, dh,
        scale, cap);
    if (int e = launched()) return e;
    bwd_dkdv_bf16_kernel<D, PAD, DOCS, CAP><<<dim3(B * Hkv, nb), BWD_THREADS, smem_kv, st>>>(
        (bf16 *)dk, (bf16 *)dv, (const bf16 *)q, (const bf16 *)k, (const bf16 *)v, (const bf16 *)dout, lse, Di, doc, S,
        H, Hkv, dh, scale, cap);
    return launched();
}

template <int D, bool PAD>
int bwd_bf16(cudaStream_t st, void *dq, void *dk, void *dv, const void *dout, const float *lse, const float *Di,
             const void *q, const void *k, const void *v, const int32_t *doc, int B, int S, int H, int Hkv, int dh,
             float scale, float cap)
{
    if (cap > 0.f)
        return doc ? bwd_bf16_run<D, PAD, true, true>(st, dq, dk, dv, dout, lse, Di, q, k, v, doc, B, S, H, Hkv, dh,
                                                      scale, cap)
                   : bwd_bf16_run<D, PAD, false, true>(st, dq, dk, dv, dout, lse, Di, q, k, v, doc, B, S, H, Hkv, dh,
                                                       scale, cap);
    return doc ? bwd_bf16_run<D, PAD, true, false>(st, dq, dk, dv, dout, lse, Di, q, k, v, doc, B, S, H, Hkv, dh, scale,
                                                   cap)
               : bwd_bf16_run<D, PAD, false, false>(st, dq, dk, dv, dout, lse, Di, q, k, v, doc, B, S, H, Hkv, dh,
                                                    scale, cap);
}

template <int D, bool PAD, bool CAP>
int bwd_f32_run(cudaStream_t st, void *dq, void *dk, void *dv, const void *dout, const float *lse, const float *Di,
                const void *q, const void *k, const void *v, const int32_t *doc, int B, int S, int H, int Hkv, int dh,
                float scale, float cap)
{
    constexpr int smem = f_bwd_smem_bytes<D>();
    if (int e = set_smem(bwd_dq_f32_kernel<D, PAD, CAP>, smem)) return e;
    if (int e = set_smem(bwd_dkdv_f32_kernel<D, PAD, CAP>, smem)) return e;
    const int nb = (S + F_R - 1) / F_R;
    bwd_dq_f32_kernel<D, PAD, CAP><<<dim3(B * H, nb), F_THREADS, smem, st>>>(
        (float *)dq, (const float *)q, (const float *)k, (const float *)v, (const float *)dout, lse, Di, doc, S, H, Hkv,
        dh, scale, cap);
    if (int e = launched()) return e;
    bwd_dkdv_f32_kernel<D, PAD, CAP><<<dim3(B * Hkv, nb), F_THREADS, smem, st>>>(
        (float *)dk, (float *)dv, (const float *)q, (const float *)k, (const float *)v, (const float *)dout, lse, Di,
        doc, S, H, Hkv, dh, scale, cap);
    return launched();
}

template <int D, bool PAD>
int bwd_f32(cudaStream_t st, void *dq, void *dk, void *dv, const void *dout, const float *lse, const float *Di,
            const void *q, const void *k, const void *v, const int32_t *doc, int B, int S, int H, int Hkv, int dh,
            float scale, float cap)
{
    return cap > 0.f ? bwd_f32_run<D, PAD, true>(st, dq, dk, dv, dout, lse, Di, q, k, v, doc, B, S, H, Hkv, dh, scale,
                                                 cap)
                     : bwd_f32_run<D, PAD, false>(st, dq, dk, dv, dout, lse, Di, q, k, v, doc, B, S, H, Hkv, dh, scale,
                                                  cap);
}

} // namespace

// The launcher of fn for head size D: its tile, padded (PAD) when D is smaller.
#define BY_TILE(fn, ...)                                                                                               \
    switch (tile_of(D)) {                                                                                              \
    case 32: return D == 32 ? fn<32, false>(__VA_ARGS__) : fn<32, true>(__VA_ARGS__);                                  \
    case 64: return D == 64 ? fn<64, false>(__VA_ARGS__) : fn<64, true>(__VA_ARGS__);                                  \
    case 128: return D == 128 ? fn<128, false>(__VA_ARGS__) : fn<128, true>(__VA_ARGS__);                              \
    default: return D == 256 ? fn<256, false>(__VA_ARGS__) : fn<256, true>(__VA_ARGS__);                               \
    }

// ---------------------------------------------------------------------------
// C API

extern "C" int mt_cuattn_head_dim_ok(int D) { return D >= 8 && D <= 256 && D % 8 == 0; }

extern "C" const char *mt_cuattn_strerror(int code)
{
    switch (code) {
    case MT_CUATTN_OK: return "success";
    case MT_CUATTN_EINVAL: return "invalid argument (shape, dtype, scale or NULL pointer)";
    case MT_CUATTN_EHEADDIM: return "unsupported head dimension (D must be a multiple of 8 from 8 to 256)";
    case MT_CUATTN_EALIGN: return "a tensor is not 16-byte aligned";
    case MT_CUATTN_EWORKSPACE: return "workspace NULL, too small or misaligned";
    case MT_CUATTN_ECONFIG: return "could not set the kernel's shared-memory size";
    case MT_CUATTN_ELAUNCH: return "kernel launch failed";
    case MT_CUATTN_ETOOBIG: return "shape too large for the grid";
    case MT_CUATTN_EUNSUPPORTED: return "the Hopper kernels do not run here (they need a compute capability 9.0 device; the forward takes D 64, 128, 192 and 256, the backward 64 and 128)";
    default: return "unknown error code";
    }
}

extern "C" int mt_cuattn_forward_mma(void *stream, int dtype, void *out, float *lse, const void *q, const void *k,
                                     const void *v, const int32_t *doc_start, int B, int S, int H, int Hkv, int D,
                                     float scale, float softcap)
{
    if (int e = check_shape(dtype, B, S, H, Hkv, D, scale)) return e;
    if (!(softcap >= 0.f) || isinf(softcap)) return MT_CUATTN_EINVAL;
    if (!out || !lse || !q || !k || !v) return MT_CUATTN_EINVAL;
    if (misaligned(out, 16) || misaligned(q, 16) || misaligned(k, 16) || misaligned(v, 16) || misaligned(lse, 4))
        return MT_CUATTN_EALIGN;
    if (B == 0 || S == 0) return MT_CUATTN_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (dtype == MT_CUATTN_BF16) {
        BY_TILE(fwd_bf16, st, out, lse, q, k, v, doc_start, B, S, H, Hkv, D, scale, softcap);
    }
    BY_TILE(fwd_f32, st, out, lse, q, k, v, doc_start, B, S, H, Hkv, D, scale, softcap);
}

// The mma.sync (or fp32) kernels. The Hopper forward (mt_cuattn_sm90_forward_ex) takes the same cases
// in bf16 on compute capability 9.0, but becomes the default here only once its visit to a GPU has run
// its tests and measured it against these kernels and cuDNN (issue 36); until then it is reached through
// its own call.
extern "C" int mt_cuattn_forward_softcap(void *stream, int dtype, void *out, float *lse, const void *q,
                                         const void *k, const void *v, const int32_t *doc_start, int B, int S, int H,
                                         int Hkv, int D, float scale, float softcap)
{
    return mt_cuattn_forward_mma(stream, dtype, out, lse, q, k, v, doc_start, B, S, H, Hkv, D, scale, softcap);
}

extern "C" int mt_cuattn_forward_docs(void *stream, int dtype, void *out, float *lse, const void *q, const void *k,
                                      const void *v, const int32_t *doc_start, int B, int S, int H, int Hkv, int D,
                                      float scale)
{
    return mt_cuattn_forward_softcap(stream, dtype, out, lse, q, k, v, doc_start, B, S, H, Hkv, D, scale, 0.f);
}

extern "C" int mt_cuattn_forward(void *stream, int dtype, void *out, float *lse, const void *q, const void *k,
                                 const void *v, int B, int S, int H, int Hkv, int D, float scale)
{
    return mt_cuattn_forward_docs(stream, dtype, out, lse, q, k, v, NULL, B, S, H, Hkv, D, scale);
}

extern "C" size_t mt_cuattn_workspace_bytes(int B, int S, int H, int Hkv, int D)
{
    (void)Hkv;
    (void)D;
    if (B <= 0 || S <= 0 || H <= 0) return 0;
    return ((size_t)B * H * S * sizeof(float) + 255) / 256 * 256;
}

extern "C" int mt_cuattn_backward_softcap(void *stream, int dtype, void *dq, void *dk, void *dv, const void *dout,
                                          const void *out, const float *lse, const void *q, const void *k,
                                          const void *v, const int32_t *doc_start, int B, int S, int H, int Hkv, int D,
                                          float scale, float softcap, void *workspace, size_t workspace_bytes)
{
    if (int e = check_shape(dtype, B, S, H, Hkv, D, scale)) return e;
    if (!(softcap >= 0.f) || isinf(softcap)) return MT_CUATTN_EINVAL;
    if (!dq || !dk || !dv || !dout || !out || !lse || !q || !k || !v) return MT_CUATTN_EINVAL;
    if (misaligned(dq, 16) || misaligned(dk, 16) || misaligned(dv, 16) || misaligned(dout, 16) ||
        misaligned(out, 16) || misaligned(q, 16) || misaligned(k, 16) || misaligned(v, 16) || misaligned(lse, 4))
        return MT_CUATTN_EALIGN;
    if (B == 0 || S == 0) return MT_CUATTN_OK;
    if (!workspace || misaligned(workspace, 16) || workspace_bytes < mt_cuattn_workspace_bytes(B, S, H, Hkv, D))
        return MT_CUATTN_EWORKSPACE;
    cudaStream_t st = (cudaStream_t)stream;
    float *Di = (float *)workspace;
    const size_t rows = (size_t)B * S * H;
    const unsigned di_blocks = (unsigned)((rows + 7) / 8);
    if (dtype == MT_CUATTN_BF16) {
        bwd_di_kernel<bf16><<<di_blocks, 256, 0, st>>>(Di, (const bf16 *)dout, (const bf16 *)out, S, H, D, rows);
        if (int e = launched()) return e;
        BY_TILE(bwd_bf16, st, dq, dk, dv, dout, lse, Di, q, k, v, doc_start, B, S, H, Hkv, D, scale, softcap);
    }
    bwd_di_kernel<float><<<di_blocks, 256, 0, st>>>(Di, (const float *)dout, (const float *)out, S, H, D, rows);
    if (int e = launched()) return e;
    BY_TILE(bwd_f32, st, dq, dk, dv, dout, lse, Di, q, k, v, doc_start, B, S, H, Hkv, D, scale, softcap);
}

extern "C" int mt_cuattn_backward_docs(void *stream, int dtype, void *dq, void *dk, void *dv, const void *dout,
                                       const void *out, const float *lse, const void *q, const void *k,
                                       const void *v, const int32_t *doc_start, int B, int S, int H, int Hkv, int D,
                                       float scale, void *workspace, size_t workspace_bytes)
{
    return mt_cuattn_backward_softcap(stream, dtype, dq, dk, dv, dout, out, lse, q, k, v, doc_start, B, S, H, Hkv, D,
                                      scale, 0.f, workspace, workspace_bytes);
}

extern "C" int mt_cuattn_backward(void *stream, int dtype, void *dq, void *dk, void *dv, const void *dout,
                                  const void *out, const float *lse, const void *q, const void *k, const void *v,
                                  int B, int S, int H, int Hkv, int D, float scale, void *workspace,
                                  size_t workspace_bytes)
{
    return mt_cuattn_backward_docs(stream, dtype, dq, dk, dv, dout, out, lse, q, k, v, NULL, B, S, H, Hkv, D, scale,
                                   workspace, workspace_bytes);
}

// ---- helpers ----------------------------------------------------------------------

extern "C" int mt_cuattn_fill_random(void *stream, int dtype, void *p, size_t n, uint64_t seed, float stddev)
{
    if (!p || (dtype != MT_CUATTN_BF16 && dtype != MT_CUATTN_FP32)) return MT_CUATTN_EINVAL;
    if (n == 0) return MT_CUATTN_OK;
    const size_t want = (n + 255) / 256;
    const unsigned blocks = (unsigned)(want < 65536 ? want : 65536);
    if (dtype == MT_CUATTN_BF16)
        fill_random_kernel<bf16><<<blocks, 256, 0, (cudaStream_t)stream>>>((bf16 *)p, n, seed, stddev);
    else
        fill_random_kernel<float><<<blocks, 256, 0, (cudaStream_t)stream>>>((float *)p, n, seed, stddev);
    return launched();
}
