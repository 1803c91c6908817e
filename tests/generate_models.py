"""Tiny random models for the generation tests, and reference decoders that recompute everything each step.

Weights are drawn with std 0.3 (not the 0.02 of training's initialisation) and the models run in float64, so the
next token depends on every token before it and no two logits are close enough for rounding to swap them.
"""

from __future__ import annotations

import torch

import attnkit
from attnkit.models.greedy import greedy_target as greedy_translate_without_cache  # noqa: F401  (whole passes)

POSITIONS = ("sinusoidal", "learned", "relative", "rope", "alibi", "none")


def tiny_model(family: str = "decoder", *, position: str = "learned", seed: int = 0, **overrides):
    """(model, config): 2 layers, width 32, vocabulary 13, context 24, float64, eval mode."""
    settings = dict(
        family=family, vocab_size=13, d_model=32, n_layers=2, n_heads=4, d_ff=64, max_seq_len=24, position=position,
        relative_max_distance=6,
    )
    config = attnkit.ModelConfig(**{**settings, **overrides})
    torch.manual_seed(seed)
    return randomised(attnkit.build_model(config)), config


@torch.no_grad()
def randomised(model):
    """The model with its matrices drawn again with std 0.3 (from torch's global generator: seed it first), in
    float64 and eval mode (see the module docstring)."""
    for parameter in model.parameters():
        if parameter.dim() > 1:
            parameter.normal_(0.0, 0.3)
    return model.double().eval()


@torch.no_grad()
def greedy_without_cache(model, prompt: list[int], n: int) -> list[int]:
    """Greedy decoding that runs the whole sequence through the model for every new token."""
    ids = list(prompt)
    for _ in range(n):
        logits = model(torch.tensor([ids])).logits[0, -1]
        ids.append(int(logits.argmax()))
    return ids[len(prompt):]
