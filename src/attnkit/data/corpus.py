"""Text corpora: find files (paths, folders, globs); `attnkit.textfiles` reads them as UTF-8 with clear errors.

With no data given, the corpus is the Python standard library's own source code, found through `sysconfig`:
every Python installation carries it, so the default run has real text and downloads nothing.
"""

from __future__ import annotations

import glob
import logging
import os
import sysconfig
from collections.abc import Iterable, Sequence
from pathlib import Path

from attnkit.errors import InputError
from attnkit.textfiles import special_file

log = logging.getLogger(__name__)

# Parts of the standard library that are not its own source: test suites (and their data), IDLE, and
# installed third-party packages.
STDLIB_EXCLUDE = frozenset({"test", "tests", "idlelib", "site-packages", "dist-packages", "lib2to3", "__pycache__"})
_GLOB_CHARS = frozenset("*?[")


def stdlib_dir() -> Path:
    """The directory of the running Python's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def stdlib_files(max_bytes: int | None = None) -> list[Path]:
    """The standard library's `*.py` files in sorted order, without tests, IDLE and site-packages.

    `max_bytes` keeps the first files (in that order) whose sizes add up to at most `max_bytes`
    (always at least one), so a small default run stays fast. Raises `InputError` if none are found
    (some distributions ship the standard library as bytecode only).
    """
    root = stdlib_dir()
    found = []
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d not in STDLIB_EXCLUDE]  # prune: never walk into the test suites
        found.extend(Path(folder, n) for n in names if n.endswith(".py"))
    files = sorted(found, key=lambda p: p.relative_to(root).as_posix())
    files = [p for p in files if p.is_file() and p.stat().st_size > 0]
    if not files:
        raise InputError(f"found no Python source files in the standard library at {root}; pass --data PATHS")
    return _cap(files, max_bytes)


def _cap(files: list[Path], max_bytes: int | None) -> list[Path]:
    if max_bytes is None:
        return files
    kept, total = [], 0
    for path in files:
        size = path.stat().st_size
        if kept and total + size > max_bytes:
            break
        kept.append(path)
        total += size
    return kept


def find_files(paths: Sequence[str | os.PathLike], *, suffixes: Sequence[str] | None = None) -> list[Path]:
    """Expand files, folders (recursively, skipping hidden entries) and glob patterns into a list of files.

    Explicit files keep the order given; each folder and glob contributes its files in sorted order;
    duplicates are dropped. `suffixes` (e.g. `[".txt"]`) filters what folders and globs contribute.
    Raises `InputError` for a path that does not exist or a pattern or folder that matches no file.
    """
    if not paths:
        raise InputError("no data paths given")
    found: list[Path] = []
    for item in paths:
        text = os.fspath(item)
        path = Path(text).expanduser()
        if path.is_file():
            found.append(path)
            continue
        if path.is_dir():
            matches = [p for p in path.rglob("*") if p.is_file() and not _hidden(p.relative_to(path))]
        elif _GLOB_CHARS.intersection(text):
            matches = [Path(p) for p in glob.glob(os.path.expanduser(text), recursive=True) if Path(p).is_file()]
        elif special_file(path) is not None:
            raise InputError(f"data path {text} is {special_file(path)}, not a regular file; save the text to a file "
                             f"and give that path")
        else:
            raise InputError(f"data path {text} does not exist")
        matches = sorted(p for p in matches if suffixes is None or p.suffix in suffixes)
        if not matches:
            raise InputError(f"{text} matches no files" + (f" with suffix {list(suffixes)}" if suffixes else ""))
        found.extend(matches)
    return list(dict.fromkeys(found))


def _hidden(relative: Path) -> bool:
    return any(part.startswith(".") for part in relative.parts)


def resolve_files(
    paths: Sequence[str | os.PathLike] | None, *, max_bytes: int | None = None, suffixes: Sequence[str] | None = None
) -> list[Path]:
    """The files of a corpus: `find_files(paths)`, or the standard library's source when `paths` is empty."""
    if not paths:
        files = stdlib_files(max_bytes)
        log.info("no data given: using %d standard-library source files from %s", len(files), stdlib_dir())
        return files
    return _cap(find_files(paths, suffixes=suffixes), max_bytes)


def file_manifest(files: Iterable[Path]) -> list[dict]:
    """Path, size and modification time of each file: what a cache built from them depends on."""
    out = []
    for path in files:
        try:
            st = path.stat()
        except OSError as err:
            raise InputError(f"cannot read {path}: {err.strerror}") from None
        out.append({"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out
