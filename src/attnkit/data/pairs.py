"""Parallel corpora for encoder-decoder models: (source, target) sentence pairs as padded, bucketed batches.

Two layouts: two line-aligned files (`train.de` + `train.en`, as Multi30k ships), or one TSV of
`source<TAB>target` lines. One batch, for teacher forcing (tgt_out is tgt_in shifted left by one):

    src_ids   x1  x2  x3  EOS PAD       src_mask  1 1 1 1 0
    tgt_in    BOS y1  y2  PAD PAD       tgt_mask  1 1 1 0 0
    tgt_out   y1  y2  EOS -100 -100     (-100: ignored by the loss)
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence

import numpy as np
import torch

from attnkit.data.batching import IGNORE_INDEX, BucketedData, pad
from attnkit.errors import InputError
from attnkit.textfiles import EncodingErrors, read_lines, read_text, tsv_rows
from attnkit.tokenize import Tokenizer, require_id

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class PairBatch:
    """A batch of pairs. All int64 except the masks (bool, True = real token)."""

    src_ids: torch.Tensor  # (B, S)
    src_mask: torch.Tensor  # (B, S)
    tgt_in: torch.Tensor  # (B, T) begins with BOS
    tgt_out: torch.Tensor  # (B, T) ends with EOS, IGNORE_INDEX at padding
    tgt_mask: torch.Tensor  # (B, T)

    def to(self, device: torch.device | str) -> PairBatch:
        return PairBatch(*(getattr(self, f.name).to(device) for f in dataclasses.fields(self)))

    @property
    def n_tgt_tokens(self) -> int:
        """Target tokens that count towards the loss."""
        return int(self.tgt_mask.sum())


def _drop_empty(pairs: list[tuple[int, str, str]], name: str) -> list[tuple[str, str]]:
    """The (source, target) of `pairs` (line, source, target) with text on both sides; the others are skipped with a
    warning that names their lines (a file whose other side is missing or shifted shows at once)."""
    kept = [(s, t) for _, s, t in pairs if s.strip() and t.strip()]
    if len(kept) < len(pairs):
        lines = [str(n) for n, s, t in pairs if not (s.strip() and t.strip())]
        log.warning("%s: skipped %d of %d pairs with an empty side (line %s%s)", name, len(lines), len(pairs),
                    ", ".join(lines[:5]), f" and {len(lines) - 5} more" if len(lines) > 5 else "")
    if not kept:
        raise InputError(f"{name}: no pairs with text on both sides")
    return kept


def read_parallel(
    src_path: str | os.PathLike, tgt_path: str | os.PathLike, *, encoding_errors: EncodingErrors = "strict"
) -> list[tuple[str, str]]:
    """Pairs from two line-aligned files (line i of one translates line i of the other).

    Raises `InputError` naming both line counts when they differ, and for empty or unreadable files.
    Pairs with an empty side are skipped (with a warning).
    """
    src = read_lines(src_path, errors=encoding_errors)
    tgt = read_lines(tgt_path, errors=encoding_errors)
    if len(src) != len(tgt):
        raise InputError(
            f"parallel files are not line-aligned: {src_path} has {len(src)} lines, {tgt_path} has {len(tgt)}"
        )
    return _drop_empty([(n, s, t) for n, (s, t) in enumerate(zip(src, tgt, strict=True), start=1)],
                       f"{src_path} + {tgt_path}")


def read_tsv_pairs(path: str | os.PathLike, *, encoding_errors: EncodingErrors = "strict") -> list[tuple[str, str]]:
    """Pairs from `source<TAB>target` rows, raw or quoted as csv and pandas write them (`textfiles.tsv_rows`: a text
    holding a tab or a line break in quotes). Raises `InputError` naming a line that lacks a tab or has more than
    one."""
    text = read_text(path, errors=encoding_errors)
    if not text:
        raise InputError(f"{path} is empty")
    pairs = []
    for number, row in enumerate(tsv_rows(text, path, width=2), start=1):
        if not any(cell.strip() for cell in row):
            continue
        if len(row) == 1:
            raise InputError(f"{path}, line {number}: expected 'source<TAB>target', found no tab")
        if len(row) > 2:  # e.g. Tatoeba's pairs with an attribution column: it would end up in the target
            raise InputError(f"{path}, line {number}: expected 'source<TAB>target', found {len(row)} "
                             f"columns; keep the source and target columns only (e.g. cut -f1,2 {path})")
        pairs.append((number, *row))
    return _drop_empty(pairs, str(path))


class PairData(BucketedData[PairBatch]):
    """Tokenized pairs served as `PairBatch`es; batching and resume are described in `BucketedData`."""

    def __init__(
        self,
        src: Sequence[Sequence[int]],
        tgt: Sequence[Sequence[int]],
        *,
        src_pad_id: int,
        tgt_pad_id: int,
        batch_size: int = 32,
        seed: int = 0,
        bucket_batches: int = 50,
        batch_tokens: int | None = None,
    ) -> None:
        """`src` ends with EOS; `tgt` is BOS, tokens, EOS (see `from_pairs`). `batch_tokens` counts a pair's
        source and target tokens (src_ids and tgt_in, padding aside)."""
        if len(src) != len(tgt):
            raise InputError(f"{len(src)} sources but {len(tgt)} targets")
        self.src, self.tgt = list(src), list(tgt)
        self.src_pad_id, self.tgt_pad_id = src_pad_id, tgt_pad_id
        lengths = [max(len(s), len(t) - 1) for s, t in zip(self.src, self.tgt, strict=True)]
        tokens = [len(s) + len(t) - 1 for s, t in zip(self.src, self.tgt, strict=True)]
        super().__init__(lengths, batch_size=batch_size, seed=seed, bucket_batches=bucket_batches,
                         batch_tokens=batch_tokens, tokens=tokens)

    @classmethod
    def from_pairs(
        cls,
        pairs: Sequence[tuple[str, str]],
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer | None = None,
        *,
        max_len: int | None = None,
        **kwargs,
    ) -> PairData:
        """Tokenize pairs: source = tokens + EOS, target = BOS + tokens + EOS. `max_len` caps the source
        (with its EOS) and each of tgt_in / tgt_out by cutting tokens off the end. One tokenizer serves both
        sides unless `tgt_tokenizer` is given. Remaining keyword arguments go to `PairData`.
        """
        tgt_tokenizer = tgt_tokenizer or src_tokenizer
        if max_len is not None and max_len < 2:
            raise InputError(f"max_len must be at least 2, got {max_len}")
        keep = None if max_len is None else max_len - 1
        src_eos = require_id(src_tokenizer, "eos")
        bos, eos = require_id(tgt_tokenizer, "bos"), require_id(tgt_tokenizer, "eos")
        src_ids = src_tokenizer.encode_batch([s for s, _ in pairs])
        tgt_ids = tgt_tokenizer.encode_batch([t for _, t in pairs])
        return cls(
            [np.array([*ids[:keep], src_eos]) for ids in src_ids],
            [np.array([bos, *ids[:keep], eos]) for ids in tgt_ids],
            src_pad_id=require_id(src_tokenizer, "pad"),
            tgt_pad_id=require_id(tgt_tokenizer, "pad"),
            **kwargs,
        )

    def collate(self, indices: Sequence[int]) -> PairBatch:
        src_ids, src_mask = pad([self.src[i] for i in indices], self.src_pad_id)  # (B, S)
        tgt_in, tgt_mask = pad([self.tgt[i][:-1] for i in indices], self.tgt_pad_id)  # (B, T)
        tgt_out, _ = pad([self.tgt[i][1:] for i in indices], IGNORE_INDEX)  # (B, T)
        return PairBatch(src_ids, src_mask, tgt_in, tgt_out, tgt_mask)
