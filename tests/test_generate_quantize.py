"""int8 weight-only decoding: the kernel equals the dequantized reference, and the model stays close."""

import torch

from attnkit import ModelConfig, build_model
from attnkit.generate.decoder import generate_tokens
from attnkit.generate.quantize import Int8Linear, quantize_int8, quantize_rows


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
