/* The private interface between the scheduler (engine.c) and a compute
 * backend (CPU: src/cpu/cpu_backend.c; CUDA: cuda/backend/). Backends run
 * a family's layer template (model/template.h) on their kernels; they own
 * memory and ordering, the template owns the arithmetic. The scheduler decides the order
 * of everything: which unit's weights go into which slot when, which
 * micro-batch runs through which unit, when gradients go back. A backend
 * owns the memory of the computation (weight slots, activation checkpoints,
 * per-micro-batch gradients of the hidden state, gradient accumulators,
 * scratch) and carries out each call, possibly asynchronously: calls are
 * issued in order and a backend must make each one see the effects of the
 * ones before it (on a GPU, by stream order and events). Only sync() and
 * the results it returns wait for the work.
 *
 * Units: 0 the embedding, 1..L the decoder layers, L+1 the head. A micro-
 * batch's hidden state enters unit u as checkpoint u-1 (the embedding's
 * output is checkpoint 0, the head's input is checkpoint L). */
#ifndef MT_BACKEND_H
#define MT_BACKEND_H

#include "core/internal.h"
#include "model/layout.h"
#include "memory/tiler.h"
#include "core/threadpool.h"
#include "engine/timeline.h"

typedef struct mt_be mt_be;

/* How the CUDA backend runs the experts' input and weight gradients (mt_be_request.expert_gemm): its rule
 * by shape, or one path for every product it can take (tests and benchmarks compare them). The forward
 * and the recompute always run the grouped kernel (their row counts exist only on the device then). */
typedef enum mt_expert_gemm {
    MT_EXPERT_GEMM_AUTO = 0,
    MT_EXPERT_GEMM_KERNEL = 1, /* the grouped Hopper kernel, offsets on the device */
    MT_EXPERT_GEMM_LOOP = 2    /* one cuBLASLt GEMM per expert, row counts from the forward's routing on the host */
} mt_expert_gemm;

typedef struct mt_be_shape {
    int n_seq;     /* sequences per micro-batch */
    int seq_len;
    int n_micro;   /* micro-batches held at once (checkpoints for all of them) */
    int want_grad; /* training (grad buffers) or evaluation only */
} mt_be_shape;

/* What a backend is asked to hold: a model (validated config and policy,
 * its layout, the host tiles it reads weights from and sends gradients to,
 * the logger and the worker pool) and a batch shape. A backend sees the
 * model through this alone, never through the model's handle (which only
 * src/engine knows); the pointers live as long as the model. */
typedef struct mt_be_request {
    const mt_model_config *cfg;
    const mt_offload_policy *pol;
    const mt_layout *layout;
    mt_be_shape shape;
    uint64_t gpu_free;         /* the device's free bytes before the backend allocates anything (0: unknown, the
                                * budget is assumed free) */
    int threads;               /* the CPU threads that compute (the CPU backend's scratch is per thread) */
    uint32_t mlp_piece_tokens; /* tests: the MLP's tokens per piece (0: the backend's own rule) */
    uint32_t head_chunk_tokens; /* tests: the head's tokens per logits chunk (0: the backend's own rule) */
    uint32_t head_dw_tokens;    /* tests: the head's tokens per weight-gradient GEMM, rounded up to whole chunks
                                 * (0: the backend's own rule; mt_head_dw_rows) */
    uint32_t keep_layers_cap;  /* tests: at most this many layers keep activations (0: as many as fit) */
    uint32_t host_checkpoints; /* tests: this many activation checkpoints in host memory (0: the backend's rule) */
    uint32_t recomputed_checkpoints; /* tests: this many checkpoints recomputed (mt_ck_recomputed; 0: the backend's
                                      * rule) */
    uint32_t expert_gemm;      /* tests and benchmarks: the experts' backward products on one path (mt_expert_gemm;
                                * 0: the backend's rule by shape) */
    uint64_t host_budget;      /* the host bytes the tiles and the backend's host memory share (0: the policy's
                                * host_budget_bytes, or what the machine has available) */
    int n_ranks;               /* data parallelism: the backend is one of this many ranks (engine/group.c), its shape
                                * one rank's share; 0 or 1: alone */
    /* the model's state and services for a backend that runs (NULL in a request only planned for) */
    const mt_tiles *tiles;     /* the host tiles it reads weights from and sends gradients to */
    const mt_logger *log;
    mt_pool *pool;             /* the CPU threads */
} mt_be_request;

/* A backend's memory for a request, counted by the code that allocates it
 * (so a plan and an allocation cannot disagree). Bytes by tier; the
 * checkpoints are part of whichever tier holds them. */
typedef struct mt_be_needs {
    uint64_t device_bytes;     /* GPU memory, its libraries' workspaces included */
    uint64_t pinned_bytes;     /* page-locked host memory */
    uint64_t host_bytes;       /* ordinary host memory */
    uint64_t checkpoint_bytes; /* the activation checkpoints, wherever they live */
    mt_placement activations;  /* where they live: MT_PLACE_DEVICE or MT_PLACE_HOST */
    int host_checkpoints;      /* how many of the L+1 checkpoints live in host memory */
    int recomputed;            /* how many the backward recomputes instead of keeping (mt_ck_recomputed) */
} mt_be_needs;

/* Checkpoints the backward recomputes. When the checkpoints of a step do
 * not fit the GPU and the host together, a backend keeps n fewer: the
 * outputs of layers L-1, L-3, .., L-2n+1 (never two neighbours, so each is
 * one layer away from a kept one). The forward writes each of them into one
 * spare row that the next layer reads; the backward, before layer idx+1's,
 * visits layer idx again and runs its forward from checkpoint idx-1 into
 * that row (phase MT_PHASE_BACKWARD, the ops' forward). One more layer
 * forward and one more weight load for each. 0 <= n <= L/2. */
static inline int mt_ck_recomputed(int L, int n, int idx)
{
    return idx <= L - 1 && idx >= L - 2 * n + 1 && (L - 1 - idx) % 2 == 0;
}

/* The rows that hold the L+1 checkpoints with n recomputed: one each for
 * the kept ones, in order, and the spare behind them. */
static inline int mt_ck_rows(int L, int n) { return L + 1 - n + (n > 0); }

/* The row of checkpoint idx among mt_ck_rows(L, n). */
static inline int mt_ck_row(int L, int n, int idx)
{
    if (mt_ck_recomputed(L, n, idx)) return L + 1 - n; /* the spare */
    int below = 0;
    for (int j = 0; j < n; j++) below += L - 1 - 2 * j < idx;
    return idx - below;
}

/* Data parallelism (engine/group.c): each of G ranks holds the largest
 * share of a step's M micro-batches. */
static inline int mt_rank_share(int M, int G) { return G <= 1 ? M : (M + G - 1) / G; }

/* G ranks reduce a unit's n gradient
 * elements in G equal slices of mt_grad_slice(n, G) elements (a multiple of
 * 64: 256-byte aligned in fp32), rank r's slice [r s, r s + s) cut at n; the
 * accumulators hold mt_grad_acc_elems(n, G), all G slices. Alone (G <= 1)
 * the one slice is the whole unit. */
static inline uint64_t mt_grad_slice(uint64_t n, int G)
{
    return G <= 1 ? n : (n + (uint64_t)G * 64 - 1) / ((uint64_t)G * 64) * 64;
}
/* The same for fetching a unit's weights in slices (mt_be.fetch_slices):
 * n of them (bytes of the host block on a GPU, elements of the slot on the
 * CPU) in G slices of mt_fetch_slice(n, G), a multiple of 256 (a lean weight
 * block on the CPU, 256-byte aligned on a GPU); rank r fetches [*lo, *hi),
 * cut at n; a buffer that all G slices land in holds mt_fetch_span(n, G). */
static inline uint64_t mt_fetch_slice(uint64_t n, int G)
{
    return G <= 1 ? n : (n + (uint64_t)G * 256 - 1) / ((uint64_t)G * 256) * 256;
}
static inline uint64_t mt_fetch_span(uint64_t n, int G) { return G <= 1 ? n : mt_fetch_slice(n, G) * (uint64_t)G; }
static inline void mt_fetch_slice_of(uint64_t n, int r, int G, uint64_t *lo, uint64_t *hi)
{
    const uint64_t s = mt_fetch_slice(n, G);
    *lo = MT_MIN((uint64_t)(G <= 1 ? 0 : r) * s, n);
    *hi = MT_MIN(*lo + s, n);
}
static inline uint64_t mt_grad_acc_elems(uint64_t n, int G) { return G <= 1 ? n : mt_grad_slice(n, G) * (uint64_t)G; }
/* Rank r's slice of n elements among G: [*lo, *hi), empty when lo >= n. */
static inline void mt_grad_slice_of(uint64_t n, int r, int G, uint64_t *lo, uint64_t *hi)
{
    const uint64_t s = mt_grad_slice(n, G);
    *lo = MT_MIN((uint64_t)(G <= 1 ? 0 : r) * s, n);
    *hi = MT_MIN(*lo + s, n);
}

/* A kind of backend: what it needs, and making one. */
typedef struct mt_be_class {
    const char *name;
    /* Fills *n for r; MT_ERR_GPU_BUDGET (and the like) when it cannot fit,
     * with *n filled as far as it could be. */
    mt_status (*needs)(const mt_be_request *r, mt_be_needs *n, mt_err err);
    /* A backend for the model of r (its shape unused) on device (a CUDA
     * device index; the CPU ignores it), nothing reserved yet. */
    mt_status (*create)(const mt_be_request *r, int device, mt_be **out, mt_err err);
    /* Makes ranks[0..n) (each from create, one per device, in rank order) one
     * data-parallel group: sets their rank and n_ranks, and builds what
     * reduce_grads needs (on CUDA, NCCL communicators). NULL where the class
     * has no groups. */
    mt_status (*join)(mt_be *const *ranks, int n, mt_err err);
    /* The group's reduction of unit's gradients, issued once for all ranks
     * after each one's last backward of the unit and before their
     * send_grads: rank r's accumulator then holds, in its slice, the sum of
     * every rank's. */
    void (*reduce_grads)(mt_be *const *ranks, int n, int unit);
    /* Completes a load in slices (mt_be.fetch_slices), issued once for all
     * ranks after each one's load_weights of unit into slot, which copied
     * only its slice from the host: every rank's slot then holds the whole
     * unit (on CUDA, NCCL's all-gather on the copy streams) before a visit
     * reads it. NULL where the class cannot (the group then fetches whole). */
    void (*gather_weights)(mt_be *const *ranks, int n, int slot, int unit);
} mt_be_class;

/* The class of a resolved backend kind; NULL, with the reason in err
 * (MT_ERR_UNSUPPORTED), when this library was built without it. */
const mt_be_class *mt_be_class_of(mt_backend kind, mt_err err);

typedef struct mt_be_ops {
    const char *name;
    void (*destroy)(mt_be *be);
    /* Allocates what request r needs (what needs() counts for it: r's shape
     * is this backend's share of a step, r->n_ranks its group's size) and
     * records it in held; the previous allocation, if any, is released first.
     * r is the create()'s model's. */
    mt_status (*reserve)(mt_be *be, const mt_be_request *r, mt_err err);
    /* Frees what reserve() allocated (once the work issued is done). */
    void (*release)(mt_be *be);
    /* The step's inputs: tokens and targets of micro-batch mb (n_seq * seq_len
     * each; targets may be NULL), and the tokens' positions in their
     * documents (validated: mt_batch.positions), or NULL for one document
     * a sequence. */
    void (*set_tokens)(mt_be *be, int mb, const int32_t *tokens, const int32_t *targets, const int32_t *positions);
    /* Copies unit's weights from its host tile (the bf16 block, or the fp32
     * master in fp32 mode) into slot, after the slot's previous user released it.
     * With fetch_slices, only the rank's slice (mt_fetch_slice_of), which the
     * class's gather_weights completes. */
    void (*load_weights)(mt_be *be, int slot, int unit);
    /* A visit of unit in phase (mt_phase) begins: its compute waits for the
     * weights in slot (-1: none) and for the checkpoints it reads. */
    void (*begin_visit)(mt_be *be, int slot, int unit, int phase);
    /* The visit's compute is issued: the slot (-1: none) is free for the
     * next load once that compute is done. */
    void (*end_visit)(mt_be *be, int slot);
    /* Forward of micro-batch mb through unit (embedding or layer): reads
     * checkpoint unit-1 (or the tokens), writes checkpoint unit. */
    void (*forward)(mt_be *be, int slot, int unit, int mb);
    /* The head on micro-batch mb: adds the cross-entropy sum (scaled by
     * loss_scale for the gradients) to the step's loss, and with grads the
     * gradient of the hidden state into the micro-batch's grad buffer and the
     * head's weight gradients into the accumulator. */
    void (*head)(mt_be *be, int slot, int mb, float loss_scale, int want_grad);
    /* Next-token logits at the last position of each sequence of mb: out[n_seq * V] (host). */
    void (*head_logits)(mt_be *be, int slot, int mb, float *out);
    /* Backward of micro-batch mb through unit: recompute the forward from
     * checkpoint unit-1, take the grad buffer as the output gradient and leave
     * the input gradient in it; weight gradients add into the accumulator. */
    void (*backward)(mt_be *be, int slot, int unit, int mb);
    /* Zero the gradient accumulator before unit's first micro-batch. */
    void (*begin_grads)(mt_be *be, int unit);
    /* After unit's last micro-batch (and, in a group, reduce_grads): add
     * the squared norm of the backend's slice of the accumulator
     * (mt_grad_slice_of; alone, all of it) to the step's total and copy
     * that slice into the unit's host tile. */
    void (*send_grads)(mt_be *be, int unit);
    /* Waits for all work issued. Returns the step's loss sum and squared
     * gradient norm, and resets both for the next step. */
    mt_status (*sync)(mt_be *be, double *loss_sum, double *grad_sumsq, mt_err err);
    /* Timing, NULL where a backend keeps none. trace_start at the start of a
     * step, with nothing running: the origin is now; t->level MARKS asks for
     * mark_head alone, FULL also for every visit and copy, which the backend
     * appends to t as it issues them, with their device times filled in by
     * trace_read after sync(). Nonzero when the events cannot be had. */
    int (*trace_start)(mt_be *be, mt_trace *t);
    void (*mark_head)(mt_be *be);
    int (*trace_read)(mt_be *be);
} mt_be_ops;

struct mt_be {
    const mt_be_ops *ops;
    mt_be_needs held;      /* what the last reserve() allocated, by the same count as needs() */
    uint64_t device_fixed; /* device bytes held from create() on, outside any reservation */
    int rank, n_ranks;     /* in a data-parallel group (join); 0 and 1 alone */
    int fetch_slices;      /* in a group: load_weights fetches the rank's slice, gather_weights the rest */
};

/* A data-parallel group of n backends of class cls over one model
 * (engine/group.c): a backend itself, which divides each step's
 * micro-batches among its ranks and reduces their gradients. devices: one
 * per rank (-1: no device to make current, the CPU); fetch: how the ranks
 * receive a unit's weights (MT_FETCH_SLICES: in slices that gather_weights
 * completes; otherwise whole). Takes the ranks, which it destroys with
 * itself (also on failure). */
mt_status mt_group_create(const mt_be_class *cls, mt_be **ranks, const int *devices, int n, mt_weight_fetch fetch,
                          mt_be **out, mt_err err);

extern const mt_be_class mt_cpu_be_class;
#ifdef MT_HAVE_CUDA
extern const mt_be_class mt_cuda_be_class;
#endif

#endif
