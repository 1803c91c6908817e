"""rnn-forgets: the task puts the token to predict exactly d back, the checks catch a recurrent model that never
learned the task and a Transformer that forgets too, and in a world where distance does not matter the verdict is
not "held"."""

from __future__ import annotations

import pytest
import torch

from attnkit.experiments import rnn_forgets, run_experiment
from attnkit.experiments.base import verdict_of


@pytest.mark.parametrize("distance", [1, 2, 5, 16])
def test_each_scored_token_is_the_one_d_back_and_no_nearer_token_tells_it(distance):
    ids, labels = rnn_forgets.recall_batch(torch.Generator().manual_seed(0), 64, distance, 12)
    assert ids.shape == labels.shape == (64, distance + 11)
    scored = labels != -100  # (B, T)
    assert (scored.sum(1) == 12).all() and not scored[:, :distance - 1].any()
    sequence = torch.cat([ids, labels[:, -1:]], 1)  # (B, d + scored): labels[:, t] is the token after ids[:, t]
    for t in range(distance - 1, ids.shape[1]):
        assert torch.equal(labels[:, t], sequence[:, t + 1 - distance])
    if distance > 1:  # the token before the one predicted does not tell it: a fresh draw, right about 1 time in 8
        agree = (labels[:, distance - 1] == ids[:, distance - 1]).float().mean().item()
        assert agree < 0.4


def test_each_seed_is_scored_on_its_own_held_out_sequences_the_same_for_every_model():
    """Held-out sequences shared by every seed would keep their own sampling noise out of the seeds' spread: each
    seed draws its own, from the seed and d alone (so every model of one seed reads the same ones)."""
    first, again, second = (rnn_forgets.held_out(seed, 16, 64, 12) for seed in (0, 0, 1))
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    assert not torch.equal(first[0], second[0])
    training = rnn_forgets.recall_batch(torch.Generator().manual_seed(0), 64, 16, 12)  # seed 0's first training batch
    assert not torch.equal(first[0], training[0])  # held out from what the seed trains on


def accuracies(lstm: tuple[float, float], rnn: tuple[float, float], transformer: tuple[float, float],
               jitter: float = 0.01) -> dict[tuple[str, int], list[float]]:
    """Accuracy per seed (3 seeds, spread by `jitter`) at d=2 and d=64, from each model's (near, far) means."""
    out = {}
    for name, pair in (("LSTM", lstm), ("RNN", rnn), ("Transformer", transformer)):
        for distance, value in zip((2, 64), pair, strict=True):
            out[(name, distance)] = [value - jitter, value, value + jitter]
    return out


def outcome(checks, starts: str, model: str) -> str:
    """The outcome of the one check whose prediction starts with `starts` and names `model`."""
    (check,) = [check for check in checks if check.what.startswith(starts) and f"the {model}" in check.what]
    return check.outcome


def test_the_claim_holds_where_recurrent_models_fall_from_where_the_transformer_starts():
    checks = rnn_forgets.checks(accuracies((1.0, 0.13), (0.98, 0.12), (1.0, 0.99)), 2, 64)
    assert verdict_of(checks)[0] == "held"


def test_a_recurrent_model_that_never_learned_the_task_is_caught_by_the_control():
    """At chance everywhere the RNN loses nothing with distance, and at d=2 it is far short of the Transformer."""
    checks = rnn_forgets.checks(accuracies((1.0, 0.13), (0.125, 0.125), (1.0, 0.99)), 2, 64)
    assert outcome(checks, "the RNN forgets", "RNN") == "inside noise"
    assert outcome(checks, "control", "RNN") == "against" and outcome(checks, "control", "LSTM") == "for"
    assert verdict_of(checks)[0] == "mixed"


def test_a_transformer_that_forgets_too_is_against_the_claim():
    checks = rnn_forgets.checks(accuracies((1.0, 0.13), (1.0, 0.12), (1.0, 0.5)), 2, 64)
    assert outcome(checks, "the Transformer does not forget", "Transformer") == "against"
    assert verdict_of(checks)[0] == "mixed"



def test_a_transformer_short_at_a_middle_distance_but_whole_further_back_has_not_forgotten():
    """The small run's Transformer predicted d=8 at 81% to 97% (not learned in 300 steps) and d=16 to 64 at 100%:
    a dip that does not grow with distance. The checks read d=2 and the longest d, so it keeps the Transformer's
    check for the claim; the same 13 points lost at the longest distance are against it."""
    dip = {**accuracies((1.0, 0.13), (1.0, 0.14), (1.0, 1.0)),
           **{(name, 8): [value - 0.01, value, value + 0.01] for name, value in
              (("LSTM", 0.36), ("RNN", 0.98), ("Transformer", 0.87))}}
    assert outcome(rnn_forgets.checks(dip, 2, 64), "the Transformer does not forget", "Transformer") == "for"
    assert verdict_of(rnn_forgets.checks(dip, 2, 64))[0] == "held"
    far = accuracies((1.0, 0.13), (1.0, 0.14), (1.0, 0.87))
    assert outcome(rnn_forgets.checks(far, 2, 64), "the Transformer does not forget", "Transformer") == "against"

@pytest.mark.slow  # 18 small models trained 300 steps each: 3 to 5 minutes on a busy 2-core machine
def test_rnn_forgets_does_not_hold_where_the_token_d_back_is_also_the_one_just_before(tmp_path, monkeypatch):
    """Distance made irrelevant: each sequence is one symbol repeated, so the token d back is also the token just
    before, and a recurrent model needs to keep one step. The setting is the small budget's at d=2 and d=16, where on
    the real task (the stored run, whose arms at those distances are these: each seeded by its seed and d) the LSTM
    falls from 96% to 13% and the RNN from 100% to 28% while the Transformer predicts both (100%); here neither
    recurrent model's accuracy falls with d, and the verdict is not held."""
    task = rnn_forgets.recall_batch

    def distance_irrelevant(generator, batch, distance, scored):
        ids, labels = task(generator, batch, 1, distance + scored - 1)  # a period of one: every token the same
        labels[:, :distance - 1] = -100  # scored where the real task scores
        return ids, labels

    monkeypatch.setattr(rnn_forgets, "recall_batch", distance_irrelevant)
    monkeypatch.setitem(rnn_forgets.SETTINGS, "tiny", {**rnn_forgets.SETTINGS["small"], "distances": [2, 16]})
    result = run_experiment("rnn-forgets", budget="tiny", seeds=3, out=tmp_path)
    for model in ("LSTM", "RNN"):
        assert outcome(result.checks, f"the {model} forgets", model) != "for"
    assert result.verdict != "held"


def test_the_models_are_built_from_their_configs_at_the_stored_runs_sizes():
    """Each recurrent model is the `recurrent-lm` config's model (the one `attnkit train` builds) whose parameter
    count is closest to the Transformer's, and the sizes are the stored small run's (so its table reads as this
    code builds): all three within 1% of one another, the plain RNN's state the wider for the same count."""
    import json
    from pathlib import Path

    from attnkit.config import RecurrentLMConfig
    from attnkit.models import build_model, count_parameters

    stored = Path(__file__).parents[1] / "docs/experiments/rnn-forgets/results.json"
    if not stored.is_file():
        pytest.skip(f"no stored run at {stored}")
    sizes = {row["model"]: row["parameters"] for row in json.loads(stored.read_text())["rows"]}
    s = rnn_forgets.SETTINGS["small"]
    max_len = max(s["distances"]) + s["scored"]
    size = count_parameters(rnn_forgets.transformer(s["width"], max_len))
    built = {name: rnn_forgets.build(name, s["width"], max_len, size) for name in rnn_forgets.MODELS}
    assert {name: count_parameters(model) for name, model in built.items()} == sizes
    assert all(abs(count / size - 1) < 0.01 for count in sizes.values())
    hidden = {name: built[name].rnn.hidden_size for name in rnn_forgets.RECURRENT}
    assert hidden["RNN"] > hidden["LSTM"]  # an LSTM's 4 gates to an RNN's 1: the narrower state for the count
    for name, cell in rnn_forgets.RECURRENT.items():
        config = RecurrentLMConfig(vocab_size=rnn_forgets.VOCAB, embedding_dim=s["width"], hidden_size=hidden[name],
                                   n_layers=1, cell=cell)
        assert count_parameters(build_model(config)) == sizes[name]
