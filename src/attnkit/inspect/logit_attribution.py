"""Direct logit attribution (Elhage et al. 2021, "A Mathematical Framework for Transformer Circuits"; TransformerLens's
`ActivationCache.logit_attrs`): the residual stream a pre-norm stack ends with is a sum of writes, so a logit
difference splits into each writer's direct share.

    x_final = embed + sum over blocks (attn.out [+ cross_attn.out] + mlp.out)         (pre-norm: an exact sum)
    attn.out = sum over heads h of z_h W_O,h + b_O          mlp.out = sum over neurons n of hidden_n W_down,n + b_down
    logit(answer) - logit(wrong) = sum over writers p of  p . u / s  (+ the norm's and the head's biases)

where u = (W_U[answer] - W_U[wrong]) scaled by the final norm's gain (centred for a LayerNorm) and s is the final
norm's scale of x_final, frozen at its value on this input: with s fixed the norm is linear, and the shares sum to
the model's own logit difference. A share is direct only: what a head's output does through later layers is not in
it (activation or attribution patching measure that).

Where the logit is not linear in the stream once the final norm's scale is frozen, there is no such sum, and
`logit_attribution` refuses with the reason: a post-norm stack (each block renormalises the stream), a masked LM's
head transform or a classifier's pooler (a GELU or tanh between the stream and the logit), the recurrent seq2seq's
readout (tanh of [context; state]), a bare encoder (no logits).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.inspect.inputs import output_ids
from attnkit.inspect.points import evaluated, hook_points, module_of
from attnkit.inspect.tracing import trace
from attnkit.layers.norms import LayerNorm, RMSNorm
from attnkit.models.encoder import EncoderClassifier
from attnkit.models.stack import TransformerStack


@dataclass(frozen=True)
class LogitAttribution:
    """Each writer's direct share of the logit difference at one position, per row of the batch.

    names: "embed" (the stream entering the first block: tokens, and positions unless apart), "pos_embed" (asked
        with `positions=True`: absolute positions added with no norm after the sum, GPT-2's, apart, as
        TransformerLens's `decompose_resid` has them), "SITE head h" for each head of each attention sublayer,
        "SITE bias" (its o_proj bias), "blocks.L.mlp" for each FFN, and "bias" (the final norm's and the output
        layer's biases); SITE is `blocks.L.attn`, `decoder.blocks.L.cross_attn`, ... as `head_sites`.
    values: (N, B), one row per name; they sum to `total`.
    total: (B,) the model's own logit difference there.
    neurons: {"blocks.L.mlp": (B, d_ff)} each FFN neuron's share (asked with `neurons=True`); a layer's neurons and
        its down_proj bias sum to its "blocks.L.mlp" value.
    """

    names: list[str]
    values: Tensor
    total: Tensor
    neurons: dict[str, Tensor] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Tensor:
        if name not in self.names:
            raise InputError(f"no writer {name!r}; the writers are {', '.join(self.names)}")
        return self.values[self.names.index(name)]

    def heads(self) -> tuple[list[str], Tensor]:
        """The sites and a (sites, H) table of their heads' shares, averaged over the batch (NaN: no such head)."""
        found: dict[str, dict[int, float]] = {}
        for name, value in zip(self.names, self.values.mean(1), strict=True):
            site, _, head = name.partition(" head ")
            if head:
                found.setdefault(site, {})[int(head)] = float(value)
        width = max((len(h) for h in found.values()), default=0)
        table = torch.full((len(found), width), float("nan"))
        for i, heads in enumerate(found.values()):
            table[i, list(heads)] = torch.tensor(list(heads.values()))
        return list(found), table

    def rows(self) -> list[dict]:
        """One row per writer: its share, averaged over the batch."""
        return [{"writer": name, "logit difference": round(float(value), 6)}
                for name, value in zip(self.names, self.values.mean(1), strict=True)]

    def top(self, k: int = 5) -> list[tuple[str, float]]:
        """The k writers with the largest share in size (averaged over the batch): (name, share)."""
        mean = self.values.mean(1)
        return [(self.names[int(i)], float(mean[i])) for i in mean.abs().argsort(descending=True)[:k]]


@dataclass(frozen=True)
class _Readout:
    """How the final stream becomes the logits: the stack, its final norm, the output layer and how positions are
    read (one position, or a classifier's pooling over them)."""

    prefix: str
    stack: TransformerStack
    head: nn.Module
    pooling: str | None  # None: a logit per position; "cls" or "mean": a classifier's pooled sequence


def _readout(model: nn.Module) -> _Readout:
    """The stack and output layer of `model`, or InputError naming why the logit is no sum of writers."""
    name = type(model).__name__
    decoder = getattr(model, "decoder", None)
    if decoder is not None and not isinstance(decoder, TransformerStack):
        raise InputError(f"{name}'s logits read tanh(readout([context; state])) of a recurrent decoder, not a sum of "
                         "writes: direct logit attribution needs a pre-norm Transformer stack (use attribution "
                         "patching or integrated gradients for this model)")
    stack = decoder if decoder is not None else getattr(model, "stack", None)
    if not isinstance(stack, TransformerStack):
        raise InputError(f"direct logit attribution reads a Transformer stack's stream; {name} has none")
    if not all(block.pre_norm for block in stack.blocks):
        raise InputError(f"{name} is post-norm: each block renormalises the stream, so the logit is no sum of the "
                         "sublayers' writes; direct logit attribution applies to pre-norm models (norm_position=pre)")
    if getattr(model, "transform", None) is not None:
        raise InputError(f"{name}'s masked-LM head passes the stream through dense, activation and norm before the "
                         "output layer (mlm_transform), which is not linear: direct logit attribution needs "
                         "mlm_transform=false")
    if getattr(model, "pooler", None) is not None:
        raise InputError(f"{name}'s pooler (tanh of a dense layer) sits between the stream and the classifier, which "
                         "is not linear: direct logit attribution needs pooler=false")
    head = getattr(model, "lm_head", None) or getattr(model, "classifier", None)
    if not isinstance(head, nn.Linear):
        raise InputError(f"{name} has no linear output layer (lm_head or classifier) to attribute its logits to")
    pooling = model.pooling if isinstance(model, EncoderClassifier) else None  # one logit per sequence
    return _Readout("decoder." if stack is decoder else "", stack, head, pooling)


def affine(module: nn.Module, width: int, like: Tensor) -> tuple[Tensor, Tensor]:
    """An affine module's map read from its calls, so that wrapped layers (LoRA) count as they run: (width, out) and
    (out,), x -> x @ weight + bias."""
    dtype = next(module.parameters()).dtype
    with torch.no_grad():
        zero = module(like.new_zeros(1, width, dtype=dtype)).to(like)  # (1, out)
        return module(torch.eye(width, dtype=dtype, device=like.device)).to(like) - zero, zero[0]


def _frozen_norm(norm: nn.Module | None, x: Tensor) -> tuple[Tensor, Tensor, Tensor, bool]:
    """The final norm at the stream x (B, T, C), its scale frozen: (scale (B, T, 1), gain (C,), bias (C,), whether it
    centres). Raises InputError for a norm of another kind."""
    ones, zeros = x.new_ones(x.shape[-1]), x.new_zeros(x.shape[-1])
    if norm is None or isinstance(norm, nn.Identity):
        return x.new_ones(*x.shape[:-1], 1), ones, zeros, False
    if isinstance(norm, LayerNorm | nn.LayerNorm):
        scale = (x.var(-1, unbiased=False, keepdim=True) + norm.eps).sqrt()
        gain = ones if norm.weight is None else norm.weight.to(x)
        return scale, gain, zeros if norm.bias is None else norm.bias.to(x), True
    if isinstance(norm, RMSNorm | nn.RMSNorm):
        eps = norm.eps if norm.eps is not None else torch.finfo(torch.float32).eps
        scale = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
        return scale, ones if norm.weight is None else norm.weight.to(x), zeros, False
    raise InputError(f"the final norm is a {type(norm).__name__}; direct logit attribution freezes a LayerNorm's or "
                     "an RMSNorm's scale")


@torch.no_grad()
@evaluated
def logit_attribution(model: nn.Module, *args: Tensor, answer: int | Tensor, wrong: int | Tensor | None = None,
                      position: int = -1, neurons: bool = False, positions: bool = False, **kwargs: Tensor
                      ) -> LogitAttribution:
    """Split `model(*args, **kwargs)`'s logit(answer) - logit(wrong) at `position` into each writer's direct share
    (module docstring); `wrong=None`: the answer's logit alone. answer, wrong: a token or class id, or one per row
    (B,). A sequence classifier's logits come from its pooled stream, and `position` is not used. `neurons=True`
    also splits each FFN into its neurons; `positions=True` the absolute positions' share from the embeddings' where
    they are a part of the sum ("pos_embed"; a norm after the sum, or no absolute positions: none). Raises
    InputError for a model whose logit is no sum of writes (the reason named)."""
    model = module_of(model)  # a pipeline from attnkit.load: its model
    read = _readout(model)
    blocks = read.stack.blocks
    p = f"{read.prefix}blocks"
    names = [f"{p}.0.resid_pre", f"{p}.{len(blocks) - 1}.resid_post"]
    for layer, block in enumerate(blocks):
        names += [f"{p}.{layer}.attn.z", f"{p}.{layer}.mlp.out"]
        names += [f"{p}.{layer}.cross_attn.z"] if block.cross_attn is not None else []
        names += [f"{p}.{layer}.mlp.hidden"] if neurons and hasattr(block.mlp, "down_proj") else []
    embeddings = read.stack.embeddings
    apart = f"{read.prefix}pos_embed" if positions and embeddings.norm is None else None  # a norm after: no parts
    names += [apart] if apart is not None and apart in hook_points(model) else []
    traced = trace(model, *args, names=names, **kwargs)
    cache = {k: v.double() for k, v in traced.cache.items()}
    final = cache[names[1]]  # (B, T, C): the stream the final norm reads
    batch, length, width = final.shape
    scale, gain, bias, centres = _frozen_norm(read.stack.final_norm, final)
    answer_ids, wrong_ids = output_ids(answer, "answer", batch, read.head.weight.shape[0], final.device), None
    head_weight = read.head.weight.double()  # (V, C)
    direction = head_weight[answer_ids]  # (B, C)
    head_bias = read.head.bias.double()[answer_ids] if read.head.bias is not None else final.new_zeros(batch)
    if wrong is not None:
        wrong_ids = output_ids(wrong, "wrong", batch, read.head.weight.shape[0], final.device)
        direction = direction - head_weight[wrong_ids]
        if read.head.bias is not None:
            head_bias = head_bias - read.head.bias.double()[wrong_ids]
    weights = _position_weights(read.pooling, batch, length, position, kwargs.get("attention_mask"), final)  # (B, T)
    reader = weights[..., None] * gain * direction[:, None, :] / scale  # (B, T, C): d logit / d stream, frozen scale
    if centres:
        reader = reader - reader.mean(-1, keepdim=True)  # centre(x) . r = x . centre(r)

    def share(part: Tensor) -> Tensor:
        return (part * reader).sum((1, 2))  # (B, T, C) -> (B,)

    values, labels, per_neuron = [share(cache[names[0]])], ["embed"], {}
    if apart in cache:  # (1, T, C): the positions' share apart, the tokens' the rest of the stream entering
        values = [values[0] - share(cache[apart]), share(cache[apart])]
        labels.append("pos_embed")
    for layer, block in enumerate(blocks):
        sites = [("attn", block.self_attn)] + ([("cross_attn", block.cross_attn)] if block.cross_attn else [])
        for kind, attention in sites:
            z = cache[f"{p}.{layer}.{kind}.z"]  # (B, T, H, D)
            heads, head_dim = z.shape[2], z.shape[3]
            w_o, b_o = affine(attention.o_proj, heads * head_dim, z)  # (H*D, C), (C,)
            per_head = torch.einsum("bthd,hdc,btc->hb", z, w_o.view(heads, head_dim, width), reader)  # (H, B)
            values += list(per_head)
            labels += [f"{p}.{layer}.{kind} head {h}" for h in range(heads)]
            values.append((b_o * reader).sum((1, 2)))
            labels.append(f"{p}.{layer}.{kind} bias")
        mlp = f"{p}.{layer}.mlp"
        values.append(share(cache[f"{mlp}.out"]))
        labels.append(mlp)
        if f"{mlp}.hidden" in cache:
            hidden = cache[f"{mlp}.hidden"]  # (B, T, F)
            w_down, _ = affine(block.mlp.down_proj, hidden.shape[-1], hidden)  # (F, C)
            per_neuron[mlp] = torch.einsum("btf,fc,btc->bf", hidden, w_down, reader).float()
    values.append((bias * direction).sum(-1) * weights.sum(1) + head_bias)
    labels.append("bias")
    logits = traced.output.logits if hasattr(traced.output, "logits") else traced.output
    total = _difference(logits, answer_ids, wrong_ids, None if read.pooling else position)
    return LogitAttribution(labels, torch.stack(values).float(), total, per_neuron)


def _difference(logits: Tensor, answer: Tensor, wrong: Tensor | None, position: int | None) -> Tensor:
    """The model's own logit(answer) - logit(wrong) per row: logits (B, T, V) at `position`, or (B, V)."""
    at = (logits if position is None else logits[:, position]).float()  # (B, V)
    value = at.gather(1, answer[:, None])[:, 0]
    return value if wrong is None else value - at.gather(1, wrong[:, None])[:, 0]


def _position_weights(pooling: str | None, batch: int, length: int, position: int, mask: Tensor | None,
                      like: Tensor) -> Tensor:
    """How much each position's final state enters the logit: one-hot at `position`, at 0 for [CLS] pooling, or the
    mean over real tokens; (B, T)."""
    weights = like.new_zeros(batch, length)
    if pooling is None or pooling == "cls":
        index = 0 if pooling == "cls" else position
        if not -length <= index < length:
            raise InputError(f"position {position} is out of range for {length} tokens")
        weights[:, index] = 1.0
        return weights
    real = like.new_ones(batch, length) if mask is None else mask.to(like)
    return real / real.sum(1, keepdim=True)
