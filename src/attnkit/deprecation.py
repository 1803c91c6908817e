"""Old names that still work: a renamed keyword argument is accepted with a DeprecationWarning naming the new one
(a renamed config field is read by `config.ModelConfig.from_dict`, which logs a warning naming the field)."""

from __future__ import annotations

import functools
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


def renamed_keywords(**renames: str) -> Callable[[F], F]:
    """Decorator: `old=value` is passed on as `new=value` for each `old="new"` in `renames`, with a DeprecationWarning
    naming the new keyword. Raises TypeError when both are given."""

    def wrap(function: F) -> F:
        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            for old, new in renames.items():
                if old in kwargs:
                    if new in kwargs:
                        raise TypeError(f"{function.__qualname__}() got {old}= and {new}=; {old} is the old name of "
                                        f"{new}: give {new}= only")
                    warn_renamed(f"{function.__qualname__}() keyword {old}=", f"{new}=")
                    kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return wrap


def warn_renamed(old: str, new: str) -> None:
    """A DeprecationWarning: `old` is now `new`, attributed to the caller's own line (the first frame outside
    attnkit and torch: a module is called through torch's `Module.__call__`), where Python's filters show it."""
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=_callers_level())


def _callers_level() -> int:
    """The `stacklevel` of the first frame outside attnkit's and torch's own files, for a warning raised here."""
    torch = sys.modules.get("torch")
    internal = tuple(str(Path(module.__file__).parent) for module in (sys.modules[__package__], torch) if module)
    frame, level = sys._getframe(2), 2  # warn_renamed's caller: stacklevel 2 of the warnings.warn in it
    while frame.f_back is not None and frame.f_code.co_filename.startswith(internal):
        frame, level = frame.f_back, level + 1
    return level
