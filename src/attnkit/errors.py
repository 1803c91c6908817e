"""The errors attnkit raises on bad input: each names the problem and the fix."""

import difflib
import errno
import os
from collections.abc import Iterable


class AttnkitError(Exception):
    """Base class: every error attnkit raises on purpose derives from it."""


class ConfigError(AttnkitError, ValueError):
    """An invalid configuration: raised when the config is constructed, naming the field and the fix."""


class InputError(AttnkitError, ValueError):
    """Bad input at a model's edge (token ids, lengths, batch sizes) or in a data file."""


class CheckpointError(AttnkitError, ValueError):
    """A checkpoint that is missing, corrupted or does not match the model it is loaded into."""


class BrokenOutputs(AttnkitError, RuntimeError):
    """A model's outputs hold no numbers to predict from (nan or inf logits: fp16 activations that overflowed, or
    broken weights)."""


_OS_ERROR_FIXES = {  # errno name -> (what happened, the fix)
    "ENOSPC": ("the disk is full", "free some space, or write to another disk"),
    "EDQUOT": ("the disk quota is used up", "free some space, or write to another disk"),
    "EROFS": ("the file system is read-only", "choose a writable location"),
    "EACCES": ("permission denied", "choose a location you may write to, or change its permissions"),
    "EPERM": ("operation not permitted", "choose a location you may write to, or change its permissions"),
    "EISDIR": ("it is a directory, where a file was expected", "give the path of a file"),
    "ENOTDIR": ("part of the path is a file, where a directory was expected", "give a path under a directory"),
    "ENAMETOOLONG": ("the name is too long", "choose a shorter path"),
    "EEXIST": ("it already exists", "choose another path"),
}
_FILE_IN_THE_WAY = ("a file is in the way, where a directory is needed", "give a path where a directory can be made "
                    "(a file of yours is never removed to make room)")


def os_error_message(err: OSError, path: object, doing: str) -> str:
    """One line for an OSError met while `doing` ("writing", "reading") `path`: what happened and the fix."""
    name = errno.errorcode.get(err.errno or 0, "")
    what, fix = _OS_ERROR_FIXES.get(name, (err.strerror or str(err), "check the path and try again"))
    if name == "EEXIST" and err.filename is not None and not os.path.isdir(err.filename):
        what, fix = _FILE_IN_THE_WAY  # mkdir(exist_ok=True) over a file: the file is not to be removed
    where = f" ({err.filename})" if err.filename not in (None, str(path)) else ""
    return f"cannot finish {doing} {path}: {what}{where}; {fix}"


def nearest(name: str, known: Iterable[str]) -> str | None:
    """The known name closest to a mistyped `name`: one that differs from it only in case (`q4_k_m`: `Q4_K_M`), else
    difflib's closest (its ratio at least 0.6), or None when none is close."""
    known = list(known)
    if same := [candidate for candidate in known if candidate.lower() == name.lower()]:
        return same[0]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    return close[0] if close else None


def unknown_name(what: str, name: str, known: Iterable[str], *, otherwise: str) -> str:
    """One line for a `name` not among `known`: "{what} 'name'; did you mean 'nearest'?", or, when no known name
    is close, `otherwise` (where the names are listed) in its place."""
    guess = nearest(name, known)
    return f"{what} {name!r}; " + (f"did you mean {guess!r}?" if guess is not None else otherwise)
