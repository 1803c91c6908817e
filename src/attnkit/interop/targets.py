"""Which export each model family has, so that a refusal points to one that works, or says there is none.

    --to-hf      Hugging Face layouts (`keymaps.FAMILIES`): decoders, encoders, encoder-decoders (Marian)
    --to-gguf    llama.cpp generates text: decoders
    --to-onnx    decoders (with past keys and values) and encoders

Recurrent models (RNN, GRU, LSTM, with or without attention) have none: the three ecosystems run Transformers.
"""

from __future__ import annotations

from attnkit.config import ModelConfig

TARGETS = {  # family -> the convert flags that write it
    "decoder": ("--to-hf", "--to-gguf", "--to-onnx"),
    "encoder": ("--to-hf", "--to-onnx"),
    "encoder-decoder": ("--to-hf",),
}


def elsewhere(config: ModelConfig, tried: str) -> str:
    """The advice after refusing `tried` for `config`'s family: the other flags that write it, or that none does."""
    others = [flag for flag in TARGETS.get(config.family, ()) if flag != tried]
    if config.family not in TARGETS:
        return (f"a {config.family} model has no export form: Hugging Face, llama.cpp and onnxruntime run "
                "Transformers, not recurrent networks; run it with attnkit itself (generate, translate, serve)")
    if not others:
        return f"nothing else writes a {config.family} model either; run it with attnkit itself"
    return f"use {' or '.join(others)} for it"
