"""The lecture's comparison table as data: the shapes of Vaswani's Transformer, GPT-2, BERT, Llama and Llama 2,
and CPU-sized `-tiny` versions of each family. Nothing here builds a model.

    preset       family           norm         ffn      positions   attention
    vaswani      encoder-decoder  post, Layer  ReLU     sinusoidal  multi-head
    gpt2         decoder          pre, Layer   GELU     learned     multi-head
    bert         encoder          post, Layer  GELU     learned     multi-head
    llama        decoder          pre, RMS     SwiGLU   rotary      multi-head
    llama2-70b   decoder          pre, RMS     SwiGLU   rotary      grouped-query (8 kv heads)

and the recurrent models the Transformer replaced (issue: the RNN baseline):

    preset             family             cell   layers x width   embedding   attention
    lstm-lm            recurrent-lm       LSTM   2 x 512          512         -           (char-rnn's classic)
    gru-seq2seq        recurrent-seq2seq  GRU    1 x 512          256         none        (the bottleneck)
    gru-attn-seq2seq   recurrent-seq2seq  GRU    1 x 512          256         Bahdanau    (bidirectional encoder:
                                                                                           the Multi30k shape)

and the convolutional one (lecture 004's second type of sequence model):

    preset         family    layers x width   kernel   dilations         receptive field
    gcnn-lm-tiny   conv-lm   4 x 64           3        1, 2, 4, 8        31 tokens   (Dauphin et al. 2017's GLU
                                                                                      blocks, WaveNet's dilations)

and the feed-forward ones the lectures teach before the RNN (UT CS 371N's recap of neural LMs):

    preset           family           reads                                    embedding   hidden
    bengio-lm-tiny   feedforward-lm   the last 8 tokens, concatenated          32          1 x 128 tanh
                                      (Bengio et al. 2003; position-sensitive)
    dan-lm-tiny      feedforward-lm   the mean of every token so far           32          1 x 128 tanh
                                      (a DAN, Iyyer et al. 2015; order-blind)
"""

from __future__ import annotations

from typing import Any

from attnkit.config import (
    ConvLMConfig,
    FeedForwardLMConfig,
    ModelConfig,
    RecurrentLMConfig,
    RecurrentSeq2SeqConfig,
    TransformerConfig,
)
from attnkit.errors import ConfigError, unknown_name

_VASWANI = dict(
    family="encoder-decoder", vocab_size=37000, d_model=512, n_layers=6, n_heads=8, d_ff=2048,
    score="scaled_dot", position="sinusoidal", norm="layer", norm_position="post", activation="relu",
    max_seq_len=512, dropout=0.1, bias=True, tie_embeddings=True, scale_embeddings=True, label_smoothing=0.1,
)
_GPT2 = dict(
    family="decoder", vocab_size=50257, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
    position="learned", norm="layer", norm_position="pre", activation="gelu_tanh", max_seq_len=1024,
    dropout=0.1, bias=True, tie_embeddings=True,
)
_BERT = dict(
    family="encoder", vocab_size=30522, d_model=768, n_layers=12, n_heads=12, d_ff=3072,
    position="learned", norm="layer", norm_position="post", activation="gelu", max_seq_len=512,
    dropout=0.1, bias=True, tie_embeddings=True, norm_eps=1e-12, encoder_head="classify", pooling="cls",
)
_LLAMA = dict(
    family="decoder", vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, d_ff=11008,
    position="rope", norm="rms", norm_position="pre", activation="swiglu", max_seq_len=2048,
    dropout=0.0, bias=False, tie_embeddings=False, norm_eps=1e-6, rope_theta=10000.0,
)
_LSTM_LM = dict(family="recurrent-lm", vocab_size=256, cell="lstm", n_layers=2, hidden_size=512, max_seq_len=256,
                dropout=0.2, tie_embeddings=True)
_GRU_SEQ2SEQ = dict(family="recurrent-seq2seq", vocab_size=8000, cell="gru", n_layers=1, hidden_size=512,
                    embedding_dim=256, max_seq_len=128, dropout=0.3, tie_embeddings=False, attention="none")
_GRU_ATTN_SEQ2SEQ = {**_GRU_SEQ2SEQ, "bidirectional": True, "attention": "bahdanau"}
_TINY = dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128, dropout=0.0)

_FEEDFORWARD_TINY = dict(family="feedforward-lm", vocab_size=512, context="window", context_size=8, embedding_dim=32,
                         hidden_size=128, n_layers=1, max_seq_len=128, dropout=0.0, tie_embeddings=True)
_RECURRENT_TINY = dict(vocab_size=512, hidden_size=64, embedding_dim=32, n_layers=1, max_seq_len=128, dropout=0.0)

PRESETS: dict[str, dict[str, Any]] = {
    "vaswani-base": _VASWANI,
    "gpt2-124m": _GPT2,
    # BERT's segment (A/B) embeddings, LayerNorm after the embeddings and pooler: BertModel's 109,482,240 weights
    "bert-base": {**_BERT, "type_vocab_size": 2, "embedding_norm": True, "pooler": True},
    "llama-7b": _LLAMA,
    "llama2-7b": {**_LLAMA, "max_seq_len": 4096, "norm_eps": 1e-5},
    "llama2-70b": {
        **_LLAMA, "max_seq_len": 4096, "norm_eps": 1e-5, "d_model": 8192, "n_layers": 80, "n_heads": 64,
        "n_kv_heads": 8, "d_ff": 28672,
    },
    "vaswani-tiny": {**_VASWANI, **_TINY},
    "gpt2-tiny": {**_GPT2, **_TINY},
    "bert-tiny": {**_BERT, **_TINY},
    "llama-tiny": {**_LLAMA, **_TINY, "d_ff": 172},
    "llama2-tiny": {**_LLAMA, **_TINY, "d_ff": 172, "n_kv_heads": 2, "norm_eps": 1e-5},
    "lstm-lm": _LSTM_LM,
    "gru-seq2seq": _GRU_SEQ2SEQ,
    "gru-attn-seq2seq": _GRU_ATTN_SEQ2SEQ,
    "rnn-lm-tiny": {**_LSTM_LM, **_RECURRENT_TINY, "cell": "rnn", "embedding_dim": None},
    "lstm-lm-tiny": {**_LSTM_LM, **_RECURRENT_TINY, "embedding_dim": None},
    "gru-seq2seq-tiny": {**_GRU_SEQ2SEQ, **_RECURRENT_TINY},
    "gru-attn-seq2seq-tiny": {**_GRU_ATTN_SEQ2SEQ, **_RECURRENT_TINY},
    "gcnn-lm-tiny": dict(family="conv-lm", vocab_size=512, d_model=64, n_layers=4, kernel_size=3, dilation_base=2,
                         max_seq_len=128, dropout=0.0, tie_embeddings=True),
    "bengio-lm-tiny": _FEEDFORWARD_TINY,
    "dan-lm-tiny": {**_FEEDFORWARD_TINY, "context": "average"},
}


def names() -> list[str]:
    """All preset names, in the table's order."""
    return list(PRESETS)


def get(name: str, **overrides: Any) -> ModelConfig:
    """The preset's config, with `overrides` applied (and validated): a field the preset's family lacks is a
    ConfigError."""
    if name not in PRESETS:
        raise ConfigError(unknown_name("unknown preset", name, PRESETS,
                                       otherwise=f"choose one of {', '.join(PRESETS)}"))
    return ModelConfig(**PRESETS[name]).replace(**overrides)


COLUMNS = ("layers", "width", "heads/kv", "norm", "ffn/cell", "positions", "score/attention")


def summary(config: ModelConfig) -> dict[str, str]:
    """One row of `attnkit presets` for `config`: the COLUMNS, as text ("-" where a family has no such part)."""
    row = dict.fromkeys(COLUMNS, "-")
    if isinstance(config, TransformerConfig):
        resolved = config.resolved
        decoder_layers = getattr(resolved, "n_decoder_layers", None)
        row.update(
            layers=f"{config.n_layers}+{decoder_layers}" if decoder_layers else str(config.n_layers),
            width=str(config.d_model), norm=f"{config.norm_position} {config.norm}",
            positions=config.position, **{"heads/kv": f"{config.n_heads}/{resolved.n_kv_heads}",
                                          "ffn/cell": config.activation, "score/attention": config.score},
        )
    elif isinstance(config, RecurrentSeq2SeqConfig):
        encoder_width = config.resolved.encoder_hidden_size
        encoder = f"{encoder_width}x2" if config.bidirectional else str(encoder_width)
        row.update(layers=f"{config.n_layers}+{config.n_layers}", width=f"{encoder}/{config.hidden_size}",
                   **{"ffn/cell": config.cell, "score/attention": config.attention})
    elif isinstance(config, RecurrentLMConfig):
        row.update(layers=str(config.n_layers), width=str(config.hidden_size), **{"ffn/cell": config.cell})
    elif isinstance(config, ConvLMConfig):
        row.update(layers=str(config.n_layers), width=str(config.d_model),
                   **{"ffn/cell": f"GLU conv k={config.kernel_size}, receptive field {config.receptive_field}"})
    elif isinstance(config, FeedForwardLMConfig):
        reads = f"window of {config.context_size}" if config.context == "window" else "prefix mean"
        row.update(layers=str(config.n_layers), width=f"{config.embedding_dim}/{config.hidden_size}",
                   **{"ffn/cell": f"{config.activation} MLP over the {reads}"})
    return row
