"""The model families, each registered once: config class, builder, decoding state.

    family              config                   decoding state
    decoder             DecoderConfig            KVCache
    encoder             EncoderConfig            -
    encoder-decoder     EncoderDecoderConfig     KVCache
    recurrent-lm        RecurrentLMConfig        RecurrentState
    recurrent-seq2seq   RecurrentSeq2SeqConfig   RecurrentState
    conv-lm             ConvLMConfig             ConvState
    feedforward-lm      FeedForwardLMConfig      PrefixState

Everything that depends on the family asks here (`family_of(config)`) instead of keeping its own table of family
names: `build_model` how to build it, the pipeline whether it decodes. Which tasks a family trains for, and so
which pipeline methods its runs serve, the tasks' registrations say (`attnkit.tasks`, a layer above). A new family
is a config class (`attnkit.config`), a builder, and one `register` call below.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from attnkit.config import (
    ConvLMConfig,
    DecoderConfig,
    EncoderConfig,
    EncoderDecoderConfig,
    FeedForwardLMConfig,
    ModelConfig,
    RecurrentLMConfig,
    RecurrentSeq2SeqConfig,
    config_class,
)
from attnkit.errors import ConfigError
from attnkit.layers.kv_cache import KVCache
from attnkit.machine import free_bytes, gib
from attnkit.models.build import build_decoder, build_encoder, build_encoder_decoder
from attnkit.models.convolutional.build import build_conv_lm
from attnkit.models.convolutional.lm import ConvState
from attnkit.models.feedforward.build import build_feedforward_lm
from attnkit.models.feedforward.lm import PrefixState
from attnkit.models.recurrent.build import build_recurrent_lm, build_recurrent_seq2seq
from attnkit.models.recurrent.rnn import RecurrentState
from attnkit.presets import get as preset


@dataclass(frozen=True)
class Family:
    """One model family: how its config becomes a model, and what the model is for."""

    config: type[ModelConfig]  # its config class, which declares the family's name (`config.FAMILY`)
    build: Callable[[ModelConfig], nn.Module]  # config -> model with initialised weights
    state: type | None  # what it carries from one decoding step to the next; None: it does not decode
    example: str  # a preset of the family, for messages that suggest one
    exports: tuple[str, ...] = ()  # the ecosystems' formats that hold it ("hf", "gguf", "onnx": `interop.targets`)

    @property
    def name(self) -> str:
        return self.config.FAMILY


_FAMILIES: dict[str, Family] = {}


def register(family: Family) -> Family:
    """Add a family. Raises ConfigError when its name is taken."""
    if family.name in _FAMILIES:
        raise ConfigError(f"family {family.name!r} is registered already")
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


def as_config(config: ModelConfig | dict | str) -> ModelConfig:
    """A model config from what a caller has at hand: a config, a dict of its fields, or a preset's name."""
    if isinstance(config, str):
        return preset(config)
    if isinstance(config, dict):
        return ModelConfig(**config)
    if not isinstance(config, ModelConfig):
        raise ConfigError(f"expected a model config (ModelConfig), a dict of its fields or a preset's name, not "
                          f"{type(config).__name__}")
    return config


def build_model(config: ModelConfig | dict | str, *, force: bool = False) -> nn.Module:
    """Build the model a config (or a dict of its fields, or a preset's name) describes, with initialised weights
    (on the current default device).

    Every path from a config to a model comes here (a fresh run, --init-from, --resume, `attnkit.load`, a Hugging
    Face conversion), so here the weights' size is estimated first and a model whose weights alone exceed the
    memory free is refused with both figures (ConfigError) instead of being allocated; `force` builds it anyway. A
    size no tensor can hold is refused either way (`check_sizes`).
    """
    config = as_config(config)
    family = family_of(config)
    check_sizes(config)  # force or not: torch cannot build such a size, on any device
    device = torch.get_default_device()
    if not force and device.type != "meta":
        check_weights_fit(config, device)
    return family.build(config)


def check_weights_fit(config: ModelConfig, device: torch.device) -> None:
    """Raise ConfigError when the weights of the model `config` describes (at the default dtype) cannot fit in the
    memory free on `device` (`machine.free_bytes`)."""
    free = free_bytes(device)
    if free is None:
        return
    n_parameters = estimate_parameters(config)
    need = n_parameters * torch.empty((), dtype=torch.get_default_dtype(), device="meta").element_size()
    if need > free:
        raise ConfigError(
            f"the model its config describes ({config.family}, d_model={getattr(config, 'd_model', '?')}, "
            f"n_layers={config.n_layers}, vocab_size={config.vocab_size}) has {n_parameters:,} parameters: its weights "
            f"alone need {gib(need)} but {device.type} has {gib(free)} free. Check the config's sizes (a damaged or "
            f"foreign config.json?), or use a smaller model or a machine with more memory"
        )


_DEEP = 64  # layers past which the count is extrapolated from one and two layers (building a million meta layers
# would itself exhaust memory)


def estimate_parameters(config: ModelConfig) -> int:
    """The model's parameter count, without allocating: built on the meta device; a stack deeper than `_DEEP`
    layers is counted from one and two layers (every layer alike: params(L) = p1 + (L - 1) (p2 - p1))."""
    check_sizes(config)  # before the shallow counts, which would not see a size tied to the depth
    if config.n_layers <= _DEEP:
        return count_parameters(config)
    try:
        one, two = (count_parameters(config.replace(n_layers=n)) for n in (1, 2))
    except ConfigError:  # a field tied to the depth (a window's global_every): count it whole
        return count_parameters(config)
    return one + (config.n_layers - 1) * (two - one)


def count_parameters(model: nn.Module | ModelConfig | dict | str) -> int:
    """Number of distinct parameters (tied ones once) of a model, of a loaded run (`attnkit.load`), or of the
    model a config (a dict of its fields, a preset's name) describes (built on the meta device, without
    allocating)."""
    model = getattr(model, "model", model)  # a loaded run holds its model
    if not isinstance(model, nn.Module):
        with torch.device("meta"):
            model = build_model(model)  # its sizes checked first (`check_sizes`)
    return sum(p.numel() for p in model.parameters())


INT64_MAX = torch.iinfo(torch.int64).max  # the largest size and element count torch holds


def check_sizes(config: ModelConfig) -> None:
    """Raise ConfigError where the model `config` describes has a size no tensor can hold: a whole-number field, or
    the element count of one of its weights (`ModelConfig.weight_shapes`), beyond int64, torch's sizes. Arithmetic
    only: nothing is built."""
    sizes = {name: value for name, value in config.to_dict().items()
             if isinstance(value, int) and not isinstance(value, bool)}
    fix = "Check the config's sizes (a damaged or foreign config.json?)"
    beyond = {name: value for name, value in sizes.items() if value > INT64_MAX}
    if beyond:
        raise ConfigError(f"the model its config describes has a size no tensor can hold ({_named(beyond)}): each "
                          f"size must be at most {INT64_MAX:,} (int64). {fix}")
    for weight, shape in config.weight_shapes().items():
        if math.prod(shape) > INT64_MAX:
            largest = dict(sorted(sizes.items(), key=lambda item: item[1], reverse=True)[:2])
            raise ConfigError(f"the model its config describes has a size no tensor can hold ({_named(largest)}): its "
                              f"{weight} weight would be {' x '.join(map(str, shape))}, {math.prod(shape):,} elements, "
                              f"more than {INT64_MAX:,} (int64). {fix}")


def _named(sizes: dict[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in sizes.items())


register(Family(DecoderConfig, build_decoder, state=KVCache, example="gpt2-tiny", exports=("hf", "gguf", "onnx")))
register(Family(EncoderConfig, build_encoder, state=None, example="bert-tiny", exports=("hf", "onnx")))
register(Family(EncoderDecoderConfig, build_encoder_decoder, state=KVCache, example="vaswani-tiny",
                exports=("hf", "onnx")))
register(Family(RecurrentLMConfig, build_recurrent_lm, state=RecurrentState, example="rnn-lm-tiny"))
register(Family(RecurrentSeq2SeqConfig, build_recurrent_seq2seq, state=RecurrentState, example="gru-attn-seq2seq-tiny"))
register(Family(ConvLMConfig, build_conv_lm, state=ConvState, example="gcnn-lm-tiny"))
register(Family(FeedForwardLMConfig, build_feedforward_lm, state=PrefixState, example="bengio-lm-tiny"))
