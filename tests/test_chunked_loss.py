"""The chunked linear + cross-entropy equals the plain path (lm_head, then cross-entropy) in value and gradient."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from attnkit.layers.chunked_loss import chunked_linear_cross_entropy


def _inputs(dtype, n=18, c=16, v=40, seed=0):
    torch.manual_seed(seed)
    hidden = torch.randn(n, c, dtype=dtype, requires_grad=True)
    weight = torch.randn(v, c, dtype=dtype, requires_grad=True)
    targets = torch.randint(0, v, (n,))
    targets[-3:] = -100
    return hidden, weight, targets


def _loss_and_grads(loss_fn, hidden, weight, targets, *, autocast=False):
    hidden.grad = weight.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(hidden, weight, targets)
    loss.backward()
    return loss.detach().double(), hidden.grad.double(), weight.grad.double()


def _plain(smoothing):
    return lambda h, w, t: F.cross_entropy((h @ w.t()).float(), t, label_smoothing=smoothing)


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
            out = model(ids, labels=targets, return_logits=return_logits)
        else:
            out = model(ids, ids, labels=targets, return_logits=return_logits)
        out.loss.backward()
        return out, [p.grad.clone() for p in model.parameters()]

    (plain, plain_grads), (fused, fused_grads) = run(True), run(False)
    assert fused.logits is None and plain.logits is not None
    torch.testing.assert_close(fused.loss, plain.loss)
    for a, b in zip(fused_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_fp32_equals_the_plain_path(smoothing):
    hidden, weight, targets = _inputs(torch.float32, n=70)
    expected = _loss_and_grads(_plain(smoothing), hidden, weight, targets)
    ours = _loss_and_grads(lambda h, w, t: chunked_linear_cross_entropy(h, w, t, chunk_size=16,
                                                                        label_smoothing=smoothing),
                           hidden, weight, targets)
    for a, b in zip(ours, expected, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_bf16_autocast_is_as_close_to_float64_as_the_plain_bf16_path(smoothing):
    """Under bf16 autocast the products are bf16 and the weight gradient builds up chunk by chunk in the fp32 master
    weight's dtype: no further from the float64 loss and gradients than the plain path under the same autocast."""
    hidden, weight, targets = _inputs(torch.float32, n=300, c=64, v=600, seed=1)
    exact = _loss_and_grads(_plain(smoothing), hidden.detach().double().requires_grad_(),
                            weight.detach().double().requires_grad_(), targets)
    plain = _loss_and_grads(_plain(smoothing), hidden, weight, targets, autocast=True)
    ours = _loss_and_grads(lambda h, w, t: chunked_linear_cross_entropy(h, w, t, chunk_size=64,
                                                                        label_smoothing=smoothing),
                           hidden, weight, targets, autocast=True)
    assert weight.grad.dtype == torch.float32 and hidden.grad.dtype == torch.float32
    for mine, theirs, truth in zip(ours, plain, exact, strict=True):
        scale = truth.abs().max()
        assert (mine - truth).abs().max() <= 1.5 * (theirs - truth).abs().max() + 1e-3 * scale


def test_bf16_weights_keep_bf16_gradients():
    """A bf16 model (the compute copy of `--dtype bf16-master`) gets bf16 gradients close to float64's."""
    hidden, weight, targets = _inputs(torch.bfloat16, n=64, c=32, v=200)
    exact = _loss_and_grads(_plain(0.0), hidden.detach().double().requires_grad_(),
                            weight.detach().double().requires_grad_(), targets)
    ours = _loss_and_grads(lambda h, w, t: chunked_linear_cross_entropy(h, w, t, chunk_size=16), hidden, weight,
                           targets)
    assert hidden.grad.dtype == weight.grad.dtype == torch.bfloat16
    for mine, truth in zip(ours, exact, strict=True):
        torch.testing.assert_close(mine, truth, atol=2e-2 * truth.abs().max().item(), rtol=0)


class _LargestTensor(TorchDispatchMode):
    """Records the largest number of elements of any tensor an operation returns."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("autocast", [False, True])
def test_no_tensor_as_large_as_all_the_logits(autocast):
    """Forward and backward create nothing of N x V elements: a chunk's logits, the (V, C) weight gradient and the
    (N, C) input gradient are the largest tensors (the plain path's logits, or a whole gradient-of-logits buffer,
    would be N x V)."""
    n, c, v, chunk = 64, 16, 50, 8
    hidden, weight, targets = _inputs(torch.float32, n=n, c=c, v=v)
    with _LargestTensor() as seen:
        _loss_and_grads(lambda h, w, t: chunked_linear_cross_entropy(h, w, t, chunk_size=chunk), hidden, weight,
                        targets, autocast=autocast)
    assert seen.largest == max(chunk * v, v * c, n * c) < n * v
