// Mixture-of-experts kernels (moe.h): routing, its backward and its check, the
// row gathers and sums between tokens and the experts' sorted rows, the
// load-balancing loss, and the experts' GEMMs of a few outputs a row. Sums run in an order fixed by the shapes (tree
// reductions in shared memory, warp sums broadcast from lane 0), never with
// floating-point atomics, so every result is the same from run to run.
#include "cuda/kernels/moe.h"
#include "cuda/kernels/vec.cuh"
#include "model/template.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <math.h>
#include <stdint.h>
#include <type_traits>

typedef __nv_bfloat16 bf16;

namespace {

constexpr unsigned FULL = 0xffffffffu;
constexpr int BLOCK = 256;         // threads of the block-per-row kernels (a power of two)
constexpr int WARPS_PER_BLOCK = 4; // tokens per block of the warp-per-token kernels

__device__ __forceinline__ float ld(const float *p) { return *p; }
__device__ __forceinline__ float ld(const bf16 *p) { return __bfloat162float(*p); }
__device__ __forceinline__ void st(float *p, float v) { *p = v; }
__device__ __forceinline__ void st(bf16 *p, float v) { *p = __float2bfloat16_rn(v); }

// The routing's order: the larger probability first, then the lower index (a total order, so
// every lane of a warp picks the same expert, and the CPU op the same as the GPU).
__device__ __forceinline__ bool before(float p, int e, float q, int f) { return p > q || (p == q && e < f); }

// A warp's sum, the same in every lane (lane 0's, broadcast).
__device__ __forceinline__ double warp_sum(double v)
{
    for (int o = 16; o; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
    return __shfl_sync(FULL, v, 0);
}

// The block's sum (blockDim.x == BLOCK), in a fixed tree order; valid in thread 0.
template <typename T> __device__ T block_sum(T v, T *sh)
{
    sh[threadIdx.x] = v;
    __syncthreads();
    for (int h = BLOCK / 2; h; h >>= 1) {
        if ((int)threadIdx.x < h) sh[threadIdx.x] += sh[threadIdx.x + h];
        __syncthreads();
    }
    return sh[0];
}

// ---- CUDA kernels ----------------------------------------------------------------------------

// One warp per token: softmax, top-k in the routing's order, renormalisation, scale (where not 1).
__global__ void route_k(float *probs, float *topw, int32_t *topi, const float *logits, int T, int E, int k, int norm,
                        float scale)
{
    const int t = blockIdx.x * WARPS_PER_BLOCK + threadIdx.y, lane = threadIdx.x;
    if (t >= T) return; // the whole warp
    const float *z = logits + (size_t)t * E;
    float *p = probs + (size_t)t * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, z[e]);
    for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, o));
    double sum = 0.0;
    for (int e = lane; e < E; e += 32) {
        const float v = expf(z[e] - mx);
        p[e] = v;
        sum += v;
    }
    const float inv = (float)(1.0 / warp_sum(sum));
    for (int e = lane; e < E; e += 32) p[e] *= inv;
    __syncwarp();
    float lastp = INFINITY, s = 0.0f;
    int laste = -1;
    for (int j = 0; j < k; j++) { // the first expert after the previous pick
        float bp = 0.0f;
        int be = E; // none yet
        for (int e = lane; e < E; e += 32) {
            const float v = p[e];
            if (before(lastp, laste, v, e) && (be == E || before(v, e, bp, be))) bp = v, be = e;
        }
        for (int o = 16; o; o >>= 1) {
            const float op = __shfl_xor_sync(FULL, bp, o);
            const int oe = __shfl_xor_sync(FULL, be, o);
            if (oe != E && (be == E || before(op, oe, bp, be))) bp = op, be = oe;
        }
        if (lane == 0) topi[(size_t)t * k + j] = be, topw[(size_t)t * k + j] = bp;
        s += bp; // in the order of j, as the CPU op
        lastp = bp, laste = be;
    }
    if (norm && lane == 0)
        for (int j = 0; j < k; j++) topw[(size_t)t * k + j] /= s;
    if (scale != 1.0f && lane == 0)
        for (int j = 0; j < k; j++) topw[(size_t)t * k + j] *= scale;
}

__device__ float sigmoid_f(float z);

// A choice score: the score plus the correction bias (none: the score)
template <typename TB> __device__ __forceinline__ float choice(const float *p, const TB *bias, int e)
{
    return bias ? p[e] + ld(bias + e) : p[e];
}

// One warp per token, DeepSeek-V3's routing (mt_route's sigmoid): the scores; with groups, each group's
// two best choice scores summed (a lane a group) and the topk_group best groups picked in the routing's
// order (kept as a bit each, in shared memory); then the top-k choice scores among the kept groups'
// experts (the others at -inf), their scores renormalised (+ 1e-20) and scaled, as cpu_moe.c's.
// softmax: DeepSeek-V2's group_limited_greedy instead: route_k's softmax scores, a group scored by its
// best, no bias, the weights renormalised and scaled as route_k's.
template <typename TB>
__global__ void route_sigmoid_k(float *probs, float *topw, int32_t *topi, const float *logits, int T, int E, int k,
                                const TB *bias, int norm, int n_group, int topk_group, float scale, int softmax)
{
    __shared__ float gsc[WARPS_PER_BLOCK][MT_MAX_EXPERTS];       // the group scores
    __shared__ unsigned kept[WARPS_PER_BLOCK][MT_MAX_EXPERTS / 32]; // a bit per kept group
    const int wi = threadIdx.y, t = blockIdx.x * WARPS_PER_BLOCK + wi, lane = threadIdx.x;
    if (t >= T) return; // the whole warp; no block barrier follows
    const float *z = logits + (size_t)t * E;
    float *p = probs + (size_t)t * E;
    if (softmax) { // as route_k
        float mx = -INFINITY;
        for (int e = lane; e < E; e += 32) mx = fmaxf(mx, z[e]);
        for (int o = 16; o; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(FULL, mx, o));
        double sum = 0.0;
        for (int e = lane; e < E; e += 32) {
            const float v = expf(z[e] - mx);
            p[e] = v;
            sum += v;
        }
        const float inv = (float)(1.0 / warp_sum(sum));
        for (int e = lane; e < E; e += 32) p[e] *= inv;
    } else {
        for (int e = lane; e < E; e += 32) p[e] = sigmoid_f(z[e]);
    }
    __syncwarp();
    const int G = n_group > 1 ? E / n_group : E; // experts of a group
    if (n_group > 1) {
        for (int g = lane; g < n_group; g += 32) {
            float a = -INFINITY, b = -INFINITY;
            for (int e = g * G; e < (g + 1) * G; e++) {
                const float c = choice(p, bias, e);
                if (c > a) b = a, a = c;
                else if (c > b) b = c;
            }
            gsc[wi][g] = G > 1 && !softmax ? a + b : a;
        }
        for (int i = lane; i < (n_group + 31) / 32; i += 32) kept[wi][i] = 0u;
        __syncwarp();
        float lastv = INFINITY;
        int lastg = -1;
        for (int j = 0; j < topk_group; j++) { // the first group after the previous pick
            float bv = 0.0f;
            int bg = n_group; // none yet
            for (int g = lane; g < n_group; g += 32) {
                const float v = gsc[wi][g];
                if (before(lastv, lastg, v, g) && (bg == n_group || before(v, g, bv, bg))) bv = v, bg = g;
            }
            for (int o = 16; o; o >>= 1) {
                const float ov = __shfl_xor_sync(FULL, bv, o);
                const int og = __shfl_xor_sync(FULL, bg, o);
                if (og != n_group && (bg == n_group || before(ov, og, bv, bg))) bv = ov, bg = og;
            }
            if (lane == 0 && bg < n_group) kept[wi][bg >> 5] |= 1u << (bg & 31);
            lastv = bv, lastg = bg;
        }
        __syncwarp();
    }
    float lastc = INFINITY, s = 0.0f;
    int laste = -1;
    for (int j = 0; j < k; j++) { // the first expert after the previous pick, by choice score
        float bc = 0.0f;
        int be = E; // none yet
        for (int e = lane; e < E; e += 32) {
            const int g = e / G;
            const bool in = n_group <= 1 || (kept[wi][g >> 5] >> (g & 31) & 1u);
            const float v = in ? choice(p, bias, e) : -INFINITY;
            if (before(lastc, laste, v, e) && (be == E || before(v, e, bc, be))) bc = v, be = e;
        }
        for (int o = 16; o; o >>= 1) {
            const float oc = __shfl_xor_sync(FULL, bc, o);
            const int oe = __shfl_xor_sync(FULL, be, o);
            if (oe != E && (be == E || before(oc, oe, bc, be))) bc = oc, be = oe;
        }
        const float sc = be < E ? p[be] : NAN; // the score, without the bias
        if (lane == 0) topi[(size_t)t * k + j] = be, topw[(size_t)t * k + j] = sc;
        s += sc; // in the order of j, as the CPU op
        lastc = bc, laste = be;
    }
    if (lane == 0 && softmax) { // as route_k and the CPU's softmax path
        if (norm)
            for (int j = 0; j < k; j++) topw[(size_t)t * k + j] /= s;
        if (scale != 1.0f)
            for (int j = 0; j < k; j++) topw[(size_t)t * k + j] *= scale;
    } else if (lane == 0) {
        for (int j = 0; j < k; j++) {
            float x = topw[(size_t)t * k + j];
            if (norm) x /= s + 1e-20f;
            topw[(size_t)t * k + j] = x * scale;
        }
    }
}

// One block per expert: its routed rows into offs[e + 1] (and stats), its probability sum.
__global__ void count_k(int32_t *offs, float *stats, const int32_t *topi, const float *probs, int T, int E, int R)
{
    __shared__ int shi[BLOCK];
    __shared__ double shd[BLOCK];
    const int e = blockIdx.x;
    int c = 0;
    for (int i = threadIdx.x; i < R; i += BLOCK) c += topi[i] == e;
    c = block_sum(c, shi);
    if (threadIdx.x == 0) offs[e + 1] = c;
    if (!stats) return;
    double ps = 0.0;
    for (int t = threadIdx.x; t < T; t += BLOCK) ps += probs[(size_t)t * E + e];
    __syncthreads();
    ps = block_sum(ps, shd);
    if (threadIdx.x == 0) stats[e] = (float)c, stats[E + e] = (float)ps;
}

// The counts in offs[1..E] into each expert's first row (E <= 1024: one thread).
__global__ void scan_k(int32_t *offs, int E)
{
    offs[0] = 0;
    for (int e = 0; e < E; e++) offs[e + 1] += offs[e];
}

// One block per expert: its slots, in order, into its rows. A thread tests PLACE_SLOTS consecutive
// slots an iteration, so BLOCK * PLACE_SLOTS slots pass between the block's barriers (one slot a
// thread took 340 us for Qwen3-30B-A3B's 131072 slots on the H200: 256 iterations of two barriers
// and a serial sum over the warps, for 128 blocks that each read all of topi).
constexpr int PLACE_SLOTS = 16;

__global__ void place_k(int32_t *rows, int32_t *slot_row, const int32_t *offs, const int32_t *topi, int R)
{
    __shared__ int warp_n[BLOCK / 32];
    const int e = blockIdx.x, lane = threadIdx.x & 31, w = threadIdx.x >> 5;
    int base = offs[e];
    for (int i0 = 0; i0 < R; i0 += BLOCK * PLACE_SLOTS) {
        const int i = i0 + (int)threadIdx.x * PLACE_SLOTS;
        unsigned bits = 0;
#pragma unroll
        for (int q = 0; q < PLACE_SLOTS; q++) bits |= (unsigned)(i + q < R && topi[i + q] == e) << q;
        const int n = __popc(bits);
        int incl = n; // the warp's inclusive sum of n, lane by lane
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int y = __shfl_up_sync(FULL, incl, o);
            if (lane >= o) incl += y;
        }
        if (lane == 31) warp_n[w] = incl;
        __syncthreads();
        int r = base + incl - n;
        for (int q = 0; q < w; q++) r += warp_n[q];
        for (int q = 0; bits; q++, bits >>= 1)
            if (bits & 1u) rows[r] = i + q, slot_row[i + q] = r, r++;
        for (int q = 0; q < BLOCK / 32; q++) base += warp_n[q];
        __syncthreads();
    }
}

// A routing that left slots unplaced (a non-finite router logit: no expert compares above it) has rows
// past offs[E] and slots without a row that nothing wrote. The step is reported failed by the offsets'
// check at its end; until then the kernels behind the routing read these, so they get harmless values:
// row 0, expert 0 with weight 0. A routing that placed every slot is left as it is.
__global__ void unplaced_k(int32_t *rows, int32_t *slot_row, int32_t *topi, float *topw, const int32_t *offs, int E,
                           int R)
{
    const int i = blockIdx.x * BLOCK + threadIdx.x;
    if (i >= R || offs[E] == R) return;
    if (i >= offs[E]) rows[i] = 0;
    if (topi[i] < 0 || topi[i] >= E) topi[i] = 0, topw[i] = 0.0f, slot_row[i] = 0;
}

// One warp per token: the gradient of the probabilities (the load-balancing loss's, then the
// routing weights' through the scale and the renormalisation), then through the softmax (or the
// sigmoid). The experts' routed rows summed over the L layers are made once per block, in shared memory.
__global__ void route_bwd_k(float *dlogits, const float *dw, const float *probs, const float *topw,
                            const int32_t *topi, const float *stats, int L, float aux, int T, int E, int k, int norm,
                            int sigmoid, float scale)
{
    __shared__ float cnt[1024];
    for (int e = threadIdx.y * 32 + threadIdx.x; e < E; e += 32 * WARPS_PER_BLOCK) {
        float c = 0.0f;
        if (stats)
            for (int l = 0; l < L; l++) c += stats[(size_t)l * 2 * E + e];
        cnt[e] = c;
    }
    __syncthreads();
    const int t = blockIdx.x * WARPS_PER_BLOCK + threadIdx.y, lane = threadIdx.x;
    if (t >= T) return; // the whole warp, after the block's last barrier
    const float *p = probs + (size_t)t * E;
    float *g = dlogits + (size_t)t * E;
    for (int e = lane; e < E; e += 32) g[e] = aux * cnt[e];
    __syncwarp();
    if (lane == 0) {
        const float *gw = dw + (size_t)t * k, *w = topw + (size_t)t * k;
        const int32_t *idx = topi + (size_t)t * k;
        float S = 0.0f, dot = 0.0f;
        for (int j = 0; j < k; j++) S += p[idx[j]], dot += gw[j] * w[j];
        if (sigmoid) S += 1e-20f; // the forward's denominator
        for (int j = 0; j < k; j++) g[idx[j]] += norm ? (scale * gw[j] - dot) / S : scale * gw[j];
    }
    __syncwarp();
    if (sigmoid) { // dz = p (1 - p) g
        for (int e = lane; e < E; e += 32) g[e] = p[e] * (1.0f - p[e]) * g[e];
        return;
    }
    double pg = 0.0;
    for (int e = lane; e < E; e += 32) pg += (double)p[e] * g[e];
    const float s = (float)warp_sum(pg);
    __syncwarp();
    for (int e = lane; e < E; e += 32) g[e] = p[e] * (g[e] - s);
}

template <typename TD> __global__ void gather_k(TD *dst, const TD *src, const int32_t *rows, int k, int C)
{
    const size_t r = blockIdx.x, from = (size_t)(rows[r] / k);
    for (int c = threadIdx.x; c < C; c += blockDim.x) dst[r * C + c] = src[from * C + c];
}

// Rows of n 16-byte units (both pointers aligned): one unit a thread. gather_k's one element a thread
// took 524 us for Qwen3-30B-A3B's 131072 rows of 2048 bf16 on the H200, 4x its traffic's time.
__global__ void gather16_k(uint4 *dst, const uint4 *src, const int32_t *rows, int k, int n, size_t total)
{
    const size_t i = (size_t)blockIdx.x * BLOCK + threadIdx.x;
    if (i >= total) return;
    const size_t r = i / (size_t)n, c = i - r * (size_t)n;
    dst[i] = src[(size_t)(rows[r] / k) * n + c];
}

// combine_k eight elements a thread, through 16-byte accesses (C % 8 == 0, out and src aligned), each
// element's sum in the same order and roundings: the same bits.
template <typename TO, typename TS>
__global__ void combine8_k(TO *out, const TS *src, const float *w, const int32_t *slot_row, int k, int C)
{
    const size_t t = blockIdx.x;
    for (int c = threadIdx.x * 8; c < C; c += blockDim.x * 8) {
        float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f}, v[8], o[8];
        for (int j = 0; j < k; j++) {
            const size_t s = t * k + j;
            const float ws = w ? w[s] : 1.0f;
            load<8>(src + (size_t)slot_row[s] * C + c, v);
#pragma unroll
            for (int q = 0; q < 8; q++) acc[q] = __fadd_rn(acc[q], __fmul_rn(ws, v[q]));
        }
        load<8>(out + t * C + c, o);
#pragma unroll
        for (int q = 0; q < 8; q++) o[q] = __fadd_rn(o[q], acc[q]);
        store<8>(out + t * C + c, o);
    }
}

template <typename TO, typename TS>
__global__ void combine_k(TO *out, const TS *src, const float *w, const int32_t *slot_row, int k, int C)
{
    const size_t t = blockIdx.x;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++) {
            const size_t s = t * k + j;
            acc = __fadd_rn(acc, __fmul_rn(w ? w[s] : 1.0f, ld(src + (size_t)slot_row[s] * C + c)));
        }
        st(out + t * C + c, __fadd_rn(ld(out + t * C + c), acc));
    }
}

// dot_scale_k with a thread's elements held in registers from the dot to the scale, eight at a time
// through 16-byte accesses (n % 8 == 0, x and y aligned): thread t holds the groups of eight t + BLOCK j,
// j < V, so each row is read once (dot_scale_k reads it twice, element by element). The scaled rows are
// dot_scale_k's bits; the dot sums the same exact double products in another order, so dw can differ
// from dot_scale_k's in its last bit where the double sum lies next to a float's rounding boundary.
template <typename TD, int V>
__global__ void __launch_bounds__(BLOCK) dot_scale8_k(float *dw, TD *x, TD *y, const float *w, const int32_t *rows,
                                                      int n)
{
    __shared__ double sh[BLOCK];
    const size_t r = blockIdx.x;
    TD *xr = x + r * n, *yr = y ? y + r * n : nullptr;
    const int groups = n / 8;
    float xv[V][8], yv[V][8];
    double d = 0.0;
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int g = threadIdx.x + j * BLOCK;
        if (g >= groups) continue;
        load<8>(xr + (size_t)8 * g, xv[j]);
        if (yr) {
            load<8>(yr + (size_t)8 * g, yv[j]);
            if (dw)
#pragma unroll
                for (int q = 0; q < 8; q++) d += (double)xv[j][q] * yv[j][q];
        }
    }
    if (dw && yr) {
        d = block_sum(d, sh);
        if (threadIdx.x == 0) dw[rows[r]] = (float)d;
    }
    const float s = w[rows[r]];
#pragma unroll
    for (int j = 0; j < V; j++) {
        const int g = threadIdx.x + j * BLOCK;
        if (g >= groups) continue;
#pragma unroll
        for (int q = 0; q < 8; q++) xv[j][q] *= s;
        store<8>(xr + (size_t)8 * g, xv[j]);
        if (yr) {
#pragma unroll
            for (int q = 0; q < 8; q++) yv[j][q] *= s;
            store<8>(yr + (size_t)8 * g, yv[j]);
        }
    }
}

// dw NULL: no dot; y NULL: x alone is scaled (and no dot). Both branches are uniform over the block, so
// block_sum's barriers are reached by every thread or by none; without the dot, each thread reads and
// writes only its own elements.
template <typename TD>
__global__ void dot_scale_k(float *dw, TD *x, TD *y, const float *w, const int32_t *rows, int n)
{
    __shared__ double sh[BLOCK];
    const size_t r = blockIdx.x;
    TD *xr = x + r * n, *yr = y ? y + r * n : nullptr;
    if (dw && yr) {
        double d = 0.0;
        for (int i = threadIdx.x; i < n; i += BLOCK) d += (double)ld(xr + i) * ld(yr + i);
        d = block_sum(d, sh); // every read of the row is done
        if (threadIdx.x == 0) dw[rows[r]] = (float)d;
    }
    const float s = w[rows[r]];
    if (yr)
        for (int i = threadIdx.x; i < n; i += BLOCK) st(xr + i, ld(xr + i) * s), st(yr + i, ld(yr + i) * s);
    else
        for (int i = threadIdx.x; i < n; i += BLOCK) st(xr + i, ld(xr + i) * s);
}

__device__ float sigmoid_f(float z) { return 1.0f / (1.0f + expf(-z)); }

template <typename TD> __global__ void shared_gate_k(TD *out, const TD *src, const float *z, int C)
{
    const size_t t = blockIdx.x;
    const float s = sigmoid_f(z[t]);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        const size_t i = t * C + c;
        st(out + i, ld(out + i) + s * ld(src + i));
    }
}

template <typename TD> __global__ void shared_gate_bwd_k(float *dz, TD *x, TD *y, const float *z, int n)
{
    __shared__ double sh[BLOCK];
    const size_t t = blockIdx.x;
    TD *xt = x + t * n, *yt = y + t * n;
    double d = 0.0;
    for (int i = threadIdx.x; i < n; i += BLOCK) d += (double)ld(xt + i) * ld(yt + i);
    d = block_sum(d, sh); // every read of the row is done
    const float s = sigmoid_f(z[t]);
    if (threadIdx.x == 0) dz[t] = (float)(d * s * (1.0 - s));
    for (int i = threadIdx.x; i < n; i += BLOCK) st(xt + i, ld(xt + i) * s), st(yt + i, ld(yt + i) * s);
}

__global__ void aux_loss_k(double *loss, const float *stats, int L, int E, double scale)
{
    __shared__ double sh[BLOCK];
    double sum = 0.0;
    for (int e = threadIdx.x; e < E; e += BLOCK) {
        double c = 0.0, p = 0.0;
        for (int l = 0; l < L; l++) c += stats[(size_t)l * 2 * E + e], p += stats[(size_t)l * 2 * E + E + e];
        sum += c * p;
    }
    sum = block_sum(sum, sh);
    if (threadIdx.x == 0) *loss += scale * (double)E * sum;
}

// The offsets' check (mt_cu_moe_check_offs): one thread, E <= 1024. The first bad routing stays.
__global__ void check_offs_k(const int32_t *offs, int E, int expect, int32_t *flag)
{
    if (flag[0]) return;
    bool mono = offs[0] == 0;
    for (int e = 0; e < E && mono; e++) mono = offs[e + 1] >= offs[e];
    if (mono && offs[E] == expect) return;
    flag[1] = mono ? offs[E] : -1;
    flag[2] = expect;
    flag[0] = 1;
}

// The recompute's offsets against the forward's (mt_cu_moe_check_same): each thread a stride of the E + 1,
// the smallest differing expert by an atomicMin in shared memory (the result does not depend on the order).
__global__ void check_same_k(const int32_t *offs, const int32_t *ref, int E, int32_t *flag)
{
    __shared__ int first;
    if (threadIdx.x == 0) first = E + 1;
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x)
        if (offs[e] != ref[e]) atomicMin(&first, e);
    __syncthreads();
    if (threadIdx.x || first > E || flag[0]) return;
    flag[1] = first;
    flag[2] = offs[first];
    flag[0] = 2;
}

// Expert e's first row, clamped to [0, R]: a routing that failed its check (reported at the step's end)
// must not send a kernel out of its buffers meanwhile.
__device__ __forceinline__ int first_row(const int32_t *offs, int e, int R) { return min(max(offs[e], 0), R); }

// The expert whose rows hold r, or -1: the last e whose (clamped) first row is at most r, if r is before
// the next expert's first row. Experts without rows share their first row with the next, so the last
// such e is the one with rows. A binary search over E + 1 offsets.
__device__ int expert_of(const int32_t *offs, int E, int R, int r)
{
    if (first_row(offs, 0, R) > r) return -1;
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) / 2;
        if (first_row(offs, mid, R) <= r) lo = mid;
        else hi = mid - 1;
    }
    return r < first_row(offs, lo + 1, R) ? lo : -1;
}

// One warp per output y[r, n] (N <= MT_CU_MOE_SMALL_N): each lane's products over its stride of K in
// fp32, the lanes summed by a fixed tree into lane 0, which adds the bias and y and writes.
template <typename TD, typename TO>
__global__ void linear_small_k(TO *y, const TD *x, const TD *W, const TD *bias, const int32_t *offs, int E, int R,
                               int K, int N, int accumulate)
{
    const size_t o = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) / 32; // the same in every lane
    const int lane = threadIdx.x & 31;
    if (o >= (size_t)R * N) return; // the whole warp
    const int r = (int)(o / N), n = (int)(o % N);
    const int e = expert_of(offs, E, R, r);
    if (e < 0) return; // the whole warp: a row of no expert
    const TD *xr = x + (size_t)r * K, *wr = W + ((size_t)e * N + n) * K;
    float acc = 0.0f;
    for (int i = lane; i < K; i += 32) acc = fmaf(ld(xr + i), ld(wr + i), acc);
    for (int h = 16; h; h >>= 1) acc += __shfl_down_sync(FULL, acc, h);
    if (lane) return;
    if (bias) acc += ld(bias + (size_t)e * N + n);
    TO *out = y + (size_t)r * N + n;
    if (accumulate) acc += ld(out);
    st(out, acc);
}

// One thread per (expert, output n, column i of K; i == K: the bias): its sum over the expert's rows in
// ascending order, added once. Blocks of one (expert, n) along y, of columns along x.
template <typename TD>
__global__ void linear_dw_small_k(float *dW, float *db, const TD *dy, const TD *x, const int32_t *offs, int R, int K,
                                  int N)
{
    const int i = blockIdx.x * blockDim.x + threadIdx.x, e = blockIdx.y / N, n = blockIdx.y % N;
    if (i > K || (i == K && !db)) return;
    const int lo = first_row(offs, e, R), hi = max(first_row(offs, e + 1, R), lo);
    if (hi == lo) return; // no rows: untouched
    float acc = 0.0f;
    if (i < K) {
        for (int r = lo; r < hi; r++) acc = fmaf(ld(dy + (size_t)r * N + n), ld(x + (size_t)r * K + i), acc);
        dW[((size_t)e * N + n) * K + i] += acc;
    } else {
        for (int r = lo; r < hi; r++) acc += ld(dy + (size_t)r * N + n);
        db[(size_t)e * N + n] += acc;
    }
}

int launched(void) { return cudaGetLastError() == cudaSuccess ? 0 : -1; }

template <typename F> int with_dt(mt_cu_dtype dt, F &&f)
{
    if (dt == MT_CU_BF16) return f((bf16 *)nullptr);
    if (dt == MT_CU_F32) return f((float *)nullptr);
    return -1;
}

unsigned threads_for(int C) { return C >= BLOCK ? BLOCK : (unsigned)((C + 31) / 32 * 32); }

} // namespace

// ---- kernel launchers ----------------------------------------------------------------------------

extern "C" int mt_cu_moe_route(mt_cu_stream s, float *probs, float *topw, int32_t *topi, int32_t *rows,
                               int32_t *slot_row, int32_t *offs, float *stats, const float *logits, int T, int E,
                               int k, const mt_route *rt, mt_cu_dtype bias_dt)
{
    if (!rt || T < 0 || E <= 0 || E > MT_MAX_EXPERTS || k <= 0 || k > E) return -1;
    const int ng = rt->n_group > 1 ? rt->n_group : 0;
    if (ng && (E % ng || rt->topk_group < 1 || rt->topk_group > ng)) return -1;
    cudaStream_t st_ = (cudaStream_t)s;
    const int R = T * k;
    const dim3 grid((T + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK), block(32, WARPS_PER_BLOCK);
    if (T && !rt->sigmoid && !ng) {
        route_k<<<grid, block, 0, st_>>>(probs, topw, topi, logits, T, E, k, rt->norm, rt->scale);
    } else if (T) {
        auto go = [&](auto tag) {
            using TB = typename std::remove_pointer<decltype(tag)>::type;
            route_sigmoid_k<TB><<<grid, block, 0, st_>>>(probs, topw, topi, logits, T, E, k, (const TB *)rt->bias,
                                                         rt->norm, ng, rt->topk_group, rt->scale, !rt->sigmoid);
            return 0;
        };
        if (rt->bias ? with_dt(bias_dt, go) : go((float *)nullptr)) return -1;
    }
    count_k<<<E, BLOCK, 0, st_>>>(offs, stats, topi, probs, T, E, R);
    scan_k<<<1, 1, 0, st_>>>(offs, E);
    if (R) place_k<<<E, BLOCK, 0, st_>>>(rows, slot_row, offs, topi, R);
    if (R) unplaced_k<<<(R + BLOCK - 1) / BLOCK, BLOCK, 0, st_>>>(rows, slot_row, topi, topw, offs, E, R);
    return launched();
}

extern "C" int mt_cu_moe_route_bwd(mt_cu_stream s, float *dlogits, const float *dw, const float *probs,
                                   const float *topw, const int32_t *topi, const float *stats, int L, float aux, int T,
                                   int E, int k, const mt_route *rt)
{
    if (!rt || T < 0 || E <= 0 || E > MT_MAX_EXPERTS || k <= 0 || k > E || L < 0) return -1;
    if (!T) return 0;
    route_bwd_k<<<(T + WARPS_PER_BLOCK - 1) / WARPS_PER_BLOCK, dim3(32, WARPS_PER_BLOCK), 0, (cudaStream_t)s>>>(
        dlogits, dw, probs, topw, topi, stats, L, aux, T, E, k, rt->norm, rt->sigmoid, rt->scale);
    return launched();
}

extern "C" int mt_cu_moe_gather(mt_cu_stream s, mt_cu_dtype dt, void *dst, const void *src, const int32_t *rows, int R,
                                int k, int C)
{
    if (R < 0 || k <= 0 || C <= 0) return -1;
    if (!R) return 0;
    return with_dt(dt, [&](auto tag) {
        using TD = typename std::remove_pointer<decltype(tag)>::type;
        if ((size_t)C * sizeof(TD) % 16 == 0 && al16(dst) && al16(src)) {
            const int n = (int)((size_t)C * sizeof(TD) / 16);
            const size_t total = (size_t)R * n;
            gather16_k<<<(unsigned)((total + BLOCK - 1) / BLOCK), BLOCK, 0, (cudaStream_t)s>>>(
                (uint4 *)dst, (const uint4 *)src, rows, k, n, total);
        } else {
            gather_k<TD><<<R, threads_for(C), 0, (cudaStream_t)s>>>((TD *)dst, (const TD *)src, rows, k, C);
        }
        return launched();
    });
}

extern "C" int mt_cu_moe_combine(mt_cu_stream s, mt_cu_dtype odt, void *out, mt_cu_dtype sdt, const void *src,
                                 const float *w, const int32_t *slot_row, int T, int k, int C)
{
    if (T < 0 || k <= 0 || C <= 0) return -1;
    if (!T) return 0;
    return with_dt(odt, [&](auto to) {
        using TO = typename std::remove_pointer<decltype(to)>::type;
        return with_dt(sdt, [&](auto ts) {
            using TS = typename std::remove_pointer<decltype(ts)>::type;
            if (C % 8 == 0 && al16(out) && al16(src))
                combine8_k<TO, TS><<<T, threads_for(C / 8), 0, (cudaStream_t)s>>>((TO *)out, (const TS *)src, w,
                                                                                 slot_row, k, C);
            else
                combine_k<TO, TS><<<T, threads_for(C), 0, (cudaStream_t)s>>>((TO *)out, (const TS *)src, w, slot_row,
                                                                             k, C);
            return launched();
        });
    });
}

extern "C" int mt_cu_moe_dot_scale(mt_cu_stream s, mt_cu_dtype dt, float *dw, void *x, void *y, const float *w,
                                   const int32_t *rows, int R, int n)
{
    if (R < 0 || n <= 0) return -1;
    if (!R) return 0;
    return with_dt(dt, [&](auto tag) {
        using TD = typename std::remove_pointer<decltype(tag)>::type;
        cudaStream_t st = (cudaStream_t)s;
        // the groups of eight a thread holds: bf16 rows up to 16384 wide, fp32 up to 8192 (registers)
        const int per = (n / 8 + BLOCK - 1) / BLOCK, vmax = sizeof(TD) == 2 ? 8 : 4;
        if (n % 8 || !al16(x) || (y && !al16(y)) || per > vmax)
            dot_scale_k<TD><<<R, BLOCK, 0, st>>>(dw, (TD *)x, (TD *)y, w, rows, n);
        else if (per <= 1)
            dot_scale8_k<TD, 1><<<R, BLOCK, 0, st>>>(dw, (TD *)x, (TD *)y, w, rows, n);
        else if (per <= 2)
            dot_scale8_k<TD, 2><<<R, BLOCK, 0, st>>>(dw, (TD *)x, (TD *)y, w, rows, n);
        else if (per <= 4)
            dot_scale8_k<TD, 4><<<R, BLOCK, 0, st>>>(dw, (TD *)x, (TD *)y, w, rows, n);
        else
            dot_scale8_k<TD, 8><<<R, BLOCK, 0, st>>>(dw, (TD *)x, (TD *)y, w, rows, n);
        return launched();
    });
}

extern "C" int mt_cu_moe_shared_gate(mt_cu_stream s, mt_cu_dtype dt, void *out, const void *src, const float *z,
                                     int T, int C)
{
    if (T < 0 || C <= 0) return -1;
    if (!T) return 0;
    return with_dt(dt, [&](auto tag) {
        using TD = typename std::remove_pointer<decltype(tag)>::type;
        shared_gate_k<TD><<<T, threads_for(C), 0, (cudaStream_t)s>>>((TD *)out, (const TD *)src, z, C);
        return launched();
    });
}

extern "C" int mt_cu_moe_shared_gate_bwd(mt_cu_stream s, mt_cu_dtype dt, float *dz, void *x, void *y, const float *z,
                                         int T, int n)
{
    if (T < 0 || n <= 0) return -1;
    if (!T) return 0;
    return with_dt(dt, [&](auto tag) {
        using TD = typename std::remove_pointer<decltype(tag)>::type;
        shared_gate_bwd_k<TD><<<T, BLOCK, 0, (cudaStream_t)s>>>(dz, (TD *)x, (TD *)y, z, n);
        return launched();
    });
}

extern "C" int mt_cu_moe_aux_loss(mt_cu_stream s, double *loss, const float *stats, int L, int E, double scale)
{
    if (L < 0 || E <= 0) return -1;
    aux_loss_k<<<1, BLOCK, 0, (cudaStream_t)s>>>(loss, stats, L, E, scale);
    return launched();
}

extern "C" int mt_cu_moe_check_offs(mt_cu_stream s, const int32_t *offs, int E, int expect, int32_t *flag)
{
    if (!offs || !flag || E <= 0 || E > MT_MAX_EXPERTS) return -1;
    check_offs_k<<<1, 1, 0, (cudaStream_t)s>>>(offs, E, expect, flag);
    return launched();
}

extern "C" int mt_cu_moe_check_same(mt_cu_stream s, const int32_t *offs, const int32_t *ref, int E, int32_t *flag)
{
    if (!offs || !ref || !flag || E <= 0 || E > MT_MAX_EXPERTS) return -1;
    check_same_k<<<1, 256, 0, (cudaStream_t)s>>>(offs, ref, E, flag);
    return launched();
}

extern "C" int mt_cu_moe_linear_small(mt_cu_stream s, mt_cu_dtype dt, mt_cu_dtype ydt, void *y, const void *x,
                                      const void *W, const void *bias, const int32_t *offs, int E, int R, int K, int N,
                                      int accumulate)
{
    if (E <= 0 || E > MT_MAX_EXPERTS || R < 0 || K <= 0 || N <= 0 || N > MT_CU_MOE_SMALL_N) return -1;
    if (!R) return 0;
    const size_t warps = (size_t)R * N, blocks = (warps + BLOCK / 32 - 1) / (BLOCK / 32);
    if (blocks > 0x7fffffffu) return -1;
    return with_dt(dt, [&](auto tag) {
        using TD = typename std::remove_pointer<decltype(tag)>::type;
        return with_dt(ydt, [&](auto to) {
            using TO = typename std::remove_pointer<decltype(to)>::type;
            linear_small_k<TD, TO><<<(unsigned)blocks, BLOCK, 0, (cudaStream_t)s>>>(
                (TO *)y, (const TD *)x, (const TD *)W, (const TD *)bias, offs, E, R, K, N, accumulate);
            return launched();
        });
    });
}

extern "C" int mt_cu_moe_linear_dw_small(mt_cu_stream s, mt_cu_dtype dt, float *dW, float *db, const void *dy,
                                         const void *x, const int32_t *offs, int E, int R, int K, int N)
{
    if (E <= 0 || E > MT_MAX_EXPERTS || R < 0 || K <= 0 || N <= 0 || N > MT_CU_MOE_SMALL_N) return -1;
    if (!R) return 0;
    const dim3 grid((unsigned)((K + 1 + BLOCK - 1) / BLOCK), (unsigned)(E * N)); // E * N <= 8192
    return with_dt(dt, [&](auto tag) {
        using TD = typename std::remove_pointer<decltype(tag)>::type;
        linear_dw_small_k<TD><<<grid, BLOCK, 0, (cudaStream_t)s>>>(dW, db, (const TD *)dy, (const TD *)x, offs, R, K,
                                                                   N);
        return launched();
    });
}
