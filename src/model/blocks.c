/* The pieces the layer templates share (blocks.h). */
#include "model/blocks.h"

#include <stddef.h>

#define BUF(name, n, is_f32) MT_WORK_BUF(mt_work, name, n, is_f32)

int mt_block_work(const mt_dims *d, int want_grad, mt_work_buf *out)
{
    const uint64_t T = (uint64_t)d->T, C = (uint64_t)d->C, Q = (uint64_t)d->Q, KV = (uint64_t)d->KV;
    /* the MLP's pieces; a shared expert's run in the same buffers */
    const uint64_t FT = (uint64_t)d->FT * (uint64_t)MT_MAX(d->F, d->FS);
    const uint64_t dlogits = (uint64_t)MT_MAX(d->dw_rows, d->chunk) * (uint64_t)d->V;
    /* the logits buffer also takes head_logits' n_seq rows */
    const uint64_t logits = (uint64_t)MT_MAX(d->chunk, d->n_seq) * (uint64_t)d->V;
    int k = 0;
    BUF(xn1, T * C, 0);
    BUF(q, T * Q, 0);
    BUF(k, T * KV, 0);
    BUF(v, T * KV, 0);
    BUF(att, T * Q, 0);
    BUF(lse, T * (uint64_t)d->H, 1);
    BUF(h, T * C, 0);
    BUF(xn2, T * C, 0);
    BUF(g, FT, 0);
    BUF(u, FT, 0);
    BUF(a, FT, 0);
    BUF(rows, (uint64_t)d->n_seq * C, 0);
    BUF(rstd1, T, 1);
    BUF(rstd2, T, 1);
    BUF(logits, logits, 1);
    if (want_grad) {
        BUF(dy_act, T * C, 0);
        BUF(da, FT, 0);
        BUF(dg, FT, 0);
        BUF(du, FT, 0);
        BUF(datt, T * Q, 0);
        BUF(dq, T * Q, 0);
        BUF(dk, T * KV, 0);
        BUF(dv, T * KV, 0);
        BUF(dxn, T * C, 1);
        BUF(dlogits, dlogits, 0);
    }
    if (d->mla) {
        const uint64_t Rq = (uint64_t)d->Rq, Rkv = (uint64_t)d->Rkv, Dr = (uint64_t)d->Dr;
        const uint64_t KVB = (uint64_t)d->H * (uint64_t)(d->Dn + d->Dv), Qo = (uint64_t)d->Qo;
        const uint64_t R = MT_MAX(Rq, Rkv);
        if (Rq) {
            BUF(cq, T * Rq, 0);
            BUF(cqn, T * Rq, 0);
            BUF(rstdcq, T, 1);
        }
        BUF(kva, T * (Rkv + Dr), 0);
        BUF(kvc, T * Rkv, 0);
        BUF(kvn, T * Rkv, 0);
        BUF(rstdkv, T, 1);
        BUF(kvb, T * KVB, 0);
        BUF(attp, T * Qo, 0);
        if (want_grad) {
            BUF(dkvb, T * KVB, 0);
            BUF(dkva, T * (Rkv + Dr), 0);
            BUF(dattp, T * Qo, 0);
            BUF(dlat_act, T * R, 0);
            BUF(dlat32, T * R, 1);
            BUF(dlatn32, T * R, 1);
        }
    }
    if (d->qk_l2) BUF(l2w, (uint64_t)d->D, 0);
    if (d->qk_norm || d->qk_l2) {
        BUF(qr, T * Q, 0);
        BUF(kr, T * KV, 0);
        BUF(rstdq, T * (uint64_t)d->H, 1);
        BUF(rstdk, T * (uint64_t)d->Hkv, 1);
        if (want_grad) {
            BUF(dqr, T * Q, 1);
            BUF(dkr, T * KV, 1);
            BUF(dqk32, T * Q, 1);
        }
    }
    return k;
}

int mt_block_reductions(const mt_dims *d, int want_grad, mt_reduction *out)
{
    const uint64_t T = (uint64_t)d->T;
    int k = 0;
    out[k++] = (mt_reduction){MT_RED_CROSS_ENTROPY, (uint64_t)d->chunk, (uint64_t)d->V};
    if (!want_grad) return k;
    out[k++] = (mt_reduction){MT_RED_RMSNORM_BWD, T, (uint64_t)d->C};
    if (d->qk_norm || d->qk_l2) { /* the norms of each head of q and k: T * H and T * Hkv rows of D */
        out[k++] = (mt_reduction){MT_RED_RMSNORM_BWD, T * (uint64_t)d->H, (uint64_t)d->D};
        out[k++] = (mt_reduction){MT_RED_RMSNORM_BWD, T * (uint64_t)d->Hkv, (uint64_t)d->D};
    }
    if (d->mla) { /* the latents' norms; the biases of q_a_proj and kv_a_proj_with_mqa */
        if (d->Rq) out[k++] = (mt_reduction){MT_RED_RMSNORM_BWD, T, (uint64_t)d->Rq};
        out[k++] = (mt_reduction){MT_RED_RMSNORM_BWD, T, (uint64_t)d->Rkv};
        out[k++] = (mt_reduction){MT_RED_BIAS_GRAD, T, (uint64_t)MT_MAX(d->Rq, d->Rkv + d->Dr)};
    }
    out[k++] = (mt_reduction){MT_RED_EMBEDDING_BWD, T, (uint64_t)d->C};
    /* q's bias (k's and v's are narrower), o's (GPT-OSS) */
    out[k++] = (mt_reduction){MT_RED_BIAS_GRAD, T, (uint64_t)MT_MAX(d->Q, d->C)};
    return k;
}

unsigned mt_block_keeps(const mt_dims *d)
{
    /* with q and k normed per head the backward needs them before their norms, and multi-head latent
     * attention its latents: kept q, k, v would not spare their recompute */
    return MT_KEEP_ATT | MT_KEEP_H | (d->qk_norm || d->qk_l2 || d->mla ? 0u : (unsigned)MT_KEEP_QKV);
}

void mt_block_embed_forward(const mt_exec *x, void *const *w, const int32_t *tokens, void *out)
{
    x->k->embedding(x->kc, out, tokens, w[MT_T_EMBED], x->d->T, x->d->C, x->d->V, x->d->embed_scale);
}

void mt_block_embed_backward(const mt_exec *x, float *gwte, const int32_t *tokens, const float *dy)
{
    x->k->embedding_bwd(x->kc, gwte, tokens, dy, x->d->T, x->d->C, x->d->V, x->d->embed_scale, x->d->pad);
}

/* DeepseekV3Attention's latent attention with RMSNorm's eps (DeepseekV3RMSNorm's default: q_a_layernorm and
 * kv_a_layernorm are built without the config's rms_norm_eps) */
#define MLA_NORM_EPS 1e-6f

/* Multi-head latent attention's q, k and v (DeepseekV3Attention.forward up to the attention) into a->q, a->k,
 * a->v, laid out as any attention's: heads of D = Dn + Dr, RoPE on the last Dr of each (the key's the one
 * shared part, copied to every head), the values D wide with zeros past Dv. */
static void mla_qkv(const mt_exec *x, void *const *w, const mt_layer_acts *a)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int T = d->T, C = d->C, H = d->H, D = d->D, Dn = d->Dn, Dr = d->Dr, Dv = d->Dv, Rq = d->Rq, Rkv = d->Rkv;
    if (Rq) {
        k->linear(kc, b->cq, 0, b->xn1, w[MT_T_Q_A], w[MT_T_Q_A_BIAS], T, C, Rq, 0);
        k->rmsnorm(kc, b->cqn, b->rstdcq, b->cq, w[MT_T_Q_A_NORM], T, Rq, MLA_NORM_EPS, d->norm_offset);
        k->linear(kc, a->q, 0, b->cqn, w[MT_T_Q_B], NULL, T, Rq, d->Q, 0);
    } else {
        k->linear(kc, a->q, 0, b->xn1, w[MT_T_Q], NULL, T, C, d->Q, 0);
    }
    k->linear(kc, b->kva, 0, b->xn1, w[MT_T_KV_A], w[MT_T_KV_A_BIAS], T, C, Rkv + Dr, 0);
    k->copy_cols(kc, b->kvc, Rkv, 0, b->kva, Rkv + Dr, 0, T, Rkv, 1);
    k->rmsnorm(kc, b->kvn, b->rstdkv, b->kvc, w[MT_T_KV_A_NORM], T, Rkv, MLA_NORM_EPS, d->norm_offset);
    k->linear(kc, b->kvb, 0, b->kvn, w[MT_T_KV_B], NULL, T, Rkv, H * (Dn + Dv), 0);
    k->copy_cols(kc, a->k, D, 0, b->kvb, Dn + Dv, 0, T * H, Dn, 1);         /* each head's part without RoPE */
    k->copy_cols(kc, a->k, D, Dn, b->kva, Rkv + Dr, Rkv, T * H, Dr, H);     /* the shared part, to every head */
    if (Dv < D) k->zero(kc, a->v, (size_t)T * d->KV * d->es);
    k->copy_cols(kc, a->v, D, 0, b->kvb, Dn + Dv, Dn, T * H, Dv, 1);
    k->rope(kc, a->q, T, H, D, 0, a->rope_local);
    k->rope(kc, a->k, T, H, D, 0, a->rope_local);
}

/* Its backward from dq, dk, dv (after RoPE's): the weights' gradients, the input's into b->dxn (written) */
static void mla_qkv_bwd(const mt_exec *x, void *const *w, float *const *gw)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int T = d->T, C = d->C, H = d->H, D = d->D, Dn = d->Dn, Dr = d->Dr, Dv = d->Dv, Rq = d->Rq, Rkv = d->Rkv;
    const int KVB = H * (Dn + Dv);
    if (Rq) { /* q = q_b(norm(q_a(xn1))) */
        k->linear_dx(kc, b->dlat32, 1, b->dq, w[MT_T_Q_B], T, Rq, d->Q, 0);
        k->linear_dw(kc, gw[MT_T_Q_B], NULL, b->dq, b->cqn, T, Rq, d->Q);
        k->zero(kc, b->dlatn32, (size_t)T * Rq * sizeof(float));
        k->rmsnorm_bwd(kc, b->dlatn32, gw[MT_T_Q_A_NORM], b->dlat32, b->cq, w[MT_T_Q_A_NORM], b->rstdcq, T, Rq,
                       MLA_NORM_EPS, d->norm_offset);
        const void *dcq = k->as_act(kc, b->dlat_act, b->dlatn32, (size_t)T * Rq);
        k->linear_dx(kc, b->dxn, 1, dcq, w[MT_T_Q_A], T, C, Rq, 0);
        k->linear_dw(kc, gw[MT_T_Q_A], gw[MT_T_Q_A_BIAS], dcq, b->xn1, T, C, Rq);
    } else {
        k->linear_dx(kc, b->dxn, 1, b->dq, w[MT_T_Q], T, C, d->Q, 0);
        k->linear_dw(kc, gw[MT_T_Q], NULL, b->dq, b->xn1, T, C, d->Q);
    }
    /* the expanded keys' parts and values back into kv_b's rows; the shared key part summed over the heads */
    k->copy_cols(kc, b->dkvb, Dn + Dv, 0, b->dk, D, 0, T * H, Dn, 1);
    k->copy_cols(kc, b->dkvb, Dn + Dv, Dn, b->dv, D, 0, T * H, Dv, 1);
    k->sum_cols(kc, b->dkva, Rkv + Dr, Rkv, b->dk, D, Dn, T, Dr, H);
    k->linear_dx(kc, b->dlat32, 1, b->dkvb, w[MT_T_KV_B], T, Rkv, KVB, 0);
    k->linear_dw(kc, gw[MT_T_KV_B], NULL, b->dkvb, b->kvn, T, Rkv, KVB);
    k->zero(kc, b->dlatn32, (size_t)T * Rkv * sizeof(float));
    k->rmsnorm_bwd(kc, b->dlatn32, gw[MT_T_KV_A_NORM], b->dlat32, b->kvc, w[MT_T_KV_A_NORM], b->rstdkv, T, Rkv,
                   MLA_NORM_EPS, d->norm_offset);
    k->copy_cols(kc, b->dkva, Rkv + Dr, 0, k->as_act(kc, b->dlat_act, b->dlatn32, (size_t)T * Rkv), Rkv, 0, T, Rkv,
                 1);
    k->linear_dx(kc, b->dxn, 1, b->dkva, w[MT_T_KV_A], T, C, Rkv + Dr, 1);
    k->linear_dw(kc, gw[MT_T_KV_A], gw[MT_T_KV_A_BIAS], b->dkva, b->xn1, T, C, Rkv + Dr);
}

const void *mt_block_attention_out(const mt_exec *x, const mt_layer_acts *a)
{
    const mt_dims *d = x->d;
    if (!d->mla) return a->att;
    x->k->copy_cols(x->kc, x->w->attp, d->Dv, 0, a->att, d->D, 0, d->T * d->H, d->Dv, 1);
    return x->w->attp;
}

void mt_block_attention(const mt_exec *x, void *const *w, const void *in, int recompute, const mt_layer_acts *a)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int T = d->T, C = d->C;
    /* xn1 and rstd1 always: the backward of the q, k, v projections and of the norm reads them */
    k->rmsnorm(kc, b->xn1, b->rstd1, in, w[MT_T_ATTN_NORM], T, C, d->eps, d->norm_offset);
    /* with qk_norm or qk_l2 the backward also reads q and k before their norms, with MLA its latents:
     * never skipped */
    const int l2 = d->qk_l2 && !a->nope; /* Llama 4 norms q and k on its layers with RoPE, after it */
    if (d->mla) {
        mla_qkv(x, w, a);
    } else if (!recompute || !a->qkv_kept || d->qk_norm || d->qk_l2) {
        void *q = d->qk_norm || l2 ? b->qr : a->q, *kk = d->qk_norm || l2 ? b->kr : a->k;
        k->linear(kc, q, 0, b->xn1, w[MT_T_Q], w[MT_T_Q_BIAS], T, C, d->Q, 0);
        k->linear(kc, kk, 0, b->xn1, w[MT_T_K], w[MT_T_K_BIAS], T, C, d->KV, 0);
        k->linear(kc, a->v, 0, b->xn1, w[MT_T_V], w[MT_T_V_BIAS], T, C, d->KV, 0);
        if (l2) { /* Llama4TextL2Norm: x / sqrt(mean(x^2) + eps), the norms' kernel at a scale of 1 + 0 */
            k->rope(kc, b->qr, T, d->H, d->D, 0, a->rope_local);
            k->rope(kc, b->kr, T, d->Hkv, d->D, 0, a->rope_local);
            k->zero(kc, b->l2w, (size_t)d->D * d->es);
            k->rmsnorm(kc, a->q, b->rstdq, b->qr, b->l2w, T * d->H, d->D, d->eps, 1.0f);
            k->rmsnorm(kc, a->k, b->rstdk, b->kr, b->l2w, T * d->Hkv, d->D, d->eps, 1.0f);
        } else {
            if (d->qk_norm) { /* Qwen3, Gemma 3: before RoPE, with weights */
                k->rmsnorm(kc, a->q, b->rstdq, b->qr, w[MT_T_Q_NORM], T * d->H, d->D, d->eps, d->norm_offset);
                k->rmsnorm(kc, a->k, b->rstdk, b->kr, w[MT_T_K_NORM], T * d->Hkv, d->D, d->eps, d->norm_offset);
            }
            if (!a->nope) {
                k->rope(kc, a->q, T, d->H, d->D, 0, a->rope_local);
                k->rope(kc, a->k, T, d->Hkv, d->D, 0, a->rope_local);
            }
        }
        /* Llama 4's NoPE layers: q times the attention temperature of its position in the sequence */
        if (a->nope && d->temp_floor != 0.0f)
            k->attn_temperature(kc, a->q, T, d->seq_len, d->Q, d->temp_floor, d->temp_scale);
    }
    if (!recompute || !a->att_kept) {
        k->attention(kc, a->att, a->lse, a->q, a->k, a->v, d->n_seq, d->seq_len, d->H, d->Hkv, d->D, d->attn_scale,
                     a->window, d->attn_softcap);
        /* GPT-OSS's sinks: what is kept, and what the backward runs from, is the attention with them */
        if (w[MT_T_SINKS]) k->attn_sink(kc, a->att, a->lse, w[MT_T_SINKS], d->n_seq, d->seq_len, d->H, d->D);
    }
}

/* The backward of the RMSNorm of each head (rows of D) of q or k: dact (act)
 * holds the gradient after the norm; returns it before the norm, as act (in
 * dact or dx, which gets it in f32). */
static const void *head_norm_backward(const mt_exec *x, void *dact, float *dx, float *gw, const void *xr,
                                      const void *w, const float *rstd, int rows, float woff)
{
    const mt_kernels *k = x->k;
    const mt_dims *d = x->d;
    const size_t n = (size_t)rows * d->D;
    const float *dy = k->as_f32(x->kc, x->w->dqk32, dact, n);
    k->zero(x->kc, dx, n * sizeof(float));
    k->rmsnorm_bwd(x->kc, dx, gw, dy, xr, w, rstd, rows, d->D, d->eps, woff);
    return k->as_act(x->kc, dact, dx, n);
}

static void qkv_proj_bwd(const mt_exec *x, void *const *w, float *const *gw, const void *in, float *dy,
                         const void *dq, const void *dk);

void mt_block_attention_bwd(const mt_exec *x, void *const *w, float *const *gw, const void *in, const void *dya,
                            float *dy, const mt_layer_acts *a)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int T = d->T, C = d->C, Q = d->Q;
    if (d->mla) { /* o_proj read the first Dv of each head: the gradient of the rest is zero */
        k->linear_dx(kc, b->dattp, 0, dya, w[MT_T_O], T, d->Qo, C, 0);
        k->linear_dw(kc, gw[MT_T_O], gw[MT_T_O_BIAS], dya, mt_block_attention_out(x, a), T, d->Qo, C);
        k->zero(kc, b->datt, (size_t)T * Q * d->es);
        k->copy_cols(kc, b->datt, d->D, 0, b->dattp, d->Dv, 0, T * d->H, d->Dv, 1);
    } else {
        k->linear_dx(kc, b->datt, 0, dya, w[MT_T_O], T, Q, C, 0);
        k->linear_dw(kc, gw[MT_T_O], gw[MT_T_O_BIAS], dya, a->att, T, Q, C);
    }
    if (w[MT_T_SINKS])
        k->attn_sink_bwd(kc, gw[MT_T_SINKS], b->datt, a->att, a->lse, w[MT_T_SINKS], d->n_seq, d->seq_len, d->H, d->D);
    k->attention_bwd(kc, b->dq, b->dk, b->dv, b->datt, a->att, a->lse, a->q, a->k, a->v, d->n_seq, d->seq_len, d->H,
                     d->Hkv, d->D, d->attn_scale, a->window, d->attn_softcap);
    if (d->qk_l2 && !a->nope) { /* the L2 norms' backward (no weight: no gradient of one), then RoPE's */
        k->zero(kc, b->l2w, (size_t)d->D * d->es);
        void *dq = (void *)head_norm_backward(x, b->dq, b->dqr, NULL, b->qr, b->l2w, b->rstdq, T * d->H, 1.0f);
        void *dk = (void *)head_norm_backward(x, b->dk, b->dkr, NULL, b->kr, b->l2w, b->rstdk, T * d->Hkv, 1.0f);
        k->rope(kc, dq, T, d->H, d->D, 1, a->rope_local);
        k->rope(kc, dk, T, d->Hkv, d->D, 1, a->rope_local);
        qkv_proj_bwd(x, w, gw, in, dy, dq, dk);
        return;
    }
    if (a->nope && d->temp_floor != 0.0f) /* linear in q: the same factors on its gradient */
        k->attn_temperature(kc, b->dq, T, d->seq_len, d->Q, d->temp_floor, d->temp_scale);
    if (!a->nope) {
        k->rope(kc, b->dq, T, d->H, d->D, 1, a->rope_local);
        k->rope(kc, b->dk, T, d->Hkv, d->D, 1, a->rope_local);
    }
    if (d->mla) {
        mla_qkv_bwd(x, w, gw);
        k->rmsnorm_bwd(kc, dy, gw[MT_T_ATTN_NORM], b->dxn, in, w[MT_T_ATTN_NORM], b->rstd1, T, C, d->eps,
                       d->norm_offset);
        return;
    }
    const void *dq = b->dq, *dk = b->dk;
    if (d->qk_norm) {
        dq = head_norm_backward(x, b->dq, b->dqr, gw[MT_T_Q_NORM], b->qr, w[MT_T_Q_NORM], b->rstdq, T * d->H,
                                d->norm_offset);
        dk = head_norm_backward(x, b->dk, b->dkr, gw[MT_T_K_NORM], b->kr, w[MT_T_K_NORM], b->rstdk, T * d->Hkv,
                                d->norm_offset);
    }
    qkv_proj_bwd(x, w, gw, in, dy, dq, dk);
}

/* The q, k, v projections' and the input norm's backward from dq, dk (act) and b->dv, into dy */
static void qkv_proj_bwd(const mt_exec *x, void *const *w, float *const *gw, const void *in, float *dy,
                         const void *dq, const void *dk)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int T = d->T, C = d->C, Q = d->Q, KV = d->KV;
    k->linear_dx(kc, b->dxn, 1, dq, w[MT_T_Q], T, C, Q, 0);
    k->linear_dx(kc, b->dxn, 1, dk, w[MT_T_K], T, C, KV, 1);
    k->linear_dx(kc, b->dxn, 1, b->dv, w[MT_T_V], T, C, KV, 1);
    k->linear_dw(kc, gw[MT_T_Q], gw[MT_T_Q_BIAS], dq, b->xn1, T, C, Q);
    k->linear_dw(kc, gw[MT_T_K], gw[MT_T_K_BIAS], dk, b->xn1, T, C, KV);
    k->linear_dw(kc, gw[MT_T_V], gw[MT_T_V_BIAS], b->dv, b->xn1, T, C, KV);
    k->rmsnorm_bwd(kc, dy, gw[MT_T_ATTN_NORM], b->dxn, in, w[MT_T_ATTN_NORM], b->rstd1, T, C, d->eps, d->norm_offset);
}

const mt_mlp_roles MT_MLP_DENSE = {MT_T_GATE, MT_T_UP, MT_T_DOWN};
const mt_mlp_roles MT_MLP_SHARED = {MT_T_SH_GATE, MT_T_SH_UP, MT_T_SH_DOWN};

void mt_block_mlp_up_of(const mt_exec *x, void *const *w, const mt_mlp_roles *m, int F, int t0, int n)
{
    const mt_kernels *k = x->k;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const void *xn = mt_at(d, b->xn2, (size_t)t0 * d->C);
    k->linear(x->kc, b->g, 0, xn, w[m->gate], NULL, n, d->C, F, 0);
    k->linear(x->kc, b->u, 0, xn, w[m->up], NULL, n, d->C, F, 0);
    k->glu(x->kc, b->a, b->g, b->u, (size_t)n * F, d->glu_act);
}

void mt_block_mlp_bwd_of(const mt_exec *x, void *const *w, float *const *gw, const mt_mlp_roles *m, int F,
                         const void *dyp, int t0, int n, const float *gate_z, float *gate_dz, int accumulate)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int C = d->C;
    const void *xn = mt_at(d, b->xn2, (size_t)t0 * C);
    float *dxn = b->dxn + (size_t)t0 * C;
    k->linear_dx(kc, b->da, 0, dyp, w[m->down], n, F, C, 0);
    /* out += s * (a Wd^T): the gate's gradient dot(dy Wd, a) s (1 - s), then da and a times s */
    if (gate_z) k->moe_shared_gate_bwd(kc, gate_dz + t0, b->da, b->a, gate_z + t0, n, F);
    k->linear_dw(kc, gw[m->down], NULL, dyp, b->a, n, F, C);
    k->glu_bwd(kc, b->dg, b->du, b->da, b->g, b->u, (size_t)n * F, d->glu_act);
    k->linear_dx(kc, dxn, 1, b->dg, w[m->gate], n, C, F, accumulate);
    k->linear_dx(kc, dxn, 1, b->du, w[m->up], n, C, F, 1);
    k->linear_dw(kc, gw[m->gate], NULL, b->dg, xn, n, C, F);
    k->linear_dw(kc, gw[m->up], NULL, b->du, xn, n, C, F);
}

void mt_block_mlp_up(const mt_exec *x, void *const *w, int t0, int n)
{
    mt_block_mlp_up_of(x, w, &MT_MLP_DENSE, x->d->F, t0, n);
}

void mt_block_mlp_bwd(const mt_exec *x, void *const *w, float *const *gw, const void *dyp, int t0, int n)
{
    mt_block_mlp_bwd_of(x, w, gw, &MT_MLP_DENSE, x->d->F, dyp, t0, n, NULL, NULL, 0);
}

void mt_block_head(const mt_exec *x, void *const *w, const void *lm, float *const *gw, float *glm, const void *in,
                   const int32_t *targets, float loss_scale, float *dy)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    const int T = d->T, C = d->C, V = d->V;
    k->rmsnorm(kc, b->xn1, b->rstd1, in, w[MT_T_FINAL_NORM], T, C, d->eps, d->norm_offset);
    if (dy) k->zero(kc, b->dxn, (size_t)T * C * sizeof(float));
    /* The chunks' dlogits stay side by side in b->dlogits until dw_rows tokens (or T) have them; then one
     * GEMM adds their weight gradient: a chunk of a few hundred tokens of a large vocabulary would
     * otherwise read and write the whole fp32 (V, C) gradient for little arithmetic. */
    const int G = MT_MAX(d->dw_rows, d->chunk);
    for (int t0 = 0, g0 = 0; t0 < T; t0 += d->chunk) {
        const int n = MT_MIN(d->chunk, T - t0);
        const void *xc = mt_at(d, b->xn1, (size_t)t0 * C);
        void *dl = dy ? mt_at(d, b->dlogits, (size_t)(t0 - g0) * V) : NULL;
        k->linear(kc, b->logits, 1, xc, lm, NULL, n, C, V, 0);
        k->cross_entropy(kc, dl, b->logits, targets + t0, n, V, loss_scale, d->final_softcap);
        if (dy) {
            k->linear_dx(kc, b->dxn + (size_t)t0 * C, 1, dl, lm, n, C, V, 0);
            if (t0 + n - g0 >= G || t0 + n == T) {
                k->linear_dw(kc, glm, NULL, b->dlogits, mt_at(d, b->xn1, (size_t)g0 * C), t0 + n - g0, C, V);
                g0 = t0 + n;
            }
        }
    }
    if (dy) {
        k->zero(kc, dy, (size_t)T * C * sizeof(float));
        k->rmsnorm_bwd(kc, dy, gw[MT_T_FINAL_NORM], b->dxn, in, w[MT_T_FINAL_NORM], b->rstd1, T, C, d->eps,
                       d->norm_offset);
    }
}

void mt_block_head_logits(const mt_exec *x, void *const *w, const void *lm, const void *in, float *out)
{
    const mt_kernels *k = x->k;
    void *kc = x->kc;
    const mt_dims *d = x->d;
    const mt_work *b = x->w;
    k->rmsnorm(kc, b->xn1, b->rstd1, in, w[MT_T_FINAL_NORM], d->T, d->C, d->eps, d->norm_offset);
    /* the last position of each sequence, gathered into one small GEMM */
    k->last_rows(kc, b->rows, b->xn1, d->n_seq, d->seq_len, d->C);
    k->linear(kc, b->logits, 1, b->rows, lm, NULL, d->n_seq, d->C, d->V, 0);
    if (d->final_softcap > 0.0f) k->softcap(kc, b->logits, (size_t)d->n_seq * d->V, d->final_softcap);
    k->to_host(kc, out, b->logits, (size_t)d->n_seq * d->V);
}
