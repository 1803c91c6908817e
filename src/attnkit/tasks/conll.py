"""Token-tagged text: CoNLL-style files and CoNLL-U, read into sentences of (words, tags), and the BIO/BIOES
consistency check of entity tags.

    CoNLL (.conll, .txt, ...)   one token per line, its tag in the last column (the token in the first; columns
                                between, such as CoNLL-2003's POS and chunk tags, are ignored); a blank line ends a
                                sentence; `-DOCSTART-` lines are skipped
    CoNLL-U (.conllu)           read by the `conllu` package; the tag is the column `column` names (upos, xpos,
                                deprel, or a MISC key such as NER); multiword-token ranges and empty nodes skipped

Entity tags (Ramshaw & Marcus 1995; BIOES as in Ratinov & Roth 2009): `O` outside an entity, `B-TYPE` its first
word, `I-TYPE` a word inside it, and in BIOES `E-TYPE` its last word and `S-TYPE` a one-word entity. Tags in
neither form (part-of-speech tags) are plain labels, scored by accuracy alone.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

from attnkit.errors import InputError
from attnkit.textfiles import EncodingErrors, format_suffix, read_text

Sentence = tuple[list[str], list[str]]  # words, their tags
SCHEMES = ("BIO", "BIOES")
_CONLLU_FIELDS = ("form", "lemma", "upos", "xpos", "feats", "head", "deprel", "deps", "misc")


def is_conllu(path: str | Path) -> bool:
    """Whether `path` is read as CoNLL-U (by its suffix, .conllu in any case), else as CoNLL."""
    return format_suffix(path) == ".conllu"


def read_tagged(path: str | Path, *, column: str = "upos", encoding_errors: EncodingErrors = "strict",
                option: str = "--tag-column") -> list[Sentence]:
    """The sentences of a CoNLL or CoNLL-U file (module docstring; `.conllu` files by their suffix). `option`: the
    flag that chooses `column` where the reading is asked for (a refusal names it).

    Raises InputError naming the file and line of a line without a tag or with other columns than the lines before
    it (not a CoNLL table), a token without a value in `column`, or a file without sentences.
    """
    path = Path(path)
    text = read_text(path, errors=encoding_errors)
    sentences = _read_conllu(text, path, column, option) if is_conllu(path) else _read_conll(text, path)
    if not sentences:
        raise InputError(f"{path} holds no tagged sentences: write one token and its tag per line, a blank line "
                         "between sentences (CoNLL), or give a .conllu file")
    return sentences


def _read_conll(text: str, path: Path) -> list[Sentence]:
    sentences: list[Sentence] = []
    words: list[str] = []
    tags: list[str] = []
    columns: tuple[int, int] | None = None  # (the first token line's number, its column count): a CoNLL file is a table
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields or fields[0] == "-DOCSTART-":
            if words:
                sentences.append((words, tags))
                words, tags = [], []
            continue
        if len(fields) < 2:
            raise InputError(f"{path}:{number}: {line.strip()!r} has no tag; a CoNLL line is a token and its tag "
                             "(separated by spaces or a tab), a blank line between sentences")
        columns = columns or (number, len(fields))
        if len(fields) != columns[1]:
            raise InputError(f"{path}:{number}: {line.strip()[:60]!r} has {len(fields)} columns where line "
                             f"{columns[0]} has {columns[1]}: this is not a CoNLL file (one token per line and the "
                             "same columns on every line, its tag last; a blank line between sentences)")
        words.append(fields[0])
        tags.append(fields[-1])
    if words:
        sentences.append((words, tags))
    return sentences


def _read_conllu(text: str, path: Path, column: str, option: str) -> list[Sentence]:
    import conllu

    sentences: list[Sentence] = []
    try:
        for sentence in conllu.parse_incr(io.StringIO(text)):
            words = [t for t in sentence if isinstance(t["id"], int)]  # no multiword ranges, no empty nodes
            if words:
                sentences.append(([t["form"] for t in words], [_column(t, column, path, option) for t in words]))
    except conllu.exceptions.ParseException as err:
        raise InputError(f"{path} is not valid CoNLL-U: {err}") from None
    return sentences


def _column(token, column: str, path: Path, option: str) -> str:
    if column in _CONLLU_FIELDS:
        value = token[column]
    else:  # a key of the MISC column, e.g. NER=B-PER
        value = (token["misc"] or {}).get(column)
    if value is None or value == "_":
        raise InputError(f"{path}: the token {token['form']!r} has no {column!r} value; choose the column of tags "
                         f"with {option} ({', '.join(_CONLLU_FIELDS[1:])}, or a MISC key such as NER)")
    return str(value)


def write_conll(path: str | Path, sentences: Sequence[Sentence]) -> None:
    """Sentences as a CoNLL file: `word<TAB>tag` lines, a blank line after each sentence."""
    text = "".join("".join(f"{w}\t{t}\n" for w, t in zip(words, tags, strict=True)) + "\n" for words, tags in sentences)
    Path(path).write_text(text, encoding="utf-8")


def tag_scheme(tags: set[str]) -> str | None:
    """"BIOES" when some tag starts E- or S-, "BIO" when every tag is O or B-/I-TYPE, else None (plain labels)."""
    prefixes = {t.split("-", 1)[0] for t in tags if t != "O"}
    if not all("-" in t for t in tags if t != "O") or not prefixes <= set("BIES"):
        return None
    return "BIOES" if prefixes & {"E", "S"} else "BIO"


def check_scheme(sentences: Sequence[Sentence], scheme: str, where: str) -> None:
    """Raise InputError at the first tag that breaks `scheme` (an I- that continues no entity of its type, in
    BIOES also an entity left open or an E- that closes none), naming the sentence, the word and the fix."""
    for index, (words, tags) in enumerate(sentences, 1):
        previous = "O"
        for word, tag in zip([*words, "(end)"], [*tags, "O"], strict=True):
            problem = _transition(previous, tag, scheme)
            if problem:
                raise InputError(f"{where}, sentence {index}: {problem} at {word!r} ({' '.join(tags)}); fix the tags "
                                 f"or convert the file to {scheme} (seqeval, or the corpus's own tools)")
            previous = tag


def _transition(previous: str, tag: str, scheme: str) -> str | None:
    before, before_type = (previous.split("-", 1) + [""])[:2]
    prefix, kind = (tag.split("-", 1) + [""])[:2]
    open_entity = before in ("B", "I")
    if prefix in ("I", "E") and not (open_entity and before_type == kind):
        return f"{tag} follows {previous}, so it continues no {kind} entity"
    if scheme == "BIOES" and open_entity and prefix not in ("I", "E"):
        return f"{previous} opens an entity that {tag} leaves unclosed (BIOES ends each with E- or S-)"
    return None
