"""One stack of blocks behind an embedding: the shared body of the encoder and the decoder.

    ids -> Embeddings (token, x sqrt(C)?, + absolute positions) -> block 1 .. block N -> final norm? -> (B, T, C)

The position scheme (`layers/positions.py`) acts where it belongs: absolute schemes inside `Embeddings`, relative
ones (RoPE, Shaw, ALiBi) inside each block's self-attention, which the stack hands the tokens' positions, prepared
once for every layer by a scheme they share (RoPE's cos and sin).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from attnkit.errors import InputError
from attnkit.layers.embedding import Embeddings, check_token_ids, has_values
from attnkit.layers.kv_cache import KVCache
from attnkit.layers.masks import AttentionMask
from attnkit.layers.positions import PositionScheme


class TransformerStack(nn.Module):
    """Embeddings + blocks + optional final norm. Encoder and decoder stacks differ only in their blocks."""

    def __init__(
        self,
        *,
        embeddings: Embeddings,
        blocks: list[nn.Module],
        final_norm: nn.Module | None,
        positions: PositionScheme | None = None,
    ) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.blocks = nn.ModuleList(blocks)
        self.final_norm = final_norm
        self.positions = positions  # the scheme the blocks' self-attentions share, if they share one

    @property
    def causal(self) -> bool:
        """Whether its blocks attend causally (a decoder stack)."""
        # len, not bool: torch 2.11's Dynamo cannot trace bool() of a ModuleList (2.13 can)
        return len(self.blocks) > 0 and self.blocks[0].causal

    def forward(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        cache: KVCache | None = None,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        prefix_len: int | Tensor | None = None,
        document_ids: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """input_ids (B, T) -> hidden states (B, T, C) and per-layer attention weights (when asked).

        attention_mask: (B, S) bool/int, 1 at real tokens; with a cache, S covers the cached positions too.
        position_ids: (B, T); by default the positions after those already cached.
        token_type_ids: (B, T) segment ids, for stacks with token-type embeddings (BERT).
        context, context_mask: the encoder's output (B, S_src, C) that cross-attention reads, and its padding mask
            (B, S_src) bool, True at real tokens (checked when the source was encoded).
        prefix_len: a causal stack's prefix (a prefix LM's prompt): positions below it see each other both ways;
            an int, or (B,) per row.
        document_ids: (B, T) the document of each position of a packed row (`data/packing.py`): no position attends
            to another document's (without a cache; give position_ids restarting at each document).
        The masks are built here, once for the forward pass, and shared by every block (`layers/masks.py`).
        """
        check_token_ids(input_ids, self.embeddings.vocab_size)
        start = cache.length if cache is not None else 0
        length = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(start, start + length, device=input_ids.device).unsqueeze(0)  # (1, T)
            last = start + length - 1  # known without reading the tensor
        else:
            last = _check_position_ids(position_ids, input_ids.shape)
        self.embeddings.check_positions(position_ids, last=last)
        if cache is not None:
            self._check_cache(cache, input_ids.shape[0])
        attention_mask = _check_mask(attention_mask, input_ids.shape[0], start + length, "attention_mask")
        if document_ids is not None and (cache is not None or document_ids.shape != input_ids.shape):
            raise InputError(f"document_ids has shape {tuple(document_ids.shape)}: a packed row's documents need one "
                             f"id per token, {tuple(input_ids.shape)}, and no cache")
        mask = self.self_mask(length, start=start, attention_mask=attention_mask,
                              prefix_len=self._check_prefix(prefix_len, input_ids.shape[0]), device=input_ids.device,
                              documents=document_ids)
        cross_mask = None if context is None else AttentionMask(length, attention_mask=context_mask,
                                                                   device=input_ids.device)
        return self.run(
            input_ids,
            position_ids,
            mask=mask,
            token_type_ids=token_type_ids,
            cache=cache,
            context=context,
            cross_mask=cross_mask,
            need_weights=need_weights,
        )

    def self_mask(
        self, length: int, *, start: int | Tensor = 0, attention_mask: Tensor | None = None,
        prefix_len: int | Tensor | None = None, device: torch.device | None = None, documents: Tensor | None = None,
    ) -> AttentionMask:
        """The self-attention mask of a forward pass over `length` tokens from position `start`: causal in a decoder
        stack, with the padding, prefix and packed documents given; each block's attention asks it for its own
        window."""
        return AttentionMask(length, start=start, causal=self.causal, attention_mask=attention_mask,
                             prefix_len=prefix_len, device=device, documents=documents)

    def run(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        *,
        mask: AttentionMask,
        token_type_ids: Tensor | None = None,
        cache: KVCache | None = None,
        context: Tensor | None = None,
        cross_mask: AttentionMask | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """`forward` after its checks of the inputs, which read tensor values (a compiled decoding step calls this,
        its inputs known good), with the masks built: the same objects go to every block."""
        x = self.embeddings(input_ids, position_ids, token_type_ids)  # (B, T, C)
        positions = self.positions.prepare(position_ids) if self.positions is not None else position_ids
        attentions: list[dict[str, Tensor]] = []
        for index, block in enumerate(self.blocks):
            x, weights = block(
                x,
                mask=mask,
                positions=positions,
                cache=cache.layers[index] if cache is not None else None,
                context=context,
                cross_mask=cross_mask,
                need_weights=need_weights,
            )
            attentions.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, attentions

    def _check_cache(self, cache: KVCache, batch: int) -> None:
        """A cache allocated for this stack (its layers' key/value heads and head size) and this batch: another
        model's cache would be written into by broadcasting, or fail deep in torch."""
        attention, layer = self.blocks[0].self_attn, cache.layers[0]  # the first layer stands for all: every step
        wanted, held = (attention.n_kv_heads, attention.head_dim), (layer.keys.shape[1], layer.keys.shape[3])
        if len(cache.layers) != len(self.blocks) or held != wanted:
            raise InputError(f"the KV cache was allocated for another model: its {len(cache.layers)} layers hold "
                             f"(key/value heads, head size) {held}, this stack's {len(self.blocks)} need {wanted}; "
                             "allocate one with this model's allocate_cache")
        if cache.batch_size != batch:
            raise InputError(f"the KV cache was allocated for {cache.batch_size} sequences but input_ids holds "
                             f"{batch}; allocate one with batch_size={batch}")

    def _check_prefix(self, prefix_len: int | Tensor | None, batch: int) -> int | Tensor | None:
        """prefix_len as given, once checked: a causal stack's, an int >= 0 or (B,) integers."""
        if prefix_len is None:
            return None
        if not self.causal:
            raise InputError("prefix_len applies to a causal (decoder) stack; this one reads both ways: drop it")
        if isinstance(prefix_len, Tensor):
            if prefix_len.shape != (batch,) or prefix_len.is_floating_point() or prefix_len.dtype == torch.bool:
                raise InputError(f"prefix_len has shape {tuple(prefix_len.shape)} and dtype {prefix_len.dtype}; give "
                                 f"an int or ({batch},) integers, one prefix length per sequence")
            return prefix_len
        if isinstance(prefix_len, bool) or not isinstance(prefix_len, int) or prefix_len < 0:
            raise InputError(f"prefix_len={prefix_len!r} must be an integer >= 0 (or one per sequence)")
        return prefix_len


def _check_position_ids(position_ids: Tensor, ids_shape: torch.Size) -> int | None:
    """Positions a caller gives: integers (B or 1, T) for ids (B, T), counted from 0. Returns the highest, read with
    the lowest in one transfer from the device (None where values are not read, `has_values`)."""
    batch, length = ids_shape
    if (position_ids.is_floating_point() or position_ids.is_complex() or position_ids.dtype == torch.bool
            or position_ids.dim() != 2 or position_ids.shape[1] != length or position_ids.shape[0] not in (1, batch)):
        raise InputError(f"position_ids has shape {tuple(position_ids.shape)} and dtype {position_ids.dtype}; give "
                         f"integer positions ({batch}, {length}) or (1, {length}), one per token")
    if not has_values(position_ids):
        return None
    low, high = torch.stack(torch.aminmax(position_ids)).tolist()
    if low < 0:
        raise InputError(f"position_ids holds position {low}; positions count from 0")
    return high


def _check_mask(mask: Tensor | None, batch: int, expected_len: int, name: str) -> Tensor | None:
    """Validate a (B, S) padding mask and return it as bool; None stays None."""
    if mask is None:
        return None
    if mask.dim() != 2 or mask.shape[0] != batch or mask.shape[1] != expected_len:
        raise InputError(
            f"{name} has shape {tuple(mask.shape)} but ({batch}, {expected_len}) is needed: one entry per "
            f"token (including cached ones), 1 for real tokens and 0 for padding"
        )
    if mask.dtype != torch.bool and has_values(mask) and not bool(((mask == 0) | (mask == 1)).all()):
        other = mask[(mask != 0) & (mask != 1)][0].item()
        raise InputError(f"{name} holds values other than 0 and 1 (such as {other}): it marks real tokens 1 and "
                         f"padding 0, and is no additive bias; from a bias with 0 at real tokens, give (bias == 0)")
    mask = mask.bool()
    if has_values(mask) and not bool(mask.any(dim=1).all()):
        raise InputError(f"{name} marks every token of some sequence as padding; each needs a real token")
    return mask
