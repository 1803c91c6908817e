"""Synthetic tasks generated from a seed, each with an exactly known answer, for every model family.

    task      source     target
    ab        ABAA       B         the lecture's running example: B if any B occurs, else A
    copy      cadb       cadb
    reverse   cadb       bdac
    sort      cadb       abcd
    add       123+45     168

A decoder learns lines `source=target<eos>` (`lm_ids`) and is scored by completing `source=`; an
encoder-decoder maps source to target (`pairs`); an encoder classifies (`labelled`: tasks whose target is one
symbol, such as `ab`). All use `synthetic_tokenizer()`, one character per token over a fixed alphabet.
"""

from __future__ import annotations

import dataclasses
import random
import string
from collections.abc import Callable, Sequence

import numpy as np

from attnkit.errors import ConfigError
from attnkit.tokenize import CharTokenizer, Tokenizer, require_id

ALPHABET = "AB" + string.digits + string.ascii_lowercase + "+="
SEPARATOR = "="


def synthetic_tokenizer() -> CharTokenizer:
    """The fixed character vocabulary of every synthetic task, with all special tokens (for every family)."""
    return CharTokenizer(ALPHABET, unknown="error")


@dataclasses.dataclass(frozen=True)
class Example:
    source: str
    target: str

    @property
    def prompt(self) -> str:
        """What a decoder is given to complete with the target."""
        return self.source + SEPARATOR

    @property
    def text(self) -> str:
        return self.prompt + self.target


def _ab(rng: random.Random, length: int) -> str:
    seq = ["A"] * length
    if rng.random() < 0.5:  # balanced classes: half contain at least one B
        for i in rng.sample(range(length), rng.randint(1, length)):
            seq[i] = "B"
    return "".join(seq)


def _add(rng: random.Random, n_digits: int) -> str:
    a, b = (rng.randrange(10 ** rng.randint(1, n_digits)) for _ in range(2))
    return f"{a}+{b}"


# name -> the exact answer for a source
SOLVERS: dict[str, Callable[[str], str]] = {
    "ab": lambda s: "B" if "B" in s else "A",
    "copy": lambda s: s,
    "reverse": lambda s: s[::-1],
    "sort": lambda s: "".join(sorted(s)),
    "add": lambda s: str(sum(int(x) for x in s.split("+"))),
}
TASKS = tuple(SOLVERS)


@dataclasses.dataclass(frozen=True)
class SyntheticTask:
    name: str
    examples: tuple[Example, ...]

    def __len__(self) -> int:
        return len(self.examples)

    def pairs(self) -> list[tuple[str, str]]:
        """(source, target) pairs for `PairData.from_pairs`."""
        return [(e.source, e.target) for e in self.examples]

    def labelled(self) -> list[tuple[str, str]]:
        """(text, label) examples for `LabelledData.from_examples`; only for one-symbol targets."""
        if any(len(e.target) != 1 for e in self.examples):
            raise ConfigError(f"task {self.name!r} has multi-symbol targets, so it is no classification; use 'ab'")
        return [(e.source, e.target) for e in self.examples]

    def lm_ids(self, tokenizer: Tokenizer | None = None) -> np.ndarray:
        """One token stream of `source=target<eos>` lines, (N,) int64, for `LMData.from_ids`."""
        tokenizer = tokenizer or synthetic_tokenizer()
        eos = require_id(tokenizer, "eos")
        lines = tokenizer.encode_batch([e.text for e in self.examples])
        return np.fromiter((i for ids in lines for i in (*ids, eos)), dtype=np.int64)

    def score(self, predictions: Sequence[str]) -> float:
        """Exact-match accuracy of `predictions` (one per example, in order)."""
        if len(predictions) != len(self.examples):
            raise ConfigError(f"{len(predictions)} predictions for {len(self.examples)} examples")
        return sum(p == e.target for p, e in zip(predictions, self.examples, strict=True)) / len(self.examples)


def make_task(
    name: str,
    n: int,
    seed: int,
    *,
    min_len: int = 2,
    max_len: int = 8,
    symbols: str = "abcdefghij",
    n_digits: int = 3,
) -> SyntheticTask:
    """`n` examples of task `name`, a pure function of the arguments.

    Sequence tasks draw lengths in [min_len, max_len] over `symbols` (`ab` uses A and B); `add` draws two
    numbers of 1 to `n_digits` digits. Raises `ConfigError` for an unknown task or bad sizes.
    """
    if name not in SOLVERS:
        raise ConfigError(f"unknown synthetic task {name!r}; choose one of {', '.join(TASKS)}")
    if not 1 <= min_len <= max_len or n < 1 or n_digits < 1:
        raise ConfigError(f"need n >= 1, n_digits >= 1 and 1 <= min_len <= max_len (got {n}, {min_len}, {max_len})")
    if not symbols or set(symbols) - set(string.ascii_lowercase):
        raise ConfigError(f"symbols must be lowercase letters, got {symbols!r}")
    rng = random.Random(f"{name}:{seed}")  # a str seed is hashed with SHA-512: stable everywhere
    sources = []
    for _ in range(n):
        length = rng.randint(min_len, max_len)
        if name == "ab":
            sources.append(_ab(rng, length))
        elif name == "add":
            sources.append(_add(rng, n_digits))
        else:
            sources.append("".join(rng.choice(symbols) for _ in range(length)))
    return SyntheticTask(name, tuple(Example(s, SOLVERS[name](s)) for s in sources))
