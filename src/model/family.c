/* The table of model families, its look-ups, and the public listing
 * (mt_family_get, mt_family_example). */
#include "model/family.h"
#include "core/abi.h"
#include "core/internal.h"
#include "model/template.h"

#include <stdio.h>
#include <string.h>

/* Fields a family leaves out are 0, NULL or Llama's (MT_GLU_SILU is 0). In
 * the order of mt_arch, which is also the order of every list. */
#define LLAMA_DEFAULTS .hidden_act = "silu", .rope_theta = 10000.0f
#define GEMMA_LAYER                                                                                                  \
    .layer_template = &mt_template_gemma, .template_name = "gemma",                                                  \
    .norm_offset = 1.0f, .glu_act = MT_GLU_GELU_TANH, .hidden_act = "gelu_pytorch_tanh",                             \
    .window = MT_WINDOW_PATTERN, .tied = 1, .query_pre_attn_scalar = 256.0f
#define LLAMA_TEMPLATE .layer_template = &mt_template_llama, .template_name = "llama"
#define MOE_TEMPLATE .layer_template = &mt_template_moe, .template_name = "moe"

static const mt_family FAMILIES[] = {
    {
        .arch = MT_ARCH_LLAMA, .name = "llama", .display_name = "Llama", .architecture = "LlamaForCausalLM",
        .model_type = "llama", .particular = "Llama 2, 3, 3.1, 3.2", LLAMA_TEMPLATE, LLAMA_DEFAULTS,
        .window = MT_WINDOW_NONE,
        .example = "Llama-3.1-8B", .example_shape = {128256, 4096, 14336, 32, 32, 8, 0, 0, 0, 0, 0, 0},
    },
    {
        .arch = MT_ARCH_QWEN2, .name = "qwen2", .display_name = "Qwen2", .architecture = "Qwen2ForCausalLM",
        .model_type = "qwen2", .particular = "q/k/v biases; windows", LLAMA_TEMPLATE, LLAMA_DEFAULTS,
        .flags = MT_FAMILY_BIAS, .window = MT_WINDOW_FROM_LAYER, .max_window_layers = 28,
        .example = "Qwen2.5-7B", .example_shape = {152064, 3584, 18944, 28, 28, 4, 0, 0, 0, 0, 0, 0},
    },
    {
        .arch = MT_ARCH_MISTRAL, .name = "mistral", .display_name = "Mistral", .architecture = "MistralForCausalLM",
        .model_type = "mistral", .particular = "sliding window", LLAMA_TEMPLATE, LLAMA_DEFAULTS,
        .window = MT_WINDOW_EVERY_LAYER,
        .example = "Mistral-7B-v0.1", .example_shape = {32000, 4096, 14336, 32, 32, 8, 0, 4096, 0, 0, 0, 0},
    },
    {
        .arch = MT_ARCH_QWEN3, .name = "qwen3", .display_name = "Qwen3", .architecture = "Qwen3ForCausalLM",
        .model_type = "qwen3", .particular = "norms of q and k", LLAMA_TEMPLATE, LLAMA_DEFAULTS,
        .flags = MT_FAMILY_QK_NORM, .window = MT_WINDOW_FROM_LAYER, .max_window_layers = 28,
        .example = "Qwen3-8B", .example_shape = {151936, 4096, 12288, 36, 32, 8, 128, 0, 0, 0, 0, 0},
    },
    {
        .arch = MT_ARCH_PHI3, .name = "phi3", .display_name = "Phi-3", .architecture = "Phi3ForCausalLM",
        .model_type = "phi3", .particular = "fused qkv, gate_up", LLAMA_TEMPLATE, LLAMA_DEFAULTS,
        .flags = MT_FAMILY_FUSED | MT_FAMILY_NULL_TOKEN_IDS | MT_FAMILY_CLASS_PAD | MT_FAMILY_PHI3_ROPE,
        .class_pad = 32000,
        .window = MT_WINDOW_EVERY_LAYER,
        .example = "Phi-4", .example_shape = {100352, 5120, 17920, 40, 40, 10, 0, 0, 0, 0, 0, 0},
    },
    {
        .arch = MT_ARCH_GEMMA2, .name = "gemma2", .display_name = "Gemma 2", .architecture = "Gemma2ForCausalLM",
        .model_type = "gemma2", .particular = "sandwich norms, caps", GEMMA_LAYER,
        .flags = MT_FAMILY_SANDWICH | MT_FAMILY_EMBED_SCALE | MT_FAMILY_GEMMA_CONFIG | MT_FAMILY_CLASS_PAD,
        .window_pattern = 2, /* every other layer: transformers 4 wrote no pattern */
        .rope_theta = 10000.0f, .attn_softcap = 50.0f, .final_softcap = 30.0f,
        .example = "gemma-2-9b", .example_shape = {256000, 3584, 14336, 42, 16, 8, 256, 4096, 1, 0, 0, 0},
    },
    {
        .arch = MT_ARCH_GEMMA3, .name = "gemma3", .display_name = "Gemma 3", .architecture = "Gemma3ForCausalLM",
        .model_type = "gemma3_text", .particular = "q/k norms, local RoPE", GEMMA_LAYER,
        .flags = MT_FAMILY_SANDWICH | MT_FAMILY_EMBED_SCALE | MT_FAMILY_GEMMA_CONFIG | MT_FAMILY_QK_NORM |
                 MT_FAMILY_LOCAL_ROPE | MT_FAMILY_CLASS_PAD,
        .window_pattern = 6, .window_pattern_key = "sliding_window_pattern",
        .rope_theta = 1e6f, .rope_local_base_freq = 10000.0f,
        .example = "gemma-3-1b", .example_shape = {262144, 1152, 6912, 26, 4, 1, 256, 512, 1, 0, 0, 0},
    },
    {
        .arch = MT_ARCH_QWEN3_MOE, .name = "qwen3_moe", .display_name = "Qwen3-MoE",
        .architecture = "Qwen3MoeForCausalLM", .model_type = "qwen3_moe", .particular = "128 experts, top-8",
        MOE_TEMPLATE, LLAMA_DEFAULTS, .flags = MT_FAMILY_QK_NORM, .window = MT_WINDOW_FROM_LAYER, .max_window_layers = 28,
        .moe = MT_MOE_QWEN3, .experts = 128, .experts_per_tok = 8, .expert_ffn = 768, .moe_block = "mlp",
        .expert_names = {"gate_proj", "up_proj", "down_proj"},
        .example = "Qwen3-30B-A3B", .example_shape = {151936, 2048, 6144, 48, 32, 4, 128, 0, 0, 128, 8, 768, 1, 0},
    },
    {
        .arch = MT_ARCH_MIXTRAL, .name = "mixtral", .display_name = "Mixtral", .architecture = "MixtralForCausalLM",
        .model_type = "mixtral", .particular = "8 experts, top-2", MOE_TEMPLATE, LLAMA_DEFAULTS,
        .window = MT_WINDOW_EVERY_LAYER,
        .moe = MT_MOE_MIXTRAL, .experts = 8, .experts_per_tok = 2, .moe_block = "block_sparse_moe",
        .expert_names = {"w1", "w3", "w2"}, /* w1 the gate, w3 the up, w2 the down projection */
        .example = "Mixtral-8x7B", .example_shape = {32000, 4096, 14336, 32, 32, 8, 0, 0, 0, 8, 2, 14336, 1, 0},
    },
    {
        .arch = MT_ARCH_QWEN2_MOE, .name = "qwen2_moe", .display_name = "Qwen2-MoE",
        .architecture = "Qwen2MoeForCausalLM", .model_type = "qwen2_moe", .particular = "gated shared expert",
        MOE_TEMPLATE, LLAMA_DEFAULTS, .bias_key = "qkv_bias", .window = MT_WINDOW_EVEN_BELOW, .max_window_layers = 28,
        .moe = MT_MOE_QWEN3, .experts = 60, .experts_per_tok = 4, .expert_ffn = 1408, .moe_block = "mlp",
        .expert_names = {"gate_proj", "up_proj", "down_proj"},
        .shared_block = "shared_expert", .shared_ffn = 5632, .shared_gate = "shared_expert_gate",
        .example = "Qwen1.5-MoE-A2.7B",
        .example_shape = {151936, 2048, 5632, 24, 16, 16, 0, 0, 0, 60, 4, 1408, 0, 5632},
    },
    {
        .arch = MT_ARCH_GPT_OSS, .name = "gpt_oss", .display_name = "GPT-OSS", .architecture = "GptOssForCausalLM",
        .model_type = "gpt_oss", .particular = "sinks, expert biases", MOE_TEMPLATE, .hidden_act = "silu",
        .flags = MT_FAMILY_O_BIAS | MT_FAMILY_SINKS, .bias_key = "attention_bias", .glu_act = MT_GLU_GPTOSS,
        .window = MT_WINDOW_PATTERN, .window_pattern = 2, .window_default = 128, /* sliding, full, sliding, ... */
        .head_dim_default = 64,
        .rope_theta = 150000.0f, .rope_default_yarn = {32.0f, 4096.0f, 32.0f, 1.0f},
        .moe = MT_MOE_GPT_OSS, .experts = 128, .experts_per_tok = 4, .moe_block = "mlp",
        .example = "gpt-oss-20b",
        .example_shape = {201088, 2880, 2880, 24, 64, 8, 64, 128, 0, 32, 4, 2880, 1, 0},
    },
    {
        .arch = MT_ARCH_DEEPSEEK_V3, .name = "deepseek_v3", .display_name = "DeepSeek-V3",
        .architecture = "DeepseekV3ForCausalLM", .model_type = "deepseek_v3",
        .particular = "latent attention, sigmoid routing", MOE_TEMPLATE, LLAMA_DEFAULTS, .flags = MT_FAMILY_MLA,
        .moe = MT_MOE_DEEPSEEK, .experts = 256, .experts_per_tok = 8, .expert_ffn = 2048, .moe_block = "mlp",
        .expert_names = {"gate_proj", "up_proj", "down_proj"}, .shared_block = "shared_experts",
        .example = "DeepSeek-V3",
        .example_shape = {.vocab = 129280, .hidden = 7168, .ffn = 18432, .layers = 61, .heads = 128, .kv_heads = 128,
                          .head_dim = 192, .experts = 256, .experts_per_tok = 8, .expert_ffn = 2048, .norm_topk = 1,
                          .shared_ffn = 2048, .kv_lora = 512, .q_lora = 1536, .qk_nope = 128, .qk_rope = 64,
                          .v_dim = 128, .dense_layers = 3, .n_group = 8, .topk_group = 4, .routed_scale = 2.5f},
    },
    {
        .arch = MT_ARCH_DEEPSEEK_V2, .name = "deepseek_v2", .display_name = "DeepSeek-V2",
        .architecture = "DeepseekV2ForCausalLM", .model_type = "deepseek_v2",
        .particular = "latent attention, softmax routing", MOE_TEMPLATE, LLAMA_DEFAULTS, .flags = MT_FAMILY_MLA,
        .moe = MT_MOE_DEEPSEEK, .experts = 64, .experts_per_tok = 0, .expert_ffn = 1407, .moe_block = "mlp",
        .expert_names = {"gate_proj", "up_proj", "down_proj"}, .shared_block = "shared_experts",
        .example = "DeepSeek-V2-Lite",
        .example_shape = {.vocab = 102400, .hidden = 2048, .ffn = 10944, .layers = 27, .heads = 16, .kv_heads = 16,
                          .head_dim = 192, .experts = 64, .experts_per_tok = 6, .expert_ffn = 1408, .norm_topk = 0,
                          .shared_ffn = 2816, .kv_lora = 512, .q_lora = 0, .qk_nope = 128, .qk_rope = 64,
                          .v_dim = 128, .dense_layers = 1, .routed_scale = 1.0f},
    },
    {
        .arch = MT_ARCH_LLAMA4, .name = "llama4", .display_name = "Llama 4", .architecture = "Llama4ForCausalLM",
        .model_type = "llama4_text", .particular = "chunked and NoPE layers, shared expert", MOE_TEMPLATE,
        .hidden_act = "silu", .rope_theta = 500000.0f, .flags = MT_FAMILY_CHUNKED_NOPE | MT_FAMILY_O_BIAS,
        .head_dim_default = 128,
        .moe = MT_MOE_LLAMA4, .experts = 16, .experts_per_tok = 1, .moe_block = "feed_forward",
        .expert_names = {"gate_proj", "up_proj", "down_proj"}, .shared_block = "shared_expert",
        .example = "Llama-4-Scout-17B-16E",
        .example_shape = {.vocab = 202048, .hidden = 5120, .ffn = 16384, .layers = 48, .heads = 40, .kv_heads = 8,
                          .head_dim = 128, .experts = 16, .experts_per_tok = 1, .expert_ffn = 8192,
                          .shared_ffn = 8192, .chunk = 8192, .nope_every = 4},
    },
};
#define N_FAMILIES (sizeof FAMILIES / sizeof FAMILIES[0])

const mt_family *mt_family_at(size_t i) { return i < N_FAMILIES ? &FAMILIES[i] : NULL; }

const mt_family *mt_family_of(uint32_t arch)
{
    for (size_t i = 0; i < N_FAMILIES; i++)
        if ((uint32_t)FAMILIES[i].arch == arch) return &FAMILIES[i];
    return NULL;
}

const mt_family *mt_family_by_architecture(const char *architecture)
{
    for (size_t i = 0; architecture && i < N_FAMILIES; i++)
        if (!strcmp(FAMILIES[i].architecture, architecture)) return &FAMILIES[i];
    return NULL;
}

const mt_family *mt_family_by_model_type(const char *model_type)
{
    for (size_t i = 0; model_type && i < N_FAMILIES; i++)
        if (!strcmp(FAMILIES[i].model_type, model_type)) return &FAMILIES[i];
    return NULL;
}

const char *mt_family_list(char *buf, size_t len, int types)
{
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < N_FAMILIES && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%s", i ? ", " : "",
                              types ? FAMILIES[i].model_type : FAMILIES[i].architecture);
    return buf;
}

/* ---- the public listing ------------------------------------------------------ */

void mt_family_info_init_sized(mt_family_info *info, uint32_t size) { mt_struct_init(info, size, NULL, 0); }

uint32_t mt_family_count(void) { return (uint32_t)N_FAMILIES; }

mt_status mt_family_get(mt_family_info *out, uint32_t index)
{
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (index >= N_FAMILIES)
        return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_family_get: index %u is past the last family (%u families)",
                       index, (unsigned)N_FAMILIES);
    const mt_family *f = &FAMILIES[index];
    mt_family_info info = {
        .struct_size = sizeof info, .arch = (uint32_t)f->arch, .name = f->name, .display_name = f->display_name,
        .architecture = f->architecture, .model_type = f->model_type, .layer_template = f->template_name,
        .particular = f->particular, .example = f->example,
    };
    return mt_copy_out(err, out, &info, sizeof info, MT_FIRST_SIZE_FAMILY_INFO, "mt_family_info");
}

mt_status mt_family_example(mt_model_config *cfg, uint32_t arch)
{
    mt_err err = mt_err_thread();
    mt_err_clear(err);
    if (!cfg) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_family_example: cfg is NULL");
    const mt_family *f = mt_family_of(arch);
    if (!f) return mt_fail(err, MT_ERR_INVALID_ARGUMENT, "mt_family_example: arch %u is not an mt_arch value", arch);
    mt_model_config caller;
    mt_status st = mt_copy_in(err, &caller, sizeof caller, cfg, MT_FIRST_SIZE_MODEL_CONFIG, "mt_model_config");
    if (st) return st;
    /* the shape is the example's; what training does with it stays the caller's, as mt_config_load */
    mt_model_config c;
    mt_model_config_init(&c);
    c.precision = caller.precision, c.seed = caller.seed, c.initializer_range = caller.initializer_range;
    const mt_family_shape *s = &f->example_shape;
    c.arch = (uint32_t)f->arch, c.vocab_size = s->vocab, c.hidden_size = s->hidden, c.intermediate_size = s->ffn;
    c.num_hidden_layers = s->layers, c.num_attention_heads = s->heads, c.num_key_value_heads = s->kv_heads;
    c.head_dim = s->head_dim, c.sliding_window = s->window, c.tie_word_embeddings = s->tied;
    c.attention_bias = (f->flags & MT_FAMILY_BIAS) || f->bias_key;
    if (s->experts) {
        c.num_experts = s->experts, c.num_experts_per_tok = s->experts_per_tok;
        c.moe_intermediate_size = s->expert_ffn, c.norm_topk_prob = s->norm_topk;
        c.shared_expert_intermediate_size = s->shared_ffn, c.shared_expert_gate = s->shared_ffn && f->shared_gate;
    }
    if (s->kv_lora) {
        c.kv_lora_rank = s->kv_lora, c.q_lora_rank = s->q_lora, c.qk_nope_head_dim = s->qk_nope;
        c.qk_rope_head_dim = s->qk_rope, c.v_head_dim = s->v_dim, c.rope_interleave = 1;
        c.n_group = s->n_group, c.topk_group = s->topk_group, c.routed_scaling_factor = s->routed_scale;
        c.moe_scoring = f->arch == MT_ARCH_DEEPSEEK_V3 ? MT_MOE_SCORING_SIGMOID : MT_MOE_SCORING_SOFTMAX;
        for (uint32_t l = 0; l < s->dense_layers; l++) c.mlp_only_layers[l / 64] |= (uint64_t)1 << (l % 64);
    }
    if (f->moe == MT_MOE_LLAMA4) { /* Llama4TextConfig's defaults beside the shape */
        c.attention_chunk_size = s->chunk, c.qk_l2_norm = 1, c.moe_input_weighted = 1;
        c.moe_scoring = MT_MOE_SCORING_SIGMOID;
        c.attn_temperature_floor = 8192.0f, c.attn_temperature_scale = 0.1f;
        for (uint32_t l = 0; l < s->layers; l++)
            if ((l + 1) % s->nope_every == 0) c.nope_layers[l / 64] |= (uint64_t)1 << (l % 64);
    }
    uint32_t caller_size;
    memcpy(&caller_size, cfg, sizeof caller_size);
    const size_t i = mt_config_first_set_past(&c, MT_MIN((size_t)caller_size, sizeof c));
    if (i < sizeof c)
        return mt_fail(err, MT_ERR_UNSUPPORTED,
                           "mt_family_example: %s's example needs a field of mt_model_config past the %u bytes this "
                           "caller's struct has (byte %zu, %s): build against this library's megatrain.h",
                           f->display_name, caller_size, i, mt_config_field_group(i));
    return mt_copy_out(err, cfg, &c, sizeof c, MT_FIRST_SIZE_MODEL_CONFIG, "mt_model_config");
}
