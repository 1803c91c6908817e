"""Files attnkit reads back, checked before use: one place that reads a JSON file written earlier (by attnkit or by
another tool) and takes its fields one by one, each refusal naming the file, the field and the fix.

    fields = FileFields.read(path, fix="write it again with `attnkit tune`")
    fields.integer("version", minimum=1)              -> int, or InputError "path: version='abc' must be ..."
    fields.mapping("attention").number("decode_keys", minimum=0)
    [row.scalars() for row in fields.records("rows")]  -> each row's values, or "path: rows[2] holds no value ..."

Used for the tuning profile (`machine.load_profile`), Hugging Face `config.json` (`interop.hf_config`), an
experiment's results.json (`experiments.replot`), and the other files a run or a cache holds; a wrong type, a
negative limit or text that is not UTF-8 is refused here rather than met later as a traceback or, worse, used.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

from attnkit.errors import InputError

_REQUIRED = object()


def digest(path: str | Path) -> str:
    """The SHA-256 of a file, as hex (about 0.6 s for 500 MB): what a checksum written beside a file is checked
    against when it is read back (a checkpoint's checksums.json, the token cache's meta file)."""
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def json_digest(value: Any) -> str:
    """The SHA-256 of `value` written as JSON with its keys sorted, as hex: a name or checksum for a record that
    equal records share (a token cache's key, an experiment arm's checksum)."""
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


class _RepeatedKey(ValueError):
    """An object of JSON text names one key twice (JSON readers differ on which value they keep)."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    repeated = sorted(key for key, times in Counter(key for key, _ in pairs).items() if times > 1)
    if repeated:
        raise _RepeatedKey(f"names {', '.join(repeated)} twice in one object (JSON readers differ on which value "
                           "counts): keep one")
    return dict(pairs)


def parse_json(text: str, source: str, *, fix: str, error: type[Exception] = InputError) -> Any:
    """The value of JSON `text`; `error` naming `source` when it is not JSON, nests too deeply, holds a number too
    long to read, or names a key twice in one object."""
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except _RepeatedKey as err:
        raise error(f"{source} {err}; {fix}") from None
    except (ValueError, RecursionError) as err:  # ValueError: JSONDecodeError, or an integer too long to convert
        reason = ("nested too deeply" if isinstance(err, RecursionError) else str(err)
                  if isinstance(err, json.JSONDecodeError) else "a number too long to read")
        raise error(f"{source} is not valid JSON ({reason}); {fix}") from None


class FileFields:
    """The fields of a JSON object read from `source`, handed out checked. `fix` ends every refusal (how to get a
    good file); `error` is the exception raised (InputError, or the caller's: ConfigError for a model's config);
    `prefix` names nested objects ("attention.bf16.")."""

    def __init__(self, data: Any, source: str, *, fix: str, error: type[Exception] = InputError,
                 prefix: str = "") -> None:
        self.source, self.fix, self.error, self.prefix = source, fix, error, prefix
        if not isinstance(data, dict):
            what = f"{prefix.rstrip('.')} " if prefix else ""
            raise error(f"{source}: {what}must be a JSON object of field: value, not {type(data).__name__}; {fix}")
        self.data = data

    @classmethod
    def read(cls, path: str | Path, *, fix: str, error: type[Exception] = InputError) -> FileFields:
        """The JSON object in `path`; `error` naming the file when it is not UTF-8, not JSON or not an object."""
        path = Path(path)
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as err:
            raise error(f"{path} is not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset {err.start}); "
                        f"{fix}") from None
        return cls(parse_json(text, str(path), fix=fix, error=error), str(path), fix=fix, error=error)

    def __contains__(self, name: str) -> bool:
        return name in self.data

    def __iter__(self) -> Iterator[str]:
        return iter(self.data)

    def refuse(self, name: str, value: Any, expected: str) -> NoReturn:
        """Raise the refusal for field `name`: "{source}: {name}={value!r} must be {expected}; {fix}"."""
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:77] + "..."
        raise self.error(f"{self.source}: {self.prefix}{name}={shown} must be {expected}; {self.fix}")

    def get(self, name: str, default: Any = None) -> Any:
        """The raw value (unchecked), for fields checked elsewhere."""
        return self.data.get(name, default)

    def _value(self, name: str, default: Any) -> Any:
        if name not in self.data or (self.data[name] is None and default is not _REQUIRED):
            if default is _REQUIRED:
                raise self.error(f"{self.source} lacks the field {self.prefix}{name}; {self.fix}")
            return default
        return self.data[name]

    def number(self, name: str, *, default: Any = _REQUIRED, minimum: float | None = None,
               positive: bool = False) -> Any:
        """A finite number (not a bool, not a string of digits), at least `minimum`, above 0 when `positive`."""
        value = self._value(name, default)
        if value is default and default is not _REQUIRED:
            return value
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            self.refuse(name, value, "a finite number")
        if minimum is not None and value < minimum:
            self.refuse(name, value, f"at least {minimum}")
        if positive and value <= 0:
            self.refuse(name, value, "above 0")
        return value

    def integer(self, name: str, *, default: Any = _REQUIRED, minimum: int | None = None) -> Any:
        """A whole number (JSON integer), at least `minimum`."""
        value = self._value(name, default)
        if value is default and default is not _REQUIRED:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            self.refuse(name, value, "a whole number" + (f" of at least {minimum}" if minimum is not None else ""))
        if minimum is not None and value < minimum:
            self.refuse(name, value, f"at least {minimum}")
        return value

    def string(self, name: str, *, default: Any = _REQUIRED, choices: tuple[str, ...] | None = None) -> Any:
        """A string, one of `choices` when given."""
        value = self._value(name, default)
        if value is default and default is not _REQUIRED:
            return value
        if not isinstance(value, str):
            self.refuse(name, value, "a string")
        if choices is not None and value not in choices:
            self.refuse(name, value, f"one of {', '.join(choices)}")
        return value

    def strings(self, name: str, *, default: Any = _REQUIRED) -> Any:
        """A list of strings."""
        value = self._value(name, default)
        if value is default and default is not _REQUIRED:
            return value
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            self.refuse(name, value, "a list of strings")
        return value

    def records(self, name: str, *, default: Any = _REQUIRED) -> Any:
        """A list of JSON objects, each as FileFields (named `name[i].field`), e.g. a table's rows."""
        value = self._value(name, default)
        if value is default and default is not _REQUIRED:
            return value
        if not isinstance(value, list):
            self.refuse(name, value, "a list of JSON objects")
        return [FileFields(item, self.source, fix=self.fix, error=self.error, prefix=f"{self.prefix}{name}[{index}].")
                for index, item in enumerate(value)]

    def scalars(self) -> dict[str, Any]:
        """Every field, each a number, a string, true/false or null (a table's row); refused when every one is
        missing (null or NaN) or there is none: a row that says nothing."""
        for name, value in self.data.items():
            if value is not None and not isinstance(value, (str, int, float)):
                self.refuse(name, value, "a number, a string, true/false or null")
        if all(value is None or isinstance(value, float) and math.isnan(value) for value in self.data.values()):
            raise self.error(f"{self.source}: {self.prefix.rstrip('.')} holds no value (every field missing or "
                             f"null); {self.fix}")
        return dict(self.data)

    def mapping(self, name: str, *, default: Any = _REQUIRED) -> Any:
        """A nested JSON object, as FileFields (its fields named `name.field`); `default` when absent or null."""
        value = self._value(name, default)
        if value is default and default is not _REQUIRED:
            return value
        if not isinstance(value, dict):
            self.refuse(name, value, "a JSON object of field: value")
        return FileFields(value, self.source, fix=self.fix, error=self.error, prefix=f"{self.prefix}{name}.")
