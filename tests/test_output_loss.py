"""The output loss's paths (`layers/output_loss.py`) give the plain path's loss and gradients: the padded product,
the chunked one, and Liger Kernel's fused one where CUDA and the kernel are present; the concatenated q/k/v product
of training equals the three projections; a model traced for training has no graph breaks."""

import logging

import pytest
import torch
import torch.nn.functional as F

from attnkit import build_model, presets
from attnkit.layers.output_loss import LossPath, fused_kernel_missing, linear_cross_entropy, padded_logits


def _inputs(device="cpu", dtype=torch.float64, n=2, t=9, c=16, v=45):
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, t, c, dtype=dtype, generator=generator).to(device).requires_grad_()
    weight = torch.randn(v, c, dtype=dtype, generator=generator).to(device).requires_grad_()
    targets = torch.randint(0, v, (n, t), generator=generator)
    targets[0, -3:] = -100
    return hidden, weight, targets.to(device)


def _loss_and_grads(path, smoothing, inputs):
    hidden, weight, targets = inputs
    hidden.grad = weight.grad = None
    loss = linear_cross_entropy(hidden, weight, targets, path=path, label_smoothing=smoothing)
    (3 * loss).backward()  # an upstream gradient other than 1
    return loss.detach(), hidden.grad.clone(), weight.grad.clone()


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("path", [LossPath("plain", vocab_multiple=64), LossPath("plain", vocab_multiple=8),
                                  LossPath("chunked", chunk_size=5)], ids=["padded-64", "padded-8", "chunked"])
def test_each_path_equals_the_plain_one(path, smoothing):
    inputs = _inputs()
    expected = _loss_and_grads(LossPath("plain"), smoothing, inputs)
    for ours, reference in zip(_loss_and_grads(path, smoothing, inputs), expected, strict=True):
        # the chunked path soft-maxes in fp32 whatever its inputs' dtype
        tolerance = 1e-10 if path.kind == "plain" else 1e-6
        torch.testing.assert_close(ours.to(reference.dtype), reference, atol=tolerance, rtol=tolerance)


def test_padding_adds_logits_no_softmax_sees():
    hidden, weight, _ = _inputs()
    logits = padded_logits(hidden.reshape(-1, 16), weight, 64)
    assert logits.shape == (18, 64)
    assert torch.isneginf(logits[:, 45:]).all()
    torch.testing.assert_close(logits[:, :45], hidden.reshape(-1, 16) @ weight.t())
    torch.testing.assert_close(torch.softmax(logits, -1)[:, :45], torch.softmax(logits[:, :45], -1))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="Liger Kernel's fused loss runs on CUDA; torch sees none")
@pytest.mark.skipif(fused_kernel_missing() is not None, reason=str(fused_kernel_missing()))
def test_fused_path_equals_the_plain_one_on_cuda():
    inputs = _inputs("cuda", torch.float32)
    expected = _loss_and_grads(LossPath("plain"), 0.0, inputs)
    for ours, reference in zip(_loss_and_grads(LossPath("fused"), 0.0, inputs), expected, strict=True):
        torch.testing.assert_close(ours, reference, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama2-tiny"])
def test_concatenated_qkv_product_trains_like_three(name):
    """Train mode with gradients projects q, k and v in one product; eval mode (and no gradients) calls the three
    layers: same outputs and same gradients for each weight."""
    torch.manual_seed(0)
    model = build_model(presets.get(name, vocab_size=64, n_layers=1, d_model=32, n_heads=4, max_seq_len=16))
    ids, labels = torch.randint(0, 64, (2, 12)), torch.randint(0, 64, (2, 12))

    q_proj_calls = []
    model.stack.blocks[0].self_attn.q_proj.register_forward_hook(lambda *_: q_proj_calls.append(1))

    def loss_and_grads(train: bool):
        model.train(train)
        model.zero_grad()
        loss = model(ids, labels=labels).loss
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    concatenated = loss_and_grads(True)
    assert not q_proj_calls  # training went through the concatenated product, not the layer
    separate = loss_and_grads(False)  # dropout is 0 in these presets
    assert q_proj_calls == [1]
    torch.testing.assert_close(concatenated[0], separate[0])
    for name_, grad in separate[1].items():
        torch.testing.assert_close(concatenated[1][name_], grad, msg=name_)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama2-tiny", "vaswani-tiny", "bert-tiny"])
def test_training_forward_traces_without_graph_breaks(name):
    """The Transformer families' training forward (with the loss) is one graph: no value read splits it."""
    torch._logging.set_logs(dynamo=logging.ERROR)
    config = presets.get(name, vocab_size=64, n_layers=1, max_seq_len=16)
    model = build_model(config).train()
    ids, labels = torch.randint(0, 64, (2, 8)), torch.randint(0, 64, (2, 8))
    if config.family == "encoder-decoder":
        forward = lambda: model(ids, ids, labels=labels, return_logits=False).loss  # noqa: E731
    elif config.family == "encoder":
        forward = lambda: model(ids, attention_mask=torch.ones_like(ids)).logits  # noqa: E731
    else:
        forward = lambda: model(ids, labels=labels, return_logits=False).loss  # noqa: E731
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(forward)()
    assert explanation.graph_break_count == 0, [str(b.reason)[:200] for b in explanation.break_reasons]


def test_plain_loss_matches_cross_entropy_of_logits():
    hidden, weight, targets = _inputs()
    expected = F.cross_entropy((hidden @ weight.t()).reshape(-1, 45), targets.reshape(-1))
    torch.testing.assert_close(linear_cross_entropy(hidden, weight, targets, path=LossPath("plain")), expected)
