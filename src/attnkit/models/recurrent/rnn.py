"""The recurrence itself: torch's RNN (tanh), GRU and LSTM, run over padded batches, and the state they carry.

    h_t = f(x_t, h_{t-1})        one step per position: O(T) steps that cannot run at once (lecture:
                                 "RNNs and parallelizability"); the state h_T summarises everything read

`torch.nn.RNN/GRU/LSTM` (cuDNN on GPUs) run the whole sequence when it is known; `run_rnn` packs padded rows
(`pack_padded_sequence`) so padding never enters the state, and decoders that must interleave a computation
between steps (Bahdanau's attention) call the same modules one position at a time.

`RecurrentState` is a recurrent model's decoding state, what the KV cache is to a Transformer: passed into and
out of the model, it holds (n_layers * directions, B, H) hidden states (and an LSTM's cells), of fixed size
however long the sequence grows.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

Cell = Literal["rnn", "gru", "lstm"]
TorchState = Tensor | tuple[Tensor, Tensor]


def make_rnn(
    cell: Cell, input_size: int, hidden: int, *, n_layers: int, dropout: float = 0.0, bidirectional: bool = False
) -> nn.RNNBase:
    """torch's recurrent layer of `cell` type (batch first); `dropout` applies between layers, as in torch."""
    kinds = {"rnn": nn.RNN, "gru": nn.GRU, "lstm": nn.LSTM}
    if cell not in kinds:
        raise ValueError(f"unknown cell {cell!r}; use rnn, gru or lstm")
    return kinds[cell](
        input_size, hidden, num_layers=n_layers, batch_first=True, bidirectional=bidirectional,
        dropout=dropout if n_layers > 1 else 0.0,
    )


class RecurrentState:
    """Hidden states (L * dirs, B, H), LSTM cells likewise, and how many steps have been taken; for a decoder with
    attention also `keys` (B, 1, S, K), the attention's projection of the encoder states, computed on the first
    step and kept, as a KV cache keeps its cross-attention keys.

    Empty (hidden None) until the first step: the recurrence then starts from zeros, or a decoder from its
    encoder's summary. Updated in place by the model, like a KV cache; `reorder` follows beam search.
    """

    max_len = None  # never full: the state has one size however long the text, so generation never slides a window

    def __init__(self) -> None:
        self.hidden: Tensor | None = None
        self.cell: Tensor | None = None
        self.keys: Tensor | None = None
        self.length = 0

    @property
    def started(self) -> bool:
        return self.hidden is not None

    @property
    def rows(self) -> int | None:
        """The sequences it holds; None before the first step."""
        return None if self.hidden is None else self.hidden.shape[1]

    def get(self) -> TorchState | None:
        """The state as torch's recurrent layers take it: h, or (h, c) for an LSTM; None before the first step."""
        if self.hidden is None:
            return None
        return (self.hidden, self.cell) if self.cell is not None else self.hidden

    def set(self, state: TorchState, steps: int = 0) -> None:
        """Store torch's state after `steps` more positions."""
        self.hidden, self.cell = state if isinstance(state, tuple) else (state, None)
        self.length += steps

    @property
    def top(self) -> Tensor:
        """The last layer's hidden state (B, H): a unidirectional decoder's output at its latest step."""
        return self.hidden[-1]

    def reorder(self, index: Tensor) -> None:
        """Keep batch rows `index` (B',), e.g. the surviving hypotheses of beam search."""
        if self.hidden is not None:
            self.hidden = self.hidden.index_select(1, index)
        if self.cell is not None:
            self.cell = self.cell.index_select(1, index)
        if self.keys is not None:
            self.keys = self.keys.index_select(0, index)


def run_rnn(
    rnn: nn.RNNBase, x: Tensor, state: TorchState | None, attention_mask: Tensor | None = None
) -> tuple[Tensor, TorchState]:
    """x (B, T, I) -> outputs (B, T, dirs * H), zero at padding, and the state after each row's last real token.

    attention_mask: (B, T) bool from `stateful_lm.check_mask` (contiguous real tokens, left or right padded); None:
    no padding.
    Left-padded rows are rotated to the left first, so every row is packed from its first real token; a
    backward direction then starts at each row's own last token, and padding never changes a real output.
    """
    if attention_mask is None:
        return rnn(x, state)
    length = x.shape[1]
    lengths = attention_mask.sum(dim=1)  # (B,)
    start = attention_mask.int().argmax(dim=1)  # (B,) leading padding
    positions = torch.arange(length, device=x.device)
    rotate = bool((start > 0).any())
    if rotate:  # row b's token t moves to (t - start_b) mod T
        gather = ((positions[None, :] + start[:, None]) % length)[..., None].expand_as(x)  # (B, T, I)
        x = x.gather(1, gather)
    packed = pack_padded_sequence(x, lengths.cpu(), batch_first=True, enforce_sorted=False)
    out, state = rnn(packed, state)
    out, _ = pad_packed_sequence(out, batch_first=True, total_length=length)  # (B, T, dirs * H)
    if rotate:
        back = ((positions[None, :] - start[:, None]) % length)[..., None].expand_as(out)
        out = out.gather(1, back)
    return out, state
