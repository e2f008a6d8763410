//! Trains a small model on a repeating token pattern through libmegatrain's C
//! ABI from Rust, with no crate and no generated bindings: the structs below
//! are this program's own definitions, and each is initialised by
//! `mt_X_init_sized` with the size of that definition (docs/abi.md). The
//! offload policy is declared as the library's first release had it (it ends
//! at `abort_user_data`), so this also checks that a binding written against
//! an older header gets the defaults of the fields it does not know.
//!
//!     rustc --edition 2021 -O train.rs -L "$(pkg-config --variable=libdir megatrain)" -o train
//!
//! Exits 0 when the loss fell to under half its first value.
use std::ffi::CStr;
use std::mem::size_of;
use std::os::raw::{c_char, c_int, c_void};

type Status = c_int;
const MT_OK: Status = 0;
const MT_BACKEND_CPU: u32 = 1;
const MT_PRECISION_FP32: u32 = 1;

#[repr(C)]
struct ModelConfig {
    struct_size: u32,
    arch: u32,
    vocab_size: u32,
    hidden_size: u32,
    intermediate_size: u32,
    num_hidden_layers: u32,
    num_attention_heads: u32,
    num_key_value_heads: u32,
    head_dim: u32,
    max_position_embeddings: u32,
    rms_norm_eps: f32,
    rope_theta: f32,
    rope_scaling: u32,
    rope_factor: f32,
    rope_low_freq_factor: f32,
    rope_high_freq_factor: f32,
    rope_original_max_position: u32,
    attention_bias: u32,
    tie_word_embeddings: u32,
    precision: u32,
    seed: u64,
    initializer_range: f32,
    reserved0: u32,
}

/// mt_offload_policy as first released (without `recompute`, `reserved1`).
#[repr(C)]
struct OffloadPolicyV1 {
    struct_size: u32,
    backend: u32,
    device: i32,
    weight_slots: u32,
    gpu_budget_bytes: u64,
    host_budget_bytes: u64,
    numa_node: i32,
    optimizer_threads: u32,
    activations: u32,
    pin_host: u32,
    log_callback: Option<extern "C" fn(u32, *const c_char, *mut c_void)>,
    log_user_data: *mut c_void,
    log_level: u32,
    timeline: u32,
    abort_callback: Option<extern "C" fn(*mut c_void) -> c_int>,
    abort_user_data: *mut c_void,
}

#[repr(C)]
struct OptimConfig {
    struct_size: u32,
    schedule: u32,
    lr: f32,
    beta1: f32,
    beta2: f32,
    eps: f32,
    weight_decay: f32,
    grad_clip: f32,
    min_lr_ratio: f32,
    warmup_steps: u32,
    total_steps: u32,
    reserved0: u32,
}

#[repr(C)]
struct Batch {
    struct_size: u32,
    micro_batch_size: u32,
    seq_len: u32,
    num_micro_batches: u32,
    tokens: *const i32,
    targets: *const i32,
}

#[repr(C)]
struct StepStats {
    struct_size: u32,
    reserved0: u32,
    step: u64,
    loss: f64,
    grad_norm: f64,
    lr: f32,
    reserved1: u32,
    tokens: u64,
    target_tokens: u64,
    seconds: f64,
    forward_seconds: f64,
    backward_seconds: f64,
    optimizer_seconds: f64,
}

#[repr(C)]
struct Model {
    _opaque: [u8; 0],
}

#[link(name = "megatrain")]
extern "C" {
    fn mt_version_string() -> *const c_char;
    fn mt_status_str(status: Status) -> *const c_char;
    fn mt_last_errmsg() -> *const c_char;
    fn mt_model_config_init_sized(cfg: *mut ModelConfig, size: u32);
    fn mt_offload_policy_init_sized(pol: *mut OffloadPolicyV1, size: u32);
    fn mt_optim_config_init_sized(opt: *mut OptimConfig, size: u32);
    fn mt_batch_init_sized(batch: *mut Batch, size: u32);
    fn mt_step_stats_init_sized(stats: *mut StepStats, size: u32);
    fn mt_model_create(
        out: *mut *mut Model,
        cfg: *const ModelConfig,
        pol: *const OffloadPolicyV1,
    ) -> Status;
    fn mt_model_destroy(model: *mut Model);
    fn mt_model_errmsg(model: *const Model) -> *const c_char;
    fn mt_model_num_params(model: *const Model) -> u64;
    fn mt_step(
        model: *mut Model,
        batch: *const Batch,
        opt: *const OptimConfig,
        stats: *mut StepStats,
    ) -> Status;
}

/// A struct of this program's definition, filled with the library's defaults.
macro_rules! init {
    ($ty:ty, $f:ident) => {{
        let mut x = std::mem::MaybeUninit::<$ty>::uninit();
        // SAFETY: mt_X_init_sized writes exactly size_of::<$ty>() bytes, every
        // field of which is an integer, a float, a nullable pointer or an
        // Option of a function pointer, all valid when zero or filled.
        unsafe {
            $f(x.as_mut_ptr(), size_of::<$ty>() as u32);
            x.assume_init()
        }
    }};
}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: the library returns NUL-terminated strings that live at least until the next call.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn main() {
    println!(
        "libmegatrain {} from Rust",
        text(unsafe { mt_version_string() })
    );

    let mut cfg = init!(ModelConfig, mt_model_config_init_sized);
    cfg.vocab_size = 32;
    cfg.hidden_size = 64;
    cfg.intermediate_size = 128;
    cfg.num_hidden_layers = 2;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.max_position_embeddings = 64;
    cfg.precision = MT_PRECISION_FP32;
    let mut pol = init!(OffloadPolicyV1, mt_offload_policy_init_sized);
    pol.backend = MT_BACKEND_CPU;

    // a refusal first: 7 query heads, which the default 8 key/value heads do not divide
    let mut bad = init!(ModelConfig, mt_model_config_init_sized);
    bad.num_attention_heads = 7;
    let mut model: *mut Model = std::ptr::null_mut();
    let st = unsafe { mt_model_create(&mut model, &bad, &pol) };
    let why = text(unsafe { mt_last_errmsg() });
    if st == MT_OK || !model.is_null() || why.is_empty() {
        eprintln!("a bad config was not refused with a message ({st}, \"{why}\")");
        std::process::exit(1);
    }
    println!(
        "refused as expected: {}: {}",
        text(unsafe { mt_status_str(st) }),
        why
    );

    let st = unsafe { mt_model_create(&mut model, &cfg, &pol) };
    if st != MT_OK {
        eprintln!(
            "mt_model_create: {}: {}",
            text(unsafe { mt_status_str(st) }),
            text(unsafe { mt_last_errmsg() })
        );
        std::process::exit(1);
    }
    println!("{} parameters", unsafe { mt_model_num_params(model) });

    // 4 sequences of 32 tokens of a period-7 pattern, each starting elsewhere in it
    let (n_seq, seq_len) = (4usize, 32usize);
    let pattern = [3, 17, 5, 29, 11, 2, 23];
    let mut tokens = vec![0i32; n_seq * seq_len];
    let mut targets = vec![0i32; n_seq * seq_len];
    for s in 0..n_seq {
        for t in 0..seq_len {
            tokens[s * seq_len + t] = pattern[(s + t) % 7];
            targets[s * seq_len + t] = pattern[(s + t + 1) % 7];
        }
    }
    let mut batch = init!(Batch, mt_batch_init_sized);
    batch.micro_batch_size = n_seq as u32;
    batch.seq_len = seq_len as u32;
    batch.num_micro_batches = 1;
    batch.tokens = tokens.as_ptr();
    batch.targets = targets.as_ptr();
    let mut opt = init!(OptimConfig, mt_optim_config_init_sized);
    opt.lr = 3e-3;
    opt.total_steps = 60;

    let mut first = f64::NAN;
    let mut last = f64::NAN;
    for i in 0..60 {
        let mut stats = init!(StepStats, mt_step_stats_init_sized);
        let st = unsafe { mt_step(model, &batch, &opt, &mut stats) };
        if st != MT_OK {
            eprintln!(
                "mt_step: {}: {}",
                text(unsafe { mt_status_str(st) }),
                text(unsafe { mt_model_errmsg(model) })
            );
            unsafe { mt_model_destroy(model) };
            std::process::exit(1);
        }
        if i == 0 {
            first = stats.loss;
        }
        last = stats.loss;
        if i % 20 == 0 || i == 59 {
            println!(
                "step {:2}: loss {:.6}, grad norm {:.6}, lr {:.6}",
                stats.step, stats.loss, stats.grad_norm, stats.lr
            );
        }
    }
    unsafe { mt_model_destroy(model) };
    if !(last < 0.5 * first) {
        eprintln!("the loss did not fall to half: {first:.4} -> {last:.4}");
        std::process::exit(1);
    }
    println!("learned: loss {first:.6} -> {last:.6}");
}
