"""train(): callbacks, progress, evaluation, checkpoints and resume; the
fine-tuning example end to end."""
import io
import os
import subprocess
import sys

import numpy as np
import pytest

import megatrain

from conftest import ROOT, TINY, python_env


@pytest.fixture
def tokens_file(tmp_path):
    pattern = np.array([3, 17, 5, 29, 11, 2, 23], dtype=np.uint16)
    path = tmp_path / "pattern.bin"
    np.tile(pattern, 400).tofile(path)
    return path


class Recorder(megatrain.TrainerCallback):
    def __init__(self, stop_at=None):
        self.events, self.stop_at = [], stop_at

    def on_train_begin(self, model, state):
        self.events.append(("begin", state.step))

    def on_step_end(self, model, state, stats):
        self.events.append(("step", stats.step))
        if state.step == self.stop_at:
            state.should_stop = True

    def on_log(self, model, state, logs):
        self.events.append(("log", logs["step"], "eval_loss" in logs))

    def on_evaluate(self, model, state, metrics):
        self.events.append(("evaluate", metrics["step"], metrics["eval_loss"] < 10))

    def on_save(self, model, state, path):
        self.events.append(("save", os.path.basename(path)))

    def on_train_end(self, model, state):
        self.events.append(("end", state.step))


def test_callbacks_in_order(tiny, tokens_file, tmp_path):
    rec = Recorder()
    with megatrain.Dataset(tokens_file, seq_len=32, heldout_fraction=0.1) as data:
        state = megatrain.train(tiny, data, max_steps=4, micro_batch_size=2, lr=3e-3, logging_steps=2,
                                eval_steps=4, eval_batches=2, output_dir=tmp_path / "run", save_steps=2,
                                callbacks=[rec], progress=False)
    assert rec.events == [("begin", 0), ("step", 1), ("step", 2), ("log", 2, False), ("save", "step-00000002"),
                          ("step", 3), ("step", 4), ("log", 4, False), ("evaluate", 4, True), ("log", 4, True),
                          ("save", "step-00000004"), ("end", 4)]
    assert state.step == 4 and state.data_position == 8 and state.eval_loss is not None
    assert [h["step"] for h in state.log_history] == [2, 4, 4]


def test_plain_progress_lines(tiny, tokens_file, capsys):
    """Without tqdm, progress is a plain line every logging_steps."""
    with megatrain.Dataset(tokens_file, seq_len=32) as data:
        megatrain.train(tiny, data, max_steps=4, micro_batch_size=2, logging_steps=2, progress=False,
                        callbacks=[megatrain.ProgressCallback(use_tqdm=False)])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == ["step 2/4", "step 4/4"]
    assert "loss " in lines[0] and "tokens_per_second" in lines[0]


def test_tqdm_when_installed(tiny, tokens_file):
    pytest.importorskip("tqdm")
    out = io.StringIO()
    with megatrain.Dataset(tokens_file, seq_len=32) as data:
        megatrain.train(tiny, data, max_steps=3, micro_batch_size=2, progress=False,
                        callbacks=[megatrain.ProgressCallback(stream=out)])
    assert "3/3" in out.getvalue()


def test_a_callback_stops_the_run(tiny, tokens_file, tmp_path):
    rec = Recorder(stop_at=3)
    with megatrain.Dataset(tokens_file, seq_len=32) as data:
        state = megatrain.train(tiny, data, max_steps=10, micro_batch_size=2, output_dir=tmp_path / "run",
                                callbacks=[rec], progress=False)
    assert state.step == 3 and rec.events[-2:] == [("save", "step-00000003"), ("end", 3)]


def test_resume_is_bit_identical(tokens_file, tmp_path):
    """Six steps in one run, or three and three more from the checkpoint in
    a new model: the same weights, bit for bit."""
    with megatrain.Dataset(tokens_file, seq_len=32) as data:
        opt = megatrain.OptimConfig(lr=3e-3, total_steps=6)
        with megatrain.Model(**TINY) as m:
            megatrain.train(m, data, max_steps=6, micro_batch_size=2, optim=opt, progress=False)
            whole = m.logits(np.arange(8).reshape(1, 8))
        with megatrain.Model(**TINY) as m:
            megatrain.train(m, data, max_steps=3, micro_batch_size=2, optim=opt, output_dir=tmp_path / "r",
                            progress=False)
        with megatrain.Model(**TINY) as m:
            state = megatrain.train(m, data, max_steps=6, micro_batch_size=2, optim=opt, output_dir=tmp_path / "r",
                                    resume=True, progress=False)
            assert state.step == 6 and state.data_position == 12
            np.testing.assert_array_equal(m.logits(np.arange(8).reshape(1, 8)), whole)


def test_the_finetune_example(sft_data, tmp_path):
    """examples/python/finetune.py on a small model folder and the sft-data
    conversations: a folder that loads again, its tokenizer beside it."""
    folder = tmp_path / "base"
    with megatrain.Model(vocab_size=384, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=256,
                         precision="fp32", backend="cpu") as m:
        m.save(folder)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (folder / f).write_bytes((sft_data / f).read_bytes())
    jsonl = tmp_path / "train.jsonl"
    with open(sft_data / "train.jsonl") as f:
        jsonl.write_text("".join(next(f) for _ in range(40)))
    out = tmp_path / "tuned"
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "python", "finetune.py"), str(folder),
                        str(jsonl), str(out), "4"], capture_output=True, text=True, env=python_env(), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "PrepareStats" in r.stdout and f"saved {out}" in r.stdout
    assert (out / "tokenizer.json").exists() and (out / "checkpoints" / "latest").exists()
    with megatrain.Model.from_pretrained(out, precision="fp32", backend="cpu") as tuned:
        assert tuned.config.vocab_size == 384
