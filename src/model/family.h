/* The model families: one descriptor a family, read by everything that
 * differs between families (config validation, config.json, the tensor
 * layout, the template and its dims, the norms' initial value, the CLI's
 * lists through mt_family_get). A family whose layer is one already written
 * is an entry of the table in family.c and nothing else; see
 * docs/architecture.md, "Adding a family". */
#ifndef MT_FAMILY_H
#define MT_FAMILY_H

#include "megatrain.h"

#include <stddef.h>
#include <stdint.h>

struct mt_template; /* model/template.h */

/* What a family is, beyond Llama's layer (MT_FAMILY_* bits of mt_family.flags). */
enum {
    MT_FAMILY_BIAS = 1u << 0,       /* q/k/v biases always; config.json has no attention_bias (Qwen2) */
    MT_FAMILY_QK_NORM = 1u << 1,    /* an RMSNorm of each head of q and k before RoPE (Qwen3, Gemma 3) */
    MT_FAMILY_FUSED = 1u << 2,      /* the checkpoint fuses q, k, v into qkv_proj and gate, up into
                                     * gate_up_proj (Phi-3); so no q/k/v biases */
    MT_FAMILY_SANDWICH = 1u << 3,   /* norms after attention and MLP too: post_attention_layernorm is the
                                     * attention output's, pre/post_feedforward_layernorm the MLP's (Gemma) */
    MT_FAMILY_EMBED_SCALE = 1u << 4,/* the embedding times sqrt(hidden_size), in the activations' type (Gemma) */
    MT_FAMILY_GEMMA_CONFIG = 1u << 5,/* GemmaConfig's keys: hidden_activation, query_pre_attn_scalar, the
                                     * soft-caps (which only these families may set); no mlp_bias */
    MT_FAMILY_LOCAL_ROPE = 1u << 6, /* sliding layers rotate by their own base, rope_local_base_freq
                                     * (Gemma 3); use_bidirectional_attention refused */
    MT_FAMILY_NULL_TOKEN_IDS = 1u << 7, /* config.json written with null token ids where the source folder
                                     * has none: the config class's defaults are another model's (Phi-3) */
    MT_FAMILY_CLASS_PAD = 1u << 8,  /* the config class's pad_token_id, where config.json has none, is
                                     * class_pad (Gemma's 0, Phi3Config's 32000), not None */
    MT_FAMILY_PHI3_ROPE = 1u << 9,  /* Phi3Config's RoPE: partial_rotary_factor, a top-level
                                     * original_max_position_embeddings, rope types su and yarn read as longrope */
    MT_FAMILY_O_BIAS = 1u << 10,    /* attention_bias gives o_proj a bias too, beside q, k and v's (GPT-OSS) */
    MT_FAMILY_SINKS = 1u << 11,     /* a learnt logit per head in the attention's softmax (self_attn.sinks,
                                     * GPT-OSS) */
    MT_FAMILY_MLA = 1u << 12,       /* multi-head latent attention (kv_lora_rank and the q/k/v head sizes,
                                     * DeepSeek-V2/V3); first_k_dense_replace dense layers; n_shared_experts */
    MT_FAMILY_CHUNKED_NOPE = 1u << 13, /* Llama 4's attention: layers with RoPE attend in chunks
                                     * (attention_chunk_size) with L2-normed q and k (use_qk_norm), layers
                                     * without (no_rope_layers) attend fully with a temperature on q */
};

/* Which layers slide, and how config.json says so. */
typedef enum mt_window_kind {
    MT_WINDOW_NONE = 0,        /* none: a sliding_window shorter than the positions is refused (Llama) */
    MT_WINDOW_EVERY_LAYER = 1, /* sliding_window on every layer; no pattern (Mistral, Phi-3, Mixtral) */
    MT_WINDOW_FROM_LAYER = 2,  /* use_sliding_window: the layers from max_window_layers on (Qwen2, Qwen3) */
    MT_WINDOW_PATTERN = 3,     /* one layer in sliding_window_pattern attends fully (Gemma) */
    MT_WINDOW_EVEN_BELOW = 4,  /* use_sliding_window: the even layers below max_window_layers (Qwen2-MoE's
                                * Qwen2MoeConfig, unlike Qwen2's) */
} mt_window_kind;

/* How config.json describes the experts, which also says what the layout
 * names them and which rules hold. */
typedef enum mt_moe_format {
    MT_MOE_NONE = 0,
    /* Qwen3MoeConfig: num_experts, moe_intermediate_size, norm_topk_prob, decoder_sparse_step,
     * mlp_only_layers */
    MT_MOE_QWEN3 = 1,
    /* MixtralConfig: num_local_experts of intermediate_size each, every layer sparse, the top-k always
     * renormalised, router_jitter_noise (refused unless 0) */
    MT_MOE_MIXTRAL = 2,
    /* GptOssConfig: num_local_experts of intermediate_size each, every layer sparse; the router (mlp.router)
     * and every expert matrix have biases; the softmax of each token's top-k logits (the top-k of the
     * softmax, renormalised); the experts' matrices stored stacked and transposed, gate and up interleaved
     * (mlp.experts.gate_up_proj (E, C, 2F), down_proj (E, F, C) and their biases) */
    MT_MOE_GPT_OSS = 3,
    /* DeepseekV3Config: n_routed_experts (num_local_experts) of moe_intermediate_size each beside
     * n_shared_experts shared ones (one MLP n_shared_experts times as wide: mlp.shared_experts), the first
     * first_k_dense_replace layers dense (intermediate_size); sigmoid scores, e_score_correction_bias,
     * n_group/topk_group, routed_scaling_factor; experts named as Qwen3-MoE's */
    MT_MOE_DEEPSEEK = 4,
    /* Llama4TextConfig: num_local_experts of intermediate_size each (the dense layers' width is
     * intermediate_size_mlp) and a shared expert as wide, every interleave_moe_layer_step-th layer sparse
     * (or those of moe_layers); top-k by logit, each weight sigmoid(logit) applied to its expert's input;
     * the experts stored stacked and transposed, gate and up concatenated (feed_forward.experts.gate_up_proj
     * (E, C, 2F), down_proj (E, F, C)), the router feed_forward.router */
    MT_MOE_LLAMA4 = 5,
} mt_moe_format;
/* Qwen2MoeConfig's keys are Qwen3MoeConfig's and shared_expert_intermediate_size (mt_family.shared_block). */

/* The shape of a checkpoint people fine-tune, for `megatrain plan --families`
 * (mt_family_example): the fields the layout and the plan read. */
typedef struct mt_family_shape {
    uint32_t vocab, hidden, ffn, layers, heads, kv_heads, head_dim, window, tied;
    uint32_t experts, experts_per_tok, expert_ffn, norm_topk, shared_ffn;
    /* multi-head latent attention and DeepSeek's routing */
    uint32_t kv_lora, q_lora, qk_nope, qk_rope, v_dim, dense_layers, n_group, topk_group;
    float routed_scale;
    /* Llama 4: the chunk of the layers with RoPE, and one layer in nope_every without it */
    uint32_t chunk, nope_every;
} mt_family_shape;

typedef struct mt_family {
    mt_arch arch;
    /* names */
    const char *name;         /* short and stable: the CLI's checkpoints record it ("gemma3") */
    const char *display_name; /* "Gemma 3": messages and lists */
    const char *architecture; /* config.json's architectures[0] */
    const char *model_type;   /* config.json's model_type */
    const char *particular;   /* what differs from Llama, in a few words (plan --families) */
    /* the layer */
    const struct mt_template *layer_template;
    const char *template_name;
    uint32_t flags;           /* MT_FAMILY_* */
    const char *bias_key;     /* where config.json says whether q/k/v have biases by another key than
                               * attention_bias, that key, whose default is true (Qwen2-MoE's qkv_bias) */
    /* norms scale by norm_offset + w: 1 where the checkpoint stores the scale minus one (Gemma), whose
     * weights then start at 0 (mt_family_norm_init) */
    float norm_offset;
    int glu_act;              /* mt_glu_act of the MLP */
    const char *hidden_act;   /* config.json's name of it: the only one accepted, and the one written */
    /* attention windows */
    mt_window_kind window;
    uint32_t max_window_layers; /* MT_WINDOW_FROM_LAYER: transformers' default */
    uint32_t window_pattern;    /* MT_WINDOW_PATTERN: the default pattern */
    uint32_t window_default;    /* sliding_window where config.json has none (GptOssConfig's 128), else 0 */
    uint32_t head_dim_default;  /* head_dim where config.json has none (GptOssConfig's 64); 0: hidden / heads */
    const char *window_pattern_key; /* ... and the key that may change it (NULL: none, fixed) */
    /* config.json defaults where a key is absent: transformers' for the family */
    float rope_theta;
    /* GptOssConfig's RoPE where config.json has none: yarn with these (factor, original length,
     * beta_fast, beta_slow; untruncated); rope_default_yarn[0] 0: no scaling */
    float rope_default_yarn[4];
    uint32_t tied;              /* tie_word_embeddings */
    uint32_t class_pad;         /* MT_FAMILY_CLASS_PAD: pad_token_id */
    float query_pre_attn_scalar, attn_softcap, final_softcap; /* MT_FAMILY_GEMMA_CONFIG */
    float rope_local_base_freq; /* MT_FAMILY_LOCAL_ROPE */
    /* mixture of experts */
    mt_moe_format moe;
    uint32_t experts, experts_per_tok, expert_ffn; /* config.json defaults (expert_ffn: Qwen3-MoE only) */
    const char *moe_block;      /* the MLP's module name: "mlp", "block_sparse_moe" */
    const char *expert_names[3];/* the experts' gate, up and down projections */
    /* a shared expert beside the routed ones (NULL: none): its module under moe_block, with the
     * expert_names of its projections, its width's default, and its sigmoid gate's module (NULL: none) */
    const char *shared_block;
    uint32_t shared_ffn;
    const char *shared_gate;
    /* the example */
    const char *example;
    mt_family_shape example_shape;
} mt_family;

/* The descriptor of an mt_arch value; NULL for a value that names no family. */
const mt_family *mt_family_of(uint32_t arch);
/* By config.json's architectures[0] or model_type; NULL when no family has it. */
const mt_family *mt_family_by_architecture(const char *architecture);
const mt_family *mt_family_by_model_type(const char *model_type);
/* The families in order (0 .. mt_family_count() - 1): what lists print. */
const mt_family *mt_family_at(size_t i);

/* The family of a config that passed mt_config_import: never NULL there. */
static inline const mt_family *mt_config_family(const mt_model_config *c) { return mt_family_of(c->arch); }
/* Whether a config's family has all of the MT_FAMILY_* bits `flags` (0 for an unknown arch). */
static inline int mt_config_has(const mt_model_config *c, uint32_t flags)
{
    const mt_family *f = mt_family_of(c->arch);
    return f && (f->flags & flags) == flags;
}
/* The value every norm scale starts at: the scale norm_offset + w starts at 1. */
static inline float mt_family_norm_init(const mt_family *f) { return 1.0f - f->norm_offset; }

/* "A, B, C" of the families' architecture names (model_types when types) into buf. */
const char *mt_family_list(char *buf, size_t len, int types);

#endif
