/* The Gemma template: Gemma 2 and Gemma 3 (text). Llama's attention and
 * gated MLP (blocks.h) inside "sandwich" norms, each RMSNorm scaling by
 * (1 + w) (d->norm_offset), GELU-tanh in the MLP (d->glu_act), the embedding
 * scaled by sqrt(hidden) (d->embed_scale), soft-capped attention scores and
 * logits in Gemma 2 (d->attn_softcap, d->final_softcap), q/k norms and a
 * separate RoPE for the sliding layers in Gemma 3 (d->qk_norm, a->rope_local):
 *
 *   layer:  xn1 = rmsnorm(x)                       att = attention(q, k, v) as Llama's
 *           ao = att Wo^T                          h = x + rmsnorm_post_attn(ao)
 *           xn2 = rmsnorm_pre_ff(h)                mo = (gelu(xn2 Wg^T) * (xn2 Wu^T)) Wd^T
 *           out = h + rmsnorm_post_ff(mo)
 *
 * Unlike Llama's, the residual cannot be added inside the output GEMMs: each
 * branch is normed first. The post norms' backward needs their inputs: the
 * recompute makes ao again (one GEMM of the output projection), and each MLP
 * piece makes mo again just before its backward, as it makes g and u. */
#include "model/blocks.h"

#include <stddef.h>

/* The shared buffers and the post norms': the attention's output projection ao (T, C) and an MLP
 * piece's output mo (FT, C) before their norms, a scratch mn (FT, C) (act); their 1/rms rstd3 (T),
 * rstd4 (FT); in the backward the f32 gradients before the norms, dpost (T, C). */
typedef struct gemma_work {
    mt_work base;
    void *ao, *mo, *mn;
    float *rstd3, *rstd4, *dpost;
} gemma_work;
_Static_assert(sizeof(gemma_work) <= sizeof(mt_work_store), "gemma_work fits mt_work_store");

static const gemma_work *W(const mt_exec *x) { return (const gemma_work *)x->w; }

#define BUF(name, n, is_f32) MT_WORK_BUF(gemma_work, name, n, is_f32)

static int gemma_work_bufs(const mt_dims *d, int want_grad, mt_work_buf *out)
{
    const uint64_t T = (uint64_t)d->T, C = (uint64_t)d->C, FT = (uint64_t)d->FT;
    int k = mt_block_work(d, want_grad, out);
    BUF(ao, T * C, 0);
    BUF(mo, FT * C, 0);
    BUF(mn, FT * C, 0);
    BUF(rstd3, T, 1);
    BUF(rstd4, FT, 1);
    if (want_grad) BUF(dpost, T * C, 1);
    return k;
}

/* The shared pieces' reductions and the post norms' backward: T rows of C after attention, FT after
 * each MLP piece. */
static int gemma_reductions(const mt_dims *d, int want_grad, mt_reduction *out)
{
    int k = mt_block_reductions(d, want_grad, out);
    if (want_grad) out[k++] = (mt_reduction){MT_RED_RMSNORM_BWD, (uint64_t)d->FT, (uint64_t)d->C};
    return k;
}

/* out rows t0 .. t0 + n = h + rmsnorm_post_ff(mo) of one MLP piece, after mt_block_mlp_up */
static void mlp_out(const mt_exec *x, void *const *w, const void *h, void *out, void *mo, int t0, int n)
{
    const mt_kernels *k = x->k;
    const mt_dims *d = x->d;
    const size_t off = (size_t)t0 * d->C, elems = (size_t)n * d->C;
    k->linear(x->kc, mo, 0, x->w->a, w[MT_T_DOWN], NULL, n, d->F, d->C, 0);
    k->rmsnorm(x->kc, out ? mt_at(d, out, off) : W(x)->mn, W(x)->rstd4, mo, w[MT_T_POST_MLP_NORM], n, d->C, d->eps,
               d->norm_offset);
    if (out) k->add(x->kc, mt_at(d, out, off), mt_at(d, out, off), mt_at(d, h, off), elems);
}

static void layer_forward(const mt_exec *x, void *const *w, const void *in, void *out, const mt_layer_acts *a)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int recompute = out == NULL, T = d->T, C = d->C;
    mt_block_attention(x, w, in, recompute, a);
    /* h = x + rmsnorm(att Wo^T); ao and rstd3 also in the recompute, for the norm's backward */
    k->linear(kc, W(x)->ao, 0, a->att, w[MT_T_O], NULL, T, d->Q, C, 0);
    if (!recompute || !a->h_kept) {
        k->rmsnorm(kc, a->h, W(x)->rstd3, W(x)->ao, w[MT_T_POST_ATTN_NORM], T, C, d->eps, d->norm_offset);
        k->add(kc, a->h, a->h, in, (size_t)T * C);
    } else {
        k->rmsnorm(kc, b->xn2, W(x)->rstd3, W(x)->ao, w[MT_T_POST_ATTN_NORM], T, C, d->eps, d->norm_offset);
    }
    k->rmsnorm(kc, b->xn2, b->rstd2, a->h, w[MT_T_MLP_NORM], T, C, d->eps, d->norm_offset);
    if (recompute) return; /* layer_backward recomputes each MLP piece just before its backward */
    for (int t0 = 0; t0 < T; t0 += d->FT) {
        const int n = MT_MIN(d->FT, T - t0);
        mt_block_mlp_up(x, w, t0, n);
        mlp_out(x, w, a->h, out, W(x)->mo, t0, n);
    }
}

/* dpost rows (f32, overwritten) = the gradient before a post norm of input xr, from dy rows (f32) after it */
static const void *post_norm_backward(const mt_exec *x, float *gw, const float *dy, const void *xr, const void *w,
                                      const float *rstd, int rows, void *act_scratch)
{
    const mt_kernels *k = x->k;
    const mt_dims *d = x->d;
    const size_t n = (size_t)rows * d->C;
    k->zero(x->kc, W(x)->dpost, n * sizeof(float));
    k->rmsnorm_bwd(x->kc, W(x)->dpost, gw, dy, xr, w, rstd, rows, d->C, d->eps, d->norm_offset);
    return k->as_act(x->kc, act_scratch, W(x)->dpost, n);
}

static void layer_backward(const mt_exec *x, void *const *w, float *const *gw, const void *in, float *dy,
                           const mt_layer_acts *a)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int T = d->T, C = d->C;
    /* out = h + rmsnorm(mo), piece by piece: the MLP's forward again, then its backward */
    for (int t0 = 0; t0 < T; t0 += d->FT) {
        const int n = MT_MIN(d->FT, T - t0);
        mt_block_mlp_up(x, w, t0, n);
        mlp_out(x, w, a->h, NULL, W(x)->mo, t0, n);
        const void *dmo = post_norm_backward(x, gw[MT_T_POST_MLP_NORM], dy + (size_t)t0 * C, W(x)->mo,
                                             w[MT_T_POST_MLP_NORM], W(x)->rstd4, n, b->dy_act);
        mt_block_mlp_bwd(x, w, gw, dmo, t0, n);
    }
    k->rmsnorm_bwd(kc, dy, gw[MT_T_MLP_NORM], b->dxn, a->h, w[MT_T_MLP_NORM], b->rstd2, T, C, d->eps, d->norm_offset);
    /* h = x + rmsnorm(ao) */
    const void *dao =
        post_norm_backward(x, gw[MT_T_POST_ATTN_NORM], dy, W(x)->ao, w[MT_T_POST_ATTN_NORM], W(x)->rstd3, T, b->dy_act);
    mt_block_attention_bwd(x, w, gw, in, dao, dy, a);
}

const mt_template mt_template_gemma = {
    .name = "gemma",
    .work = gemma_work_bufs,
    .reductions = gemma_reductions,
    .keeps = mt_block_keeps,
    .embed_forward = mt_block_embed_forward,
    .embed_backward = mt_block_embed_backward,
    .layer_forward = layer_forward,
    .layer_backward = layer_backward,
    .head = mt_block_head,
    .head_logits = mt_block_head_logits,
};
