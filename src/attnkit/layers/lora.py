r"""LoRA: a frozen linear map plus a trainable low-rank update (Hu et al. 2021, "LoRA: Low-Rank Adaptation").

```
x --> W (frozen, C_out x C_in) + b ------------------------------.
 \                                                                (+) --> h = W x + b + (alpha / r) B A x
  `-> dropout --> A (r x C_in) --> B (C_out x r) --> * alpha / r -'
```
A starts random and B at zero, so training starts from the pretrained model exactly (paper, 4.1). After training
the update folds into the weight, `W' = W + (alpha / r) B A`, and inference costs nothing extra.

The wrapper keeps the base's `weight` and `bias` under their own names, so a run's `model.safetensors` stays the
base model's tensors; the adapters (`*.lora_a`, `*.lora_b`) are saved beside it and merged when it is read
(`attnkit.checkpoint`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

LORA_A, LORA_B = "lora_a", "lora_b"


def lora_delta(lora_a: Tensor, lora_b: Tensor, scale: float) -> Tensor:
    """The update a LoRA adapter adds to its weight: `scale * B A`. (C_out, r) @ (r, C_in) -> (C_out, C_in)."""
    return (lora_b @ lora_a) * scale


class LoRALinear(nn.Module):
    """`base` (an nn.Linear, whose parameters it takes over) plus a rank-`rank` update scaled by `alpha / rank`.

    (…, C_in) -> (…, C_out). Raises ValueError for a rank below 1 or a dropout outside [0, 1).
    """

    def __init__(self, base: nn.Linear, *, rank: int, alpha: float, dropout: float = 0.0) -> None:
        super().__init__()
        if rank < 1:
            raise ValueError(f"LoRA rank must be >= 1, got {rank}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"LoRA dropout must lie in [0, 1), got {dropout}")
        self.in_features, self.out_features = base.in_features, base.out_features
        self.weight, self.bias = base.weight, base.bias
        self.rank, self.alpha, self.scale = rank, alpha, alpha / rank
        factory = dict(device=base.weight.device, dtype=base.weight.dtype)
        self.lora_a = nn.Parameter(torch.empty(rank, self.in_features, **factory))
        self.lora_b = nn.Parameter(torch.zeros(self.out_features, rank, **factory))
        nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))  # as the paper's reference code (loralib) does
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        update = F.linear(F.linear(self.dropout(x), self.lora_a), self.lora_b)  # (…, C_in) -> (…, r) -> (…, C_out)
        return F.linear(x, self.weight, self.bias) + update * self.scale

    def merged(self) -> nn.Linear:
        """A plain nn.Linear computing the same map: weight `W + scale * B A`, the same bias."""
        linear = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                           device=self.weight.device, dtype=self.weight.dtype)
        with torch.no_grad():
            linear.weight.copy_(self.weight + lora_delta(self.lora_a, self.lora_b, self.scale))
            if self.bias is not None:
                linear.bias.copy_(self.bias)
        return linear

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, rank={self.rank}, alpha={self.alpha}"


def adapter_tensors(model: nn.Module) -> dict[str, Tensor]:
    """Every LoRA adapter's A and B, as `{module}.lora_a` / `{module}.lora_b` (empty when the model has none)."""
    out: dict[str, Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoRALinear):
            out[f"{name}.{LORA_A}"], out[f"{name}.{LORA_B}"] = module.lora_a, module.lora_b
    return out


@contextmanager
def adapters_off(model: nn.Module) -> Iterator[bool]:
    """Within the block, every LoRA wrapper of `model` computes its base map alone (its update scaled by 0), as
    PEFT's `disable_adapter()`: the frozen model the adapters started from, without a second copy (DPO's reference,
    as TRL reads it). Yields whether the model has adapters; each scale comes back as it was on leaving, also on an
    error, and a block nested in another leaves the adapters off for the rest of the outer one."""
    scales = [(m, m.scale) for m in model.modules() if isinstance(m, LoRALinear)]
    try:
        for module, _ in scales:
            module.scale = 0.0
        yield bool(scales)
    finally:
        for module, scale in scales:
            module.scale = scale


def adapter_alphas(model: nn.Module) -> dict[str, float]:
    """Each adapted module's alpha, by module name (what merging needs besides A and B)."""
    return {name: module.alpha for name, module in model.named_modules() if isinstance(module, LoRALinear)}


def merge_adapter_tensors(weights: dict[str, Tensor], adapters: dict[str, Tensor], alphas: dict[str, float]):
    """`weights` (a state dict) with each adapted module's `.weight` replaced by `W + alpha / r * B A`.

    Raises KeyError naming an adapter whose base weight or alpha is absent.
    """
    merged = dict(weights)
    for module, alpha in alphas.items():
        lora_a, lora_b = adapters[f"{module}.{LORA_A}"], adapters[f"{module}.{LORA_B}"]
        weight = merged[f"{module}.weight"]
        delta = lora_delta(lora_a.to(torch.float32), lora_b.to(torch.float32), alpha / lora_a.shape[0])
        merged[f"{module}.weight"] = (weight.to(torch.float32) + delta).to(weight.dtype)
    return merged
