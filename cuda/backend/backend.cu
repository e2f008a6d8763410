// The CUDA backend: the family's layer template (model/template.h) run on
// the kernels of cuda/kernels and cuBLASLt GEMMs, with the scheduler's calls
// carried out on three streams.
//
//   h2d      unit weights from their pinned host tile into one of K slots
//   compute  every kernel and GEMM, in the order the scheduler issues them
//   d2h      finished gradients from the device into the unit's host tile
//
// Ordering is by events only: a slot's compute waits for its load
// (slot_loaded), a load into a slot waits until the compute that last read it
// is done (slot_free), a gradient buffer is reused only after its copy to the
// host finished (grad_sent). The host waits in sync() alone.
//
// Precision: in bf16 mode the slots, activations and checkpoints are bf16,
// GEMMs accumulate in fp32, weight gradients accumulate in fp32 on the device
// and go to the host as bf16 (into the unit's weight block, see
// docs/architecture.md); the gradient of the residual stream is fp32. In fp32
// mode everything is fp32 and gradients go to the tile's fp32 gradient block.
//
// Activation checkpoints (the output of every unit for every micro-batch)
// stay on the device when they fit the GPU budget. When they do not, the
// first ck_host of them (1 <= ck_host <= L-1: as few as make the rest fit)
// live in pinned host memory, through two rotating device rows (a row is one
// unit's outputs for all micro-batches): checkpoints 0 .. ck_host+1 take row
// u % 2, the rest a row each. The forward writes row u % 2 and copies a host
// checkpoint to pinned memory on the d2h stream; the backward fetches
// checkpoint u-2 into the row that checkpoint u just vacated while unit u
// computes, so the copies hide behind the compute. Checkpoints ck_host and
// ck_host+1 are still in their rows when the backward comes to them and never
// travel; with ck_host = L-1 (policy MT_PLACE_HOST) the device holds just
// the two rows. When the host cannot take as many as that needs (its budget,
// less the tiles), the backward recomputes rc checkpoints instead of keeping
// them (engine/backend.h: mt_ck_recomputed; all above the two rotating rows),
// through one spare row behind the others: as few as make the step fit.
//
// Beside device checkpoints, some of the layers' activations for every
// micro-batch are kept on the device when they fit (policy recompute AUTO),
// so that the backward's recompute does less: the attention output and its
// log-sum-exp of the first keep_att layers (their recompute skips the
// attention forward), and once every layer has those, the residual after
// attention of the first keep_h layers (their recompute skips the output
// projection too), and once every layer has that, q, k and v of the first
// keep_qkv layers (their recompute skips the q, k, v projections and RoPE).
// Attention goes first: per byte it saves the most, and more the longer the
// sequence. As many layers as fit the budget are kept.
//
// Memory: one device allocation (the arena) carved by layout_buffers(),
// which needs() and reserve() both run, so a plan counts exactly what a
// reservation allocates.
//
// Device: every call runs with the policy's device current, which the
// library's entry points see to (mt_engine_enter); create checks it.
//
// Notation: T = n_seq * seq_len tokens of one micro-batch, C hidden, Q = H*D,
// KV = Hkv*D, F MLP width, V vocabulary, L layers.
#include "cuda/kernels/attention.h"
#include "cuda/kernels/cudnn_attention.h"
#include "cuda/gemm/gemm.h"
#include "cuda/kernels/kernels.h"
#include "cuda/kernels/grouped_gemm.h"
#include "cuda/kernels/moe.h"
#include "cuda/runtime/nccl.h"

extern "C" { // the library's own (C) headers
#include "core/sysinfo.h"
#include "engine/backend.h"
#include "model/rope.h"
#include "model/runner.h"
}

#include <cuda_runtime.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SLOTS MT_MAX_WEIGHT_SLOTS

// The MLP runs in pieces of tokens whose (tokens, F) buffers stay within
// MLP_PIECE_BYTES (mt_mlp_piece_tokens): a 262144-token micro-batch of the
// 7B shape (d 4096, F 11008) would otherwise need six 5.4 GiB buffers, and T * F
// elements past 2^31. The head computes the logits in chunks of
// LOGITS_CHUNK_BYTES of fp32, and keeps the chunks' dlogits until
// DLOGITS_GROUP_BYTES of them can share one weight-gradient GEMM: per
// chunk, a vocabulary of 151936 and hidden 2048 (chunks of 441 tokens)
// read and wrote the head's 1.2 GB fp32 gradient for 0.27 TFLOP of
// arithmetic, and that GEMM ran at 300 TFLOP/s (docs/benchmarks.md).
#define MLP_PIECE_BYTES ((uint64_t)2 << 30)
#define LOGITS_CHUNK_BYTES ((uint64_t)256 << 20)
#define DLOGITS_GROUP_BYTES ((uint64_t)512 << 20)

struct cu_be {
    mt_be base;
    mt_be_request req;        // what the arena is laid out for (the model's tiles NULL in a backend that only counts)
    mt_be_shape shape;        // req.shape
    mt_runner run;            // the template's calls, dims and working buffers (in the arena)
    int L, K;
    mt_cu_dtype dt;
    size_t es; // bytes per activation element
    mt_gemm *gemm;
    mt_cu_gg *gg; // the grouped expert GEMMs (Hopper, bf16, models with experts); NULL: the loop serves them
    // The forward's routings on the host: each (unit, micro-batch)'s expert offsets (E + 1 int32), copied
    // behind the routing while the forward runs, so that the backward knows every expert's rows without a
    // wait (its recompute routes the same tokens the same way, which a check on the device confirms).
    int32_t *offs_h;          // pinned, (L + 2) x n_micro x (E + 1)
    const int32_t *offs_hd;  // the same memory as the device reads it
    unsigned char *offs_ok;   // (L + 2) x n_micro: the entry holds the forward's offsets for the micro-batch's tokens
    cudaEvent_t *offs_copied; // (L + 2) x n_micro: the entry's copy
    int unit;                 // the unit the kernels run for
    int in_backward;          // in a backward call, whose routing is the forward's again
    const int32_t *bwd_offs_h, *bwd_offs_d; // the backward's routing: the forward's on the host, the recompute's
    int bwd_E;
    cudaStream_t h2d, comp, d2h;
    cudaEvent_t slot_loaded[MAX_SLOTS], slot_free[MAX_SLOTS], grad_ready[2], grad_sent[2];
    int gbuf;       // the gradient buffer in use
    char *arena;    // one device allocation, carved below
    size_t arena_bytes;
    void *slots[MAX_SLOTS];
    float *slot_scale[MAX_SLOTS]; // lean mode: the scales of the weight codes loaded into each slot
    float *acc[2];  // fp32 weight-gradient accumulators (largest unit)
    float *tied_acc;// (V, C) when the head shares the embedding
    void *stage[2]; // bf16 gradients on their way to the host
    void *ck;       // (L+1, n_micro, T, C) checkpoints, or with ck_host L+1-ck_host rows (see above)
    int ck_host;    // checkpoints 0 .. ck_host-1 live in pinned host memory (ck_pinned); 0: none
    int rc;         // checkpoints the backward recomputes (mt_ck_recomputed), through the last row
    int keep_att;   // layers 1 .. keep_att keep their attention outputs for the backward
    int keep_h;     // layers 1 .. keep_h keep their residuals after attention
    int keep_qkv;   // layers 1 .. keep_qkv keep q, k and v (after RoPE)
    void *att_keep; // (keep_att, n_micro, T, Q)
    float *lse_keep;// (keep_att, n_micro, T, H)
    void *h_keep;   // (keep_h, n_micro, T, C)
    void *qkv_keep; // (keep_qkv, n_micro, T, Q + 2 KV): each layer and micro-batch's q, then k, then v
    void *ck_pinned;// (ck_host, n_micro, T, C) on the host
    cudaEvent_t ck_saved[2], ck_fetched[2], ck_row_done[2];
    float *dx;      // (n_micro, T, C) gradient of the residual stream
    int32_t *tokens, *targets; // (n_micro, T)
    int32_t *pos;   // (n_micro, T) each token's position in its document
    int32_t *doc_start; // (n_micro, T) each token's first key (mt_doc_layout)
    int32_t *win_start; // (n_micro, T) with a sliding window: each token's first key there (mt_window_starts)
    int *docs;      // (n_micro) on the host: the micro-batch packs documents
    int mb;         // the micro-batch the kernels run on
    int *rope_long; // (n_micro) on the host, after docs: the micro-batch rotates by the long table
    float *inv_freq[MT_ROPE_TABLES]; // (rotary dims / 2) each, NULL where mt_rope_has_table says none
    float rope_scale[MT_ROPE_TABLES];
    void *attn_ws;  // the attention's workspace: the kernels' backward, cuDNN's forward and backward
    size_t attn_ws_bytes;
    mt_cudnn_attn *cudnn; // cuDNN's fused attention (bf16, policy not KERNELS, loadable), or NULL
    size_t cudnn_version; // of b->cudnn; in a backend that only counts, of the cuDNN a probe found (0: none)
    int cudnn_fwd, cudnn_bwd; // the attention forward / backward runs on cuDNN (batches without documents)
    int cudnn_warned;     // a cuDNN call failed and was served by the kernels: said once
    char cudnn_why[200];  // why there is no cuDNN (b->cudnn_version 0)
    void *red_scratch; // reductions' scratch: the largest that the template declares (mt_runner_scratch_bytes)
    float *bias32;     // bf16: a bias in fp32 for a product with an fp32 output (the router's logits), E floats
    int bias32_n;
    size_t red_bytes;
    double *d_loss, *d_sumsq;
    int32_t *d_check;   // the device-side checks' flag (the routing's, mt_cu_moe_check_offs), read and zeroed by sync()
    int32_t *h_tokens;  // pinned staging for set_tokens
    char why[256];
    int failed;         // the first error, reported by sync()
    // the step's trace (timeline.h), armed from trace_start() to sync()
    mt_trace *tr;
    int armed;
    cudaEvent_t origin, head;
    cudaEvent_t *vev, *cev; // two per visit, two per copy: start and end
    int cap_vev, cap_cev;
    int slot_copy[MAX_SLOTS];            // the copy that last filled each slot
    int ck_save_copy[2], ck_fetch_copy[2]; // the copies behind ck_saved and ck_fetched
    int device;        // the CUDA device
    mt_nccl *nccl;     // in a group (join): NCCL, and this rank's communicator
    mt_nccl_comm comm;
};

#define CU(b, call)                                                                                                    \
    do {                                                                                                               \
        cudaError_t e_ = (call);                                                                                       \
        if (e_ != cudaSuccess) fail_cuda(b, #call, e_);                                                                \
    } while (0)
#define OK(b, call, what)                                                                                              \
    do {                                                                                                               \
        if ((call) != 0) fail_op(b, what);                                                                             \
    } while (0)

static void fail_cuda(cu_be *b, const char *what, cudaError_t e)
{
    if (!b->failed) snprintf(b->why, sizeof b->why, "%s: %s", what, cudaGetErrorString(e));
    b->failed = 1;
    cudaGetLastError();
}

static void fail_op(cu_be *b, const char *what)
{
    if (!b->failed) snprintf(b->why, sizeof b->why, "%s failed", what);
    b->failed = 1;
}

// A failure whose message is whole already (NCCL's).
static void fail_why(cu_be *b, const char *why)
{
    if (!b->failed) snprintf(b->why, sizeof b->why, "%s", why);
    b->failed = 1;
}

static const mt_unit_desc *unit_desc(cu_be *b, int u) { return &b->req.layout->units[u]; }
static void destroy_events(cudaEvent_t *ev, int n);

// ---- the trace -----------------------------------------------------------------------
//
// With a FULL trace every visit gets a timing event on the compute stream
// when it starts (after its waits) and when it ends, and every copy one on
// its stream before and after; the engine turns them into the timeline.

static double host_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int full_trace(const cu_be *b) { return b->armed && b->tr->level == MT_TRACE_FULL; }

// A traced copy about to be issued on stream s: its index, or -1.
static int copy_start(cu_be *b, cudaStream_t s, int to_host, int kind, uint64_t bytes)
{
    mt_trace *t = b->tr;
    if (!full_trace(b) || t->n_copies >= t->cap_copies || t->n_copies >= b->cap_cev) return -1;
    const int i = t->n_copies++;
    t->copy[i] = (mt_trace_copy){to_host, kind, bytes, host_now() - t->origin, 0.0, 0.0};
    CU(b, cudaEventRecord(b->cev[2 * i], s));
    return i;
}

static void copy_end(cu_be *b, int i, cudaStream_t s)
{
    if (i >= 0) CU(b, cudaEventRecord(b->cev[2 * i + 1], s));
}

// Grows a pool of event pairs to need pairs; on failure it is as before.
static int grow_events(cudaEvent_t **ev, int *cap, int need)
{
    if (need <= *cap) return 0;
    cudaEvent_t *p = (cudaEvent_t *)realloc(*ev, 2 * (size_t)need * sizeof *p);
    if (!p) return -1;
    *ev = p;
    for (int i = 2 * *cap; i < 2 * need; i++)
        if (cudaEventCreate(&p[i]) != cudaSuccess) {
            cudaGetLastError();
            destroy_events(p + 2 * *cap, i - 2 * *cap);
            return -1;
        }
    *cap = need;
    return 0;
}

static int cu_trace_start(mt_be *be, mt_trace *t)
{
    cu_be *b = (cu_be *)be;
    b->tr = t;
    b->armed = 0;
    if (!b->origin && (cudaEventCreate(&b->origin) != cudaSuccess || cudaEventCreate(&b->head) != cudaSuccess)) {
        cudaGetLastError();
        return -1;
    }
    if (t->level == MT_TRACE_FULL &&
        (grow_events(&b->vev, &b->cap_vev, t->cap_visits) || grow_events(&b->cev, &b->cap_cev, t->cap_copies)))
        return -1;
    for (int i = 0; i < MAX_SLOTS; i++) b->slot_copy[i] = -1;
    b->ck_save_copy[0] = b->ck_save_copy[1] = b->ck_fetch_copy[0] = b->ck_fetch_copy[1] = -1;
    if (cudaEventRecord(b->origin, b->comp) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    b->armed = 1;
    return 0;
}

static void cu_mark_head(mt_be *be)
{
    cu_be *b = (cu_be *)be;
    if (b->armed) CU(b, cudaEventRecord(b->head, b->comp));
}

// Seconds from the origin to ev, which has completed.
static int since_origin(cu_be *b, cudaEvent_t ev, double *s)
{
    float ms = 0;
    if (cudaEventElapsedTime(&ms, b->origin, ev) != cudaSuccess) {
        cudaGetLastError();
        return -1;
    }
    *s = ms / 1e3;
    return 0;
}

static int cu_trace_read(mt_be *be)
{
    cu_be *b = (cu_be *)be;
    mt_trace *t = b->tr;
    if (!t || !t->level || since_origin(b, b->head, &t->head_start)) return -1;
    if (t->level < MT_TRACE_FULL) return 0;
    for (int i = 0; i < t->n_visits; i++)
        if (since_origin(b, b->vev[2 * i], &t->visit[i].start) || since_origin(b, b->vev[2 * i + 1], &t->visit[i].end))
            return -1;
    for (int i = 0; i < t->n_copies; i++)
        if (since_origin(b, b->cev[2 * i], &t->copy[i].start) || since_origin(b, b->cev[2 * i + 1], &t->copy[i].end))
            return -1;
    return 0;
}

// ---- kernels ---------------------------------------------------------------------------
//
// The template's kernel table on the compute stream. A failure is kept (the
// first one) and reported by sync(): the template never checks.

static cu_be *B(void *kc) { return (cu_be *)kc; }
static int gemm_type(const cu_be *b, int f32) { return f32 || b->dt == MT_CU_F32 ? MT_GEMM_F32 : MT_GEMM_BF16; }

static void gemm(cu_be *b, const char *what, int ta, int tb, int M, int N, int K, const void *A, const void *Bm,
                 int c_f32, void *Cm, float beta, const void *bias)
{
    char why[160];
    if (mt_gemm_run(b->gemm, b->comp, ta, tb, M, N, K, gemm_type(b, 0), A, Bm, gemm_type(b, c_f32), Cm, beta, bias, why,
                    sizeof why) &&
        !b->failed) {
        snprintf(b->why, sizeof b->why, "%s GEMM %dx%dx%d: %s", what, M, N, K, why);
        b->failed = 1;
    }
}

static void k_rmsnorm(void *kc, void *y, float *rstd, const void *x, const void *w, int T, int C, float eps,
                      float woff)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_rmsnorm(b->comp, b->dt, y, rstd, b->dt, x, w, T, C, eps, woff, NULL), "rmsnorm");
}

// Whether the reductions' scratch holds need bytes (the template declared the call's shape); a
// failure of the step where it does not.
static int scratch_ok(cu_be *b, size_t need, const char *what, int rows, int cols)
{
    if (need <= b->red_bytes) return 1;
    if (!b->failed)
        snprintf(b->why, sizeof b->why, "%s of %d x %d: %zu bytes of scratch, more than the %zu that the layer "
                 "template's reductions declared", what, rows, cols, need, b->red_bytes);
    b->failed = 1;
    return 0;
}

static void k_rmsnorm_bwd(void *kc, float *dx, float *dw, const float *dy, const void *x, const void *w,
                          const float *rstd, int T, int C, float eps, float woff)
{
    cu_be *b = B(kc);
    if (!scratch_ok(b, mt_cu_rmsnorm_bwd_scratch_bytes(T, C, NULL), "rmsnorm backward", T, C)) return;
    OK(b, mt_cu_rmsnorm_bwd(b->comp, dx, dw, dy, b->dt, x, b->dt, w, rstd, T, C, eps, woff, b->red_scratch, NULL),
       "rmsnorm backward");
}

// y[M,N] = x[M,K] W[N,K]^T (+ bias) (+ y)
static void k_linear(void *kc, void *y, int out_f32, const void *x, const void *W, const void *bias, int M, int K, int N,
                     int accumulate)
{
    cu_be *b = B(kc);
    // cuBLASLt reads the bias in the output's type (CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE's default): an fp32
    // output of bf16 operands (a router's logits) takes its bf16 bias converted to fp32 first
    if (bias && out_f32 && b->dt != MT_CU_F32) {
        if (N > b->bias32_n) {
            if (!b->failed)
                snprintf(b->why, sizeof b->why, "a bias of %d for an fp32 output, room for %d", N, b->bias32_n);
            b->failed = 1;
            return;
        }
        OK(b, mt_cu_convert(b->comp, MT_CU_F32, b->bias32, b->dt, bias, (size_t)N), "bias to fp32");
        bias = b->bias32;
    }
    gemm(b, "forward", 0, 1, M, N, K, x, W, out_f32, y, accumulate ? 1.0f : 0.0f, bias);
}

// dx[M,K] = dy[M,N] W[N,K] (+ dx)
static void k_linear_dx(void *kc, void *dx, int out_f32, const void *dy, const void *W, int M, int K, int N,
                        int accumulate)
{
    gemm(B(kc), "input-gradient", 0, 0, M, K, N, dy, W, out_f32, dx, accumulate ? 1.0f : 0.0f, NULL);
}

// dW[N,K] += dy[M,N]^T x[M,K] in fp32, and db[N] += the column sums of dy
static void k_linear_dw(void *kc, float *dW, float *db, const void *dy, const void *x, int M, int K, int N)
{
    cu_be *b = B(kc);
    gemm(b, "weight-gradient", 1, 0, N, K, M, dy, x, 1, dW, 1.0f, NULL);
    if (db && scratch_ok(b, mt_cu_bias_grad_scratch_bytes(M, N), "bias gradient", M, N))
        OK(b, mt_cu_bias_grad(b->comp, db, b->dt, dy, M, N, b->red_scratch), "bias gradient");
}

static void k_rope(void *kc, void *x, int T, int nh, int D, int inverse, int local)
{
    cu_be *b = B(kc);
    // local: the sliding layers' table, there only where mt_rope_has_table (the template asks for it on no other model)
    const mt_rope_table t = local ? MT_ROPE_LOCAL : b->rope_long[b->mb] ? MT_ROPE_LONG : MT_ROPE_GLOBAL;
    if (!b->inv_freq[t]) {
        if (!b->failed) snprintf(b->why, sizeof b->why, "rope: local frequencies asked of a model without them");
        b->failed = 1;
        return;
    }
    const mt_model_config *c = b->req.cfg;
    OK(b, mt_cu_rope_at(b->comp, b->dt, x, b->pos + (size_t)b->mb * b->run.d.T, b->inv_freq[t], T, nh, D,
                        (int)mt_config_rotary_offset(c), (int)mt_config_rotary_dims(c), mt_config_rope_interleaved(c),
                        b->rope_scale[t], inverse),
       inverse ? "rope backward" : "rope");
}

static void k_copy_cols(void *kc, void *dst, int dld, int doff, const void *src, int sld, int soff, int rows, int w,
                        int rep)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_copy_cols(b->comp, b->dt, dst, dld, doff, src, sld, soff, rows, w, rep), "copy columns");
}

static void k_sum_cols(void *kc, void *dst, int dld, int doff, const void *src, int sld, int soff, int rows, int w,
                       int n)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_sum_cols(b->comp, b->dt, dst, dld, doff, src, sld, soff, rows, w, n), "sum columns");
}

static int attn_type(const cu_be *b) { return b->dt == MT_CU_BF16 ? MT_CUATTN_BF16 : MT_CUATTN_FP32; }

// The first key of each query of the current micro-batch: its window's in a sliding layer, its
// document's where it packs documents, else NULL (the sequence's first).
static const int32_t *key_starts(const cu_be *b, int window)
{
    const size_t off = (size_t)b->mb * b->run.d.T;
    return window ? b->win_start + off : b->docs[b->mb] ? b->doc_start + off : NULL;
}

// A cuDNN call that failed: the kernels serve this call; an execution
// failure also turns cuDNN off for that direction. Said once.
static void cudnn_failed(cu_be *b, int bwd, int rc, const char *why)
{
    if (rc == MT_CUDNN_EEXEC) *(bwd ? &b->cudnn_bwd : &b->cudnn_fwd) = 0;
    if (b->cudnn_warned) return;
    b->cudnn_warned = 1;
    mt_log(b->req.log, rc == MT_CUDNN_EEXEC ? MT_LOG_WARN : MT_LOG_INFO, "cuDNN attention %s: %s; the library's kernels run it%s",
           bwd ? "backward" : "forward", why, rc == MT_CUDNN_EEXEC ? " from now on" : "");
}

static void k_attention(void *kc, void *out, float *lse, const void *q, const void *k, const void *v, int n_seq,
                        int seq_len, int H, int Hkv, int D, float scale, int window, float softcap)
{
    cu_be *b = B(kc);
    const int32_t *docs = key_starts(b, window);
    if (b->cudnn_fwd && !docs && softcap == 0.0f) { // cuDNN has no soft-cap (attn_candidates keeps it off)
        char why[256];
        const int rc = mt_cudnn_attn_forward(b->cudnn, b->comp, out, lse, q, k, v, n_seq, seq_len, H, Hkv, D, scale,
                                             b->attn_ws, b->attn_ws_bytes, why, sizeof why);
        if (rc == 0) return;
        cudnn_failed(b, 0, rc, why);
    }
    const int rc = mt_cuattn_forward_softcap(b->comp, attn_type(b), out, lse, q, k, v, docs, n_seq, seq_len, H, Hkv,
                                             D, scale, softcap);
    if (rc && !b->failed) snprintf(b->why, sizeof b->why, "attention: %s", mt_cuattn_strerror(rc)), b->failed = 1;
}

static void k_attention_bwd(void *kc, void *dq, void *dk, void *dv, const void *dout, const void *out,
                            const float *lse, const void *q, const void *k, const void *v, int n_seq, int seq_len,
                            int H, int Hkv, int D, float scale, int window, float softcap)
{
    cu_be *b = B(kc);
    const int32_t *docs = key_starts(b, window);
    if (b->cudnn_bwd && !docs && softcap == 0.0f) {
        char why[256];
        const int rc = mt_cudnn_attn_backward(b->cudnn, b->comp, dq, dk, dv, dout, out, lse, q, k, v, n_seq, seq_len,
                                              H, Hkv, D, scale, b->attn_ws, b->attn_ws_bytes, why, sizeof why);
        if (rc == 0) return;
        cudnn_failed(b, 1, rc, why);
    }
    const int rc = mt_cuattn_backward_softcap(b->comp, attn_type(b), dq, dk, dv, dout, out, lse, q, k, v, docs, n_seq,
                                              seq_len, H, Hkv, D, scale, softcap, b->attn_ws, b->attn_ws_bytes);
    if (rc && !b->failed)
        snprintf(b->why, sizeof b->why, "attention backward: %s", mt_cuattn_strerror(rc)), b->failed = 1;
}

static void k_attn_sink(void *kc, void *out, float *lse, const void *sinks, int n_seq, int seq_len, int H, int D)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_attn_sink(b->comp, b->dt, out, lse, sinks, n_seq, seq_len, H, D), "attention sinks");
}

static void k_attn_sink_bwd(void *kc, float *dsink, const void *dout, const void *out, const float *lse,
                            const void *sinks, int n_seq, int seq_len, int H, int D)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_attn_sink_bwd(b->comp, b->dt, dsink, dout, out, lse, sinks, n_seq, seq_len, H, D),
       "attention sinks backward");
}

static void k_attn_temperature(void *kc, void *x, int T, int seq_len, int n, float floor_scale, float scale)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_attn_temperature(b->comp, b->dt, x, T, seq_len, n, floor_scale, scale), "attention temperature");
}

static void k_glu(void *kc, void *out, const void *gate, const void *up, size_t n, int act)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_glu(b->comp, b->dt, act, out, gate, up, n), "gated activation");
}

static void k_glu_bwd(void *kc, void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n,
                      int act)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_glu_bwd(b->comp, b->dt, act, dgate, dup, dout, gate, up, n), "gated activation backward");
}

static void k_copy(void *kc, void *dst, const void *src, size_t n)
{
    cu_be *b = B(kc);
    CU(b, cudaMemcpyAsync(dst, src, n * b->es, cudaMemcpyDeviceToDevice, b->comp));
}

static void k_last_rows(void *kc, void *rows, const void *src, int n, int stride, int C)
{
    cu_be *b = B(kc);
    const size_t row = (size_t)C * b->es;
    CU(b, cudaMemcpy2DAsync(rows, row, (const char *)src + (size_t)(stride - 1) * row, (size_t)stride * row, row,
                            (size_t)n, cudaMemcpyDeviceToDevice, b->comp));
}

static const void *k_as_act(void *kc, void *scratch, const float *src, size_t n)
{
    cu_be *b = B(kc);
    if (b->dt == MT_CU_F32) return src;
    OK(b, mt_cu_convert(b->comp, b->dt, scratch, MT_CU_F32, src, n), "convert");
    return scratch;
}

static const float *k_as_f32(void *kc, float *scratch, const void *src, size_t n)
{
    cu_be *b = B(kc);
    if (b->dt == MT_CU_F32) return (const float *)src;
    OK(b, mt_cu_convert(b->comp, MT_CU_F32, scratch, b->dt, src, n), "convert");
    return scratch;
}

static void k_zero(void *kc, void *p, size_t bytes)
{
    cu_be *b = B(kc);
    CU(b, cudaMemsetAsync(p, 0, bytes, b->comp));
}

static void k_embedding(void *kc, void *out, const int32_t *tokens, const void *wte, int T, int C, int V, float scale)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_embedding(b->comp, b->dt, out, tokens, b->dt, wte, T, C, V, scale), "embedding");
}

static void k_embedding_bwd(void *kc, float *dwte, const int32_t *tokens, const float *dout, int T, int C, int V,
                            float scale, int pad)
{
    cu_be *b = B(kc);
    if (!scratch_ok(b, mt_cu_embedding_bwd_scratch_bytes(T), "embedding backward", T, C)) return;
    OK(b, mt_cu_embedding_bwd(b->comp, dwte, tokens, dout, T, C, V, scale, pad, b->red_scratch), "embedding backward");
}

static void k_cross_entropy(void *kc, void *dlogits, float *logits, const int32_t *targets, int n, int V, float dscale,
                            float softcap)
{
    cu_be *b = B(kc);
    if (!scratch_ok(b, mt_cu_cross_entropy_scratch_bytes(n), "cross-entropy", n, V)) return;
    OK(b, mt_cu_cross_entropy(b->comp, logits, targets, n, V, dscale, softcap, MT_IGNORE_INDEX, b->dt, dlogits,
                              b->d_loss, NULL, b->red_scratch, NULL),
       "cross-entropy");
}

static void k_softcap(void *kc, float *x, size_t n, float cap)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_softcap(b->comp, x, n, cap), "logit soft-cap");
}

static void k_add(void *kc, void *dst, const void *a, const void *c, size_t n)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_add(b->comp, b->dt, dst, b->dt, a, b->dt, c, n), "add");
}

static void k_to_host(void *kc, float *dst, const float *src, size_t n)
{
    cu_be *b = B(kc);
    CU(b, cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, b->comp));
}

// ---- mixture of experts (cuda/kernels/moe.cu) ----

// The routing, its offsets left on the device for the grouped GEMMs: no wait. A non-finite router
// logit leaves a token without experts, so fewer than T*k rows placed; the check runs on the device
// behind the routing, into d_check, which sync() reads with the loss and reports (the grouped GEMMs clamp
// every expert's rows to [0, R] meanwhile).
static void k_moe_route(void *kc, float *probs, float *topw, int32_t *topi, int32_t *rows, int32_t *slot_row,
                        int32_t *offs_buf, float *stats, const float *logits, int T, int E, int k, const mt_route *rt)
{
    cu_be *b = B(kc);
    // the correction bias, a weight, is in the activations' type
    OK(b, mt_cu_moe_route(b->comp, probs, topw, topi, rows, slot_row, offs_buf, stats, logits, T, E, k, rt, b->dt),
       "expert routing");
    OK(b, mt_cu_moe_check_offs(b->comp, offs_buf, E, T * k, b->d_check), "expert routing check");
    if (!b->offs_h || E != b->run.d.E || b->unit < 0 || b->unit > b->L + 1 || b->failed) return;
    const size_t at = (size_t)b->unit * b->shape.n_micro + b->mb;
    const size_t n = (size_t)E + 1;
    b->bwd_offs_h = b->bwd_offs_d = NULL;
    if (!b->in_backward) { // the forward's: to the host behind the routing, read by this unit's backward
        CU(b, cudaMemcpyAsync(b->offs_h + at * n, offs_buf, n * 4, cudaMemcpyDeviceToHost, b->comp));
        CU(b, cudaEventRecord(b->offs_copied[at], b->comp));
        b->offs_ok[at] = 1;
    } else if (b->offs_ok[at]) {
        // recorded a unit visit or more ago: done, unless the host runs that far ahead (it then waits here,
        // the GPU still busy with what was queued since)
        CU(b, cudaEventSynchronize(b->offs_copied[at]));
        OK(b, mt_cu_moe_check_same(b->comp, offs_buf, b->offs_hd + at * n, E, b->d_check), "expert routing check");
        if (b->failed) return;
        b->bwd_offs_h = b->offs_h + at * n, b->bwd_offs_d = offs_buf, b->bwd_E = E;
    }
}

static void k_moe_route_bwd(void *kc, float *dlogits, const float *dw, const float *probs, const float *topw,
                            const int32_t *topi, const float *stats, int L, float aux, int T, int E, int k,
                            const mt_route *rt)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_moe_route_bwd(b->comp, dlogits, dw, probs, topw, topi, stats, L, aux, T, E, k, rt),
       "expert routing backward");
}

static void k_moe_gather(void *kc, void *dst, const void *src, const int32_t *rows, int R, int k, int C)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_moe_gather(b->comp, b->dt, dst, src, rows, R, k, C), "expert gather");
}

static void k_moe_combine(void *kc, void *out, int out_f32, const void *src, int src_f32, const float *w,
                          const int32_t *slot_row, int T, int k, int C)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_moe_combine(b->comp, out_f32 ? MT_CU_F32 : b->dt, out, src_f32 ? MT_CU_F32 : b->dt, src, w, slot_row,
                            T, k, C),
       "expert combine");
}

static void k_moe_dot_scale(void *kc, float *dw, void *x, void *y, const float *w, const int32_t *rows, int R, int n)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_moe_dot_scale(b->comp, b->dt, dw, x, y, w, rows, R, n), "expert weight gradient");
}

static void k_moe_shared_gate(void *kc, void *out, const void *src, const float *z, int T, int C)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_moe_shared_gate(b->comp, b->dt, out, src, z, T, C), "shared expert gate");
}

static void k_moe_shared_gate_bwd(void *kc, float *dz, void *x, void *y, const float *z, int T, int n)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_moe_shared_gate_bwd(b->comp, b->dt, dz, x, y, z, T, n), "shared expert gate backward");
}

static void k_moe_aux_loss(void *kc, const float *stats, int L, int E, double scale)
{
    cu_be *b = B(kc);
    OK(b, mt_cu_moe_aux_loss(b->comp, b->d_loss, stats, L, E, scale), "load-balancing loss");
}

// The grouped GEMMs' fallback: the offsets read back to the host (a wait on the compute stream, the one
// thing a device grouped GEMM spares), each expert's rows clamped to [0, R], then each expert with rows
// through each(e, first row, rows), the per-expert path of k_linear, k_linear_dx or k_linear_dw. After a
// failure nothing runs: the step is lost anyway, and a failed stream's offsets cannot be trusted.
template <typename F> static void grouped_by_loop(cu_be *b, const int32_t *offs, int E, int R, F &&each)
{
    if (b->failed) return;
    if (E <= 0 || E > MT_MAX_EXPERTS) {
        fail_why(b, "expert GEMM: more experts than MT_MAX_EXPERTS");
        return;
    }
    int32_t buf[MT_MAX_EXPERTS + 1];
    const int32_t *h = buf;
    if (b->bwd_offs_h && offs == b->bwd_offs_d && E == b->bwd_E) {
        h = b->bwd_offs_h; // the backward: the forward's offsets, already on the host
    } else {
        CU(b, cudaMemcpyAsync(buf, offs, (size_t)(E + 1) * sizeof *buf, cudaMemcpyDeviceToHost, b->comp));
        CU(b, cudaStreamSynchronize(b->comp));
    }
    if (b->failed) return;
    for (int e = 0; e < E; e++) {
        const int lo = MT_MIN(MT_MAX(h[e], 0), R), hi = MT_MIN(MT_MAX(h[e + 1], lo), R);
        if (hi > lo) each(e, lo, hi - lo);
    }
}

static int expert_path(const cu_be *b, int dw, const int32_t *offs, int E, int R, int K, int N);
enum { EP_KERNEL, EP_LOOP };

// y[r, :N] = x[r, :K] W_e^T (+ bias_e) (+ y) over each expert's rows: a few outputs a row (a bias's
// products, N = 1) on the kernel that reads offs on the device; the others on the grouped kernel or the
// loop as expert_path says (the recompute of the backward has the forward's offsets on the host, and
// runs long row blocks on the loop as the input gradient does).
static void k_moe_linear(void *kc, void *y, int out_f32, const void *x, const void *W, const void *bias,
                         const int32_t *offs, int E, int R, int K, int N, int accumulate)
{
    cu_be *b = B(kc);
    if (N <= MT_CU_MOE_SMALL_N) {
        OK(b, mt_cu_moe_linear_small(b->comp, b->dt, out_f32 ? MT_CU_F32 : b->dt, y, x, W, bias, offs, E, R, K, N,
                                     accumulate),
           "expert GEMM");
        return;
    }
    if (expert_path(b, 0, offs, E, R, K, N) == EP_KERNEL) {
        OK(b, mt_cu_gg_linear(b->gg, b->comp, y, out_f32, x, W, bias, offs, E, R, K, N, accumulate), "expert GEMM");
        return;
    }
    const size_t es = b->es, ys = out_f32 ? 4 : b->es;
    grouped_by_loop(b, offs, E, R, [&](int e, int r0, int n) {
        k_linear(kc, (char *)y + (size_t)r0 * N * ys, out_f32, (const char *)x + (size_t)r0 * K * es,
                 (const char *)W + (size_t)e * N * K * es, bias ? (const char *)bias + (size_t)e * N * es : NULL, n,
                 K, N, accumulate);
    });
}

// Which way an expert product of the backward (its recompute's included) runs. With the forward's
// offsets on the host (the backward's products after its recompute routed), either can: the grouped kernel (offsets on the
// device) or the loop of one cuBLASLt GEMM per expert (sizes from the host offsets, no wait). The rule
// comes from bench/cuda_grouped_gemm on an H100 (12-06, docs/moe.md): the weight gradient is faster
// through the loop at every shape measured (263-623 TFLOP/s against the kernel's 151-387); the input
// gradient through the kernel where the experts' row blocks are short (128 experts of ~1024 rows; ~1536
// rows: a tie), through the loop where they are long (2048 and 4096 rows an expert: 554-714 against
// 412-492); the recompute's forward products the same way (long blocks: the loop's 630-728 against the
// kernel's 402-531). Without host offsets: the kernel, else the loop (which then reads
// them back). cuBLAS's grouped GEMM was measured too and is not used: slower than both where it runs
// (240-290), and it refuses fp32 outputs with bf16 operands.
static int expert_path(const cu_be *b, int dw, const int32_t *offs, int E, int R, int K, int N)
{
    const int kernel = b->gg && b->dt == MT_CU_BF16 && mt_cu_gg_fits(K, N);
    const int host = b->bwd_offs_h && offs == b->bwd_offs_d && E == b->bwd_E;
    if (!host) return kernel ? EP_KERNEL : EP_LOOP;
    switch ((mt_expert_gemm)b->req.expert_gemm) {
    case MT_EXPERT_GEMM_KERNEL: return kernel ? EP_KERNEL : EP_LOOP;
    case MT_EXPERT_GEMM_LOOP: return EP_LOOP;
    case MT_EXPERT_GEMM_AUTO: break;
    }
    if (dw) return EP_LOOP;
    const int long_blocks = R >= 2048 * E; // rows an expert on average
    return kernel && !long_blocks ? EP_KERNEL : EP_LOOP;
}

// dx[r, :K] = dy[r, :N] W_e (+ dx) over each expert's rows
static void k_moe_linear_dx(void *kc, void *dx, int out_f32, const void *dy, const void *W, const int32_t *offs,
                            int E, int R, int K, int N, int accumulate)
{
    cu_be *b = B(kc);
    if (expert_path(b, 0, offs, E, R, K, N) == EP_KERNEL) {
        OK(b, mt_cu_gg_linear_dx(b->gg, b->comp, dx, out_f32, dy, W, offs, E, R, K, N, accumulate),
           "expert input-gradient GEMM");
        return;
    }
    const size_t es = b->es, xs = out_f32 ? 4 : b->es;
    grouped_by_loop(b, offs, E, R, [&](int e, int r0, int n) {
        k_linear_dx(kc, (char *)dx + (size_t)r0 * K * xs, out_f32, (const char *)dy + (size_t)r0 * N * es,
                    (const char *)W + (size_t)e * N * K * es, n, K, N, accumulate);
    });
}

// dW_e += dy_e^T x_e, db_e += the column sums of dy_e; a few outputs a row on the kernel
static void k_moe_linear_dw(void *kc, float *dW, float *db, const void *dy, const void *x, const int32_t *offs, int E,
                            int R, int K, int N)
{
    cu_be *b = B(kc);
    if (N <= MT_CU_MOE_SMALL_N) {
        OK(b, mt_cu_moe_linear_dw_small(b->comp, b->dt, dW, db, dy, x, offs, E, R, K, N),
           "expert weight-gradient GEMM");
        return;
    }
    if (expert_path(b, 1, offs, E, R, K, N) == EP_KERNEL) {
        OK(b, mt_cu_gg_linear_dw(b->gg, b->comp, dW, db, dy, x, offs, E, R, K, N), "expert weight-gradient GEMM");
        return;
    }
    const size_t es = b->es;
    grouped_by_loop(b, offs, E, R, [&](int e, int r0, int n) {
        k_linear_dw(kc, dW + (size_t)e * N * K, db ? db + (size_t)e * N : NULL, (const char *)dy + (size_t)r0 * N * es,
                    (const char *)x + (size_t)r0 * K * es, n, K, N);
    });
}

// The scratch of a reduction the template declares, as the kernels above ask it.
static size_t cu_scratch_bytes(const mt_reduction *r)
{
    const int rows = (int)r->rows, cols = (int)r->cols;
    switch (r->op) {
    case MT_RED_RMSNORM_BWD: return mt_cu_rmsnorm_bwd_scratch_bytes(rows, cols, NULL);
    case MT_RED_EMBEDDING_BWD: return mt_cu_embedding_bwd_scratch_bytes(rows);
    case MT_RED_BIAS_GRAD: return mt_cu_bias_grad_scratch_bytes(rows, cols);
    case MT_RED_CROSS_ENTROPY: return mt_cu_cross_entropy_scratch_bytes(rows);
    }
    return 0;
}

static mt_kernels cuda_kernels(void)
{
    mt_kernels k;
    memset(&k, 0, sizeof k);
    k.rmsnorm = k_rmsnorm;
    k.rmsnorm_bwd = k_rmsnorm_bwd;
    k.linear = k_linear;
    k.linear_dx = k_linear_dx;
    k.linear_dw = k_linear_dw;
    k.rope = k_rope;
    k.copy_cols = k_copy_cols;
    k.sum_cols = k_sum_cols;
    k.attention = k_attention;
    k.attention_bwd = k_attention_bwd;
    k.attn_sink = k_attn_sink;
    k.attn_sink_bwd = k_attn_sink_bwd;
    k.attn_temperature = k_attn_temperature;
    k.glu = k_glu;
    k.glu_bwd = k_glu_bwd;
    k.copy = k_copy;
    k.last_rows = k_last_rows;
    k.as_act = k_as_act;
    k.as_f32 = k_as_f32;
    k.zero = k_zero;
    k.embedding = k_embedding;
    k.embedding_bwd = k_embedding_bwd;
    k.cross_entropy = k_cross_entropy;
    k.softcap = k_softcap;
    k.add = k_add;
    k.to_host = k_to_host;
    k.moe_route = k_moe_route;
    k.moe_route_bwd = k_moe_route_bwd;
    k.moe_gather = k_moe_gather;
    k.moe_combine = k_moe_combine;
    k.moe_dot_scale = k_moe_dot_scale;
    k.moe_shared_gate = k_moe_shared_gate;
    k.moe_shared_gate_bwd = k_moe_shared_gate_bwd;
    k.moe_aux_loss = k_moe_aux_loss;
    k.moe_linear = k_moe_linear;
    k.moe_linear_dx = k_moe_linear_dx;
    k.moe_linear_dw = k_moe_linear_dw;
    k.scratch_bytes = cu_scratch_bytes;
    return k;
}

static const mt_kernels CUDA_KERNELS = cuda_kernels();

// ---- checkpoints ---------------------------------------------------------------------

static size_t ck_row_bytes(const cu_be *b) { return (size_t)b->shape.n_micro * b->run.d.T * b->run.d.C * b->es; }

// The device rows of checkpoints: L+1, two in evaluation (which keeps
// nothing), L+1-ck_host with host checkpoints; rc fewer and a spare with
// recomputed ones.
static int ck_rows(const cu_be *b)
{
    return !b->shape.want_grad ? 2 : mt_ck_rows(b->L, b->rc) - b->ck_host;
}

// Checkpoint idx of micro-batch mb on the device: its own row, the rotating
// row idx % 2 (evaluation; host checkpoints and the two after them), or the
// spare (the last row) where it is recomputed.
static void *ck_at(cu_be *b, int idx, int mb)
{
    const int rotating = !b->shape.want_grad || (b->ck_host && idx <= b->ck_host + 1);
    // own rows (and the spare) follow the two rotating ones, which stand for the host checkpoints
    const size_t row = rotating ? (size_t)(idx % 2) : (size_t)(mt_ck_row(b->L, b->rc, idx) - b->ck_host);
    return (char *)b->ck + row * ck_row_bytes(b) + (size_t)mb * (size_t)b->run.d.T * (size_t)b->run.d.C * b->es;
}

static void *ck_host_at(cu_be *b, int idx) { return (char *)b->ck_pinned + (size_t)idx * ck_row_bytes(b); }

// Where layer unit's activations for micro-batch mb live: kept for the
// backward, or the template's work buffers.
static mt_layer_acts acts_of(cu_be *b, int unit, int mb)
{
    const int l = unit - 1;
    const size_t i = (size_t)l * b->shape.n_micro + mb, T = (size_t)b->run.d.T;
    mt_layer_acts a = mt_runner_acts(&b->run, unit);
    a.att_kept = l < b->keep_att, a.h_kept = l < b->keep_h, a.qkv_kept = l < b->keep_qkv;
    if (a.att_kept) {
        a.att = (char *)b->att_keep + i * T * b->run.d.Q * b->es;
        a.lse = b->lse_keep + i * T * b->run.d.H;
    }
    if (a.h_kept) a.h = (char *)b->h_keep + i * T * b->run.d.C * b->es;
    if (a.qkv_kept) {
        a.q = (char *)b->qkv_keep + i * T * (size_t)(b->run.d.Q + 2 * b->run.d.KV) * b->es;
        a.k = (char *)a.q + T * b->run.d.Q * b->es;
        a.v = (char *)a.k + T * b->run.d.KV * b->es;
    }
    return a;
}

// ---- memory --------------------------------------------------------------------------------

// Carves aligned pieces out of one allocation: a first pass only measures.
typedef struct carver {
    char *base;
    size_t off;
} carver;

static void *carve(carver *c, size_t bytes)
{
    size_t at = (c->off + 255) & ~(size_t)255;
    c->off = at + (bytes ? bytes : 1);
    return c->base ? c->base + at : NULL;
}

// The sizes of req's micro-batch: the template's through the runner, and this backend's choices.
static mt_status set_dims(cu_be *b, mt_err err)
{
    const mt_model_config *c = b->req.cfg;
    const mt_be_shape *s = &b->req.shape;
    b->shape = *s;
    b->L = (int)c->num_hidden_layers;
    b->K = (int)b->req.pol->weight_slots;
    b->dt = c->precision == MT_PRECISION_FP32 ? MT_CU_F32 : MT_CU_BF16;
    b->es = b->dt == MT_CU_BF16 ? 2 : 4;
    mt_status st = mt_runner_init(&b->run, c, b->req.layout, &CUDA_KERNELS, b, s->n_seq, s->seq_len, s->n_micro,
                                  "CUDA", err);
    if (st) return st;
    mt_dims *d = &b->run.d;
    d->es = b->es;
    d->FT = b->req.mlp_piece_tokens ? MT_MIN(d->T, (int)b->req.mlp_piece_tokens)
                                    : (int)mt_mlp_piece_tokens((uint64_t)d->T, (uint64_t)MT_MAX(d->F, d->FS), b->es,
                                                              MLP_PIECE_BYTES);
    d->chunk = b->req.head_chunk_tokens
                   ? MT_MIN(d->T, (int)b->req.head_chunk_tokens)
                   : (int)MT_MAX((size_t)1, MT_MIN((size_t)d->T, LOGITS_CHUNK_BYTES / ((size_t)d->V * 4)));
    d->dw_rows = mt_head_dw_rows(d->T, d->chunk, b->req.head_dw_tokens, (uint64_t)d->V, b->es, DLOGITS_GROUP_BYTES);
    return MT_OK;
}

// The attention's workspace: the kernels' backward, and cuDNN's forward and
// backward where they run (a bound, reserved before cuDNN can be asked).
static size_t attn_workspace_bytes(const cu_be *b)
{
    const mt_be_shape *s = &b->shape;
    const mt_dims *d = &b->run.d;
    size_t n = s->want_grad ? mt_cuattn_workspace_bytes(s->n_seq, s->seq_len, d->H, d->Hkv, d->D) : 0;
    if (b->cudnn_fwd) n = MT_MAX(n, mt_cudnn_attn_forward_workspace_bound(s->n_seq, s->seq_len, d->H, d->Hkv, d->D));
    if (b->cudnn_bwd)
        n = MT_MAX(n, mt_cudnn_attn_backward_workspace_bound(s->n_seq, s->seq_len, d->H, d->Hkv, d->D,
                                                             !(b->req.pol->attention_flags & MT_ATTENTION_NONDETERMINISTIC)));
    return n;
}

static void layout_buffers(cu_be *b, carver *c)
{
    const mt_layout *lo = b->req.layout;
    const mt_be_shape *s = &b->shape;
    const mt_dims *d = &b->run.d;
    const size_t T = (size_t)d->T, C = (size_t)d->C, Q = (size_t)d->Q;
    const size_t es = b->es, M = (size_t)s->n_micro;
    const int tied = b->req.cfg->tie_word_embeddings != 0;
    size_t slot_elems = lo->largest_unit_padded;
    if (tied) slot_elems = MT_MAX(slot_elems, unit_desc(b, b->L + 1)->padded + unit_desc(b, 0)->padded);
    const int lean = b->req.cfg->precision == MT_PRECISION_LEAN;
    // in a group, room for all G slices of a load in slices (mt_fetch_span), whichever way it fetches
    const size_t slot_bytes = mt_fetch_span(slot_elems * es, b->req.n_ranks);
    for (int i = 0; i < b->K; i++) {
        b->slots[i] = carve(c, slot_bytes);
        b->slot_scale[i] = lean ? (float *)carve(c, slot_elems / MT_LEAN_BLOCK_ELEMS * 4) : NULL;
    }
    b->ck = carve(c, (size_t)ck_rows(b) * M * T * C * es);
    const size_t AM = (size_t)b->keep_att * M, HM = (size_t)b->keep_h * M, QM = (size_t)b->keep_qkv * M;
    b->att_keep = AM ? carve(c, AM * T * Q * es) : NULL;
    b->lse_keep = AM ? (float *)carve(c, AM * T * (size_t)d->H * 4) : NULL;
    b->h_keep = HM ? carve(c, HM * T * C * es) : NULL;
    b->qkv_keep = QM ? carve(c, QM * T * (Q + 2 * (size_t)d->KV) * es) : NULL;
    b->tokens = (int32_t *)carve(c, M * T * 4);
    b->targets = (int32_t *)carve(c, M * T * 4);
    b->pos = (int32_t *)carve(c, M * T * 4);
    b->doc_start = (int32_t *)carve(c, M * T * 4);
    b->win_start = d->window ? (int32_t *)carve(c, M * T * 4) : NULL;
    for (int t = 0; t < MT_ROPE_TABLES; t++)
        b->inv_freq[t] = mt_rope_has_table(b->req.cfg, (mt_rope_table)t) ? (float *)carve(c, (size_t)d->D / 2 * 4) : NULL;
    // the template's working buffers and state
    mt_runner_buf rb[MT_RUNNER_MAX_BUFS];
    const int n = mt_runner_buffers(&b->run, s->want_grad, rb);
    for (int i = 0; i < n; i++) *rb[i].where = carve(c, (size_t)rb[i].elems * (rb[i].f32 ? 4 : es));
    b->bias32_n = es == 4 ? 0 : MT_MAX(d->E, 0); // the router's bias, the one fp32-output product with a bias
    b->bias32 = b->bias32_n ? (float *)carve(c, (size_t)b->bias32_n * 4) : NULL;
    b->d_loss = (double *)carve(c, 8);
    b->d_sumsq = (double *)carve(c, 8);
    b->d_check = (int32_t *)carve(c, MT_CU_MOE_CHECK_INTS * 4);
    // the reductions' scratch: send_grads' sum of squares, and what the template declares
    b->red_bytes = MT_MAX(mt_cu_sumsq_scratch_bytes(), mt_runner_scratch_bytes(&b->run, s->want_grad));
    if (s->want_grad) {
        // in a group, room for every rank's slice (engine/backend.h)
        const size_t acc_elems = mt_grad_acc_elems(lo->largest_unit_padded, b->req.n_ranks);
        b->acc[0] = (float *)carve(c, acc_elems * 4);
        b->acc[1] = (float *)carve(c, acc_elems * 4);
        b->tied_acc = tied ? (float *)carve(c, mt_grad_acc_elems(unit_desc(b, 0)->padded, b->req.n_ranks) * 4) : NULL;
        if (b->dt == MT_CU_BF16) {
            b->stage[0] = carve(c, lo->largest_unit_padded * 2);
            b->stage[1] = carve(c, lo->largest_unit_padded * 2);
        }
        b->dx = (float *)carve(c, M * T * C * 4);
    }
    b->red_scratch = carve(c, b->red_bytes);
    b->attn_ws_bytes = attn_workspace_bytes(b);
    b->attn_ws = b->attn_ws_bytes ? carve(c, b->attn_ws_bytes) : NULL;
}

// The arena's bytes with att layers keeping their attention outputs, h
// their residuals and qkv their q, k, v (leaves b->keep_* so).
static size_t arena_bytes(cu_be *b, int att, int h, int qkv)
{
    carver t = {NULL, 0};
    b->keep_att = att, b->keep_h = h, b->keep_qkv = qkv;
    layout_buffers(b, &t);
    return t.off + 256;
}

// The arena's bytes with the tiers before `tier` kept by every layer and n
// layers keeping tier's activations (0 attention outputs, 1 residuals, 2 q, k, v).
static size_t arena_tier(cu_be *b, int tier, int n)
{
    const int L = b->L;
    return arena_bytes(b, tier == 0 ? n : L, tier == 1 ? n : tier > 1 ? L : 0, tier == 2 ? n : 0);
}

// The most layers, up to cap, that keep tier's activations (with every layer
// keeping the tiers before it) within room bytes.
static int most_kept(cu_be *b, size_t room, int cap, int tier)
{
    const size_t base = arena_tier(b, tier, 0);
    const size_t one = arena_tier(b, tier, 1) - base;
    if (room <= base || one == 0) return 0;
    int n = (int)MT_MIN((size_t)cap, (room - base) / one); // alignment can add a few bytes: check
    while (n > 0 && arena_tier(b, tier, n) > room) n--;
    return n;
}

// Whether cuDNN may run the attention forward (*cf) and backward (*cb) of
// b->req, by the policy, the precision, the cuDNN found and its rules; why
// not in no.
static void attn_candidates(cu_be *b, int *cf, int *cb, char *no, size_t len)
{
    const mt_be_shape *s = &b->shape;
    const mt_dims *d = &b->run.d;
    *cf = *cb = 0;
    snprintf(no, len, "the policy asks for the library's kernels");
    if (b->req.pol->attention == MT_ATTENTION_KERNELS) return;
    snprintf(no, len, "it has no fp32 attention (this model trains in fp32)");
    if (b->dt != MT_CU_BF16) return;
    snprintf(no, len, "it has no soft-capped attention (this model caps its attention scores)");
    if (d->attn_softcap != 0.0f) return; // every layer of such a model caps: all on the kernels
    snprintf(no, len, "%s", b->cudnn_why[0] ? b->cudnn_why : "cuDNN 9 cannot be loaded");
    if (!b->cudnn_version) return;
    char why[200];
    if (mt_cudnn_attn_shape_ok(b->cudnn_version, 0, s->seq_len, d->H, d->Hkv, d->D, why, sizeof why)) {
        snprintf(no, len, "%s", why);
        return;
    }
    *cf = 1;
    if (s->want_grad && mt_cudnn_attn_shape_ok(b->cudnn_version, 1, s->seq_len, d->H, d->Hkv, d->D, why, sizeof why)) {
        snprintf(no, len, "%s", why);
        return;
    }
    *cb = s->want_grad;
    no[0] = '\0';
}

// The most checkpoints the backward may recompute with h of them on the
// host: all above the two rotating rows, none of checkpoint 0.
static int rc_max(int L, int h) { return h ? MT_MAX(0, (L - h - 1) / 2) : L / 2; }

// The arrays of each micro-batch's staging: tokens, targets, positions, document starts and,
// with a sliding window, its starts.
static int staged_arrays(const cu_be *b) { return b->run.d.window ? 5 : 4; }

// The pinned bytes of h host checkpoints and of the tokens' staging.
static uint64_t pinned_of(const cu_be *b, int h)
{
    return (uint64_t)b->shape.n_micro * b->run.d.T * staged_arrays(b) * sizeof(int32_t) + (uint64_t)h * ck_row_bytes(b);
}

// What b->req needs, with free_b bytes free on the device: decides where the
// checkpoints go, how many the backward recomputes and how many layers keep
// activations (b->ck_host, b->rc, b->keep_*), fills *n, and says whether it
// fits.
static mt_status size_up(cu_be *b, size_t free_b, mt_be_needs *n, mt_err err)
{
    const mt_offload_policy *pol = b->req.pol;
    const mt_be_shape *s = &b->shape;
    memset(n, 0, sizeof *n);
    mt_status st = set_dims(b, err);
    if (st) return st;
    if (!mt_cuattn_head_dim_ok(b->run.d.D))
        return mt_fail(err, MT_ERR_UNSUPPORTED,
                       "the CUDA backend's attention supports head_dim of a multiple of 8 up to 256, not %d", b->run.d.D);
    // the budget covers the GEMM workspace (allocated with the backend) and the arena
    const size_t held = mt_gemm_device_bytes();
    const uint64_t budget =
        pol->gpu_budget_bytes ? (pol->gpu_budget_bytes > held ? pol->gpu_budget_bytes - held : 0) : free_b;
    // The attention: cuDNN both ways, else cuDNN's forward alone, else the
    // kernels, the first whose workspace fits (cuDNN's deterministic backward
    // keeps an S x S matrix per head); for each, checkpoints on the device if
    // they fit (or the policy says so), else as few of them in pinned host
    // memory as make the rest fit (all that can travel, L-1, when the policy
    // says host).
    int cf, cb;
    char no[256];
    attn_candidates(b, &cf, &cb, no, sizeof no);
    const int cudnn_only = pol->attention == MT_ATTENTION_CUDNN;
    if (cudnn_only && !(cf && (cb || !s->want_grad)))
        return mt_fail(err, MT_ERR_UNSUPPORTED, "the policy asks for cuDNN's attention, but %s", no);
    const int opts[3][2] = {{cf, cb}, {cf, 0}, {0, 0}};
    const uint32_t place = pol->activations;
    const int may_host = s->want_grad && b->L >= 2 && place != MT_PLACE_DEVICE;
    const int forced = s->want_grad && b->L >= 2 && b->req.host_checkpoints
                           ? (int)MT_MIN((uint32_t)b->L - 1, b->req.host_checkpoints) : 0;
    const int h_first = forced ? forced : place == MT_PLACE_HOST && may_host ? b->L - 1 : 0;
    const int h_last = forced ? forced : may_host ? b->L - 1 : 0;
    const int rc_forced = s->want_grad ? (int)MT_MIN((uint32_t)b->L / 2, b->req.recomputed_checkpoints) : 0;
    size_t need = 0;
    int done = 0;
    for (int o = 0; o < (cudnn_only ? 1 : 3) && !done; o++) {
        if (o && opts[o][0] == opts[o - 1][0] && opts[o][1] == opts[o - 1][1]) continue;
        for (int h = h_first; h <= h_last && !done; h++) {
            b->cudnn_fwd = opts[o][0], b->cudnn_bwd = opts[o][1], b->ck_host = h;
            b->rc = MT_MIN(rc_forced, rc_max(b->L, h));
            need = arena_bytes(b, 0, 0, 0);
            done = need <= budget && need <= free_b;
        }
    }
    // Where the host cannot take the checkpoints that leaves (its budget less
    // the tiles), fewer checkpoints: the least recompute that fits both, with
    // as few on the host as the GPU allows.
    const uint64_t host_budget = b->req.host_budget       ? b->req.host_budget
                                 : pol->host_budget_bytes ? pol->host_budget_bytes
                                                          : mt_sys_mem_available();
    const uint64_t host_room = host_budget > b->req.layout->tile_bytes ? host_budget - b->req.layout->tile_bytes : 0;
    if (done && !rc_forced && !forced && b->ck_host && pinned_of(b, b->ck_host) > host_room) {
        const int h0 = b->ck_host;
        const size_t need0 = need;
        done = 0;
        for (int rc = 1; rc <= b->L / 2 && !done; rc++)
            for (int h = h_first; h <= h_last && rc <= rc_max(b->L, h) && !done; h++) {
                b->ck_host = h, b->rc = rc;
                need = arena_bytes(b, 0, 0, 0);
                done = need <= budget && need <= free_b && pinned_of(b, h) <= host_room;
            }
        if (!done) b->ck_host = h0, b->rc = 0, need = need0; // the plan says the host is short
    }
    // the most kept activations that fit, leaving the device a margin when no budget was set
    if (s->want_grad && !b->ck_host && !b->rc && pol->recompute == MT_RECOMPUTE_AUTO) {
        const size_t margin = pol->gpu_budget_bytes ? 0 : (size_t)512 << 20;
        const size_t room = MT_MIN((size_t)budget, free_b > margin ? free_b - margin : 0);
        const int cap = b->req.keep_layers_cap ? MT_MIN(b->L, (int)b->req.keep_layers_cap) : b->L;
        // in order, what the template says kept activations spare it (mt_template.keeps)
        const unsigned keeps = mt_runner_keeps(&b->run);
        const int att = keeps & MT_KEEP_ATT ? most_kept(b, room, cap, 0) : 0;
        const int h = att == b->L && keeps & MT_KEEP_H ? most_kept(b, room, cap, 1) : 0;
        const int qkv = h == b->L && keeps & MT_KEEP_QKV ? most_kept(b, room, cap, 2) : 0;
        need = arena_bytes(b, att, h, qkv);
    }
    const size_t row = ck_row_bytes(b);
    n->device_bytes = need + held;
    n->pinned_bytes = pinned_of(b, b->ck_host);
    n->checkpoint_bytes = (uint64_t)ck_rows(b) * row + (uint64_t)b->ck_host * row; // the spare row included
    n->activations = b->ck_host ? MT_PLACE_HOST : MT_PLACE_DEVICE;
    n->host_checkpoints = b->ck_host;
    n->recomputed = b->rc;
    char b1[32], b2[32];
    if (need > budget || need > free_b)
        return mt_fail(err, MT_ERR_GPU_BUDGET, "a step of %d x %d x %d tokens needs %s of GPU memory, but the %s is %s",
                       s->n_micro, s->n_seq, s->seq_len, mt_fmt_bytes(b1, sizeof b1, n->device_bytes),
                       need > budget ? (pol->gpu_budget_bytes ? "policy's GPU budget" : "device's free memory")
                                     : "device's free memory",
                       mt_fmt_bytes(b2, sizeof b2, need > budget ? budget + held : free_b + held));
    return MT_OK;
}

// The class's needs(): the sizing of reserve() without a device (a plan
// without free memory to ask about assumes the budget is free).
static mt_status cu_needs(const mt_be_request *r, mt_be_needs *n, mt_err err)
{
    cu_be *b = (cu_be *)calloc(1, sizeof *b);
    if (!b) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    b->req = *r;
    // the cuDNN a backend made here would load (not loaded for a model that would not use it)
    if (r->pol->attention != MT_ATTENTION_KERNELS && r->cfg->precision != MT_PRECISION_FP32)
        b->cudnn_version = mt_cudnn_attn_probe(b->cudnn_why, sizeof b->cudnn_why);
    const size_t held = mt_gemm_device_bytes();
    size_t free_b = r->gpu_free;
    if (!free_b) free_b = r->pol->gpu_budget_bytes > held ? r->pol->gpu_budget_bytes - held : 0;
    else free_b = free_b > held ? free_b - held : 0;
    const mt_status st = size_up(b, free_b, n, err);
    free(b);
    return st;
}

// ---- set-up ------------------------------------------------------------------------------

// A model with experts, training: the host's copies of the forward's routings (offs_h), E + 1 int32 a
// unit and micro-batch (50 KB for 128 experts, 48 layers and 8 micro-batches).
static mt_status alloc_routing_copies(cu_be *b, mt_err err)
{
    const int E = b->run.d.E;
    if (E <= 0 || !b->shape.want_grad) return MT_OK;
    const size_t n = (size_t)(b->L + 2) * b->shape.n_micro;
    void *dev = NULL;
    if (cudaHostAlloc((void **)&b->offs_h, n * (E + 1) * 4, cudaHostAllocPortable | cudaHostAllocMapped) != cudaSuccess ||
        cudaHostGetDevicePointer(&dev, b->offs_h, 0) != cudaSuccess) {
        cudaGetLastError();
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "cannot allocate pinned memory for the experts' routings");
    }
    b->offs_hd = (const int32_t *)dev;
    b->offs_ok = (unsigned char *)calloc(n, 1);
    b->offs_copied = (cudaEvent_t *)calloc(n, sizeof *b->offs_copied);
    if (!b->offs_ok || !b->offs_copied) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    for (size_t i = 0; i < n; i++)
        if (cudaEventCreateWithFlags(&b->offs_copied[i], cudaEventDisableTiming) != cudaSuccess) {
            cudaGetLastError();
            return mt_fail(err, MT_ERR_DEVICE, "cannot create the routing copies' events");
        }
    return MT_OK;
}

static void free_device(cu_be *b)
{
    if (b->arena) cudaFree(b->arena);
    b->arena = NULL;
    b->arena_bytes = 0;
    if (b->h_tokens) cudaFreeHost(b->h_tokens);
    b->h_tokens = NULL;
    free(b->docs);
    b->docs = NULL;
    b->rope_long = NULL;
    if (b->ck_pinned) cudaFreeHost(b->ck_pinned);
    b->ck_pinned = NULL;
    if (b->offs_h) cudaFreeHost(b->offs_h);
    if (b->offs_copied) destroy_events(b->offs_copied, (b->L + 2) * b->shape.n_micro);
    free(b->offs_copied), free(b->offs_ok);
    b->offs_h = NULL, b->offs_hd = NULL, b->offs_copied = NULL, b->offs_ok = NULL;
    b->bwd_offs_h = b->bwd_offs_d = NULL;
    b->ck_host = b->rc = 0;
    b->keep_att = b->keep_h = b->keep_qkv = 0;
    memset(&b->shape, 0, sizeof b->shape);
    memset(&b->base.held, 0, sizeof b->base.held);
}

static void destroy_events(cudaEvent_t *ev, int n)
{
    for (int i = 0; i < n; i++)
        if (ev[i]) cudaEventDestroy(ev[i]);
}

static void destroy_trace_events(cu_be *b)
{
    if (b->origin) cudaEventDestroy(b->origin);
    if (b->head) cudaEventDestroy(b->head);
    if (b->vev) destroy_events(b->vev, 2 * b->cap_vev);
    if (b->cev) destroy_events(b->cev, 2 * b->cap_cev);
    free(b->vev), free(b->cev);
    b->origin = b->head = NULL;
    b->vev = b->cev = NULL;
    b->cap_vev = b->cap_cev = 0;
}

static void cu_release(mt_be *be)
{
    cu_be *b = (cu_be *)be;
    cudaDeviceSynchronize(); // not on the hot path: a new batch shape
    free_device(b);
}

static void cu_destroy(mt_be *be)
{
    cu_be *b = (cu_be *)be;
    if (b->comp) cudaStreamSynchronize(b->comp);
    if (b->h2d) cudaStreamSynchronize(b->h2d);
    if (b->d2h) cudaStreamSynchronize(b->d2h);
    free_device(b);
    for (int i = 0; i < MAX_SLOTS; i++) {
        if (b->slot_loaded[i]) cudaEventDestroy(b->slot_loaded[i]);
        if (b->slot_free[i]) cudaEventDestroy(b->slot_free[i]);
    }
    for (int i = 0; i < 2; i++) {
        if (b->grad_ready[i]) cudaEventDestroy(b->grad_ready[i]);
        if (b->grad_sent[i]) cudaEventDestroy(b->grad_sent[i]);
        if (b->ck_saved[i]) cudaEventDestroy(b->ck_saved[i]);
        if (b->ck_fetched[i]) cudaEventDestroy(b->ck_fetched[i]);
        if (b->ck_row_done[i]) cudaEventDestroy(b->ck_row_done[i]);
    }
    destroy_trace_events(b);
    if (b->h2d) cudaStreamDestroy(b->h2d);
    if (b->comp) cudaStreamDestroy(b->comp);
    if (b->d2h) cudaStreamDestroy(b->d2h);
    mt_gemm_destroy(b->gemm);
    mt_cu_gg_destroy(b->gg);
    mt_cudnn_attn_destroy(b->cudnn);
    mt_nccl_comm_destroy(b->nccl, b->comm);
    mt_nccl_close(b->nccl);
    cudaGetLastError();
    free(b);
}

// The attention in words, for the log: "attention: cuDNN 9.14 forward and deterministic backward".
static void attn_describe(const cu_be *b, char *out, size_t len)
{
    const int det = !(b->req.pol->attention_flags & MT_ATTENTION_NONDETERMINISTIC);
    const size_t v = b->cudnn_version;
    if (b->cudnn_fwd || b->cudnn_bwd)
        snprintf(out, len, "attention: cuDNN %zu.%zu %s%s%s (the kernels for batches that pack documents%s)",
                 v / 10000, v / 100 % 100, b->cudnn_fwd ? "forward" : "", b->cudnn_fwd && b->cudnn_bwd ? " and " : "",
                 b->cudnn_bwd ? (det ? "deterministic backward" : "non-deterministic backward") : "",
                 b->run.d.window ? " and for the sliding-window layers" : "");
    else
        snprintf(out, len, "attention: the library's kernels");
}

// Builds cuDNN's plans for the reserved shape now rather than in the first
// step, and checks that the workspace reserved for them (a bound) holds them;
// a direction cuDNN refuses after all runs on the kernels (an error when the
// policy asks for cuDNN).
static mt_status check_cudnn_plans(cu_be *b, mt_err err)
{
    const mt_be_shape *s = &b->shape;
    const mt_dims *d = &b->run.d;
    for (int bwd = 0; bwd < 2; bwd++) {
        int *use = bwd ? &b->cudnn_bwd : &b->cudnn_fwd;
        if (!*use) continue;
        char why[256] = "", b1[32], b2[32];
        size_t ws = 0;
        int rc = bwd ? mt_cudnn_attn_backward_workspace(b->cudnn, s->n_seq, s->seq_len, d->H, d->Hkv, d->D, &ws, why,
                                                        sizeof why)
                     : mt_cudnn_attn_forward_workspace(b->cudnn, s->n_seq, s->seq_len, d->H, d->Hkv, d->D, &ws, why,
                                                       sizeof why);
        if (rc == 0 && ws > b->attn_ws_bytes) {
            snprintf(why, sizeof why, "its plan needs %s of workspace, more than the %s reserved",
                     mt_fmt_bytes(b1, sizeof b1, ws), mt_fmt_bytes(b2, sizeof b2, b->attn_ws_bytes));
            rc = MT_CUDNN_EWORKSPACE;
        }
        if (rc == 0) continue;
        if (b->req.pol->attention == MT_ATTENTION_CUDNN)
            return mt_fail(err, MT_ERR_UNSUPPORTED, "the policy asks for cuDNN's attention, but its %s: %s",
                           bwd ? "backward" : "forward", why);
        *use = 0;
        mt_log(b->req.log, MT_LOG_INFO, "cuDNN attention %s: %s; the library's kernels run it",
               bwd ? "backward" : "forward", why);
    }
    return MT_OK;
}

static mt_status cu_reserve(mt_be *be, const mt_be_request *r, mt_err err)
{
    cu_be *b = (cu_be *)be;
    const mt_be_shape *s = &r->shape;
    cu_release(be);
    b->req = *r;
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    mt_be_needs n;
    mt_status st = size_up(b, free_b, &n, err);
    if (st) return st;
    carver c = {NULL, 0};
    const size_t need = arena_bytes(b, b->keep_att, b->keep_h, b->keep_qkv);
    char b1[32], b2[32];
    if (cudaMalloc((void **)&c.base, need) != cudaSuccess) {
        cudaGetLastError();
        return mt_fail(err, MT_ERR_OUT_OF_GPU_MEMORY, "cudaMalloc of %s failed", mt_fmt_bytes(b1, sizeof b1, need));
    }
    b->arena = c.base;
    b->arena_bytes = need;
    layout_buffers(b, &c);
    b->shape = *s;
    b->docs = (int *)calloc(2 * (size_t)s->n_micro, sizeof *b->docs);
    b->rope_long = b->docs ? b->docs + s->n_micro : NULL;
    if (!b->docs || cudaHostAlloc((void **)&b->h_tokens, (size_t)s->n_micro * b->run.d.T * staged_arrays(b) * sizeof(int32_t),
                                  cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        free_device(b);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "cannot allocate pinned memory for the tokens");
    }
    st = alloc_routing_copies(b, err);
    if (st) {
        free_device(b);
        return st;
    }
    const int ck_host = b->ck_host; // free_device() below would clear it
    if (ck_host &&
        cudaHostAlloc(&b->ck_pinned, (size_t)ck_host * ck_row_bytes(b), cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        free_device(b);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY,
                       "cannot allocate %s of pinned host memory for the activation checkpoints",
                       mt_fmt_bytes(b1, sizeof b1, (uint64_t)ck_host * ck_row_bytes(b)));
    }
    // frequencies, as the CPU backend computes them (positions come with each micro-batch's tokens)
    float *inv = (float *)malloc((size_t)b->run.d.D / 2 * sizeof *inv);
    if (!inv) {
        free_device(b);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    cudaError_t e1 = cudaSuccess, e4 = cudaSuccess;
    for (int t = 0; t < MT_ROPE_TABLES; t++) { // each synchronous copy is done with inv before the next
        b->rope_scale[t] = mt_rope_attention_factor(b->req.cfg, (mt_rope_table)t);
        if (!b->inv_freq[t]) continue;
        mt_rope_inv_freq_of(inv, b->req.cfg, (mt_rope_table)t);
        if (!e1) e1 = cudaMemcpy(b->inv_freq[t], inv, (size_t)b->run.d.D / 2 * 4, cudaMemcpyHostToDevice);
    }
    cudaError_t e2 = cudaMemset(b->d_loss, 0, 8), e3 = cudaMemset(b->d_sumsq, 0, 8);
    if (!e3) e3 = cudaMemset(b->d_check, 0, MT_CU_MOE_CHECK_INTS * 4);
    // the template's state and the checks' flag start zero (the legacy stream's memsets done before the
    // compute stream, which does not wait for them, can read them)
    if (!e2 && b->run.state) e2 = cudaMemset(b->run.state, 0, mt_runner_state_bytes(&b->run));
    if (!e2) e2 = cudaDeviceSynchronize();
    free(inv);
    if (e1 || e2 || e3 || e4) {
        cudaGetLastError();
        free_device(b);
        return mt_fail(err, MT_ERR_DEVICE, "cannot initialise the CUDA backend's buffers");
    }
    b->failed = 0;
    b->gbuf = 0;
    b->base.held = n;
    st = check_cudnn_plans(b, err);
    if (st) {
        free_device(b);
        return st;
    }
    char kept[128] = "";
    if (b->keep_att)
        snprintf(kept, sizeof kept,
                 ", kept for the backward: attention outputs of %d of %d layers, residuals of %d, q/k/v of %d",
                 b->keep_att, b->L, b->keep_h, b->keep_qkv);
    char att[160];
    attn_describe(b, att, sizeof att);
    char where[128] = "", again[128] = "";
    if (ck_host)
        snprintf(where, sizeof where, ", %d of %d activation checkpoints in pinned host memory: %s", ck_host, b->L + 1,
                 mt_fmt_bytes(b2, sizeof b2, (uint64_t)ck_host * ck_row_bytes(b)));
    if (n.recomputed)
        snprintf(again, sizeof again, ", %d of %d checkpoints recomputed in the backward (%d more layer forwards)",
                 n.recomputed, b->L + 1, n.recomputed);
    mt_log(b->req.log, MT_LOG_INFO, "CUDA backend: %s of GPU memory for %d x %d x %d tokens per step%s%s%s; %s",
           mt_fmt_bytes(b1, sizeof b1, need), s->n_micro, s->n_seq, s->seq_len, kept, where, again, att);
    return MT_OK;
}

static void cu_set_tokens(mt_be *be, int mb, const int32_t *tokens, const int32_t *targets, const int32_t *positions)
{
    cu_be *b = (cu_be *)be;
    const size_t n = (size_t)b->run.d.T, M = (size_t)b->shape.n_micro;
    // the staging buffer (tokens, targets, positions, document starts of every micro-batch) is
    // free: every step, evaluation and logits call ends in sync()
    int32_t *ht = b->h_tokens + (size_t)mb * n, *hg = ht + M * n, *hp = hg + M * n, *hs = hp + M * n, *hw = hs + M * n;
    memcpy(ht, tokens, n * 4);
    CU(b, cudaMemcpyAsync(b->tokens + (size_t)mb * n, ht, n * 4, cudaMemcpyHostToDevice, b->comp));
    if (b->offs_ok) // new tokens: the forward routes them again before any backward reads its copies
        for (int u = 0; u < b->L + 2; u++) b->offs_ok[(size_t)u * M + mb] = 0;
    if (targets) {
        memcpy(hg, targets, n * 4);
        CU(b, cudaMemcpyAsync(b->targets + (size_t)mb * n, hg, n * 4, cudaMemcpyHostToDevice, b->comp));
    }
    b->docs[mb] = mt_doc_layout(hp, hs, positions, b->run.d.n_seq, b->run.d.seq_len);
    b->rope_long[mb] = mt_rope_uses_long(b->req.cfg, mt_max_position(hp, n));
    CU(b, cudaMemcpyAsync(b->pos + (size_t)mb * n, hp, n * 4, cudaMemcpyHostToDevice, b->comp));
    if (b->docs[mb]) CU(b, cudaMemcpyAsync(b->doc_start + (size_t)mb * n, hs, n * 4, cudaMemcpyHostToDevice, b->comp));
    if (b->run.d.window) {
        mt_window_starts(hw, hs, b->run.d.n_seq, b->run.d.seq_len, b->run.d.window);
        CU(b, cudaMemcpyAsync(b->win_start + (size_t)mb * n, hw, n * 4, cudaMemcpyHostToDevice, b->comp));
    }
}

// ---- weights ---------------------------------------------------------------------------------

// The streamed block of a unit: bf16 weights (lean mode: their int16 codes), or in fp32 mode the master.
static const void *host_block(cu_be *b, int unit, size_t *bytes)
{
    const mt_unit_desc *u = unit_desc(b, unit);
    const mt_tile *t = &b->req.tiles->tile[unit];
    if (b->dt == MT_CU_BF16) {
        *bytes = u->weight_bytes;
        return u->lean ? (const void *)mt_tile_wq(t, u) : (const void *)mt_tile_weights_bf16(t, u);
    }
    *bytes = u->padded * 4;
    return mt_tile_master(t, u);
}

// Lean mode: the scales of a unit's weight codes, to scale_at on the device (the copy stream).
static void load_lean_scales(cu_be *b, int unit, float *scale_at)
{
    const mt_unit_desc *u = unit_desc(b, unit);
    CU(b, cudaMemcpyAsync(scale_at, mt_tile_sw(&b->req.tiles->tile[unit], u), u->scale_bytes, cudaMemcpyHostToDevice,
                          b->h2d));
}

// The head of a model with tied embeddings reads the embedding matrix too, which its slot holds behind its own.
static int tied_head(cu_be *b, int unit) { return unit == b->L + 1 && b->req.cfg->tie_word_embeddings; }

// What a load of unit copies into a slot: its streamed block to the slot's start and, for a tied head, the
// embedding's block to `at` (the head's padded elements on); span, the bytes of the slot it fills, is what a
// load in slices divides among the ranks.
struct load_src {
    const char *own, *emb;
    size_t own_bytes, emb_bytes, at, span;
};

static load_src load_src_of(cu_be *b, int unit)
{
    load_src l = {};
    l.own = (const char *)host_block(b, unit, &l.own_bytes);
    l.at = unit_desc(b, unit)->padded * b->es;
    if (tied_head(b, unit)) l.emb = (const char *)host_block(b, 0, &l.emb_bytes);
    l.span = l.emb ? l.at + l.emb_bytes : l.own_bytes;
    return l;
}

// After the copies (and in a group fetching slices, the all-gather): lean codes become the bf16 weights the
// visit computes with, in place, and the slot is ready.
static void finish_load(cu_be *b, int slot, int unit)
{
    const mt_unit_desc *u = unit_desc(b, unit);
    if (u->lean)
        OK(b, mt_cu_q16_to_bf16(b->h2d, b->slots[slot], b->slot_scale[slot],
                                u->padded + (tied_head(b, unit) ? unit_desc(b, 0)->padded : 0)),
           "weight codes to bf16");
    CU(b, cudaEventRecord(b->slot_loaded[slot], b->h2d));
}

// The unit's block (and a tied head's embedding) from its host tile into the slot on the copy stream; with
// fetch_slices only this rank's slice of the slot's span, which cu_gather_weights completes. Lean scales
// (1/128 of the codes) come whole to every rank.
static void cu_load_weights(mt_be *be, int slot, int unit)
{
    cu_be *b = (cu_be *)be;
    const load_src l = load_src_of(b, unit);
    uint64_t lo = 0, hi = l.span;
    if (be->fetch_slices) mt_fetch_slice_of(l.span, be->rank, be->n_ranks, &lo, &hi);
    const size_t own_lo = MT_MIN(lo, l.own_bytes), own_hi = MT_MIN(hi, l.own_bytes); // of the unit's block
    const size_t emb_lo = l.emb ? MT_MIN(MT_MAX(lo, l.at), l.at + l.emb_bytes) - l.at : 0;
    const size_t emb_hi = l.emb ? MT_MIN(MT_MAX(hi, l.at), l.at + l.emb_bytes) - l.at : 0; // of the embedding's
    const mt_unit_desc *u = unit_desc(b, unit);
    const size_t scales = u->lean ? u->scale_bytes + (l.emb ? unit_desc(b, 0)->scale_bytes : 0) : 0;
    CU(b, cudaStreamWaitEvent(b->h2d, b->slot_free[slot], 0));
    const int c = copy_start(b, b->h2d, 0, MT_COPY_WEIGHTS, (own_hi - own_lo) + (emb_hi - emb_lo) + scales);
    if (own_hi > own_lo)
        CU(b, cudaMemcpyAsync((char *)b->slots[slot] + own_lo, l.own + own_lo, own_hi - own_lo,
                              cudaMemcpyHostToDevice, b->h2d));
    if (emb_hi > emb_lo)
        CU(b, cudaMemcpyAsync((char *)b->slots[slot] + l.at + emb_lo, l.emb + emb_lo, emb_hi - emb_lo,
                              cudaMemcpyHostToDevice, b->h2d));
    if (u->lean) { // the scales in the same order as the codes: the embedding's behind the head's
        load_lean_scales(b, unit, b->slot_scale[slot]);
        if (l.emb) load_lean_scales(b, 0, b->slot_scale[slot] + u->padded / MT_LEAN_BLOCK_ELEMS);
    }
    copy_end(b, c, b->h2d);
    b->slot_copy[slot] = c;
    if (!be->fetch_slices) finish_load(b, slot, unit);
}

// The compute waits for the slot's weights and for the checkpoint row the
// visit reads: in the forward, the row's previous checkpoint must have
// reached the host before unit overwrites it; in the backward, checkpoint
// unit-1 must be back from the host.
static void cu_begin_visit(mt_be *be, int slot, int unit, int phase)
{
    cu_be *b = (cu_be *)be;
    int ck = -1;
    if (slot >= 0) CU(b, cudaStreamWaitEvent(b->comp, b->slot_loaded[slot], 0));
    if (b->ck_host && phase == MT_PHASE_FORWARD && unit >= 2 && unit - 2 <= b->ck_host - 1) {
        CU(b, cudaStreamWaitEvent(b->comp, b->ck_saved[unit % 2], 0));
        ck = b->ck_save_copy[unit % 2];
    }
    if (b->ck_host && phase == MT_PHASE_BACKWARD && unit >= 1 && unit - 1 <= b->ck_host - 1) {
        CU(b, cudaStreamWaitEvent(b->comp, b->ck_fetched[(unit - 1) % 2], 0));
        ck = b->ck_fetch_copy[(unit - 1) % 2];
    }
    if (full_trace(b) && b->tr->n_visits > 0) {
        const int i = b->tr->n_visits - 1; // the engine's record of this visit
        b->tr->visit[i].weights = slot >= 0 ? b->slot_copy[slot] : -1;
        b->tr->visit[i].checkpoint = ck;
        CU(b, cudaEventRecord(b->vev[2 * i], b->comp));
    }
}

static void cu_end_visit(mt_be *be, int slot)
{
    cu_be *b = (cu_be *)be;
    if (slot >= 0) CU(b, cudaEventRecord(b->slot_free[slot], b->comp));
    if (full_trace(b) && b->tr->n_visits > 0) CU(b, cudaEventRecord(b->vev[2 * (b->tr->n_visits - 1) + 1], b->comp));
}

// ---- units -----------------------------------------------------------------------------------

static float *dx_of(cu_be *b, int mb) { return b->dx + (size_t)mb * b->run.d.T * b->run.d.C; }
static float *grads_of(cu_be *b, int unit) { return unit == 0 && b->tied_acc ? b->tied_acc : b->acc[b->gbuf]; }

// What the runner's calls of unit for micro-batch mb run on (the kernels'
// RoPE positions and documents are the micro-batch's); acts: where a layer's
// activations live (acts_of).
static mt_unit_io io_of(cu_be *b, int slot, int unit, int mb, const mt_layer_acts *acts)
{
    const size_t off = (size_t)mb * b->run.d.T;
    b->mb = mb;
    mt_unit_io io = {slot >= 0 ? b->slots[slot] : NULL, unit > 0 ? ck_at(b, unit - 1, mb) : NULL,
                     unit <= b->L ? ck_at(b, unit, mb) : NULL, b->tokens + off, b->targets + off,
                     b->dx ? dx_of(b, mb) : NULL, b->acc[b->gbuf], b->tied_acc, acts};
    return io;
}

static void cu_forward(mt_be *be, int slot, int unit, int mb)
{
    cu_be *b = (cu_be *)be;
    const mt_layer_acts a = unit > 0 ? acts_of(b, unit, mb) : mt_layer_acts{};
    const mt_unit_io io = io_of(b, slot, unit, mb, &a);
    b->unit = unit, b->in_backward = 0;
    mt_run_forward(&b->run, unit, mb, &io);
    const int r = unit % 2;
    if (b->ck_host && mb == b->shape.n_micro - 1 && unit <= b->ck_host - 1) { // to the host, behind the next unit
        CU(b, cudaEventRecord(b->ck_row_done[r], b->comp));
        CU(b, cudaStreamWaitEvent(b->d2h, b->ck_row_done[r], 0));
        const int c = copy_start(b, b->d2h, 1, MT_COPY_CHECKPOINT, ck_row_bytes(b));
        CU(b, cudaMemcpyAsync(ck_host_at(b, unit), ck_at(b, unit, 0), ck_row_bytes(b), cudaMemcpyDeviceToHost, b->d2h));
        copy_end(b, c, b->d2h);
        b->ck_save_copy[r] = c;
        CU(b, cudaEventRecord(b->ck_saved[r], b->d2h));
    }
}

static void cu_backward(mt_be *be, int slot, int unit, int mb)
{
    cu_be *b = (cu_be *)be;
    const mt_layer_acts a = unit > 0 ? acts_of(b, unit, mb) : mt_layer_acts{};
    const mt_unit_io io = io_of(b, slot, unit, mb, &a);
    b->unit = unit, b->in_backward = 1;
    b->bwd_offs_h = b->bwd_offs_d = NULL;
    mt_run_backward(&b->run, unit, mb, &io);
    b->in_backward = 0;
    b->bwd_offs_h = b->bwd_offs_d = NULL;
}

static void cu_head(mt_be *be, int slot, int mb, float loss_scale, int want_grad)
{
    cu_be *b = (cu_be *)be;
    mt_unit_io io = io_of(b, slot, b->L + 1, mb, NULL);
    if (!want_grad) io.grads = NULL;
    mt_run_head(&b->run, mb, &io, loss_scale);
}

static void cu_head_logits(mt_be *be, int slot, int mb, float *out)
{
    cu_be *b = (cu_be *)be;
    const mt_unit_io io = io_of(b, slot, b->L + 1, mb, NULL);
    mt_run_head_logits(&b->run, mb, &io, out);
}

// ---- gradients ---------------------------------------------------------------------------------

static void cu_begin_grads(mt_be *be, int unit)
{
    cu_be *b = (cu_be *)be;
    b->gbuf ^= 1; // alternate, so one buffer fills while the other goes to the host
    CU(b, cudaStreamWaitEvent(b->comp, b->grad_sent[b->gbuf], 0));
    CU(b, cudaMemsetAsync(b->acc[b->gbuf], 0, unit_desc(b, unit)->padded * 4, b->comp));
    if (unit == b->L + 1 && b->tied_acc)
        CU(b, cudaMemsetAsync(b->tied_acc, 0, unit_desc(b, 0)->padded * 4, b->comp));
    if (b->ck_host && unit >= 2 && unit - 2 <= b->ck_host - 1) { // checkpoint unit-2, for the backward after this one
        const int r = (unit - 2) % 2;
        CU(b, cudaEventRecord(b->ck_row_done[r], b->comp)); // the row's last reader (backward unit+1, or the head)
        CU(b, cudaStreamWaitEvent(b->h2d, b->ck_row_done[r], 0));
        const int c = copy_start(b, b->h2d, 0, MT_COPY_CHECKPOINT, ck_row_bytes(b));
        CU(b, cudaMemcpyAsync(ck_at(b, unit - 2, 0), ck_host_at(b, unit - 2), ck_row_bytes(b), cudaMemcpyHostToDevice,
                              b->h2d));
        copy_end(b, c, b->h2d);
        b->ck_fetch_copy[r] = c;
        CU(b, cudaEventRecord(b->ck_fetched[r], b->h2d));
    }
}

// The backend's slice of the unit's gradients (alone: all of them) to the host tile.
static void cu_send_grads(mt_be *be, int unit)
{
    cu_be *b = (cu_be *)be;
    const mt_unit_desc *u = unit_desc(b, unit);
    const mt_tile *t = &b->req.tiles->tile[unit];
    uint64_t lo, hi;
    mt_grad_slice_of(u->padded, be->rank, be->n_ranks, &lo, &hi);
    const size_t n = (size_t)(hi - lo);
    const float *src = grads_of(b, unit) + lo;
    const int i = b->gbuf;
    if (n) OK(b, mt_cu_sumsq(b->comp, b->d_sumsq, src, n, b->red_scratch), "sum of squares");
    if (b->dt == MT_CU_BF16) { // rounded on the device, landing in the tile's weight block (lean: gradient block)
        if (n) OK(b, mt_cu_convert(b->comp, MT_CU_BF16, b->stage[i], MT_CU_F32, src, n), "convert");
        CU(b, cudaEventRecord(b->grad_ready[i], b->comp));
        CU(b, cudaStreamWaitEvent(b->d2h, b->grad_ready[i], 0));
        const int c = copy_start(b, b->d2h, 1, MT_COPY_GRADIENTS, n * 2);
        if (n) CU(b, cudaMemcpyAsync(mt_tile_grad_bf16(t, u) + lo, b->stage[i], n * 2, cudaMemcpyDeviceToHost, b->d2h));
        copy_end(b, c, b->d2h);
    } else {
        CU(b, cudaEventRecord(b->grad_ready[i], b->comp));
        CU(b, cudaStreamWaitEvent(b->d2h, b->grad_ready[i], 0));
        const int c = copy_start(b, b->d2h, 1, MT_COPY_GRADIENTS, n * 4);
        if (n) CU(b, cudaMemcpyAsync(mt_tile_grad_f32(t, u) + lo, src, n * 4, cudaMemcpyDeviceToHost, b->d2h));
        copy_end(b, c, b->d2h);
    }
    CU(b, cudaEventRecord(b->grad_sent[i], b->d2h));
}

// A group's reduction (engine/backend.h): one NCCL reduce-scatter per rank, in place in each rank's
// accumulator, on its compute stream behind its backward; the ranks' calls grouped, as NCCL asks of one
// thread driving several devices.
static void cu_reduce_grads(mt_be *const *ranks, int n, int unit)
{
    cu_be *b0 = (cu_be *)ranks[0];
    const uint64_t count = mt_grad_slice(unit_desc(b0, unit)->padded, n);
    char why[256];
    mt_nccl_group_begin(b0->nccl);
    for (int r = 0; r < n; r++) {
        cu_be *b = (cu_be *)ranks[r];
        cudaSetDevice(b->device);
        if (mt_nccl_reduce_scatter_f32(b->nccl, grads_of(b, unit), (size_t)count, r, b->comm, b->comp, why,
                                       sizeof why))
            fail_why(b, why);
    }
    if (mt_nccl_group_end(b0->nccl, why, sizeof why)) fail_why(b0, why);
}

// A group's load in slices (engine/backend.h): one in-place NCCL all-gather of the slot's span per rank, on
// its copy stream behind its slice's copy, the ranks' calls grouped; then each rank's slot is finished. The
// same communicator as the gradients' reduce-scatter, on another stream: NCCL runs a communicator's
// collectives in the order they are issued, which is the same on every rank (one thread issues all), and
// each waits only for work issued before it, so neither can wait for the other.
static void cu_gather_weights(mt_be *const *ranks, int n, int slot, int unit)
{
    cu_be *b0 = (cu_be *)ranks[0];
    const uint64_t count = mt_fetch_slice(load_src_of(b0, unit).span, n);
    char why[256];
    mt_nccl_group_begin(b0->nccl);
    for (int r = 0; r < n; r++) {
        cu_be *b = (cu_be *)ranks[r];
        cudaSetDevice(b->device);
        if (mt_nccl_all_gather_u8(b->nccl, b->slots[slot], (size_t)count, r, b->comm, b->h2d, why, sizeof why))
            fail_why(b, why);
    }
    if (mt_nccl_group_end(b0->nccl, why, sizeof why)) fail_why(b0, why);
    for (int r = 0; r < n; r++) {
        cu_be *b = (cu_be *)ranks[r];
        cudaSetDevice(b->device);
        finish_load(b, slot, unit);
    }
}

// Ranks 0..n-1 of a group: NCCL (loaded now; a model on one GPU never needs it) and one communicator per
// rank's device.
static mt_status cu_join(mt_be *const *ranks, int n, mt_err err)
{
    char why[256] = "";
    int devices[MT_MAX_DEVICES] = {0};
    mt_nccl_comm comms[MT_MAX_DEVICES] = {0};
    if (n > MT_MAX_DEVICES) return mt_fail(err, MT_ERR_UNSUPPORTED, "CUDA backend: %d devices; at most %d", n, MT_MAX_DEVICES);
    for (int r = 0; r < n; r++) {
        cu_be *b = (cu_be *)ranks[r];
        devices[r] = b->device;
        if (!(b->nccl = mt_nccl_open(why, sizeof why)))
            return mt_fail(err, MT_ERR_UNSUPPORTED, "training on %d GPUs: %s", n, why);
    }
    if (mt_nccl_comms_init(((cu_be *)ranks[0])->nccl, comms, n, devices, why, sizeof why))
        return mt_fail(err, MT_ERR_DEVICE, "training on %d GPUs: %s", n, why);
    for (int r = 0; r < n; r++) {
        cu_be *b = (cu_be *)ranks[r];
        b->comm = comms[r];
        b->base.rank = r, b->base.n_ranks = n;
    }
    return MT_OK;
}

static mt_status cu_sync(mt_be *be, double *loss_sum, double *grad_sumsq, mt_err err)
{
    cu_be *b = (cu_be *)be;
    double v[2] = {0, 0};
    int32_t bad[MT_CU_MOE_CHECK_INTS] = {0};
    CU(b, cudaMemcpyAsync(&v[0], b->d_loss, 8, cudaMemcpyDeviceToHost, b->comp));
    CU(b, cudaMemcpyAsync(&v[1], b->d_sumsq, 8, cudaMemcpyDeviceToHost, b->comp));
    CU(b, cudaMemsetAsync(b->d_loss, 0, 8, b->comp));
    CU(b, cudaMemsetAsync(b->d_sumsq, 0, 8, b->comp));
    // the routings' check (k_moe_route), read where the step waits anyway
    CU(b, cudaMemcpyAsync(bad, b->d_check, sizeof bad, cudaMemcpyDeviceToHost, b->comp));
    CU(b, cudaMemsetAsync(b->d_check, 0, sizeof bad, b->comp));
    CU(b, cudaStreamSynchronize(b->comp));
    CU(b, cudaStreamSynchronize(b->d2h));
    CU(b, cudaStreamSynchronize(b->h2d));
    b->armed = 0;
    *loss_sum = v[0];
    *grad_sumsq = v[1];
    if (bad[0] == 1 && !b->failed) {
        snprintf(b->why, sizeof b->why, "expert routing: %d of %d routed rows placed (non-finite router logits?)",
                 bad[1], bad[2]);
        b->failed = 1;
    } else if (bad[0] == 2 && !b->failed) {
        snprintf(b->why, sizeof b->why,
                 "expert routing: the backward's recompute routed differently from the forward (expert %d's first "
                 "row %d): the forward is not deterministic",
                 bad[1], bad[2]);
        b->failed = 1;
    }
    if (b->failed) {
        b->failed = 0;
        return mt_fail(err, MT_ERR_DEVICE, "CUDA backend: %s", b->why);
    }
    return MT_OK;
}

// The ops by name (C++ before 20 has no designated initialisers).
static mt_be_ops cuda_ops(void)
{
    mt_be_ops o;
    memset(&o, 0, sizeof o);
    o.name = "CUDA";
    o.destroy = cu_destroy;
    o.reserve = cu_reserve;
    o.release = cu_release;
    o.set_tokens = cu_set_tokens;
    o.load_weights = cu_load_weights;
    o.begin_visit = cu_begin_visit;
    o.end_visit = cu_end_visit;
    o.forward = cu_forward;
    o.head = cu_head;
    o.head_logits = cu_head_logits;
    o.backward = cu_backward;
    o.begin_grads = cu_begin_grads;
    o.send_grads = cu_send_grads;
    o.sync = cu_sync;
    o.trace_start = cu_trace_start;
    o.mark_head = cu_mark_head;
    o.trace_read = cu_trace_read;
    return o;
}

static const mt_be_ops cu_ops = cuda_ops();

static mt_status cu_create(const mt_be_request *r, int device, mt_be **out, mt_err err)
{
    *out = NULL;
    cu_be *b = (cu_be *)calloc(1, sizeof *b);
    if (!b) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the CUDA backend");
    b->base.ops = &cu_ops;
    b->base.n_ranks = 1;
    b->req = *r;
    b->device = device;
    char why[256] = "";
    int ok = cudaSetDevice(device) == cudaSuccess;
    ok = ok && cudaStreamCreateWithFlags(&b->h2d, cudaStreamNonBlocking) == cudaSuccess;
    ok = ok && cudaStreamCreateWithFlags(&b->comp, cudaStreamNonBlocking) == cudaSuccess;
    ok = ok && cudaStreamCreateWithFlags(&b->d2h, cudaStreamNonBlocking) == cudaSuccess;
    for (int i = 0; ok && i < MAX_SLOTS; i++)
        ok = cudaEventCreateWithFlags(&b->slot_loaded[i], cudaEventDisableTiming) == cudaSuccess &&
             cudaEventCreateWithFlags(&b->slot_free[i], cudaEventDisableTiming) == cudaSuccess;
    for (int i = 0; ok && i < 2; i++)
        ok = cudaEventCreateWithFlags(&b->grad_ready[i], cudaEventDisableTiming) == cudaSuccess &&
             cudaEventCreateWithFlags(&b->grad_sent[i], cudaEventDisableTiming) == cudaSuccess &&
             cudaEventCreateWithFlags(&b->ck_saved[i], cudaEventDisableTiming) == cudaSuccess &&
             cudaEventCreateWithFlags(&b->ck_fetched[i], cudaEventDisableTiming) == cudaSuccess &&
             cudaEventCreateWithFlags(&b->ck_row_done[i], cudaEventDisableTiming) == cudaSuccess;
    if (!ok) snprintf(why, sizeof why, "cannot create streams and events: %s", cudaGetErrorString(cudaGetLastError()));
    if (ok && !(b->gemm = mt_gemm_create(why, sizeof why))) ok = 0;
    if (!ok) {
        cu_destroy(&b->base);
        return mt_fail(err, MT_ERR_DEVICE, "CUDA backend: %s", why);
    }
    // the grouped GEMMs of the kernel table's moe_linear entries, in bf16 on a Hopper GPU (fp32 and other
    // GPUs run the loop); a handle of a few bytes, nothing on the device until a model with experts calls it
    if (r->cfg->precision != MT_PRECISION_FP32) {
        char gwhy[160] = "";
        if (!(b->gg = mt_cu_gg_create(gwhy, sizeof gwhy)))
            mt_log(r->log, MT_LOG_DEBUG, "%s; grouped GEMMs run one GEMM a group", gwhy);
    }
    // cuDNN's attention, where the policy and the precision would use it
    if (r->pol->attention != MT_ATTENTION_KERNELS && r->cfg->precision != MT_PRECISION_FP32) {
        b->cudnn = mt_cudnn_attn_create(!(r->pol->attention_flags & MT_ATTENTION_NONDETERMINISTIC), b->cudnn_why,
                                        sizeof b->cudnn_why);
        b->cudnn_version = mt_cudnn_attn_version(b->cudnn);
        if (!b->cudnn)
            mt_log(r->log, r->pol->attention == MT_ATTENTION_CUDNN ? MT_LOG_WARN : MT_LOG_INFO,
                   "cuDNN attention: %s; the library's kernels run the attention", b->cudnn_why);
    }
    b->base.device_fixed = mt_gemm_device_bytes();
    *out = &b->base;
    return MT_OK;
}

extern "C" const mt_be_class mt_cuda_be_class = {"CUDA", cu_needs, cu_create, cu_join, cu_reduce_grads,
                                                   cu_gather_weights};
