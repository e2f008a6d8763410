//! Raw declarations of libmegatrain's C API, `include/megatrain.h` of 0.2,
//! written by hand and checked field by field against the C compiler's
//! layout (tests/layout.rs). No logic: the safe API is the `megatrain` crate.
//!
//! - Enums are plain integer types with constants, not Rust enums: the
//!   library may return values this crate does not know, and a Rust enum
//!   holding an unknown value is undefined behaviour.
//! - The header's `mt_X_init(p)` are `static inline` and so not in the
//!   library. They are here as `unsafe fn mt_X_init(p)`, and as `T::init()`,
//!   both passing `size_of::<T>()` of the definitions below to the exported
//!   `mt_X_init_sized` (docs/abi.md): the library then never writes past, nor
//!   reads beyond, the struct as this crate defines it.
//! - Strings returned by the library are owned by it; see each function.
#![allow(non_camel_case_types)]

use std::marker::{PhantomData, PhantomPinned};
use std::mem::{size_of, MaybeUninit};
use std::os::raw::{c_char, c_int, c_uint, c_void};

// ---- version ---------------------------------------------------------------

pub const MT_VERSION_MAJOR: u32 = 0;
pub const MT_VERSION_MINOR: u32 = 2;
pub const MT_VERSION_PATCH: u32 = 0;
/// The header version these declarations follow, as `mt_version_number()`
/// reports the loaded library's.
pub const MT_VERSION_NUMBER: u32 =
    MT_VERSION_MAJOR * 10000 + MT_VERSION_MINOR * 100 + MT_VERSION_PATCH;

// ---- enums -----------------------------------------------------------------

// C enums whose values all fit in 0..=0x7FFFFFFF: the C compiler makes them
// `unsigned int` (the `*_MAX_ENUM` members keep them 32-bit).
macro_rules! c_enum {
    ($(#[$m:meta])* $ty:ident { $($(#[$vm:meta])* $name:ident = $val:expr,)* }) => {
        $(#[$m])*
        pub type $ty = c_uint;
        $($(#[$vm])* pub const $name: $ty = $val;)*
    };
}

c_enum!(mt_status {
    MT_OK = 0,
    MT_ERR_INVALID_ARGUMENT = 1,
    MT_ERR_STRUCT_SIZE = 2,
    MT_ERR_OUT_OF_HOST_MEMORY = 3,
    MT_ERR_HOST_BUDGET = 4,
    MT_ERR_GPU_BUDGET = 5,
    MT_ERR_OUT_OF_GPU_MEMORY = 6,
    MT_ERR_NO_DEVICE = 7,
    MT_ERR_DEVICE = 8,
    MT_ERR_IO = 9,
    MT_ERR_FORMAT = 10,
    MT_ERR_UNSUPPORTED = 11,
    MT_ERR_NONFINITE = 12,
    MT_ERR_ABORTED = 13,
    MT_ERR_INTERNAL = 14,
    MT_STATUS_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_log_level {
    MT_LOG_DEBUG = 0,
    MT_LOG_INFO = 1,
    MT_LOG_WARN = 2,
    MT_LOG_ERROR = 3,
    MT_LOG_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_arch {
    MT_ARCH_LLAMA = 0,
    MT_ARCH_QWEN2 = 1,
    MT_ARCH_MISTRAL = 2,
    MT_ARCH_QWEN3 = 3,
    MT_ARCH_PHI3 = 4,
    MT_ARCH_GEMMA2 = 5,
    MT_ARCH_GEMMA3 = 6,
    MT_ARCH_QWEN3_MOE = 7,
    MT_ARCH_MIXTRAL = 8,
    MT_ARCH_QWEN2_MOE = 9,
    MT_ARCH_GPT_OSS = 10,
    MT_ARCH_DEEPSEEK_V3 = 11,
    MT_ARCH_DEEPSEEK_V2 = 12,
    MT_ARCH_LLAMA4 = 13,
    MT_ARCH_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_precision {
    MT_PRECISION_BF16 = 0,
    MT_PRECISION_FP32 = 1,
    MT_PRECISION_LEAN = 2,
    MT_PRECISION_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_rope_scaling {
    MT_ROPE_SCALING_NONE = 0,
    MT_ROPE_SCALING_LLAMA3 = 1,
    MT_ROPE_SCALING_LINEAR = 2,
    MT_ROPE_SCALING_YARN = 3,
    MT_ROPE_SCALING_LONGROPE = 4,
    MT_ROPE_SCALING_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_moe_scoring {
    MT_MOE_SCORING_SOFTMAX = 0,
    MT_MOE_SCORING_SIGMOID = 1,
    MT_MOE_SCORING_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_backend {
    MT_BACKEND_AUTO = 0,
    MT_BACKEND_CPU = 1,
    MT_BACKEND_CUDA = 2,
    MT_BACKEND_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_placement {
    MT_PLACE_AUTO = 0,
    MT_PLACE_DEVICE = 1,
    MT_PLACE_HOST = 2,
    MT_PLACE_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_pinning {
    MT_PIN_AUTO = 0,
    MT_PIN_ALWAYS = 1,
    MT_PIN_NEVER = 2,
    MT_PIN_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_recompute {
    MT_RECOMPUTE_AUTO = 0,
    MT_RECOMPUTE_FULL = 1,
    MT_RECOMPUTE_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_attention {
    MT_ATTENTION_AUTO = 0,
    MT_ATTENTION_KERNELS = 1,
    MT_ATTENTION_CUDNN = 2,
    MT_ATTENTION_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_weight_fetch {
    MT_FETCH_AUTO = 0,
    MT_FETCH_WHOLE = 1,
    MT_FETCH_SLICES = 2,
    MT_FETCH_MAX_ENUM = 0x7FFF_FFFF,
});

/// mt_offload_policy.attention_flags
pub const MT_ATTENTION_NONDETERMINISTIC: u32 = 1;

c_enum!(mt_lr_schedule {
    MT_LR_CONSTANT = 0,
    MT_LR_COSINE = 1,
    MT_LR_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_phase {
    MT_PHASE_FORWARD = 0,
    MT_PHASE_HEAD = 1,
    MT_PHASE_BACKWARD = 2,
    MT_PHASE_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(
    /// An index into the `wait_seconds` arrays.
    mt_wait {
        MT_WAIT_WEIGHTS = 0,
        MT_WAIT_OPTIMIZER = 1,
        MT_WAIT_CHECKPOINTS = 2,
        MT_WAIT_LAUNCH = 3,
        MT_WAIT_HOST = 4,
        /// The causes this header knows; grows up to `MT_WAIT_CAPACITY`.
        MT_WAIT_COUNT = 5,
    }
);

c_enum!(mt_token_format {
    MT_TOKENS_AUTO = 0,
    MT_TOKENS_U16 = 1,
    MT_TOKENS_U32 = 2,
    MT_TOKENS_LLMC = 3,
    /// 0.2: documents with a loss mask (mt_doc_writer writes them).
    MT_TOKENS_DOCS = 4,
    MT_TOKENS_MAX_ENUM = 0x7FFF_FFFF,
});

c_enum!(mt_split {
    MT_SPLIT_TRAIN = 0,
    MT_SPLIT_HELDOUT = 1,
    MT_SPLIT_MAX_ENUM = 0x7FFF_FFFF,
});

/// The length of the `wait_seconds` arrays (a `usize`: it sizes arrays).
pub const MT_WAIT_CAPACITY: usize = 8;

/// Targets equal to this are not predicted.
pub const MT_IGNORE_INDEX: i32 = -100;

// ---- callbacks ---------------------------------------------------------------

/// One line of text without a newline, valid only during the call; called
/// from the thread that called into the library.
pub type mt_log_fn =
    Option<unsafe extern "C" fn(level: mt_log_level, text: *const c_char, user_data: *mut c_void)>;

/// Polled during long work; non-zero stops it with `MT_ERR_ABORTED`.
pub type mt_abort_fn = Option<unsafe extern "C" fn(user_data: *mut c_void) -> c_int>;

// ---- structs -------------------------------------------------------------------

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mt_model_config {
    pub struct_size: u32,
    pub arch: u32,
    pub vocab_size: u32,
    pub hidden_size: u32,
    pub intermediate_size: u32,
    pub num_hidden_layers: u32,
    pub num_attention_heads: u32,
    pub num_key_value_heads: u32,
    pub head_dim: u32,
    pub max_position_embeddings: u32,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: u32,
    pub rope_factor: f32,
    pub rope_low_freq_factor: f32,
    pub rope_high_freq_factor: f32,
    pub rope_original_max_position: u32,
    pub attention_bias: u32,
    pub tie_word_embeddings: u32,
    pub precision: u32,
    pub seed: u64,
    pub initializer_range: f32,
    pub reserved0: u32,
    pub sliding_window: u32,
    pub sliding_window_pattern: u32,
    pub max_window_layers: u32,
    pub reserved1: u32,
    pub query_pre_attn_scalar: f32,
    pub rope_local_base_freq: f32,
    pub attn_logit_softcapping: f32,
    pub final_logit_softcapping: f32,
    pub num_experts: u32,
    pub num_experts_per_tok: u32,
    pub moe_intermediate_size: u32,
    pub norm_topk_prob: u32,
    pub decoder_sparse_step: u32,
    pub output_router_logits: u32,
    pub router_aux_loss_coef: f32,
    pub reserved2: u32,
    pub mlp_only_layers: [u64; 4],
    pub pad_token_id: i32,
    pub reserved3: u32,
    pub shared_expert_intermediate_size: u32,
    pub shared_expert_gate: u32,
    pub partial_rotary_factor: f32,
    pub rope_attention_factor: f32,
    pub rope_beta_fast: f32,
    pub rope_beta_slow: f32,
    pub rope_mscale: f32,
    pub rope_mscale_all_dim: f32,
    pub rope_no_truncate: u32,
    pub rope_n_factors: u32,
    pub rope_short_factor: [f32; 128],
    pub rope_long_factor: [f32; 128],
    pub kv_lora_rank: u32,
    pub q_lora_rank: u32,
    pub qk_nope_head_dim: u32,
    pub qk_rope_head_dim: u32,
    pub v_head_dim: u32,
    pub rope_interleave: u32,
    pub n_group: u32,
    pub topk_group: u32,
    pub routed_scaling_factor: f32,
    pub moe_scoring: u32,
    pub attention_chunk_size: u32,
    pub qk_l2_norm: u32,
    pub attn_temperature_floor: f32,
    pub attn_temperature_scale: f32,
    pub moe_input_weighted: u32,
    pub reserved4: u32,
    pub nope_layers: [u64; 4],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mt_offload_policy {
    pub struct_size: u32,
    pub backend: u32,
    pub device: i32,
    pub weight_slots: u32,
    pub gpu_budget_bytes: u64,
    pub host_budget_bytes: u64,
    pub numa_node: i32,
    pub optimizer_threads: u32,
    pub activations: u32,
    pub pin_host: u32,
    pub log_callback: mt_log_fn,
    pub log_user_data: *mut c_void,
    pub log_level: u32,
    pub timeline: u32,
    pub abort_callback: mt_abort_fn,
    pub abort_user_data: *mut c_void,
    pub recompute: u32,
    pub reserved1: u32,
    pub attention: u32,
    pub attention_flags: u32,
    pub num_devices: u32,
    pub weight_fetch: u32,
    pub devices: *const i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mt_optim_config {
    pub struct_size: u32,
    pub schedule: u32,
    pub lr: f32,
    pub beta1: f32,
    pub beta2: f32,
    pub eps: f32,
    pub weight_decay: f32,
    pub grad_clip: f32,
    pub min_lr_ratio: f32,
    pub warmup_steps: u32,
    pub total_steps: u32,
    pub reserved0: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mt_batch_shape {
    pub struct_size: u32,
    pub micro_batch_size: u32,
    pub seq_len: u32,
    pub num_micro_batches: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mt_memory_plan {
    pub struct_size: u32,
    pub backend: u32,
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
    pub activations: u32,
    pub num_units: u32,
    pub reserved0: u32,
    pub largest_unit_params: u64,
    pub host_checkpoints: u32,
    pub recomputed_checkpoints: u32,
}

/// Opaque.
#[repr(C)]
pub struct mt_model {
    _data: [u8; 0],
    // neither Send, Sync nor Unpin: what is allowed is the safe crate's decision
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mt_batch {
    pub struct_size: u32,
    pub micro_batch_size: u32,
    pub seq_len: u32,
    pub num_micro_batches: u32,
    pub tokens: *const i32,
    pub targets: *const i32,
    pub positions: *const i32,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mt_step_stats {
    pub struct_size: u32,
    pub reserved0: u32,
    pub step: u64,
    pub loss: f64,
    pub grad_norm: f64,
    pub lr: f32,
    pub reserved1: u32,
    pub tokens: u64,
    pub target_tokens: u64,
    pub seconds: f64,
    pub forward_seconds: f64,
    pub backward_seconds: f64,
    pub optimizer_seconds: f64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mt_eval_stats {
    pub struct_size: u32,
    pub reserved0: u32,
    pub loss: f64,
    pub tokens: u64,
    pub target_tokens: u64,
    pub seconds: f64,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mt_timeline {
    pub struct_size: u32,
    pub n_visits: u32,
    pub step: u64,
    pub seconds: f64,
    pub busy_seconds: f64,
    pub wait_seconds: [f64; MT_WAIT_CAPACITY],
    pub h2d_seconds: f64,
    pub d2h_seconds: f64,
    pub h2d_bytes: u64,
    pub d2h_bytes: u64,
}

/// A fixed layout without `struct_size`: zeroed (`Default`) is a valid start.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct mt_timeline_visit {
    pub unit: u32,
    pub phase: u32,
    pub start: f64,
    pub end: f64,
    pub weights_start: f64,
    pub weights_end: f64,
    pub wait_seconds: [f64; MT_WAIT_CAPACITY],
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mt_checkpoint_info {
    pub struct_size: u32,
    pub reserved0: u32,
    pub step: u64,
    pub data_position: u64,
    pub rng_state: [u64; 4],
    /// 0.2: the caller's JSON object kept in trainer_state.json; on load,
    /// owned by the model until its next checkpoint load or destruction.
    pub caller_json: *const c_char,
}

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct mt_dataset_options {
    pub struct_size: u32,
    pub format: u32,
    pub vocab_size: u32,
    pub seq_len: u32,
    pub heldout_fraction: f32,
    pub reserved0: u32,
    pub seed: u64,
}

/// Opaque; read-only after open (one dataset may serve several threads).
#[repr(C)]
pub struct mt_dataset {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

/// Opaque (0.2): a document file being written; one thread at a time.
#[repr(C)]
pub struct mt_doc_writer {
    _data: [u8; 0],
    _marker: PhantomData<(*mut u8, PhantomPinned)>,
}

// ---- functions --------------------------------------------------------------------

// No #[link] here: build.rs links the library as pkg-config says.
extern "C" {
    pub fn mt_version_number() -> u32;
    /// "MAJOR.MINOR.PATCH"; static.
    pub fn mt_version_string() -> *const c_char;

    /// Static, never NULL.
    pub fn mt_status_str(status: mt_status) -> *const c_char;
    /// Per thread; valid until the thread's next failing call without a handle.
    pub fn mt_last_errmsg() -> *const c_char;

    pub fn mt_model_config_init_sized(cfg: *mut mt_model_config, size: u32);
    pub fn mt_offload_policy_init_sized(pol: *mut mt_offload_policy, size: u32);
    pub fn mt_optim_config_init_sized(opt: *mut mt_optim_config, size: u32);
    pub fn mt_lr_at(opt: *const mt_optim_config, step: u64) -> f32;
    pub fn mt_batch_shape_init_sized(shape: *mut mt_batch_shape, size: u32);
    pub fn mt_memory_plan_init_sized(plan: *mut mt_memory_plan, size: u32);
    pub fn mt_plan(
        out: *mut mt_memory_plan,
        cfg: *const mt_model_config,
        pol: *const mt_offload_policy,
        shape: *const mt_batch_shape,
    ) -> mt_status;

    pub fn mt_model_create(
        out: *mut *mut mt_model,
        cfg: *const mt_model_config,
        pol: *const mt_offload_policy,
    ) -> mt_status;
    pub fn mt_model_destroy(model: *mut mt_model);
    /// Valid until the next call on the model or its destruction.
    pub fn mt_model_errmsg(model: *const mt_model) -> *const c_char;
    pub fn mt_model_get_config(model: *const mt_model, out: *mut mt_model_config) -> mt_status;
    pub fn mt_model_num_params(model: *const mt_model) -> u64;
    pub fn mt_model_backend(model: *const mt_model) -> mt_backend;

    pub fn mt_batch_init_sized(batch: *mut mt_batch, size: u32);
    pub fn mt_step_stats_init_sized(stats: *mut mt_step_stats, size: u32);
    pub fn mt_step(
        model: *mut mt_model,
        batch: *const mt_batch,
        opt: *const mt_optim_config,
        stats: *mut mt_step_stats,
    ) -> mt_status;
    pub fn mt_eval_stats_init_sized(stats: *mut mt_eval_stats, size: u32);
    pub fn mt_eval(
        model: *mut mt_model,
        batch: *const mt_batch,
        stats: *mut mt_eval_stats,
    ) -> mt_status;
    pub fn mt_model_logits(
        model: *mut mt_model,
        tokens: *const i32,
        n_seq: u32,
        seq_len: u32,
        out: *mut f32,
    ) -> mt_status;

    pub fn mt_timeline_init_sized(timeline: *mut mt_timeline, size: u32);
    pub fn mt_model_timeline(
        model: *mut mt_model,
        out: *mut mt_timeline,
        visits: *mut mt_timeline_visit,
        cap: u32,
    ) -> mt_status;
    pub fn mt_model_step_count(model: *const mt_model) -> u64;

    pub fn mt_config_load(cfg: *mut mt_model_config, dir: *const c_char) -> mt_status;
    pub fn mt_model_load(model: *mut mt_model, dir: *const c_char) -> mt_status;
    pub fn mt_model_save(model: *mut mt_model, dir: *const c_char) -> mt_status;

    pub fn mt_checkpoint_info_init_sized(info: *mut mt_checkpoint_info, size: u32);
    pub fn mt_checkpoint_save(
        model: *mut mt_model,
        dir: *const c_char,
        info: *const mt_checkpoint_info,
    ) -> mt_status;
    pub fn mt_checkpoint_load(
        model: *mut mt_model,
        dir: *const c_char,
        info: *mut mt_checkpoint_info,
    ) -> mt_status;

    pub fn mt_dataset_options_init_sized(opt: *mut mt_dataset_options, size: u32);
    pub fn mt_dataset_open(
        out: *mut *mut mt_dataset,
        path: *const c_char,
        opt: *const mt_dataset_options,
    ) -> mt_status;
    pub fn mt_dataset_close(ds: *mut mt_dataset);
    pub fn mt_dataset_num_tokens(ds: *const mt_dataset) -> u64;
    pub fn mt_dataset_num_windows(ds: *const mt_dataset, split: mt_split) -> u64;
    pub fn mt_dataset_read(
        ds: *const mt_dataset,
        split: mt_split,
        position: u64,
        n_seq: u32,
        tokens: *mut i32,
        targets: *mut i32,
    ) -> mt_status;

    // 0.2: document files
    pub fn mt_doc_writer_create(
        out: *mut *mut mt_doc_writer,
        path: *const c_char,
        vocab_size: u32,
    ) -> mt_status;
    /// `targets`: `n` flags (1: learnt, 0: not), or NULL: all learnt.
    pub fn mt_doc_writer_append(
        w: *mut mt_doc_writer,
        tokens: *const i32,
        targets: *const u8,
        n: usize,
    ) -> mt_status;
    pub fn mt_doc_writer_end_document(w: *mut mt_doc_writer) -> mt_status;
    pub fn mt_doc_writer_finish(w: *mut mt_doc_writer) -> mt_status;
    /// NULL ok; unfinished: the temporary is removed.
    pub fn mt_doc_writer_free(w: *mut mt_doc_writer);
    pub fn mt_doc_writer_num_tokens(w: *const mt_doc_writer) -> u64;
    pub fn mt_doc_writer_num_targets(w: *const mt_doc_writer) -> u64;
    pub fn mt_doc_writer_num_documents(w: *const mt_doc_writer) -> u64;
}

// ---- the header's inline initialisers ------------------------------------------------

macro_rules! sized_init {
    ($($ty:ident: $init:ident => $sized:ident;)*) => {$(
        #[doc = concat!("The header's inline `", stringify!($init), "`: `",
                        stringify!($sized), "(p, size_of::<", stringify!($ty), ">())`.")]
        ///
        /// # Safety
        /// `p` must point to writable memory for one such struct.
        #[inline]
        pub unsafe fn $init(p: *mut $ty) {
            $sized(p, size_of::<$ty>() as u32)
        }

        impl $ty {
            /// The library's defaults for this definition of the struct,
            /// `struct_size` included.
            pub fn init() -> Self {
                let mut x = MaybeUninit::<$ty>::zeroed();
                // SAFETY: every field is an integer, a float, an array of
                // them, a nullable pointer or an Option of a function
                // pointer, for which zero bytes are valid; the initialiser
                // writes at most size_of::<$ty>() bytes of such values.
                unsafe {
                    $sized(x.as_mut_ptr(), size_of::<$ty>() as u32);
                    x.assume_init()
                }
            }
        }
    )*};
}

sized_init! {
    mt_model_config: mt_model_config_init => mt_model_config_init_sized;
    mt_offload_policy: mt_offload_policy_init => mt_offload_policy_init_sized;
    mt_optim_config: mt_optim_config_init => mt_optim_config_init_sized;
    mt_batch_shape: mt_batch_shape_init => mt_batch_shape_init_sized;
    mt_memory_plan: mt_memory_plan_init => mt_memory_plan_init_sized;
    mt_batch: mt_batch_init => mt_batch_init_sized;
    mt_step_stats: mt_step_stats_init => mt_step_stats_init_sized;
    mt_eval_stats: mt_eval_stats_init => mt_eval_stats_init_sized;
    mt_timeline: mt_timeline_init => mt_timeline_init_sized;
    mt_checkpoint_info: mt_checkpoint_info_init => mt_checkpoint_info_init_sized;
    mt_dataset_options: mt_dataset_options_init => mt_dataset_options_init_sized;
}
