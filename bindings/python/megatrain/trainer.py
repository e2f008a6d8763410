"""train(): the training loop most runs need, with callbacks in the spirit of
transformers' TrainerCallback, held-out evaluation, resume checkpoints, and a
progress bar (tqdm when it is installed, plain lines when it is not)."""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence

from .data import Dataset
from .model import EvalStats, Model, StepStats
from .options import OptimConfig, Split, _fill


@dataclass
class TrainerState:
    """Where a train() run is; every callback receives it.

    Set ``should_stop`` in a callback to end the run after the current step
    (it is then saved, as at the end)."""
    step: int = 0                   #: optimizer steps the model has taken
    max_steps: int = 0              #: the step the run ends at
    data_position: int = 0          #: the next training window to read
    epoch: float = 0.0              #: training windows read over the training windows of the file
    loss: float = math.nan          #: the last step's loss
    eval_loss: Optional[float] = None  #: the last held-out loss
    log_history: List[Dict[str, Any]] = field(default_factory=list)  #: every on_log's logs
    should_stop: bool = False


class TrainerCallback:
    """Hooks into train(), as transformers' TrainerCallback: override those you
    need. Each receives the model and the TrainerState; returning nothing is
    the norm (set state.should_stop to end the run)."""

    def on_train_begin(self, model: Model, state: TrainerState) -> None:
        """Before the first step (after a resume, if any)."""

    def on_step_end(self, model: Model, state: TrainerState, stats: StepStats) -> None:
        """After each optimizer step."""

    def on_log(self, model: Model, state: TrainerState, logs: Dict[str, Any]) -> None:
        """Every logging_steps steps, and after each evaluation: logs holds step, loss, lr, grad_norm,
        tokens_per_second (or eval_loss)."""

    def on_evaluate(self, model: Model, state: TrainerState, metrics: Dict[str, Any]) -> None:
        """After each held-out evaluation: metrics holds eval_loss and eval_tokens."""

    def on_save(self, model: Model, state: TrainerState, path: str) -> None:
        """After each checkpoint and the final save; path is the folder written."""

    def on_train_end(self, model: Model, state: TrainerState) -> None:
        """After the last step and its save (also when a callback stopped the run)."""


def _tqdm():
    try:
        from tqdm.auto import tqdm  # optional: a bar where it is installed
        return tqdm
    except ImportError:
        return None


class ProgressCallback(TrainerCallback):
    """The run's progress: a tqdm bar when tqdm is installed (the logs as its
    postfix), plain lines on stream every logging_steps otherwise."""

    def __init__(self, use_tqdm: Optional[bool] = None, stream=None):
        self.tqdm = _tqdm() if use_tqdm is not False else None
        self.stream = stream
        self.bar = None

    def on_train_begin(self, model, state):
        if self.tqdm is not None:
            self.bar = self.tqdm(total=state.max_steps, initial=state.step, unit="step", dynamic_ncols=True,
                                 file=self.stream)

    def on_step_end(self, model, state, stats):
        if self.bar is not None:
            self.bar.update(1)

    def on_log(self, model, state, logs):
        if self.bar is not None:
            self.bar.set_postfix({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in logs.items()
                                  if k != "step"}, refresh=False)
        else:
            parts = [f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in logs.items() if k != "step"]
            print(f"step {logs['step']}/{state.max_steps}: " + ", ".join(parts), file=self.stream or sys.stdout,
                  flush=True)

    def on_save(self, model, state, path):
        if self.bar is None:
            print(f"step {state.step}: saved {path}", file=self.stream or sys.stdout, flush=True)

    def on_train_end(self, model, state):
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def evaluate(model: Model, dataset: Dataset, micro_batch_size: int, max_batches: Optional[int] = None) -> EvalStats:
    """The loss on the dataset's held-out windows (all of them, or the first
    max_batches batches), weighted by target tokens as one pass would."""
    loss = 0.0
    tokens = targets = 0
    seconds = 0.0
    for i, batch in enumerate(dataset.batches(micro_batch_size, split=Split.HELDOUT)):
        if max_batches is not None and i >= max_batches:
            break
        s = model.eval(batch)
        loss += s.loss * s.target_tokens
        tokens += s.tokens
        targets += s.target_tokens
        seconds += s.seconds
    return EvalStats(loss / targets if targets else math.nan, tokens, targets, seconds)


def train(model: Model, dataset: Dataset, *, max_steps: int, micro_batch_size: int = 1,
          num_micro_batches: int = 1, optim: Optional[OptimConfig] = None, eval_dataset: Optional[Dataset] = None,
          eval_steps: int = 0, eval_batches: Optional[int] = None, output_dir=None, save_steps: int = 0,
          resume: bool = False, logging_steps: int = 10, callbacks: Sequence[TrainerCallback] = (),
          progress: Optional[bool] = None, **optim_fields) -> TrainerState:
    """Trains model on dataset's training windows until max_steps optimizer
    steps (counted by the model, so a resumed run ends at the same step).

    Arguments:
        micro_batch_size, num_micro_batches: sequences per micro-batch and
            micro-batches per step (gradient accumulation).
        optim: the OptimConfig (model.optim when None); keyword arguments
            of OptimConfig (lr, warmup_steps, ...) are applied on top, and
            total_steps defaults to max_steps.
        eval_dataset: held-out data (the dataset's own held-out windows when
            None); evaluated every eval_steps steps (0: never) over
            eval_batches batches (all when None).
        output_dir: where checkpoints go every save_steps steps (0: at the
            end only) and at the end (output_dir/step-NNNNNNNN, latest); with
            resume, a run continues from output_dir's latest checkpoint,
            weights, optimizer, step and data position.
        logging_steps: on_log every this many steps.
        callbacks: TrainerCallback objects, called in order.
        progress: a progress bar or lines (ProgressCallback); None: on, False: off.

    Returns the final TrainerState. Ctrl-C stops the step under way (the
    model as before it) and raises KeyboardInterrupt; the checkpoints already
    written stay."""
    given = optim if optim is not None else model.optim
    opt = _fill(OptimConfig, given, optim_fields)
    if "total_steps" not in optim_fields and given.total_steps == OptimConfig().total_steps:
        opt.total_steps = max_steps  # the schedule is the run's unless the caller set one
    cbs: List[TrainerCallback] = list(callbacks)
    if progress is not False:
        cbs.insert(0, ProgressCallback())
    state = TrainerState(max_steps=max_steps)
    if resume and output_dir is not None and os.path.exists(os.path.join(output_dir, "latest")):
        info = model.load_checkpoint(output_dir)
        state.data_position = info.data_position
        if isinstance(info.state, dict):
            state.log_history = list(info.state.get("log_history", []))
    state.step = model.step_count
    n_seq = micro_batch_size * num_micro_batches
    windows = max(len(dataset), 1)
    heldout = eval_dataset if eval_dataset is not None else dataset

    def call(name, *args):
        for cb in cbs:
            getattr(cb, name)(model, state, *args)

    def save():
        model.save_checkpoint(output_dir, data_position=state.data_position,
                              state={"log_history": state.log_history, "max_steps": max_steps})
        call("on_save", os.path.join(output_dir, "step-%08d" % state.step))

    def run_eval():
        s = evaluate(model, heldout, micro_batch_size, eval_batches)
        state.eval_loss = s.loss
        metrics = {"step": state.step, "eval_loss": s.loss, "eval_tokens": s.target_tokens}
        call("on_evaluate", metrics)
        state.log_history.append(metrics)
        call("on_log", metrics)

    call("on_train_begin")
    since, window_tokens = time.perf_counter(), 0
    batches = dataset.batches(micro_batch_size, num_micro_batches, start=state.data_position)
    saved_at = None
    while state.step < max_steps and not state.should_stop:
        batch = next(batches)
        stats = model.step(batch, optim=opt)
        state.step = stats.step
        state.data_position = batch.position + n_seq
        state.epoch = state.data_position / windows
        state.loss = stats.loss
        window_tokens += stats.tokens
        call("on_step_end", stats)
        if logging_steps and (state.step % logging_steps == 0 or state.step == max_steps):
            now = time.perf_counter()
            logs = {"step": state.step, "loss": stats.loss, "lr": float(stats.lr), "grad_norm": stats.grad_norm,
                    "tokens_per_second": window_tokens / max(now - since, 1e-9)}
            since, window_tokens = now, 0
            state.log_history.append(logs)
            call("on_log", logs)
        if eval_steps and state.step % eval_steps == 0:
            run_eval()
        if output_dir is not None and save_steps and state.step % save_steps == 0:
            save()
            saved_at = state.step
    if output_dir is not None and saved_at != state.step:
        save()
    call("on_train_end")
    return state
