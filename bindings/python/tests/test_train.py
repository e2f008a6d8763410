"""The reference run of examples/c/train.c, and errors."""
import os
import subprocess
import sys

import numpy as np
import pytest

import megatrain

from conftest import ROOT, TINY, cflags, library_dir, pattern_batch, python_env

EXAMPLE = os.path.join(ROOT, "examples", "python", "train.py")


def test_the_same_run_as_c(cc, tmp_path):
    """examples/python/train.py prints, after its first line, exactly what
    examples/c/train.c prints against the same library: the refusal, the
    parameter count, every loss, gradient norm and learning rate."""
    lib = library_dir()
    exe = tmp_path / "train-c"
    subprocess.run([cc, os.path.join(ROOT, "examples", "c", "train.c"), *cflags(), "-L" + lib, "-lmegatrain",
                    "-Wl,-rpath," + lib, "-o", str(exe)], check=True)
    c = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    py = subprocess.run([sys.executable, EXAMPLE], check=True, capture_output=True, text=True,
                        env=python_env()).stdout
    assert py.splitlines()[0].endswith("from Python")
    assert py.splitlines()[1:] == c.splitlines()[1:]


def test_step_losses_in_process(tiny):
    """The same numbers in process: the C example's first loss, and training lowers it."""
    tokens, targets = pattern_batch()
    optim = megatrain.OptimConfig(lr=3e-3, total_steps=60)
    first = tiny.step(tokens, targets, optim=optim)
    assert first.step == 1 and f"{first.loss:.6f}" == "3.493850"
    assert first.tokens == first.target_tokens == 128
    for _ in range(20):
        last = tiny.step(tokens, targets, optim=optim)
    assert last.loss < 0.5 * first.loss and tiny.step_count == 21
    ev = tiny.eval(tokens, targets)
    assert ev.loss < first.loss and ev.target_tokens == 128 and tiny.step_count == 21


def test_errors_carry_status_and_message(tmp_path):
    with pytest.raises(megatrain.InvalidArgumentError) as e:
        megatrain.Model(num_attention_heads=7, backend="cpu")
    assert isinstance(e.value, ValueError) and isinstance(e.value, megatrain.MegatrainError)
    assert e.value.status == megatrain.Status.INVALID_ARGUMENT
    assert "must divide num_attention_heads 7" in e.value.message
    assert str(e.value).startswith("invalid argument: ")

    with pytest.raises(megatrain.IOFailedError) as e:
        megatrain.Dataset(tmp_path / "missing.bin")
    assert "missing.bin" in e.value.message

    bad = tmp_path / "odd.bin"
    bad.write_bytes(b"\x01\x00" * 10 + b"\x01")
    with pytest.raises(megatrain.MegatrainError) as e:
        megatrain.Dataset(bad, seq_len=4)
    assert "odd.bin" in e.value.message

    with pytest.raises(megatrain.HostBudgetError) as e:
        megatrain.plan(megatrain.ModelConfig(), backend="cpu", host_budget_bytes=1 << 20)
    assert e.value.plan.num_params > 0 and "budget" in e.value.message


def test_model_errors_use_the_models_message(tiny, tmp_path):
    with pytest.raises(megatrain.IOFailedError) as e:
        tiny.load(tmp_path / "no-such-model")
    assert "no-such-model" in e.value.message
    tokens, targets = pattern_batch()
    with pytest.raises(megatrain.InvalidArgumentError):
        tiny.step(tokens + 100, targets)  # ids past the vocabulary
    assert tiny.step_count == 0
    with pytest.raises(megatrain.UnsupportedError):
        tiny.timeline()


def test_close_and_context_manager():
    m = megatrain.Model(**TINY)
    assert not m.closed and "78144 parameters" in repr(m)
    m.close()
    m.close()
    assert m.closed and "closed" in repr(m)
    with pytest.raises(ValueError, match="closed"):
        m.step(*pattern_batch())
    with megatrain.Model(**TINY) as m2:
        assert m2.num_params == 78144
    assert m2.closed


def test_save_load_and_checkpoints(tiny, tmp_path):
    tokens, targets = pattern_batch()
    for _ in range(3):
        tiny.step(tokens, targets)
    tiny.save(tmp_path / "model")
    assert (tmp_path / "model" / "config.json").exists()
    with megatrain.Model.from_pretrained(tmp_path / "model", precision="fp32", backend="cpu") as again:
        assert again.config.hidden_size == 64
        np.testing.assert_array_equal(again.logits(tokens), tiny.logits(tokens))
    tiny.save_checkpoint(tmp_path / "ck", data_position=12, rng_state=(1, 2, 3, 4), state={"note": "é"})
    after = tiny.step(tokens, targets)
    with megatrain.Model(**TINY) as resumed:
        info = resumed.load_checkpoint(tmp_path / "ck")
        assert (info.step, info.data_position, info.rng_state, info.state) == (3, 12, (1, 2, 3, 4), {"note": "é"})
        assert resumed.step(tokens, targets).loss == after.loss


def test_families_and_plan():
    fams = megatrain.families()
    assert {f.name for f in fams} >= {"llama", "qwen2", "gemma3"}
    cfg = megatrain.ModelConfig.example("qwen2")
    assert cfg.arch == megatrain.Arch.QWEN2 and cfg.hidden_size > 512
    p = megatrain.plan(megatrain.ModelConfig(**{k: v for k, v in TINY.items() if k != "backend"}), backend="cpu",
                       micro_batch_size=4, seq_len=32)
    assert p.num_params == 78144 and p.backend == megatrain.Backend.CPU and p.gpu_bytes == 0
    o = megatrain.OptimConfig(lr=1e-3, warmup_steps=10, schedule="constant")
    assert o.lr_at(0) == pytest.approx(1e-4) and o.lr_at(50) == pytest.approx(1e-3)
