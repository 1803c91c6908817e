"""Which heads resolve a reference: how often a head's attention from a word goes to the word it refers to.

COGS 150's "The animal didn't cross the street because it was tired": attention relates elements of a sentence, and a
head that relates "it" to its referent puts more of its weight from "it" on "animal" than on "street". Over sentences
whose referent is known (a candidate right, a candidate wrong), a head's referent accuracy is the share of sentences
where its weight from the pronoun on the right candidate exceeds its weight on the wrong one (a tie picks neither). A
head that ignores the two scores 0; one that splits its weight by position alone scores about as often as the right
candidate sits there.

Referent accuracy is relative: a head that looks away from the wrong candidate, putting little weight on either
(0.06 on "street", less on "animal"), picks the right one as surely as a head that points at it. `referent_weight`,
the mean weight on the right candidate, tells the two apart: read them side by side.
"""

from __future__ import annotations

import torch
from torch import Tensor

from attnkit.errors import InputError


def weights_on_candidates(patterns: Tensor, query: Tensor, referent: Tensor, other: Tensor) -> tuple[Tensor, Tensor]:
    """patterns (N, L, H, T, S); query, referent, other (N,) -> each head's weight from `query` on `referent` and on
    `other`, (N, L, H) each.

    Raises InputError where the positions do not fit the patterns or the referent is the other candidate.
    """
    if patterns.dim() != 5:
        raise InputError(f"patterns are (sentences, layers, heads, queries, keys), not {tuple(patterns.shape)}")
    n, _, _, length, keys = patterns.shape
    for name, positions, limit in (("query", query, length), ("referent", referent, keys), ("other", other, keys)):
        if positions.shape != (n,) or positions.min() < 0 or positions.max() >= limit:
            raise InputError(f"{name} positions must be one per sentence ({n}) within 0..{limit - 1}")
    if bool((referent == other).any()):
        raise InputError("a sentence's referent and other candidate are one position: give two candidates")
    rows = torch.arange(n)
    from_query = patterns[rows, :, :, query]  # (N, L, H, S): each head's weights from the pronoun
    return from_query[rows, :, :, referent], from_query[rows, :, :, other]  # (N, L, H) each


def referent_weight(patterns: Tensor, query: Tensor, referent: Tensor, other: Tensor) -> Tensor:
    """patterns (N, L, H, T, S); query, referent, other (N,) -> (L, H): each head's mean weight from `query` on
    `referent` (how much it points at the right candidate, where referent accuracy says only that it weighs it above
    `other`). Raises InputError as `referent_accuracy` does."""
    on_referent, _ = weights_on_candidates(patterns, query, referent, other)  # (N, L, H)
    return on_referent.mean(dim=0)  # (L, H)


def referent_accuracy(patterns: Tensor, query: Tensor, referent: Tensor, other: Tensor) -> Tensor:
    """patterns (N, L, H, T, S): each sentence's attention per layer and head; query, referent, other (N,): the
    pronoun's position, the right candidate's and the wrong one's -> (L, H): the share of sentences where the head's
    weight from `query` on `referent` exceeds its weight on `other`.

    Raises InputError where the positions do not fit the patterns or the referent is the other candidate.
    """
    on_referent, on_other = weights_on_candidates(patterns, query, referent, other)  # (N, L, H) each
    return (on_referent > on_other).float().mean(dim=0)  # (L, H)
