"""The lecture's comparison table as data: the shapes of Vaswani's Transformer, GPT-2, BERT, Llama and Llama 2,
and CPU-sized `-tiny` versions of each family. Nothing here builds a model.

    preset       family           norm         ffn      positions   attention
    vaswani      encoder-decoder  post, Layer  ReLU     sinusoidal  multi-head
    gpt2         decoder          pre, Layer   GELU     learned     multi-head
    bert         encoder          post, Layer  GELU     learned     multi-head
    llama        decoder          pre, RMS     SwiGLU   rotary      multi-head
    llama2-70b   decoder          pre, RMS     SwiGLU   rotary      grouped-query (8 kv heads)
"""

from __future__ import annotations

from typing import Any

from attnkit.config import ModelConfig
from attnkit.errors import ConfigError

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
_TINY = dict(vocab_size=512, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=128, dropout=0.0)

PRESETS: dict[str, dict[str, Any]] = {
    "vaswani-base": _VASWANI,
    "gpt2-124m": _GPT2,
    "bert-base": _BERT,
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
}


def names() -> list[str]:
    """All preset names, in the table's order."""
    return list(PRESETS)


def get(name: str, **overrides: Any) -> ModelConfig:
    """The preset's config, with `overrides` applied (and validated)."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return ModelConfig(**{**PRESETS[name], **overrides})
