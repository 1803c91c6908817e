"""Corpora: finding files and the standard-library default."""

from __future__ import annotations

from pathlib import Path

import pytest

from attnkit.data.corpus import (
    STDLIB_EXCLUDE,
    find_files,
    resolve_files,
    stdlib_dir,
    stdlib_files,
)
from attnkit.errors import InputError


def _tree(root: Path) -> None:
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "b.txt").write_text("b")
    (root / "a.md").write_text("a")
    (root / "sub" / "c.txt").write_text("c")
    (root / ".git" / "config").write_text("hidden")
    (root / ".hidden.txt").write_text("hidden")


def test_find_files_expands_folders_and_globs(tmp_path: Path) -> None:
    _tree(tmp_path)
    names = lambda files: [p.relative_to(tmp_path).as_posix() for p in files]  # noqa: E731
    assert names(find_files([tmp_path])) == ["a.md", "b.txt", "sub/c.txt"]
    assert names(find_files([tmp_path], suffixes=[".txt"])) == ["b.txt", "sub/c.txt"]
    assert names(find_files([str(tmp_path / "**" / "*.txt")])) == ["b.txt", "sub/c.txt"]
    assert names(find_files([tmp_path / "sub" / "c.txt", tmp_path])) == ["sub/c.txt", "a.md", "b.txt"]


def test_find_files_errors(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        find_files([tmp_path / "missing.txt"])
    with pytest.raises(InputError, match="matches no files"):
        find_files([str(tmp_path / "*.nothing")])
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(InputError, match="matches no files"):
        find_files([tmp_path / "empty_dir"])
    with pytest.raises(InputError, match="no data paths"):
        find_files([])


def test_stdlib_corpus_is_sorted_source_without_tests() -> None:
    root = stdlib_dir()
    files = stdlib_files()
    assert len(files) > 100
    rel = [p.relative_to(root) for p in files]
    assert [r.as_posix() for r in rel] == sorted(r.as_posix() for r in rel)
    assert all(p.suffix == ".py" for p in files)
    assert not any(STDLIB_EXCLUDE.intersection(r.parts) for r in rel)
    assert root / "json" / "decoder.py" in files


def test_stdlib_corpus_cap_and_default(tmp_path: Path) -> None:
    capped = stdlib_files(max_bytes=100_000)
    assert sum(p.stat().st_size for p in capped) <= 100_000
    assert capped == stdlib_files()[: len(capped)]
    assert len(stdlib_files(max_bytes=1)) == 1  # always at least one file
    assert resolve_files(None, max_bytes=100_000) == capped
    (tmp_path / "x.txt").write_text("x")
    assert resolve_files([tmp_path]) == [tmp_path / "x.txt"]
