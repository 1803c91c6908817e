"""The KV cache: keys and values of past positions, kept so each decoding step computes only the new token.

Buffers are preallocated (B, Hkv, max_len, D) and written by position, as in gpt-fast, so decoding never
reallocates. Cross-attention keys and values of the encoder's output are computed once and kept beside them.

`StaticKVCache` keeps the shapes of a decoding step fixed for a compiled step (gpt-fast's static cache): the new
position is written where a tensor says, not a Python int, and attention reads the whole buffer with the keys not
yet written masked out, so every step runs the same graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.errors import InputError


class LayerCache:
    """One layer's cache: self-attention keys/values by position, and the encoder's keys/values once computed."""

    def __init__(self, batch_size: int, n_kv_heads: int, max_len: int, head_dim: int, *, dtype, device) -> None:
        shape = (batch_size, n_kv_heads, max_len, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0
        self.cross: tuple[Tensor, Tensor] | None = None

    @property
    def max_len(self) -> int:
        return self.keys.shape[2]

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Write keys/values (B, Hkv, T, D) at the next T positions; return all so far, (B, Hkv, S, D)."""
        start, end = self.length, self.length + keys.shape[2]
        _check_room(self.max_len, end)
        self.keys[:, :, start:end] = keys
        self.values[:, :, start:end] = values
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def written(self, count: int) -> Tensor:
        """The positions (count,) of the keys the last `append` wrote, among those it returned."""
        return torch.arange(self.length - count, self.length, device=self.keys.device)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (B',), e.g. the surviving hypotheses of beam search."""
        self.keys = self.keys.index_select(0, index)
        self.values = self.values.index_select(0, index)
        if self.cross is not None:
            self.cross = (self.cross[0].index_select(0, index), self.cross[1].index_select(0, index))


class KVCache:
    """The caches of all layers of one decoder stack, passed into and out of the model."""

    layer_type = LayerCache

    def __init__(self, layers: list[LayerCache]) -> None:
        self.layers = layers

    @classmethod
    def allocate(
        cls,
        *,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        head_dim: int,
        max_len: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
    ) -> KVCache:
        return cls(
            [
                cls.layer_type(batch_size, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)
                for _ in range(n_layers)
            ]
        )

    @property
    def length(self) -> int:
        """Number of positions cached so far."""
        return self.layers[0].length

    @property
    def max_len(self) -> int:
        return self.layers[0].max_len

    def reorder(self, index: Tensor) -> None:
        for layer in self.layers:
            layer.reorder(index)


class StaticLayerCache(LayerCache):
    """A layer cache whose single-position appends have fixed shapes (see the module docstring).

    Several positions at once (the prefill) append as in LayerCache. A single position is written at `slot`, a
    one-element tensor that the StaticKVCache shares among its layers and sets in `advance`, and the whole buffer
    is returned.
    """

    slot: Tensor  # (1,) long, set by StaticKVCache

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """keys/values (B, Hkv, 1, D) -> the whole buffers (B, Hkv, max_len, D); several positions as LayerCache."""
        if keys.shape[2] != 1:
            return super().append(keys, values)
        self.keys.index_copy_(2, self.slot, keys)
        self.values.index_copy_(2, self.slot, values)
        return self.keys, self.values

    def written(self, count: int) -> Tensor:
        """(1,): the slot a single-position append wrote; several positions as LayerCache."""
        return self.slot if count == 1 else super().written(count)


class StaticKVCache(KVCache):
    """The layers' static caches, their shared `slot`, and `filled` (B, max_len) bool: which positions hold a real
    token's keys."""

    layer_type = StaticLayerCache

    def __init__(self, layers: list[StaticLayerCache]) -> None:
        super().__init__(layers)
        batch, _, max_len, _ = layers[0].keys.shape
        device = layers[0].keys.device
        self.slot = torch.zeros(1, dtype=torch.long, device=device)  # the position the next single-position step writes
        self.filled = torch.zeros((batch, max_len), dtype=torch.bool, device=device)
        for layer in layers:
            layer.slot = self.slot

    def mark_prefilled(self, is_real: Tensor) -> None:
        """Record the prefill's padding: is_real (B, L) for the L positions the prefill wrote."""
        self.filled[:, : is_real.shape[1]] = is_real

    def advance(self) -> None:
        """Make the next position the one a single-position step writes, and count it as filled (a real token)."""
        position = self.length
        _check_room(self.max_len, position + 1)
        self.slot.fill_(position)
        self.filled[:, position] = True
        for layer in self.layers:
            layer.length = position + 1


def _check_room(max_len: int, needed: int) -> None:
    if needed > max_len:
        raise InputError(
            f"the KV cache holds {max_len} positions but {needed} are needed; allocate a larger cache (max_len) or "
            f"generate fewer tokens"
        )
