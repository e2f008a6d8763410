"""Model: a model's weights and optimizer state in host memory, and the
calls that train and evaluate it.

Every long call (step, eval, logits, load, save) runs with the GIL released,
so other Python threads keep running. The library polls the model's abort
callback before each micro-batch of each layer; the package wires it to
Ctrl-C: a KeyboardInterrupt during a call stops it there, leaves the model
exactly as it was before the call (the library's promise for an aborted
call), and is raised once the library has returned."""

from __future__ import annotations

import ctypes
import json
import signal
import threading
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional, Tuple

import numpy as np

from . import _lib
from .errors import Status, check, error_for
from .options import (Backend, LogLevel, ModelConfig, OffloadPolicy, OptimConfig, _fill, split_fields, to_enum)

#: Targets equal to this are not predicted (prompt tokens, padding), as in transformers.
IGNORE_INDEX = -100

_I32P = ctypes.POINTER(ctypes.c_int32)


def _int32(a, name) -> np.ndarray:
    """a as a C-contiguous int32 array: the array itself when it is one (the
    library reads the caller's memory, no copy), a copy otherwise."""
    out = np.ascontiguousarray(a, dtype=np.int32)
    if out.ndim == 0:
        raise ValueError(f"{name} must be an array of token ids, not a scalar")
    return out


class Batch:
    """One optimizer step's tokens (mt_batch): ``num_micro_batches`` micro-batches
    of ``micro_batch_size`` sequences of ``seq_len`` tokens.

    tokens, targets (and positions, for documents packed into sequences) are
    anything NumPy takes as an array of integers, of shape (n_seq, seq_len)
    or (num_micro_batches, micro_batch_size, seq_len); C-contiguous int32
    arrays are used in place, without a copy. targets holds the id to predict
    at each position, or IGNORE_INDEX. ``position`` is where a Dataset read
    the batch (the next batch starts at position + n_seq)."""

    __slots__ = ("tokens", "targets", "positions", "num_micro_batches", "position")

    def __init__(self, tokens, targets, positions=None, *, num_micro_batches: Optional[int] = None,
                 position: Optional[int] = None):
        tokens = _int32(tokens, "tokens")
        targets = _int32(targets, "targets")
        if tokens.ndim == 1:
            tokens, targets = tokens[None, :], targets[None, :] if targets.ndim == 1 else targets
        if tokens.ndim == 3:
            if num_micro_batches not in (None, tokens.shape[0]):
                raise ValueError(f"tokens hold {tokens.shape[0]} micro-batches, not {num_micro_batches}")
            num_micro_batches = tokens.shape[0]
        elif tokens.ndim != 2:
            raise ValueError(f"tokens must have 2 or 3 dimensions, not shape {tokens.shape}")
        num_micro_batches = num_micro_batches or 1
        if targets.size != tokens.size or targets.shape[-1] != tokens.shape[-1]:
            raise ValueError(f"targets of shape {targets.shape} for tokens of shape {tokens.shape}")
        n_seq = tokens.size // tokens.shape[-1]
        if n_seq % num_micro_batches:
            raise ValueError(f"{n_seq} sequences do not divide into {num_micro_batches} micro-batches")
        if positions is not None:
            positions = _int32(positions, "positions")
            if positions.size != tokens.size:
                raise ValueError(f"positions of shape {positions.shape} for tokens of shape {tokens.shape}")
        self.tokens, self.targets, self.positions = tokens, targets, positions
        self.num_micro_batches = num_micro_batches
        self.position = position

    @property
    def seq_len(self) -> int:
        return self.tokens.shape[-1]

    @property
    def micro_batch_size(self) -> int:
        return self.tokens.size // self.seq_len // self.num_micro_batches

    def __len__(self) -> int:
        """The number of sequences."""
        return self.tokens.size // self.seq_len

    def _struct(self) -> _lib.BatchStruct:
        b = _lib.BatchStruct()
        b.micro_batch_size = self.micro_batch_size
        b.seq_len = self.seq_len
        b.num_micro_batches = self.num_micro_batches
        b.tokens = self.tokens.ctypes.data_as(_I32P)
        b.targets = self.targets.ctypes.data_as(_I32P)
        if self.positions is not None:
            b.positions = self.positions.ctypes.data_as(_I32P)
        return b

    def __repr__(self):
        return (f"Batch({self.num_micro_batches} x {self.micro_batch_size} sequences of {self.seq_len} tokens"
                + (f", position {self.position}" if self.position is not None else "") + ")")


@dataclass(frozen=True)
class StepStats:
    """What one optimizer step did (mt_step_stats)."""
    step: int               #: optimizer steps taken, this one included
    loss: float             #: mean cross-entropy over the step's target tokens
    grad_norm: float        #: global L2 norm of the gradients, before clipping
    lr: float               #: the learning rate this step used
    tokens: int
    target_tokens: int      #: tokens whose target was not ignored
    seconds: float          #: wall time; forward + backward + optimizer
    forward_seconds: float
    backward_seconds: float
    optimizer_seconds: float


@dataclass(frozen=True)
class EvalStats:
    """The loss of a model on a batch (mt_eval_stats)."""
    loss: float
    tokens: int
    target_tokens: int
    seconds: float


@dataclass(frozen=True)
class CheckpointInfo:
    """What a resume checkpoint carried besides the model (mt_checkpoint_info)."""
    step: int                       #: the optimizer steps the model had taken
    data_position: int              #: the caller's place in its data
    rng_state: Tuple[int, int, int, int]
    state: Optional[Any]            #: the caller's own JSON-able state, or None


def _stats(cls, s):
    return cls(**{f: getattr(s, f) for f in cls.__dataclass_fields__})


def log_to_logging(level: LogLevel, text: str) -> None:
    """A log callback that hands the library's lines to Python's logging, under
    the logger "megatrain": ``Model(..., log=megatrain.log_to_logging)``."""
    import logging
    logging.getLogger("megatrain").log({LogLevel.DEBUG: logging.DEBUG, LogLevel.INFO: logging.INFO,
                                        LogLevel.WARN: logging.WARNING}.get(level, logging.ERROR), "%s", text)


class _SigintGuard:
    """For the length of one call on the main thread: Ctrl-C sets the model's
    flag, which its abort callback reads, instead of raising inside a ctypes
    callback (where the exception would be printed and lost). Only Python's
    default handler is replaced; a program's own SIGINT handler is left alone
    and stays in charge."""

    __slots__ = ("model", "previous")

    def __init__(self, model):
        self.model = model
        self.previous = None

    def __enter__(self):
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            model = self.model

            def on_sigint(signum, frame):
                model._sigint = True
            self.previous = signal.signal(signal.SIGINT, on_sigint)
        return self

    def __exit__(self, *exc):
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


class Model:
    """A model: its weights, gradients and AdamW state in host memory, trained
    on the policy's backend (mt_model_create).

    Build one from a config and a policy, or from keyword fields of either::

        model = megatrain.Model(vocab_size=32, hidden_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2,
                                precision="fp32", backend="cpu")
        model = megatrain.Model.from_pretrained("Qwen3-0.6B", backend="cpu")

    Arguments:
        config: a ModelConfig (the library's defaults when None).
        policy: an OffloadPolicy (the library's defaults when None).
        optim: the OptimConfig that step() uses when given none (the
            library's defaults when None; ``model.optim`` can be changed).
        log: called as log(level, text) with each line the library logs at
            the policy's log_level and above (stderr for warnings when None);
            ``megatrain.log_to_logging`` hands them to the logging module.
        abort: called before each micro-batch of each layer during step,
            eval and logits; returning true stops the call with AbortedError,
            the model as before it.
        **fields: fields of ModelConfig and OffloadPolicy, applied on top.

    Use it in a ``with`` block, or call close(): the memory is the library's
    and can be large. One model must not be used by two threads at once: a
    second thread's call raises RuntimeError rather than waiting; different
    models may train in different threads at the same time."""

    def __init__(self, config: Optional[ModelConfig] = None, policy: Optional[OffloadPolicy] = None, *,
                 optim: Optional[OptimConfig] = None, log: Optional[Callable[[LogLevel, str], None]] = None,
                 abort: Optional[Callable[[], bool]] = None, **fields):
        cf, pf = split_fields(fields, ModelConfig, OffloadPolicy)
        cfg = _fill(ModelConfig, config, cf)
        pol = _fill(OffloadPolicy, policy, pf)
        self._handle = None
        self._busy = threading.Lock()
        self._interrupted = threading.Event()
        self._sigint = False
        self._pending: Optional[BaseException] = None
        self.abort = abort
        self.log = log
        self.optim = optim.copy() if optim is not None else OptimConfig()
        # The callbacks reach the model through a weak reference: the ctypes
        # function objects live as long as the model, and must not keep it alive.
        ref = weakref.ref(self)

        def on_abort(_user):
            m = ref()
            if m is None:
                return 0
            try:
                if m._sigint or m._interrupted.is_set():
                    return 1
                return 1 if m.abort is not None and m.abort() else 0
            except BaseException as e:  # raised once the library has returned
                if m._pending is None:
                    m._pending = e
                return 1

        def on_log(level, text, _user):
            m = ref()
            if m is None or m.log is None:
                return
            try:
                m.log(to_enum(LogLevel, level), _lib.text(text))
            except BaseException as e:
                if m._pending is None:
                    m._pending = e

        self._abort_fn = _lib.mt_abort_fn(on_abort)
        _lib.OffloadPolicyStruct.abort_callback.__set__(pol, self._abort_fn)
        if log is not None:
            self._log_fn = _lib.mt_log_fn(on_log)
            _lib.OffloadPolicyStruct.log_callback.__set__(pol, self._log_fn)
        handle = ctypes.c_void_p()
        check(_lib.lib.mt_model_create(ctypes.byref(handle), ctypes.byref(cfg), ctypes.byref(pol)))
        self._handle = handle

    @classmethod
    def from_pretrained(cls, folder, policy: Optional[OffloadPolicy] = None, **fields) -> "Model":
        """A model with the config and weights of a Hugging Face model folder
        (mt_config_load, mt_model_create, mt_model_load). Keyword arguments:
        fields of ModelConfig (precision, seed, ...) and OffloadPolicy, and
        Model's optim, log and abort."""
        own = {k: fields.pop(k) for k in ("optim", "log", "abort") if k in fields}
        cf, pf = split_fields(fields, ModelConfig, OffloadPolicy)
        model = cls(ModelConfig.from_pretrained(folder, **cf), policy, **pf, **own)
        try:
            model.load(folder)
        except BaseException:
            model.close()
            raise
        return model

    # -- the handle ----------------------------------------------------------------------

    def close(self) -> None:
        """Frees everything the model owns (mt_model_destroy). Closing twice is
        harmless; any other call on a closed model raises ValueError."""
        if self._handle is None:
            return
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("the model is in use by another thread: close it once that call has returned")
        try:
            handle, self._handle = self._handle, None
            _lib.lib.mt_model_destroy(handle)
        finally:
            self._busy.release()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            try:
                self.close()
            except Exception:
                pass  # interpreter shutdown, or another thread's call: the process frees it

    @property
    def closed(self) -> bool:
        return self._handle is None

    def _call(self, fn, *args, interruptible=False):
        """One library call on the model: refuses a closed model and a second
        thread, and raises what the call (or a callback during it) failed with."""
        if self._handle is None:
            raise ValueError("the model is closed")
        if not self._busy.acquire(blocking=False):
            raise RuntimeError("the model is in use by another thread (one model, one thread at a time)")
        try:
            self._sigint = False
            self._pending = None
            if interruptible:
                with _SigintGuard(self):
                    st = fn(self._handle, *args)
            else:
                st = fn(self._handle, *args)
            pending, sigint = self._pending, self._sigint
            self._pending, self._sigint = None, False
            if st == Status.ABORTED:
                self._interrupted.clear()  # the request is answered
            if pending is not None:
                # A callback raised (KeyboardInterrupt, or the caller's own
                # exception): the call stopped, and this is why.
                raise pending
            if st == Status.ABORTED and sigint:
                raise KeyboardInterrupt
            if st != 0:
                raise error_for(st, _lib.text(_lib.lib.mt_model_errmsg(self._handle)))
            if sigint:
                raise KeyboardInterrupt  # Ctrl-C after the last poll: the call is done, then the interrupt
        finally:
            self._busy.release()

    def interrupt(self) -> None:
        """Asks the call running on this model in another thread, or the next
        call if none is running, to stop: it raises AbortedError there, the
        model as before that call. Safe from any thread: a training loop in a
        worker thread is stopped this way (Ctrl-C reaches only the main one)."""
        self._interrupted.set()

    # -- what the model is ---------------------------------------------------------------

    @property
    def config(self) -> ModelConfig:
        """The configuration the model was created with (mt_model_get_config)."""
        out = ModelConfig()
        self._call(_lib.lib.mt_model_get_config, ctypes.byref(out))
        return out

    @property
    def num_params(self) -> int:
        """The number of trainable parameters."""
        return self._query(_lib.lib.mt_model_num_params)

    @property
    def backend(self) -> Backend:
        """The backend in use: Backend.CPU or Backend.CUDA."""
        return to_enum(Backend, self._query(_lib.lib.mt_model_backend))

    @property
    def step_count(self) -> int:
        """Optimizer steps the model has taken."""
        return self._query(_lib.lib.mt_model_step_count)

    def _query(self, fn):
        if self._handle is None:
            raise ValueError("the model is closed")
        return fn(self._handle)

    def __repr__(self):
        if self._handle is None:
            return "<megatrain.Model (closed)>"
        if self._busy.locked():
            return "<megatrain.Model (busy in a call)>"
        c = self.config
        return (f"<megatrain.Model {c.arch.name.lower()} {self.num_params} parameters, {c.num_hidden_layers} "
                f"layers, {c.precision.name.lower()} on {self.backend.name.lower()}, step {self.step_count}>")

    # -- training ------------------------------------------------------------------------

    def _batch(self, tokens, targets, positions, num_micro_batches) -> Batch:
        if isinstance(tokens, Batch):
            if targets is not None or positions is not None:
                raise TypeError("give a Batch alone, or tokens and targets")
            return tokens
        if targets is None:
            raise TypeError("targets are needed with tokens (or give a Batch)")
        return Batch(tokens, targets, positions, num_micro_batches=num_micro_batches)

    def step(self, tokens, targets=None, *, positions=None, num_micro_batches: Optional[int] = None,
             optim: Optional[OptimConfig] = None) -> StepStats:
        """One optimizer step (mt_step): forward and backward over every
        micro-batch, global-norm clipping, AdamW at the learning rate of the
        model's step counter under optim's schedule (self.optim when None).

        tokens: a Batch, or token ids with targets (see Batch). On failure the
        model is as before the call: NonFiniteError for a NaN or infinite loss
        or gradient norm, AbortedError when abort or interrupt() stopped it,
        KeyboardInterrupt for Ctrl-C."""
        batch = self._batch(tokens, targets, positions, num_micro_batches)
        b = batch._struct()
        opt = optim if optim is not None else self.optim
        stats = _lib.StepStatsStruct()
        self._call(_lib.lib.mt_step, ctypes.byref(b), ctypes.byref(opt), ctypes.byref(stats), interruptible=True)
        return _stats(StepStats, stats)

    def eval(self, tokens, targets=None, *, positions=None, num_micro_batches: Optional[int] = None) -> EvalStats:
        """The loss on a batch, changing nothing (mt_eval)."""
        batch = self._batch(tokens, targets, positions, num_micro_batches)
        b = batch._struct()
        stats = _lib.EvalStatsStruct()
        self._call(_lib.lib.mt_eval, ctypes.byref(b), ctypes.byref(stats), interruptible=True)
        return _stats(EvalStats, stats)

    def logits(self, tokens, *, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Next-token logits after each sequence (mt_model_logits): tokens of
        shape (n_seq, seq_len) give float32 logits of shape (n_seq,
        vocab_size); one sequence of shape (seq_len,) gives (vocab_size,).

        out: an array to write them into (float32, C-contiguous, that shape),
        which the library fills in place; a new array otherwise."""
        t = _int32(tokens, "tokens")
        one = t.ndim == 1
        if one:
            t = t[None, :]
        if t.ndim != 2:
            raise ValueError(f"tokens must be (n_seq, seq_len), not shape {t.shape}")
        vocab = self.config.vocab_size
        shape = (vocab,) if one else (t.shape[0], vocab)
        if out is None:
            out = np.empty(shape, dtype=np.float32)
        elif out.dtype != np.float32 or not out.flags.c_contiguous or out.shape != shape or not out.flags.writeable:
            raise ValueError(f"out must be a writable C-contiguous float32 array of shape {shape}")
        self._call(_lib.lib.mt_model_logits, t.ctypes.data_as(_I32P), t.shape[0], t.shape[1],
                   out.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), interruptible=True)
        return out

    def lr_at(self, step: Optional[int] = None, optim: Optional[OptimConfig] = None) -> float:
        """The learning rate of a step (the next one when None) under optim (self.optim when None)."""
        return (optim or self.optim).lr_at(self.step_count if step is None else step)

    def timeline(self, max_visits: int = 4096):
        """The CUDA timeline of the last step (mt_model_timeline): a dict of its
        totals and a list of its unit visits. UnsupportedError unless the
        policy's timeline is set and the backend is CUDA."""
        t = _lib.TimelineStruct()
        visits = (_lib.TimelineVisitStruct * max(max_visits, 1))()
        self._call(_lib.lib.mt_model_timeline, ctypes.byref(t), visits, max_visits)
        total = {f: (list(getattr(t, f)) if f == "wait_seconds" else getattr(t, f))
                 for f, _ in t._fields_ if f != "struct_size"}
        rows = [{f: (list(getattr(v, f)) if f == "wait_seconds" else getattr(v, f)) for f, _ in v._fields_}
                for v in visits[:min(t.n_visits, max_visits)]]
        return total, rows

    # -- files ---------------------------------------------------------------------------

    def load(self, folder) -> None:
        """Loads a Hugging Face model folder's weights into the model, whose
        configuration must match (mt_model_load); the optimizer state is reset."""
        self._call(_lib.lib.mt_model_load, _lib.fsencode(folder))

    def save(self, folder) -> None:
        """Writes config.json and model.safetensors (and the tokenizer files of
        the folder last loaded) into folder, which transformers then loads."""
        self._call(_lib.lib.mt_model_save, _lib.fsencode(folder))

    def save_checkpoint(self, folder, *, data_position: int = 0, rng_state=(0, 0, 0, 0),
                        state: Any = None) -> None:
        """Saves what a bit-identical resume needs into folder/step-NNNNNNNN and
        points folder/latest at it (mt_checkpoint_save). data_position and
        rng_state are the caller's, stored as given; state is any JSON-able
        object of the caller's (its settings, its log history)."""
        info = _lib.CheckpointInfoStruct()
        info.data_position = data_position
        info.rng_state = (ctypes.c_uint64 * 4)(*rng_state)
        keep = json.dumps(state).encode() if state is not None else None
        info.caller_json = keep
        self._call(_lib.lib.mt_checkpoint_save, _lib.fsencode(folder), ctypes.byref(info))

    def load_checkpoint(self, folder) -> CheckpointInfo:
        """Loads the checkpoint folder/latest names (or folder itself, a step
        folder) into the model: weights, optimizer state, step counter."""
        info = _lib.CheckpointInfoStruct()
        self._call(_lib.lib.mt_checkpoint_load, _lib.fsencode(folder), ctypes.byref(info))
        state = json.loads(info.caller_json.decode()) if info.caller_json else None
        return CheckpointInfo(info.step, info.data_position, tuple(info.rng_state), state)
