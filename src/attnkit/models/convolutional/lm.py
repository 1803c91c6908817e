"""A gated convolutional language model (GCNN; Dauphin et al. 2017), dilated as WaveNet and ByteNet dilate:

    ids (B, T) -> embedding (C) -> dropout -> [GatedConvBlock, dilation d_l] x n_layers -> lm_head -> (B, T, V)

The lecture's second kind of sequence model (lecture 004, "three types of sequence models"): each representation
is conditioned on local context, the `receptive_field` tokens up to and including it,
R = 1 + (k - 1) * sum_l d_l, and on nothing before them. There are no positions: a kernel's taps are relative.

Padding: an attention mask zeroes the padded columns before every block, so left padding reads as the zeros that
stand for the text before the first token, and a left-padded row computes what it computes alone.

Generation: `ConvState` keeps the last R - 1 tokens read, and each step runs the whole stack again over them and the
new tokens (a full recompute of R positions a step, not a cache of each layer's past inputs, as fast WaveNet
generation keeps). Since nothing further back reaches the output, this equals a forward pass over the whole text.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnkit.layers.embedding import check_token_ids
from attnkit.models.convolutional.gated import GatedConvBlock
from attnkit.models.stateful_lm import StatefulLM, step_mask


class ConvState:
    """The last `receptive_field - 1` tokens read, ids (B, R - 1) with their mask (B, R - 1), and how many tokens
    have been read; updated in place by the model, like a KV cache. Its size never depends on the length of the text,
    so generation never slides a window (`max_len` None, as a recurrent state's)."""

    max_len = None

    def __init__(self) -> None:
        self.ids: Tensor | None = None
        self.mask: Tensor | None = None
        self.length = 0

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (B',), e.g. the surviving hypotheses of beam search."""
        if self.ids is not None:
            self.ids, self.mask = self.ids.index_select(0, index), self.mask.index_select(0, index)


class ConvLM(StatefulLM):
    """Predicts each next token from the `receptive_field` tokens up to it (its forward: `StatefulLM`'s)."""

    def __init__(
        self,
        *,
        vocab_size: int,
        d_model: int,
        kernel_size: int,
        dilations: Sequence[int],
        dropout: float = 0.0,
        tie_embeddings: bool = True,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(
            GatedConvBlock(d_model, kernel_size, dilation=dilation, dropout=dropout) for dilation in dilations
        )
        self.output_layer(d_model, tie_embeddings=tie_embeddings, label_smoothing=label_smoothing)
        self.receptive_field = 1 + (kernel_size - 1) * sum(dilations)

    def stack(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: ConvState | None = None,
    ) -> tuple[Tensor, ConvState]:
        """The body without the output layer, called as a decoder's `TransformerStack` is (so generation's prefill
        and steps serve both): input_ids (B, T) -> hidden states (B, T, C) and the state after them.

        attention_mask: (B, T) 1 at real tokens, 0 at padding on the left or the right of each row (outputs at
            padding carry no meaning). A wider mask, (B, S + T) over the tokens already read and these (a KV cache's
            convention), is cut to its last T columns.
        position_ids: accepted for the decoder's call signature and unused: the kernels' taps are relative.
        cache: the `ConvState` to continue from; updated in place to hold the last receptive_field - 1 tokens.
        """
        check_token_ids(input_ids, self.vocab_size)
        new = input_ids.shape[1]
        mask = step_mask(attention_mask, input_ids)  # bool (B, T), or None: no padding
        state = cache if cache is not None else ConvState()
        ids = input_ids
        if state.ids is not None:  # the tokens read before, within reach of the new ones
            ids = torch.cat((state.ids, input_ids), dim=1)  # (B, R - 1 + T)
            new_mask = torch.ones_like(input_ids, dtype=torch.bool) if mask is None else mask
            mask = torch.cat((state.mask, new_mask), dim=1)
        if cache is not None:
            keep = self.receptive_field - 1
            state.ids = ids[:, -keep:]
            state.mask = torch.ones_like(state.ids, dtype=torch.bool) if mask is None else mask[:, -keep:]
            state.length += new
        return self.body(ids, mask)[:, -new:], state  # (B, T, C)

    def body(self, input_ids: Tensor, mask: Tensor | None) -> Tensor:
        """input_ids (B, L), mask (B, L) bool or None -> hidden states (B, L, C)."""
        keep = None if mask is None or bool(mask.all()) else mask[:, None, :].to(self.embedding.weight.dtype)
        x = self.dropout(self.embedding(input_ids)).transpose(1, 2)  # (B, L, C) -> (B, C, L): channels first
        for block in self.blocks:
            x = block(x if keep is None else x * keep)  # padding reads as the zeros before a text
        return x.transpose(1, 2)  # (B, C, L) -> (B, L, C)

    def allocate_cache(self, batch_size: int, max_len: int | None = None) -> ConvState:
        """An empty state for `batch_size` rows (called as a KV cache is allocated); its size never depends on
        `max_len`, the steps to come: it holds the last receptive_field - 1 tokens however long the text."""
        return ConvState()
