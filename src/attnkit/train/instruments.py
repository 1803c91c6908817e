"""Training instruments: what happens inside the model as it trains, per layer (lecture: "Gradients and Training
Instability"; Xiong et al. 2020 on post-norm's large gradients near the output without warmup).

    attention_entropy/SITE   -sum_j a_ij log a_ij, mean over sequences, heads and queries (nats): log S for
                             uniform attention over S keys, 0 for attention to a single token
    residual_norm/BLOCK      ||x||_2 of the block's output (the residual stream), mean over tokens
    grad_norm/BLOCK          ||g||_2 of the block's parameters' gradients, before clipping

Activations are measured during evaluation (the first `max_calls` forward passes, without a KV cache), gradients at
the optimizer step before it. Both are logged as one metrics.jsonl record of kind "instruments" per evaluation.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch import Tensor, nn

from attnkit.models.attention_capture import AttentionSite, recompute_attention, transformer_blocks


class Activations:
    """Means of the activation instruments over their first `max_calls` values; `summary()` gives the record's
    entries."""

    def __init__(self, max_calls: int) -> None:
        self.max_calls = max_calls
        self._sums: dict[str, float] = defaultdict(float)
        self._counts: dict[str, int] = defaultdict(int)

    def add(self, key: str, measure: Callable[[], Tensor], *, limited: bool = True) -> None:
        """Count `measure()` under `key` unless `max_calls` values are counted already (then it is not called);
        `limited=False`: always, for values their source already limits to `max_calls` passes."""
        if not limited or self._counts[key] < self.max_calls:
            self._sums[key] += float(measure())
            self._counts[key] += 1

    def summary(self) -> dict[str, float]:
        return {key: total / self._counts[key] for key, total in self._sums.items()}


def attention_entropy(weights: Tensor) -> Tensor:
    """Mean entropy (nats) of the rows of weights (B, H, T, S); 0 log 0 counts as 0."""
    weights = weights.float()
    return -torch.special.xlogy(weights, weights).sum(dim=-1).mean()


@contextmanager
def measure_activations(model: nn.Module, *, max_calls: int = 4) -> Iterator[Activations]:
    """While active, the first `max_calls` forward passes of each block and attention site are measured."""
    measured = Activations(max_calls)

    def on_weights(site: AttentionSite, weights: Tensor) -> None:  # the first max_calls passes' (each step's of them)
        measured.add(f"attention_entropy/{site.name}", lambda: attention_entropy(weights), limited=False)

    def residual_hook(name: str):
        def hook(module: nn.Module, args: tuple, output: tuple[Tensor, dict]) -> None:
            measured.add(f"residual_norm/{name}", lambda: output[0].detach().float().norm(dim=-1).mean())

        return hook

    with ExitStack() as stack:
        stack.enter_context(recompute_attention(model, on_weights, max_calls=max_calls))
        for block in transformer_blocks(model):
            stack.callback(block.module.register_forward_hook(residual_hook(block.name)).remove)
        yield measured


def gradient_norms(model: nn.Module) -> dict[str, float]:
    """`grad_norm/BLOCK` for every Transformer block with gradients (a sharded model's norms are gathered)."""
    norms = {}
    for block in transformer_blocks(model):
        grads = [p.grad for p in block.module.parameters() if p.grad is not None]
        if grads:
            norm = torch.nn.utils.get_total_norm(grads)
            norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm  # a DTensor under FSDP2
            norms[f"grad_norm/{block.name}"] = float(norm)
    return norms
