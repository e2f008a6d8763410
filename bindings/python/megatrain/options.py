"""The option structs as Python classes, their enums, and plan().

Each class is the header's struct itself (a ctypes.Structure with the same
fields in the same order), so it goes to the library without a copy. Its
defaults are the C defaults: the constructor calls the library's own
mt_X_init_sized before applying the keyword arguments, so a default changed
in the library is the package's default too. Enum fields take the enum, its
name as a string in any case ("fp32", "CPU"), or the number; a misspelt
field name is a TypeError, not a silently new attribute."""

from __future__ import annotations

import ctypes
import enum
from typing import Any, Dict, Iterable, Optional

from . import _lib
from .errors import MegatrainError, check


class Arch(enum.IntEnum):
    """mt_arch: the model family."""
    LLAMA = 0
    QWEN2 = 1
    MISTRAL = 2
    QWEN3 = 3
    PHI3 = 4
    GEMMA2 = 5
    GEMMA3 = 6
    QWEN3_MOE = 7
    MIXTRAL = 8
    QWEN2_MOE = 9
    GPT_OSS = 10
    DEEPSEEK_V3 = 11
    DEEPSEEK_V2 = 12
    LLAMA4 = 13


class Precision(enum.IntEnum):
    """mt_precision: BF16 (the default), FP32 (the reference) or LEAN (6.05 bytes of state a parameter)."""
    BF16 = 0
    FP32 = 1
    LEAN = 2


class RopeScaling(enum.IntEnum):
    """mt_rope_scaling."""
    NONE = 0
    LLAMA3 = 1
    LINEAR = 2
    YARN = 3
    LONGROPE = 4


class MoeScoring(enum.IntEnum):
    """mt_moe_scoring: how a router's logits become expert scores."""
    SOFTMAX = 0
    SIGMOID = 1


class Backend(enum.IntEnum):
    """mt_backend: AUTO is CUDA where a usable GPU is present, else CPU."""
    AUTO = 0
    CPU = 1
    CUDA = 2


class Placement(enum.IntEnum):
    """mt_placement of activation checkpoints."""
    AUTO = 0
    DEVICE = 1
    HOST = 2


class Pinning(enum.IntEnum):
    """mt_pinning of host tiles."""
    AUTO = 0
    ALWAYS = 1
    NEVER = 2


class Recompute(enum.IntEnum):
    """mt_recompute: what the backward recomputes."""
    AUTO = 0
    FULL = 1


class Attention(enum.IntEnum):
    """mt_attention: which attention the CUDA backend runs."""
    AUTO = 0
    KERNELS = 1
    CUDNN = 2


class WeightFetch(enum.IntEnum):
    """mt_weight_fetch: how each GPU of a model on several receives a unit's weights."""
    AUTO = 0
    WHOLE = 1
    SLICES = 2


class LogLevel(enum.IntEnum):
    """mt_log_level."""
    DEBUG = 0
    INFO = 1
    WARN = 2
    ERROR = 3


class LRSchedule(enum.IntEnum):
    """mt_lr_schedule: linear warm-up, then constant or cosine decay."""
    CONSTANT = 0
    COSINE = 1


class TokenFormat(enum.IntEnum):
    """mt_token_format of a token file; DOCS is a document file with a loss mask."""
    AUTO = 0
    U16 = 1
    U32 = 2
    LLMC = 3
    DOCS = 4


class Split(enum.IntEnum):
    """mt_split: the training windows or the held-out ones."""
    TRAIN = 0
    HELDOUT = 1


def to_enum(cls, value):
    """value as a member of the enum cls: a member, its name in any case, or its number."""
    if isinstance(value, str):
        try:
            return cls[value.upper().replace("-", "_")]
        except KeyError:
            raise ValueError(f"{value!r} is not a {cls.__name__}: one of "
                             f"{', '.join(m.name.lower() for m in cls)}") from None
    try:
        return cls(value)
    except ValueError:
        return int(value)  # a value newer than this package: the library judges it


class _Options:
    """What the option classes add to their struct: enum fields, refusal of
    unknown names, a repr that shows what differs from the defaults."""

    _enums_: Dict[str, Any] = {}
    _hidden_ = ("struct_size",)

    def __setattr__(self, name, value):
        if name.startswith("_"):
            object.__setattr__(self, name, value)
            return
        if name not in self._names():
            raise TypeError(f"{type(self).__name__} has no field {name!r}")
        if name in self._enums_:
            value = to_enum(self._enums_[name], value)
        if isinstance(value, (list, tuple)) and not isinstance(value, ctypes.Array):
            array = getattr(self, name)
            if len(value) > len(array):
                raise ValueError(f"{name} holds at most {len(array)} values")
            for i in range(len(array)):
                array[i] = value[i] if i < len(value) else 0
            return
        super().__setattr__(name, value)

    def __getattribute__(self, name):
        value = super().__getattribute__(name)
        if not name.startswith("_") and name in type(self)._enums_:
            try:
                return type(self)._enums_[name](value)
            except ValueError:
                return value
        return value

    @classmethod
    def _names(cls):
        return [f[0] for f in cls._fields_]

    def to_dict(self) -> Dict[str, Any]:
        """Every field but struct_size and the reserved ones, arrays as lists."""
        out = {}
        for name in self._names():
            if name in self._hidden_ or name.startswith("reserved"):
                continue
            v = getattr(self, name)
            out[name] = list(v) if isinstance(v, ctypes.Array) else v
        return out

    def copy(self):
        """An independent copy."""
        return type(self).from_buffer_copy(self)

    def __eq__(self, other):
        return type(other) is type(self) and bytes(self) == bytes(other)

    def __repr__(self):
        default = type(self)()
        changed = []
        for name, v in self.to_dict().items():
            d = getattr(default, name)
            if isinstance(d, ctypes.Array):
                d = list(d)
            if v != d:
                changed.append(f"{name}={v.name.lower() if isinstance(v, enum.Enum) else v!r}")
        return f"{type(self).__name__}({', '.join(changed)})"


class ModelConfig(_Options, _lib.ModelConfigStruct):
    """mt_model_config: the shape of a model, its field names those of Hugging
    Face's config.json. The defaults are the library's (a small bf16 Llama:
    vocab 32000, hidden 512, 8 layers); ``ModelConfig.from_pretrained(folder)``
    reads a model folder's config.json instead.

    >>> ModelConfig(vocab_size=32, hidden_size=64, num_hidden_layers=2, precision="fp32")
    """

    _enums_ = {"arch": Arch, "precision": Precision, "rope_scaling": RopeScaling, "moe_scoring": MoeScoring}

    @classmethod
    def from_pretrained(cls, folder, **fields) -> "ModelConfig":
        """The config.json of a Hugging Face model folder (mt_config_load).

        precision, seed and initializer_range are not in the file: give them
        here (with any other field to change after reading)."""
        cfg = cls(**{k: v for k, v in fields.items() if k in ("precision", "seed", "initializer_range")})
        check(_lib.lib.mt_config_load(ctypes.byref(cfg), _lib.fsencode(folder)))
        for k, v in fields.items():
            setattr(cfg, k, v)
        return cfg

    @classmethod
    def example(cls, arch, **fields) -> "ModelConfig":
        """The shape of a family's example checkpoint (mt_family_example), then fields."""
        cfg = cls(**{k: v for k, v in fields.items() if k in ("precision", "seed", "initializer_range")})
        check(_lib.lib.mt_family_example(ctypes.byref(cfg), int(to_enum(Arch, arch))))
        for k, v in fields.items():
            setattr(cfg, k, v)
        return cfg


class OffloadPolicy(_Options, _lib.OffloadPolicyStruct):
    """mt_offload_policy: where state lives and what runs it. Defaults: backend
    AUTO (CUDA when a usable GPU is present), device 0, budgets from the
    machine, all cores. ``devices=[0, 1]`` trains on several GPUs of the host.

    The log and abort callbacks are not set here: give ``log=`` and
    ``abort=`` to Model, which wires them (and Ctrl-C) itself."""

    _enums_ = {"backend": Backend, "activations": Placement, "pin_host": Pinning, "log_level": LogLevel,
               "recompute": Recompute, "attention": Attention, "weight_fetch": WeightFetch}
    _hidden_ = ("struct_size", "log_callback", "log_user_data", "abort_callback", "abort_user_data")

    def __setattr__(self, name, value):
        if name == "devices" and not isinstance(value, ctypes._Pointer):
            ids = list(value or [])
            array = (ctypes.c_int32 * max(len(ids), 1))(*ids)
            object.__setattr__(self, "_devices_keep", array)  # the struct points into it
            _lib.OffloadPolicyStruct.devices.__set__(self, ctypes.cast(array, ctypes.POINTER(ctypes.c_int32))
                                                     if ids else None)
            self.num_devices = len(ids)
            return
        if name in ("log_callback", "abort_callback", "log_user_data", "abort_user_data"):
            raise TypeError(f"give the callback to Model (log=, abort=), not OffloadPolicy.{name}")
        super().__setattr__(name, value)

    def to_dict(self):
        out = super().to_dict()
        out["devices"] = [self.devices[i] for i in range(self.num_devices)] if self.devices else []
        return out

    def copy(self):
        c = super().copy()
        if self.devices:
            c.devices = [self.devices[i] for i in range(self.num_devices)]
        return c


class OptimConfig(_Options, _lib.OptimConfigStruct):
    """mt_optim_config: AdamW as torch.optim.AdamW, and the learning-rate
    schedule. Defaults: cosine, lr 3e-4, betas (0.9, 0.95), eps 1e-8,
    weight_decay 0.1, grad_clip 1.0, min_lr_ratio 0.1, no warm-up, 1000 steps."""

    _enums_ = {"schedule": LRSchedule}

    def lr_at(self, step: int) -> float:
        """The learning rate of 0-based step (mt_lr_at); NaN for an invalid config."""
        return _lib.lib.mt_lr_at(ctypes.byref(self), step)


class BatchShape(_Options, _lib.BatchShapeStruct):
    """mt_batch_shape: one optimizer step's batch, for plan(). Defaults: 1
    sequence of 1024 tokens, 1 micro-batch."""


class DatasetOptions(_Options, _lib.DatasetOptionsStruct):
    """mt_dataset_options. Defaults: AUTO format, no vocabulary check, seq_len
    1024, 1% held out, seed 1."""

    _enums_ = {"format": TokenFormat}


class MemoryPlan(_Options, _lib.MemoryPlanStruct):
    """mt_memory_plan: the bytes per tier a model would use (plan())."""

    _enums_ = {"backend": Backend, "activations": Placement}

    def __repr__(self):
        gib = 1 << 30
        return (f"MemoryPlan(backend={self.backend.name.lower()}, num_params={self.num_params}, "
                f"host={(self.host_pinned_bytes + self.host_pageable_bytes) / gib:.3f} GiB, "
                f"gpu={self.gpu_bytes / gib:.3f} GiB)")


def _fill(cls, given, fields):
    """given (an instance, or None) copied, with fields applied: the struct a call takes."""
    out = given.copy() if given is not None else cls()
    for k, v in fields.items():
        setattr(out, k, v)
    return out


def split_fields(fields: Dict[str, Any], *classes) -> Iterable[Dict[str, Any]]:
    """fields divided among the classes whose struct has each name; TypeError for a name none has."""
    parts = [dict() for _ in classes]
    for k, v in fields.items():
        for part, cls in zip(parts, classes):
            if k in cls._names() or (cls is OffloadPolicy and k == "devices"):
                part[k] = v
                break
        else:
            raise TypeError(f"unknown option {k!r} (not a field of {', '.join(c.__name__ for c in classes)})")
    return parts


def plan(config: Optional[ModelConfig] = None, policy: Optional[OffloadPolicy] = None,
         shape: Optional[BatchShape] = None, **fields) -> MemoryPlan:
    """The memory a model would use, computed without allocating (mt_plan).

    Keyword arguments are fields of ModelConfig, OffloadPolicy or BatchShape
    (``plan(cfg, backend="cpu", seq_len=2048, micro_batch_size=4)``). Without
    a shape (and no shape fields) the plan is of the persistent state alone.
    A plan over budget raises HostBudgetError or GPUBudgetError, whose
    ``plan`` attribute holds the numbers all the same."""
    cf, pf, sf = split_fields(fields, ModelConfig, OffloadPolicy, BatchShape)
    cfg = _fill(ModelConfig, config, cf)
    pol = _fill(OffloadPolicy, policy, pf)
    shp = _fill(BatchShape, shape, sf) if (shape is not None or sf) else None
    out = MemoryPlan()
    st = _lib.lib.mt_plan(ctypes.byref(out), ctypes.byref(cfg), ctypes.byref(pol),
                          ctypes.byref(shp) if shp is not None else None)
    try:
        check(st)
    except MegatrainError as e:
        e.plan = out
        raise
    return out


class FamilyInfo:
    """One family the library trains (mt_family_get)."""

    def __init__(self, s):
        self.arch = to_enum(Arch, s.arch)
        self.name = _lib.text(s.name)
        self.display_name = _lib.text(s.display_name)
        self.architecture = _lib.text(s.architecture)
        self.model_type = _lib.text(s.model_type)
        self.layer_template = _lib.text(s.layer_template)
        self.particular = _lib.text(s.particular)
        self.example = _lib.text(s.example)

    def __repr__(self):
        return f"FamilyInfo({self.name!r}, {self.architecture!r}, example={self.example!r})"


def families() -> list:
    """The families this library trains, in the order of its lists."""
    out = []
    for i in range(_lib.lib.mt_family_count()):
        s = _lib.FamilyInfoStruct()
        check(_lib.lib.mt_family_get(ctypes.byref(s), i))
        out.append(FamilyInfo(s))
    return out
