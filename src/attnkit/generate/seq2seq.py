"""Greedy decoding for an encoder-decoder (translation): encode the source once, then write the target a token
at a time through the decoder's KV cache.

    src (B, S) -> encode -> memory (B, S, C)              computed once
    <bos> -> decode -> y1 -> decode -> y2 ... <eos>       one token per step; the cross-attention keys and
                                                          values of the memory are computed on the first step
                                                          and kept in the cache
Sources are right-padded (the encoder attends both ways, so only the mask matters); every target starts with
BOS at position 0, so targets need no padding.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from attnkit.data.batching import pad
from attnkit.deprecation import warn_renamed
from attnkit.errors import InputError
from attnkit.generate.sampling import (
    GREEDY,
    Repeats,
    SamplingConfig,
    check_drawn,
    hold_back,
    select_next,
    unwritable_ids,
)
from attnkit.layers.kv_cache import KVCache


@dataclass
class Source:
    """Encoded sources: memory (B, S, C) and src_mask (B, S), True at real tokens."""

    memory: Tensor
    src_mask: Tensor

    @property
    def mask(self) -> Tensor:
        """The old name of `src_mask`, with a DeprecationWarning."""
        warn_renamed("Source.mask", "Source.src_mask")
        return self.src_mask

    def repeat(self, k: int) -> Source:
        """Each source k times in a row (for k beams): (B, ...) -> (B * k, ...)."""
        return Source(self.memory.repeat_interleave(k, dim=0), self.src_mask.repeat_interleave(k, dim=0))


def encode_sources(model: nn.Module, sources: Sequence[Sequence[int]], *, pad_id: int) -> Source:
    """Run the encoder once over the right-padded sources. Raises `InputError` for an empty source."""
    if any(len(s) == 0 for s in sources):
        raise InputError("a source sequence is empty; give at least one token per source")
    ids, mask = pad(sources, pad_id, device=next(model.parameters()).device)  # (B, S)
    return Source(model.encode(ids, src_mask=mask), mask)


def decode_step(model: nn.Module, tokens: Tensor, source: Source, cache: KVCache) -> Tensor:
    """Feed the newest target token of each row, tokens (B,); the cache holds the rest. Returns logits (B, V)."""
    out = model.decode(tokens[:, None], source.memory, src_mask=source.src_mask, cache=cache)
    return out.logits[:, -1]


def check_max_length(max_length: int) -> None:
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise InputError(f"max_length={max_length!r} must be a positive integer (target tokens, EOS included)")


@torch.inference_mode()
def greedy_translate(
    model: nn.Module, sources: Sequence[Sequence[int]], *, bos_id: int, eos_id: int, max_length: int, pad_id: int = 0,
    writable: int | None = None, repetition_penalty: float = 1.0, no_repeat_ngram_size: int = 0,
) -> list[list[int]]:
    """The most likely token at every step, until EOS or `max_length` target tokens (EOS counted). `writable`: the
    target tokenizer's size, where the model's vocabulary is padded past it (the ids from it on are never chosen).
    `repetition_penalty` and `no_repeat_ngram_size` act on each step's logits over the target so far, BOS included,
    as transformers' greedy search applies them to an encoder-decoder's decoder input (`sampling.Repeats`).

    Returns each source's target tokens, without BOS and EOS. Raises SamplingError for a bad repetition_penalty or
    no_repeat_ngram_size.
    """
    check_max_length(max_length)
    SamplingConfig(repetition_penalty=repetition_penalty, no_repeat_ngram_size=no_repeat_ngram_size)  # checks them
    source = encode_sources(model, sources, pad_id=pad_id)
    batch = len(sources)
    cache = model.allocate_cache(batch, max_length)
    tokens = torch.full((batch,), bos_id, dtype=torch.long, device=source.memory.device)
    finished = [False] * batch
    targets: list[list[int]] = [[] for _ in range(batch)]
    unwritable = repeats = None
    rows = torch.arange(batch, device=tokens.device)  # (B,)
    for _ in range(max_length):
        logits = decode_step(model, tokens, source, cache)  # (B, V)
        if unwritable is None:  # (U,): a padded vocabulary's ids past the tokenizer's, found once
            unwritable = unwritable_ids(logits.shape[-1], writable, device=logits.device)
            repeats = Repeats.of([[bos_id]] * batch, k=1, penalty=repetition_penalty, n=no_repeat_ngram_size,
                                 vocab_size=logits.shape[-1], device=logits.device)
        if repeats is not None:
            logits = repeats(logits.float())
        tokens = select_next(hold_back(logits, unwritable), GREEDY)  # (B,): NO_TOKEN for nan logits
        if repeats is not None:
            repeats.advance(rows, tokens)
        for row, token in enumerate(check_drawn(tokens.tolist(), model=model)):
            if not finished[row]:
                finished[row] = token == eos_id
                if not finished[row]:
                    targets[row].append(token)
        if all(finished):
            break
    return targets
