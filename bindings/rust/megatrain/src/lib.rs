//! Safe Rust API of libmegatrain, which trains decoder-only transformer
//! language models (Llama, Qwen2, Qwen3, Mistral, Phi-3) whose state lives in
//! host memory while the GPU receives one layer at a time.
//!
//! ```no_run
//! use megatrain::{Backend, Batch, Model, ModelConfig, OffloadPolicy, OptimConfig, Precision};
//!
//! let cfg = ModelConfig {
//!     vocab_size: 32,
//!     hidden_size: 64,
//!     intermediate_size: 128,
//!     num_hidden_layers: 2,
//!     num_attention_heads: 4,
//!     num_key_value_heads: 2,
//!     max_position_embeddings: 64,
//!     precision: Precision::FP32,
//!     ..Default::default()
//! };
//! let policy = OffloadPolicy { backend: Backend::CPU, ..Default::default() };
//! let mut model = Model::new(&cfg, &policy)?;
//! let tokens = vec![1; 32];
//! let targets = vec![2; 32];
//! let stats = model.step(&Batch::new(&tokens, &targets, 1, 32), &OptimConfig::default())?;
//! println!("loss {}", stats.loss);
//! # Ok::<(), megatrain::Error>(())
//! ```
//!
//! Configuration structs are plain Rust structs whose `Default` is the
//! library's defaults (from its `mt_X_init_sized`); every fallible call
//! returns [`Result`] with the library's status and message.
//!
//! Threads: a [`Model`] is `Send` but not `Sync` (the library allows one
//! thread at a time per model); a [`Dataset`] is both (read-only after open).
#![deny(unsafe_op_in_unsafe_fn)]

use std::borrow::Cow;
use std::ffi::{CStr, CString};
use std::fmt;
use std::os::raw::{c_char, c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The raw declarations this crate is built on.
pub use megatrain_sys as sys;

/// Targets equal to this are not predicted (prompt tokens, padding).
pub const IGNORE_INDEX: i32 = sys::MT_IGNORE_INDEX;

/// The version of the library actually loaded, as major * 10000 + minor * 100 + patch.
pub fn version_number() -> u32 {
    // SAFETY: no arguments, no state.
    unsafe { sys::mt_version_number() }
}

/// "MAJOR.MINOR.PATCH" of the library actually loaded.
pub fn version() -> &'static str {
    // SAFETY: the library's version string is static.
    static_str(unsafe { sys::mt_version_string() })
}

// ---- enums -------------------------------------------------------------------

// Newtypes over the C value, not Rust enums: a newer library may return a
// value this crate does not know, and that must not be undefined behaviour.
macro_rules! c_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $c:ident = $v:path,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $name(pub u32);

        impl $name {
            $($(#[$vm])* pub const $c: $name = $name($v);)*
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match *self {
                    $($name::$c => f.write_str(concat!(stringify!($name), "::", stringify!($c))),)*
                    $name(v) => write!(f, concat!(stringify!($name), "({})"), v),
                }
            }
        }
    };
}

c_enum!(
    /// The outcome of a call; [`Error::status`] holds one that is not `OK`.
    Status {
        OK = sys::MT_OK,
        /// A bad value or an inconsistent configuration.
        INVALID_ARGUMENT = sys::MT_ERR_INVALID_ARGUMENT,
        STRUCT_SIZE = sys::MT_ERR_STRUCT_SIZE,
        OUT_OF_HOST_MEMORY = sys::MT_ERR_OUT_OF_HOST_MEMORY,
        HOST_BUDGET = sys::MT_ERR_HOST_BUDGET,
        GPU_BUDGET = sys::MT_ERR_GPU_BUDGET,
        OUT_OF_GPU_MEMORY = sys::MT_ERR_OUT_OF_GPU_MEMORY,
        NO_DEVICE = sys::MT_ERR_NO_DEVICE,
        DEVICE = sys::MT_ERR_DEVICE,
        IO = sys::MT_ERR_IO,
        FORMAT = sys::MT_ERR_FORMAT,
        UNSUPPORTED = sys::MT_ERR_UNSUPPORTED,
        /// A loss or gradient norm was not finite; nothing was updated.
        NONFINITE = sys::MT_ERR_NONFINITE,
        /// The policy's abort flag was set.
        ABORTED = sys::MT_ERR_ABORTED,
        INTERNAL = sys::MT_ERR_INTERNAL,
    }
);

impl Status {
    /// The library's static English description.
    pub fn description(self) -> &'static str {
        // SAFETY: mt_status_str returns a static string for any value.
        static_str(unsafe { sys::mt_status_str(self.0) })
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.description())
    }
}

c_enum!(LogLevel {
    DEBUG = sys::MT_LOG_DEBUG,
    INFO = sys::MT_LOG_INFO,
    WARN = sys::MT_LOG_WARN,
    ERROR = sys::MT_LOG_ERROR,
});

c_enum!(Arch {
    LLAMA = sys::MT_ARCH_LLAMA,
    QWEN2 = sys::MT_ARCH_QWEN2,
    MISTRAL = sys::MT_ARCH_MISTRAL,
    QWEN3 = sys::MT_ARCH_QWEN3,
    PHI3 = sys::MT_ARCH_PHI3,
    GEMMA2 = sys::MT_ARCH_GEMMA2,
    GEMMA3 = sys::MT_ARCH_GEMMA3,
    QWEN3_MOE = sys::MT_ARCH_QWEN3_MOE,
    MIXTRAL = sys::MT_ARCH_MIXTRAL,
    QWEN2_MOE = sys::MT_ARCH_QWEN2_MOE,
    GPT_OSS = sys::MT_ARCH_GPT_OSS,
    DEEPSEEK_V3 = sys::MT_ARCH_DEEPSEEK_V3,
    DEEPSEEK_V2 = sys::MT_ARCH_DEEPSEEK_V2,
    LLAMA4 = sys::MT_ARCH_LLAMA4,
});

c_enum!(Precision {
    BF16 = sys::MT_PRECISION_BF16,
    FP32 = sys::MT_PRECISION_FP32,
    LEAN = sys::MT_PRECISION_LEAN,
});

c_enum!(RopeScaling {
    NONE = sys::MT_ROPE_SCALING_NONE,
    LLAMA3 = sys::MT_ROPE_SCALING_LLAMA3,
    LINEAR = sys::MT_ROPE_SCALING_LINEAR,
    YARN = sys::MT_ROPE_SCALING_YARN,
    LONGROPE = sys::MT_ROPE_SCALING_LONGROPE,
});

c_enum!(
    /// How a router's logits become the scores that choose and weigh the experts.
    MoeScoring {
        /// The softmax of the logits; a group's score its best expert's (DeepSeek-V2).
        SOFTMAX = sys::MT_MOE_SCORING_SOFTMAX,
        /// sigmoid(logit); chosen by score + e_score_correction_bias, a group's score the sum
        /// of its best two (DeepSeek-V3).
        SIGMOID = sys::MT_MOE_SCORING_SIGMOID,
    }
);

c_enum!(Backend {
    AUTO = sys::MT_BACKEND_AUTO,
    CPU = sys::MT_BACKEND_CPU,
    CUDA = sys::MT_BACKEND_CUDA,
});

c_enum!(Placement {
    AUTO = sys::MT_PLACE_AUTO,
    DEVICE = sys::MT_PLACE_DEVICE,
    HOST = sys::MT_PLACE_HOST,
});

c_enum!(Pinning {
    AUTO = sys::MT_PIN_AUTO,
    ALWAYS = sys::MT_PIN_ALWAYS,
    NEVER = sys::MT_PIN_NEVER,
});

c_enum!(Recompute {
    AUTO = sys::MT_RECOMPUTE_AUTO,
    FULL = sys::MT_RECOMPUTE_FULL,
});

c_enum!(Attention {
    AUTO = sys::MT_ATTENTION_AUTO,
    KERNELS = sys::MT_ATTENTION_KERNELS,
    CUDNN = sys::MT_ATTENTION_CUDNN,
});

c_enum!(WeightFetch {
    AUTO = sys::MT_FETCH_AUTO,
    WHOLE = sys::MT_FETCH_WHOLE,
    SLICES = sys::MT_FETCH_SLICES,
});

c_enum!(LrSchedule {
    CONSTANT = sys::MT_LR_CONSTANT,
    COSINE = sys::MT_LR_COSINE,
});

c_enum!(Phase {
    FORWARD = sys::MT_PHASE_FORWARD,
    HEAD = sys::MT_PHASE_HEAD,
    BACKWARD = sys::MT_PHASE_BACKWARD,
});

c_enum!(
    /// A cause of the compute stream's idle time: an index into `wait_seconds`.
    Wait {
        WEIGHTS = sys::MT_WAIT_WEIGHTS,
        OPTIMIZER = sys::MT_WAIT_OPTIMIZER,
        CHECKPOINTS = sys::MT_WAIT_CHECKPOINTS,
        LAUNCH = sys::MT_WAIT_LAUNCH,
        HOST = sys::MT_WAIT_HOST,
    }
);

c_enum!(TokenFormat {
    AUTO = sys::MT_TOKENS_AUTO,
    U16 = sys::MT_TOKENS_U16,
    U32 = sys::MT_TOKENS_U32,
    LLMC = sys::MT_TOKENS_LLMC,
    DOCS = sys::MT_TOKENS_DOCS,
});

c_enum!(Split {
    TRAIN = sys::MT_SPLIT_TRAIN,
    HELDOUT = sys::MT_SPLIT_HELDOUT,
});

// ---- errors --------------------------------------------------------------------

/// A failed call: the library's status and its message for that call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Error {
    pub status: Status,
    pub message: String,
}

impl fmt::Display for Error {
    /// `"<status description>: <message>"`, as the C examples print a failure.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.status.description(), self.message)
    }
}

impl std::error::Error for Error {}

pub type Result<T, E = Error> = std::result::Result<T, E>;

fn static_str(p: *const c_char) -> &'static str {
    if p.is_null() {
        return "";
    }
    // SAFETY: only called on the library's static, NUL-terminated strings.
    unsafe { CStr::from_ptr(p) }.to_str().unwrap_or("")
}

/// Copies a string the library owns, before any further call can replace it.
fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the library's strings are NUL-terminated and live until the
    // next call on the same handle (or thread); this copies it at once.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// A refusal made on this side, before the library is called.
fn invalid(message: String) -> Error {
    Error {
        status: Status::INVALID_ARGUMENT,
        message,
    }
}

/// A call without a handle: its message is this thread's mt_last_errmsg,
/// read right after the call, on the same thread.
fn thread_result(st: sys::mt_status) -> Result<()> {
    if st == sys::MT_OK {
        return Ok(());
    }
    Err(Error {
        status: Status(st),
        // SAFETY: no arguments; the string is copied at once.
        message: text(unsafe { sys::mt_last_errmsg() }),
    })
}

fn c_path(path: &Path) -> Result<CString> {
    #[cfg(unix)]
    let bytes = {
        use std::os::unix::ffi::OsStrExt;
        path.as_os_str().as_bytes().to_vec()
    };
    #[cfg(not(unix))]
    let bytes = match path.to_str() {
        Some(s) => s.as_bytes().to_vec(),
        None => return Err(invalid(format!("path {} is not UTF-8", path.display()))),
    };
    CString::new(bytes).map_err(|_| invalid(format!("path {} contains a NUL byte", path.display())))
}

fn to_u32(n: usize, what: &str) -> Result<u32> {
    u32::try_from(n).map_err(|_| invalid(format!("{what} {n} does not fit in 32 bits")))
}

// ---- model configuration -----------------------------------------------------------

/// The shape of a model; field names follow Hugging Face's config.json.
/// `Default` is the library's: a small Llama (vocab 32000, hidden 512, 8
/// layers), bf16, seed 1. Build one with `..Default::default()` so that
/// fields added later keep their defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelConfig {
    pub arch: Arch,
    pub vocab_size: u32,
    pub hidden_size: u32,
    pub intermediate_size: u32,
    pub num_hidden_layers: u32,
    pub num_attention_heads: u32,
    /// Divides `num_attention_heads`; equal for plain multi-head attention.
    pub num_key_value_heads: u32,
    /// 0: `hidden_size / num_attention_heads`.
    pub head_dim: u32,
    pub max_position_embeddings: u32,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub rope_factor: f32,
    pub rope_low_freq_factor: f32,
    pub rope_high_freq_factor: f32,
    pub rope_original_max_position: u32,
    /// q, k and v projections have a bias (Qwen2).
    pub attention_bias: bool,
    /// The LM head is the embedding matrix.
    pub tie_word_embeddings: bool,
    pub precision: Precision,
    /// Weight initialisation.
    pub seed: u64,
    pub initializer_range: f32,
    /// 0: none; W: a sliding layer's query i sees keys i - W + 1 ..= i only.
    pub sliding_window: u32,
    /// 0: every layer from `max_window_layers` slides; P: of those, layer i
    /// with (i + 1) % P == 0 attends fully.
    pub sliding_window_pattern: u32,
    /// The layers below this attend fully.
    pub max_window_layers: u32,
    /// 0: head_dim; attention scores are scaled by its -1/2 power.
    pub query_pre_attn_scalar: f32,
    /// 0: rope_theta; the RoPE base of the sliding layers (Gemma 3).
    pub rope_local_base_freq: f32,
    /// 0: none; c: attention scores s become c * tanh(s / c).
    pub attn_logit_softcapping: f32,
    /// 0: none; c: the same on the LM head's logits.
    pub final_logit_softcapping: f32,
    /// 0: dense MLPs; E: each sparse layer's MLP is E experts and a router.
    pub num_experts: u32,
    /// k: each token's output is the weighted sum of its k best experts'.
    pub num_experts_per_tok: u32,
    /// Each expert's inner width.
    pub moe_intermediate_size: u32,
    /// Non-zero: the k routing weights are renormalised to sum to 1.
    pub norm_topk_prob: u32,
    /// 0 or 1: every layer is sparse; s: layer l is when (l + 1) % s == 0.
    pub decoder_sparse_step: u32,
    /// Non-zero: the load-balancing loss is added to the training loss.
    pub output_router_logits: u32,
    /// The load-balancing loss's weight.
    pub router_aux_loss_coef: f32,
    /// Bit l % 64 of word l / 64: layer l has a dense MLP.
    pub mlp_only_layers: [u64; 4],
    /// -1: none; p: the embedding's padding row (nn.Embedding's padding_idx), zero at the start and
    /// given no gradient by the tokens that look it up.
    pub pad_token_id: i32,
    /// 0: none; S: each sparse layer also runs a shared expert of width S on every token.
    pub shared_expert_intermediate_size: u32,
    /// Non-zero: the shared expert's output is scaled by sigmoid(x . w) (Qwen2-MoE).
    pub shared_expert_gate: u32,
    /// 0 or 1: RoPE turns all of head_dim; f: its first int(head_dim * f) dimensions.
    pub partial_rotary_factor: f32,
    /// yarn, longrope: the factor of cos and sin; 0: the scaling's default.
    pub rope_attention_factor: f32,
    /// yarn: 0 means 32.
    pub rope_beta_fast: f32,
    /// yarn: 0 means 1.
    pub rope_beta_slow: f32,
    /// yarn: with rope_mscale_all_dim, the default attention factor's ratio.
    pub rope_mscale: f32,
    /// yarn: 0 none.
    pub rope_mscale_all_dim: f32,
    /// yarn: non-zero: the correction range is not rounded to whole dimensions.
    pub rope_no_truncate: u32,
    /// longrope: the entries of each factor list (rotary dimensions / 2).
    pub rope_n_factors: u32,
    /// longrope: each frequency's divisor while positions stay below original_max_position.
    pub rope_short_factor: [f32; 128],
    /// longrope: ... and once a micro-batch has a position past it.
    pub rope_long_factor: [f32; 128],
    /// 0: plain attention; R: multi-head latent attention, each token's keys and values
    /// expanded from a rank-R latent (kv_a_proj_with_mqa, kv_b_proj).
    pub kv_lora_rank: u32,
    /// With kv_lora_rank: 0, q_proj from the hidden state; R, q from a rank-R latent
    /// (q_a_proj, q_b_proj).
    pub q_lora_rank: u32,
    /// With kv_lora_rank: each q and k head's dimensions without RoPE (head_dim is this
    /// plus qk_rope_head_dim).
    pub qk_nope_head_dim: u32,
    /// With kv_lora_rank: each q and k head's dimensions with RoPE (the key's shared by all heads).
    pub qk_rope_head_dim: u32,
    /// With kv_lora_rank: each value head's dimensions (at most head_dim).
    pub v_head_dim: u32,
    /// With kv_lora_rank: non-zero: RoPE turns the pairs (2i, 2i + 1), not (i, i + d/2).
    pub rope_interleave: u32,
    /// 0 or 1: no group limit; G: the experts form G groups of E/G ...
    pub n_group: u32,
    /// ... and a token's k are chosen from its topk_group best groups.
    pub topk_group: u32,
    /// 0 or 1: none; s: the routing weights are multiplied by s.
    pub routed_scaling_factor: f32,
    /// How the router scores the experts.
    pub moe_scoring: MoeScoring,
    /// 0: none; N: on the layers with RoPE, query i sees only the keys of its chunk of N,
    /// from N * floor(i / N) (Llama 4's chunked attention).
    pub attention_chunk_size: u32,
    /// Non-zero: on the layers with RoPE, each head of q and k is divided by its root mean
    /// square (+ rms_norm_eps), no weight, after RoPE (Llama 4).
    pub qk_l2_norm: u32,
    /// 0: none; F: on the NoPE layers, q of token i of its sequence is scaled by
    /// 1 + attn_temperature_scale * log1p(floor((i + 1) / F)) (Llama 4).
    pub attn_temperature_floor: f32,
    /// With attn_temperature_floor: the scale of the NoPE layers' query temperature.
    pub attn_temperature_scale: f32,
    /// Non-zero: each routing weight scales its expert's input, not its output (Llama 4).
    pub moe_input_weighted: u32,
    /// Bit l % 64 of word l / 64: layer l has no RoPE and attends to the whole sequence
    /// (Llama 4's no_rope_layers, inverted; l < 256).
    pub nope_layers: [u64; 4],
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self::from_raw(&sys::mt_model_config::init())
    }
}

impl ModelConfig {
    fn from_raw(r: &sys::mt_model_config) -> Self {
        ModelConfig {
            arch: Arch(r.arch),
            vocab_size: r.vocab_size,
            hidden_size: r.hidden_size,
            intermediate_size: r.intermediate_size,
            num_hidden_layers: r.num_hidden_layers,
            num_attention_heads: r.num_attention_heads,
            num_key_value_heads: r.num_key_value_heads,
            head_dim: r.head_dim,
            max_position_embeddings: r.max_position_embeddings,
            rms_norm_eps: r.rms_norm_eps,
            rope_theta: r.rope_theta,
            rope_scaling: RopeScaling(r.rope_scaling),
            rope_factor: r.rope_factor,
            rope_low_freq_factor: r.rope_low_freq_factor,
            rope_high_freq_factor: r.rope_high_freq_factor,
            rope_original_max_position: r.rope_original_max_position,
            attention_bias: r.attention_bias != 0,
            tie_word_embeddings: r.tie_word_embeddings != 0,
            precision: Precision(r.precision),
            seed: r.seed,
            initializer_range: r.initializer_range,
            sliding_window: r.sliding_window,
            sliding_window_pattern: r.sliding_window_pattern,
            max_window_layers: r.max_window_layers,
            query_pre_attn_scalar: r.query_pre_attn_scalar,
            rope_local_base_freq: r.rope_local_base_freq,
            attn_logit_softcapping: r.attn_logit_softcapping,
            final_logit_softcapping: r.final_logit_softcapping,
            num_experts: r.num_experts,
            num_experts_per_tok: r.num_experts_per_tok,
            moe_intermediate_size: r.moe_intermediate_size,
            norm_topk_prob: r.norm_topk_prob,
            decoder_sparse_step: r.decoder_sparse_step,
            output_router_logits: r.output_router_logits,
            router_aux_loss_coef: r.router_aux_loss_coef,
            mlp_only_layers: r.mlp_only_layers,
            pad_token_id: r.pad_token_id,
            shared_expert_intermediate_size: r.shared_expert_intermediate_size,
            shared_expert_gate: r.shared_expert_gate,
            partial_rotary_factor: r.partial_rotary_factor,
            rope_attention_factor: r.rope_attention_factor,
            rope_beta_fast: r.rope_beta_fast,
            rope_beta_slow: r.rope_beta_slow,
            rope_mscale: r.rope_mscale,
            rope_mscale_all_dim: r.rope_mscale_all_dim,
            rope_no_truncate: r.rope_no_truncate,
            rope_n_factors: r.rope_n_factors,
            rope_short_factor: r.rope_short_factor,
            rope_long_factor: r.rope_long_factor,
            kv_lora_rank: r.kv_lora_rank,
            q_lora_rank: r.q_lora_rank,
            qk_nope_head_dim: r.qk_nope_head_dim,
            qk_rope_head_dim: r.qk_rope_head_dim,
            v_head_dim: r.v_head_dim,
            rope_interleave: r.rope_interleave,
            n_group: r.n_group,
            topk_group: r.topk_group,
            routed_scaling_factor: r.routed_scaling_factor,
            moe_scoring: MoeScoring(r.moe_scoring),
            attention_chunk_size: r.attention_chunk_size,
            qk_l2_norm: r.qk_l2_norm,
            attn_temperature_floor: r.attn_temperature_floor,
            attn_temperature_scale: r.attn_temperature_scale,
            moe_input_weighted: r.moe_input_weighted,
            nope_layers: r.nope_layers,
        }
    }

    fn to_raw(&self) -> sys::mt_model_config {
        let mut r = sys::mt_model_config::init();
        r.arch = self.arch.0;
        r.vocab_size = self.vocab_size;
        r.hidden_size = self.hidden_size;
        r.intermediate_size = self.intermediate_size;
        r.num_hidden_layers = self.num_hidden_layers;
        r.num_attention_heads = self.num_attention_heads;
        r.num_key_value_heads = self.num_key_value_heads;
        r.head_dim = self.head_dim;
        r.max_position_embeddings = self.max_position_embeddings;
        r.rms_norm_eps = self.rms_norm_eps;
        r.rope_theta = self.rope_theta;
        r.rope_scaling = self.rope_scaling.0;
        r.rope_factor = self.rope_factor;
        r.rope_low_freq_factor = self.rope_low_freq_factor;
        r.rope_high_freq_factor = self.rope_high_freq_factor;
        r.rope_original_max_position = self.rope_original_max_position;
        r.attention_bias = self.attention_bias as u32;
        r.tie_word_embeddings = self.tie_word_embeddings as u32;
        r.precision = self.precision.0;
        r.seed = self.seed;
        r.initializer_range = self.initializer_range;
        r.sliding_window = self.sliding_window;
        r.sliding_window_pattern = self.sliding_window_pattern;
        r.max_window_layers = self.max_window_layers;
        r.query_pre_attn_scalar = self.query_pre_attn_scalar;
        r.rope_local_base_freq = self.rope_local_base_freq;
        r.attn_logit_softcapping = self.attn_logit_softcapping;
        r.final_logit_softcapping = self.final_logit_softcapping;
        r.num_experts = self.num_experts;
        r.num_experts_per_tok = self.num_experts_per_tok;
        r.moe_intermediate_size = self.moe_intermediate_size;
        r.norm_topk_prob = self.norm_topk_prob;
        r.decoder_sparse_step = self.decoder_sparse_step;
        r.output_router_logits = self.output_router_logits;
        r.router_aux_loss_coef = self.router_aux_loss_coef;
        r.mlp_only_layers = self.mlp_only_layers;
        r.pad_token_id = self.pad_token_id;
        r.shared_expert_intermediate_size = self.shared_expert_intermediate_size;
        r.shared_expert_gate = self.shared_expert_gate;
        r.partial_rotary_factor = self.partial_rotary_factor;
        r.rope_attention_factor = self.rope_attention_factor;
        r.rope_beta_fast = self.rope_beta_fast;
        r.rope_beta_slow = self.rope_beta_slow;
        r.rope_mscale = self.rope_mscale;
        r.rope_mscale_all_dim = self.rope_mscale_all_dim;
        r.rope_no_truncate = self.rope_no_truncate;
        r.rope_n_factors = self.rope_n_factors;
        r.rope_short_factor = self.rope_short_factor;
        r.rope_long_factor = self.rope_long_factor;
        r.kv_lora_rank = self.kv_lora_rank;
        r.q_lora_rank = self.q_lora_rank;
        r.qk_nope_head_dim = self.qk_nope_head_dim;
        r.qk_rope_head_dim = self.qk_rope_head_dim;
        r.v_head_dim = self.v_head_dim;
        r.rope_interleave = self.rope_interleave;
        r.n_group = self.n_group;
        r.topk_group = self.topk_group;
        r.routed_scaling_factor = self.routed_scaling_factor;
        r.moe_scoring = self.moe_scoring.0;
        r.attention_chunk_size = self.attention_chunk_size;
        r.qk_l2_norm = self.qk_l2_norm;
        r.attn_temperature_floor = self.attn_temperature_floor;
        r.attn_temperature_scale = self.attn_temperature_scale;
        r.moe_input_weighted = self.moe_input_weighted;
        r.nope_layers = self.nope_layers;
        r
    }

    /// Reads a Hugging Face model folder's config.json into `self`
    /// (`precision`, `seed` and `initializer_range` are kept). Another
    /// architecture or an unsupported setting is refused with
    /// [`Status::UNSUPPORTED`]. On failure `self` is unchanged.
    pub fn read_hf_config(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = c_path(dir.as_ref())?;
        let mut r = self.to_raw();
        // SAFETY: r is a complete mt_model_config, dir a C string.
        thread_result(unsafe { sys::mt_config_load(&mut r, dir.as_ptr()) })?;
        *self = Self::from_raw(&r);
        Ok(())
    }
}

// ---- offload policy -----------------------------------------------------------------

/// Receives the library's log lines (without a newline) on the thread that
/// called into it. A panic inside it is caught and dropped: it must not
/// unwind into C.
pub type LogFn = Arc<dyn Fn(LogLevel, &str) + Send + Sync>;

/// Where state lives and what runs it. `Default` is the library's: backend
/// AUTO, device 0, 2 weight slots, budgets from the machine, warnings and
/// errors to stderr.
#[derive(Clone)]
pub struct OffloadPolicy {
    pub backend: Backend,
    /// CUDA device index.
    pub device: i32,
    /// GPU weight buffers, at least 2.
    pub weight_slots: u32,
    /// 0: the device's free memory.
    pub gpu_budget_bytes: u64,
    /// 0: the memory the machine has available.
    pub host_budget_bytes: u64,
    /// -1: the node nearest the GPU (or none).
    pub numa_node: i32,
    /// 0: one per core of the NUMA node.
    pub optimizer_threads: u32,
    /// Where activation checkpoints live.
    pub activations: Placement,
    pub pin_host: Pinning,
    /// The least severe level delivered to `log` (or printed to stderr).
    pub log_level: LogLevel,
    /// Record each step's timeline (CUDA backend; [`Model::timeline`]).
    pub timeline: bool,
    pub recompute: Recompute,
    /// The CUDA backend's attention: cuDNN's fused kernels or the library's.
    pub attention: Attention,
    /// Let cuDNN's attention backward add dQ with atomics: faster, not
    /// bit-reproducible (`MT_ATTENTION_NONDETERMINISTIC`).
    pub nondeterministic_attention: bool,
    /// Data parallelism on the GPUs of one host: two or more CUDA device
    /// indices train together on one host copy of the model (each step's
    /// micro-batches divided among them, a multiple of their number;
    /// gradients reduced over NCCL). Empty: the one GPU `device`.
    pub devices: Vec<i32>,
    /// How each of those GPUs receives a unit's weights: whole over its
    /// own link, or a slice each and an NCCL all-gather (`mt_weight_fetch`).
    pub weight_fetch: WeightFetch,
    /// None: warnings and errors go to stderr.
    pub log: Option<LogFn>,
    /// Polled between unit visits and micro-batches: once it is true, the
    /// running call stops with [`Status::ABORTED`] and leaves the model as
    /// before it. The model keeps this flag alive; set it from any thread.
    /// Models created from clones of a policy share its flag.
    pub abort: Option<Arc<AtomicBool>>,
}

impl Default for OffloadPolicy {
    fn default() -> Self {
        let r = sys::mt_offload_policy::init();
        OffloadPolicy {
            backend: Backend(r.backend),
            device: r.device,
            weight_slots: r.weight_slots,
            gpu_budget_bytes: r.gpu_budget_bytes,
            host_budget_bytes: r.host_budget_bytes,
            numa_node: r.numa_node,
            optimizer_threads: r.optimizer_threads,
            activations: Placement(r.activations),
            pin_host: Pinning(r.pin_host),
            log_level: LogLevel(r.log_level),
            timeline: r.timeline != 0,
            recompute: Recompute(r.recompute),
            attention: Attention(r.attention),
            nondeterministic_attention: r.attention_flags & sys::MT_ATTENTION_NONDETERMINISTIC != 0,
            devices: Vec::new(),
            weight_fetch: WeightFetch(r.weight_fetch),
            log: None,
            abort: None,
        }
    }
}

impl fmt::Debug for OffloadPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OffloadPolicy")
            .field("backend", &self.backend)
            .field("device", &self.device)
            .field("weight_slots", &self.weight_slots)
            .field("gpu_budget_bytes", &self.gpu_budget_bytes)
            .field("host_budget_bytes", &self.host_budget_bytes)
            .field("numa_node", &self.numa_node)
            .field("optimizer_threads", &self.optimizer_threads)
            .field("activations", &self.activations)
            .field("pin_host", &self.pin_host)
            .field("log_level", &self.log_level)
            .field("timeline", &self.timeline)
            .field("attention", &self.attention)
            .field(
                "nondeterministic_attention",
                &self.nondeterministic_attention,
            )
            .field("recompute", &self.recompute)
            .field("devices", &self.devices)
            .field("weight_fetch", &self.weight_fetch)
            .field("log", &self.log.as_ref().map(|_| "Fn"))
            .field("abort", &self.abort)
            .finish()
    }
}

/// What the callbacks' user_data point to, owned by whoever may be called
/// back: a model for its life, or a policy for the length of one call.
/// Heap objects, so moving this moves no pointee.
struct Hooks {
    log: Option<Box<LogFn>>,
    abort: Option<Arc<AtomicBool>>,
    /// the device list the struct points to (the library copies it)
    devices: Vec<i32>,
}

unsafe extern "C" fn log_trampoline(
    level: sys::mt_log_level,
    text: *const c_char,
    user_data: *mut c_void,
) {
    // SAFETY: user_data is the Box<LogFn> of the Hooks that outlive every
    // call the library may make back; text is NUL-terminated for this call.
    let f = unsafe { &*(user_data as *const LogFn) };
    let line = if text.is_null() {
        Cow::Borrowed("")
    } else {
        unsafe { CStr::from_ptr(text) }.to_string_lossy()
    };
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| f(LogLevel(level), &line))) {
        // dropping the payload could panic in turn
        std::mem::forget(payload);
    }
}

unsafe extern "C" fn abort_trampoline(user_data: *mut c_void) -> c_int {
    // SAFETY: user_data is the Arc<AtomicBool> of the Hooks that outlive
    // every call the library may make back. A flag publishes no other data,
    // so Relaxed is enough.
    c_int::from(unsafe { &*(user_data as *const AtomicBool) }.load(Ordering::Relaxed))
}

impl OffloadPolicy {
    /// The C struct, and the hooks its callback pointers point into: they
    /// must outlive every call that is given the struct (and the model
    /// created with it).
    fn to_raw(&self) -> (sys::mt_offload_policy, Hooks) {
        let mut r = sys::mt_offload_policy::init();
        r.backend = self.backend.0;
        r.device = self.device;
        r.weight_slots = self.weight_slots;
        r.gpu_budget_bytes = self.gpu_budget_bytes;
        r.host_budget_bytes = self.host_budget_bytes;
        r.numa_node = self.numa_node;
        r.optimizer_threads = self.optimizer_threads;
        r.activations = self.activations.0;
        r.pin_host = self.pin_host.0;
        r.log_level = self.log_level.0;
        r.timeline = self.timeline as u32;
        r.recompute = self.recompute.0;
        r.attention = self.attention.0;
        r.weight_fetch = self.weight_fetch.0;
        r.attention_flags = if self.nondeterministic_attention {
            sys::MT_ATTENTION_NONDETERMINISTIC
        } else {
            0
        };
        let hooks = Hooks {
            log: self.log.clone().map(Box::new),
            abort: self.abort.clone(),
            devices: self.devices.clone(),
        };
        if hooks.devices.len() > 1 {
            r.num_devices = hooks.devices.len() as u32;
            r.devices = hooks.devices.as_ptr();
        } else if let Some(&d) = hooks.devices.first() {
            r.device = d;
        }
        if let Some(log) = &hooks.log {
            r.log_callback = Some(log_trampoline);
            r.log_user_data = &**log as *const LogFn as *mut c_void;
        }
        if let Some(flag) = &hooks.abort {
            r.abort_callback = Some(abort_trampoline);
            r.abort_user_data = Arc::as_ptr(flag) as *mut c_void;
        }
        (r, hooks)
    }
}

// ---- optimizer --------------------------------------------------------------------

/// AdamW with decoupled weight decay, as torch.optim.AdamW. `Default` is the
/// library's: cosine, lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay
/// 0.1, grad clip 1.0, min_lr_ratio 0.1, no warm-up, 1000 steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OptimConfig {
    pub schedule: LrSchedule,
    /// Peak learning rate.
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    /// Applied to matrices; norms and biases are never decayed.
    pub weight_decay: f32,
    /// Clips the global gradient L2 norm to this; 0: no clipping.
    pub grad_clip: f32,
    /// Cosine floor as a fraction of lr.
    pub min_lr_ratio: f32,
    pub warmup_steps: u32,
    /// The length of the cosine schedule.
    pub total_steps: u32,
}

impl Default for OptimConfig {
    fn default() -> Self {
        let r = sys::mt_optim_config::init();
        OptimConfig {
            schedule: LrSchedule(r.schedule),
            lr: r.lr,
            beta1: r.beta1,
            beta2: r.beta2,
            eps: r.eps,
            weight_decay: r.weight_decay,
            grad_clip: r.grad_clip,
            min_lr_ratio: r.min_lr_ratio,
            warmup_steps: r.warmup_steps,
            total_steps: r.total_steps,
        }
    }
}

impl OptimConfig {
    fn to_raw(self) -> sys::mt_optim_config {
        let mut r = sys::mt_optim_config::init();
        r.schedule = self.schedule.0;
        r.lr = self.lr;
        r.beta1 = self.beta1;
        r.beta2 = self.beta2;
        r.eps = self.eps;
        r.weight_decay = self.weight_decay;
        r.grad_clip = self.grad_clip;
        r.min_lr_ratio = self.min_lr_ratio;
        r.warmup_steps = self.warmup_steps;
        r.total_steps = self.total_steps;
        r
    }

    /// The learning rate of `step` (0-based); NaN for an invalid config.
    pub fn lr_at(&self, step: u64) -> f32 {
        let r = self.to_raw();
        // SAFETY: r is a complete mt_optim_config.
        unsafe { sys::mt_lr_at(&r, step) }
    }
}

// ---- memory plan ---------------------------------------------------------------------

/// One optimizer step's batch shape. `Default`: 1 sequence of 1024 tokens, 1 micro-batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchShape {
    pub micro_batch_size: u32,
    pub seq_len: u32,
    pub num_micro_batches: u32,
}

impl Default for BatchShape {
    fn default() -> Self {
        let r = sys::mt_batch_shape::init();
        BatchShape {
            micro_batch_size: r.micro_batch_size,
            seq_len: r.seq_len,
            num_micro_batches: r.num_micro_batches,
        }
    }
}

/// Bytes per tier that a model would use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryPlan {
    pub backend: Backend,
    pub num_params: u64,
    pub host_pinned_bytes: u64,
    pub host_pageable_bytes: u64,
    pub gpu_bytes: u64,
    pub weight_bytes: u64,
    pub grad_bytes: u64,
    pub master_bytes: u64,
    pub optim_bytes: u64,
    pub activation_bytes: u64,
    pub workspace_bytes: u64,
    pub host_budget_bytes: u64,
    pub gpu_budget_bytes: u64,
    pub weight_slots: u32,
    pub activations: Placement,
    pub num_units: u32,
    pub largest_unit_params: u64,
    /// How many activation checkpoints live in host memory (0.2).
    pub host_checkpoints: u32,
    /// How many the backward recomputes instead of keeping (0.2).
    pub recomputed_checkpoints: u32,
}

/// The memory plan of `cfg` under `policy`, computed without allocating;
/// `shape` None plans the persistent state alone (what [`Model::new`]
/// needs). A plan that does not fit the budgets is an error
/// ([`Status::HOST_BUDGET`], [`Status::GPU_BUDGET`]) whose message has the numbers.
pub fn plan(
    cfg: &ModelConfig,
    policy: &OffloadPolicy,
    shape: Option<&BatchShape>,
) -> Result<MemoryPlan> {
    let c = cfg.to_raw();
    let (p, _hooks) = policy.to_raw(); // alive until the call returns
    let s = shape.map(|s| {
        let mut r = sys::mt_batch_shape::init();
        r.micro_batch_size = s.micro_batch_size;
        r.seq_len = s.seq_len;
        r.num_micro_batches = s.num_micro_batches;
        r
    });
    let mut out = sys::mt_memory_plan::init();
    let sp = s
        .as_ref()
        .map_or(ptr::null(), |s| s as *const sys::mt_batch_shape);
    // SAFETY: complete structs (or NULL for the shape), as the header asks.
    thread_result(unsafe { sys::mt_plan(&mut out, &c, &p, sp) })?;
    Ok(MemoryPlan {
        backend: Backend(out.backend),
        num_params: out.num_params,
        host_pinned_bytes: out.host_pinned_bytes,
        host_pageable_bytes: out.host_pageable_bytes,
        gpu_bytes: out.gpu_bytes,
        weight_bytes: out.weight_bytes,
        grad_bytes: out.grad_bytes,
        master_bytes: out.master_bytes,
        optim_bytes: out.optim_bytes,
        activation_bytes: out.activation_bytes,
        workspace_bytes: out.workspace_bytes,
        host_budget_bytes: out.host_budget_bytes,
        gpu_budget_bytes: out.gpu_budget_bytes,
        weight_slots: out.weight_slots,
        activations: Placement(out.activations),
        num_units: out.num_units,
        largest_unit_params: out.largest_unit_params,
        host_checkpoints: out.host_checkpoints,
        recomputed_checkpoints: out.recomputed_checkpoints,
    })
}

// ---- batches and statistics --------------------------------------------------------------

/// One optimizer step's tokens: `num_micro_batches` micro-batches of
/// `micro_batch_size` sequences of `seq_len` tokens, in that order. Both
/// slices must hold exactly that many entries (checked before each call).
#[derive(Clone, Copy, Debug)]
pub struct Batch<'a> {
    pub tokens: &'a [i32],
    /// The id to predict at each position, or [`IGNORE_INDEX`].
    pub targets: &'a [i32],
    pub micro_batch_size: u32,
    pub seq_len: u32,
    pub num_micro_batches: u32,
    /// Documents packed into each sequence: each token's position in its
    /// document (0 where one starts); `None`, one document a sequence.
    pub positions: Option<&'a [i32]>,
}

impl<'a> Batch<'a> {
    /// One micro-batch of `micro_batch_size` sequences of `seq_len` tokens.
    pub fn new(tokens: &'a [i32], targets: &'a [i32], micro_batch_size: u32, seq_len: u32) -> Self {
        Batch {
            tokens,
            targets,
            micro_batch_size,
            seq_len,
            num_micro_batches: 1,
            positions: None,
        }
    }

    /// The C struct pointing into the slices, once their lengths are those
    /// the library will read: it reads exactly that many, and trusts them.
    fn to_raw(self) -> Result<sys::mt_batch> {
        let n = (self.micro_batch_size as u64)
            .checked_mul(self.seq_len as u64)
            .and_then(|n| n.checked_mul(self.num_micro_batches as u64));
        let positions_len = self.positions.map_or(self.tokens.len(), |p| p.len());
        if n != Some(self.tokens.len() as u64)
            || n != Some(self.targets.len() as u64)
            || n != Some(positions_len as u64)
        {
            return Err(invalid(format!(
                "batch of {} x {} x {} tokens given {} tokens, {} targets and {} positions",
                self.num_micro_batches,
                self.micro_batch_size,
                self.seq_len,
                self.tokens.len(),
                self.targets.len(),
                positions_len
            )));
        }
        let mut r = sys::mt_batch::init();
        r.micro_batch_size = self.micro_batch_size;
        r.seq_len = self.seq_len;
        r.num_micro_batches = self.num_micro_batches;
        r.tokens = self.tokens.as_ptr();
        r.targets = self.targets.as_ptr();
        r.positions = self.positions.map_or(ptr::null(), |p| p.as_ptr());
        Ok(r)
    }
}

/// What one optimizer step did.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct StepStats {
    /// Optimizer steps taken, this one included.
    pub step: u64,
    /// Mean cross-entropy over the step's target tokens.
    pub loss: f64,
    /// Global L2 norm of the gradients, before clipping.
    pub grad_norm: f64,
    /// The learning rate this step used.
    pub lr: f32,
    pub tokens: u64,
    pub target_tokens: u64,
    pub seconds: f64,
    pub forward_seconds: f64,
    pub backward_seconds: f64,
    pub optimizer_seconds: f64,
}

/// The loss of an evaluation.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct EvalStats {
    pub loss: f64,
    pub tokens: u64,
    pub target_tokens: u64,
    pub seconds: f64,
}

/// Where the last step's time went on the GPU (see docs/timeline.md).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct Timeline {
    pub n_visits: u32,
    pub step: u64,
    pub seconds: f64,
    pub busy_seconds: f64,
    /// Idle time of the compute stream, indexed by [`Wait`]; busy + waits = seconds.
    pub wait_seconds: [f64; sys::MT_WAIT_CAPACITY],
    pub h2d_seconds: f64,
    pub d2h_seconds: f64,
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
}

impl Timeline {
    /// The idle time of one cause (0 for one this library does not know).
    pub fn wait(&self, cause: Wait) -> f64 {
        self.wait_seconds
            .get(cause.0 as usize)
            .copied()
            .unwrap_or(0.0)
    }
}

/// One unit visit of a step's timeline. Its C layout is fixed, so this is
/// the raw struct.
pub type TimelineVisit = sys::mt_timeline_visit;

/// What a resume checkpoint carries besides the model and optimizer state.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CheckpointInfo {
    /// On load: the optimizer steps the model had taken (ignored on save).
    pub step: u64,
    /// The caller's position in its data.
    pub data_position: u64,
    /// The caller's random state.
    pub rng_state: [u64; 4],
    /// The caller's own state, the text of a JSON object kept in
    /// trainer_state.json beside the library's keys.
    pub caller_json: Option<String>,
}

// ---- the model ---------------------------------------------------------------------

/// A model, its optimizer state and its step counter; destroyed on drop.
///
/// `Send`: the library lets a model be used from whichever thread calls it.
/// Not `Sync`: it must not be used by two threads at once, so sharing a
/// `&Model` across threads does not compile:
///
/// ```compile_fail,E0277
/// fn shared<T: Sync>() {}
/// shared::<megatrain::Model>();
/// ```
///
/// while moving one to another thread does:
///
/// ```
/// fn movable<T: Send>() {}
/// movable::<megatrain::Model>();
/// ```
pub struct Model {
    raw: NonNull<sys::mt_model>,
    vocab_size: u32,
    // Declared after `raw` and dropped after Drop::drop has destroyed the
    // model: the library may call back until then.
    _hooks: Hooks,
}

// SAFETY: the library allows a model to be used from any thread, one at a
// time; the hooks hold only Send + Sync data. Not Sync: no two threads at once.
unsafe impl Send for Model {}

// A static assertion that Model is not Sync (the compile_fail test above
// says the same): were it Sync, the two impls would make the call ambiguous.
const _: fn() = || {
    trait AmbiguousIfSync<A> {
        fn some_item() {}
    }
    impl<T: ?Sized> AmbiguousIfSync<()> for T {}
    impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}
    let _ = <Model as AmbiguousIfSync<_>>::some_item;
};

impl Drop for Model {
    fn drop(&mut self) {
        // SAFETY: raw came from mt_model_create and is destroyed once.
        unsafe { sys::mt_model_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Model {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Model")
            .field("num_params", &self.num_params())
            .field("step_count", &self.step_count())
            .field("backend", &self.backend())
            .finish()
    }
}

impl Model {
    /// Checks the plan against the budgets, allocates the host tiles and
    /// initialises the weights from `cfg.seed`.
    pub fn new(cfg: &ModelConfig, policy: &OffloadPolicy) -> Result<Model> {
        let c = cfg.to_raw();
        let (p, hooks) = policy.to_raw();
        let mut out = ptr::null_mut();
        // SAFETY: complete structs; the hooks p points into live on in the
        // model (or until this returns, if creation fails).
        thread_result(unsafe { sys::mt_model_create(&mut out, &c, &p) })?;
        let raw = NonNull::new(out).ok_or_else(|| Error {
            status: Status::INTERNAL,
            message: "mt_model_create returned MT_OK and no model".to_string(),
        })?;
        let mut model = Model {
            raw,
            vocab_size: 0,
            _hooks: hooks,
        };
        // the library's own value sizes the logits buffer
        model.vocab_size = model.config()?.vocab_size;
        Ok(model)
    }

    /// A call on this model: its message is the model's, read right away.
    fn check(&self, st: sys::mt_status) -> Result<()> {
        if st == sys::MT_OK {
            return Ok(());
        }
        Err(Error {
            status: Status(st),
            // SAFETY: a live model; the string is copied before any other call.
            message: text(unsafe { sys::mt_model_errmsg(self.raw.as_ptr()) }),
        })
    }

    /// The configuration the model was created with.
    pub fn config(&self) -> Result<ModelConfig> {
        let mut r = sys::mt_model_config::init();
        // SAFETY: a live model and a complete struct.
        self.check(unsafe { sys::mt_model_get_config(self.raw.as_ptr(), &mut r) })?;
        Ok(ModelConfig::from_raw(&r))
    }

    /// The number of trainable parameters.
    pub fn num_params(&self) -> u64 {
        // SAFETY: a live model.
        unsafe { sys::mt_model_num_params(self.raw.as_ptr()) }
    }

    /// Optimizer steps taken.
    pub fn step_count(&self) -> u64 {
        // SAFETY: a live model.
        unsafe { sys::mt_model_step_count(self.raw.as_ptr()) }
    }

    /// The backend in use: CPU or CUDA.
    pub fn backend(&self) -> Backend {
        // SAFETY: a live model.
        Backend(unsafe { sys::mt_model_backend(self.raw.as_ptr()) })
    }

    /// One optimizer step over every micro-batch of `batch`, with the
    /// learning rate of the model's step counter under `opt`'s schedule. On
    /// failure the weights, optimizer state and step counter are unchanged.
    pub fn step(&mut self, batch: &Batch<'_>, opt: &OptimConfig) -> Result<StepStats> {
        let b = batch.to_raw()?;
        let o = opt.to_raw();
        let mut s = sys::mt_step_stats::init();
        // SAFETY: b points into slices of the lengths it declares, alive
        // for the call; complete structs.
        self.check(unsafe { sys::mt_step(self.raw.as_ptr(), &b, &o, &mut s) })?;
        Ok(StepStats {
            step: s.step,
            loss: s.loss,
            grad_norm: s.grad_norm,
            lr: s.lr,
            tokens: s.tokens,
            target_tokens: s.target_tokens,
            seconds: s.seconds,
            forward_seconds: s.forward_seconds,
            backward_seconds: s.backward_seconds,
            optimizer_seconds: s.optimizer_seconds,
        })
    }

    /// The loss on `batch`, changing nothing.
    pub fn eval(&mut self, batch: &Batch<'_>) -> Result<EvalStats> {
        let b = batch.to_raw()?;
        let mut s = sys::mt_eval_stats::init();
        // SAFETY: as in step.
        self.check(unsafe { sys::mt_eval(self.raw.as_ptr(), &b, &mut s) })?;
        Ok(EvalStats {
            loss: s.loss,
            tokens: s.tokens,
            target_tokens: s.target_tokens,
            seconds: s.seconds,
        })
    }

    /// Next-token logits after each of `n_seq` sequences of `seq_len`
    /// tokens: `n_seq * vocab_size` scores, a sequence's after another.
    pub fn logits(&mut self, tokens: &[i32], n_seq: u32, seq_len: u32) -> Result<Vec<f32>> {
        if (n_seq as u64) * (seq_len as u64) != tokens.len() as u64 {
            return Err(invalid(format!(
                "logits of {n_seq} x {seq_len} tokens given {}",
                tokens.len()
            )));
        }
        // checked: the library writes this many, whatever usize is
        let n_out = (n_seq as usize)
            .checked_mul(self.vocab_size as usize)
            .ok_or_else(|| invalid(format!("logits of {n_seq} sequences do not fit in memory")))?;
        let mut out = vec![0f32; n_out];
        // SAFETY: tokens holds n_seq * seq_len ids, out n_seq * vocab_size floats.
        self.check(unsafe {
            sys::mt_model_logits(
                self.raw.as_ptr(),
                tokens.as_ptr(),
                n_seq,
                seq_len,
                out.as_mut_ptr(),
            )
        })?;
        Ok(out)
    }

    /// The timeline of the last step and up to `max_visits` of its unit
    /// visits. [`Status::UNSUPPORTED`] unless the policy's `timeline` is set
    /// and the backend is CUDA.
    pub fn timeline(&mut self, max_visits: usize) -> Result<(Timeline, Vec<TimelineVisit>)> {
        let cap = to_u32(max_visits, "max_visits")?;
        let mut t = sys::mt_timeline::init();
        let mut visits = vec![TimelineVisit::default(); max_visits];
        // SAFETY: visits has room for cap entries.
        self.check(unsafe {
            sys::mt_model_timeline(self.raw.as_ptr(), &mut t, visits.as_mut_ptr(), cap)
        })?;
        visits.truncate((t.n_visits as usize).min(max_visits));
        let timeline = Timeline {
            n_visits: t.n_visits,
            step: t.step,
            seconds: t.seconds,
            busy_seconds: t.busy_seconds,
            wait_seconds: t.wait_seconds,
            h2d_seconds: t.h2d_seconds,
            d2h_seconds: t.d2h_seconds,
            h2d_bytes: t.h2d_bytes,
            d2h_bytes: t.d2h_bytes,
        };
        Ok((timeline, visits))
    }

    /// Writes config.json and model.safetensors into `dir` (created if missing).
    pub fn save(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = c_path(dir.as_ref())?;
        // SAFETY: a live model and a C string.
        self.check(unsafe { sys::mt_model_save(self.raw.as_ptr(), dir.as_ptr()) })
    }

    /// Loads the weights of a Hugging Face model folder whose configuration
    /// matches; resets the optimizer state. On failure the model is unchanged.
    pub fn load(&mut self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = c_path(dir.as_ref())?;
        // SAFETY: a live model and a C string.
        self.check(unsafe { sys::mt_model_load(self.raw.as_ptr(), dir.as_ptr()) })
    }

    /// Saves everything a bit-identical resume needs into `dir/step-NNNNNNNN/`
    /// and points `dir/latest` at it; `info` is stored as given.
    pub fn checkpoint_save(&mut self, dir: impl AsRef<Path>, info: &CheckpointInfo) -> Result<()> {
        let dir = c_path(dir.as_ref())?;
        let caller = match &info.caller_json {
            Some(text) => Some(CString::new(text.as_str()).map_err(|_| {
                invalid("CheckpointInfo::caller_json holds a NUL byte".to_string())
            })?),
            None => None,
        };
        let mut r = sys::mt_checkpoint_info::init();
        r.step = info.step;
        r.data_position = info.data_position;
        r.rng_state = info.rng_state;
        r.caller_json = caller.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        // SAFETY: a live model, a C string and a complete struct whose
        // caller_json, if any, outlives the call.
        self.check(unsafe { sys::mt_checkpoint_save(self.raw.as_ptr(), dir.as_ptr(), &r) })
    }

    /// Loads the checkpoint `dir/latest` names (or `dir` itself, a step
    /// folder): weights, optimizer state and step counter. Returns what was
    /// saved with it. On failure the model is unchanged.
    pub fn checkpoint_load(&mut self, dir: impl AsRef<Path>) -> Result<CheckpointInfo> {
        let dir = c_path(dir.as_ref())?;
        let mut r = sys::mt_checkpoint_info::init();
        // SAFETY: a live model, a C string and a complete struct.
        self.check(unsafe { sys::mt_checkpoint_load(self.raw.as_ptr(), dir.as_ptr(), &mut r) })?;
        // SAFETY: NULL, or a NUL-terminated string the model owns until its
        // next checkpoint load; copied at once.
        let caller_json = (!r.caller_json.is_null()).then(|| {
            unsafe { CStr::from_ptr(r.caller_json) }
                .to_string_lossy()
                .into_owned()
        });
        Ok(CheckpointInfo {
            step: r.step,
            data_position: r.data_position,
            rng_state: r.rng_state,
            caller_json,
        })
    }
}

// ---- token data --------------------------------------------------------------------

/// How a token file is read. `Default`: AUTO format, no vocabulary check,
/// seq_len 1024, 1% held out, seed 1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DatasetOptions {
    pub format: TokenFormat,
    /// Token ids at or above this are refused at open; 0: no check.
    pub vocab_size: u32,
    /// Tokens per training sequence; a window holds seq_len + 1 tokens.
    pub seq_len: u32,
    /// Share of the windows held out (the file's last ones), in [0, 0.5].
    pub heldout_fraction: f32,
    /// The order in which training windows are drawn.
    pub seed: u64,
}

impl Default for DatasetOptions {
    fn default() -> Self {
        let r = sys::mt_dataset_options::init();
        DatasetOptions {
            format: TokenFormat(r.format),
            vocab_size: r.vocab_size,
            seq_len: r.seq_len,
            heldout_fraction: r.heldout_fraction,
            seed: r.seed,
        }
    }
}

/// A memory-mapped token file cut into windows of seq_len + 1 tokens;
/// closed on drop. Read-only after open, so it may serve several threads.
pub struct Dataset {
    raw: NonNull<sys::mt_dataset>,
    seq_len: u32,
}

// SAFETY: the header makes a dataset read-only after open: one may serve
// several threads, and be closed from any.
unsafe impl Send for Dataset {}
unsafe impl Sync for Dataset {}

impl Drop for Dataset {
    fn drop(&mut self) {
        // SAFETY: raw came from mt_dataset_open and is closed once.
        unsafe { sys::mt_dataset_close(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Dataset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dataset")
            .field("num_tokens", &self.num_tokens())
            .field("seq_len", &self.seq_len)
            .finish()
    }
}

impl Dataset {
    /// Opens and validates a token file (size, header, every id against
    /// `opts.vocab_size`).
    pub fn open(path: impl AsRef<Path>, opts: &DatasetOptions) -> Result<Dataset> {
        let path = c_path(path.as_ref())?;
        let mut r = sys::mt_dataset_options::init();
        r.format = opts.format.0;
        r.vocab_size = opts.vocab_size;
        r.seq_len = opts.seq_len;
        r.heldout_fraction = opts.heldout_fraction;
        r.seed = opts.seed;
        let mut out = ptr::null_mut();
        // SAFETY: a C string and a complete struct.
        thread_result(unsafe { sys::mt_dataset_open(&mut out, path.as_ptr(), &r) })?;
        let raw = NonNull::new(out).ok_or_else(|| Error {
            status: Status::INTERNAL,
            message: "mt_dataset_open returned MT_OK and no dataset".to_string(),
        })?;
        // The library has no getter for it, and read() needs it to size buffers.
        Ok(Dataset {
            raw,
            seq_len: opts.seq_len,
        })
    }

    /// Tokens per sequence, as opened.
    pub fn seq_len(&self) -> u32 {
        self.seq_len
    }

    pub fn num_tokens(&self) -> u64 {
        // SAFETY: a live dataset.
        unsafe { sys::mt_dataset_num_tokens(self.raw.as_ptr()) }
    }

    pub fn num_windows(&self, split: Split) -> u64 {
        // SAFETY: a live dataset.
        unsafe { sys::mt_dataset_num_windows(self.raw.as_ptr(), split.0) }
    }

    /// Fills `tokens` and `targets` (the next token of each) with
    /// `tokens.len() / seq_len` sequences starting at window `position` of
    /// `split`; the next call's position is `position` plus that count.
    /// Training positions run on into the next epochs; held-out ones wrap.
    pub fn read_into(
        &self,
        split: Split,
        position: u64,
        tokens: &mut [i32],
        targets: &mut [i32],
    ) -> Result<()> {
        let l = self.seq_len as usize;
        if l == 0 || tokens.len() % l != 0 || targets.len() != tokens.len() {
            return Err(invalid(format!(
                "dataset read into {} tokens and {} targets: both must be the same multiple of seq_len {l}",
                tokens.len(),
                targets.len()
            )));
        }
        let n_seq = to_u32(tokens.len() / l, "n_seq")?;
        // SAFETY: both buffers hold n_seq * seq_len entries.
        thread_result(unsafe {
            sys::mt_dataset_read(
                self.raw.as_ptr(),
                split.0,
                position,
                n_seq,
                tokens.as_mut_ptr(),
                targets.as_mut_ptr(),
            )
        })
    }

    /// [`Dataset::read_into`] new buffers of `n_seq` sequences: (tokens, targets).
    pub fn read(&self, split: Split, position: u64, n_seq: u32) -> Result<(Vec<i32>, Vec<i32>)> {
        let n = n_seq as usize * self.seq_len as usize;
        let mut tokens = vec![0; n];
        let mut targets = vec![0; n];
        self.read_into(split, position, &mut tokens, &mut targets)?;
        Ok((tokens, targets))
    }
}

// ---- writing document files (0.2) ----------------------------------------------------

/// A document file (`TokenFormat::DOCS`) being written: documents of token
/// ids, each id learnt or not. The file appears under its path only when
/// [`DocWriter::finish`] succeeds; dropped unfinished, it leaves nothing.
pub struct DocWriter {
    raw: NonNull<sys::mt_doc_writer>,
}

// SAFETY: a writer may be used from any thread, one at a time (&mut self).
unsafe impl Send for DocWriter {}

impl Drop for DocWriter {
    fn drop(&mut self) {
        // SAFETY: raw came from mt_doc_writer_create and is freed once.
        unsafe { sys::mt_doc_writer_free(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for DocWriter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocWriter")
            .field("num_documents", &self.num_documents())
            .field("num_tokens", &self.num_tokens())
            .finish()
    }
}

impl DocWriter {
    /// Starts a file for ids below `vocab_size` (written to `path` + ".tmp"
    /// until finish).
    pub fn create(path: impl AsRef<Path>, vocab_size: u32) -> Result<DocWriter> {
        let path = c_path(path.as_ref())?;
        let mut out = ptr::null_mut();
        // SAFETY: a C string and an out pointer.
        thread_result(unsafe { sys::mt_doc_writer_create(&mut out, path.as_ptr(), vocab_size) })?;
        let raw = NonNull::new(out).ok_or_else(|| Error {
            status: Status::INTERNAL,
            message: "mt_doc_writer_create returned MT_OK and no writer".to_string(),
        })?;
        Ok(DocWriter { raw })
    }

    /// Appends tokens to the current document, every one learnt (`learnt`)
    /// or none.
    pub fn append(&mut self, tokens: &[i32], learnt: bool) -> Result<()> {
        let flags = vec![learnt as u8; tokens.len()];
        self.append_flags(tokens, &flags)
    }

    /// Appends tokens with a flag each: true for a token the model learns.
    pub fn append_flags(&mut self, tokens: &[i32], learnt: &[u8]) -> Result<()> {
        if learnt.len() != tokens.len() {
            return Err(invalid(format!(
                "doc writer append: {} tokens and {} flags",
                tokens.len(),
                learnt.len()
            )));
        }
        // SAFETY: both slices hold tokens.len() entries.
        thread_result(unsafe {
            sys::mt_doc_writer_append(
                self.raw.as_ptr(),
                tokens.as_ptr(),
                learnt.as_ptr(),
                tokens.len(),
            )
        })
    }

    /// Ends the current document (an empty one is none).
    pub fn end_document(&mut self) -> Result<()> {
        // SAFETY: a live writer.
        thread_result(unsafe { sys::mt_doc_writer_end_document(self.raw.as_ptr()) })
    }

    /// Ends the last document and puts the file under its path.
    pub fn finish(self) -> Result<()> {
        // SAFETY: a live writer; dropped (freed) after.
        thread_result(unsafe { sys::mt_doc_writer_finish(self.raw.as_ptr()) })
    }

    pub fn num_tokens(&self) -> u64 {
        // SAFETY: a live writer.
        unsafe { sys::mt_doc_writer_num_tokens(self.raw.as_ptr()) }
    }

    pub fn num_targets(&self) -> u64 {
        // SAFETY: a live writer.
        unsafe { sys::mt_doc_writer_num_targets(self.raw.as_ptr()) }
    }

    pub fn num_documents(&self) -> u64 {
        // SAFETY: a live writer.
        unsafe { sys::mt_doc_writer_num_documents(self.raw.as_ptr()) }
    }
}

#[cfg(test)]
mod tests;
