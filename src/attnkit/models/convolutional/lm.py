"""A gated convolutional language model (GCNN; Dauphin et al. 2017), dilated as WaveNet and ByteNet dilate:

    ids (B, T) -> embedding (C) -> dropout -> [GatedConvBlock, dilation d_l] x n_layers -> lm_head -> (B, T, V)

The lecture's second kind of sequence model (lecture 004, "three types of sequence models"): each representation
is conditioned on local context, the `receptive_field` tokens up to and including it,
R = 1 + (k - 1) * sum_l d_l, and on nothing before them. There are no positions: a kernel's taps are relative.

Padding: an attention mask zeroes the padded columns before every block, so left padding reads as the zeros that
stand for the text before the first token, and a left-padded row computes what it computes alone.

Generation: `ConvState` keeps each block's last (k - 1) d_l inputs, the queues of fast WaveNet generation (Paine et
al. 2016, "Fast Wavenet Generation Algorithm"), so a step convolves only the new positions with what each block read
before: a token costs one kernel's taps a block, whatever the length of the text. Since nothing further back reaches
the output, this equals a forward pass over the whole text.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attnkit.layers.embedding import check_token_ids
from attnkit.models.convolutional.gated import GatedConvBlock
from attnkit.models.stateful_lm import StatefulLM, check_state_rows, step_mask


class ConvState:
    """Each block's last (k - 1) d_l inputs, (B, C, (k - 1) d_l) a block (zeros before the first token), and how many
    tokens have been read; updated in place by the model, like a KV cache. Its size never depends on the length of
    the text, so generation never slides a window (`max_len` None, as a recurrent state's)."""

    max_len = None

    def __init__(self) -> None:
        self.inputs: dict[int, Tensor] = {}  # block index -> its last inputs (B, C, (k - 1) d)
        self.length = 0

    def past(self, block: int, x: Tensor, reach: int) -> Tensor:
        """The `reach` inputs of block `block` before x (B, C, T), (B, C, reach) (zeros before the first token);
        keeps the last `reach` of them and x for the next step."""
        before = self.inputs.get(block)
        if before is None:
            before = x.new_zeros(x.shape[0], x.shape[1], reach)  # (B, C, reach): the text before the first token
        seen = torch.cat((before, x), dim=2)  # (B, C, reach + T)
        self.inputs[block] = seen[:, :, seen.shape[2] - reach:]  # (B, C, reach)
        return before

    @property
    def rows(self) -> int | None:
        """The sequences it holds; None while empty."""
        held = next(iter(self.inputs.values()), None)
        return None if held is None else held.shape[0]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (B',), e.g. the surviving hypotheses of beam search."""
        self.inputs = {block: inputs.index_select(0, index) for block, inputs in self.inputs.items()}


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
        and steps serve both): input_ids (B, T) -> hidden states (B, T, C) and `cache`, holding the state after them;
        without `cache`, an empty `ConvState` (a pass that keeps nothing: allocate one to continue a text).

        attention_mask: (B, T) 1 at real tokens, 0 at padding on the left or the right of each row (outputs at
            padding carry no meaning). A wider mask, (B, S + T) over the tokens already read and these (a KV cache's
            convention), is cut to its last T columns.
        position_ids: accepted for the decoder's call signature and unused: the kernels' taps are relative.
        cache: the `ConvState` to continue from; updated in place to hold each block's last inputs. One that holds
            another number of rows than input_ids is an InputError (`check_state_rows`).
        """
        check_token_ids(input_ids, self.vocab_size)
        check_state_rows(cache, input_ids)
        mask = step_mask(attention_mask, input_ids)  # bool (B, T), or None: no padding
        hidden = self.body(input_ids, mask, cache)
        if cache is None:
            return hidden, ConvState()
        cache.length += input_ids.shape[1]
        return hidden, cache

    def body(self, input_ids: Tensor, mask: Tensor | None, state: ConvState | None = None) -> Tensor:
        """input_ids (B, T), mask (B, T) bool or None -> hidden states (B, T, C); with `state`, each block reads its
        inputs before these from it (and leaves these there) instead of zeros."""
        keep = None if mask is None or bool(mask.all()) else mask[:, None, :].to(self.embedding.weight.dtype)
        x = self.dropout(self.embedding(input_ids)).transpose(1, 2)  # (B, T, C) -> (B, C, T): channels first
        for index, block in enumerate(self.blocks):
            x = x if keep is None else x * keep  # padding reads as the zeros before a text
            x = block(x, None if state is None else state.past(index, x, block.conv.left))
        return x.transpose(1, 2)  # (B, C, T) -> (B, T, C)

    def allocate_cache(self, batch_size: int, max_len: int | None = None) -> ConvState:
        """An empty state for `batch_size` rows (called as a KV cache is allocated); its size never depends on
        `max_len`, the steps to come: it holds each block's last (k - 1) d inputs however long the text."""
        return ConvState()
