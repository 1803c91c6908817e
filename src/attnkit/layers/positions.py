"""Position information: the Transformer's attention is order-blind without it.

- absolute, added to the token embedding: `SinusoidalPositions` (Vaswani et al. 2017, 3.5), `LearnedPositions`
  (GPT-2, BERT);
- relative, inside the attention score: `RelativePositions` (Shaw et al. 2018);
- rotary, rotating queries and keys: `RotaryEmbedding` (Su et al. 2021, RoFormer; Llama).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn


class SinusoidalPositions(nn.Module):
    """PE(pos, 2i) = sin(pos / 10000^(2i/C)), PE(pos, 2i+1) = cos(...). No parameters; any length.

    The same C/2 frequencies can be laid out two ways:

        interleaved (Vaswani et al. 2017)    sin f0, cos f0, sin f1, cos f1, ...
        halves (Marian)                      sin f0, sin f1, ..., cos f0, cos f1, ...

    position_ids (B, T) -> (B, T, C).
    """

    def __init__(self, d_model: int, *, base: float = 10000.0, layout: str = "interleaved") -> None:
        super().__init__()
        if d_model % 2:
            raise ValueError(f"sinusoidal positions need an even d_model, got {d_model}")
        if layout not in ("interleaved", "halves"):
            raise ValueError(f"unknown sinusoidal layout {layout!r}; use 'interleaved' or 'halves'")
        inv_freq = torch.exp(-math.log(base) * torch.arange(0, d_model, 2, dtype=torch.float32) / d_model)
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (C/2,)
        self.layout = layout

    def forward(self, position_ids: Tensor) -> Tensor:
        angles = position_ids.float().unsqueeze(-1) * self.inv_freq  # (B, T, C/2)
        if self.layout == "halves":
            return torch.cat((angles.sin(), angles.cos()), dim=-1)  # (B, T, C)
        return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (B, T, C/2, 2) -> (B, T, C)


class LearnedPositions(nn.Module):
    """A learned vector per position, up to `max_seq_len`. position_ids (B, T) -> (B, T, C)."""

    def __init__(self, max_seq_len: int, d_model: int) -> None:
        super().__init__()
        self.max_seq_len = max_seq_len
        self.weight = nn.Parameter(torch.zeros(max_seq_len, d_model))

    def forward(self, position_ids: Tensor) -> Tensor:
        return self.weight[position_ids]


class RotaryEmbedding(nn.Module):
    """RoPE: rotate each pair of query/key dimensions by an angle proportional to the position.

    Rotating q at position m and k at position n makes q_m . k_n depend only on m - n, and leaves norms unchanged.
    Pairs are (i, i + D/2), the layout of Hugging Face's Llama checkpoints ("rotate half").
    """

    def __init__(self, head_dim: int, *, theta: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {head_dim}")
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # (D/2,)

    def forward(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        """position_ids (B, T) or (T,) -> cos, sin, each (B, 1, T, D) or (1, 1, T, D), float32."""
        angles = position_ids.float().unsqueeze(-1) * self.inv_freq  # (B, T, D/2)
        angles = torch.cat((angles, angles), dim=-1)  # (B, T, D)
        if angles.dim() == 2:
            angles = angles.unsqueeze(0)
        return angles.cos().unsqueeze(1), angles.sin().unsqueeze(1)


def _rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate x (B, H, T, D) by the angles behind cos/sin (B or 1, 1, T, D)."""
    x32 = x.float()
    return (x32 * cos + _rotate_half(x32) * sin).to(x.dtype)


class RelativePositions(nn.Module):
    """Shaw et al. 2018: learned embeddings a^K_ij, a^V_ij of the clipped distance j - i, shared across heads.

    e_ij = q_i . (k_j + a^K_ij) * scale,  z_i = sum_j alpha_ij (v_j + a^V_ij); distances beyond +-k share one
    embedding each side.
    """

    def __init__(self, max_distance: int, head_dim: int) -> None:
        super().__init__()
        self.max_distance = max_distance
        self.key = nn.Parameter(torch.zeros(2 * max_distance + 1, head_dim))
        self.value = nn.Parameter(torch.zeros(2 * max_distance + 1, head_dim))

    def forward(self, query_len: int, key_len: int) -> tuple[Tensor, Tensor]:
        """Embeddings for queries at positions `key_len - query_len ..` against keys `0 .. key_len - 1`.

        Returns a^K and a^V, each (T, S, D).
        """
        device = self.key.device
        query_pos = torch.arange(key_len - query_len, key_len, device=device)
        key_pos = torch.arange(key_len, device=device)
        distance = (key_pos[None, :] - query_pos[:, None]).clamp(-self.max_distance, self.max_distance)  # (T, S)
        index = distance + self.max_distance
        return self.key[index], self.value[index]
