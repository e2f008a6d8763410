"""The ctypes structs against the C compiler's layout of the header, the
defaults against the library's, and the version rules."""
import ctypes
import os
import re
import subprocess
import sys
import textwrap

import pytest

import megatrain
from megatrain import _lib

from conftest import ROOT, cflags, python_env


def test_struct_layouts_match_c(cc, tmp_path):
    """Every struct the package mirrors has the size and field offsets that
    the C compiler gives it from the header the library was built with."""
    lines = []
    for cname, cls in _lib.STRUCTS.items():
        lines.append(f'printf("{cname} %zu\\n", sizeof({cname}));')
        for name, _ in cls._fields_:
            lines.append(f'printf("{cname}.{name} %zu\\n", offsetof({cname}, {name}));')
    src = tmp_path / "layout.c"
    src.write_text("#include <megatrain.h>\n#include <stddef.h>\n#include <stdio.h>\nint main(void)\n{\n" +
                   "\n".join(lines) + "\nreturn 0;\n}\n")
    subprocess.run([cc, "-std=c11", "-Wall", "-Werror", *cflags(), str(src), "-o", str(tmp_path / "layout")],
                   check=True)
    out = subprocess.run([str(tmp_path / "layout")], check=True, capture_output=True, text=True).stdout
    c = dict(line.rsplit(" ", 1) for line in out.splitlines())
    py = {}
    for cname, cls in _lib.STRUCTS.items():
        py[cname] = str(ctypes.sizeof(cls))
        for name, _ in cls._fields_:
            py[f"{cname}.{name}"] = str(getattr(cls, name).offset)
    assert py == c


def test_every_header_struct_is_mirrored():
    """A struct added to the header needs its mirror here (and a field
    appended to one, which the layout test then compares)."""
    header = os.path.join(ROOT, "include", "megatrain.h")
    if not os.path.exists(header):
        pytest.skip("not in the source tree")
    names = set(re.findall(r"typedef struct (\w+) \{", open(header).read()))
    assert names == set(_lib.STRUCTS)


def test_defaults_are_the_librarys():
    """Each option class starts from the library's mt_X_init_sized: the
    documented defaults, and struct_size its own size."""
    cfg = megatrain.ModelConfig()
    assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers, cfg.precision) == (32000, 512, 8,
                                                                                         megatrain.Precision.BF16)
    assert cfg.struct_size == ctypes.sizeof(megatrain.ModelConfig)
    opt = megatrain.OptimConfig()
    assert opt.schedule == megatrain.LRSchedule.COSINE and opt.total_steps == 1000
    assert abs(opt.lr - 3e-4) < 1e-9 and abs(opt.beta2 - 0.95) < 1e-7
    pol = megatrain.OffloadPolicy()
    assert (pol.backend, pol.weight_slots, pol.numa_node) == (megatrain.Backend.AUTO, 2, -1)
    ds = megatrain.DatasetOptions()
    assert (ds.seq_len, ds.seed, ds.format) == (1024, 1, megatrain.TokenFormat.AUTO)
    assert megatrain.BatchShape().seq_len == 1024


def test_keyword_fields_and_enums():
    cfg = megatrain.ModelConfig(precision="fp32", arch=megatrain.Arch.QWEN2, vocab_size=100)
    assert cfg.precision is megatrain.Precision.FP32 and cfg.arch == 1 and cfg.vocab_size == 100
    assert "precision='fp32'" in repr(cfg) and "hidden_size" not in repr(cfg)
    with pytest.raises(TypeError, match="no field 'vocab'"):
        megatrain.ModelConfig(vocab=3)
    with pytest.raises(ValueError, match="not a Precision"):
        megatrain.ModelConfig(precision="fp8")
    with pytest.raises(TypeError, match="unknown option"):
        megatrain.Model(hidden=3)
    pol = megatrain.OffloadPolicy(devices=[0, 1])
    assert pol.num_devices == 2 and pol.to_dict()["devices"] == [0, 1]
    with pytest.raises(TypeError, match="give the callback to Model"):
        megatrain.OffloadPolicy(abort_callback=None)
    cfg.mlp_only_layers = [1, 2]
    assert list(cfg.mlp_only_layers) == [1, 2, 0, 0]
    assert cfg.copy() == cfg and cfg.copy() is not cfg


def test_version_follows_the_library():
    assert megatrain.__version__ == megatrain.library_version
    header = os.path.join(ROOT, "include", "megatrain.h")
    if os.path.exists(header):
        v = dict(re.findall(r"#define MT_VERSION_(MAJOR|MINOR|PATCH) (\d+)", open(header).read()))
        assert megatrain.__version__ == f"{v['MAJOR']}.{v['MINOR']}.{v['PATCH']}"


def test_an_older_library_is_refused(cc, tmp_path):
    """A library older than the package needs is refused at import, with both versions and the way out."""
    src = tmp_path / "old.c"
    src.write_text(textwrap.dedent("""\
        #include <stdint.h>
        uint32_t mt_version_number(void) { return 100; }
        const char *mt_version_string(void) { return "0.1.0"; }
        """))
    lib = tmp_path / "libmegatrain.so.0"
    subprocess.run([cc, "-shared", "-fPIC", str(src), "-o", str(lib)], check=True)
    env = python_env(MEGATRAIN_LIBRARY=str(lib))
    r = subprocess.run([sys.executable, "-c", "import megatrain"], env=env, capture_output=True, text=True,
                       cwd=str(tmp_path))
    assert r.returncode != 0
    assert "needs libmegatrain 0.2.0 or newer" in r.stderr and "is 0.1.0" in r.stderr
    assert "MEGATRAIN_LIBRARY" in r.stderr


def test_a_missing_library_says_where_it_looked(tmp_path):
    env = python_env(MEGATRAIN_LIBRARY=str(tmp_path / "nowhere.so"))
    r = subprocess.run([sys.executable, "-c", "import megatrain"], env=env, capture_output=True, text=True)
    assert r.returncode != 0 and "cannot load libmegatrain" in r.stderr and "nowhere.so" in r.stderr


def test_help_is_useful():
    import pydoc
    text = pydoc.render_doc(megatrain.Model, renderer=pydoc.plaintext)
    for needed in ("step(", "logits(", "from_pretrained(", "close(", "KeyboardInterrupt", "two threads"):
        assert needed in text
    assert "Hooks into train()" in pydoc.render_doc(megatrain.TrainerCallback, renderer=pydoc.plaintext)
    assert megatrain.Dataset.read.__doc__ and megatrain.train.__doc__ and megatrain.prepare.__doc__
