"""The native decoding kernels (`generate/native_gemv.py`) around their numbers, which tests/fast_paths.py holds equal
to their references on drawn shapes: the library built once per machine and checked against its digest before each
load; the reasons they cannot run (no compiler, a failed build, a CPU without AVX2 and FMA) and the plan keeping
PyTorch's kernels for them; the wrappers refusing tensors the C code would misread; the layers sending rows beyond
their kernels' to the matrix products; the plan, `attnkit generate` and the tune choosing them; and the one-query
attention kernel (`attend_one`) against the float32 products, with the inputs it refuses and the queries it serves."""

import copy
import hashlib
import json
import re
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from described_cpus import AVX2, AVX512, AVX512_BF16, BASELINE
from torch import Tensor, nn

from attnkit import ModelConfig, build_model, cli
from attnkit.checkpoint import save_model
from attnkit.generate import native_gemv, tune
from attnkit.generate.decode_layout import NATIVE_BF16_ROWS, NATIVE_ROWS, NativeLinear
from attnkit.generate.decoder import generate_tokens
from attnkit.generate.plan import ONE_QUERY_SPEEDUP, plan_inference
from attnkit.generate.quantize import (
    INT4_GROUP,
    NATIVE_QUANTIZED_ROWS,
    NativeInt4Linear,
    NativeInt8Linear,
    int4_reference,
)
from attnkit.layers.kernels import grouped_attention, use_math_kernel
from attnkit.machine import DEFAULT_PROFILE, CpuCapabilities, Profile
from attnkit.tokenize import CharTokenizer


def _require_kernels() -> None:
    """Skip, with the reason, where the native kernels cannot run (built, where needed, under the cache in use)."""
    reason = native_gemv.unavailable()
    if reason is not None:
        pytest.skip(f"the native kernels cannot run here: {reason}")


def _require_avx2() -> None:
    if native_gemv.build_for(CpuCapabilities.detect()) is None:
        pytest.skip("this CPU lacks AVX2 and FMA, which the kernels need before any compiler is asked")


@pytest.fixture
def kernels_dir(tmp_path, monkeypatch):
    """An empty cache home, where the library is looked for and built: the process's loaded library is forgotten
    before and after, so that the tests after this one load the one under the usual cache again."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    native_gemv._library.cache_clear()
    native_gemv._bf16_dot_here.cache_clear()
    yield tmp_path / "cache" / "attnkit" / "kernels"
    native_gemv._library.cache_clear()
    native_gemv._bf16_dot_here.cache_clear()


def _record_builds(monkeypatch) -> list:
    """Each library path `native_gemv._build` is called for, from now on (it still builds)."""
    calls, build = [], native_gemv._build
    monkeypatch.setattr(native_gemv, "_build", lambda cc, level, path: (calls.append(path), build(cc, level, path)))
    return calls


def _kept(kernels_dir):
    """The kept library and its digest file: exactly one of each."""
    libraries, digests = sorted(kernels_dir.glob("gemv-*.so")), sorted(kernels_dir.glob("gemv-*.sha256"))
    assert len(libraries) == 1 and [d.stem for d in digests] == [libraries[0].stem], list(kernels_dir.iterdir())
    return libraries[0], digests[0]


def _int8_product() -> tuple[torch.Tensor, torch.Tensor]:
    """`gemv_i8` on two rows of a small int8 weight, and the same product in float64."""
    torch.manual_seed(0)
    weight, scales, x = torch.randint(-127, 128, (24, 40), dtype=torch.int8), torch.rand(24) / 100, torch.randn(2, 40)
    expected = x.double() @ (weight.double() * scales.double()[:, None]).T
    return native_gemv.gemv_i8(weight, scales, x), expected.float()


# the library: built once, checked before each load -------------------------------------------------------------
def test_the_library_is_built_once_and_loaded_as_kept_afterwards(kernels_dir, monkeypatch):
    built = _record_builds(monkeypatch)
    _require_kernels()
    out, expected = _int8_product()
    torch.testing.assert_close(out, expected)
    assert len(built) == 1
    library, digest = _kept(kernels_dir)
    assert library.name.startswith(f"gemv-{native_gemv.build_for(CpuCapabilities.detect())}-")
    assert digest.read_text().strip() == hashlib.sha256(library.read_bytes()).hexdigest()
    written = library.stat().st_mtime_ns
    native_gemv._library.cache_clear()  # as a new process would: find the kept library, check it, load it
    out, expected = _int8_product()
    torch.testing.assert_close(out, expected)
    assert len(built) == 1 and library.stat().st_mtime_ns == written


@pytest.mark.parametrize("damage", ["library", "digest"])
def test_a_kept_library_that_does_not_match_its_digest_is_built_again_before_it_is_loaded(kernels_dir, tmp_path,
                                                                                       monkeypatch, damage):
    """The damaged copy is kept under a second cache home, a path this process has never loaded (a loaded path would
    be answered from the loader's own table): loading the damaged library unbuilt would fail, and the product with
    it."""
    _require_kernels()
    damaged = tmp_path / "damaged"
    shutil.copytree(kernels_dir, damaged / "attnkit" / "kernels")
    library, digest = _kept(damaged / "attnkit" / "kernels")
    if damage == "library":
        library.write_bytes(b"not a shared library\n")
    else:
        digest.write_text("0" * 64 + "\n")
    monkeypatch.setenv("XDG_CACHE_HOME", str(damaged))
    native_gemv._library.cache_clear()
    built = _record_builds(monkeypatch)
    out, expected = _int8_product()
    torch.testing.assert_close(out, expected)
    assert built == [library]
    assert digest.read_text().strip() == hashlib.sha256(library.read_bytes()).hexdigest()
    assert library.read_bytes().startswith(b"\x7fELF")


# where they cannot run, and the plan without them ------------------------------------------------------------------
def _decoder() -> nn.Module:
    config = ModelConfig(vocab_size=50, d_model=32, n_layers=1, n_heads=4, d_ff=64, max_seq_len=32)
    torch.manual_seed(0)
    return build_model(config).eval()


@pytest.mark.parametrize(("environment", "said"), [
    ({"CC": "no-such-compiler --quiet"}, "$CC is 'no-such-compiler --quiet', which is not a program on PATH"),
    ({"PATH": ""}, "no C compiler found to build them (install gcc, or set $CC)")], ids=["CC missing", "PATH empty"])
def test_without_a_compiler_the_plan_keeps_pytorchs_kernels_and_says_how_to_get_them(kernels_dir, monkeypatch,
                                                                                    environment, said):
    _require_avx2()
    monkeypatch.delenv("CC", raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert native_gemv.unavailable() == said
    plan = plan_inference(_decoder(), "decoder", profile=DEFAULT_PROFILE)
    assert plan.linear == "plain"
    assert "cannot run here" in plan.explain() and said in plan.explain()
    quantized = plan_inference(_decoder(), "decoder", quantize="int8", profile=DEFAULT_PROFILE)
    assert quantized.linear == "int8"
    assert "PyTorch's int8-weight kernel" in quantized.explain() and said in quantized.explain()
    with pytest.raises(RuntimeError, match=f"cannot run here: {re.escape(said)}"):
        native_gemv.gemv_f32(torch.randn(4, 8), torch.randn(1, 8))
    assert not kernels_dir.exists() or not any(kernels_dir.iterdir())


def test_a_failed_build_is_the_reason_and_leaves_nothing_kept(kernels_dir, monkeypatch):
    _require_avx2()
    failing = shutil.which("false")
    if failing is None:
        pytest.skip("no `false` command to stand for a compiler that fails")
    monkeypatch.setenv("CC", failing)
    reason = native_gemv.unavailable()
    assert reason is not None and reason.startswith("building them failed (")
    quantized = plan_inference(_decoder(), "decoder", quantize="int8", profile=DEFAULT_PROFILE)
    assert quantized.linear == "int8" and "building them failed" in quantized.explain()
    assert list(kernels_dir.iterdir()) == []  # no library, no digest, no scratch folder


def test_each_cpu_gets_the_build_its_vector_level_runs(kernels_dir, monkeypatch):
    assert native_gemv.build_for(AVX512) == "avx512" and native_gemv.build_for(AVX2) == "avx2"
    assert native_gemv.build_for(AVX512_BF16) == "avx512_bf16"
    assert native_gemv.build_for(CpuCapabilities(isa="AVX2", flags=frozenset({"avx2"}))) is None  # no FMA
    no_dq = CpuCapabilities(isa="AVX512", flags=AVX512.flags - {"avx512_dq"})
    assert native_gemv.build_for(no_dq) == "avx2"
    assert native_gemv.build_for(BASELINE) is None
    reason = native_gemv.unavailable(BASELINE)
    assert reason is not None and "AVX2 and FMA" in reason and "DEFAULT" in reason
    built = _record_builds(monkeypatch)
    assert native_gemv.unavailable(AVX2) is None  # a plan for another CPU: building there is that machine's affair
    assert built == []


def _require_bf16_dot() -> None:
    _require_kernels()
    if not native_gemv.bf16_dot():
        pytest.skip(f"this CPU reports no AVX512-BF16 ({CpuCapabilities.detect().isa}): no bf16 dot-product kernel")


@pytest.mark.parametrize(("cpu", "layout", "said"), [
    (AVX512_BF16, "native+packed", "AVX512-BF16's dot-product instruction, vdpbf16ps"),
    (AVX512, "native+packed", "widened to fp32 as read, fp32 arithmetic: this CPU reports no AVX512-BF16"),
    (AVX2, "native", "widened to fp32 as read, fp32 arithmetic: this CPU reports no AVX512-BF16"),
])
def test_the_plan_says_bf16_rows_take_the_dot_product_only_where_the_cpu_reports_avx512_bf16(cpu, layout, said):
    assert native_gemv.bf16_dot(cpu) == (cpu is AVX512_BF16)
    profile = Profile(attention={}, decode_linear={"bf16": layout}, source="test")
    plan = plan_inference(_decoder().to(torch.bfloat16), "decoder", cpu=cpu, profile=profile)
    assert plan.linear == layout and said in plan.explain()
    fp32 = plan_inference(_decoder(), "decoder", cpu=cpu, profile=Profile(
        attention={}, decode_linear={"fp32": "native"}, source="test"))
    assert "the weight read as stored, fp32 arithmetic" in fp32.explain() and "vdpbf16ps" not in fp32.explain()


def test_bf16_rows_go_through_the_dot_product_and_fp32_rows_are_widened(monkeypatch):
    _require_bf16_dot()
    torch.manual_seed(0)
    linear = nn.Linear(40, 24).to(torch.bfloat16)
    x = torch.randn(2, 40, dtype=torch.bfloat16)
    expected = F.linear(x.double(), linear.weight.double(), linear.bias.double())
    with torch.no_grad():
        torch.testing.assert_close(NativeLinear(linear)(x).double(), expected, rtol=2**-8, atol=1e-5)
        _refuse(monkeypatch, "gemv_bf16_dot_to_bf16")  # the layer's bf16 output, written so by the kernel
        with pytest.raises(AssertionError, match="gemv_bf16_dot_to_bf16 called"):
            NativeLinear(linear)(x)
        _refuse(monkeypatch, "gemv_bf16_dot")  # the product's fp32 output
        with pytest.raises(AssertionError, match="gemv_bf16_dot called"):
            native_gemv.dense_product(linear.weight, linear.bias.float())(x)
        widened = native_gemv.gemv_bf16(linear.weight, x.float(), linear.bias.float())  # fp32 rows: not rounded
    torch.testing.assert_close(widened.double(), expected, rtol=1e-6, atol=1e-6)


def test_the_dot_products_bf16_output_is_its_fp32_output_rounded_as_pytorch_rounds_it(monkeypatch):
    """A bf16 layer's product writes bf16 itself (no conversion after the call); the numbers are those of the fp32
    sums converted by PyTorch, bit for bit: ties to even, overflow to infinity, NaN, signed zeros, subnormals."""
    _require_bf16_dot()
    torch.manual_seed(0)
    weight, bias = torch.randn(300, 37).bfloat16(), torch.randn(300)
    special = torch.tensor([3e38, -3e38, float("nan"), 0.0, -0.0, 1e-39, float("inf")]).bfloat16()
    weight[:7, 0], weight[:7, 1:] = special, 0  # rows whose sums are these (the bias kept apart: nan + 0 = nan)
    rows = torch.randn(6, 37).bfloat16()
    rows[:, 0] = torch.tensor([1.0, 2.0, -1.0, 0.5, 3.0, 1.0])
    product = native_gemv.dense_product(weight, bias)
    no_bias = native_gemv.dense_product(weight, None)
    for bound in (product, no_bias):
        written = bound(rows, torch.bfloat16)
        assert written.dtype == torch.bfloat16
        assert torch.equal(written.view(torch.int16), bound(rows).to(torch.bfloat16).view(torch.int16))
    # sums exactly halfway between two bf16 numbers round to the even one, as PyTorch's conversion does
    halfway = torch.tensor([[1.0 + 2**-8, 1.0 + 3 * 2**-8, -(1.0 + 2**-8)]])  # (1, 3): fp32 sums on a tie
    tie = native_gemv.dense_product(torch.eye(3).bfloat16(), halfway[0] - 1)
    assert torch.equal(tie(torch.ones(1, 3).bfloat16(), torch.bfloat16), halfway.to(torch.bfloat16))  # 1 + bias
    _refuse(monkeypatch, "gemv_bf16_dot_to_bf16")
    with torch.no_grad(), pytest.raises(AssertionError, match="gemv_bf16_dot_to_bf16 called"):
        NativeLinear(nn.Linear(37, 300).bfloat16())(rows[:1])  # a bf16 layer's one row: written in bf16


def test_where_the_bf16_build_fails_the_avx512_build_serves_without_the_dot_product(kernels_dir, monkeypatch):
    if native_gemv.build_for(CpuCapabilities.detect()) != "avx512_bf16" or isinstance(native_gemv.compiler(), str):
        pytest.skip("this CPU reports no AVX512-BF16, or no compiler is here to build the AVX-512 kernels")
    build = native_gemv._build

    def no_bf16(cc, level, path):
        if level == "avx512_bf16":
            raise OSError("cc: error: unrecognized command-line option '-mavx512bf16'")
        build(cc, level, path)

    monkeypatch.setattr(native_gemv, "_build", no_bf16)
    assert native_gemv.unavailable() is None and not native_gemv.bf16_dot()
    assert _kept(kernels_dir)[0].name.startswith("gemv-avx512-")
    torch.manual_seed(0)
    weight, x = torch.randn(8, 40, dtype=torch.bfloat16), torch.randn(3, 40, dtype=torch.bfloat16)
    torch.testing.assert_close(native_gemv.gemv_bf16(weight, x), (x.double() @ weight.double().T).float())
    with pytest.raises(RuntimeError, match="needs AVX512-BF16"):
        native_gemv.gemv_bf16_dot(weight, x)


# the wrappers refuse what the C code would misread ----------------------------------------------------------------
@pytest.mark.parametrize(("call", "problem"), [
    (lambda: native_gemv.gemv_f32(torch.randn(8, 64, dtype=torch.bfloat16), torch.randn(1, 64)),
     r"weight must be a contiguous CPU torch.float32 tensor .* not a contiguous torch.bfloat16 one"),
    (lambda: native_gemv.gemv_f32(torch.empty(8, 64, device="meta"), torch.randn(1, 64)),
     r"weight must be a contiguous CPU torch.float32 tensor .* on meta"),
    (lambda: native_gemv.gemv_bf16(torch.randn(64, 8, dtype=torch.bfloat16).T, torch.randn(1, 64)),
     r"weight must be a contiguous CPU torch.bfloat16 tensor of shape \(8, 64\), not a strided"),
    (lambda: native_gemv.gemv_f32(torch.randn(8, 64), torch.randn(1, 63)),
     r"expected CPU rows \(M, 64\), got \(1, 63\)"),
    (lambda: native_gemv.gemv_f32(torch.randn(8, 64), torch.randn(64)), r"expected CPU rows \(M, 64\), got \(64,\)"),
    (lambda: native_gemv.gemv_i8(torch.zeros(8, 64, dtype=torch.int8), torch.ones(7), torch.randn(1, 64)),
     r"scales must be a contiguous CPU torch.float32 tensor of shape \(8,\)"),
    (lambda: native_gemv.gemv_f32(torch.randn(8, 64), torch.randn(1, 64), torch.ones(8, dtype=torch.bfloat16)),
     r"bias must be a contiguous CPU torch.float32 tensor of shape \(8,\), not a contiguous torch.bfloat16"),
    (lambda: native_gemv.gemv_i4(torch.zeros(8, 24, dtype=torch.uint8), torch.ones(8, 1), torch.ones(8, 1),
                                 torch.randn(1, 48)), r"groups of 32 inputs; got 48"),
    (lambda: native_gemv.pack_int4(torch.zeros(8, 48, dtype=torch.uint8)), r"groups of 32; got 48"),
    (lambda: native_gemv.pack_int4(torch.full((2, 32), 16)), r"codes must lie in 0..15; got 16..16: clamp"),
    (lambda: native_gemv.pack_int4(torch.arange(-1, 31).view(1, 32)), r"codes must lie in 0..15; got -1..30"),
    (lambda: native_gemv.pack_int4(torch.full((2, 32), 3.7)), r"codes must be integers 0..15, not torch.float32"),
    (lambda: native_gemv.gemv_i4(torch.zeros(8, 32, dtype=torch.uint8), torch.ones(8, 1), torch.ones(8, 2),
                                 torch.randn(1, 64)), r"scales must be .* shape \(8, 2\), not .* of shape \(8, 1\)"),
], ids=["dtype", "meta device", "transposed view", "width", "one row unbatched", "scales", "bias", "int4 width",
        "pack width", "code past 15", "negative code", "float codes", "groups"])
def test_the_wrappers_refuse_tensors_the_kernels_would_misread(call, problem):
    with pytest.raises(ValueError, match=problem):
        call()


def test_4_bit_codes_are_packed_in_q4_0s_order_and_unpacked_back():
    torch.manual_seed(0)
    codes = torch.randint(0, 16, (3, 2 * INT4_GROUP), dtype=torch.uint8)
    packed = native_gemv.pack_int4(codes)
    assert packed.dtype == torch.uint8 and packed.shape == (3, INT4_GROUP)
    half = INT4_GROUP // 2
    for row in range(3):
        for group in range(2):
            base = group * INT4_GROUP
            for j in range(half):
                low, high = int(codes[row, base + j]), int(codes[row, base + j + half])
                assert int(packed[row, group * half + j]) == low | high << 4, (row, group, j)
    assert torch.equal(native_gemv.unpack_int4(packed), codes)  # and back


# the layers: their kernels for few rows, the matrix products for more ----------------------------------------------
def _refuse(monkeypatch, kernel: str) -> None:
    """From now on, the C function `kernel` raises when called, also from a product bound to it (`DenseProduct`)."""
    library = native_gemv._kernel

    def refused(*args):
        raise AssertionError(f"{kernel} called")
    monkeypatch.setattr(native_gemv, "_kernel", lambda name: refused if name == kernel else library(name))


def test_native_linear_keeps_bf16_and_sends_more_rows_than_its_kernel_takes_to_nn_linear(monkeypatch):
    _require_kernels()
    torch.manual_seed(0)
    linear = nn.Linear(48, 24).to(torch.bfloat16)
    x = torch.randn(1, 1, 48, dtype=torch.bfloat16)
    with torch.no_grad():
        out = NativeLinear(linear)(x)
        exact = F.linear(x.float(), linear.weight.float(), linear.bias.float())
    assert out.dtype == torch.bfloat16 and out.shape == (1, 1, 24)
    torch.testing.assert_close(out.float(), exact, rtol=2**-8, atol=1e-5)  # one bf16 rounding of fp32's sums

    _refuse(monkeypatch, "gemv_f32")
    linear = nn.Linear(16, 8)
    layer = NativeLinear(linear)
    several = torch.randn(1, NATIVE_ROWS + 1, 16)
    with torch.no_grad():
        torch.testing.assert_close(layer(several), linear(several))
        with pytest.raises(AssertionError, match="gemv_f32 called"):
            layer(several[:, :NATIVE_ROWS])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_native_layer_whose_tensors_are_replaced_reads_the_new_ones(dtype):
    """The layer's product keeps the weight's address from when it was built; tensors put in its place (`.to`, a
    buffer assigned) are read from the next call on, never the old ones."""
    _require_kernels()
    torch.manual_seed(0)
    layer = NativeLinear(nn.Linear(40, 24).to(dtype))
    x = torch.randn(1, 1, 40, dtype=dtype)

    def expected() -> torch.Tensor:
        return F.linear(x.double(), layer.weight.double(), layer.bias_fp32.double())

    with torch.no_grad():
        layer(x)
        layer.bias_fp32 = torch.randn(24)
        torch.testing.assert_close(layer(x).double(), expected(), rtol=2**-7, atol=1e-4)
        layer.weight = torch.randn(24, 40, dtype=dtype)
        torch.testing.assert_close(layer(x).double(), expected(), rtol=2**-7, atol=1e-4)
        layer.to(torch.float32)  # new tensors for every buffer
        torch.testing.assert_close(layer(x.float()).double(), expected(), rtol=1e-6, atol=1e-5)
        twin = copy.deepcopy(layer)  # a copy's product reads the copy's tensors
        assert twin.product.weight is twin.weight and twin.product.bias is twin.bias_fp32
        torch.testing.assert_close(twin(x.float()), layer(x.float()), rtol=0, atol=0)


@pytest.mark.parametrize(("built", "moved"), [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
def test_a_native_layer_moved_to_another_dtype_decodes_in_it(built, moved):
    """`model.to(dtype)` after the plan (a loaded pipeline's model converted) converts the weight and every buffer, the
    kernel's fp32 bias too: the layer reads the bias widened again, where the kernel refused a bf16 bias."""
    _require_kernels()
    torch.manual_seed(0)
    layer = NativeLinear(nn.Linear(40, 24).to(built))
    with torch.no_grad():
        layer(torch.randn(1, 40, dtype=built))
        layer.to(moved)
        for rows in (1, NATIVE_ROWS + 1):  # the native product, and the matrix product beyond it
            x = torch.randn(rows, 40, dtype=moved)
            expected = F.linear(x.double(), layer.weight.double(), layer.bias.double())
            torch.testing.assert_close(layer(x).double(), expected, rtol=2**-7, atol=1e-2)


@pytest.mark.parametrize(("built", "moved"), [(torch.float32, torch.bfloat16), (torch.bfloat16, torch.float32)])
def test_a_native_layer_moved_to_another_dtype_takes_that_dtypes_row_limit(built, moved, monkeypatch):
    """The rows the native product takes depend on the weight's dtype (`NATIVE_ROWS`, `NATIVE_BF16_ROWS`): a layer
    moved by `.to(dtype)` takes as many as one built in that dtype, never the limit of the dtype it was built in."""
    _require_kernels()
    layer = NativeLinear(nn.Linear(40, 24).to(built)).to(moved)
    assert NativeLinear(nn.Linear(40, 24).to(built)).max_rows != NativeLinear(nn.Linear(40, 24).to(moved)).max_rows
    assert layer.max_rows == NativeLinear(nn.Linear(40, 24).to(moved)).max_rows
    rows = max(NATIVE_ROWS, NATIVE_BF16_ROWS) if moved == torch.bfloat16 else NATIVE_ROWS + 1
    called = []
    monkeypatch.setattr(layer, "rows", lambda x: called.append(x.shape) or F.linear(x, layer.weight))
    with torch.no_grad():
        layer(torch.randn(rows, 40, dtype=moved))
    assert called == ([] if moved == torch.bfloat16 else [(rows, 40)])  # bf16: native; fp32: past its limit


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("how", ["copied in", "assigned", "after to_empty"])
def test_a_native_layer_reads_the_bias_of_a_state_dict_loaded_into_it(dtype, how):
    """The kernel adds an fp32 copy of the bias (`bias_fp32`, not in the state dict): a state dict loaded into the
    layer (copied into its tensors, assigned in their place, or into tensors `to_empty` left uninitialized, as a
    model built on the meta device is loaded) sets that copy too, where the layer went on adding the old bias."""
    _require_kernels()
    torch.manual_seed(0)
    layer, other = NativeLinear(nn.Linear(40, 24).to(dtype)), NativeLinear(nn.Linear(40, 24).to(dtype))
    x = torch.randn(1, 40, dtype=dtype)
    with torch.no_grad():
        layer(x)
        if how == "after to_empty":
            layer.to_empty(device="cpu")
        layer.load_state_dict(other.state_dict(), assign=how == "assigned")
        torch.testing.assert_close(layer(x), other(x), rtol=0, atol=0)
        several = torch.randn(NATIVE_ROWS + 1, 40, dtype=dtype)  # nn.Linear's rows add it too
        torch.testing.assert_close(layer(several), other(several), rtol=0, atol=0)


def test_a_native_int8_layer_whose_scales_are_replaced_reads_the_new_ones():
    _require_kernels()
    torch.manual_seed(0)
    layer = NativeInt8Linear(nn.Linear(40, 24))
    x = torch.randn(1, 40)
    with torch.no_grad():
        layer(x)
        layer.scales = layer.scales * 2  # a new tensor in the buffer's place
        torch.testing.assert_close(layer(x), layer.reference(x), rtol=1e-5, atol=1e-5)
        twin = copy.deepcopy(layer)
        assert twin.product.reads(twin.weight, twin.bias, twin.scales)
        torch.testing.assert_close(twin(x), layer(x), rtol=0, atol=0)


def test_a_native_int8_layer_moved_to_bf16_decodes_bf16_rows():
    """`model.to(torch.bfloat16)` after int8 quantization converts the layer's float buffers (scales, bias) too: the
    kernel reads them widened to fp32 again (bf16-rounded, as `reference` reads them), where it refused bf16 scales."""
    _require_kernels()
    torch.manual_seed(0)
    layer = NativeInt8Linear(nn.Linear(40, 24))
    with torch.no_grad():
        layer(torch.randn(1, 40))
        layer.to(torch.bfloat16)
        x = torch.randn(1, 40, dtype=torch.bfloat16)
        out = layer(x)
        assert out.dtype == torch.bfloat16
        torch.testing.assert_close(out, layer.reference(x), rtol=2**-7, atol=1e-2)


# Each layer's memory is moved under the same tensor object, `.data =` and `share_memory()`, and the old memory freed:
# a product still bound to the old address reads freed memory (numbers of 1e33 where it was measured, or a crash).
MOVED_UNDER_THE_LAYER = """
import sys, torch
from torch import nn
from attnkit.generate.decode_layout import NativeLinear
from attnkit.generate.quantize import NativeInt8Linear
torch.manual_seed(0)
kind = sys.argv[1]
linear = nn.Linear(40, 24)
layer = NativeInt8Linear(linear) if kind == "int8" else NativeLinear(linear.to(getattr(torch, kind)))
x = torch.randn(1, 40, dtype=torch.float32 if kind == "int8" else getattr(torch, kind))
def check(what):
    want = layer.reference(x) if kind == "int8" else nn.functional.linear(x.double(), layer.weight.double(),
                                                                        layer.bias_fp32.double()).to(x.dtype)
    torch.testing.assert_close(layer(x), want, rtol=2**-7, atol=1e-4, msg=lambda m: f"after {what}: {m}")
with torch.no_grad():
    layer(x)
    layer.weight.data = layer.weight.clone() * 2
    check(".data =")
    layer.share_memory()
    layer.weight.mul_(-1)
    if kind == "int8":
        layer.scales.mul_(3)
    else:
        layer.bias_fp32.mul_(3)
    check("share_memory()")
print("read the moved tensors")
"""


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "int8"])
def test_a_native_layer_reads_its_tensors_memory_where_it_moved_under_the_same_tensor(kind):
    """`.data =` and `share_memory()` (as `set_` would) give a layer's tensor new memory under the same object and
    free the old: the bound product reads the new memory, never the old address. In a subprocess: a stale address is a
    use after free."""
    _require_kernels()
    done = subprocess.run([sys.executable, "-c", MOVED_UNDER_THE_LAYER, kind], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and "read the moved tensors" in done.stdout, done.stderr[-2000:]


def test_native_int8_layer_dequantizes_for_more_rows_than_its_kernel_takes(monkeypatch):
    _refuse(monkeypatch, "gemv_i8")
    torch.manual_seed(0)
    layer = NativeInt8Linear(nn.Linear(24, 8))
    x = torch.randn(NATIVE_QUANTIZED_ROWS + 1, 24)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), layer.reference(x))
        with pytest.raises(AssertionError, match="gemv_i8 called"):
            layer(x[:NATIVE_QUANTIZED_ROWS])


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_a_traced_native_layer_keeps_its_row_limit(monkeypatch, form):
    """Traced with a symbolic row count, as the captured step's several-row form is exported, a native quantized layer
    gives its eager numbers bit for bit at row counts about its limit, and its kernel is never handed more rows than
    the limit (beyond it the weight is dequantized for the call, as eagerly)."""
    _require_kernels()
    kernel = {"int8": "gemv_i8", "int4": "gemv_i4"}[form]
    handed, run = [], getattr(native_gemv, kernel)
    monkeypatch.setattr(native_gemv, kernel, lambda *args: handed.append(args[-2].shape[0]) or run(*args))
    torch.manual_seed(0)
    layer = {"int8": NativeInt8Linear, "int4": NativeInt4Linear}[form](nn.Linear(200, 24))
    x = torch.randn(NATIVE_QUANTIZED_ROWS + 8, 200)
    rows = torch.export.Dim("rows", min=2)
    with torch.no_grad():
        traced = torch.export.export(layer, (x[:2],), dynamic_shapes=({0: rows},)).module()
        for count in (2, NATIVE_QUANTIZED_ROWS - 1, NATIVE_QUANTIZED_ROWS, NATIVE_QUANTIZED_ROWS + 1, len(x)):
            torch.testing.assert_close(traced(x[:count]), layer(x[:count]), rtol=0, atol=0, msg=f"{count} rows")
    assert handed and max(handed) <= NATIVE_QUANTIZED_ROWS, handed


def test_native_int4_layer_pads_an_in_width_its_groups_do_not_tile():
    _require_kernels()
    torch.manual_seed(0)
    linear = nn.Linear(172, 16)
    layer = NativeInt4Linear(linear)
    assert layer.padding == 192 - 172 and layer.codes.shape == (16, 192 // 2)
    for rows in (1, NATIVE_QUANTIZED_ROWS + 1):  # the kernel, then the dequantized weight
        x = torch.randn(rows, 172)
        with torch.no_grad():
            torch.testing.assert_close(layer(x), int4_reference(linear, x, native=True), rtol=1e-5, atol=1e-5)


# the plan, the command line and the tune --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("native-run") / "run"
    tokenizer = CharTokenizer("abcdefghijklmnopqrstuvwxyz .:ROME")
    config = ModelConfig(vocab_size=tokenizer.vocab_size, d_model=32, n_layers=1, n_heads=4, d_ff=64, max_seq_len=32)
    torch.manual_seed(0)
    save_model(build_model(config).eval(), config, root)
    tokenizer.save(root / "tokenizer")
    return root


@pytest.mark.parametrize(("options", "linear"), [([], "native"), (["--int8"], "int8-native"),
                                                 (["--int4"], "int4-native")])
def test_generate_explains_a_plan_through_the_native_kernels(char_run, capsys, options, linear):
    """The tests' kept profile is the documented default, which names the native kernels for every form."""
    _require_kernels()
    command = ["generate", str(char_run), *options, "--explain", "--prompt", "ROMEO:", "--max-new-tokens", "3",
               "--temperature", "0"]
    assert cli.main(command) == 0
    printed = capsys.readouterr()
    chosen = [line.split()[2] for line in printed.err.splitlines() if line.strip().startswith("linear layers")]
    assert chosen == [f"{linear}:"], printed.err  # the run is fp32: no bf16 packing
    generated = printed.out.splitlines()
    assert len(generated) == 1 and generated[0].startswith("ROMEO:") and len(generated[0]) == len("ROMEO:") + 3


@pytest.mark.parametrize("form", ["int8", "int4"])
def test_tune_measures_pytorchs_and_the_native_quantized_kernels_where_each_runs(form):
    cpu = CpuCapabilities.detect()
    expected = ({"pytorch"} if form == "int8" or cpu.int4_kernel else set()) | \
        ({"native"} if native_gemv.unavailable(cpu) is None else set())
    times, rows = tune.measure_quantized(form, cpu, tune.QUICK)
    assert set(times) == expected and all(seconds > 0 for seconds in times.values())
    assert len(rows) == len(expected) and all(form in row for row in rows)
    times, rows = tune.measure_quantized(form, BASELINE, tune.QUICK)  # neither is vectorized nor built there
    assert set(times) == ({"pytorch"} if form == "int8" else set()) and len(rows) == len(times)


def test_a_cc_with_a_launcher_in_front_builds_with_it(kernels_dir, monkeypatch):
    """$CC may carry a launcher or flags ("ccache gcc"): the first word is looked up, the rest passed on."""
    _require_avx2()
    gcc, env = shutil.which("gcc") or shutil.which("cc"), shutil.which("env")
    if gcc is None or env is None:
        pytest.skip("needs gcc (or cc) and env on PATH to stand for a launcher in front of a compiler")
    monkeypatch.setenv("CC", f"env {gcc}")
    assert native_gemv.compiler() == [env, gcc]
    assert native_gemv.unavailable() is None
    out, expected = _int8_product()
    torch.testing.assert_close(out, expected)


def test_a_profile_measured_without_the_native_kernels_is_measured_again_once_they_run(kernels_dir, monkeypatch):
    """No compiler at the first plan: the kept profile's choices are made without the native kernels. Once a compiler
    is there, the next plan measures again (and keeps that), rather than keep PyTorch's kernels for good."""
    _require_avx2()
    monkeypatch.delenv("ATTNKIT_PROFILE", raising=False)
    monkeypatch.setattr(tune, "FIRST_USE", tune.QUICK)
    measured = []
    measure = tune.tune
    monkeypatch.setattr(tune, "tune", lambda **kw: measured.append(kw) or measure(**kw))
    monkeypatch.setenv("CC", "no-such-compiler")
    assert plan_inference(_decoder(), "decoder", quantize="int8").linear == "int8"  # measured, kept
    assert len(measured) == 1
    monkeypatch.delenv("CC")
    native_gemv._library.cache_clear()
    plan = plan_inference(_decoder(), "decoder", quantize="int8")
    assert len(measured) == 2 and "native" in plan.explain()  # measured again, now with the native kernels
    plan_inference(_decoder(), "decoder", quantize="int8")
    assert len(measured) == 2  # and kept


# one decoding query's attention -------------------------------------------------------------------------------------
def _one_query_inputs(q_shape: tuple[int, ...], k_shape: tuple[int, ...], v: str = "same") -> tuple[Tensor, ...]:
    """q and k of these shapes, v like k: "same", "shorter" (a key fewer), "meta" (no memory to read), "strided" (every
    other element along D) or "grad" (q asking for a gradient)."""
    q, k = torch.randn(q_shape), torch.randn(k_shape)
    values = {"same": k.clone(), "shorter": k[:, :, 1:].clone(), "meta": k.to("meta"),
              "strided": torch.randn(*k_shape[:-1], 2 * k_shape[-1])[..., ::2], "grad": k.clone()}[v]
    return q.requires_grad_(v == "grad"), k, values


@pytest.mark.parametrize(("q_shape", "k_shape", "v", "problem"), [
    ((1, 2, 2, 8), (1, 2, 5, 8), "same", "two queries a head"),
    ((1, 2, 1, 8), (1, 2, 0, 8), "same", "no keys"),
    ((1, 3, 1, 8), (1, 2, 5, 8), "same", "query heads not a multiple of key heads"),
    ((1, 2, 1, 8), (1, 0, 5, 8), "same", "no key heads"),
    ((1, 2, 1, 8), (1, 2, 5, 4), "same", "another head width"),
    ((2, 2, 1, 8), (1, 2, 5, 8), "same", "another batch"),
    ((1, 2, 1, 8), (2, 5, 8), "same", "keys without a batch dimension"),
    ((1, 2, 1, 8), (1, 2, 5, 8), "shorter", "values of another shape"),
    ((1, 2, 1, 8), (1, 2, 5, 8), "meta", "values in no memory"),
    ((1, 2, 1, 8), (1, 2, 5, 8), "strided", "values strided along D"),
    ((1, 2, 1, 8), (1, 2, 5, 8), "grad", "a query asking for a gradient"),
])
def test_the_one_query_kernel_refuses_inputs_it_would_misread(q_shape, k_shape, v, problem):
    """Each is refused with a ValueError (never read: the meta tensor's address ended the process before), and the
    plan's kernel declines it, so that attention takes the float32 products."""
    _require_kernels()
    q, k, values = _one_query_inputs(q_shape, k_shape, v)
    with pytest.raises(ValueError, match="attend_one takes one CPU query a head"):
        native_gemv.attend_one(q, k, values, 0.5)
    assert native_gemv.attend_one_query(q, k, values, 0.5) is None
    if v == "grad":
        with torch.no_grad():  # no gradient asked for: the kernel serves
            torch.testing.assert_close(native_gemv.attend_one(q, k, values, 0.5),
                                       grouped_attention(q, k, values, None, scale=0.5))


def test_the_one_query_kernel_declines_values_of_another_dtype():
    _require_kernels()
    q, k = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 5, 8)  # (B, H, 1, D), (B, Hkv, S, D)
    assert native_gemv.attend_one_query(q, k, k.clone(), 0.5) is not None
    assert native_gemv.attend_one_query(q, k, k.half(), 0.5) is None


def test_the_plan_hands_bf16_decoding_the_one_query_kernel_and_attention_takes_it(monkeypatch):
    """Eager bf16 decoding on a CPU where the kernels run gets the native one-query kernel inside its math kernel
    (`--explain` says so); a compiled step, which cannot call into C, and fp32, where SDPA is as fast, do not. A
    decoding step of the planned model calls it, and the tokens are those of the float32 products."""
    _require_kernels()
    model = build_model(ModelConfig(family="decoder", vocab_size=40, d_model=32, n_layers=2, n_heads=4,
                                    max_seq_len=64)).eval().to(torch.bfloat16)
    plan = plan_inference(model, "decoder", profile=DEFAULT_PROFILE)
    assert plan.math_kernel.one_query is native_gemv.attend_one_query
    assert "the native kernel for one decoding query" in plan.explain()
    compiled = plan_inference(model, "decoder", profile=DEFAULT_PROFILE, compile=True).math_kernel
    assert compiled is None or compiled.one_query is None
    assert plan_inference(model.float(), "decoder", profile=DEFAULT_PROFILE).math_kernel is None  # fp32: SDPA
    model.to(torch.bfloat16)
    plan.apply(model)
    prompt = [[3, 1, 4, 1, 5, 9, 2, 6]]
    with_kernel = generate_tokens(model, prompt, max_new_tokens=6, context_len=64)
    calls = []  # the kernel asked, and declining (the products then serve)
    monkeypatch.setattr(native_gemv, "attends_one", lambda *args: calls.append(args) or False)
    generate_tokens(model, prompt, max_new_tokens=2, context_len=64)
    assert len(calls) == 2  # one decoding step, two layers (the prefill's queries are many)
    monkeypatch.undo()
    use_math_kernel(model, replace(plan.math_kernel, one_query=None))
    assert generate_tokens(model, prompt, max_new_tokens=6, context_len=64) == with_kernel


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("special", ["nan query", "inf key", "inf value", "nan value", "huge scores", "subnormal",
                                     "every key -inf"])
def test_the_one_query_kernel_meets_special_values_as_the_float32_products_do(special, dtype):
    """nan and inf reach the same outputs as `grouped_attention`'s (a row whose softmax is undefined is nan in both),
    scores past fp32's range keep the softmax's shift by the largest, and subnormal inputs are not flushed."""
    _require_kernels()
    torch.manual_seed(0)
    q, k, v = (torch.randn(shape, dtype=dtype) for shape in ((1, 4, 1, 8), (1, 2, 6, 8), (1, 2, 6, 8)))
    if special == "nan query":
        q[0, 0, 0, 3] = float("nan")
    elif special == "inf key":
        k[0, 0, 2, 1] = float("inf")
    elif special in ("inf value", "nan value"):
        v[0, 1, 4, 5] = float(special.split()[0])
    elif special == "huge scores":
        q *= 1e30
    elif special == "subnormal":
        q *= 1e-39
        v *= 1e-39
    else:
        q.fill_(1.0)
        k.fill_(float("-inf"))
    out, products = native_gemv.attend_one(q, k, v, 0.3), grouped_attention(q, k, v, None, scale=0.3)
    torch.testing.assert_close(out, products, equal_nan=True, rtol=1e-5,  # fp32 sums in another order
                               atol=1e-44 if special == "subnormal" else 1e-6)
    if special == "subnormal":
        assert out.abs().max() < torch.finfo(torch.float32).tiny and out.abs().max() > 0


def _step_logits(model: nn.Module, *, rolling: bool) -> Tensor:
    """The last logits (V,) of a prompt of 8 and of 8 decoding steps after it through a 24-position cache -> (9, V)."""
    cache = model.allocate_cache(1, 24, rolling=rolling)
    with torch.no_grad():
        out = [model(torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]]), cache=cache).logits[0, -1]]
        out += [model(torch.tensor([[token]]), cache=cache).logits[0, -1] for token in range(7, 15)]
    return torch.stack(out).float()


@pytest.mark.parametrize(("variant", "keys_read"), [
    ({"attention_window": 4}, {True: {4}, False: set()}),  # a rolling cache holds the window; a full one is masked
    ({"attention_window": 4, "global_every": 2}, {True: {4, *range(9, 17)}, False: set(range(9, 17))}),
    ({"position": "alibi"}, {True: set(), False: set()}),  # a score bias: never the kernel
    ({"position": "relative"}, {True: set(), False: set()}),  # Shaw's bias and value term: never the kernel
    ({"attn_softcap": 0.5}, {True: set(), False: set()}),  # soft-capped scores: never the kernel
], ids=["window", "window, global layers", "alibi", "relative", "soft-cap"])
def test_the_one_query_kernel_serves_only_the_queries_that_see_every_key_they_are_given(variant, keys_read,
                                                                                        monkeypatch):
    """A decoding query whose window hides cached keys, whose scores take ALiBi's bias or a soft cap, goes to the
    paths that apply them; the kernel reads only what the query sees (a rolling cache's window, a global layer's
    keys), and each step's logits are those of the float32 products bit for bit."""
    _require_kernels()
    torch.manual_seed(0)
    model = build_model(ModelConfig(family="decoder", vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                                    max_seq_len=24, **variant)).eval().to(torch.bfloat16)
    plan = plan_inference(model, "decoder", profile=DEFAULT_PROFILE)
    plan.apply(model)
    takes = native_gemv.attends_one
    for rolling in (True, False):
        lengths = []  # the key count of each call the kernel takes

        def counted(q: Tensor, k: Tensor, v: Tensor, lengths: list[int] = lengths) -> bool:
            taken = takes(q, k, v)
            if taken:
                lengths.append(k.shape[2])
            return taken

        monkeypatch.setattr(native_gemv, "attends_one", counted)
        served = _step_logits(model, rolling=rolling)
        monkeypatch.undo()
        assert set(lengths) == keys_read[rolling]
        use_math_kernel(model, replace(plan.math_kernel, one_query=None))
        assert torch.equal(served, _step_logits(model, rolling=rolling))
        use_math_kernel(model, plan.math_kernel)


def test_the_plans_one_query_figures_are_those_its_results_file_records():
    """`plan.ONE_QUERY_SPEEDUP` is each dtype's range of the float32 products over the native kernel in the results
    file, and the plan quotes its own dtype's."""
    results = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "decode-attention-cpu.json"
    kernels = json.loads(results.read_text())["kernels"]
    ratios = {dtype: [row["math_over_native"] for row in rows] for dtype, rows in kernels.items()}
    assert ONE_QUERY_SPEEDUP == {dtype: (round(min(each), 1), round(max(each), 1)) for dtype, each in ratios.items()}
    _require_kernels()
    limits = DEFAULT_PROFILE.attention["bf16"]
    fp32_products = replace(DEFAULT_PROFILE, attention={**DEFAULT_PROFILE.attention, "fp32": limits})
    plan = plan_inference(_decoder(), "decoder", profile=fp32_products)  # fp32 decoding sent to the products
    assert plan.math_kernel.one_query is native_gemv.attend_one_query
    assert "(1.4-2.7x faster than the float32 products, measured)" in plan.explain()
