"""Add & Norm's norms: LayerNorm (Ba et al. 2016) and RMSNorm (Zhang & Sennrich 2019, used by Llama).

LayerNorm centres and scales each token's features: `(x - mean) / sqrt(var + eps) * weight + bias`.
RMSNorm drops the centring and the bias: `x / sqrt(mean(x^2) + eps) * weight`. Both compute in float32 and cast
back, so bf16 activations keep their statistics exact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def layer_norm_reference(x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    """LayerNorm written out, the readable reference that `LayerNorm` is tested against."""
    x32 = x.float()
    mean = x32.mean(dim=-1, keepdim=True)
    var = x32.var(dim=-1, unbiased=False, keepdim=True)
    y = (x32 - mean) * torch.rsqrt(var + eps) * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)


class LayerNorm(nn.Module):
    """LayerNorm over the last dimension, with an optional bias. (…, C) -> (…, C)."""

    def __init__(self, dim: int, *, eps: float = 1e-5, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None

    def forward(self, x: Tensor) -> Tensor:
        # The fused kernel computes exactly layer_norm_reference (tests/test_norms.py holds them equal).
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)


class RMSNorm(nn.Module):
    """Root-mean-square norm, no centring and no bias. (…, C) -> (…, C)."""

    def __init__(self, dim: int, *, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


def make_norm(kind: str, dim: int, *, eps: float, bias: bool = True) -> nn.Module:
    """`layer` -> LayerNorm, `rms` -> RMSNorm."""
    if kind == "layer":
        return LayerNorm(dim, eps=eps, bias=bias)
    if kind == "rms":
        return RMSNorm(dim, eps=eps)
    raise ValueError(f"unknown norm {kind!r}; use 'layer' or 'rms'")
