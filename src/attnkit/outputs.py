"""Outputs written whole or not at all: the one place attnkit writes a file or a directory that a user keeps.

    atomic_write(path, data)            bytes -> a temporary sibling file -> renamed over `path`
    write_figure(figure, path)          a matplotlib figure drawn as a PNG in memory, then `atomic_write`
    sibling_file(path)                  an empty temporary sibling for a writer that takes a path (safetensors)
    scratch_file(path)                  a sibling path for a file made on the way to `path`, removed by the caller
    atomic_output(path, directory=...)  a temporary sibling (a directory, or a file path) that the caller fills;
                                        renamed into place when the block ends, removed when it fails
    files_into(path)                    a temporary sibling directory whose files are renamed into the directory
                                        `path` when the block ends (others there kept), removed when it fails
    check_output(path, directory=...)   what atomic_output refuses, asked before a command's long work
    refuse_root(path)                   the file system's root named as an output: refused
    remove_path(path)                   a file, link or folder deleted (a link's target kept); absent already: nothing
    writing(path)                       an OSError met on the way -> one CheckpointError naming the path and the fix

A process killed at any point (SIGKILL, a power cut) leaves `path` as it was (absent, or the previous output) and at
most a hidden `.NAME.partial-PID` sibling, which the next writer of `path` removes; an output replaced with
`overwrite` waits as `.NAME.replaced-PID` until the new one is in place, and is put back by the next writer if the
new one never arrived; a file made on the way (`.NAME.scratch-PID`) is removed by the next writer too. Files are
synced before the rename, so the rename publishes bytes that are on the disk.
New files get the mode `open()` would give them (0666 less the user's umask), not `mkstemp`'s private 0600.
"""

from __future__ import annotations

import errno
import io
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from attnkit.errors import CheckpointError, InputError, os_error_message

PARTIAL = "partial"  # .NAME.partial-PID: an output being written
_PARTIAL_PART = re.compile(rf"\.(.+)\.{PARTIAL}-[0-9]+")  # one such name, NAME its group
REPLACED = "replaced"  # .NAME.replaced-PID: the output an `overwrite` replaces, until the new one is in place
SCRATCH = "scratch"  # .NAME.scratch-PID: a file a writer of NAME makes on the way (an f16 GGUF to quantize)
log = logging.getLogger(__name__)
_OS_ERROR_IN_TEXT = re.compile(r"\(os error (\d+)\)")  # how Rust libraries (safetensors, tokenizers) report errno


def file_mode() -> int:
    """The mode a new file gets from `open()`: 0o666 less the process's umask."""
    status = Path("/proc/self/status")
    try:
        for line in status.read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)  # where /proc does not say (not Linux): read it by setting it, then put it back
    os.umask(mask)
    return 0o666 & ~mask


def as_os_error(err: BaseException, path: Path) -> OSError | None:
    """`err`, met writing `path`, as the OSError it is: itself, or a library's own error whose text carries "(os
    error N)" (safetensors' SafetensorError, tokenizers' bare Exception on a full disk); None for any other error."""
    if isinstance(err, OSError):
        return err if err.errno is not None else _short_write(err, path)
    code = _OS_ERROR_IN_TEXT.search(str(err)) if isinstance(err, Exception) else None
    if code is None:
        return None
    return OSError(int(code[1]), os.strerror(int(code[1])))


def _short_write(err: OSError, place: Path) -> OSError:
    """An OSError without an errno (numpy's "N requested and M written", which the gguf writer meets on a full disk)
    as ENOSPC when the file system of `place` has less than a MiB left; as it is otherwise."""
    while not place.exists() and place != place.parent:
        place = place.parent
    try:
        free = os.statvfs(place)
        full = free.f_bavail * free.f_frsize < 2**20
    except OSError:
        full = False
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)) if full else err


class writing:
    """Context manager: an OSError while writing `path` (or a library error carrying one, `as_os_error`) becomes a
    CheckpointError naming the path, what happened (a full disk, a read-only or forbidden place, a file where a
    directory is needed) and the fix; `note` is added."""

    def __init__(self, path: str | Path, *, doing: str = "writing", note: str = "") -> None:
        self.path, self.doing, self.note = Path(path), doing, note

    def __enter__(self) -> writing:
        return self

    def __exit__(self, kind: type | None, err: BaseException | None, traceback: object) -> None:
        if isinstance(err, CheckpointError) and getattr(err, "os_error", False):
            if not self.note:
                return
            message = str(err)  # from a `writing` inside this one: the file named there, the note added here
        elif err is not None and (os_err := as_os_error(err, self.path)) is not None:
            if os_err.filename is not None and _temporary_sibling(Path(os.fsdecode(os_err.filename)), self.path):
                os_err.filename = None  # the user knows the output by its name, not by the sibling it is made in
            elif os_err.filename is not None:
                os_err.filename = str(as_written(Path(os.fsdecode(os_err.filename))))
            message = os_error_message(os_err, as_written(self.path), self.doing)
        else:
            return
        failure = CheckpointError(message + self.note)
        failure.os_error = True
        raise failure from None


def as_written(path: Path) -> Path:
    """`path` as the user will know it: a file inside an output being written (`.NAME.partial-PID/file`) named
    inside the output it becomes (`NAME/file`)."""
    return Path(*(match[1] if (match := _PARTIAL_PART.fullmatch(part)) else part for part in path.parts))


def _temporary_sibling(name: Path, path: Path) -> bool:
    """Whether `name` is (or lies inside) a temporary sibling of `path` (`.NAME.*`)."""
    try:
        first = name.absolute().relative_to(path.parent.absolute()).parts[0]
    except (ValueError, IndexError):
        return False
    return first.startswith(f".{path.name}.")


def sibling_file(path: Path) -> Path:
    """An empty temporary file beside `path` (hidden, same file system) with `file_mode()`."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())
    finally:
        os.close(fd)
    return Path(tmp)


def refuse_special(path: Path, *, flag: str = "") -> None:
    """InputError where `path` (or what a link there points to) exists and is neither a regular file nor a directory:
    a device (/dev/null), a pipe or a socket, which the rename that publishes an output would replace with a file
    (run as root, over /dev/null itself)."""
    if os.path.exists(path) and not (path.is_file() or path.is_dir()):
        named = f"{flag} {path}" if flag else str(path)
        raise InputError(f"{named} is a device, a pipe or a socket, not a file: an output is written beside it and "
                         "renamed over it, which would replace it; give the path of a file")


def refuse_root(path: str | Path, *, flag: str = "--out") -> None:
    """InputError where `path` is the file system's root (`/`, or a path that resolves to it): an output there would
    spread its files among the system's folders, and a file or folder has no name to be written under."""
    if os.path.realpath(path) == os.path.realpath(os.sep):
        raise InputError(f"{flag} {path} is the file system's root: give a folder of the output's own")


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write `data` to a temporary file beside `path`, then rename it over `path`: readers see old or new. InputError
    where `path` is a device, a pipe or a socket (`refuse_special`)."""
    path = Path(path)
    with writing(path):
        refuse_special(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = sibling_file(path)
        try:
            with open(tmp, "wb") as handle:
                handle.write(data.encode() if isinstance(data, str) else data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise


def png_bytes(figure, *, dpi: float | None = None) -> bytes:
    """A matplotlib figure drawn as a PNG in memory (`dpi` None: the figure's own), so that nothing is written before
    the picture is whole."""
    picture = io.BytesIO()
    figure.savefig(picture, format="png", dpi=dpi)
    return picture.getvalue()


def write_figure(figure, path: str | Path, *, dpi: float | None = None) -> Path:
    """A matplotlib figure as a PNG at `path`, whole or not at all (`png_bytes`, then `atomic_write`); returns
    `path`."""
    atomic_write(path, png_bytes(figure, dpi=dpi))
    return Path(path)


@contextmanager
def atomic_output(path: str | Path, *, directory: bool, overwrite: bool = False,
                  flag: str = "--out") -> Iterator[Path]:
    """Yield a temporary sibling of `path` to write into (a new empty directory, or a file path not yet created);
    when the block ends it is renamed to `path`, and when the block raises it is removed, leaving `path` as it was.

    An existing `path` is replaced only with `overwrite` (the caller decides first whether what is there may go);
    otherwise, and when `path` is of the other kind (a file where a directory is to be written, or the reverse),
    an InputError names `flag` and the fix. OS failures (a full disk, a read-only place) are CheckpointErrors
    naming `path` and saying it was left as it was.
    """
    path = Path(path)
    kind = "directory" if directory else "file"
    # inside an output being written (a file of an exporter's folder), the folder's own note says what is left
    note = "" if as_written(path) != path else f"; {path} is left as it was"
    with writing(path, note=note):
        path.parent.mkdir(parents=True, exist_ok=True)
        check_output(path, directory=directory, overwrite=overwrite, flag=flag)
        partial = _sibling(path, PARTIAL)
        try:
            if directory:
                partial.mkdir()
            yield partial
            if not partial.exists():
                raise InputError(f"nothing was written for {path}: the {kind} to write was not made")
            _sync(partial)
            _put_in_place(partial, path)
        except BaseException as err:
            named = as_os_error(err, partial)  # before the partial goes: a full disk is still seen full
            remove_path(partial)
            if named is not None and named is not err:
                raise named from err
            raise


@contextmanager
def files_into(path: str | Path, *, first: tuple[str, ...] = (), flag: str = "--out") -> Iterator[Path]:
    """Yield a new empty directory beside the directory `path` to write files into; when the block ends, each file
    is renamed into `path` (made where missing), replacing the one of its name, the names in `first` first; when it
    raises, nothing reaches `path`. Other files in `path` are kept: for outputs that share a folder with the
    user's own files (an experiment's results beside notes on it), where `atomic_output` would replace the folder.

    A file is published whole; the set is published by one rename a file, at the end, after all the work. A file
    where `path` is to be is refused as `check_output` refuses it (InputError naming `flag` and the fix); OS
    failures making, filling or publishing the directory are CheckpointErrors naming `path`, while an OSError of the
    block's naming a file elsewhere (one it reads) passes as it is."""
    path = Path(os.path.abspath(path))  # "." and ".." named: the sibling is named after the folder they stand for
    untouched = writing(path, note=f"; nothing was written to {path}")
    with untouched:
        path.parent.mkdir(parents=True, exist_ok=True)
        check_output(path, directory=True, overwrite=True, flag=flag)
        partial = _sibling(path, PARTIAL)
        partial.mkdir()
    try:
        try:
            yield partial
        except OSError as err:
            if err.filename is not None and not _temporary_sibling(Path(os.fsdecode(err.filename)), path):
                raise  # the block's own, naming a file elsewhere (a corpus it reads): not the output's to explain
            with untouched:
                raise
        with untouched:
            _sync(partial)
            path.mkdir(exist_ok=True)
            order = {name: index for index, name in enumerate(first)}
            for file in sorted(partial.iterdir(), key=lambda file: (order.get(file.name, len(first)), file.name)):
                os.replace(file, path / file.name)
    finally:
        remove_path(partial)


def clear_leftovers(path: Path) -> None:
    """Remove what writers of `path` killed before they finished left beside it: their partial outputs, and an
    output they had moved aside to replace (put back when the new one never arrived). Live writers' are kept."""
    for sibling in path.parent.glob(f".{glob_escape(path.name)}.*-*"):
        role, _, pid = sibling.name[len(path.name) + 2:].rpartition("-")
        if role not in (PARTIAL, REPLACED, SCRATCH) or not pid.isdigit() or _alive(int(pid)):
            continue
        if role == REPLACED and not (path.exists() or path.is_symlink()):
            os.rename(sibling, path)  # the replacement never arrived: the previous output comes back
        else:
            remove_path(sibling)


def glob_escape(name: str) -> str:
    """`name` with glob's special characters matched literally."""
    return re.sub(r"([*?\[])", r"[\1]", name)


def scratch_file(path: str | Path) -> Path:
    """The path (not yet made) of a hidden sibling of `path` for a file made on the way to it (an intermediate a tool
    reads), which the caller removes; one a killed writer left is removed by the next writer of `path`."""
    return _sibling(Path(path), SCRATCH)


def _sibling(path: Path, role: str) -> Path:
    return path.with_name(f".{path.name}.{role}-{os.getpid()}")


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # this process is not writing it now: what it left is a leftover of an earlier attempt
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's live process
    return True


def check_output(path: str | Path, *, directory: bool, overwrite: bool = False, flag: str = "--out") -> None:
    """What `atomic_output` checks before writing, for a command to ask before its long work: InputError naming
    `flag` and the fix when `path` is of the other kind or not a file at all (`refuse_special`), or exists (a
    non-empty directory) without `overwrite`.
    What killed writers of `path` left is cleared first (`clear_leftovers`)."""
    path = Path(path)
    refuse_root(path, flag=flag)
    if path.parent.is_dir():
        clear_leftovers(path)
    if not (path.exists() or path.is_symlink()):
        return
    refuse_special(path, flag=flag)
    if directory and not path.is_dir():
        raise InputError(f"{flag} {path} is a file, where a directory is to be written; give the path of a new "
                         "directory")
    if not directory and path.is_dir():
        raise InputError(f"{flag} {path} is a directory, where a file is to be written; give a file name")
    if directory and path.is_symlink() and not overwrite:  # the output replaces the link, never fills its target
        raise InputError(f"{flag} {path} is a link to {os.path.realpath(path)}; give that directory's own path, or "
                         "add --overwrite to replace the link with the output")
    if directory and not any(path.iterdir()):
        return  # an empty directory: the rename takes its place
    if not overwrite:
        raise InputError(f"{flag} {path} already exists; choose another {flag}, or add --overwrite to replace it")


def _sync(partial: Path) -> None:
    """fsync every file of the output, so that the rename publishes bytes already on the disk."""
    for file in [partial] if partial.is_file() else (p for p in partial.rglob("*") if p.is_file()):
        with open(file, "rb") as handle:
            os.fsync(handle.fileno())


def _put_in_place(partial: Path, path: Path) -> None:
    """Rename `partial` to `path`. A file (or an empty directory) is replaced in one rename; a directory that holds
    files, or a link to a directory, is moved aside first, so a kill between the two renames leaves it for
    `clear_leftovers` to put back."""
    if not path.is_dir() or not (path.is_symlink() or any(path.iterdir())):  # a link goes aside as a full folder
        os.replace(partial, path)
        return
    aside = _sibling(path, REPLACED)
    os.rename(path, aside)
    try:
        os.rename(partial, path)
    except BaseException:
        os.rename(aside, path)
        raise
    try:
        remove_path(aside)
    except OSError as err:  # the new output is whole and in place; the next writer of `path` removes the old one
        log.warning("%s is written; the output it replaced is left in %s (%s)", path, aside, err)


def remove_path(path: Path) -> None:
    """Delete `path`: a folder with what it holds, or a file or link (never what a link points to); gone already is
    fine."""
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        pass
