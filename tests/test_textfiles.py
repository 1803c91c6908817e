"""Text files: clear errors on bad text, lines, line-aligned pieces, and texts from strings and paths."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from attnkit.errors import InputError
from attnkit.textfiles import iter_texts, read_lines, read_text, split_text


def test_binary_file_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "image.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(InputError, match=r"image.png looks like a binary file \(NUL byte at offset 8\)"):
        read_text(path)


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-be", "utf-32"])
def test_a_utf16_or_utf32_file_is_named_so_with_the_conversion(tmp_path: Path, encoding: str) -> None:
    """Excel's 'Unicode text' and Windows tools write UTF-16 with a byte-order mark: its NUL bytes read as 'a binary
    file', which it is not."""
    path = tmp_path / "export.tsv"
    path.write_bytes((b"\xfe\xff" if encoding == "utf-16-be" else b"") + "text\tlabel\n".encode(encoding))
    kind = "UTF-32" if encoding == "utf-32" else "UTF-16"
    with pytest.raises(InputError, match=rf"export.tsv is {kind} text \(its byte-order mark says so\); attnkit reads "
                                         rf"UTF-8: convert it \(iconv -f {kind} -t UTF-8\)"):
        read_text(path)


def test_undecodable_bytes_name_file_and_offset_or_are_replaced(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("café au lait".encode("latin-1"))
    with pytest.raises(InputError, match=r"latin1.txt is not valid UTF-8: byte 0xe9 at offset 3"):
        read_text(path)
    assert read_text(path, errors="replace") == "caf\ufffd au lait"


def test_bom_is_dropped_and_unreadable_is_clear(tmp_path: Path) -> None:
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeffhello".encode())
    assert read_text(path) == "hello"
    with pytest.raises(InputError, match="cannot read"):
        read_text(tmp_path)  # a directory


def test_read_lines_splits_only_on_newlines(tmp_path: Path) -> None:
    path = tmp_path / "lines.txt"
    path.write_bytes("one\r\ntwo\u2028still two\x0cstill\nthree\n".encode())
    assert read_lines(path) == ["one", "two\u2028still two\x0cstill", "three"]
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(InputError, match="empty.txt is empty"):
        read_lines(empty)


def test_split_text_keeps_lines_whole() -> None:
    text = "".join(f"line {i}\n" for i in range(1000)) + "tail"
    pieces = split_text(text, 100)
    assert "".join(pieces) == text
    assert all(p.endswith("\n") for p in pieces[:-1]) and len(pieces) > 10
    assert split_text("", 10) == []


def test_iter_texts_reads_paths_and_passes_strings(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_bytes("\ufeffread from a file\n".encode())
    assert list(iter_texts(["given", path, str(path)])) == ["given", "read from a file\n", str(path)]
    path.write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(InputError, match="a.txt is not valid UTF-8"):
        list(iter_texts([path]))
    assert list(iter_texts([path], errors="replace")) == ["caf\ufffd"]


def test_a_gzip_file_is_read_as_its_text_and_a_cut_off_one_is_named(tmp_path: Path) -> None:
    """A corpus shipped as .gz read as 'a binary file (NUL byte ...)'; it is opened by its first bytes, and a
    compressed CSV or CoNLL-U file keeps the layout its name gives under the .gz."""
    import gzip

    from attnkit.data.labelled import read_labelled
    from attnkit.tasks.conll import read_tagged

    text = "Ünïcode line one\r\nline two\n" * 50
    (tmp_path / "corpus.txt.gz").write_bytes(gzip.compress(text.encode("utf-8-sig")))
    assert read_text(tmp_path / "corpus.txt.gz") == text
    (tmp_path / "reviews.CSV.gz").write_bytes(gzip.compress(b'text,label\n"two\nlines",pos\nplain,neg\n'))
    assert read_labelled(tmp_path / "reviews.CSV.gz") == [("two\nlines", "pos"), ("plain", "neg")]
    conllu = "# sent_id = 1\n1-2\tdon't\t_\t_\t_\t_\t_\t_\t_\t_\n1\tdo\tdo\tAUX\n2\tn't\tnot\tPART\n\n"
    (tmp_path / "tags.conllu.gz").write_bytes(gzip.compress(conllu.encode()))
    assert read_tagged(tmp_path / "tags.conllu.gz") == [(["do", "n't"], ["AUX", "PART"])]
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(text.encode())[:40])
    with pytest.raises(InputError, match=r"cut.txt.gz is a damaged gzip file \(.*\); compress the text again"):
        read_text(tmp_path / "cut.txt.gz")


@pytest.mark.parametrize(("width", "order"), [("16", "LE"), ("16", "BE"), ("32", "LE"), ("32", "BE")])
def test_utf16_or_utf32_without_a_byte_order_mark_or_a_binary_file_is_named_with_its_fix(
        tmp_path: Path, width: str, order: str) -> None:
    """UTF-32 without a byte-order mark (NUL bytes in every other place too) was named UTF-16."""
    path = tmp_path / "export.txt"
    path.write_bytes(("plain text\n" if width == "16" else "plain text, é 中 😀\n").encode(f"utf-{width}-{order}"))
    with pytest.raises(InputError, match=rf"looks like a binary file .*: it reads as UTF-{width}{order} text without "
                                         rf"a byte-order mark: convert it \(iconv -f UTF-{width}{order} -t UTF-8\)"):
        read_text(path)
    png = tmp_path / "image.png"
    png.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(InputError, match=r"attnkit reads UTF-8 text: leave it out of the data \(a glob such as "
                                         r"'folder/\*\*/\*.txt' takes a folder's text files alone\)$"):
        read_text(png)


def test_split_text_cuts_a_huge_line_before_a_word_or_at_its_size() -> None:
    """A text of one line was one piece however long; it is cut before a space that follows a word, or at `size`
    characters where it has no space."""
    words = "one  two,three " * 200
    pieces = split_text(words, 50)
    assert "".join(pieces) == words and len(pieces) > 10
    assert all(p.startswith(" ") and not before[-1].isspace() for before, p in itertools.pairwise(pieces))
    assert max(map(len, pieces)) <= 4 * 50
    solid = "字" * 1000
    assert [len(p) for p in split_text(solid, 100)] == [100] * 6 + [400]
