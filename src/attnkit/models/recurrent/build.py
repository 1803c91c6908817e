"""The recurrent families' builders: a `RecurrentLMConfig` or `RecurrentSeq2SeqConfig` becomes modules (registered
in `models/families.py`). Weights start as torch's layers start them, U(-1/sqrt(H), 1/sqrt(H)) and N(0, 1) for
embedding tables, except that a table tied to the output layer starts U(-0.1, 0.1) (`stateful_lm.init_embedding`)."""

from __future__ import annotations

from attnkit.config import RecurrentLMConfig, RecurrentSeq2SeqConfig
from attnkit.models.recurrent.lm import RecurrentLM
from attnkit.models.recurrent.seq2seq import RecurrentSeq2Seq, recurrent_seq2seq


def build_recurrent_lm(config: RecurrentLMConfig) -> RecurrentLM:
    return RecurrentLM(
        vocab_size=config.vocab_size, embedding_dim=config.resolved.embedding_dim, hidden=config.hidden_size,
        n_layers=config.n_layers, cell=config.cell, dropout=config.dropout, tie_embeddings=config.tie_embeddings,
        label_smoothing=config.label_smoothing,
    )


def build_recurrent_seq2seq(config: RecurrentSeq2SeqConfig) -> RecurrentSeq2Seq:
    return recurrent_seq2seq(
        src_vocab_size=config.vocab_size, tgt_vocab_size=config.target_vocab_size,
        embedding_dim=config.resolved.embedding_dim, hidden=config.hidden_size,
        encoder_hidden=config.resolved.encoder_hidden_size,
        n_layers=config.n_layers, cell=config.cell, attention=config.attention, bidirectional=config.bidirectional,
        dropout=config.dropout, tie_embeddings=config.tie_embeddings, share_vocabulary=config.tgt_vocab_size is None,
        additive_dim=config.additive_dim, label_smoothing=config.label_smoothing,
    )
