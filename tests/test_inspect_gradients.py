"""Gradients at hook points and integrated gradients on known answers: the gradient read at a point equals the one
autograd gives for a zero perturbation added there (and a finite difference along a random direction), also where a
decoder calls its attention once per step; the parameters' gradients are left alone; integrated gradients satisfy
completeness (the attributions sum to f(input) - f(baseline)) on every family."""

import pytest
import torch

from attnkit.config import ModelConfig
from attnkit.errors import InputError
from attnkit.inspect import hooked
from attnkit.inspect.gradients import backward_trace
from attnkit.inspect.integrated_gradients import integrated_gradients
from attnkit.models import build_model
from attnkit.models.recurrent import recurrent_seq2seq

VOCAB = 30


def _model(**fields):
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=VOCAB, d_model=16, n_heads=2, d_ff=24, max_seq_len=16, n_layers=2, **fields)
    return build_model(config).eval()


def _recurrent():
    torch.manual_seed(0)
    return recurrent_seq2seq(src_vocab_size=VOCAB, tgt_vocab_size=VOCAB, embedding_dim=8, hidden=8, encoder_hidden=8,
                             n_layers=1, cell="gru", attention="bahdanau").eval()


def _by_perturbation(model, args, metric, name):
    """d metric / d activation at `name` as the gradient of a zero added there, one per call (joined on axis 1)."""
    added = []

    def add(activation, point):
        zero = torch.zeros_like(activation, requires_grad=True)
        added.append(zero)
        return activation + zero

    with hooked(model, edits={name: add}):
        value = metric(model(*args))
    return torch.cat(torch.autograd.grad(value, added), dim=1)


CASES = {
    "decoder": (lambda: _model(family="decoder"), ["blocks.0.attn.z", "blocks.1.resid_pre", "blocks.0.mlp.hidden"]),
    "encoder-decoder": (lambda: _model(family="encoder-decoder"), ["encoder.blocks.1.resid_post",
                                                                   "decoder.blocks.0.cross_attn.z"]),
    "recurrent, attention once per step": (_recurrent, ["decoder.attn.z", "encoder.out"]),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_the_gradient_at_a_point_is_autograds(kind):
    build, names = CASES[kind]
    model = build()
    ids = torch.randint(0, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))
    args = (ids,) if kind == "decoder" else (ids, ids[:, :5])

    def metric(output):
        return output.logits[:, -1, 3].sum() - output.logits[:, 2, 5].sum()

    found = backward_trace(model, *args, metric=metric, names=names)
    assert all(p.grad is None for p in model.parameters())  # read through autograd.grad, not .backward()
    for name in names:
        expected = _by_perturbation(model, args, metric, name)
        torch.testing.assert_close(found.grads[name], expected, rtol=1e-5, atol=1e-6)
        assert found.grads[name].shape == found.cache[name].shape and found.grads[name].abs().sum() > 0
    with torch.no_grad():
        assert found.value == pytest.approx(float(metric(model(*args))), abs=1e-5)


def test_the_gradient_matches_a_finite_difference_and_reaches_the_pattern():
    model = _model(family="decoder").double()
    ids = torch.randint(0, VOCAB, (2, 6), generator=torch.Generator().manual_seed(2))

    def metric(output):
        return output.logits[:, -1, 4].sum()

    found = backward_trace(model, ids, metric=metric, names=["blocks.1.resid_pre", "blocks.1.attn.pattern"])
    direction = torch.randn(found.cache["blocks.1.resid_pre"].shape, generator=torch.Generator().manual_seed(3),
                            dtype=torch.double)
    eps = 1e-6
    values = []
    for sign in (1, -1):
        shifted = trace_value(model, ids, metric, "blocks.1.resid_pre", sign * eps * direction)
        values.append(shifted)
    numeric = (values[0] - values[1]) / (2 * eps)
    assert float((found.grads["blocks.1.resid_pre"] * direction).sum()) == pytest.approx(numeric, rel=1e-6)
    pattern = found.grads["blocks.1.attn.pattern"]
    assert pattern.shape == (2, 2, 6, 6) and pattern[:, :, -1].abs().sum() > 0


def trace_value(model, ids, metric, name, shift):
    with torch.no_grad(), hooked(model, edits={name: lambda activation, point: activation + shift}):
        return float(metric(model(ids)))


def test_a_point_without_a_tensor_of_its_own_is_refused():
    model = _model(family="decoder", position="learned")
    with pytest.raises(InputError, match="blocks.0.resid_pre"):
        backward_trace(model, torch.zeros(1, 4, dtype=torch.long), metric=lambda out: out.logits.sum(),
                       names=["pos_embed"])


IG_CASES = {
    "decoder": dict(family="decoder"),
    "masked LM": dict(family="encoder", encoder_head="mlm"),
    "classifier": dict(family="encoder", encoder_head="classify", n_classes=3),
    "tagger": dict(family="encoder", encoder_head="tag", n_classes=3),
    "encoder-decoder": dict(family="encoder-decoder"),
}


@pytest.mark.parametrize("kind", list(IG_CASES))
def test_integrated_gradients_are_complete(kind):
    model = _model(**IG_CASES[kind])
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(4))
    args = (ids, ids[:, :5]) if kind == "encoder-decoder" else (ids,)
    found = integrated_gradients(model, *args, target=torch.tensor([1, 2]), position=3, steps=64)
    scale = float((found.value - found.baseline_value).abs().max())
    assert scale > 1e-3
    assert float(found.completeness_gap().abs().max()) < 0.01 * scale + 1e-5
    with torch.no_grad():
        logits = model(*args).logits
    at = logits if logits.dim() == 2 else logits[:, 3]
    torch.testing.assert_close(found.value, at[torch.arange(2), torch.tensor([1, 2])], rtol=0, atol=1e-5)
    names = ["encoder.embed", "decoder.embed"] if kind == "encoder-decoder" else ["embed"]
    assert list(found.attributions) == names and found.tokens[names[0]].shape == (2, 7)
    coarse = integrated_gradients(model, *args, target=torch.tensor([1, 2]), position=3, steps=2)
    assert coarse.completeness_gap().abs().max() > found.completeness_gap().abs().max()  # the sum converges


def test_integrated_gradients_on_the_recurrent_seq2seq_name_their_points():
    model = _recurrent()
    ids = torch.randint(1, VOCAB, (2, 6), generator=torch.Generator().manual_seed(5))
    with pytest.raises(InputError, match="encoder.out"):
        integrated_gradients(model, ids, ids[:, :4], target=3)
    found = integrated_gradients(model, ids, ids[:, :4], target=3, points=["encoder.out"], steps=64)
    scale = float((found.value - found.baseline_value).abs().max())
    assert float(found.completeness_gap().abs().max()) < 0.01 * scale + 1e-5
