"""Stopping a step (the abort callback, Ctrl-C, interrupt()), and threads:
the GIL released during steps, models in parallel, one model one thread."""
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import megatrain

from conftest import TINY, pattern_batch, python_env


def untouched(model, tokens, targets, before_logits):
    """The model as before the stopped call: same step count, same outputs,
    and its next step the first step of a fresh model."""
    assert model.step_count == 0
    np.testing.assert_array_equal(model.logits(tokens), before_logits)
    with megatrain.Model(**TINY) as fresh:
        assert model.step(tokens, targets).loss == fresh.step(tokens, targets).loss


def test_abort_callback_stops_the_step():
    polls = []
    with megatrain.Model(**TINY, abort=lambda: polls.append(1) or len(polls) >= 3) as m:
        tokens, targets = pattern_batch()
        m.abort = None
        before = m.logits(tokens)
        m.abort = lambda: polls.append(1) or len(polls) >= 3
        with pytest.raises(megatrain.AbortedError) as e:
            m.step(tokens, targets)
        assert e.value.status == megatrain.Status.ABORTED and len(polls) == 3
        m.abort = None
        untouched(m, tokens, targets, before)


def test_ctrl_c_stops_the_step_and_raises_keyboard_interrupt():
    """A SIGINT while the library runs stops the step at the next poll and
    comes out as KeyboardInterrupt once it has returned; Python's handler is
    back in place afterwards."""
    sent = []

    def ctrl_c():
        if not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGINT)  # a real signal, delivered while the library runs
        return False

    with megatrain.Model(**TINY) as m:
        tokens, targets = pattern_batch()
        before = m.logits(tokens)
        m.abort = ctrl_c
        with pytest.raises(KeyboardInterrupt):
            m.step(tokens, targets)
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        m.abort = None
        untouched(m, tokens, targets, before)


def test_ctrl_c_from_outside(tmp_path):
    """The whole path in a process of its own: SIGINT from another process
    during a training loop ends it with KeyboardInterrupt, the model as
    after its last whole step."""
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(f"""\
        import sys, megatrain
        from conftest import TINY, pattern_batch
        m = megatrain.Model(**TINY)
        t, y = pattern_batch(16, 64)
        print("ready", flush=True)
        try:
            while True:
                m.step(t, y)
        except KeyboardInterrupt:
            n = m.step_count
            m.step(t, y)  # still usable
            print("interrupted", n, m.step_count == n + 1, flush=True)
        """))
    env = python_env()
    env["PYTHONPATH"] += os.pathsep + os.path.dirname(os.path.abspath(__file__))
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, env=env)
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    p.send_signal(signal.SIGINT)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0
    words = out.split()
    assert words[0] == "interrupted" and int(words[1]) > 0 and words[2] == "True"


def test_interrupt_from_another_thread():
    with megatrain.Model(**{**TINY, "num_hidden_layers": 2}) as m:
        tokens, targets = pattern_batch(32, 64)
        started = threading.Event()

        def poll():
            started.set()
            return False
        m.abort = poll
        result = []

        def worker():
            try:
                while True:
                    m.step(tokens, targets)
            except megatrain.AbortedError as e:
                result.append(e)
        t = threading.Thread(target=worker)
        t.start()
        started.wait(10)
        time.sleep(0.05)
        m.interrupt()
        t.join(30)
        assert not t.is_alive() and isinstance(result[0], megatrain.AbortedError)


def test_a_callback_exception_comes_out_of_the_call():
    def broken():
        raise RuntimeError("from the callback")
    with megatrain.Model(**TINY, abort=broken) as m:
        with pytest.raises(RuntimeError, match="from the callback"):
            m.step(*pattern_batch())
        assert m.step_count == 0
    lines = []
    with megatrain.Model(**TINY, log=lambda level, text: lines.append((level, text)), log_level="debug") as m:
        m.step(*pattern_batch())
    assert lines and all(isinstance(level, megatrain.LogLevel) for level, _ in lines)


def test_the_gil_is_released_during_a_step():
    """Another Python thread runs while a step runs in the library: it ticks
    many times between the step's start and its end."""
    with megatrain.Model(**{**TINY, "hidden_size": 128, "intermediate_size": 512, "num_hidden_layers": 4}) as m:
        tokens, targets = pattern_batch(16, 64)
        m.step(tokens, targets)  # the first step's allocations out of the way
        span, ticks, done = [], [], threading.Event()

        def worker():
            span.append(time.perf_counter())
            m.step(tokens, targets)
            span.append(time.perf_counter())
            done.set()
        t = threading.Thread(target=worker)
        t.start()
        while not done.is_set():
            ticks.append(time.perf_counter())
        t.join()
        inside = [x for x in ticks if span[0] < x < span[1]]
        assert span[1] - span[0] > 0.01
        # held GIL: the main thread would tick only around the call
        assert len(inside) > 1000, f"{len(inside)} ticks during a {span[1] - span[0]:.3f} s step"


def test_models_in_parallel_threads_train_as_alone():
    tokens, targets = pattern_batch()

    def run(out):
        with megatrain.Model(**TINY, optimizer_threads=1) as m:
            out.extend(m.step(tokens, targets).loss for _ in range(15))
    alone = []
    run(alone)
    results = [[] for _ in range(3)]
    threads = [threading.Thread(target=run, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(r == alone for r in results)


def test_one_model_one_thread():
    """A second thread's call on a busy model is refused, not raced."""
    inside, release = threading.Event(), threading.Event()

    def hold():
        inside.set()
        release.wait(10)
        return False
    with megatrain.Model(**TINY, abort=hold) as m:
        t = threading.Thread(target=m.step, args=pattern_batch())
        t.start()
        inside.wait(10)
        m.abort = None
        try:
            with pytest.raises(RuntimeError, match="another thread"):
                m.logits(pattern_batch()[0])
            with pytest.raises(RuntimeError, match="another thread"):
                m.close()
        finally:
            release.set()
            t.join()
        assert m.step_count == 1
