/* The Llama template: Llama 2/3, Qwen2 (q/k/v biases), Mistral, Phi-3 (whose
 * checkpoint fuses tensors: the layout's business) and Qwen3 (an RMSNorm of
 * each head of q and k before RoPE: d->qk_norm); a layer's sliding window
 * (a->window) is the attention kernels'; its layer up to the MLP is also the MoE
 * template's (mt_llama_attn_forward, _backward). Each unit's forward, recompute and
 * backward as calls on the kernel table (template.h); the worked example of
 * docs/architecture.md.
 *
 *   layer:  xn1 = rmsnorm(x)            q, k, v = xn1 Wq^T (+ b), ...
 *           q, k = rope(q), rope(k)     att, lse = attention(q, k, v)
 *           h = x + att Wo^T            xn2 = rmsnorm(h)
 *           out = h + (silu(xn2 Wg^T) * (xn2 Wu^T)) Wd^T
 *   head:   loss = cross_entropy(rmsnorm(x) Wlm^T), in chunks of tokens
 *
 * What the backward needs is made by the recompute (layer_forward with
 * out NULL) and by the MLP's forward again, one piece of d->FT tokens at a
 * time just before that piece's backward; the recompute stops before the
 * MLP, so a layer's down projection (a quarter of its GEMM FLOPs) runs once
 * in the forward and never again. What the backend kept from the forward
 * (mt_layer_acts: q, k, v; the attention output; the residual after it) the
 * recompute skips; the forward writes those straight where they are kept. */
#include "model/blocks.h"

void mt_llama_attn_forward(const mt_exec *x, void *const *w, const void *in, const mt_layer_acts *a, int recompute)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int T = d->T, C = d->C;
    mt_block_attention(x, w, in, recompute, a);
    /* the residual adds inside the GEMMs: h = x + att Wo^T */
    if (!recompute || !a->h_kept) {
        k->copy(kc, a->h, in, (size_t)T * C);
        k->linear(kc, a->h, 0, mt_block_attention_out(x, a), w[MT_T_O], w[MT_T_O_BIAS], T, d->Qo, C, 1);
    }
    k->rmsnorm(kc, b->xn2, b->rstd2, a->h, w[MT_T_MLP_NORM], T, C, d->eps, d->norm_offset);
}

static void layer_forward(const mt_exec *x, void *const *w, const void *in, void *out, const mt_layer_acts *a)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int T = d->T, C = d->C;
    mt_llama_attn_forward(x, w, in, a, out == NULL);
    if (!out) return; /* layer_backward recomputes each MLP piece just before its backward */
    k->copy(kc, out, a->h, (size_t)T * C);
    for (int t0 = 0; t0 < T; t0 += d->FT) {
        const int n = MT_MIN(d->FT, T - t0);
        mt_block_mlp_up(x, w, t0, n);
        k->linear(kc, mt_at(d, out, (size_t)t0 * C), 0, b->a, w[MT_T_DOWN], NULL, n, d->F, C, 1);
    }
}

static void layer_backward(const mt_exec *x, void *const *w, float *const *gw, const void *in, float *dy,
                           const mt_layer_acts *a)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int T = d->T, C = d->C;
    /* out = h + a Wd^T, piece by piece: the MLP's forward again, then its backward */
    const void *dya = k->as_act(kc, b->dy_act, dy, (size_t)T * C);
    for (int t0 = 0; t0 < T; t0 += d->FT) {
        const int n = MT_MIN(d->FT, T - t0);
        mt_block_mlp_up(x, w, t0, n);
        mt_block_mlp_bwd(x, w, gw, mt_at(d, dya, (size_t)t0 * C), t0, n);
    }
    mt_llama_attn_backward(x, w, gw, in, dy, a);
}

void mt_llama_attn_backward(const mt_exec *x, void *const *w, float *const *gw, const void *in, float *dy,
                            const mt_layer_acts *a)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int T = d->T, C = d->C;
    k->rmsnorm_bwd(kc, dy, gw[MT_T_MLP_NORM], b->dxn, a->h, w[MT_T_MLP_NORM], b->rstd2, T, C, d->eps, d->norm_offset);
    /* h = x + att Wo^T */
    mt_block_attention_bwd(x, w, gw, in, k->as_act(kc, b->dy_act, dy, (size_t)T * C), dy, a);
}

const mt_template mt_template_llama = {
    .name = "llama",
    .work = mt_block_work,
    .reductions = mt_block_reductions,
    .keeps = mt_block_keeps,
    .embed_forward = mt_block_embed_forward,
    .embed_backward = mt_block_embed_backward,
    .layer_forward = layer_forward,
    .layer_backward = layer_backward,
    .head = mt_block_head,
    .head_logits = mt_block_head_logits,
};
