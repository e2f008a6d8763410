/* The public option structs: defaults, size-checked copies, validation, and
 * the learning-rate schedule. */
#include "core/internal.h"

#include <math.h>
#include <string.h>

mt_status mt_copy_in(mt_err err, void *dst, size_t dst_size, const void *src, size_t min_size, const char *what)
{
    if (!src) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    uint32_t size;
    memcpy(&size, src, sizeof size);
    if (size < min_size)
        return mt_fail(err, MT_ERR_STRUCT_SIZE,
                       "%s.struct_size is %u, but the smallest this library accepts is %zu: "
                       "initialise the struct with its _init() function",
                       what, size, min_size);
    if (size > dst_size) {
        const unsigned char *tail = (const unsigned char *)src + dst_size;
        for (size_t i = 0; i < size - dst_size; i++)
            if (tail[i])
                return mt_fail(err, MT_ERR_STRUCT_SIZE,
                               "%s.struct_size is %u, this library (%s) knows the first %zu bytes, and byte %zu "
                               "is not zero: the caller uses a field this version does not have",
                               what, size, mt_version_string(), dst_size, dst_size + i);
    }
    memcpy(dst, src, MT_MIN(size, dst_size));
    memcpy(dst, &(uint32_t){(uint32_t)dst_size}, sizeof(uint32_t));
    return MT_OK;
}

mt_status mt_copy_out(mt_err err, void *dst, const void *src, size_t src_size, size_t min_size, const char *what)
{
    if (!dst) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "%s is NULL", what);
    uint32_t size;
    memcpy(&size, dst, sizeof size);
    if (size < min_size)
        return mt_fail(err, MT_ERR_STRUCT_SIZE,
                       "%s.struct_size is %u, but the smallest this library accepts is %zu: "
                       "initialise the struct with its _init() function",
                       what, size, min_size);
    memcpy((char *)dst + sizeof size, (const char *)src + sizeof size, MT_MIN(size, src_size) - sizeof size);
    return MT_OK;
}

/* ---- defaults ---------------------------------------------------------- */

void mt_struct_init(void *p, uint32_t size, const void *defaults, size_t known)
{
    if (!p || size < sizeof size) return;
    memset(p, 0, size);
    if (defaults) memcpy(p, defaults, MT_MIN((size_t)size, known));
    memcpy(p, &size, sizeof size);
}

void mt_model_config_init_sized(mt_model_config *p, uint32_t size)
{
    mt_model_config c;
    memset(&c, 0, sizeof c);
    c.arch = MT_ARCH_LLAMA;
    c.vocab_size = 32000;
    c.hidden_size = 512;
    c.intermediate_size = 1408;
    c.num_hidden_layers = 8;
    c.num_attention_heads = 8;
    c.num_key_value_heads = 8;
    c.max_position_embeddings = 2048;
    c.rms_norm_eps = 1e-5f;
    c.rope_theta = 10000.0f;
    c.rope_scaling = MT_ROPE_SCALING_NONE;
    c.rope_factor = 8.0f;
    c.rope_low_freq_factor = 1.0f;
    c.rope_high_freq_factor = 4.0f;
    c.rope_original_max_position = 8192;
    c.precision = MT_PRECISION_BF16;
    c.seed = 1;
    c.initializer_range = 0.02f;
    mt_struct_init(p, size, &c, sizeof c);
}

void mt_offload_policy_init_sized(mt_offload_policy *p, uint32_t size)
{
    mt_offload_policy d;
    memset(&d, 0, sizeof d);
    d.backend = MT_BACKEND_AUTO;
    d.weight_slots = 2;
    d.numa_node = -1;
    d.activations = MT_PLACE_AUTO;
    d.pin_host = MT_PIN_AUTO;
    d.log_level = MT_LOG_WARN;
    d.recompute = MT_RECOMPUTE_AUTO;
    mt_struct_init(p, size, &d, sizeof d);
}

void mt_optim_config_init_sized(mt_optim_config *p, uint32_t size)
{
    mt_optim_config o;
    memset(&o, 0, sizeof o);
    o.schedule = MT_LR_COSINE;
    o.lr = 3e-4f;
    o.beta1 = 0.9f;
    o.beta2 = 0.95f;
    o.eps = 1e-8f;
    o.weight_decay = 0.1f;
    o.grad_clip = 1.0f;
    o.min_lr_ratio = 0.1f;
    o.warmup_steps = 0;
    o.total_steps = 1000;
    mt_struct_init(p, size, &o, sizeof o);
}

void mt_batch_shape_init_sized(mt_batch_shape *p, uint32_t size)
{
    mt_batch_shape s;
    memset(&s, 0, sizeof s);
    s.micro_batch_size = 1;
    s.seq_len = 1024;
    s.num_micro_batches = 1;
    mt_struct_init(p, size, &s, sizeof s);
}

void mt_memory_plan_init_sized(mt_memory_plan *p, uint32_t size) { mt_struct_init(p, size, NULL, 0); }

/* ---- validation ---------------------------------------------------------- */

/* Limits that keep every size computation inside 64 bits and reject typos:
 * far above any model this design can train on one machine. */
#define MAX_VOCAB (1u << 24)
#define MAX_HIDDEN (1u << 17)
#define MAX_LAYERS 4096u
#define MAX_HEADS 1024u
#define MAX_HEAD_DIM 1024u

#define BAD(...) mt_fail(err, MT_ERR_INVALID_ARGUMENT, __VA_ARGS__)

static int is_gemma(const mt_model_config *c) { return c->arch == MT_ARCH_GEMMA2 || c->arch == MT_ARCH_GEMMA3; }
static int is_moe(const mt_model_config *c) { return c->arch == MT_ARCH_QWEN3_MOE || c->arch == MT_ARCH_MIXTRAL; }

/* A float field that is 0 (unset) or finite and above lo. */
static int unset_or_above(float f, float lo) { return f == 0.0f || (isfinite(f) && f > lo); }

static mt_status gemma_fields_check(mt_err err, const mt_model_config *c)
{
    if (!unset_or_above(c->query_pre_attn_scalar, 0.0f))
        return BAD("query_pre_attn_scalar %g must be 0 or a positive finite number", (double)c->query_pre_attn_scalar);
    if (!unset_or_above(c->rope_local_base_freq, 1.0f))
        return BAD("rope_local_base_freq %g must be 0 or a finite number above 1", (double)c->rope_local_base_freq);
    if (!unset_or_above(c->attn_logit_softcapping, 0.0f) || !unset_or_above(c->final_logit_softcapping, 0.0f))
        return BAD("attn_logit_softcapping %g and final_logit_softcapping %g must be 0 or positive finite numbers",
                   (double)c->attn_logit_softcapping, (double)c->final_logit_softcapping);
    if (!is_gemma(c) && (c->query_pre_attn_scalar != 0.0f || c->attn_logit_softcapping != 0.0f ||
                         c->final_logit_softcapping != 0.0f))
        return BAD("query_pre_attn_scalar, attn_logit_softcapping and final_logit_softcapping are Gemma's: they must "
                   "be 0 for architecture %u",
                   c->arch);
    if (c->arch != MT_ARCH_GEMMA3 && c->rope_local_base_freq != 0.0f)
        return BAD("rope_local_base_freq %g is Gemma 3's: it must be 0 for architecture %u",
                   (double)c->rope_local_base_freq, c->arch);
    return MT_OK;
}

#define MAX_EXPERTS 1024u

static int any_dense_layer(const mt_model_config *c)
{
    return (c->mlp_only_layers[0] | c->mlp_only_layers[1] | c->mlp_only_layers[2] | c->mlp_only_layers[3]) != 0;
}

static mt_status moe_fields_check(mt_err err, const mt_model_config *c)
{
    const int any = c->num_experts || c->num_experts_per_tok || c->moe_intermediate_size || c->norm_topk_prob ||
                    c->decoder_sparse_step || c->output_router_logits || c->router_aux_loss_coef != 0.0f ||
                    c->mlp_only_layers[0] || c->mlp_only_layers[1] || c->mlp_only_layers[2] ||
                    c->mlp_only_layers[3];
    if (!is_moe(c)) {
        if (any)
            return BAD("num_experts and the other mixture-of-experts fields must be 0 for architecture %u (Qwen3-MoE "
                       "and Mixtral have experts)",
                       c->arch);
        return MT_OK;
    }
    if (c->num_experts == 0 || c->num_experts > MAX_EXPERTS)
        return BAD("num_experts %u is outside [1, %u]", c->num_experts, MAX_EXPERTS);
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
    if (c->arch == MT_ARCH_MIXTRAL &&
        (!c->norm_topk_prob || c->decoder_sparse_step > 1 || any_dense_layer(c)))
        return BAD("Mixtral renormalises its top-k weights and has experts in every layer: norm_topk_prob must be 1, "
                   "decoder_sparse_step 0 or 1 and mlp_only_layers empty");
    return MT_OK;
}

mt_status mt_config_import(mt_err err, mt_model_config *c, const mt_model_config *src)
{
    mt_model_config_init(c);
    mt_status st = mt_copy_in(err, c, sizeof *c, src, MT_FIRST_SIZE_MODEL_CONFIG, "mt_model_config");
    if (st) return st;
    if (c->arch > MT_ARCH_MIXTRAL) return BAD("mt_model_config.arch %u is not an mt_arch value", c->arch);
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
    if (c->rope_scaling > MT_ROPE_SCALING_LINEAR)
        return BAD("rope_scaling %u is not an mt_rope_scaling value", c->rope_scaling);
    if (c->rope_scaling == MT_ROPE_SCALING_LLAMA3 &&
        (!(c->rope_factor >= 1.0f) || !(c->rope_low_freq_factor > 0.0f) ||
         !(c->rope_high_freq_factor > c->rope_low_freq_factor) || c->rope_original_max_position == 0))
        return BAD("llama3 rope scaling needs factor >= 1, 0 < low_freq_factor < high_freq_factor and "
                   "original_max_position > 0 (got %g, %g, %g, %u)",
                   (double)c->rope_factor, (double)c->rope_low_freq_factor, (double)c->rope_high_freq_factor,
                   c->rope_original_max_position);
    if (c->rope_scaling == MT_ROPE_SCALING_LINEAR && !(c->rope_factor >= 1.0f && isfinite(c->rope_factor)))
        return BAD("linear rope scaling needs a finite factor >= 1 (got %g)", (double)c->rope_factor);
    if (!(c->initializer_range >= 0.0f) || !isfinite(c->initializer_range))
        return BAD("initializer_range %g must be finite and >= 0", (double)c->initializer_range);
    if (c->reserved0) return BAD("mt_model_config.reserved0 must be zero");
    if (c->reserved1) return BAD("mt_model_config.reserved1 must be zero");
    if (c->reserved2) return BAD("mt_model_config.reserved2 must be zero");
    st = gemma_fields_check(err, c);
    if (!st) st = moe_fields_check(err, c);
    if (st) return st;
    if (c->arch == MT_ARCH_PHI3 && c->attention_bias)
        return BAD("attention_bias: Phi-3's fused qkv_proj has no bias");
    if (c->sliding_window) {
        if (c->arch == MT_ARCH_LLAMA)
            return BAD("sliding_window %u: Llama has no sliding-window attention (Mistral, Qwen2, Qwen3 and Phi-3 do)",
                       c->sliding_window);
        if ((c->arch == MT_ARCH_MISTRAL || c->arch == MT_ARCH_PHI3) &&
            (c->sliding_window_pattern || c->max_window_layers))
            return BAD("%s slides every layer: sliding_window_pattern %u and max_window_layers %u must be 0",
                       c->arch == MT_ARCH_PHI3 ? "Phi-3" : "Mistral", c->sliding_window_pattern, c->max_window_layers);
        if (c->sliding_window_pattern == 1 || c->sliding_window_pattern > c->num_hidden_layers)
            return BAD("sliding_window_pattern %u must be 0 or between 2 and num_hidden_layers %u",
                       c->sliding_window_pattern, c->num_hidden_layers);
        if (c->max_window_layers > c->num_hidden_layers)
            return BAD("max_window_layers %u is more than num_hidden_layers %u", c->max_window_layers,
                       c->num_hidden_layers);
    } else if (c->sliding_window_pattern || c->max_window_layers) {
        return BAD("sliding_window_pattern %u and max_window_layers %u need a sliding_window",
                   c->sliding_window_pattern, c->max_window_layers);
    }
#undef BAD
    return MT_OK;
}

mt_status mt_policy_import(mt_err err, mt_offload_policy *p, const mt_offload_policy *src)
{
    mt_offload_policy_init(p);
    if (!src) return MT_OK; /* NULL policy: the defaults */
    mt_status st = mt_copy_in(err, p, sizeof *p, src, MT_FIRST_SIZE_OFFLOAD_POLICY, "mt_offload_policy");
    if (st) return st;
#define BAD(...) mt_fail(err, MT_ERR_INVALID_ARGUMENT, __VA_ARGS__)
    if (p->backend > MT_BACKEND_CUDA) return BAD("mt_offload_policy.backend %u is not an mt_backend value", p->backend);
    if (p->device < 0) return BAD("mt_offload_policy.device %d is negative", p->device);
    if (p->weight_slots < 2 || p->weight_slots > MT_MAX_WEIGHT_SLOTS)
        return BAD("mt_offload_policy.weight_slots %u is outside [2, %d]", p->weight_slots, MT_MAX_WEIGHT_SLOTS);
    if (p->numa_node < -1) return BAD("mt_offload_policy.numa_node %d: use -1 for automatic", p->numa_node);
    if (p->optimizer_threads > 4096)
        return BAD("mt_offload_policy.optimizer_threads %u is absurd", p->optimizer_threads);
    if (p->activations > MT_PLACE_HOST)
        return BAD("mt_offload_policy.activations %u is not an mt_placement value", p->activations);
    if (p->pin_host > MT_PIN_NEVER) return BAD("mt_offload_policy.pin_host %u is not an mt_pinning value", p->pin_host);
    if (p->log_level > MT_LOG_ERROR + 1) return BAD("mt_offload_policy.log_level %u is not an mt_log_level", p->log_level);
    if (p->timeline > 1) return BAD("mt_offload_policy.timeline %u is not 0 or 1", p->timeline);
    if (p->recompute > MT_RECOMPUTE_FULL)
        return BAD("mt_offload_policy.recompute %u is not an mt_recompute value", p->recompute);
    if (p->reserved1) return BAD("mt_offload_policy.reserved1 must be zero");
    if (p->attention > MT_ATTENTION_CUDNN)
        return BAD("mt_offload_policy.attention %u is not an mt_attention value", p->attention);
    if (p->attention_flags & ~MT_ATTENTION_NONDETERMINISTIC)
        return BAD("mt_offload_policy.attention_flags 0x%x has unknown bits", p->attention_flags);
    if (p->weight_fetch > MT_FETCH_SLICES)
        return BAD("mt_offload_policy.weight_fetch %u is not an mt_weight_fetch (0 auto, 1 whole, 2 slices)",
                   p->weight_fetch);
    if (p->num_devices > MT_MAX_DEVICES)
        return BAD("mt_offload_policy.num_devices %u: at most %d GPUs of one host", p->num_devices, MT_MAX_DEVICES);
    if (p->num_devices > 1) {
        if (p->backend == MT_BACKEND_CPU)
            return BAD("mt_offload_policy.num_devices %u asks for several GPUs, but the backend is the CPU",
                       p->num_devices);
        if (!p->devices) return BAD("mt_offload_policy.devices is NULL, with num_devices %u", p->num_devices);
        for (uint32_t i = 0; i < p->num_devices; i++) {
            if (p->devices[i] < 0) return BAD("mt_offload_policy.devices[%u] is %d, negative", i, p->devices[i]);
            for (uint32_t j = 0; j < i; j++)
                if (p->devices[j] == p->devices[i])
                    return BAD("mt_offload_policy.devices lists device %d twice (entries %u and %u)", p->devices[i],
                               j, i);
        }
        p->device = p->devices[0]; /* rank 0's: what the library reports and plans for */
    } else {
        p->devices = NULL; /* not read */
    }
#undef BAD
    return MT_OK;
}

mt_status mt_optim_import(mt_err err, mt_optim_config *o, const mt_optim_config *src)
{
    mt_optim_config_init(o);
    mt_status st = mt_copy_in(err, o, sizeof *o, src, MT_FIRST_SIZE_OPTIM_CONFIG, "mt_optim_config");
    if (st) return st;
#define BAD(...) mt_fail(err, MT_ERR_INVALID_ARGUMENT, __VA_ARGS__)
    if (o->schedule > MT_LR_COSINE) return BAD("mt_optim_config.schedule %u is not an mt_lr_schedule", o->schedule);
    if (!(o->lr >= 0.0f) || !isfinite(o->lr)) return BAD("lr %g must be finite and >= 0", (double)o->lr);
    if (!(o->beta1 >= 0.0f && o->beta1 < 1.0f)) return BAD("beta1 %g is outside [0, 1)", (double)o->beta1);
    if (!(o->beta2 >= 0.0f && o->beta2 < 1.0f)) return BAD("beta2 %g is outside [0, 1)", (double)o->beta2);
    if (!(o->eps > 0.0f) || !isfinite(o->eps)) return BAD("eps %g must be positive and finite", (double)o->eps);
    if (!(o->weight_decay >= 0.0f) || !isfinite(o->weight_decay))
        return BAD("weight_decay %g must be finite and >= 0", (double)o->weight_decay);
    if (!(o->grad_clip >= 0.0f) || !isfinite(o->grad_clip))
        return BAD("grad_clip %g must be finite and >= 0 (0 disables clipping)", (double)o->grad_clip);
    if (!(o->min_lr_ratio >= 0.0f && o->min_lr_ratio <= 1.0f))
        return BAD("min_lr_ratio %g is outside [0, 1]", (double)o->min_lr_ratio);
    if (o->schedule == MT_LR_COSINE && o->total_steps == 0) return BAD("a cosine schedule needs total_steps > 0");
    if (o->reserved0) return BAD("mt_optim_config.reserved0 must be zero");
#undef BAD
    return MT_OK;
}

mt_status mt_shape_import(mt_err err, mt_batch_shape *s, const mt_batch_shape *src)
{
    mt_batch_shape_init(s);
    if (!src) return MT_OK;
    mt_status st = mt_copy_in(err, s, sizeof *s, src, MT_FIRST_SIZE_BATCH_SHAPE, "mt_batch_shape");
    if (st) return st;
    if (s->micro_batch_size == 0 || s->seq_len == 0 || s->num_micro_batches == 0)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT,
                       "mt_batch_shape needs micro_batch_size, seq_len and num_micro_batches > 0 (got %u, %u, %u)",
                       s->micro_batch_size, s->seq_len, s->num_micro_batches);
    if ((uint64_t)s->micro_batch_size * s->seq_len > (1u << 30))
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "a micro-batch of %u x %u tokens is absurd",
                       s->micro_batch_size, s->seq_len);
    return MT_OK;
}

/* ---- learning-rate schedule -------------------------------------------------- */

/* Linear warm-up from lr/warmup to lr over warmup_steps (step 0 gets
 * lr/warmup, as the common `(step+1)/warmup` ramp), then constant or a cosine
 * decay from lr to lr*min_lr_ratio at total_steps, constant after. */
float mt_lr_at(const mt_optim_config *src, uint64_t step)
{
    mt_optim_config o;
    mt_err none = {0};
    if (mt_optim_import(none, &o, src) != MT_OK) return NAN;
    if (step < o.warmup_steps) return o.lr * (float)((double)(step + 1) / (double)o.warmup_steps);
    if (o.schedule == MT_LR_CONSTANT) return o.lr;
    uint64_t decay = o.total_steps > o.warmup_steps ? o.total_steps - o.warmup_steps : 0;
    double progress = decay ? (double)(step - o.warmup_steps) / (double)decay : 1.0;
    if (progress > 1.0) progress = 1.0;
    double floor_lr = (double)o.lr * o.min_lr_ratio;
    double cosv = 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
    return (float)(floor_lr + ((double)o.lr - floor_lr) * cosv);
}
