"""int8 decoding, weight-only and dynamic (weights and activations): each kernel equals its step-by-step reference,
and a quantized model stays close to the unquantized one."""

import pytest
import torch

from attnkit import ModelConfig, build_model
from attnkit.generate.decoder import generate_tokens
from attnkit.generate.quantize import (
    Int8DynamicLinear,
    Int8Linear,
    dynamic_quantization_available,
    quantize_int8,
    quantize_rows,
)


def test_rows_round_trip_within_half_a_step():
    weight = torch.randn(12, 40)
    q, scales = quantize_rows(weight)
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127
    error = (q.float() * scales[:, None] - weight).abs()
    assert torch.all(error <= scales[:, None] / 2 + 1e-6)


def test_kernel_equals_the_dequantized_reference():
    torch.manual_seed(0)
    layer = Int8Linear(torch.nn.Linear(64, 48))
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    torch.testing.assert_close(layer(x), layer.reference(x), atol=2e-2, rtol=2e-2)
    assert layer(torch.randn(2, 64)).dtype == torch.float32


def test_quantized_decoder_stays_close_and_decodes():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, d_model=64, n_layers=2, n_heads=4, d_ff=128, position="rope",
                         norm="rms", activation="swiglu", bias=False, max_seq_len=64)
    model = build_model(config).eval().to(torch.bfloat16)
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        expected = model(ids).logits.float()
        quantize_int8(model)
        quantized = model(ids).logits.float()
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert (quantized - expected).abs().max() < 0.05 * expected.abs().max()
    tokens = generate_tokens(model, [[1, 2, 3]], max_new_tokens=5, context_len=64)
    assert len(tokens[0]) == 5


# int8-dynamic: weights and activations in int8 ------------------------------------------------------------------
needs_fbgemm = pytest.mark.skipif(dynamic_quantization_available() is not None,
                                  reason=str(dynamic_quantization_available()))


@needs_fbgemm
def test_dynamic_kernel_equals_the_step_by_step_reference():
    """One row (batch-1 decoding) and several rows of very different sizes, with and without a bias."""
    torch.manual_seed(0)
    for bias in (True, False):
        layer = Int8DynamicLinear(torch.nn.Linear(96, 40, bias=bias))
        one_row = torch.randn(1, 1, 96)
        rows = torch.randn(2, 3, 96) * torch.tensor([1e-3, 1.0, 50.0])[:, None]  # (2, 3, 96): rows 1e-3 to 50
        for x in (one_row, rows):
            expected = layer.reference(x)
            torch.testing.assert_close(layer(x), expected, atol=1e-4 * float(expected.abs().max()), rtol=0)


@needs_fbgemm
def test_dynamic_quantization_keeps_each_rows_precision():
    """A row of small numbers beside a row of large ones keeps its own grid: its error stays that of the row
    alone, not a grid 5000 times coarser."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(128, 64, bias=False)
    layer = Int8DynamicLinear(linear)
    small, large = torch.randn(1, 128) * 0.01, torch.randn(1, 128) * 50
    alone = (layer(small) - linear(small)).abs().max()
    beside = (layer(torch.cat([small, large]))[0] - linear(small)[0]).abs().max()
    assert beside < 3 * alone
    assert beside < 0.02 * linear(small).abs().max()


@needs_fbgemm
def test_dynamic_quantized_decoder_stays_close_and_decodes():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=64)
    model = build_model(config).eval()
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        expected = model(ids).logits
        quantize_int8(model, "int8-dynamic")
        quantized = model(ids).logits
    assert any(isinstance(m, Int8DynamicLinear) for m in model.modules())
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert (quantized - expected).abs().max() < 0.05 * expected.abs().max()
    tokens = generate_tokens(model, [[1, 2, 3]], max_new_tokens=5, context_len=64)
    assert len(tokens[0]) == 5


@needs_fbgemm
def test_dynamic_products_do_not_saturate_at_the_extremes():
    """Every weight at +-127 and every activation at the top of its grid: the largest integer products there
    are. With 8-bit activations on a CPU without VNNI these pairs would overflow 16 bits (`reduce_range`)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(768, 256)
    with torch.no_grad():
        linear.weight.copy_(torch.sign(torch.randn(256, 768)) * 0.5)
    layer = Int8DynamicLinear(linear)
    x = torch.rand(1, 768) + 1.0  # all positive, so the codes run up to the grid's top
    expected = layer.reference(x)
    torch.testing.assert_close(layer(x), expected, atol=1e-5 * float(expected.abs().max()), rtol=0)


@needs_fbgemm
def test_dynamic_layer_keeps_one_copy_of_the_weight_as_quantized():
    linear = torch.nn.Linear(64, 48)
    layer = Int8DynamicLinear(linear)
    weight, scales = layer.weight_and_scales()
    expected_weight, expected_scales = quantize_rows(linear.weight)
    assert torch.equal(weight, expected_weight)
    torch.testing.assert_close(scales, expected_scales)
    assert [name for name, _ in layer.named_buffers()] == ["bias"]  # the packed weight is the only weight
