"""Quantized decoding, int8 weight-only and dynamic (weights and activations) and int4 weight-only: each kernel
equals its step-by-step reference, and a quantized model stays close to the unquantized one."""

import os
import subprocess
import sys

import hypothesis.strategies as st
import pytest
import torch
from fast_paths import AVX2_ENV
from hypothesis import given, settings

from attnkit import ModelConfig, build_model
from attnkit.checkpoint import save_model
from attnkit.generate.decoder import generate_tokens
from attnkit.generate.quantize import (
    INT4_GROUP,
    Int4Linear,
    Int8DynamicLinear,
    Int8Linear,
    dynamic_quantization_available,
    int4_grid,
    int4_reference,
    quantize_groups,
    quantize_rows,
    quantize_weights,
)
from attnkit.machine import CpuCapabilities
from attnkit.tokenize import CharTokenizer


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


LLAMA_BLOCK = dict(position="rope", norm="rms", activation="swiglu", bias=False)


def _quantized_logits(form, kind, dtype=torch.float32, **block):
    """A small random decoder's logits before and after `quantize_weights(model, form)`, once every linear layer
    is a `kind` and the quantized model decodes."""
    torch.manual_seed(0)
    config = ModelConfig(vocab_size=50, d_model=64, n_layers=2, n_heads=4, d_ff=128, max_seq_len=64, **block)
    model = build_model(config).eval().to(dtype)
    ids = torch.randint(0, 50, (2, 12))
    with torch.no_grad():
        expected = model(ids).logits.float()
        quantize_weights(model, form)
        quantized = model(ids).logits.float()
    assert any(isinstance(m, kind) for m in model.modules())
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert len(generate_tokens(model, [[1, 2, 3]], max_new_tokens=5, context_len=64)[0]) == 5
    return expected, quantized


def test_quantized_decoder_stays_close_and_decodes():
    expected, quantized = _quantized_logits("int8", Int8Linear, torch.bfloat16, **LLAMA_BLOCK)
    assert (quantized - expected).abs().max() < 0.05 * expected.abs().max()


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
    expected, quantized = _quantized_logits("int8-dynamic", Int8DynamicLinear)
    assert (quantized - expected).abs().max() < 0.05 * expected.abs().max()


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


# int4: 4-bit weights in groups ---------------------------------------------------------------------------------
needs_int4_kernel = pytest.mark.skipif(not CpuCapabilities.detect().int4_kernel,
                                       reason="PyTorch's CPU int4 kernel is vectorized only for AVX2 and AVX-512")


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 5), groups=st.integers(1, 4), scale=st.floats(1e-3, 1e3), seed=st.integers(0, 2**16))
def test_int4_groups_round_trip_within_half_a_step(rows, groups, scale, seed):
    weight = torch.randn(rows, groups * INT4_GROUP, generator=torch.Generator().manual_seed(seed)) * scale
    codes, scales, zeros = quantize_groups(weight)
    assert codes.min() >= 0 and codes.max() <= 15
    steps = scales.repeat_interleave(INT4_GROUP, dim=1)  # (N, K): each weight's own group's step
    restored = (codes.float() - 8) * steps + zeros.repeat_interleave(INT4_GROUP, dim=1)
    assert torch.all((restored - weight).abs() <= steps / 2 + 1e-5 * scale)


@needs_int4_kernel
def test_int4_kernel_equals_the_dequantized_product():
    """50 output rows (not a multiple of the kernel's 16: zero rows are added and cut) and a bias."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(96, 50)
    layer = Int4Linear(linear)
    x = torch.randn(3, 5, 96)
    expected = int4_reference(linear, x)
    out = layer(x)
    assert out.shape == (3, 5, 50) and out.dtype == torch.float32
    torch.testing.assert_close(out, expected, atol=2e-2 * float(expected.abs().max()), rtol=0)
    last = layer(x.bfloat16()[:, -1])  # a strided view in bf16: the last position of each row, as decoding reads it
    torch.testing.assert_close(last.float(), expected[:, -1], atol=2e-2 * float(expected.abs().max()), rtol=0)


def test_int4_reference_is_the_dequantized_grid():
    """The reference dequantizes `quantize_groups`' codes: (code - 8) * scale + zero, scales and zeros in bf16."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 8, bias=False)
    codes, scales, zeros = quantize_groups(linear.weight)
    weight = ((codes.float() - 8) * scales.bfloat16().float().repeat_interleave(INT4_GROUP, 1)
              + zeros.bfloat16().float().repeat_interleave(INT4_GROUP, 1))
    x = torch.randn(3, 64)
    torch.testing.assert_close(int4_reference(linear, x), x.bfloat16().float() @ weight.t())


@needs_int4_kernel
def test_int4_decoder_logits_stay_close_to_fp32():
    """Stated tolerance: logits within 15% of fp32's (relative norm of the difference). 4-bit codes over a group's
    range of about 4 standard deviations leave each weight off by up to 1/30 of that range, about 8% of its size
    in rms, and the errors of two layers add in part; int8 on the same model stays within 1%."""
    expected, quantized = _quantized_logits("int4", Int4Linear, **LLAMA_BLOCK)
    assert (quantized - expected).norm() < 0.15 * expected.norm()


def test_int4_pads_a_row_its_groups_do_not_tile_with_its_last_weight():
    """40 inputs: a second group of 8 weights and 24 copies of the last, so its range is its own 8 weights'."""
    torch.manual_seed(0)
    weight = torch.randn(3, 40)
    codes, scales, zeros = int4_grid(weight)
    assert codes.shape == (3, 64)
    assert torch.equal(codes[:, 40:], codes[:, 39:40].expand(3, 24))
    _, own_scales, own_zeros = quantize_groups(weight[:, 32:40], group=8)
    torch.testing.assert_close(scales[:, 1:], own_scales)
    torch.testing.assert_close(zeros[:, 1:], own_zeros)


# end to end: the width that crashed ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def d_ff_172_run(tmp_path_factory):
    """A tiny LM whose FFN takes 172 inputs: not a multiple of the 8 or 16 inputs PyTorch's int8 kernel reads."""
    root = tmp_path_factory.mktemp("d-ff-172") / "run"
    tokenizer = CharTokenizer("abcdefghijklmnopqrstuvwxyz .:ROME")  # no newline: one line per command
    config = ModelConfig(vocab_size=tokenizer.vocab_size, d_model=64, n_layers=2, n_heads=4, d_ff=172,
                         max_seq_len=64)
    torch.manual_seed(0)
    save_model(build_model(config).eval(), config, root)
    tokenizer.save(root / "tokenizer")
    return root


@pytest.mark.skipif(not torch.backends.cpu.get_cpu_capability().startswith("AVX"),
                    reason="needs a CPU with AVX2 to run PyTorch's AVX2 kernels")
@pytest.mark.parametrize(("kernel", "padded"), [("pytorch", ["(172 -> 176)", "(172 -> 192)"]),
                                                ("native", ["int8-native", "(172 -> 192)"])])
def test_quantized_generation_with_an_in_width_of_172_completes_under_avx2_kernels(d_ff_172_run, tmp_path, kernel,
                                                                                  padded):
    """`attnkit generate RUN --int8` crashed (signal 11) on AVX2 CPUs for this width with a prompt of several tokens,
    and `--int4` with it. Both commands here, through the command line's entry point in one subprocess (one start)
    with PyTorch's and oneDNN's AVX2 kernels, with the profile choosing PyTorch's int8 and int4 kernels, then the
    native ones (which take in-width 172 as it is for int8, and pad it to int4's groups)."""
    commands = [["generate", str(d_ff_172_run), form, "--explain", "--prompt", "ROMEO:", "--max-new-tokens", "5",
                 "--temperature", "0"] for form in ("--int8", "--int4")]
    profile = tmp_path / "profile.json"  # written in the subprocess: the CPU it describes is the AVX2 one it sees
    script = (f"import dataclasses, sys, torch; from attnkit import cli; from attnkit.machine import DEFAULT_PROFILE, "
              f"CpuCapabilities; open({str(profile)!r}, 'w').write(dataclasses.replace(DEFAULT_PROFILE, "
              f"decode_linear={{'int8': {kernel!r}, 'int4': {kernel!r}}}, cpu=CpuCapabilities.detect(), "
              f"torch_version=torch.__version__).to_json()); sys.exit(max(cli.main(c) for c in {commands!r}))")
    env = {**os.environ, **AVX2_ENV, "OMP_NUM_THREADS": "1", "ATTNKIT_PROFILE": str(profile)}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr[-2000:]}"
    generated = result.stdout.splitlines()
    assert len(generated) == 2 and all(line.startswith("ROMEO:") and len(line) == len("ROMEO:") + 5
                                       for line in generated), result.stdout
    assert all(said in result.stderr for said in padded), result.stderr  # each plan says its kernel and padding
