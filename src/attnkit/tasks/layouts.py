"""What kind of labelled file a file is, by its layout: tagged sentences (a tagger's) or labelled texts (a
classifier's), so `attnkit eval` names a file given to a run of the other kind instead of reading CoNLL tokens as
class labels or a text's words as tags.

    tagged      a .conllu file, or CoNLL: lines of a fixed number of columns (a word, its tag, maybe columns
                between) in sentences separated by blank lines, the tags (last column) fewer than the words
    labelled    a .csv/.tsv file whose header names a text and a label column, a .jsonl file, or one example a
                line with no blank lines between them: a label and texts of varying numbers of words

The rules are strict on purpose: a file they do not recognise is read as the run's kind, whose reader names any
line it cannot read.
"""

from __future__ import annotations

import csv
import io
import statistics
from collections import Counter
from pathlib import Path
from typing import Literal

from attnkit.data.labelled import JSON_LINES, LABEL_COLUMNS, TEXT_COLUMNS
from attnkit.errors import InputError
from attnkit.tasks.conll import is_conllu
from attnkit.textfiles import EncodingErrors, format_suffix, read_text

Layout = Literal["tagged", "labelled"]
KIND = {"tagged": "tagged sentences", "labelled": "labelled texts"}
RUN = {"tagged": "a tagger", "labelled": "a classifier"}
FORMAT = {"tagged": "CoNLL files (a word and its tag per line, a blank line between sentences) or .conllu files",
          "labelled": "'<label> <text>' lines, CSV/TSV files with text and label columns, or JSON Lines"}
FIXED_COLUMNS = 0.95  # share of a CoNLL file's lines with its usual number of columns, at least


def layout_of(path: str | Path, *, encoding_errors: EncodingErrors = "strict") -> tuple[Layout, str] | None:
    """The file's layout and what shows it (module docstring), or None when neither is plain."""
    path = Path(path)
    if is_conllu(path):
        return "tagged", "a .conllu file"
    suffix = format_suffix(path)
    if suffix in JSON_LINES:
        return "labelled", "a JSON Lines file"
    text = read_text(path, errors=encoding_errors)
    if suffix in (".csv", ".tsv"):
        delimiter = "," if suffix == ".csv" else "\t"
        header = {cell.strip().lower() for cell in next(csv.reader(io.StringIO(text), delimiter=delimiter), [])}
        if header & set(TEXT_COLUMNS) and header & set(LABEL_COLUMNS):
            return "labelled", "a header naming text and label columns"
    blocks: list[list[list[str]]] = [[]]  # runs of lines between blank lines, each line's fields
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            blocks.append([])
        elif fields[0] != "-DOCSTART-":
            blocks[-1].append(fields)
    blocks = [block for block in blocks if block]
    rows = [fields for block in blocks for fields in block]
    if len(rows) < 2:
        return None
    columns, usual = Counter(map(len, rows)).most_common(1)[0]
    fixed = usual >= FIXED_COLUMNS * len(rows)
    if fixed and columns >= 2 and len(blocks) >= 2 and max(map(len, blocks)) >= 2 and (
            len({r[-1] for r in rows}) <= len({r[0] for r in rows})):
        return "tagged", f"{columns} columns a line, in sentences separated by blank lines"
    if len(blocks) == 1 and not fixed and statistics.median(map(len, rows)) >= 3:
        return "labelled", "one example a line: a label and a text of varying length"
    return None


def check_layout(path: str | Path, wanted: Layout, *, encoding_errors: EncodingErrors = "strict") -> None:
    """Refuse a file laid out for the other kind of run than `wanted` (`layout_of`), naming what it holds, what the
    run reads and which run scores it."""
    found = layout_of(path, encoding_errors=encoding_errors)
    if found is not None and found[0] != wanted:
        layout, why = found
        raise InputError(f"{path} looks like {KIND[layout]} for {RUN[layout]} ({why}), but this run is "
                         f"{RUN[wanted]}, scored on {FORMAT[wanted]}; score the file with {RUN[layout]} run, or give "
                         "this run a file of its own kind")
