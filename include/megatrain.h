/*
 * megatrain.h - the public API of libmegatrain.
 *
 * libmegatrain trains decoder-only transformer language models (Llama, Qwen2,
 * Mistral families) whose size is bounded by host RAM rather than GPU memory:
 * weights, gradients, fp32 master weights and AdamW moments live in host
 * memory and the GPU receives one layer at a time.
 *
 * Conventions
 * - Every fallible call returns an mt_status; MT_OK is 0. A call that fails
 *   leaves its handle as it was before the call unless its documentation
 *   says otherwise. mt_model_errmsg() gives the last message for a model;
 *   every other call (mt_model_create, mt_plan, mt_config_load, and the
 *   dataset calls, since one dataset may serve several threads) leaves its
 *   message in mt_last_errmsg(), which is per thread.
 * - Out parameters come first, option structs after, user_data last.
 * - Option structs start with their size: call the matching *_init()
 *   function, which sets struct_size and the defaults, then change fields.
 *   Fields are only ever appended. A caller built against an older header
 *   passes a smaller struct_size and gets defaults for the fields it lacks;
 *   a caller built against a newer header may pass a larger one as long as
 *   the bytes this library does not know are zero (MT_ERR_STRUCT_SIZE
 *   otherwise).
 * - mt_X_init(p) is defined here, inline, as mt_X_init_sized(p, sizeof *p):
 *   the size is the caller's, fixed when the caller is compiled, so the
 *   library never writes past a struct from an older header. The exported
 *   mt_X_init_sized(p, size) writes exactly size bytes: the first size bytes
 *   of the defaults (zeros past the fields this library knows) and
 *   struct_size = size. A size below the struct's first release is written
 *   all the same and refused with MT_ERR_STRUCT_SIZE by the call that reads
 *   it; a size below 4 writes nothing. Bindings that cannot use the inline
 *   functions call mt_X_init_sized with their own struct's size.
 * - Strings returned by the library are owned by it: mt_status_str() and
 *   mt_version_string() live forever, mt_model_errmsg() until the next call
 *   on the same handle or its destruction.
 * - The library never prints to stdout and never terminates the process.
 *   Diagnostics go to the log callback of the model's policy (stderr at
 *   MT_LOG_WARN and above when none is set).
 * - Thread safety: different models may be used from different threads at
 *   once; one model must not be used by two threads at the same time.
 *   mt_plan, mt_status_str, the *_init and *_init_sized functions and the
 *   version functions are safe from any thread.
 * - CUDA: a model works on its policy's device from whichever thread calls
 *   it; each call leaves the calling thread's current CUDA device as it
 *   found it, so the library and the caller's own CUDA work do not disturb
 *   each other. Its pinned host memory is portable (usable by every device).
 */
#ifndef MEGATRAIN_H
#define MEGATRAIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(MT_BUILDING_LIBRARY) && defined(__GNUC__)
#define MT_API __attribute__((visibility("default")))
#else
#define MT_API
#endif

/* ---- version ------------------------------------------------------------ */

#define MT_VERSION_MAJOR 0
#define MT_VERSION_MINOR 2
#define MT_VERSION_PATCH 0
#define MT_VERSION_NUMBER (MT_VERSION_MAJOR * 10000 + MT_VERSION_MINOR * 100 + MT_VERSION_PATCH)

/* The version of the library actually loaded, as MT_VERSION_NUMBER computes it. */
MT_API uint32_t mt_version_number(void);
/* "MAJOR.MINOR.PATCH" of the loaded library. */
MT_API const char *mt_version_string(void);

/* ---- status codes --------------------------------------------------------- */

typedef enum mt_status {
    MT_OK = 0,
    MT_ERR_INVALID_ARGUMENT = 1,  /* NULL pointer, bad value, inconsistent config */
    MT_ERR_STRUCT_SIZE = 2,       /* struct_size too small, or unknown tail bytes not zero */
    MT_ERR_OUT_OF_HOST_MEMORY = 3,/* an allocation of host memory failed */
    MT_ERR_HOST_BUDGET = 4,       /* the plan needs more host memory than the budget or the machine has */
    MT_ERR_GPU_BUDGET = 5,        /* the plan needs more GPU memory than the budget or the device has */
    MT_ERR_OUT_OF_GPU_MEMORY = 6, /* a GPU allocation failed */
    MT_ERR_NO_DEVICE = 7,         /* the policy asks for a backend that this machine lacks */
    MT_ERR_DEVICE = 8,            /* the GPU runtime reported an error */
    MT_ERR_IO = 9,                /* a file could not be opened, read or written */
    MT_ERR_FORMAT = 10,           /* a file is corrupt, truncated or not of the expected format */
    MT_ERR_UNSUPPORTED = 11,      /* valid, but not supported by this build or architecture */
    MT_ERR_NONFINITE = 12,        /* a loss or gradient norm was NaN or infinite; nothing was updated */
    MT_ERR_ABORTED = 13,          /* the abort callback asked to stop */
    MT_ERR_INTERNAL = 14,         /* a bug in the library: please report it */
    MT_STATUS_MAX_ENUM = 0x7FFFFFFF
} mt_status;

/* A static English description of a status; never NULL. */
MT_API const char *mt_status_str(mt_status status);

/* The message of the last failed call on this thread that had no handle to
 * hold it (mt_model_create, mt_plan); "" when there is none. */
MT_API const char *mt_last_errmsg(void);

/* ---- logging -------------------------------------------------------------- */

typedef enum mt_log_level {
    MT_LOG_DEBUG = 0,
    MT_LOG_INFO = 1,
    MT_LOG_WARN = 2,
    MT_LOG_ERROR = 3,
    MT_LOG_MAX_ENUM = 0x7FFFFFFF
} mt_log_level;

/* Receives one line of text without a trailing newline; the text is valid
 * only during the call. Called from the thread that called into the library. */
typedef void (*mt_log_fn)(mt_log_level level, const char *text, void *user_data);

/* Polled by mt_step, mt_eval and mt_model_logits before each micro-batch of
 * each unit visit (so at least once per layer), on the calling thread;
 * return non-zero to stop the call with MT_ERR_ABORTED. The GPU work already
 * issued finishes first (at most one unit's work for one micro-batch), and
 * the model is left exactly as before the call. */
typedef int (*mt_abort_fn)(void *user_data);

/* ---- model configuration ------------------------------------------------- */

typedef enum mt_arch {
    MT_ARCH_LLAMA = 0,   /* LlamaForCausalLM */
    MT_ARCH_QWEN2 = 1,   /* Qwen2ForCausalLM: q/k/v bias */
    MT_ARCH_MISTRAL = 2, /* MistralForCausalLM */
    MT_ARCH_QWEN3 = 3,   /* Qwen3ForCausalLM: RMSNorm of each head of q and k */
    MT_ARCH_PHI3 = 4,    /* Phi3ForCausalLM (Phi-3, Phi-4): q, k, v and gate, up fused in the checkpoint */
    MT_ARCH_GEMMA2 = 5,  /* Gemma2ForCausalLM: (1 + w) norms around attention and MLP, GELU-tanh, soft-capping */
    MT_ARCH_GEMMA3 = 6,  /* Gemma3ForCausalLM (text): Gemma 2's layer with q/k norms and a local RoPE base */
    MT_ARCH_QWEN3_MOE = 7, /* Qwen3MoeForCausalLM: Qwen3 attention, mixture-of-experts MLPs */
    MT_ARCH_MIXTRAL = 8, /* MixtralForCausalLM: Mistral attention, mixture-of-experts MLPs */
    MT_ARCH_QWEN2_MOE = 9, /* Qwen2MoeForCausalLM: Qwen2 attention, routed experts and a gated shared expert */
    MT_ARCH_GPT_OSS = 10, /* GptOssForCausalLM: attention sinks and q/k/v/o biases, sliding and full layers
                           * alternating, experts with biases and a clamped SwiGLU */
    MT_ARCH_DEEPSEEK_V3 = 11, /* DeepseekV3ForCausalLM: multi-head latent attention, sigmoid-scored experts
                               * with a shared one, the first layers dense (also Kimi-K2, Moonlight) */
    MT_ARCH_DEEPSEEK_V2 = 12, /* DeepseekV2ForCausalLM: DeepSeek-V3's layer with softmax-scored experts
                               * (greedy or group-limited), no correction bias (DeepSeek-V2, V2-Lite) */
    MT_ARCH_LLAMA4 = 13,  /* Llama4ForCausalLM (text): chunked attention with RoPE, NoPE layers with a
                              temperature, q/k L2 norms, experts weighted on their input beside a shared one */
    MT_ARCH_MAX_ENUM = 0x7FFFFFFF
} mt_arch;

typedef enum mt_precision {
    MT_PRECISION_BF16 = 0, /* bf16 weights and activations, fp32 accumulation, fp32 master and moments */
    MT_PRECISION_FP32 = 1, /* everything in fp32: the reference mode */
    /* bf16's arithmetic with 6.05 bytes of host state per parameter instead of 14: the weights as 16-bit codes
     * and the AdamW moments as 8-bit ones in blocks of 256 with a scale each, updated with stochastic rounding
     * (no fp32 master; docs/lean-optimizer.md) */
    MT_PRECISION_LEAN = 2,
    MT_PRECISION_MAX_ENUM = 0x7FFFFFFF
} mt_precision;

typedef enum mt_rope_scaling {
    MT_ROPE_SCALING_NONE = 0,
    MT_ROPE_SCALING_LLAMA3 = 1, /* rope_type "llama3": factor, low/high_freq_factor, original_max_position */
    MT_ROPE_SCALING_LINEAR = 2, /* rope_type "linear": positions divided by factor (Gemma 3's full layers) */
    MT_ROPE_SCALING_YARN = 3,   /* rope_type "yarn": factor, original_max_position, rope_beta_fast/slow,
                                   rope_mscale, rope_mscale_all_dim, rope_attention_factor, rope_no_truncate */
    MT_ROPE_SCALING_LONGROPE = 4, /* rope_type "longrope": rope_short_factor below original_max_position,
                                     rope_long_factor past it, rope_attention_factor */
    MT_ROPE_SCALING_MAX_ENUM = 0x7FFFFFFF
} mt_rope_scaling;

/* The shape of a model. Field names follow Hugging Face's config.json. */
typedef struct mt_model_config {
    uint32_t struct_size;          /* the caller's sizeof(mt_model_config), set by mt_model_config_init */
    uint32_t arch;                 /* mt_arch */
    uint32_t vocab_size;
    uint32_t hidden_size;
    uint32_t intermediate_size;    /* the MLP's inner width */
    uint32_t num_hidden_layers;
    uint32_t num_attention_heads;
    uint32_t num_key_value_heads;  /* divides num_attention_heads; equal for plain MHA */
    uint32_t head_dim;             /* 0: hidden_size / num_attention_heads */
    uint32_t max_position_embeddings;
    float rms_norm_eps;
    float rope_theta;
    uint32_t rope_scaling;         /* mt_rope_scaling */
    float rope_factor;
    float rope_low_freq_factor;
    float rope_high_freq_factor;
    uint32_t rope_original_max_position;
    uint32_t attention_bias;       /* non-zero: q, k and v projections have a bias (Qwen2) */
    uint32_t tie_word_embeddings;  /* non-zero: the LM head is the embedding matrix */
    uint32_t precision;            /* mt_precision */
    uint64_t seed;                 /* weight initialisation */
    float initializer_range;       /* std of the normal init of matrices; norms start at 1, biases at 0 */
    uint32_t reserved0;            /* zero */
    /* appended in 0.2: sliding-window attention */
    uint32_t sliding_window;       /* 0: none; W: a sliding layer's query i sees keys i - W + 1 .. i only */
    uint32_t sliding_window_pattern; /* 0: every layer from max_window_layers slides; P: of those, layer i
                                        with (i + 1) % P == 0 attends fully (one in P, as Gemma's) */
    uint32_t max_window_layers;    /* the layers below this attend fully (Qwen2's max_window_layers) */
    uint32_t reserved1;            /* zero */
    /* appended in 0.2: Gemma 2 and Gemma 3 */
    float query_pre_attn_scalar;   /* 0: head_dim; attention scores are scaled by its -1/2 power */
    float rope_local_base_freq;    /* 0: rope_theta; the RoPE base of the sliding layers (Gemma 3), unscaled */
    float attn_logit_softcapping;  /* 0: none; c: attention scores s become c * tanh(s / c) (Gemma 2) */
    float final_logit_softcapping; /* 0: none; c: the same on the logits of the LM head */
    /* appended in 0.2: mixture of experts (Qwen3-MoE, Mixtral) */
    uint32_t num_experts;          /* 0: dense MLPs; E: each sparse layer's MLP is E experts and a router */
    uint32_t num_experts_per_tok;  /* k: each token's output is the weighted sum of its k best experts' */
    uint32_t moe_intermediate_size; /* each expert's inner width */
    uint32_t norm_topk_prob;       /* non-zero: the k routing weights are renormalised to sum to 1 */
    uint32_t decoder_sparse_step;  /* 0 or 1: every layer is sparse; s: layer l is when (l + 1) % s == 0 */
    uint32_t output_router_logits; /* non-zero: the router's load-balancing loss is added to the training loss */
    float router_aux_loss_coef;    /* its weight */
    uint32_t reserved2;            /* zero */
    uint64_t mlp_only_layers[4];   /* bit l % 64 of word l / 64: layer l has a dense MLP (l < 256) */
    /* appended in 0.2: the embedding's padding row (nn.Embedding's padding_idx) */
    int32_t pad_token_id;          /* -1 (the default): none; p in [0, vocab_size): row p of the embedding
                                      starts at zero and gets no gradient from the tokens that look it up */
    uint32_t reserved3;            /* zero */
    /* appended in 0.2: a shared expert beside the routed ones (Qwen2-MoE) */
    uint32_t shared_expert_intermediate_size; /* 0: none; S: each sparse layer also runs a gated MLP of width S
                                                 on every token, its output added to the routed experts' */
    uint32_t shared_expert_gate;   /* non-zero: that output is first scaled by sigmoid(x . w), w a (1, hidden)
                                      matrix of the layer (Qwen2-MoE's shared_expert_gate) */
    /* appended in 0.2: RoPE on part of each head; YaRN and LongRoPE */
    float partial_rotary_factor;   /* 0 or 1: RoPE turns all of head_dim; f: its first int(head_dim * f)
                                      dimensions, the rest pass unrotated (Phi-4-mini's 0.75) */
    float rope_attention_factor;   /* yarn, longrope: cos and sin are multiplied by it; 0: the scaling's default */
    float rope_beta_fast;          /* yarn: 0 means 32 */
    float rope_beta_slow;          /* yarn: 0 means 1 */
    float rope_mscale;             /* yarn: with rope_mscale_all_dim, the default attention factor's ratio */
    float rope_mscale_all_dim;     /* yarn: 0 none */
    uint32_t rope_no_truncate;     /* yarn: non-zero: the correction range is not rounded to whole dimensions */
    uint32_t rope_n_factors;       /* longrope: the entries of each list below, (rotary dimensions) / 2 */
    float rope_short_factor[128];  /* longrope: each frequency's divisor while positions < original_max_position */
    float rope_long_factor[128];   /* longrope: ... and once a micro-batch has a position past it */
    /* appended in 0.2: multi-head latent attention and DeepSeek's routing (DeepSeek-V2, DeepSeek-V3) */
    uint32_t kv_lora_rank;         /* 0: plain attention; R: multi-head latent attention, each token's keys and
                                      values expanded from a rank-R latent (kv_a_proj_with_mqa, kv_b_proj) */
    uint32_t q_lora_rank;          /* with kv_lora_rank: 0, q_proj from the hidden state; R, q from a rank-R
                                      latent (q_a_proj, q_b_proj) */
    uint32_t qk_nope_head_dim;     /* with kv_lora_rank: each q and k head is qk_nope_head_dim dimensions without
                                      RoPE, then qk_rope_head_dim with it (the key's shared by all heads);
                                      head_dim is their sum */
    uint32_t qk_rope_head_dim;
    uint32_t v_head_dim;           /* with kv_lora_rank: each value head's dimensions (at most head_dim) */
    uint32_t rope_interleave;      /* with kv_lora_rank: RoPE turns the pairs (2i, 2i + 1), not (i, i + d/2) */
    uint32_t n_group;              /* 0 or 1: no group limit; G: the experts form G groups of E/G ... */
    uint32_t topk_group;           /* ... and a token's k are chosen from its topk_group best groups */
    float routed_scaling_factor;   /* 0 or 1: none; s: the routing weights are multiplied by s */
    uint32_t moe_scoring;          /* mt_moe_scoring: how the router scores the experts */
    /* appended in 0.2: Llama 4 */
    uint32_t attention_chunk_size; /* 0: none; N: on the layers with RoPE, query i sees only the keys of its
                                      chunk of N, from N * floor(i / N) (Llama 4's chunked attention) */
    uint32_t qk_l2_norm;           /* non-zero: on the layers with RoPE, each head of q and k is divided by its
                                      root mean square (+ rms_norm_eps), no weight, after RoPE (Llama 4) */
    float attn_temperature_floor;  /* 0: none; F: on the NoPE layers, q of token i of its sequence is scaled
                                      by 1 + attn_temperature_scale * log1p(floor((i + 1) / F)) (Llama 4) */
    float attn_temperature_scale;
    uint32_t moe_input_weighted;   /* non-zero: each routing weight scales its expert's input, not its output
                                      (Llama 4) */
    uint32_t reserved4;            /* zero */
    uint64_t nope_layers[4];       /* bit l % 64 of word l / 64: layer l has no RoPE and attends to the whole
                                      sequence (Llama 4's no_rope_layers, inverted; l < 256) */
} mt_model_config;

/* mt_model_config.moe_scoring: how a router's logits become the scores that choose and weigh the experts */
typedef enum mt_moe_scoring {
    MT_MOE_SCORING_SOFTMAX = 0, /* the softmax of the logits; a group's score its best expert's (DeepSeek-V2) */
    MT_MOE_SCORING_SIGMOID = 1, /* sigmoid(logit); chosen by score + e_score_correction_bias, a group's score
                                   the sum of its best two (DeepSeek-V3) */
    MT_MOE_SCORING_MAX_ENUM = 0x7FFFFFFF
} mt_moe_scoring;

/* Defaults: a small Llama (vocab 32000, hidden 512, 8 layers, 8 heads,
 * intermediate 1408, max positions 2048), rms_norm_eps 1e-5, rope_theta 10000,
 * bf16, seed 1, initializer_range 0.02. */
MT_API void mt_model_config_init_sized(mt_model_config *cfg, uint32_t size);
static inline void mt_model_config_init(mt_model_config *cfg)
{
    mt_model_config_init_sized(cfg, sizeof *cfg);
}

/* 0.2: the families this library trains, for lists and help texts. Every
 * string lives as long as the library and must not be freed. */
typedef struct mt_family_info {
    uint32_t struct_size;       /* the caller's sizeof(mt_family_info), set by mt_family_info_init */
    uint32_t arch;              /* its mt_arch value */
    const char *name;           /* short and stable, as megatrain's checkpoints record it: "gemma3" */
    const char *display_name;   /* "Gemma 3" */
    const char *architecture;   /* config.json's architectures[0]: "Gemma3ForCausalLM" */
    const char *model_type;     /* config.json's model_type: "gemma3_text" */
    const char *layer_template; /* the layer template it runs: "llama", "gemma" or "moe" */
    const char *particular;     /* what differs from Llama, in a few words */
    const char *example;        /* a checkpoint of the family, whose shape mt_family_example gives */
} mt_family_info;

MT_API void mt_family_info_init_sized(mt_family_info *info, uint32_t size);
static inline void mt_family_info_init(mt_family_info *info)
{
    mt_family_info_init_sized(info, sizeof *info);
}

/* The number of families: mt_family_get takes 0 .. mt_family_count() - 1. */
MT_API uint32_t mt_family_count(void);
/* Fills *out with family `index`, in the order of lists (not an mt_arch value). */
MT_API mt_status mt_family_get(mt_family_info *out, uint32_t index);
/* Sets the shape fields of *cfg (initialised by mt_model_config_init) to the
 * family's example checkpoint, keeping its precision, seed and
 * initializer_range, as mt_config_load does. */
MT_API mt_status mt_family_example(mt_model_config *cfg, uint32_t arch);

/* ---- where state lives and what runs it ---------------------------------- */

typedef enum mt_backend {
    MT_BACKEND_AUTO = 0, /* CUDA when a usable GPU is present, else CPU */
    MT_BACKEND_CPU = 1,
    MT_BACKEND_CUDA = 2,
    MT_BACKEND_MAX_ENUM = 0x7FFFFFFF
} mt_backend;

typedef enum mt_placement {
    MT_PLACE_AUTO = 0,   /* decided by the memory plan */
    MT_PLACE_DEVICE = 1, /* keep on the GPU */
    MT_PLACE_HOST = 2,   /* keep in pinned host memory, stream to the GPU when needed */
    MT_PLACE_MAX_ENUM = 0x7FFFFFFF
} mt_placement;

typedef enum mt_pinning {
    MT_PIN_AUTO = 0,   /* pin host tiles when a CUDA backend is in use */
    MT_PIN_ALWAYS = 1, /* fail if they cannot be pinned */
    MT_PIN_NEVER = 2,
    MT_PIN_MAX_ENUM = 0x7FFFFFFF
} mt_pinning;

/* What the backward recomputes from each layer's input checkpoint. */
typedef enum mt_recompute {
    MT_RECOMPUTE_AUTO = 0, /* keep the attention outputs (then the residuals) of as many layers as fit the GPU */
    MT_RECOMPUTE_FULL = 1, /* recompute the whole layer: the least GPU memory */
    MT_RECOMPUTE_MAX_ENUM = 0x7FFFFFFF
} mt_recompute;

/* Which attention the CUDA backend runs (the CPU backend has one). */
typedef enum mt_attention {
    MT_ATTENTION_AUTO = 0,    /* bf16: cuDNN's fused attention (loaded at run time) where it is installed, serves
                                 the shape and its workspace fits the GPU budget; the library's kernels elsewhere,
                                 and for fp32, documents packed into sequences, sliding-window layers, soft-capped
                                 attention scores (Gemma 2) and any shape cuDNN refuses */
    MT_ATTENTION_KERNELS = 1, /* the library's own kernels, always */
    MT_ATTENTION_CUDNN = 2,   /* cuDNN where the kernels would be chosen by AUTO only for a lack of room or for
                                 documents; a model or shape it cannot serve at all (fp32, soft-capped scores,
                                 cuDNN absent, refused) is an error */
    MT_ATTENTION_MAX_ENUM = 0x7FFFFFFF
} mt_attention;

/* mt_offload_policy.attention_flags */
#define MT_ATTENTION_NONDETERMINISTIC 1u /* let cuDNN's backward add dQ with atomics: faster, with less
                                            workspace, but the bits vary from run to run */

/* mt_offload_policy.weight_fetch: how each GPU of a model on several (num_devices > 1) receives a unit's
 * weights from the one host copy. Alone, a GPU copies the whole unit. */
typedef enum mt_weight_fetch {
    MT_FETCH_AUTO = 0,   /* the library's choice: WHOLE */
    MT_FETCH_WHOLE = 1,  /* every GPU copies the whole unit from host memory over its own link */
    MT_FETCH_SLICES = 2, /* GPU r of G copies the r-th G-th of it, and an NCCL all-gather between the GPUs
                            completes every copy: 1/G of the host-to-GPU traffic, the rest over NVLink */
    MT_FETCH_MAX_ENUM = 0x7FFFFFFF
} mt_weight_fetch;

typedef struct mt_offload_policy {
    uint32_t struct_size;        /* the caller's sizeof(mt_offload_policy), set by mt_offload_policy_init */
    uint32_t backend;            /* mt_backend */
    int32_t device;              /* CUDA device index */
    uint32_t weight_slots;       /* GPU weight buffers, >= 2 (double buffering) */
    uint64_t gpu_budget_bytes;   /* 0: the device's free memory */
    uint64_t host_budget_bytes;  /* 0: the memory the machine has available; a caller who sets it
                                    vouches that this much host memory can be had */
    int32_t numa_node;           /* -1: the node nearest the GPU (or none) */
    uint32_t optimizer_threads;  /* 0: one per core of the NUMA node */
    uint32_t activations;        /* mt_placement of activation checkpoints */
    uint32_t pin_host;           /* mt_pinning */
    mt_log_fn log_callback;      /* NULL: warnings and errors to stderr */
    void *log_user_data;
    uint32_t log_level;          /* mt_log_level: the least severe level delivered */
    uint32_t timeline;           /* 1: record each step's timeline (CUDA backend; mt_model_timeline) */
    mt_abort_fn abort_callback;  /* NULL: never abort; like log_callback, called until mt_model_destroy */
    void *abort_user_data;
    uint32_t recompute;          /* mt_recompute: what the backward recomputes */
    uint32_t reserved1;          /* zero */
    uint32_t attention;          /* mt_attention */
    uint32_t attention_flags;    /* MT_ATTENTION_* flags; 0: deterministic */
    /* Data parallelism on the GPUs of one host (CUDA backend): num_devices > 1 trains on devices[0..num_devices)
     * (distinct CUDA device indices; `device` is then ignored), which share the one host copy of the state. Each
     * step's micro-batches are divided among them in contiguous runs, every GPU receives each unit's weights,
     * gradients are reduce-scattered over NCCL (libnccl.so.2, loaded at run time) and each GPU sends its slice
     * to the host; the optimizer runs once. 0 or 1: the one GPU `device` (devices is not read). The library
     * copies the list during mt_model_create. */
    uint32_t num_devices;
    uint32_t weight_fetch;       /* mt_weight_fetch: how each of those GPUs receives a unit's weights */
    const int32_t *devices;
} mt_offload_policy;

/* Defaults: backend AUTO, device 0, 2 weight slots, budgets from the machine,
 * NUMA node nearest the GPU, all cores, placements AUTO, log to stderr at WARN,
 * no timeline, recompute AUTO, attention AUTO and deterministic. */
MT_API void mt_offload_policy_init_sized(mt_offload_policy *pol, uint32_t size);
static inline void mt_offload_policy_init(mt_offload_policy *pol)
{
    mt_offload_policy_init_sized(pol, sizeof *pol);
}

/* ---- optimizer ------------------------------------------------------------ */

typedef enum mt_lr_schedule {
    MT_LR_CONSTANT = 0, /* linear warm-up, then lr */
    MT_LR_COSINE = 1,   /* linear warm-up, then cosine decay to lr * min_lr_ratio at total_steps */
    MT_LR_MAX_ENUM = 0x7FFFFFFF
} mt_lr_schedule;

/* AdamW with decoupled weight decay and bias correction, as torch.optim.AdamW. */
typedef struct mt_optim_config {
    uint32_t struct_size;  /* the caller's sizeof(mt_optim_config), set by mt_optim_config_init */
    uint32_t schedule;     /* mt_lr_schedule */
    float lr;              /* peak learning rate */
    float beta1;
    float beta2;
    float eps;
    float weight_decay;    /* applied to matrices; norms and biases are never decayed */
    float grad_clip;       /* clip the global gradient L2 norm to this; 0: no clipping */
    float min_lr_ratio;    /* cosine floor as a fraction of lr */
    uint32_t warmup_steps;
    uint32_t total_steps;  /* the length of the cosine schedule */
    uint32_t reserved0;    /* zero */
} mt_optim_config;

/* Defaults: cosine, lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight_decay 0.1,
 * grad_clip 1.0, min_lr_ratio 0.1, warmup 0, total_steps 1000. */
MT_API void mt_optim_config_init_sized(mt_optim_config *opt, uint32_t size);
static inline void mt_optim_config_init(mt_optim_config *opt)
{
    mt_optim_config_init_sized(opt, sizeof *opt);
}

/* The learning rate of `step` (0-based) under `opt`; NaN for an invalid config. */
MT_API float mt_lr_at(const mt_optim_config *opt, uint64_t step);

/* ---- memory plan ------------------------------------------------------------ */

/* The shape of one optimizer step's batch. */
typedef struct mt_batch_shape {
    uint32_t struct_size;      /* the caller's sizeof(mt_batch_shape), set by mt_batch_shape_init */
    uint32_t micro_batch_size; /* sequences per micro-batch */
    uint32_t seq_len;          /* tokens per sequence */
    uint32_t num_micro_batches;/* micro-batches per optimizer step (gradient accumulation) */
} mt_batch_shape;

/* Defaults: 1 sequence of 1024 tokens, 1 micro-batch. */
MT_API void mt_batch_shape_init_sized(mt_batch_shape *shape, uint32_t size);
static inline void mt_batch_shape_init(mt_batch_shape *shape)
{
    mt_batch_shape_init_sized(shape, sizeof *shape);
}

/* Bytes per tier that a model would use, computed without allocating. */
typedef struct mt_memory_plan {
    uint32_t struct_size;        /* the caller's size, set by mt_memory_plan_init */
    uint32_t backend;            /* mt_backend the plan was made for (CPU or CUDA) */
    uint64_t num_params;
    uint64_t host_pinned_bytes;  /* page-locked host memory */
    uint64_t host_pageable_bytes;/* ordinary host memory */
    uint64_t gpu_bytes;          /* device memory (0 on the CPU backend) */
    /* where the host bytes go */
    uint64_t weight_bytes;       /* the copy that is streamed (bf16, or none in fp32 mode) */
    uint64_t grad_bytes;         /* gradients (none where they share the weight block) */
    uint64_t master_bytes;       /* fp32 master weights */
    uint64_t optim_bytes;        /* fp32 AdamW m and v */
    uint64_t activation_bytes;   /* activation checkpoints, wherever they live */
    uint64_t workspace_bytes;    /* weight slots, gradient accumulators, scratch */
    uint64_t host_budget_bytes;  /* the budget the plan was checked against */
    uint64_t gpu_budget_bytes;
    uint32_t weight_slots;
    uint32_t activations;        /* mt_placement chosen for activation checkpoints */
    uint32_t num_units;          /* embedding + layers + head */
    uint32_t reserved0;
    uint64_t largest_unit_params;
    /* 0.2: where the activation checkpoints (one a layer, the embedding's and
     * the last layer's output included: L + 1) go. With a budget too small
     * for them all, the CUDA backend puts the first ones in pinned host
     * memory, and when the host cannot take enough either, keeps fewer: the
     * backward then runs the forward of the layer below each missing one
     * again (one more layer forward each). */
    uint32_t host_checkpoints;       /* how many of them live in host memory */
    uint32_t recomputed_checkpoints; /* how many are not kept but recomputed in the backward */
} mt_memory_plan;

MT_API void mt_memory_plan_init_sized(mt_memory_plan *plan, uint32_t size);
static inline void mt_memory_plan_init(mt_memory_plan *plan)
{
    mt_memory_plan_init_sized(plan, sizeof *plan);
}

/* Fills *out for cfg, pol and shape; pol NULL means the defaults, shape NULL
 * plans the model's persistent state alone (what mt_model_create needs).
 * A policy asking for MT_BACKEND_CUDA with a gpu_budget_bytes plans for such
 * a GPU on any machine, one without a GPU included (0.2; 0.1 returned
 * MT_ERR_NO_DEVICE there).
 * Returns MT_ERR_HOST_BUDGET or MT_ERR_GPU_BUDGET when the plan does not fit,
 * with *out filled all the same, and the numbers in mt_last_errmsg(). */
MT_API mt_status mt_plan(mt_memory_plan *out, const mt_model_config *cfg, const mt_offload_policy *pol,
                         const mt_batch_shape *shape);

/* ---- the model ---------------------------------------------------------------- */

typedef struct mt_model mt_model;

/* Creates a model: checks the plan against the budgets, allocates the host
 * tiles, and initialises the weights from cfg->seed. pol may be NULL (the
 * defaults). On failure *out is NULL, nothing stays allocated, and
 * mt_last_errmsg() says why. */
MT_API mt_status mt_model_create(mt_model **out, const mt_model_config *cfg, const mt_offload_policy *pol);

/* Frees everything the model owns. NULL is a no-op. */
MT_API void mt_model_destroy(mt_model *model);

/* The message of the last failed call on this model; "" if none. */
MT_API const char *mt_model_errmsg(const mt_model *model);

/* The configuration the model was created with (struct_size of *out decides
 * how much is written). */
MT_API mt_status mt_model_get_config(const mt_model *model, mt_model_config *out);

/* The number of trainable parameters. */
MT_API uint64_t mt_model_num_params(const mt_model *model);

/* The backend in use: MT_BACKEND_CPU or MT_BACKEND_CUDA. */
MT_API mt_backend mt_model_backend(const mt_model *model);

/* ---- training and evaluation ----------------------------------------------------- */

/* Targets equal to this are not predicted (prompt tokens, padding), as in transformers. */
#define MT_IGNORE_INDEX (-100)

/* One optimizer step's tokens: num_micro_batches micro-batches of
 * micro_batch_size sequences of seq_len tokens, laid out in that order. */
typedef struct mt_batch {
    uint32_t struct_size;       /* the caller's sizeof(mt_batch), set by mt_batch_init */
    uint32_t micro_batch_size;
    uint32_t seq_len;
    uint32_t num_micro_batches;
    const int32_t *tokens;      /* [num_micro_batches * micro_batch_size * seq_len] input ids */
    const int32_t *targets;     /* same shape: the id to predict at each position, or MT_IGNORE_INDEX */
    /* 0.2. NULL, or the same shape: documents packed into each sequence,
     * given as each token's position in its document (transformers'
     * position_ids for packed, padding-free batches): 0 where a document
     * starts, then one more at each token. Every sequence starts one. A
     * token attends only to the tokens of its own document up to itself,
     * and RoPE rotates it by its position. NULL: one document a sequence. */
    const int32_t *positions;
} mt_batch;

MT_API void mt_batch_init_sized(mt_batch *batch, uint32_t size);
static inline void mt_batch_init(mt_batch *batch)
{
    mt_batch_init_sized(batch, sizeof *batch);
}

typedef struct mt_step_stats {
    uint32_t struct_size;       /* the caller's size, set by mt_step_stats_init */
    uint32_t reserved0;
    uint64_t step;              /* optimizer steps taken, this one included */
    double loss;                /* mean cross-entropy over the step's target tokens */
    double grad_norm;           /* global L2 norm of the gradients, before clipping */
    float lr;                   /* the learning rate this step used */
    uint32_t reserved1;
    uint64_t tokens;            /* tokens processed */
    uint64_t target_tokens;     /* tokens whose target was not ignored */
    double seconds;             /* wall time of the step */
    double forward_seconds;     /* forward pass (on the CUDA backend until the head starts on the GPU) */
    double backward_seconds;    /* loss, backward with recompute, gradient transfers */
    double optimizer_seconds;   /* clipping and AdamW; on the CUDA backend the update runs behind the
                                   next step's forward, and this is the time to start it */
                                /* the three add up to seconds */
} mt_step_stats;

MT_API void mt_step_stats_init_sized(mt_step_stats *stats, uint32_t size);
static inline void mt_step_stats_init(mt_step_stats *stats)
{
    mt_step_stats_init_sized(stats, sizeof *stats);
}

/* One optimizer step: forward and backward over every micro-batch, exact
 * global-norm clipping, AdamW with the learning rate of the model's step
 * counter under opt's schedule. stats may be NULL. On failure the model's
 * weights, optimizer state and step counter are as before the call;
 * MT_ERR_NONFINITE when the loss or gradient norm is not finite,
 * MT_ERR_ABORTED when the policy's abort callback asked to stop.
 * On the CUDA backend the AdamW update may still be running on a library
 * thread when mt_step returns; the next step's forward waits for each unit,
 * and every other call that reads the model waits for all of it. */
MT_API mt_status mt_step(mt_model *model, const mt_batch *batch, const mt_optim_config *opt, mt_step_stats *stats);

typedef struct mt_eval_stats {
    uint32_t struct_size;       /* the caller's size, set by mt_eval_stats_init */
    uint32_t reserved0;
    double loss;                /* mean cross-entropy over the target tokens */
    uint64_t tokens;
    uint64_t target_tokens;
    double seconds;
} mt_eval_stats;

MT_API void mt_eval_stats_init_sized(mt_eval_stats *stats, uint32_t size);
static inline void mt_eval_stats_init(mt_eval_stats *stats)
{
    mt_eval_stats_init_sized(stats, sizeof *stats);
}

/* The loss of the model on batch, without changing anything. */
MT_API mt_status mt_eval(mt_model *model, const mt_batch *batch, mt_eval_stats *stats);

/* Next-token logits after each of n_seq sequences of seq_len tokens:
 * out[n_seq * vocab_size], the scores at each sequence's last position. */
MT_API mt_status mt_model_logits(mt_model *model, const int32_t *tokens, uint32_t n_seq, uint32_t seq_len, float *out);

/* ---- step timeline ------------------------------------------------------------- */

/* Where a step's time goes on the GPU. With mt_offload_policy.timeline set,
 * the CUDA backend records CUDA events around every unit visit on the compute
 * stream and every copy on the two copy streams; after the step the library
 * splits the step's wall time into the compute stream's busy time and the
 * causes of its idle time. See docs/timeline.md. */
typedef enum mt_phase {
    MT_PHASE_FORWARD = 0,  /* embedding or layer forward, every micro-batch */
    MT_PHASE_HEAD = 1,     /* final norm, logits, loss and its gradient */
    MT_PHASE_BACKWARD = 2, /* layer recompute and backward, or the embedding's backward */
    MT_PHASE_MAX_ENUM = 0x7FFFFFFF
} mt_phase;

typedef enum mt_wait {
    MT_WAIT_WEIGHTS = 0,     /* a unit's weights still on their way (PCIe, or a slot still in use) */
    MT_WAIT_OPTIMIZER = 1,   /* the CPU AdamW had not finished a unit the forward needed */
    MT_WAIT_CHECKPOINTS = 2, /* activation checkpoints on their way to or from host memory */
    MT_WAIT_LAUNCH = 3,      /* nothing issued yet: launch latency and the host's own work */
    MT_WAIT_HOST = 4,        /* before the step's first GPU work and after its last (checks, sync) */
    MT_WAIT_COUNT = 5,       /* the causes this header knows; it grows up to MT_WAIT_CAPACITY */
    MT_WAIT_MAX_ENUM = 0x7FFFFFFF
} mt_wait;

/* The length of the wait arrays below, fixed whatever the number of causes,
 * so that a new cause moves no field (0.1 sized them by MT_WAIT_COUNT; the
 * library still writes the 0.1 layout for a caller whose
 * mt_timeline.struct_size is 0.1's). Entries from MT_WAIT_COUNT on are 0. */
#define MT_WAIT_CAPACITY 8

typedef struct mt_timeline {
    uint32_t struct_size;           /* the caller's sizeof(mt_timeline), set by mt_timeline_init */
    uint32_t n_visits;              /* unit visits in the step */
    uint64_t step;                  /* the step recorded (mt_model_step_count after it) */
    double seconds;                 /* wall time of the step */
    double busy_seconds;            /* the compute stream running the step's visits */
    double wait_seconds[MT_WAIT_CAPACITY]; /* the compute stream idle, by mt_wait: busy + waits = seconds */
    double h2d_seconds;             /* the host-to-device stream copying */
    double d2h_seconds;             /* the device-to-host stream copying */
    uint64_t h2d_bytes;
    uint64_t d2h_bytes;
} mt_timeline;

/* One unit visit. A fixed layout: new fields will come with a new type. */
typedef struct mt_timeline_visit {
    uint32_t unit;                  /* 0 embedding, 1..L layers, L+1 head */
    uint32_t phase;                 /* mt_phase */
    double start, end;              /* on the compute stream, seconds from the step's start */
    double weights_start;           /* its weights' copy on the host-to-device stream; -1 without one */
    double weights_end;
    double wait_seconds[MT_WAIT_CAPACITY]; /* the compute stream's idle time just before it, by mt_wait */
} mt_timeline_visit;

MT_API void mt_timeline_init_sized(mt_timeline *timeline, uint32_t size);
static inline void mt_timeline_init(mt_timeline *timeline)
{
    mt_timeline_init_sized(timeline, sizeof *timeline);
}

/* The timeline of the model's last step: *out, and the first cap visits
 * into visits (may be NULL). MT_ERR_UNSUPPORTED unless the policy's
 * timeline is set and the backend is CUDA; MT_ERR_INVALID_ARGUMENT before
 * the first step. */
MT_API mt_status mt_model_timeline(mt_model *model, mt_timeline *out, mt_timeline_visit *visits, uint32_t cap);

/* Optimizer steps the model has taken. */
MT_API uint64_t mt_model_step_count(const mt_model *model);

/* ---- Hugging Face model folders ------------------------------------------------- */

/* Reads a model folder's config.json (LlamaForCausalLM, Qwen2ForCausalLM,
 * MistralForCausalLM) into *cfg, which the caller initialised with
 * mt_model_config_init (precision, seed and initializer_range are kept).
 * Another architecture or an unsupported setting is refused with
 * MT_ERR_UNSUPPORTED and a message naming it. */
MT_API mt_status mt_config_load(mt_model_config *cfg, const char *dir);

/* Loads the weights of a model folder (model.safetensors, or the shards that
 * model.safetensors.index.json lists; bf16, fp16 or fp32) into the model,
 * whose configuration must match. The optimizer state is reset. On failure
 * the model is as before. */
MT_API mt_status mt_model_load(mt_model *model, const char *dir);

/* Writes config.json and model.safetensors (bf16 in bf16 mode, fp32 in fp32
 * mode) into dir, which is created if missing, and (0.2) the tokenizer files
 * of the folder the model was last loaded from (tokenizer.json,
 * tokenizer_config.json, special_tokens_map.json, tokenizer.model,
 * generation_config.json, those that exist), so that the folder is a whole
 * model. Files are written under temporary names, synced, then renamed over
 * the old ones. */
MT_API mt_status mt_model_save(mt_model *model, const char *dir);

/* ---- resume checkpoints ------------------------------------------------------------ */

/* What a checkpoint carries besides the model and optimizer state: the
 * caller's position in its data and its random state, stored as given. */
typedef struct mt_checkpoint_info {
    uint32_t struct_size;      /* the caller's sizeof(mt_checkpoint_info), set by mt_checkpoint_info_init */
    uint32_t reserved0;
    uint64_t step;             /* on load: the optimizer steps the model had taken (ignored on save) */
    uint64_t data_position;    /* the caller's, e.g. the next window of an mt_dataset */
    uint64_t rng_state[4];     /* the caller's */
    /* 0.2: the caller's own state as the text of a JSON object (its run's
     * settings, its log history, ...), kept in trainer_state.json beside the
     * library's keys, which it may not use. On save: NULL for none. On load:
     * what was saved, or NULL; owned by the model, valid until the next
     * mt_checkpoint_load on it or its destruction. */
    const char *caller_json;
} mt_checkpoint_info;

MT_API void mt_checkpoint_info_init_sized(mt_checkpoint_info *info, uint32_t size);
static inline void mt_checkpoint_info_init(mt_checkpoint_info *info)
{
    mt_checkpoint_info_init_sized(info, sizeof *info);
}

/* Saves everything a bit-identical resume needs into dir/step-NNNNNNNN/
 * (config.json, model.safetensors with the fp32 master weights, which
 * transformers can load, optimizer.safetensors with AdamW's exp_avg and
 * exp_avg_sq, trainer_state.json) and then points dir/latest at it. Each file
 * is written under a temporary name and synced, the step folder is renamed
 * into place, and `latest` is replaced last: a process killed at any moment
 * leaves the previous checkpoint loadable. Then older checkpoints are
 * removed: of the step folders numbered below this one, the newest is kept
 * (two in all); folders numbered above it (another continuation of the run)
 * and anything that is not a step folder are left alone, as are leftovers of
 * killed saves other than this step's. info may be NULL.
 * One writer at a time: the save holds dir's advisory lock, the file
 * dir/.megatrain.lock locked with flock(2) (LOCK_EX) and holding the
 * holder's process id in decimal and a newline; while another process holds
 * it the save fails with MT_ERR_IO naming that process, and changes nothing.
 * A caller that writes the folder itself may take the same lock around a
 * whole run, writing its own pid: a lock naming the calling process is taken
 * as held. The file is removed when the lock is released; one left by a
 * killed process holds no flock and is taken over. */
MT_API mt_status mt_checkpoint_save(mt_model *model, const char *dir, const mt_checkpoint_info *info);

/* Loads the checkpoint dir/latest names (or dir itself, when it is a step
 * folder) into a model of the same shape and precision: weights, optimizer
 * state and step counter; info (may be NULL) receives what was saved. On
 * failure the model is as before. */
MT_API mt_status mt_checkpoint_load(mt_model *model, const char *dir, mt_checkpoint_info *info);

/* ---- token data ---------------------------------------------------------------- */

typedef enum mt_token_format {
    MT_TOKENS_AUTO = 0, /* the llm.c header when the file starts with its magic, else raw uint16; a raw
                           file is refused when vocab_size exceeds 65536 or the data look like uint32 */
    MT_TOKENS_U16 = 1,  /* raw little-endian uint16 (refused when every other value is 0, as in uint32 data) */
    MT_TOKENS_U32 = 2,  /* raw little-endian uint32 */
    MT_TOKENS_LLMC = 3, /* llm.c .bin: 256 int32 header (magic 20240520, version 1: uint16 or 2: uint32, count) */
    MT_TOKENS_DOCS = 4, /* 0.2: documents with a loss mask ("MTTOKENS" header, megatrain prepare; docs/data.md):
                           a window is one document (or a piece of one longer than seq_len + 1 tokens),
                           padded; tokens the mask leaves out and the padding are not targets */
    MT_TOKENS_MAX_ENUM = 0x7FFFFFFF
} mt_token_format;

typedef enum mt_split {
    MT_SPLIT_TRAIN = 0,
    MT_SPLIT_HELDOUT = 1,
    MT_SPLIT_MAX_ENUM = 0x7FFFFFFF
} mt_split;

typedef struct mt_dataset_options {
    uint32_t struct_size;      /* the caller's sizeof(mt_dataset_options), set by mt_dataset_options_init */
    uint32_t format;           /* mt_token_format */
    uint32_t vocab_size;       /* token ids >= this are refused at open; 0: no check */
    uint32_t seq_len;          /* tokens per training sequence; a window holds seq_len + 1 tokens */
    float heldout_fraction;    /* share of the windows held out (the file's last ones), in [0, 0.5] */
    uint32_t reserved0;        /* zero */
    uint64_t seed;             /* the order in which training windows are drawn */
} mt_dataset_options;

/* Defaults: AUTO format, no vocabulary check, seq_len 1024, 1% held out, seed 1. */
MT_API void mt_dataset_options_init_sized(mt_dataset_options *opt, uint32_t size);
static inline void mt_dataset_options_init(mt_dataset_options *opt)
{
    mt_dataset_options_init_sized(opt, sizeof *opt);
}

/* A memory-mapped token file cut into windows of seq_len + 1 tokens (stride
 * seq_len). Training windows are visited in a seeded random order that is
 * reshuffled every epoch; held-out windows in file order. Read-only after
 * open: one dataset may serve several threads. */
typedef struct mt_dataset mt_dataset;

/* Opens and validates path (size, header, every token id against vocab_size).
 * On failure *out is NULL and mt_last_errmsg() names the file and the problem. */
MT_API mt_status mt_dataset_open(mt_dataset **out, const char *path, const mt_dataset_options *opt);
MT_API void mt_dataset_close(mt_dataset *ds); /* NULL ok */
MT_API uint64_t mt_dataset_num_tokens(const mt_dataset *ds);
MT_API uint64_t mt_dataset_num_windows(const mt_dataset *ds, mt_split split);
/* 0.2: the documents of an MT_TOKENS_DOCS file (0 for a token stream), and
 * the padded positions of a split's windows, which nothing learns (0 for a
 * token stream, whose windows are full). */
MT_API uint64_t mt_dataset_num_documents(const mt_dataset *ds);
MT_API uint64_t mt_dataset_padding(const mt_dataset *ds, mt_split split);

/* Fills n_seq sequences starting at window `position` of the split (training
 * positions run on past the end into the next epochs; held-out ones wrap):
 * tokens[n_seq * seq_len] and targets[n_seq * seq_len], the next token of
 * each. The next call's position is position + n_seq. */
MT_API mt_status mt_dataset_read(const mt_dataset *ds, mt_split split, uint64_t position, uint32_t n_seq,
                                 int32_t *tokens, int32_t *targets);

/* ---- writing document files (0.2) --------------------------------------------------- */

/* Writes a document file (MT_TOKENS_DOCS, docs/data.md), what `megatrain
 * prepare` writes: documents of token ids, each id a target of the loss or
 * not. Tokens go to path.tmp as they are appended; mt_doc_writer_finish
 * completes, syncs and renames it to path, so nothing is under path until
 * then (an older file there stays as it was), and a writer freed unfinished
 * or after a failed write removes path.tmp. One writer must not be used by
 * two threads at once. Failed calls leave their message in mt_last_errmsg(). */
typedef struct mt_doc_writer mt_doc_writer;

/* Ids are below vocab_size, in [1, 2^31]: 2 bytes a token up to 65536, else 4.
 * On failure *out is NULL. */
MT_API mt_status mt_doc_writer_create(mt_doc_writer **out, const char *path, uint32_t vocab_size);
/* Appends n tokens to the current document. targets: n flags, 1 for a token
 * the model learns to write and 0 for one it does not (a prompt); NULL: all
 * are targets. A refused call appends nothing. */
MT_API mt_status mt_doc_writer_append(mt_doc_writer *w, const int32_t *tokens, const uint8_t *targets, size_t n);
/* Ends the current document; the next append starts another. Ending an
 * empty document does nothing. */
MT_API mt_status mt_doc_writer_end_document(mt_doc_writer *w);
/* Ends the last document and puts the file under path (at least one document
 * needed). After it, or after any failed write, only mt_doc_writer_free is left. */
MT_API mt_status mt_doc_writer_finish(mt_doc_writer *w);
MT_API void mt_doc_writer_free(mt_doc_writer *w); /* NULL ok; unfinished: path.tmp removed */
/* The tokens, the target tokens and the ended documents so far; 0 for NULL. */
MT_API uint64_t mt_doc_writer_num_tokens(const mt_doc_writer *w);
MT_API uint64_t mt_doc_writer_num_targets(const mt_doc_writer *w);
MT_API uint64_t mt_doc_writer_num_documents(const mt_doc_writer *w);

/* ---- tokenizers (0.2) ------------------------------------------------------------- */

/* A Hugging Face tokenizer.json: byte-level BPE (GPT-2, Llama 3, Qwen2,
 * Qwen3, DeepSeek-V3, GPT-OSS: NFC, Split pre-tokenizers with any
 * behavior, added and special tokens) and SentencePiece-style BPE with byte
 * fallback (Llama 2, Mistral, Gemma 3). Anything else in the file (another
 * model type, normalizer, pre-tokenizer, post-processor or decoder) is
 * refused at load with a message naming it.
 * Read-only after load: one tokenizer may serve several threads at once.
 * Failed calls leave their message in mt_last_errmsg(). */
typedef struct mt_tokenizer mt_tokenizer;

/* path: a tokenizer.json, or a folder that holds one (a model folder). On
 * failure *out is NULL. */
MT_API mt_status mt_tokenizer_load(mt_tokenizer **out, const char *path);
MT_API void mt_tokenizer_free(mt_tokenizer *tok); /* NULL ok */

/* Flags of mt_tokenizer_encode, or-ed together. */
typedef enum mt_encode_flag {
    MT_ENCODE_SPECIAL = 1,     /* added tokens marked special ("<|im_start|>") in the text become their ids;
                                  without it they are text like any other */
    MT_ENCODE_ADD_SPECIAL = 2, /* the post-processor's template around the text (Llama 2's <s>) */
    MT_ENCODE_MAX_ENUM = 0x7FFFFFFF
} mt_encode_flag;

/* Encodes len bytes of UTF-8 text (mt_encode_flag flags). Writes at most cap
 * ids into ids (which may be NULL when cap is 0) and the number the text
 * needs into *n_ids, which may exceed cap: then call again with room for
 * them. MT_ERR_INVALID_ARGUMENT for text that is not valid UTF-8. */
MT_API mt_status mt_tokenizer_encode(const mt_tokenizer *tok, const char *text, size_t len, uint32_t flags,
                                     int32_t *ids, size_t cap, size_t *n_ids);

/* Flags of mt_tokenizer_decode. */
typedef enum mt_decode_flag {
    MT_DECODE_SKIP_SPECIAL = 1, /* leave out added tokens marked special */
    MT_DECODE_MAX_ENUM = 0x7FFFFFFF
} mt_decode_flag;

/* Decodes n ids into UTF-8 text (mt_decode_flag flags; bytes that do not
 * form UTF-8 become U+FFFD, as transformers does). Writes at most cap bytes
 * and a terminating NUL when there is room for it, and the text's length
 * (without the NUL) into *len, which may exceed cap. MT_ERR_INVALID_ARGUMENT
 * for an id outside the vocabulary. */
MT_API mt_status mt_tokenizer_decode(const mt_tokenizer *tok, const int32_t *ids, size_t n, uint32_t flags,
                                     char *text, size_t cap, size_t *len);

/* The number of ids: the largest id of the vocabulary and the added tokens,
 * plus one. 0 for NULL. */
MT_API uint32_t mt_tokenizer_vocab_size(const mt_tokenizer *tok);
/* The id of a token as the vocabulary spells it ("<|im_end|>", "\u0120the",
 * "\u2581the"), -1 when there is none. */
MT_API int32_t mt_tokenizer_token_to_id(const mt_tokenizer *tok, const char *token);
/* The vocabulary's spelling of id, NULL outside it; valid as long as tok. */
MT_API const char *mt_tokenizer_id_to_token(const mt_tokenizer *tok, int32_t id);

/* ---- chat templates (0.2) ------------------------------------------------------------- */

/* A model's chat template: the Jinja that Hugging Face folders carry
 * (chat_template.jinja, or tokenizer_config.json's chat_template), rendered
 * as transformers' apply_chat_template renders it (Python Jinja2 with
 * trim_blocks and lstrip_blocks; raise_exception, strftime_now, tojson, the
 * {% generation %} tag). A construct the renderer lacks is refused when the
 * template is loaded (or, for a method of a value, when it runs), with its
 * line and column, never rendered some other way. Read-only after load: one
 * template may serve several threads at once. Failed calls leave their
 * message in mt_last_errmsg(). docs/fine-tuning.md shows them at work. */
typedef struct mt_chat_template mt_chat_template;

/* path: a model or tokenizer folder (its chat_template.jinja, else the
 * chat_template of its tokenizer_config.json: a string, or from a list the
 * one named "default"), a tokenizer_config.json, or a template file (.jinja);
 * or, for a folder without a template, one of the built-in names "chatml"
 * (Qwen), "llama3" and "mistral". The special tokens of the
 * tokenizer_config.json (bos_token, eos_token, ...) become the template's
 * variables, as transformers passes them. MT_ERR_IO: no such file, or a
 * folder without a template; MT_ERR_FORMAT: not JSON, or a template that
 * does not parse; MT_ERR_UNSUPPORTED: a construct the renderer lacks. On
 * failure *out is NULL. */
MT_API mt_status mt_chat_template_load(mt_chat_template **out, const char *path);
MT_API void mt_chat_template_free(mt_chat_template *t); /* NULL ok */

/* Flags of mt_chat_render. */
typedef enum mt_chat_flag {
    MT_CHAT_ADD_GENERATION_PROMPT = 1, /* end with the header of the assistant's turn to come */
    MT_CHAT_FLAG_MAX_ENUM = 0x7FFFFFFF
} mt_chat_flag;

/* Renders a conversation. messages: a JSON array of messages, each
 * {"role": ..., "content": ...} and whatever else the template reads
 * (tool_calls, reasoning_content, ...); variables: NULL or a JSON object of
 * further variables (tools, enable_thinking, date_string, ...; a special
 * token given here replaces the config's). Writes at most cap bytes and a
 * terminating NUL when there is room, and the text's length into *len, which
 * may exceed cap: then call again with room for it. MT_ERR_INVALID_ARGUMENT
 * for JSON that is not an array (an object), or a conversation the template
 * refuses (its raise_exception, whose message is kept); MT_ERR_FORMAT for a
 * template that fails as it runs. */
MT_API mt_status mt_chat_render(const mt_chat_template *t, const char *messages, const char *variables,
                                 uint32_t flags, char *text, size_t cap, size_t *len);

/* What a model learns of a conversation, as TRL's assistant-only loss
 * takes it: called once per text to train on, with the text (len bytes,
 * NUL-terminated) and the byte ranges the model learns to write, n_spans
 * pairs (start, end), end exclusive. A template's {% generation %} blocks
 * give them where it has them. Otherwise each assistant turn learns what it
 * adds to the rendering: render(messages before it, add_generation_prompt)
 * is the prompt, and the turn's text is what render(messages up to it) adds
 * past that (the content, the template's end-of-turn marker and anything it
 * puts between them). The conversation is rendered whole and each turn is
 * found at its place there; a turn the template renders differently once
 * later messages follow (Qwen3's thinking block) comes as a text of its own,
 * render(messages up to it), after the whole. A non-zero return from fn stops
 * with MT_ERR_ABORTED. MT_ERR_INVALID_ARGUMENT also for a conversation
 * without an assistant turn; MT_ERR_UNSUPPORTED where a turn's prompt is not
 * the start of its rendering. */
typedef int (*mt_chat_text_fn)(void *user, const char *text, size_t len, const size_t *spans, size_t n_spans);
MT_API mt_status mt_chat_render_learnt(const mt_chat_template *t, const char *messages, const char *variables,
                                       mt_chat_text_fn fn, void *user);

/* The text that ends an assistant's turn after its content ("<|im_end|>\n",
 * "<|eot_id|>", "<end_of_turn>\n"), as the template renders a conversation's
 * last turn with the given variables (NULL: none); written as by
 * mt_chat_render. Generation stops at its first special token. */
MT_API mt_status mt_chat_end_of_turn(const mt_chat_template *t, const char *variables, char *text, size_t cap,
                                     size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* MEGATRAIN_H */
