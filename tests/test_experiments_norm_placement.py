"""norm-placement runs in Xiong et al. (2020)'s setting: their initialisation, and their measurement of the gradient.

Under attnkit's default GPT-2 initialisation every branch starts small, a post-norm stack starts close to the
identity, and its feed-forward gradients come out flat across depth; the experiment once ran there and reported
the opposite of the paper. These tests hold the experiment's own setup to the paper's figure 3.
"""

from __future__ import annotations

import logging
import math
import pickle

import pytest
import torch

from attnkit.experiments import base, norm_placement, run_experiment
from attnkit.experiments.lm_runs import char_corpus
from attnkit.experiments.norm_placement import WIDTH, config, gradients_at_init, paper_init
from attnkit.models import build_model


@pytest.fixture(scope="module")
def corpus():
    return char_corpus(20_000)


def profile(corpus, placement: str, *, depth: int = 8, init=paper_init) -> list[float]:
    torch.manual_seed(0)
    model = build_model(config(depth, placement).replace(vocab_size=corpus.vocab_size))
    if init is not None:
        init(model)
    return gradients_at_init(model, corpus, seed=0)


def test_post_norm_gradients_grow_toward_the_output_and_pre_norm_ones_do_not(corpus):
    """Xiong et al. 2020, figure 3: at initialisation post-LN's FFN gradients are largest near the output."""
    post, pre = profile(corpus, "post"), profile(corpus, "pre")
    assert sum(post[-2:]) > 1.3 * sum(post[:2])
    assert sum(pre[-2:]) < sum(pre[:2])


def test_under_gpt2_init_post_norm_gradients_are_flat_and_small(corpus):
    """Why the earlier run contradicted the paper: with GPT-2's init the branches barely move the residual."""
    post_default, post_paper = profile(corpus, "post", init=None), profile(corpus, "post")
    assert max(post_default) < 1.2 * min(post_default)
    assert max(post_default) < 0.1 * min(post_paper)


def test_measuring_the_gradient_changes_no_weight(corpus):
    torch.manual_seed(0)
    model = build_model(config(2, "post").replace(vocab_size=corpus.vocab_size))
    paper_init(model)
    before = [p.detach().clone() for p in model.parameters()]
    norms = gradients_at_init(model, corpus, seed=0)
    assert len(norms) == 2 and all(n > 0 for n in norms)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_paper_init_is_xavier_with_unit_scale_embeddings(corpus):
    torch.manual_seed(0)
    model = build_model(config(4, "post").replace(vocab_size=corpus.vocab_size))
    paper_init(model)
    block = model.stack.blocks[-1]
    for linear in (block.mlp.up_proj, block.mlp.down_proj):  # no 1/sqrt(2N) shrinking of the residual projection
        fan_out, fan_in = linear.weight.shape
        assert linear.weight.std().item() == pytest.approx(math.sqrt(2 / (fan_in + fan_out)), rel=0.1)
    embedding = model.stack.embeddings.token.weight
    assert embedding.std().item() == pytest.approx(WIDTH**-0.5, rel=0.1)
    assert model.lm_head.weight is embedding  # tied: the output layer keeps the embedding's init


class InProcessPool:
    """ProcessPoolExecutor's `map` run in this process, where what crosses the process boundary (the function with its
    arguments, and each result) is a pickled copy, as it is between processes: a worker's Arms is not the run's."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def __enter__(self) -> InProcessPool:
        return self

    def __exit__(self, *exc) -> None:
        pass

    def map(self, fn, *iterables):
        def copy(value):
            return pickle.loads(pickle.dumps(value))

        return [copy(copy(fn)(*copy(arguments))) for arguments in zip(*iterables, strict=True)]


def test_a_resumed_run_says_how_many_of_its_arms_it_reused_when_workers_ran_them(tmp_path, monkeypatch, caplog):
    """Past the tiny budget each (seed, placement) trains in a worker process with a copy of the run's arms, so the
    run's summary ("reused N of M arms") counted none of them and was never logged; each worker's own "reusing ..."
    lines were all there was. The workers now hand back the arms they reused and ran."""
    monkeypatch.setattr(norm_placement, "ProcessPoolExecutor", InProcessPool)
    monkeypatch.setattr(base, "source_digest", lambda: "the same code")  # whatever else changes in the checkout
    monkeypatch.setitem(norm_placement.SETTINGS, "small", norm_placement.SETTINGS["tiny"])  # workers, tiny sizes
    with monkeypatch.context() as patch:  # Ctrl-C as the picture is drawn: every arm finished, no results written
        patch.setattr(norm_placement, "save", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt))
        with pytest.raises(KeyboardInterrupt):
            run_experiment("norm-placement", budget="small", seeds=2, out=tmp_path)
    arms = len(list((tmp_path / "arms").glob("*.json")))
    assert arms == 2 * 2 * 2 * 2  # seeds x placements x depths x schedules
    with caplog.at_level(logging.INFO, logger="attnkit"):
        run_experiment("norm-placement", budget="small", seeds=2, out=tmp_path)
    summaries = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reused ")]
    assert summaries == [f"reused {arms} of {arms} arms a stopped run had finished"]
