//! The layout of every public struct, as bindgen's layout tests check it:
//! size, alignment and each field's offset, against the numbers the C
//! compiler gives for include/megatrain.h on a 64-bit Linux target
//! (`sizeof`, `_Alignof`, `offsetof`). The library asserts the same numbers
//! in C. Offsets come from pointer arithmetic on a MaybeUninit, which works
//! on compilers older than `offset_of!`.
// The numbers are those of LP64 targets; pointers make them differ elsewhere.
#![cfg(target_pointer_width = "64")]

use megatrain_sys::*;
use std::mem::{align_of, size_of, MaybeUninit};
use std::ptr::addr_of;

macro_rules! layout {
    ($ty:ident, size $size:expr, align $align:expr, $($field:ident: $offset:expr,)*) => {
        #[test]
        #[allow(non_snake_case)]
        fn $ty() {
            assert_eq!(size_of::<$ty>(), $size, concat!("size of ", stringify!($ty)));
            assert_eq!(align_of::<$ty>(), $align, concat!("alignment of ", stringify!($ty)));
            let uninit = MaybeUninit::<$ty>::uninit();
            let base = uninit.as_ptr();
            $(
                // SAFETY: addr_of! takes the field's address without reading it.
                let offset = unsafe { addr_of!((*base).$field) as usize - base as usize };
                assert_eq!(offset, $offset,
                           concat!("offset of ", stringify!($ty), "::", stringify!($field)));
            )*
            // Names every field, with no `..`: a field added to the struct and
            // not to this list fails to compile.
            let _ = |x: $ty| {
                let $ty { $($field: _,)* } = x;
            };
        }
    };
}

layout! {
    mt_model_config, size 1360, align 8,
    struct_size: 0,
    arch: 4,
    vocab_size: 8,
    hidden_size: 12,
    intermediate_size: 16,
    num_hidden_layers: 20,
    num_attention_heads: 24,
    num_key_value_heads: 28,
    head_dim: 32,
    max_position_embeddings: 36,
    rms_norm_eps: 40,
    rope_theta: 44,
    rope_scaling: 48,
    rope_factor: 52,
    rope_low_freq_factor: 56,
    rope_high_freq_factor: 60,
    rope_original_max_position: 64,
    attention_bias: 68,
    tie_word_embeddings: 72,
    precision: 76,
    seed: 80,
    initializer_range: 88,
    reserved0: 92,
    sliding_window: 96,
    sliding_window_pattern: 100,
    max_window_layers: 104,
    reserved1: 108,
    query_pre_attn_scalar: 112,
    rope_local_base_freq: 116,
    attn_logit_softcapping: 120,
    final_logit_softcapping: 124,
    num_experts: 128,
    num_experts_per_tok: 132,
    moe_intermediate_size: 136,
    norm_topk_prob: 140,
    decoder_sparse_step: 144,
    output_router_logits: 148,
    router_aux_loss_coef: 152,
    reserved2: 156,
    mlp_only_layers: 160,
    pad_token_id: 192,
    reserved3: 196,
    shared_expert_intermediate_size: 200,
    shared_expert_gate: 204,
    partial_rotary_factor: 208,
    rope_attention_factor: 212,
    rope_beta_fast: 216,
    rope_beta_slow: 220,
    rope_mscale: 224,
    rope_mscale_all_dim: 228,
    rope_no_truncate: 232,
    rope_n_factors: 236,
    rope_short_factor: 240,
    rope_long_factor: 752,
    kv_lora_rank: 1264,
    q_lora_rank: 1268,
    qk_nope_head_dim: 1272,
    qk_rope_head_dim: 1276,
    v_head_dim: 1280,
    rope_interleave: 1284,
    n_group: 1288,
    topk_group: 1292,
    routed_scaling_factor: 1296,
    moe_scoring: 1300,
    attention_chunk_size: 1304,
    qk_l2_norm: 1308,
    attn_temperature_floor: 1312,
    attn_temperature_scale: 1316,
    moe_input_weighted: 1320,
    reserved4: 1324,
    nope_layers: 1328,
}

layout! {
    mt_offload_policy, size 120, align 8,
    struct_size: 0,
    backend: 4,
    device: 8,
    weight_slots: 12,
    gpu_budget_bytes: 16,
    host_budget_bytes: 24,
    numa_node: 32,
    optimizer_threads: 36,
    activations: 40,
    pin_host: 44,
    log_callback: 48,
    log_user_data: 56,
    log_level: 64,
    timeline: 68,
    abort_callback: 72,
    abort_user_data: 80,
    recompute: 88,
    reserved1: 92,
    attention: 96,
    attention_flags: 100,
    num_devices: 104,
    weight_fetch: 108,
    devices: 112,
}

layout! {
    mt_optim_config, size 48, align 4,
    struct_size: 0,
    schedule: 4,
    lr: 8,
    beta1: 12,
    beta2: 16,
    eps: 20,
    weight_decay: 24,
    grad_clip: 28,
    min_lr_ratio: 32,
    warmup_steps: 36,
    total_steps: 40,
    reserved0: 44,
}

layout! {
    mt_batch_shape, size 16, align 4,
    struct_size: 0,
    micro_batch_size: 4,
    seq_len: 8,
    num_micro_batches: 12,
}

layout! {
    mt_memory_plan, size 136, align 8,
    struct_size: 0,
    backend: 4,
    num_params: 8,
    host_pinned_bytes: 16,
    host_pageable_bytes: 24,
    gpu_bytes: 32,
    weight_bytes: 40,
    grad_bytes: 48,
    master_bytes: 56,
    optim_bytes: 64,
    activation_bytes: 72,
    workspace_bytes: 80,
    host_budget_bytes: 88,
    gpu_budget_bytes: 96,
    weight_slots: 104,
    activations: 108,
    num_units: 112,
    reserved0: 116,
    largest_unit_params: 120,
    host_checkpoints: 128,
    recomputed_checkpoints: 132,
}

layout! {
    mt_batch, size 40, align 8,
    struct_size: 0,
    micro_batch_size: 4,
    seq_len: 8,
    num_micro_batches: 12,
    tokens: 16,
    targets: 24,
    positions: 32,
}

layout! {
    mt_step_stats, size 88, align 8,
    struct_size: 0,
    reserved0: 4,
    step: 8,
    loss: 16,
    grad_norm: 24,
    lr: 32,
    reserved1: 36,
    tokens: 40,
    target_tokens: 48,
    seconds: 56,
    forward_seconds: 64,
    backward_seconds: 72,
    optimizer_seconds: 80,
}

layout! {
    mt_eval_stats, size 40, align 8,
    struct_size: 0,
    reserved0: 4,
    loss: 8,
    tokens: 16,
    target_tokens: 24,
    seconds: 32,
}

layout! {
    mt_timeline, size 128, align 8,
    struct_size: 0,
    n_visits: 4,
    step: 8,
    seconds: 16,
    busy_seconds: 24,
    wait_seconds: 32,
    h2d_seconds: 96,
    d2h_seconds: 104,
    h2d_bytes: 112,
    d2h_bytes: 120,
}

layout! {
    mt_timeline_visit, size 104, align 8,
    unit: 0,
    phase: 4,
    start: 8,
    end: 16,
    weights_start: 24,
    weights_end: 32,
    wait_seconds: 40,
}

layout! {
    mt_checkpoint_info, size 64, align 8,
    struct_size: 0,
    reserved0: 4,
    step: 8,
    data_position: 16,
    rng_state: 24,
    caller_json: 56,
}

layout! {
    mt_dataset_options, size 32, align 8,
    struct_size: 0,
    format: 4,
    vocab_size: 8,
    seq_len: 12,
    heldout_fraction: 16,
    reserved0: 20,
    seed: 24,
}

#[test]
fn constants() {
    // the wait arrays have room for causes added later
    assert_eq!(MT_WAIT_CAPACITY, 8);
    assert!(MT_WAIT_COUNT as usize <= MT_WAIT_CAPACITY);
    // callbacks are nullable function pointers, the size of a C pointer
    assert_eq!(size_of::<mt_log_fn>(), size_of::<*const u8>());
    assert_eq!(size_of::<mt_abort_fn>(), size_of::<*const u8>());
    assert_eq!(size_of::<mt_status>(), 4);
}
