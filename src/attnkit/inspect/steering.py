"""Activation addition (Turner et al. 2023, "Activation Addition: Steering Language Models Without Optimization"):
add coeff * a steering vector to the residual stream at one hook point while the model runs, generation included.

    v = contrast_vector(model, "blocks.2.resid_pre", love_ids, hate_ids)     # (T, C): "Love" minus "Hate", by position
    with steering(model, "blocks.2.resid_pre", v, coeff=5.0):
        tokens = generate_tokens(model, [prompt], max_new_tokens=20, context_len=128)

The vector is the difference of the point's activations on a contrast pair of prompts (ActAdd), a linear probe's
direction (`probe_direction`) or a sparse autoencoder feature's decoder row (`feature_direction`). A (C,) vector is
added at every position from `start` on; a (n, C) one position by position at `start` .. `start + n - 1`, the
paper's alignment of the pair with the front of the prompt:

    position       0        1       2      3   ...
    prompt         I        hate    you    because
    added       +c*v[0]  +c*v[1]     .        .        (v from a pair of 2 tokens, start 0)

Steering is an edit of `inspect.hooked`, the one mechanism that caches and intervenes: nothing is attached outside
the context. A position is the one the model gives the token (its `position_ids`, read as the stack embeds them):
each row's own tokens count from 0, a left-padded batch's padding not counted, so a prompt is steered alike alone
or batched. Under a KV cache each call sees only its new positions, so a position is steered once, when it is first
computed, and its cached keys and values carry the change on; beam search and speculative decoding (whose rejected
drafts are computed again, steered again alike) write the texts the steered model writes. When generation slides its
window past the context (`generate/decoder.py`), the kept tokens' positions restart at 0 and are steered from
`start` again. A compiled decoding step runs without the hooks: a pipeline loaded with `compile` is refused.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import Tensor, nn

from attnkit.blocks import TransformerBlock
from attnkit.errors import InputError
from attnkit.inspect.points import HookPoint, module_of, resolve
from attnkit.inspect.sae import SparseAutoencoder
from attnkit.inspect.tracing import hooked, trace
from attnkit.models.stack import TransformerStack


class Steer:
    """An edit adding `coeff * vector` from position `start` on (module docstring); `positions` (B, T) or (1, T) are
    the current call's token positions (`steering` sets them as the stack embeds them; None: 0 .. T - 1). Raises
    InputError for a vector that is not a float (C,) or (n, C), a coeff that is not finite, or a start below 0."""

    def __init__(self, vector: Tensor, *, coeff: float = 1.0, start: int = 0) -> None:
        if not isinstance(vector, Tensor) or vector.dim() not in (1, 2) or not vector.is_floating_point():
            raise InputError(f"a steering vector is a float tensor (C,) or (n, C); got {_described(vector)}")
        if not isinstance(coeff, numbers.Real) or isinstance(coeff, bool) or not torch.isfinite(torch.tensor(coeff)):
            raise InputError(f"coeff={coeff!r} must be a finite number (0 leaves the model as it is)")
        if isinstance(start, bool) or not isinstance(start, numbers.Integral) or start < 0:
            raise InputError(f"start={start!r} must be a position, a whole number from 0")
        self.vector, self.coeff, self.start = vector.detach(), float(coeff), int(start)
        self.positions: Tensor | None = None

    def __call__(self, activation: Tensor, point: HookPoint) -> Tensor:
        """activation (B, T, C) -> the same plus coeff * the vector at the steered positions."""
        width = activation.shape[-1]
        if activation.dim() != 3 or point.head_axis is not None or self.vector.shape[-1] != width:
            raise InputError(f"the steering vector is {tuple(self.vector.shape)}, {point.name} is "
                             f"{tuple(activation.shape)}: steer a (B, T, C) point with a vector of its width {width} "
                             "(read at the same point of the same model)")
        length = activation.shape[1]
        positions = (self.positions if self.positions is not None and self.positions.shape[-1] == length else
                     torch.arange(length, device=activation.device)[None])  # (B, T) or (1, T)
        relative = positions.to(activation.device) - self.start  # (B, T): where in the vector each position is
        rows = 1 if self.vector.dim() == 1 else self.vector.shape[0]
        steered = (relative >= 0) & (relative < rows) if self.vector.dim() == 2 else relative >= 0  # (B, T)
        vector = self.vector.to(activation)
        added = vector if vector.dim() == 1 else vector[relative.clamp(0, rows - 1)]  # (C,) or (B, T, C)
        return activation + self.coeff * (added * steered[..., None])  # (B, T, C)


@contextmanager
def steering(model: nn.Module, point: str, vector: Tensor, *, coeff: float = 1.0, start: int = 0
             ) -> Iterator[Steer]:
    """While active, every call of `model` (a module or a pipeline's) adds `coeff * vector` at `point` (a
    `blocks.L.*` point of shape (B, T, C): `blocks.L.resid_pre`, `.resid_post`, `.attn.out`, `.mlp.out`) from
    position `start` on, KV-cached decoding included (module docstring). Yields the edit. Raises InputError for a
    point the model has not or one outside a block, blocks run outside a TransformerStack, a vector, coeff or start
    `Steer` refuses, or a pipeline loaded with `compile`; and, at the model's first call, a vector of another width
    than the point's."""
    compiled = getattr(getattr(model, "plan", None), "compile", False)
    if compiled:
        raise InputError(f"this pipeline was loaded with compile={compiled!r}: its compiled blocks or decoding step "
                         "run without the steering hooks; load it without compile (attnkit.load(run)) to steer it")
    model = module_of(model)
    (found,) = resolve(model, point)
    embeddings = _embeddings_of(model, _block_of(model, found))
    edit = Steer(vector, coeff=coeff, start=start)

    def locate(module: nn.Module, args: tuple) -> None:  # the call's token positions, (B, T) or (1, T)
        edit.positions = args[1]  # TransformerStack calls embeddings(input_ids, position_ids, token_type_ids)

    with ExitStack() as stack:
        stack.callback(embeddings.register_forward_pre_hook(locate).remove)
        stack.enter_context(hooked(model, edits={point: edit}))
        yield edit


def _block_of(model: nn.Module, point: HookPoint) -> TransformerBlock:
    for block in model.modules():
        if isinstance(block, TransformerBlock) and any(m is point.module for m in block.modules()):
            return block
    raise InputError(f"{point.name} is not inside a block; steer the residual stream at a block's point "
                     "(blocks.0.resid_pre for the embeddings)")


def _embeddings_of(model: nn.Module, block: TransformerBlock) -> nn.Module:
    """The embeddings of the stack that runs `block`: they are given each call's position_ids (B, T)."""
    for stack in model.modules():
        if isinstance(stack, TransformerStack) and any(b is block for b in stack.blocks):
            return stack.embeddings
    raise InputError(f"{type(model).__name__} runs its blocks outside a transformer stack, which gives no token "
                     "positions to steer by; steer a model built by attnkit.models")


def contrast_vector(model: nn.Module, point: str, positive: Tensor, negative: Tensor, *, aligned: bool = True
                    ) -> Tensor:
    """The point's activation on `positive` minus that on `negative` (token ids (T,) or (1, T)): (T, C), position by
    position, as ActAdd adds it (`aligned`), or (C,), each prompt's mean over its positions, added everywhere.
    Raises InputError for an empty prompt, or aligned prompts of different lengths (naming the fix)."""
    positive, negative = _one_row(positive, "positive"), _one_row(negative, "negative")
    if aligned and positive.shape[1] != negative.shape[1]:
        raise InputError(f"the contrast pair is {positive.shape[1]} and {negative.shape[1]} tokens: an aligned vector "
                         "subtracts position by position, so pad the shorter prompt (Turner et al. pad with spaces) "
                         "to the same length, or take each prompt's mean (aligned=False: a (C,) vector)")
    found = [trace(model, ids, names=[point])[point][0] for ids in (positive, negative)]  # (T, C) each
    if found[0].dim() != 2:
        raise InputError(f"{point} is {tuple(found[0].shape[1:])} a position; steer a (B, T, C) point such as "
                         "blocks.0.resid_pre")
    if aligned:
        return found[0] - found[1]  # (T, C)
    return found[0].mean(0) - found[1].mean(0)  # (C,)


def _one_row(ids: Tensor, name: str) -> Tensor:
    if not isinstance(ids, Tensor) or ids.dtype != torch.long or ids.dim() not in (1, 2) or (
            ids.dim() == 2 and ids.shape[0] != 1):
        raise InputError(f"the {name} prompt is token ids, a long tensor (T,) or (1, T); got {_described(ids)}")
    if ids.numel() == 0:
        raise InputError(f"the {name} prompt has no tokens; give at least one")
    return ids.reshape(1, -1)  # (1, T)


def probe_direction(probe: nn.Linear | Tensor, *, toward: int = 0, against: int | None = None) -> Tensor:
    """A linear probe's unit direction (C,) toward class `toward` (against class `against`: the difference of their
    rows), from its weight (K, C) or the nn.Linear itself; a probe on standardised features is given its weight
    divided by their standard deviation. Raises InputError for a class it has not."""
    weight = probe.weight if isinstance(probe, nn.Linear) else probe
    if not isinstance(weight, Tensor) or weight.dim() != 2:
        raise InputError(f"a probe is an nn.Linear or its weight (K, C); got {_described(weight)}")
    for name, row in (("toward", toward), ("against", against)):
        if row is not None and not 0 <= row < weight.shape[0]:
            raise InputError(f"{name}={row} is no class of the probe: it has {weight.shape[0]} "
                             f"(0..{weight.shape[0] - 1})")
    direction = weight[toward] - (0 if against is None else weight[against])  # (C,)
    norm = direction.norm()
    if norm == 0:
        raise InputError("the probe's direction is zero (the two classes' rows are equal); choose other classes")
    return (direction / norm).detach()


def feature_direction(sae: SparseAutoencoder, feature: int) -> Tensor:
    """A sparse autoencoder feature's decoder row (C,): the direction it writes (unit norm; `inspect/sae.py`)."""
    features = sae.W_dec.shape[0]
    if isinstance(feature, bool) or not isinstance(feature, numbers.Integral) or not 0 <= feature < features:
        raise InputError(f"feature {feature!r} is not one of the SAE's {features} (0..{features - 1})")
    return sae.W_dec[feature].detach().clone()


def _described(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    return f"a {type(value).__name__}"
