"""Read and change a model's activations as it runs: forward hooks on its hook points, only while asked.

    with hooked(model, capture=["blocks.1.attn.pattern"], edits={"blocks.0.attn.z": zero_ablate(head=3)}) as cache:
        out = model(ids)                         # cache["blocks.1.attn.pattern"]: (B, H, T, S), once the block ends
    t = trace(model, ids, names=["blocks.0.resid_post"])      # the same in one call, without gradients

Caching and intervening are one mechanism (TransformerLens's `run_with_cache` and `run_with_hooks`): a hook that
reads, and one that returns a replacement. The hooks exist inside the context alone, so a model with nothing
attached runs as it always does, on its fast kernels, to the bit. Points that read the attention weights or the
scores ask that attention module for them (`need_weights`, the reference path, as `models/attention_capture.py`
does); the caller's own `need_weights` is kept, so its outputs look as they would have.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.inspect.points import INPUT, OUTPUT, POSITIONS, WEIGHTS, HookPoint, module_of, resolve

Edit = Callable[[Tensor, HookPoint], Tensor]  # (the activation as the point shows it, the point) -> its replacement
Names = Iterable[str] | Callable[[str], bool] | str | None


@dataclass
class Trace:
    """One run: the model's own output and the activations read, {name: tensor} (detached)."""

    output: Any
    cache: dict[str, Tensor]

    def __getitem__(self, name: str) -> Tensor:
        if name not in self.cache:
            raise InputError(f"{name!r} was not read in this trace; name it in trace(..., names=[...])")
        return self.cache[name]


def trace(model: nn.Module, *args: Any, names: Names = None, edits: Mapping[str, Edit] | None = None,
          **kwargs: Any) -> Trace:
    """Run `model(*args, **kwargs)` without gradients, reading the points `names` picks (a list, a test on a name,
    None: all) and applying `edits` ({name: edit}). `model`: a module, or a pipeline from `attnkit.load` (its
    model is run). Raises InputError for a name the model has not, or an edit that returns no like tensor."""
    model = module_of(model)
    with torch.no_grad(), hooked(model, capture=names, edits=edits) as cache:
        output = model(*args, **kwargs)
    return Trace(output, cache)


@contextmanager
def hooked(model: nn.Module, *, capture: Names = (), edits: Mapping[str, Edit] | None = None
           ) -> Iterator[dict[str, Tensor]]:
    """While active, every call of the model reads the `capture` points (None: all) into the dict it yields and
    replaces the `edits` points by what each edit returns. A point seen by several calls (Bahdanau's decoder steps,
    a model run twice, a KV-cached decoder's prompt and steps) is concatenated along its query axis when the context
    ends. Raises InputError for names and edits of the wrong kind, for an edit that returns anything but a tensor of
    the activation's shape, dtype and device, and for calls that do not join (another batch size; a cached decoder's
    pattern, whose keys grow with each step)."""
    edits = _checked_edits(edits)
    read = resolve(model, capture) if capture is None or callable(capture) or capture else []
    edited = resolve(model, list(edits))
    for point in edited:
        if point.where == POSITIONS:
            stream = point.name.replace("pos_embed", "blocks.0.resid_pre")
            raise InputError(f"{point.name} is read, not rebuilt (the embeddings add it within one call); edit "
                             f"{stream}, the tokens and positions together, instead")
        if not point.editable:  # the recurrent decoder's weights, which its attention returns beside its contexts
            prefix = point.name.rpartition(".pattern")[0]
            raise InputError(f"{point.name} is read, not rebuilt (the attention returns it beside the contexts it "
                             f"made); edit {prefix}.z or {prefix}.out, the contexts, instead")
    calls: dict[str, list[Tensor]] = defaultdict(list)
    cache: dict[str, Tensor] = {}
    hooks = _Hooks(calls, {p.name for p in read}, edits)
    with ExitStack() as stack:
        for point in {p.name: p for p in [*read, *edited]}.values():
            for handle in hooks.attach(point):
                stack.callback(handle.remove)
        for module in {id(p.weights_from): p.weights_from for p in [*read, *edited] if p.weights_from is not None
                       }.values():
            for handle in hooks.ask_weights(module, [p for p in read if p.where == WEIGHTS and
                                                     p.weights_from is module]):
                stack.callback(handle.remove)
        try:
            yield cache
        except BaseException:  # what was read before the error, as far as it joins; the error itself goes on
            _fill(cache, calls, read, strict=False)
            raise
        _fill(cache, calls, read, strict=True)


def _checked_edits(edits: object) -> dict[str, Edit]:
    if edits is None:
        return {}
    if not isinstance(edits, Mapping):
        raise InputError(f"edits= takes {{point name: edit}} (a dict); got a {type(edits).__name__}")
    for name, edit in edits.items():
        if not callable(edit):
            raise InputError(f"the edit of {name!r} is {edit!r} ({type(edit).__name__}); an edit is a function "
                             "(activation, point) -> replacement, such as zero_ablate(head=0) or patch(source)")
    return dict(edits)


def _check_replacement(point: HookPoint, shown: Tensor, new: object) -> None:
    """An edit's return is a tensor the model can go on with: the activation's shape, dtype and device."""
    if not isinstance(new, Tensor):
        raise InputError(f"the edit of {point.name} returned {type(new).__name__}; an edit returns a tensor like the "
                         "activation it is given (or None to leave it as it is)")
    if new.shape != shown.shape:
        raise InputError(f"the edit of {point.name} returned shape {tuple(new.shape)}, not the point's "
                         f"{tuple(shown.shape)}")
    if new.dtype != shown.dtype or new.device != shown.device:
        raise InputError(f"the edit of {point.name} returned {new.dtype} on {new.device}, the activation is "
                         f"{shown.dtype} on {shown.device}: return value.to(activation) (the model goes on with it)")


def _fill(cache: dict[str, Tensor], calls: dict[str, list[Tensor]], read: list[HookPoint], *, strict: bool) -> None:
    """Each read point's calls joined into `cache`; a point whose calls do not join is an InputError (`strict`) or
    left out."""
    for point in read:
        parts = calls[point.name]
        if not parts:
            continue
        try:
            cache[point.name] = parts[0] if len(parts) == 1 else torch.cat(parts, dim=point.position_axis)
        except RuntimeError:  # another batch size, or keys that grew between calls (a KV-cached decoder's steps)
            if strict:
                raise InputError(f"{point.name} was read in {len(parts)} calls of shapes "
                                 f"{', '.join(str(tuple(p.shape)) for p in parts[:4])}{', ...' * (len(parts) > 4)}, "
                                 "which do not join along its query axis: a context joins the calls of one sequence "
                                 "(Bahdanau's decoder steps); read each run, or each step of a KV-cached decoder, in "
                                 "its own trace or hooked context, or the whole sequence in one call") from None


class _Hooks:
    """The hook functions of one `hooked` context: what they read into, and the edits they apply."""

    def __init__(self, calls: dict[str, list[Tensor]], read: set[str], edits: Mapping[str, Edit]) -> None:
        self.calls, self.read, self.edits = calls, read, edits

    def visit(self, point: HookPoint, value: Tensor) -> Tensor | None:
        """The value as the point shows it, edited when the point has an edit and read after the edit; returns the
        replacement (None: unchanged)."""
        shown = value if point.heads is None else value.unflatten(-1, (point.heads, -1))  # (B, T, H*D) -> (B, T, H, D)
        edit = self.edits.get(point.name)
        new = None if edit is None else edit(shown, point)
        if new is not None:
            _check_replacement(point, shown, new)
        if point.name in self.read:  # what the model goes on with: the edited value where there is an edit
            self.calls[point.name].append((shown if new is None else new).detach())
        if new is None:
            return None
        return new if point.heads is None else new.flatten(-2)  # (B, T, H, D) -> (B, T, H*D)

    def attach(self, point: HookPoint) -> list[torch.utils.hooks.RemovableHandle]:
        if point.where == INPUT:
            def pre_hook(module: nn.Module, args: tuple) -> tuple | None:
                new = self.visit(point, args[0])
                return None if new is None else (new, *args[1:])

            return [point.module.register_forward_pre_hook(pre_hook)]
        if point.where == POSITIONS:
            def positions_hook(module: nn.Module, args: tuple) -> None:
                self.visit(point, module.positions.embed(args[1]))  # position_ids (B, T) -> (B, T, C)

            return [point.module.register_forward_pre_hook(positions_hook)]
        if point.where == OUTPUT:
            def hook(module: nn.Module, args: tuple, output: Any) -> Any:
                first = output[0] if isinstance(output, tuple) else output
                new = self.visit(point, first)
                if new is None:
                    return None
                return (new, *output[1:]) if isinstance(output, tuple) else new

            return [point.module.register_forward_hook(hook)]
        if point.weights_from is None:  # attention that returns its weights anyway (a recurrent decoder's)
            def weights_hook(module: nn.Module, args: tuple, output: tuple) -> None:
                self.visit(point, output[1])

            return [point.module.register_forward_hook(weights_hook)]
        return []  # read by `ask_weights`

    def ask_weights(self, module: nn.Module, weight_points: list[HookPoint]) -> list[torch.utils.hooks.RemovableHandle]:
        """Make `module` (an `Attention`) take its reference path, read its weights for `weight_points`, and give
        its caller what the caller asked for."""
        asked: list[bool] = []

        def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple:
            asked.append(bool(kwargs.get("need_weights", False)))
            return args, {**kwargs, "need_weights": True}

        def hook(module: nn.Module, args: tuple, kwargs: dict, output: tuple) -> tuple:
            for point in weight_points:
                self.visit(point, output[1])
            return output if asked.pop() else (output[0], None)

        return [module.register_forward_pre_hook(pre_hook, with_kwargs=True),
                module.register_forward_hook(hook, with_kwargs=True)]
