/* Which template a family uses, and binding a unit's tensors. */
#include "model/template.h"
#include "core/bf16.h"

#include <math.h>
#include <string.h>

const mt_template *mt_template_for(const mt_model_config *cfg)
{
    const mt_family *f = mt_family_of(cfg->arch);
    return f ? f->layer_template : NULL;
}

mt_status mt_template_check(mt_err err, const mt_model_config *cfg)
{
    if (mt_template_for(cfg)) return MT_OK;
    return mt_fail(err, MT_ERR_UNSUPPORTED, "architecture %u has no layer template in this build of the library",
                   cfg->arch);
}

void mt_dims_init(mt_dims *d, const mt_model_config *c, int n_seq, int seq_len)
{
    memset(d, 0, sizeof *d);
    d->n_seq = n_seq, d->seq_len = seq_len, d->T = n_seq * seq_len;
    d->C = (int)c->hidden_size, d->H = (int)c->num_attention_heads, d->Hkv = (int)c->num_key_value_heads;
    d->D = (int)c->head_dim, d->Q = d->H * d->D, d->KV = d->Hkv * d->D;
    d->F = (int)c->intermediate_size, d->V = (int)c->vocab_size;
    d->eps = c->rms_norm_eps;
    d->attn_scale = 1.0f / sqrtf((float)d->D);
    /* Gemma: query_pre_attn_scalar ** -0.5, a Python float until it meets the scores */
    if (c->query_pre_attn_scalar > 0.0f) d->attn_scale = (float)(1.0 / sqrt((double)c->query_pre_attn_scalar));
    const mt_family *f = mt_config_family(c);
    d->qk_norm = (f->flags & MT_FAMILY_QK_NORM) != 0;
    d->qk_l2 = c->qk_l2_norm != 0;
    d->temp_floor = c->attn_temperature_floor, d->temp_scale = c->attn_temperature_scale;
    d->norm_offset = f->norm_offset;
    d->glu_act = f->glu_act;
    /* transformers: torch.tensor(hidden_size ** 0.5, dtype=the activations' dtype) */
    d->embed_scale = 1.0f;
    d->pad = c->pad_token_id;
    if (f->flags & MT_FAMILY_EMBED_SCALE) {
        d->embed_scale = (float)sqrt((double)c->hidden_size);
        if (c->precision != MT_PRECISION_FP32) d->embed_scale = mt_bf16_to_f32(mt_f32_to_bf16(d->embed_scale));
    }
    d->Qo = d->Q;
    if (c->kv_lora_rank) {
        d->mla = 1, d->Rq = (int)c->q_lora_rank, d->Rkv = (int)c->kv_lora_rank;
        d->Dn = (int)c->qk_nope_head_dim, d->Dr = (int)c->qk_rope_head_dim, d->Dv = (int)c->v_head_dim;
        d->Qo = d->H * d->Dv;
        /* DeepseekV3Attention.scaling: qk_head_dim ** -0.5, times yarn's mscale(factor, mscale_all_dim)
         * squared where RoPE is scaled (yarn_apply_mscale), in Python floats */
        double s = 1.0 / sqrt((double)d->D);
        if (c->rope_scaling != MT_ROPE_SCALING_NONE && c->rope_mscale_all_dim != 0.0f && c->rope_factor > 1.0f) {
            const double m = 0.1 * (double)c->rope_mscale_all_dim * log((double)c->rope_factor) + 1.0;
            s *= m * m;
        }
        d->attn_scale = (float)s;
    }
    d->attn_softcap = c->attn_logit_softcapping;
    d->final_softcap = c->final_logit_softcapping;
    for (int l = 0; l < (int)c->num_hidden_layers && !d->window; l++) d->window = mt_config_layer_window(c, l, seq_len);
    d->L = (int)c->num_hidden_layers;
    d->n_micro = 1;
    if (c->num_experts) {
        d->E = (int)c->num_experts, d->FE = (int)c->moe_intermediate_size, d->topk = (int)c->num_experts_per_tok;
        d->norm_topk = c->norm_topk_prob != 0;
        d->n_sparse = mt_config_sparse_layers(c);
        d->aux_coef = c->output_router_logits ? c->router_aux_loss_coef : 0.0f;
        d->FS = (int)c->shared_expert_intermediate_size, d->shared_gate = c->shared_expert_gate != 0;
        d->expert_bias = f->moe == MT_MOE_GPT_OSS;
        d->input_weighted = c->moe_input_weighted != 0;
        /* the routing (mt_route): the softmax's top-k, or DeepSeek-V3's sigmoid scores, groups and
         * routed_scaling_factor */
        d->route_sigmoid = c->moe_scoring == MT_MOE_SCORING_SIGMOID;
        d->n_group = c->n_group > 1 ? (int)c->n_group : 0, d->topk_group = c->n_group > 1 ? (int)c->topk_group : 0;
        d->route_scale = c->routed_scaling_factor != 0.0f ? c->routed_scaling_factor : 1.0f;
    }
}

void mt_bind_unit(void **w, void *block, const mt_unit_desc *u, size_t es)
{
    memset(w, 0, MT_T_ROLE_COUNT * sizeof *w);
    for (int i = 0; i < u->n_tensors; i++) w[u->tensors[i].role] = (char *)block + u->tensors[i].offset * es;
}

void mt_bind_unit_f32(float **w, float *block, const mt_unit_desc *u)
{
    memset(w, 0, MT_T_ROLE_COUNT * sizeof *w);
    for (int i = 0; i < u->n_tensors; i++) w[u->tensors[i].role] = block + u->tensors[i].offset;
}

int mt_doc_layout(int32_t *pos, int32_t *doc_start, const int32_t *positions, int n_seq, int seq_len)
{
    int docs = 0;
    for (int s = 0; s < n_seq; s++) {
        int32_t first = 0;
        for (int i = 0; i < seq_len; i++) {
            const size_t t = (size_t)s * seq_len + i;
            const int32_t p = positions ? positions[t] : i;
            if (p == 0) first = i;
            docs |= first != 0;
            pos[t] = p;
            doc_start[t] = first;
        }
    }
    return docs;
}

void mt_window_starts(int32_t *win, const int32_t *doc_start, int n_seq, int seq_len, int window)
{
    for (int s = 0; s < n_seq; s++)
        for (int i = 0; i < seq_len; i++) {
            const size_t t = (size_t)s * seq_len + i;
            win[t] = MT_MAX(doc_start[t], window < 0 ? i - i % -window : i - window + 1);
        }
}
