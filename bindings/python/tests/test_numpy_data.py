"""NumPy round trips (batches, logits, datasets, document files), tokenizers,
chat templates, and prepare() against `megatrain prepare`."""
import json
import os
import subprocess

import numpy as np
import pytest

import megatrain

from conftest import ROOT, TINY, pattern_batch


def test_batches_use_the_callers_memory():
    tokens, targets = pattern_batch()
    b = megatrain.Batch(tokens, targets)
    assert b.tokens is tokens and b.targets is targets  # int32, C-contiguous: no copy
    assert (len(b), b.micro_batch_size, b.seq_len, b.num_micro_batches) == (4, 4, 32, 1)
    wide = megatrain.Batch(tokens.astype(np.int64), targets.tolist(), num_micro_batches=2)
    assert wide.tokens.dtype == np.int32 and wide.micro_batch_size == 2
    with pytest.raises(ValueError, match="divide"):
        megatrain.Batch(tokens, targets, num_micro_batches=3)
    with pytest.raises(ValueError, match="targets"):
        megatrain.Batch(tokens, targets[:, :5])


def test_micro_batches_accumulate(tiny):
    """Two micro-batches of two sequences (a 3-D array) train as one of four:
    the same loss."""
    tokens, targets = pattern_batch()
    with megatrain.Model(**TINY) as other:
        a = tiny.step(tokens, targets)
        b = other.step(tokens.reshape(2, 2, 32), targets.reshape(2, 2, 32))
    assert b.loss == pytest.approx(a.loss, rel=1e-6)


def test_logits(tiny):
    tokens, _ = pattern_batch()
    out = tiny.logits(tokens)
    assert out.shape == (4, 32) and out.dtype == np.float32
    again = np.zeros((4, 32), np.float32)
    assert tiny.logits(tokens, out=again) is again  # written in place
    np.testing.assert_array_equal(again, out)
    one = tiny.logits(list(tokens[1]))
    assert one.shape == (32,)
    np.testing.assert_array_equal(one, out[1])
    with pytest.raises(ValueError, match="float32"):
        tiny.logits(tokens, out=np.zeros((4, 32), np.float64))


def test_token_file_round_trip(tmp_path):
    ids = (np.arange(1000) * 7 % 50).astype(np.uint16)
    path = tmp_path / "tokens.bin"
    ids.tofile(path)
    with megatrain.Dataset(path, seq_len=9, vocab_size=50, heldout_fraction=0.1, format="u16") as ds:
        assert ds.num_tokens == 1000 and ds.num_documents == 0
        train, held = ds.num_windows("train"), ds.num_windows(megatrain.Split.HELDOUT)
        assert train + held == (1000 - 1) // 9 and len(ds) == train
        seen = set()
        for tokens, targets in ds:  # one epoch, each window once
            assert tokens.shape == (9,) and tokens.dtype == np.int32
            start = int(np.flatnonzero((ids[:-9] == tokens[0]) & (ids[1:-8] == tokens[1]))[0])
            np.testing.assert_array_equal(tokens, ids[start:start + 9])
            np.testing.assert_array_equal(targets, ids[start + 1:start + 10])
            seen.add(tuple(tokens))
        assert len(seen) == train or len(seen) <= train
        h_tokens, _ = ds.read(0, 2, "heldout")
        np.testing.assert_array_equal(h_tokens[0], ids[train * 9:train * 9 + 9])
        batches = ds.batches(3, 2, steps=2)
        b = next(batches)
        assert b.tokens.shape == (2, 3, 9) and b.position == 0 and next(batches).position == 6
        buf = (np.empty((2, 9), np.int32), np.empty((2, 9), np.int32))
        assert ds.read(4, 2, out=buf)[0] is buf[0]


def test_document_file_round_trip(tmp_path):
    path = tmp_path / "docs.mt"
    with megatrain.DocWriter(path, 100) as w:
        w.append([5, 6, 7], targets=False)
        w.append(np.array([8, 9], np.int64))
        w.end_document()
        w.append([10, 11, 12, 13], targets=[0, 1, 1, 0])
        w.end_document()
        assert (w.num_documents, w.num_tokens, w.num_targets) == (2, 9, 4)
    with megatrain.Dataset(path, seq_len=8, format="docs", heldout_fraction=0) as ds:
        assert ds.num_documents == 2 and ds.num_tokens == 9
        windows = sorted((tuple(t), tuple(y)) for t, y in ds)
    ign = megatrain.IGNORE_INDEX
    first = [w for w in windows if w[0][0] == 5][0]
    assert first[0][:4] == (5, 6, 7, 8) and first[1][:4] == (ign, ign, 8, 9)
    second = [w for w in windows if w[0][0] == 10][0]
    assert second[1][:3] == (11, 12, ign)


def test_an_unfinished_writer_leaves_nothing(tmp_path):
    path = tmp_path / "never.mt"
    with pytest.raises(KeyError):
        with megatrain.DocWriter(path, 10) as w:
            w.append([1, 2])
            raise KeyError("stop")
    assert not path.exists() and not os.listdir(tmp_path)


def test_tokenizer_round_trip(sft_data):
    tok = megatrain.Tokenizer(sft_data)
    ids = tok.encode("<|im_start|>user\nMax has 13 cards.<|im_end|>")
    assert ids.dtype == np.int32 and ids[0] == tok.token_to_id("<|im_start|>")
    assert tok.decode(ids) == "<|im_start|>user\nMax has 13 cards.<|im_end|>"
    assert tok.decode(ids, skip_special_tokens=True) == "user\nMax has 13 cards."
    plain = tok.encode("<|im_start|>", special_tokens=False)
    assert plain.size > 1
    assert len(tok) == tok.vocab_size == 384 and tok.id_to_token(int(ids[0])) == "<|im_start|>"
    assert tok.token_to_id("no such token") is None
    with pytest.raises(megatrain.InvalidArgumentError):
        tok.decode([100000])
    tok.close()
    with pytest.raises(ValueError, match="closed"):
        tok.encode("x")


def test_chat_template(sft_data):
    with megatrain.ChatTemplate(sft_data) as chat:
        msgs = [{"role": "user", "content": "2 + 2?"}, {"role": "assistant", "content": "4 é."}]
        text = chat.render(msgs)
        assert text == "<|im_start|>user\n2 + 2?<|im_end|>\n<|im_start|>assistant\n4 é.<|im_end|>\n"
        assert chat.render(msgs[:1], add_generation_prompt=True).endswith("<|im_start|>assistant\n")
        (learnt,) = chat.render_learnt(msgs)
        assert learnt.text == text and [learnt.text[a:b] for a, b in learnt.spans] == ["4 é.<|im_end|>\n"]
        assert chat.end_of_turn() == "<|im_end|>\n"
        with pytest.raises(megatrain.InvalidArgumentError):
            chat.render({"role": "user"})


def test_prepare_writes_what_the_cli_writes(cli, sft_data, tmp_path):
    """prepare() and `megatrain prepare` give the same file, byte for byte:
    conversations, prompt/completion pairs, texts and a plain text file."""
    jsonl = tmp_path / "mixed.jsonl"
    with open(sft_data / "train.jsonl") as f:
        lines = [next(f) for _ in range(20)]
    lines += [json.dumps({"prompt": "What is 3 + 4?", "completion": " 7."}) + "\n",
              json.dumps({"text": "Plain text, all learnt."}) + "\n", "\n"]
    jsonl.write_text("".join(lines))
    plain = tmp_path / "notes.txt"
    plain.write_text("Max has 3 pens.\nNora has 4.\n")
    subprocess.run([cli, "prepare", "--tokenizer", str(sft_data), "-o", str(tmp_path / "cli.mt"), str(jsonl),
                    str(plain)], check=True, capture_output=True)
    stats = megatrain.prepare([jsonl, plain], tmp_path / "py.mt", tokenizer=sft_data)
    assert (tmp_path / "py.mt").read_bytes() == (tmp_path / "cli.mt").read_bytes()
    assert stats.documents == 23 and 0 < stats.targets < stats.tokens and stats.vocab_size == 384


def test_prepare_errors(sft_data, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "no completion"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:1: \"completion\" is missing"):
        megatrain.prepare(bad, tmp_path / "out.mt", tokenizer=sft_data)
    assert not (tmp_path / "out.mt").exists()
    tok_only = os.path.join(ROOT, "tests", "fixtures", "tokenizers", "bytelevel.json")
    if os.path.exists(tok_only):
        chat = tmp_path / "chat.jsonl"
        chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
        with pytest.raises(ValueError, match="chat_template"):
            megatrain.prepare(chat, tmp_path / "out.mt", tokenizer=tok_only)
