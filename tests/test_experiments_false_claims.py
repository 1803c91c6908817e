"""Each experiment's rule can say no: run in a world where its claim is false, the check that claim rests on comes
out against it (or, where the world makes the things it compares alike, not for it) and the verdict is not "held".
The worlds are changes to what is measured (the data, the model), never to the numbers measured."""

from __future__ import annotations

import types

import pytest
import torch

from attnkit import presets
from attnkit.config import ModelConfig
from attnkit.data import LMData
from attnkit.experiments import (
    ab_task,
    bottleneck,
    gqa_memory,
    heads_specialise,
    kernel_regression,
    lm_runs,
    norm_placement,
    position_extrapolation,
    rnn_transformer_cost,
    run_experiment,
    score_functions,
    transformer_plus_plus,
)
from attnkit.experiments.lm_runs import Corpus
from attnkit.inspect.induction import InductionTask
from attnkit.models import build_model
from attnkit.models.recurrent import recurrent_seq2seq
from attnkit.models.seq2seq import EncoderDecoder


def outcome_of(result, starts: str) -> str:
    """The outcome of the one check whose prediction starts with `starts`."""
    (check,) = [check for check in result.checks if check.what.startswith(starts)]
    return check.outcome


def test_kernel_regression_does_not_hold_where_the_truth_is_flat(tmp_path, monkeypatch):
    """A constant truth is what the plain average estimates best: attention's local averages only add variance, and
    the leave-one-out bandwidth flattens the weights instead of sharpening them."""
    monkeypatch.setattr(kernel_regression, "true_function", torch.ones_like)
    result = run_experiment("kernel-regression", budget="tiny", seeds=12, out=tmp_path)
    assert outcome_of(result, "the plain average's test MSE minus attention's") == "against"
    assert result.verdict == "did not hold at this scale"


def test_ab_task_does_not_hold_for_attention_that_cannot_choose_where_to_look(tmp_path, monkeypatch):
    """A query fixed at zero scores every token alike: the attention pooling is an average of the values, and a lone B
    in 64 tokens is lost to it as to the plain average."""
    built = ab_task.PooledClassifier.__init__

    def fixed_query(self, *, attend: bool) -> None:
        built(self, attend=attend)
        if attend:
            self.query = torch.nn.Parameter(torch.zeros(1, 1, ab_task.DIM), requires_grad=False)

    monkeypatch.setattr(ab_task.PooledClassifier, "__init__", fixed_query)
    result = run_experiment("ab-task", budget="tiny", out=tmp_path)
    assert outcome_of(result, "attention's accuracy at length 64 minus 0.99") == "against"
    assert result.verdict in ("did not hold at this scale", "mixed")


def test_position_extrapolation_does_not_hold_where_the_learned_table_reaches_every_length(tmp_path, monkeypatch):
    """A learned table with a row for every evaluated length does run past the training length."""
    longest = position_extrapolation.SETTINGS["tiny"]["lengths"][-1]

    def longer_table(name: str, **fields):
        if fields.get("position") == "learned":
            fields["max_seq_len"] = longest
        return presets.get(name, **fields)

    monkeypatch.setattr(position_extrapolation, "presets", types.SimpleNamespace(get=longer_table))
    result = run_experiment("position-extrapolation", budget="tiny", out=tmp_path)
    assert outcome_of(result, "learned positions refuse inputs past") == "against"
    assert result.verdict in ("did not hold at this scale", "mixed")


def test_scaled_dot_does_not_hold_where_the_unscaled_scores_shrink_as_d_grows(tmp_path, monkeypatch):
    """The claim is that unscaled softmax saturates *as D grows*. In models whose queries are built (64/D)^2 times
    larger (16 times at D=16, as built at D=64), q . k's spread falls as D grows and the unscaled model's attention
    flattens; its weights stay sharper than the scaled model's, so that comparison alone could not say no. The world
    is the models the experiment builds and trains, not its measurement."""
    built = lm_runs.build_model

    def shrinking_queries(config):
        model = built(config)
        with torch.no_grad():
            for name, module in model.named_modules():
                if name.endswith("q_proj"):
                    module.weight.mul_((64 / config.resolved.head_dim) ** 2)
        return model

    monkeypatch.setattr(lm_runs, "build_model", shrinking_queries)
    result = run_experiment("scaled-dot", budget="tiny", seeds=4, out=tmp_path)
    assert outcome_of(result, "at initialisation: the unscaled model's mean largest attention weight at") == "against"
    assert result.verdict in ("did not hold at this scale", "mixed")


@pytest.mark.slow  # four models trained and timed: about 10 s alone
def test_gqa_memory_does_not_hold_where_every_variant_keeps_all_its_key_value_heads(tmp_path, monkeypatch):
    """Models built with n_kv_heads = n_heads whatever the variant asks keep a cache as large as MHA's: the cache size,
    read from the cache each model allocates, says so."""
    monkeypatch.setattr(gqa_memory, "ModelConfig",
                        lambda **fields: ModelConfig(**{**fields, "n_kv_heads": fields["n_heads"]}))
    result = run_experiment("gqa-memory", budget="tiny", out=tmp_path)
    assert outcome_of(result, "MQA's KV cache is") == "against"
    assert result.verdict in ("did not hold at this scale", "mixed")


def test_score_functions_does_not_call_three_steps_learning(tmp_path):
    """Three steps from initialisation teach no score to attend: "every score learns" is false there, and its check
    does not say it held (below ln V alone, as it once asked, any start is)."""
    result = run_experiment("score-functions", budget="tiny", out=tmp_path)
    assert outcome_of(result, "every score learns") != "for"
    assert result.verdict != "held"


@pytest.mark.slow  # five models trained 60 steps (the additive score's the slowest): about 60 s
def test_score_functions_does_not_hold_where_no_score_attends(tmp_path, monkeypatch):
    """Every score's block with its attention output held at zero learns only what the current character says of the
    next: past character frequencies (the yardstick it once had) in 60 steps, but no further than the block without
    attention."""
    trained = score_functions.train_lm
    monkeypatch.setattr(score_functions, "train_lm",
                        lambda config, corpus, **run: trained(config, corpus,
                                                              **{**run, "init": score_functions.without_attention}))
    monkeypatch.setitem(score_functions.STEPS, "tiny", 60)
    result = run_experiment("score-functions", budget="tiny", out=tmp_path)
    assert outcome_of(result, "every score learns to attend") != "for"
    assert result.verdict != "held"


def test_a_block_without_attention_reads_the_current_token_alone():
    """without_attention: the logits at a position do not change with the tokens before it, and training leaves
    the attention output at zero."""
    config = ModelConfig(family="decoder", d_model=32, n_heads=2, n_layers=2, d_ff=64, position="rope",
                         max_seq_len=16, vocab_size=11)
    corpus = Corpus(LMData.from_ids(torch.randint(0, 11, (400,), generator=torch.Generator().manual_seed(0)).numpy(),
                                    val_fraction=0.2), vocab_size=11)
    model = score_functions.train_lm(config, corpus, steps=3, seq_len=8, init=score_functions.without_attention).model
    model.eval()
    x = torch.tensor([[1, 2, 3, 4, 5], [9, 8, 7, 6, 5]])  # (B, T): the same last token after different contexts
    logits = model(x).logits  # (B, T, V)
    torch.testing.assert_close(logits[0, -1], logits[1, -1])
    attended = build_model(config)
    assert not torch.allclose(attended(x).logits[0, -1], attended(x).logits[1, -1])  # the check could fail
    assert all(not parameter.any() for name, parameter in model.named_parameters() if "o_proj" in name)


@pytest.mark.slow  # sixteen short training runs and their gradients at initialisation: about 40 s
def test_norm_placement_does_not_hold_where_post_norm_is_built_as_pre_norm(tmp_path, monkeypatch):
    """The two placements swapped: where the model called post-norm has its norms before the sublayers (and the one
    called pre-norm after them), its gradients at initialisation shrink toward the output, as pre-norm's do (Xiong et
    al. 2020, figure 3), instead of growing."""
    built = norm_placement.config
    monkeypatch.setattr(norm_placement, "config",
                        lambda depth, placement: built(depth, {"pre": "post", "post": "pre"}[placement]))
    result = run_experiment("norm-placement", budget="tiny", seeds=4, out=tmp_path)
    assert outcome_of(result, "post-norm's FFN gradient at initialisation, last block over first") == "against"
    assert result.verdict in ("did not hold at this scale", "mixed")


@pytest.mark.slow  # six 60-step runs: about 15 s on a busy machine
def test_transformer_plus_plus_does_not_hold_where_the_two_recipes_are_swapped(tmp_path, monkeypatch):
    """The model called Transformer++ built as the original Transformer (post-LayerNorm, ReLU, sinusoidal positions,
    biases) and the one called Vaswani-style built as Transformer++: the loss gap the claim rests on comes out against
    it, and Transformer++ reaches the other's loss at no size (60 steps rather than the tiny budget's 30, where one
    size's gap is about its noise; the ablations, which no check reads, left out)."""
    plus_plus = {size: transformer_plus_plus.plus_plus(*size) for size in transformer_plus_plus.SIZES["tiny"]}
    monkeypatch.setattr(transformer_plus_plus, "plus_plus", transformer_plus_plus.vaswani)
    monkeypatch.setattr(transformer_plus_plus, "vaswani", lambda width, layers: dict(plus_plus[(width, layers)]))
    monkeypatch.setitem(transformer_plus_plus.STEPS, "tiny", 60)
    monkeypatch.setattr(transformer_plus_plus, "INGREDIENTS", {})
    result = run_experiment("transformer-plus-plus", budget="tiny", seeds=3, out=tmp_path)
    assert outcome_of(result, "Vaswani-style validation loss minus Transformer++'s") == "against"
    assert result.key_number == "Transformer++ did not reach the Vaswani-style loss"
    assert result.verdict in ("did not hold at this scale", "mixed")


class NoRepeats(InductionTask):
    """Training batches of uniform random tokens: no second half repeats the first, so nothing rewards induction."""

    def training_ids(self, generator: torch.Generator) -> torch.Tensor:
        return torch.randint(0, self.vocab_size, (self.batch, 2 * self.half), generator=generator)  # (B, 2n)


@pytest.mark.slow  # six 200-step induction runs and six short text runs: about 30 s on a busy machine
def test_heads_specialise_does_not_hold_where_there_is_nothing_to_learn(tmp_path, monkeypatch):
    """Heads trained on uniform random tokens (no repeats in the induction task's batches, random characters for the
    text) have no job to divide: no head's induction score pulls away from the others' as it does on repeated tokens
    (+0.16 +- 0.08 over initialisation after the same 200 steps and 3 seeds), and the verdict is not "held". The
    measurement is the experiment's own, on held-out repeated tokens and the random text's validation split."""
    trained = heads_specialise.train_induction
    monkeypatch.setattr(heads_specialise, "train_induction",
                        lambda model, task, **run: trained(model, NoRepeats(task.vocab_size, task.half, task.shortest,
                                                                            task.batch), **run))
    text = heads_specialise.char_corpus

    def random_characters(max_bytes: int) -> Corpus:
        corpus = text(max_bytes)
        draw = torch.Generator().manual_seed(0)
        ids = torch.randint(0, corpus.vocab_size, (len(corpus.data.tokens),), generator=draw)  # (N,)
        return Corpus(LMData.from_ids(ids.numpy(), val_fraction=0.1), corpus.vocab_size)

    monkeypatch.setattr(heads_specialise, "char_corpus", random_characters)
    monkeypatch.setitem(heads_specialise.SETTINGS, "tiny", {**heads_specialise.SETTINGS["tiny"], "induction": 200})
    result = run_experiment("heads-specialise", budget="tiny", seeds=3, out=tmp_path)
    assert outcome_of(result, "induction task: best induction score minus the other heads' mean") != "for"
    assert result.verdict != "held"


@pytest.mark.slow  # six copy models trained 1,500 steps each: about 5 minutes on a busy 2-core machine
def test_bottleneck_does_not_hold_where_attention_reads_one_vector(tmp_path, monkeypatch):
    """Attention removed from both attention models, built as the experiment builds them: the GRU called "with
    Bahdanau attention" is replaced by one without it (its decoder starts from the encoder's final state alone), and
    the Transformer's encoder hands cross-attention every position as the mean of its states, one vector whatever the
    weights. Every model then copies through a fixed-size vector. The budget is one where the models learn to copy
    (strings of 2 to 10 symbols, 1,500 steps; the tiny budget's 20 steps teach none of them): there, with attention,
    Bahdanau's GRU loses 0.57 +- 0.14 less per-symbol accuracy from 2-4 to 8-10 symbols than the GRU without it (2
    seeds), a check "for" the claim; here +0.04 +- 0.40. The Transformer reading the mean learns to copy little (31%
    per symbol at 2-4 symbols against the plain GRU's 81%), so it loses little with length (its fall-off check is for
    the claim); the start its fall-off is measured from catches it (-0.40 +- 0.32, against), and the verdict is mixed.
    With attention that check is inside its noise (one of the two seeds' Transformers copied well)."""
    encode = EncoderDecoder.encode

    def one_vector(self, src_ids, *, src_mask=None, need_weights=False):
        memory = encode(self, src_ids, src_mask=src_mask, need_weights=need_weights)  # (B, S, C)
        real = (torch.ones_like(src_ids) if src_mask is None else src_mask).to(memory.dtype)[..., None]  # (B, S, 1)
        mean = (memory * real).sum(1, keepdim=True) / real.sum(1, keepdim=True)  # (B, 1, C)
        return mean.expand_as(memory)  # (B, S, C): every key and value the same vector

    built, fields = bottleneck.models, {}

    def recorded(**gru):  # the GRUs' sizes, as the experiment gives them
        fields.update(gru)
        return recurrent_seq2seq(**gru)

    def attention_removed(width: int, vocab_size: int, max_len: int) -> dict:
        models = built(width, vocab_size, max_len)  # built as the experiment builds them: the same initial weights
        models["GRU + Bahdanau attention"] = recurrent_seq2seq(**{**fields, "attention": "none"})
        return models

    monkeypatch.setattr(EncoderDecoder, "encode", one_vector)
    monkeypatch.setattr(bottleneck, "recurrent_seq2seq", recorded)
    monkeypatch.setattr(bottleneck, "models", attention_removed)
    monkeypatch.setitem(bottleneck.SETTINGS, "tiny", dict(lengths=(2, 10), buckets=[(2, 4), (8, 10)], n_train=4000,
                                                          steps=1500, batch=32, width=64))
    result = run_experiment("bottleneck", budget="tiny", out=tmp_path)
    assert outcome_of(result, "per-symbol accuracy lost from 2-4 to 8-10 symbols: without attention minus GRU") != "for"
    assert outcome_of(result, "Transformer copies the shortest strings as well") == "against"
    assert result.verdict != "held"


@pytest.mark.parametrize("drift", [0.03, -0.02])
def test_rnn_vs_transformer_cost_does_not_hold_where_the_machine_drifts_and_t_does_not_matter(drift, tmp_path,
                                                                                             monkeypatch):
    """Timings in which neither model's time per token depends on T, on a machine that slows down (or speeds up) as
    the run goes on: every training step, of either model, 3% slower (2% faster) than the one before. Timed in
    rounds, the two models side by side, the drift moves both models' growth alike, and the Transformer's growth
    beyond the LSTM's is not for the claim; the verdict is not held. No real timing is asserted."""
    taken = []

    def drifting(model, optimizer, batch, length):
        def timed_step():
            taken.append(length)
            return 1e-6 * length * (1 + drift) ** len(taken) * (1 + 0.01 * (len(taken) % 3))

        return timed_step, 1000 * length

    monkeypatch.setattr(rnn_transformer_cost, "prepare_step", drifting)
    result = run_experiment("rnn-vs-transformer-cost", budget="tiny", seeds=3, out=tmp_path)
    assert outcome_of(result, "the Transformer's growth in time per token") != "for"
    assert result.verdict != "held"


@pytest.mark.parametrize(("drift", "control"), [(0.3, "minus"), (-0.2, "plus")])
def test_rnn_vs_transformer_cost_control_catches_a_drift_of_the_transformer_alone(drift, control, tmp_path,
                                                                                 monkeypatch):
    """Timings in which neither model's time per token depends on T, but each of the Transformer's steps is 30%
    slower (20% faster) than its step before, a drift the two models do not share: its time per token seems to grow
    (shrink) with T, and the control catches it on the side the drift takes, since the short length timed again at
    the end of each round changes as much where T does not change; the verdict is not held."""

    transformer_steps = []

    def drifting(model, optimizer, batch, length):
        transformer = not isinstance(model, rnn_transformer_cost.RecurrentLM)

        def timed_step():
            if not transformer:
                return 1e-6 * length
            transformer_steps.append(length)
            return 1e-6 * length * (1 + drift) ** len(transformer_steps) * (1 + 0.01 * (len(transformer_steps) % 3))

        return timed_step, 1000 * length

    monkeypatch.setattr(rnn_transformer_cost, "prepare_step", drifting)
    result = run_experiment("rnn-vs-transformer-cost", budget="tiny", seeds=3, out=tmp_path)
    assert outcome_of(result, "the Transformer's growth in time per token") == ("for" if drift > 0 else "against")
    assert outcome_of(result, f"control, T unchanged (T=16 timed again at the end of each round): 0.25 {control}") \
        == "against"
    assert result.verdict != "held"
