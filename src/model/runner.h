/* The unit runner: the template calls of one unit visit (the embedding's,
 * a layer's forward, its recompute and backward, the head's), written once
 * for every backend. A backend supplies what it owns: the slot that holds
 * the unit's weights, the checkpoints a visit reads and writes, the hidden
 * state's gradient and the gradient accumulators, the tokens, where kept
 * activations live, and the kernel table; the runner binds the weights by
 * role and calls the family's template, which declares through it what the
 * backend must size (its working buffers and state, its reductions'
 * scratch, what kept activations spare it). So a backend holds no layer
 * code, no family flags and no family's buffers. */
#ifndef MT_MODEL_RUNNER_H
#define MT_MODEL_RUNNER_H

#include "model/template.h"

typedef struct mt_runner {
    const mt_template *tpl;
    const mt_model_config *cfg;
    const mt_layout *layout;
    const mt_kernels *k;
    void *kc;
    mt_dims d;              /* the model's part from mt_dims_init; es, FT and chunk the backend's */
    mt_work_store work;     /* the template's working buffers, where the backend put them */
    float *state;           /* (n_micro, state_elems) f32, the template's state per micro-batch, or NULL */
    uint64_t state_elems;
} mt_runner;

/* One buffer the runner needs from its backend: the backend stores a
 * pointer to elems elements (4 bytes each where f32, else of the activation
 * type) at *where. */
typedef struct mt_runner_buf {
    void **where;
    uint64_t elems;
    int f32;
} mt_runner_buf;

#define MT_RUNNER_MAX_BUFS (MT_WORK_MAX_BUFS + 1)

/* Sets r up for a validated config and its layout, with the backend's
 * kernels, for micro-batches of n_seq sequences of seq_len, n_micro of them
 * in a step; the backend then sets r->d.es, FT and chunk before sizing.
 * MT_ERR_UNSUPPORTED, naming the backend, where the family has no template. */
mt_status mt_runner_init(mt_runner *r, const mt_model_config *cfg, const mt_layout *layout, const mt_kernels *k,
                         void *kc, int n_seq, int seq_len, int n_micro, const char *backend, mt_err err);

/* The buffers to allocate for training (want_grad) or evaluation: the
 * template's work and its state for the step's micro-batches. Returns their
 * number (at most MT_RUNNER_MAX_BUFS). The state must be zero before the
 * first step (mt_runner_state_bytes). */
int mt_runner_buffers(mt_runner *r, int want_grad, mt_runner_buf *out);
uint64_t mt_runner_state_bytes(const mt_runner *r);

/* The scratch bytes the largest of the template's reductions needs of the
 * kernel table (0 where its kernels need none). */
size_t mt_runner_scratch_bytes(const mt_runner *r, int want_grad);

/* What kept activations spare the template's recompute: MT_KEEP_* bits. */
unsigned mt_runner_keeps(const mt_runner *r);

/* A layer unit's activations in the work buffers, nothing kept, with the
 * layer's window and RoPE table; a backend that keeps some points them at
 * its own buffers. */
mt_layer_acts mt_runner_acts(const mt_runner *r, int unit);

/* What one call runs on, from the backend (fields a call does not use are
 * ignored). */
typedef struct mt_unit_io {
    void *slot;                /* the unit's weights, laid out as its tile (act); a tied head's with the
                                * embedding's behind them */
    const void *in;            /* layers and the head: checkpoint unit-1 (act) */
    void *out;                 /* the embedding's and a layer's forward: checkpoint unit (act) */
    const int32_t *tokens;     /* the embedding */
    const int32_t *targets;    /* the head */
    float *dy;                 /* backward and the head in training: the hidden state's gradient (T, C) f32 */
    float *grads;              /* backward and the head in training: the unit's fp32 gradient accumulator */
    float *tied_grads;         /* the embedding's accumulator where the head shares it (embedding backward, head) */
    const mt_layer_acts *acts; /* layers: where their activations live (mt_runner_acts, or the backend's) */
} mt_unit_io;

/* Forward of micro-batch mb through unit (embedding or layer). */
void mt_run_forward(const mt_runner *r, int unit, int mb, const mt_unit_io *io);
/* Backward of mb through unit: a layer's recompute, then its backward. */
void mt_run_backward(const mt_runner *r, int unit, int mb, const mt_unit_io *io);
/* The head on mb: its loss, and with io->grads its gradients. */
void mt_run_head(const mt_runner *r, int mb, const mt_unit_io *io, float loss_scale);
/* The next-token logits at the last position of each sequence of mb: out[n_seq * V] (host). */
void mt_run_head_logits(const mt_runner *r, int mb, const mt_unit_io *io, float *out);

/* The head's tokens per weight-gradient GEMM (mt_dims.dw_rows) for T tokens in logits chunks of chunk
 * tokens: want (a test's count, 0: none) rounded up to whole chunks, else as many whole chunks as keep
 * their (rows, V) dlogits of es-byte elements within max_bytes; at least one chunk, at most T. */
int mt_head_dw_rows(int T, int chunk, uint64_t want, uint64_t V, uint64_t es, uint64_t max_bytes);

/* The tokens of each MLP piece for T tokens of an F-wide MLP of es-byte
 * elements whose (tokens, F) buffers stay within max_bytes: all T, or equal
 * pieces, a multiple of 128 tokens (never fewer than 128). */
uint64_t mt_mlp_piece_tokens(uint64_t T, uint64_t F, uint64_t es, uint64_t max_bytes);

#endif
