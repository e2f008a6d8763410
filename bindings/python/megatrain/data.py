"""Token data: Dataset reads a token or document file in windows of
seq_len + 1 tokens; DocWriter writes a document file with a loss mask.

A Dataset is memory-mapped and read-only once open: one may serve several
threads, and reads go straight into NumPy arrays."""

from __future__ import annotations

import ctypes
from typing import Iterator, Optional, Tuple, Union

import numpy as np

from . import _lib
from .errors import check
from .model import Batch
from .options import DatasetOptions, Split, _fill, to_enum

_I32P = ctypes.POINTER(ctypes.c_int32)
SplitLike = Union[Split, str, int]


class Dataset(_lib.Handle):
    """A token file cut into windows (mt_dataset_open): training windows in a
    seeded order reshuffled every epoch, held-out ones in file order.

    path: a raw uint16 or uint32 token file, an llm.c .bin, or a document
    file (``megatrain prepare``, prepare() or DocWriter), whose windows are
    one document each and whose masked tokens are not targets.

    Keyword arguments are DatasetOptions fields with the C defaults:
    seq_len (1024), format ("auto"), vocab_size (0: no check),
    heldout_fraction (0.01), seed (1).

    Iterating over a Dataset gives each training window of one epoch, in the
    seeded order, as (tokens, targets) arrays of seq_len ids; batches()
    gives whole Batches for Model.step."""

    def __init__(self, path, options: Optional[DatasetOptions] = None, **fields):
        opt = _fill(DatasetOptions, options, fields)
        handle = ctypes.c_void_p()
        check(_lib.lib.mt_dataset_open(ctypes.byref(handle), _lib.fsencode(path), ctypes.byref(opt)))
        self._handle = handle
        self.path = path
        self.seq_len: int = opt.seq_len
        self.options = opt

    _what = "dataset"

    def _release(self, handle) -> None:
        """close() unmaps the file (mt_dataset_close)."""
        _lib.lib.mt_dataset_close(handle)

    @property
    def num_tokens(self) -> int:
        return _lib.lib.mt_dataset_num_tokens(self._h())

    @property
    def num_documents(self) -> int:
        """The documents of a document file; 0 for a token stream."""
        return _lib.lib.mt_dataset_num_documents(self._h())

    def num_windows(self, split: SplitLike = Split.TRAIN) -> int:
        return _lib.lib.mt_dataset_num_windows(self._h(), int(to_enum(Split, split)))

    def padding(self, split: SplitLike = Split.TRAIN) -> int:
        """The padded positions of a split's windows, which nothing learns (0 for a token stream)."""
        return _lib.lib.mt_dataset_padding(self._h(), int(to_enum(Split, split)))

    def __len__(self) -> int:
        """The training windows (one epoch)."""
        return self.num_windows(Split.TRAIN)

    def read(self, position: int, n_seq: int = 1, split: SplitLike = Split.TRAIN,
             out: Optional[Tuple[np.ndarray, np.ndarray]] = None) -> Tuple[np.ndarray, np.ndarray]:
        """n_seq windows from window `position` of the split (mt_dataset_read):
        (tokens, targets), int32 arrays of shape (n_seq, seq_len), targets the
        next token of each or IGNORE_INDEX. Training positions run on into
        the next epochs; held-out ones wrap. out: two such arrays to fill in
        place instead of new ones."""
        shape = (n_seq, self.seq_len)
        if out is None:
            tokens, targets = np.empty(shape, np.int32), np.empty(shape, np.int32)
        else:
            tokens, targets = out
            for a in out:
                if a.dtype != np.int32 or a.shape != shape or not a.flags.c_contiguous or not a.flags.writeable:
                    raise ValueError(f"out must be two writable C-contiguous int32 arrays of shape {shape}")
        check(_lib.lib.mt_dataset_read(self._h(), int(to_enum(Split, split)), position, n_seq,
                                       tokens.ctypes.data_as(_I32P), targets.ctypes.data_as(_I32P)))
        return tokens, targets

    def batches(self, micro_batch_size: int, num_micro_batches: int = 1, *, split: SplitLike = Split.TRAIN,
                start: int = 0, steps: Optional[int] = None) -> Iterator[Batch]:
        """Batches of num_micro_batches x micro_batch_size windows from window
        `start` on, each with its `position` (what a checkpoint records to
        resume there). Training batches go on for ever unless steps says how
        many; held-out ones cover the split once (wrapping into its start to
        fill the last batch)."""
        n = micro_batch_size * num_micro_batches
        if steps is None and to_enum(Split, split) == Split.HELDOUT:
            steps = max(1, -(-self.num_windows(split) // n))
        position, done = start, 0
        while steps is None or done < steps:
            tokens, targets = self.read(position, n, split)
            yield Batch(tokens.reshape(num_micro_batches, micro_batch_size, self.seq_len),
                        targets.reshape(num_micro_batches, micro_batch_size, self.seq_len), position=position)
            position += n
            done += 1

    def windows(self, split: SplitLike = Split.TRAIN) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        """Each window of the split once (an epoch of training windows), as
        (tokens, targets) arrays of seq_len ids."""
        for i in range(self.num_windows(split)):
            tokens, targets = self.read(i, 1, split)
            yield tokens[0], targets[0]

    def __iter__(self) -> Iterator[Tuple[np.ndarray, np.ndarray]]:
        return self.windows(Split.TRAIN)

    def __repr__(self):
        if self._handle is None:
            return f"<megatrain.Dataset {self.path!s} (closed)>"
        docs = f", {self.num_documents} documents" if self.num_documents else ""
        return (f"<megatrain.Dataset {self.path!s}: {self.num_tokens} tokens{docs}, {len(self)} training and "
                f"{self.num_windows(Split.HELDOUT)} held-out windows of {self.seq_len}>")


class DocWriter:
    """Writes a document file (mt_doc_writer): documents of token ids, each id
    a target of the loss or not. Nothing is under path until finish();
    a writer closed unfinished, or a ``with`` block left by an exception,
    leaves no file behind (an older file at path stays as it was). A
    ``with`` block left normally finishes the file.

        with megatrain.DocWriter("train.mt", tokenizer.vocab_size) as w:
            w.append(prompt_ids, targets=False)
            w.append(answer_ids)                # targets: learnt
            w.end_document()
    """

    def __init__(self, path, vocab_size: int):
        handle = ctypes.c_void_p()
        check(_lib.lib.mt_doc_writer_create(ctypes.byref(handle), _lib.fsencode(path), vocab_size))
        self._handle = handle
        self.path = path

    def _h(self):
        if self._handle is None:
            raise ValueError("the writer is closed")
        return self._handle

    def append(self, tokens, targets=True) -> None:
        """Appends ids to the current document. targets: True (all learnt),
        False (none: a prompt) or one flag per id."""
        ids = np.ascontiguousarray(tokens, dtype=np.int32).reshape(-1)
        if targets is True:
            flags = None
        elif targets is False:
            flags = np.zeros(ids.size, np.uint8)
        else:
            flags = np.ascontiguousarray(targets, dtype=np.uint8).reshape(-1)
            if flags.size != ids.size:
                raise ValueError(f"{flags.size} target flags for {ids.size} tokens")
        check(_lib.lib.mt_doc_writer_append(
            self._h(), ids.ctypes.data_as(_I32P),
            flags.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)) if flags is not None else None, ids.size))

    def end_document(self) -> None:
        """Ends the current document (an empty one is not written)."""
        check(_lib.lib.mt_doc_writer_end_document(self._h()))

    def finish(self) -> None:
        """Ends the last document and puts the file in place; the writer is then closed."""
        try:
            check(_lib.lib.mt_doc_writer_finish(self._h()))
        finally:
            self.close()

    def close(self) -> None:
        """Frees the writer; unfinished, its temporary file is removed."""
        if self._handle is not None:
            handle, self._handle = self._handle, None
            _lib.lib.mt_doc_writer_free(handle)

    def __enter__(self) -> "DocWriter":
        return self

    def __exit__(self, exc_type, *exc) -> None:
        if exc_type is None and self._handle is not None:
            self.finish()
        else:
            self.close()

    def __del__(self):
        if getattr(self, "_handle", None) is not None:
            self.close()

    @property
    def num_tokens(self) -> int:
        return _lib.lib.mt_doc_writer_num_tokens(self._handle)

    @property
    def num_targets(self) -> int:
        return _lib.lib.mt_doc_writer_num_targets(self._handle)

    @property
    def num_documents(self) -> int:
        """The documents ended so far."""
        return _lib.lib.mt_doc_writer_num_documents(self._handle)
