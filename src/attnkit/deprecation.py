"""Old names that still work: a renamed keyword argument is accepted with a DeprecationWarning naming the new one
(a renamed config field is read by `config.ModelConfig.from_dict`, which warns the same way)."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
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


def warn_renamed(old: str, new: str, *, stacklevel: int = 3) -> None:
    """A DeprecationWarning: `old` is now `new`."""
    warnings.warn(f"{old} is deprecated; use {new}", DeprecationWarning, stacklevel=stacklevel)
