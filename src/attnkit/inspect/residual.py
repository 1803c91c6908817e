"""The residual stream and what each sublayer writes into it (Elhage et al. 2021, "A Mathematical Framework for
Transformer Circuits": every sublayer reads the stream and adds its output back to it).

    pre-norm:   x -> + attn.out -> + mlp.out -> next block        resid_post = resid_pre + attn.out + mlp.out
    post-norm:  x -> norm(x + attn.out) -> norm(. + mlp.out) ->   the sum holds before each norm

Read through `attnkit.inspect`'s hook points (`blocks.{l}.resid_pre`, `.attn.out`, `.cross_attn.out`, `.mlp.out`,
`.resid_post`); the stream between two sublayers of a block is rebuilt from those with the block's own norms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.inspect.logit_lens import unembedding
from attnkit.inspect.points import evaluated, module_of
from attnkit.inspect.tracing import trace
from attnkit.models.stack import TransformerStack


@dataclass(frozen=True)
class Write:
    """One sublayer's write: `into` is the stream it reads and adds to, `out` what it adds; both (B, T, C)."""

    block: int
    sublayer: str  # "attn", "cross_attn" or "mlp"
    into: Tensor
    out: Tensor

    def share(self) -> Tensor:
        """|out| / |into| at each position (B, T): how large the write is against the stream it joins."""
        return self.out.float().norm(dim=-1) / self.into.float().norm(dim=-1).clamp_min(1e-12)


@dataclass(frozen=True)
class ResidualStream:
    """stream (L + 1, B, T, C): after the embeddings, then after each block; writes: each sublayer's, in order."""

    stream: Tensor
    writes: list[Write]
    output: object  # the model's own output of the same pass


@torch.no_grad()
@evaluated
def residual_stream(model: nn.Module, *args: Tensor, **kwargs: Tensor) -> ResidualStream:
    """Run `model(*args, **kwargs)` once and read the stream of the stack whose stream becomes tokens (a decoder's,
    an encoder-decoder's decoder; a model without an output layer: its `stack`). Raises InputError for a model without
    a Transformer stack."""
    model = module_of(model)  # a pipeline from attnkit.load: its model
    try:
        prefix, _ = unembedding(model)
    except InputError:  # no output layer (a classifier): its stack's stream, read the same way
        prefix = ""
    stack = getattr(model, prefix.rstrip(".") or "stack", None)
    if not isinstance(stack, TransformerStack):
        raise InputError(f"the residual stream is read from a Transformer stack; {type(model).__name__} has none")
    sublayers = ("attn", "cross_attn", "mlp")
    names = [f"{prefix}blocks.0.resid_pre"]
    for layer, block in enumerate(stack.blocks):
        present = [s for s in sublayers if s != "cross_attn" or block.cross_attn is not None]
        names += [f"{prefix}blocks.{layer}.{s}.out" for s in present] + [f"{prefix}blocks.{layer}.resid_post"]
    read = trace(model, *args, names=names, **kwargs)
    writes, stream = [], [read[names[0]]]
    for layer, block in enumerate(stack.blocks):
        norms = {"attn": block.attn_norm, "cross_attn": block.cross_attn_norm, "mlp": block.mlp_norm}
        x = stream[-1]  # (B, T, C)
        for sublayer in sublayers:
            if sublayer == "cross_attn" and block.cross_attn is None:
                continue
            out = read[f"{prefix}blocks.{layer}.{sublayer}.out"]  # (B, T, C), dropout is off in eval
            writes.append(Write(layer, sublayer, x, out))
            x = x + out if block.pre_norm else norms[sublayer](x + out)
        stream.append(read[f"{prefix}blocks.{layer}.resid_post"])
    return ResidualStream(torch.stack(stream), writes, read.output)
