"""Under bf16 autocast an input that several products read is cast once (`layers/autocast.py`): backward keeps one
bf16 copy of it, not one per product, and the numbers are those of letting each product cast for itself."""

import pytest
import torch

from attnkit import build_model, presets
from attnkit.layers import attention, feedforward
from attnkit.layers.attention import Attention
from attnkit.layers.feedforward import SwiGLU
from attnkit.layers.masks import AttentionMask

B, T, C = 2, 5, 32


def _saved_copies_of(x: torch.Tensor, run) -> int:
    """How many distinct bf16 copies of x autograd keeps for backward while `run()` runs."""
    storages = set()
    copy = x.detach().bfloat16()

    def pack(saved: torch.Tensor) -> torch.Tensor:
        if saved.dtype == torch.bfloat16 and saved.numel() == x.numel() and saved.shape[-1] == x.shape[-1]:
            if torch.equal(saved.detach().reshape(x.shape), copy):
                storages.add(saved.untyped_storage().data_ptr())
        return saved

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda saved: saved):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            run()
    return len(storages)


def _uncast(monkeypatch) -> None:
    """Let each product cast its own input again, as before the shared cast."""
    for module in (attention, feedforward):
        monkeypatch.setattr(module, "cast_for_autocast", lambda x: x)


@pytest.mark.parametrize("case", ["self-attention q/k/v", "cross-attention k/v", "swiglu gate/up"])
def test_an_input_read_by_several_products_is_kept_once(case, monkeypatch):
    torch.manual_seed(0)
    x = torch.randn(B, T, C, requires_grad=True) * 1.0  # an activation (autocast caches a leaf's cast itself)
    if case == "self-attention q/k/v":  # in eval mode: in training the weights are concatenated, one product
        layer, products = Attention(C, 4).eval(), 3
        run = lambda: layer(x, mask=AttentionMask(T, causal=True))  # noqa: E731
    elif case == "cross-attention k/v":
        layer, products = Attention(C, 4), 2
        query = torch.randn(B, 3, C)
        run = lambda: layer(query, context=x)  # noqa: E731
    else:
        layer, products = SwiGLU(C, 3 * C), 2
        run = lambda: layer(x)  # noqa: E731
    assert _saved_copies_of(x, run) == 1
    _uncast(monkeypatch)
    assert _saved_copies_of(x, run) == products  # what the shared cast saves


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama2-tiny", "vaswani-tiny"])
def test_casting_once_keeps_the_forward_and_the_gradients_accuracy(preset, monkeypatch):
    """The forward pass is the same bit for bit. The gradient reaching a shared input is now summed in bf16 before
    its cast back (autograd sums a tensor's gradients in its dtype), so gradients are held to the fp32 ones as
    closely as before, not bit for bit."""
    config = presets.get(preset).replace(dropout=0.0, d_model=64, d_ff=256)
    ids = torch.randint(3, config.vocab_size, (4, 32))

    def loss_and_grads(autocast: bool = True):
        torch.manual_seed(0)
        model = build_model(config)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            inputs = (ids,) if config.family == "decoder" else (ids, ids)
            loss = model(*inputs, labels=ids).loss
        loss.backward()
        return loss.detach(), {name: p.grad for name, p in model.named_parameters() if p.grad is not None}

    def error(grads: dict, reference: dict) -> float:
        difference = sum((grads[name] - grad).square().sum() for name, grad in reference.items())
        return (difference / sum(grad.square().sum() for grad in reference.values())).sqrt().item()

    _, fp32 = loss_and_grads(autocast=False)
    loss, grads = loss_and_grads()
    _uncast(monkeypatch)
    loss_uncast, grads_uncast = loss_and_grads()
    assert torch.equal(loss, loss_uncast)
    assert grads.keys() == grads_uncast.keys() == fp32.keys()
    assert error(grads, fp32) < 1.1 * error(grads_uncast, fp32)
