"""The analyses on models whose answer is known: a two-layer attention-only decoder trained on repeated random
tokens has an induction head, which the detector names, whose ablation costs the repeated half its loss and whose
patch restores the answer; a probe finds a planted linear feature and not its control task; the logit lens's last
layer is the model's own logits; the tuned lens reads every layer closer to the final distribution than the logit lens
and keeps a translator at the identity where a layer's stream is already the last's."""

import copy
import json
import logging

import pytest
import torch
from safetensors.torch import load_file, save_file

from attnkit.config import ModelConfig
from attnkit.errors import CheckpointError, InputError
from attnkit.inspect import patch
from attnkit.inspect.attribution import attribute_heads, attribute_stream, attribute_sublayers
from attnkit.inspect.head_types import head_types, monotonicity, repeat_periods, repeat_types, self_scores
from attnkit.inspect.importance import head_importance
from attnkit.inspect.induction import InductionTask, attention_only_decoder, train_induction
from attnkit.inspect.inputs import Batch, lm_batch, token_losses
from attnkit.inspect.logit_attribution import logit_attribution
from attnkit.inspect.logit_lens import logit_lens
from attnkit.inspect.patching import logit_difference, logit_differences, patch_heads, patch_stream
from attnkit.inspect.path_patching import path_patch
from attnkit.inspect.probes import control_labels, majority, probe
from attnkit.inspect.tuned_lens import (
    CONFIG_FILE,
    SCORED_TOKENS,
    WEIGHTS_FILE,
    lens_divergences,
    load_tuned_lens,
    output_digest,
    save_tuned_lens,
    train_tuned_lens,
    tuned_lens,
)
from attnkit.layers.attention import Attention
from attnkit.models import build_model
from attnkit.models.recurrent import recurrent_seq2seq

INDUCTION = 0.5  # an induction head puts at least half its weight on the token after the earlier copy
TASK = InductionTask(vocab_size=24, half=8, shortest=4, batch=32)


@pytest.fixture(scope="module")
def induction_model():
    """Layer 0: four heads; layer 1: one head, which has to become the induction head for the repeated half to be
    predictable (400 steps, about 3 s on one core; halves of 4 to 8 tokens, so no fixed offset finds the copy)."""
    torch.manual_seed(0)
    model = attention_only_decoder(vocab_size=TASK.vocab_size, d_model=32, n_heads=(4, 1), max_seq_len=2 * TASK.half)
    train_induction(model, TASK, steps=400, lr=1e-2)
    return model


@pytest.fixture(scope="module")
def held_out():
    return TASK.ids(torch.Generator().manual_seed(5), batch=32)


def test_the_model_learned_to_copy_the_repeated_half(induction_model, held_out):
    first, repeated = TASK.half_losses(induction_model, held_out)
    assert repeated < 0.6 < 2.5 < first  # the first half is random (ln 24 = 3.2); the second is copied


def test_the_detector_names_the_induction_head_and_no_other(induction_model, held_out):
    found = head_types(induction_model, held_out)
    site, head, score = found.best("induction")
    assert (site, head) == ("blocks.1.attn", 0) and score > INDUCTION
    others = found.scores["induction"][0]  # layer 0's four heads
    assert bool((others < INDUCTION).all())
    assert found.types[1][0] == "induction"


def test_over_several_periods_the_induction_head_is_still_typed_induction(induction_model):
    assert repeat_periods(8) == (8, 5, 3) and repeat_periods(20) == (20, 13, 8)
    found = repeat_types(induction_model, TASK.vocab_size, periods=(8, 5, 4),
                         generator=torch.Generator().manual_seed(2))
    assert found.types[1][0] == "induction" and found.best("induction")[:2] == ("blocks.1.attn", 0)
    assert "induction" not in found.types[0]


def test_ablating_the_induction_head_alone_costs_the_repeated_half(induction_model, held_out):
    batch = lm_batch(held_out)
    labels = batch.labels.clone()
    labels[:, : TASK.half] = -100  # score the repeated half's predictions only
    importance = head_importance(induction_model, Batch(batch.args, labels))
    first, repeated = TASK.half_losses(induction_model, held_out)
    assert importance.baseline == pytest.approx(repeated, abs=0.05)
    rise = importance.scores[1, 0]
    assert rise > 0.5 * (first - repeated)  # back up at least halfway to the first half's loss
    assert bool((importance.scores[0] < 0.25 * rise).all())  # no layer-0 head alone matters as much
    assert importance.top(1)[0][:2] == ("blocks.1.attn", 0)


def test_patching_the_induction_head_restores_the_answer(induction_model, held_out):
    clean = held_out[:8]
    corrupted = clean.clone()
    corrupted[:, : TASK.half] = TASK.ids(torch.Generator().manual_seed(9), batch=8)[:, : TASK.half]  # new first half
    answer = clean[:, -1]  # x_n, which the last input position (x_(n-1), repeated) predicts by induction
    batch_clean, batch_corrupted = Batch((clean[:, :-1],)), Batch((corrupted[:, :-1],))
    wrong = (answer + 1) % TASK.vocab_size
    heads = patch_heads(induction_model, batch_clean, batch_corrupted, answer=answer, wrong=wrong)
    assert heads.clean > heads.corrupted
    assert heads.restored[1, 0] > 0.7
    assert heads.restored[1, 0] == heads.restored.nan_to_num(-1).max()
    # position by position: the last layer's head writes the answer where it is read and nowhere else counts
    by_position = patch_heads(induction_model, batch_clean, batch_corrupted, answer=answer, wrong=wrong,
                              by_position=True)
    assert by_position.restored.shape == (2, 2 * TASK.half - 1, 4)
    assert bool(by_position.restored[1, :, 1:].isnan().all())  # layer 1 has one head
    assert float(by_position.restored[1, -1, 0]) == pytest.approx(float(heads.restored[1, 0]), abs=1e-4)
    assert float(by_position.restored[1, :-1, 0].abs().max()) < 1e-5
    with pytest.raises(InputError, match="'attn' is none of resid_pre, attn.out and mlp.out"):
        patch_stream(induction_model, batch_clean, batch_corrupted, answer=answer, wrong=wrong, point="attn")
    stream = patch_stream(induction_model, batch_clean, batch_corrupted, answer=answer, wrong=wrong)
    assert stream.restored.shape == (2, 2 * TASK.half - 1)
    # the answer x_n sits at position n - 1, after the earlier copy of the last token x_(n-1): patched there, the
    # stream entering the induction head's layer brings the answer back, and no other position does as much
    assert int(stream.restored[1].argmax()) == TASK.half - 1 and stream.restored[1, TASK.half - 1] > 0.5


def test_the_logit_lens_reads_the_copied_answer_only_after_the_induction_head(induction_model, held_out):
    """On the repeated half the next token is the one after the current token's earlier copy: neither the embeddings
    nor layer 0's heads (which see only the previous token) hold it, so read there the lens guesses at chance (1/24);
    after layer 1, whose induction head copies it, the lens reads it as the model does."""
    ids, targets = held_out[:, :-1], held_out[:, 1:]
    lens = logit_lens(induction_model, ids)
    repeated = slice(TASK.half, None)  # positions n..2n-2: each predicts a token of the repeated half
    hits = (lens.logits[:, :, repeated].argmax(-1) == targets[:, repeated]).float().mean((1, 2))  # (L + 1,)
    assert lens.layers == ["blocks.0.resid_pre", "blocks.0.resid_post", "blocks.1.resid_post"]
    assert hits[0] < 0.15 and hits[1] < 0.15 < 0.7 < hits[2]


def test_direct_logit_attribution_credits_the_induction_head_with_the_copied_answer(induction_model, held_out):
    """The last position's answer x_n is copied by the induction head alone: its direct share is most of the logit
    difference against another token, and no other writer (embeddings, layer 0's heads, biases) comes near it."""
    answer = held_out[:, -1]
    found = logit_attribution(induction_model, held_out[:, :-1], answer=answer, wrong=(answer + 1) % TASK.vocab_size)
    shares = dict(zip(found.names, found.values.mean(1).tolist(), strict=True))  # each writer's mean share
    induction = shares.pop("blocks.1.attn head 0")
    assert induction > 0.9 * float(found.total.mean()) > 0
    assert max(abs(v) for v in shares.values()) < 0.1 * induction


@pytest.mark.parametrize("analysis", [
    lambda model, a, b: patch_heads(model, a, b, answer=1, wrong=2),
    lambda model, a, b: patch_stream(model, a, b, answer=1, wrong=2),
    lambda model, a, b: attribute_heads(model, a, b, answer=1, wrong=2),
    lambda model, a, b: path_patch(model, a, b, sender=("blocks.0.attn", 0), receiver=("blocks.1.attn", 0), via="q",
                                   metric=lambda logits: float(logits[:, -1, 1].mean())),
    lambda model, a, b: head_importance(model, a),
])
def test_token_ids_where_a_batch_is_taken_are_refused_naming_how_to_make_one(induction_model, held_out, analysis):
    ids = held_out[:2]
    with pytest.raises(InputError, match=r"is a tensor of shape \(2, 16\), where the analyses take a Batch: "
                       r"Batch\(\(ids,\)\) runs the model on token ids"):
        analysis(induction_model, ids, ids)


@pytest.mark.parametrize(("target", "message"), [
    ({"answer": 99}, r"answer=99 is outside the model's 24 outputs \(ids 0..23\): give ids from its tokenizer"),
    ({"wrong": -1}, r"wrong=-1 is outside the model's 24 outputs"),
    ({"answer": torch.tensor([1, 2, 3])}, r"answer=\[1, 2, 3\] must be one token or class id, or one per row of the "
     r"batch \(2\)"),
    ({"answer": 1.5}, "answer=1.5 must be one token or class id"),
    ({"position": 15}, "position 15 is out of range"),
])
@pytest.mark.parametrize("analysis", [
    lambda model, ids, target: patch_heads(model, Batch((ids,)), Batch((ids.flip(1),)), **target),
    lambda model, ids, target: attribute_heads(model, Batch((ids,)), Batch((ids.flip(1),)), **target),
    lambda model, ids, target: logit_attribution(model, ids, **target),
])
def test_an_answer_or_position_the_logits_have_not_is_refused(induction_model, held_out, analysis, target, message):
    with pytest.raises(InputError, match=message):
        analysis(induction_model, held_out[:2, :-1], {"answer": 1, "wrong": 2, **target})  # ids (2, 15)


def test_a_probe_reads_a_planted_feature_and_not_its_control_task():
    generator = torch.Generator().manual_seed(0)
    features = torch.randn(800, 16, generator=generator)  # (N, C)
    direction = torch.randn(16, generator=generator)
    labels = (features @ direction > 0).long()  # a linear feature, planted
    types = torch.randint(0, 200, (800,), generator=generator)  # word types the features know nothing of
    result = probe(features, labels, types, steps=150)
    assert result.accuracy > 0.9
    assert result.control_accuracy < 0.65  # chance for two near-balanced classes: 0.5
    assert result.selectivity > 0.3


def test_control_labels_give_each_type_one_label_from_the_label_distribution():
    types = torch.tensor([0, 1, 0, 2, 1, 0] * 50)
    labels = torch.tensor([0, 1, 1, 2, 1, 0] * 50)
    control = control_labels(types, labels, generator=torch.Generator().manual_seed(1))
    for t in range(3):
        assert control[types == t].unique().numel() == 1
    assert set(control.tolist()) <= {0, 1, 2}


@pytest.mark.parametrize("family", ["decoder", "encoder-decoder", "encoder"])
def test_the_logit_lens_last_layer_is_the_models_own_logits(family):
    torch.manual_seed(0)
    head = {"encoder_head": "mlm"} if family == "encoder" else {}
    model = build_model(ModelConfig(family=family, vocab_size=30, d_model=16, n_heads=2, d_ff=32, max_seq_len=16,
                                    n_layers=2, **head)).eval()
    ids = torch.randint(0, 30, (2, 7))
    args = (ids, ids[:, :5]) if family == "encoder-decoder" else (ids,)
    lens = logit_lens(model, *args)
    with torch.no_grad():
        expected = model(*args).logits
    assert len(lens.layers) == 3
    torch.testing.assert_close(lens.logits[-1], expected, rtol=0, atol=0)
    assert bool((lens.ranks()[-1] == 0).all())
    assert not torch.allclose(lens.logits[0], expected)


def test_the_logit_lens_refuses_a_model_without_an_output_layer_over_a_stack():
    model = recurrent_seq2seq(src_vocab_size=10, tgt_vocab_size=10, embedding_dim=8, hidden=8, encoder_hidden=8,
                              n_layers=1, cell="gru", attention="luong-dot")
    with pytest.raises(InputError, match="logit lens"):
        logit_lens(model, torch.zeros(1, 3, dtype=torch.long), torch.zeros(1, 2, dtype=torch.long))


def test_head_type_scores_on_hand_made_patterns():
    ids = torch.tensor([[5, 6, 7, 5, 6, 7]])
    previous = torch.zeros(1, 1, 6, 6)
    previous[0, 0, 0, 0] = 1
    previous[0, 0, torch.arange(1, 6), torch.arange(0, 5)] = 1  # each query on the token before it
    induction = torch.zeros(1, 1, 6, 6)
    induction[0, 0, torch.arange(6), torch.arange(6)] = 1
    induction[0, 0, torch.arange(3, 6), torch.arange(1, 4)] = torch.tensor([1.0, 1.0, 1.0])
    induction[0, 0, torch.arange(3, 6), torch.arange(3, 6)] = 0  # the repeated half on the successor of its copy
    scores = self_scores(torch.cat((previous, induction), dim=1), ids)
    assert scores["previous"].tolist() == [1.0, pytest.approx(0.0)]
    assert scores["induction"].tolist() == [pytest.approx(0.0), 1.0]
    diagonal = torch.eye(5).expand(1, 2, 5, 5).clone()  # head 0 monotone; head 1 jumps back and forth
    diagonal[0, 1] = torch.eye(5)[[0, 3, 1, 4, 2]]
    assert monotonicity(diagonal).tolist() == [1.0, 0.5]


def test_resample_ablation_takes_another_row_never_the_rows_own(induction_model, held_out):
    # two rows: each row's head output can only come from the other, so the score equals the swap made by hand
    batch = lm_batch(held_out[:2])
    found = head_importance(induction_model, batch, ablation="resample")
    clean = batch.run(induction_model, names=["blocks.1.attn.z"])
    swapped = batch.run(induction_model, edits={"blocks.1.attn.z": patch(clean["blocks.1.attn.z"].flip(0), head=0)})
    by_hand = token_losses(batch.logits(swapped.output), batch.labels).nanmean() - found.baseline
    assert found.scores[1, 0] == pytest.approx(float(by_hand), abs=1e-6)
    assert found.scores[1, 0] > 0.1


def test_a_probe_reports_the_control_tasks_majority_baseline():
    generator = torch.Generator().manual_seed(0)
    labels = (torch.rand(600, generator=generator) < 0.1).long()  # a skewed label set: nine in ten are 0
    types = torch.randint(0, 60, (600,), generator=generator)
    features = torch.randn(600, 8, generator=generator)
    train = torch.rand(600, generator=generator) < 0.8
    result = probe(features, labels, types, train=train, steps=50, seed=4)
    control = control_labels(types, labels, generator=torch.Generator().manual_seed(4))  # as the probe draws them
    assert result.control_majority == pytest.approx(majority(control, train))
    assert result.control_majority > 0.6 and result.row()["control majority"] == round(result.control_majority, 4)


def _ranks(values: torch.Tensor) -> torch.Tensor:
    """Each value's rank, tied values sharing their mean rank (as scipy.stats.rankdata)."""
    _, inverse, counts = values.unique(return_inverse=True, return_counts=True)
    return (counts.cumsum(0) - (counts + 1) / 2).double()[inverse]


def _rank_correlation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Spearman's: the correlation of the values' ranks (NaN cells dropped)."""
    keep = ~(a.isnan() | b.isnan())
    return float(torch.corrcoef(torch.stack([_ranks(a[keep]), _ranks(b[keep])]))[0, 1])


def _induction_pair(held_out):
    clean = held_out[:8]
    corrupted = clean.clone()
    corrupted[:, : TASK.half] = TASK.ids(torch.Generator().manual_seed(9), batch=8)[:, : TASK.half]
    answer = clean[:, -1]
    return Batch((clean[:, :-1],)), Batch((corrupted[:, :-1],)), answer, (answer + 1) % TASK.vocab_size


def test_attribution_patching_finds_the_induction_circuit_activation_patching_finds(induction_model, held_out):
    clean, corrupted, answer, wrong = _induction_pair(held_out)
    heads = attribute_heads(induction_model, clean, corrupted, answer=answer, wrong=wrong)
    patched = patch_heads(induction_model, clean, corrupted, answer=answer, wrong=wrong)
    assert heads.rows == patched.rows and heads.restored.shape == patched.restored.shape
    assert heads.clean == pytest.approx(patched.clean) and heads.corrupted == pytest.approx(patched.corrupted, abs=1e-5)
    # ranked first by both (the layer-0 heads' shares, all below 0.07, rank in no stable order)
    assert heads.restored.nan_to_num(-1).argmax() == patched.restored.nan_to_num(-1).argmax() == 4
    integrated = attribute_heads(induction_model, clean, corrupted, answer=answer, wrong=wrong, steps=8)
    assert integrated.restored[1, 0] == pytest.approx(float(patched.restored[1, 0]), abs=0.05)
    # the linear estimate is the first-order term written out with autograd: (z_clean - z_corrupted) . d metric / d z
    # at the corrupted run, summed over the batch (a batch mean divided twice would give an eighth of it here)
    z_clean = clean.run(induction_model, names=["blocks.1.attn.z"])["blocks.1.attn.z"].flatten(-2)  # (B, T, H*D)
    kept = {}

    def differentiable(module, args):
        kept["z"] = args[0].detach().requires_grad_()
        return (kept["z"],)

    handle = induction_model.stack.blocks[1].self_attn.o_proj.register_forward_pre_hook(differentiable)
    try:
        logits = induction_model(*corrupted.args).logits[:, -1]  # (B, V)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad((logits.gather(1, answer[:, None]) - logits.gather(1, wrong[:, None])).mean(),
                                  kept["z"])
    first_order = float(((z_clean - kept["z"]) * grad).sum().detach()) / (patched.clean - patched.corrupted)
    assert float(heads.restored[1, 0]) == pytest.approx(first_order, rel=1e-4, abs=1e-5)
    stream = attribute_stream(induction_model, clean, corrupted, answer=answer, wrong=wrong, steps=4)
    exact = patch_stream(induction_model, clean, corrupted, answer=answer, wrong=wrong)
    assert int(stream.restored[1].argmax()) == int(exact.restored[1].argmax()) == TASK.half - 1
    # completeness: the integrated shares over a whole point sum to what patching the whole point restores
    whole = Batch((corrupted.args[0],)).run(induction_model, edits={"blocks.1.resid_pre": patch(
        clean.run(induction_model, names=["blocks.1.resid_pre"])["blocks.1.resid_pre"])})
    gap = exact.clean - exact.corrupted
    restored = (logit_difference(whole.output.logits, answer, wrong) - exact.corrupted) / gap
    assert float(stream.restored[1].sum()) == pytest.approx(restored, abs=0.02)


def test_attribution_patching_agrees_with_activation_patching_on_a_random_gpt2():
    torch.manual_seed(0)
    model = build_model(ModelConfig(family="decoder", vocab_size=50, d_model=64, n_heads=4, d_ff=256, n_layers=3,
                                    max_seq_len=32, position="learned")).eval()
    generator = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 50, (4, 12), generator=generator)
    corrupted_ids = ids.clone()
    corrupted_ids[:, 2:5] = torch.randint(0, 50, (4, 3), generator=generator)
    clean, corrupted = Batch((ids,)), Batch((corrupted_ids,))
    with torch.no_grad():
        answer = model(ids).logits[:, -1].argmax(-1)
    wrong = (answer + 7) % 50
    for estimate, exact, steps in ((attribute_heads, patch_heads, 1), (attribute_stream, patch_stream, 4)):
        estimated = estimate(model, clean, corrupted, answer=answer, wrong=wrong, steps=steps).restored.flatten()
        patched = exact(model, clean, corrupted, answer=answer, wrong=wrong).restored.flatten()
        assert _rank_correlation(estimated, patched) >= 0.9
    sublayers = attribute_sublayers(model, clean, corrupted, answer=answer, wrong=wrong)
    assert sublayers.rows == ["blocks.0.attn", "blocks.0.mlp", "blocks.1.attn", "blocks.1.mlp", "blocks.2.attn",
                              "blocks.2.mlp"]
    assert sublayers.restored.shape == (6, 12)


def test_attribution_patching_per_position_and_head_is_exact_where_the_metric_is_linear_in_the_point():
    """Without a final norm, an attention-only decoder's last layer writes the logits linearly: its heads' outputs,
    values and patterns (z = pattern @ v, the pattern fixed by q and k) are reached through products and sums alone,
    so the first-order estimate is the patch itself, cell by cell (position x head) and over all positions; its
    queries and keys pass a softmax, so there the estimate only approximates the patch (and does not equal it)."""
    torch.manual_seed(0)
    model = attention_only_decoder(vocab_size=20, d_model=32, n_heads=(2, 4), max_seq_len=16).double().eval()
    model.stack.final_norm = None
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 20, (3, 7), generator=generator)
    corrupted_ids = ids.clone()
    corrupted_ids[:, 1:3] = torch.randint(0, 20, (3, 2), generator=generator)
    pair, target = (Batch((ids,)), Batch((corrupted_ids,))), {"answer": 3, "wrong": 4}
    for point in ("z", "v", "pattern", "q", "k"):
        estimated = attribute_heads(model, *pair, **target, by_position=True, point=point)
        patched = patch_heads(model, *pair, **target, by_position=True, point=point)
        assert estimated.rows == patched.rows == ["blocks.0.attn", "blocks.1.attn"]
        assert estimated.columns == "position x head" and estimated.restored.shape == (2, 7, 4)
        assert bool(estimated.restored[0, :, 2:].isnan().all() and patched.restored[0, :, 2:].isnan().all())
        error = float((estimated.restored[1] - patched.restored[1]).abs().max())
        if point in ("q", "k"):
            assert error > 1e-3, point  # a softmax between the point and the logits: first order only
            continue
        assert error < 1e-5, point
        whole = attribute_heads(model, *pair, **target, point=point).restored[1]  # (H,): every position at once
        torch.testing.assert_close(whole, patch_heads(model, *pair, **target, point=point).restored[1], atol=1e-5,
                                   rtol=0)


def test_attribution_patching_by_position_ranks_the_induction_head_at_the_last_position_first(induction_model,
                                                                                             held_out):
    """On the trained induction model the estimate per (site, position, head) puts first, as activation patching
    does, the induction head's output where the answer is read (the last position) and its values where it reads
    them: the key after the earlier copy of the last token (the first half's last, the answer itself); its queries
    matter at the last position alone (the last block's other queries write nothing read)."""
    clean, corrupted, answer, wrong = _induction_pair(held_out)
    last = 2 * TASK.half - 2  # the position the answer is read at; its token is the first half's one but last
    for point, position in (("z", last), ("v", TASK.half - 1)):
        estimated = attribute_heads(induction_model, clean, corrupted, answer=answer, wrong=wrong, by_position=True,
                                    point=point)
        patched = patch_heads(induction_model, clean, corrupted, answer=answer, wrong=wrong, by_position=True,
                              point=point)
        cells = [tuple(torch.unravel_index(found.restored.nan_to_num(-9).argmax(), found.restored.shape))
                 for found in (estimated, patched)]
        assert [tuple(int(i) for i in cell) for cell in cells] == [(1, position, 0)] * 2, point
    queries = attribute_heads(induction_model, clean, corrupted, answer=answer, wrong=wrong, by_position=True,
                              point="q")
    assert float(queries.restored[1, :-1, 0].abs().max()) < 1e-6


def _lens_batches(*seeds):
    return [Batch((TASK.ids(torch.Generator().manual_seed(seed), batch=32),)) for seed in seeds]


def _tuned(model):
    return train_tuned_lens(model, _lens_batches(0, 1, 2, 3), steps=250, generator=torch.Generator().manual_seed(0))


def test_the_tuned_lens_reads_every_layer_closer_to_the_final_distribution_than_the_logit_lens(induction_model):
    grads = [None if p.grad is None else p.grad.clone() for p in induction_model.parameters()]
    lens = _tuned(induction_model)
    assert all((a is None and p.grad is None) or torch.equal(a, p.grad)
               for a, p in zip(grads, induction_model.parameters(), strict=True))  # the model is read, not trained
    held_out = _lens_batches(99)
    logit, tuned = lens_divergences(induction_model, held_out), lens_divergences(induction_model, held_out, lens)
    assert lens.layers == ["blocks.0.resid_pre", "blocks.0.resid_post", "blocks.1.resid_post"]
    assert bool((tuned[:-1] < 0.85 * logit[:-1]).all()), (tuned, logit)  # measured: 1.63 vs 2.46, 1.57 vs 2.25
    assert float(tuned[-1]) == float(logit[-1]) == 0.0  # the last layer is the model's own reading
    ids = held_out[0].args[0]
    read = tuned_lens(induction_model, lens, ids)
    torch.testing.assert_close(read.logits[-1], induction_model(ids).logits)
    assert read.layers == logit_lens(induction_model, ids).layers


def test_a_layer_whose_stream_is_already_the_last_keeps_a_translator_at_the_identity(induction_model):
    """With the last block writing nothing (its o_proj zeroed), the stream after block 0 is the last one: its
    translator, started at the identity, stays there (a drift of Adam's kind would move it), and reads the final
    distribution; the stream after the embeddings is still translated (it lacks block 0's writes)."""
    model = attention_only_decoder(vocab_size=TASK.vocab_size, d_model=32, n_heads=(4, 1), max_seq_len=2 * TASK.half)
    model.load_state_dict(induction_model.state_dict())
    with torch.no_grad():
        model.stack.blocks[1].self_attn.o_proj.weight.zero_()
    lens = _tuned(model.eval())
    kept = lens.translators[1]
    assert float(kept.weight.abs().max()) < 1e-5 and float(kept.bias.abs().max()) < 1e-5
    assert float(lens.translators[0].weight.abs().max()) > 0.1
    assert float(lens_divergences(model, _lens_batches(99), lens)[1]) < 1e-6


def test_the_tuned_lens_steps_as_the_paper_sets_its_sgd():
    """The paper's learning rate 1.0 is the tuned-lens package's, which gives PyTorch's SGD 1.0 * (1 - 0.9) (its
    momentum scales a step by 1 / (1 - 0.9)), and the gradient is clipped to norm 1: from the identity, the first
    Nesterov step moves the translators by 0.1 * (1 + 0.9) * the clipped gradient, 0.19 where the gradient is large
    (an output layer scaled up), and less where it is small. Given to PyTorch as 1.0, the step was ten times that."""
    torch.manual_seed(0)
    model = attention_only_decoder(vocab_size=TASK.vocab_size, d_model=32, n_heads=(4, 1), max_seq_len=16).eval()
    batches = [Batch((TASK.ids(torch.Generator().manual_seed(0), batch=8),))]

    def moved() -> float:
        lens = train_tuned_lens(model, batches, steps=1)
        return float(torch.cat([p.flatten() for p in lens.parameters()]).norm())

    assert 0.0 < moved() < 0.19
    with torch.no_grad():
        model.lm_head.weight.mul_(30)  # KL and its gradient far above norm 1
    assert moved() == pytest.approx(0.19, rel=1e-5)


def test_a_saved_lens_reads_back_equal_and_a_damaged_one_is_refused(induction_model, tmp_path, caplog):
    lens = train_tuned_lens(induction_model, _lens_batches(0), steps=5)
    saved = save_tuned_lens(lens, tmp_path / "lens", record={"steps": 5})
    assert json.loads((saved / CONFIG_FILE).read_text())["steps"] == 5
    back = load_tuned_lens(saved, induction_model)
    ids = _lens_batches(7)[0].args[0]
    torch.testing.assert_close(tuned_lens(induction_model, back, ids).logits,
                               tuned_lens(induction_model, lens, ids).logits)
    weights = load_file(saved / WEIGHTS_FILE)
    for name, damage, message in (
            ("nan", {**weights, "translators.0.bias": torch.full((32,), float("nan"))}, "NaN or infinite"),
            ("short", {k: v for k, v in weights.items() if k != "translators.1.weight"}, "translators.1.weight"),
            ("shape", {**weights, "translators.0.weight": torch.zeros(16, 32)}, "of another shape")):
        damaged = tmp_path / name
        damaged.mkdir()
        (damaged / CONFIG_FILE).write_text((saved / CONFIG_FILE).read_text())
        save_file(damage, str(damaged / WEIGHTS_FILE))
        with pytest.raises(CheckpointError, match=message):
            load_tuned_lens(damaged)
    (tmp_path / "shape" / CONFIG_FILE).write_text('{"layers": "blocks.0.resid_pre"}')
    with pytest.raises(CheckpointError, match="not a tuned lens's record"):
        load_tuned_lens(tmp_path / "shape")
    other = build_model(ModelConfig(family="decoder", vocab_size=TASK.vocab_size, d_model=32, n_heads=2, d_ff=64,
                                    n_layers=3, max_seq_len=16))
    with pytest.raises(InputError, match="reads 3 layers .* the model has 4 of width 32: train a lens for this model"):
        load_tuned_lens(saved, other)
    with pytest.raises(InputError, match="at least one training step"):
        train_tuned_lens(induction_model, _lens_batches(0), steps=0)
    # read for a model of the same shape with another output layer, the lens warns, as the tuned-lens package does
    assert json.loads((saved / CONFIG_FILE).read_text())["trained_on"] == output_digest(induction_model)
    retrained = copy.deepcopy(induction_model)
    with torch.no_grad():
        retrained.lm_head.weight.add_(0.01)
    with caplog.at_level(logging.WARNING, logger="attnkit.inspect.tuned_lens"):
        load_tuned_lens(saved, induction_model)
        assert not caplog.records
        load_tuned_lens(saved, retrained)
    assert "was trained on a model with another output layer" in caplog.text
    # read for a model on another device (a CUDA run's --lens; here the meta device), the lens goes where it runs
    elsewhere = copy.deepcopy(induction_model).to("meta")
    assert {p.device.type for p in load_tuned_lens(saved, elsewhere).parameters()} == {"meta"}


def test_a_bf16_models_lens_translates_in_fp32_and_reads_through_its_output_layer():
    """A bf16 model's streams are translated by fp32 translators and read back through its bf16 output layer (training
    fed fp32 streams to it, and reading fed bf16 streams to the translators: both stopped on the dtype)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(family="decoder", vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=2,
                                    max_seq_len=16)).eval().to(torch.bfloat16)
    ids = torch.randint(0, 20, (3, 6), generator=torch.Generator().manual_seed(0))
    lens = train_tuned_lens(model, [Batch((ids,))], steps=3)
    assert lens.translators[0].weight.dtype == torch.float32 and float(lens.translators[0].weight.abs().max()) > 0
    divergences = lens_divergences(model, [Batch((ids,))], lens)
    assert divergences.shape == (3,) and bool(divergences.isfinite().all())
    read = tuned_lens(model, lens, ids)
    assert read.logits.dtype == torch.bfloat16
    torch.testing.assert_close(read.logits[-1], model(ids).logits)


def test_a_lens_reads_at_most_512_tokens_through_the_output_layer_at_once_and_scores_them_all():
    """The final distribution was kept for every token, (N, V) (about 1 MB a token under a 50k vocabulary: 4.4 GB
    for 4,096 tokens), and each layer scored on all N at once; training reads the final distribution of the tokens it
    draws, and scoring goes SCORED_TOKENS at a time, to the same mean KL over all of them."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(family="decoder", vocab_size=20, d_model=16, n_heads=2, d_ff=32, n_layers=2,
                                    max_seq_len=256)).eval()
    ids = torch.randint(0, 20, (4, 200), generator=torch.Generator().manual_seed(0))  # 800 tokens
    rows = []

    def count(module, args, out) -> None:  # the lens's reads (n, C), not the model's own forward's (B, T, C)
        if args[0].dim() == 2:
            rows.append(len(args[0]))

    model.lm_head.register_forward_hook(count)
    lens = train_tuned_lens(model, [Batch((ids[:2],)), Batch((ids[2:],))], steps=2)
    divergences = lens_divergences(model, [Batch((ids,))])
    assert 0 < max(rows) <= SCORED_TOKENS == 512
    logits = logit_lens(model, ids).logits.flatten(1, 2).float().log_softmax(-1)  # (L + 1, N, V)
    expected = (logits[-1].exp() * (logits[-1] - logits)).sum(-1).mean(-1)  # KL(final || layer), per layer
    torch.testing.assert_close(divergences, expected, rtol=1e-5, atol=1e-6)
    assert float(lens_divergences(model, [Batch((ids,))], lens)[0]) < float(divergences[0])


def test_a_translations_padded_targets_are_left_out_of_its_lens_by_their_mask():
    """A translation's decoder stream is padded by its target mask (`tgt_mask`, the seq2seq model's); the lens read
    only a decoder's `attention_mask`, so a padded target's pads were scored (and trained on) as tokens."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(family="encoder-decoder", vocab_size=20, d_model=16, n_heads=2, d_ff=32,
                                    n_layers=2, max_seq_len=16)).eval()
    generator = torch.Generator().manual_seed(0)
    source, target = (torch.randint(1, 20, (2, length), generator=generator) for length in (6, 5))
    mask = torch.ones(2, 5, dtype=torch.long)
    mask[1, 3:] = 0  # the second target is 3 tokens long, padded to 5
    padded = Batch((source, target), kwargs={"tgt_mask": mask})
    apart = [Batch((source[:1], target[:1])), Batch((source[1:], target[1:, :3]))]
    found, expected = lens_divergences(model, [padded]), lens_divergences(model, apart)
    assert float(expected[0]) > 0  # an untrained model's KLs are small: compared relative to their size
    torch.testing.assert_close(found, expected, rtol=1e-4, atol=0)


def test_an_encoder_decoders_lens_reads_its_decoder():
    torch.manual_seed(0)
    model = build_model(ModelConfig(family="encoder-decoder", vocab_size=20, d_model=16, n_heads=2, d_ff=32,
                                    n_layers=2, max_seq_len=16)).eval()
    generator = torch.Generator().manual_seed(0)
    source, target = (torch.randint(0, 20, (3, length), generator=generator) for length in (6, 5))
    lens = train_tuned_lens(model, [Batch((source, target))], steps=3)
    assert lens.layers[0] == "decoder.blocks.0.resid_pre" and len(lens.layers) == 3
    read = tuned_lens(model, lens, source, target)
    torch.testing.assert_close(read.logits[-1], model(source, target).logits)


@pytest.mark.parametrize("family", ["decoder", "encoder"])
def test_a_probe_reads_words_at_the_running_texts_pieces(family, monkeypatch):
    """A probe read each word encoded on its own, a lone space piece between words (a tagger's old layout), where
    the model reads running text's pieces ('Ġlives'): with a byte-level BPE its ids and word positions are those of
    the running text, at each word's last piece in a decoder and its first in an encoder."""
    from attnkit.inspect import probes
    from attnkit.tokenize import train_tokenizer

    tokenizer = train_tokenizer("bpe", ["Johnathan lives in Paris"] * 20, vocab_size=300)
    words = ["Johnathan", "lives", "in", "Paris"]
    pieces = tokenizer.encode_words(words)
    model = build_model(ModelConfig(family=family, vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1, n_heads=2,
                                    d_ff=32, max_seq_len=32))
    seen = []

    mark = int(family != "decoder")  # a language model reads its stream unmarked, an encoder CLS ... SEP

    def positions(stack, ids, *, names, attention_mask):  # each position's state: its own index
        seen.append(ids[0, mark:ids.shape[1] - mark].tolist())
        return {n: torch.arange(ids.shape[1], dtype=torch.float).expand(*ids.shape)[..., None] for n in names}

    monkeypatch.setattr(probes, "trace", positions)
    found = probes.word_states(model, tokenizer, [(words, ["X", "Y", "Y", "X"])], max_len=32)
    assert seen == [[piece for word in pieces for piece in word]]
    ends = [mark + sum(map(len, pieces[:i + 1])) - 1 for i in range(len(words))]
    starts = [mark + sum(map(len, pieces[:i])) for i in range(len(words))]
    expected = ends if family == "decoder" else starts
    assert found.states["blocks.0.resid_pre"][:, 0].tolist() == expected


@pytest.mark.parametrize("family", ["decoder", "encoder-decoder"])
def test_a_probe_reads_a_language_models_and_a_sources_text_without_a_start_mark(family):
    """A language model learned from a stream of text and an encoder-decoder's encoder from sources (with EOS), and
    neither ever read BOS at their start: the probe reads each word's state from the running text as the model reads
    it, where BOS before the first word moved every state after it."""
    from attnkit.inspect import trace
    from attnkit.inspect.probes import word_states
    from attnkit.tokenize import CharTokenizer

    tokenizer = CharTokenizer("abcdefgh ")
    torch.manual_seed(0)
    model = build_model(ModelConfig(family=family, vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1,
                                    n_heads=2, d_ff=32, max_seq_len=32)).eval()
    words = ["abc", "de", "fgh"]
    found = word_states(model, tokenizer, [(words, ["X", "Y", "X"]), (["ab"], ["Y"])], max_len=32)
    ids = torch.tensor([tokenizer.encode("abc de fgh") + ([tokenizer.eos_id] if family != "decoder" else [])])
    stack = model.encoder if family == "encoder-decoder" else model.stack
    expected = trace(stack, ids, names=["blocks.0.resid_post"])["blocks.0.resid_post"][0]  # (T, C)
    at = [2, 5, 9] if family == "decoder" else [0, 4, 7]  # each word's last piece in a decoder, first in an encoder
    torch.testing.assert_close(found.states["blocks.0.resid_post"][:3], expected[at])


@pytest.mark.parametrize(("family", "head", "frame", "around"), [
    ("decoder", "lm", "attnkit", (["bos"], [])),  # a converted Llama: its texts start with BOS, as it generates
    ("decoder", "tag", "own", ([], [])),  # a converted GPT-2 tagger: its tokenizer adds nothing
    ("encoder", "tag", "own", (["bos", "cls"], ["sep", "eos"])),  # two marks on each side, its tokenizer's own
])
def test_a_probe_frames_a_converted_models_text_as_its_tokenizer_does(family, head, frame, around):
    """A converted Llama (starts_with_bos) was probed without the BOS it always read; a converted GPT-2 tagger read
    BOS ... EOS it never saw; and a frame of other than one mark on each side was cut at [1:-1]: each word's state is
    the stack's own at that word on [*before, *pieces, *after]."""
    from attnkit.inspect import trace
    from attnkit.inspect.probes import word_states
    from attnkit.tokenize import CharTokenizer

    tokenizer = CharTokenizer("abcdefgh ")
    before, after = ([tokenizer.token_id(role) for role in side] for side in around)
    tokenizer.starts_with_bos = before == [tokenizer.bos_id]
    tokenizer.own_frame = (tuple(before), tuple(after))
    torch.manual_seed(0)
    fields = {"decoder_head" if family == "decoder" else "encoder_head": head}
    if head == "tag":
        fields["n_classes"] = 2
    model = build_model(ModelConfig(family=family, vocab_size=tokenizer.vocab_size, d_model=16, n_layers=1,
                                    n_heads=2, d_ff=32, max_seq_len=32, **fields)).eval()
    words = ["abc", "de", "fgh"]
    found = word_states(model, tokenizer, [(words, ["X", "Y", "X"]), (["ab"], ["Y"])], max_len=32, frame=frame)
    ids = torch.tensor([[*before, *tokenizer.encode("abc de fgh"), *after]])
    expected = trace(model.stack, ids, names=["blocks.0.resid_post"])["blocks.0.resid_post"][0]  # (T, C)
    at = [2, 5, 9] if family == "decoder" else [0, 4, 7]  # each word's last piece in a decoder, first in an encoder
    torch.testing.assert_close(found.states["blocks.0.resid_post"][:3], expected[[len(before) + i for i in at]])


def test_the_induction_heads_values_carry_the_answer_and_its_queries_act_where_it_is_read(induction_model,
                                                                                          held_out):
    """Patching each head's queries, keys, values or pattern (TransformerLens's
    get_act_patch_attn_head_all_pos_every) on the induction model, whose corruption gives the first half new tokens:
    the token to copy is gone from what the induction head reads, so its values patched back restore most of the
    answer and its queries, keys and pattern little; position by position, its queries and pattern matter only at the
    query where the answer is read (the last block's other queries write nothing read), and there as much as at
    every position. A point the model does not show is refused naming the fix."""
    clean = held_out[:8]
    corrupted = clean.clone()
    corrupted[:, : TASK.half] = TASK.ids(torch.Generator().manual_seed(9), batch=8)[:, : TASK.half]
    answer, wrong = clean[:, -1], (clean[:, -1] + 1) % TASK.vocab_size
    pair = Batch((clean[:, :-1],)), Batch((corrupted[:, :-1],))
    found = {point: patch_heads(induction_model, *pair, answer=answer, wrong=wrong, point=point)
             for point in ("q", "k", "v", "pattern")}
    assert float(found["v"].restored[1, 0]) > 0.7
    assert all(abs(float(found[point].restored[1, 0])) < 0.2 for point in ("q", "k", "pattern"))
    for point in ("q", "pattern"):
        each = patch_heads(induction_model, *pair, answer=answer, wrong=wrong, point=point, by_position=True)
        assert each.restored.shape == (2, 2 * TASK.half - 1, 4), point
        assert float(each.restored[1, :-1, 0].abs().max()) < 1e-5, point
        assert float(each.restored[1, -1, 0]) == pytest.approx(float(found[point].restored[1, 0]), abs=1e-4)
    with pytest.raises(InputError, match="'o' is none of z, q, k, v, pattern"):
        patch_heads(induction_model, *pair, answer=answer, wrong=wrong, point="o")
    fused = copy.deepcopy(induction_model)
    for attention in (m for m in fused.modules() if isinstance(m, Attention)):
        attention.fuse_qkv()  # inference's one product: no separate q, k, v to patch
    with pytest.raises(InputError, match="has no k to patch at blocks.0.attn.k .*patch z"):
        patch_heads(fused, *pair, answer=answer, wrong=wrong, point="k")


def test_left_padded_prompts_patch_as_each_prompt_alone(induction_model, held_out):
    """Prompts of different lengths left-padded into one batch (the attention mask, and position ids that start at
    each prompt's first token, as Hugging Face and TransformerLens pad a batch of prompts), read at the last position:
    patching position t of the batch patches each prompt at its own t - (its padding), and patching padding patches
    nothing, so every share is the one the prompts patched alone give, averaged as TransformerLens's normalised
    metric averages (patched - corrupted) over the batch."""
    lengths = [15, 11]  # the second prompt: 4 padding positions, then its first 11 tokens
    corrupted_rows = held_out[:2].clone()
    corrupted_rows[:, : TASK.half] = TASK.ids(torch.Generator().manual_seed(9), batch=2)[:, : TASK.half]
    answer = torch.stack([held_out[row, n] for row, n in enumerate(lengths)])
    wrong = (answer + 1) % TASK.vocab_size
    width = max(lengths)

    def left_padded(rows):
        ids, mask, positions = (torch.zeros(len(lengths), width, dtype=torch.long) for _ in range(3))
        for row, n in enumerate(lengths):
            ids[row, width - n:], mask[row, width - n:] = rows[row, :n], 1
            positions[row, width - n:] = torch.arange(n)
        return Batch((ids,), kwargs={"attention_mask": mask, "position_ids": positions})

    batched = patch_stream(induction_model, left_padded(held_out), left_padded(corrupted_rows), answer=answer,
                           wrong=wrong)
    expected_clean, expected_corrupted, patched = [], [], torch.zeros(len(lengths), 2, width)  # (B, L, T)
    for row, n in enumerate(lengths):
        alone = patch_stream(induction_model, Batch((held_out[row:row + 1, :n],)),
                             Batch((corrupted_rows[row:row + 1, :n],)), answer=answer[row], wrong=wrong[row])
        expected_clean.append(alone.clean)
        expected_corrupted.append(alone.corrupted)
        patched[row] = alone.corrupted  # padding patched: the corrupted run unchanged
        patched[row, :, width - n:] = alone.corrupted + alone.restored * (alone.clean - alone.corrupted)
    clean, corrupted = sum(expected_clean) / 2, sum(expected_corrupted) / 2
    assert (batched.clean, batched.corrupted) == pytest.approx((clean, corrupted), abs=1e-5)
    torch.testing.assert_close(batched.restored, (patched.mean(0) - corrupted) / (clean - corrupted), rtol=1e-4,
                               atol=1e-4)
    assert not bool(batched.restored.isnan().any())


def test_padded_prompts_are_each_read_at_their_own_last_token(induction_model, held_out):
    """Prompts of different lengths, right-padded into one batch, are read each at its own last token (`position`
    one per row, as TransformerLens users index their prompts' ends): the clean and corrupted logit differences are
    the mean of each prompt's run alone, and the induction head still restores most of the answer."""
    ids = held_out[:2, :-1].clone()  # (2, 15): the second prompt is cut to 11 tokens and padded
    corrupted = ids.clone()
    corrupted[:, :TASK.half] = TASK.ids(torch.Generator().manual_seed(9), batch=2)[:, :TASK.half]
    mask = torch.ones_like(ids)
    mask[1, 11:] = 0
    ends = torch.tensor([14, 10])
    answer, wrong = torch.stack((held_out[0, 15], held_out[1, 11])), torch.tensor([0, 1])
    padded = [Batch((x.masked_fill(mask == 0, 0),), kwargs={"attention_mask": mask}) for x in (ids, corrupted)]
    found = patch_heads(induction_model, *padded, answer=answer, wrong=wrong, position=ends)
    with torch.no_grad():
        alone = [[float(logit_differences(induction_model(x[row:row + 1, :end + 1]).logits, answer[row], wrong[row]))
                  for row, end in enumerate(ends.tolist())] for x in (ids, corrupted)]
    assert (found.clean, found.corrupted) == pytest.approx((sum(alone[0]) / 2, sum(alone[1]) / 2), abs=1e-4)
    assert found.restored[1, 0] > 0.5
    for position, message in ((torch.tensor([14]), r"position=\[14\] must be one position, or one per row of the "
                               r"batch \(2\)"), (torch.tensor([14.0, 10.0]), "must be one position"),
                              (torch.tensor([14, 15]), r"position \[14, 15\] is out of range")):
        with pytest.raises(InputError, match=message):
            patch_heads(induction_model, *padded, answer=answer, wrong=wrong, position=position)
