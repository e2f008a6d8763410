/* The mixture-of-experts template: Qwen3-MoE, Mixtral, Qwen2-MoE, GPT-OSS, DeepSeek and
 * Llama 4. Llama's attention (mt_llama_attn_forward / _backward, with Qwen3's q/k norms where the config
 * has them); on the sparse layers (mt_config_layer_sparse) a router and E
 * experts take the MLP's place, and the dense layers of a Qwen3-MoE model
 * (mlp_only_layers, decoder_sparse_step) are Llama's layer as it is.
 *
 *   sparse layer:  xn2 = rmsnorm(h)                      (T, C)
 *                  p = softmax(xn2 Wr^T) in fp32          (T, E)
 *                  w, i = top-k of p (renormalised: norm_topk_prob, Mixtral always)
 *                  out = h + sum_j w_j * down_i(silu(gate_i(xn2)) * up_i(xn2))
 *                        (+ sigmoid(xn2 Wsg^T) * down_s(silu(gate_s(xn2)) * up_s(xn2)): Qwen2-MoE's
 *                         shared expert and its gate, d->FS and d->shared_gate)
 *   Llama 4 (d->input_weighted): w_j = sigmoid of the k best logits, out = h + sum_j down_i(act(w_j xn2))
 *                  + the shared expert: the weight scales the expert's input rows, not its output
 *
 * The experts run on the T*k routed rows sorted by expert (moe_route): each
 * token's row is gathered to its experts' rows, the experts' GEMMs run as one
 * grouped call each (moe_linear, moe_linear_dx, moe_linear_dw: every expert
 * over its contiguous block of rows; experts without rows run nothing, so
 * their gradient blocks stay as begin_grads zeroed them), and the weighted
 * outputs are added back per token in slot order (moe_combine: no atomics,
 * the same bits every run). The grouped calls read each expert's first row
 * (moe_route's offs_buf, b->roffs) in the backend's memory: the template never
 * sees a row count, so nothing comes back to the host inside a sparse layer
 * and a GPU backend never waits for its routing.
 *
 * The backward recomputes the routing and the experts' gate, up and
 * activation; the routing weights' gradient is dot(dy_t, expert output), which
 * is dot(dys Wd, a) for the row, so the expert outputs need not be kept. The
 * top-k choice has no gradient; the weights' gradient goes through the
 * renormalisation and the softmax into the router (moe_route_bwd).
 *
 * The load-balancing loss (transformers' load_balancing_loss_func with no
 * attention mask, over every sparse layer's router probabilities
 * concatenated): with N = n_sparse * T rows, f_e the share of the N*k routed
 * rows that go to expert e and P_e the mean of its probability over the N rows,
 *
 *     aux = E * sum_e f_e * P_e,  loss = CE + router_aux_loss_coef * aux
 *
 * It is not a sum of per-layer terms, but f has no gradient, so d aux / d p =
 * E * f_e / N for every row of every layer: each layer's forward writes its
 * counts and probability sums into the micro-batch's statistics (mt_exec.state,
 * one row per layer), the head adds the loss once the forward is done, and
 * each layer's backward takes the gradient from the counts summed over the
 * layers. transformers computes the loss per forward call: with several
 * micro-batches a step's loss is the cross-entropy over all its targets plus
 * the coefficient times the mean of the micro-batches' aux losses, and the
 * gradients are those of that sum. mt_eval reports the cross-entropy alone. */
#include "model/blocks.h"

#include <stddef.h>


/* The shared buffers, and the router's and experts': the router's logits and probabilities (T, E) f32,
 * each token's k experts and weights (T*k), the routed rows' order (R = T*k; int32 in 4-byte elements),
 * each expert's first routed row (E+1, int32: moe_route's offs_buf); the routed rows' inputs (R, C),
 * gate, up, activation (R, FE) and outputs (R, C) act; in the backward the routing weights' gradient (R)
 * f32, the routed rows' gradients (R, C) f32, the experts' gate and up gradients (R, FE) act and the
 * router logits' gradient (T, E) f32 and act. */
typedef struct moe_work {
    mt_work base;
    float *rlog, *rprob, *topw, *rdw, *dxs, *drlog;
    int32_t *topi, *rrows, *rslot, *roffs;
    void *xs, *eg, *eu, *ea, *ys, *dea, *deg, *deu, *drlog_act;
    float *sz, *dsz; /* the shared expert's gate logits (T) and their gradient */
    void *dsz_act;
    /* GPT-OSS's down-projection biases in the backward: dot(dy, b_e) of each routed row (R) f32, and the
     * routing weights as act, by slot and by routed row (R each) */
    float *rbd;
    void *topw_act, *wrow_act;
    /* Llama 4 (d->input_weighted), in the backward: the routed rows' inputs before their weights (R, C) act */
    void *xs0;
} moe_work;
_Static_assert(sizeof(moe_work) <= sizeof(mt_work_store), "moe_work fits mt_work_store");

static const moe_work *W(const mt_exec *x) { return (const moe_work *)x->w; }

#define BUF(name, n, is_f32) MT_WORK_BUF(moe_work, name, n, is_f32)

/* Each layer's routing statistics, one row of 2E per decoder layer (dense layers' left zero): the
 * counts and probability sums that the load-balancing loss needs from the whole forward. */
static uint64_t moe_state_elems(const mt_dims *d) { return (uint64_t)d->L * 2 * (uint64_t)d->E; }

static int moe_work_bufs(const mt_dims *d, int want_grad, mt_work_buf *out)
{
    int k = mt_block_work(d, want_grad, out); /* the attention's, and the dense layers' MLP */
    const uint64_t T = (uint64_t)d->T, E = (uint64_t)d->E, R = T * (uint64_t)d->topk, C = (uint64_t)d->C;
    const uint64_t FE = (uint64_t)d->FE;
    BUF(rlog, T * E, 1);
    BUF(rprob, T * E, 1);
    BUF(topw, R, 1);
    BUF(topi, R, 1); /* int32: 4-byte elements */
    BUF(rrows, R, 1);
    BUF(rslot, R, 1);
    BUF(roffs, E + 1, 1);
    BUF(xs, R * C, 0);
    BUF(eg, R * FE, 0);
    BUF(eu, R * FE, 0);
    BUF(ea, R * FE, 0);
    BUF(ys, R * C, 0); /* the experts' outputs; in the backward the routed rows' output gradients */
    if (want_grad) {
        BUF(rdw, R, 1);
        BUF(dxs, R * C, 1);
        BUF(dea, R * FE, 0);
        BUF(deg, R * FE, 0);
        BUF(deu, R * FE, 0);
        BUF(drlog, T * E, 1);
        BUF(drlog_act, T * E, 0);
    }
    if (d->expert_bias && want_grad) {
        BUF(rbd, R, 1);
        BUF(topw_act, R, 0);
        BUF(wrow_act, R, 0);
    }
    if (d->input_weighted && want_grad) BUF(xs0, R * C, 0);
    if (d->shared_gate) {
        BUF(sz, T, 1);
        if (want_grad) {
            BUF(dsz, T, 1);
            BUF(dsz_act, T, 0);
        }
    }
    return k;
}

/* The layer's routing (moe_route, moe_route_bwd): the dims' mode, the weights' correction bias (NULL none) */
static mt_route route_of(const mt_dims *d, void *const *w)
{
    return (mt_route){.norm = d->norm_topk, .sigmoid = d->route_sigmoid, .n_group = d->n_group,
                      .topk_group = d->topk_group, .scale = d->route_scale, .bias = w[MT_T_ROUTER_CORR]};
}

/* The routing of xn2 and, for every routed row, the experts' gate, up and silu(gate) * up. b->roffs gets
 * each expert's first row (in the backend's memory); stats (NULL: left as they are) the layer's
 * load-balancing statistics. With the weights on the experts' input (Llama 4) the routed rows are scaled
 * by them first, their unscaled copy going to xs0 where the backward asks (keep). */
static void route_and_up(const mt_exec *x, void *const *w, float *stats, int keep)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const moe_work *b = W(x);
    const int T = d->T, C = d->C, E = d->E, K = d->topk, FE = d->FE, R = T * K;
    k->linear(kc, b->rlog, 1, b->base.xn2, w[MT_T_ROUTER], w[MT_T_ROUTER_BIAS], T, C, E, 0); /* (T, E) f32 */
    const mt_route rt = route_of(d, w);
    k->moe_route(kc, b->rprob, b->topw, b->topi, b->rrows, b->rslot, b->roffs, stats, b->rlog, T, E, K, &rt);
    k->moe_gather(kc, b->xs, b->base.xn2, b->rrows, R, K, C); /* (R, C) */
    if (d->input_weighted) { /* Llama4TextMoe: routed_in = hidden_states * router_scores */
        if (keep) k->copy(kc, b->xs0, b->xs, (size_t)R * C);
        k->moe_dot_scale(kc, NULL, b->xs, NULL, b->topw, b->rrows, R, C);
    }
    k->moe_linear(kc, b->eg, 0, b->xs, w[MT_T_EXP_GATE], w[MT_T_EXP_GATE_BIAS], b->roffs, E, R, C, FE, 0);
    k->moe_linear(kc, b->eu, 0, b->xs, w[MT_T_EXP_UP], w[MT_T_EXP_UP_BIAS], b->roffs, E, R, C, FE, 0);
    k->glu(kc, b->ea, b->eg, b->eu, (size_t)R * FE, d->glu_act);
}

/* The shared expert on every token, added to out piece by piece (d->FT tokens, in the MLP's buffers;
 * the routed rows' ys, free once combined, holds a gated piece's output): Qwen2-MoE's
 * sigmoid(xn2 Wsg^T) * down(silu(gate(xn2)) * up(xn2)). */
static void shared_forward(const mt_exec *x, void *const *w, void *out)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const moe_work *b = W(x);
    const int T = d->T, C = d->C;
    if (d->shared_gate) k->linear(kc, b->sz, 1, b->base.xn2, w[MT_T_SH_SCORE], NULL, T, C, 1, 0); /* (T, 1) f32 */
    for (int t0 = 0; t0 < T; t0 += d->FT) {
        const int n = MT_MIN(d->FT, T - t0);
        void *o = mt_at(d, out, (size_t)t0 * C);
        mt_block_mlp_up_of(x, w, &MT_MLP_SHARED, d->FS, t0, n);
        if (!d->shared_gate) {
            k->linear(kc, o, 0, b->base.a, w[MT_T_SH_DOWN], NULL, n, d->FS, C, 1);
            continue;
        }
        k->linear(kc, b->ys, 0, b->base.a, w[MT_T_SH_DOWN], NULL, n, d->FS, C, 0);
        k->moe_shared_gate(kc, o, b->ys, b->sz + t0, n, C);
    }
}

/* Its backward from dya (T, C) act, the gradient of the layer's output: the input gradient added to
 * dxn, the gate's through dsz. */
static void shared_backward(const mt_exec *x, void *const *w, float *const *gw, const void *dya)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const moe_work *b = W(x);
    const int T = d->T, C = d->C;
    if (d->shared_gate) k->linear(kc, b->sz, 1, b->base.xn2, w[MT_T_SH_SCORE], NULL, T, C, 1, 0);
    for (int t0 = 0; t0 < T; t0 += d->FT) {
        const int n = MT_MIN(d->FT, T - t0);
        mt_block_mlp_up_of(x, w, &MT_MLP_SHARED, d->FS, t0, n);
        mt_block_mlp_bwd_of(x, w, gw, &MT_MLP_SHARED, d->FS, mt_at(d, dya, (size_t)t0 * C), t0, n,
                            d->shared_gate ? b->sz : NULL, b->dsz, 1);
    }
    if (!d->shared_gate) return;
    const void *dz = k->as_act(kc, b->dsz_act, b->dsz, (size_t)T);
    k->linear_dx(kc, b->base.dxn, 1, dz, w[MT_T_SH_SCORE], T, C, 1, 1);
    k->linear_dw(kc, gw[MT_T_SH_SCORE], NULL, dz, b->base.xn2, T, C, 1);
}

/* GPT-OSS's down-projection biases, after moe_dot_scale (ys holds each routed row's output gradient
 * dys, unweighted): a row's output is a Wd^T + b_e, so its routing weight's gradient gains dot(dys, b_e),
 * added by slot; b_e's gradient is the weighted sum of its rows' dys, w^T dys as a GEMM of one row. Both
 * are grouped GEMMs with N = 1, the biases (E, C) read as a stacked matrix (E, 1, C). */
static void down_bias_backward(const mt_exec *x, void *const *w, float *const *gw)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const moe_work *b = W(x);
    const int C = d->C, E = d->E, R = d->T * d->topk;
    /* rbd[r] = dot(dys[r], b_e) */
    k->moe_linear(kc, b->rbd, 1, b->ys, w[MT_T_EXP_DOWN_BIAS], NULL, b->roffs, E, R, C, 1, 0);
    k->moe_combine(kc, b->rdw, 1, b->rbd, 1, NULL, b->rslot, R, 1, 1); /* rdw[slot] += rbd[its row] */
    k->moe_gather(kc, b->wrow_act, k->as_act(kc, b->topw_act, b->topw, (size_t)R), b->rrows, R, 1, 1);
    k->moe_linear_dw(kc, gw[MT_T_EXP_DOWN_BIAS], NULL, b->wrow_act, b->ys, b->roffs, E, R, C, 1);
}

/* The reductions of the Llama blocks and, with GPT-OSS's biases, the router's and the experts' bias
 * gradients: rows T at most (a token takes an expert once), as wide as the widest of them. */
static int moe_reductions(const mt_dims *d, int want_grad, mt_reduction *out)
{
    int k = mt_block_reductions(d, want_grad, out);
    if (want_grad && d->expert_bias)
        out[k++] = (mt_reduction){MT_RED_BIAS_GRAD, (uint64_t)d->T, (uint64_t)MT_MAX(d->FE, d->E)};
    return k;
}

static void layer_forward(const mt_exec *x, void *const *w, const void *in, void *out, const mt_layer_acts *a)
{
    if (!w[MT_T_ROUTER]) { /* a dense layer */
        mt_template_llama.layer_forward(x, w, in, out, a);
        return;
    }
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const moe_work *b = W(x);
    const int T = d->T, C = d->C, E = d->E, K = d->topk, FE = d->FE, R = T * K;
    mt_llama_attn_forward(x, w, in, a, out == NULL);
    if (!out) return; /* layer_backward routes again */
    route_and_up(x, w, x->state ? x->state + (size_t)a->layer * 2 * E : NULL, 0);
    k->moe_linear(kc, b->ys, 0, b->ea, w[MT_T_EXP_DOWN], w[MT_T_EXP_DOWN_BIAS], b->roffs, E, R, FE, C, 0);
    k->copy(kc, out, a->h, (size_t)T * C);
    k->moe_combine(kc, out, 0, b->ys, 0, d->input_weighted ? NULL : b->topw, b->rslot, T, K, C);
    if (d->FS) shared_forward(x, w, out);
}

static void layer_backward(const mt_exec *x, void *const *w, float *const *gw, const void *in, float *dy,
                           const mt_layer_acts *a)
{
    if (!w[MT_T_ROUTER]) {
        mt_template_llama.layer_backward(x, w, gw, in, dy, a);
        return;
    }
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const moe_work *b = W(x);
    const int T = d->T, C = d->C, E = d->E, K = d->topk, FE = d->FE, R = T * K;
    route_and_up(x, w, NULL, 1); /* the statistics are the forward's */
    /* out = h + sum_j w_j y_j: each routed row's output gradient is its token's (unweighted here) */
    const void *dya = k->as_act(kc, b->base.dy_act, dy, (size_t)T * C);
    k->moe_gather(kc, b->ys, dya, b->rrows, R, K, C);
    k->moe_linear_dx(kc, b->dea, 0, b->ys, w[MT_T_EXP_DOWN], b->roffs, E, R, FE, C, 0); /* da = dys Wd, unweighted */
    /* the weight's gradient: dot(dy_t, y) = dot(dys Wd, a); then da and a times the weight (Llama 4's
     * weights are on the input: below) */
    if (!d->input_weighted) k->moe_dot_scale(kc, b->rdw, b->dea, b->ea, b->topw, b->rrows, R, FE);
    if (d->expert_bias) down_bias_backward(x, w, gw);
    k->glu_bwd(kc, b->deg, b->deu, b->dea, b->eg, b->eu, (size_t)R * FE, d->glu_act);
    /* The experts' weight gradients (experts without rows: none, the accumulator's zeros stay) and the
     * routed rows' input gradient, gate's then up's added to it. An expert's rows are its own, so doing
     * each product for every expert in turn gives the bits of doing every product for each expert. */
    k->moe_linear_dw(kc, gw[MT_T_EXP_DOWN], NULL, b->ys, b->ea, b->roffs, E, R, FE, C);
    k->moe_linear_dx(kc, b->dxs, 1, b->deg, w[MT_T_EXP_GATE], b->roffs, E, R, C, FE, 0);
    k->moe_linear_dx(kc, b->dxs, 1, b->deu, w[MT_T_EXP_UP], b->roffs, E, R, C, FE, 1);
    k->moe_linear_dw(kc, gw[MT_T_EXP_GATE], gw[MT_T_EXP_GATE_BIAS], b->deg, b->xs, b->roffs, E, R, C, FE);
    k->moe_linear_dw(kc, gw[MT_T_EXP_UP], gw[MT_T_EXP_UP_BIAS], b->deu, b->xs, b->roffs, E, R, C, FE);
    /* the gradient of xn2: the experts' rows added back per token, then the router's */
    k->zero(kc, b->base.dxn, (size_t)T * C * sizeof(float));
    if (d->input_weighted) {
        /* routed_in = x_t w: the weight's gradient is dot(d routed_in, x_t), x_t's gains w d routed_in. The
         * rows' gradient in act (ys, free once the experts' backward is done), as the product's in bf16 */
        void *dxs = (void *)k->as_act(kc, b->ys, b->dxs, (size_t)R * C);
        k->moe_dot_scale(kc, b->rdw, dxs, b->xs0, b->topw, b->rrows, R, C);
        k->moe_combine(kc, b->base.dxn, 1, dxs, 0, NULL, b->rslot, T, K, C);
    } else {
        k->moe_combine(kc, b->base.dxn, 1, b->dxs, 1, NULL, b->rslot, T, K, C);
    }
    const int aux = x->state && d->aux_coef != 0.0f && d->n_sparse;
    const double N = (double)d->n_sparse * T; /* the rows of the loss: every sparse layer's tokens */
    const float aux_scale = aux ? (float)((double)d->aux_coef / d->n_micro * E / (N * N)) : 0.0f;
    const mt_route rt = route_of(d, w);
    k->moe_route_bwd(kc, b->drlog, b->rdw, b->rprob, b->topw, b->topi, aux ? x->state : NULL, d->L, aux_scale, T, E, K,
                     &rt);
    const void *dl = k->as_act(kc, b->drlog_act, b->drlog, (size_t)T * E);
    k->linear_dx(kc, b->base.dxn, 1, dl, w[MT_T_ROUTER], T, C, E, 1);
    k->linear_dw(kc, gw[MT_T_ROUTER], gw[MT_T_ROUTER_BIAS], dl, b->base.xn2, T, C, E);
    if (d->FS) shared_backward(x, w, gw, dya);
    mt_llama_attn_backward(x, w, gw, in, dy, a);
}

static void head(const mt_exec *x, void *const *w, const void *lm, float *const *gw, float *glm, const void *in,
                 const int32_t *targets, float loss_scale, float *dy)
{
    mt_block_head(x, w, lm, gw, glm, in, targets, loss_scale, dy);
    const mt_dims *d = x->d;
    /* the load-balancing loss once the forward has routed every layer: the step's loss sum is divided
     * by its targets (1 / loss_scale), and the loss is the mean over the micro-batches. Training only:
     * loss_scale 0 (mt_eval) reports the cross-entropy alone. */
    if (x->state && d->aux_coef != 0.0f && d->n_sparse && loss_scale != 0.0f) {
        const double N = (double)d->n_sparse * d->T;
        x->k->moe_aux_loss(x->kc, x->state, d->L, d->E, (double)d->aux_coef / d->n_micro / loss_scale / (N * N));
    }
}

const mt_template mt_template_moe = {
    .name = "moe",
    .work = moe_work_bufs,
    .reductions = moe_reductions,
    .state_elems = moe_state_elems,
    .keeps = mt_block_keeps,
    .embed_forward = mt_block_embed_forward, /* the embedding and the last positions' logits are Llama's */
    .embed_backward = mt_block_embed_backward,
    .layer_forward = layer_forward,
    .layer_backward = layer_backward,
    .head = head,
    .head_logits = mt_block_head_logits,
};
