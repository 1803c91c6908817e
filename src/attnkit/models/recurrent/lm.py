"""A recurrent language model (char-rnn; Zaremba et al. 2014; AWD-LSTM's shape without its regularisers):

    ids (B, T) -> embedding (E) -> dropout -> RNN/GRU/LSTM x n_layers (H) -> dropout -> [H -> E] -> lm_head -> (B, T, V)

The whole sequence is known, so one call of torch's recurrent layer reads it (cuDNN on GPUs); generation feeds
one token at a time through the same layer, carrying a `RecurrentState`. With tied embeddings (Press & Wolf
2017; Inan et al. 2017) the output layer is the embedding table, and a linear map brings H to E when they differ.
"""

from __future__ import annotations

from torch import Tensor, nn

from attnkit.layers.embedding import check_token_ids
from attnkit.models.recurrent.rnn import Cell, RecurrentState, make_rnn, run_rnn
from attnkit.models.stateful_lm import StatefulLM, check_state_rows, output_projection, step_mask


class RecurrentLM(StatefulLM):
    """Predicts each next token from the recurrent state after the tokens before it."""

    def __init__(
        self,
        *,
        vocab_size: int,
        embedding_dim: int,
        hidden: int,
        n_layers: int,
        cell: Cell = "lstm",
        dropout: float = 0.0,
        tie_embeddings: bool = True,
        label_smoothing: float = 0.0,
    ) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embedding_dim)
        self.rnn = make_rnn(cell, embedding_dim, hidden, n_layers=n_layers, dropout=dropout)
        self.dropout = nn.Dropout(dropout)
        self.proj = output_projection(hidden, embedding_dim, tie_embeddings)
        self.output_layer(embedding_dim if tie_embeddings else hidden, tie_embeddings=tie_embeddings,
                          label_smoothing=label_smoothing)

    def stack(
        self,
        input_ids: Tensor,
        *,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        cache: RecurrentState | None = None,
    ) -> tuple[Tensor, RecurrentState]:
        """The body without the output layer, called as a decoder's `TransformerStack` is (so generation's prefill
        and steps serve both): input_ids (B, T) -> hidden states (B, T, E or H) and the state after them.

        attention_mask: (B, T) 1 at real tokens, 0 at padding, on the left or the right of each row (the state
            skips padding; outputs there are those of a zero state and carry no meaning). A wider mask, (B, S + T)
            over the tokens already read and these (a KV cache's convention), is cut to its last T columns.
        position_ids: accepted for the decoder's call signature and unused: a recurrence knows the order.
        cache: the `RecurrentState` to continue from; updated in place to the state after the last real token. One
            that holds another number of rows than input_ids is an InputError (`check_state_rows`).
        """
        check_token_ids(input_ids, self.vocab_size)
        check_state_rows(cache, input_ids)
        attention_mask = step_mask(attention_mask, input_ids)  # bool (B, T), or None: no padding
        state = cache if cache is not None else RecurrentState()
        x = self.dropout(self.embedding(input_ids))  # (B, T, E)
        out, new_state = run_rnn(self.rnn, x, state.get(), attention_mask)  # (B, T, H)
        state.set(new_state, input_ids.shape[1])
        return self.proj(self.dropout(out)), state  # (B, T, E or H)

    def allocate_cache(self, batch_size: int, max_len: int | None = None) -> RecurrentState:
        """An empty state for `batch_size` rows (called as a KV cache is allocated): the recurrence starts from
        zeros, and the state's size never depends on `max_len`, the steps to come. Generation therefore continues
        past `max_seq_len` (the training length) from the whole history, where a Transformer slides its window."""
        return RecurrentState()
