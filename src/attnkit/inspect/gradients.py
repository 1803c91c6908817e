"""Gradients at hook points (TransformerLens's `run_with_cache(incl_bwd=True)`): one forward pass with gradients and
one backward pass of a scalar metric, the activations and d metric / d activation read at the same named points.

    found = backward_trace(model, ids, metric=lambda out: out.logits[:, -1, 5].sum(), names=["blocks.0.attn.z"])
    found.grads["blocks.0.attn.z"]            # (B, T, H, D), shaped as the point shows its activation

The points are held through the one hook mechanism of `attnkit.inspect.tracing` (an edit that keeps the tensor the
model goes on with), so nothing is attached outside the call and the model runs as it always does. The gradients
come from `torch.autograd.grad` on those tensors: the parameters' `.grad` is left as it was. The attention pattern
(read only) is read from the attention module's own output, which the reference path gives while it is asked for.
A point seen by several calls (Bahdanau's decoder steps) gets its gradients joined in the order of the calls.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.inspect.points import WEIGHTS, HookPoint, resolve
from attnkit.inspect.tracing import Edit, Names, hooked


@dataclass
class GradientTrace:
    """One forward and backward pass: the model's output, the metric's value, and per point its activation and the
    metric's gradient with respect to it, {name: tensor} (detached, the same shapes)."""

    output: Any
    value: float
    cache: dict[str, Tensor]
    grads: dict[str, Tensor]


class _Kept:
    """The tensors the model goes on with at each point, in call order (a point may be called once per step)."""

    def __init__(self) -> None:
        self.tensors: dict[str, list[Tensor]] = defaultdict(list)

    def edit(self) -> Edit:
        def keep(activation: Tensor, point: HookPoint) -> Tensor:
            if not activation.requires_grad:  # nothing before this point needs gradients (frozen weights): start here
                activation = activation.detach().requires_grad_()
            self.tensors[point.name].append(activation)
            return activation

        return keep

    def weights_hook(self, point: HookPoint):
        def hook(module: nn.Module, args: tuple, output: tuple) -> None:
            if output[1] is not None:
                self.tensors[point.name].append(output[1])

        return hook

    def joined(self, grads: dict[int, Tensor], point: HookPoint) -> Tensor:
        parts = self.tensors[point.name]
        found = [grads[id(t)] for t in parts]
        return found[0] if len(found) == 1 else torch.cat(found, dim=point.position_axis)


def backward_trace(model: nn.Module, *args: Any, metric: Callable[[Any], Tensor], names: Names = None,
                   **kwargs: Any) -> GradientTrace:
    """Run `model(*args, **kwargs)` with gradients, reduce its output to a scalar by `metric` (output -> 0-dim tensor,
    e.g. a summed logit difference) and read, at the points `names` picks (a list, a test on a name, None: every
    point an edit or a weights read can hold), each activation and d metric / d activation. Raises InputError for a
    name the model has not, a point that cannot hold a gradient (the absolute positions) or a metric that is not a
    scalar."""
    points = resolve(model, names)
    if names is None:
        points = [p for p in points if p.editable or p.where == WEIGHTS]
    unheld = [p.name for p in points if not (p.editable or p.where == WEIGHTS)]
    if unheld:
        raise InputError(f"{unheld[0]} is added to the embeddings without a tensor of its own; read the gradient at "
                         "the stream it joins (blocks.0.resid_pre)")
    kept = _Kept()
    weights = [p for p in points if p.where == WEIGHTS]
    with ExitStack() as stack, torch.enable_grad():
        for point in weights:  # attached first: it reads the weights before `hooked` hands the caller its own output
            stack.callback(point.module.register_forward_hook(kept.weights_hook(point)).remove)
        cache = stack.enter_context(hooked(model, capture=[p.name for p in points],
                                           edits={p.name: kept.edit() for p in points if p.editable}))
        output = model(*args, **kwargs)
        value = metric(output)
    if not isinstance(value, Tensor) or value.dim() != 0:
        raise InputError("the metric must reduce the model's output to one number (a 0-dim tensor), e.g. "
                         "output.logits[:, -1, answer].sum()")
    tensors = [t for parts in kept.tensors.values() for t in parts]
    found = torch.autograd.grad(value, tensors, allow_unused=True) if tensors else ()
    grads = {id(t): (torch.zeros_like(t) if g is None else g).detach() for t, g in zip(tensors, found, strict=True)}
    missing = [p.name for p in points if not kept.tensors[p.name]]
    if missing:
        raise InputError(f"{missing[0]} was not reached with gradients in this run (a pattern the attention did not "
                         "return); read another point")
    return GradientTrace(output, float(value.detach()), cache, {p.name: kept.joined(grads, p) for p in points})
