"""The model families, each registered once: config class, builder, tasks, pipeline methods, decoding state.

    family              config                   tasks          pipeline methods        decoding state
    decoder             DecoderConfig            lm             generate, attention     KVCache
    encoder             EncoderConfig            classify, mlm  classify, attention     -
    encoder-decoder     EncoderDecoderConfig     translate      translate, attention    KVCache
    recurrent-lm        RecurrentLMConfig        lm             generate                RecurrentState
    recurrent-seq2seq   RecurrentSeq2SeqConfig   translate      translate, attention    RecurrentState

Everything that depends on the family asks here (`family_of(config)`) instead of keeping its own table of family
names: the trainer which tasks a model trains for, the pipeline which methods it serves, `build_model` how to
build it. A new family is a config class (`attnkit.config`), a builder, and one `register` call below.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from attnkit.config import (
    DecoderConfig,
    EncoderConfig,
    EncoderDecoderConfig,
    ModelConfig,
    RecurrentLMConfig,
    RecurrentSeq2SeqConfig,
    config_class,
)
from attnkit.errors import ConfigError
from attnkit.layers.kv_cache import KVCache
from attnkit.models.build import build_decoder, build_encoder, build_encoder_decoder
from attnkit.models.recurrent.build import build_recurrent_lm, build_recurrent_seq2seq
from attnkit.models.recurrent.rnn import RecurrentState

METHODS = ("generate", "translate", "classify", "attention")  # what `attnkit.load(...)` can do with a model


@dataclass(frozen=True)
class Family:
    """One model family: how its config becomes a model, and what the model is for."""

    config: type[ModelConfig]  # its config class, which declares the family's name (`config.FAMILY`)
    build: Callable[[ModelConfig], nn.Module]  # config -> model with initialised weights
    tasks: tuple[str, ...]  # the training tasks (`attnkit.train.tasks`) its models learn
    methods: tuple[str, ...]  # the pipeline methods its models serve (of METHODS)
    state: type | None  # what it carries from one decoding step to the next; None: it does not decode
    example: str  # a preset of the family, for messages that suggest one

    @property
    def name(self) -> str:
        return self.config.FAMILY


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add a family. Raises ConfigError when its name is taken or it names a method the pipeline lacks."""
    if family.name in _FAMILIES:
        raise ConfigError(f"family {family.name!r} is registered already")
    unknown = sorted(set(family.methods) - set(METHODS))
    if unknown:
        raise ConfigError(f"family {family.name!r} names unknown pipeline methods {unknown}; use {METHODS}")
    config_class(family.name)  # the config class must declare it
    _FAMILIES[family.name] = family
    return family


def family_of(config: ModelConfig | str) -> Family:
    """The registered family of a config (or of a family name). Raises ConfigError naming the known ones."""
    name = config if isinstance(config, str) else config.family
    if name not in _FAMILIES:
        raise ConfigError(f"family {name!r} is not registered; the families are {', '.join(_FAMILIES)}")
    return _FAMILIES[name]


def families() -> list[Family]:
    """Every registered family, in the order of registration."""
    return list(_FAMILIES.values())


def families_for_task(task: str) -> list[Family]:
    """The families whose models train for `task`."""
    return [f for f in _FAMILIES.values() if task in f.tasks]


def build_model(config: ModelConfig) -> nn.Module:
    """Build the model a config describes, with initialised weights (on the current default device)."""
    return family_of(config).build(config)


def count_parameters(model: nn.Module | ModelConfig | str) -> int:
    """Number of distinct parameters (tied ones once) of a model, of a loaded run (`attnkit.load`), or of the
    model a config or a preset's name describes (built on the meta device, without allocating)."""
    if isinstance(model, str):
        from attnkit.presets import get as preset

        model = preset(model)
    if isinstance(model, ModelConfig):
        with torch.device("meta"):
            model = build_model(model)
    model = getattr(model, "model", model)  # a loaded run holds its model
    if not isinstance(model, nn.Module):
        raise ConfigError(f"count_parameters takes a model, a ModelConfig, a preset's name or a loaded run, not "
                          f"{type(model).__name__}")
    return sum(p.numel() for p in model.parameters())


register(Family(DecoderConfig, build_decoder, tasks=("lm",), methods=("generate", "attention"), state=KVCache,
                example="gpt2-tiny"))
register(Family(EncoderConfig, build_encoder, tasks=("classify", "mlm"), methods=("classify", "attention"),
                state=None, example="bert-tiny"))
register(Family(EncoderDecoderConfig, build_encoder_decoder, tasks=("translate",),
                methods=("translate", "attention"), state=KVCache, example="vaswani-tiny"))
register(Family(RecurrentLMConfig, build_recurrent_lm, tasks=("lm",), methods=("generate",), state=RecurrentState,
                example="rnn-lm-tiny"))
register(Family(RecurrentSeq2SeqConfig, build_recurrent_seq2seq, tasks=("translate",),
                methods=("translate", "attention"), state=RecurrentState, example="gru-attn-seq2seq-tiny"))
