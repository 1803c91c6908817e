"""Attention masks: which keys each query may see, as one object per forward pass.

`AttentionMask` holds the mask's parts and the queries' absolute positions (the positions their keys take in the
KV cache, Hugging Face's `cache_position`: one convention for every cache, kernel and position scheme):

    causal          no query sees a key after it (lecture: "masked self-attention" in the decoder)
    prefix_len      ... except that positions below it see each other both ways: the prompt of a prefix LM is read
                    bidirectionally (Raffel et al. 2020, section 3.2.3; Dong et al. 2019)
    window          no query sees a key `window` or more positions away (Longformer, Mistral); asked per layer,
                    since a model may alternate windowed and global layers (Gemma 2)
    attention_mask  no query sees a padded key: (B, P) bool, True at real tokens, indexed by position
    documents       no query sees a key of another document: (B, T) ids of the documents packed into each row
                    (`data/packing.py`), so that packed rows train as their documents would alone

    keys ->   causal       causal, prefix_len=3    causal, window=2
    query 0   x . . . .    x x x . .               x . . . .
          1   x x . . .    x x x . .               x x . . .
          2   x x x . .    x x x . .               . x x . .
          3   x x x x .    x x x x .               . . x x .

The model's stack builds the mask once per forward pass and hands the same object to every layer; each kernel asks
it for the form it wants: `is_causal_only` (SDPA's `is_causal`, or nothing at all for the one newest query: no
tensor is built), `allowed` (boolean), `bias` (additive: 0 where allowed, -inf where not, the form the reference
path adds to its scores like a position bias, so masks and biases combine by addition) or `mask_mod` (FlexAttention's
function of (b, h, q_idx, kv_idx), from which `layers/kernels.py` builds its block mask). A tensor form is built once
per forward pass for each key length and window, and shared by the layers that ask for the same (`shared`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor


@dataclass(frozen=True, eq=False)
class AttentionMask:
    """Which keys each of `length` queries may see (see the module docstring for the parts).

    start: the first query's absolute position; the queries sit at start .. start + length - 1 (with a KV cache,
        the positions they are written to; a (1,) tensor for a compiled decoding step's cache slot).
    attention_mask: (B, P) bool, True at real tokens; P covers every key position (cached ones too).
    prefix_len: an int, or (B,) per row: positions below it see each other both ways (with `causal`).
    device: where its tensors are built (None: the attention_mask's or start's device, else the CPU).
    documents: (B, T) int, the document of each position of a packed row; keys are the queries themselves (no
        cache). Positions of different documents never see each other.
    """

    length: int
    start: int | Tensor = 0
    causal: bool = False
    attention_mask: Tensor | None = None
    prefix_len: int | Tensor | None = None
    device: torch.device | None = None
    documents: Tensor | None = None
    _forms: dict = field(default_factory=dict, init=False, repr=False)  # tensor forms built so far, by request

    @classmethod
    def for_queries(cls, x: Tensor, cache=None, *, causal: bool = False,
                    attention_mask: Tensor | None = None) -> AttentionMask:
        """The mask of the queries x (B, T, C) written after `cache`'s positions (a LayerCache, or None): what the
        keywords before AttentionMask (causal=, key_is_real=) described."""
        return cls(x.shape[1], start=cache.length if cache is not None else 0, causal=causal,
                   attention_mask=attention_mask, device=x.device)

    @property
    def query_positions(self) -> Tensor:
        """(T,) long: the queries' absolute positions."""
        positions = self._forms.get("queries")
        if positions is None:
            if isinstance(self.start, Tensor):
                positions = self.start + torch.arange(self.length, device=self.start.device)
            else:
                positions = torch.arange(self.start, self.start + self.length, device=self._device)
            self._keep(None if torch.compiler.is_compiling() else "queries", positions)
        return positions

    @property
    def _device(self) -> torch.device | None:
        if self.device is not None:
            return self.device
        return self.attention_mask.device if self.attention_mask is not None else None

    def is_causal_only(self, key_len: int, *, window: int | None = None) -> bool:
        """Whether, over `key_len` keys from a cache (or the queries themselves), this mask is causality alone:
        the queries are all the keys (a square: SDPA's `is_causal`) or the one newest position (it sees every key),
        nothing is padded, no prefix reads both ways, and the window spans every key. Then no tensor is needed."""
        return (self.causal and self.attention_mask is None and self.prefix_len is None and self.documents is None
                and self.length in (1, key_len) and (window is None or window >= key_len))

    def key_positions(self, key_len: int, given: Tensor | None = None) -> Tensor:
        """(S,) long: the keys' absolute positions, `given` (a rolling cache's, `LayerCache.key_positions`) or
        0 .. key_len - 1, on the queries' device."""
        return given if given is not None else torch.arange(key_len, device=self.query_positions.device)

    def hides_keys(self, key_len: int, *, window: int | None = None) -> bool:
        """Whether some query may not see some of `key_len` keys at positions 0 .. key_len - 1: causality, padding,
        documents or a window shorter than the keys (False: `allowed` and `mask_mod` are None)."""
        return (self.causal or self.attention_mask is not None or self.documents is not None
                or (window is not None and window < key_len))

    def allowed(self, key_len: int, *, window: int | None = None, key_positions: Tensor | None = None
                ) -> Tensor | None:
        """(T, S), or (B, 1, T, S) with padding or a per-row prefix: bool, True where the query may attend; None:
        every key. key_positions: (S,) each key's absolute position (a rolling cache's, not in order); None: the
        keys are positions 0 .. key_len - 1.

        With structure (causal, window) and padding, each of several queries may also see its own position, so a
        padded query row (left padding in batched generation) is never empty; real rows see it anyway.
        """
        name = self._form_name("allowed", key_len, window, key_positions)
        if name in self._forms:  # asked before by a layer with the same keys and window
            return self._forms[name]
        query = self.query_positions[:, None]  # (T, 1)
        key = self.key_positions(key_len, key_positions)[None, :]  # (1, S)
        structure = self._structure(query, key)
        if window is not None and not (key_positions is None and window >= key_len):  # the window hides some key
            near = (query - key).abs() < window  # (T, S); both ways, as a prefix reads
            structure = near if structure is None else structure & near
        padding = None
        if self.attention_mask is not None:
            real = self.attention_mask if key_positions is None else self.attention_mask[:, key_positions]
            padding = real[:, None, None, :]  # (B, S) -> (B, 1, 1, S)
        mask = _and(structure, padding)
        if (self.causal or window is not None) and padding is not None and self.length > 1:
            mask = mask | (key == query)
        if self.documents is not None:
            documents = self._documents(key_len, key_positions)
            mask = _and(mask, documents[:, None, :, None] == documents[:, None, None, :])  # (B, 1, T, S)
        self._keep(name, mask)
        return mask

    def mask_mod(self, key_len: int, *, window: int | None = None):
        """`allowed` as FlexAttention's `mask_mod(b, h, q_idx, kv_idx) -> bool` over keys at positions 0 .. key_len - 1
        (no rolling cache; `start` an int); None where every key is allowed. It reads the same parts as `allowed`, in
        the same order, so the two agree position by position."""
        if not self.hides_keys(key_len, window=window):
            return None
        start, causal, real = self.start, self.causal, self.attention_mask
        device = self.query_positions.device
        prefix = self.prefix_len.to(device) if isinstance(self.prefix_len, Tensor) else self.prefix_len
        documents = self._documents(key_len, None) if self.documents is not None else None
        windowed = window is not None and window < key_len
        keep_own = (causal or window is not None) and real is not None and self.length > 1

        def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
            query = q_idx + start
            allowed = kv_idx <= query if causal else kv_idx >= 0
            if causal and prefix is not None:
                below = prefix[b] if isinstance(prefix, Tensor) else prefix
                allowed = allowed | ((kv_idx < below) & (query < below))
            if windowed:
                allowed = allowed & ((query - kv_idx).abs() < window)
            if real is not None:
                allowed = allowed & real[b, kv_idx]
                if keep_own:
                    allowed = allowed | (kv_idx == query)
            if documents is not None:
                allowed = allowed & (documents[b, q_idx] == documents[b, kv_idx])
            return allowed

        return mask_mod

    def shared(self, name: tuple, build):
        """The form `name` built by `build()` once for this forward pass and shared by the layers that ask for it (a
        kernel's own form, such as FlexAttention's block mask); built afresh, not kept, while torch.compile traces."""
        if torch.compiler.is_compiling():
            return build()
        if name not in self._forms:
            self._forms[name] = build()
        return self._forms[name]

    def _documents(self, key_len: int, key_positions: Tensor | None) -> Tensor:
        """The documents (B, T) of a packed row, whose keys are its queries: refused with a cache."""
        if key_positions is not None or key_len != self.length or not (isinstance(self.start, int) and self.start == 0):
            raise ValueError(f"a document mask covers a packed row's own {self.length} positions, its keys the "
                             f"queries; these {key_len} keys come from a cache: run packed rows without one")
        return self.documents.to(self.query_positions.device)

    def bias(self, key_len: int, *, dtype: torch.dtype = torch.float32, window: int | None = None,
             key_positions: Tensor | None = None) -> Tensor | None:
        """`allowed` as an additive float bias of `dtype`: 0 where the query may attend, -inf where not; None:
        every key."""
        name = self._form_name("bias", key_len, window, key_positions, dtype)
        if name in self._forms:
            return self._forms[name]
        allowed = self.allowed(key_len, window=window, key_positions=key_positions)
        bias = as_bias(allowed, dtype) if allowed is not None else None
        self._keep(name, bias)
        return bias

    def _form_name(self, kind: str, key_len: int, window: int | None, key_positions: Tensor | None,
                   *rest: object) -> tuple | None:
        """The name a tensor form is kept under for the other layers of this forward pass; None: not kept. Forms
        over a rolling cache's keys are not kept (their positions are the layer's own), nor those traced by
        torch.compile or torch.export: the blocks share one compiled graph, which a mask already holding forms
        would not match, and a traced length is symbolic."""
        if key_positions is not None or torch.compiler.is_compiling() or not isinstance(key_len, int):
            return None
        return (kind, key_len, window, *rest)

    def _keep(self, name: tuple | str | None, form: Tensor | None) -> None:
        if name is not None:
            self._forms[name] = form

    def _structure(self, query: Tensor, key: Tensor) -> Tensor | None:
        """Causality, opened both ways below the prefix: (T, S), (B, 1, T, S) for a per-row prefix; None: none."""
        if not self.causal:
            return None
        structure = key <= query  # (T, S)
        if self.prefix_len is None:
            return structure
        prefix = self.prefix_len
        if isinstance(prefix, Tensor):
            prefix = prefix.to(query.device)[:, None, None, None]  # (B,) -> (B, 1, 1, 1)
        return structure | ((key < prefix) & (query < prefix))


def _and(*masks: Tensor | None) -> Tensor | None:
    """Logical AND of the masks that are given; None when none is."""
    result: Tensor | None = None
    for mask in masks:
        if mask is not None:
            result = mask if result is None else result & mask
    return result


def as_bias(mask: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """A boolean mask as an additive score bias of the same shape: 0 where it may attend, -inf where not."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, float("-inf"))
