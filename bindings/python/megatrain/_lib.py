"""The C library through ctypes: where it is found, its structs as the header
lays them out, and the prototype of every function the package calls.

Nothing here is public; the rest of the package wraps it. The structs mirror
include/megatrain.h field for field (the tests compare every size and offset
with the C compiler's), so a pointer to one can be handed to the library as
it is. Calls go through ctypes.CDLL, which releases the GIL for the length
of each foreign call: a long step does not hold up the process's other
Python threads."""

from __future__ import annotations

import ctypes
import os
import subprocess
from ctypes import (POINTER, c_char_p, c_double, c_float, c_int, c_int32, c_size_t, c_uint8, c_uint32, c_uint64,
                    c_void_p)

from ._version import MIN_LIBRARY_VERSION, __version__

#: The SONAME this package binds: the library's ABI major version.
SONAME = "libmegatrain.so.0"


def _version_tuple(number: int) -> tuple:
    return (number // 10000, number // 100 % 100, number % 100)


def _candidates() -> list:
    """Where to look for the library, in order, with why each place is tried.

    1. MEGATRAIN_LIBRARY: the caller names the file and nothing else is tried.
    2. The package's own copy (a wheel built with the library inside it).
    3. pkg-config's libdir for megatrain (PKG_CONFIG_PATH as for C programs).
    4. The system's loader (ldconfig's cache, LD_LIBRARY_PATH).
    """
    named = os.environ.get("MEGATRAIN_LIBRARY")
    if named:
        return [(named, "MEGATRAIN_LIBRARY")]
    found = []
    here = os.path.dirname(os.path.abspath(__file__))
    for name in (SONAME, "libmegatrain.so"):
        path = os.path.join(here, name)
        if os.path.exists(path):
            found.append((path, "the package's own copy"))
    try:
        libdir = subprocess.run(["pkg-config", "--variable=libdir", "megatrain"], capture_output=True, text=True,
                                timeout=30, check=False)
        if libdir.returncode == 0 and libdir.stdout.strip():
            found.append((os.path.join(libdir.stdout.strip(), SONAME), "pkg-config's libdir"))
    except (OSError, subprocess.SubprocessError):
        pass  # no pkg-config: the loader's own search remains
    found.append((SONAME, "the system's library path"))
    return found


def _load():
    tried = []
    for path, why in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            tried.append(f"{path} ({why}): {e}")
            continue
        return lib, path
    raise ImportError("megatrain: cannot load libmegatrain (" + SONAME + "); tried:\n  " + "\n  ".join(tried) +
                      "\nInstall the library (make install), set PKG_CONFIG_PATH to its lib/pkgconfig, or set "
                      "MEGATRAIN_LIBRARY to the path of libmegatrain.so.0")


lib, path = _load()

lib.mt_version_number.restype = c_uint32
lib.mt_version_number.argtypes = []
lib.mt_version_string.restype = c_char_p
lib.mt_version_string.argtypes = []
VERSION_NUMBER = lib.mt_version_number()
if VERSION_NUMBER < MIN_LIBRARY_VERSION:
    raise ImportError(
        "megatrain %s needs libmegatrain %d.%d.%d or newer, and %s is %s: install a newer libmegatrain, or point "
        "MEGATRAIN_LIBRARY at one" % ((__version__,) + _version_tuple(MIN_LIBRARY_VERSION) +
                                      (path, lib.mt_version_string().decode())))
if VERSION_NUMBER // 10000 != MIN_LIBRARY_VERSION // 10000:
    raise ImportError("megatrain %s binds libmegatrain %d.x, and %s is %s" %
                      (__version__, MIN_LIBRARY_VERSION // 10000, path, lib.mt_version_string().decode()))

mt_status = c_int
mt_log_fn = ctypes.CFUNCTYPE(None, c_int, c_char_p, c_void_p)
mt_abort_fn = ctypes.CFUNCTYPE(c_int, c_void_p)
mt_chat_text_fn = ctypes.CFUNCTYPE(c_int, c_void_p, POINTER(ctypes.c_char), c_size_t, POINTER(c_size_t), c_size_t)


class Struct(ctypes.Structure):
    """An option or result struct of the header: struct_size first, filled by
    the library's own mt_X_init_sized so the defaults are the C defaults."""

    _init_ = None  # the name of the library's init function

    def __init__(self, **fields):
        super().__init__()
        getattr(lib, self._init_)(ctypes.byref(self), ctypes.sizeof(self))
        for name, value in fields.items():
            setattr(self, name, value)


class ModelConfigStruct(Struct):
    _init_ = "mt_model_config_init_sized"
    _fields_ = [
        ("struct_size", c_uint32), ("arch", c_uint32), ("vocab_size", c_uint32), ("hidden_size", c_uint32),
        ("intermediate_size", c_uint32), ("num_hidden_layers", c_uint32), ("num_attention_heads", c_uint32),
        ("num_key_value_heads", c_uint32), ("head_dim", c_uint32), ("max_position_embeddings", c_uint32),
        ("rms_norm_eps", c_float), ("rope_theta", c_float), ("rope_scaling", c_uint32), ("rope_factor", c_float),
        ("rope_low_freq_factor", c_float), ("rope_high_freq_factor", c_float),
        ("rope_original_max_position", c_uint32), ("attention_bias", c_uint32), ("tie_word_embeddings", c_uint32),
        ("precision", c_uint32), ("seed", c_uint64), ("initializer_range", c_float), ("reserved0", c_uint32),
        ("sliding_window", c_uint32), ("sliding_window_pattern", c_uint32), ("max_window_layers", c_uint32),
        ("reserved1", c_uint32),
        ("query_pre_attn_scalar", c_float), ("rope_local_base_freq", c_float), ("attn_logit_softcapping", c_float),
        ("final_logit_softcapping", c_float),
        ("num_experts", c_uint32), ("num_experts_per_tok", c_uint32), ("moe_intermediate_size", c_uint32),
        ("norm_topk_prob", c_uint32), ("decoder_sparse_step", c_uint32), ("output_router_logits", c_uint32),
        ("router_aux_loss_coef", c_float), ("reserved2", c_uint32), ("mlp_only_layers", c_uint64 * 4),
        ("pad_token_id", c_int32), ("reserved3", c_uint32),
        ("shared_expert_intermediate_size", c_uint32), ("shared_expert_gate", c_uint32),
        ("partial_rotary_factor", c_float), ("rope_attention_factor", c_float), ("rope_beta_fast", c_float),
        ("rope_beta_slow", c_float), ("rope_mscale", c_float), ("rope_mscale_all_dim", c_float),
        ("rope_no_truncate", c_uint32), ("rope_n_factors", c_uint32), ("rope_short_factor", c_float * 128),
        ("rope_long_factor", c_float * 128),
        ("kv_lora_rank", c_uint32), ("q_lora_rank", c_uint32), ("qk_nope_head_dim", c_uint32),
        ("qk_rope_head_dim", c_uint32), ("v_head_dim", c_uint32), ("rope_interleave", c_uint32),
        ("n_group", c_uint32), ("topk_group", c_uint32), ("routed_scaling_factor", c_float),
        ("moe_scoring", c_uint32),
        ("attention_chunk_size", c_uint32), ("qk_l2_norm", c_uint32), ("attn_temperature_floor", c_float),
        ("attn_temperature_scale", c_float), ("moe_input_weighted", c_uint32), ("reserved4", c_uint32),
        ("nope_layers", c_uint64 * 4),
    ]


class FamilyInfoStruct(Struct):
    _init_ = "mt_family_info_init_sized"
    _fields_ = [("struct_size", c_uint32), ("arch", c_uint32), ("name", c_char_p), ("display_name", c_char_p),
                ("architecture", c_char_p), ("model_type", c_char_p), ("layer_template", c_char_p),
                ("particular", c_char_p), ("example", c_char_p)]


class OffloadPolicyStruct(Struct):
    _init_ = "mt_offload_policy_init_sized"
    _fields_ = [
        ("struct_size", c_uint32), ("backend", c_uint32), ("device", c_int32), ("weight_slots", c_uint32),
        ("gpu_budget_bytes", c_uint64), ("host_budget_bytes", c_uint64), ("numa_node", c_int32),
        ("optimizer_threads", c_uint32), ("activations", c_uint32), ("pin_host", c_uint32),
        ("log_callback", mt_log_fn), ("log_user_data", c_void_p), ("log_level", c_uint32), ("timeline", c_uint32),
        ("abort_callback", mt_abort_fn), ("abort_user_data", c_void_p), ("recompute", c_uint32),
        ("reserved1", c_uint32), ("attention", c_uint32), ("attention_flags", c_uint32), ("num_devices", c_uint32),
        ("weight_fetch", c_uint32), ("devices", POINTER(c_int32)),
    ]


class OptimConfigStruct(Struct):
    _init_ = "mt_optim_config_init_sized"
    _fields_ = [("struct_size", c_uint32), ("schedule", c_uint32), ("lr", c_float), ("beta1", c_float),
                ("beta2", c_float), ("eps", c_float), ("weight_decay", c_float), ("grad_clip", c_float),
                ("min_lr_ratio", c_float), ("warmup_steps", c_uint32), ("total_steps", c_uint32),
                ("reserved0", c_uint32)]


class BatchShapeStruct(Struct):
    _init_ = "mt_batch_shape_init_sized"
    _fields_ = [("struct_size", c_uint32), ("micro_batch_size", c_uint32), ("seq_len", c_uint32),
                ("num_micro_batches", c_uint32)]


class MemoryPlanStruct(Struct):
    _init_ = "mt_memory_plan_init_sized"
    _fields_ = [
        ("struct_size", c_uint32), ("backend", c_uint32), ("num_params", c_uint64), ("host_pinned_bytes", c_uint64),
        ("host_pageable_bytes", c_uint64), ("gpu_bytes", c_uint64), ("weight_bytes", c_uint64),
        ("grad_bytes", c_uint64), ("master_bytes", c_uint64), ("optim_bytes", c_uint64),
        ("activation_bytes", c_uint64), ("workspace_bytes", c_uint64), ("host_budget_bytes", c_uint64),
        ("gpu_budget_bytes", c_uint64), ("weight_slots", c_uint32), ("activations", c_uint32),
        ("num_units", c_uint32), ("reserved0", c_uint32), ("largest_unit_params", c_uint64),
        ("host_checkpoints", c_uint32), ("recomputed_checkpoints", c_uint32),
    ]


class BatchStruct(Struct):
    _init_ = "mt_batch_init_sized"
    _fields_ = [("struct_size", c_uint32), ("micro_batch_size", c_uint32), ("seq_len", c_uint32),
                ("num_micro_batches", c_uint32), ("tokens", POINTER(c_int32)), ("targets", POINTER(c_int32)),
                ("positions", POINTER(c_int32))]


class StepStatsStruct(Struct):
    _init_ = "mt_step_stats_init_sized"
    _fields_ = [("struct_size", c_uint32), ("reserved0", c_uint32), ("step", c_uint64), ("loss", c_double),
                ("grad_norm", c_double), ("lr", c_float), ("reserved1", c_uint32), ("tokens", c_uint64),
                ("target_tokens", c_uint64), ("seconds", c_double), ("forward_seconds", c_double),
                ("backward_seconds", c_double), ("optimizer_seconds", c_double)]


class EvalStatsStruct(Struct):
    _init_ = "mt_eval_stats_init_sized"
    _fields_ = [("struct_size", c_uint32), ("reserved0", c_uint32), ("loss", c_double), ("tokens", c_uint64),
                ("target_tokens", c_uint64), ("seconds", c_double)]


WAIT_CAPACITY = 8


class TimelineStruct(Struct):
    _init_ = "mt_timeline_init_sized"
    _fields_ = [("struct_size", c_uint32), ("n_visits", c_uint32), ("step", c_uint64), ("seconds", c_double),
                ("busy_seconds", c_double), ("wait_seconds", c_double * WAIT_CAPACITY), ("h2d_seconds", c_double),
                ("d2h_seconds", c_double), ("h2d_bytes", c_uint64), ("d2h_bytes", c_uint64)]


class TimelineVisitStruct(ctypes.Structure):
    """A fixed layout without struct_size (the header's mt_timeline_visit)."""
    _fields_ = [("unit", c_uint32), ("phase", c_uint32), ("start", c_double), ("end", c_double),
                ("weights_start", c_double), ("weights_end", c_double),
                ("wait_seconds", c_double * WAIT_CAPACITY)]


class CheckpointInfoStruct(Struct):
    _init_ = "mt_checkpoint_info_init_sized"
    _fields_ = [("struct_size", c_uint32), ("reserved0", c_uint32), ("step", c_uint64),
                ("data_position", c_uint64), ("rng_state", c_uint64 * 4), ("caller_json", c_char_p)]


class DatasetOptionsStruct(Struct):
    _init_ = "mt_dataset_options_init_sized"
    _fields_ = [("struct_size", c_uint32), ("format", c_uint32), ("vocab_size", c_uint32), ("seq_len", c_uint32),
                ("heldout_fraction", c_float), ("reserved0", c_uint32), ("seed", c_uint64)]


#: Every struct of the header that the package mirrors, by its C name (the tests compare their layouts).
STRUCTS = {
    "mt_model_config": ModelConfigStruct, "mt_family_info": FamilyInfoStruct,
    "mt_offload_policy": OffloadPolicyStruct, "mt_optim_config": OptimConfigStruct,
    "mt_batch_shape": BatchShapeStruct, "mt_memory_plan": MemoryPlanStruct, "mt_batch": BatchStruct,
    "mt_step_stats": StepStatsStruct, "mt_eval_stats": EvalStatsStruct, "mt_timeline": TimelineStruct,
    "mt_timeline_visit": TimelineVisitStruct, "mt_checkpoint_info": CheckpointInfoStruct,
    "mt_dataset_options": DatasetOptionsStruct,
}

P = c_void_p  # every handle is opaque
PP = POINTER(c_void_p)
I32P = POINTER(c_int32)
_PROTOTYPES = {
    # name: (restype, argtypes)
    "mt_status_str": (c_char_p, [c_int]),
    "mt_last_errmsg": (c_char_p, []),
    "mt_family_count": (c_uint32, []),
    "mt_family_get": (mt_status, [POINTER(FamilyInfoStruct), c_uint32]),
    "mt_family_example": (mt_status, [POINTER(ModelConfigStruct), c_uint32]),
    "mt_lr_at": (c_float, [POINTER(OptimConfigStruct), c_uint64]),
    "mt_plan": (mt_status, [POINTER(MemoryPlanStruct), POINTER(ModelConfigStruct), POINTER(OffloadPolicyStruct),
                            POINTER(BatchShapeStruct)]),
    "mt_model_create": (mt_status, [PP, POINTER(ModelConfigStruct), POINTER(OffloadPolicyStruct)]),
    "mt_model_destroy": (None, [P]),
    "mt_model_errmsg": (c_char_p, [P]),
    "mt_model_get_config": (mt_status, [P, POINTER(ModelConfigStruct)]),
    "mt_model_num_params": (c_uint64, [P]),
    "mt_model_backend": (c_int, [P]),
    "mt_step": (mt_status, [P, POINTER(BatchStruct), POINTER(OptimConfigStruct), POINTER(StepStatsStruct)]),
    "mt_eval": (mt_status, [P, POINTER(BatchStruct), POINTER(EvalStatsStruct)]),
    "mt_model_logits": (mt_status, [P, I32P, c_uint32, c_uint32, POINTER(c_float)]),
    "mt_model_timeline": (mt_status, [P, POINTER(TimelineStruct), POINTER(TimelineVisitStruct), c_uint32]),
    "mt_model_step_count": (c_uint64, [P]),
    "mt_config_load": (mt_status, [POINTER(ModelConfigStruct), c_char_p]),
    "mt_model_load": (mt_status, [P, c_char_p]),
    "mt_model_save": (mt_status, [P, c_char_p]),
    "mt_checkpoint_save": (mt_status, [P, c_char_p, POINTER(CheckpointInfoStruct)]),
    "mt_checkpoint_load": (mt_status, [P, c_char_p, POINTER(CheckpointInfoStruct)]),
    "mt_dataset_open": (mt_status, [PP, c_char_p, POINTER(DatasetOptionsStruct)]),
    "mt_dataset_close": (None, [P]),
    "mt_dataset_num_tokens": (c_uint64, [P]),
    "mt_dataset_num_windows": (c_uint64, [P, c_int]),
    "mt_dataset_num_documents": (c_uint64, [P]),
    "mt_dataset_padding": (c_uint64, [P, c_int]),
    "mt_dataset_read": (mt_status, [P, c_int, c_uint64, c_uint32, I32P, I32P]),
    "mt_doc_writer_create": (mt_status, [PP, c_char_p, c_uint32]),
    "mt_doc_writer_append": (mt_status, [P, I32P, POINTER(c_uint8), c_size_t]),
    "mt_doc_writer_end_document": (mt_status, [P]),
    "mt_doc_writer_finish": (mt_status, [P]),
    "mt_doc_writer_free": (None, [P]),
    "mt_doc_writer_num_tokens": (c_uint64, [P]),
    "mt_doc_writer_num_targets": (c_uint64, [P]),
    "mt_doc_writer_num_documents": (c_uint64, [P]),
    "mt_tokenizer_load": (mt_status, [PP, c_char_p]),
    "mt_tokenizer_free": (None, [P]),
    "mt_tokenizer_encode": (mt_status, [P, c_char_p, c_size_t, c_uint32, I32P, c_size_t, POINTER(c_size_t)]),
    "mt_tokenizer_decode": (mt_status, [P, I32P, c_size_t, c_uint32, c_void_p, c_size_t, POINTER(c_size_t)]),
    "mt_tokenizer_vocab_size": (c_uint32, [P]),
    "mt_tokenizer_token_to_id": (c_int32, [P, c_char_p]),
    "mt_tokenizer_id_to_token": (c_char_p, [P, c_int32]),
    "mt_chat_template_load": (mt_status, [PP, c_char_p]),
    "mt_chat_template_free": (None, [P]),
    "mt_chat_render": (mt_status, [P, c_char_p, c_char_p, c_uint32, c_void_p, c_size_t, POINTER(c_size_t)]),
    "mt_chat_render_learnt": (mt_status, [P, c_char_p, c_char_p, mt_chat_text_fn, c_void_p]),
    "mt_chat_end_of_turn": (mt_status, [P, c_char_p, c_void_p, c_size_t, POINTER(c_size_t)]),
}
for _name, (_res, _args) in _PROTOTYPES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args
for _struct in STRUCTS.values():
    if getattr(_struct, "_init_", None):
        _fn = getattr(lib, _struct._init_)
        _fn.restype = None
        _fn.argtypes = [c_void_p, c_uint32]


def fsencode(path) -> bytes:
    """A path argument as the library takes it (bytes, the file system's encoding)."""
    return os.fsencode(path)


def text(b) -> str:
    """A string from the library (UTF-8 as the header promises; never fails)."""
    return b.decode("utf-8", "replace") if b else ""


class Handle:
    """An owner of one library handle: close() frees it once (closing twice is
    harmless), ``with`` closes it, and so does garbage collection. A subclass
    sets _what (for the error a closed handle's calls raise) and _release(handle)."""

    _what = "handle"
    _handle = None

    def _release(self, handle) -> None:
        raise NotImplementedError

    def close(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            self._release(handle)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            self.close()

    def _h(self):
        if self._handle is None:
            raise ValueError("the %s is closed" % self._what)
        return self._handle
