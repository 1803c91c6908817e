"""Edits for `hooked` and `trace`: ablate part of an activation, or patch it in from another input.

    zero_ablate(head=3)                          head 3's output set to 0 (at a point with heads: attn.z, q, k, v)
    mean_ablate(reference, position=5)           position 5 replaced by the mean over a reference batch
    resample_ablate(reference, generator=g)      each row replaced by a random row of the reference batch
    patch(source, head=3)                        head 3's output taken from another run (the same shapes)

A whole layer is ablated at its sublayer's output (`blocks.L.attn.out`, `blocks.L.mlp.out`), a head at
`blocks.L.attn.z`, a position by `position=` at any point. Zero ablation is Michel et al.'s (2019) head masking;
the mean (Wang et al. 2022) and a resampled input (Chan et al. 2022) keep the activation's typical size, so a loss
change measures what the head carries rather than the shock of a zero.
"""

from __future__ import annotations

import numbers
from typing import Literal

import torch
from torch import Tensor

from attnkit.errors import InputError
from attnkit.inspect.points import HookPoint
from attnkit.inspect.tracing import Edit

Ablation = Literal["zero", "mean", "resample"]


def part(point: HookPoint, ndim: int, *, head: int | None = None, position: int | None = None) -> tuple:
    """The index of `head` and `position` in an activation of the point (None: every one)."""
    index: list = [slice(None)] * ndim
    if head is not None:
        if point.head_axis is None:
            raise InputError(f"{point.name} has no heads; ablate a head at an attention point with heads (attn.z)")
        index[point.head_axis] = head
    if position is not None:
        index[point.position_axis] = position
    return tuple(index)


def replaced(activation: Tensor, value: Tensor, point: HookPoint, *, head: int | None = None,
             position: int | None = None) -> Tensor:
    """A copy of `activation` whose part (`part`) is `value` there (value broadcast to the activation's shape)."""
    index = part(point, activation.dim(), head=head, position=position)
    _check_index(activation, point, index)
    out = activation.clone()
    out[index] = value.to(activation.dtype).expand_as(activation)[index]
    return out


def _check_index(activation: Tensor, point: HookPoint, index: tuple) -> None:
    """A head or position indexes as Python does: 0..n-1, or -n..-1 from the end (-1: the last position)."""
    for axis, what in ((point.head_axis, "head"), (point.position_axis, "position")):
        if axis is None or not isinstance(index[axis], int):
            continue
        n = activation.shape[axis]
        if not -n <= index[axis] < n:
            raise InputError(f"{what} {index[axis]} is out of range at {point.name}: it has {n} ({what}s 0..{n - 1}, "
                             f"or -{n}..-1 from the end)")


def _check_part(head: object, position: object) -> None:
    """A head and a position are whole numbers (indices), or None for every one."""
    for name, value in (("head", head), ("position", position)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise InputError(f"{name}={value!r} must be a whole number (an index from 0), or None for every {name}")


def _check_reference(reference: object, what: str) -> None:
    if not isinstance(reference, Tensor):
        raise InputError(f"{what} is a {type(reference).__name__}; give the point's activations on other inputs, a "
                         "tensor (trace(model, ids, names=[point])[point])")


def zero_ablate(*, head: int | None = None, position: int | None = None) -> Edit:
    """Set the part to 0."""
    _check_part(head, position)

    def edit(activation: Tensor, point: HookPoint) -> Tensor:
        return replaced(activation, activation.new_zeros(()), point, head=head, position=position)

    return edit


def mean_ablate(reference: Tensor, *, head: int | None = None, position: int | None = None) -> Edit:
    """Replace the part by the mean of the point's `reference` activations over their batch and positions (the
    same point read on other inputs, any batch size and length)."""
    _check_part(head, position)
    _check_reference(reference, "mean_ablate's reference")

    def edit(activation: Tensor, point: HookPoint) -> Tensor:
        _check_like(reference, activation, point, "mean_ablate's reference", free=(0, point.position_axis))
        mean = reference.to(activation.device).mean(dim=(0, point.position_axis), keepdim=True)
        return replaced(activation, mean, point, head=head, position=position)

    return edit


def resample_ablate(reference: Tensor, *, head: int | None = None, position: int | None = None,
                    generator: torch.Generator | None = None) -> Edit:
    """Replace each row's part by that of a random row of `reference` (the point read on other inputs of the same
    length)."""
    _check_part(head, position)
    _check_reference(reference, "resample_ablate's reference")

    def edit(activation: Tensor, point: HookPoint) -> Tensor:
        _check_like(reference, activation, point, "resample_ablate's reference", free=(0,))
        rows = torch.randint(reference.shape[0], (activation.shape[0],), generator=generator)
        return replaced(activation, reference[rows].to(activation.device), point, head=head, position=position)

    return edit


def ablate(how: Ablation, reference: Tensor | None = None, *, head: int | None = None, position: int | None = None,
           generator: torch.Generator | None = None) -> Edit:
    """The ablation `how` names; mean and resample read `reference`. Raises InputError when it is missing."""
    if how == "zero":
        return zero_ablate(head=head, position=position)
    if reference is None:
        raise InputError(f"{how} ablation replaces by other inputs' activations: give reference= (the point read "
                         "on a reference batch)")
    if how == "mean":
        return mean_ablate(reference, head=head, position=position)
    if how == "resample":
        return resample_ablate(reference, head=head, position=position, generator=generator)
    raise InputError(f"unknown ablation {how!r}; use zero, mean or resample")


def patch(source: Tensor, *, head: int | None = None, position: int | None = None) -> Edit:
    """Replace the part by the same part of `source`, the point read on another input of the same shape (activation
    patching, Meng et al. 2022). A point seen one step per call (Bahdanau's decoder attention: one position per call,
    the source read over every step) takes the source's steps in the order of the calls."""
    _check_part(head, position)
    _check_reference(source, "the patch's source")
    step = 0  # the next step of a point called once per step

    def edit(activation: Tensor, point: HookPoint) -> Tensor | None:
        nonlocal step
        axis, here = point.position_axis, position
        piece = source
        if activation.shape[axis] == 1 < source.shape[axis]:  # one step of a stepwise decoder
            piece, at = source.narrow(axis, step, 1), step
            step = (step + 1) % source.shape[axis]
            if position is not None:
                if position % source.shape[axis] != at:
                    return None  # the patched position is another step's
                here = 0
        _check_like(piece, activation, point, "the patch's source", free=())
        return replaced(activation, piece.to(activation.device), point, head=head, position=here)

    return edit


def _check_like(other: Tensor, activation: Tensor, point: HookPoint, what: str, *, free: tuple[int, ...]) -> None:
    """InputError unless `other` has the activation's shape but for the axes `free` (batch, positions): read at the
    same point of the same model, and as long where positions are matched one by one."""
    axis = point.position_axis
    if other.dim() != activation.dim():
        why = f"{other.dim()} axes where the run has {activation.dim()}"
    elif axis not in free and other.shape[axis] != activation.shape[axis]:
        raise InputError(f"{what} at {point.name} has {other.shape[axis]} positions, the run {activation.shape[axis]}: "
                         "give inputs of the same length")
    else:
        differs = [a for a in range(activation.dim()) if a not in free and other.shape[a] != activation.shape[a]]
        if not differs:
            return
        names = {activation.dim() - 1: "width", 0: "batch size"}
        if point.head_axis is not None:
            names[point.head_axis] = "heads"
        name = names.get(differs[0], f"axis {differs[0]}")
        why = f"its {name} is {other.shape[differs[0]]}, the run's {activation.shape[differs[0]]}"
    raise InputError(f"{what} at {point.name} has shape {tuple(other.shape)}, the run {tuple(activation.shape)} "
                     f"({why}): read it at the same point of the same model (trace(model, ids, "
                     f"names=[{point.name!r}]))")