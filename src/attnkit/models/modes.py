"""A model run in eval mode (dropout off) and given back in the modes its modules had: reading a model mid-training
(an analysis, an attention picture) leaves it training, with a module its owner froze in eval mode still frozen."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from torch import nn


@contextmanager
def evaluating(model: nn.Module) -> Iterator[nn.Module]:
    """`with evaluating(model):` the model in eval mode inside, each of its modules back in its own mode after (also
    on an error)."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.train(training)
