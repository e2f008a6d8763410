/* Causal attention forward for Hopper (attention.h, mt_cuattn_sm90_forward):
 * wgmma fed by the bulk tensor copy engine, a producer warpgroup and two
 * consumer warpgroups, in the manner of FlashAttention-3. docs/attention.md,
 * "The Hopper kernels", gives the design and its FLOP and byte counts.
 *
 * One block computes BM = 128 query rows of one (batch, head): warpgroup 0
 * produces (one thread issues the copies), warpgroups 1 and 2 consume, each
 * owning 64 of the rows. The block's Q comes once; the key blocks (BN = 128
 * keys) come K and V apart, each into a ring of STAGES shared-memory stages
 * with full/empty mbarriers, from the diagonal block down to block 0, so
 * that only the first block visited needs the causal mask.
 *
 * A consumer, per key block j (in its visiting order):
 *   S = Q K_j^T         wgmma, both operands in shared memory (K-major)
 *   online softmax      in registers: the running max m (in units of
 *                       log2 e * scale * score), P = 2^(scale log2e s - m),
 *                       the row sums l kept per thread, O rescaled
 *   O += P V_j          wgmma, P from registers (bf16, the S accumulators
 *                       repacked as A fragments), V MN-major in shared memory
 * and the product of block j + 1's S is issued before block j's P V, so the
 * softmax of one block runs while the tensor cores work on the other's
 * products (the intra-warpgroup overlap of FlashAttention-3).
 *
 * Q, K and V are read through 4-D tensor maps (D, heads, S, B) in boxes of
 * 64 columns (128 bytes, the 128-byte swizzle) by 128 rows; rows past S are
 * the copy engine's zeros. Query rows past S are computed and not stored;
 * keys past S sit above the diagonal of every stored row, so the mask
 * removes them. */
#include "cuda/kernels/attention.h"
#include "cuda/kernels/sm90.cuh"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

namespace {

constexpr int BM = 128, BN = 128, THREADS = 384, STAGES = 2;

template <int D> struct fcfg {
    static constexpr int Q_BYTES = BM * D * 2;
    static constexpr int KV_BYTES = BN * D * 2;
    static constexpr int SMEM = 1024 /* alignment */ + Q_BYTES + 2 * STAGES * KV_BYTES + (1 + 4 * STAGES) * 8;
};

struct fwd_args {
    __nv_bfloat16 *out;
    float *lse;
    int S, H, group; /* group: query heads per kv head */
    int n_mb, BH;    /* query blocks per sequence, B * H */
    float scale_log2;
};

#ifdef MT_SM90A
using namespace mt_sm90;

__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&v;
}

/* The max over the 4 threads of a row (lanes 4 r .. 4 r + 3) */
__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

/* S = Q K^T over D: 64 rows of this warpgroup (cw) against the stage's BN keys */
template <int D>
__device__ __forceinline__ void qk(float (&s)[BN / 2], const uint8_t *sQ, const uint8_t *sK, int cw)
{
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const int c = kk / 4, w = (kk % 4) * 32;
        const uint64_t da = sdesc(saddr(sQ + c * BM * 128 + cw * 64 * 128 + w), 16, 1024);
        const uint64_t db = sdesc(saddr(sK + c * BN * 128 + w), 16, 1024);
        wgmma_ss<BN, 0, 0>::run(s, da, db, kk != 0);
    }
}

/* O += P V over the stage's BN keys: P from registers, V (keys x D) MN-major, 64-column chunks BN rows apart */
template <int D>
__device__ __forceinline__ void pv(float (&o)[D / 2], const uint32_t (&p)[BN / 16][4], const uint8_t *sV)
{
#pragma unroll
    for (int t = 0; t < BN / 16; t++) {
        const uint64_t db = sdesc(saddr(sV + t * 2048), BN * 128, 1024);
        wgmma_rs<D, 1>::run(o, p[t], db, 1);
    }
}

/* The online softmax of one key block's scores s (scaled in place to the probabilities): per thread rows
 * lane/4 (r = 0) and lane/4 + 8 (r = 1) of its warp; m, l the running max and this thread's partial
 * sums; alpha the factor by which the previous O rows shrink. */
__device__ __forceinline__ void softmax(float (&s)[BN / 2], float (&m)[2], float (&l)[2], float (&alpha)[2],
                                        float scale_log2)
{
#pragma unroll
    for (int r = 0; r < 2; r++) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) mx = fmaxf(mx, fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
        const float mn = fmaxf(m[r], quad_max(mx) * scale_log2);
        const float mu = mn == -INFINITY ? 0.0f : mn; /* a row with every key masked so far: P = 0, not NaN */
        alpha[r] = ex2(m[r] - mu);
        m[r] = mn;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            s[4 * j + 2 * r] = ex2(fmaf(s[4 * j + 2 * r], scale_log2, -mu));
            s[4 * j + 2 * r + 1] = ex2(fmaf(s[4 * j + 2 * r + 1], scale_log2, -mu));
            sum += s[4 * j + 2 * r] + s[4 * j + 2 * r + 1];
        }
        l[r] = l[r] * alpha[r] + sum;
    }
}

/* The probabilities as bf16 A fragments of P V's k16 steps: step t takes columns 16 t .. 16 t + 15, the
 * accumulator groups 2 t and 2 t + 1 */
__device__ __forceinline__ void to_frags(uint32_t (&p)[BN / 16][4], const float (&s)[BN / 2])
{
#pragma unroll
    for (int t = 0; t < BN / 16; t++) {
        p[t][0] = pack_bf16(s[8 * t + 0], s[8 * t + 1]);
        p[t][1] = pack_bf16(s[8 * t + 2], s[8 * t + 3]);
        p[t][2] = pack_bf16(s[8 * t + 4], s[8 * t + 5]);
        p[t][3] = pack_bf16(s[8 * t + 6], s[8 * t + 7]);
    }
}
#endif

template <int D>
__global__ void __launch_bounds__(THREADS, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
               const __grid_constant__ CUtensorMap tmV, const fwd_args a)
{
#ifdef MT_SM90A
    using C = fcfg<D>;
    constexpr int CH = D / 64; /* 64-column chunks of a row */
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sQ = smem, *sK = sQ + C::Q_BYTES, *sV = sK + STAGES * C::KV_BYTES;
    uint64_t *qfull = (uint64_t *)(sV + STAGES * C::KV_BYTES);
    uint64_t *kfull = qfull + 1, *kempty = kfull + STAGES, *vfull = kempty + STAGES, *vempty = vfull + STAGES;

    /* the longest query blocks first: block index i takes query block n_mb - 1 - i / BH */
    const int mb = a.n_mb - 1 - (int)(blockIdx.x / a.BH), bh = (int)(blockIdx.x % a.BH);
    const int b = bh / a.H, h = bh % a.H, g = h / a.group;
    const int m0 = mb * BM;
    const int nkb = min(m0 + BM - 1, a.S - 1) / BN + 1; /* key blocks 0 .. nkb - 1 */

    if (threadIdx.x == 0) {
        mbar_init(qfull, 1);
        for (int s = 0; s < STAGES; s++) {
            mbar_init(&kfull[s], 1), mbar_init(&kempty[s], 2);
            mbar_init(&vfull[s], 1), mbar_init(&vempty[s], 2);
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) { /* the producer */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 24;");
        if (threadIdx.x != 0) return;
        mbar_expect_tx(qfull, C::Q_BYTES);
#pragma unroll
        for (int c = 0; c < CH; c++) tma4(sQ + c * BM * 128, &tmQ, qfull, 64 * c, h, m0, b);
        int s = 0, ph = 0;
        for (int j = nkb - 1; j >= 0; j--) {
            mbar_wait(&kempty[s], ph ^ 1);
            mbar_expect_tx(&kfull[s], C::KV_BYTES);
#pragma unroll
            for (int c = 0; c < CH; c++) tma4(sK + s * C::KV_BYTES + c * BN * 128, &tmK, &kfull[s], 64 * c, g, j * BN, b);
            mbar_wait(&vempty[s], ph ^ 1);
            mbar_expect_tx(&vfull[s], C::KV_BYTES);
#pragma unroll
            for (int c = 0; c < CH; c++) tma4(sV + s * C::KV_BYTES + c * BN * 128, &tmV, &vfull[s], 64 * c, g, j * BN, b);
            if (++s == STAGES) s = 0, ph ^= 1;
        }
        return;
    }

    /* the consumers */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    const int cw = wg - 1, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int row = m0 + cw * 64 + warp * 16 + lane / 4; /* this thread's rows: row and row + 8 */
    float o[D / 2], s[BN / 2], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, alpha[2];
    uint32_t p[BN / 16][4];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.0f;

    mbar_wait(qfull, 0);
    /* the diagonal block: S, the causal mask (keys past a row, which include the keys past S), P */
    int st = 0, ph = 0;
    mbar_wait(&kfull[st], ph);
    acc_fence(s);
    wg_fence();
    qk<D>(s, sQ, sK + st * C::KV_BYTES, cw);
    wg_commit();
    wg_wait<0>();
    acc_fence(s);
    if (t == 0) mbar_arrive(&kempty[st]);
    {
        const int key0 = (nkb - 1) * BN + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (key0 + 8 * j + (e & 1) > row + 8 * (e >> 1)) s[4 * j + e] = -INFINITY;
    }
    softmax(s, m, l, alpha, a.scale_log2);
    to_frags(p, s);

    /* Operand fences (acc_fence, reg_fence) around every wgmma: the compiler neither moves the making of
     * O's and P's values past the wgmma.fence that publishes them nor reuses their registers before the
     * wait, which would have ptxas serialise the products (its warning C7519). */
    for (int it = 1; it < nkb; it++) {
        const int sp = st, pp = ph; /* the previous block's stage: its V goes with p */
        if (++st == STAGES) st = 0, ph ^= 1;
        mbar_wait(&kfull[st], ph);
        acc_fence(o);
        reg_fence(p);
        acc_fence(s);
        wg_fence();
        qk<D>(s, sQ, sK + st * C::KV_BYTES, cw);
        wg_commit();
        mbar_wait(&vfull[sp], pp);
        wg_fence();
        pv<D>(o, p, sV + sp * C::KV_BYTES);
        wg_commit();
        wg_wait<1>(); /* S is in; P V may still run */
        acc_fence(s);
        if (t == 0) mbar_arrive(&kempty[st]);
        softmax(s, m, l, alpha, a.scale_log2);
        wg_wait<0>();
        acc_fence(o);
        reg_fence(p);
        if (t == 0) mbar_arrive(&vempty[sp]);
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            o[4 * j] *= alpha[0], o[4 * j + 1] *= alpha[0];
            o[4 * j + 2] *= alpha[1], o[4 * j + 3] *= alpha[1];
        }
        to_frags(p, s);
    }
    mbar_wait(&vfull[st], ph);
    acc_fence(o);
    reg_fence(p);
    wg_fence();
    pv<D>(o, p, sV + st * C::KV_BYTES);
    wg_commit();
    wg_wait<0>();
    acc_fence(o);
    reg_fence(p);
    if (t == 0) mbar_arrive(&vempty[st]);

    /* out = O / l in bf16, lse = (m + log2 l) ln 2 */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int i = row + 8 * r;
        const float lr = quad_sum(l[r]);
        if (i >= a.S) continue;
        const float inv = 1.0f / lr;
        __nv_bfloat16 *orow = a.out + (((size_t)b * a.S + i) * a.H + h) * D + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < D / 8; j++)
            *(uint32_t *)(orow + 8 * j) = pack_bf16(o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv);
        if (lane % 4 == 0) a.lse[((size_t)b * a.H + h) * a.S + i] = (m[r] + log2f(lr)) * 0.69314718055994531f;
    }
#else
    (void)tmQ, (void)tmK, (void)tmV, (void)a;
#endif
}

/* A bf16 tensor map over (B, S, heads, D) as (D, heads, S, B), boxes of 64 columns x rows, 128-byte swizzle */
int tmap(PFN_cuTensorMapEncodeTiled_v12000 encode, CUtensorMap *m, const void *p, int B, int S, int heads, int D,
         int rows)
{
    const cuuint64_t dims[4] = {(cuuint64_t)D, (cuuint64_t)heads, (cuuint64_t)S, (cuuint64_t)B};
    const cuuint64_t strides[3] = {(cuuint64_t)D * 2, (cuuint64_t)heads * D * 2, (cuuint64_t)S * heads * D * 2};
    const cuuint32_t box[4] = {64, 1, (cuuint32_t)rows, 1}, es[4] = {1, 1, 1, 1};
    return encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, (void *)p, dims, strides, box, es,
                  CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                  CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS
               ? 0
               : -1;
}

template <int D>
int fwd_run(cudaStream_t st, PFN_cuTensorMapEncodeTiled_v12000 encode, void *out, float *lse, const void *q,
            const void *k, const void *v, int B, int S, int H, int Hkv, float scale)
{
    CUtensorMap mq, mk, mv;
    if (tmap(encode, &mq, q, B, S, H, D, BM) || tmap(encode, &mk, k, B, S, Hkv, D, BN) ||
        tmap(encode, &mv, v, B, S, Hkv, D, BN))
        return MT_CUATTN_EINVAL;
    constexpr int smem = fcfg<D>::SMEM;
    if (cudaFuncSetAttribute(fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
        cudaGetLastError();
        return MT_CUATTN_ECONFIG;
    }
    const int n_mb = (S + BM - 1) / BM;
    const fwd_args a = {(__nv_bfloat16 *)out, lse, S, H, H / Hkv, n_mb, B * H, scale * 1.4426950408889634f};
    fwd_kernel<D><<<(unsigned)((long long)n_mb * B * H), THREADS, smem, st>>>(mq, mk, mv, a);
    return cudaGetLastError() == cudaSuccess ? MT_CUATTN_OK : MT_CUATTN_ELAUNCH;
}

bool misaligned(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) != 0; }

} // namespace

extern "C" int mt_cuattn_sm90_head_dim_ok(int D) { return D == 64 || D == 128; }

extern "C" int mt_cuattn_sm90_device_ok(void)
{
    int dev = 0, major = 0, minor = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return major == 9 && minor == 0;
}

extern "C" int mt_cuattn_sm90_forward(void *stream, void *out, float *lse, const void *q, const void *k,
                                      const void *v, int B, int S, int H, int Hkv, int D, float scale)
{
    if (B < 0 || S < 0 || H <= 0 || Hkv <= 0 || H % Hkv != 0 || !(scale > 0.0f) || isinf(scale))
        return MT_CUATTN_EINVAL;
    if (!out || !lse || !q || !k || !v) return MT_CUATTN_EINVAL;
    if (!mt_cuattn_sm90_head_dim_ok(D)) return MT_CUATTN_EUNSUPPORTED;
    if (misaligned(out, 16) || misaligned(q, 16) || misaligned(k, 16) || misaligned(v, 16) || misaligned(lse, 4))
        return MT_CUATTN_EALIGN;
    if ((long long)((S + BM - 1) / BM) * B * H > 0x7fffffffLL) return MT_CUATTN_ETOOBIG;
    if (B == 0 || S == 0) return MT_CUATTN_OK;
    if (!mt_cuattn_sm90_device_ok()) return MT_CUATTN_EUNSUPPORTED;
    void *fn = NULL;
    cudaDriverEntryPointQueryResult qr;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &qr) !=
            cudaSuccess ||
        qr != cudaDriverEntryPointSuccess || !fn) {
        cudaGetLastError();
        return MT_CUATTN_EUNSUPPORTED;
    }
    const PFN_cuTensorMapEncodeTiled_v12000 encode = (PFN_cuTensorMapEncodeTiled_v12000)fn;
    cudaStream_t st = (cudaStream_t)stream;
    return D == 64 ? fwd_run<64>(st, encode, out, lse, q, k, v, B, S, H, Hkv, scale)
                   : fwd_run<128>(st, encode, out, lse, q, k, v, B, S, H, Hkv, scale);
}
