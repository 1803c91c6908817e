"""Packed sequences: whole documents one after another in full rows, instead of one padded document per row.

    documents   a b c <eos>    d e f g h <eos>    i j <eos>                    (seq_len 8)
    padded      row 0: a b c <eos> . . . .   row 1: d e f g h <eos> . .   row 2: i j <eos> . . . . .
    packed      row 0: a b c <eos> d e f g   (h <eos> does not fit: next row)
                documents  0 0 0 0     1 1 1 1      positions 0 1 2 3 0 1 2 3
                labels     b c <eos> - e f g h                        (- : nothing predicted, -100)

A row of T positions holds pieces: a document's first T + 1 tokens (a window and the token after it), the rest of a
longer document its next pieces. A piece takes its n - 1 positions (inputs piece[:-1], targets piece[1:]); pieces
fill a row in corpus order until the next one does not fit, which starts the next row; what is left of a row is
padding, a document of its own whose targets are ignored. The row's document ids (`AttentionMask.documents`) keep
every position from attending to another document's, and positions restart at each piece, so a packed row trains
as its documents would one per row (torchtune's PackedDataset with `packed_block_causal_mask`; Krell et al. 2021,
"Efficient Sequence Packing without Cross-contamination"). Padded rows hold one piece each (`pack_rows(...,
packed=False)`), the baseline `python -m benchmarks packing` measures packing against.

A document ends after the tokenizer's end-of-sequence token (which separates a corpus's files in the stream), and
with `lines` also after every token whose text holds a line break (one document per line: captions, sentences).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from attnkit.data.batching import IGNORE_INDEX
from attnkit.tokenize import Tokenizer

PackMode = Literal["off", "files", "lines"]


def document_ends(tokens: np.ndarray, tokenizer: Tokenizer, mode: PackMode) -> np.ndarray:
    """The index just past each document's last token in `tokens` (N,), the stream's end included: after each
    end-of-sequence token, and with mode `lines` after each token whose text holds a line break. (D,) int64"""
    ends = tokens == tokenizer.eos_id if tokenizer.eos_id is not None else np.zeros(len(tokens), dtype=bool)
    if mode == "lines":
        breaks = np.array(["\n" in tokenizer.decode([i], skip_special=False) for i in range(tokenizer.vocab_size)])
        ends = ends | breaks[np.asarray(tokens, dtype=np.int64)]
    indices = np.flatnonzero(ends) + 1
    return indices if len(indices) and indices[-1] == len(tokens) else np.append(indices, len(tokens))


def pieces(ends: np.ndarray, seq_len: int) -> np.ndarray:
    """The documents ending at `ends` cut into pieces of at most seq_len + 1 tokens, each the next one's first token
    on (so every target is predicted once); pieces of one token predict nothing and are dropped. (P, 2) start, stop"""
    starts = np.concatenate([[0], ends[:-1]])
    cut = []
    for start, stop in zip(starts.tolist(), ends.tolist(), strict=True):
        cut += [(s, min(s + seq_len + 1, stop)) for s in range(start, stop - 1, seq_len)]
    return np.array(cut, dtype=np.int64).reshape(-1, 2)


@dataclass(frozen=True)
class PackedRows:
    """Rows of seq_len positions: input_ids and labels (R, T), the document of each position and its position within
    the document (R, T); labels are -100 where nothing is predicted (padding)."""

    input_ids: np.ndarray
    labels: np.ndarray
    documents: np.ndarray
    positions: np.ndarray

    @property
    def real_tokens(self) -> int:
        """Positions that predict a token (not padding)."""
        return int((self.labels != IGNORE_INDEX).sum())

    @property
    def padding_share(self) -> float:
        """The share of positions that are padding."""
        return 1.0 - self.real_tokens / self.labels.size

    def batch(self, rows: np.ndarray) -> PackedBatch:
        """The rows `rows` as int64 tensors."""
        return PackedBatch(*(torch.from_numpy(a[rows].astype(np.int64)) for a in (
            self.input_ids, self.labels, self.documents, self.positions)))


@dataclass(frozen=True)
class PackedBatch:
    """A batch of packed rows, each (B, T): what a decoder takes as input_ids, labels, document_ids, position_ids."""

    input_ids: Tensor
    labels: Tensor
    document_ids: Tensor
    position_ids: Tensor


def pack_rows(tokens: np.ndarray, cut: np.ndarray, seq_len: int, *, packed: bool = True,
              trained: np.ndarray | None = None) -> PackedRows:
    """The pieces `cut` (P, 2) of `tokens` in rows of `seq_len` positions: as many whole pieces per row as fit, in
    order (packed), or one per row (padded). `trained` (N,) bool: the tokens learnt as targets, the others' labels
    -100 (a chat's prompts, `attnkit.chat_format.ChatTemplate.conversation_ids`); None: every target."""
    rows: list[list[tuple[int, int]]] = []
    used = seq_len
    for start, stop in cut.tolist():
        if not packed or used + stop - start - 1 > seq_len:
            rows.append([])
            used = 0
        rows[-1].append((start, stop))
        used += stop - start - 1
    shape = (len(rows), seq_len)
    input_ids = np.zeros(shape, dtype=np.int32)
    labels = np.full(shape, IGNORE_INDEX, dtype=np.int32)
    documents = np.zeros(shape, dtype=np.int32)
    positions = np.zeros(shape, dtype=np.int32)
    for r, row in enumerate(rows):
        at = 0
        for d, (start, stop) in enumerate(row):
            n = stop - start - 1
            input_ids[r, at : at + n] = tokens[start : stop - 1]
            targets = tokens[start + 1 : stop]
            labels[r, at : at + n] = targets if trained is None else np.where(trained[start + 1 : stop], targets,
                                                                               IGNORE_INDEX)
            documents[r, at : at + n] = d
            positions[r, at : at + n] = np.arange(n)
            at += n
        documents[r, at:] = len(row)  # padding: a document of its own
        positions[r, at:] = np.arange(seq_len - at)
    return PackedRows(input_ids, labels, documents, positions)
