"""The chunked linear + cross-entropy equals the plain path (lm_head, then cross-entropy) in value and gradient."""

import pytest
import torch
import torch.nn.functional as F

from attnkit.layers.chunked_loss import chunked_linear_cross_entropy


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("chunk_size", [3, 7, 1000])
def test_equals_the_plain_path(smoothing, chunk_size):
    torch.manual_seed(0)
    hidden = torch.randn(2, 9, 16, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(40, 16, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 40, (2, 9))
    targets[0, -3:] = -100
    expected = F.cross_entropy((hidden @ weight.t()).reshape(-1, 40), targets.reshape(-1), label_smoothing=smoothing)
    expected.backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ours = chunked_linear_cross_entropy(hidden, weight, targets, chunk_size=chunk_size, label_smoothing=smoothing)
    (2 * ours).backward()  # an upstream gradient other than 1 must scale the result
    torch.testing.assert_close(ours, expected.to(ours.dtype), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(hidden.grad, 2 * grads[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(weight.grad, 2 * grads[1], atol=1e-6, rtol=1e-6)


def test_without_grad_gives_the_plain_loss():
    hidden, weight = torch.randn(5, 8), torch.randn(11, 8)
    targets = torch.randint(0, 11, (5,))
    with torch.no_grad():
        loss = chunked_linear_cross_entropy(hidden, weight, targets, chunk_size=2)
    torch.testing.assert_close(loss, F.cross_entropy(hidden @ weight.t(), targets))


@pytest.mark.parametrize("name", ["gpt2-tiny", "vaswani-tiny"])
def test_models_give_the_same_loss_and_gradients_without_logits(name):
    from attnkit import build_model, presets

    torch.manual_seed(0)
    config = presets.get(name, label_smoothing=0.1)
    model = build_model(config)
    ids = torch.randint(0, config.vocab_size, (2, 10))
    targets = ids.roll(-1, 1)
    targets[1, 6:] = -100

    def run(return_logits):
        model.zero_grad()
        if config.family == "decoder":
            out = model(ids, targets=targets, return_logits=return_logits)
        else:
            out = model(ids, ids, targets=targets, return_logits=return_logits)
        out.loss.backward()
        return out, [p.grad.clone() for p in model.parameters()]

    (plain, plain_grads), (fused, fused_grads) = run(True), run(False)
    assert fused.logits is None and plain.logits is not None
    torch.testing.assert_close(fused.loss, plain.loss)
    for a, b in zip(fused_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
