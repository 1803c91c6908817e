"""Attribution patching (Nanda 2023, "Attribution Patching: Activation Patching At Industrial Scale"; Syed et al.
2023, "Attribution Patching Outperforms Automated Circuit Discovery"): activation patching's first-order
approximation, for every activation at once from one clean forward pass and one corrupted forward and backward pass.

    patched metric - corrupted metric  ~  (a_clean - a_corrupted) . d metric / d a   (at the corrupted run)
    restored  ~  that sum over the patched part / (clean - corrupted)

The metric is `patching`'s logit difference, and each function returns a `patching.Patching` with the same rows
and columns as its activation-patching twin, so the two read side by side:

    attribute_heads       each head's output (SITE.z), or its q, k, v or pattern   ~ patching.patch_heads
                          (`point`), every position or each alone (`by_position`)
    attribute_stream      the stream entering each block, position by position  ~ patching.patch_stream
    attribute_sublayers   each attention and FFN sublayer's output, position by position

The approximation is exact for a part the metric depends on linearly and drifts where it does not: a final norm
or an attention pattern that moves between the runs (the two-layer induction model's layer-0 heads, whose small
shares it ranks in no stable order). `steps > 1` integrates the gradient instead (integrated gradients along the
straight path from the corrupted to the clean activation at each point, the rest of the model recomputed; Marks et
al. 2024, "Sparse Feature Circuits"): one forward and backward pass per point over `steps` copies of the batch,
whose shares over a whole point sum to what patching the whole point restores.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.inspect.edits import patch
from attnkit.inspect.gradients import backward_trace
from attnkit.inspect.inputs import Batch
from attnkit.inspect.integrated_gradients import repeated
from attnkit.inspect.patching import (
    HeadPoint,
    Patching,
    check_pair,
    head_points,
    logit_difference,
    logit_differences,
    share,
    stream_points,
)
from attnkit.inspect.points import HookPoint, evaluated, hook_points
from attnkit.inspect.tracing import hooked


def _effects(model: nn.Module, clean: Batch, corrupted: Batch, names: list[str], target: tuple, steps: int
             ) -> tuple[dict[str, Tensor], float, float]:
    """(a_clean - a_corrupted) * d metric / d a at each point (its shape), the gradient taken at the corrupted run or
    averaged over `steps` points between the two; and the clean and corrupted metrics."""
    check_pair(clean, corrupted)
    if steps < 1:
        raise InputError(f"steps={steps}: give 1 (attribution patching) or more (its integrated-gradients form)")
    source = clean.run(model, names=names)
    clean_value = logit_difference(clean.logits(source.output), *target)
    # the rows' sum: each row's gradient is its own logit difference's (d diff_b / d a_b), as `_integrated` takes it,
    # so that the callers' mean over rows is the mean first-order change (a mean here would divide by B twice)
    found = backward_trace(model, *corrupted.args, names=names, **corrupted.kwargs,
                           metric=lambda out: logit_differences(corrupted.logits(out), *target).sum())
    corrupted_value = found.value / clean.logits(source.output).shape[0]  # the mean over rows, as logit_difference
    if steps == 1:
        return {n: (source[n] - found.cache[n]) * found.grads[n] for n in names}, clean_value, corrupted_value
    return ({n: _integrated(model, corrupted, n, found.cache[n], source[n], target, steps) for n in names},
            clean_value, corrupted_value)


def _integrated(model: nn.Module, corrupted: Batch, name: str, start: Tensor, end: Tensor, target: tuple,
                steps: int) -> Tensor:
    """(end - start) * the gradient at `name` averaged over `steps` midpoints of the straight path from start to end
    (B, ...), the model run from that point on: one pass over `steps` copies of the batch."""
    alphas = (torch.arange(steps, dtype=start.dtype, device=start.device) + 0.5) / steps  # (steps,)
    shape = (steps, *[1] * start.dim())
    path = (start + alphas.view(shape) * (end - start)).flatten(0, 1).requires_grad_()  # (steps * B, ...)
    answer, wrong = (repeated(t, steps) for t in target[:2])
    args = [repeated(a, steps) for a in corrupted.args]
    kwargs = {k: repeated(v, steps) for k, v in corrupted.kwargs.items()}
    with torch.enable_grad(), hooked(model, edits={name: patch(path)}):
        logits = corrupted.logits(model(*args, **kwargs))
        value = logit_differences(logits, answer, wrong, target[2]).sum() / steps
    (grad,) = torch.autograd.grad(value, path)
    return (end - start) * grad.unflatten(0, (steps, -1)).sum(0)


@evaluated
def attribute_heads(model: nn.Module, clean: Batch, corrupted: Batch, *, answer: int | Tensor, wrong: int | Tensor,
                    position: int = -1, steps: int = 1, by_position: bool = False, point: HeadPoint = "z"
                    ) -> Patching:
    """Each head's estimated share restored when its `point` is patched from the clean run: its output (`z`), its
    queries, keys or values (`q`, `k`, `v`; a GQA model's keys and values per key/value head) or its pattern; over
    every position, restored (sites, H), or (`by_position`) at each (query) position alone, (sites, T, H), NaN where a
    site has fewer heads or positions: `patching.patch_heads`'s table from one backward pass. Raises InputError for a
    point the model's attention does not show (`patching.head_points`)."""
    names = head_points(model, point)
    effects, clean_value, corrupted_value = _effects(model, clean, corrupted, names, (answer, wrong, position), steps)
    points = hook_points(model)
    per_site = [_position_by_head(effects[n], points[n]) for n in names]  # (T, H) each
    per_site = per_site if by_position else [cells.sum(0) for cells in per_site]  # (H,) each
    size = [max(dims) for dims in zip(*(cells.shape for cells in per_site), strict=True)]
    restored = torch.full((len(names), *size), float("nan"))  # (sites, T, H) or (sites, H)
    for i, cells in enumerate(per_site):
        restored[(i, *(slice(0, n) for n in cells.shape))] = share(corrupted_value + cells, clean_value,
                                                                   corrupted_value)
    sites = [n.rpartition(".")[0] for n in names]
    return Patching(sites, restored, clean_value, corrupted_value, "position x head" if by_position else "head")


def _position_by_head(effect: Tensor, point: HookPoint) -> Tensor:
    """A point's per-element effects (B, ...) summed to one per (query) position and head, averaged over rows: (T, H);
    a pattern's (B, H, T, S) over its keys, a q/k/v/z's (B, T, H, D) over the head's dimensions."""
    kept = (point.position_axis, point.head_axis)
    summed = effect.sum([axis for axis in range(1, effect.dim()) if axis not in kept]).mean(0)  # (T, H) or (H, T)
    return summed if point.position_axis < point.head_axis else summed.T


def _by_position(model: nn.Module, clean: Batch, corrupted: Batch, names: list[str], rows: list[str],
                 target: tuple, steps: int) -> Patching:
    effects, clean_value, corrupted_value = _effects(model, clean, corrupted, names, target, steps)
    per_row = [effects[n].sum(-1).mean(0) for n in names]  # (B, T, C) -> (T,): a translation's two sides' T differ
    restored = torch.full((len(names), max(len(row) for row in per_row)), float("nan"))  # NaN past a row's positions
    for i, row in enumerate(per_row):
        restored[i, : len(row)] = share(corrupted_value + row, clean_value, corrupted_value)
    return Patching(rows, restored, clean_value, corrupted_value, "position")


@evaluated
def attribute_stream(model: nn.Module, clean: Batch, corrupted: Batch, *, answer: int | Tensor, wrong: int | Tensor,
                     position: int = -1, stack: str | None = None, steps: int = 1) -> Patching:
    """Each (block, position)'s estimated share restored when the stream entering the block is patched there."""
    names = stream_points(model, stack)
    return _by_position(model, clean, corrupted, names, [n.removesuffix(".resid_pre") for n in names],
                        (answer, wrong, position), steps)


@evaluated
def attribute_sublayers(model: nn.Module, clean: Batch, corrupted: Batch, *, answer: int | Tensor,
                        wrong: int | Tensor, position: int = -1, stack: str | None = None, steps: int = 1
                        ) -> Patching:
    """Each (sublayer, position)'s estimated share restored when the sublayer's output (`attn.out`, `cross_attn.out`,
    `mlp.out`, a recurrent decoder's `attn.out`) is patched there; rows are the sublayers in the order they run,
    those of one stack when `stack` names it ("encoder", "decoder"). An encoder-decoder's rows of both stacks span
    the longer side's positions, NaN past a row's own (the source's for the encoder, the target's for the decoder)."""
    prefix = "" if stack is None else f"{stack.rstrip('.')}."
    names = [n for n in hook_points(model) if n.startswith(prefix) and n.endswith(("attn.out", "mlp.out"))]
    return _by_position(model, clean, corrupted, names, [n.removesuffix(".out") for n in names],
                        (answer, wrong, position), steps)
