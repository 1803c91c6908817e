"""Decoding layouts give the same numbers: fused q/k/v projections, and transposed weights for fp32 CPU decoding
and packed weights for bf16 (`attnkit.load` applying them is tested with the pipeline)."""

import pytest
import torch

from attnkit import ModelConfig, build_model
from attnkit.errors import InputError
from attnkit.generate import native_gemv
from attnkit.generate.decode_layout import (
    GemvLinear,
    GemvPackedLinear,
    NativePackedLinear,
    PackedLinear,
    TransposedLinear,
    fuse_qkv_projections,
    gemv_pack_linear_weights,
    pack_linear_weights,
    transpose_linear_weights,
)
from attnkit.generate.decoder import generate_tokens
from attnkit.generate.plan import plan_inference
from attnkit.generate.seq2seq import greedy_translate
from attnkit.generate.swap import remove_dropout_layers
from attnkit.layers.attention import Attention
from attnkit.machine import CpuCapabilities

CPU = CpuCapabilities.detect()
needs_onednn_bf16 = pytest.mark.skipif(
    not CPU.onednn_bf16, reason=f"oneDNN packs bf16 weights only with AVX-512 BW/VL/DQ or AVX-NE-CONVERT; this CPU "
    f"reports {CPU.isa} (the plan's fallback is tested in test_generate_plan.py)")


@pytest.mark.parametrize("bias", [True, False])
def test_transposed_layer_equals_the_linear_layer(bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(24, 40, bias=bias)
    layer = TransposedLinear(linear)
    assert layer.weight_t.shape == (24, 40) and layer.weight_t.is_contiguous()
    for x in (torch.randn(1, 1, 24), torch.randn(3, 5, 24), torch.randn(7, 24)):
        torch.testing.assert_close(layer(x), linear(x), atol=1e-6, rtol=1e-5)


@needs_onednn_bf16
@pytest.mark.parametrize("bias", [True, False])
def test_packed_layer_equals_the_bf16_linear_layer_bit_for_bit(bias):
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 72, bias=bias).to(torch.bfloat16)
    layer = PackedLinear(linear)
    assert layer.weight_packed.is_mkldnn  # the weight lives in oneDNN's layout, packed once
    x = torch.randn(3, 5, 48, dtype=torch.bfloat16)
    for rows in (x[:1, :1], x, x[:, -1], x.reshape(15, 48)):  # one row, several, a strided view
        assert torch.equal(layer(rows), linear(rows))


@needs_onednn_bf16
@pytest.mark.parametrize(("swap", "bit_for_bit"), [(pack_linear_weights, True), (gemv_pack_linear_weights, False)])
def test_bf16_decoding_layouts_give_the_same_tokens(swap, bit_for_bit):
    """Packed: the same logits bit for bit. Packed plus ATen's kernel for single rows: the same tokens, batch 1
    (single rows) and 2 (several)."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=60, d_model=32, n_layers=2, n_heads=4, d_ff=64, position="learned",
                         max_seq_len=40, tie_embeddings=True)
    model = build_model(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, 60, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
    prompts = [[1, 2, 3], [4]]
    expected_tokens = [generate_tokens(model, batch, max_new_tokens=12, context_len=40)
                       for batch in (prompts[:1], prompts)]
    swap(model)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    if bit_for_bit:
        with torch.no_grad():
            assert torch.equal(model(ids).logits, expected)
    assert [generate_tokens(model, batch, max_new_tokens=12, context_len=40)
            for batch in (prompts[:1], prompts)] == expected_tokens


@needs_onednn_bf16
@pytest.mark.parametrize("bias", [True, False])
def test_gemv_packed_layer_takes_each_path_and_gives_the_linear_layers_numbers(bias, monkeypatch):
    """One row through ATen's matrix-vector kernel, several through the packed weight; oneDNN is on again after
    each one-row product, also when it raises."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40, bias=bias).to(torch.bfloat16)
    layer = GemvPackedLinear(linear)
    x = torch.randn(3, 5, 96, dtype=torch.bfloat16)
    for rows in (x, x[:, -1]):  # several rows, a strided view
        torch.testing.assert_close(layer(rows), linear(rows), atol=1e-2, rtol=1e-2)
    assert torch.equal(layer(x), layer.packed(x))  # several rows: the packed product itself
    monkeypatch.setattr(type(layer.packed), "forward", lambda self, rows: pytest.fail("one row went to the packed "
                                                                                        "weight"))
    for rows in (x[:1, :1], x[0, 0]):  # one row, 3-D and 1-D: ATen's kernel, with oneDNN off
        with torch.backends.mkldnn.flags(enabled=False):
            expected = torch.nn.functional.linear(rows, linear.weight, linear.bias)
        assert torch.equal(layer(rows), expected)
        assert torch.backends.mkldnn.enabled
    with pytest.raises(RuntimeError):
        layer(torch.randn(1, 96))  # one row in fp32 against bf16 weights: the one-row product fails
    assert torch.backends.mkldnn.enabled


@needs_onednn_bf16
@pytest.mark.parametrize("layout", [GemvPackedLinear, NativePackedLinear])
def test_a_state_dict_loaded_into_a_packed_layer_reaches_its_packed_weight_too(layout):
    """A layer holding its weight twice (as loaded for one row, packed by oneDNN for several) saves the first alone;
    a state dict loaded into it packs the loaded weight again, where several rows went on through the old one."""
    if layout is NativePackedLinear and native_gemv.unavailable() is not None:
        pytest.skip(f"the native kernels cannot run here: {native_gemv.unavailable()}")
    torch.manual_seed(0)
    layer, other = (layout(torch.nn.Linear(40, 24).to(torch.bfloat16)) for _ in range(2))
    x = torch.randn(8, 40, dtype=torch.bfloat16)
    with torch.no_grad():
        layer(x)
        layer.load_state_dict(other.state_dict())
        for rows in (x[:1], x):  # one row, several
            assert torch.equal(layer(rows), other(rows))


def test_gemv_layer_reads_one_bf16_row_through_atens_kernel_and_several_through_nn_linear(monkeypatch):
    """Where oneDNN cannot pack bf16: one row with oneDNN off (ATen's kernel, fp32 arithmetic), several as nn.Linear
    computes them; oneDNN is on again after each one-row product."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 40).to(torch.bfloat16)
    layer = GemvLinear(linear)
    x = torch.randn(3, 5, 96, dtype=torch.bfloat16)
    assert torch.equal(layer(x), linear(x))
    for rows in (x[:1, :1], x[0, 0]):
        with torch.backends.mkldnn.flags(enabled=False):
            expected = torch.nn.functional.linear(rows, linear.weight, linear.bias)
        assert torch.equal(layer(rows), expected) and torch.backends.mkldnn.enabled
    exact = rows.double() @ linear.weight.double().t() + linear.bias.double()
    torch.testing.assert_close(layer(rows).double(), exact, atol=2e-2, rtol=1e-2)


@pytest.mark.skipif(CPU.onednn_bf16, reason="this CPU packs bf16 weights; the refusal is for CPUs that cannot")
def test_packing_is_refused_with_the_reason_where_onednn_cannot_pack():
    with pytest.raises(InputError, match="AVX-512"):
        PackedLinear(torch.nn.Linear(8, 8).to(torch.bfloat16))


def test_transposed_decoder_gives_the_same_logits_and_tokens():
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=60, d_model=32, n_layers=2, n_heads=4, d_ff=64, position="learned",
                         max_seq_len=40, tie_embeddings=True)
    model = build_model(config).eval()
    ids = torch.randint(0, 60, (2, 9))
    with torch.no_grad():
        expected = model(ids).logits
    expected_tokens = generate_tokens(model, [[1, 2, 3], [4]], max_new_tokens=12, context_len=40)
    table = model.stack.embeddings.token.weight.clone()
    transpose_linear_weights(model)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert torch.equal(model.stack.embeddings.token.weight, table)  # the tied table keeps its own layout
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, expected, atol=1e-5, rtol=1e-5)
    assert generate_tokens(model, [[1, 2, 3], [4]], max_new_tokens=12, context_len=40) == expected_tokens


def _greedy(model, family, sources):
    if family == "decoder":
        return generate_tokens(model, sources, max_new_tokens=10, context_len=40)
    return greedy_translate(model, sources, bos_id=1, eos_id=2, pad_id=0, max_length=10)


@pytest.mark.parametrize("family", ["decoder", "encoder-decoder"])
def test_fused_qkv_models_decode_and_translate_the_same_tokens(family):
    torch.manual_seed(0)
    config = ModelConfig(family=family, vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64,
                         position="rope" if family == "decoder" else "sinusoidal", max_seq_len=40)
    model = build_model(config).eval()
    sources = [[5, 6, 7, 8], [9, 10]]
    expected = _greedy(model, family, sources)
    fuse_qkv_projections(model)
    attentions = [m for m in model.modules() if isinstance(m, Attention)]
    fused = [m for m in attentions if m.qkv_proj is not None]
    assert len(fused) == (2 if family == "decoder" else 4)  # every block's self-attention
    assert all(hasattr(m, "q_proj") for m in attentions if m.qkv_proj is None)  # cross-attention keeps its own
    assert len(attentions) == len(fused) + (0 if family == "decoder" else 2)
    assert _greedy(model, family, sources) == expected


def test_removing_dropout_layers_changes_no_number():
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=2, d_ff=64, dropout=0.3,
                                    max_seq_len=16)).eval()
    ids = torch.randint(0, 40, (2, 10))
    with torch.no_grad():
        expected = model(ids).logits
        assert any(isinstance(m, torch.nn.Dropout) for m in model.modules())
        remove_dropout_layers(model)
        assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
        assert torch.equal(model(ids).logits, expected)


def test_the_plan_replaces_every_dropout_layer_and_says_so():
    """Dropout is skipped one way at inference: the plan swaps each layer for nn.Identity, in every family (the
    layers themselves call it in every mode)."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=2, d_ff=64, dropout=0.3,
                                    max_seq_len=16))
    plan = plan_inference(model, "decoder")
    assert "dropout" in plan.explain() and "replaced by nn.Identity" in plan.explain()
    plan.apply(model)
    assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())


_DROPOUT_FAMILIES = {  # every family a run can hold, at a tiny size, with dropout on
    "decoder": dict(d_model=16, n_heads=2, d_ff=32, n_layers=1),
    "encoder": dict(d_model=16, n_heads=2, d_ff=32, n_layers=1),
    "encoder-decoder": dict(d_model=16, n_heads=2, d_ff=32, n_layers=1),
    "recurrent-lm": dict(cell="lstm", n_layers=2),
    "recurrent-seq2seq": dict(cell="gru", hidden_size=8, attention="luong-dot"),
    "conv-lm": {},
    "feedforward-lm": {},
}


@pytest.mark.parametrize("family", sorted(_DROPOUT_FAMILIES))
def test_dropout_drops_in_training_and_the_plan_removes_it_for_inference(family):
    """The layers call their dropout in every mode (no `if self.training` of their own): training draws a new mask
    each call, eval mode passes inputs through, and the plan's nn.Identity swap leaves eval's numbers unchanged."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(family=family, vocab_size=12, max_seq_len=16, dropout=0.5,
                                    **_DROPOUT_FAMILIES[family]))
    ids = torch.randint(0, 12, (2, 6))
    inputs = (ids, ids) if "seq2seq" in family or family == "encoder-decoder" else (ids,)
    model.train()
    first, second = model(*inputs).logits, model(*inputs).logits
    assert not torch.equal(first, second), "training drew the same dropout mask twice (or none)"
    model.eval()
    with torch.no_grad():
        expected = model(*inputs).logits
        plan_inference(model, family).apply(model)
        assert not any(isinstance(m, torch.nn.Dropout) for m in model.modules())
        assert torch.equal(model(*inputs).logits, expected)
