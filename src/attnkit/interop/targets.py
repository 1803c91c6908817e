"""Which export each model family has (its registration's `exports`), so that a refusal points to one that works,
or says there is none.

    --to-hf      Hugging Face layouts (`keymaps.FAMILIES`): decoders, encoders, encoder-decoders (Marian)
    --to-gguf    llama.cpp generates text: decoders
    --to-onnx    decoders (next-token ones with past keys and values; taggers without), encoders and
                 encoder-decoders (Optimum's three graphs)

Recurrent models (RNN, GRU, LSTM, with or without attention) have none: the three ecosystems run Transformers.
"""

from __future__ import annotations

from attnkit.config import ModelConfig
from attnkit.models import family_of


def elsewhere(config: ModelConfig, *tried: str) -> str:
    """The advice after refusing `tried` (convert flags: those that cannot hold the model for one reason, as GGUF
    cannot hold what no Hugging Face layout holds) for `config`'s family: the other flags that write it, or that none
    does."""
    formats = family_of(config).exports
    others = [flag for flag in (f"--to-{name}" for name in formats) if flag not in tried]
    if not formats:
        return (f"a {config.family} model has no export form: Hugging Face, llama.cpp and onnxruntime run "
                "Transformers, not the recurrent, convolutional or feed-forward baselines; run it with attnkit itself "
                "(generate, translate, serve)")
    if not others:
        return f"nothing else writes a {config.family} model either; run it with attnkit itself"
    return f"use {' or '.join(others)} for it"
