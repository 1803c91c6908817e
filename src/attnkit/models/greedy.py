"""A translation model's sentence pair as it reads one, for the attention pictures (`attnkit.viz`), the analyses
(`attnkit.inspect`) and the explorer (`attnkit.serve`): the source with EOS for the encoder, and a target given or,
for a source alone, the model's own translation, greedily, by whole forward passes (the annotated Transformer's
`greedy_decode`). A few dozen tokens at most, where the tokens matter and speed does not; `attnkit.generate`
decodes with a KV cache (`greedy_translate`, held equal to `greedy_target` in tests).

    source     x1 x2 ... EOS          the encoder's input
    target     BOS y1 y2 ... EOS      the decoder reads target[:-1] (BOS y1 y2 ...) and predicts target[1:]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from attnkit.errors import InputError
from attnkit.tokenize import Tokenizer, encode_some, require_id


class EmptyTranslation(InputError):
    """The model's own translation of a source is empty: it writes EOS first. `instead`: what to give in its place."""

    def __init__(self, instead: str) -> None:
        super().__init__(f"the model's own translation of the source is empty (it writes EOS first): {instead}")


@dataclass(frozen=True)
class TranslationPair:
    """One source and its target as token ids: `source` ends with EOS; `written` is the target without BOS and
    EOS (given, or the model's own translation)."""

    source: list[int]
    written: list[int]
    bos: int
    eos: int

    @property
    def decoder_input(self) -> list[int]:
        """What the decoder reads: BOS, then the target."""
        return [self.bos, *self.written]

    @property
    def predicted(self) -> list[int]:
        """What the decoder predicts at each position: the target, then EOS."""
        return [*self.written, self.eos]

    @property
    def target(self) -> list[int]:
        """BOS, the target, EOS: `decoder_input` and `predicted` in one row, as training's pairs hold it."""
        return [self.bos, *self.written, self.eos]


def translation_pair(model: nn.Module, tokenizer: Tokenizer, source: str, target: str | Sequence[int] | None, *,
                     max_length: int, instead: str, context: int | None = None) -> TranslationPair:
    """`source` and `target` as `model` reads them, each encoded once; `target` a text, or token ids taken as they
    are (another pair's target), or None: the model's own greedy translation of at most `max_length` tokens
    (`greedy_target`). `context`: the model's max_seq_len, which the
    encoder's input (the source with EOS, checked before any decoding step) and the decoder's (BOS and the target)
    must fit; the model's own translation stops where BOS and it fill the context.

    Raises InputError for a tokenizer without BOS or EOS, a source or given target longer than `context`, a source
    of no token (`encode_some`) and a given target of no tokens; EmptyTranslation (an InputError) when the model's
    own translation is empty, its message ending with `instead` (what the caller's user gives in its place, e.g.
    "give --target TEXT")."""
    eos, bos = require_id(tokenizer, "eos"), require_id(tokenizer, "bos")
    ids = [*encode_some(tokenizer, source, "the source"), eos]
    check_fits(ids, "source with EOS", context)
    if target is None:
        room = max_length if context is None else min(max_length, context - 1)  # BOS and the tokens written
        written = greedy_target(model, ids, bos=bos, eos=eos, max_length=room)
        if not written:
            raise EmptyTranslation(instead)
    else:
        written = tokenizer.encode(target) if isinstance(target, str) else [int(i) for i in target]
        if not written:
            raise InputError(f"the target {target!r} becomes no tokens: give a non-empty target")
        check_fits([bos, *written], "target with BOS", context)
    return TranslationPair(ids, written, bos, eos)


def check_fits(ids: list[int], what: str, context: int | None) -> None:
    """InputError naming `what` when its `ids` are more than the `context` (max_seq_len) the model reads."""
    if context is not None and len(ids) > context:
        raise InputError(f"the {what} has {len(ids)} tokens; this model reads at most {context} (max_seq_len): "
                         "shorten it")


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
