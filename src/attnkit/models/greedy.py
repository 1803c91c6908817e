"""A translation model's own translation of one source, greedily, by whole forward passes (the annotated
Transformer's `greedy_decode`): what the attention pictures (`attnkit.viz`) and the analyses (`attnkit.inspect`)
read when given a source alone. A few dozen tokens at most, where the tokens matter and speed does not;
`attnkit.generate` decodes with a KV cache (`greedy_translate`, held equal to this in tests)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


@torch.no_grad()
def greedy_target(model: nn.Module, source: Sequence[int], *, bos: int, eos: int, max_length: int) -> list[int]:
    """The most likely token at every step given the source (its ids, EOS included) and the tokens written so far,
    one forward pass of `model(src (1, S), tgt (1, T))` a token, until EOS or `max_length` tokens. Returns the
    target tokens without BOS and EOS: empty when the model writes EOS first (each caller says what to give then).
    """
    device = next(model.parameters()).device
    src = torch.tensor([list(source)], device=device)  # (1, S)
    written: list[int] = []
    for _ in range(max_length):
        logits = model(src, torch.tensor([[bos, *written]], device=device)).logits  # (1, T, V)
        token = int(logits[0, -1].argmax())
        if token == eos:
            break
        written.append(token)
    return written
