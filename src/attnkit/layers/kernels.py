"""The fast path of attention: which kernel computes softmax(q k^T * scale + bias) v.

`layers/attention.py` holds the lecture's math and its reference path; it calls `attend` or `flex_attend` here when
no weights are asked for. Three kernels compute the same thing (tests hold each equal to the reference path):

    attend ----> MathKernel covers (q, S)?  yes: its one-query kernel, for one unmasked decoding query where it has
                                                 one and takes the inputs; else grouped_attention (float32 matrix
                                                 products, GQA folded into rows)
                                            no:  F.scaled_dot_product_attention (fused; enable_gqa)
    flex_attend  FlexAttention (torch.nn.attention.flex_attention, compiled): every variant it can express, the
                 position bias and tanh soft-capping as a `score_mod` (ALiBi, `soft_capped`) and the mask as a
                 `block_mask` (causal, prefix, sliding window, padding, packed documents), so none of them holds a
                 (T, S) bias or weights

SDPA's fused kernels take a causal flag or a dense float bias: ALiBi, windows, padding and document masks reach them
as a materialised (T, S) bias (on a GPU, off the flash kernel). FlexAttention generates one fused kernel per
score_mod and mask_mod, and skips the blocks the mask empties. A structural block mask (causal, prefix, window:
no tensors) is built once per shape and kept (`structural_block_mask`); one that reads a batch's padding or documents
once per forward pass, shared by the layers. FlexAttention has no dropout, and on the CPU (torch 2.13) no backward:
there it serves forward passes only.

Which is faster depends on the machine, so no choice is made here: by default every call goes to SDPA, and the
inference plan (`generate/plan.py`) or the trainer hands each attention layer a `MathKernel` taken from the
machine's measured profile (`attnkit.machine`, `attnkit tune`) through `use_math_kernel`, and FlexAttention through
`use_flex_attention` where the training plan chooses it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention

from attnkit.layers.masks import AttentionMask
from attnkit.machine import AttentionKernelLimits, Profile, dtype_name


@dataclass(frozen=True)
class MathKernel:
    """Where `attend` runs `grouped_attention` instead of SDPA: queries of `dtype` on `device_type`, over up to
    `limits.decode_keys` keys for a single query and `limits.pass_keys` keys for several. `one_query`, where the
    inference plan gives one (`native_gemv.attend_one_query`), serves a single query with no mask first: (q, k, v,
    scale) -> the output (B, H, 1, D), or None where it does not take these inputs."""

    device_type: str
    dtype: torch.dtype
    limits: AttentionKernelLimits
    one_query: Callable[[Tensor, Tensor, Tensor, float], Tensor | None] | None = None

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
    grouped: bool,
    math_kernel: MathKernel | None = None,
) -> Tensor:
    """softmax(q k^T * scale + bias) v without forming the weights where the kernel can avoid it.

    q (B, H, T, D); k, v (B, Hkv, S, D) with H a multiple of Hkv; bias: an additive float bias broadcastable to
    (B, H, T, S) (masked keys -inf), or None; causal: instead of a bias, a mask that is causality alone over a
    square of queries and keys (`AttentionMask.is_causal_only`): SDPA's `is_causal`, no tensor; grouped: Hkv < H, as
    the layer knows it (a plain bool: comparing the shapes is a symbolic bool under `torch.compile(dynamic=True)`,
    which SDPA's `enable_gqa` rejects); math_kernel: where plain matrix products are used instead of SDPA.
    -> (B, H, T, D)
    """
    key_len = k.shape[2]
    if math_kernel is not None and math_kernel.covers(q, key_len):
        if math_kernel.one_query is not None and bias is None and causal is None and not dropout:
            out = math_kernel.one_query(q, k, v, scale)  # (B, H, 1, D), or None where it does not take these
            if out is not None:
                return out
        if causal is not None:  # the math kernel has no causal flag: it takes the mask's tensor form
            bias = causal.bias(key_len)
        return grouped_attention(q, k, v, bias, dropout, scale=scale)
    mask = None if bias is None else bias.to(q.dtype)  # SDPA takes a float mask in the queries' dtype
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


ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]  # (score, b, h, q_idx, kv_idx) -> score


def flex_attend(q: Tensor, k: Tensor, v: Tensor, *, mask: AttentionMask, window: int | None,
                score_mod: ScoreMod | None, scale: float, grouped: bool) -> Tensor:
    """softmax(q k^T * scale + score_mod + mask) v through FlexAttention, compiled.

    q (B, H, T, D); k, v (B, Hkv, S, D) at key positions 0 .. S - 1 (no rolling cache); mask: the forward pass's
    mask (its `mask_mod`), with `window` the layer's; score_mod: the position scheme's (`flex_score_mod`) or None;
    grouped: Hkv < H, a plain bool as `attend` takes it. -> (B, H, T, D)
    """
    key_len = k.shape[2]
    blocks = block_mask_for(mask, q.shape[0], key_len, window, q.device)
    # inside a compiled model, the model's compilation compiles the kernel; outside it, the compiled function does
    kernel = flex_attention if torch.compiler.is_compiling() else compiled_flex_attention()
    return kernel(q, k, v, score_mod=score_mod, block_mask=blocks, scale=scale,
                  enable_gqa=grouped)  # (B, H, T, D)


def soft_capped(cap: float | None, then: ScoreMod | None) -> ScoreMod | None:
    """The score_mod that soft-caps the score to cap * tanh(score / cap) (`attention.soft_cap`), then applies `then`
    (a position bias), or `then` alone without a cap."""
    if cap is None:
        return then

    def capped(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        score = cap * torch.tanh(score / cap)
        return score if then is None else then(score, b, h, q_idx, kv_idx)

    return capped


@functools.cache
def compiled_flex_attention() -> Callable[..., Tensor]:
    """flex_attention compiled once for the process (its eager form is a slow reference); each score_mod and mask_mod
    compiles its own kernel the first time it meets a shape."""
    return torch.compile(flex_attention, dynamic=False)


def block_mask_for(mask: AttentionMask, batch: int, key_len: int, window: int | None,
                   device: torch.device) -> BlockMask | None:
    """The block mask of `mask` for `key_len` keys and the layer's `window`: kept across steps when it holds no
    tensors (built once per shape), else built once for this forward pass; None where every key is allowed."""
    if mask.attention_mask is None and mask.documents is None and not isinstance(mask.prefix_len, Tensor) \
            and isinstance(mask.start, int) and not torch.compiler.is_compiling():
        return structural_block_mask(mask.length, key_len, mask.start, mask.causal, mask.prefix_len,
                                     window if window is not None and window < key_len else None, str(device))
    mask_mod = mask.mask_mod(key_len, window=window)
    if mask_mod is None:
        return None
    return mask.shared(("flex_block_mask", key_len, window),
                       lambda: create_block_mask(mask_mod, batch, None, mask.length, key_len, device=device))


@functools.lru_cache(maxsize=64)
def structural_block_mask(length: int, key_len: int, start: int, causal: bool, prefix_len: int | None,
                          window: int | None, device: str) -> BlockMask | None:
    """The block mask of causality, an int prefix and a window over (length, key_len), for every row and head: built
    once per shape and kept (64 shapes at most)."""
    mask_mod = AttentionMask(length, start=start, causal=causal, prefix_len=prefix_len).mask_mod(key_len,
                                                                                               window=window)
    return None if mask_mod is None else create_block_mask(mask_mod, None, None, length, key_len, device=device)


def use_flex_attention(model: nn.Module, on: bool) -> nn.Module:
    """Let every attention layer of `model` take FlexAttention for the variants it expresses (False: never); returns
    the model."""
    for module in model.modules():
        if hasattr(module, "flex_attention"):
            module.flex_attention = on
    return model
