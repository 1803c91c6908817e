"""`ModelConfig`: one validated, frozen description of a Transformer variant.

Every choice the lectures teach is a field here: the attention score, the position scheme, the norm and where it
sits, the feed-forward activation, the family. An invalid combination raises `ConfigError` when the config is
constructed, naming the field and the fix. Only `models/build.py` turns a config into modules.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from attnkit.errors import ConfigError

Family = Literal["encoder", "decoder", "encoder-decoder"]
Score = Literal["scaled_dot", "dot", "bilinear", "additive"]
Position = Literal["sinusoidal", "learned", "relative", "rope", "none"]
Norm = Literal["layer", "rms"]
NormPosition = Literal["pre", "post"]
Activation = Literal["relu", "gelu", "gelu_tanh", "silu", "swiglu"]
EncoderHead = Literal["classify", "mlm", "none"]
SinusoidalLayout = Literal["interleaved", "halves"]
Pooling = Literal["cls", "mean"]

_CHOICES: dict[str, Any] = {
    "family": Family,
    "score": Score,
    "position": Position,
    "norm": Norm,
    "norm_position": NormPosition,
    "activation": Activation,
    "encoder_head": EncoderHead,
    "pooling": Pooling,
    "sinusoidal_layout": SinusoidalLayout,
}


@dataclass(frozen=True)
class ModelConfig:
    """A Transformer variant. Sizes follow one vocabulary: `d_model n_heads n_kv_heads head_dim d_ff n_layers`.

    `d_ff` is the feed-forward hidden width: for `relu`/`gelu`/`gelu_tanh`/`silu` the FFN is `down(act(up(x)))`
    with `up: C -> d_ff`; for `swiglu` it is `down(silu(gate(x)) * up(x))`, with gate and up both `C -> d_ff`
    (Llama uses d_ff ~ 8/3 C so the three matrices cost what two of width 4C would).

    `encoder_head`: `classify` (one label per sequence), `mlm` (a token per position), or `none`, the bare
    encoder, whose output is its hidden states and pooled vector (sentence embeddings; Hugging Face's BertModel).

    Raises:
        ConfigError: on any invalid field or combination, naming the field and the fix.
    """

    family: Family = "decoder"
    vocab_size: int = 256
    tgt_vocab_size: int | None = None  # encoder-decoder only; None: the target shares the source vocabulary
    d_model: int = 128
    n_layers: int = 2
    n_decoder_layers: int | None = None  # encoder-decoder only; None: same as n_layers
    n_heads: int = 4
    n_kv_heads: int | None = None  # None: n_heads (multi-head); 1: multi-query; in between: grouped-query
    head_dim: int | None = None  # None: d_model // n_heads
    d_ff: int = 512
    score: Score = "scaled_dot"
    position: Position = "learned"
    norm: Norm = "layer"
    norm_position: NormPosition = "pre"
    activation: Activation = "gelu"
    max_seq_len: int = 256
    dropout: float = 0.0
    attention_dropout: float = 0.0
    bias: bool = True
    tie_embeddings: bool = True
    scale_embeddings: bool = False  # multiply token embeddings by sqrt(d_model) (Vaswani et al. 2017, 3.4)
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    relative_max_distance: int = 16  # Shaw et al. 2018: relative distances are clipped to [-k, k]
    additive_dim: int | None = None  # hidden width of the additive (Bahdanau) score MLP; None: head_dim
    final_norm: bool | None = None  # norm after the last block; None: True for pre-norm, False for post-norm
    encoder_head: EncoderHead = "classify"
    n_classes: int = 2
    pooling: Pooling = "cls"
    label_smoothing: float = 0.0
    # Options that published checkpoints need (all off by default):
    sinusoidal_layout: SinusoidalLayout = "interleaved"  # sin/cos interleaved (Vaswani) or in halves (Marian)
    type_vocab_size: int = 0  # token-type (segment) embeddings added to the input (BERT: 2); 0: none
    embedding_norm: bool = False  # a norm after the embedding sum, before the first block (BERT, BART)
    pooler: bool = False  # encoder: dense + tanh on the pooled vector before the head (BERT's pooler)
    lm_head_bias: bool = False  # a bias on the output projection (Marian's final_logits_bias)
    mlm_transform: bool = False  # masked LM: dense + activation + norm before the output projection (BERT)

    def __post_init__(self) -> None:
        for name, literal in _CHOICES.items():
            value = getattr(self, name)
            allowed = get_args(literal)
            if value not in allowed:
                raise ConfigError(f"{name}={value!r} is not a known choice; use one of {', '.join(allowed)}")
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len", "n_classes"):
            _require_positive_int(name, getattr(self, name))
        for name in ("tgt_vocab_size", "n_decoder_layers", "n_kv_heads", "head_dim", "additive_dim"):
            if getattr(self, name) is not None:
                _require_positive_int(name, getattr(self, name))
        _require_positive_int("relative_max_distance", self.relative_max_distance)
        if self.type_vocab_size != 0:
            _require_positive_int("type_vocab_size", self.type_vocab_size)  # 0 disables token-type embeddings
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"{name}={value} must lie in [0, 1); 0 disables it")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise ConfigError(f"label_smoothing={self.label_smoothing} must lie in [0, 1)")
        if self.norm_eps <= 0:
            raise ConfigError(f"norm_eps={self.norm_eps} must be positive (1e-5 or 1e-6 are usual)")
        if self.rope_theta <= 0:
            raise ConfigError(f"rope_theta={self.rope_theta} must be positive (10000 in the RoFormer paper)")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}; choose n_heads dividing "
                f"d_model (e.g. {_divisors_hint(self.d_model)}) or set head_dim explicitly"
            )
        if self.n_heads % self.kv_heads:
            raise ConfigError(
                f"n_heads={self.n_heads} is not divisible by n_kv_heads={self.kv_heads}; grouped-query attention "
                f"shares each key/value head among n_heads / n_kv_heads query heads: choose n_kv_heads dividing "
                f"{self.n_heads}"
            )
        if self.position == "rope" and self.head_size % 2:
            raise ConfigError(
                f"position='rope' needs an even head dimension, got head_dim={self.head_size}; RoPE rotates pairs "
                f"of dimensions: change d_model/n_heads or head_dim"
            )
        if self.position == "relative" and self.score not in ("scaled_dot", "dot"):
            raise ConfigError(
                f"position='relative' adds q.a_ij to dot-product scores (Shaw et al. 2018) and needs score "
                f"'scaled_dot' or 'dot', got score={self.score!r}"
            )
        if self.pooler and self.family != "encoder":
            raise ConfigError("pooler=True applies to family='encoder' only (BERT's pooler); set pooler=False")
        if self.mlm_transform and (self.family != "encoder" or self.encoder_head != "mlm"):
            raise ConfigError("mlm_transform=True applies to family='encoder' with encoder_head='mlm' only")
        if self.mlm_transform and self.activation == "swiglu":
            raise ConfigError("mlm_transform applies `activation` to one vector and needs an elementwise one "
                              "(gelu, gelu_tanh, relu, silu), not the gated swiglu")
        if self.family != "encoder-decoder":
            for name in ("tgt_vocab_size", "n_decoder_layers"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{name} applies to family='encoder-decoder' only; remove it or change family")

    # Derived sizes -------------------------------------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        """Number of key/value heads: `n_kv_heads`, or `n_heads` when unset."""
        return self.n_kv_heads if self.n_kv_heads is not None else self.n_heads

    @property
    def head_size(self) -> int:
        """Per-head dimension D: `head_dim`, or `d_model // n_heads` when unset."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def decoder_layers(self) -> int:
        return self.n_decoder_layers if self.n_decoder_layers is not None else self.n_layers

    @property
    def target_vocab_size(self) -> int:
        return self.tgt_vocab_size if self.tgt_vocab_size is not None else self.vocab_size

    @property
    def use_final_norm(self) -> bool:
        return self.final_norm if self.final_norm is not None else self.norm_position == "pre"

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
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ConfigError(f"unknown config field(s) {unknown}; known fields are {sorted(known)}")
        return cls(**data)

    @classmethod
    def from_json(cls, text_or_path: str | Path) -> ModelConfig:
        """Read a config from JSON text or from a path to a JSON file."""
        text = str(text_or_path)
        if not text.lstrip().startswith("{"):
            path = Path(text_or_path)
            if not path.is_file():
                raise ConfigError(f"config file {path} does not exist")
            text = path.read_text()
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ConfigError(f"config is not valid JSON: {err}") from None
        if not isinstance(data, dict):
            raise ConfigError("config JSON must be an object of field: value")
        return cls.from_dict(data)

    def replace(self, **changes: Any) -> ModelConfig:
        """A copy with `changes` applied, validated again."""
        return self.from_dict({**self.to_dict(), **changes})

    def with_overrides(self, assignments: list[str]) -> ModelConfig:
        """Apply `key=value` strings (the CLI's `--set`); values are parsed as JSON when they parse."""
        changes: dict[str, Any] = {}
        for assignment in assignments:
            key, sep, raw = assignment.partition("=")
            if not sep or not key:
                raise ConfigError(f"--set expects key=value, got {assignment!r}")
            try:
                changes[key.strip()] = json.loads(raw)
            except json.JSONDecodeError:
                changes[key.strip()] = raw
        return self.replace(**changes)


def _require_positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name}={value!r} must be a positive integer")


def _divisors_hint(n: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, 64) + 1) if n % d == 0 and d > 1)
