"""The fast path of attention: which kernel computes softmax(q k^T * scale + bias) v, chosen by measurement.

`layers/attention.py` holds the lecture's math and its reference path; it calls `attend` here when no weights are
asked for. The choices below were measured (`python -m benchmarks attention`); tests hold every one of them equal
to the reference path.

    attend ----> math_kernel_is_faster(q, S)?  yes: grouped_attention (float32 matrix products, GQA folded into rows)
                                               no:  F.scaled_dot_product_attention (fused; enable_gqa)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attnkit.layers.masks import as_bias, causal_mask


def attend(
    q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None, *, is_causal: bool, scale: float, dropout: float
) -> Tensor:
    """softmax(q k^T * scale + bias) v without forming the weights where the kernel can avoid it.

    q (B, H, T, D); k, v (B, Hkv, S, D) with H a multiple of Hkv; bias: an additive float bias broadcastable to
    (B, H, T, S) (masked keys -inf), or None; is_causal: a causal mask with no bias tensor (a full
    square pass, no padding). -> (B, H, T, D)
    """
    key_len = k.shape[2]
    if math_kernel_is_faster(q, key_len):
        if is_causal:  # the math kernel has no causal flag
            bias = as_bias(causal_mask(q.shape[2], key_len, device=q.device))
        return grouped_attention(q, k, v, bias, dropout, scale=scale)
    mask = None if bias is None else bias.to(q.dtype)  # SDPA takes a float mask in the queries' dtype
    grouped = k.shape[1] != q.shape[1]
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=is_causal, scale=scale, enable_gqa=grouped
    )  # (B, H, T, D)


def math_kernel_is_faster(q: Tensor, key_len: int) -> bool:
    """Whether `grouped_attention` beats PyTorch's fused SDPA kernel for these queries.

    On CPU in bf16/fp16 the fused kernel has a large fixed cost per call. Measured on a 2-core AVX-512 machine
    (`python -m benchmarks attention`, one thread), a causal training pass (forward and backward) over up to 128
    keys is 1.5-2.8x faster here and a single decoding query over up to 512 cached keys 2-2.8x; from 256 keys
    on, training passes are faster through the fused kernel. On GPUs and in fp32 the fused kernel is as fast or
    faster and keeps no (T, S) weights, so it stays the default there.
    """
    reduced = q.dtype in (torch.bfloat16, torch.float16)
    return q.device.type == "cpu" and reduced and key_len <= (512 if q.shape[2] == 1 else 128)


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
