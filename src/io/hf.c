#define _GNU_SOURCE
/* Hugging Face model folders: config.json, model.safetensors (or shards
 * listed by model.safetensors.index.json). See docs/formats.md. */
#include "io/hf.h"
#include "io/fileio.h"
#include "io/safetensors.h"
#include "optim/q16.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- config.json ----------------------------------------------------------- */

/* An unsigned integer field. required: absence is an error; else *out keeps its value. */
static mt_status get_u32(mt_err err, const cJSON *o, const char *key, uint32_t *out, int required, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return mt_fail(err, MT_ERR_FORMAT, "%s lacks \"%s\"", path, key);
        return MT_OK;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0) || v->valuedouble != floor(v->valuedouble))
        return mt_fail(err, MT_ERR_FORMAT, "%s: \"%s\" must be a non-negative integer", path, key);
    if (v->valuedouble > 4294967295.0) /* an integer, but not one a uint32 holds */
        return mt_fail(err, MT_ERR_FORMAT, "%s: \"%s\" is %.17g, above the largest this library reads (4294967295)",
                       path, key, v->valuedouble);
    *out = (uint32_t)v->valuedouble;
    return MT_OK;
}

static mt_status get_float(mt_err err, const cJSON *o, const char *key, float *out, int required, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) {
        if (required) return mt_fail(err, MT_ERR_FORMAT, "%s lacks \"%s\"", path, key);
        return MT_OK;
    }
    if (!cJSON_IsNumber(v)) return mt_fail(err, MT_ERR_FORMAT, "%s: \"%s\" must be a number", path, key);
    *out = (float)v->valuedouble;
    return MT_OK;
}

static mt_status get_bool(mt_err err, const cJSON *o, const char *key, uint32_t *out, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return MT_OK;
    if (!cJSON_IsBool(v)) return mt_fail(err, MT_ERR_FORMAT, "%s: \"%s\" must be true or false", path, key);
    *out = cJSON_IsTrue(v) ? 1u : 0u;
    return MT_OK;
}

/* Sliding-window attention, as transformers reads it (mt_family.window):
 * Mistral and Phi-3 slide every layer when sliding_window is set; Qwen2 and
 * Qwen3 the layers from max_window_layers on when use_sliding_window is true;
 * Gemma one layer in a pattern attends fully; "layer_types" (one per layer,
 * written by transformers 4.53 and later), where present, says which layers
 * slide, and must be a shape mt_model_config can hold. */
static mt_status sliding_window_from_json(mt_err err, mt_model_config *c, const mt_family *f, const cJSON *j,
                                          const char *path)
{
    mt_status st;
    const uint32_t L = c->num_hidden_layers;
    uint32_t W = f->window_default, mwl = 0;
    if ((st = get_u32(err, j, "sliding_window", &W, 0, path))) return st;
    if (f->window == MT_WINDOW_NONE) {
        /* LlamaForCausalLM has no window: one that covers every position is harmless */
        if (W && W < c->max_position_embeddings)
            return mt_fail(err, MT_ERR_UNSUPPORTED,
                           "%s: sliding_window %u (shorter than max_position_embeddings %u) in a %s model is not "
                           "supported (Mistral, Qwen2, Qwen3 and Phi-3 have sliding windows)",
                           path, W, c->max_position_embeddings, f->display_name);
        W = 0;
    } else if (f->window == MT_WINDOW_FROM_LAYER || f->window == MT_WINDOW_EVEN_BELOW) {
        uint32_t use = 0;
        if ((st = get_bool(err, j, "use_sliding_window", &use, path))) return st;
        if (!use) W = 0;
        if (use && !W)
            return mt_fail(err, MT_ERR_FORMAT, "%s: use_sliding_window is true but sliding_window is not set", path);
        mwl = f->max_window_layers; /* transformers' default */
        if ((st = get_u32(err, j, "max_window_layers", &mwl, 0, path))) return st;
    }
    /* the layers that slide: from max_window_layers on, one in P attending fully */
    uint32_t P = 0, first = W ? MT_MIN(mwl, L) : L; /* first == L: no layer slides */
    if (f->window == MT_WINDOW_EVEN_BELOW && W) {
        /* Qwen2MoeConfig: layer i slides when i is even and below max_window_layers; of those rules only
         * none, or every even layer (P = 2 from layer 0), is a shape mt_model_config holds */
        const uint32_t last_even = (L - 1) & ~1u;
        if (mwl == 0) {
            first = L;
        } else if (last_even < mwl) {
            first = 0, P = L > 1 ? 2 : 0;
        } else {
            return mt_fail(err, MT_ERR_UNSUPPORTED,
                           "%s: use_sliding_window with max_window_layers %u of %u layers: %s slides the even layers "
                           "below it only, which is not supported (every even layer or none is: max_window_layers "
                           ">= %u or 0)",
                           path, mwl, L, f->display_name, last_even + 1);
        }
    }
    if (f->window == MT_WINDOW_PATTERN) {
        /* Gemma 2: every other layer (transformers 4 wrote no pattern); Gemma 3: sliding_window_pattern */
        P = f->window_pattern;
        if (f->window_pattern_key && (st = get_u32(err, j, f->window_pattern_key, &P, 0, path))) return st;
        if (P == 1) first = L; /* every layer attends fully */
        if (P > L) P = 0;      /* no full layer among these: every layer slides */
    }
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    if (lt && !cJSON_IsNull(lt) && !(f->flags & MT_FAMILY_CHUNKED_NOPE)) { /* Llama 4's: llama4_from_json */
        if (!cJSON_IsArray(lt)) return mt_fail(err, MT_ERR_FORMAT, "%s: \"layer_types\" must be a list", path);
        if ((uint32_t)cJSON_GetArraySize(lt) != L)
            return mt_fail(err, MT_ERR_FORMAT, "%s: \"layer_types\" has %d entries for %u layers", path,
                           cJSON_GetArraySize(lt), L);
        uint32_t i = 0, g = L; /* g: the first full layer after the first sliding one */
        first = L;
        for (const cJSON *e = lt->child; e; e = e->next, i++) {
            if (!cJSON_IsString(e))
                return mt_fail(err, MT_ERR_FORMAT, "%s: \"layer_types\" must be a list of names", path);
            const int slides = !strcmp(e->valuestring, "sliding_attention");
            if (!slides && strcmp(e->valuestring, "full_attention") != 0)
                return mt_fail(err, MT_ERR_UNSUPPORTED,
                               "%s: layer_types[%u] is %s: only full_attention and sliding_attention layers are "
                               "supported",
                               path, i, e->valuestring);
            if (slides && first == L) first = i;
            if (!slides && first < L && g == L) g = i;
        }
        if (first < L && !W)
            return mt_fail(err, MT_ERR_FORMAT,
                           "%s: layer_types[%u] is sliding_attention but the model has no sliding_window%s", path,
                           first, f->window == MT_WINDOW_FROM_LAYER ? " (use_sliding_window)" : "");
        P = g < L ? g + 1 : 0;
        i = 0;
        for (const cJSON *e = lt->child; e; e = e->next, i++) {
            const int slides = !strcmp(e->valuestring, "sliding_attention");
            if (slides != (i >= first && (P == 0 || (i + 1) % P != 0)))
                return mt_fail(err, MT_ERR_UNSUPPORTED,
                               "%s: layer_types: layer %u %s, which does not follow the pattern of the layers before "
                               "it (full layers, then sliding ones with every P-th full)",
                               path, i, slides ? "slides" : "attends fully");
        }
    }
    if (W && first < L) {
        c->sliding_window = W;
        c->max_window_layers = first;
        c->sliding_window_pattern = P;
    }
    return MT_OK;
}

/* An optional number that may be null (0 here, "none"); def where absent. */
static mt_status get_float_or_null(mt_err err, const cJSON *o, const char *key, float *out, float def,
                                   const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    *out = !v ? def : 0.0f;
    return v && !cJSON_IsNull(v) ? get_float(err, o, key, out, 1, path) : MT_OK;
}

/* Gemma's own keys (MT_FAMILY_GEMMA_CONFIG), with transformers' defaults where a key is absent. */
static mt_status gemma_from_json(mt_err err, mt_model_config *c, const mt_family *f, const cJSON *j,
                                 const char *path)
{
    mt_status st;
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_activation");
    if (!act || cJSON_IsNull(act)) act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (act && !cJSON_IsNull(act) && (!cJSON_IsString(act) || strcmp(act->valuestring, f->hidden_act) != 0))
        return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: hidden_activation %s is not supported (Gemma's is %s)", path,
                       cJSON_IsString(act) ? act->valuestring : "(not a name)", f->hidden_act);
    c->query_pre_attn_scalar = f->query_pre_attn_scalar;
    if ((st = get_float(err, j, "query_pre_attn_scalar", &c->query_pre_attn_scalar, 0, path)) ||
        (st = get_float_or_null(err, j, "attn_logit_softcapping", &c->attn_logit_softcapping, f->attn_softcap, path)) ||
        (st = get_float_or_null(err, j, "final_logit_softcapping", &c->final_logit_softcapping, f->final_softcap,
                                path)))
        return st;
    if (f->flags & MT_FAMILY_LOCAL_ROPE) {
        c->rope_local_base_freq = f->rope_local_base_freq;
        if ((st = get_float(err, j, "rope_local_base_freq", &c->rope_local_base_freq, 0, path))) return st;
        uint32_t bidirectional = 0;
        if ((st = get_bool(err, j, "use_bidirectional_attention", &bidirectional, path))) return st;
        if (bidirectional)
            return mt_fail(err, MT_ERR_UNSUPPORTED,
                           "%s: use_bidirectional_attention true (an encoder's attention) is not supported: only "
                           "causal decoders train here",
                           path);
    }
    return MT_OK;
}

/* partial_rotary_factor of o (the config, or its rope_parameters) where present: only Phi-3's
 * attention turns part of each head; the others' a factor other than 1 could not run in transformers. */
static mt_status get_partial_rotary(mt_err err, mt_model_config *c, const mt_family *f, const cJSON *o,
                                    const char *path)
{
    float r = c->partial_rotary_factor != 0.0f ? c->partial_rotary_factor : 1.0f;
    mt_status st = get_float(err, o, "partial_rotary_factor", &r, 0, path);
    if (st) return st;
    if (!(r > 0.0f && r <= 1.0f))
        return mt_fail(err, MT_ERR_FORMAT, "%s: partial_rotary_factor %g must be in (0, 1]", path, (double)r);
    if (r != 1.0f && !(f->flags & MT_FAMILY_PHI3_ROPE))
        return mt_fail(err, MT_ERR_UNSUPPORTED,
                       "%s: partial_rotary_factor %g is not supported for %s (its attention turns every dimension "
                       "of a head; Phi-3's may turn part)",
                       path, (double)r, f->display_name);
    c->partial_rotary_factor = r == 1.0f ? 0.0f : r;
    return MT_OK;
}

/* A list of n positive numbers (longrope's factors) into out[n]: FORMAT where it is not one. */
static mt_status get_factors(mt_err err, const cJSON *o, const char *key, float *out, uint32_t n, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
    if (!v || cJSON_IsNull(v)) return mt_fail(err, MT_ERR_FORMAT, "%s: longrope lacks \"%s\"", path, key);
    if (!cJSON_IsArray(v) || (uint32_t)cJSON_GetArraySize(v) != n)
        return mt_fail(err, MT_ERR_FORMAT, "%s: \"%s\" must be a list of %u numbers (one per pair of rotary dimensions)",
                       path, key, n);
    uint32_t i = 0;
    for (const cJSON *e = v->child; e; e = e->next, i++) {
        if (!cJSON_IsNumber(e) || !(e->valuedouble > 0.0) || !isfinite(e->valuedouble))
            return mt_fail(err, MT_ERR_FORMAT, "%s: %s[%u] must be a positive number", path, key, i);
        out[i] = (float)e->valuedouble;
    }
    return MT_OK;
}

/* One RoPE description (rope_scaling, or an entry of rope_parameters) rs into c's global fields, with
 * transformers' defaults: the pretraining length (llama3, yarn, longrope) is a top-level
 * original_max_position_embeddings where the config has one (Phi3Config always: 4096 by default),
 * else rs's, else max_position_embeddings; yarn's and longrope's factor, where null, the ratio of the
 * two lengths. c's max_position_embeddings and partial_rotary_factor are read already. */
static mt_status rope_type_from_json(mt_err err, mt_model_config *c, const mt_family *f, const cJSON *j,
                                     const cJSON *rs, const char *path)
{
    mt_status st;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    if (!t) t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t))
        return mt_fail(err, MT_ERR_FORMAT, "%s: \"rope_scaling\" has no \"rope_type\" (or \"type\")", path);
    const char *type = t->valuestring;
    /* Phi3Config reads its su and yarn as longrope, and knows no other scaling */
    if ((f->flags & MT_FAMILY_PHI3_ROPE) && (!strcmp(type, "su") || !strcmp(type, "yarn"))) type = "longrope";
    if ((f->flags & MT_FAMILY_PHI3_ROPE) && strcmp(type, "default") != 0 && strcmp(type, "longrope") != 0)
        return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: rope_scaling type %s: %s has only the default and longrope",
                       path, type, f->display_name);
    const int scaled = !strcmp(type, "llama3") || !strcmp(type, "yarn") || !strcmp(type, "longrope");
    if (scaled) {
        uint32_t orig = c->max_position_embeddings;
        const cJSON *top = cJSON_GetObjectItemCaseSensitive(j, "original_max_position_embeddings");
        if ((f->flags & MT_FAMILY_PHI3_ROPE) && !top) orig = 4096; /* Phi3Config's default */
        else if ((st = get_u32(err, rs, "original_max_position_embeddings", &orig, 0, path))) return st;
        if (top && (st = get_u32(err, j, "original_max_position_embeddings", &orig, 0, path))) return st;
        if (orig == 0) return mt_fail(err, MT_ERR_FORMAT, "%s: original_max_position_embeddings is 0", path);
        c->rope_original_max_position = orig;
    }
    const float ratio = (float)((double)c->max_position_embeddings / (double)c->rope_original_max_position);
    if (!strcmp(type, "llama3")) {
        c->rope_scaling = MT_ROPE_SCALING_LLAMA3;
        if ((st = get_float(err, rs, "factor", &c->rope_factor, 1, path)) ||
            (st = get_float(err, rs, "low_freq_factor", &c->rope_low_freq_factor, 1, path)) ||
            (st = get_float(err, rs, "high_freq_factor", &c->rope_high_freq_factor, 1, path)))
            return st;
    } else if (!strcmp(type, "linear")) {
        c->rope_scaling = MT_ROPE_SCALING_LINEAR;
        if ((st = get_float(err, rs, "factor", &c->rope_factor, 1, path))) return st;
    } else if (!strcmp(type, "yarn")) {
        c->rope_scaling = MT_ROPE_SCALING_YARN;
        if (!cJSON_HasObjectItem(rs, "factor")) /* _compute_yarn_parameters indexes it */
            return mt_fail(err, MT_ERR_FORMAT, "%s: yarn rope_scaling lacks \"factor\"", path);
        c->rope_factor = ratio;
        uint32_t truncate = 1;
        if ((st = get_float(err, rs, "factor", &c->rope_factor, 0, path)) ||
            (st = get_float(err, rs, "attention_factor", &c->rope_attention_factor, 0, path)) ||
            (st = get_float(err, rs, "beta_fast", &c->rope_beta_fast, 0, path)) ||
            (st = get_float(err, rs, "beta_slow", &c->rope_beta_slow, 0, path)) ||
            (st = get_float(err, rs, "mscale", &c->rope_mscale, 0, path)) ||
            (st = get_float(err, rs, "mscale_all_dim", &c->rope_mscale_all_dim, 0, path)) ||
            (st = get_bool(err, rs, "truncate", &truncate, path)))
            return st;
        c->rope_no_truncate = !truncate;
    } else if (!strcmp(type, "longrope")) {
        c->rope_scaling = MT_ROPE_SCALING_LONGROPE;
        mt_model_config shape = *c; /* head_dim as mt_config_import resolves it */
        if (!shape.head_dim && shape.num_attention_heads) shape.head_dim = shape.hidden_size / shape.num_attention_heads;
        const uint32_t n = mt_config_rotary_dims(&shape) / 2;
        if (n > 128)
            return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: longrope over %u rotary dimensions: at most 256 are supported",
                           path, 2 * n);
        c->rope_factor = ratio;
        c->rope_n_factors = n;
        if ((st = get_float(err, rs, "factor", &c->rope_factor, 0, path)) ||
            (st = get_float(err, rs, "attention_factor", &c->rope_attention_factor, 0, path)) ||
            (st = get_factors(err, rs, "short_factor", c->rope_short_factor, n, path)) ||
            (st = get_factors(err, rs, "long_factor", c->rope_long_factor, n, path)))
            return st;
    } else if (strcmp(type, "default") != 0) {
        return mt_fail(err, MT_ERR_UNSUPPORTED,
                       "%s: rope_scaling type %s is not supported (llama3, linear, yarn and longrope are)", path, type);
    }
    return MT_OK;
}

/* The number of experts: "num_experts" (Qwen3-MoE's Hub configs) or "num_local_experts" (Mixtral's);
 * transformers 5 maps either name to the other, so a folder it saved may hold the other one, or both. */
static mt_status get_experts(mt_err err, const cJSON *j, uint32_t *out, const char *path)
{
    const uint32_t unset = UINT32_MAX;
    uint32_t a = unset, b = unset;
    mt_status st;
    if ((st = get_u32(err, j, "num_experts", &a, 0, path)) || (st = get_u32(err, j, "num_local_experts", &b, 0, path)))
        return st;
    if (a != unset && b != unset && a != b)
        return mt_fail(err, MT_ERR_FORMAT, "%s: num_experts %u and num_local_experts %u disagree", path, a, b);
    if (a != unset) *out = a;
    else if (b != unset) *out = b;
    return MT_OK;
}

/* DeepseekV3Config's experts and multi-head latent attention, with its defaults where a key is absent.
 * Its config.json's head_dim is qk_rope_head_dim (DeepseekV3Config sets it so); the library's head_dim is
 * the q/k head, qk_nope_head_dim + qk_rope_head_dim. Keys of DeepSeek's own code that transformers ignores
 * (scoring_func "sigmoid", topk_method "noaux_tc", num_nextn_predict_layers: the multi-token prediction
 * layers, whose weights it does not load) are checked where they would say another model. */
static mt_status deepseek_moe_from_json(mt_err err, mt_model_config *c, const mt_family *f, const cJSON *j,
                                        const char *path)
{
    mt_status st;
    const int v3 = f->arch == MT_ARCH_DEEPSEEK_V3; /* DeepseekV3Config's defaults, else DeepseekV2Config's */
    uint32_t dense = v3 ? 3 : 0, shared = v3 ? 1 : 2, q_lora = 1536, interleave = 1, norm = v3;
    const uint32_t unset = UINT32_MAX;
    uint32_t n_routed = unset, n_local = unset;
    c->moe_intermediate_size = f->expert_ffn;
    c->kv_lora_rank = 512, c->qk_nope_head_dim = 128, c->qk_rope_head_dim = 64, c->v_head_dim = 128;
    c->n_group = v3 ? 8 : 0, c->topk_group = v3 ? 4 : 0, c->routed_scaling_factor = v3 ? 2.5f : 1.0f;
    c->num_experts_per_tok = v3 ? 8 : 0;
    if (!v3) { /* DeepseekV2TopkRouter: "greedy" (no groups) or "group_limited_greedy" */
        const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "topk_method");
        const char *method = cJSON_IsString(tm) ? tm->valuestring : "greedy";
        const int grouped = !strcmp(method, "group_limited_greedy");
        if (!grouped && strcmp(method, "greedy") != 0)
            return mt_fail(err, MT_ERR_UNSUPPORTED,
                           "%s: topk_method %s: DeepseekV2ForCausalLM chooses its experts by \"greedy\" or "
                           "\"group_limited_greedy\" (transformers has no other)",
                           path, method);
        if (grouped) {
            const cJSON *g = cJSON_GetObjectItemCaseSensitive(j, "n_group"), *tg = cJSON_GetObjectItemCaseSensitive(j, "topk_group");
            if (!cJSON_IsNumber(g) || !cJSON_IsNumber(tg))
                return mt_fail(err, MT_ERR_FORMAT, "%s: topk_method group_limited_greedy needs n_group and topk_group",
                               path);
            if ((st = get_u32(err, j, "n_group", &c->n_group, 1, path)) ||
                (st = get_u32(err, j, "topk_group", &c->topk_group, 1, path)))
                return st;
        }
    }
    if ((st = get_u32(err, j, "n_routed_experts", &n_routed, 0, path)) ||
        (st = get_u32(err, j, "num_local_experts", &n_local, 0, path)) ||
        (st = get_u32(err, j, "num_experts", &n_local, 0, path)) ||
        (st = get_u32(err, j, "num_experts_per_tok", &c->num_experts_per_tok, 0, path)) ||
        (st = get_u32(err, j, "moe_intermediate_size", &c->moe_intermediate_size, 0, path)) ||
        (st = get_u32(err, j, "n_shared_experts", &shared, 0, path)) ||
        (st = get_u32(err, j, "first_k_dense_replace", &dense, 0, path)) ||
        (v3 && (st = get_u32(err, j, "n_group", &c->n_group, 0, path))) ||
        (v3 && (st = get_u32(err, j, "topk_group", &c->topk_group, 0, path))) ||
        (st = get_float(err, j, "routed_scaling_factor", &c->routed_scaling_factor, 0, path)) ||
        (st = get_bool(err, j, "norm_topk_prob", &norm, path)) ||
        (st = get_u32(err, j, "kv_lora_rank", &c->kv_lora_rank, 0, path)) ||
        (st = get_u32(err, j, "qk_nope_head_dim", &c->qk_nope_head_dim, 0, path)) ||
        (st = get_u32(err, j, "qk_rope_head_dim", &c->qk_rope_head_dim, 0, path)) ||
        (st = get_u32(err, j, "v_head_dim", &c->v_head_dim, 0, path)) ||
        (st = get_bool(err, j, "rope_interleave", &interleave, path)))
        return st;
    if (n_routed != unset && n_local != unset && n_routed != n_local)
        return mt_fail(err, MT_ERR_FORMAT, "%s: n_routed_experts %u and num_local_experts %u disagree", path,
                       n_routed, n_local);
    if (n_routed != unset) c->num_experts = n_routed;
    else if (n_local != unset) c->num_experts = n_local;
    const cJSON *ql = cJSON_GetObjectItemCaseSensitive(j, "q_lora_rank");
    if (ql && cJSON_IsNull(ql)) q_lora = 0; /* q_proj from the hidden state (DeepSeek-V2-Lite's shape) */
    else if ((st = get_u32(err, j, "q_lora_rank", &q_lora, 0, path))) return st;
    if (c->num_experts_per_tok == 0)
        return mt_fail(err, MT_ERR_FORMAT, "%s: num_experts_per_tok is missing (DeepseekV2Config has no default)",
                       path);
    /* DeepseekV2's router reads no norm_topk_prob (never renormalises) and turns RoPE's pairs always */
    c->q_lora_rank = q_lora, c->rope_interleave = v3 ? interleave : 1, c->norm_topk_prob = v3 ? norm : 0;
    c->moe_scoring = v3 ? MT_MOE_SCORING_SIGMOID : MT_MOE_SCORING_SOFTMAX;
    if (c->n_group == 1 && c->topk_group <= 1) c->n_group = 0, c->topk_group = 0; /* one group: no limit */
    const cJSON *sf = cJSON_GetObjectItemCaseSensitive(j, "scoring_func");
    if (cJSON_IsString(sf) && strcmp(sf->valuestring, v3 ? "sigmoid" : "softmax") != 0)
        return mt_fail(err, MT_ERR_UNSUPPORTED,
                       "%s: scoring_func %s: %s scores its experts by the %s (transformers reads no other)", path,
                       sf->valuestring, f->architecture, v3 ? "sigmoid" : "softmax");
    const cJSON *hd = cJSON_GetObjectItemCaseSensitive(j, "head_dim");
    if (cJSON_IsNumber(hd) && hd->valuedouble != (double)c->qk_rope_head_dim &&
        hd->valuedouble != (double)(c->qk_nope_head_dim + c->qk_rope_head_dim))
        return mt_fail(err, MT_ERR_FORMAT, "%s: head_dim %.0f is neither qk_rope_head_dim %u nor the q/k head %u", path,
                       hd->valuedouble, c->qk_rope_head_dim, c->qk_nope_head_dim + c->qk_rope_head_dim);
    c->head_dim = c->qk_nope_head_dim + c->qk_rope_head_dim;
    if (c->num_experts == 0)
        return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: n_routed_experts 0 (a %s model without experts) is not supported",
                       path, f->display_name);
    if (shared > 64 || (uint64_t)shared * c->moe_intermediate_size > 0xFFFFFFFFu)
        return mt_fail(err, MT_ERR_FORMAT, "%s: n_shared_experts %u is out of range", path, shared);
    c->shared_expert_intermediate_size = shared * c->moe_intermediate_size, c->shared_expert_gate = 0;
    if (dense > c->num_hidden_layers)
        return mt_fail(err, MT_ERR_FORMAT, "%s: first_k_dense_replace %u is more than num_hidden_layers %u", path, dense,
                       c->num_hidden_layers);
    if (dense > 256)
        return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: first_k_dense_replace %u: only layers below 256 can be dense",
                       path, dense);
    for (uint32_t l = 0; l < dense; l++) c->mlp_only_layers[l / 64] |= (uint64_t)1 << (l % 64);
    c->decoder_sparse_step = 1;
    c->router_aux_loss_coef = 0.0f, c->output_router_logits = 0; /* transformers computes none for it */
    return MT_OK;
}

/* A list of num_hidden_layers 0/1 flags (Llama4TextConfig's no_rope_layers) into out; left as it is when
 * absent, null or empty (Llama4TextConfig then takes its default) */
static mt_status get_layer_flags(mt_err err, const cJSON *j, const char *key, uint32_t L, int *out, const char *path)
{
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key);
    if (!a || cJSON_IsNull(a) || (cJSON_IsArray(a) && !a->child)) return MT_OK; /* [] too: Python's falsy list */
    if (!cJSON_IsArray(a) || (uint32_t)cJSON_GetArraySize(a) != L)
        return mt_fail(err, MT_ERR_FORMAT, "%s: \"%s\" must be a list of one 0 or 1 a layer (%u layers)", path, key, L);
    uint32_t l = 0;
    for (const cJSON *e = a->child; e; e = e->next, l++) {
        if (!(cJSON_IsNumber(e) || cJSON_IsBool(e)) || (cJSON_IsNumber(e) && e->valuedouble != 0 && e->valuedouble != 1))
            return mt_fail(err, MT_ERR_FORMAT, "%s: \"%s\"[%u] must be 0 or 1", path, key, l);
        out[l] = cJSON_IsNumber(e) ? e->valuedouble != 0 : cJSON_IsTrue(e);
    }
    return MT_OK;
}

/* Llama4TextConfig's experts and attention, with its defaults where a key is absent. Its intermediate_size
 * is each expert's width (and the shared expert's), intermediate_size_mlp the dense layers'; the sparse
 * layers are every interleave_moe_layer_step-th or those moe_layers names. no_rope_layers[l] is 1 where
 * layer l HAS RoPE (transformers' name): by default every layer but each no_rope_layer_interval-th; the
 * layers with RoPE attend in chunks of attention_chunk_size (layer_types "chunked_attention"), the others
 * fully. Llama4ForCausalLM adds no load-balancing loss and its router no jitter, whatever the config says. */
static mt_status llama4_from_json(mt_err err, mt_model_config *c, const mt_family *f, const cJSON *j,
                                  const char *path)
{
    mt_status st;
    const uint32_t L = c->num_hidden_layers;
    uint32_t step = 1, interval = 4, chunk = 8192, qk_norm = 1, tuning = 1;
    float floor_scale = 8192.0f, scale = 0.1f;
    c->moe_intermediate_size = c->intermediate_size; /* read as the model's: the experts' */
    c->intermediate_size = 16384;
    const cJSON *cs = cJSON_GetObjectItemCaseSensitive(j, "attention_chunk_size");
    if (cs && cJSON_IsNull(cs)) chunk = 0;
    else if ((st = get_u32(err, j, "attention_chunk_size", &chunk, 0, path))) return st;
    if ((st = get_experts(err, j, &c->num_experts, path)) ||
        (st = get_u32(err, j, "num_experts_per_tok", &c->num_experts_per_tok, 0, path)) ||
        (st = get_u32(err, j, "intermediate_size_mlp", &c->intermediate_size, 0, path)) ||
        (st = get_u32(err, j, "interleave_moe_layer_step", &step, 0, path)) ||
        (st = get_u32(err, j, "no_rope_layer_interval", &interval, 0, path)) ||
        (st = get_bool(err, j, "use_qk_norm", &qk_norm, path)) ||
        (st = get_float(err, j, "floor_scale", &floor_scale, 0, path)) ||
        (st = get_float(err, j, "attn_scale", &scale, 0, path)))
        return st;
    /* Llama4TextAttention tests it for truth: Llama 4 Scout's config.json says 4 */
    const cJSON *tt = cJSON_GetObjectItemCaseSensitive(j, "attn_temperature_tuning");
    if (tt && !cJSON_IsNull(tt)) {
        if (!cJSON_IsBool(tt) && !cJSON_IsNumber(tt))
            return mt_fail(err, MT_ERR_FORMAT, "%s: \"attn_temperature_tuning\" must be true, false or a number",
                           path);
        tuning = cJSON_IsBool(tt) ? cJSON_IsTrue(tt) : tt->valuedouble != 0;
    }
    if (c->num_experts == 0)
        return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: num_local_experts 0 (a %s model without experts) is not supported",
                       path, f->display_name);
    if (L > 256)
        return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: %u layers: %s's layer lists are supported up to 256 layers", path,
                       L, f->display_name);
    if (step == 0 || interval == 0)
        return mt_fail(err, MT_ERR_FORMAT, "%s: interleave_moe_layer_step and no_rope_layer_interval must be at least 1",
                       path);
    /* the sparse layers: moe_layers, else every step-th (transformers' range(step - 1, L, step)) */
    int sparse[256], rope[256];
    for (uint32_t l = 0; l < L; l++) sparse[l] = (l + 1) % step == 0, rope[l] = (l + 1) % interval != 0;
    const cJSON *ml = cJSON_GetObjectItemCaseSensitive(j, "moe_layers");
    if (ml && !cJSON_IsNull(ml)) {
        if (!cJSON_IsArray(ml)) return mt_fail(err, MT_ERR_FORMAT, "%s: \"moe_layers\" must be a list", path);
        for (uint32_t l = 0; l < L; l++) sparse[l] = 0;
        for (const cJSON *e = ml->child; e; e = e->next) {
            if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0) || e->valuedouble >= L ||
                e->valuedouble != floor(e->valuedouble))
                return mt_fail(err, MT_ERR_FORMAT, "%s: \"moe_layers\" must be a list of layer indices below %u", path,
                               L);
            sparse[(int)e->valuedouble] = 1;
        }
    }
    if ((st = get_layer_flags(err, j, "no_rope_layers", L, rope, path))) return st;
    /* layer_types, where given, must be what the layers' RoPE makes them (transformers derives it so) */
    const cJSON *lt = cJSON_GetObjectItemCaseSensitive(j, "layer_types");
    if (lt && !cJSON_IsNull(lt)) {
        if (!cJSON_IsArray(lt) || (uint32_t)cJSON_GetArraySize(lt) != L)
            return mt_fail(err, MT_ERR_FORMAT, "%s: \"layer_types\" must be a list of one name a layer", path);
        uint32_t l = 0;
        for (const cJSON *e = lt->child; e; e = e->next, l++) {
            const char *want = rope[l] ? "chunked_attention" : "full_attention";
            if (!cJSON_IsString(e) || strcmp(e->valuestring, want) != 0)
                return mt_fail(err, MT_ERR_UNSUPPORTED,
                               "%s: layer_types[%u] is %s, but layer %u %s RoPE: %s's layers with RoPE attend in "
                               "chunks and the others fully (\"%s\")",
                               path, l, cJSON_IsString(e) ? e->valuestring : "not a name", l,
                               rope[l] ? "has" : "has no", f->display_name, want);
        }
    }
    memset(c->mlp_only_layers, 0, sizeof c->mlp_only_layers);
    memset(c->nope_layers, 0, sizeof c->nope_layers);
    for (uint32_t l = 0; l < L; l++) {
        if (!sparse[l]) c->mlp_only_layers[l / 64] |= (uint64_t)1 << (l % 64);
        if (!rope[l]) c->nope_layers[l / 64] |= (uint64_t)1 << (l % 64);
    }
    c->decoder_sparse_step = 1, c->norm_topk_prob = 0, c->moe_scoring = MT_MOE_SCORING_SIGMOID;
    c->moe_input_weighted = 1, c->shared_expert_intermediate_size = c->moe_intermediate_size, c->shared_expert_gate = 0;
    c->attention_chunk_size = chunk, c->qk_l2_norm = qk_norm;
    c->attn_temperature_floor = tuning ? floor_scale : 0.0f, c->attn_temperature_scale = tuning ? scale : 0.0f;
    if (tuning && !(floor_scale > 0.0f))
        return mt_fail(err, MT_ERR_FORMAT, "%s: floor_scale %g must be positive", path, (double)floor_scale);
    c->router_aux_loss_coef = 0.0f, c->output_router_logits = 0;
    return MT_OK;
}

/* The mixture-of-experts keys, with transformers' defaults where a key is absent
 * (Qwen3MoeConfig, MixtralConfig). Qwen3-MoE: num_experts, num_experts_per_tok,
 * moe_intermediate_size, norm_topk_prob, decoder_sparse_step, mlp_only_layers;
 * Mixtral: num_local_experts, num_experts_per_tok, intermediate_size as each
 * expert's width, always renormalised. Both: router_aux_loss_coef,
 * output_router_logits. */
static mt_status moe_from_json(mt_err err, mt_model_config *c, const mt_family *f, const cJSON *j,
                               const char *path)
{
    mt_status st;
    c->router_aux_loss_coef = 0.001f;
    c->output_router_logits = 0;
    if ((st = get_float(err, j, "router_aux_loss_coef", &c->router_aux_loss_coef, 0, path)) ||
        (st = get_bool(err, j, "output_router_logits", &c->output_router_logits, path)))
        return st;
    c->num_experts = f->experts, c->num_experts_per_tok = f->experts_per_tok;
    if (f->moe == MT_MOE_DEEPSEEK) return deepseek_moe_from_json(err, c, f, j, path);
    if (f->moe == MT_MOE_LLAMA4) return llama4_from_json(err, c, f, j, path);
    if (f->moe == MT_MOE_MIXTRAL || f->moe == MT_MOE_GPT_OSS) {
        if ((st = get_experts(err, j, &c->num_experts, path)) ||
            (st = get_u32(err, j, "num_experts_per_tok", &c->num_experts_per_tok, 0, path)))
            return st;
        c->moe_intermediate_size = c->intermediate_size;
        c->norm_topk_prob = 1; /* GPT-OSS: the softmax of the top-k logits, the same weights */
        if (f->moe == MT_MOE_GPT_OSS) return MT_OK;
        float jitter = 0.0f;
        if ((st = get_float(err, j, "router_jitter_noise", &jitter, 0, path))) return st;
        if (jitter != 0.0f)
            return mt_fail(err, MT_ERR_UNSUPPORTED,
                           "%s: router_jitter_noise %g is not supported (it multiplies the router's input by random "
                           "noise in training; only 0 is)",
                           path, (double)jitter);
        return MT_OK;
    }
    c->moe_intermediate_size = f->expert_ffn, c->decoder_sparse_step = 1;
    c->norm_topk_prob = 0;
    if ((st = get_experts(err, j, &c->num_experts, path)) ||
        (st = get_u32(err, j, "num_experts_per_tok", &c->num_experts_per_tok, 0, path)) ||
        (st = get_u32(err, j, "moe_intermediate_size", &c->moe_intermediate_size, 0, path)) ||
        (st = get_u32(err, j, "decoder_sparse_step", &c->decoder_sparse_step, 0, path)) ||
        (st = get_bool(err, j, "norm_topk_prob", &c->norm_topk_prob, path)))
        return st;
    if (c->num_experts == 0)
        return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: num_experts 0 (a %s model without experts) is not supported",
                       path, f->display_name);
    if (c->decoder_sparse_step == 0)
        return mt_fail(err, MT_ERR_FORMAT, "%s: decoder_sparse_step must be at least 1", path);
    /* a shared expert: the family's (Qwen2-MoE, always gated), or refused where the family has none */
    uint32_t shared = f->shared_ffn;
    if ((st = get_u32(err, j, "shared_expert_intermediate_size", &shared, 0, path))) return st;
    if (!f->shared_block && shared)
        return mt_fail(err, MT_ERR_UNSUPPORTED,
                       "%s: shared_expert_intermediate_size %u: %s has no shared expert (Qwen2-MoE has)", path, shared,
                       f->display_name);
    if (f->shared_block && !shared)
        return mt_fail(err, MT_ERR_UNSUPPORTED,
                       "%s: shared_expert_intermediate_size 0 (a %s without its shared expert) is not supported",
                       path, f->display_name);
    c->shared_expert_intermediate_size = shared;
    c->shared_expert_gate = f->shared_gate != NULL && shared;
    const cJSON *ml = cJSON_GetObjectItemCaseSensitive(j, "mlp_only_layers");
    if (ml && !cJSON_IsNull(ml)) {
        if (!cJSON_IsArray(ml)) return mt_fail(err, MT_ERR_FORMAT, "%s: \"mlp_only_layers\" must be a list", path);
        for (const cJSON *e = ml->child; e; e = e->next) {
            if (!cJSON_IsNumber(e) || !(e->valuedouble >= 0) || e->valuedouble != floor(e->valuedouble))
                return mt_fail(err, MT_ERR_FORMAT, "%s: \"mlp_only_layers\" must be a list of layer indices", path);
            if (e->valuedouble >= c->num_hidden_layers || e->valuedouble >= 256)
                return mt_fail(err, e->valuedouble >= c->num_hidden_layers ? MT_ERR_FORMAT : MT_ERR_UNSUPPORTED,
                               "%s: mlp_only_layers names layer %.0f, %s", path, e->valuedouble,
                               e->valuedouble >= c->num_hidden_layers ? "past the model's layers"
                                                                      : "and only layers below 256 can be dense");
            const uint32_t l = (uint32_t)e->valuedouble;
            c->mlp_only_layers[l / 64] |= (uint64_t)1 << (l % 64);
        }
    }
    return MT_OK;
}

/* The embedding's padding row: transformers builds nn.Embedding(vocab_size, hidden_size,
 * padding_idx=pad_token_id), which takes -V <= p < V (a negative one counts from the end) and
 * refuses any other. Absent, the config class's default: None, or Gemma's 0 and Phi3Config's
 * 32000, the latter dropped where the vocabulary has no such row (transformers cannot build that
 * model; a saved folder says null). */
static mt_status get_pad(mt_err err, const cJSON *j, const mt_family *f, mt_model_config *c, const char *path)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "pad_token_id");
    const double V = (double)c->vocab_size;
    c->pad_token_id = -1;
    if (!v) {
        if ((f->flags & MT_FAMILY_CLASS_PAD) && f->class_pad < c->vocab_size) c->pad_token_id = (int32_t)f->class_pad;
        return MT_OK;
    }
    if (cJSON_IsNull(v)) return MT_OK;
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble))
        return mt_fail(err, MT_ERR_FORMAT, "%s: \"pad_token_id\" must be an integer or null", path);
    if (!(v->valuedouble >= -V && v->valuedouble < V))
        return mt_fail(err, MT_ERR_FORMAT,
                       "%s: pad_token_id %.0f is outside the vocabulary (vocab_size %u): the embedding has no such "
                       "padding row (transformers refuses it too)",
                       path, v->valuedouble, c->vocab_size);
    c->pad_token_id = (int32_t)(v->valuedouble < 0 ? v->valuedouble + V : v->valuedouble);
    return MT_OK;
}

static mt_status config_from_json(mt_err err, mt_model_config *c, const cJSON *j, const char *path)
{
    mt_status st;
    /* architecture */
    const cJSON *archs = cJSON_GetObjectItemCaseSensitive(j, "architectures");
    const cJSON *mtype = cJSON_GetObjectItemCaseSensitive(j, "model_type");
    const mt_family *f = NULL;
    char known[256];
    /* multimodal checkpoints (Gemma 3 4B+, Llava, Qwen2-VL, Mistral 3, Llama 4) nest their language
     * model beside a vision tower: say that, rather than only that the architecture is unknown */
    static const char *const towers[] = {"vision_config", "audio_config"};
    for (size_t i = 0; i < sizeof towers / sizeof towers[0]; i++)
        if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(j, towers[i]))) {
            const cJSON *a0 = cJSON_IsArray(archs) ? cJSON_GetArrayItem(archs, 0) : NULL;
            return mt_fail(err, MT_ERR_UNSUPPORTED,
                           "%s: %s: %s has a %s encoder beside its language model; only text-only decoder models "
                           "are supported (%s)",
                           path, towers[i], cJSON_IsString(a0) ? a0->valuestring : "the model",
                           i ? "audio" : "vision", mt_family_list(known, sizeof known, 0));
        }
    if (archs && !cJSON_IsNull(archs)) {
        if (!cJSON_IsArray(archs) || cJSON_GetArraySize(archs) < 1)
            return mt_fail(err, MT_ERR_FORMAT, "%s: \"architectures\" must be a non-empty list of names", path);
        const cJSON *a0 = cJSON_GetArrayItem(archs, 0);
        if (!cJSON_IsString(a0))
            return mt_fail(err, MT_ERR_FORMAT, "%s: \"architectures\" must be a list of names", path);
        if (!(f = mt_family_by_architecture(a0->valuestring))) {
            /* hybrids of linear attention (Gated DeltaNet) and full attention: say what is missing */
            static const char *const hybrids[] = {"Qwen3NextForCausalLM", "Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"};
            for (size_t i = 0; i < sizeof hybrids / sizeof hybrids[0]; i++)
                if (!strcmp(a0->valuestring, hybrids[i]))
                    return mt_fail(err, MT_ERR_UNSUPPORTED,
                                   "%s: architecture %s is not supported: its linear-attention layers (Gated "
                                   "DeltaNet, layer_types \"linear_attention\") have no template in this library; "
                                   "only softmax-attention models are (%s)",
                                   path, a0->valuestring, mt_family_list(known, sizeof known, 0));
            return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: architecture %s is not supported (%s are)", path,
                           a0->valuestring, mt_family_list(known, sizeof known, 0));
        }
    } else if (cJSON_IsString(mtype)) {
        if (!(f = mt_family_by_model_type(mtype->valuestring)))
            return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: model_type %s is not supported (%s are)", path,
                           mtype->valuestring, mt_family_list(known, sizeof known, 1));
    } else {
        return mt_fail(err, MT_ERR_FORMAT, "%s names neither \"architectures\" nor \"model_type\"", path);
    }
    c->arch = (uint32_t)f->arch;
    /* a quantized checkpoint (GPT-OSS's MXFP4 experts, GPTQ, AWQ, bitsandbytes) holds no weights to train */
    const cJSON *quant = cJSON_GetObjectItemCaseSensitive(j, "quantization_config");
    if (quant && !cJSON_IsNull(quant)) {
        const cJSON *qm = cJSON_GetObjectItemCaseSensitive(quant, "quant_method");
        return mt_fail(err, MT_ERR_UNSUPPORTED,
                       "%s: quantization_config (%s): the checkpoint's weights are quantized; training needs them in "
                       "bf16 or fp32 (a dequantized copy of the checkpoint, as transformers saves one with "
                       "dequantize=True)",
                       path, cJSON_IsString(qm) ? qm->valuestring : "quantized");
    }

    /* shape */
    if ((st = get_u32(err, j, "vocab_size", &c->vocab_size, 1, path)) ||
        (st = get_u32(err, j, "hidden_size", &c->hidden_size, 1, path)) ||
        (st = get_u32(err, j, "intermediate_size", &c->intermediate_size, 1, path)) ||
        (st = get_u32(err, j, "num_hidden_layers", &c->num_hidden_layers, 1, path)) ||
        (st = get_u32(err, j, "num_attention_heads", &c->num_attention_heads, 1, path)))
        return st;
    c->num_key_value_heads = c->num_attention_heads;
    c->head_dim = f->head_dim_default;
    if ((st = get_u32(err, j, "num_key_value_heads", &c->num_key_value_heads, 0, path)) ||
        (st = get_u32(err, j, "head_dim", &c->head_dim, 0, path)) ||
        (st = get_u32(err, j, "max_position_embeddings", &c->max_position_embeddings, 1, path)) ||
        (st = get_float(err, j, "rms_norm_eps", &c->rms_norm_eps, 0, path)))
        return st;
    c->rope_theta = f->rope_theta; /* transformers' defaults */
    if ((st = get_float(err, j, "rope_theta", &c->rope_theta, 0, path))) return st;
    c->tie_word_embeddings = f->tied;
    if ((st = get_bool(err, j, "tie_word_embeddings", &c->tie_word_embeddings, path))) return st;
    if ((st = get_pad(err, j, f, c, path))) return st;

    /* biases */
    c->attention_bias = 0;
    if (f->flags & MT_FAMILY_BIAS) {
        c->attention_bias = 1; /* Qwen2 always has q/k/v biases */
    } else if (f->bias_key) { /* Qwen2-MoE's qkv_bias, true by default */
        c->attention_bias = 1;
        if ((st = get_bool(err, j, f->bias_key, &c->attention_bias, path))) return st;
    } else if ((st = get_bool(err, j, "attention_bias", &c->attention_bias, path))) {
        return st;
    }
    uint32_t mlp_bias = 0;
    if ((st = get_bool(err, j, "mlp_bias", &mlp_bias, path))) return st;
    if (mlp_bias) return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: mlp_bias true is not supported", path);

    /* activation */
    const cJSON *act = cJSON_GetObjectItemCaseSensitive(j, "hidden_act");
    if (f->flags & MT_FAMILY_GEMMA_CONFIG) {
        if ((st = gemma_from_json(err, c, f, j, path))) return st;
    } else if (act && !cJSON_IsNull(act)) {
        if (!cJSON_IsString(act)) return mt_fail(err, MT_ERR_FORMAT, "%s: \"hidden_act\" must be a string", path);
        if (strcmp(act->valuestring, f->hidden_act) != 0)
            return mt_fail(err, MT_ERR_UNSUPPORTED, "%s: hidden_act %s is not supported (only %s is)", path,
                           act->valuestring, f->hidden_act);
    }

    if ((st = sliding_window_from_json(err, c, f, j, path))) return st;
    if (f->moe != MT_MOE_NONE && (st = moe_from_json(err, c, f, j, path))) return st;

    /* RoPE on part of each head (Phi-4-mini's 0.75): top-level, or in rope_parameters (below) */
    c->partial_rotary_factor = 0.0f;
    if ((st = get_partial_rotary(err, c, f, j, path))) return st;

    /* rope scaling: "rope_scaling" (transformers 4), or "rope_parameters",
     * which transformers 5 writes instead of both rope_theta and rope_scaling */
    c->rope_scaling = MT_ROPE_SCALING_NONE;
    const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (rp && !cJSON_IsNull(rp)) {
        if (!cJSON_IsObject(rp))
            return mt_fail(err, MT_ERR_FORMAT, "%s: \"rope_parameters\" must be an object or null", path);
        /* by layer type (Gemma 3 in transformers 5): the full layers' RoPE, and the sliding layers' base */
        const cJSON *full = cJSON_GetObjectItemCaseSensitive(rp, "full_attention");
        const cJSON *local = cJSON_GetObjectItemCaseSensitive(rp, "sliding_attention");
        if (cJSON_IsObject(local)) {
            if (!(f->flags & MT_FAMILY_LOCAL_ROPE))
                return mt_fail(err, MT_ERR_UNSUPPORTED,
                               "%s: rope_parameters.sliding_attention: a RoPE of the sliding layers of their own is "
                               "Gemma 3's only",
                               path);
            mt_model_config lc = *c;
            lc.rope_theta = c->rope_local_base_freq;
            if ((st = get_float(err, local, "rope_theta", &lc.rope_theta, 0, path)) ||
                (st = rope_type_from_json(err, &lc, f, j, local, path)))
                return st;
            if (lc.rope_scaling != MT_ROPE_SCALING_NONE)
                return mt_fail(err, MT_ERR_UNSUPPORTED,
                               "%s: rope_parameters.sliding_attention: scaled RoPE on the sliding layers is not "
                               "supported (Gemma 3's is the default rope)",
                               path);
            c->rope_local_base_freq = lc.rope_theta;
        }
        if (cJSON_IsObject(full)) rp = full;
        if ((st = get_float(err, rp, "rope_theta", &c->rope_theta, 0, path)) ||
            (st = get_partial_rotary(err, c, f, rp, path)))
            return st;
        if (!rs || cJSON_IsNull(rs)) rs = rp; /* rope_type default | llama3 | linear with their fields */
    }
    if (rs && !cJSON_IsNull(rs)) {
        if (!cJSON_IsObject(rs)) return mt_fail(err, MT_ERR_FORMAT, "%s: \"rope_scaling\" must be an object or null", path);
        if ((st = rope_type_from_json(err, c, f, j, rs, path))) return st;
    } else if (f->rope_default_yarn[0] != 0.0f) {
        /* GptOssConfig: no RoPE description at all is its yarn */
        const float *y = f->rope_default_yarn;
        c->rope_scaling = MT_ROPE_SCALING_YARN, c->rope_factor = y[0], c->rope_original_max_position = (uint32_t)y[1];
        c->rope_beta_fast = y[2], c->rope_beta_slow = y[3], c->rope_no_truncate = 1;
    }
    return MT_OK;
}

mt_status mt_config_load(mt_model_config *cfg, const char *dir)
{
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (!cfg) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_config_load: cfg is NULL");
    if (!dir) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_config_load: dir is NULL");
    mt_model_config caller;
    mt_model_config_init(&caller);
    mt_status st = mt_copy_in(err, &caller, sizeof caller, cfg, MT_FIRST_SIZE_MODEL_CONFIG, "mt_model_config");
    if (st) return st;

    mt_model_config c;
    mt_model_config_init(&c);
    c.precision = caller.precision;
    c.seed = caller.seed;
    c.initializer_range = caller.initializer_range;

    char path[4096];
    mt_path_join(path, sizeof path, dir, "config.json");
    cJSON *j;
    if ((st = mt_parse_json_file(err, path, &j))) return st;
    st = config_from_json(err, &c, j, path);
    cJSON_Delete(j);
    if (st) return st;

    mt_model_config check;
    char why[MT_ERRMSG_MAX];
    if ((st = mt_config_import((mt_err){why}, &check, &c)))
        return mt_fail(err, st, "%s describes an impossible model: %s", path, why);
    /* a caller built against an older header gets the fields it knows: refuse rather than drop a
     * setting (the fields appended since have their defaults) */
    uint32_t caller_size;
    memcpy(&caller_size, cfg, sizeof caller_size);
    const size_t known = MT_MIN((size_t)caller_size, sizeof c);
    const size_t i = mt_config_first_set_past(&c, known);
    if (i < sizeof c)
        return mt_fail(err, MT_ERR_UNSUPPORTED,
                           "%s needs a field of mt_model_config past the %zu bytes this caller's struct has (byte %zu, "
                           "%s): build against this library's megatrain.h",
                           path, known, i, mt_config_field_group(i));
    return mt_copy_out(err, cfg, &c, sizeof c, MT_FIRST_SIZE_MODEL_CONFIG, "mt_model_config");
}

/* ---- writing ------------------------------------------------------------------ */

/* The shortest decimal that reads back as the same float, as a JSON number
 * that Python reads as a float: "30.0", not "30" (transformers 5 validates
 * the types of config fields, and an int is no float there). */
static cJSON *float_number(float f)
{
    char s[40];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(s, sizeof s - 2, "%.*g", prec, (double)f);
        if (strtof(s, NULL) == f) break;
    }
    if (!strpbrk(s, ".e")) strcat(s, ".0");
    return cJSON_CreateRaw(s);
}

/* A number that transformers types as an int where it is one (query_pre_attn_scalar). */
static cJSON *int_or_float_number(float f)
{
    return f == floorf(f) && fabsf(f) < 1e9f ? cJSON_CreateNumber((double)f) : float_number(f);
}

/* bos and eos of the folder a model came from: the library does not use them, but transformers
 * does (generation stops at eos), and its defaults are some other model's (LlamaConfig's eos 2).
 * Best effort: a source folder whose config.json is gone or unreadable gives none. pad_token_id
 * is the model's own (its padding row). */
static void add_token_ids(cJSON *j, const mt_model_config *c, const char *source_dir)
{
    static const char *const keys[] = {"bos_token_id", "eos_token_id"};
    cJSON *src = NULL;
    if (source_dir) {
        char path[4096], *text;
        size_t len;
        char why[MT_ERRMSG_MAX];
        mt_path_join(path, sizeof path, source_dir, "config.json");
        if (mt_read_small_file((mt_err){why}, path, &text, &len) == MT_OK) {
            src = cJSON_ParseWithLength(text, len);
            free(text);
        }
    }
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const cJSON *v = src ? cJSON_GetObjectItemCaseSensitive(src, keys[i]) : NULL;
        if (v) cJSON_AddItemToObject(j, keys[i], cJSON_Duplicate(v, 1));
        else if (mt_config_has(c, MT_FAMILY_NULL_TOKEN_IDS)) cJSON_AddNullToObject(j, keys[i]); /* not Phi3Config's 32000 */
    }
    /* the model's own padding row, or null: never the config class's default, which the model may not have */
    if (c->pad_token_id >= 0) cJSON_AddNumberToObject(j, "pad_token_id", c->pad_token_id);
    else cJSON_AddNullToObject(j, "pad_token_id");
    cJSON_Delete(src);
}

char *mt_config_json_text(const mt_model_config *c, const char *source_dir)
{
    cJSON *j = cJSON_CreateObject();
    if (!j) return NULL;
    const mt_family *f = mt_config_family(c);
    if (!f) f = mt_family_of(MT_ARCH_LLAMA); /* not a validated config: as before, Llama's names */
    const char *names[1] = {f->architecture};
    cJSON_AddItemToObject(j, "architectures", cJSON_CreateStringArray(names, 1));
    cJSON_AddStringToObject(j, "model_type", f->model_type);
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", c->hidden_size);
    /* Mixtral's and GPT-OSS's intermediate_size is each expert's width */
    cJSON_AddNumberToObject(j, "intermediate_size",
                            f->moe == MT_MOE_MIXTRAL || f->moe == MT_MOE_GPT_OSS || f->moe == MT_MOE_LLAMA4
                                ? c->moe_intermediate_size
                                : c->intermediate_size);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->num_hidden_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->num_attention_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->num_key_value_heads);
    /* DeepseekV3Config's head_dim is qk_rope_head_dim (the library's, the q/k head, is the sum) */
    cJSON_AddNumberToObject(j, "head_dim", c->kv_lora_rank ? c->qk_rope_head_dim : c->head_dim);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_position_embeddings);
    cJSON_AddItemToObject(j, "rms_norm_eps", float_number(c->rms_norm_eps));
    cJSON_AddItemToObject(j, "rope_theta", float_number(c->rope_theta));
    if (c->rope_scaling == MT_ROPE_SCALING_LLAMA3) {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddItemToObject(rs, "factor", float_number(c->rope_factor));
        cJSON_AddItemToObject(rs, "low_freq_factor", float_number(c->rope_low_freq_factor));
        cJSON_AddItemToObject(rs, "high_freq_factor", float_number(c->rope_high_freq_factor));
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_original_max_position);
    } else if (c->rope_scaling == MT_ROPE_SCALING_LINEAR) {
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", "linear");
        cJSON_AddItemToObject(rs, "factor", float_number(c->rope_factor));
    } else if (c->rope_scaling == MT_ROPE_SCALING_YARN || c->rope_scaling == MT_ROPE_SCALING_LONGROPE) {
        const int yarn = c->rope_scaling == MT_ROPE_SCALING_YARN;
        cJSON *rs = cJSON_AddObjectToObject(j, "rope_scaling");
        cJSON_AddStringToObject(rs, "rope_type", yarn ? "yarn" : "longrope");
        cJSON_AddItemToObject(rs, "factor", float_number(c->rope_factor));
        cJSON_AddNumberToObject(rs, "original_max_position_embeddings", c->rope_original_max_position);
        /* the settings a config gave (0: the default, left to the reader as it was) */
        const float v[5] = {c->rope_attention_factor, c->rope_beta_fast, c->rope_beta_slow, c->rope_mscale,
                            c->rope_mscale_all_dim};
        static const char *const keys[5] = {"attention_factor", "beta_fast", "beta_slow", "mscale", "mscale_all_dim"};
        for (int i = 0; i < 5; i++)
            if (v[i] != 0.0f) cJSON_AddItemToObject(rs, keys[i], float_number(v[i]));
        if (yarn && c->rope_no_truncate) cJSON_AddBoolToObject(rs, "truncate", 0);
        if (!yarn) {
            cJSON *sf = cJSON_AddArrayToObject(rs, "short_factor"), *lf = cJSON_AddArrayToObject(rs, "long_factor");
            for (uint32_t i = 0; i < c->rope_n_factors; i++) {
                cJSON_AddItemToArray(sf, float_number(c->rope_short_factor[i]));
                cJSON_AddItemToArray(lf, float_number(c->rope_long_factor[i]));
            }
        }
    } else if (f->rope_default_yarn[0] != 0.0f) {
        /* GptOssConfig reads no RoPE description as its yarn: say "none" explicitly */
        cJSON *rp = cJSON_AddObjectToObject(j, "rope_parameters");
        cJSON_AddStringToObject(rp, "rope_type", "default");
        cJSON_AddItemToObject(rp, "rope_theta", float_number(c->rope_theta));
    } else {
        cJSON_AddNullToObject(j, "rope_scaling");
    }
    if (f->flags & MT_FAMILY_PHI3_ROPE) {
        /* Phi3Config's own keys, which take priority over rope_scaling's */
        cJSON_AddItemToObject(j, "partial_rotary_factor",
                              float_number(c->partial_rotary_factor != 0.0f ? c->partial_rotary_factor : 1.0f));
        if (c->rope_scaling == MT_ROPE_SCALING_LONGROPE)
            cJSON_AddNumberToObject(j, "original_max_position_embeddings", c->rope_original_max_position);
    }
    if (f->bias_key) cJSON_AddBoolToObject(j, f->bias_key, c->attention_bias != 0);
    else if (!(f->flags & MT_FAMILY_BIAS)) cJSON_AddBoolToObject(j, "attention_bias", c->attention_bias != 0);
    if (f->flags & MT_FAMILY_GEMMA_CONFIG) {
        /* transformers' Gemma reads hidden_activation; the keys it defaults when absent, explicitly */
        cJSON_AddStringToObject(j, "hidden_activation", f->hidden_act);
        cJSON_AddStringToObject(j, "hidden_act", f->hidden_act);
        cJSON_AddItemToObject(j, "query_pre_attn_scalar", int_or_float_number(c->query_pre_attn_scalar));
        const float caps[2] = {c->attn_logit_softcapping, c->final_logit_softcapping};
        static const char *const cap_keys[2] = {"attn_logit_softcapping", "final_logit_softcapping"};
        for (int i = 0; i < 2; i++)
            cJSON_AddItemToObject(j, cap_keys[i], caps[i] > 0.0f ? float_number(caps[i]) : cJSON_CreateNull());
        if (f->flags & MT_FAMILY_LOCAL_ROPE) {
            cJSON_AddItemToObject(j, "rope_local_base_freq",
                                  float_number(c->rope_local_base_freq > 0.0f ? c->rope_local_base_freq : c->rope_theta));
            cJSON_AddBoolToObject(j, "use_bidirectional_attention", 0);
        }
    } else {
        cJSON_AddBoolToObject(j, "mlp_bias", 0);
        cJSON_AddStringToObject(j, "hidden_act", f->hidden_act);
    }
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_word_embeddings != 0);
    if (f->window == MT_WINDOW_FROM_LAYER || f->window == MT_WINDOW_EVEN_BELOW) {
        cJSON_AddBoolToObject(j, "use_sliding_window", c->sliding_window != 0);
        /* Qwen2-MoE's rule slides the even layers below it: all of them */
        if (c->sliding_window)
            cJSON_AddNumberToObject(j, "max_window_layers",
                                    f->window == MT_WINDOW_EVEN_BELOW ? c->num_hidden_layers : c->max_window_layers);
    }
    if (c->sliding_window) {
        cJSON_AddNumberToObject(j, "sliding_window", c->sliding_window);
        if (f->window != MT_WINDOW_EVERY_LAYER) {
            /* which layers slide, explicitly */
            cJSON *lt = cJSON_AddArrayToObject(j, "layer_types");
            for (int l = 0; l < (int)c->num_hidden_layers; l++)
                cJSON_AddItemToArray(lt, cJSON_CreateString(mt_config_layer_slides(c, l) ? "sliding_attention"
                                                                                         : "full_attention"));
        }
    } else if (f->window != MT_WINDOW_NONE) {
        cJSON_AddNullToObject(j, "sliding_window");
    }
    if (f->moe == MT_MOE_QWEN3) {
        cJSON_AddNumberToObject(j, "num_experts", c->num_experts);
        cJSON_AddNumberToObject(j, "num_experts_per_tok", c->num_experts_per_tok);
        cJSON_AddNumberToObject(j, "moe_intermediate_size", c->moe_intermediate_size);
        cJSON_AddBoolToObject(j, "norm_topk_prob", c->norm_topk_prob != 0);
        if (f->shared_block)
            cJSON_AddNumberToObject(j, "shared_expert_intermediate_size", c->shared_expert_intermediate_size);
        cJSON_AddNumberToObject(j, "decoder_sparse_step", c->decoder_sparse_step ? c->decoder_sparse_step : 1);
        cJSON *ml = cJSON_AddArrayToObject(j, "mlp_only_layers");
        for (int l = 0; l < (int)MT_MIN(c->num_hidden_layers, 256u); l++)
            if (c->mlp_only_layers[l / 64] >> (l % 64) & 1) cJSON_AddItemToArray(ml, cJSON_CreateNumber(l));
    } else if (f->moe == MT_MOE_DEEPSEEK) {
        uint32_t dense = 0;
        while (dense < MT_MIN(c->num_hidden_layers, 256u) && (c->mlp_only_layers[dense / 64] >> (dense % 64) & 1)) dense++;
        cJSON_AddNumberToObject(j, "n_routed_experts", c->num_experts);
        cJSON_AddNumberToObject(j, "num_experts_per_tok", c->num_experts_per_tok);
        cJSON_AddNumberToObject(j, "moe_intermediate_size", c->moe_intermediate_size);
        cJSON_AddNumberToObject(j, "n_shared_experts", c->shared_expert_intermediate_size / c->moe_intermediate_size);
        cJSON_AddNumberToObject(j, "first_k_dense_replace", dense);
        /* no group limit is one group of all the experts (DeepSeek-V2: the greedy top-k) */
        cJSON_AddNumberToObject(j, "n_group", c->n_group > 1 ? c->n_group : 1);
        cJSON_AddNumberToObject(j, "topk_group", c->n_group > 1 ? c->topk_group : 1);
        if (f->arch == MT_ARCH_DEEPSEEK_V2)
            cJSON_AddStringToObject(j, "topk_method", c->n_group > 1 ? "group_limited_greedy" : "greedy");
        cJSON_AddItemToObject(j, "routed_scaling_factor",
                              float_number(c->routed_scaling_factor != 0.0f ? c->routed_scaling_factor : 1.0f));
        cJSON_AddBoolToObject(j, "norm_topk_prob", c->norm_topk_prob != 0);
        cJSON_AddNumberToObject(j, "kv_lora_rank", c->kv_lora_rank);
        if (c->q_lora_rank) cJSON_AddNumberToObject(j, "q_lora_rank", c->q_lora_rank);
        else cJSON_AddNullToObject(j, "q_lora_rank");
        cJSON_AddNumberToObject(j, "qk_nope_head_dim", c->qk_nope_head_dim);
        cJSON_AddNumberToObject(j, "qk_rope_head_dim", c->qk_rope_head_dim);
        cJSON_AddNumberToObject(j, "v_head_dim", c->v_head_dim);
        if (f->arch == MT_ARCH_DEEPSEEK_V3) cJSON_AddBoolToObject(j, "rope_interleave", c->rope_interleave != 0);
    } else if (f->moe == MT_MOE_LLAMA4) {
        /* every layer listed: moe_layers and no_rope_layers (1: RoPE), the layer types they make */
        cJSON_AddNumberToObject(j, "num_local_experts", c->num_experts);
        cJSON_AddNumberToObject(j, "num_experts_per_tok", c->num_experts_per_tok);
        cJSON_AddNumberToObject(j, "intermediate_size_mlp", c->intermediate_size);
        cJSON *ml = cJSON_AddArrayToObject(j, "moe_layers"), *nr = cJSON_AddArrayToObject(j, "no_rope_layers");
        cJSON *lt = cJSON_AddArrayToObject(j, "layer_types");
        for (int l = 0; l < (int)c->num_hidden_layers; l++) {
            if (mt_config_layer_sparse(c, l)) cJSON_AddItemToArray(ml, cJSON_CreateNumber(l));
            cJSON_AddItemToArray(nr, cJSON_CreateNumber(!mt_config_layer_nope(c, l)));
            cJSON_AddItemToArray(lt, cJSON_CreateString(mt_config_layer_nope(c, l) ? "full_attention"
                                                                                    : "chunked_attention"));
        }
        if (c->attention_chunk_size) cJSON_AddNumberToObject(j, "attention_chunk_size", c->attention_chunk_size);
        else cJSON_AddNullToObject(j, "attention_chunk_size");
        cJSON_AddBoolToObject(j, "use_qk_norm", c->qk_l2_norm != 0);
        cJSON_AddBoolToObject(j, "attn_temperature_tuning", c->attn_temperature_floor != 0.0f);
        if (c->attn_temperature_floor != 0.0f) {
            cJSON_AddItemToObject(j, "floor_scale", int_or_float_number(c->attn_temperature_floor));
            cJSON_AddItemToObject(j, "attn_scale", float_number(c->attn_temperature_scale));
        }
    } else if (f->moe == MT_MOE_MIXTRAL || f->moe == MT_MOE_GPT_OSS) {
        cJSON_AddNumberToObject(j, "num_local_experts", c->num_experts);
        cJSON_AddNumberToObject(j, "num_experts_per_tok", c->num_experts_per_tok);
        if (f->moe == MT_MOE_MIXTRAL) cJSON_AddItemToObject(j, "router_jitter_noise", float_number(0.0f));
    }
    if (f->moe != MT_MOE_NONE && f->moe != MT_MOE_DEEPSEEK) {
        cJSON_AddItemToObject(j, "router_aux_loss_coef", float_number(c->router_aux_loss_coef));
        cJSON_AddBoolToObject(j, "output_router_logits", c->output_router_logits != 0);
    }
    cJSON_AddStringToObject(j, "torch_dtype", c->precision == MT_PRECISION_FP32 ? "float32" : "bfloat16");
    cJSON_AddItemToObject(j, "initializer_range", float_number(c->initializer_range));
    add_token_ids(j, c, source_dir);
    char *s = cJSON_Print(j);
    cJSON_Delete(j);
    return s;
}

int mt_tensor_ndim(const mt_tensor_desc *t)
{
    return mt_role_is_norm(t->role) || mt_role_is_bias(t->role) || mt_role_is_drawn_vector(t->role) ||
                   mt_role_is_frozen(t->role)
               ? 1
               : 2;
}

/* The checkpoint's shape of a tensor of all the experts (ck_il): (E, cols, rows' * il), or (E, rows' *
 * il) for a bias; its map from the model's order. */
static int experts_tensor_shape(const mt_tensor_desc *t, uint64_t *dims, mt_st_map *map)
{
    const uint64_t rows = t->rows / t->experts;
    *map = (mt_st_map){rows, t->cols, t->ck_il, t->ck_phase, t->ck_cat};
    dims[0] = t->experts;
    if (t->cols == 1) {
        dims[1] = rows * t->ck_il;
        return 2;
    }
    dims[1] = t->cols, dims[2] = rows * t->ck_il;
    return 3;
}

mt_st_write_req *mt_tensor_write_list(const mt_model_files *m, int which, int dtype, char (*names)[128], size_t *count)
{
    mt_st_write_req *r = calloc(MT_MAX(mt_tensor_count(m), (size_t)1), sizeof *r);
    if (!r) return NULL;
    static const char *const suffix[] = {"", ".exp_avg", ".exp_avg_sq"};
    size_t k = 0;
    for (int u = 0; u < m->layout->n_units; u++) {
        const mt_unit_desc *ud = &m->layout->units[u];
        const mt_tile *tl = &m->tiles->tile[u];
        /* lean mode: the weights' values from their codes (it has no master; its moments are written per unit) */
        const int src = ud->lean ? MT_ST_Q16 : MT_ST_F32;
        const unsigned char *base = ud->lean ? (const unsigned char *)mt_tile_wq(tl, ud)
                                  : (const unsigned char *)(which == 0   ? mt_tile_master(tl, ud)
                                                            : which == 1 ? mt_tile_m(tl, ud)
                                                                         : mt_tile_v(tl, ud));
        const float *sw = ud->lean ? mt_tile_sw(tl, ud) : NULL;
        const uint64_t es = mt_st_esize(src);
        for (int i = 0; i < ud->n_tensors; i++) {
            const mt_tensor_desc *t = &ud->tensors[i];
            if ((t->fused_rows && t->fused_row0) || (t->ck_il && t->ck_phase)) {
                /* a later block of the fused matrix before it, or a later one interleaved with it */
                mt_st_write_req *f = &r[k - 1];
                f->part[f->n_parts] = base + t->offset * es;
                if (sw) f->part_scale[f->n_parts] = sw + t->offset / MT_Q16_BLOCK; /* tensors start a block */
                f->part_numel[f->n_parts++] = t->numel;
                f->numel += t->numel;
                continue;
            }
            if (t->ck_il) { /* all the experts in one tensor, transposed (and interleaved: parts above) */
                snprintf(names[k], sizeof names[k], "%s%s", t->name, suffix[which]);
                r[k] = (mt_st_write_req){names[k], dtype, 0, {0}, t->numel, 1, {base + t->offset * es}, {t->numel}, src,
                                         {sw ? sw + t->offset / MT_Q16_BLOCK : NULL}, {0}, {0}};
                r[k].ndim = experts_tensor_shape(t, r[k].dims, &r[k].map);
                r[k].map.phase = 0;
                k++;
                continue;
            }
            /* stacked experts: one checkpoint tensor per expert's block */
            const uint32_t nb = mt_tensor_blocks(t);
            const uint64_t rows = t->fused_rows ? t->fused_rows : t->rows / nb, numel = t->numel / nb;
            for (uint32_t e = 0; e < nb; e++, k++) {
                char name[128];
                mt_tensor_name_of(name, sizeof name, t, e);
                snprintf(names[k], sizeof names[k], "%s%s", name, suffix[which]);
                const uint64_t off = t->offset + e * numel;
                /* a frozen buffer keeps its fp32 bits in a bf16 folder (transformers holds DeepSeek-V3's
                 * e_score_correction_bias in fp32 whatever the model's dtype) */
                const int tdt = which == 0 && mt_role_is_frozen(t->role) ? MT_ST_F32 : dtype;
                r[k] = (mt_st_write_req){names[k], tdt, mt_tensor_ndim(t), {rows, t->cols}, numel, 1,
                                         {base + off * es}, {numel}, src, {NULL}, {0}, {0}};
                if (sw) { /* an expert's block can start inside a block of codes */
                    r[k].part_scale[0] = sw + off / MT_Q16_BLOCK;
                    r[k].part_phase[0] = (uint32_t)(off % MT_Q16_BLOCK);
                }
            }
        }
    }
    *count = k;
    return r;
}

size_t mt_tensor_count(const mt_model_files *m)
{
    size_t n = 0;
    for (int u = 0; u < m->layout->n_units; u++)
        for (int i = 0; i < m->layout->units[u].n_tensors; i++) n += mt_tensor_blocks(&m->layout->units[u].tensors[i]);
    return n;
}

mt_status mt_write_config(mt_err err, const mt_model_config *cfg, const char *source_dir, const char *dir)
{
    char *text = mt_config_json_text(cfg, source_dir), path[4096];
    if (!text) return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory building config.json");
    size_t n = strlen(text);
    char *line = malloc(n + 2);
    if (!line) {
        cJSON_free(text);
        return mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory building config.json");
    }
    memcpy(line, text, n);
    line[n] = '\n';
    cJSON_free(text);
    mt_path_join(path, sizeof path, dir, "config.json");
    mt_status st = mt_write_file_atomic(err, path, line, n + 1);
    free(line);
    return st;
}

mt_status mt_save_tensors(mt_err err, const mt_model_files *m, const char *path, int which, int dtype)
{
    size_t n = mt_tensor_count(m);
    char(*names)[128] = malloc(MT_MAX(n, (size_t)1) * sizeof *names);
    mt_st_write_req *req = names ? mt_tensor_write_list(m, which, dtype, names, &n) : NULL;
    mt_status st = req ? mt_st_write(err, path, req, n)
                       : mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory writing %s", path);
    free(req);
    free(names);
    return st;
}

/* The files of a tokenizer that a model folder carries beside the model:
 * copied from the folder the model was loaded from, so that the saved folder
 * is a whole model for transformers. */
static const char *const TOKENIZER_FILES[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                              "tokenizer.model", "generation_config.json", "chat_template.jinja"};

static mt_status copy_tokenizer(mt_err err, const char *from, const char *to)
{
    char a[4096], b[4096], ra[4096], rb[4096];
    if (realpath(from, ra) && realpath(to, rb) && !strcmp(ra, rb)) return MT_OK; /* saved where it came from */
    for (size_t i = 0; i < sizeof TOKENIZER_FILES / sizeof TOKENIZER_FILES[0]; i++) {
        mt_path_join(a, sizeof a, from, TOKENIZER_FILES[i]);
        mt_path_join(b, sizeof b, to, TOKENIZER_FILES[i]);
        struct stat sb;
        if (stat(a, &sb) != 0) continue;
        char *data;
        size_t len;
        mt_status st = mt_read_small_file(err, a, &data, &len);
        if (!st) st = mt_write_file_atomic(err, b, data, len);
        if (st) return st;
        free(data);
    }
    return MT_OK;
}

mt_status mt_hf_save(mt_err err, const mt_model_files *m, const char *dir)
{
    char path[4096];
    mt_path_join(path, sizeof path, dir, "model.safetensors");
    mt_status st;
    if ((st = mt_mkdir_p(err, dir)) ||
        (st = mt_save_tensors(err, m, path, 0, m->cfg->precision == MT_PRECISION_FP32 ? MT_ST_F32 : MT_ST_BF16)) ||
        (st = mt_write_config(err, m->cfg, m->source_dir, dir)) ||
        (m->source_dir && (st = copy_tokenizer(err, m->source_dir, dir))))
        return st;
    return mt_sync_dir(err, dir);
}

/* ---- reading --------------------------------------------------------------------- */

/* Lean mode: the weights of unit u from the requests of lean_unit u (their
 * offsets in the unit at lean_off), a window of elements at a time through
 * fp32 scratch, each block of 256 encoded to nearest (optim/q16.h); padding
 * is zeros. A block holding a NaN or an infinity gets the scale NaN: every
 * value of it reads NaN, as a bf16 model's NaN weights make its loss NaN. */
#define LEAN_WINDOW (1u << 24) /* elements: 64 MiB of scratch */
_Static_assert(LEAN_WINDOW % MT_Q16_BLOCK == 0, "a window holds whole blocks");

static mt_status read_lean_weights(mt_err err, const mt_model_files *m, const mt_st_read_req *req, const int *lean_unit,
                                   const uint64_t *lean_off, size_t n)
{
    float *x = malloc(LEAN_WINDOW * sizeof *x);
    mt_st_read_req *part = malloc(MT_MAX(n, (size_t)1) * sizeof *part);
    mt_status st = x && part ? MT_OK : mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory reading weights");
    for (int u = 0; u < m->layout->n_units && !st; u++) {
        const mt_unit_desc *ud = &m->layout->units[u];
        if (!ud->lean) continue;
        const mt_tile *tl = &m->tiles->tile[u];
        for (uint64_t a = 0; a < ud->padded && !st; a += LEAN_WINDOW) {
            const uint64_t b = MT_MIN(a + LEAN_WINDOW, ud->padded);
            size_t np = 0;
            memset(x, 0, (b - a) * sizeof *x);
            for (size_t k = 0; k < n; k++) { /* the requests' overlaps with [a, b) */
                if (lean_unit[k] != u) continue;
                const uint64_t lo = MT_MAX(lean_off[k], a), hi = MT_MIN(lean_off[k] + req[k].numel, b);
                if (lo >= hi) continue;
                part[np++] = (mt_st_read_req){req[k].src, x + (lo - a), NULL, req[k].offset + (lo - lean_off[k]), hi - lo,
                                              req[k].map};
            }
            if ((st = mt_st_read(err, m->pool, part, np))) break;
            for (uint64_t i = a; i < b; i += MT_Q16_BLOCK) {
                int16_t *q = mt_tile_wq(tl, ud) + i;
                float *sc = mt_tile_sw(tl, ud) + i / MT_Q16_BLOCK;
                if (mt_q16_encode(x + (i - a), MT_Q16_BLOCK, q, sc)) {
                    memset(q, 0, MT_Q16_BLOCK * sizeof *q);
                    *sc = NAN;
                }
            }
        }
    }
    free(part);
    free(x);
    return st;
}

mt_status mt_load_tensors(mt_err err, const mt_model_files *m, mt_st_set *s, const int *which, int n_which, const char *where,
                          int write_bf16, int dry_run)
{
    static const char *const suffix[] = {"", ".exp_avg", ".exp_avg_sq"};
    const size_t n = MT_MAX(mt_tensor_count(m) * (size_t)n_which, (size_t)1);
    /* req[0..k) read in place; lean mode's weights go to lreq[0..nl), for unit lean_unit at lean_off */
    mt_st_read_req *req = calloc(n, sizeof *req), *lreq = calloc(n, sizeof *lreq);
    int *lean_unit = malloc(n * sizeof *lean_unit);
    uint64_t *lean_off = malloc(n * sizeof *lean_off);
    mt_status st = req && lreq && lean_unit && lean_off ? MT_OK
                 : mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    size_t k = 0, nl = 0;
    /* validate everything before touching the model */
    for (int w = 0; w < n_which && !st; w++)
        for (int u = 0; u < m->layout->n_units && !st; u++) {
            const mt_unit_desc *ud = &m->layout->units[u];
            const mt_tile *tl = &m->tiles->tile[u];
            /* lean mode: the weights into their codes (no master; moments per unit, checkpoint.c) */
            const int lean = ud->lean && which[w] == 0;
            float *base = which[w] == 0 ? mt_tile_master(tl, ud) : which[w] == 1 ? mt_tile_m(tl, ud) : mt_tile_v(tl, ud);
            uint16_t *bf = write_bf16 && which[w] == 0 ? mt_tile_weights_bf16(tl, ud) : NULL;
            for (int i = 0; i < ud->n_tensors && !st; i++) {
                const mt_tensor_desc *t = &ud->tensors[i];
                /* stacked experts: each expert's block from its own checkpoint tensor */
                const uint32_t nb = mt_tensor_blocks(t);
                const uint64_t numel = t->numel / nb;
                for (uint32_t e = 0; e < nb && !st; e++) {
                    char name[128], base_name[128];
                    mt_tensor_name_of(base_name, sizeof base_name, t, e);
                    snprintf(name, sizeof name, "%s%s", base_name, suffix[which[w]]);
                    uint64_t dims[3] = {t->fused_rows ? t->fused_rows : t->rows / nb, t->cols};
                    const uint64_t off = t->offset + e * numel, from = (uint64_t)t->fused_row0 * t->cols;
                    mt_st_map map = {0};
                    const int ndim = t->ck_il ? experts_tensor_shape(t, dims, &map) : mt_tensor_ndim(t);
                    mt_st_tensor *src;
                    st = mt_st_expect(err, s, name, dims, ndim, where, &src);
                    if (!st && !mt_st_is_float(src->dtype))
                        st = mt_fail(err, MT_ERR_FORMAT, "%s: tensor %s is not F32, BF16 or F16", where, name);
                    if (st) break;
                    if (lean) {
                        lreq[nl] = (mt_st_read_req){src, NULL, NULL, from, numel, map};
                        lean_unit[nl] = u, lean_off[nl++] = off;
                    } else {
                        req[k++] = (mt_st_read_req){src, base ? base + off : NULL, bf ? bf + off : NULL, from, numel,
                                                    map};
                    }
                }
            }
        }
    for (size_t i = 0; i < s->n && !st; i++) {
        const mt_st_tensor *t = &s->t[i];
        size_t len = strlen(t->name);
        if (t->used || (len >= 19 && !strcmp(t->name + len - 19, "rotary_emb.inv_freq"))) continue;
        if (m->cfg->tie_word_embeddings && !strcmp(t->name, "lm_head.weight")) continue;
        /* DeepSeek-V3's multi-token-prediction layers after the model's (num_nextn_predict_layers), which
         * transformers does not load either (_keys_to_ignore_on_load_unexpected) */
        unsigned layer;
        if (mt_config_has(m->cfg, MT_FAMILY_MLA) && sscanf(t->name, "model.layers.%u.", &layer) == 1 &&
            layer >= m->cfg->num_hidden_layers)
            continue;
        st = mt_fail(err, MT_ERR_FORMAT, "%s holds tensor %s, which this model does not have", s->files[t->file].path,
                     t->name);
    }
    if (!st && !dry_run) st = mt_st_read(err, m->pool, req, k);
    if (!st && !dry_run && nl) st = read_lean_weights(err, m, lreq, lean_unit, lean_off, nl);
    free(req), free(lreq), free(lean_unit), free(lean_off);
    return st;
}

static void zero_moments(const mt_model_files *m)
{
    for (int u = 0; u < m->layout->n_units; u++) {
        const mt_unit_desc *ud = &m->layout->units[u];
        const mt_tile *tl = &m->tiles->tile[u];
        if (ud->lean) { /* codes and scales: a block of scale 0 is zeros */
            memset(mt_tile_qm(tl, ud), 0, ud->padded);
            memset(mt_tile_qv(tl, ud), 0, ud->padded);
            memset(mt_tile_sm(tl, ud), 0, ud->scale_bytes);
            memset(mt_tile_sv(tl, ud), 0, ud->scale_bytes);
            continue;
        }
        memset(mt_tile_m(tl, ud), 0, ud->padded * 4);
        memset(mt_tile_v(tl, ud), 0, ud->padded * 4);
    }
}

mt_status mt_hf_load(mt_err err, mt_model_files *m, const char *dir)
{
    mt_st_set s = {0};
    mt_status st = mt_st_open_dir(err, &s, dir);
    if (!st) st = mt_st_index(err, &s);
    const int weights = 0;
    if (!st) st = mt_load_tensors(err, m, &s, &weights, 1, s.n_files == 1 ? s.files[0].path : dir, 1, 0);
    char *source = NULL;
    if (!st && !(source = strdup(dir))) st = mt_fail(err, MT_ERR_OUT_OF_HOST_MEMORY, "out of host memory");
    if (!st) {
        zero_moments(m);
        m->step = 0;
        free(m->source_dir);
        m->source_dir = source;
    }
    mt_st_free(&s);
    return st;
}
