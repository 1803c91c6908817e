"""Hook points: a model's activations under stable dotted names (the names of TransformerLens's hook points).

Every point is a place on a module that exists: an input a forward pre-hook sees, an output a forward hook sees,
or the attention weights `need_weights` asks the reference path for (an `Attention`'s `pattern`, an identity
module there). Nothing else is added to the model; a point costs nothing until `attnkit.inspect.trace` attaches a
hook to it.

    name (a stack's prefix first)        shape            where
    embed                                (B, T, C)        the token table's rows, before any sqrt(C) scale
    pos_embed                            (1, T, C)        the absolute positions added to them (read only)
    blocks.L.resid_pre                   (B, T, C)        the residual stream entering block L
    blocks.L.attn.q / .k / .v            (B, T, H, D)     projections (k, v: Hkv heads), unless fused
    blocks.L.attn.scores                 (B, H, T, S)     scores before masks and biases (reference path)
    blocks.L.attn.pattern                (B, H, T, S)     softmax weights (reference path), what the values are
                                                          summed with: an edit replaces them
    blocks.L.attn.z                      (B, T, H, D)     each head's output, before o_proj mixes the heads
    blocks.L.attn.out                    (B, T, C)        the sublayer's output (o_proj's)
    blocks.L.cross_attn.*                                 the same for an encoder-decoder's cross-attention
    blocks.L.mlp.hidden                  (B, T, d_ff)     the FFN's hidden activation (down_proj's input)
    blocks.L.mlp.out                     (B, T, C)        the FFN's output
    blocks.L.resid_post                  (B, T, C)        the residual stream leaving block L
    final_norm                           (B, T, C)        the stack's final norm, when it has one

A decoder LM and an encoder have one stack and no prefix (`blocks.3.attn.pattern`); an encoder-decoder has
`encoder.` and `decoder.` ones. The recurrent seq2seq with attention has `encoder.out` (the memory, (B, S, M)),
`decoder.attn.pattern` ((B, 1, T, S), read only), `decoder.attn.out` (the contexts, (B, T, M)) and
`decoder.attn.z` (the same as its one head, (B, T, 1, M)); Bahdanau's decoder calls its attention once per step, so
those points see one step (T = 1) per call.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from torch import nn

from attnkit.blocks import TransformerBlock
from attnkit.errors import InputError
from attnkit.layers.attention import Attention
from attnkit.layers.embedding import Embeddings
from attnkit.layers.feedforward import FeedForward, SwiGLU
from attnkit.models.modes import evaluating
from attnkit.models.recurrent.attention import SourceAttention
from attnkit.models.recurrent.seq2seq import RecurrentEncoder
from attnkit.models.stack import TransformerStack

INPUT, OUTPUT, WEIGHTS, POSITIONS = "input", "output", "weights", "positions"
T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class HookPoint:
    """One named activation: which module's call shows it, and how.

    where: `input` (the first positional argument, a pre-hook), `output` (the output, or its first item),
        `weights` (the attention weights, its second item) or `positions` (the position scheme's embedding of the
        `position_ids` an `Embeddings` call receives).
    heads: the point's tensor is (B, T, H * D) on the module and is shown as (B, T, H, D) with this H.
    weights_from: the attention module asked for its weights (`need_weights`) while this point is hooked: the
        reference path, which alone forms scores and weights.
    head_axis: the axis that indexes heads (None: none); position_axis: the axis of the query positions.
    """

    name: str
    module: nn.Module
    where: str = OUTPUT
    heads: int | None = None
    weights_from: nn.Module | None = None
    head_axis: int | None = None
    position_axis: int = 1

    @property
    def editable(self) -> bool:
        """Whether an edit can replace it (the recurrent decoder's weights and absolute positions are read, not
        rebuilt)."""
        return self.where in (INPUT, OUTPUT)


def module_of(model: object) -> nn.Module:
    """The torch model `model` is or holds: a module, or a pipeline from `attnkit.load` (its `.model`). Raises
    InputError for anything else, naming what is taken."""
    if isinstance(model, nn.Module):
        return model
    if isinstance(getattr(model, "model", None), nn.Module):
        return model.model
    raise InputError(f"attnkit.inspect reads a torch model (an nn.Module) or a pipeline from attnkit.load; got a "
                     f"{type(model).__name__}")


def evaluated(analysis: Callable[..., T]) -> Callable[..., T]:
    """`analysis(model, ...)` run with the model (a module or a pipeline's) in eval mode, dropout off, and its
    modules given back in the modes they had: an analysis of a model mid-training leaves it training. Not for a
    generator function (the modes would come back before its first value): use `with evaluating(...)` inside it."""

    @functools.wraps(analysis)
    def run(model: object, *args: Any, **kwargs: Any) -> T:
        with evaluating(module_of(model)):
            return analysis(model, *args, **kwargs)

    return run


def hook_points(model: nn.Module) -> dict[str, HookPoint]:
    """Every hook point of `model` (or of a pipeline's model), by name, in the order a forward pass meets them
    (module docstring)."""
    model = module_of(model)
    points: list[HookPoint] = []
    stacks = [(name, m) for name, m in model.named_modules() if isinstance(m, TransformerStack)]
    for name, stack in stacks:
        points += _stack_points("" if len(stacks) == 1 else f"{name}.", stack)
    for name, module in model.named_modules():
        if isinstance(module, RecurrentEncoder):
            points.append(HookPoint(f"{name}.out", module))
        elif isinstance(module, SourceAttention):
            prefix = name.rpartition(".")[0] or "decoder"
            points += [HookPoint(f"{prefix}.attn.pattern", module, WEIGHTS, head_axis=1, position_axis=2),
                       HookPoint(f"{prefix}.attn.z", module, heads=1, head_axis=2),
                       HookPoint(f"{prefix}.attn.out", module)]
    return {p.name: p for p in points}


def resolve(model: nn.Module, names) -> list[HookPoint]:
    """The points `names` picks: a name, a list of names, a function of a name (True: take it), or None (all).
    Raises InputError for a name that is no string, or naming the nearest point for a name the model has not."""
    model = module_of(model)
    points = hook_points(model)
    if names is None:
        return list(points.values())
    if callable(names):
        return [p for n, p in points.items() if names(n)]
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, Iterable):
        raise InputError(f"points are picked by a name, a list of names, a function of a name or None (every point); "
                         f"got {names!r}")
    names = list(names)
    for name in names:
        if not isinstance(name, str):
            raise InputError(f"a hook point's name is a string ('blocks.0.attn.z'); got {name!r} "
                             f"({type(name).__name__}; attnkit.inspect.hook_points(model) lists the names)")
    unknown = [n for n in names if n not in points]
    if unknown:
        raise InputError(f"{type(model).__name__} has no hook point {unknown[0]!r}; its points are "
                         f"{_summary(points)} (attnkit.inspect.hook_points(model) lists them)")
    return [points[n] for n in names]


def _summary(points: dict[str, HookPoint]) -> str:
    names = list(points)
    return ", ".join(names[:12]) + (f", ... ({len(names)} in all)" if len(names) > 12 else "")


def _stack_points(prefix: str, stack: TransformerStack) -> list[HookPoint]:
    embeddings: Embeddings = stack.embeddings
    points = [HookPoint(f"{prefix}embed", embeddings.token)]
    if embeddings.positions is not None and embeddings.positions.embeds:
        points.append(HookPoint(f"{prefix}pos_embed", embeddings, POSITIONS))
    for layer, block in enumerate(stack.blocks):
        points += _block_points(f"{prefix}blocks.{layer}.", block)
    if stack.final_norm is not None:
        points.append(HookPoint(f"{prefix}final_norm", stack.final_norm))
    return points


def _block_points(prefix: str, block: TransformerBlock) -> list[HookPoint]:
    points = [HookPoint(f"{prefix}resid_pre", block, INPUT)]
    points += _attention_points(f"{prefix}attn.", block.self_attn)
    if block.cross_attn is not None:
        points += _attention_points(f"{prefix}cross_attn.", block.cross_attn)
    mlp = block.mlp
    if isinstance(mlp, FeedForward | SwiGLU):
        points.append(HookPoint(f"{prefix}mlp.hidden", mlp.down_proj, INPUT))
    points += [HookPoint(f"{prefix}mlp.out", mlp), HookPoint(f"{prefix}resid_post", block)]
    return points


def _attention_points(prefix: str, attention: Attention) -> list[HookPoint]:
    points = []
    if attention.qkv_proj is None:
        points += [HookPoint(f"{prefix}{name}", getattr(attention, f"{name}_proj"), heads=heads, head_axis=2)
                   for name, heads in (("q", attention.n_heads), ("k", attention.n_kv_heads),
                                       ("v", attention.n_kv_heads))]
    points += [
        HookPoint(f"{prefix}scores", attention.score, weights_from=attention, head_axis=1, position_axis=2),
        HookPoint(f"{prefix}pattern", attention.pattern, weights_from=attention, head_axis=1, position_axis=2),
        HookPoint(f"{prefix}z", attention.o_proj, INPUT, heads=attention.n_heads, head_axis=2),
        HookPoint(f"{prefix}out", attention),
    ]
    return points


def head_sites(model: nn.Module) -> list[str]:
    """The prefixes of the model's attention sublayers, in layer order: `blocks.0.attn`, `decoder.blocks.0.cross_attn`,
    a recurrent decoder's `decoder.attn`, ... (a point is `f"{site}.z"`)."""
    return [name.removesuffix(".z") for name in hook_points(model) if name.endswith("attn.z")]


def attends_across(site: str) -> bool:
    """Whether a site's queries attend to another sequence (cross-attention, a recurrent decoder's attention)."""
    return site.endswith("cross_attn") or ".blocks." not in f".{site}"
