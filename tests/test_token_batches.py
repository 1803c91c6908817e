"""Batches by token count (`batch_tokens`): bounded real tokens per batch, every example once an epoch, fixed by
the seed, and a translation run that draws them resumes bit for bit."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_train import request, small_and_single_threaded, train_losses, weights  # noqa: F401 (a fixture)

from attnkit.data.labelled import LabelledData, LabelVocab
from attnkit.data.pairs import PairData
from attnkit.data.synthetic import make_task, synthetic_tokenizer
from attnkit.errors import ConfigError, InputError
from attnkit.train import prepare
from attnkit.train.job import DataConfig

BUDGET = 120  # source + target tokens per batch


@pytest.fixture(scope="module")
def pairs() -> PairData:
    task = make_task("reverse", 600, seed=0, min_len=1, max_len=20)
    return PairData.from_pairs(task.pairs(), synthetic_tokenizer(), batch_size=16, batch_tokens=BUDGET, seed=3)


def real_tokens(batch) -> int:
    return int(batch.src_mask.sum()) + batch.n_tgt_tokens


def test_each_batch_holds_at_most_the_budget_and_short_pairs_come_more_to_a_batch(pairs: PairData) -> None:
    sizes = []
    for index, indices in enumerate(pairs.batch_order(0)):
        batch = pairs.batch(0, index)
        assert real_tokens(batch) == sum(int(pairs.tokens[i]) for i in indices)
        assert real_tokens(batch) <= BUDGET or len(indices) == 1
        sizes.append((float(pairs.lengths[indices].mean()), len(indices)))
    short = [n for length, n in sizes if length < 6]
    long = [n for length, n in sizes if length > 15]
    assert short and long and min(short) > max(long)
    totals = [real_tokens(pairs.batch(0, i)) for i in range(pairs.num_batches)]
    assert np.median(totals) > 0.8 * BUDGET  # batches are filled, not cut early


def test_every_pair_once_an_epoch_and_the_seed_fixes_the_order(pairs: PairData) -> None:
    for epoch in range(3):
        seen = np.concatenate(pairs.batch_order(epoch))
        assert sorted(seen.tolist()) == list(range(len(pairs)))
    assert [b.tolist() for b in pairs.batch_order(0)] != [b.tolist() for b in pairs.batch_order(1)]
    twin = PairData(pairs.src, pairs.tgt, src_pad_id=pairs.src_pad_id, tgt_pad_id=pairs.tgt_pad_id, batch_size=16,
                    batch_tokens=BUDGET, seed=3)
    assert [b.tolist() for b in twin.batch_order(2)] == [b.tolist() for b in pairs.batch_order(2)]
    other_seed = PairData(pairs.src, pairs.tgt, src_pad_id=pairs.src_pad_id, tgt_pad_id=pairs.tgt_pad_id,
                          batch_size=16, batch_tokens=BUDGET, seed=4)
    assert [b.tolist() for b in other_seed.batch_order(2)] != [b.tolist() for b in pairs.batch_order(2)]


def test_an_example_longer_than_the_budget_gets_a_batch_of_its_own() -> None:
    data = PairData([[1] * 30, [1, 2], [1, 2], [1] * 3], [[1] * 30, [1, 2], [1, 2], [1] * 3], src_pad_id=0,
                    tgt_pad_id=0, batch_size=8, batch_tokens=10, seed=0)
    batches = sorted(sorted(b.tolist()) for b in data.batch_order(0))
    assert [0] in batches and sorted(i for b in batches for i in b) == [0, 1, 2, 3]
    assert all(sum(int(data.tokens[i]) for i in b) <= 10 for b in batches if b != [0])
    with pytest.raises(InputError, match="batch_tokens must be >= 1"):
        PairData([[1]], [[1, 2]], src_pad_id=0, tgt_pad_id=0, batch_tokens=0)


def test_labelled_texts_batch_by_tokens_too() -> None:
    ids = [[5] * n for n in range(1, 41)] * 5
    data = LabelledData(ids, [i % 2 for i in range(len(ids))], pad_id=0, label_vocab=LabelVocab(("0", "1")),
                        batch_size=4, batch_tokens=64, seed=1)
    for index, indices in enumerate(data.batch_order(0)):
        assert int(data.batch(0, index).attention_mask.sum()) <= 64 or len(indices) == 1
    assert sorted(np.concatenate(data.batch_order(0)).tolist()) == list(range(len(ids)))


def test_stream_tasks_refuse_batch_tokens() -> None:
    with pytest.raises(ConfigError, match="drop batch_tokens"):
        DataConfig(task="lm", batch_tokens=1000)
    with pytest.raises(ConfigError, match="batch_tokens=0"):
        DataConfig(task="translate", batch_tokens=0)


@pytest.mark.slow
def test_a_translation_run_on_token_batches_resumes_bit_for_bit(tmp_path, monkeypatch) -> None:
    """Epochs of token batches vary in length; the data position (epoch, index) still resumes the very batches,
    across the end of an epoch (100 pairs: about 14 batches an epoch, 24 drawn)."""
    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (100, 48))
    whole, split = tmp_path / "whole", tmp_path / "split"

    def run(out, **kw):
        req = request(out, "translate", max_steps=12, eval_every=6, **kw)
        req.data["batch_tokens"] = 150
        return prepare(req)

    trainer = run(whole)
    assert trainer.task.train.batch_tokens == 150 and trainer.task.val.batch_tokens is None
    trainer.fit()
    assert trainer.task.epoch >= 1
    run(split).fit(stop_at=7)
    run(split, resume=True).fit()
    assert train_losses(split) == train_losses(whole)
    a, b = weights(whole), weights(split)
    for name in a:
        assert torch.equal(a[name], b[name]), name
