"""Attention weights of a model as it runs, recomputed on request (lecture: attention "provides some
interpretability": inspect the distribution to see what the decoder was focusing on).

The fast path (`F.scaled_dot_product_attention`) never forms the (T, S) weights, and nothing here asks the model to
keep them. Inside `recompute_attention`, a forward hook on each chosen attention module receives the very inputs
of that call (its queries' and keys' sources, masks, positions) and calls the module once more with
`need_weights=True`: the reference path's weights for the same queries and keys, scores, masks and position terms.
The hooks live only inside the context; training and generation never pay for them.

    model               site (module)                    kind
    decoder LM          stack.blocks[i].self_attn        causal
    encoder             stack.blocks[i].self_attn        self
    encoder-decoder     encoder.blocks[i].self_attn      self
                        decoder.blocks[i].self_attn      causal
                        decoder.blocks[i].cross_attn     cross
    recurrent seq2seq   decoder.attention                cross (one layer, one head; one call per decoding step
                                                         for Bahdanau's decoder)
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.blocks import TransformerBlock
from attnkit.models.recurrent.attention import SourceAttention

KINDS = ("self", "causal", "cross")


@dataclass(frozen=True)
class Block:
    """One Transformer block and where it sits: `stack` is the stack's attribute ("stack", "encoder", "decoder")."""

    stack: str
    layer: int
    module: TransformerBlock

    @property
    def name(self) -> str:
        return f"{self.stack}.{self.layer}"


@dataclass(frozen=True)
class AttentionSite:
    """One attention module of a model: its kind (self, causal, cross), its stack and its layer in that stack."""

    stack: str
    layer: int
    kind: str
    module: nn.Module

    @property
    def name(self) -> str:
        return f"{self.stack}.{self.kind}.{self.layer}"


def transformer_blocks(model: nn.Module) -> list[Block]:
    """Every Transformer block of `model`, stack by stack in layer order (none for recurrent models)."""
    blocks = []
    for name, module in model.named_modules():
        if isinstance(module, TransformerBlock):
            stack, _, layer = name.rpartition(".blocks.")
            blocks.append(Block(stack or "stack", int(layer), module))
    return blocks


def attention_sites(model: nn.Module) -> list[AttentionSite]:
    """Every attention module of `model` (see the module docstring), stack by stack in layer order."""
    sites = []
    for block in transformer_blocks(model):
        sites.append(AttentionSite(block.stack, block.layer, "causal" if block.module.causal else "self",
                                   block.module.self_attn))
        if block.module.cross_attn is not None:
            sites.append(AttentionSite(block.stack, block.layer, "cross", block.module.cross_attn))
    for name, module in model.named_modules():
        if isinstance(module, SourceAttention):
            sites.append(AttentionSite(name.rpartition(".")[0] or "decoder", 0, "cross", module))
    return sites


@contextmanager
def recompute_attention(
    model: nn.Module,
    on_weights: Callable[[AttentionSite, Tensor], None],
    *,
    sites: Sequence[AttentionSite] | None = None,
    max_calls: int | None = None,
) -> Iterator[None]:
    """While active, every call of a chosen site's module (within its first `max_calls` passes, when given) passes
    its weights (B, H, T, S) to `on_weights`.

    Transformer attention is called again on the same inputs with `need_weights=True` (without gradients); a call
    through a KV cache (a decoding step) is left out, since calling it again would append its keys twice. A
    recurrent decoder's attention computes its weights anyway, and they are passed on as they are; Bahdanau's
    decoder calls it once a decoding step, so its passes are counted as its decoder's calls, and every step of
    the first `max_calls` passes is passed on.
    """
    reentered = False
    calls: dict[AttentionSite, int] = defaultdict(int)

    def hook_for(site: AttentionSite):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output) -> None:
            nonlocal reentered
            if reentered:
                return
            if isinstance(module, SourceAttention):
                if max_calls is None or calls[site] <= max_calls:  # calls: its decoder's, counted as they begin
                    on_weights(site, output[1])
                return
            if (max_calls is not None and calls[site] >= max_calls) or kwargs.get("cache") is not None:
                return
            calls[site] += 1
            weights = output[1]
            if weights is None:
                reentered = True
                try:
                    with torch.no_grad():
                        weights = module(*args, **{**kwargs, "need_weights": True})[1]
                finally:
                    reentered = False
            on_weights(site, weights)

        return hook

    def count_pass(site: AttentionSite):
        def pre_hook(module: nn.Module, args: tuple) -> None:
            calls[site] += 1

        return pre_hook

    chosen = attention_sites(model) if sites is None else sites
    handles = [s.module.register_forward_hook(hook_for(s), with_kwargs=True) for s in chosen]
    owners = {id(child): module for module in model.modules() for child in module.children()}
    handles += [owners.get(id(s.module), s.module).register_forward_pre_hook(count_pass(s))
                for s in chosen if isinstance(s.module, SourceAttention)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


@contextmanager
def capture_attention(
    model: nn.Module, *, sites: Sequence[AttentionSite] | None = None
) -> Iterator[dict[AttentionSite, list[Tensor]]]:
    """Collect the weights of every call inside the context: {site: [(B, H, T, S) per call]}, detached.

    For one forward pass each Transformer site has one entry; Bahdanau's decoder has one per decoding step
    (concatenate them along the query axis, dim 2).
    """
    captured: dict[AttentionSite, list[Tensor]] = defaultdict(list)

    def keep(site: AttentionSite, weights: Tensor) -> None:
        captured[site].append(weights.detach())

    with recompute_attention(model, keep, sites=sites):
        yield captured
