"""Swapping a model's layers, in place, for inference-only forms: linear layers (int8 weights, transposed weights),
and dropout layers for nothing."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from torch import nn

Layer = TypeVar("Layer", bound=nn.Module)


def swap_layers(model: nn.Module, kind: type[Layer], make: Callable[[Layer], nn.Module]) -> nn.Module:
    """Replace every layer of type `kind` in `model` by `make(layer)`; returns the model, in eval mode.

    Each old layer is dropped as soon as its replacement is in place, so at most one extra weight matrix is held
    at a time (a model-wide list of modules would keep every old weight alive until the end).
    """
    parents = [m for m in model.modules() if any(isinstance(c, kind) for c in m.children())]
    for parent in parents:
        for name in [n for n, c in parent.named_children() if isinstance(c, kind)]:
            setattr(parent, name, make(getattr(parent, name)))
    return model.eval()


def remove_dropout_layers(model: nn.Module) -> nn.Module:
    """Replace every nn.Dropout of `model` by nn.Identity (in place); returns the model, in eval mode.

    In eval mode a dropout layer passes its input through, but each call still costs a module call and a dispatch,
    which shows in small models' eager decoding steps. The numbers are unchanged.
    """
    return swap_layers(model, nn.Dropout, lambda _: nn.Identity())
