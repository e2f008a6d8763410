// The CUDA backend: the scheduler's calls carried out on three streams.
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
// device keeps two rows (one unit's outputs for all micro-batches): the
// forward writes row u % 2 and copies it to pinned host memory on the d2h
// stream; the backward fetches checkpoint u-2 into the row that checkpoint u
// just vacated while unit u computes, so the copies hide behind the compute.
// Checkpoints L-1 and L are still on the device when the backward starts and
// never travel.
//
// Beside device checkpoints, some of the layers' activations for every
// micro-batch are kept on the device when they fit (policy recompute AUTO),
// so that the backward's recompute does less: the attention output and its
// log-sum-exp of the first keep_att layers (their recompute skips the
// attention forward), and once every layer has those, the residual after
// attention of the first keep_h layers (their recompute skips the output
// projection too). Attention goes first: per byte it saves the most, and
// more the longer the sequence. As many layers as fit the budget are kept.
//
// Device: every call runs with the policy's device current, which the
// library's entry points see to (mt_engine_enter); create checks it.
//
// Notation: T = n_seq * seq_len tokens of one micro-batch, C hidden, Q = H*D,
// KV = Hkv*D, F MLP width, V vocabulary, L layers.
#include "cuda/kernels/attention.h"
#include "cuda/gemm/gemm.h"
#include "cuda/kernels/kernels.h"

extern "C" { // the library's own (C) headers
#include "engine/backend.h"
#include "cpu/cpu_ops.h" // mt_rope_inv_freq: the same frequencies as the CPU backend
#include "engine/model.h"
#include "engine/plan.h" // the MLP's pieces and the head's chunks, by the plan's rules
}

#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_SLOTS 16

struct cu_be {
    mt_be base;
    mt_model *m;
    mt_be_shape shape;
    int T, C, Q, KV, F, V, H, Hkv, D, L, K;
    mt_cu_dtype dt;
    size_t es; // bytes per activation element
    int chunk; // head tokens per chunk
    int FT;    // MLP tokens per piece: T, or fewer when T * F elements would not fit MT_MLP_PIECE_BYTES
    mt_gemm *gemm;
    cudaStream_t h2d, comp, d2h;
    cudaEvent_t slot_loaded[MAX_SLOTS], slot_free[MAX_SLOTS], grad_ready[2], grad_sent[2];
    int gbuf;       // the gradient buffer in use
    char *arena;    // one device allocation, carved below
    size_t arena_bytes;
    void *slots[MAX_SLOTS];
    float *acc[2];  // fp32 weight-gradient accumulators (largest unit)
    float *tied_acc;// (V, C) when the head shares the embedding
    void *stage[2]; // bf16 gradients on their way to the host
    void *ck;       // (L+1, n_micro, T, C) checkpoints, or with ck_host two rows (2, n_micro, T, C)
    int ck_host;    // checkpoints 0 .. L-2 live in pinned host memory (ck_pinned)
    int keep_att;   // layers 1 .. keep_att keep their attention outputs for the backward
    int keep_h;     // layers 1 .. keep_h keep their residuals after attention
    void *att_keep; // (keep_att, n_micro, T, Q)
    float *lse_keep;// (keep_att, n_micro, T, H)
    void *h_keep;   // (keep_h, n_micro, T, C)
    void *ck_pinned;// (L-1, n_micro, T, C) on the host
    cudaEvent_t ck_saved[2], ck_fetched[2], ck_row_done[2];
    float *dx;      // (n_micro, T, C) gradient of the residual stream
    int32_t *tokens, *targets; // (n_micro, T)
    int32_t *pos;   // (T)
    float *inv_freq;// (D/2)
    // one layer's activations (dt unless noted) and gradients
    void *xn1, *q, *k, *v, *att, *h, *xn2, *g, *u, *a, *scratch_out;
    float *lse, *rstd1, *rstd2;
    void *dy_act, *da, *dg, *du, *datt, *dq, *dk, *dv, *dlogits;
    float *dxn, *logits;
    void *attn_ws;
    size_t attn_ws_bytes;
    void *red_scratch; // reductions' scratch (the largest need)
    double *d_loss, *d_sumsq;
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

static const mt_unit_desc *unit_desc(cu_be *b, int u) { return &b->m->layout.units[u]; }
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

// ---- GEMMs ---------------------------------------------------------------------------

// y[M,N] = x[M,K] W[N,K]^T (+ bias) + beta y
static void linear(cu_be *b, void *y, int y_type, const void *x, const void *W, const void *bias, int M, int K, int N,
                   float beta)
{
    char why[160];
    int ab = b->dt == MT_CU_BF16 ? MT_GEMM_BF16 : MT_GEMM_F32;
    if (mt_gemm_run(b->gemm, b->comp, 0, 1, M, N, K, ab, x, W, y_type, y, beta, bias, why, sizeof why) && !b->failed) {
        snprintf(b->why, sizeof b->why, "forward GEMM %dx%dx%d: %s", M, N, K, why);
        b->failed = 1;
    }
}

// dx[M,K] = dy[M,N] W[N,K] (+ beta dx)
static void linear_dx(cu_be *b, void *dx, int dx_type, const void *dy, const void *W, int M, int K, int N, float beta)
{
    char why[160];
    int ab = b->dt == MT_CU_BF16 ? MT_GEMM_BF16 : MT_GEMM_F32;
    if (mt_gemm_run(b->gemm, b->comp, 0, 0, M, K, N, ab, dy, W, dx_type, dx, beta, NULL, why, sizeof why) &&
        !b->failed) {
        snprintf(b->why, sizeof b->why, "input-gradient GEMM %dx%dx%d: %s", M, K, N, why);
        b->failed = 1;
    }
}

// dW[N,K] += dy[M,N]^T x[M,K], in fp32
static void linear_dw(cu_be *b, float *dW, const void *dy, const void *x, int M, int K, int N)
{
    char why[160];
    int ab = b->dt == MT_CU_BF16 ? MT_GEMM_BF16 : MT_GEMM_F32;
    if (mt_gemm_run(b->gemm, b->comp, 1, 0, N, K, M, ab, dy, x, MT_GEMM_F32, dW, 1.0f, NULL, why, sizeof why) &&
        !b->failed) {
        snprintf(b->why, sizeof b->why, "weight-gradient GEMM %dx%dx%d: %s", N, K, M, why);
        b->failed = 1;
    }
}

static int act_gemm_type(const cu_be *b) { return b->dt == MT_CU_BF16 ? MT_GEMM_BF16 : MT_GEMM_F32; }

// ---- checkpoints ---------------------------------------------------------------------

static size_t ck_row_bytes(const cu_be *b) { return (size_t)b->shape.n_micro * b->T * b->C * b->es; }

// Checkpoint idx of micro-batch mb on the device: its own place, or with two
// rows (host checkpoints, or evaluation, which keeps nothing) row idx % 2.
static void *ck_at(cu_be *b, int idx, int mb)
{
    const int rows = b->ck_host || !b->shape.want_grad;
    const size_t row = rows ? (size_t)(idx % 2) : (size_t)idx;
    return (char *)b->ck + row * ck_row_bytes(b) + (size_t)mb * (size_t)b->T * (size_t)b->C * b->es;
}

static void *ck_host_at(cu_be *b, int idx) { return (char *)b->ck_pinned + (size_t)idx * ck_row_bytes(b); }

// Where layer unit's activations for micro-batch mb live: kept for the
// backward, or the one layer's buffers.
typedef struct layer_acts {
    void *att;    // attention output (T, Q)
    float *lse;   // its log-sum-exp (T, H)
    void *h;      // the residual after attention (T, C)
    int att_kept; // att and lse hold the forward's values in the backward
    int h_kept;   // h does
} layer_acts;

static layer_acts acts_of(cu_be *b, int unit, int mb)
{
    const int l = unit - 1;
    const size_t i = (size_t)l * b->shape.n_micro + mb, T = (size_t)b->T;
    layer_acts a = {b->att, b->lse, b->h, l < b->keep_att, l < b->keep_h};
    if (a.att_kept) {
        a.att = (char *)b->att_keep + i * T * b->Q * b->es;
        a.lse = b->lse_keep + i * T * b->H;
    }
    if (a.h_kept) a.h = (char *)b->h_keep + i * T * b->C * b->es;
    return a;
}

// ---- set-up ------------------------------------------------------------------------------

static void free_device(cu_be *b)
{
    if (b->arena) cudaFree(b->arena);
    b->arena = NULL;
    b->arena_bytes = 0;
    if (b->h_tokens) cudaFreeHost(b->h_tokens);
    b->h_tokens = NULL;
    if (b->ck_pinned) cudaFreeHost(b->ck_pinned);
    b->ck_pinned = NULL;
    b->ck_host = 0;
    b->keep_att = b->keep_h = 0;
    memset(&b->shape, 0, sizeof b->shape);
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
    cudaGetLastError();
    free(b);
}

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

static void layout_buffers(cu_be *b, carver *c)
{
    const mt_layout *lo = &b->m->layout;
    const mt_be_shape *s = &b->shape;
    const size_t T = (size_t)b->T, C = (size_t)b->C, Q = (size_t)b->Q, KV = (size_t)b->KV, F = (size_t)b->F;
    const size_t es = b->es, M = (size_t)s->n_micro;
    const int tied = b->m->cfg.tie_word_embeddings != 0;
    size_t slot_elems = lo->largest_unit_padded;
    if (tied) slot_elems = MT_MAX(slot_elems, unit_desc(b, b->L + 1)->padded + unit_desc(b, 0)->padded);
    for (int i = 0; i < b->K; i++) b->slots[i] = carve(c, slot_elems * es);
    b->ck = carve(c, (b->ck_host || !s->want_grad ? 2 : (size_t)b->L + 1) * M * T * C * es);
    const size_t AM = (size_t)b->keep_att * M, HM = (size_t)b->keep_h * M;
    b->att_keep = AM ? carve(c, AM * T * Q * es) : NULL;
    b->lse_keep = AM ? (float *)carve(c, AM * T * (size_t)b->H * 4) : NULL;
    b->h_keep = HM ? carve(c, HM * T * C * es) : NULL;
    b->tokens = (int32_t *)carve(c, M * T * 4);
    b->targets = (int32_t *)carve(c, M * T * 4);
    b->pos = (int32_t *)carve(c, T * 4);
    b->inv_freq = (float *)carve(c, (size_t)b->D / 2 * 4);
    b->xn1 = carve(c, T * C * es);
    b->q = carve(c, T * Q * es);
    b->k = carve(c, T * KV * es);
    b->v = carve(c, T * KV * es);
    b->att = carve(c, T * Q * es);
    b->lse = (float *)carve(c, T * (size_t)b->H * 4);
    b->h = carve(c, T * C * es);
    b->xn2 = carve(c, T * C * es);
    const size_t FT = (size_t)b->FT;
    b->g = carve(c, FT * F * es);
    b->u = carve(c, FT * F * es);
    b->a = carve(c, FT * F * es);
    b->scratch_out = carve(c, T * C * es);
    b->rstd1 = (float *)carve(c, T * 4);
    b->rstd2 = (float *)carve(c, T * 4);
    b->logits = (float *)carve(c, (size_t)b->chunk * (size_t)b->V * 4);
    b->d_loss = (double *)carve(c, 8);
    b->d_sumsq = (double *)carve(c, 8);
    size_t red = mt_cu_sumsq_scratch_bytes();
    red = MT_MAX(red, mt_cu_cross_entropy_scratch_bytes(b->chunk));
    if (s->want_grad) {
        b->acc[0] = (float *)carve(c, lo->largest_unit_padded * 4);
        b->acc[1] = (float *)carve(c, lo->largest_unit_padded * 4);
        b->tied_acc = tied ? (float *)carve(c, unit_desc(b, 0)->padded * 4) : NULL;
        if (b->dt == MT_CU_BF16) {
            b->stage[0] = carve(c, lo->largest_unit_padded * 2);
            b->stage[1] = carve(c, lo->largest_unit_padded * 2);
        }
        b->dx = (float *)carve(c, M * T * C * 4);
        b->dy_act = carve(c, T * C * es);
        b->da = carve(c, FT * F * es);
        b->dg = carve(c, FT * F * es);
        b->du = carve(c, FT * F * es);
        b->datt = carve(c, T * Q * es);
        b->dq = carve(c, T * Q * es);
        b->dk = carve(c, T * KV * es);
        b->dv = carve(c, T * KV * es);
        b->dxn = (float *)carve(c, T * C * 4);
        b->dlogits = carve(c, (size_t)b->chunk * (size_t)b->V * es);
        b->attn_ws_bytes = mt_cuattn_workspace_bytes(s->n_seq, s->seq_len, b->H, b->Hkv, b->D);
        b->attn_ws = carve(c, b->attn_ws_bytes);
        red = MT_MAX(red, mt_cu_rmsnorm_bwd_scratch_bytes(b->T, b->C, NULL));
        red = MT_MAX(red, mt_cu_embedding_bwd_scratch_bytes(b->T));
        red = MT_MAX(red, mt_cu_bias_grad_scratch_bytes(b->T, b->Q));
    }
    b->red_scratch = carve(c, red);
}

// Tokens per MLP piece (plan.h): a 262144-token micro-batch of the
// Llama-2-7B shape would otherwise need six 5.4 GiB buffers, and T * F
// elements past 2^31.
static int mlp_piece_tokens(const cu_be *b)
{
    if (b->m->mlp_piece_tokens) return MT_MIN(b->T, (int)b->m->mlp_piece_tokens);
    return (int)mt_plan_mlp_piece_tokens((uint64_t)b->T, (uint64_t)b->F, b->es);
}

// The arena's bytes with att layers keeping their attention outputs and h
// their residuals (leaves b->keep_* so).
static size_t arena_bytes(cu_be *b, int att, int h)
{
    carver t = {NULL, 0};
    b->keep_att = att, b->keep_h = h;
    layout_buffers(b, &t);
    return t.off + 256;
}

// The most layers, up to cap, that keep their attention outputs (residuals:
// with every layer's attention kept) within room bytes.
static int most_kept(cu_be *b, size_t room, int cap, int residuals)
{
    const int att0 = residuals ? b->L : 0;
    const size_t base = arena_bytes(b, att0, 0);
    const size_t one = (residuals ? arena_bytes(b, att0, 1) : arena_bytes(b, 1, 0)) - base;
    if (room <= base || one == 0) return 0;
    int n = (int)MT_MIN((size_t)cap, (room - base) / one); // alignment can add a few bytes: check
    while (n > 0 && arena_bytes(b, residuals ? att0 : n, residuals ? n : 0) > room) n--;
    return n;
}

static mt_status cu_reserve(mt_be *be, const mt_be_shape *s, mt_err err)
{
    cu_be *b = (cu_be *)be;
    const mt_model_config *cfg = &b->m->cfg;
    cudaDeviceSynchronize(); // not on the hot path: a new batch shape
    free_device(b);
    b->shape = *s;
    b->T = s->n_seq * s->seq_len;
    b->C = (int)cfg->hidden_size;
    b->H = (int)cfg->num_attention_heads;
    b->Hkv = (int)cfg->num_key_value_heads;
    b->D = (int)cfg->head_dim;
    b->Q = b->H * b->D;
    b->KV = b->Hkv * b->D;
    b->F = (int)cfg->intermediate_size;
    b->V = (int)cfg->vocab_size;
    b->L = (int)cfg->num_hidden_layers;
    b->chunk = (int)MT_MAX((size_t)1, MT_MIN((size_t)b->T, MT_LOGITS_CHUNK_BYTES / ((size_t)b->V * 4)));
    b->FT = mlp_piece_tokens(b);
    if (b->D != 32 && b->D != 64 && b->D != 128)
        return mt_fail(err, MT_ERR_UNSUPPORTED, "the CUDA backend's attention supports head_dim 32, 64 and 128, not %d",
                       b->D);
    size_t free_b = 0, total = 0;
    cudaMemGetInfo(&free_b, &total);
    // the budget covers the GEMM workspace, already allocated, and the arena
    const size_t held = mt_gemm_device_bytes();
    const uint64_t budget = b->m->pol.gpu_budget_bytes
                                ? (b->m->pol.gpu_budget_bytes > held ? b->m->pol.gpu_budget_bytes - held : 0)
                                : free_b;
    // checkpoints on the device if they fit (or the policy says so), else in pinned host memory
    carver c = {NULL, 0};
    b->ck_host = 0;
    b->keep_att = b->keep_h = 0;
    layout_buffers(b, &c);
    const uint32_t place = b->m->pol.activations;
    if (s->want_grad && b->L >= 2 &&
        (place == MT_PLACE_HOST || (place == MT_PLACE_AUTO && (c.off + 256 > budget || c.off + 256 > free_b)))) {
        b->ck_host = 1;
        c.off = 0;
        layout_buffers(b, &c);
    }
    // the most kept activations that fit, leaving the device a margin when no budget was set
    if (s->want_grad && !b->ck_host && b->m->pol.recompute == MT_RECOMPUTE_AUTO) {
        const size_t margin = b->m->pol.gpu_budget_bytes ? 0 : (size_t)512 << 20;
        const size_t room = MT_MIN((size_t)budget, free_b > margin ? free_b - margin : 0);
        const int cap = b->m->keep_layers_cap ? MT_MIN(b->L, (int)b->m->keep_layers_cap) : b->L;
        const int att = most_kept(b, room, cap, 0);
        const int h = att == b->L ? most_kept(b, room, cap, 1) : 0;
        b->keep_att = att, b->keep_h = h;
        c.off = arena_bytes(b, att, h) - 256;
    }
    const size_t need = c.off + 256;
    char b1[32], b2[32];
    if (need > budget || need > free_b)
        return mt_fail(err, MT_ERR_GPU_BUDGET,
                       "a step of %d x %d x %d tokens needs %s of GPU memory, but the %s is %s", s->n_micro, s->n_seq,
                       s->seq_len, mt_fmt_bytes(b1, sizeof b1, need),
                       need > budget ? "GPU budget (less the GEMM workspace)" : "device's free memory",
                       mt_fmt_bytes(b2, sizeof b2, need > budget ? budget : free_b));
    if (cudaMalloc((void **)&c.base, need) != cudaSuccess) {
        cudaGetLastError();
        return mt_fail(err, MT_ERR_OUT_OF_GPU_MEMORY, "cudaMalloc of %s failed", mt_fmt_bytes(b1, sizeof b1, need));
    }
    b->arena = c.base;
    b->arena_bytes = need;
    c.off = 0;
    layout_buffers(b, &c);
    if (cudaHostAlloc((void **)&b->h_tokens, (size_t)s->n_micro * b->T * 2 * sizeof(int32_t), cudaHostAllocPortable) !=
        cudaSuccess) {
        cudaGetLastError();
        free_device(b);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "cannot allocate pinned memory for the tokens");
    }
    const int ck_host = b->ck_host; // free_device() below would clear it
    if (ck_host &&
        cudaHostAlloc(&b->ck_pinned, (size_t)(b->L - 1) * ck_row_bytes(b), cudaHostAllocPortable) != cudaSuccess) {
        cudaGetLastError();
        free_device(b);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "cannot allocate %s of pinned host memory for the activation checkpoints",
                       mt_fmt_bytes(b1, sizeof b1, (uint64_t)(b->L - 1) * ck_row_bytes(b)));
    }
    // positions and frequencies, as the CPU backend computes them
    int32_t *pos = (int32_t *)malloc((size_t)b->T * sizeof *pos);
    float *inv = (float *)malloc((size_t)b->D / 2 * sizeof *inv);
    if (!pos || !inv) {
        free(pos), free(inv);
        free_device(b);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    }
    for (int t = 0; t < b->T; t++) pos[t] = t % s->seq_len;
    mt_rope_params rp = {cfg->rope_theta, cfg->rope_scaling == MT_ROPE_SCALING_LLAMA3, cfg->rope_factor,
                         cfg->rope_low_freq_factor, cfg->rope_high_freq_factor, (int)cfg->rope_original_max_position};
    mt_rope_inv_freq(inv, b->D, &rp);
    cudaError_t e1 = cudaMemcpy(b->pos, pos, (size_t)b->T * 4, cudaMemcpyHostToDevice);
    cudaError_t e2 = cudaMemcpy(b->inv_freq, inv, (size_t)b->D / 2 * 4, cudaMemcpyHostToDevice);
    cudaError_t e3 = cudaMemset(b->d_loss, 0, 8), e4 = cudaMemset(b->d_sumsq, 0, 8);
    free(pos), free(inv);
    if (e1 || e2 || e3 || e4) {
        cudaGetLastError();
        free_device(b);
        return mt_fail(err, MT_ERR_DEVICE, "cannot initialise the CUDA backend's buffers");
    }
    b->failed = 0;
    b->gbuf = 0;
    char kept[128] = "";
    if (b->keep_att)
        snprintf(kept, sizeof kept, ", kept for the backward: attention outputs of %d of %d layers, residuals of %d",
                 b->keep_att, b->L, b->keep_h);
    mt_log(&b->m->log, MT_LOG_INFO, "CUDA backend: %s of GPU memory for %d x %d x %d tokens per step%s%s%s",
           mt_fmt_bytes(b1, sizeof b1, need), s->n_micro, s->n_seq, s->seq_len, kept,
           ck_host ? ", activation checkpoints in pinned host memory: " : "",
           ck_host ? mt_fmt_bytes(b2, sizeof b2, (uint64_t)(b->L - 1) * ck_row_bytes(b)) : "");
    return MT_OK;
}

static void cu_set_tokens(mt_be *be, int mb, const int32_t *tokens, const int32_t *targets)
{
    cu_be *b = (cu_be *)be;
    const size_t n = (size_t)b->T, M = (size_t)b->shape.n_micro;
    int32_t *ht = b->h_tokens + (size_t)mb * n, *hg = b->h_tokens + (M + (size_t)mb) * n;
    // the staging buffer is free: every step, evaluation and logits call ends in sync()
    memcpy(ht, tokens, n * 4);
    CU(b, cudaMemcpyAsync(b->tokens + (size_t)mb * n, ht, n * 4, cudaMemcpyHostToDevice, b->comp));
    if (targets) {
        memcpy(hg, targets, n * 4);
        CU(b, cudaMemcpyAsync(b->targets + (size_t)mb * n, hg, n * 4, cudaMemcpyHostToDevice, b->comp));
    }
}

// ---- weights ---------------------------------------------------------------------------------

// The streamed block of a unit: bf16 weights, or in fp32 mode the master.
static const void *host_block(cu_be *b, int unit, size_t *bytes)
{
    const mt_unit_desc *u = unit_desc(b, unit);
    const mt_tile *t = &b->m->tiles.tile[unit];
    if (b->dt == MT_CU_BF16) {
        *bytes = u->weight_bytes;
        return mt_tile_weights_bf16(t, u);
    }
    *bytes = u->padded * 4;
    return mt_tile_master(t, u);
}

static void cu_load_weights(mt_be *be, int slot, int unit)
{
    cu_be *b = (cu_be *)be;
    size_t bytes;
    const void *src = host_block(b, unit, &bytes);
    const int tied_head = unit == b->L + 1 && b->m->cfg.tie_word_embeddings; // it reads the embedding matrix too
    size_t eb = 0;
    const void *e = tied_head ? host_block(b, 0, &eb) : NULL;
    CU(b, cudaStreamWaitEvent(b->h2d, b->slot_free[slot], 0));
    const int c = copy_start(b, b->h2d, 0, MT_COPY_WEIGHTS, bytes + eb);
    CU(b, cudaMemcpyAsync(b->slots[slot], src, bytes, cudaMemcpyHostToDevice, b->h2d));
    if (tied_head)
        CU(b, cudaMemcpyAsync((char *)b->slots[slot] + unit_desc(b, unit)->padded * b->es, e, eb,
                              cudaMemcpyHostToDevice, b->h2d));
    copy_end(b, c, b->h2d);
    b->slot_copy[slot] = c;
    CU(b, cudaEventRecord(b->slot_loaded[slot], b->h2d));
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
    if (b->ck_host && phase == MT_PHASE_FORWARD && unit >= 2 && unit - 2 <= b->L - 2) {
        CU(b, cudaStreamWaitEvent(b->comp, b->ck_saved[unit % 2], 0));
        ck = b->ck_save_copy[unit % 2];
    }
    if (b->ck_host && phase == MT_PHASE_BACKWARD && unit >= 1 && unit - 1 <= b->L - 2) {
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

// Pointers to each tensor of a unit inside a block laid out like its tile.
static void bind(void **w, void *block, const mt_unit_desc *u, size_t es)
{
    memset(w, 0, MT_T_ROLE_COUNT * sizeof *w);
    for (int i = 0; i < u->n_tensors; i++) w[u->tensors[i].role] = (char *)block + u->tensors[i].offset * es;
}

static void bind_f32(float **w, float *block, const mt_unit_desc *u)
{
    memset(w, 0, MT_T_ROLE_COUNT * sizeof *w);
    for (int i = 0; i < u->n_tensors; i++) w[u->tensors[i].role] = block + u->tensors[i].offset;
}


// ---- a decoder layer ---------------------------------------------------------------------------

// g, u and a = silu(g) * u for the n tokens from t0 of xn2: one MLP piece.
static void mlp_up(cu_be *b, void *const *w, int t0, int n)
{
    const int C = b->C, F = b->F, at = act_gemm_type(b);
    const void *xn = (const char *)b->xn2 + (size_t)t0 * C * b->es;
    linear(b, b->g, at, xn, w[MT_T_GATE], NULL, n, C, F, 0.0f);
    linear(b, b->u, at, xn, w[MT_T_UP], NULL, n, C, F, 0.0f);
    OK(b, mt_cu_swiglu(b->comp, b->dt, b->a, b->g, b->u, (size_t)n * F), "swiglu");
}

// x (T, C) -> out (T, C), keeping in b and in *a what the backward needs.
// The MLP runs in pieces of b->FT tokens (one piece below 2 GiB buffers).
// The backward's recompute passes out NULL: it stops at the MLP's input,
// since layer_backward recomputes each MLP piece just before its backward,
// without the down projection (a quarter of the layer's GEMM FLOPs in a
// Llama), which only makes the output; and it skips what the forward kept
// (a->att_kept, a->h_kept).
static void layer_forward(cu_be *b, void *const *w, const void *x, void *out, const layer_acts *a)
{
    const int recompute = out == NULL;
    const int T = b->T, C = b->C, Q = b->Q, KV = b->KV, F = b->F, at = act_gemm_type(b);
    const float eps = b->m->cfg.rms_norm_eps, scale = 1.0f / sqrtf((float)b->D);
    const size_t es = b->es;
    OK(b, mt_cu_rmsnorm(b->comp, b->dt, b->xn1, b->rstd1, b->dt, x, w[MT_T_ATTN_NORM], T, C, eps, NULL), "rmsnorm");
    linear(b, b->q, at, b->xn1, w[MT_T_Q], w[MT_T_Q_BIAS], T, C, Q, 0.0f);
    linear(b, b->k, at, b->xn1, w[MT_T_K], w[MT_T_K_BIAS], T, C, KV, 0.0f);
    linear(b, b->v, at, b->xn1, w[MT_T_V], w[MT_T_V_BIAS], T, C, KV, 0.0f);
    OK(b, mt_cu_rope(b->comp, b->dt, b->q, b->pos, b->inv_freq, T, b->H, b->D, 0), "rope");
    OK(b, mt_cu_rope(b->comp, b->dt, b->k, b->pos, b->inv_freq, T, b->Hkv, b->D, 0), "rope");
    if (!recompute || !a->att_kept) {
        int rc = mt_cuattn_forward(b->comp, b->dt == MT_CU_BF16 ? MT_CUATTN_BF16 : MT_CUATTN_FP32, a->att, a->lse,
                                   b->q, b->k, b->v, b->shape.n_seq, b->shape.seq_len, b->H, b->Hkv, b->D, scale);
        if (rc && !b->failed) snprintf(b->why, sizeof b->why, "attention: %s", mt_cuattn_strerror(rc)), b->failed = 1;
    }
    // h = x + att Wo^T, out = h + silu(xn2 Wg^T) * (xn2 Wu^T) Wd^T: the residual adds inside the GEMMs
    if (!recompute || !a->h_kept) {
        CU(b, cudaMemcpyAsync(a->h, x, (size_t)T * C * es, cudaMemcpyDeviceToDevice, b->comp));
        linear(b, a->h, at, a->att, w[MT_T_O], NULL, T, Q, C, 1.0f);
    }
    OK(b, mt_cu_rmsnorm(b->comp, b->dt, b->xn2, b->rstd2, b->dt, a->h, w[MT_T_MLP_NORM], T, C, eps, NULL),
       "rmsnorm");
    if (!out) return; // the backward recomputes the MLP piece by piece
    CU(b, cudaMemcpyAsync(out, a->h, (size_t)T * C * es, cudaMemcpyDeviceToDevice, b->comp));
    for (int t0 = 0; t0 < T; t0 += b->FT) {
        const int n = MT_MIN(b->FT, T - t0);
        mlp_up(b, w, t0, n);
        linear(b, (char *)out + (size_t)t0 * C * es, at, b->a, w[MT_T_DOWN], NULL, n, F, C, 1.0f);
    }
}

// After layer_forward(x): dy (T, C) fp32 holds the output gradient and gets
// the input gradient; weight gradients add into gw.
static void layer_backward(cu_be *b, void *const *w, float *const *gw, const void *x, float *dy, const layer_acts *a)
{
    const int T = b->T, C = b->C, Q = b->Q, KV = b->KV, F = b->F, at = act_gemm_type(b);
    const float eps = b->m->cfg.rms_norm_eps, scale = 1.0f / sqrtf((float)b->D);
    void *rs = b->red_scratch;
    // out = h + a Wd^T, piece by piece: the MLP's forward again, then its backward
    OK(b, mt_cu_convert(b->comp, b->dt, b->dy_act, MT_CU_F32, dy, (size_t)T * C), "convert");
    for (int t0 = 0; t0 < T; t0 += b->FT) {
        const int n = MT_MIN(b->FT, T - t0);
        const void *dyp = (const char *)b->dy_act + (size_t)t0 * C * b->es;
        const void *xn = (const char *)b->xn2 + (size_t)t0 * C * b->es;
        float *dxn = b->dxn + (size_t)t0 * C;
        mlp_up(b, w, t0, n);
        linear_dx(b, b->da, at, dyp, w[MT_T_DOWN], n, F, C, 0.0f);
        linear_dw(b, gw[MT_T_DOWN], dyp, b->a, n, F, C);
        OK(b, mt_cu_swiglu_bwd(b->comp, b->dt, b->dg, b->du, b->da, b->g, b->u, (size_t)n * F), "swiglu backward");
        linear_dx(b, dxn, MT_GEMM_F32, b->dg, w[MT_T_GATE], n, C, F, 0.0f);
        linear_dx(b, dxn, MT_GEMM_F32, b->du, w[MT_T_UP], n, C, F, 1.0f);
        linear_dw(b, gw[MT_T_GATE], b->dg, xn, n, C, F);
        linear_dw(b, gw[MT_T_UP], b->du, xn, n, C, F);
    }
    OK(b, mt_cu_rmsnorm_bwd(b->comp, dy, gw[MT_T_MLP_NORM], b->dxn, b->dt, a->h, b->dt, w[MT_T_MLP_NORM], b->rstd2, T,
                            C, eps, rs, NULL),
       "rmsnorm backward");
    // h = x + att Wo^T
    OK(b, mt_cu_convert(b->comp, b->dt, b->dy_act, MT_CU_F32, dy, (size_t)T * C), "convert");
    linear_dx(b, b->datt, at, b->dy_act, w[MT_T_O], T, Q, C, 0.0f);
    linear_dw(b, gw[MT_T_O], b->dy_act, a->att, T, Q, C);
    int rc = mt_cuattn_backward(b->comp, b->dt == MT_CU_BF16 ? MT_CUATTN_BF16 : MT_CUATTN_FP32, b->dq, b->dk, b->dv,
                                b->datt, a->att, a->lse, b->q, b->k, b->v, b->shape.n_seq, b->shape.seq_len, b->H,
                                b->Hkv, b->D, scale, b->attn_ws, b->attn_ws_bytes);
    if (rc && !b->failed)
        snprintf(b->why, sizeof b->why, "attention backward: %s", mt_cuattn_strerror(rc)), b->failed = 1;
    OK(b, mt_cu_rope(b->comp, b->dt, b->dq, b->pos, b->inv_freq, T, b->H, b->D, 1), "rope backward");
    OK(b, mt_cu_rope(b->comp, b->dt, b->dk, b->pos, b->inv_freq, T, b->Hkv, b->D, 1), "rope backward");
    linear_dx(b, b->dxn, MT_GEMM_F32, b->dq, w[MT_T_Q], T, C, Q, 0.0f);
    linear_dx(b, b->dxn, MT_GEMM_F32, b->dk, w[MT_T_K], T, C, KV, 1.0f);
    linear_dx(b, b->dxn, MT_GEMM_F32, b->dv, w[MT_T_V], T, C, KV, 1.0f);
    linear_dw(b, gw[MT_T_Q], b->dq, b->xn1, T, C, Q);
    linear_dw(b, gw[MT_T_K], b->dk, b->xn1, T, C, KV);
    linear_dw(b, gw[MT_T_V], b->dv, b->xn1, T, C, KV);
    if (gw[MT_T_Q_BIAS]) {
        OK(b, mt_cu_bias_grad(b->comp, gw[MT_T_Q_BIAS], b->dt, b->dq, T, Q, rs), "bias gradient");
        OK(b, mt_cu_bias_grad(b->comp, gw[MT_T_K_BIAS], b->dt, b->dk, T, KV, rs), "bias gradient");
        OK(b, mt_cu_bias_grad(b->comp, gw[MT_T_V_BIAS], b->dt, b->dv, T, KV, rs), "bias gradient");
    }
    OK(b, mt_cu_rmsnorm_bwd(b->comp, dy, gw[MT_T_ATTN_NORM], b->dxn, b->dt, x, b->dt, w[MT_T_ATTN_NORM], b->rstd1, T,
                            C, eps, rs, NULL),
       "rmsnorm backward");
}

static void cu_forward(mt_be *be, int slot, int unit, int mb)
{
    cu_be *b = (cu_be *)be;
    void *w[MT_T_ROLE_COUNT];
    bind(w, b->slots[slot], unit_desc(b, unit), b->es);
    const int r = unit % 2;
    if (unit == 0) {
        OK(b, mt_cu_embedding(b->comp, b->dt, ck_at(b, 0, mb), b->tokens + (size_t)mb * b->T, b->dt, w[MT_T_EMBED],
                              b->T, b->C, b->V),
           "embedding");
    } else {
        const layer_acts a = acts_of(b, unit, mb);
        layer_forward(b, w, ck_at(b, unit - 1, mb), ck_at(b, unit, mb), &a);
    }
    if (b->ck_host && mb == b->shape.n_micro - 1 && unit <= b->L - 2) { // to the host, behind the next unit
        CU(b, cudaEventRecord(b->ck_row_done[r], b->comp));
        CU(b, cudaStreamWaitEvent(b->d2h, b->ck_row_done[r], 0));
        const int c = copy_start(b, b->d2h, 1, MT_COPY_CHECKPOINT, ck_row_bytes(b));
        CU(b, cudaMemcpyAsync(ck_host_at(b, unit), ck_at(b, unit, 0), ck_row_bytes(b), cudaMemcpyDeviceToHost, b->d2h));
        copy_end(b, c, b->d2h);
        b->ck_save_copy[r] = c;
        CU(b, cudaEventRecord(b->ck_saved[r], b->d2h));
    }
}

static float *grads_of(cu_be *b, int unit) { return unit == 0 && b->tied_acc ? b->tied_acc : b->acc[b->gbuf]; }

static void cu_backward(mt_be *be, int slot, int unit, int mb)
{
    cu_be *b = (cu_be *)be;
    float *dy = b->dx + (size_t)mb * b->T * b->C;
    if (unit == 0) {
        OK(b, mt_cu_embedding_bwd(b->comp, grads_of(b, 0), b->tokens + (size_t)mb * b->T, dy, b->T, b->C, b->V,
                                  b->red_scratch),
           "embedding backward");
        return;
    }
    void *w[MT_T_ROLE_COUNT];
    float *gw[MT_T_ROLE_COUNT];
    bind(w, b->slots[slot], unit_desc(b, unit), b->es);
    bind_f32(gw, b->acc[b->gbuf], unit_desc(b, unit));
    const void *x = ck_at(b, unit - 1, mb);
    const layer_acts a = acts_of(b, unit, mb);
    layer_forward(b, w, x, NULL, &a);
    layer_backward(b, w, gw, x, dy, &a);
}

// ---- the head ------------------------------------------------------------------------------

static void head_run(cu_be *b, int slot, int mb, float loss_scale, int want_grad, float *logits_out)
{
    const mt_unit_desc *u = unit_desc(b, b->L + 1);
    const int T = b->T, C = b->C, V = b->V;
    const size_t es = b->es;
    void *w[MT_T_ROLE_COUNT];
    float *gw[MT_T_ROLE_COUNT];
    bind(w, b->slots[slot], u, es);
    const int tied = b->m->cfg.tie_word_embeddings != 0;
    const void *lm = tied ? (const void *)((char *)b->slots[slot] + u->padded * es) : w[MT_T_LM_HEAD];
    const void *x = ck_at(b, b->L, mb);
    OK(b, mt_cu_rmsnorm(b->comp, b->dt, b->xn1, b->rstd1, b->dt, x, w[MT_T_FINAL_NORM], T, C,
                        b->m->cfg.rms_norm_eps, NULL),
       "rmsnorm");
    if (logits_out) { // the last position of each sequence, gathered into one small GEMM
        const int n = b->shape.n_seq, S = b->shape.seq_len;
        CU(b, cudaMemcpy2DAsync(b->scratch_out, (size_t)C * es, (char *)b->xn1 + (size_t)(S - 1) * C * es,
                                (size_t)S * C * es, (size_t)C * es, (size_t)n, cudaMemcpyDeviceToDevice, b->comp));
        linear(b, b->logits, MT_GEMM_F32, b->scratch_out, lm, NULL, n, C, V, 0.0f);
        CU(b, cudaMemcpyAsync(logits_out, b->logits, (size_t)n * V * 4, cudaMemcpyDeviceToHost, b->comp));
        return;
    }
    float *glm = NULL;
    if (want_grad) {
        bind_f32(gw, b->acc[b->gbuf], u);
        glm = tied ? b->tied_acc : gw[MT_T_LM_HEAD];
        CU(b, cudaMemsetAsync(b->dxn, 0, (size_t)T * C * 4, b->comp));
    }
    const int32_t *tg = b->targets + (size_t)mb * T;
    for (int t0 = 0; t0 < T; t0 += b->chunk) {
        const int n = MT_MIN(b->chunk, T - t0);
        const void *xc = (const char *)b->xn1 + (size_t)t0 * C * es;
        linear(b, b->logits, MT_GEMM_F32, xc, lm, NULL, n, C, V, 0.0f);
        OK(b, mt_cu_cross_entropy(b->comp, b->logits, tg + t0, n, V, loss_scale, MT_IGNORE_INDEX, b->dt,
                                  want_grad ? b->dlogits : NULL, b->d_loss, NULL, b->red_scratch, NULL),
           "cross-entropy");
        if (want_grad) {
            linear_dx(b, b->dxn + (size_t)t0 * C, MT_GEMM_F32, b->dlogits, lm, n, C, V, 0.0f);
            linear_dw(b, glm, b->dlogits, xc, n, C, V);
        }
    }
    if (want_grad) {
        float *dx = b->dx + (size_t)mb * T * C;
        CU(b, cudaMemsetAsync(dx, 0, (size_t)T * C * 4, b->comp));
        OK(b, mt_cu_rmsnorm_bwd(b->comp, dx, gw[MT_T_FINAL_NORM], b->dxn, b->dt, x, b->dt, w[MT_T_FINAL_NORM],
                                b->rstd1, T, C, b->m->cfg.rms_norm_eps, b->red_scratch, NULL),
           "rmsnorm backward");
    }
}

static void cu_head(mt_be *be, int slot, int mb, float loss_scale, int want_grad)
{
    head_run((cu_be *)be, slot, mb, loss_scale, want_grad, NULL);
}

static void cu_head_logits(mt_be *be, int slot, int mb, float *out) { head_run((cu_be *)be, slot, mb, 0, 0, out); }

// ---- gradients ---------------------------------------------------------------------------------

static void cu_begin_grads(mt_be *be, int unit)
{
    cu_be *b = (cu_be *)be;
    b->gbuf ^= 1; // alternate, so one buffer fills while the other goes to the host
    CU(b, cudaStreamWaitEvent(b->comp, b->grad_sent[b->gbuf], 0));
    CU(b, cudaMemsetAsync(b->acc[b->gbuf], 0, unit_desc(b, unit)->padded * 4, b->comp));
    if (unit == b->L + 1 && b->tied_acc)
        CU(b, cudaMemsetAsync(b->tied_acc, 0, unit_desc(b, 0)->padded * 4, b->comp));
    if (b->ck_host && unit >= 2 && unit <= b->L) { // checkpoint unit-2, for the backward after this one
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

static void cu_send_grads(mt_be *be, int unit)
{
    cu_be *b = (cu_be *)be;
    const mt_unit_desc *u = unit_desc(b, unit);
    const mt_tile *t = &b->m->tiles.tile[unit];
    const float *src = grads_of(b, unit);
    const int i = b->gbuf;
    OK(b, mt_cu_sumsq(b->comp, b->d_sumsq, src, u->padded, b->red_scratch), "sum of squares");
    if (b->dt == MT_CU_BF16) { // rounded on the device, landing in the tile's weight block
        OK(b, mt_cu_convert(b->comp, MT_CU_BF16, b->stage[i], MT_CU_F32, src, u->padded), "convert");
        CU(b, cudaEventRecord(b->grad_ready[i], b->comp));
        CU(b, cudaStreamWaitEvent(b->d2h, b->grad_ready[i], 0));
        const int c = copy_start(b, b->d2h, 1, MT_COPY_GRADIENTS, u->weight_bytes);
        CU(b, cudaMemcpyAsync(mt_tile_weights_bf16(t, u), b->stage[i], u->weight_bytes, cudaMemcpyDeviceToHost,
                              b->d2h));
        copy_end(b, c, b->d2h);
    } else {
        CU(b, cudaEventRecord(b->grad_ready[i], b->comp));
        CU(b, cudaStreamWaitEvent(b->d2h, b->grad_ready[i], 0));
        const int c = copy_start(b, b->d2h, 1, MT_COPY_GRADIENTS, u->grad_bytes);
        CU(b, cudaMemcpyAsync(mt_tile_grad_f32(t, u), src, u->grad_bytes, cudaMemcpyDeviceToHost, b->d2h));
        copy_end(b, c, b->d2h);
    }
    CU(b, cudaEventRecord(b->grad_sent[i], b->d2h));
}

static mt_status cu_sync(mt_be *be, double *loss_sum, double *grad_sumsq, mt_err err)
{
    cu_be *b = (cu_be *)be;
    double v[2] = {0, 0};
    CU(b, cudaMemcpyAsync(&v[0], b->d_loss, 8, cudaMemcpyDeviceToHost, b->comp));
    CU(b, cudaMemcpyAsync(&v[1], b->d_sumsq, 8, cudaMemcpyDeviceToHost, b->comp));
    CU(b, cudaMemsetAsync(b->d_loss, 0, 8, b->comp));
    CU(b, cudaMemsetAsync(b->d_sumsq, 0, 8, b->comp));
    CU(b, cudaStreamSynchronize(b->comp));
    CU(b, cudaStreamSynchronize(b->d2h));
    CU(b, cudaStreamSynchronize(b->h2d));
    b->armed = 0;
    *loss_sum = v[0];
    *grad_sumsq = v[1];
    if (b->failed) {
        b->failed = 0;
        return mt_fail(err, MT_ERR_DEVICE, "CUDA backend: %s", b->why);
    }
    return MT_OK;
}

static const mt_be_ops cu_ops = {
    "CUDA",         cu_destroy,     cu_reserve,       cu_set_tokens, cu_load_weights,  cu_begin_visit,
    cu_end_visit,   cu_forward,     cu_head,          cu_head_logits, cu_backward,     cu_begin_grads,
    cu_send_grads,  cu_sync,        cu_trace_start,   cu_mark_head,  cu_trace_read,
};

extern "C" mt_be *mt_cuda_backend_create(mt_model *m, mt_err err)
{
    if (m->pol.weight_slots > MAX_SLOTS) {
        mt_fail(err, MT_ERR_INVALID_ARGUMENT, "at most %d weight slots", MAX_SLOTS);
        return NULL;
    }
    cu_be *b = (cu_be *)calloc(1, sizeof *b);
    if (!b) {
        mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the CUDA backend");
        return NULL;
    }
    b->base.ops = &cu_ops;
    b->m = m;
    b->K = (int)m->pol.weight_slots;
    b->dt = m->cfg.precision == MT_PRECISION_FP32 ? MT_CU_F32 : MT_CU_BF16;
    b->es = b->dt == MT_CU_BF16 ? 2 : 4;
    char why[256] = "";
    int ok = cudaSetDevice(m->pol.device) == cudaSuccess;
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
        mt_fail(err, MT_ERR_DEVICE, "CUDA backend: %s", why);
        cu_destroy(&b->base);
        return NULL;
    }
    return &b->base;
}
