/* Fused causal attention with grouped-query heads on the GPU, forward and
 * backward, flash-attention style: memory linear in the sequence length (no
 * S x S matrix is ever stored). Plain C: the CUDA toolkit stays in
 * cuda/kernels/attention.cu; streams are passed as void * (a cudaStream_t, NULL for
 * the default stream). docs/attention.md describes the algorithm.
 *
 * Shapes and layouts are those of mt_cpu_attention / mt_cpu_attention_bwd
 * (src/cpu/cpu_ops.h): B batch, S sequence, H query heads, Hkv key/value heads
 * (H % Hkv == 0, query head h reads kv head h / (H/Hkv)), D head dim.
 *   q, out, dout, dq  (B, S, H, D)      k, v, dk, dv  (B, S, Hkv, D)
 *   lse               (B, H, S) fp32: natural log-sum-exp of each query row's
 *                     scaled scores, written by the forward, read by the backward
 *   out[b,i,h] = sum_{j<=i} softmax_j(scale * q[b,i,h] . k[b,j,g]) v[b,j,g], g = h / (H/Hkv)
 * All pointers are device pointers; the tensors are dense; q, k, v, out,
 * dout, dq, dk, dv and the workspace 16-byte aligned, lse 4-byte aligned.
 *
 * dtype MT_CUATTN_BF16: q, k, v, out, dout, dq, dk, dv are bf16; the products
 *   run on the tensor cores (mma.sync m16n8k16) with fp32 accumulation; the
 *   probabilities P and dS are rounded to bf16 before their products.
 * dtype MT_CUATTN_FP32: all fp32, computed in fp32 on the CUDA cores (the
 *   reference mode: slower).
 * D may be any multiple of 8 from 8 to 256 (either dtype): the kernels run
 * tiles of 32, 64, 128 or 256 columns, the smallest that holds D, with the
 * columns past D zero in shared memory (mt_cuattn_head_dim_ok).
 *
 * Determinism: every output element is written by one thread block that sums
 * its terms in an order fixed by the shapes (no atomics), so results are
 * bit-identical from run to run on the same GPU model.
 *
 * Calls are asynchronous on `stream` and enqueue kernels only (no allocation,
 * no synchronisation, no global state): a return of 0 means the kernels were
 * launched; errors in their execution surface at the next synchronisation.
 * A call that fails a check before launching leaves every output untouched.
 * Calls are thread-safe (on different streams or the same). */
#ifndef MT_CUDA_ATTENTION_H
#define MT_CUDA_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
    MT_CUATTN_BF16 = 0,
    MT_CUATTN_FP32 = 1,
};

/* Return codes (mt_cuattn_strerror gives a sentence for each). */
enum {
    MT_CUATTN_OK = 0,
    MT_CUATTN_EINVAL = -1,     /* a shape <= 0 (or B, S < 0), H % Hkv != 0, scale not > 0, unknown dtype, NULL pointer */
    MT_CUATTN_EHEADDIM = -2,   /* D is not a multiple of 8 from 8 to 256 */
    MT_CUATTN_EALIGN = -3,     /* a tensor is not 16-byte aligned */
    MT_CUATTN_EWORKSPACE = -4, /* workspace NULL, too small, or not 16-byte aligned */
    MT_CUATTN_ECONFIG = -5,    /* the kernel's shared-memory size could not be set (cudaFuncSetAttribute) */
    MT_CUATTN_ELAUNCH = -6,    /* a launch failed (cudaGetLastError after it; no device, bad context, ...) */
    /* -7 is retired (a runtime helper failed; those helpers are now device/device.h) */
    MT_CUATTN_ETOOBIG = -8,    /* B*H > INT_MAX or S > 1048560 (grid dimensions) */
    MT_CUATTN_EUNSUPPORTED = -9, /* the Hopper kernels: not a compute capability 9.0 device, or a head size
                                    (mt_cuattn_sm90_head_dim_ok) they do not take */
};

/* A static string describing a return code; never NULL. */
const char *mt_cuattn_strerror(int code);
/* Nonzero when the kernels take head size D. */
int mt_cuattn_head_dim_ok(int D);

/* Forward: out and lse from q, k, v. B == 0 or S == 0 is a no-op. The
 * forward calls run the mma.sync kernels (the Hopper kernel, below, is reached
 * through its own calls until it has been measured against them). */
int mt_cuattn_forward(void *stream, int dtype, void *out, float *lse, const void *q, const void *k, const void *v,
                      int B, int S, int H, int Hkv, int D, float scale);

/* Bytes of device workspace the backward needs: D_i = rowsum(dout * out),
 * B*H*S floats. */
size_t mt_cuattn_workspace_bytes(int B, int S, int H, int Hkv, int D);

/* Backward: dq, dk, dv (overwritten) from dout, and out and lse of the
 * forward. workspace: at least mt_cuattn_workspace_bytes(...) bytes of device
 * memory, 16-byte aligned, contents garbage before and after; one workspace
 * must not serve two calls in flight at once. Three kernels: D_i, then dq
 * (one block per query block: a pass over its key blocks), then dk and dv
 * (one block per key block of a kv head: a pass over the query heads of the
 * group and their query blocks). */
int mt_cuattn_backward(void *stream, int dtype, void *dq, void *dk, void *dv, const void *dout, const void *out,
                       const float *lse, const void *q, const void *k, const void *v, int B, int S, int H, int Hkv,
                       int D, float scale, void *workspace, size_t workspace_bytes);

/* Both with documents packed into each sequence: doc_start (B, S) on the
 * device gives, for each token, the index in its sequence of its document's
 * first token (nondecreasing along the sequence, doc_start[i] <= i); query i
 * then sees keys [doc_start[i], i] only. NULL: one document per sequence. A
 * block of queries starts at the first key any of its rows sees; blocks of
 * keys after a document's end are still visited (and masked), so packing
 * saves little work yet. */
int mt_cuattn_forward_docs(void *stream, int dtype, void *out, float *lse, const void *q, const void *k, const void *v,
                           const int32_t *doc_start, int B, int S, int H, int Hkv, int D, float scale);
int mt_cuattn_backward_docs(void *stream, int dtype, void *dq, void *dk, void *dv, const void *dout, const void *out,
                            const float *lse, const void *q, const void *k, const void *v, const int32_t *doc_start,
                            int B, int S, int H, int Hkv, int D, float scale, void *workspace,
                            size_t workspace_bytes);

/* Both with soft-capped scores (Gemma 2's attn_logit_softcapping), documents
 * as above: softcap > 0 replaces each score u = scale q.k by
 * c = softcap * tanh(u / softcap) (computed as tanhf(s * scale / softcap) *
 * softcap, as mt_cpu_attention_docs) before the softmax; lse is then the
 * log-sum-exp of the c, and the backward multiplies dS by 1 - tanh^2. The
 * backward must get the forward's softcap. softcap 0: exactly the calls
 * above (the kernels without the cap); < 0, NaN or inf: MT_CUATTN_EINVAL. */
int mt_cuattn_forward_softcap(void *stream, int dtype, void *out, float *lse, const void *q, const void *k,
                              const void *v, const int32_t *doc_start, int B, int S, int H, int Hkv, int D,
                              float scale, float softcap);
int mt_cuattn_backward_softcap(void *stream, int dtype, void *dq, void *dk, void *dv, const void *dout,
                               const void *out, const float *lse, const void *q, const void *k, const void *v,
                               const int32_t *doc_start, int B, int S, int H, int Hkv, int D, float scale,
                               float softcap, void *workspace, size_t workspace_bytes);

/* ---- the Hopper kernels (attention_sm90.cu, docs/attention.md) ------------------
 * bf16 only, on compute capability 9.0 devices, D 64, 128, 192 or 256 (the
 * backward: 64 or 128); the same
 * contract, layouts and math as the calls above (a different order of the
 * sums: not the same bits). Deterministic: each output element is written
 * once, its sums in an order fixed by the shapes. */

/* The forward of mt_cuattn_forward_softcap on the mma.sync (bf16) or CUDA-core
 * (fp32) kernels whatever the device: what the forward calls run (and will
 * run where the Hopper kernel does not, once it is their default). For tests
 * and benchmarks. */
int mt_cuattn_forward_mma(void *stream, int dtype, void *out, float *lse, const void *q, const void *k, const void *v,
                          const int32_t *doc_start, int B, int S, int H, int Hkv, int D, float scale, float softcap);
/* Nonzero when the Hopper forward takes head size D (64, 128, 192, 256). */
int mt_cuattn_sm90_head_dim_ok(int D);
/* Nonzero when the Hopper backward takes head size D (64, 128). */
int mt_cuattn_sm90_bwd_head_dim_ok(int D);
/* Nonzero when the current device runs them (compute capability 9.0). */
int mt_cuattn_sm90_device_ok(void);
/* mt_cuattn_forward in bf16; MT_CUATTN_EUNSUPPORTED (launching nothing) on
 * another device or head size. */
int mt_cuattn_sm90_forward(void *stream, void *out, float *lse, const void *q, const void *k, const void *v, int B,
                           int S, int H, int Hkv, int D, float scale);
/* The same with each query's first key (starts, (B, S) on the device, as
 * doc_start of mt_cuattn_forward_docs: documents, sliding windows, chunks)
 * and Gemma 2's soft cap (0: none), as mt_cuattn_forward_softcap: key blocks
 * before a query block's first row's first key are not visited, so packing
 * and windows save work. */
int mt_cuattn_sm90_forward_ex(void *stream, void *out, float *lse, const void *q, const void *k, const void *v,
                              const int32_t *starts, int B, int S, int H, int Hkv, int D, float scale, float softcap);

/* Bytes of device workspace mt_cuattn_sm90_backward needs (0 for a head
 * size it does not take): the rows' Dq and lse in log2 units, a semaphore
 * per 64 query rows and the fp32 sums of dq, (B, H, S rounded up to 64, D):
 * linear in S. */
size_t mt_cuattn_sm90_workspace_bytes(int B, int S, int H, int Hkv, int D);
/* mt_cuattn_backward in bf16: dq, dk, dv from dout, out and lse. workspace
 * 256-byte aligned, at least mt_cuattn_sm90_workspace_bytes, contents garbage
 * before and after; B * H at most 65535. dq's sums run in the order of the
 * key blocks (a semaphore per query block), so the result is deterministic.
 * MT_CUATTN_EUNSUPPORTED (launching nothing) on another device or head
 * size. */
int mt_cuattn_sm90_backward(void *stream, void *dq, void *dk, void *dv, const void *dout, const void *out,
                            const float *lse, const void *q, const void *k, const void *v, int B, int S, int H,
                            int Hkv, int D, float scale, void *workspace, size_t workspace_bytes);

/* ---- for tests and benchmarks ----------------------------------------------------
 * Device memory, copies and synchronisation are the device layer's
 * (src/device/device.h). */

/* Fills n elements of dtype (MT_CUATTN_BF16 or _FP32) at p with pseudo-random
 * values, roughly normal with standard deviation stddev (a sum of uniforms),
 * a pure function of (seed, index). Asynchronous on stream. */
int mt_cuattn_fill_random(void *stream, int dtype, void *p, size_t n, uint64_t seed, float stddev);

#ifdef __cplusplus
}
#endif

#endif
