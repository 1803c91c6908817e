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
from attnkit.layers.embedding import Embeddings, check_token_ids
from attnkit.layers.kv_cache import KVCache
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
        need_weights: bool = False,
    ) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """input_ids (B, T) -> hidden states (B, T, C) and per-layer attention weights (when asked).

        attention_mask: (B, S) bool/int, 1 at real tokens; with a cache, S covers the cached positions too.
        position_ids: (B, T); by default the positions after those already cached.
        token_type_ids: (B, T) segment ids, for stacks with token-type embeddings (BERT).
        """
        check_token_ids(input_ids, self.embeddings.vocab_size)
        start = cache.length if cache is not None else 0
        length = input_ids.shape[1]
        if position_ids is None:
            position_ids = torch.arange(start, start + length, device=input_ids.device).unsqueeze(0)  # (1, T)
        self.embeddings.check_positions(position_ids)
        key_is_real = _check_mask(attention_mask, input_ids, start + length, "attention_mask")
        return self.run(
            input_ids,
            position_ids,
            key_is_real=key_is_real,
            token_type_ids=token_type_ids,
            cache=cache,
            context=context,
            context_mask=context_mask,
            need_weights=need_weights,
        )

    def run(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        *,
        key_is_real: Tensor | None = None,
        token_type_ids: Tensor | None = None,
        cache: KVCache | None = None,
        context: Tensor | None = None,
        context_mask: Tensor | None = None,
        need_weights: bool = False,
    ) -> tuple[Tensor, list[dict[str, Tensor]]]:
        """`forward` after its checks of the inputs, which read tensor values (a compiled decoding step calls this,
        its inputs known good). key_is_real: (B, S) bool, True at real keys."""
        x = self.embeddings(input_ids, position_ids, token_type_ids)  # (B, T, C)
        positions = self.positions.prepare(position_ids) if self.positions is not None else position_ids
        attentions: list[dict[str, Tensor]] = []
        for index, block in enumerate(self.blocks):
            x, weights = block(
                x,
                key_is_real=key_is_real,
                positions=positions,
                cache=cache.layers[index] if cache is not None else None,
                context=context,
                context_is_real=context_mask,
                need_weights=need_weights,
            )
            attentions.append(weights)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, attentions


def _check_mask(mask: Tensor | None, ids: Tensor, expected_len: int, name: str) -> Tensor | None:
    """Validate a (B, S) padding mask and return it as bool; None stays None."""
    if mask is None:
        return None
    if mask.dim() != 2 or mask.shape[0] != ids.shape[0] or mask.shape[1] != expected_len:
        raise InputError(
            f"{name} has shape {tuple(mask.shape)} but ({ids.shape[0]}, {expected_len}) is needed: one entry per "
            f"token (including cached ones), 1 for real tokens and 0 for padding"
        )
    mask = mask.bool()
    if not mask.is_meta and not torch.compiler.is_exporting() and not bool(mask.any(dim=1).all()):
        raise InputError(f"{name} marks every token of some sequence as padding; each needs a real token")
    return mask
