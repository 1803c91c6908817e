"""Activation patching (Meng et al. 2022, "Locating and Editing Factual Associations in GPT"; Wang et al. 2022,
"Interpretability in the Wild"): run the model on a corrupted input, put back one activation from the clean run,
and see how much of the clean answer returns.

    metric     logit(answer) - logit(wrong) at one position (the logit difference)
    restored   (patched - corrupted) / (clean - corrupted): 0 = the patch brings nothing back, 1 = all of it

`patch_stream` patches the residual stream entering each block at each position (layer x position; a recurrent
encoder's states, one row), or each attention sublayer's or FFN's output (`point`: TransformerLens's
`get_act_patch_attn_out` and `get_act_patch_mlp_out`); `patch_heads` each head's output over every position, or at
each position alone (`by_position`: layer x position x head, `get_act_patch_attn_head_out_by_pos`), or its queries,
keys, values or pattern (`point`: `get_act_patch_attn_head_all_pos_every`). Clean and
corrupted inputs have the same shapes. A sequence classifier's logits (B, C) have no positions: the difference is
read from them.

A corruption that hardly moves the logit difference (by less than `FAINT`) makes every share a ratio of two tiny
numbers; `Patching.warning` says so, and the command prints it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.inspect.edits import patch
from attnkit.inspect.inputs import Batch, check_batch, output_ids
from attnkit.inspect.points import evaluated, head_sites, hook_points, module_of
from attnkit.inspect.tracing import Trace

FAINT = 0.1  # a corruption moving logit(answer) - logit(wrong) by less (the odds by under 10%) restores little of note
StreamPoint = Literal["resid_pre", "attn.out", "mlp.out"]  # what `patch_stream` patches in each block
HeadPoint = Literal["z", "q", "k", "v", "pattern"]  # what `patch_heads` patches of each head


@dataclass(frozen=True)
class Patching:
    """`restored[i, j]`: the share of the logit difference a patch at (`rows[i]`, column j) brings back; `clean` and
    `corrupted`: the logit differences of the two runs."""

    rows: list[str]
    restored: Tensor  # (rows, columns): positions or heads; (rows, positions, heads) by position and head
    clean: float
    corrupted: float
    columns: str  # "position", "head" or "position x head"

    @property
    def warning(self) -> str | None:
        """Why the shares may mean little (a corruption that barely moves the answer), or None."""
        return faint_warning(self.clean, self.corrupted)


def faint_warning(clean: float, corrupted: float) -> str | None:
    """Why shares of `clean - corrupted` (two logit differences) may mean little: the corruption barely moves the
    answer (by less than FAINT); None where it moves it enough."""
    gap = abs(clean - corrupted)
    if gap >= FAINT:
        return None
    return (f"the corruption barely moves the answer: logit difference {clean:.4f} clean, {corrupted:.4f} corrupted, "
            f"so every share is divided by {gap:.2g}; corrupt the tokens the answer depends on")


def logit_differences(logits: Tensor, answer: int | Tensor, wrong: int | Tensor | None,
                      position: int | Tensor = -1) -> Tensor:
    """logit(answer) - logit(wrong) at `position` per row (B,) (wrong None: the answer's logit): logits (B, T, V), or a
    sequence classifier's (B, C) (no position); answer and wrong one token or class id, or one per row (B,);
    `position` one, or one per row (B,) (padded prompts of different lengths, each read at its own last token)."""
    at = (logits if logits.dim() == 2 else logits[torch.arange(len(logits)), _positions(position, logits)]).float()

    def logit(token: int | Tensor, name: str) -> Tensor:
        return at.gather(1, output_ids(token, name, *at.shape, at.device)[:, None])[:, 0]  # (B,)

    return logit(answer, "answer") if wrong is None else logit(answer, "answer") - logit(wrong, "wrong")


def _positions(position: int | Tensor, logits: Tensor) -> Tensor:
    """`position` as one position per row of logits (B, T, V): (B,) on their device. Raises InputError for a position
    that is not a whole number, one per row of another count, or out of range."""
    rows, length = logits.shape[:2]
    where = torch.as_tensor(position, device=logits.device)
    shown = position.tolist() if isinstance(position, Tensor) else position
    if where.dtype.is_floating_point or where.dtype.is_complex or where.dtype == torch.bool or where.dim() > 1 or (
            where.dim() == 1 and len(where) != rows):
        raise InputError(f"position={shown} must be one position, or one per row of the batch ({rows})")
    if not bool(((where >= -length) & (where < length)).all()):
        raise InputError(f"position {shown} is out of range: the logits have {length} positions "
                         f"(0..{length - 1}, or -{length}..-1 from the end)")
    return where.long().expand(rows)  # (B,)


def logit_difference(logits: Tensor, answer: int | Tensor, wrong: int | Tensor, position: int | Tensor = -1) -> float:
    """`logit_differences` averaged over the batch."""
    return float(logit_differences(logits, answer, wrong, position).mean())


@dataclass(frozen=True)
class _Runs:
    """The clean run's activations and both runs' logit differences; `restored` scores a patched corrupted run."""

    source: Trace  # the clean run
    clean: float
    corrupted: float
    batch: Batch  # the corrupted input
    target: tuple  # answer, wrong, position

    def restored(self, model: nn.Module, edits: dict) -> float:
        run = self.batch.run(model, edits=edits)
        return share(logit_difference(self.batch.logits(run.output), *self.target), self.clean, self.corrupted)


def check_pair(clean: Batch, corrupted: Batch) -> None:
    """Raise InputError unless the clean and corrupted inputs are Batches of the same shapes."""
    check_batch(clean, "the clean input")
    check_batch(corrupted, "the corrupted input")
    if [a.shape for a in clean.args] != [a.shape for a in corrupted.args]:
        raise InputError("the clean and corrupted inputs differ in shape; patching swaps activations position by "
                         "position, so give inputs of the same lengths (corrupt by substituting tokens)")


def _runs(model: nn.Module, clean: Batch, corrupted: Batch, names: list[str], target: tuple) -> _Runs:
    check_pair(clean, corrupted)
    model = module_of(model)  # a pipeline from attnkit.load: its model
    source = clean.run(model, names=names)
    corrupted_run = corrupted.run(model)
    return _Runs(source, logit_difference(clean.logits(source.output), *target),
                 logit_difference(corrupted.logits(corrupted_run.output), *target), corrupted, target)


def _stream_prefix(model: nn.Module, stack: str | None) -> str:
    """The stack whose stream is patched: `stack` given, else the only one, else an encoder-decoder's encoder (its
    input is where a corruption usually is)."""
    if stack is not None:
        return stack if not stack or stack.endswith(".") else f"{stack}."
    return "encoder." if "encoder.blocks.0.resid_pre" in hook_points(model) else ""


def stream_points(model: nn.Module, stack: str | None = None,
                  point: StreamPoint | Sequence[StreamPoint] = "resid_pre") -> list[str]:
    """The points of the stream entering each block of `stack` (`_stream_prefix`; a recurrent encoder's states), or
    of each block's `point` (its self-attention's or FFN's output); several points: block by block, in the order the
    block meets them."""
    wanted = (point,) if isinstance(point, str) else tuple(point)
    if not wanted or any(p not in get_args(StreamPoint) for p in wanted):
        raise InputError(f"point {point!r} is none of resid_pre, attn.out and mlp.out (what each block writes)")
    prefix = _stream_prefix(model, stack)
    points = hook_points(model)
    names = [n for n in points if n.startswith(f"{prefix}blocks.") and n.endswith(tuple(f".{p}" for p in wanted))]
    if not names and "encoder.out" in points and wanted == ("resid_pre",):  # a recurrent encoder's states
        names = ["encoder.out"]
    if not names:
        raise InputError(f"{type(model).__name__} has no {' or '.join(wanted)} {prefix!r} to patch")
    return names


@evaluated
def patch_stream(model: nn.Module, clean: Batch, corrupted: Batch, *, answer: int | Tensor, wrong: int | Tensor,
                 position: int | Tensor = -1, stack: str | None = None,
                 point: StreamPoint | Sequence[StreamPoint] = "resid_pre") -> Patching:
    """Patch the stream entering each block of `stack` (module docstring), or each block's `point` (or points: block
    by block, TransformerLens's `get_act_patch_block_every` with all three), at each position, one at a time. Rows:
    `blocks.L` (the stream), `blocks.L.attn`, `blocks.L.mlp`."""
    names = stream_points(model, stack, point)
    runs = _runs(model, clean, corrupted, names, (answer, wrong, position))
    length = runs.source[names[0]].shape[1]
    restored = torch.tensor([[runs.restored(model, {name: patch(runs.source[name], position=t)}) for t in range(length)]
                             for name in names])
    rows = [n.removesuffix(".resid_pre").removesuffix(".out") if ".blocks." in f".{n}" else n for n in names]
    return Patching(rows, restored, runs.clean, runs.corrupted, "position")


def head_points(model: nn.Module, point: HeadPoint) -> list[str]:
    """Each head site's `point` (`blocks.0.attn.q`), in layer order. Raises InputError for a point that is none of
    HeadPoint's, or that the model's attention does not show as a tensor an edit replaces (fused q/k/v, a recurrent
    decoder's read-only pattern)."""
    if point not in get_args(HeadPoint):
        raise InputError(f"point {point!r} is none of {', '.join(get_args(HeadPoint))} (what a head reads and writes)")
    points = hook_points(model)
    names = [f"{s}.{point}" for s in head_sites(model)]
    missing = [n for n in names if n not in points or not points[n].editable]
    if missing:
        raise InputError(f"{type(module_of(model)).__name__} has no {point} to patch at {missing[0]} (its projections "
                         "are fused, or it is read only): patch z, each head's output")
    return names


@evaluated
def patch_heads(model: nn.Module, clean: Batch, corrupted: Batch, *, answer: int | Tensor, wrong: int | Tensor,
                position: int | Tensor = -1, by_position: bool = False, point: HeadPoint = "z") -> Patching:
    """Patch each head's `point` from the clean run into the corrupted one: its output (`z`), its queries, keys or
    values (`q`, `k`, `v`: a GQA model's keys and values per key/value head, each shared by a group of query heads,
    as TransformerLens patches them) or its attention pattern (`pattern`, each query's row); at every position at
    once, or (`by_position`) at each (query) position alone, restored (sites, T, H) (NaN: a site with fewer heads, or
    a cross-attention site's positions beyond its own stream's). Raises InputError for a point the model's attention
    does not show (fused q/k/v, a recurrent decoder's read-only pattern)."""
    sites = head_sites(model)
    points = hook_points(model)
    names = head_points(model, point)
    runs = _runs(model, clean, corrupted, names, (answer, wrong, position))
    shapes = [(runs.source[n].shape[points[n].position_axis], runs.source[n].shape[points[n].head_axis])
              for n in names]  # (T, H) of each site
    restored = torch.full((len(sites), *map(max, zip(*shapes, strict=True))) if by_position else
                          (len(sites), max(h for _, h in shapes)), float("nan"))  # (sites, T, H) or (sites, H)
    for i, (name, (length, heads)) in enumerate(zip(names, shapes, strict=True)):
        for head in range(heads):
            for t in range(length) if by_position else [None]:
                restored[(i, t, head) if by_position else (i, head)] = runs.restored(
                    model, {name: patch(runs.source[name], head=head, position=t)})
    return Patching(sites, restored, runs.clean, runs.corrupted, "position x head" if by_position else "head")


def share(patched: float, clean: float, corrupted: float) -> float:
    """(patched - corrupted) / (clean - corrupted); InputError when the two runs agree."""
    if abs(clean - corrupted) < 1e-9:
        raise InputError("the clean and corrupted runs give the same logit difference, so nothing can be restored; "
                         "corrupt the input where it changes the answer")
    return (patched - corrupted) / (clean - corrupted)
