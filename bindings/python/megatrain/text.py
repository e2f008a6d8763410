"""Text: Hugging Face tokenizers, chat templates, and prepare(), which turns
JSONL chat or instruction data into a document file whose loss mask keeps
only what the model should learn to write (what ``megatrain prepare`` does,
byte for byte)."""

from __future__ import annotations

import ctypes
import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from .errors import IOFailedError, MegatrainError, check, error_for
from .data import DocWriter

_I32P = ctypes.POINTER(ctypes.c_int32)
_ENCODE_SPECIAL, _ENCODE_ADD_SPECIAL, _DECODE_SKIP_SPECIAL, _CHAT_ADD_GENERATION_PROMPT = 1, 2, 1, 1


def _sized(fn, *args) -> bytes:
    """The text of a call that writes at most cap bytes and reports the length
    it needs: asked once for the length, then with room for it."""
    n = ctypes.c_size_t(0)
    check(fn(*args, None, 0, ctypes.byref(n)))
    buf = ctypes.create_string_buffer(n.value + 1)
    check(fn(*args, buf, n.value + 1, ctypes.byref(n)))
    return buf.raw[:n.value]


class Tokenizer(_lib.Handle):
    """A Hugging Face tokenizer.json (mt_tokenizer_load): byte-level BPE and
    SentencePiece-style BPE. path: the file, or a model folder holding it.
    Read-only once loaded: one tokenizer may serve several threads."""

    def __init__(self, path):
        handle = ctypes.c_void_p()
        check(_lib.lib.mt_tokenizer_load(ctypes.byref(handle), _lib.fsencode(path)))
        self._handle = handle
        self.path = path

    _what = "tokenizer"

    def _release(self, handle) -> None:
        _lib.lib.mt_tokenizer_free(handle)

    def encode_bytes(self, text: bytes, *, special_tokens: bool = True, add_special_tokens: bool = False) -> np.ndarray:
        """encode() of UTF-8 bytes."""
        flags = (_ENCODE_SPECIAL if special_tokens else 0) | (_ENCODE_ADD_SPECIAL if add_special_tokens else 0)
        n = ctypes.c_size_t(0)
        guess = len(text) // 2 + 16
        ids = np.empty(guess, np.int32)
        check(_lib.lib.mt_tokenizer_encode(self._h(), text, len(text), flags, ids.ctypes.data_as(_I32P), guess,
                                           ctypes.byref(n)))
        if n.value > guess:
            ids = np.empty(n.value, np.int32)
            check(_lib.lib.mt_tokenizer_encode(self._h(), text, len(text), flags, ids.ctypes.data_as(_I32P),
                                               n.value, ctypes.byref(n)))
        return ids[:n.value].copy() if n.value < ids.size else ids

    def encode(self, text: str, *, special_tokens: bool = True, add_special_tokens: bool = False) -> np.ndarray:
        """The ids of text, an int32 array (mt_tokenizer_encode).

        special_tokens: added tokens marked special ("<|im_start|>") in the
            text become their ids, as transformers reads them; False: they
            are text like any other.
        add_special_tokens: the post-processor's template around the text
            (Llama 2's <s>)."""
        return self.encode_bytes(text.encode("utf-8"), special_tokens=special_tokens,
                                 add_special_tokens=add_special_tokens)

    __call__ = encode

    def decode(self, ids, *, skip_special_tokens: bool = False) -> str:
        """The text of ids (mt_tokenizer_decode); bytes that do not form UTF-8
        become U+FFFD, as in transformers."""
        a = np.ascontiguousarray(ids, dtype=np.int32).reshape(-1)
        raw = _sized(_lib.lib.mt_tokenizer_decode, self._h(), a.ctypes.data_as(_I32P), a.size,
                     _DECODE_SKIP_SPECIAL if skip_special_tokens else 0)
        return raw.decode("utf-8", "replace")

    @property
    def vocab_size(self) -> int:
        """The number of ids: the largest id of the vocabulary and the added tokens, plus one."""
        return _lib.lib.mt_tokenizer_vocab_size(self._h())

    def __len__(self) -> int:
        return self.vocab_size

    def token_to_id(self, token: str) -> Optional[int]:
        """The id of a token as the vocabulary spells it, None when there is none."""
        i = _lib.lib.mt_tokenizer_token_to_id(self._h(), token.encode("utf-8"))
        return None if i < 0 else i

    def id_to_token(self, id: int) -> Optional[str]:
        """The vocabulary's spelling of id, None outside it."""
        s = _lib.lib.mt_tokenizer_id_to_token(self._h(), id)
        return None if s is None else s.decode("utf-8", "replace")

    def __repr__(self):
        return f"<megatrain.Tokenizer {self.path!s}: {self.vocab_size} ids>"


@dataclass(frozen=True)
class LearntText:
    """One text a conversation trains on and the parts of it that are learnt:
    spans of (start, end) character offsets, end exclusive."""
    text: str
    spans: List[Tuple[int, int]]


class ChatTemplate(_lib.Handle):
    """A model's chat template (mt_chat_template_load), rendered as
    transformers' apply_chat_template renders it.

    path: a model or tokenizer folder, a tokenizer_config.json, a .jinja
    file, or one of the built-in names "chatml", "llama3", "mistral". The
    special tokens of the tokenizer_config.json are the template's
    variables. Messages are lists of {"role": ..., "content": ...} dicts and
    whatever else the template reads; keyword arguments are further
    variables (tools, enable_thinking, ...)."""

    def __init__(self, path):
        handle = ctypes.c_void_p()
        check(_lib.lib.mt_chat_template_load(ctypes.byref(handle), _lib.fsencode(path)))
        self._handle = handle
        self.path = path

    _what = "chat template"

    def _release(self, handle) -> None:
        _lib.lib.mt_chat_template_free(handle)

    @staticmethod
    def _json(messages, variables) -> Tuple[bytes, Optional[bytes]]:
        m = messages if isinstance(messages, (str, bytes)) else json.dumps(messages)
        m = m.encode("utf-8") if isinstance(m, str) else m
        v = json.dumps(variables).encode("utf-8") if variables else None
        return m, v

    def render_bytes(self, messages, *, add_generation_prompt: bool = False, **variables) -> bytes:
        """render() as UTF-8 bytes."""
        m, v = self._json(messages, variables)
        return _sized(_lib.lib.mt_chat_render, self._h(), m, v,
                      _CHAT_ADD_GENERATION_PROMPT if add_generation_prompt else 0)

    def render(self, messages, *, add_generation_prompt: bool = False, **variables) -> str:
        """The conversation as the model reads it (mt_chat_render);
        add_generation_prompt ends it with the header of the assistant's turn."""
        return self.render_bytes(messages, add_generation_prompt=add_generation_prompt,
                                 **variables).decode("utf-8", "replace")

    def render_learnt_bytes(self, messages, **variables) -> List[Tuple[bytes, List[Tuple[int, int]]]]:
        """render_learnt() as UTF-8 bytes and byte ranges."""
        m, v = self._json(messages, variables)
        out: List[Tuple[bytes, List[Tuple[int, int]]]] = []
        failed: List[BaseException] = []

        def on_text(_user, text, n, spans, n_spans):
            try:
                out.append((ctypes.string_at(text, n), [(spans[2 * i], spans[2 * i + 1]) for i in range(n_spans)]))
                return 0
            except BaseException as e:  # raised once the library has returned
                failed.append(e)
                return 1

        fn = _lib.mt_chat_text_fn(on_text)
        st = _lib.lib.mt_chat_render_learnt(self._h(), m, v, fn, None)
        if failed:
            raise failed[0]
        check(st)
        return out

    def render_learnt(self, messages, **variables) -> List[LearntText]:
        """What a model learns of a conversation, as TRL's assistant-only loss
        takes it (mt_chat_render_learnt): the texts to train on, each with
        the spans the model learns to write (character offsets)."""
        out = []
        for raw, spans in self.render_learnt_bytes(messages, **variables):
            text = raw.decode("utf-8", "replace")
            chars = [(len(raw[:a].decode("utf-8", "replace")), len(raw[:b].decode("utf-8", "replace")))
                     for a, b in spans]
            out.append(LearntText(text, chars))
        return out

    def end_of_turn(self, **variables) -> str:
        """The text that ends an assistant's turn ("<|im_end|>\\n", "<|eot_id|>")."""
        v = json.dumps(variables).encode("utf-8") if variables else None
        return _sized(_lib.lib.mt_chat_end_of_turn, self._h(), v).decode("utf-8", "replace")

    def __repr__(self):
        return f"<megatrain.ChatTemplate {self.path!s}>"


# ---- prepare: JSONL into a document file ------------------------------------------------------------


def _folder(path) -> str:
    return str(path) if os.path.isdir(path) else (os.path.dirname(str(path)) or ".")


def eos_token(tokenizer_path) -> Optional[str]:
    """The eos_token of the tokenizer_config.json beside a tokenizer (a string,
    or the "content" of an object), None when there is none."""
    path = os.path.join(_folder(tokenizer_path), "tokenizer_config.json")
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        return None
    e = cfg.get("eos_token")
    if isinstance(e, dict):
        e = e.get("content")
    return e if isinstance(e, str) else None


@dataclass(frozen=True)
class PrepareStats:
    """What prepare() wrote."""
    path: str
    documents: int
    tokens: int
    targets: int    #: tokens that are learnt
    vocab_size: int


class _Doc:
    """A document being built: its text (bytes) and its learnt byte ranges,
    tokenized whole as transformers tokenizes a rendered chat template; a
    token is learnt when its text overlaps a learnt range (transformers' rule
    for its assistant mask). The tokens before a range's edge are found by
    tokenizing the text up to that edge: the ids it shares with the whole."""

    def __init__(self, tok: Tokenizer, writer: DocWriter):
        self.tok, self.writer = tok, writer
        self.text = bytearray()
        self.spans: List[List[int]] = []

    def add(self, data: bytes, target: bool) -> None:
        if not data:
            return
        if target:
            if self.spans and self.spans[-1][1] == len(self.text):
                self.spans[-1][1] += len(data)  # one range with the one before it
            else:
                self.spans.append([len(self.text), len(self.text) + len(data)])
        self.text += data

    def _before(self, edge: int, ids: np.ndarray) -> Tuple[int, bool]:
        prefix = self.tok.encode_bytes(bytes(self.text[:edge]))
        m = min(prefix.size, ids.size)
        same = prefix[:m] == ids[:m]
        c = m if same.all() else int(np.argmin(same))
        return c, c < prefix.size

    def end(self) -> None:
        if not self.text:
            return
        ids = self.tok.encode_bytes(bytes(self.text))
        n, length = ids.size, len(self.text)
        flags = np.zeros(n, np.uint8)
        for start, end in self.spans:
            if start >= end:
                continue
            first = self._before(start, ids)[0] if start else 0
            if end < length:
                last, crossed = self._before(end, ids)
                if crossed and last < n:
                    last += 1  # the token across the range's end
            else:
                last = n
            if first < last:
                flags[first:last] = 1
        self.writer.append(ids, flags)
        self.writer.end_document()
        self.text = bytearray()
        self.spans = []


def prepare(inputs: Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]], out, tokenizer, *,
            chat_template=None, chat_vars: Optional[Dict[str, Any]] = None, eos: Optional[str] = None,
            text_lines: bool = False) -> PrepareStats:
    """Tokenizes chat, instruction and text data into a document file for
    Dataset (what ``megatrain prepare`` writes, byte for byte).

    inputs: one path or several. A .jsonl (or .json) file holds one record
        a line: {"messages": [...]} (and "tools"), rendered by the chat
        template, what the assistant's turns add learnt; {"prompt": ...,
        "completion": ...}, the completion and EOS learnt; or {"text": ...},
        all of it and EOS. Any other file is plain text, all learnt: the
        whole file one document, or each line one with text_lines.
    tokenizer: a model or tokenizer folder, or a tokenizer.json.
    chat_template: the template for a folder without one (a .jinja or
        tokenizer_config.json path, or "chatml", "llama3", "mistral").
    chat_vars: variables for the template ({"enable_thinking": False}).
    eos: the end-of-sequence token (default: tokenizer_config.json's)."""
    if isinstance(inputs, (str, os.PathLike)):
        inputs = [inputs]
    tok = Tokenizer(tokenizer)
    chat, chat_why = None, None
    try:
        chat = ChatTemplate(chat_template if chat_template is not None else _folder(tokenizer))
    except IOFailedError as e:
        if chat_template is not None or "chat" not in e.message:
            raise
        chat_why = f"{e.message}: give chat_template (chatml, llama3, mistral, or a template file)"
    eos = eos or eos_token(tokenizer)
    if eos and tok.token_to_id(eos) is None:
        raise ValueError(f'the EOS token "{eos}" is not in the tokenizer\'s vocabulary')
    eos_bytes = eos.encode("utf-8") if eos else None
    writer = DocWriter(out, tok.vocab_size)
    doc = _Doc(tok, writer)
    try:
        for path in inputs:
            _prepare_file(doc, str(path), chat, chat_why, chat_vars or {}, eos_bytes, text_lines)
        stats = PrepareStats(str(out), writer.num_documents, writer.num_tokens, writer.num_targets, tok.vocab_size)
        if not stats.documents:
            raise ValueError("prepare: the inputs hold no document")
        if not stats.targets:
            raise ValueError("prepare: the documents hold no token to learn")
        writer.finish()
        return stats
    finally:
        writer.close()
        tok.close()
        if chat is not None:
            chat.close()


def _prepare_file(doc: _Doc, path: str, chat, chat_why, chat_vars, eos: Optional[bytes], text_lines: bool):
    def add_eos(where):
        if not eos:
            raise ValueError(f"{where}: the tokenizer names no EOS token to end a document with: give eos=")
        doc.add(eos, True)

    jsonl = path.endswith(".jsonl") or path.endswith(".json")
    with open(path, "rb") as f:
        if not jsonl and not text_lines:
            whole = f.read()
            if whole:
                doc.add(whole, True)
                add_eos(path)
                doc.end()
            return
        for no, line in enumerate(f, 1):
            where = f"{path}:{no}"
            if jsonl:
                if not line.strip(b" \t\r\n"):
                    continue
                _prepare_record(doc, line, where, chat, chat_why, chat_vars, add_eos)
            else:
                line = line.rstrip(b"\r\n")
                if line:
                    doc.add(line, True)
                    add_eos(where)
                    doc.end()


def _prepare_record(doc, line, where, chat, chat_why, chat_vars, add_eos):
    try:
        rec = json.loads(line)
    except ValueError:
        rec = None
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: not a JSON object")

    def member(name, required=False):
        v = rec.get(name)
        if v is None and not required:
            return None
        if not isinstance(v, str):
            raise ValueError(f'{where}: "{name}" {"is not a string" if v is not None else "is missing"}')
        return v.encode("utf-8")

    msgs = rec.get("messages")
    prompt, text = member("prompt"), member("text")
    if msgs is not None:
        if chat is None:
            raise ValueError(f"{where}: {chat_why}")
        if not isinstance(msgs, list) or not msgs:
            raise ValueError(f'{where}: "messages" is not a non-empty array')
        variables = dict(chat_vars)
        if rec.get("tools") is not None:
            variables["tools"] = rec["tools"]
        try:
            texts = chat.render_learnt_bytes(json.dumps(msgs, ensure_ascii=False), **variables)
        except MegatrainError as e:
            raise error_for(e.status, f"{where}: {e.message}") from e
        for raw, spans in texts:
            at = 0
            for a, b in spans:
                a = max(a, at)
                doc.add(raw[at:a], False)
                if b > a:
                    doc.add(raw[a:b], True)
                at = max(at, b)
            doc.add(raw[at:], False)
            doc.end()
        return
    if prompt is not None:
        doc.add(prompt, False)
        doc.add(member("completion", True), True)
        add_eos(where)
    elif text is not None:
        doc.add(text, True)
        add_eos(where)
    else:
        raise ValueError(f'{where}: a record has "messages", "prompt" and "completion", or "text"')
    doc.end()
