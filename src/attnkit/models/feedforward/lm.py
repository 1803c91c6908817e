"""Feed-forward neural language models (UT CS 371N's recap: "Neural LMs: DANs; FFNNs that are 'position
sensitive', only consider n-1 words"), each reading a prefix into one vector for a multilayer perceptron:

    context="window"   (Bengio et al. 2003)  the last K embeddings, concatenated oldest first      (B, T, K * E)
    context="average"  (Iyyer et al. 2015)   the mean of every embedding up to and including t      (B, T, E)
        -> [Linear -> tanh (or ReLU) -> dropout] x n_layers (H) -> [H -> E] -> lm_head -> (B, T, V)

The window is position-sensitive: each of its K slots has its own weights in the first layer, and a token older
than K reaches nothing (an n-gram model's context, n = K + 1, read by a network). The average, a deep averaging
network's pooling applied to each prefix, is position-insensitive: any order of the same prefix predicts the same.
Both compute every position of a (B, T) batch at once: the window unfolds the embeddings, left-padded with zeros
(the text before the first token); the average is a running mean (a cumulative sum over a cumulative count, in at
least fp32 whatever the model's dtype).

Zeros, not a learned padding embedding, fill the slots before the text: an empty slot adds nothing to the first
layer, so a prediction near the start reads its real tokens and the bias alone. Bengio et al. leave the start
unspecified; makemore's MLP pads with its "." token instead, whose embedding is learned, which lets the model tell
"nothing yet" from any token. Here that marker is the tokenizer's BOS, where it prepends one.

Padding: an attention mask zeroes the padded embeddings, so left padding reads as the text before the first token
and a left-padded row computes what it computes alone; the mean counts real tokens only.

Generation: `PrefixState` keeps what the next token needs, of one size however long the text: the last K - 1
embeddings (window), or the sum of the embeddings read and their count (average).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn

from attnkit.layers.embedding import check_token_ids
from attnkit.models.stateful_lm import StatefulLM, check_state_rows, output_projection, step_mask

Context = Literal["window", "average"]
ACTIVATIONS: dict[str, type[nn.Module]] = {"tanh": nn.Tanh, "relu": nn.ReLU}


class PrefixState:
    """What a feed-forward LM carries from one decoding step to the next, updated in place like a KV cache: the last
    K - 1 embeddings (B, K - 1, E) for a window, or the running sum of embeddings (B, E) and the count of real tokens
    (B, 1) for an average. Never full (`max_len` None): generation never slides a window."""

    max_len = None

    def __init__(self) -> None:
        self.recent: Tensor | None = None
        self.total: Tensor | None = None
        self.count: Tensor | None = None
        self.length = 0

    @property
    def rows(self) -> int | None:
        """The sequences it holds; None while empty."""
        held = self.recent if self.recent is not None else self.total
        return None if held is None else held.shape[0]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (B',), e.g. the surviving hypotheses of beam search."""
        for name in ("recent", "total", "count"):
            value = getattr(self, name)
            if value is not None:
                setattr(self, name, value.index_select(0, index))


class FeedForwardLM(StatefulLM):
    """Predicts each next token from a fixed window of the tokens up to it, or from their average."""

    def __init__(
        self,
        *,
        vocab_size: int,
        embedding_dim: int,
        hidden: int,
        n_layers: int,
        context: Context = "window",
        context_size: int = 8,
        activation: str = "tanh",
        dropout: float = 0.0,
        tie_embeddings: bool = True,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        if context not in ("window", "average") or activation not in ACTIVATIONS or context_size < 1:
            raise ValueError(f"context={context!r} (window or average), activation={activation!r} (tanh or relu), "
                             f"context_size={context_size} (>= 1)")
        self.context, self.context_size = context, context_size
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.dropout = nn.Dropout(dropout)
        width = embedding_dim * context_size if context == "window" else embedding_dim
        self.mlp = nn.Sequential(*(
            part for layer in range(n_layers)
            for part in (nn.Linear(width if layer == 0 else hidden, hidden), ACTIVATIONS[activation](),
                         nn.Dropout(dropout))
        ))
        self.proj = output_projection(hidden, embedding_dim, tie_embeddings)
        self.output_layer(embedding_dim if tie_embeddings else hidden, tie_embeddings=tie_embeddings,
                          label_smoothing=label_smoothing)

    def stack(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: PrefixState | None = None,
    ) -> tuple[Tensor, PrefixState]:
        """The body without the output layer, called as a decoder's `TransformerStack` is (so generation's prefill
        and steps serve both): input_ids (B, T) -> hidden states (B, T, E or H) and the state after them.

        attention_mask: (B, T) 1 at real tokens, 0 at padding on the left or the right of each row (outputs at
            padding carry no meaning). A wider mask, (B, S + T) over the tokens already read and these (a KV cache's
            convention), is cut to its last T columns.
        position_ids: accepted for the decoder's call signature and unused: a window's slots are its positions.
        cache: the `PrefixState` to continue from; updated in place. One that holds another number of rows than
            input_ids is an InputError (`check_state_rows`).
        """
        check_token_ids(input_ids, self.vocab_size)
        check_state_rows(cache, input_ids)
        mask = step_mask(attention_mask, input_ids)  # bool (B, T), or None: no padding
        state = cache if cache is not None else PrefixState()
        x = self.embedding(input_ids)  # (B, T, E)
        if mask is not None:
            x = x * mask[..., None].to(x.dtype)  # padding reads as the zeros before a text
        x = self.dropout(x)
        read = self.window(x, state) if self.context == "window" else self.average(x, mask, state)
        state.length += input_ids.shape[1]
        return self.proj(self.mlp(read)), state  # (B, T, E or H)

    def window(self, x: Tensor, state: PrefixState) -> Tensor:
        """x (B, T, E) -> each position's last K embeddings, oldest first (B, T, K * E); keeps the last K - 1."""
        batch, _, width = x.shape
        keep = self.context_size - 1
        past = state.recent if state.recent is not None else x.new_zeros(batch, keep, width)  # (B, K - 1, E)
        padded = torch.cat((past, x), dim=1)  # (B, K - 1 + T, E)
        state.recent = padded[:, padded.shape[1] - keep:]  # not [:, -keep:], which keeps all at K = 1
        windows = padded.unfold(1, self.context_size, 1)  # (B, T, E, K): window t ends at token t
        return windows.transpose(2, 3).flatten(2)  # (B, T, K, E) -> (B, T, K * E)

    def average(self, x: Tensor, mask: Tensor | None, state: PrefixState) -> Tensor:
        """x (B, T, E) (zeros at padding) -> the mean of each prefix's real embeddings (B, T, E); keeps the sum and
        the count. Both accumulate in at least fp32, whatever x's dtype: a bf16 count stops at 256 (256 + 1 rounds
        to 256) and a bf16 running sum loses the new token's share long before that."""
        accumulate = torch.promote_types(x.dtype, torch.float32)
        real = torch.ones(x.shape[:2], device=x.device) if mask is None else mask  # (B, T)
        sums, counts = x.to(accumulate).cumsum(1), real.to(accumulate).cumsum(1)[..., None]  # (B, T, E), (B, T, 1)
        if state.total is not None:
            sums, counts = sums + state.total[:, None], counts + state.count[:, None]
        state.total, state.count = sums[:, -1], counts[:, -1]
        return (sums / counts.clamp(min=1)).to(x.dtype)  # a row's leading padding: 0 / 1, no division by zero

    def allocate_cache(self, batch_size: int, max_len: int | None = None) -> PrefixState:
        """An empty state for `batch_size` rows (called as a KV cache is allocated); its size never depends on
        `max_len`, the steps to come."""
        return PrefixState()
