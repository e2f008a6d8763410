"""libmegatrain from Python: train transformer language models whose state
lives in host memory, through the installed C library (ctypes, no compiled
extension).

    import megatrain
    with megatrain.Model.from_pretrained("Qwen3-0.6B", backend="cpu") as model:
        data = megatrain.Dataset("train.mt", seq_len=512)
        megatrain.train(model, data, max_steps=100, micro_batch_size=4, lr=1e-5)
        model.save("Qwen3-0.6B-tuned")

Model trains and evaluates; Dataset reads token and document files;
Tokenizer, ChatTemplate and prepare() turn text and chat data into document
files; plan() tells the memory a model would need. The option structs
(ModelConfig, OffloadPolicy, OptimConfig, DatasetOptions, BatchShape) take
their fields as keyword arguments, with the library's defaults. A failed
call raises a MegatrainError subclass (one per mt_status) carrying the
library's message. The library is found through MEGATRAIN_LIBRARY, the
package's own copy, pkg-config's libdir, or the system's library path."""

from ._version import __version__, MIN_LIBRARY_VERSION
from . import _lib
from .errors import (AbortedError, DeviceError, FormatError, GPUBudgetError, HostBudgetError, InternalError,
                     InvalidArgumentError, IOFailedError, MegatrainError, NoDeviceError, NonFiniteError,
                     OutOfGPUMemoryError, OutOfHostMemoryError, Status, StructSizeError, UnsupportedError,
                     status_str)
from .options import (Arch, Attention, Backend, BatchShape, DatasetOptions, FamilyInfo, LogLevel, LRSchedule,
                      MemoryPlan, ModelConfig, MoeScoring, OffloadPolicy, OptimConfig, Pinning, Placement,
                      Precision, Recompute, RopeScaling, Split, TokenFormat, WeightFetch, families, plan)
from .model import IGNORE_INDEX, Batch, CheckpointInfo, EvalStats, Model, StepStats, log_to_logging
from .data import Dataset, DocWriter
from .text import ChatTemplate, LearntText, PrepareStats, Tokenizer, eos_token, prepare
from .trainer import ProgressCallback, TrainerCallback, TrainerState, evaluate, train

#: The loaded library's version, "MAJOR.MINOR.PATCH".
library_version: str = _lib.text(_lib.lib.mt_version_string())
#: The path the library was loaded from.
library_path: str = _lib.path

__all__ = [
    "__version__", "library_version", "library_path", "MIN_LIBRARY_VERSION",
    "Model", "Batch", "StepStats", "EvalStats", "CheckpointInfo", "IGNORE_INDEX", "log_to_logging",
    "Dataset", "DocWriter", "Tokenizer", "ChatTemplate", "LearntText", "prepare", "PrepareStats", "eos_token",
    "train", "evaluate", "TrainerCallback", "TrainerState", "ProgressCallback",
    "ModelConfig", "OffloadPolicy", "OptimConfig", "DatasetOptions", "BatchShape", "MemoryPlan", "plan",
    "families", "FamilyInfo",
    "Arch", "Precision", "RopeScaling", "MoeScoring", "Backend", "Placement", "Pinning", "Recompute", "Attention",
    "WeightFetch", "LogLevel", "LRSchedule", "TokenFormat", "Split",
    "MegatrainError", "Status", "status_str", "InvalidArgumentError", "StructSizeError", "OutOfHostMemoryError",
    "HostBudgetError", "GPUBudgetError", "OutOfGPUMemoryError", "NoDeviceError", "DeviceError", "IOFailedError",
    "FormatError", "UnsupportedError", "NonFiniteError", "AbortedError", "InternalError",
]
