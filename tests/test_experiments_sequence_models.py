"""The sequence-models experiment (lecture 004's recurrence, convolution, attention): its sizes match, its context
measurement sees exactly how far a model reads, and in a world where attention cannot reach past the convolution's
receptive field its check does not come out for the claim."""

import pytest
import torch
from torch import nn

from attnkit.config import ModelConfig
from attnkit.experiments import run_experiment, sequence_models
from attnkit.experiments.lm_runs import RunLog, char_corpus
from attnkit.models import build_model, count_parameters


@pytest.mark.parametrize("budget", sorted(sequence_models.SETTINGS))
def test_each_budget_scores_the_receptive_field_and_the_training_length_at_matched_sizes(budget):
    s = sequence_models.SETTINGS[budget]
    configs = sequence_models.matched_configs(s, vocab=70)
    assert configs["convolution"].receptive_field in s["cuts"] and max(s["cuts"]) == s["seq_len"]
    assert min(s["cuts"]) < configs["convolution"].receptive_field < s["seq_len"]
    sizes = {name: count_parameters(config) for name, config in configs.items()}
    assert all(abs(size / sizes["attention"] - 1) < 0.05 for size in sizes.values()), sizes


def test_loss_by_context_is_flat_past_a_models_reach_and_not_within_it():
    """An untrained convolution scores the same with R tokens as with all of them, and differently with fewer; an
    LSTM, which reads the whole history, scores differently with R tokens than with all."""
    corpus = char_corpus(20_000)
    conv = ModelConfig(family="conv-lm", vocab_size=corpus.vocab_size, d_model=16, n_layers=2, kernel_size=3,
                       dilation_base=2, max_seq_len=32)
    lstm = ModelConfig(family="recurrent-lm", vocab_size=corpus.vocab_size, cell="lstm", n_layers=1, hidden_size=16,
                       max_seq_len=32)
    reach = conv.receptive_field
    measured = {}
    for name, config in (("conv", conv), ("lstm", lstm)):
        torch.manual_seed(0)
        model = build_model(config)
        for p in model.parameters():
            torch.nn.init.normal_(p, 0.0, 0.5)
        measured[name] = sequence_models.loss_by_context(model, corpus, cuts=[2, reach, 32], seq_len=32, windows=8,
                                                         scored=3)
    assert abs(measured["conv"][reach] - measured["conv"][32]) < 1e-5
    assert abs(measured["conv"][2] - measured["conv"][reach]) > 1e-3
    assert abs(measured["lstm"][reach] - measured["lstm"][32]) > 1e-4


def test_attention_that_cannot_reach_past_the_receptive_field_gains_nothing_there(tmp_path, monkeypatch):
    """The false world: every attention layer sees only its last 4 keys, so two layers reach 1 + 2 * 3 = 7 tokens,
    the convolution's receptive field at the tiny budget. The tokens past it then change nothing for attention
    either: its check is no longer for the claim, and the verdict is not held (at `tiny`, where the true world is
    inconclusive too, that holds of any verdict: the verdict's wiring is held by the test below)."""
    built = sequence_models.transformer_config

    def windowed(width: int, seq_len: int, vocab: int) -> ModelConfig:
        return built(width, seq_len, vocab).replace(attention_window=4)

    monkeypatch.setattr(sequence_models, "transformer_config", windowed)
    result = run_experiment("sequence-models", budget="tiny", seeds=2, out=tmp_path)
    (check,) = [c for c in result.checks if c.what.startswith("attention reads past")]
    assert abs(check.difference) < 1e-5 and check.outcome != "for"
    assert result.verdict != "held"
    assert result.rows[1]["reads at most"] == 7


def _world(monkeypatch, *, attention_reads_past_r: bool) -> None:
    """Trained models replaced by the losses a world gives them, so that the checks and the verdict are read alone:
    every model gains 0.5 nats from 2 tokens to the convolution's reach R; the LSTM gains 0.2 more from R to the
    training length, and attention too where it reads past R, where elsewhere the tokens past R cost it 0.05; each
    seed moves a model's losses by up to 0.01."""
    seeds = iter(range(1_000))

    def trained(config, corpus, *, seed, **_):
        return RunLog(model=_Tagged(config.family, next(seeds)))

    def measured(model, corpus, *, cuts, seq_len, **_):
        reach = 7  # the tiny budget's R (test_each_budget_scores_the_receptive_field_and_...)
        past = {"recurrent-lm": 0.2, "decoder": 0.2 if attention_reads_past_r else -0.05}.get(model.family, 0.0)
        jitter = 0.01 * ((model.index * 7) % 5) / 4
        return {cut: 3.0 + jitter + 0.5 * (cut < reach) + past * (cut < seq_len) for cut in cuts}

    monkeypatch.setattr(sequence_models, "train_lm", trained)
    monkeypatch.setattr(sequence_models, "loss_by_context", measured)


class _Tagged(nn.Module):
    def __init__(self, family: str, index: int) -> None:
        super().__init__()
        self.family, self.index = family, index


@pytest.mark.parametrize(("attention_reads_past_r", "verdict", "attention_outcome"),
                         [(True, "held", "for"), (False, "mixed", "against")])
def test_the_verdict_follows_whether_attention_reads_past_the_receptive_field(tmp_path, monkeypatch,
                                                                              attention_reads_past_r, verdict,
                                                                              attention_outcome):
    """The checks wired to the right models' losses: a world where attention and the LSTM gain past R and the
    convolution cannot is held; the same world with attention worse past R is not, its check against the claim."""
    _world(monkeypatch, attention_reads_past_r=attention_reads_past_r)
    result = run_experiment("sequence-models", budget="tiny", seeds=3, out=tmp_path)
    outcomes = {check.what.split(":")[0]: check.outcome for check in result.checks}
    assert outcomes["attention reads past R = 7"] == attention_outcome
    assert outcomes["recurrence reads past R = 7"] == "for"
    assert result.verdict == verdict
