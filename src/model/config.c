/* mt_config_import: the validated copy of an mt_model_config. The rules
 * every model follows are here; what a family allows beyond Llama (windows,
 * Gemma's fields, experts) is read from its descriptor (model/family.h),
 * which is why this lives in src/model rather than with the other option
 * structs in src/core/options.c. */
#include "core/internal.h"
#include "model/family.h"
#include "model/template.h" /* MT_MAX_EXPERTS */

#include <math.h>
#include <stddef.h>
#include <string.h>

/* Limits that keep every size computation inside 64 bits and reject typos:
 * far above any model this design can train on one machine. */
#define MAX_VOCAB (1u << 24)
#define MAX_HIDDEN (1u << 17)
#define MAX_LAYERS 4096u
#define MAX_HEADS 1024u
#define MAX_HEAD_DIM 1024u

#define BAD(...) mt_fail(err, MT_ERR_INVALID_ARGUMENT, __VA_ARGS__)

/* A float field that is 0 (unset) or finite and above lo. */
static int unset_or_above(float f, float lo) { return f == 0.0f || (isfinite(f) && f > lo); }

static mt_status gemma_fields_check(mt_err err, const mt_model_config *c, const mt_family *f)
{
    if (!unset_or_above(c->query_pre_attn_scalar, 0.0f))
        return BAD("query_pre_attn_scalar %g must be 0 or a positive finite number", (double)c->query_pre_attn_scalar);
    if (!unset_or_above(c->rope_local_base_freq, 1.0f))
        return BAD("rope_local_base_freq %g must be 0 or a finite number above 1", (double)c->rope_local_base_freq);
    if (!unset_or_above(c->attn_logit_softcapping, 0.0f) || !unset_or_above(c->final_logit_softcapping, 0.0f))
        return BAD("attn_logit_softcapping %g and final_logit_softcapping %g must be 0 or positive finite numbers",
                   (double)c->attn_logit_softcapping, (double)c->final_logit_softcapping);
    if (!(f->flags & MT_FAMILY_GEMMA_CONFIG) &&
        (c->query_pre_attn_scalar != 0.0f || c->attn_logit_softcapping != 0.0f || c->final_logit_softcapping != 0.0f))
        return BAD("query_pre_attn_scalar, attn_logit_softcapping and final_logit_softcapping are Gemma's: they must "
                   "be 0 for architecture %u",
                   c->arch);
    if (!(f->flags & MT_FAMILY_LOCAL_ROPE) && c->rope_local_base_freq != 0.0f)
        return BAD("rope_local_base_freq %g is Gemma 3's: it must be 0 for architecture %u",
                   (double)c->rope_local_base_freq, c->arch);
    return MT_OK;
}

static int any_dense_layer(const mt_model_config *c)
{
    return (c->mlp_only_layers[0] | c->mlp_only_layers[1] | c->mlp_only_layers[2] | c->mlp_only_layers[3]) != 0;
}

static mt_status moe_fields_check(mt_err err, const mt_model_config *c, const mt_family *f)
{
    const int any = c->num_experts || c->num_experts_per_tok || c->moe_intermediate_size || c->norm_topk_prob ||
                    c->decoder_sparse_step || c->output_router_logits || c->router_aux_loss_coef != 0.0f ||
                    any_dense_layer(c) || c->shared_expert_intermediate_size || c->shared_expert_gate;
    if (f->moe == MT_MOE_NONE) {
        if (any)
            return BAD("num_experts and the other mixture-of-experts fields must be 0 for architecture %u (Qwen3-MoE "
                       "and Mixtral have experts)",
                       c->arch);
        return MT_OK;
    }
    if (c->num_experts == 0 || c->num_experts > MT_MAX_EXPERTS)
        return BAD("num_experts %u is outside [1, %u]", c->num_experts, MT_MAX_EXPERTS);
    if (c->num_experts_per_tok == 0 || c->num_experts_per_tok > c->num_experts)
        return BAD("num_experts_per_tok %u is outside [1, num_experts %u]", c->num_experts_per_tok, c->num_experts);
    if (c->moe_intermediate_size == 0 || c->moe_intermediate_size > 8 * MAX_HIDDEN)
        return BAD("moe_intermediate_size %u is outside [1, %u]", c->moe_intermediate_size, 8 * MAX_HIDDEN);
    if (c->decoder_sparse_step > c->num_hidden_layers)
        return BAD("decoder_sparse_step %u is more than num_hidden_layers %u", c->decoder_sparse_step,
                   c->num_hidden_layers);
    if (!(c->router_aux_loss_coef >= 0.0f) || !isfinite(c->router_aux_loss_coef))
        return BAD("router_aux_loss_coef %g must be finite and >= 0", (double)c->router_aux_loss_coef);
    for (uint32_t l = c->num_hidden_layers; l < 256; l++)
        if (c->mlp_only_layers[l / 64] >> (l % 64) & 1)
            return BAD("mlp_only_layers names layer %u of a model of %u layers", l, c->num_hidden_layers);
    if (!f->shared_block && (c->shared_expert_intermediate_size || c->shared_expert_gate))
        return BAD("shared_expert_intermediate_size %u and shared_expert_gate %u must be 0: %s has no shared expert",
                   c->shared_expert_intermediate_size, c->shared_expert_gate, f->display_name);
    if (c->shared_expert_intermediate_size > 8 * MAX_HIDDEN)
        return BAD("shared_expert_intermediate_size %u is more than %u", c->shared_expert_intermediate_size,
                   8 * MAX_HIDDEN);
    /* transformers builds the gated shared expert of such a family whatever the config says */
    if (f->shared_gate && (!c->shared_expert_intermediate_size || !c->shared_expert_gate))
        return BAD("%s has a gated shared expert in every sparse layer: shared_expert_intermediate_size must be "
                   "positive and shared_expert_gate 1 (got %u, %u)",
                   f->display_name, c->shared_expert_intermediate_size, c->shared_expert_gate);
    if (!f->shared_gate && c->shared_expert_gate)
        return BAD("shared_expert_gate: %s's shared expert has no gate", f->display_name);
    /* MixtralConfig has no key for either: a config.json could not say otherwise */
    if ((f->moe == MT_MOE_MIXTRAL || f->moe == MT_MOE_GPT_OSS) &&
        (!c->norm_topk_prob || c->decoder_sparse_step > 1 || any_dense_layer(c)))
        return BAD("%s renormalises its top-k weights (GPT-OSS: the softmax of the top-k logits, the same) and has "
                   "experts in every layer: norm_topk_prob must be 1, "
                   "decoder_sparse_step 0 or 1 and mlp_only_layers empty",
                   f->display_name);
    return MT_OK;
}

/* Multi-head latent attention (DeepSeek-V2/V3) and DeepSeek's routing; fields other families leave at 0 */
static mt_status mla_fields_check(mt_err err, mt_model_config *c, const mt_family *f)
{
    const int mla = c->kv_lora_rank || c->q_lora_rank || c->qk_nope_head_dim || c->qk_rope_head_dim ||
                    c->v_head_dim || c->rope_interleave;
    if (!(f->flags & MT_FAMILY_MLA)) {
        if (mla)
            return BAD("kv_lora_rank and the other multi-head latent attention fields must be 0 for %s (DeepSeek-V2 "
                       "and DeepSeek-V3 have it)",
                       f->display_name);
        const uint32_t scoring = f->moe == MT_MOE_LLAMA4 ? MT_MOE_SCORING_SIGMOID : MT_MOE_SCORING_SOFTMAX;
        if (c->n_group > 1 || c->topk_group || c->moe_scoring != scoring ||
            (c->routed_scaling_factor != 0.0f && c->routed_scaling_factor != 1.0f))
            return BAD("n_group, topk_group, routed_scaling_factor and moe_scoring are DeepSeek's routing: %s "
                       "routes by the %s's top-k (moe_scoring %u)",
                       f->display_name, scoring ? "sigmoid" : "softmax", scoring);
        return MT_OK;
    }
    if (c->kv_lora_rank == 0 || c->kv_lora_rank > MAX_HIDDEN || c->q_lora_rank > MAX_HIDDEN)
        return BAD("kv_lora_rank %u must be in [1, %u] and q_lora_rank %u at most that (0: no q latent)",
                   c->kv_lora_rank, MAX_HIDDEN, c->q_lora_rank);
    const uint32_t Dn = c->qk_nope_head_dim, Dr = c->qk_rope_head_dim;
    if (Dr < 2 || Dr % 2 || Dn > MAX_HEAD_DIM || Dr > MAX_HEAD_DIM)
        return BAD("qk_rope_head_dim %u must be a positive even number and qk_nope_head_dim %u at most %u", Dr, Dn,
                   MAX_HEAD_DIM);
    if (c->head_dim != Dn + Dr)
        return BAD("head_dim %u must be qk_nope_head_dim + qk_rope_head_dim = %u with multi-head latent attention",
                   c->head_dim, Dn + Dr);
    if (c->v_head_dim == 0 || c->v_head_dim > c->head_dim)
        return BAD("v_head_dim %u must be in [1, qk_nope_head_dim + qk_rope_head_dim = %u]", c->v_head_dim,
                   c->head_dim);
    if (c->num_key_value_heads != c->num_attention_heads)
        return BAD("num_key_value_heads %u must be num_attention_heads %u: multi-head latent attention expands "
                   "every head's key and value",
                   c->num_key_value_heads, c->num_attention_heads);
    if (c->partial_rotary_factor != 0.0f && c->partial_rotary_factor != 1.0f)
        return BAD("partial_rotary_factor %g: multi-head latent attention turns qk_rope_head_dim dimensions",
                   (double)c->partial_rotary_factor);
    if (c->moe_scoring > MT_MOE_SCORING_SIGMOID)
        return BAD("moe_scoring %u is not an mt_moe_scoring value", c->moe_scoring);
    if (!(c->routed_scaling_factor >= 0.0f) || !isfinite(c->routed_scaling_factor))
        return BAD("routed_scaling_factor %g must be finite and >= 0 (0: 1)", (double)c->routed_scaling_factor);
    if (c->n_group > 1 && (c->num_experts % c->n_group || c->topk_group == 0 || c->topk_group > c->n_group))
        return BAD("n_group %u must divide num_experts %u and topk_group %u be in [1, n_group]", c->n_group,
                   c->num_experts, c->topk_group);
    if (c->n_group > 1 && c->moe_scoring == MT_MOE_SCORING_SIGMOID && c->num_experts / c->n_group < 2)
        return BAD("n_group %u leaves fewer than 2 experts a group: DeepSeek-V3 scores a group by its best two",
                   c->n_group);
    if (c->n_group > 1 && c->num_experts_per_tok > c->topk_group * (c->num_experts / c->n_group))
        return BAD("num_experts_per_tok %u is more than the %u experts of topk_group %u groups",
                   c->num_experts_per_tok, c->topk_group * (c->num_experts / c->n_group), c->topk_group);
    if (c->n_group <= 1 && c->topk_group > 1)
        return BAD("topk_group %u needs n_group > 1", c->topk_group);
    if (c->output_router_logits || c->router_aux_loss_coef != 0.0f)
        return BAD("output_router_logits: transformers computes no load-balancing loss for %s", f->display_name);
    const int v3 = f->arch == MT_ARCH_DEEPSEEK_V3;
    if (c->moe_scoring != (v3 ? MT_MOE_SCORING_SIGMOID : MT_MOE_SCORING_SOFTMAX))
        return BAD("moe_scoring %u: %s scores its experts by the %s", c->moe_scoring, f->display_name,
                   v3 ? "sigmoid" : "softmax");
    /* DeepseekV2TopkRouter: RoPE by complex rotation (pairs), the weights never renormalised */
    if (!v3 && (!c->rope_interleave || c->norm_topk_prob))
        return BAD("%s turns RoPE's pairs (2i, 2i + 1) and never renormalises its routing weights: rope_interleave "
                   "must be 1 and norm_topk_prob 0 (got %u, %u)",
                   f->display_name, c->rope_interleave, c->norm_topk_prob);
    /* config.json says which layers are dense by first_k_dense_replace: the first ones */
    int dense = 1;
    for (uint32_t l = 0; l < c->num_hidden_layers && l < 256; l++) {
        const int d = (int)(c->mlp_only_layers[l / 64] >> (l % 64) & 1);
        if (d && !dense)
            return BAD("mlp_only_layers names layer %u after a sparse one: %s's dense layers are the first "
                       "first_k_dense_replace",
                       l, f->display_name);
        dense = d;
    }
    if (c->decoder_sparse_step > 1)
        return BAD("decoder_sparse_step %u: %s has experts in every layer after its first dense ones",
                   c->decoder_sparse_step, f->display_name);
    if (c->shared_expert_intermediate_size % c->moe_intermediate_size)
        return BAD("shared_expert_intermediate_size %u must be a multiple of moe_intermediate_size %u (n_shared_experts "
                   "experts of that width)",
                   c->shared_expert_intermediate_size, c->moe_intermediate_size);
    return MT_OK;
}

static int any_nope_layer(const mt_model_config *c)
{
    return (c->nope_layers[0] | c->nope_layers[1] | c->nope_layers[2] | c->nope_layers[3]) != 0;
}

/* Llama 4's attention and routing; fields other families leave at 0 */
static mt_status llama4_fields_check(mt_err err, const mt_model_config *c, const mt_family *f)
{
    if (c->reserved4) return BAD("mt_model_config.reserved4 must be zero");
    const int any = c->attention_chunk_size || c->qk_l2_norm || c->attn_temperature_floor != 0.0f ||
                    c->attn_temperature_scale != 0.0f || c->moe_input_weighted || any_nope_layer(c);
    if (!(f->flags & MT_FAMILY_CHUNKED_NOPE)) {
        if (any)
            return BAD("attention_chunk_size, qk_l2_norm, the attention temperature, moe_input_weighted and "
                       "nope_layers are Llama 4's: they must be 0 for %s",
                       f->display_name);
        return MT_OK;
    }
    for (uint32_t l = c->num_hidden_layers; l < 256; l++)
        if (c->nope_layers[l / 64] >> (l % 64) & 1)
            return BAD("nope_layers names layer %u of a model of %u layers", l, c->num_hidden_layers);
    if (c->num_hidden_layers > 256 && any_nope_layer(c))
        return BAD("nope_layers covers layers below 256: a model of %u layers is past it", c->num_hidden_layers);
    if (!unset_or_above(c->attn_temperature_floor, 0.0f) || !isfinite(c->attn_temperature_scale))
        return BAD("attn_temperature_floor %g must be 0 or positive and attn_temperature_scale %g finite",
                   (double)c->attn_temperature_floor, (double)c->attn_temperature_scale);
    if (c->attn_temperature_floor == 0.0f && c->attn_temperature_scale != 0.0f)
        return BAD("attn_temperature_scale %g needs attn_temperature_floor (0: no temperature)",
                   (double)c->attn_temperature_scale);
    if (c->sliding_window) return BAD("sliding_window: %s attends in chunks (attention_chunk_size)", f->display_name);
    /* Llama4Router and Llama4TextMoe: sigmoid of the top-k logits, on the experts' input, never renormalised */
    if (!c->moe_input_weighted || c->norm_topk_prob || c->output_router_logits || c->router_aux_loss_coef != 0.0f)
        return BAD("%s weighs each expert's input by the sigmoid of its logit, never renormalised, and computes no "
                   "load-balancing loss: moe_input_weighted must be 1, norm_topk_prob, output_router_logits and "
                   "router_aux_loss_coef 0",
                   f->display_name);
    if (c->shared_expert_intermediate_size != c->moe_intermediate_size)
        return BAD("shared_expert_intermediate_size %u must be moe_intermediate_size %u: %s's shared expert is as "
                   "wide as each routed one",
                   c->shared_expert_intermediate_size, c->moe_intermediate_size, f->display_name);
    return MT_OK;
}

/* Every float of the n that is finite and positive. */
static int all_positive(const float *v, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++)
        if (!(isfinite(v[i]) && v[i] > 0.0f)) return 0;
    return 1;
}

static mt_status rope_fields_check(mt_err err, const mt_model_config *c, const mt_family *f)
{
    const uint32_t s = c->rope_scaling;
    if (s > MT_ROPE_SCALING_LONGROPE) return BAD("rope_scaling %u is not an mt_rope_scaling value", s);
    if (s == MT_ROPE_SCALING_LLAMA3 &&
        (!(c->rope_factor >= 1.0f) || !(c->rope_low_freq_factor > 0.0f) ||
         !(c->rope_high_freq_factor >= c->rope_low_freq_factor) || c->rope_original_max_position == 0))
        return BAD("llama3 rope scaling needs factor >= 1, 0 < low_freq_factor <= high_freq_factor and "
                   "original_max_position > 0 (got %g, %g, %g, %u)",
                   (double)c->rope_factor, (double)c->rope_low_freq_factor, (double)c->rope_high_freq_factor,
                   c->rope_original_max_position);
    if (s == MT_ROPE_SCALING_LINEAR && !(c->rope_factor >= 1.0f && isfinite(c->rope_factor)))
        return BAD("linear rope scaling needs a finite factor >= 1 (got %g)", (double)c->rope_factor);
    if ((s == MT_ROPE_SCALING_YARN || s == MT_ROPE_SCALING_LONGROPE) &&
        (!(c->rope_factor > 0.0f && isfinite(c->rope_factor)) || c->rope_original_max_position == 0))
        return BAD("%s rope scaling needs a positive finite factor and original_max_position > 0 (got %g, %u)",
                   s == MT_ROPE_SCALING_YARN ? "yarn" : "longrope", (double)c->rope_factor,
                   c->rope_original_max_position);
    if (!unset_or_above(c->partial_rotary_factor, 0.0f) || c->partial_rotary_factor > 1.0f)
        return BAD("partial_rotary_factor %g must be 0 (all of each head) or in (0, 1]",
                   (double)c->partial_rotary_factor);
    if (c->partial_rotary_factor != 0.0f && c->partial_rotary_factor != 1.0f) {
        if (!(f->flags & MT_FAMILY_PHI3_ROPE))
            return BAD("partial_rotary_factor %g: %s turns every dimension of a head (Phi-3 may turn part)",
                       (double)c->partial_rotary_factor, f->display_name);
        const uint32_t rd = mt_config_rotary_dims(c);
        if (rd < 2 || rd % 2)
            return BAD("partial_rotary_factor %g turns %u of head_dim %u dimensions: it must be a positive even "
                       "number",
                       (double)c->partial_rotary_factor, rd, c->head_dim);
    }
    const float *yarn[5] = {&c->rope_attention_factor, &c->rope_beta_fast, &c->rope_beta_slow, &c->rope_mscale,
                            &c->rope_mscale_all_dim};
    static const char *const yarn_names[5] = {"rope_attention_factor", "rope_beta_fast", "rope_beta_slow",
                                              "rope_mscale", "rope_mscale_all_dim"};
    for (int i = 0; i < 5; i++) {
        if (!unset_or_above(*yarn[i], 0.0f))
            return BAD("%s %g must be 0 (the default) or a positive finite number", yarn_names[i], (double)*yarn[i]);
        /* the attention factor is yarn's and longrope's; the others yarn's alone */
        if (*yarn[i] != 0.0f && s != MT_ROPE_SCALING_YARN && (i || s != MT_ROPE_SCALING_LONGROPE))
            return BAD("%s is a setting of %s rope scaling: it must be 0 for rope_scaling %u", yarn_names[i],
                       i ? "yarn" : "yarn or longrope", s);
    }
    if (c->rope_no_truncate && s != MT_ROPE_SCALING_YARN)
        return BAD("rope_no_truncate is a setting of yarn rope scaling: it must be 0 for rope_scaling %u", s);
    const uint32_t n = s == MT_ROPE_SCALING_LONGROPE ? mt_config_rotary_dims(c) / 2 : 0;
    if (s == MT_ROPE_SCALING_LONGROPE && n > 128)
        return BAD("longrope with %u rotary dimensions: at most 256 are supported (128 factors)", 2 * n);
    if (c->rope_n_factors != n)
        return BAD("rope_n_factors %u: %s", c->rope_n_factors,
                   n ? "longrope has one short and one long factor per pair of rotary dimensions" : "only longrope has factors");
    if (!all_positive(c->rope_short_factor, n) || !all_positive(c->rope_long_factor, n))
        return BAD("longrope's short and long factors must be positive finite numbers");
    for (uint32_t i = n; i < 128; i++)
        if (c->rope_short_factor[i] != 0.0f || c->rope_long_factor[i] != 0.0f)
            return BAD("rope_short_factor and rope_long_factor must be 0 past their rope_n_factors %u entries", n);
    return MT_OK;
}

static mt_status window_fields_check(mt_err err, const mt_model_config *c, const mt_family *f)
{
    if (!c->sliding_window) {
        if (c->sliding_window_pattern || c->max_window_layers)
            return BAD("sliding_window_pattern %u and max_window_layers %u need a sliding_window",
                       c->sliding_window_pattern, c->max_window_layers);
        return MT_OK;
    }
    if (f->window == MT_WINDOW_NONE)
        return BAD("sliding_window %u: %s has no sliding-window attention (Mistral, Qwen2, Qwen3 and Phi-3 do)",
                   c->sliding_window, f->display_name);
    /* its config.json has no key for either: a config that sets them could not be saved */
    if (f->window == MT_WINDOW_EVERY_LAYER && (c->sliding_window_pattern || c->max_window_layers))
        return BAD("%s slides every layer: sliding_window_pattern %u and max_window_layers %u must be 0",
                   f->display_name, c->sliding_window_pattern, c->max_window_layers);
    /* Qwen2MoeConfig's rule (every even layer below max_window_layers) holds no other shape */
    if (f->window == MT_WINDOW_EVEN_BELOW && (c->max_window_layers || (c->num_hidden_layers > 1 && c->sliding_window_pattern != 2)))
        return BAD("%s slides every even layer or none: max_window_layers must be 0 and sliding_window_pattern 2 "
                   "(got %u, %u)",
                   f->display_name, c->max_window_layers, c->sliding_window_pattern);
    if (c->sliding_window_pattern == 1 || c->sliding_window_pattern > c->num_hidden_layers)
        return BAD("sliding_window_pattern %u must be 0 or between 2 and num_hidden_layers %u",
                   c->sliding_window_pattern, c->num_hidden_layers);
    if (c->max_window_layers > c->num_hidden_layers)
        return BAD("max_window_layers %u is more than num_hidden_layers %u", c->max_window_layers,
                   c->num_hidden_layers);
    return MT_OK;
}

mt_status mt_config_import(mt_err err, mt_model_config *c, const mt_model_config *src)
{
    mt_model_config_init(c);
    mt_status st = mt_copy_in(err, c, sizeof *c, src, MT_FIRST_SIZE_MODEL_CONFIG, "mt_model_config");
    if (st) return st;
    const mt_family *f = mt_family_of(c->arch);
    if (!f) return BAD("mt_model_config.arch %u is not an mt_arch value", c->arch);
    if (c->precision > MT_PRECISION_LEAN)
        return BAD("mt_model_config.precision %u is not an mt_precision value", c->precision);
    if (c->vocab_size < 2 || c->vocab_size > MAX_VOCAB)
        return BAD("vocab_size %u is outside [2, %u]", c->vocab_size, MAX_VOCAB);
    if (c->hidden_size == 0 || c->hidden_size > MAX_HIDDEN)
        return BAD("hidden_size %u is outside [1, %u]", c->hidden_size, MAX_HIDDEN);
    if (c->intermediate_size == 0 || c->intermediate_size > 8 * MAX_HIDDEN)
        return BAD("intermediate_size %u is outside [1, %u]", c->intermediate_size, 8 * MAX_HIDDEN);
    if (c->num_hidden_layers == 0 || c->num_hidden_layers > MAX_LAYERS)
        return BAD("num_hidden_layers %u is outside [1, %u]", c->num_hidden_layers, MAX_LAYERS);
    if (c->num_attention_heads == 0 || c->num_attention_heads > MAX_HEADS)
        return BAD("num_attention_heads %u is outside [1, %u]", c->num_attention_heads, MAX_HEADS);
    if (c->num_key_value_heads == 0 || c->num_attention_heads % c->num_key_value_heads)
        return BAD("num_key_value_heads %u must divide num_attention_heads %u", c->num_key_value_heads,
                   c->num_attention_heads);
    if (c->head_dim == 0 && c->kv_lora_rank) c->head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim; /* MLA */
    if (c->head_dim == 0) {
        if (c->hidden_size % c->num_attention_heads)
            return BAD("hidden_size %u is not a multiple of num_attention_heads %u (set head_dim)", c->hidden_size,
                       c->num_attention_heads);
        c->head_dim = c->hidden_size / c->num_attention_heads;
    }
    if (c->head_dim > MAX_HEAD_DIM || c->head_dim % 2)
        return BAD("head_dim %u must be even and at most %u", c->head_dim, MAX_HEAD_DIM);
    if (c->max_position_embeddings == 0) return BAD("max_position_embeddings is 0");
    if (!(c->rms_norm_eps > 0.0f) || !isfinite(c->rms_norm_eps))
        return BAD("rms_norm_eps %g must be a positive finite number", (double)c->rms_norm_eps);
    if (!(c->rope_theta > 1.0f) || !isfinite(c->rope_theta))
        return BAD("rope_theta %g must be a finite number above 1", (double)c->rope_theta);
    if ((st = rope_fields_check(err, c, f))) return st;
    if (!(c->initializer_range >= 0.0f) || !isfinite(c->initializer_range))
        return BAD("initializer_range %g must be finite and >= 0", (double)c->initializer_range);
    if (c->reserved0) return BAD("mt_model_config.reserved0 must be zero");
    if (c->reserved1) return BAD("mt_model_config.reserved1 must be zero");
    if (c->reserved2) return BAD("mt_model_config.reserved2 must be zero");
    if (c->reserved3) return BAD("mt_model_config.reserved3 must be zero");
    if (c->pad_token_id < -1 || c->pad_token_id >= (int64_t)c->vocab_size)
        return BAD("pad_token_id %d is outside the vocabulary [0, %u) (-1: no padding row)", c->pad_token_id,
                   c->vocab_size);
    if ((st = gemma_fields_check(err, c, f)) || (st = moe_fields_check(err, c, f)) || (st = mla_fields_check(err, c, f)) ||
        (st = llama4_fields_check(err, c, f)))
        return st;
    if ((f->flags & MT_FAMILY_FUSED) && c->attention_bias)
        return BAD("attention_bias: %s's fused qkv_proj has no bias", f->display_name);
    return window_fields_check(err, c, f);
}
#undef BAD

size_t mt_config_first_set_past(const mt_model_config *c, size_t known)
{
    mt_model_config d;
    mt_model_config_init(&d);
    for (size_t i = known; i < sizeof *c; i++)
        if (((const unsigned char *)c)[i] != ((const unsigned char *)&d)[i]) return i;
    return sizeof *c;
}

const char *mt_config_field_group(size_t byte)
{
    static const struct {
        size_t from;
        const char *what;
    } groups[] = { /* the fields appended since 0.1, by the first of each group */
        {offsetof(mt_model_config, attention_chunk_size), "Llama 4's attention and routing"},
        {offsetof(mt_model_config, kv_lora_rank), "multi-head latent attention and DeepSeek's routing"},
        {offsetof(mt_model_config, partial_rotary_factor), "partial rotary, YaRN and LongRoPE"},
        {offsetof(mt_model_config, shared_expert_intermediate_size), "the shared expert"},
        {offsetof(mt_model_config, pad_token_id), "the padding row"},
        {offsetof(mt_model_config, num_experts), "mixture of experts"},
        {offsetof(mt_model_config, query_pre_attn_scalar), "Gemma's settings"},
        {offsetof(mt_model_config, sliding_window), "the sliding window"},
    };
    for (size_t i = 0; i < sizeof groups / sizeof groups[0]; i++)
        if (byte >= groups[i].from) return groups[i].what;
    return "the model's shape";
}

