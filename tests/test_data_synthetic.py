"""Synthetic tasks: seeded, exactly answered, and usable by every family."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from attnkit.data.lm import LMData
from attnkit.data.pairs import PairData
from attnkit.data.synthetic import TASKS, make_task, synthetic_tokenizer
from attnkit.errors import ConfigError
from attnkit.tokenize import train_bpe


@pytest.mark.parametrize("name", TASKS)
def test_seeded_and_within_bounds(name: str) -> None:
    task = make_task(name, 300, seed=7, min_len=3, max_len=6)
    assert task == make_task(name, 300, seed=7, min_len=3, max_len=6)
    assert task != make_task(name, 300, seed=8, min_len=3, max_len=6)
    tok = synthetic_tokenizer()  # unknown="error": every character must be in its alphabet
    for e in task.examples:
        assert tok.decode(tok.encode(e.text)) == e.text
        if name != "add":
            assert 3 <= len(e.source) <= 6


def _independent_answer(name: str, source: str) -> str:
    if name == "ab":
        return "A" if set(source) == {"A"} else "B"
    if name == "copy":
        return "".join(c for c in source)
    if name == "reverse":
        return "".join(source[i] for i in range(len(source) - 1, -1, -1))
    if name == "sort":
        counts = {c: source.count(c) for c in set(source)}
        return "".join(c * counts[c] for c in sorted(counts))
    a, b = source.split("+")
    return f"{int(a) + int(b)}"


@pytest.mark.parametrize("name", TASKS)
def test_answers_are_exact(name: str) -> None:
    task = make_task(name, 500, seed=0)
    assert all(e.target == _independent_answer(name, e.source) for e in task.examples)
    assert task.score([e.target for e in task.examples]) == 1.0
    assert task.score([""] * len(task)) == 0.0


def test_ab_is_the_lectures_task_and_balanced() -> None:
    task = make_task("ab", 2000, seed=1, min_len=4, max_len=4)
    assert {e.source for e in task.examples} == {"".join(p) for p in itertools.product("AB", repeat=4)}
    share_b = sum(e.target == "B" for e in task.examples) / len(task)
    assert 0.45 < share_b < 0.55
    assert make_task("ab", 1, seed=1, min_len=4, max_len=4).examples[0].prompt.endswith("=")


def test_addition_digits() -> None:
    task = make_task("add", 1000, seed=2, n_digits=2)
    assert all(len(x) <= 2 for e in task.examples for x in e.source.split("+"))
    assert any(len(e.target) == 3 for e in task.examples)  # carries into a third digit happen


def test_lm_stream_is_lines_ending_in_eos() -> None:
    tok = synthetic_tokenizer()
    task = make_task("sort", 50, seed=0)
    ids = task.lm_ids()
    assert (ids == tok.eos_id).sum() == 50
    assert tok.decode(ids, skip_special=False).split("<eos>")[:-1] == [e.text for e in task.examples]
    data = LMData.from_ids(ids)
    assert len(data.train) + len(data.val) == len(ids)


def test_lm_stream_through_another_tokenizer() -> None:
    task = make_task("add", 30, seed=0)
    tok = train_bpe([e.text for e in task.examples], vocab_size=300)
    ids = task.lm_ids(tok)
    assert ids.dtype == np.int64
    assert tok.decode(ids, skip_special=False).split("<eos>")[:-1] == [e.text for e in task.examples]


def test_pairs_for_the_encoder_decoder() -> None:
    task = make_task("copy", 40, seed=0)
    data = PairData.from_pairs(task.pairs(), synthetic_tokenizer(), batch_size=8)
    assert len(data) == 40 and data.num_batches == 5


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="unknown synthetic task 'parity'; choose one of ab, copy"):
        make_task("parity", 5, seed=0)
    with pytest.raises(ConfigError):
        make_task("copy", 5, seed=0, min_len=5, max_len=2)
    with pytest.raises(ConfigError, match="lowercase"):
        make_task("copy", 5, seed=0, symbols="AB")
    with pytest.raises(ConfigError, match="predictions"):
        make_task("copy", 5, seed=0).score(["a"])
