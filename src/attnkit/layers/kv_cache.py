"""The KV cache: keys and values of past positions, kept so each decoding step computes only the new token.

Buffers are preallocated (B, Hkv, max_len, D) and written by position, as in gpt-fast, so decoding never
reallocates. Cross-attention keys and values of the encoder's output are computed once and kept beside them.
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
        if end > self.max_len:
            raise InputError(
                f"the KV cache holds {self.max_len} positions but {end} are needed; allocate a larger cache "
                f"(max_len) or generate fewer tokens"
            )
        self.keys[:, :, start:end] = keys
        self.values[:, :, start:end] = values
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (B',), e.g. the surviving hypotheses of beam search."""
        self.keys = self.keys.index_select(0, index)
        self.values = self.values.index_select(0, index)
        if self.cross is not None:
            self.cross = (self.cross[0].index_select(0, index), self.cross[1].index_select(0, index))


class KVCache:
    """The caches of all layers of one decoder stack, passed into and out of the model."""

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
                LayerCache(batch_size, n_kv_heads, max_len, head_dim, dtype=dtype, device=device)
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
