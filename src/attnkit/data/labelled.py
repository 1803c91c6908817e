"""Labelled text for encoder classifiers: reading TSV/CSV/`<label> <sentence>` files, a label vocabulary,
padded and bucketed batches.

An encoder input is `CLS tokens SEP` when the tokenizer has CLS (BERT's layout), else `BOS tokens EOS`;
the classifier reads the first position.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Literal

import numpy as np
import torch

from attnkit.data.batching import BucketedData, pad
from attnkit.errors import InputError
from attnkit.outputs import atomic_write
from attnkit.readback import FileFields, parse_json
from attnkit.textfiles import EncodingErrors, delimited_rows, format_suffix, read_text, tsv_rows
from attnkit.tokenize import Tokenizer, require_id

log = logging.getLogger(__name__)

TEXT_COLUMNS = ("text", "sentence", "review", "content")
LABEL_COLUMNS = ("label", "labels", "class", "sentiment")
JSON_LINES = (".jsonl", ".ndjson")  # one JSON object a line
TABLES = (".csv", ".tsv", *JSON_LINES)  # files of named columns (or keys): a text column, a label column, others
BadLabels = Literal["error", "skip", "keep"]
BAD_LABELS: tuple[str, ...] = ("error", "skip", "keep")
ALIKE_SHARE = 0.9  # a label written unlike the labels of this share of the lines is suspect
RARE_LINES = 5  # a label on fewer lines than this is suspect ...
RARE_RATIO = 10  # ... when another label is on this many times as many lines
NUMBER = re.compile(r"[-+]?\d+(\.\d+)?")
FORMS = {  # how a label is written -> (one, many), for messages
    "number": ("a number", "numbers"), "upper": ("an upper-case word", "upper-case words"),
    "lower": ("a lower-case word", "lower-case words"), "capitalised": ("a capitalised word", "capitalised words"),
    "mixed": ("a word", "words"),
}


@dataclasses.dataclass(frozen=True)
class LabelledBatch:
    ids: torch.Tensor  # (B, T) int64, begins with CLS (or BOS)
    attention_mask: torch.Tensor  # (B, T) bool, True = real token
    labels: torch.Tensor  # (B,) int64 label ids

    def to(self, device: torch.device | str) -> LabelledBatch:
        return LabelledBatch(self.ids.to(device), self.attention_mask.to(device), self.labels.to(device))


@dataclasses.dataclass(frozen=True)
class LabelVocab:
    """Label strings <-> ids. Sorted (numerically when every label is an integer), so ids are stable."""

    labels: tuple[str, ...]

    @classmethod
    def from_labels(cls, labels: Iterable[str], *, order: Sequence[str] | None = None) -> LabelVocab:
        """The labels, sorted; or in `order` where `order` holds the same labels (a fine-tuned source's order: its
        head has a row for each, in that order)."""
        unique = set(labels)
        if order is not None and set(order) == unique and len(order) == len(unique):
            return cls(tuple(order))
        numeric = all(label.lstrip("-").isdecimal() for label in unique)  # what int() reads (not '²')
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
        """Write `{"labels": [...]}` as JSON (e.g. `runs/NAME/labels.json`), whole or not at all."""
        atomic_write(path, json.dumps({"labels": list(self.labels)}, indent=1) + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> LabelVocab:
        """The vocabulary `save` wrote. Raises InputError naming the file and the fix for one that cannot be read, is
        not JSON (`readback`), or whose "labels" is not a list of one or more distinct strings."""
        fix = 'write it again as {"labels": ["a", "b", ...]}, each label once (LabelVocab.save writes it so)'
        try:
            fields = FileFields.read(path, fix=fix)
        except OSError as err:
            raise InputError(f"cannot read a label vocabulary from {path}: {err.strerror or err}") from None
        labels = fields.strings("labels")
        repeated = sorted(label for label, times in Counter(labels).items() if times > 1)
        if not labels or repeated:
            fields.refuse("labels", labels, f"one or more distinct labels ({', '.join(map(repr, repeated))} "
                          "given more than once)" if repeated else "one or more distinct labels")
        return cls(tuple(labels))


def _pick_column(header: list[str], wanted: str | None, defaults: tuple[str, ...], what: str, path,
                 delimiter: str) -> int:
    names = [h.strip().lower() for h in header]
    for name in [wanted] if wanted else defaults:
        if name.lower() in names:
            return names.index(name.lower())
    if wanted:
        raise InputError(f"{path}: the header {header} has no column {wanted!r}; name one of its columns")
    raise InputError(
        f"{path}: the header (the first line) {header} has no {what} column (one of {list(defaults)}); add a header "
        f"line naming the columns, e.g. {delimiter.join(('text', 'label'))!r}, or rename the {what} column to one of "
        "these"
    )


def read_labelled(
    path: str | os.PathLike,
    *,
    text_column: str | None = None,
    label_column: str | None = None,
    encoding_errors: EncodingErrors = "strict",
    bad_labels: BadLabels = "error",
    known: Sequence[str] | None = None,
) -> list[tuple[str, str]]:
    """(text, label) examples from a file.

    `.csv` and `.tsv` files need a header row naming a text and a label column (found by the usual names,
    or given); `.jsonl` files one JSON object a line, with text and label keys named so; any other file is read
    as `<label> <sentence>` lines (SST-2's layout: the first word, up to a space or tab, is the label). Raises
    `InputError` naming the file and line for an empty text or label, and for an empty file.

    Lines whose label looks wrong are what a missing label or a stray space leaves behind, so they are not turned
    silently into classes (`_suspect_labels` says which look wrong). With `known`, the labels a line may have (the
    training data's, for validation data; the run's, for evaluation), a label outside them looks wrong, and any label
    among them is right, however rare. `bad_labels="error"` (the default) raises naming the first such line and
    counting the others, "skip" leaves them out with a warning that counts them, "keep" reads them as they are
    (not with `known`: a label outside it has no class, so its lines are an error unless skipped).
    """
    if bad_labels not in BAD_LABELS:
        raise InputError(f"bad_labels={bad_labels!r}: choose one of {', '.join(BAD_LABELS)}")
    text = read_text(path, errors=encoding_errors)
    fields = [(text_column, TEXT_COLUMNS, "text"), (label_column, LABEL_COLUMNS, "label")]
    if format_suffix(path) in TABLES:
        numbered = _table(text, path, fields)
    else:
        numbered = []
        for n, line in enumerate(text.split("\n"), start=1):
            label, *rest = line.strip().split(maxsplit=1) or [""]
            if label:
                numbered.append((n, rest[0] if rest else "", label))
    examples = []
    for n, sentence, label in numbered:
        if not label.strip():
            raise InputError(f"{path}, line {n}: the label is empty")
        if not sentence.strip():
            raise InputError(f"{path}, line {n}: the text is empty (label {label.strip()!r})")
        examples.append((n, sentence.strip(), label.strip()))
    if not examples:
        raise InputError(f"{path} holds no labelled examples")
    if known is not None:
        suspects = {n: f"the label {label!r} is not among the known labels {list(known)}: is the line missing its "
                       "label?" for n, _, label in examples if label not in known}
        fixes = "leave such lines out (--bad-labels skip)"
    else:
        suspects = _suspect_labels(examples) if bad_labels != "keep" else {}
        fixes = "leave such lines out (--bad-labels skip) or read them as they are (--bad-labels keep)"
    if suspects and bad_labels != "skip":
        n, why = next(iter(suspects.items()))
        more = list(suspects)[1:]
        others = f"; {len(more)} more line(s) like it: {_lines(more)}" if more else ""
        raise InputError(f"{path}, line {n}: {why}{others}. Fix the file, or {fixes}")
    kept = [(sentence, label) for n, sentence, label in examples if n not in suspects]
    if not kept:
        n, why = next(iter(suspects.items()))
        raise InputError(f"{path}: every line's label looks wrong, so none is left to read (line {n}: {why})")
    if suspects:
        log.warning("%s: left out %d line(s) whose label looks wrong (bad_labels=skip): %s", path, len(suspects),
                    _lines(list(suspects)))
    return kept


Field = tuple[str | None, tuple[str, ...], str]  # a column or key: the name given (or None), the usual names, what


def read_texts(path: str | os.PathLike, *, text_column: str | None = None,
               encoding_errors: EncodingErrors = "strict") -> list[str] | None:
    """The texts of a CSV, TSV or JSON Lines file's text column or key (as `read_labelled` finds it; other columns,
    a label among them, are left), or None for a file of another kind (its lines are its texts). Raises InputError
    as `read_labelled` does for a header, row or line it cannot read."""
    if format_suffix(path) not in TABLES:
        return None
    rows = _table(read_text(path, errors=encoding_errors), path, [(text_column, TEXT_COLUMNS, "text")])
    return [text for _, text in rows]


def _table(text: str, path: str | os.PathLike, fields: list[Field]) -> list[tuple]:
    """(line, *cells) of a CSV/TSV file with a header, or of a JSON Lines file, one cell for each of `fields`
    (`_pick_column` finds a column); rows of blank cells skipped."""
    suffix = format_suffix(path)
    if suffix in JSON_LINES:
        return _json_lines(text, path, fields)
    dialect = {"delimiter": ","} if suffix == ".csv" else {"delimiter": "\t", "quoting": csv.QUOTE_NONE}
    rows = delimited_rows(text, path, **dialect) if suffix == ".csv" else tsv_rows(text, path)
    if not rows:
        raise InputError(f"{path} is empty")
    columns = [_pick_column(rows[0], wanted, usual, what, path, dialect["delimiter"]) for wanted, usual, what in fields]
    _check_widths(rows, path, suffix)
    return [(n, *(r[c] if c < len(r) else "" for c in columns)) for n, r in enumerate(rows[1:], start=2)
            if any(cell.strip() for cell in r)]


def _json_lines(text: str, path: str | os.PathLike, fields: list[Field]) -> list[tuple]:
    """(line, *values) of a JSON Lines file: one object a line (as `datasets`' `to_json` writes a split), a value
    for each of `fields`, under the usual keys (`TEXT_COLUMNS`, `LABEL_COLUMNS`) or the ones given; blank lines
    skipped. A number or true/false is read as written in JSON (1, true). Raises InputError naming the line (also
    for a key given twice, or a line nested too deeply: `readback.parse_json`)."""
    numbered = []
    for n, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        row = parse_json(line, f"{path}, line {n}", fix="a JSON Lines file holds one object a line, e.g. "
                         "{\"text\": \"a fine film\", \"label\": 1}")
        if not isinstance(row, dict):
            raise InputError(f"{path}, line {n} holds a JSON {type(row).__name__}, not an object: write each "
                             "example as {\"text\": ..., \"label\": ...}")
        cells = []
        for wanted, defaults, what in fields:
            keys = {str(k).strip().lower(): k for k in row}
            key = next((keys[name.lower()] for name in ([wanted] if wanted else defaults) if name.lower() in keys),
                       None)
            if key is None:
                names = [wanted] if wanted else list(defaults)
                raise InputError(f"{path}, line {n} has no {what} key (one of {names}; it has {list(row)}): "
                                 f"rename its {what} key to one of these")
            value = row[key]
            if isinstance(value, dict | list) or value is None:
                raise InputError(f"{path}, line {n}: the {what} {json.dumps(value)} is a "
                                 f"{'null' if value is None else type(value).__name__}; a {what} is a string"
                                 f"{' or a number' if what == 'label' else ''}")
            cells.append(json.dumps(value) if isinstance(value, bool) else str(value))
        numbered.append((n, *cells))
    return numbered


def _check_widths(rows: list[list[str]], path: str | os.PathLike, suffix: str) -> None:
    """Refuse a row with more (non-empty) fields than the header: an unquoted comma, or a tab in a TSV text, splits
    the text in two, and reading its first part as the text would drop the rest without a word."""
    width = len(rows[0])
    for n, row in enumerate(rows[1:], start=2):
        if len(row) > width and any(cell.strip() for cell in row[width:]):
            fix = ('a comma inside a text must be quoted ("great, fun movie")' if suffix == ".csv" else
                   "a text cannot hold a tab in a TSV file (replace it with a space, or save the file as CSV)")
            raise InputError(f"{path}, line {n}: {len(row)} fields where the header has {width}: {fix}")


def _suspect_labels(examples: list[tuple[int, str, str]]) -> dict[int, str]:
    """{line: why} for the lines whose label looks like the first word of a line that lacks its label.

    The labels of a data set are a few classes, each on many lines and all written alike (SST's 0 and 1, TREC's
    DESC and ENTY, AG News' World and Sports). A line without its label gives its first word as the label: a word of
    text, written as text is, and, the first words of sentences being many, each on few lines. So a label is suspect
    when it
      - holds whitespace (a label is one word);
      - is written unlike the labels of `ALIKE_SHARE` of the lines or more (`_form`: a lower-case word among
        numbers or capitalised words), however many lines it is on;
      - is on fewer than `RARE_LINES` lines while another label is on `RARE_RATIO` times as many: too few lines to
        learn a class from or to score it, so far likelier a sentence's first word.
    An imbalanced data set passes as long as its classes are written alike and each is on `RARE_LINES` lines or
    more, or on a tenth as many lines as the largest or more; a rarer class is read with bad_labels="keep". What
    this cannot tell from a class: `RARE_LINES` or more lines lacking their label that begin with one word written
    like the labels (`the` among `pos` and `neg`).
    """
    counts = Counter(label for _, _, label in examples)
    top, most = counts.most_common(1)[0]
    forms: Counter[str] = Counter()
    for label, count in counts.items():
        forms[_form(label)] += count
    usual, usual_lines = forms.most_common(1)[0]
    share = usual_lines / len(examples)
    alike = [label for label, _ in counts.most_common() if _form(label) == usual][:3]
    suspects = {}
    for n, _, label in examples:
        if any(c.isspace() for c in label):
            suspects[n] = f"the label {label!r} holds whitespace (a label is one word)"
        elif share >= ALIKE_SHARE and _form(label) != usual:
            suspects[n] = (f"the label {label!r} is {FORMS[_form(label)][0]}, where {share:.0%} of the lines have "
                           f"{FORMS[usual][1]} ({', '.join(map(repr, alike))}): is the line missing its label?")
        elif counts[label] < RARE_LINES and counts[label] * RARE_RATIO <= most:
            lines = f"{counts[label]} line{'s' if counts[label] > 1 else ''}"
            suspects[n] = (f"the label {label!r} is on {lines} only, where {top!r} is on {most}: is the line missing "
                           "its label?")
    return suspects


def _form(label: str) -> str:
    """How a label is written, one of `FORMS`: a number (0, -1, 4.5), upper case (DESC), lower case (pos),
    capitalised (World, Sci/Tech) or another mix (iPhone)."""
    if NUMBER.fullmatch(label):
        return "number"
    if label.isupper():
        return "upper"
    if label.islower():
        return "lower"
    return "capitalised" if label.istitle() else "mixed"


def _lines(numbers: list[int]) -> str:
    shown = ", ".join(map(str, numbers[:5]))
    return shown + (f" and {len(numbers) - 5} more" if len(numbers) > 5 else "")


def frame_ids(tokenizer: Tokenizer, *, own: bool = False) -> tuple[list[int], list[int]]:
    """(before, after): the ids a text is framed with, `before tokens after`, the one place that decides it. attnkit's
    framing: CLS and SEP when the tokenizer has CLS (BERT's layout; EOS when it has no SEP), else BOS and EOS.
    `own`: what the tokenizer's own post-processor adds (a model converted from Hugging Face learned its texts so:
    CLS and SEP for BERT's, BOS for Llama's, nothing for GPT-2's). Raises InputError naming a missing token."""
    if own:
        before, after = tokenizer.own_frame
        return list(before), list(after)
    has_cls = tokenizer.token_id("cls") is not None
    first = require_id(tokenizer, "cls" if has_cls else "bos")
    return [first], [require_id(tokenizer, "sep" if tokenizer.token_id("sep") is not None and has_cls else "eos")]


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
        batch_tokens: int | None = None,
    ) -> None:
        if len(ids) != len(labels):
            raise InputError(f"{len(ids)} texts but {len(labels)} labels")
        self.ids, self.labels = list(ids), np.asarray(labels, dtype=np.int64)
        self.pad_id, self.label_vocab = pad_id, label_vocab
        super().__init__([len(x) for x in self.ids], batch_size=batch_size, seed=seed, bucket_batches=bucket_batches,
                         batch_tokens=batch_tokens)

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
        first, last = frame_ids(tokenizer)
        label_vocab = label_vocab or LabelVocab.from_labels(label for _, label in examples)
        keep = None if max_len is None else max_len - len(first) - len(last)
        ids = [np.array([*first, *tokens[:keep], *last]) for tokens in tokenizer.encode_batch([t for t, _ in examples])]
        labels = [label_vocab.encode(label) for _, label in examples]
        return cls(ids, labels, pad_id=require_id(tokenizer, "pad"), label_vocab=label_vocab, **kwargs)

    def collate(self, indices: Sequence[int]) -> LabelledBatch:
        ids, mask = pad([self.ids[i] for i in indices], self.pad_id)  # (B, T)
        return LabelledBatch(ids, mask, torch.from_numpy(self.labels[np.asarray(indices)]))  # labels: (B,)
