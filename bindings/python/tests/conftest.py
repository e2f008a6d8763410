"""What the tests share: the tiny model of the C example, and where this
source tree's C example, header and command-line program are.

The tests run against whichever library the package loads (MEGATRAIN_LIBRARY,
pkg-config, the system's): bindings/python/check.sh points them at an
installed one. The few that need a C compiler, the header or the `megatrain`
program skip, saying why, when they are missing."""
import os
import shutil
import subprocess

import pytest

import megatrain

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

#: the shape of examples/c/train.c's model
TINY = dict(vocab_size=32, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=64, precision="fp32", backend="cpu")


def pattern_batch(n_seq=4, seq_len=32):
    """examples/c/train.c's batch: a period-7 pattern, each sequence starting elsewhere in it."""
    import numpy as np
    pattern = np.array([3, 17, 5, 29, 11, 2, 23], dtype=np.int32)
    at = np.arange(n_seq)[:, None] + np.arange(seq_len)[None, :]
    return pattern[at % 7], pattern[(at + 1) % 7]


@pytest.fixture
def tiny():
    with megatrain.Model(**TINY, optimizer_threads=1) as m:
        yield m


def cflags():
    """The compiler flags that find megatrain.h: MEGATRAIN_CFLAGS, pkg-config's, or this tree's include/."""
    if os.environ.get("MEGATRAIN_CFLAGS"):
        return os.environ["MEGATRAIN_CFLAGS"].split()
    if shutil.which("pkg-config"):
        r = subprocess.run(["pkg-config", "--cflags", "megatrain"], capture_output=True, text=True)
        if r.returncode == 0:
            return r.stdout.split()
    return ["-I" + os.path.join(ROOT, "include")]


@pytest.fixture(scope="session")
def cc():
    c = os.environ.get("CC", "cc")
    if not shutil.which(c):
        pytest.skip(f"no C compiler ({c})")
    return c


def library_dir():
    return os.path.dirname(os.path.realpath(megatrain.library_path))


@pytest.fixture(scope="session")
def cli():
    """The megatrain program beside the library (an install's bin/ or this tree's), or on PATH."""
    lib = library_dir()
    for path in (os.environ.get("MEGATRAIN_CLI"), os.path.join(os.path.dirname(lib), "bin", "megatrain"),
                 shutil.which("megatrain")):
        if path and os.access(path, os.X_OK):
            return path
    pytest.skip("no megatrain program found (set MEGATRAIN_CLI)")


@pytest.fixture(scope="session")
def sft_data(cli, tmp_path_factory):
    """`megatrain sft-data`: a byte-level BPE tokenizer folder with a ChatML
    template, and JSONL conversations."""
    d = tmp_path_factory.mktemp("sft") / "data"
    subprocess.run([cli, "sft-data", str(d)], check=True, capture_output=True)
    return d


def python_env(**extra):
    """The environment for a child Python that imports this same package."""
    pkg_parent = os.path.dirname(os.path.dirname(os.path.abspath(megatrain.__file__)))
    env = dict(os.environ, **extra)
    env["PYTHONPATH"] = pkg_parent + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
