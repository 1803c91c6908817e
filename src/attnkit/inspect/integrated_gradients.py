"""Integrated gradients (Sundararajan et al. 2017, "Axiomatic Attribution for Deep Networks"): how much each input
token's embedding contributes to one output logit, as the gradient integrated along the straight path from a
baseline embedding (zeros by default) to the real one.

    IG_i = (x_i - x'_i) * mean over alpha in (0, 1) of d f(x' + alpha (x - x')) / d x_i
    completeness: sum over i of IG_i = f(x) - f(x')          (up to the Riemann sum's error, shrinking as steps^-2)

f is the logit of `target` (a token at `position`, or a classifier's class); the path runs over the token-embedding
points (`embed`; an encoder-decoder's `encoder.embed` and `decoder.embed`) or any editable points named. All steps
run as one batch: `steps` midpoints and the two ends, one forward and one backward pass.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.inspect.patching import logit_differences
from attnkit.inspect.points import HookPoint, evaluated, hook_points, module_of
from attnkit.inspect.tracing import hooked


@dataclass(frozen=True)
class IntegratedGradients:
    """`attributions[name]` (B, T, ...) at each point, as the point shows it; `tokens[name]` (B, T): summed over the
    embedding; `value` and `baseline_value` (B,): f at the input and at the baseline."""

    attributions: dict[str, Tensor]
    value: Tensor
    baseline_value: Tensor

    @property
    def tokens(self) -> dict[str, Tensor]:
        return {name: a.flatten(2).sum(-1) for name, a in self.attributions.items()}

    def completeness_gap(self) -> Tensor:
        """(sum of the attributions) - (f(x) - f(baseline)) per row (B,): 0 for exact integration."""
        total = sum(a.flatten(1).sum(-1) for a in self.attributions.values())
        return total - (self.value - self.baseline_value)


@evaluated
def integrated_gradients(model: nn.Module, *args: Tensor, target: int | Tensor, position: int = -1,
                         points: list[str] | None = None, baselines: dict[str, Tensor] | None = None,
                         steps: int = 32, **kwargs: Any) -> IntegratedGradients:
    """Integrated gradients of the logit of `target` (one id, or one per row (B,)) at `position` (unused for a
    sequence classifier) over `points` (default: the token embeddings), each from its baseline (default: zeros;
    broadcast to the point's activation). Raises InputError for a model without embedding points (the recurrent
    seq2seq: name `points=["encoder.out"]`) or steps < 1."""
    if steps < 1:
        raise InputError(f"steps={steps}: the path needs at least one step")
    found = hook_points(model)
    names = points or [n for n in found if n == "embed" or n.endswith(".embed")]
    if not names:
        raise InputError(f"{type(model).__name__} has no token-embedding hook point; name the points to integrate "
                         f"over, e.g. points=['encoder.out'] (attnkit.inspect.hook_points lists them)")
    unknown = [n for n in names if n not in found or not found[n].editable]
    if unknown:
        raise InputError(f"{unknown[0]} is not a point integrated gradients can move along a path; give embed, "
                         "a stream or a sublayer's output")
    model = module_of(model)  # a pipeline from attnkit.load: its model
    batch = args[0].shape[0]
    alphas = torch.cat([(torch.arange(steps) + 0.5) / steps, torch.tensor([0.0, 1.0])])  # midpoints, baseline, input
    moved: dict[str, list[tuple[Tensor, Tensor]]] = {n: [] for n in names}  # (path tensor, its difference) per call

    def along_path(activation: Tensor, point: HookPoint) -> Tensor:
        real = activation.detach()
        base = (baselines or {}).get(point.name, real.new_zeros(()))
        base = base.to(real).expand_as(real)
        scale = alphas.to(real).repeat_interleave(batch).view(-1, *[1] * (real.dim() - 1))  # (S * B, 1, ...)
        path = (base + scale * (real - base)).requires_grad_()
        moved[point.name].append((path, real - base))
        return path

    with torch.enable_grad(), hooked(model, edits={n: along_path for n in names}):
        copies = len(alphas)
        output = model(*[repeated(a, copies) for a in args], **{k: repeated(v, copies) for k, v in kwargs.items()})
        logits = output.logits if hasattr(output, "logits") else output
        values = logit_differences(logits, repeated(target, copies), None, position)  # (S * B,)
        paths = [path for calls in moved.values() for path, _ in calls]
        grads = dict(zip(map(id, paths), torch.autograd.grad(values[: steps * batch].sum(), paths), strict=True))
    attributions = {}
    for name, calls in moved.items():
        parts = [(grads[id(path)].unflatten(0, (len(alphas), batch))[:steps].mean(0) * difference[:batch])
                 for path, difference in calls]
        attributions[name] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=found[name].position_axis)
    ends = values.detach().view(len(alphas), batch)
    return IntegratedGradients(attributions, ends[-1], ends[-2])


def repeated(value: Any, copies: int) -> Any:
    """A batch tensor (B, ...) as `copies` copies one after another (copies * B, ...); anything else as it is."""
    if isinstance(value, Tensor) and value.dim() > 0:
        return value.repeat(copies, *[1] * (value.dim() - 1))
    return value
