"""The feed-forward LM family's builder: a `FeedForwardLMConfig` becomes a `FeedForwardLM` (registered in
`models/families.py`)."""

from __future__ import annotations

from attnkit.config import FeedForwardLMConfig
from attnkit.models.feedforward.lm import FeedForwardLM


def build_feedforward_lm(config: FeedForwardLMConfig) -> FeedForwardLM:
    return FeedForwardLM(
        vocab_size=config.vocab_size, embedding_dim=config.embedding_dim, hidden=config.hidden_size,
        n_layers=config.n_layers, context=config.context, context_size=config.context_size,
        activation=config.activation, dropout=config.dropout, tie_embeddings=config.tie_embeddings,
        label_smoothing=config.label_smoothing,
    )
