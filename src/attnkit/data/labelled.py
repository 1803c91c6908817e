"""Labelled text for encoder classifiers: reading TSV/CSV/`<label> <sentence>` files, a label vocabulary,
padded and bucketed batches.

An encoder input is `CLS tokens SEP` when the tokenizer has CLS (BERT's layout), else `BOS tokens EOS`;
the classifier reads the first position.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

from attnkit.data.batching import BucketedData, pad
from attnkit.errors import InputError
from attnkit.textfiles import EncodingErrors, read_text
from attnkit.tokenize import Tokenizer, require_id

TEXT_COLUMNS = ("text", "sentence", "review", "content")
LABEL_COLUMNS = ("label", "labels", "class", "sentiment")


@dataclasses.dataclass(frozen=True)
class LabelledBatch:
    ids: torch.Tensor  # (B, T) int64, begins with CLS (or BOS)
    mask: torch.Tensor  # (B, T) bool, True = real token
    labels: torch.Tensor  # (B,) int64 label ids

    def to(self, device: torch.device | str) -> LabelledBatch:
        return LabelledBatch(self.ids.to(device), self.mask.to(device), self.labels.to(device))


@dataclasses.dataclass(frozen=True)
class LabelVocab:
    """Label strings <-> ids. Sorted (numerically when every label is an integer), so ids are stable."""

    labels: tuple[str, ...]

    @classmethod
    def from_labels(cls, labels: Iterable[str]) -> LabelVocab:
        unique = set(labels)
        numeric = all(label.lstrip("-").isdigit() for label in unique)
        return cls(tuple(sorted(unique, key=(lambda s: (int(s), s)) if numeric else None)))

    def __len__(self) -> int:
        return len(self.labels)

    def encode(self, label: str) -> int:
        try:
            return self.labels.index(label)
        except ValueError:
            raise InputError(f"label {label!r} is not among the known labels {list(self.labels)}") from None

    def decode(self, label_id: int) -> str:
        return self.labels[label_id]

    def save(self, path: str | os.PathLike) -> None:
        """Write `{"labels": [...]}` as JSON (e.g. `runs/NAME/labels.json`)."""
        Path(path).write_text(json.dumps({"labels": list(self.labels)}, indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | os.PathLike) -> LabelVocab:
        try:
            return cls(tuple(json.loads(Path(path).read_text(encoding="utf-8"))["labels"]))
        except (OSError, ValueError, KeyError) as err:
            raise InputError(f"cannot read a label vocabulary from {path}: {err}") from None


def _pick_column(header: list[str], wanted: str | None, defaults: tuple[str, ...], what: str, path) -> int:
    names = [h.strip().lower() for h in header]
    for name in [wanted] if wanted else defaults:
        if name.lower() in names:
            return names.index(name.lower())
    choice = f"column {wanted!r}" if wanted else f"a {what} column (one of {list(defaults)})"
    raise InputError(f"{path}: header {header} has no {choice}; name it with --{what}-column")


def read_labelled(
    path: str | os.PathLike,
    *,
    text_column: str | None = None,
    label_column: str | None = None,
    encoding_errors: EncodingErrors = "strict",
) -> list[tuple[str, str]]:
    """(text, label) examples from a file.

    `.csv` and `.tsv` files need a header row naming a text and a label column (found by the usual names,
    or given); any other file is read as `<label> <sentence>` lines (SST-2's layout). Raises `InputError`
    naming the file and line for an empty text or a missing label, and for an empty file.
    """
    text = read_text(path, errors=encoding_errors)
    suffix = Path(path).suffix.lower()
    if suffix in (".csv", ".tsv"):
        dialect = {"delimiter": ","} if suffix == ".csv" else {"delimiter": "\t", "quoting": csv.QUOTE_NONE}
        rows = [r for r in csv.reader(io.StringIO(text, newline=""), **dialect)]
        if not rows:
            raise InputError(f"{path} is empty")
        t_col = _pick_column(rows[0], text_column, TEXT_COLUMNS, "text", path)
        l_col = _pick_column(rows[0], label_column, LABEL_COLUMNS, "label", path)
        numbered = [
            (n, r[t_col] if t_col < len(r) else "", r[l_col] if l_col < len(r) else "")
            for n, r in enumerate(rows[1:], start=2)
            if any(cell.strip() for cell in r)
        ]
    else:
        numbered = []
        for n, line in enumerate(text.split("\n"), start=1):
            label, _, sentence = line.strip().partition(" ")
            if label:
                numbered.append((n, sentence, label))
    examples = []
    for n, sentence, label in numbered:
        if not label.strip():
            raise InputError(f"{path}, line {n}: the label is empty")
        if not sentence.strip():
            raise InputError(f"{path}, line {n}: the text is empty (label {label.strip()!r})")
        examples.append((sentence.strip(), label.strip()))
    if not examples:
        raise InputError(f"{path} holds no labelled examples")
    return examples


class LabelledData(BucketedData[LabelledBatch]):
    """Tokenized, labelled texts served as `LabelledBatch`es; batching and resume as in `BucketedData`."""

    def __init__(
        self,
        ids: Sequence[Sequence[int]],
        labels: Sequence[int],
        *,
        pad_id: int,
        label_vocab: LabelVocab,
        batch_size: int = 32,
        seed: int = 0,
        bucket_batches: int = 50,
    ) -> None:
        if len(ids) != len(labels):
            raise InputError(f"{len(ids)} texts but {len(labels)} labels")
        self.ids, self.labels = list(ids), np.asarray(labels, dtype=np.int64)
        self.pad_id, self.label_vocab = pad_id, label_vocab
        super().__init__([len(x) for x in self.ids], batch_size=batch_size, seed=seed, bucket_batches=bucket_batches)

    @classmethod
    def from_examples(
        cls,
        examples: Sequence[tuple[str, str]],
        tokenizer: Tokenizer,
        *,
        label_vocab: LabelVocab | None = None,
        max_len: int | None = None,
        **kwargs,
    ) -> LabelledData:
        """Tokenize (text, label) examples as `CLS tokens SEP` (or `BOS tokens EOS`), cut to `max_len`.

        Without `label_vocab` one is built from these labels (do so for the training split and pass it to
        the others). Remaining keyword arguments go to `LabelledData`.
        """
        if max_len is not None and max_len < 2:
            raise InputError(f"max_len must be at least 2, got {max_len}")
        has_cls = tokenizer.token_id("cls") is not None
        first = require_id(tokenizer, "cls" if has_cls else "bos")
        last = require_id(tokenizer, "sep" if tokenizer.token_id("sep") is not None and has_cls else "eos")
        label_vocab = label_vocab or LabelVocab.from_labels(label for _, label in examples)
        keep = None if max_len is None else max_len - 2
        ids = [np.array([first, *tokens[:keep], last]) for tokens in tokenizer.encode_batch([t for t, _ in examples])]
        labels = [label_vocab.encode(label) for _, label in examples]
        return cls(ids, labels, pad_id=require_id(tokenizer, "pad"), label_vocab=label_vocab, **kwargs)

    def collate(self, indices: Sequence[int]) -> LabelledBatch:
        ids, mask = pad([self.ids[i] for i in indices], self.pad_id)  # (B, T)
        return LabelledBatch(ids, mask, torch.from_numpy(self.labels[np.asarray(indices)]))  # labels: (B,)
