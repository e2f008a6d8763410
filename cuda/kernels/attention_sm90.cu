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

constexpr int BM = 128, THREADS = 384, STAGES = 2;

/* The forward's key block for head size D: 128 keys, fewer where Q and two stages of K and V would not fit
 * in shared memory (D 192: 112, D 256: 80, FlashAttention-3's choices) */
template <int D> struct fcfg {
    static constexpr int BN = D == 192 ? 112 : D == 256 ? 80 : 128;
    static constexpr int Q_BYTES = BM * D * 2;
    static constexpr int KV_BYTES = BN * D * 2;
    static constexpr int SMEM = 1024 /* alignment */ + Q_BYTES + 2 * STAGES * KV_BYTES + (1 + 4 * STAGES) * 8;
};

struct fwd_args {
    __nv_bfloat16 *out;
    float *lse;
    const int32_t *starts; /* (B, S): each query's first key (documents, windows), or NULL */
    int S, H, group;       /* group: query heads per kv head */
    int n_mb, BH;          /* query blocks per sequence, B * H */
    float scale_log2;      /* log2 e times the scale (with a cap: log2 e, the capped scores being scaled) */
    float cap, cap_arg;    /* the soft cap and scale / cap (CAP) */
};

__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi)
{
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(const uint32_t *)&v;
}

#ifdef MT_SM90A
using namespace mt_sm90;

__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
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
template <int D, int BN>
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
template <int D, int BN>
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
template <int BN>
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

/* The causal mask on a block of scores whose first key is key0: keys past a row (which include the keys
 * past S) get -inf */
template <int BN> __device__ __forceinline__ void mask(float (&s)[BN / 2], int key0, int row, int lane)
{
    const int k0 = key0 + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (k0 + 8 * j + (e & 1) > row + 8 * (e >> 1)) s[4 * j + e] = -INFINITY;
}

/* The same for keys before each row's first key (st[0] for row, st[1] for row + 8) */
template <int BN> __device__ __forceinline__ void mask_starts(float (&s)[BN / 2], int key0, const int (&st)[2], int lane)
{
    const int k0 = key0 + 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < BN / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++)
            if (k0 + 8 * j + (e & 1) < st[e >> 1]) s[4 * j + e] = -INFINITY;
}

/* Gemma 2's cap on the scaled scores, in place: c = cap tanh(scale s / cap) */
template <int BN> __device__ __forceinline__ void softcap(float (&s)[BN / 2], float cap, float arg)
{
#pragma unroll
    for (int i = 0; i < BN / 2; i++) s[i] = tanhf(s[i] * arg) * cap;
}

/* O's rows times the factors of their softmax step */
template <int N> __device__ __forceinline__ void rescale(float (&o)[N], const float (&alpha)[2])
{
#pragma unroll
    for (int j = 0; j < N / 4; j++) {
        o[4 * j] *= alpha[0], o[4 * j + 1] *= alpha[0];
        o[4 * j + 2] *= alpha[1], o[4 * j + 3] *= alpha[1];
    }
}

/* An accumulator of N columns as the bf16 A fragments of a product over those columns: k16 step t takes
 * columns 16 t .. 16 t + 15, the accumulator groups 2 t and 2 t + 1 */
template <int N> __device__ __forceinline__ void to_frags(uint32_t (&p)[N / 16][4], const float (&s)[N / 2])
{
#pragma unroll
    for (int t = 0; t < N / 16; t++) {
        p[t][0] = pack_bf16(s[8 * t + 0], s[8 * t + 1]);
        p[t][1] = pack_bf16(s[8 * t + 2], s[8 * t + 3]);
        p[t][2] = pack_bf16(s[8 * t + 4], s[8 * t + 5]);
        p[t][3] = pack_bf16(s[8 * t + 6], s[8 * t + 7]);
    }
}
#endif

template <int D, bool STARTS, bool CAP>
__global__ void __launch_bounds__(THREADS, 1)
    fwd_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
               const __grid_constant__ CUtensorMap tmV, const fwd_args a)
{
#ifdef MT_SM90A
    using C = fcfg<D>;
    constexpr int CH = D / 64, BN = C::BN; /* 64-column chunks of a row; keys a block */
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sQ = smem, *sK = sQ + C::Q_BYTES, *sV = sK + STAGES * C::KV_BYTES;
    uint64_t *qfull = (uint64_t *)(sV + STAGES * C::KV_BYTES);
    uint64_t *kfull = qfull + 1, *kempty = kfull + STAGES, *vfull = kempty + STAGES, *vempty = vfull + STAGES;

    /* the longest query blocks first: block index i takes query block n_mb - 1 - i / BH */
    const int mb = a.n_mb - 1 - (int)(blockIdx.x / a.BH), bh = (int)(blockIdx.x % a.BH);
    const int b = bh / a.H, h = bh % a.H, g = h / a.group;
    const int m0 = mb * BM;
    const int last = min(m0 + BM - 1, a.S - 1);
    const int nkb = last / BN + 1; /* key blocks kb_lo .. nkb - 1: the first holds the block's first row's first key */
    const int32_t *starts = STARTS ? a.starts + (size_t)b * a.S : nullptr;
    const int kb_lo = STARTS ? starts[m0] / BN : 0, smax = STARTS ? starts[last] : 0;

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
        for (int j = nkb - 1; j >= kb_lo; j--) {
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
    int st_row[2] = {0, 0}; /* the rows' first keys (STARTS) */
    if (STARTS) st_row[0] = starts[min(row, a.S - 1)], st_row[1] = starts[min(row + 8, a.S - 1)];
    uint32_t p[BN / 16][4];
#pragma unroll
    for (int i = 0; i < D / 2; i++) o[i] = 0.0f;

    /* The two consumers take turns to issue their products (named barriers 1 and 2, FlashAttention-3's
     * ping-pong): while one warpgroup's products run on the tensor cores, the other computes its softmax.
     * Warpgroup 0 goes first; each turn ends by handing the turn over, except warpgroup 1's last, so that
     * every arrival on a barrier is matched by a wait. */
    const int my_turn = 1 + cw, other_turn = 2 - cw;
    if (cw == 1) bar_arrive(1, 256);

    mbar_wait(qfull, 0);
    /* the diagonal block: S, the causal mask (keys past a row, which include the keys past S), P */
    int st = 0, ph = 0;
    mbar_wait(&kfull[st], ph);
    bar_sync(my_turn, 256);
    acc_fence(s);
    wg_fence();
    qk<D, BN>(s, sQ, sK + st * C::KV_BYTES, cw);
    wg_commit();
    bar_arrive(other_turn, 256);
    wg_wait<0>();
    acc_fence(s);
    if (t == 0) mbar_arrive(&kempty[st]);
    if (CAP) softcap<BN>(s, a.cap, a.cap_arg);
    mask<BN>(s, (nkb - 1) * BN, row, lane);
    if (STARTS && (nkb - 1) * BN < smax) mask_starts<BN>(s, (nkb - 1) * BN, st_row, lane);
    softmax<BN>(s, m, l, alpha, a.scale_log2);
    to_frags<BN>(p, s);

    /* Each turn: S of this block, then O (rescaled by the previous block's alpha while S runs) += P V of
     * the previous block. Operand fences (acc_fence, reg_fence) around every wgmma: the compiler neither
     * moves the making of O's and P's values past the wgmma.fence that publishes them nor reuses their
     * registers before the wait, which would have ptxas serialise the products (its warning C7519). */
    const int nvis = nkb - kb_lo; /* key blocks visited */
    for (int it = 1; it < nvis; it++) {
        const int sp = st, pp = ph; /* the previous block's stage: its V goes with p */
        if (++st == STAGES) st = 0, ph ^= 1;
        mbar_wait(&kfull[st], ph);
        bar_sync(my_turn, 256);
        acc_fence(o);
        reg_fence(p);
        acc_fence(s);
        wg_fence();
        qk<D, BN>(s, sQ, sK + st * C::KV_BYTES, cw);
        wg_commit();
        rescale(o, alpha);
        mbar_wait(&vfull[sp], pp);
        acc_fence(o);
        wg_fence();
        pv<D, BN>(o, p, sV + sp * C::KV_BYTES);
        wg_commit();
        bar_arrive(other_turn, 256);
        wg_wait<1>(); /* S is in; P V may still run */
        acc_fence(s);
        if (t == 0) mbar_arrive(&kempty[st]);
        if (CAP) softcap<BN>(s, a.cap, a.cap_arg);
        if ((nkb - it) * BN - 1 > m0) mask<BN>(s, (nkb - 1 - it) * BN, row, lane); /* keys past the block's first row */
        if (STARTS && (nkb - 1 - it) * BN < smax) mask_starts<BN>(s, (nkb - 1 - it) * BN, st_row, lane);
        softmax<BN>(s, m, l, alpha, a.scale_log2);
        wg_wait<0>();
        acc_fence(o);
        reg_fence(p);
        if (t == 0) mbar_arrive(&vempty[sp]);
        to_frags<BN>(p, s);
    }
    mbar_wait(&vfull[st], ph);
    bar_sync(my_turn, 256);
    rescale(o, alpha);
    acc_fence(o);
    reg_fence(p);
    wg_fence();
    pv<D, BN>(o, p, sV + st * C::KV_BYTES);
    wg_commit();
    if (cw == 0) bar_arrive(other_turn, 256);
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

/* ---- backward ----------------------------------------------------------------------------------------------
 * Three kernels on the stream:
 *   bwd_prep: per query row, Dq = rowsum(dO * O) and lse in log2 units (+inf past S: P = 0 there), and the
 *             dQ semaphores zeroed;
 *   bwd_kernel: one block per (key block of BNB = 128 keys, kv head, batch): K and V of its keys stay in
 *             shared memory; it walks the query heads of its group and, for each, the query blocks of
 *             BMB = 64 rows from its diagonal to the end (Q, dO and their rows' lse and Dq streamed through
 *             two stages). Consumer warpgroup w owns keys 64 w .. 64 w + 63 and computes
 *               S^T = K Q^T, dP^T = V dO^T          (wgmma, operands in shared memory)
 *               P^T = 2^(scale log2e S^T - lse2), dS^T = P^T (dP^T - Dq)
 *               dV += P^T dO, dK += dS^T Q          (wgmma, P^T and dS^T from registers)
 *               dQ[:, D/2 w ..] = dS K              (wgmma; dS^T through shared memory, both halves of the keys)
 *             dK and dV stay in registers to the end (the group's heads summed there, in order) and are
 *             written once. dQ's partial sums go to shared memory; warp 1 adds them to an fp32 dQ in the
 *             workspace, one bulk copy a query block, in the order of the key blocks: a semaphore per
 *             (batch, head, query block) counts the key blocks that have added, and key block n waits for
 *             n (key block 0 stores instead of adding). Blocks are numbered key block first, so every key
 *             block another waits for was started before it.
 *   bwd_post: dq = scale * dQ in bf16.
 * The sums of every output element are in an order fixed by the shapes: the same bits on every run. */
constexpr int BNB = 128, BMB = 64;

template <int D> struct bcfg {
    static constexpr int KV_BYTES = BNB * D * 2;
    static constexpr int QD_BYTES = BMB * D * 2;           /* a stage's Q, and its dO */
    static constexpr int STAGE = 2 * QD_BYTES + 1024;     /* Q, dO, lse2 and Dq (512 bytes, padded: 1024-aligned) */
    static constexpr int DS_BYTES = BNB * BMB * 2;
    static constexpr int DQ_BYTES = BMB * D * 4;
    static constexpr int SMEM = 1024 + 2 * KV_BYTES + 2 * STAGE + 2 * DS_BYTES + DQ_BYTES + 16 * 8;
};

struct bwd_args {
    __nv_bfloat16 *dk, *dv;
    float *dqacc;          /* (B, H, Sp, D) */
    const float *lse2, *Dq; /* (B, H, Sp) */
    int *sem;              /* (B, H, Sp / BMB) */
    int B, S, Sp, H, Hkv, group;
    float scale, scale_log2;
};

/* Dq, lse2 and the semaphores; one thread a row of the padded sequence */
template <int D>
__global__ void __launch_bounds__(128) bwd_prep(const __nv_bfloat16 *__restrict__ out, const __nv_bfloat16 *__restrict__ dout,
                                                const float *__restrict__ lse, float *Dq, float *lse2, int *sem, int S,
                                                int Sp, int H)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x, bh = blockIdx.y;
    if (i >= Sp) return;
    const int b = bh / H, h = bh % H;
    const size_t r = (size_t)bh * Sp + i;
    if (i % BMB == 0) sem[r / BMB] = 0;
    if (i >= S) {
        Dq[r] = 0.0f, lse2[r] = INFINITY;
        return;
    }
    const size_t e = (((size_t)b * S + i) * H + h) * D;
    float acc = 0.0f;
#pragma unroll 4
    for (int d = 0; d < D; d += 8) {
        const uint4 o = *(const uint4 *)(out + e + d), g = *(const uint4 *)(dout + e + d);
        const uint32_t ow[4] = {o.x, o.y, o.z, o.w}, gw[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
        for (int w = 0; w < 4; w++) {
            acc = fmaf(__uint_as_float(ow[w] << 16), __uint_as_float(gw[w] << 16), acc);
            acc = fmaf(__uint_as_float(ow[w] & 0xffff0000u), __uint_as_float(gw[w] & 0xffff0000u), acc);
        }
    }
    Dq[r] = acc;
    lse2[r] = lse[(size_t)bh * S + i] * 1.4426950408889634f;
}

/* dq = scale * dQ in bf16, 8 elements a thread */
template <int D>
__global__ void __launch_bounds__(256) bwd_post(__nv_bfloat16 *dq, const float *__restrict__ dqacc, int S, int Sp, int H,
                                                float scale, size_t n8)
{
    const size_t t = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= n8) return;
    const size_t e = t * 8;
    const int d = (int)(e % D);
    const size_t row = e / D; /* (b, i, h) in dq's order */
    const int h = (int)(row % H), i = (int)(row / H % S);
    const size_t b = row / H / S;
    const float *src = dqacc + (((b * H + h) * Sp) + i) * D + d;
    const float4 x = *(const float4 *)src, y = *(const float4 *)(src + 4);
    uint4 o;
    o.x = pack_bf16(x.x * scale, x.y * scale);
    o.y = pack_bf16(x.z * scale, x.w * scale);
    o.z = pack_bf16(y.x * scale, y.y * scale);
    o.w = pack_bf16(y.z * scale, y.w * scale);
    *(uint4 *)(dq + e) = o;
}

template <int D>
__global__ void __launch_bounds__(THREADS, 1)
    bwd_kernel(const __grid_constant__ CUtensorMap tmQ, const __grid_constant__ CUtensorMap tmK,
               const __grid_constant__ CUtensorMap tmV, const __grid_constant__ CUtensorMap tmdO, const bwd_args a)
{
#ifdef MT_SM90A
    using C = bcfg<D>;
    constexpr int CH = D / 64;
    extern __shared__ uint8_t smem_raw[];
    uint8_t *smem = (uint8_t *)(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sK = smem, *sV = sK + C::KV_BYTES, *sSt = sV + C::KV_BYTES;
    uint8_t *sDS = sSt + 2 * C::STAGE, *sDQ = sDS + 2 * C::DS_BYTES;
    uint64_t *bars = (uint64_t *)(sDQ + C::DQ_BYTES);
    uint64_t *kvfull = bars, *full = bars + 1, *empty = bars + 3, *dqfull = bars + 5, *dqempty = bars + 6;

    const int n = (int)(blockIdx.x / (a.B * a.Hkv)), bg = (int)(blockIdx.x % (a.B * a.Hkv));
    const int b = bg / a.Hkv, g = bg % a.Hkv;
    const int M = (a.S + BMB - 1) / BMB, m_first = n * (BNB / BMB);
    const int per_head = M - m_first, steps = a.group * per_head;

    if (threadIdx.x == 0) {
        mbar_init(kvfull, 1);
        for (int s = 0; s < 2; s++) mbar_init(&full[s], 1), mbar_init(&empty[s], 2);
        mbar_init(dqfull, 256), mbar_init(dqempty, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 32;");
        if (threadIdx.x == 0) { /* the loads */
            mbar_expect_tx(kvfull, 2 * C::KV_BYTES);
#pragma unroll
            for (int c = 0; c < CH; c++) {
                tma4(sK + c * BNB * 128, &tmK, kvfull, 64 * c, g, n * BNB, b);
                tma4(sV + c * BNB * 128, &tmV, kvfull, 64 * c, g, n * BNB, b);
            }
            int s = 0, ph = 0;
            for (int it = 0; it < steps; it++) {
                const int h = g * a.group + it / per_head, m = m_first + it % per_head;
                uint8_t *st = sSt + s * C::STAGE;
                mbar_wait(&empty[s], ph ^ 1);
                mbar_expect_tx(&full[s], 2 * C::QD_BYTES + 2 * BMB * 4); /* the bytes that come, not the stage's size */
#pragma unroll
                for (int c = 0; c < CH; c++) {
                    tma4(st + c * BMB * 128, &tmQ, &full[s], 64 * c, h, m * BMB, b);
                    tma4(st + C::QD_BYTES + c * BMB * 128, &tmdO, &full[s], 64 * c, h, m * BMB, b);
                }
                const size_t r = ((size_t)b * a.H + h) * a.Sp + (size_t)m * BMB;
                bulk_load(st + 2 * C::QD_BYTES, a.lse2 + r, BMB * 4, &full[s]);
                bulk_load(st + 2 * C::QD_BYTES + BMB * 4, a.Dq + r, BMB * 4, &full[s]);
                if (++s == 2) s = 0, ph ^= 1;
            }
        } else if (threadIdx.x == 32) { /* dQ's sums, in the order of the key blocks */
            for (int it = 0; it < steps; it++) {
                const int h = g * a.group + it / per_head, m = m_first + it % per_head;
                mbar_wait(dqfull, it & 1);
                const size_t bhm = ((size_t)b * a.H + h) * (a.Sp / BMB) + m;
                int *sem = a.sem + bhm;
                while (ld_acquire(sem) != n) {
                }
                float *dst = a.dqacc + bhm * BMB * D;
                if (n == 0) bulk_store(dst, sDQ, C::DQ_BYTES);
                else bulk_add_f32(dst, sDQ, C::DQ_BYTES);
                bulk_commit();
                bulk_wait_read();
                mbar_arrive(dqempty);
                bulk_wait();
                fence_async_global();
                st_release(sem, n + 1);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 240;");
    const int cw = wg - 1, t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
    const int krow = 64 * cw + 16 * warp + lane / 4; /* this thread's keys in the block: krow and krow + 8 */
    const int key = n * BNB + krow;
    /* dQ's columns: D / 2 a warpgroup; at D 64 warpgroup 0 takes all 64 (an N of 32 would start inside a
     * 128-byte swizzled row of K) */
    constexpr int DQN = D == 64 ? 64 : D / 2;
    const bool has_dq = cw * DQN < D;
    float dk[D / 2], dv[D / 2], s[BMB / 2], dp[BMB / 2], dq[DQN / 2];
    uint32_t pf[BMB / 16][4], dsf[BMB / 16][4];
#pragma unroll
    for (int i = 0; i < D / 2; i++) dk[i] = 0.0f, dv[i] = 0.0f;

    mbar_wait(kvfull, 0);
    int st = 0, ph = 0;
    for (int it = 0; it < steps; it++) {
        const int m = m_first + it % per_head;
        const uint8_t *sQ = sSt + st * C::STAGE, *sdO = sQ + C::QD_BYTES;
        const float *slse = (const float *)(sQ + 2 * C::QD_BYTES), *sDq = slse + BMB;
        uint8_t *ds = sDS + (it & 1) * C::DS_BYTES;
        mbar_wait(&full[st], ph);

        /* S^T = K Q^T and dP^T = V dO^T: this warpgroup's 64 keys against the 64 queries, over D */
        acc_fence(s);
        acc_fence(dp);
        wg_fence();
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const int c = kk / 4, w = (kk % 4) * 32;
            wgmma_ss<BMB, 0, 0>::run(s, sdesc(saddr(sK + c * BNB * 128 + cw * 64 * 128 + w), 16, 1024),
                                     sdesc(saddr(sQ + c * BMB * 128 + w), 16, 1024), kk != 0);
        }
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            const int c = kk / 4, w = (kk % 4) * 32;
            wgmma_ss<BMB, 0, 0>::run(dp, sdesc(saddr(sV + c * BNB * 128 + cw * 64 * 128 + w), 16, 1024),
                                     sdesc(saddr(sdO + c * BMB * 128 + w), 16, 1024), kk != 0);
        }
        wg_commit();
        wg_wait<0>();
        acc_fence(s);
        acc_fence(dp);

        /* P^T and dS^T, packed to bf16 fragments a k16 step at a time (so that the fp32 values die early);
         * the causal mask on the blocks that cross the diagonal */
        const bool diag = m * BMB < n * BNB + BNB;
#pragma unroll
        for (int tk = 0; tk < BMB / 16; tk++) {
            float pv_[8], dv_[8];
#pragma unroll
            for (int u = 0; u < 8; u++) { /* accumulator element 8 tk + u: column 16 tk + 8 (u / 4) + .. */
                const int e = u % 4, col = 16 * tk + 8 * (u / 4) + 2 * (lane % 4) + (e & 1), kr = key + 8 * (e >> 1);
                float p = ex2(fmaf(s[8 * tk + u], a.scale_log2, -slse[col]));
                if (diag && kr > m * BMB + col) p = 0.0f;
                pv_[u] = p;
                dv_[u] = p * (dp[8 * tk + u] - sDq[col]);
            }
            pf[tk][0] = pack_bf16(pv_[0], pv_[1]), pf[tk][1] = pack_bf16(pv_[2], pv_[3]);
            pf[tk][2] = pack_bf16(pv_[4], pv_[5]), pf[tk][3] = pack_bf16(pv_[6], pv_[7]);
            dsf[tk][0] = pack_bf16(dv_[0], dv_[1]), dsf[tk][1] = pack_bf16(dv_[2], dv_[3]);
            dsf[tk][2] = pack_bf16(dv_[4], dv_[5]), dsf[tk][3] = pack_bf16(dv_[6], dv_[7]);
        }
        /* dS^T in bf16 into shared memory for dQ: rows of 64 queries (128 bytes), the 128-byte swizzle; from
         * the fragments (dsf[t]: rows krow and krow + 8, columns 16 t + 2 (lane % 4) and 8 past them) */
#pragma unroll
        for (int tk = 0; tk < BMB / 16; tk++)
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = krow + 8 * (q & 1), c = 16 * tk + 8 * (q >> 1) + 2 * (lane % 4);
                *(uint32_t *)(ds + r * 128 + (((c >> 3) ^ (r & 7)) << 4) + (c & 7) * 2) = dsf[tk][q];
            }
        fence_async_smem();

        /* dV += P^T dO, dK += dS^T Q: over the 64 queries, dO and Q MN-major (64-column chunks of 64 rows) */
        acc_fence(dv);
        acc_fence(dk);
        reg_fence(pf);
        reg_fence(dsf);
        wg_fence();
#pragma unroll
        for (int tk = 0; tk < BMB / 16; tk++) {
            wgmma_rs<D, 1>::run(dv, pf[tk], sdesc(saddr(sdO + tk * 2048), BMB * 128, 1024), 1);
            wgmma_rs<D, 1>::run(dk, dsf[tk], sdesc(saddr(sQ + tk * 2048), BMB * 128, 1024), 1);
        }
        wg_commit();

        /* dQ[:, D/2 cw ..] = dS K over the block's 128 keys, once both warpgroups' dS^T are in */
        bar_sync(3, 256);
        if (has_dq) {
            acc_fence(dq);
            wg_fence();
#pragma unroll
            for (int tk = 0; tk < BNB / 16; tk++)
                wgmma_ss<DQN, 1, 1>::run(dq, sdesc(saddr(ds + tk * 2048), 8192, 1024),
                                         sdesc(saddr(sK + cw * BNB * 128 + tk * 2048), BNB * 128, 1024), tk != 0);
            wg_commit();
        }
        wg_wait<0>();
        acc_fence(dv);
        acc_fence(dk);
        acc_fence(dq);
        reg_fence(pf);
        reg_fence(dsf);
        if (t == 0) mbar_arrive(&empty[st]);

        /* the partial dQ (64 queries x D fp32, rows of D) to shared memory for warp 1 */
        mbar_wait(dqempty, (it & 1) ^ 1);
        if (has_dq) {
#pragma unroll
            for (int j = 0; j < DQN / 8; j++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    const int r = 16 * warp + lane / 4 + 8 * hf, c = cw * DQN + 8 * j + 2 * (lane % 4);
                    *(float2 *)(sDQ + (r * D + c) * 4) = make_float2(dq[4 * j + 2 * hf], dq[4 * j + 2 * hf + 1]);
                }
            fence_async_smem();
        }
        mbar_arrive(dqfull);
        if (++st == 2) st = 0, ph ^= 1;
    }

    /* dK (times the scale) and dV, rows past S not stored */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int kr = key + 8 * hf;
        if (kr >= a.S) continue;
        const size_t o = (((size_t)b * a.S + kr) * a.Hkv + g) * D + 2 * (lane % 4);
#pragma unroll
        for (int j = 0; j < D / 8; j++) {
            *(uint32_t *)(a.dk + o + 8 * j) = pack_bf16(dk[4 * j + 2 * hf] * a.scale, dk[4 * j + 2 * hf + 1] * a.scale);
            *(uint32_t *)(a.dv + o + 8 * j) = pack_bf16(dv[4 * j + 2 * hf], dv[4 * j + 2 * hf + 1]);
        }
    }
#else
    (void)tmQ, (void)tmK, (void)tmV, (void)tmdO, (void)a;
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

template <int D, bool STARTS, bool CAP>
int fwd_launch(cudaStream_t st, const CUtensorMap &mq, const CUtensorMap &mk, const CUtensorMap &mv, const fwd_args &a,
               long long blocks)
{
    constexpr int smem = fcfg<D>::SMEM;
    if (cudaFuncSetAttribute(fwd_kernel<D, STARTS, CAP>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) !=
        cudaSuccess) {
        cudaGetLastError();
        return MT_CUATTN_ECONFIG;
    }
    fwd_kernel<D, STARTS, CAP><<<(unsigned)blocks, THREADS, smem, st>>>(mq, mk, mv, a);
    return cudaGetLastError() == cudaSuccess ? MT_CUATTN_OK : MT_CUATTN_ELAUNCH;
}

template <int D>
int fwd_run(cudaStream_t st, PFN_cuTensorMapEncodeTiled_v12000 encode, void *out, float *lse, const void *q,
            const void *k, const void *v, const int32_t *starts, int B, int S, int H, int Hkv, float scale, float cap)
{
    CUtensorMap mq, mk, mv;
    if (tmap(encode, &mq, q, B, S, H, D, BM) || tmap(encode, &mk, k, B, S, Hkv, D, fcfg<D>::BN) ||
        tmap(encode, &mv, v, B, S, Hkv, D, fcfg<D>::BN))
        return MT_CUATTN_EINVAL;
    const int n_mb = (S + BM - 1) / BM;
    const float log2e = 1.4426950408889634f;
    const fwd_args a = {(__nv_bfloat16 *)out, lse,   starts,      S, H, H / Hkv, n_mb, B * H,
                        cap > 0.f ? log2e : scale * log2e, cap, cap > 0.f ? scale / cap : 0.f};
    const long long blocks = (long long)n_mb * B * H;
    if (starts) return cap > 0.f ? fwd_launch<D, true, true>(st, mq, mk, mv, a, blocks)
                                 : fwd_launch<D, true, false>(st, mq, mk, mv, a, blocks);
    return cap > 0.f ? fwd_launch<D, false, true>(st, mq, mk, mv, a, blocks)
                     : fwd_launch<D, false, false>(st, mq, mk, mv, a, blocks);
}

/* The backward's workspace: Dq and lse2 (B, H, Sp) floats, the semaphores (B, H, Sp / BMB) ints, dQ
 * (B, H, Sp, D) floats; each part 256-byte aligned */
struct bwd_ws {
    size_t dq_, lse2, sem, dqacc, total;
};
bwd_ws ws_layout(int B, int S, int H, int D)
{
    const size_t Sp = ((size_t)S + BMB - 1) / BMB * BMB, rows = (size_t)B * H * Sp;
    auto up = [](size_t x) { return (x + 255) / 256 * 256; };
    bwd_ws w;
    w.dq_ = 0;
    w.lse2 = up(rows * 4);
    w.sem = w.lse2 + up(rows * 4);
    w.dqacc = w.sem + up(rows / BMB * 4);
    w.total = w.dqacc + up(rows * D * 4);
    return w;
}

template <int D>
int bwd_run(cudaStream_t st, PFN_cuTensorMapEncodeTiled_v12000 encode, void *dq, void *dk, void *dv, const void *dout,
            const void *out, const float *lse, const void *q, const void *k, const void *v, int B, int S, int H,
            int Hkv, float scale, void *workspace)
{
    const bwd_ws w = ws_layout(B, S, H, D);
    const int Sp = (S + BMB - 1) / BMB * BMB;
    uint8_t *ws = (uint8_t *)workspace;
    float *Dq = (float *)(ws + w.dq_), *lse2 = (float *)(ws + w.lse2), *dqacc = (float *)(ws + w.dqacc);
    int *sem = (int *)(ws + w.sem);
    CUtensorMap mq, mk, mv, mdo;
    if (tmap(encode, &mq, q, B, S, H, D, BMB) || tmap(encode, &mdo, dout, B, S, H, D, BMB) ||
        tmap(encode, &mk, k, B, S, Hkv, D, BNB) || tmap(encode, &mv, v, B, S, Hkv, D, BNB))
        return MT_CUATTN_EINVAL;
    constexpr int smem = bcfg<D>::SMEM;
    if (cudaFuncSetAttribute(bwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem) != cudaSuccess) {
        cudaGetLastError();
        return MT_CUATTN_ECONFIG;
    }
    bwd_prep<D><<<dim3((Sp + 127) / 128, B * H), 128, 0, st>>>((const __nv_bfloat16 *)out,
                                                                (const __nv_bfloat16 *)dout, lse, Dq, lse2, sem, S,
                                                                Sp, H);
    if (cudaGetLastError() != cudaSuccess) return MT_CUATTN_ELAUNCH;
    const int n_nb = (S + BNB - 1) / BNB;
    const bwd_args a = {(__nv_bfloat16 *)dk, (__nv_bfloat16 *)dv, dqacc, lse2, Dq, sem, B, S, Sp, H, Hkv, H / Hkv,
                        scale, scale * 1.4426950408889634f};
    bwd_kernel<D><<<(unsigned)((long long)n_nb * B * Hkv), THREADS, smem, st>>>(mq, mk, mv, mdo, a);
    if (cudaGetLastError() != cudaSuccess) return MT_CUATTN_ELAUNCH;
    const size_t n8 = (size_t)B * S * H * D / 8;
    bwd_post<D><<<(unsigned)((n8 + 255) / 256), 256, 0, st>>>((__nv_bfloat16 *)dq, dqacc, S, Sp, H, scale, n8);
    return cudaGetLastError() == cudaSuccess ? MT_CUATTN_OK : MT_CUATTN_ELAUNCH;
}

bool misaligned(const void *p, uintptr_t a) { return ((uintptr_t)p & (a - 1)) != 0; }


} // namespace

extern "C" int mt_cuattn_sm90_head_dim_ok(int D) { return D == 64 || D == 128 || D == 192 || D == 256; }

extern "C" int mt_cuattn_sm90_bwd_head_dim_ok(int D) { return D == 64 || D == 128; }

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

extern "C" int mt_cuattn_sm90_forward_ex(void *stream, void *out, float *lse, const void *q, const void *k,
                                         const void *v, const int32_t *starts, int B, int S, int H, int Hkv, int D,
                                         float scale, float softcap)
{
    if (B < 0 || S < 0 || H <= 0 || Hkv <= 0 || H % Hkv != 0 || !(scale > 0.0f) || isinf(scale))
        return MT_CUATTN_EINVAL;
    if (!(softcap >= 0.f) || isinf(softcap)) return MT_CUATTN_EINVAL;
    if (!out || !lse || !q || !k || !v) return MT_CUATTN_EINVAL;
    if (!mt_cuattn_sm90_head_dim_ok(D)) return MT_CUATTN_EUNSUPPORTED;
    if (misaligned(out, 16) || misaligned(q, 16) || misaligned(k, 16) || misaligned(v, 16) || misaligned(lse, 4) ||
        misaligned(starts, 4))
        return MT_CUATTN_EALIGN;
    if ((long long)((S + BM - 1) / BM) * B * H > 0x7fffffffLL) return MT_CUATTN_ETOOBIG;
    if (B == 0 || S == 0) return MT_CUATTN_OK;
    if (!mt_cuattn_sm90_device_ok()) return MT_CUATTN_EUNSUPPORTED;
    const PFN_cuTensorMapEncodeTiled_v12000 encode = mt_sm90_tensor_map_encoder();
    if (!encode) return MT_CUATTN_EUNSUPPORTED;
    cudaStream_t st = (cudaStream_t)stream;
    switch (D) {
    case 64: return fwd_run<64>(st, encode, out, lse, q, k, v, starts, B, S, H, Hkv, scale, softcap);
    case 128: return fwd_run<128>(st, encode, out, lse, q, k, v, starts, B, S, H, Hkv, scale, softcap);
    case 192: return fwd_run<192>(st, encode, out, lse, q, k, v, starts, B, S, H, Hkv, scale, softcap);
    default: return fwd_run<256>(st, encode, out, lse, q, k, v, starts, B, S, H, Hkv, scale, softcap);
    }
}

extern "C" int mt_cuattn_sm90_forward(void *stream, void *out, float *lse, const void *q, const void *k,
                                      const void *v, int B, int S, int H, int Hkv, int D, float scale)
{
    return mt_cuattn_sm90_forward_ex(stream, out, lse, q, k, v, NULL, B, S, H, Hkv, D, scale, 0.0f);
}

extern "C" size_t mt_cuattn_sm90_workspace_bytes(int B, int S, int H, int Hkv, int D)
{
    (void)Hkv;
    if (B <= 0 || S <= 0 || H <= 0 || !mt_cuattn_sm90_bwd_head_dim_ok(D)) return 0;
    return ws_layout(B, S, H, D).total;
}

extern "C" int mt_cuattn_sm90_backward(void *stream, void *dq, void *dk, void *dv, const void *dout, const void *out,
                                       const float *lse, const void *q, const void *k, const void *v, int B, int S,
                                       int H, int Hkv, int D, float scale, void *workspace, size_t workspace_bytes)
{
    if (B < 0 || S < 0 || H <= 0 || Hkv <= 0 || H % Hkv != 0 || !(scale > 0.0f) || isinf(scale))
        return MT_CUATTN_EINVAL;
    if (!dq || !dk || !dv || !dout || !out || !lse || !q || !k || !v) return MT_CUATTN_EINVAL;
    if (!mt_cuattn_sm90_bwd_head_dim_ok(D)) return MT_CUATTN_EUNSUPPORTED;
    if (misaligned(dq, 16) || misaligned(dk, 16) || misaligned(dv, 16) || misaligned(dout, 16) ||
        misaligned(out, 16) || misaligned(q, 16) || misaligned(k, 16) || misaligned(v, 16) || misaligned(lse, 4))
        return MT_CUATTN_EALIGN;
    if ((long long)((S + BNB - 1) / BNB) * B * Hkv > 0x7fffffffLL || (long long)B * H > 65535 ||
        (long long)B * S * H * D / 8 / 256 > 0x7fffffffLL)
        return MT_CUATTN_ETOOBIG;
    if (B == 0 || S == 0) return MT_CUATTN_OK;
    if (!workspace || misaligned(workspace, 256) || workspace_bytes < mt_cuattn_sm90_workspace_bytes(B, S, H, Hkv, D))
        return MT_CUATTN_EWORKSPACE;
    if (!mt_cuattn_sm90_device_ok()) return MT_CUATTN_EUNSUPPORTED;
    const PFN_cuTensorMapEncodeTiled_v12000 encode = mt_sm90_tensor_map_encoder();
    if (!encode) return MT_CUATTN_EUNSUPPORTED;
    cudaStream_t st = (cudaStream_t)stream;
    return D == 64 ? bwd_run<64>(st, encode, dq, dk, dv, dout, out, lse, q, k, v, B, S, H, Hkv, scale, workspace)
                   : bwd_run<128>(st, encode, dq, dk, dv, dout, out, lse, q, k, v, B, S, H, Hkv, scale, workspace);
}
