"""Add & Norm and the feed-forward network against PyTorch's own modules and formulas."""

import torch
import torch.nn.functional as F

from attnkit.layers.feedforward import FeedForward, SwiGLU
from attnkit.layers.norms import LayerNorm, RMSNorm, layer_norm_reference


def test_layer_norm_equals_torch_and_the_written_out_formula():
    ours = LayerNorm(24, eps=1e-5)
    reference = torch.nn.LayerNorm(24, eps=1e-5)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
        reference.weight.copy_(ours.weight)
        reference.bias.copy_(ours.bias)
    x = torch.randn(3, 5, 24) * 4 + 2
    torch.testing.assert_close(ours(x), reference(x))
    torch.testing.assert_close(layer_norm_reference(x, ours.weight, ours.bias, 1e-5), reference(x))
    assert LayerNorm(24, bias=False).bias is None


def test_rms_norm_against_float64():
    norm = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(4, 16)
    x64 = x.double()
    expected = x64 / torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight.double()
    torch.testing.assert_close(norm(x).double(), expected, atol=1e-5, rtol=1e-5)
    # RMSNorm does not centre: a shifted input gives a different output, unlike LayerNorm
    assert not torch.allclose(norm(x + 3), norm(x))


def test_feedforward_activations():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8)
    for name, act in [("relu", F.relu), ("gelu", F.gelu), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"))]:
        ffn = FeedForward(8, 32, activation=name)
        expected = ffn.down_proj(act(ffn.up_proj(x)))
        torch.testing.assert_close(ffn(x), expected)
    swiglu = SwiGLU(8, 20)
    expected = swiglu.down_proj(F.silu(swiglu.gate_proj(x)) * swiglu.up_proj(x))
    torch.testing.assert_close(swiglu(x), expected)
    assert sum(p.numel() for p in swiglu.parameters()) == 3 * 8 * 20
