"""Model configs, one frozen, validated dataclass per model family, and the type checks every config shares.

Every choice the lectures teach is a field: the attention score, the position scheme, the norm and where it sits,
the feed-forward activation; for the recurrent baseline the cell, its width and the attention kind. An invalid
value or combination raises `ConfigError` when the config is constructed, naming the field and the fix. Only the
family builders (`attnkit.models`) turn a config into modules.

    ModelConfig                    what every family has: family, vocab_size, n_layers, max_seq_len, dropout, ...
      TransformerConfig            the Transformer's fields (d_model, n_heads, score, position, norm, ...)
        DecoderConfig              family "decoder"          (GPT, Llama)
        EncoderConfig              family "encoder"          (BERT): + encoder_head, n_classes, pooling, ...
        EncoderDecoderConfig       family "encoder-decoder"  (Vaswani, Marian): + tgt_vocab_size, n_decoder_layers
      RecurrentLMConfig            family "recurrent-lm"     (char-rnn): cell, hidden_size, embedding_dim
        RecurrentSeq2SeqConfig     family "recurrent-seq2seq": + bidirectional encoder, attention kind, ...
      ConvLMConfig                 family "conv-lm"          (Dauphin et al.'s GCNN): d_model, kernel_size, dilations
      FeedForwardLMConfig          family "feedforward-lm"   (Bengio et al. 2003; a DAN): context, context_size, ...

`ModelConfig(family=..., **fields)` (and `ModelConfig.from_dict` / `from_json`) builds the class that declares that
family; a field the family does not have is a ConfigError naming the families that do. A `config.json` written
when one flat config served every Transformer family still loads: the other families' fields it carries at their
defaults are dropped.

Conventions for every config and settings dataclass in attnkit (the command line is generated from them):
- the annotation is the type: `check_types(self)` at the start of `__post_init__` holds each value to it, so a
  string for a boolean or a number is a ConfigError naming the field, the value and the type expected;
- choices are `Literal[...]` annotations;
- the comment after a field (`name: type = default  # help text`), or a string literal on the lines below it, is
  its help; `field_help(cls)` (`attnkit.options`) reads them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import types
import typing
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args, get_origin

from attnkit.deprecation import warn_renamed
from attnkit.errors import ConfigError, nearest
from attnkit.options import assignments, field_help
from attnkit.readback import FileFields, parse_json
from attnkit.textfiles import special_file
from attnkit.version import installed_version

log = logging.getLogger(__name__)

# Names that were attributes beside the fields whose "None: same as ..." they resolved (config.kv_heads beside
# n_kv_heads): one name per concept now, the field's (`config.resolved.n_kv_heads` is the resolved value). A config
# that still names them (a hand-written config.json, through from_dict) is read with a warning naming the field.
RENAMED_FIELDS = {"kv_heads": "n_kv_heads", "head_size": "head_dim", "use_final_norm": "final_norm",
                  "decoder_layers": "n_decoder_layers", "embedding_size": "embedding_dim",
                  "encoder_size": "encoder_hidden_size"}

Score = Literal["scaled_dot", "dot", "bilinear", "additive"]
Position = Literal["sinusoidal", "learned", "relative", "rope", "alibi", "none"]
Norm = Literal["layer", "rms"]
NormPosition = Literal["pre", "post"]
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "swiglu"]
HeadOutput = Literal["sequence", "position", "token", "none"]
SinusoidalLayout = Literal["interleaved", "halves"]
Pooling = Literal["cls", "mean"]
Cell = Literal["rnn", "gru", "lstm"]
RecurrentAttention = Literal["none", "bahdanau", "luong-dot", "luong-general"]

DEFAULT_FAMILY = "decoder"
CONFIG_FILE_FIX = "give a model config file (a run's config.json), or write it again from its config"


# Type checks shared by every config ---------------------------------------------------------------------------
def check_types(obj: Any) -> None:
    """Hold every field of the dataclass instance `obj` to its annotation (call it first in `__post_init__`).

    bool takes only true/false (never "no", "false" or 1); int takes whole numbers (not bools); float takes any
    real number and stores it as a float; `tuple[X, ...]` takes a list too (JSON has no tuples) and stores a
    tuple; `Literal[...]` takes only its choices. Raises ConfigError naming the field, the value and the type.
    """
    hints = _type_hints(type(obj))
    for f in dataclasses.fields(obj):
        if f.name not in hints:  # an annotation that cannot be resolved here is not checked
            continue
        value = getattr(obj, f.name)
        ok, conformed = _conform(value, hints[f.name])
        if not ok and get_origin(hints[f.name]) is Literal:
            choices = ", ".join(str(a) for a in get_args(hints[f.name]))
            raise ConfigError(f"{f.name}={value!r} is not a known choice; use one of {choices}")
        if not ok:
            raise ConfigError(
                f"{f.name}={value!r} ({type(value).__name__}) is not {_describe(hints[f.name])}; "
                f"{_fix_hint(f.name, hints[f.name], value)}"
            )
        if conformed is not value:
            object.__setattr__(obj, f.name, conformed)  # a float field given an int, a tuple field given a list


# Heads: what a model's last layer outputs --------------------------------------------------------------------
# family -> head (the config's encoder_head / decoder_head) -> what it outputs, which decides how the family builds
# it: sequence: a label per text (pooled); position: a label per position (token classification); token: a token
# per position (the vocabulary); none: the bare model's states. A task names the head its models need
# (`TaskSpec.head`); one of its own may add a head of a kind the family builds (`register_head`).
HEADS: dict[str, dict[str, HeadOutput]] = {
    "encoder": {"classify": "sequence", "mlm": "token", "tag": "position", "none": "none"},
    "decoder": {"lm": "token", "tag": "position", "reward": "sequence"},
}


def register_head(family: str, name: str, output: HeadOutput) -> None:
    """Let models of `family` take the head `name`, built as the family builds heads that output `output` (the
    same modules and weight names; a task whose models label positions under a head of its own name needs no
    model code). Raises ConfigError for an unknown family or output, or a name taken by another output."""
    if family not in HEADS:
        raise ConfigError(f"family {family!r} has no heads to add to; those with heads: {', '.join(HEADS)}")
    outputs = set(HEADS[family].values())
    if output not in outputs:
        raise ConfigError(f"the {family} family builds heads that output {', '.join(sorted(outputs))}, not {output!r}")
    if HEADS[family].get(name, output) != output:
        raise ConfigError(f"{family} head {name!r} outputs {HEADS[family][name]!r} already")
    HEADS[family][name] = output


def head_output(family: str, name: str) -> HeadOutput:
    """What head `name` of a `family` model outputs. Raises ConfigError naming the family's heads."""
    heads = HEADS[family]
    if name not in heads:
        guess = nearest(str(name), list(heads))
        hint = f" (did you mean {guess!r}?)" if guess else ""
        raise ConfigError(f"{family} head {name!r} is not one attnkit builds{hint}; choose one of {', '.join(heads)}")
    return heads[name]


def require_positive(obj: Any, *names: str) -> None:
    """Each named field is a finite number > 0 (None passes: "not set"). Zero never means "the default"."""
    for name in names:
        value = getattr(obj, name)
        try:
            finite = value is None or math.isfinite(value)
        except OverflowError:  # an integer beyond a float's range (JSON reads 400 digits as one)
            raise ConfigError(f"{name} is an integer of {value.bit_length()} bits, beyond any float and any model; "
                              "give a size a model can have") from None
        if not finite:
            raise ConfigError(f"{name}={value!r} must be a finite positive number; give one, or leave it unset for "
                              "the default")
        if value == 0:
            raise ConfigError(f"{name}=0 must be positive; 0 has no meaning here (leave it unset instead)")
        if value is not None and value < 0:
            raise ConfigError(f"{name}={value!r} must be positive: a size or count is never below 0")


def require_fraction(obj: Any, *names: str) -> None:
    """Each named field lies in [0, 1) (dropout rates, label smoothing)."""
    for name in names:
        value = getattr(obj, name)
        if not 0.0 <= value < 1.0:
            raise ConfigError(f"{name}={value} must lie in [0, 1); 0 disables it")


@cache
def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=False)
    except (NameError, TypeError):  # names imported only for type checkers: resolve field by field
        hints = {}
        for klass in cls.__mro__:
            namespace = vars(sys.modules.get(klass.__module__, None) or object)
            for name, annotation in getattr(klass, "__annotations__", {}).items():
                try:
                    hints.setdefault(name, eval(annotation, namespace) if isinstance(annotation, str) else annotation)
                except Exception:  # noqa: BLE001 - an annotation this module cannot see is left unchecked
                    continue
        return hints


def _conform(value: Any, hint: Any) -> tuple[bool, Any]:
    """(whether `value` fits `hint`, the value as stored)."""
    origin, args = get_origin(hint), get_args(hint)
    if hint is Any or hint is ClassVar:
        return True, value
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args), value
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            ok, conformed = _conform(value, arg)
            if ok:
                return True, conformed
        return False, value
    if hint is type(None):
        return value is None, value
    if hint is bool:
        return isinstance(value, bool), value
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if hint is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok, _as_float(value) if ok and not isinstance(value, float) else value
    if hint is str:
        return isinstance(value, str), value
    if hint is Path:
        return isinstance(value, (str, Path)), value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            return False, value
        items = args[:1] * len(value) if len(args) == 2 and args[1] is Ellipsis else args
        if len(items) != len(value):
            return False, value
        checked = [_conform(v, a) for v, a in zip(value, items, strict=True)]
        if not all(ok for ok, _ in checked):
            return False, value
        conformed = tuple(v for _, v in checked)
        return True, value if conformed == value and isinstance(value, tuple) else conformed
    if origin is list:
        return isinstance(value, list) and all(_conform(v, args[0])[0] for v in value) if args else True, value
    if origin is dict:
        return isinstance(value, dict), value
    if isinstance(hint, type):
        return isinstance(value, hint), value
    return True, value  # Callable and other annotations are not data


def _as_float(value: int) -> float:
    """The float of integer `value`; one beyond a float's range is infinite, as JSON's 1e400 reads (the range checks
    then name the field)."""
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _describe(hint: Any) -> str:
    origin, args = get_origin(hint), get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin is tuple:
        return "a list of " + _describe(args[0]).removeprefix("a ").removeprefix("an ") + "s" if args else "a list"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "null",
             Path: "a path"}
    return names.get(hint, f"a {getattr(hint, '__name__', hint)}")


def _fix_hint(name: str, hint: Any, value: Any) -> str:
    if hint is bool or bool in get_args(hint):
        return f"write {name}=true or {name}=false (in JSON: true or false without quotes)"
    if isinstance(value, str) and (hint in (int, float) or {int, float} & set(get_args(hint))):
        return "write the number without quotes"
    return f"give {_describe(hint)}"


# The family configs -------------------------------------------------------------------------------------------
class _FamilyDispatch(type):
    """`ModelConfig(family=..., **fields)` builds the class that declares `family`; every config class refuses a
    field it does not have with a ConfigError (not a TypeError) naming the families that have it."""

    def __call__(cls, *args: Any, **fields: Any) -> Any:
        if args:
            raise ConfigError(f"{cls.__name__} takes keyword arguments only (field=value)")
        target = config_class(fields.get("family", DEFAULT_FAMILY)) if cls is ModelConfig else cls
        return type.__call__(target, **_applicable(target, fields))


@dataclass(frozen=True)
class ModelConfig(metaclass=_FamilyDispatch):
    """What every family's config holds. `ModelConfig(family=..., **fields)` builds that family's config class.

    Raises:
        ConfigError: on any invalid field, value or combination, naming the field and the fix.
    """

    FAMILY: ClassVar[str | None] = None  # set by the classes that declare a family
    _CLASSES: ClassVar[dict[str, type[ModelConfig]]] = {}

    family: str = DEFAULT_FAMILY
    """model family: decoder | encoder | encoder-decoder | recurrent-lm | recurrent-seq2seq | conv-lm |
    feedforward-lm"""
    vocab_size: int = 256  # token vocabulary (the source side's, for sequence-to-sequence families)
    n_layers: int = 2  # layers (of the encoder, for sequence-to-sequence families)
    max_seq_len: int = 256  # longest sequence the model reads (learned positions need it; recurrences read any)
    dropout: float = 0.0  # dropout rate on activations while training; 0 disables it
    tie_embeddings: bool = True  # the output layer shares the (target) embedding table (Press & Wolf 2017)
    label_smoothing: float = 0.0  # training loss: weight spread evenly over the vocabulary (Szegedy et al. 2016)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "FAMILY" in cls.__dict__:
            ModelConfig._CLASSES[cls.FAMILY] = cls

    def __post_init__(self) -> None:
        check_types(self)
        require_positive(self, "vocab_size", "n_layers", "max_seq_len")
        require_fraction(self, "dropout", "label_smoothing")

    @property
    def resolved(self) -> ModelConfig:
        """This config with every field left at "None: same as ..." filled in (`config.resolved.head_dim` is the
        head dimension whether or not the config set it); it builds the same model."""
        derived = {name: value for name, value in self._derived().items() if getattr(self, name) is None}
        return dataclasses.replace(self, **derived) if derived else self

    def _derived(self) -> dict[str, Any]:
        """The value each "None: same as ..." field stands for."""
        return {}

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        """The shapes of the largest weights of each kind the model holds (or bounds on them), by name: what the
        size check (`models.families.check_sizes`) reads without building anything."""
        return {}

    @property
    def receptive_field(self) -> int | None:
        """How many tokens (the current one included) a position's prediction reads at most, where the family's
        architecture fixes that whatever the text (a convolution's taps); None where it is not declared (every token
        given, up to what the positions allow). The training log reports it."""
        return None

    def __getattr__(self, name: str) -> Any:
        """The old attribute names of resolved values (`config.kv_heads`): `config.resolved.<field>`, with a
        DeprecationWarning."""
        field = RENAMED_FIELDS.get(name)
        if field is None or field not in _field_names(type(self)):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        warn_renamed(f"config.{name}", f"config.resolved.{field}")
        return getattr(self.resolved, field)

    # Serialisation -------------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self, path: str | Path | None = None) -> str:
        """The config as JSON text; also written to `path` when given."""
        text = json.dumps(self.to_dict(), indent=2, sort_keys=True)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, saved: bool = False) -> ModelConfig:
        """The config `data` describes: the class of its `family` (decoder when absent), or `cls` when that is a
        family's class. Raises ConfigError for unknown fields or fields the family does not have. `saved`: the
        config of a run already trained (`checkpoint.load_config`), whose window settings from before the window
        checks read as the model they built (`_windows_read_back`); a new config is refused for them."""
        if not isinstance(data, dict):
            raise ConfigError("a model config must be an object of field: value")
        if saved:
            data = _windows_read_back(_current_names(data))
        return ModelConfig(**data) if cls is ModelConfig else cls(**data)

    @classmethod
    def from_json(cls, text_or_path: str | Path, *, saved: bool = False) -> ModelConfig:
        """Read a config from JSON text (a string starting with `{` or `[`) or from a path to a JSON file, checked:
        UTF-8, valid JSON, no key given twice, an object of fields. Raises ConfigError naming the problem. `saved`:
        a run's config.json, as `from_dict` reads it; a family or field this attnkit lacks is refused as the mark of
        a newer attnkit, saying to upgrade."""
        if isinstance(text_or_path, str) and text_or_path.lstrip().startswith(("{", "[")):
            data, source = parse_json(text_or_path, "config", fix=CONFIG_FILE_FIX, error=ConfigError), "the config"
        else:
            path = source = Path(text_or_path)
            try:
                kind = "a directory" if path.is_dir() else special_file(path)
                exists = path.is_file()
            except OSError as err:  # a name too long for the file system, a folder without permission
                raise ConfigError(f"config file {path} cannot be read ({err.strerror}); {CONFIG_FILE_FIX}") from None
            if kind is not None:
                raise ConfigError(f"config file {path} is {kind}, not a regular file; {CONFIG_FILE_FIX}")
            if not exists:
                raise ConfigError(f"config file {path} does not exist")
            data = FileFields.read(path, fix=CONFIG_FILE_FIX, error=ConfigError).data
        if not isinstance(data, dict):
            raise ConfigError("config JSON must be an object of field: value")
        if saved:
            _refuse_newer(data, str(source))
        return cls.from_dict(data, saved=saved)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with `changes` applied, validated again. A change of `family` keeps the fields the two families
        share and drops the old family's own."""
        data = self.to_dict()
        if changes.get("family", self.family) != self.family:
            keep = _field_names(config_class(changes["family"]))
            data = {name: value for name, value in data.items() if name in keep}
        return ModelConfig(**{**data, **changes})

    def with_overrides(self, texts: list[str]) -> ModelConfig:
        """Apply `key=value` strings (the CLI's `--set`, read by `attnkit.options.assignments`): values are parsed
        as JSON when they parse, so `tie_embeddings=false` is the boolean and `tie_embeddings=no` the string "no"
        (refused by the type check)."""
        return self.replace(**assignments(texts))

    def with_vocabulary(self, vocab_size: int) -> ModelConfig:
        """This config for a tokenizer of `vocab_size` tokens (on both sides, for sequence-to-sequence models)."""
        return self.replace(vocab_size=vocab_size)

    def inert_fields(self) -> set[str]:
        """Fields that change nothing this config computes (kept for the record: e.g. rope_theta without RoPE)."""
        return set()


def config_class(family: str) -> type[ModelConfig]:
    """The config class that declares `family`. Raises ConfigError naming the known families."""
    if not isinstance(family, str) or family not in ModelConfig._CLASSES:
        raise ConfigError(f"family={family!r} is not a known choice; use one of {', '.join(family_names())}")
    return ModelConfig._CLASSES[family]


def family_names() -> list[str]:
    """Every family a config class declares, in the order they are defined."""
    return list(ModelConfig._CLASSES)


def model_field_names() -> set[str]:
    """Every field some family's config has (what `--set` may name for the model)."""
    return set().union(*(_field_names(c) for c in ModelConfig._CLASSES.values()))


def _field_names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _applicable(cls: type[ModelConfig], fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` under their current names (`RENAMED_FIELDS`), without what a flat config.json of the Transformer
    families carried for its sibling families at their defaults; raises ConfigError for any other field `cls`
    lacks."""
    own = _field_names(cls)
    out = {}
    for name, value in _current_names(fields).items():
        if name in own:
            out[name] = value
            continue
        holders = [c for c in ModelConfig._CLASSES.values() if name in _field_names(c)]
        legacy = issubclass(cls, TransformerConfig) and any(
            issubclass(c, TransformerConfig) and _default(c, name) == value for c in holders
        )
        if legacy:
            continue
        if not holders:
            raise ConfigError(f"unknown config field {name!r}; the fields of family={cls.FAMILY!r} are {sorted(own)}")
        families = " or ".join(repr(c.FAMILY) for c in holders)
        raise ConfigError(
            f"{name}={value!r} applies to family={families} only, not to family={cls.FAMILY!r}; remove it or "
            f"change the family"
        )
    return out


def _windows_read_back(data: dict[str, Any]) -> dict[str, Any]:
    """`data` with the window settings a config refuses since they change nothing read as what they built: a window
    longer than max_seq_len (it hid no key) as none, a global_every beyond every stack (no layer attended globally)
    as 0, each with a warning naming the field; so old runs' config.json files keep loading as the same model. Read
    after `_current_names`: an old file's decoder_layers is the decoder's depth here too."""
    window, every = data.get("attention_window"), data.get("global_every", 0)
    sizes = (window, every, data.get("max_seq_len", 1), data.get("n_layers", 1), data.get("n_decoder_layers"))
    if not all(v is None or (isinstance(v, int) and not isinstance(v, bool)) for v in sizes):
        return data  # not numbers: the type checks name them
    depths = [data.get(name) or data.get("n_layers", _default(ModelConfig, "n_layers"))
              for name in ("n_layers", "n_decoder_layers")]
    out = dict(data)
    if window is not None and window > data.get("max_seq_len", _default(ModelConfig, "max_seq_len")):
        log.warning("attention_window=%d is longer than max_seq_len, so it hides no key: read as none (write null)",
                    window)
        out.update(attention_window=None, global_every=0)
    elif every and every > max(depths):
        log.warning("global_every=%d is more than every stack's layers, so no layer attends globally: read as 0", every)
        out["global_every"] = 0
    return out


def _refuse_newer(data: dict[str, Any], source: str) -> None:
    """ConfigError for a saved config (`source`) with a family or fields that no family of this attnkit has: one a
    newer attnkit wrote, which this one cannot build; the message says so and what to do."""
    family = data.get("family", "decoder")
    unknown = sorted(set(data) - model_field_names() - set(RENAMED_FIELDS))
    if isinstance(family, str) and family not in ModelConfig._CLASSES:
        what = f"family={family!r}, which this attnkit does not have (it has {', '.join(family_names())})"
    elif unknown:
        what = f"{'fields' if len(unknown) > 1 else 'the field'} {', '.join(unknown)}, unknown to this attnkit"
    else:
        return
    raise ConfigError(f"{source} names {what}: the run was probably saved by a newer attnkit than this one "
                      f"({installed_version()}); upgrade attnkit (pip install -U attnkit) to load it, or, if {source} "
                      "was edited by hand, undo the edit")


def _current_names(fields: dict[str, Any]) -> dict[str, Any]:
    """`fields` with each old name (`RENAMED_FIELDS`) read as its field, with a warning naming the field."""
    out = dict(fields)
    for old, new in RENAMED_FIELDS.items():
        if old in out:
            if new in out:
                raise ConfigError(f"the config has both {old} and {new}; {old} is the old name of {new}: keep {new}")
            log.warning("config field %r is now called %r; read as %s=%r (write %s in the config)", old, new, new,
                        out[old], new)
            out[new] = out.pop(old)
    return out


def _default(cls: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


@dataclass(frozen=True)
class TransformerConfig(ModelConfig):
    """A Transformer variant. Sizes follow one vocabulary: `d_model n_heads n_kv_heads head_dim d_ff n_layers`.

    `d_ff` is the feed-forward hidden width: for `relu`/`gelu`/`gelu_tanh`/`silu` the FFN is `down(act(up(x)))`
    with `up: C -> d_ff`; for `swiglu` it is `down(silu(gate(x)) * up(x))`, with gate and up both `C -> d_ff`
    (Llama uses d_ff ~ 8/3 C so the three matrices cost what two of width 4C would).
    """

    d_model: int = 128  # model width C
    n_heads: int = 4  # attention heads H
    n_kv_heads: int | None = None  # None: n_heads (multi-head); 1: multi-query; in between: grouped-query
    head_dim: int | None = None  # None: d_model // n_heads
    d_ff: int = 512  # feed-forward hidden width
    score: Score = "scaled_dot"  # attention score: scaled_dot, dot, bilinear (Luong general) or additive (Bahdanau)
    position: Position = "learned"  # position scheme: sinusoidal, learned, relative (Shaw), rope, alibi or none
    norm: Norm = "layer"  # LayerNorm or RMSNorm
    norm_position: NormPosition = "pre"  # pre-norm (GPT-2, Llama) or post-norm (Vaswani, BERT)
    activation: Activation = "gelu"  # feed-forward activation (swiglu: the gated form, Shazeer 2020)
    attention_dropout: float = 0.0  # dropout on the attention weights while training
    bias: bool = True  # biases in the linear layers and norms
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model) (Vaswani et al. 2017, 3.4)
    norm_eps: float = 1e-5  # epsilon of the norms
    rope_theta: float = 10000.0  # RoPE base frequency (Su et al. 2021)
    relative_max_distance: int = 16  # Shaw et al. 2018: relative distances are clipped to [-k, k]
    additive_dim: int | None = None  # hidden width of the additive (Bahdanau) score MLP; None: head_dim
    final_norm: bool | None = None  # norm after the last block; None: True for pre-norm, False for post-norm
    attention_window: int | None = None  # sliding-window attention: a query sees its last W keys (Mistral); None: all
    global_every: int = 0  # with attention_window: every Nth layer attends to all keys (Gemma 2: 2); 0: none
    attn_softcap: float | None = None  # scores soft-capped to cap * tanh(s / cap) before masks and biases (Gemma 2: 50)
    # Options that published checkpoints need (all off by default):
    sinusoidal_layout: SinusoidalLayout = "interleaved"  # sin/cos interleaved (Vaswani) or in halves (Marian)
    type_vocab_size: int = 0  # token-type (segment) embeddings added to the input (BERT: 2); 0: none
    embedding_norm: bool = False  # a norm after the embedding sum, before the first block (BERT, BART)
    lm_head_bias: bool = False  # a bias on the output projection (Marian's final_logits_bias)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "d_model", "n_heads", "n_kv_heads", "head_dim", "d_ff", "relative_max_distance",
                         "additive_dim", "norm_eps", "rope_theta", "attention_window", "attn_softcap")
        if self.global_every < 0 or (self.global_every and self.attention_window is None):
            raise ConfigError(
                f"global_every={self.global_every} makes every Nth layer attend globally between sliding-window "
                f"layers: it needs attention_window set and N >= 1 (0: every layer windowed)"
            )
        depths = self.stack_depths()
        if self.global_every > max(depths.values()):
            stacks = ", ".join(f"{name}={depth}" for name, depth in depths.items())
            raise ConfigError(
                f"global_every={self.global_every} is more than the layers of any stack ({stacks}): no layer would "
                f"attend to all keys; choose global_every between 1 and {max(depths.values())}, or 0 for a window on "
                f"every layer"
            )
        if self.attention_window is not None and self.attention_window > self.max_seq_len:
            raise ConfigError(
                f"attention_window={self.attention_window} is longer than max_seq_len={self.max_seq_len}: no query "
                f"sees more keys than that, so the window would hide nothing; choose attention_window <= "
                f"{self.max_seq_len}, or leave it unset (null) for attention to every key"
            )
        if self.position == "sinusoidal" and self.d_model % 2:
            raise ConfigError(
                f"position='sinusoidal' needs an even d_model, got d_model={self.d_model}; the encoding pairs a sine "
                f"and a cosine per frequency: choose an even d_model (e.g. {self.d_model + 1}), or another position"
            )
        require_fraction(self, "attention_dropout")
        if self.type_vocab_size < 0:
            raise ConfigError(f"type_vocab_size={self.type_vocab_size} must be >= 0 (0: no token-type embeddings)")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; choose n_heads dividing "
                f"d_model (e.g. {_divisors_hint(self.d_model)}) or set head_dim explicitly"
            )
        resolved = self._derived()
        n_kv_heads = self.n_kv_heads or resolved["n_kv_heads"]
        head_dim = self.head_dim or resolved["head_dim"]
        if self.n_heads % n_kv_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} is not divisible by n_kv_heads={n_kv_heads}; grouped-query attention "
                f"shares each key/value head among n_heads / n_kv_heads query heads: choose n_kv_heads dividing "
                f"{self.n_heads}"
            )
        if self.position == "rope" and head_dim % 2:
            raise ConfigError(
                f"position='rope' needs an even head dimension, got head_dim={head_dim}; RoPE rotates pairs "
                f"of dimensions: change d_model/n_heads or head_dim"
            )

    def _derived(self) -> dict[str, Any]:
        return {"n_kv_heads": self.n_heads, "head_dim": self.d_model // self.n_heads,
                "final_norm": self.norm_position == "pre"}

    def stack_depths(self) -> dict[str, int]:
        """The field giving the number of blocks of each stack -> that number."""
        return {"n_layers": self.n_layers}

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.resolved
        vocab = max(c.vocab_size, getattr(c, "tgt_vocab_size", None) or 0)
        return {"embedding": (vocab, c.d_model), "positions": (c.max_seq_len, c.d_model),
                "token types": (c.type_vocab_size, c.d_model), "labels": (getattr(c, "n_classes", 0), c.d_model),
                "q_proj": (c.n_heads * c.head_dim, c.d_model), "k_proj": (c.n_kv_heads * c.head_dim, c.d_model),
                "feed-forward": (c.d_ff, c.d_model), "additive score": (c.additive_dim or c.head_dim, c.head_dim),
                "relative positions": (2 * c.relative_max_distance + 1, c.head_dim)}

    def window_of(self, layer: int) -> int | None:
        """The attention window of block `layer` (0-based): `attention_window`, except every `global_every`-th
        block (1-based), which sees all keys; None: all keys."""
        if self.global_every and (layer + 1) % self.global_every == 0:
            return None
        return self.attention_window

    @property
    def residual_layers(self) -> int:
        """Blocks whose outputs add to a residual stream (GPT-2 scales their output projections by this)."""
        return self.n_layers

    def inert_fields(self) -> set[str]:
        unused = {name for name, position in (("rope_theta", "rope"), ("sinusoidal_layout", "sinusoidal"),
                                              ("relative_max_distance", "relative")) if self.position != position}
        return unused | ({"additive_dim"} if self.score != "additive" else set())


@dataclass(frozen=True)
class DecoderConfig(TransformerConfig):
    """A decoder-only model (GPT-2, Llama): causal self-attention. `decoder_head`: `lm` (next-token prediction),
    `tag` (one of `n_classes` labels per position, from the tokens up to it: Hugging Face's
    GPT2ForTokenClassification and LlamaForTokenClassification) or `reward` (`n_classes` scores of the whole
    sequence, read at its last token; one: a reward model, as LlamaForSequenceClassification with num_labels=1)."""

    FAMILY: ClassVar[str] = "decoder"
    family: Literal["decoder"] = "decoder"
    decoder_head: str = "lm"  # lm: the next token; tag: a label per position; reward: scores per sequence (`HEADS`)
    n_classes: int = 2  # a head of labels (tag): number of labels; of scores (reward): 1

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "n_classes")
        head_output(self.FAMILY, self.decoder_head)

    def inert_fields(self) -> set[str]:
        unused = super().inert_fields()
        labels = head_output(self.FAMILY, self.decoder_head) != "token"
        return unused | ({"tie_embeddings", "lm_head_bias"} if labels else {"n_classes"})


@dataclass(frozen=True)
class EncoderConfig(TransformerConfig):
    """A bidirectional encoder (BERT). `encoder_head`: `classify` (one label per sequence), `mlm` (a token per
    position), `tag` (one of `n_classes` labels per position: token classification), or `none`, the bare encoder,
    whose output is its hidden states and pooled vector (sentence embeddings; Hugging Face's BertModel)."""

    FAMILY: ClassVar[str] = "encoder"
    family: Literal["encoder"] = "encoder"
    encoder_head: str = "classify"
    """classify: a label per text; mlm: a token per position; tag: a label per position; none: bare (`HEADS`: those
    it builds)"""
    n_classes: int = 2  # a head of labels (classify, tag): number of labels
    pooling: Pooling = "cls"  # one vector per text: the first real token's (BERT's [CLS]) or the mean over real tokens
    pooler: bool = False  # dense + tanh on the pooled vector before the head (BERT's pooler)
    mlm_transform: bool = False  # masked LM: dense + activation + norm before the output projection (BERT)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "n_classes")
        head_output(self.FAMILY, self.encoder_head)
        if self.mlm_transform and head_output(self.FAMILY, self.encoder_head) != "token":
            raise ConfigError("mlm_transform=True applies to family='encoder' with encoder_head='mlm' only; set "
                              "mlm_transform=false")
        if self.mlm_transform and self.activation == "swiglu":
            raise ConfigError("mlm_transform applies `activation` to one vector and needs an elementwise one "
                              "(gelu, gelu_tanh, relu, silu), not the gated swiglu")

    def inert_fields(self) -> set[str]:
        unused = super().inert_fields()
        output = head_output(self.FAMILY, self.encoder_head)
        if output in ("token", "position"):  # heads on every position: nothing pooled
            unused |= {"pooling", "pooler"}
        if output in ("token", "none"):
            unused |= {"n_classes"}
        return unused | ({"tie_embeddings"} if output != "token" else set())


@dataclass(frozen=True)
class EncoderDecoderConfig(TransformerConfig):
    """An encoder-decoder (Vaswani et al. 2017; Marian): the decoder cross-attends to the encoder's states."""

    FAMILY: ClassVar[str] = "encoder-decoder"
    family: Literal["encoder-decoder"] = "encoder-decoder"
    tgt_vocab_size: int | None = None  # None: the target shares the source vocabulary (and, tied, its table)
    n_decoder_layers: int | None = None  # None: same as n_layers

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "tgt_vocab_size", "n_decoder_layers")

    def _derived(self) -> dict[str, Any]:
        return {**super()._derived(), "n_decoder_layers": self.n_layers}

    def stack_depths(self) -> dict[str, int]:
        return {"n_layers": self.n_layers, "n_decoder_layers": self.n_decoder_layers or self.n_layers}

    @property
    def target_vocab_size(self) -> int:
        return self.tgt_vocab_size if self.tgt_vocab_size is not None else self.vocab_size

    @property
    def residual_layers(self) -> int:
        return self.n_layers + self.resolved.n_decoder_layers

    def with_vocabulary(self, vocab_size: int) -> ModelConfig:
        return self.replace(vocab_size=vocab_size, tgt_vocab_size=None)  # one tokenizer: one shared vocabulary


@dataclass(frozen=True)
class RecurrentLMConfig(ModelConfig):
    """A recurrent language model (char-rnn; Zaremba et al. 2014): embedding -> RNN/GRU/LSTM x n_layers -> output.
    `models/recurrent/lm.py` says what runs where."""

    FAMILY: ClassVar[str] = "recurrent-lm"
    family: Literal["recurrent-lm"] = "recurrent-lm"
    cell: Cell = "lstm"  # rnn (Elman, tanh), gru (Cho et al. 2014) or lstm (Hochreiter & Schmidhuber 1997)
    hidden_size: int = 256  # width of the recurrent state H (of the decoder, for sequence-to-sequence)
    embedding_dim: int | None = None  # token embedding width E; None: hidden_size

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "hidden_size", "embedding_dim")

    def _derived(self) -> dict[str, Any]:
        return {"embedding_dim": self.hidden_size}

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        c = self.resolved
        hidden, embedding = c.hidden_size, c.embedding_dim
        memory = (getattr(c, "encoder_hidden_size", None) or 0) * (2 if getattr(c, "bidirectional", False) else 1)
        vocab = max(c.vocab_size, getattr(c, "tgt_vocab_size", None) or 0)
        # bounds: a cell's gates (4 for an LSTM) read the embedding, the attention context and the state; the readout
        # reads the context, the state and the embedding; the bridge makes every layer's state from the encoder's
        return {"embedding": (vocab, embedding), "output": (vocab, memory + hidden + embedding),
                "cell": (4 * hidden, embedding + memory + hidden), "bridge": (c.n_layers * hidden, max(memory, 1)),
                "attention score": (getattr(c, "additive_dim", None) or hidden, max(memory, hidden))}


@dataclass(frozen=True)
class RecurrentSeq2SeqConfig(RecurrentLMConfig):
    """A recurrent encoder-decoder: without attention (the bottleneck), with Bahdanau's additive attention, or
    Luong's dot or general attention. `models/recurrent/seq2seq.py` draws it."""

    FAMILY: ClassVar[str] = "recurrent-seq2seq"
    family: Literal["recurrent-seq2seq"] = "recurrent-seq2seq"
    tgt_vocab_size: int | None = None  # None: the target shares the source vocabulary (and, tied, its table)
    encoder_hidden_size: int | None = None  # width of each encoder direction; None: hidden_size
    bidirectional: bool = False  # the encoder reads the source both ways; its states are twice as wide
    attention: RecurrentAttention = "none"  # none: the final state is all the decoder sees; else the score
    additive_dim: int | None = None  # bahdanau: hidden width of the score MLP; None: hidden_size

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "tgt_vocab_size", "encoder_hidden_size", "additive_dim")
        memory = (self.encoder_hidden_size or self.hidden_size) * (2 if self.bidirectional else 1)
        if self.attention == "luong-dot" and memory != self.hidden_size:
            raise ConfigError(
                f"attention='luong-dot' needs encoder states as wide as the decoder's ({memory} vs hidden_size="
                f"{self.hidden_size}); use luong-general or bahdanau, or set encoder_hidden_size"
            )
        if self.additive_dim is not None and self.attention != "bahdanau":
            raise ConfigError("additive_dim applies to attention='bahdanau' only; remove it")

    def _derived(self) -> dict[str, Any]:
        return {**super()._derived(), "encoder_hidden_size": self.hidden_size}

    @property
    def target_vocab_size(self) -> int:
        return self.tgt_vocab_size if self.tgt_vocab_size is not None else self.vocab_size

    def with_vocabulary(self, vocab_size: int) -> ModelConfig:
        return self.replace(vocab_size=vocab_size, tgt_vocab_size=None)


@dataclass(frozen=True)
class ConvLMConfig(ModelConfig):
    """A gated convolutional language model (Dauphin et al. 2017): embedding -> n_layers causal 1-D convolutions,
    each gated by a GLU and added to its input -> output. Layer l (0-based) dilates its kernel by
    dilation_base ** (l mod dilation_cycle) (WaveNet, van den Oord et al. 2016; ByteNet, Kalchbrenner et al. 2016),
    so each token's prediction sees the `receptive_field` tokens up to it and none before.
    `models/convolutional/lm.py` draws it."""

    FAMILY: ClassVar[str] = "conv-lm"
    family: Literal["conv-lm"] = "conv-lm"
    d_model: int = 256  # channels C of every convolution's input and output (and the embedding width)
    kernel_size: int = 4  # taps k of each causal convolution: the token itself and k - 1 before it (times dilation)
    dilation_base: int = 1  # 1: no dilation; 2: each layer's dilation doubles (1, 2, 4, ...) as in WaveNet/ByteNet
    dilation_cycle: int | None = None
    """with dilation_base > 1: layers after which the dilation restarts at 1 (ByteNet: 5, WaveNet: 10); None: never"""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "d_model", "kernel_size", "dilation_base", "dilation_cycle")
        if self.kernel_size < 2:
            raise ConfigError(f"kernel_size={self.kernel_size} sees only the token itself, no context; give "
                              "kernel_size >= 2")
        if self.dilation_cycle is not None and self.dilation_base == 1:
            raise ConfigError(f"dilation_cycle={self.dilation_cycle} applies with dilation_base >= 2 only (every "
                              "dilation is 1 here); remove it, or set dilation_base=2")
        if self.dilation_cycle is not None and self.dilation_cycle > self.n_layers:
            raise ConfigError(f"dilation_cycle={self.dilation_cycle} is more than n_layers={self.n_layers}, so the "
                              f"dilation never restarts; remove it, or give dilation_cycle <= {self.n_layers}")
        top = min(self.dilation_cycle or self.n_layers, self.n_layers) - 1  # the largest dilation's exponent
        huge = self.dilation_base > 1 and top >= self.max_seq_len.bit_length()  # b ** top alone > max_seq_len
        if huge or self.receptive_field > self.max_seq_len:
            field = "more than max_seq_len" if huge else f"{self.receptive_field} tokens"
            raise ConfigError(
                f"the receptive field is {field} (kernel_size={self.kernel_size}, n_layers={self.n_layers}, "
                f"dilation_base={self.dilation_base}, dilation_cycle={self.dilation_cycle}) but max_seq_len="
                f"{self.max_seq_len}, the longest text training shows the model: the taps past it would only ever "
                f"see padding. Raise max_seq_len, or give fewer layers, a smaller kernel_size, dilation_base or "
                f"dilation_cycle"
            )

    def dilation(self, layer: int) -> int:
        """The dilation of layer `layer` (0-based)."""
        return self.dilation_base ** (layer % (self.dilation_cycle or self.n_layers))

    @property
    def receptive_field(self) -> int:
        """How many tokens (itself included) a position's prediction reads: 1 + (k - 1) * (sum of the dilations)."""
        if self.dilation_base == 1:
            return 1 + (self.kernel_size - 1) * self.n_layers
        cycle = self.dilation_cycle or self.n_layers
        cycles, rest = divmod(self.n_layers, cycle)
        base = self.dilation_base
        dilations = (cycles * (base**cycle - 1) + base**rest - 1) // (base - 1)  # geometric series, cycle by cycle
        return 1 + (self.kernel_size - 1) * dilations

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        return {"embedding": (self.vocab_size, self.d_model),
                "convolution": (2 * self.d_model, self.d_model, self.kernel_size)}


FeedForwardContext = Literal["window", "average"]


@dataclass(frozen=True)
class FeedForwardLMConfig(ModelConfig):
    """A feed-forward neural language model: the prefix read into one vector -> n_layers hidden layers -> output.
    context="window": the last context_size embeddings concatenated (Bengio et al. 2003; position-sensitive);
    context="average": the mean of every embedding so far (a deep averaging network, Iyyer et al. 2015;
    position-insensitive). `models/feedforward/lm.py` draws both."""

    FAMILY: ClassVar[str] = "feedforward-lm"
    family: Literal["feedforward-lm"] = "feedforward-lm"
    context: FeedForwardContext = "window"
    """window: the last context_size tokens' embeddings, concatenated (Bengio et al. 2003); average: the mean of all
    the tokens' embeddings so far (a deep averaging network, Iyyer et al. 2015)"""
    context_size: int = 8  # window: the tokens each prediction reads, the token itself and those before it (n - 1)
    embedding_dim: int = 64  # token embedding width E
    hidden_size: int = 256  # width H of each hidden layer
    activation: Literal["tanh", "relu"] = "tanh"  # the hidden layers' nonlinearity (Bengio et al.: tanh)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "context_size", "embedding_dim", "hidden_size")
        if self.context == "window" and self.context_size > self.max_seq_len:
            raise ConfigError(
                f"context_size={self.context_size} is more than max_seq_len={self.max_seq_len}, the longest text "
                f"training shows the model: the window's oldest slots would only ever see padding. Raise max_seq_len "
                f"or give context_size <= {self.max_seq_len}"
            )

    @property
    def receptive_field(self) -> int | None:
        """window: the context_size tokens a prediction reads (itself included; n - 1 of an n-gram); average: None,
        every token so far."""
        return self.context_size if self.context == "window" else None

    def weight_shapes(self) -> dict[str, tuple[int, ...]]:
        read = self.embedding_dim * (self.context_size if self.context == "window" else 1)
        return {"embedding": (self.vocab_size, self.embedding_dim), "first layer": (self.hidden_size, read),
                "output": (self.vocab_size, self.hidden_size)}

    def inert_fields(self) -> set[str]:
        return {"context_size"} if self.context == "average" else set()


def _divisors_hint(n: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, 64) + 1) if n % d == 0 and d > 1)


__all__ = [
    "ConvLMConfig", "DecoderConfig", "EncoderConfig", "EncoderDecoderConfig", "FeedForwardLMConfig", "ModelConfig",
    "RecurrentLMConfig", "RecurrentSeq2SeqConfig", "TransformerConfig", "check_types", "config_class", "family_names",
    "field_help", "model_field_names", "require_fraction", "require_positive",
]
