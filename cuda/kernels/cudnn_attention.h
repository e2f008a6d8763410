/* Fused causal attention, forward and backward, through cuDNN 9's fused
 * scaled-dot-product-attention (flash) engines, reached through the backend
 * graph API. cuDNN is loaded at run time (dlopen of libcudnn.so.9, like
 * cuBLASLt in cuda/gemm/gemm.cu): the library builds and loads without it, and
 * a caller that gets NULL from mt_cudnn_attn_create, or MT_CUDNN_EUNSUPPORTED
 * from a call, uses the hand-written kernels (cuda/kernels/attention.h).
 * docs/cudnn-attention.md describes the operation graphs.
 *
 * Shapes, layouts and meaning are those of mt_cuattn_forward/backward in bf16
 * mode (cuda/kernels/attention.h): q, out, dout, dq (B, S, H, D) bf16;
 * k, v, dk, dv (B, S, Hkv, D) bf16 (grouped-query heads read natively, no
 * repetition: query head h reads kv head h / (H/Hkv)); lse (B, H, S) fp32,
 * the natural log-sum-exp of each query row's scaled, causally masked scores
 * (what cuDNN calls the softmax "stats", shape B,H,S,1: the same numbers, so
 * the two implementations' lse are interchangeable). Accumulation is fp32.
 *
 * Execution plans are built on first use of a shape (B, S, H, Hkv, D) and
 * direction, and cached (building one costs milliseconds to a second; running
 * one is a few kernels). The scale is passed at execution, not baked into the
 * plan. The backward is deterministic (an engine that sums dQ in a fixed
 * order, see the design note) unless the handle was created otherwise.
 *
 * All pointers are device pointers, 16-byte aligned; the workspace must hold
 * at least the bytes the matching *_workspace call reports. Calls are
 * asynchronous on `stream`, serialised by a mutex inside the handle (one cuDNN
 * handle), and enqueue work only: no allocation, no synchronisation. */
#ifndef MT_CUDA_CUDNN_ATTENTION_H
#define MT_CUDA_CUDNN_ATTENTION_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mt_cudnn_attn mt_cudnn_attn;

enum {
    MT_CUDNN_OK = 0,
    MT_CUDNN_EINVAL = -1,       /* a shape <= 0, H % Hkv != 0, scale not > 0, NULL or misaligned pointer */
    MT_CUDNN_EUNSUPPORTED = -2, /* cuDNN has no engine for this shape: use the hand-written kernels */
    MT_CUDNN_EWORKSPACE = -3,   /* workspace NULL or smaller than the *_workspace call says */
    MT_CUDNN_EEXEC = -4,        /* cudnnBackendExecute failed */
};

/* Loads cuDNN and creates a handle on the current device; the backward plans
 * are deterministic when `deterministic` is nonzero. NULL (with a reason in
 * why) when libcudnn.so.9 cannot be loaded, lacks a symbol, is older than
 * 9.0, or cudnnCreate fails. */
mt_cudnn_attn *mt_cudnn_attn_create(int deterministic, char *why, size_t why_len);

/* Whether cuDNN 9 can be loaded here (no device needed; loads and unloads
 * it): its cudnnGetVersion(), or 0 with the reason in why. */
size_t mt_cudnn_attn_probe(char *why, size_t why_len);

/* Whether cuDNN `version` serves a shape at all (rules known in advance of
 * building a plan: head size, grouping, the S % 128 rule of backwards before
 * 9.16); 0 when it does, else MT_CUDNN_EUNSUPPORTED with the reason. A plan
 * can still be refused when built. */
int mt_cudnn_attn_shape_ok(size_t version, int bwd, int S, int H, int Hkv, int D, char *why, size_t why_len);

/* Workspace a caller reserves before it can ask (no device, no plan): an
 * upper bound of what the *_workspace calls report on Hopper, by the engines'
 * layouts (docs/cudnn-attention.md, "Workspace"). The deterministic backward
 * keeps a (B, H, S, S) bf16 matrix of dS: quadratic in S. A plan that turns
 * out to need more is not used (the caller checks with *_workspace). */
size_t mt_cudnn_attn_forward_workspace_bound(int B, int S, int H, int Hkv, int D);
size_t mt_cudnn_attn_backward_workspace_bound(int B, int S, int H, int Hkv, int D, int deterministic);
void mt_cudnn_attn_destroy(mt_cudnn_attn *a);
/* cudnnGetVersion() of the loaded library, e.g. 91900 for 9.19.0. */
size_t mt_cudnn_attn_version(const mt_cudnn_attn *a);
/* Nonzero when the backward plans are built deterministic. */
int mt_cudnn_attn_deterministic(const mt_cudnn_attn *a);

/* Device workspace bytes of the forward / backward of a shape, building (and
 * caching) its plan; 0 on success. MT_CUDNN_EUNSUPPORTED when cuDNN refuses
 * the shape (why says what cuDNN said). */
int mt_cudnn_attn_forward_workspace(mt_cudnn_attn *a, int B, int S, int H, int Hkv, int D, size_t *bytes,
                                    char *why, size_t why_len);
int mt_cudnn_attn_backward_workspace(mt_cudnn_attn *a, int B, int S, int H, int Hkv, int D, size_t *bytes,
                                     char *why, size_t why_len);

/* Forward: out and lse from q, k, v. B == 0 or S == 0 is a no-op. */
int mt_cudnn_attn_forward(mt_cudnn_attn *a, void *stream, void *out, float *lse, const void *q, const void *k,
                          const void *v, int B, int S, int H, int Hkv, int D, float scale, void *workspace,
                          size_t workspace_bytes, char *why, size_t why_len);

/* Backward: dq, dk, dv (overwritten) from dout and the forward's out and lse. */
int mt_cudnn_attn_backward(mt_cudnn_attn *a, void *stream, void *dq, void *dk, void *dv, const void *dout,
                           const void *out, const float *lse, const void *q, const void *k, const void *v, int B,
                           int S, int H, int Hkv, int D, float scale, void *workspace, size_t workspace_bytes,
                           char *why, size_t why_len);

/* For tests without a GPU: loads cuDNN (no handle, no device needed) and
 * builds and finalizes every operation of the forward and both backward
 * graphs of a shape (not the graphs themselves, nor plans: those need a
 * device). 0 when cuDNN accepts them all; MT_CUDNN_EUNSUPPORTED with the
 * reason when it cannot be loaded or refuses one. *version (may be NULL)
 * gets cudnnGetVersion() once loaded. */
int mt_cudnn_attn_check_ops(int B, int S, int H, int Hkv, int D, size_t *version, char *why, size_t why_len);

#ifdef __cplusplus
}
#endif

#endif
