"""The KV cache: keys and values of past positions, kept so each decoding step computes only the new token.

Buffers are preallocated (B, Hkv, max_len, D) and written by position, as in gpt-fast, so decoding never
reallocates. Cross-attention keys and values of the encoder's output are computed once and kept beside them.

`RollingLayerCache` serves sliding-window attention (Mistral): it keeps only the last `window` positions, each in
slot `position % window` of a ring buffer, so memory stays flat however long generation runs. Its keys are not in
position order, so it says which absolute position each returned key holds (`key_positions`), which the mask
reads (`masks.AttentionMask`); the other caches return positions 0 .. S - 1 in order.

A cache may hold another floating dtype than the model's (a bf16 cache for an fp32 model halves its memory, as
vLLM's `kv_cache_dtype` does): keys and values are stored rounded to the cache's dtype and returned in the dtype
they came in, so attention sees one dtype.

`StaticKVCache` keeps the shapes of a decoding step fixed for a compiled step (gpt-fast's static cache): the new
position is written where a tensor says, not a Python int, and attention reads the whole buffer with the keys not
yet written masked out, so every step runs the same graph.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor, nn

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
        """Write keys/values (B, Hkv, T, D) at the next T positions; return all so far, (B, Hkv, S, D), in keys'
        dtype."""
        start, end = self.length, self.length + keys.shape[2]
        _check_room(self.max_len, end)
        self.keys[:, :, start:end] = keys
        self.values[:, :, start:end] = values
        self.length = end
        held_keys, held_values = self.keys[:, :, :end], self.values[:, :, :end]  # (B, Hkv, S, D)
        if held_keys.dtype == keys.dtype:  # a cache in the model's dtype: the views as they are, no call to convert
            return held_keys, held_values
        return held_keys.to(keys.dtype), held_values.to(keys.dtype)

    def key_positions(self) -> Tensor | None:
        """The absolute position of each key the last `append` returned, (S,); None: positions 0 .. S - 1, in
        order (here always)."""
        return None

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (B',), e.g. the surviving hypotheses of beam search."""
        self.keys = self.keys.index_select(0, index)
        self.values = self.values.index_select(0, index)
        if self.cross is not None:
            self.cross = (self.cross[0].index_select(0, index), self.cross[1].index_select(0, index))


class RollingLayerCache(LayerCache):
    """A sliding-window layer's cache: the last `window` positions in a ring buffer (B, Hkv, window, D), position p in
    slot p % window (see the module docstring). `max_len` is how many positions it may be asked to reach."""

    def __init__(self, batch_size: int, n_kv_heads: int, max_len: int, head_dim: int, *, window: int, dtype,
                 device) -> None:
        super().__init__(batch_size, n_kv_heads, window, head_dim, dtype=dtype, device=device)
        self.window, self.capacity = window, max_len
        self._returned = torch.zeros(0, dtype=torch.long, device=device)  # positions of the keys `append` returned

    @property
    def max_len(self) -> int:
        return self.capacity

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """Write keys/values (B, Hkv, T, D) of the next T positions. One position: returns the ring's keys (at most
        `window`, in slot order). Several: returns the kept keys then the new ones, in position order, so each new
        query finds its whole window; then the ring keeps the newest `window`. Returned in keys' dtype."""
        dtype, keys, values = keys.dtype, keys.to(self.keys.dtype), values.to(self.values.dtype)
        start, count = self.length, keys.shape[2]
        end = start + count
        _check_room(self.capacity, end)
        device = self.keys.device
        kept = torch.arange(max(0, start - self.window), start, device=device)  # positions the ring holds
        if count > 1:
            all_keys = torch.cat((self.keys[:, :, kept % self.window], keys), dim=2)  # (B, Hkv, kept + T, D)
            all_values = torch.cat((self.values[:, :, kept % self.window], values), dim=2)
            self._returned = torch.cat((kept, torch.arange(start, end, device=device)))
        newest = torch.arange(max(start, end - self.window), end, device=device)  # the new positions the ring keeps
        self.keys[:, :, newest % self.window] = keys[:, :, newest - start]
        self.values[:, :, newest % self.window] = values[:, :, newest - start]
        self.length = end
        if count > 1:
            return all_keys.to(dtype), all_values.to(dtype)
        filled = min(end, self.window)
        slots = torch.arange(filled, device=device)
        self._returned = slots + ((end - 1 - slots) // self.window) * self.window  # the position in each slot
        return self.keys[:, :, :filled].to(dtype), self.values[:, :, :filled].to(dtype)

    def key_positions(self) -> Tensor:
        return self._returned


class KVCache:
    """The caches of all layers of one decoder stack, passed into and out of the model."""

    layer_type = LayerCache

    def __init__(self, layers: list[LayerCache]) -> None:
        self.layers = layers
        self.memory: Tensor | None = None  # the encoder output of the layers' cross keys (`EncoderDecoder.decode`)

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
        windows: Sequence[int | None] | None = None,
    ) -> KVCache:
        """windows: each layer's attention window (None: all keys); a layer whose window is shorter than `max_len`
        gets a `RollingLayerCache` of the window's size. `dtype`: any floating dtype (see the module docstring).

        Raises InputError for a dtype that is not floating point."""
        if not dtype.is_floating_point:
            raise InputError(f"a KV cache holds floating-point keys and values, not {dtype}: give a floating dtype "
                             "(torch.bfloat16 halves an fp32 model's cache) or leave dtype out for the model's own")
        windows = windows or [None] * n_layers
        layers = []
        for window in windows:
            if window is not None and window < max_len:
                if cls.layer_type is not LayerCache:
                    raise InputError(f"{cls.__name__} has no rolling form for sliding-window layers: decode eagerly")
                layers.append(RollingLayerCache(batch_size, n_kv_heads, max_len, head_dim, window=window, dtype=dtype,
                                                device=device))
            else:
                layers.append(cls.layer_type(batch_size, n_kv_heads, max_len, head_dim, dtype=dtype, device=device))
        return cls(layers)

    @property
    def length(self) -> int:
        """Number of positions cached so far."""
        return self.layers[0].length

    @property
    def batch_size(self) -> int:
        """The number of sequences it holds (B)."""
        return self.layers[0].keys.shape[0]

    @property
    def max_len(self) -> int:
        """How many positions the cache may reach."""
        return self.layers[0].max_len

    @property
    def nbytes(self) -> int:
        """The memory its buffers take: every layer's keys and values, allocated whether written or not."""
        return sum(layer.keys.nbytes + layer.values.nbytes for layer in self.layers)

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (B',) of every layer; the memory reordered alike is whatever the next step gives."""
        for layer in self.layers:
            layer.reorder(index)
        self.memory = None

    def rewind(self, length: int) -> None:
        """Forget the positions from `length` on (speculative decoding's rejected drafts, `generate/speculative.py`):
        the next append writes at `length`. Raises InputError for a length beyond those cached, or for a rolling
        layer, whose ring has already overwritten the keys the rewound positions' windows need."""
        if not 0 <= length <= self.length:
            raise InputError(f"cannot rewind a KV cache of {self.length} positions to {length}: give 0 to "
                             f"{self.length}")
        if any(isinstance(layer, RollingLayerCache) for layer in self.layers):
            raise InputError("a rolling (sliding-window) cache cannot be rewound: its ring has overwritten older "
                             "keys; allocate the cache with rolling=False")
        for layer in self.layers:
            layer.length = length

    def read(self, row: int, start: int, end: int) -> Tensor:
        """One row's keys and values at positions [start, end) of every layer, copied: (L, 2, Hkv, end - start, D)
        (what the prefix cache keeps of a block, `layers/prefix_cache.py`)."""
        return torch.stack([torch.stack((layer.keys[row, :, start:end], layer.values[row, :, start:end]))
                            for layer in self.layers])

    def write(self, row: int, start: int, keys_values: Tensor) -> None:
        """Write `read`'s form (L, 2, Hkv, T, D) into one row at positions [start, start + T) of every layer."""
        end = start + keys_values.shape[3]
        _check_room(self.max_len, end)
        for layer, (keys, values) in zip(self.layers, keys_values, strict=True):
            layer.keys[row, :, start:end] = keys
            layer.values[row, :, start:end] = values

    def hold(self, length: int) -> None:
        """Count positions [0, length) as cached (written by `write`): the next append writes after them."""
        _check_room(self.max_len, length)
        for layer in self.layers:
            layer.length = length


class StaticLayerCache(LayerCache):
    """A layer cache whose single-position appends have fixed shapes (see the module docstring).

    Several positions at once (the prefill) append as in LayerCache. A single position is written at `slot`, a
    one-element tensor that the StaticKVCache shares among its layers and sets in `advance`, and the whole buffer
    is returned.
    """

    slot: Tensor  # (1,) long, set by StaticKVCache

    def append(self, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
        """keys/values (B, Hkv, 1, D) -> the whole buffers (B, Hkv, max_len, D), positions 0 .. max_len - 1 in order
        (those not yet written masked by `StaticKVCache.filled`); several positions as LayerCache."""
        if keys.shape[2] != 1:
            return super().append(keys, values)
        self.keys.index_copy_(2, self.slot, keys.to(self.keys.dtype))
        self.values.index_copy_(2, self.slot, values.to(self.values.dtype))
        return self.keys.to(keys.dtype), self.values.to(keys.dtype)



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

    def rewind(self, length: int) -> None:
        """Refused with InputError: a static step writes at `slot` and reads the positions `filled` marks, which
        forgetting positions would leave pointing past them (speculative decoding allocates a plain KVCache)."""
        raise InputError("a static KV cache (a compiled decoding step's) cannot be rewound: its step writes at a slot "
                         "and reads the positions marked filled; allocate the cache with static=False")

    def buffers(self) -> list[Tensor]:
        """Each layer's keys then values, (B, Hkv, max_len, D), in layer order."""
        return [buffer for layer in self.layers for buffer in (layer.keys, layer.values)]

    def over(self, buffers: Sequence[Tensor], slot: Tensor, filled: Tensor) -> StaticKVCache:
        """A cache like this one over other tensors (`buffers()`'s order, `slot`, `filled`): how a step captured as
        a function of its tensors sees its cache (`generate/captured_step.py`)."""
        layers = []
        for layer, keys, values in zip(self.layers, buffers[::2], buffers[1::2], strict=True):
            part = copy.copy(layer)
            part.keys, part.values, part.slot = keys, values, slot
            layers.append(part)
        cache = copy.copy(self)
        cache.layers, cache.slot, cache.filled = layers, slot, filled
        return cache

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


def kv_bytes_per_position(model: nn.Module, batch_size: int = 1) -> int:
    """The bytes one position of the KV cache `model.allocate_cache` gives `batch_size` rows takes (every layer's keys
    and values), read from a cache of one position, every position kept (`rolling=False`), so each layout (GQA, MQA,
    sliding windows, the cache's dtype) counts as it is allocated. The cache is made on the meta device, so nothing
    is allocated however many rows are asked about. `model`: a decoder-only model (`DecoderLM`), whose
    `allocate_cache` takes `rolling`. Beam search's memory check (`Pipeline`) and speculative decoding's read it."""
    return model.allocate_cache(batch_size, 1, rolling=False, device="meta").nbytes


def _check_room(max_len: int, needed: int) -> None:
    if needed > max_len:
        raise InputError(
            f"the KV cache holds {max_len} positions but {needed} are needed; allocate a larger cache (max_len) or "
            f"generate fewer tokens"
        )
