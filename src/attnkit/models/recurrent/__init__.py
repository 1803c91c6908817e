"""The recurrent baseline: RNN (tanh), GRU and LSTM language models and encoder-decoders without attention, with
Bahdanau's additive attention and with Luong's dot and general attention."""

from attnkit.models.recurrent.attention import SourceAttention
from attnkit.models.recurrent.lm import RecurrentLM
from attnkit.models.recurrent.rnn import RecurrentState, make_rnn, run_rnn
from attnkit.models.recurrent.seq2seq import (
    BahdanauDecoder,
    LuongDecoder,
    PlainDecoder,
    RecurrentEncoder,
    RecurrentSeq2Seq,
    StateBridge,
    recurrent_seq2seq,
)

__all__ = [
    "BahdanauDecoder",
    "LuongDecoder",
    "PlainDecoder",
    "RecurrentEncoder",
    "RecurrentLM",
    "RecurrentSeq2Seq",
    "RecurrentState",
    "SourceAttention",
    "StateBridge",
    "make_rnn",
    "recurrent_seq2seq",
    "run_rnn",
]
