"""Boolean attention masks: `True` means "may attend". Shapes broadcast to scores `(B, H, T, S)`.

Attention adds them to its scores as a float bias (`as_bias`: 0 where allowed, -inf where not), the same way as
position biases (ALiBi, Shaw), so masks and biases combine by addition.

Causal masking (lecture: "masked self-attention" in the decoder) stops position t from seeing t' > t; padding
masks stop any query from attending to padded keys.
"""

from __future__ import annotations

import torch
from torch import Tensor


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
