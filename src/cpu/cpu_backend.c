/* The CPU backend: the family's layer template (model/template.h) run on
 * kernels of cpu_ops.c, in fp32 on the model's thread pool. Weight "slots"
 * are fp32 buffers that the bf16 (or fp32) weights of a unit are copied
 * into, so the scheduler drives the same path as on a GPU; it is the
 * reference the CUDA backend is checked against.
 *
 * Every call runs when issued: there are no streams to order and nothing to
 * wait for, and the kernels cannot fail once reserve() has allocated. */
#include "engine/backend.h"
#include "model/runner.h"
#include "model/rope.h"
#include "optim/adamw.h"
#include "optim/q16.h"
#include "cpu/cpu_ops.h"
#include "cpu/cpu_moe.h"

#include <stdlib.h>
#include <string.h>

/* Logits of the head are computed for this many tokens at a time. */
#define HEAD_CHUNK 256

typedef struct cpu_be {
    mt_be base;
    mt_be_request req;    /* the model (its tiles NULL in a backend that only counts) and the shape reserved */
    mt_pool *pool;
    mt_runner run;        /* the template's calls, dims and working buffers */
    int L;
    size_t slot_elems;
    float *slots[MT_MAX_WEIGHT_SLOTS];
    float *acc;                /* (largest unit) fp32 gradient accumulator */
    float *tied_acc;           /* (V, C) embedding gradients when the head shares them */
    float *ck;                 /* (L+1, n_micro, T, C) checkpoints: the output of units 0..L; with rc of them
                                * recomputed (tests only), L+2-rc rows, the last the spare (ck_at) */
    int rc;                    /* checkpoints the backward recomputes (engine/backend.h: mt_ck_recomputed) */
    float *dx;                 /* (n_micro, T, C) gradient of the hidden state */
    int32_t *tokens, *targets; /* (n_micro, T) */
    int32_t *pos;              /* (n_micro, T) position of each token in its document */
    int32_t *doc_start;        /* (n_micro, T) the first key of each token (mt_doc_layout) */
    int32_t *docs;             /* (n_micro) the micro-batch packs documents */
    int32_t *win_start;        /* (n_micro, T) with a sliding window: each token's first key (mt_window_starts) */
    int mb;                    /* the micro-batch the kernels run on */
    int32_t *rope_long;        /* (n_micro) the micro-batch rotates by the long table (mt_rope_uses_long) */
    float *inv_freq[MT_ROPE_TABLES]; /* (rotary dims / 2) each, NULL where mt_rope_has_table says none */
    float rope_scale[MT_ROPE_TABLES];
    void *ws;                  /* the ops' per-thread workspace */
    double loss_sum, sumsq;
} cpu_be;

/* ---- kernels ---------------------------------------------------------------------- */

static mt_pool *P(void *kc) { return ((cpu_be *)kc)->pool; }
static void *WS(void *kc) { return ((cpu_be *)kc)->ws; }

static void k_rmsnorm(void *kc, void *y, float *rstd, const void *x, const void *w, int T, int C, float eps,
                      float woff)
{
    mt_cpu_rmsnorm(P(kc), y, rstd, x, w, T, C, eps, woff);
}

static void k_rmsnorm_bwd(void *kc, float *dx, float *dw, const float *dy, const void *x, const void *w,
                          const float *rstd, int T, int C, float eps, float woff)
{
    mt_cpu_rmsnorm_bwd(P(kc), dx, dw, dy, x, w, rstd, T, C, eps, woff);
}

static void k_linear(void *kc, void *y, int out_f32, const void *x, const void *W, const void *bias, int M, int K, int N,
                     int accumulate)
{
    (void)out_f32; /* every buffer is fp32 here */
    mt_cpu_matmul(P(kc), WS(kc), y, x, W, bias, M, K, N, accumulate);
}

static void k_linear_dx(void *kc, void *dx, int out_f32, const void *dy, const void *W, int M, int K, int N,
                        int accumulate)
{
    (void)out_f32;
    mt_cpu_matmul_bwd(P(kc), WS(kc), dx, NULL, NULL, dy, NULL, W, M, K, N, accumulate);
}

static void k_linear_dw(void *kc, float *dW, float *db, const void *dy, const void *x, int M, int K, int N)
{
    mt_cpu_matmul_bwd(P(kc), WS(kc), NULL, dW, db, dy, x, NULL, M, K, N, 0);
}

static void k_rope(void *kc, void *x, int T, int nh, int D, int inverse, int local)
{
    cpu_be *b = kc;
    const mt_rope_table t = local ? MT_ROPE_LOCAL : b->rope_long[b->mb] ? MT_ROPE_LONG : MT_ROPE_GLOBAL;
    const mt_model_config *c = b->req.cfg;
    mt_cpu_rope_at(b->pool, x, b->pos + (size_t)b->mb * b->run.d.T, b->inv_freq[t], T, nh, D,
                   (int)mt_config_rotary_offset(c), (int)mt_config_rotary_dims(c), mt_config_rope_interleaved(c),
                   b->rope_scale[t], inverse);
}

/* The first key of each query of the current micro-batch: its window's in a sliding layer, its
 * document's where it packs documents, else NULL (the sequence's first) */
static const int32_t *key_starts(const cpu_be *b, int window)
{
    const size_t off = (size_t)b->mb * b->run.d.T;
    return window ? b->win_start + off : b->docs[b->mb] ? b->doc_start + off : NULL;
}

static void k_attention(void *kc, void *out, float *lse, const void *q, const void *k, const void *v, int n_seq,
                        int seq_len, int H, int Hkv, int D, float scale, int window, float softcap)
{
    cpu_be *b = kc;
    mt_cpu_attention_docs(b->pool, b->ws, out, lse, q, k, v, key_starts(b, window), n_seq, seq_len, H, Hkv, D, scale,
                          softcap);
}

static void k_attention_bwd(void *kc, void *dq, void *dk, void *dv, const void *dout, const void *out,
                            const float *lse, const void *q, const void *k, const void *v, int n_seq, int seq_len,
                            int H, int Hkv, int D, float scale, int window, float softcap)
{
    cpu_be *b = kc;
    mt_cpu_attention_bwd_docs(b->pool, b->ws, dq, dk, dv, dout, out, lse, q, k, v, key_starts(b, window), n_seq,
                              seq_len, H, Hkv, D, scale, softcap);
}

static void k_attn_sink(void *kc, void *out, float *lse, const void *sinks, int n_seq, int seq_len, int H, int D)
{
    (void)kc;
    mt_cpu_attn_sink(out, lse, sinks, n_seq, seq_len, H, D);
}

static void k_attn_sink_bwd(void *kc, float *dsink, const void *dout, const void *out, const float *lse,
                            const void *sinks, int n_seq, int seq_len, int H, int D)
{
    (void)kc;
    mt_cpu_attn_sink_bwd(dsink, dout, out, lse, sinks, n_seq, seq_len, H, D);
}

static void k_attn_temperature(void *kc, void *x, int T, int seq_len, int n, float floor_scale, float scale)
{
    mt_cpu_attn_temperature(P(kc), x, T, seq_len, n, floor_scale, scale);
}

static void k_glu(void *kc, void *out, const void *gate, const void *up, size_t n, int act)
{
    mt_cpu_glu(P(kc), act, out, gate, up, n);
}

static void k_glu_bwd(void *kc, void *dgate, void *dup, const void *dout, const void *gate, const void *up, size_t n,
                      int act)
{
    mt_cpu_glu_bwd(P(kc), act, dgate, dup, dout, gate, up, n);
}

static void k_copy(void *kc, void *dst, const void *src, size_t n)
{
    (void)kc;
    memcpy(dst, src, n * sizeof(float));
}

static void k_last_rows(void *kc, void *rows, const void *src, int n, int stride, int C)
{
    (void)kc;
    for (int i = 0; i < n; i++)
        memcpy((float *)rows + (size_t)i * C, (const float *)src + ((size_t)(i + 1) * stride - 1) * C,
               (size_t)C * sizeof(float));
}

static void k_copy_cols(void *kc, void *dst, int dld, int doff, const void *src, int sld, int soff, int rows, int w,
                        int rep)
{
    mt_cpu_copy_cols(P(kc), dst, dld, doff, src, sld, soff, rows, w, rep);
}

static void k_sum_cols(void *kc, void *dst, int dld, int doff, const void *src, int sld, int soff, int rows, int w,
                       int n)
{
    mt_cpu_sum_cols(P(kc), dst, dld, doff, src, sld, soff, rows, w, n);
}

static const void *k_as_act(void *kc, void *scratch, const float *src, size_t n)
{
    (void)kc, (void)scratch, (void)n;
    return src; /* fp32 already */
}

static const float *k_as_f32(void *kc, float *scratch, const void *src, size_t n)
{
    (void)kc, (void)scratch, (void)n;
    return src; /* fp32 already */
}

static void k_zero(void *kc, void *p, size_t bytes)
{
    (void)kc;
    memset(p, 0, bytes);
}

static void k_embedding(void *kc, void *out, const int32_t *tokens, const void *wte, int T, int C, int V, float scale)
{
    (void)V;
    mt_cpu_embedding(P(kc), out, tokens, wte, T, C, scale);
}

static void k_embedding_bwd(void *kc, float *dwte, const int32_t *tokens, const float *dout, int T, int C, int V,
                            float scale, int pad)
{
    mt_cpu_embedding_bwd(P(kc), dwte, tokens, dout, T, C, V, scale, pad);
}

static void k_cross_entropy(void *kc, void *dlogits, float *logits, const int32_t *targets, int n, int V, float dscale,
                            float softcap)
{
    cpu_be *b = kc;
    /* in place: logits become the gradient */
    b->loss_sum += mt_cpu_cross_entropy(b->pool, logits, targets, n, V, dscale, softcap, MT_IGNORE_INDEX, NULL);
    if (dlogits) memcpy(dlogits, logits, (size_t)n * V * sizeof(float));
}

static void k_softcap(void *kc, float *x, size_t n, float cap)
{
    (void)kc;
    mt_cpu_softcap(x, n, cap);
}

static void k_add(void *kc, void *dst, const void *a, const void *b, size_t n)
{
    mt_cpu_add(P(kc), dst, a, b, n);
}

static void k_to_host(void *kc, float *dst, const float *src, size_t n)
{
    (void)kc;
    memcpy(dst, src, n * sizeof(float));
}

/* ---- mixture of experts (cpu_moe.c) ---- */

static void k_moe_route(void *kc, float *probs, float *topw, int32_t *topi, int32_t *rows, int32_t *slot_row,
                        int32_t *offs_buf, float *stats, const float *logits, int T, int E, int k, const mt_route *rt)
{
    (void)kc; /* offs_buf is host memory here; rt->bias is fp32, as every weight slot */
    mt_cpu_moe_route(probs, topw, topi, rows, slot_row, offs_buf, stats, logits, T, E, k, rt);
}

static void k_moe_route_bwd(void *kc, float *dlogits, const float *dw, const float *probs, const float *topw,
                            const int32_t *topi, const float *stats, int L, float aux, int T, int E, int k,
                            const mt_route *rt)
{
    (void)kc;
    mt_cpu_moe_route_bwd(dlogits, dw, probs, topw, topi, stats, L, aux, T, E, k, rt);
}

static void k_moe_gather(void *kc, void *dst, const void *src, const int32_t *rows, int R, int k, int C)
{
    (void)kc;
    mt_cpu_moe_gather(dst, src, rows, R, k, C);
}

static void k_moe_combine(void *kc, void *out, int out_f32, const void *src, int src_f32, const float *w,
                          const int32_t *slot_row, int T, int k, int C)
{
    (void)kc, (void)out_f32, (void)src_f32; /* every buffer is fp32 here */
    mt_cpu_moe_combine(out, src, w, slot_row, T, k, C);
}

static void k_moe_dot_scale(void *kc, float *dw, void *x, void *y, const float *w, const int32_t *rows, int R, int n)
{
    (void)kc;
    mt_cpu_moe_dot_scale(dw, x, y, w, rows, R, n);
}

static void k_moe_shared_gate(void *kc, void *out, const void *src, const float *z, int T, int C)
{
    (void)kc;
    mt_cpu_moe_shared_gate(out, src, z, T, C);
}

static void k_moe_shared_gate_bwd(void *kc, float *dz, void *x, void *y, const float *z, int T, int n)
{
    (void)kc;
    mt_cpu_moe_shared_gate_bwd(dz, x, y, z, T, n);
}

static void k_moe_aux_loss(void *kc, const float *stats, int L, int E, double scale)
{
    ((cpu_be *)kc)->loss_sum += scale * mt_cpu_moe_aux_sum(stats, L, E);
}

/* The experts' GEMMs: each expert's block through the calls k_linear, k_linear_dx and k_linear_dw make
 * (mt_cpu_matmul, mt_cpu_matmul_bwd), so the bits are those of a loop over the experts calling them */
static void k_moe_linear(void *kc, void *y, int out_f32, const void *x, const void *W, const void *bias,
                         const int32_t *offs, int E, int R, int K, int N, int accumulate)
{
    (void)out_f32; /* every buffer is fp32 here */
    mt_cpu_moe_linear(P(kc), WS(kc), y, x, W, bias, offs, E, R, K, N, accumulate);
}

static void k_moe_linear_dx(void *kc, void *dx, int out_f32, const void *dy, const void *W, const int32_t *offs,
                            int E, int R, int K, int N, int accumulate)
{
    (void)out_f32;
    mt_cpu_moe_linear_dx(P(kc), WS(kc), dx, dy, W, offs, E, R, K, N, accumulate);
}

static void k_moe_linear_dw(void *kc, float *dW, float *db, const void *dy, const void *x, const int32_t *offs, int E,
                            int R, int K, int N)
{
    mt_cpu_moe_linear_dw(P(kc), WS(kc), dW, db, dy, x, offs, E, R, K, N);
}

static const mt_kernels cpu_kernels = {
    .rmsnorm = k_rmsnorm,
    .rmsnorm_bwd = k_rmsnorm_bwd,
    .linear = k_linear,
    .linear_dx = k_linear_dx,
    .linear_dw = k_linear_dw,
    .rope = k_rope,
    .copy_cols = k_copy_cols,
    .sum_cols = k_sum_cols,
    .attention = k_attention,
    .attention_bwd = k_attention_bwd,
    .attn_sink = k_attn_sink,
    .attn_sink_bwd = k_attn_sink_bwd,
    .attn_temperature = k_attn_temperature,
    .glu = k_glu,
    .glu_bwd = k_glu_bwd,
    .copy = k_copy,
    .last_rows = k_last_rows,
    .as_act = k_as_act,
    .as_f32 = k_as_f32,
    .zero = k_zero,
    .embedding = k_embedding,
    .embedding_bwd = k_embedding_bwd,
    .cross_entropy = k_cross_entropy,
    .softcap = k_softcap,
    .add = k_add,
    .to_host = k_to_host,
    .moe_route = k_moe_route,
    .moe_route_bwd = k_moe_route_bwd,
    .moe_gather = k_moe_gather,
    .moe_combine = k_moe_combine,
    .moe_dot_scale = k_moe_dot_scale,
    .moe_shared_gate = k_moe_shared_gate,
    .moe_shared_gate_bwd = k_moe_shared_gate_bwd,
    .moe_aux_loss = k_moe_aux_loss,
    .moe_linear = k_moe_linear,
    .moe_linear_dx = k_moe_linear_dx,
    .moe_linear_dw = k_moe_linear_dw,
};

/* ---- memory -------------------------------------------------------------------------- */

/* Every buffer reserve() allocates, with its bytes: counting (needs) and
 * allocating (reserve) walk this one list. */
typedef struct buf_list {
    void **where[64 + MT_WORK_MAX_BUFS];
    size_t bytes[64 + MT_WORK_MAX_BUFS];
    int n;
    uint64_t checkpoint_bytes;
    int recomputed;
} buf_list;

static void add(buf_list *l, void *where, size_t bytes)
{
    l->where[l->n] = where;
    l->bytes[l->n++] = MT_MAX(bytes, (size_t)1);
}

/* The sizes of b->req's micro-batch: the template's through the runner, and the CPU's choices. */
static mt_status set_dims(cpu_be *b, mt_err err)
{
    const mt_be_shape *s = &b->req.shape;
    mt_status st = mt_runner_init(&b->run, b->req.cfg, b->req.layout, &cpu_kernels, b, s->n_seq, s->seq_len,
                                  s->n_micro, "CPU", err);
    if (st) return st;
    mt_dims *d = &b->run.d;
    d->es = sizeof(float);
    d->FT = d->T; /* the whole MLP at once */
    d->chunk = MT_MIN(d->T, b->req.head_chunk_tokens ? (int)b->req.head_chunk_tokens : HEAD_CHUNK);
    /* one weight-gradient GEMM per chunk unless a test asks: on the CPU the (V, C) gradient's traffic is
     * small beside the GEMM's arithmetic */
    d->dw_rows = mt_head_dw_rows(d->T, d->chunk, b->req.head_dw_tokens, (uint64_t)d->V, d->es, 0);
    b->L = (int)b->req.cfg->num_hidden_layers;
    /* the CPU backend keeps every checkpoint unless a test asks */
    b->rc = s->want_grad ? (int)MT_MIN(b->req.recomputed_checkpoints, (uint32_t)b->L / 2) : 0;
    return MT_OK;
}

static void list_buffers(cpu_be *b, buf_list *l)
{
    const mt_layout *lo = b->req.layout;
    const mt_be_shape *s = &b->req.shape;
    const mt_dims *d = &b->run.d;
    const size_t T = (size_t)d->T, C = (size_t)d->C, M = (size_t)s->n_micro, f = sizeof(float);
    const int tied = b->req.cfg->tie_word_embeddings != 0;
    const mt_unit_desc *embed = &lo->units[0], *head = &lo->units[b->L + 1];
    l->n = 0;
    b->slot_elems = lo->largest_unit_padded;
    if (tied) b->slot_elems = MT_MAX(b->slot_elems, head->padded + embed->padded);
    for (uint32_t i = 0; i < b->req.pol->weight_slots; i++) add(l, &b->slots[i], b->slot_elems * f);
    /* in a group, room for every rank's slice (backend.h) */
    add(l, &b->acc, mt_grad_acc_elems(lo->largest_unit_padded, b->req.n_ranks) * f);
    if (tied) add(l, &b->tied_acc, mt_grad_acc_elems(embed->padded, b->req.n_ranks) * f);
    l->checkpoint_bytes = (size_t)mt_ck_rows(b->L, b->rc) * M * T * C * f;
    l->recomputed = b->rc;
    add(l, &b->ck, l->checkpoint_bytes);
    if (s->want_grad) add(l, &b->dx, M * T * C * f);
    add(l, &b->tokens, M * T * sizeof(int32_t));
    add(l, &b->targets, M * T * sizeof(int32_t));
    add(l, &b->pos, M * T * sizeof(int32_t));
    add(l, &b->doc_start, M * T * sizeof(int32_t));
    add(l, &b->docs, M * sizeof(int32_t));
    if (d->window) add(l, &b->win_start, M * T * sizeof(int32_t));
    add(l, &b->rope_long, M * sizeof(int32_t));
    for (int t = 0; t < MT_ROPE_TABLES; t++)
        if (mt_rope_has_table(b->req.cfg, (mt_rope_table)t)) add(l, &b->inv_freq[t], (size_t)d->D / 2 * f);
    add(l, &b->ws, mt_cpu_ws_size(b->req.threads, s->seq_len));
    mt_runner_buf rb[MT_RUNNER_MAX_BUFS];
    const int n = mt_runner_buffers(&b->run, s->want_grad, rb);
    for (int i = 0; i < n; i++) add(l, rb[i].where, (size_t)rb[i].elems * f);
}

static void free_buffers(cpu_be *b)
{
    buf_list l;
    list_buffers(b, &l);
    for (int i = 0; i < l.n; i++) {
        free(*l.where[i]);
        *l.where[i] = NULL;
    }
    memset(&b->base.held, 0, sizeof b->base.held);
}

static void count(const buf_list *l, mt_be_needs *n)
{
    memset(n, 0, sizeof *n);
    for (int i = 0; i < l->n; i++) n->host_bytes += l->bytes[i];
    n->checkpoint_bytes = l->checkpoint_bytes;
    n->activations = MT_PLACE_HOST;
    n->recomputed = l->recomputed;
}

static mt_status cpu_needs(const mt_be_request *r, mt_be_needs *n, mt_err err)
{
    cpu_be b;
    memset(&b, 0, sizeof b);
    b.req = *r;
    mt_status st = set_dims(&b, err);
    if (st) return st;
    buf_list l;
    list_buffers(&b, &l);
    count(&l, n);
    return MT_OK;
}

/* ---- the backend --------------------------------------------------------------------- */

static void cpu_destroy(mt_be *be)
{
    cpu_be *b = (cpu_be *)be;
    if (b->run.tpl) free_buffers(b);
    free(b);
}

static void cpu_release(mt_be *be)
{
    cpu_be *b = (cpu_be *)be;
    if (b->run.tpl) free_buffers(b);
}

static mt_status cpu_reserve(mt_be *be, const mt_be_request *r, mt_err err)
{
    cpu_be *b = (cpu_be *)be;
    const mt_be_shape *s = &r->shape;
    cpu_release(be);
    b->req = *r;
    mt_status st = set_dims(b, err);
    if (st) return st;
    buf_list l;
    list_buffers(b, &l);
    for (int i = 0; i < l.n; i++)
        if (!(*l.where[i] = malloc(l.bytes[i]))) {
            free_buffers(b);
            char b1[32];
            mt_be_needs n;
            count(&l, &n);
            return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the CPU backend's %s",
                           mt_fmt_bytes(b1, sizeof b1, n.host_bytes));
        }
    count(&l, &b->base.held);
    for (int mb = 0; mb < s->n_micro; mb++) {
        const size_t off = (size_t)mb * b->run.d.T;
        b->docs[mb] = mt_doc_layout(b->pos + off, b->doc_start + off, NULL, s->n_seq, s->seq_len);
        if (b->run.d.window) mt_window_starts(b->win_start + off, b->doc_start + off, s->n_seq, s->seq_len, b->run.d.window);
    }
    for (int t = 0; t < MT_ROPE_TABLES; t++) {
        if (b->inv_freq[t]) mt_rope_inv_freq_of(b->inv_freq[t], b->req.cfg, (mt_rope_table)t);
        b->rope_scale[t] = mt_rope_attention_factor(b->req.cfg, (mt_rope_table)t);
    }
    for (int mb = 0; mb < s->n_micro; mb++) b->rope_long[mb] = mt_rope_uses_long(b->req.cfg, s->seq_len - 1);
    if (b->run.state) memset(b->run.state, 0, mt_runner_state_bytes(&b->run));
    b->loss_sum = b->sumsq = 0;
    return MT_OK;
}

static void cpu_set_tokens(mt_be *be, int mb, const int32_t *tokens, const int32_t *targets, const int32_t *positions)
{
    cpu_be *b = (cpu_be *)be;
    const size_t T = (size_t)b->run.d.T;
    memcpy(b->tokens + (size_t)mb * T, tokens, T * sizeof *tokens);
    if (targets) memcpy(b->targets + (size_t)mb * T, targets, T * sizeof *targets);
    /* without documents the positions are as reserve() left them, unless the last batch packed some */
    if (positions || b->docs[mb]) {
        b->docs[mb] = mt_doc_layout(b->pos + mb * T, b->doc_start + mb * T, positions, b->run.d.n_seq, b->run.d.seq_len);
        if (b->run.d.window)
            mt_window_starts(b->win_start + mb * T, b->doc_start + mb * T, b->run.d.n_seq, b->run.d.seq_len, b->run.d.window);
    }
    b->rope_long[mb] = mt_rope_uses_long(b->req.cfg, mt_max_position(b->pos + mb * T, T));
}

static const mt_unit_desc *unit_desc(cpu_be *b, int unit) { return &b->req.layout->units[unit]; }

/* Elements [lo, hi) of a unit's weights in fp32, to dst[lo, hi): from the
 * tile's bf16 block, in lean mode the bf16 values of its codes (what the GPU
 * computes with; lo a multiple of the codes' block), or in fp32 mode from
 * the master. */
static void copy_unit(cpu_be *b, float *dst, int unit, uint64_t lo, uint64_t hi)
{
    const mt_unit_desc *u = unit_desc(b, unit);
    const mt_tile *t = &b->req.tiles->tile[unit];
    const uint16_t *w = mt_tile_weights_bf16(t, u);
    if (lo >= hi) return;
    if (u->lean) mt_q16_blocks_to_f32(mt_tile_wq(t, u) + lo, mt_tile_sw(t, u) + lo / MT_Q16_BLOCK, hi - lo, dst + lo);
    else if (w) mt_cpu_convert(b->pool, dst + lo, 0, w + lo, 1, hi - lo);
    else mt_cpu_convert(b->pool, dst + lo, 0, mt_tile_master(t, u) + lo, 0, hi - lo);
}

/* The elements a slot holds for unit: its own, and for a tied head the
 * embedding matrix behind them, which the head also reads. */
static uint64_t slot_span(cpu_be *b, int unit)
{
    const int tied_head = unit == b->L + 1 && b->req.cfg->tie_word_embeddings;
    return unit_desc(b, unit)->padded + (tied_head ? unit_desc(b, 0)->padded : 0);
}

/* The whole unit, or with fetch_slices the rank's slice of its slot_span
 * (cpu_gather_weights copies in the others'). */
static void cpu_load_weights(mt_be *be, int slot, int unit)
{
    cpu_be *b = (cpu_be *)be;
    const uint64_t n = unit_desc(b, unit)->padded, all = slot_span(b, unit);
    uint64_t lo = 0, hi = all;
    if (be->fetch_slices) mt_fetch_slice_of(all, be->rank, be->n_ranks, &lo, &hi);
    copy_unit(b, b->slots[slot], unit, MT_MIN(lo, n), MT_MIN(hi, n));
    if (all > n) /* the embedding behind the head's own */
        copy_unit(b, b->slots[slot] + n, 0, MT_MAX(lo, n) - n, MT_MAX(hi, n) - n);
}

/* Work runs when issued: there is nothing to wait for or release. */
static void cpu_begin_visit(mt_be *be, int slot, int unit, int phase) { (void)be, (void)slot, (void)unit, (void)phase; }
static void cpu_end_visit(mt_be *be, int slot) { (void)be, (void)slot; }

/* Checkpoint idx: its own row, or the spare where the backward recomputes it. */
static float *ck_at(cpu_be *b, int idx, int mb)
{
    const int row = mt_ck_row(b->L, b->rc, idx);
    return b->ck + ((size_t)row * (size_t)b->req.shape.n_micro + (size_t)mb) * (size_t)b->run.d.T * (size_t)b->run.d.C;
}

static float *dx_of(cpu_be *b, int mb) { return b->dx + (size_t)mb * b->run.d.T * b->run.d.C; }
/* Where unit's weight gradients accumulate: the embedding's, tied to the head, have their own buffer. */
static float *grads_of(cpu_be *b, int unit) { return unit == 0 && b->tied_acc ? b->tied_acc : b->acc; }

/* What the runner's calls of unit for micro-batch mb run on: every
 * checkpoint kept, every activation in the work buffers (acts). The
 * kernels run on that micro-batch's positions and documents. */
static mt_unit_io io_of(cpu_be *b, int slot, int unit, int mb, const mt_layer_acts *acts)
{
    const size_t off = (size_t)mb * b->run.d.T;
    b->mb = mb;
    return (mt_unit_io){slot >= 0 ? b->slots[slot] : NULL, unit > 0 ? ck_at(b, unit - 1, mb) : NULL,
                        unit <= b->L ? ck_at(b, unit, mb) : NULL, b->tokens + off, b->targets + off, dx_of(b, mb),
                        b->acc, b->tied_acc, acts};
}

static void cpu_forward(mt_be *be, int slot, int unit, int mb)
{
    cpu_be *b = (cpu_be *)be;
    const mt_layer_acts a = mt_runner_acts(&b->run, unit);
    const mt_unit_io io = io_of(b, slot, unit, mb, &a);
    mt_run_forward(&b->run, unit, mb, &io);
}

static void cpu_backward(mt_be *be, int slot, int unit, int mb)
{
    cpu_be *b = (cpu_be *)be;
    const mt_layer_acts a = mt_runner_acts(&b->run, unit);
    const mt_unit_io io = io_of(b, slot, unit, mb, &a);
    mt_run_backward(&b->run, unit, mb, &io);
}

static void cpu_head(mt_be *be, int slot, int mb, float loss_scale, int want_grad)
{
    cpu_be *b = (cpu_be *)be;
    mt_unit_io io = io_of(b, slot, b->L + 1, mb, NULL);
    if (!want_grad) io.grads = NULL;
    mt_run_head(&b->run, mb, &io, loss_scale);
}

static void cpu_head_logits(mt_be *be, int slot, int mb, float *out)
{
    cpu_be *b = (cpu_be *)be;
    const mt_unit_io io = io_of(b, slot, b->L + 1, mb, NULL);
    mt_run_head_logits(&b->run, mb, &io, out);
}

static void cpu_begin_grads(mt_be *be, int unit)
{
    cpu_be *b = (cpu_be *)be;
    memset(b->acc, 0, unit_desc(b, unit)->padded * sizeof(float));
    if (unit == b->L + 1 && b->tied_acc) memset(b->tied_acc, 0, unit_desc(b, 0)->padded * sizeof(float));
}

/* The backend's slice of the unit's gradients (all of them alone). */
static void cpu_send_grads(mt_be *be, int unit)
{
    cpu_be *b = (cpu_be *)be;
    const mt_unit_desc *u = unit_desc(b, unit);
    const mt_tile *t = &b->req.tiles->tile[unit];
    uint64_t lo, hi;
    mt_grad_slice_of(u->padded, be->rank, be->n_ranks, &lo, &hi);
    if (lo >= hi) return;
    const float *src = grads_of(b, unit) + lo;
    b->sumsq += mt_sumsq_f32(b->pool, src, hi - lo);
    /* bf16 mode: into the weight block, which this step no longer reads; lean mode: the gradient block */
    uint16_t *w = mt_tile_grad_bf16(t, u);
    if (w) mt_cpu_convert(b->pool, w + lo, 1, src, 0, hi - lo);
    else mt_cpu_convert(b->pool, mt_tile_grad_f32(t, u) + lo, 0, src, 0, hi - lo);
}

/* A group of CPU backends (simulated ranks, for tests of the group's
 * scheduling): rank r's slice of every rank's accumulator, summed in rank
 * order, into rank r's. */
static void cpu_reduce_grads(mt_be *const *ranks, int n, int unit)
{
    const mt_unit_desc *u = unit_desc((cpu_be *)ranks[0], unit);
    for (int r = 0; r < n; r++) {
        uint64_t lo, hi;
        mt_grad_slice_of(u->padded, r, n, &lo, &hi);
        float *dst = grads_of((cpu_be *)ranks[r], unit);
        for (uint64_t i = lo; i < hi; i++) {
            float sum = 0.0f;
            for (int g = 0; g < n; g++) sum += grads_of((cpu_be *)ranks[g], unit)[i];
            dst[i] = sum;
        }
    }
}

/* Simulated ranks' all-gather: each rank's slice of its slot into every
 * other rank's. */
static void cpu_gather_weights(mt_be *const *ranks, int n, int slot, int unit)
{
    const uint64_t all = slot_span((cpu_be *)ranks[0], unit);
    for (int r = 0; r < n; r++) {
        uint64_t lo, hi;
        mt_fetch_slice_of(all, r, n, &lo, &hi);
        for (int q = 0; q < n; q++)
            if (q != r && hi > lo)
                memcpy(((cpu_be *)ranks[q])->slots[slot] + lo, ((cpu_be *)ranks[r])->slots[slot] + lo,
                       (hi - lo) * sizeof(float));
    }
}

static mt_status cpu_join(mt_be *const *ranks, int n, mt_err err)
{
    (void)err;
    for (int r = 0; r < n; r++) ranks[r]->rank = r, ranks[r]->n_ranks = n;
    return MT_OK;
}

static mt_status cpu_sync(mt_be *be, double *loss_sum, double *grad_sumsq, mt_err err)
{
    (void)err;
    cpu_be *b = (cpu_be *)be;
    *loss_sum = b->loss_sum;
    *grad_sumsq = b->sumsq;
    b->loss_sum = b->sumsq = 0;
    return MT_OK;
}

static const mt_be_ops cpu_ops = {
    .name = "CPU",
    .destroy = cpu_destroy,
    .reserve = cpu_reserve,
    .release = cpu_release,
    .set_tokens = cpu_set_tokens,
    .load_weights = cpu_load_weights,
    .begin_visit = cpu_begin_visit,
    .end_visit = cpu_end_visit,
    .forward = cpu_forward,
    .head = cpu_head,
    .head_logits = cpu_head_logits,
    .backward = cpu_backward,
    .begin_grads = cpu_begin_grads,
    .send_grads = cpu_send_grads,
    .sync = cpu_sync,
};

static mt_status cpu_create(const mt_be_request *r, int device, mt_be **out, mt_err err)
{
    (void)device;
    cpu_be *b = calloc(1, sizeof *b);
    if (!b) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory for the CPU backend");
    b->base.ops = &cpu_ops;
    b->base.n_ranks = 1;
    b->req = *r;
    b->pool = r->pool;
    *out = &b->base;
    return MT_OK;
}

const mt_be_class mt_cpu_be_class = {
    .name = "CPU",
    .needs = cpu_needs,
    .create = cpu_create,
    .join = cpu_join,
    .reduce_grads = cpu_reduce_grads,
    .gather_weights = cpu_gather_weights,
};
