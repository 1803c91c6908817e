"""Attention maps as plain data: the weights of one kind of attention over one text, with its tokens.

What the pictures and the page draw, and nothing about the model that produced them:

    kind     self (bidirectional: the encoder, BERT), causal (the decoder, GPT), cross (decoder -> encoder)
    weights  (L, H, T, S) float32: layer, head, query token, key token; each row sums to 1
    tokens   T query labels and S key labels (for self- and causal attention the same text)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attnkit.errors import InputError
from attnkit.models.attention_capture import KINDS

TITLES = {"self": "self-attention", "causal": "causal self-attention", "cross": "cross-attention"}


@dataclass(frozen=True)
class AttentionMaps:
    """One kind of attention over one text. `layers` and `heads` are the model's indices of axes 0 and 1.

    Raises `InputError` when the shapes, tokens and indices disagree.
    """

    kind: str
    weights: np.ndarray  # (L, H, T, S)
    query_tokens: tuple[str, ...]
    key_tokens: tuple[str, ...]
    layers: tuple[int, ...]
    heads: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise InputError(f"attention kind {self.kind!r} is unknown; use one of {', '.join(KINDS)}")
        weights = np.asarray(self.weights, dtype=np.float32)
        object.__setattr__(self, "weights", weights)
        for name in ("query_tokens", "key_tokens", "layers", "heads"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        expected = (len(self.layers), len(self.heads), len(self.query_tokens), len(self.key_tokens))
        if weights.shape != expected:
            raise InputError(
                f"attention weights have shape {weights.shape} but (layers, heads, query tokens, key tokens) = "
                f"{expected}; pass one weight per layer, head, query and key"
            )
        if not self.query_tokens or not self.key_tokens:
            raise InputError("attention maps need at least one query and one key token; the text is empty")
        if self.kind != "cross" and self.query_tokens != self.key_tokens:
            raise InputError(f"{TITLES[self.kind]} attends within one text: query and key tokens must be equal")

    @property
    def title(self) -> str:
        return TITLES[self.kind]

    def head_weights(self, layer: int, head: int | None) -> np.ndarray:
        """(T, S) weights of one model layer and head, or the mean over the heads when `head` is None."""
        row = _position("layer", layer, self.layers)
        if head is None:
            return self.weights[row].mean(axis=0)
        return self.weights[row, _position("head", head, self.heads)]

    def select(self, layers: Sequence[int] | None = None, heads: Sequence[int] | None = None) -> AttentionMaps:
        """These maps restricted to some of their layers and heads (model indices); None keeps all."""
        rows = [_position("layer", i, self.layers) for i in layers or ()]
        cols = [_position("head", i, self.heads) for i in heads or ()]
        weights = self.weights[rows] if layers is not None else self.weights
        weights = weights[:, cols] if heads is not None else weights
        return AttentionMaps(
            self.kind,
            weights,
            self.query_tokens,
            self.key_tokens,
            tuple(layers) if layers is not None else self.layers,
            tuple(heads) if heads is not None else self.heads,
        )


def _position(what: str, index: int, present: tuple[int, ...]) -> int:
    """Where model layer/head `index` sits among `present`; `InputError` when it is not there."""
    if index in present:
        return present.index(index)
    raise InputError(f"{what} {index} is not among these maps' {what}s {list(present)}; pick one of them")
