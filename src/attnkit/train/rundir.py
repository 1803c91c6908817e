"""Who owns a run directory, and replacing a run without losing it.

One process owns a run directory at a time. `claim(out)` takes an exclusive `flock` on `out/.lock` and writes the
owner (pid, host, start time) into it for the message a second process gets; the kernel drops the lock when its
process ends, however it ends, so a killed run never leaves a stale lock behind (the file stays, unlocked). A
process may claim a directory it already owns (one process preparing several trainers in turn); `release` (at the
end of `Trainer.fit`) gives it up.

`--overwrite` deletes nothing before the new run has written a checkpoint of its own:

    out/config.json, checkpoints/, ...   --move_aside-->  out/.replaced-<time>-<pid>/config.json, checkpoints/, ...
    the new run saves its first checkpoint  -->  drop_replaced: the old run is deleted
    the new run fails or is killed first    -->  release (or the next claim): the new run's files are removed and
                                                 the old run is moved back; until then, loading `out` is refused
                                                 naming the folder the old run waits in (`checkpoint.load_config`)

The old run stays inside `out`: nothing is written outside the directory the user named, and a rename within one
file system is atomic and instant whatever the run's size. `cache/` (tokenized data) is shared, never moved.
A run refused before it trains (`release(out, refused=True)`: a bad option, data or config found after the claim)
leaves `out` as it found it: what the claim and the refused run made there is removed (the lock, the marker, a run's
own names, `cache/` or new files in it: `RUN_NAMES`), and so are `out` and the parents the claim created once
empty. Anything else that appeared meanwhile (another program writing into the same folder) is kept.
Locks rely on flock(2): local file systems and NFS (Linux emulates flock with byte-range locks there).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from attnkit.checkpoint import (
    ADAPTERS_FILE,
    BEST_DIR,
    CHECKPOINTS_DIR,
    CHECKSUMS_FILE,
    CONFIG_FILE,
    LABELS_FILE,
    METRICS_FILE,
    OPTIMIZER_FILE,
    REPLACED_PREFIX,
    RUN_MARKER,
    TASK_FILE,
    TOKENIZER_DIR,
    TRAIN_STATE_FILE,
    WEIGHTS_FILE,
    checkpoint_dirs,
)
from attnkit.errors import ConfigError, os_error_message
from attnkit.outputs import refuse_root, remove_path

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
RUN_FILES = (CONFIG_FILE, WEIGHTS_FILE, ADAPTERS_FILE, OPTIMIZER_FILE, TRAIN_STATE_FILE, CHECKSUMS_FILE, TASK_FILE,
             LABELS_FILE, METRICS_FILE, TOKENIZER_DIR, CHECKPOINTS_DIR, BEST_DIR, "plots")
OWN_FOLDERS = (CHECKPOINTS_DIR, BEST_DIR, TOKENIZER_DIR, "plots")  # written and pruned in place, never through links
DERIVED = ("average-last-*", "averaged.json", "eval", "viz", "tensorboard", "hf_source.json")  # what attnkit
# writes into a run after training (average, eval, viz, convert): replaced with the run, never left stale

CACHE_DIR = "cache"  # tokenized data, kept across runs in one directory (`data.cache`)
RUN_NAMES = frozenset({LOCK_FILE, RUN_MARKER, CACHE_DIR, *RUN_FILES})  # what a refused run may have made in `out`


@dataclass(frozen=True)
class _Claim:
    """What this process holds of a run directory: the lock's descriptor, the first folder the claim created (None:
    `out` existed) and the names `out` and its `cache/` held before (what a refused run leaves)."""

    fd: int
    created: Path | None
    before: frozenset[str]


_held: dict[Path, _Claim] = {}  # this process's claims, by resolved run directory


def claim(out: str | Path) -> bool:
    """Make this process the owner of run directory `out` (created when missing) until `release`. Returns whether this
    call made the claim (False: this process held it already, and whoever claimed it first releases it).

    Raises ConfigError when another process owns it (naming that process), when `out` is empty or cannot be a
    writable directory (naming why), or when one of the run's own folders (`OWN_FOLDERS`) is a link, which its
    writes and pruning would follow outside `out`; InputError when `out` is the file system's root (`refuse_root`).
    A run that an interrupted `--overwrite` had moved aside is put back or dropped.
    """
    if not str(out).strip():
        raise ConfigError("--out is empty: give the run's own directory (e.g. --out runs/NAME)")
    refuse_root(out)
    out = Path(out)
    key = out.resolve()
    if key in _held:
        return False
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; a run is a directory: choose another --out")
    check_own_folders(out)
    try:
        created = _make_folders(out)
        new_lock = not (out / LOCK_FILE).exists()
        fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)  # never through a link
    except OSError as err:
        raise ConfigError(os_error_message(err, out, "creating run directory") + " (or choose another --out)") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        owner = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "a process that has not yet said who"
        os.close(fd)
        raise ConfigError(
            f"{out} is in use by another attnkit process ({owner}); wait for it to finish or stop it, "
            f"or choose another --out"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode(),
              0)
    _settle_replaced(out)  # before the names are taken: a run put back is one the claim found
    before = _names(out) - ({LOCK_FILE} if new_lock else set())  # listed even in a folder made here: another
    # program may have written into it since
    _held[key] = _Claim(fd, created, before)
    return True


def check_own_folders(out: Path) -> None:
    """ConfigError when one of run directory `out`'s own folders (`OWN_FOLDERS`) is a link, which its writes and
    pruning would follow outside `out`. `claim` asks, and each checkpoint's save again: a link made after the run began
    is caught before anything is written or deleted through it."""
    if links := [out / name for name in OWN_FOLDERS if (out / name).is_symlink()]:
        raise ConfigError(f"{links[0]} is a link to {os.path.realpath(links[0])}: a run writes and prunes the files "
                          "of its folders, which would reach outside --out through it; put the folder itself there "
                          "(or choose another --out)")


def release(out: str | Path, *, refused: bool = False) -> None:
    """Give up `out` (nothing when this process does not own it). A run moved aside by `--overwrite` comes back
    when the new run has no checkpoint; a directory `claim` created and nothing else used is removed. `refused`
    (the run stopped before it trained): everything the claim and the run made in `out` is removed as well, so
    that `out` is as the claim found it."""
    out = Path(out)
    held = _held.pop(out.resolve(), None)
    if held is None:
        return
    try:
        _settle_replaced(out)
        made = _names(out) - held.before
        if refused:
            for name in made:
                if name.split("/", 1)[0] in RUN_NAMES:  # only the lock holder writes cache/: all new there is ours
                    remove_path(out / name)
        elif held.created is not None and made <= {LOCK_FILE, RUN_MARKER}:
            (out / RUN_MARKER).unlink(missing_ok=True)
            (out / LOCK_FILE).unlink()
        if held.created is not None:
            _remove_empty(out, up_to=held.created)
    finally:
        os.close(held.fd)


def _make_folders(out: Path) -> Path | None:
    """Make `out` and its missing parents one at a time; the first this call made (None: `out` existed). A folder
    that another process makes meanwhile is not counted as made here."""
    missing = [folder for folder in (out, *out.parents) if not folder.exists()]
    created = None
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:
            if not folder.is_dir():
                raise
            created = None  # someone else's: what it holds is not ours to remove
        else:
            created = created or folder
    return created


def _names(out: Path) -> frozenset[str]:
    """The names in run directory `out`, and in its `cache/` as `cache/NAME`."""
    cache = out / CACHE_DIR
    cached = os.listdir(cache) if cache.is_dir() and not cache.is_symlink() else []
    return frozenset(os.listdir(out)) | {f"{CACHE_DIR}/{name}" for name in cached}


def _remove_empty(folder: Path, *, up_to: Path) -> None:
    """Remove `folder` and its parents up to `up_to` (all made by a claim) while they are empty."""
    while True:
        try:
            folder.rmdir()
        except OSError:  # not empty: something else is there now
            return
        if folder == up_to or folder.parent == folder:
            return
        folder = folder.parent


class owning:
    """Context manager: `claim(out)` on entry, `release(out)` on exit."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)

    def __enter__(self) -> owning:
        claim(self.out)
        return self

    def __exit__(self, *exc: object) -> None:
        release(self.out)


def existing_run(out: str | Path) -> list[str]:
    """The names of a run's files that `out` holds (empty: no run there)."""
    return [name for name in RUN_FILES if (Path(out) / name).exists()]


def run_and_derived(out: Path) -> list[str]:
    """A run's files in `out` and what attnkit derived from it there (`DERIVED`): all that replacing it removes."""
    derived = sorted({path.name for pattern in DERIVED for path in out.glob(pattern)})
    return existing_run(out) + [name for name in derived if name not in RUN_FILES]


def move_aside(out: str | Path) -> Path | None:
    """Move the run in `out` and what was derived from it into `out/.replaced-<time>-<pid>/` (see the module
    docstring). Returns that folder, or None when `out` holds no run."""
    out = Path(out)
    names = run_and_derived(out)
    if not names:
        return None
    aside = out / f"{REPLACED_PREFIX}{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    aside.mkdir()
    for name in names:
        os.replace(out / name, aside / name)
    log.warning("--overwrite: the previous run in %s is kept in %s until the new run saves its first checkpoint",
                out, aside.name)
    return aside


def drop_replaced(out: str | Path) -> None:
    """Delete runs that `--overwrite` moved aside (the new run in `out` has saved a checkpoint)."""
    for aside in Path(out).glob(f"{REPLACED_PREFIX}*"):
        shutil.rmtree(aside, ignore_errors=True)
        log.info("deleted the run that --overwrite replaced (%s): the new run has a checkpoint", aside.name)


def _settle_replaced(out: Path) -> None:
    """When a claim begins or ends: a run moved aside is dropped if the run that replaced it has a checkpoint, else
    put back (the new run's files are removed)."""
    asides = sorted(out.glob(f"{REPLACED_PREFIX}*"))
    if not asides:
        return
    if checkpoint_dirs(out):
        drop_replaced(out)
        return
    for name in run_and_derived(out):
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    for aside in asides[-1:]:  # the newest: an older one could only be left by a run killed while putting back
        for path in aside.iterdir():
            os.replace(path, out / path.name)
        aside.rmdir()
        log.warning("put back the previous run in %s: the run that was to replace it ended before its first "
                    "checkpoint", out)
    for aside in asides[:-1]:
        shutil.rmtree(aside, ignore_errors=True)
