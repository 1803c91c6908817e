"""Text files: read UTF-8 (gzip-compressed or not) with clear errors, cut long texts into line-aligned pieces, and
read the rows of CSV and TSV files (labelled text and translation pairs read them alike).

The bottom of the text side: `tokenize.py` trains on files read here and `data/` builds its corpora from them,
so both import this module and neither imports the other for it.
"""

from __future__ import annotations

import csv
import gzip
import io
import os
import re
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Literal

from attnkit.errors import InputError

EncodingErrors = Literal["strict", "replace"]


REPLACE_FIX = "convert the file to UTF-8, or pass --encoding-errors replace to substitute U+FFFD"
# byte-order marks of wider encodings (UTF-32's first: its little-endian mark begins as UTF-16's does)
WIDE_MARKS = (("UTF-32", (b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")), ("UTF-16", (b"\xff\xfe", b"\xfe\xff")))
GZIP_MAGIC = b"\x1f\x8b"  # a gzip stream's first two bytes (RFC 1952), whatever the file's name


def decode_bytes(data: bytes, *, name: str, errors: EncodingErrors = "strict", fix: str = REPLACE_FIX) -> str:
    """Decode UTF-8 (a leading byte-order mark is dropped).

    Raises `InputError` naming `name` and the byte offset for a NUL byte (a binary file) or, with
    `errors="strict"`, for bytes that are not UTF-8, then `fix` (a file a command reads with no --encoding-errors
    names its own); `errors="replace"` turns those into U+FFFD.
    """
    wide = next((name for name, marks in WIDE_MARKS if data.startswith(marks)), None)
    if wide is not None:
        raise InputError(f"{name} is {wide} text (its byte-order mark says so); attnkit reads UTF-8: convert it "
                         f"(iconv -f {wide} -t UTF-8)")
    nul = data.find(b"\x00")
    if nul >= 0:
        raise InputError(f"{name} looks like a binary file (NUL byte at offset {nul}); attnkit reads UTF-8 text: "
                         + (_unmarked_wide(data) or "leave it out of the data (a glob such as 'folder/**/*.txt' "
                            "takes a folder's text files alone)"))
    try:
        return data.decode("utf-8-sig", errors=errors)
    except UnicodeDecodeError as err:
        raise InputError(
            f"{name} is not valid UTF-8: byte 0x{data[err.start]:02x} at offset {err.start} ({fix})"
        ) from None


def _unmarked_wide(data: bytes) -> str:
    """The fix for a file's head of UTF-32 or UTF-16 written without a byte-order mark (NUL bytes in three of every
    four places, or in every other place); "" for other NUL bytes. UTF-32 is tried first: its text also has NUL
    bytes in every other place."""
    head = data[:1024]
    for order, top, plane in (("LE", head[3::4], head[2::4]), ("BE", head[::4], head[1::4])):
        if len(head) >= 4 and top.count(0) == len(top) and max(plane) <= 0x10:  # code points up to U+10FFFF
            return (f"it reads as UTF-32{order} text without a byte-order mark: convert it "
                    f"(iconv -f UTF-32{order} -t UTF-8)")
    for order, nuls in (("LE", head[1::2]), ("BE", head[::2])):
        if len(head) >= 2 and nuls.count(0) == len(nuls):
            return (f"it reads as UTF-16{order} text without a byte-order mark: convert it "
                    f"(iconv -f UTF-16{order} -t UTF-8)")
    return ""


def format_suffix(path: str | os.PathLike) -> str:
    """The suffix that says how a file is laid out, lower-cased, past a '.gz' (reviews.CSV.gz -> '.csv'), which
    `read_text` opens."""
    path = Path(path)
    if path.suffix.lower() == ".gz":
        path = path.with_suffix("")
    return path.suffix.lower()


def special_file(path: str | os.PathLike) -> str | None:
    """What `path` is when it exists but is neither a regular file nor a directory ("a FIFO", "a character device",
    ...), else None. Reading such a file can block forever (a FIFO) or never end (/dev/zero)."""
    path = Path(path)
    kinds = (("a FIFO", path.is_fifo), ("a character device", path.is_char_device),
             ("a block device", path.is_block_device), ("a socket", path.is_socket))
    return next((name for name, test in kinds if test()), None)


def read_text(path: str | os.PathLike, *, errors: EncodingErrors = "strict", fix: str = REPLACE_FIX) -> str:
    """Read one UTF-8 text file, gzip-compressed or not (told by its first bytes); see `decode_bytes` for what is
    raised (`fix`: what its error proposes). A FIFO, device or socket is refused, and so is a damaged or cut-off
    gzip file."""
    path = Path(path)
    kind = special_file(path)
    if kind is not None:
        raise InputError(f"{path} is {kind}, not a regular file; save the text to a file and give that path")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise InputError(f"cannot read {path}: {err.strerror}") from None
    if data.startswith(GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:  # BadGzipFile is an OSError; a cut-off stream an EOFError
            raise InputError(f"{path} is a damaged gzip file ({err}); compress the text again (gzip -t {path} "
                             "checks a file)") from None
    return decode_bytes(data, name=str(path), errors=errors, fix=fix)


def iter_texts(source: Iterable[str | os.PathLike], *, errors: EncodingErrors = "strict") -> Iterator[str]:
    """The text of each item in turn: a `str` is text itself, a path (`os.PathLike`) is read with `read_text`."""
    for item in source:
        yield read_text(item, errors=errors) if isinstance(item, os.PathLike) else item


def read_lines(path: str | os.PathLike, *, errors: EncodingErrors = "strict") -> list[str]:
    """The lines of a text file, without line endings (LF or CRLF). Only those two end a line, so
    line-aligned files stay aligned whatever other separators (U+2028, form feed) their text holds.
    Raises `InputError` for an empty file.
    """
    text = read_text(path, errors=errors)
    if not text:
        raise InputError(f"{path} is empty")
    return lines_of(text)


def lines_of(text: str) -> list[str]:
    """The lines of `text`, as `read_lines` splits a file's."""
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


LINE_REACH = 4  # `split_text` looks this many pieces' lengths ahead for a line end before it cuts inside a line
_LINE_START = re.compile(r"\n(?=\S)")  # a newline before a word: a cut there splits no run of white space
_WORD_START = re.compile(r"(?<=\S) ")  # a space after a word: where every tokenizer here splits anyway
_BETWEEN_WORDS = re.compile(r"(?<=\S) (?=\S)")  # one space between two words


def split_text(text: str, size: int, *, space_before_text: bool = False) -> list[str]:
    """`text` in pieces of at least `size` characters (the last may be shorter), so that the pieces tokenized one by
    one give the whole text's tokens. Each is cut just after a newline that a word follows (a cut inside a run of
    newlines or before an indented line would split a token such as GPT-2's 'ĊĊ' or 'ĠĠ'). A line running past
    LINE_REACH * `size` (a file of one huge line) is cut just before a space that follows a word, which keeps the
    tokens ('Ġword' and '▁word' take the space with them; WordPiece and char tokens never span it).

    `space_before_text`: the tokenizer puts '▁' before every text it encodes (Llama's and Mistral's SentencePiece
    normalizer or Metaspace pre-tokenizer): it would add one '▁' at a cut after a newline, so the text is cut only at
    a space between two words, and that space is left out of the pieces, as the '▁' put before the next one stands
    for it. Where no such place is near (a word or a run of text with no space longer than LINE_REACH * `size`), the
    text is cut at `size`, inside a word, where its tokens may differ from the whole text's.
    """
    pieces, start = [], 0
    while start < len(text):
        reach = start + LINE_REACH * size
        line = None if space_before_text else _LINE_START.search(text, start + size, reach)
        if line:
            end = after = line.end()
        elif reach >= len(text):
            end = after = len(text)
        else:
            space = (_BETWEEN_WORDS if space_before_text else _WORD_START).search(text, start + size, reach)
            end = space.start() if space else start + size
            after = end + 1 if space and space_before_text else end
        pieces.append(text[start:end])
        start = after
    return pieces


def delimited_rows(text: str, path: str | os.PathLike, **dialect) -> list[list[str]]:
    """The rows of a CSV or TSV file's `text`. The csv module refuses a field longer than its limit (131,072
    characters by default); a long document is a text like any other (cut to the model's context when encoded),
    so the limit is lifted to the text's length while it is read. Raises InputError naming the line it cannot read."""
    limit = csv.field_size_limit()
    csv.field_size_limit(max(limit, len(text)))
    reader = csv.reader(io.StringIO(text, newline=""), **dialect)
    try:
        return list(reader)
    except csv.Error as err:
        raise InputError(f"{path}, line {reader.line_num}: {err}; fix the line (a quote left open, a stray byte)"
                         ) from None
    finally:
        csv.field_size_limit(limit)


def tsv_rows(text: str, path: str | os.PathLike, *, width: int | None = None) -> list[list[str]]:
    """The rows of a TSV file, which come two ways: raw (GLUE's SST-2: a quote is a character of the text) and quoted
    as Python's csv module and pandas' `to_csv(sep="\\t")` write them (a text holding a tab, a line break or a quote
    put in quotes, its quotes doubled). A file with a field that opens with a quote is read as quoted only where
    csv would write the rows so read as the file is (a quoted text holds a tab, a line break or a quote; no other
    text holds a quote), each row `width` fields wide (the header's if None), and the quotes join no lines that are
    rows of that width raw. So `"a title"`, and a quote opened on one line and closed on a later one (`" hello<TAB>0`
    then `world "<TAB>1`), are raw text; a quoted text made of whole rows is read raw too (the two look alike)."""
    raw = delimited_rows(text, path, delimiter="\t", quoting=csv.QUOTE_NONE)
    if not any(cell.startswith('"') for row in raw for cell in row):
        return raw
    try:
        quoted = delimited_rows(text, path, delimiter="\t", strict=True)
    except InputError:  # a quote inside a raw text: "the movie" is bad
        return raw
    width = len(quoted[0]) if width is None and quoted else width
    if not all(len(row) == width for row in quoted if row):
        return raw
    raw_whole = all(len(row) == width for row in raw if row)
    if raw_whole and len(quoted) != len(raw):  # a raw quote left open on one line and closed on another
        return raw
    written = io.StringIO()
    csv.writer(written, delimiter="\t", lineterminator="\n").writerows(quoted)
    rewritten, given = (body.replace("\r\n", "\n").rstrip("\n") for body in (written.getvalue(), text))
    return quoted if rewritten == given else raw
