"""The n-gram language model: "estimate this by counting & normalizing" (UT CS 371N, the language-model recap;
COGS 150's statistical learning; Jurafsky & Martin, Speech and Language Processing, ch. 3).

    P(w_t | w_{t-n+1} .. w_{t-1})   the next token given the n - 1 before it, read off counts of the training ids

Two ways to leave probability for what training never showed (every context's distribution sums to 1):

    add-alpha      P(w | c) = (#(c w) + alpha) / (#c + alpha V)             (Laplace at alpha = 1; Lidstone)
    kneser-ney     P(w | c) = (max(#(c w) - d, 0) + d N1+(c .) P(w | c')) / #c        interpolated Kneser-Ney
                   (Kneser & Ney 1995; Chen & Goodman 1998): c' drops c's oldest token; the lower orders count
                   continuations, N1+(. c' w), the distinct tokens seen before c' w, instead of occurrences, and the
                   lowest interpolates with the uniform 1 / V; a context training never showed defers to c'

Kneser-Ney's d is one number for every order, or with `estimate_discounts=True` one per order k from that order's
counts of counts (continuation counts below the top): d_k = n1 / (n1 + 2 n2), n_r the k-grams counted r times (Ney,
Essen & Kneser 1994; Chen & Goodman's D for interpolated KN); where n1 or n2 is 0 the estimate says nothing and
`discount` stands in, as KenLM's --discount_fallback does.

#c is the number of n-grams that start with c (so each context's counts sum to it). Counting is vectorised: each
k-gram is one integer in base V, and a sorted table of them with their counts is searched (`torch.searchsorted`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

import torch
from torch import Tensor

from attnkit.errors import ConfigError, InputError

Smoothing = Literal["add-alpha", "kneser-ney"]
SMOOTHINGS = ("add-alpha", "kneser-ney")
Ids = Tensor | Sequence[int]


class CountTable:
    """Sorted k-gram codes (K,) with a count each (K,) and, per context (the code // V), the counts' total and how
    many k-grams share it: what one order of the model reads."""

    def __init__(self, codes: Tensor, counts: Tensor, vocab_size: int) -> None:
        self.codes, self.counts = codes, counts.double()  # (K,), (K,)
        self.contexts, inverse = torch.unique(codes // vocab_size, return_inverse=True)  # (C,)
        self.totals = torch.zeros(len(self.contexts), dtype=torch.float64).index_add_(0, inverse, self.counts)
        self.distinct = torch.bincount(inverse, minlength=len(self.contexts)).double()  # (C,) N1+(c .)

    @staticmethod
    def lookup(keys: Tensor, values: Tensor, asked: Tensor) -> Tensor:
        """values[i] where keys[i] == asked, 0 where `asked` is not among the sorted `keys`: (Q,) -> (Q,)."""
        if len(keys) == 0:
            return torch.zeros(asked.shape, dtype=torch.float64)
        at = torch.searchsorted(keys, asked).clamp(max=len(keys) - 1)
        return torch.where(keys[at] == asked, values[at], 0.0)

    def count(self, codes: Tensor) -> Tensor:
        return self.lookup(self.codes, self.counts, codes)

    def context(self, contexts: Tensor) -> tuple[Tensor, Tensor]:
        """Each context's total and distinct followers, 0 for a context never seen: (Q,) -> (Q,), (Q,)."""
        return self.lookup(self.contexts, self.totals, contexts), self.lookup(self.contexts, self.distinct, contexts)


class NGramLM:
    """An n-gram language model over token ids 0 .. vocab_size - 1, counted by `fit` and smoothed (module
    docstring). Raises ConfigError for a bad setting, InputError for ids it cannot read."""

    def __init__(
        self, *, n: int, vocab_size: int, smoothing: Smoothing = "add-alpha", alpha: float = 1.0,
        discount: float = 0.75, estimate_discounts: bool = False,
    ) -> None:
        for name, value in (("n", n), ("vocab_size", vocab_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a whole number >= 1")
        if smoothing not in SMOOTHINGS:
            raise ConfigError(f"smoothing={smoothing!r} is not a known choice; use one of {', '.join(SMOOTHINGS)}")
        for name, value in (("alpha", alpha), ("discount", discount)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ConfigError(f"{name}={value!r} must be a number")
        if not 0 < alpha < math.inf:  # an infinite alpha made every probability inf / inf: nan
            raise ConfigError(f"alpha={alpha!r} must be a finite number > 0 (add-alpha leaves alpha for each unseen "
                              "token; 1: Laplace)")
        if not 0 < discount < 1:
            raise ConfigError(f"discount={discount!r} must lie strictly between 0 and 1 (Kneser-Ney's d; 0.75 is "
                              f"usual)")
        if not isinstance(estimate_discounts, bool):
            raise ConfigError(f"estimate_discounts={estimate_discounts!r} must be True or False")
        if vocab_size ** n > torch.iinfo(torch.int64).max:
            raise ConfigError(f"n={n} over vocab_size={vocab_size} makes {vocab_size}^{n} n-grams, more than an int64 "
                              f"code holds; use a smaller n or vocabulary")
        self.n, self.vocab_size, self.smoothing = n, vocab_size, smoothing
        self.alpha, self.discount, self.estimate_discounts = float(alpha), float(discount), estimate_discounts
        self.tables: list[CountTable] = []  # tables[k - 1]: the k-grams (continuations below the top order for KN)
        self.discounts: list[float] = []  # discounts[k - 1]: Kneser-Ney's d at order k (none for add-alpha)

    # Counting ------------------------------------------------------------------------------------------------
    def fit(self, ids: Ids | Sequence[Ids]) -> NGramLM:
        """Count the n-grams (and for Kneser-Ney every lower order) of `ids`: one sequence (N,), or a list of
        sequences whose n-grams never cross from one to the next. Returns the model itself."""
        sequences = self._sequences(ids)
        if not any(len(s) >= self.n for s in sequences):
            raise InputError(f"no sequence has the {self.n} tokens one {self.n}-gram needs; give more text or a "
                             f"smaller n")
        codes, counts = torch.unique(self.every_gram(sequences, self.n), return_counts=True)
        tables = [CountTable(codes, counts, self.vocab_size)]
        if self.smoothing == "kneser-ney":
            for k in range(self.n - 1, 0, -1):  # N1+(. g): the distinct (k + 1)-grams of the text that end in g,
                # every one of them, those at a sequence's start too (no n-gram holds them: Chen & Goodman's N1+)
                wider = torch.unique(self.every_gram(sequences, k + 1))  # (G,) distinct
                lower, continuations = torch.unique(wider % self.vocab_size ** k, return_counts=True)
                tables.insert(0, CountTable(lower, continuations, self.vocab_size))
        self.tables = tables
        kneser_ney = self.smoothing == "kneser-ney"
        self.discounts = [self.order_discount(table.counts) for table in tables] if kneser_ney else []
        return self

    def order_discount(self, counts: Tensor) -> float:
        """d for one order: `discount`, or estimated from its counts (K,) as n1 / (n1 + 2 n2) (module docstring)."""
        n1, n2 = int((counts == 1).sum()), int((counts == 2).sum())
        if not self.estimate_discounts or n1 == 0 or n2 == 0:
            return self.discount
        return n1 / (n1 + 2 * n2)

    def every_gram(self, sequences: list[Tensor], k: int) -> Tensor:
        """Every k-gram of the sequences, none crossing from one to the next, coded in base V: (G,)."""
        return torch.cat([self.codes(s, k) for s in sequences])

    def codes(self, ids: Tensor, k: int) -> Tensor:
        """Each run of k ids as one integer in base V, the oldest token the most significant: (N,) -> (N - k + 1,)."""
        if len(ids) < k:
            return ids.new_zeros(0)
        if k == 0:
            return ids.new_zeros(len(ids) + 1)
        powers = self.vocab_size ** torch.arange(k - 1, -1, -1, dtype=torch.int64)  # (k,)
        return (ids.unfold(0, k, 1) * powers).sum(-1)

    # Scoring ---------------------------------------------------------------------------------------------------
    def log_probs(self, ids: Ids) -> Tensor:
        """log P(ids[t] | the n - 1 ids before it) for t = n - 1 .. N - 1, in nats: (N,) -> (N - n + 1,) float64."""
        ids = self._checked(ids)
        if len(ids) < self.n:
            raise InputError(f"{len(ids)} ids hold no {self.n}-gram to score; give at least n={self.n} ids")
        grams = self.codes(ids, self.n)  # (Q,)
        return self.probability(grams // self.vocab_size, grams % self.vocab_size).log()

    def cross_entropy(self, ids: Ids) -> float:
        """Mean negative log-probability of the ids that follow a full context (nats per token): a loss as the
        trainer's validation loss reads."""
        return -self.log_probs(ids).mean().item()

    def perplexity(self, ids: Ids) -> float:
        """exp(cross entropy): the number of tokens the model is, on average, as unsure as choosing among."""
        return math.exp(self.cross_entropy(ids))

    def next_token_probs(self, context: Ids) -> Tensor:
        """P(w | the last n - 1 ids of `context`) for every w: (V,) float64, summing to 1. Raises InputError for a
        context shorter than n - 1 ids."""
        context = self._checked(context)
        if len(context) < self.n - 1:
            raise InputError(f"a context of {len(context)} ids is shorter than the n - 1 = {self.n - 1} the model "
                             f"reads; give at least {self.n - 1} ids")
        code = self.codes(context[len(context) - (self.n - 1):], self.n - 1)[-1:]  # (1,)
        words = torch.arange(self.vocab_size)
        return self.probability(code.repeat(self.vocab_size), words)  # (V,)

    def probability(self, contexts: Tensor, words: Tensor) -> Tensor:
        """P(word | context) for contexts coded in base V (n - 1 tokens each) and words: (Q,), (Q,) -> (Q,)."""
        if not self.tables:
            raise InputError("the model has counted nothing yet; call fit(ids) first")
        if self.smoothing == "add-alpha":
            top = self.tables[-1]
            together = top.count(contexts * self.vocab_size + words)
            total, _ = top.context(contexts)
            return (together + self.alpha) / (total + self.alpha * self.vocab_size)
        p = torch.full(words.shape, 1.0 / self.vocab_size, dtype=torch.float64)  # the uniform below the unigrams
        # lowest order first: P_k interpolates with P_{k-1}, at its own d
        for k, (table, d) in enumerate(zip(self.tables, self.discounts, strict=True), start=1):
            context = contexts % self.vocab_size ** (k - 1)  # the k - 1 newest tokens of the context
            count = table.count(context * self.vocab_size + words)
            total, distinct = table.context(context)
            seen = total > 0  # an unseen context defers to the order below (alpha 0, gamma 1)
            mixed = ((count - d).clamp(min=0) + d * distinct * p) / total.clamp(min=1)
            p = torch.where(seen, mixed, p)
        return p

    # Sampling --------------------------------------------------------------------------------------------------
    def generate(
        self, prompt: Ids, max_new_tokens: int, *, temperature: float = 1.0, generator: torch.Generator | None = None
    ) -> list[int]:
        """Continue `prompt` (at least n - 1 ids) by sampling `max_new_tokens` ids, one at a time, each from
        P(. | the n - 1 before it) ** (1 / temperature), renormalised. Returns the new ids."""
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
            raise InputError(f"max_new_tokens={max_new_tokens!r} must be a whole number >= 0")
        if not temperature > 0:
            raise InputError(f"temperature={temperature!r} must be > 0 (1: the model's own distribution)")
        ids = self._checked(prompt).tolist()
        for _ in range(max_new_tokens):
            context = ids[max(0, len(ids) - (self.n - 1)):]  # the last n - 1 ids: the whole text is not re-checked
            # p ** (1 / T) renormalised, as a softmax of log p / T: a small T's powers would underflow every weight to 0
            weights = torch.softmax(self.next_token_probs(context).log() / temperature, dim=0)  # (V,)
            ids.append(int(torch.multinomial(weights, 1, generator=generator)))
        return ids[len(ids) - max_new_tokens:] if max_new_tokens else []

    # Inputs ----------------------------------------------------------------------------------------------------
    def _sequences(self, ids: Ids | Sequence[Ids]) -> list[Tensor]:
        if isinstance(ids, Tensor) or hasattr(ids, "__array__") or (isinstance(ids, Sequence) and not any(
                isinstance(item, Tensor | Sequence) for item in ids)):
            return [self._checked(ids)]
        return [self._checked(item) for item in ids]

    def _checked(self, ids: Ids) -> Tensor:
        """`ids` as a 1-D int64 tensor, each within the vocabulary; InputError naming the problem otherwise."""
        try:
            ids = torch.as_tensor(ids)
        except (TypeError, ValueError, RuntimeError) as err:
            raise InputError(f"token ids must be a sequence of integers ({err})") from None
        if ids.dim() != 1 or (ids.numel() and (ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool)):
            raise InputError(f"token ids must be one sequence of integers, not a {ids.dim()}-d {ids.dtype} tensor")
        ids = ids.long()
        if ids.numel() and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise InputError(f"token ids must lie in 0 .. {self.vocab_size - 1} (vocab_size); got "
                             f"{int(ids.min())} .. {int(ids.max())}")
        return ids
