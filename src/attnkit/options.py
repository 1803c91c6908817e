"""Command-line options generated from typed dataclass fields: the settings say once what a flag is.

A settings dataclass (a model config, `TrainConfig`, a command's own settings) already holds each option's
name, type, default and, in the comment after the field, what it means. `add_fields` turns those fields into
argparse options, so no flag, default, choice list or help text is written a second time:

    field                                   option
    name: int = 3  # what it means          --name N          help "what it means (default: 3)"
    kind: Literal["a", "b"] = "a"           --kind {a,b}      choices from the Literal
    flag: bool = False                      --flag/--no-flag
    files: tuple[str, ...] = ()             --files A [B ...] one or more values
    size: int | None = None                 --size N          None: "not given"; the comment says what it means
    run: str  # (no default)                --run RUN         required: on the command line or in --config

A help longer than a line goes in a string literal on the lines just below the field (an attribute docstring).
A few fields need more than their type says; they carry `dataclasses.field(metadata=...)` with these keys:
`flags` (the option strings, e.g. aliases), `positional` (True: an argument without `--`), `metavar`,
`parse` (a function from the text to the value, e.g. `duration`), `sep` (a tuple's items may also be split on
it: `--lora-targets q_proj,v_proj`), `const` (the option may be given bare: `--resume` means True),
`choices` (when a constant, not a Literal, holds them), `internal` (True: no option and no settings-file key;
the class fills it itself, as `DataConfig.options` from the task's own options).

Every generated option defaults to None ("not given"), so a caller can layer values: the dataclass defaults,
then a `--config` file, then what the command line gave (`given`). The help shows the dataclass default.

A field named in `either` (the command line's `run`) is taken both ways: as a positional argument (`attnkit
generate runs/x`) and as its flag (`--run runs/x`), once. `usage` writes a command's usage line from the same
fields: positional arguments, then the required options without brackets, then `[options]`.

Why a small generator and not jsonargparse (which litgpt uses): the settings classes already document their
fields in trailing comments, which this module reads; the command line must keep its exact spellings
(`--resume [PATH]`, `--max-time 5m`, `--set KEY=VALUE`, `--no-progress`), its argparse error behaviour and
exit codes; errors speak attnkit's ConfigError/InputError; and one module of stdlib code adds no dependency.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import textwrap
import types
import typing
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from attnkit.errors import ConfigError, InputError, nearest
from attnkit.textfiles import special_file


def field_help(cls: type) -> dict[str, str]:
    """Field name -> its help: the comment after it in the class body, or the string literal on the lines just
    below it (an attribute docstring, for help longer than a line); base classes' fields included."""
    found: dict[str, str] = {}
    for klass in reversed([k for k in cls.__mro__ if dataclasses.is_dataclass(k)]):
        found.update(_comments(klass))
    return found


@functools.cache
def _comments(cls: type) -> dict[str, str]:
    try:
        source = textwrap.dedent(inspect.getsource(cls))
    except (OSError, TypeError):  # defined in an interactive session: no source, no comments
        return {}
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    comments = {}
    nodes = getattr(body, "body", [])
    for node, after in zip(nodes, [*nodes[1:], None], strict=True):
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            text = _trailing_comment(lines[node.end_lineno - 1])
            below = after.value if isinstance(after, ast.Expr) else None
            if isinstance(below, ast.Constant) and isinstance(below.value, str):
                text = " ".join(below.value.split())
            if text:
                comments[node.target.id] = text
    return comments


def _trailing_comment(line: str) -> str:
    """The `# comment` ending a line of code (a '#' inside a string literal does not count)."""
    import io
    import tokenize

    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, SyntaxError):
        return ""
    return next((t.string.lstrip("#").strip() for t in tokens if t.type == tokenize.COMMENT), "")


def fields_of(cls: type) -> dict[str, dataclasses.Field]:
    """The fields that are options (all but those the class fills itself, `internal`)."""
    return {f.name: f for f in dataclasses.fields(cls) if f.init and not f.metadata.get("internal")}


def field_default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return dataclasses.MISSING


def show_default(value: Any) -> str:
    """How help text writes a default: `on`/`off` for booleans, comma lists for tuples, repr-free otherwise."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value) or "none"
    return str(value)


def help_text(cls: type, name: str, also: str = "") -> str:
    """The field's comment, followed by its default when it has one other than None (and by `also`, another
    spelling of the option)."""
    text = field_help(cls).get(name, "")
    default = field_default(fields_of(cls)[name])
    notes = [note for note in ("required" if default is dataclasses.MISSING else "", also) if note]
    if notes:
        text = f"{text} ({'; '.join(notes)})"
    if default is None or default is dataclasses.MISSING:
        return text
    return f"{text} (default: {show_default(default)})"


def flag(name: str) -> str:
    """A field's option string: `max_steps` -> `--max-steps`."""
    return f"--{name.replace('_', '-')}"


def add_fields(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, *, either: Iterable[str] = (),
    refuse: typing.Mapping[str, str] | None = None,
) -> None:
    """Add one option per field of dataclass `cls` to `parser`; see the module docstring for how a field's type
    becomes the option, and for the fields in `either`. Every option's argparse default is None. The fields in
    `refuse` (name -> why) do not apply here: their options are left out of the help, and one given is a usage
    error that says why."""
    hints = typing.get_type_hints(cls)
    for name, f in fields_of(cls).items():
        meta = f.metadata
        kwargs = _argparse_kwargs(hints[name], meta)
        if refuse and name in refuse:
            _add_refused(parser, name, meta, kwargs, refuse[name])
            continue
        kwargs["help"] = help_text(cls, name).replace("%", "%%")
        default = field_default(f)
        if name in either:
            _add_either(parser, cls, name, kwargs)
            continue
        if meta.get("positional"):
            flags: tuple[str, ...] = (name,)
            kwargs["metavar"] = name.upper()  # as the usage line writes it
            if default is not dataclasses.MISSING:
                kwargs.setdefault("nargs", "?")
        else:
            flags = tuple(meta.get("flags", (flag(name),)))
            kwargs["dest"] = name
        if "metavar" in meta:
            kwargs["metavar"] = meta["metavar"]
        parser.add_argument(*flags, default=None, **kwargs)


def _add_either(parser: argparse.ArgumentParser | argparse._ArgumentGroup, cls: type, name: str,
                kwargs: dict[str, Any]) -> None:
    """Field `name` as a positional argument (shown in the usage and help) and as its flag (accepted, not shown
    again), both filling one value."""
    if "nargs" in kwargs or "action" in kwargs:
        raise TypeError(f"{cls.__name__}.{name}: only a field of one value is taken positionally or by flag")
    metavar = fields_of(cls)[name].metadata.get("metavar", name.upper())
    kwargs["help"] = help_text(cls, name, also=f"or {flag(name)} {metavar}").replace("%", "%%")
    parser.add_argument(name, nargs="?", default=None, action=_Once, metavar=metavar, **kwargs)
    kwargs["help"] = argparse.SUPPRESS
    parser.add_argument(flag(name), dest=name, default=None, action=_Once, metavar=metavar, **kwargs)


def _add_refused(parser: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, meta: typing.Mapping[str, Any],
                 kwargs: dict[str, Any], why: str) -> None:
    """Field `name`'s option, hidden, taking what it would take (so that its value is not read as another
    argument), and refused with `why` when given."""
    switch = kwargs.get("action") is argparse.BooleanOptionalAction
    flags = (flag(name), f"--no-{flag(name)[2:]}") if switch else tuple(meta.get("flags", (flag(name),)))
    parser.add_argument(*flags, dest=name, default=None, nargs=0 if switch else kwargs.get("nargs"), action=_Refused,
                        why=why, help=argparse.SUPPRESS)


class _Refused(argparse.Action):
    """An option for other uses of the command than this one (another task's run): given, a usage error."""

    def __init__(self, option_strings, dest, *, why: str, **kwargs) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.why = why

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(self.why)


class _Once(argparse.Action):
    """A value that a positional argument or its flag gives, once (a positional not given changes nothing)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if values is None:
            return
        before = getattr(namespace, self.dest, None)
        if before is not None and before != values:
            parser.error(f"{self.metavar} is given twice ({before} and {values}); give it once")
        setattr(namespace, self.dest, values)


def usage(classes: Iterable[type], *, either: Iterable[str] = ()) -> str:
    """The usage line's words after the command: positional arguments, the required options (no brackets: they
    must be given, on the command line or in --config), then `[options]`."""
    positional, required = [], []
    for cls in classes:
        for name, f in fields_of(cls).items():
            meta, needed = f.metadata, field_default(f) is dataclasses.MISSING
            metavar = meta.get("metavar", name.upper())
            if name in either or meta.get("positional"):
                positional.append(metavar if needed else f"[{metavar}]")
            elif needed:
                many = get_origin(_without_none(typing.get_type_hints(cls)[name])) is tuple
                required.append(f"{meta.get('flags', (flag(name),))[0]} {metavar}{f' [{metavar} ...]' if many else ''}")
    return " ".join([*positional, *required, "[options]"])


def _argparse_kwargs(hint: Any, meta: typing.Mapping[str, Any]) -> dict[str, Any]:
    """argparse keywords for a field of type `hint`."""
    hint = _without_none(hint)
    kwargs: dict[str, Any] = {}
    if "const" in meta:
        kwargs.update(nargs="?", const=meta["const"])
    if hint is bool and "const" not in meta:
        return {"action": argparse.BooleanOptionalAction}
    choices = _choices(hint)
    if choices:
        kwargs.update(choices=choices, type=type(choices[0]))
    elif get_origin(hint) is tuple:
        item = get_args(hint)[0]
        parse = meta.get("parse", item if item in (int, float) else str)
        kwargs.update(nargs="+", action=_Items, type=_splitter(meta["sep"], parse) if "sep" in meta else parse)
    else:
        kwargs["type"] = meta.get("parse", _scalar(hint))
    if "choices" in meta:
        kwargs["choices"] = list(meta["choices"])
    return kwargs


def _without_none(hint: Any) -> Any:
    """`X | None` -> X; a union of a type with str (`str | bool` of `--resume`) -> str."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
        return str if str in args else args[0]
    return hint


def _choices(hint: Any) -> list[Any] | None:
    if get_origin(hint) is Literal:
        return list(get_args(hint))
    return None


def _scalar(hint: Any) -> Callable[[str], Any]:
    return hint if hint in (int, float, str) else str


def _splitter(sep: str, parse: Callable[[str], Any]) -> Callable[[str], list[Any]]:
    def split(text: str) -> list[Any]:
        return [parse(part) for part in text.split(sep) if part]

    return split


class _Items(argparse.Action):
    """A tuple option: one or more values, and more again when the option is repeated (`--set a=1 --set b=2`);
    with `sep`, each value may hold several (`q_proj,v_proj`)."""

    def __call__(self, parser, namespace, values, option_string=None):
        items = [i for v in values for i in (v if isinstance(v, list) else [v])]
        setattr(namespace, self.dest, (*(getattr(namespace, self.dest) or ()), *items))


def given(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The fields of `cls` that the command line gave (a value other than None); tuples for lists."""
    out = {}
    for name in fields_of(cls):
        value = getattr(args, name, None)
        if value is not None:
            out[name] = tuple(value) if isinstance(value, list) else value
    return out


class MissingOption(InputError):
    """A required option given neither on the command line nor in a settings file: a usage error."""


def build(cls: type, *layers: dict[str, Any], either: Iterable[str] = ()) -> Any:
    """`cls(**values)` from `layers` (later ones win); a required field missing is a MissingOption naming it as
    the command line spells it (a field of `either` as its positional argument)."""
    values: dict[str, Any] = {}
    for layer in layers:
        values.update(layer)
    fields = fields_of(cls)
    missing = [n for n, f in fields.items() if field_default(f) is dataclasses.MISSING and n not in values]
    if missing:
        names = ", ".join(f"{fields[n].metadata.get('metavar', n.upper())} (or {flag(n)})" if n in either
                          else n.upper() if fields[n].metadata.get("positional") else flag(n) for n in missing)
        raise MissingOption(f"missing {names}: give {'them' if len(missing) > 1 else 'it'} on the command line or in "
                            "the --config file")
    return cls(**values)


def coerce(cls: type, name: str, value: Any) -> Any:
    """A value read from a JSON or YAML file, made the field's type: lists -> tuples, text through `parse`."""
    f = fields_of(cls)[name]
    hint = _without_none(typing.get_type_hints(cls)[name])
    if isinstance(value, list) and get_origin(hint) is tuple:
        return tuple(value)
    if isinstance(value, str) and get_origin(hint) is tuple:  # one item, as YAML writes it: `data: input.txt`
        return tuple(_splitter(f.metadata["sep"], str)(value)) if "sep" in f.metadata else (value,)
    if isinstance(value, dict) and f.metadata.get("metavar") == "KEY=VALUE":  # `set: {n_layers: 6}`
        return tuple(f"{key}={json.dumps(item)}" for key, item in value.items())
    if isinstance(value, str) and "parse" in f.metadata:
        try:
            return f.metadata["parse"](value)
        except (argparse.ArgumentTypeError, ValueError) as err:
            raise InputError(f"{name}: {err}") from None
    return value


def read_settings_file(path: str | Path) -> dict[str, Any]:
    """A JSON (.json) or YAML (.yaml, .yml) file holding one object of setting: value."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"--config {path} is a directory; give a JSON or YAML file of settings")
    kind = special_file(path)
    if kind is not None:
        raise InputError(f"--config {path} is {kind}, not a regular file; give a JSON or YAML file of settings")
    if not path.is_file():
        raise InputError(f"--config {path}: no such file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise InputError(f"--config {path} is not UTF-8 text ({err.reason} at byte {err.start}); give a JSON or "
                         "YAML file") from None
    if path.suffix.lower() in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError:
            raise InputError(f"--config {path}: reading YAML needs PyYAML (pip install pyyaml); or write the "
                             "file as JSON") from None
        try:
            data = yaml.safe_load(text)
        except (yaml.YAMLError, RecursionError) as err:  # RecursionError: nested deeper than Python's stack
            raise InputError(f"--config {path} is not valid YAML: {err}") from None
    else:
        try:
            data = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as err:  # RecursionError: nested deeper than Python's stack
            raise InputError(f"--config {path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise InputError(f"--config {path} must hold one object of setting: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def assignments(texts: Iterable[str]) -> dict[str, Any]:
    """`--set` strings `key=value` -> {key: value}; a value is read as JSON when it parses (`false`, `6`, `[1, 2]`),
    else kept as text (`rope`). Raises ConfigError for a string without `=` or key."""
    changes: dict[str, Any] = {}
    for text in texts:
        key, sep, raw = text.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--set expects key=value, got {text!r}")
        try:
            changes[key] = json.loads(raw)
        except json.JSONDecodeError:
            changes[key] = raw
        except RecursionError:
            raise ConfigError(f"--set {key}=...: the value is nested too deeply to read; give a plain value") from None
    return changes


def duration(text: str) -> float:
    """'300', '90s', '5m', '1.5h' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    scale = units.get(text[-1:].lower(), 1)
    try:
        seconds = float(text[:-1] if text[-1:].lower() in units else text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is no duration; write e.g. 300, 90s, 5m or 1h") from None
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the duration must be positive")
    return seconds


def one_flag(what: str, **flags: bool) -> str | None:
    """The one boolean flag given among `flags` (its option name without "--": int8_dynamic -> "int8-dynamic"),
    None for none; InputError naming them when more than one is, as `what` says they are."""
    given = [name.replace("_", "-") for name, on in flags.items() if on]
    if len(given) > 1:
        raise InputError(f"{' and '.join('--' + name for name in given)} are {what}; give one")
    return given[0] if given else None


def unknown_keys(keys: Iterable[str], known: Iterable[str], what: str) -> None:
    """Raise a ConfigError naming the keys that are not among `known`, each with the nearest known one."""
    known = set(known)
    unknown = sorted(set(keys) - known)
    if unknown:
        guesses = [f"{key!r} (did you mean {guess!r}?)" if (guess := nearest(key, known)) else repr(key)
                   for key in unknown]
        raise ConfigError(f"unknown {what} {', '.join(guesses)}; the keys are the command's options' names "
                          "(see its --help)")
