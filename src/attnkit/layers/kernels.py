"""The fast path of attention: which kernel computes softmax(q k^T * scale + bias) v.

`layers/attention.py` holds the lecture's math and its reference path; it calls `attend` here when no weights are
asked for. Two kernels compute the same thing (tests hold both equal to the reference path):

    attend ----> MathKernel covers (q, S)?  yes: grouped_attention (float32 matrix products, GQA folded into rows)
                                            no:  F.scaled_dot_product_attention (fused; enable_gqa)

Which is faster depends on the machine, so no choice is made here: by default every call goes to SDPA, and the
inference plan (`generate/plan.py`) or the trainer hands each attention layer a `MathKernel` taken from the
machine's measured profile (`attnkit.machine`, `attnkit tune`) through `use_math_kernel`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.layers.masks import AttentionMask
from attnkit.machine import AttentionKernelLimits, Profile, dtype_name


@dataclass(frozen=True)
class MathKernel:
    """Where `attend` runs `grouped_attention` instead of SDPA: queries of `dtype` on `device_type`, over up to
    `limits.decode_keys` keys for a single query and `limits.pass_keys` keys for several."""

    device_type: str
    dtype: torch.dtype
    limits: AttentionKernelLimits

    @classmethod
    def from_profile(cls, device_type: str, dtype: torch.dtype, profile: Profile) -> MathKernel | None:
        """The choice `profile` records for attention of `dtype` on the CPU; None (SDPA) elsewhere or where the
        profile lists none."""
        limits = profile.attention.get(dtype_name(dtype)) if device_type == "cpu" else None
        if limits is None or (limits.decode_keys <= 0 and limits.pass_keys <= 0):
            return None
        return cls(device_type, dtype, limits)

    def covers(self, q: Tensor, key_len: int) -> bool:
        limit = self.limits.decode_keys if q.shape[2] == 1 else self.limits.pass_keys
        return q.device.type == self.device_type and q.dtype == self.dtype and key_len <= limit


def attend(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    bias: Tensor | None,
    *,
    causal: AttentionMask | None = None,
    scale: float,
    dropout: float,
    math_kernel: MathKernel | None = None,
) -> Tensor:
    """softmax(q k^T * scale + bias) v without forming the weights where the kernel can avoid it.

    q (B, H, T, D); k, v (B, Hkv, S, D) with H a multiple of Hkv; bias: an additive float bias broadcastable to
    (B, H, T, S) (masked keys -inf), or None; causal: instead of a bias, a mask that is causality alone over a
    square of queries and keys (`AttentionMask.is_causal_only`): SDPA's `is_causal`, no tensor; math_kernel: where
    plain matrix products are used instead of SDPA. -> (B, H, T, D)
    """
    key_len = k.shape[2]
    if math_kernel is not None and math_kernel.covers(q, key_len):
        if causal is not None:  # the math kernel has no causal flag: it takes the mask's tensor form
            bias = causal.bias(key_len)
        return grouped_attention(q, k, v, bias, dropout, scale=scale)
    mask = None if bias is None else bias.to(q.dtype)  # SDPA takes a float mask in the queries' dtype
    grouped = k.shape[1] != q.shape[1]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal is not None, scale=scale, enable_gqa=grouped
    )  # (B, H, T, D)


def use_math_kernel(model: nn.Module, math_kernel: MathKernel | None) -> nn.Module:
    """Hand every attention layer of `model` the kernel choice (None: SDPA always); returns the model."""
    for module in model.modules():
        if hasattr(module, "math_kernel"):
            module.math_kernel = math_kernel
    return model


def grouped_attention(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, dropout: float = 0.0, *, scale: float | None = None
) -> Tensor:
    """Dot-product attention as plain matrix products, with grouped queries folded into rows.

    q (B, H, T, D) with H = G * Hkv; k, v (B, Hkv, S, D); bias: additive, broadcastable to (B, H, T, S), -inf at
    masked keys; scale: 1/sqrt(D) unless given. The G query heads sharing a key/value head become G * T rows
    against that head, so keys and values are never copied per query head (the reference path's
    `repeat_interleave`). It computes in float32, as fused kernels do inside, so bf16 inputs lose no precision to
    rounded scores or weights. -> (B, H, T, D) in q's dtype
    """
    batch, n_heads, length, head_dim = q.shape
    n_kv_heads, key_len = k.shape[1], k.shape[2]
    group = n_heads // n_kv_heads
    rows = q.float().reshape(batch, n_kv_heads, group * length, head_dim)  # (B, Hkv, G*T, D)
    scale = head_dim**-0.5 if scale is None else scale
    scores = torch.matmul(rows, k.float().transpose(-2, -1)) * scale  # (B, Hkv, G*T, S)
    if bias is not None:
        bias = bias.float()
        while bias.dim() < 4:
            bias = bias.unsqueeze(0)
        if bias.shape[1] == 1:  # one bias for all heads: (B, 1, T, S) -> (B, 1, G*T, S), rows in q's order
            bias = bias.expand(batch, 1, length, key_len)
            bias = bias.repeat(1, 1, group, 1) if group > 1 else bias
        else:  # a bias per query head: (B, H, T, S) -> (B, Hkv, G*T, S)
            bias = bias.expand(batch, n_heads, length, key_len).reshape(batch, n_kv_heads, group * length, key_len)
        scores = scores + bias
    weights = torch.softmax(scores, dim=-1)
    if dropout > 0:
        weights = F.dropout(weights, p=dropout)
    out = torch.matmul(weights, v.float())  # (B, Hkv, G*T, S) @ (B, Hkv, S, D) -> (B, Hkv, G*T, D)
    return out.view(batch, n_heads, length, head_dim).to(q.dtype)
