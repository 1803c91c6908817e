"""Boolean attention masks: `True` means "may attend". Shapes broadcast to scores `(B, H, T, S)`.

Attention adds them to its scores as a float bias (`as_bias`: 0 where allowed, -inf where not), the same way as
position biases (ALiBi, Shaw), so masks and biases combine by addition.

Causal masking (lecture: "masked self-attention" in the decoder) stops position t from seeing t' > t; padding
masks stop any query from attending to padded keys; a sliding window (Longformer, Mistral) stops a query from
seeing keys W or more positions away. `AttentionMask` holds these parts with the queries' and keys' absolute
positions (keys in a rolling cache are not in order) and gives attention one boolean mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class AttentionMask:
    """Which keys each query may see: causal (none after the query), a window (none `window` or more positions
    away), padding (no padded key). Positions are absolute: query_positions (T,), key_positions (S,);
    key_is_real (B, P) is indexed by position (P covers every position so far)."""

    query_positions: Tensor
    key_positions: Tensor
    causal: bool = False
    window: int | None = None
    key_is_real: Tensor | None = None

    @property
    def windowed(self) -> bool:
        """Whether the window hides any key: some query is `window` or more positions from some key."""
        if self.window is None:
            return False
        before = self.query_positions.max() - self.key_positions.min()  # the farthest key behind a query
        after = 0 if self.causal else self.key_positions.max() - self.query_positions.min()
        return bool(before >= self.window or after >= self.window)

    def allowed(self) -> Tensor | None:
        """(B, 1, T, S) or (T, S) bool, True where the query may attend; None: every key.

        With causal (or windowed) structure and padding, each of several queries may also see its own position, so
        a padded query row (left padding in batched generation) is never empty; real rows see it anyway.
        """
        query = self.query_positions[:, None]  # (T, 1)
        key = self.key_positions[None, :]  # (1, S)
        structure = key <= query if self.causal else None  # (T, S)
        if self.windowed:
            near = (query - key < self.window) if self.causal else ((query - key).abs() < self.window)
            structure = near if structure is None else structure & near
        padding = None if self.key_is_real is None else padding_mask(self.key_is_real[:, self.key_positions])
        mask = combine(structure, padding)
        if structure is not None and padding is not None and len(self.query_positions) > 1:
            mask = mask | (key == query)
        return mask


def causal_mask(query_len: int, key_len: int, *, device: torch.device | None = None) -> Tensor:
    """(T, S) lower-triangular mask for queries that are the last `query_len` of `key_len` positions.

    With a KV cache the queries sit at positions `S - T .. S - 1`, so query i may see keys `0 .. S - T + i`.
    """
    offset = key_len - query_len
    query_pos = torch.arange(query_len, device=device).unsqueeze(1) + offset  # (T, 1)
    key_pos = torch.arange(key_len, device=device).unsqueeze(0)  # (1, S)
    return key_pos <= query_pos  # (T, S)


def padding_mask(key_is_real: Tensor) -> Tensor:
    """(B, S) bool, True at real tokens -> (B, 1, 1, S), broadcastable over heads and queries."""
    return key_is_real[:, None, None, :]


def combine(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the masks that are given; None when none is."""
    result: Tensor | None = None
    for mask in masks:
        if mask is not None:
            result = mask if result is None else result & mask
    return result


def as_bias(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """A boolean mask as an additive score bias of the same shape: 0 where it may attend, -inf where not."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
