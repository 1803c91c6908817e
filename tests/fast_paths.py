"""Every fast linear and attention path held equal to its reference on drawn shapes: the worker that
`test_fast_paths_property.py` runs in a subprocess, so that a kernel that crashes (a segfault in a C++ kernel) fails
a test instead of ending the run.

    python tests/fast_paths.py --examples 4            each path: its pinned cases, then 4 drawn ones
    python tests/fast_paths.py --examples 50 int8      one path

Shapes are drawn as users' models have them: in- and out-widths odd, prime or just past a power of two (1 to 300),
1 to 17 rows (1 to 64 for the native quantized layers traced as a captured step traces them, about their row
limit), inputs that are views into a larger buffer (at an offset, or strided), with and without a bias, in each dtype
the path serves. Each case is printed before it runs, so a crash names its case. The references compute
in float64 (or, for quantized layers, step by step from the quantized numbers). A path joins by one entry in
`LINEAR_PATHS` or `ATTENTION_PATHS`; one that cannot run on this CPU says why and is skipped.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass

import hypothesis.strategies as st
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, example, given, settings
from torch import Tensor, nn

from attnkit.generate import native_gemv
from attnkit.generate.captured_step import row_int8_products, row_products
from attnkit.generate.decode_layout import (
    GemvLinear,
    GemvPackedLinear,
    NativeLinear,
    NativePackedLinear,
    PackedLinear,
    TransposedLinear,
)
from attnkit.generate.quantize import (
    NATIVE_QUANTIZED_ROWS,
    Int4Linear,
    Int8DynamicLinear,
    Int8Linear,
    NativeInt4Linear,
    NativeInt8Linear,
    dynamic_quantization_available,
    int4_reference,
    quantize_rows,
)
from attnkit.layers.kernels import MathKernel, attend, grouped_attention
from attnkit.layers.masks import AttentionMask
from attnkit.machine import AttentionKernelLimits, CpuCapabilities

AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}  # an AVX-512 CPU running its AVX2 kernels
WIDTHS = st.one_of(st.sampled_from([1, 2, 3, 5, 7, 13, 17, 31, 33, 63, 65, 97, 127, 129, 172, 173, 191, 257]),
                   st.integers(1, 300))
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


# linear layers -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LinearCase:
    in_features: int
    out_features: int
    rows: int
    dtype: str
    bias: bool
    offset: int  # the input starts this many elements into its buffer (a view, as a slice of a larger tensor is)
    seed: int
    column_major: bool = False  # the input laid out column by column (a transposed view): its rows are strided

    def linear(self) -> nn.Linear:
        torch.manual_seed(self.seed)
        return nn.Linear(self.in_features, self.out_features, bias=self.bias)

    def input(self) -> Tensor:
        """(rows, in_features) in the case's dtype, `offset` elements into a larger buffer."""
        generator = torch.Generator().manual_seed(self.seed + 1)
        buffer = torch.randn(self.rows * self.in_features + self.offset, generator=generator)
        rows = buffer.to(DTYPES[self.dtype])[self.offset:].view(self.rows, self.in_features)
        return rows.t().contiguous().t() if self.column_major else rows


def float64_linear(linear: nn.Linear, x: Tensor) -> Tensor:
    """The product in float64, from the numbers the layer holds in its dtype."""
    bias = None if linear.bias is None else linear.bias.double()
    return F.linear(x.double(), linear.weight.double(), bias)


def in_dtype(linear: nn.Linear, x: Tensor) -> nn.Linear:
    return linear.to(x.dtype)


def onednn_packs() -> str | None:
    cpu = CpuCapabilities.detect()
    return None if cpu.onednn_bf16 else f"oneDNN packs bf16 weights only with AVX-512 or AVX-NE-CONVERT ({cpu.isa})"


def int4_kernel() -> str | None:
    cpu = CpuCapabilities.detect()
    return None if cpu.int4_kernel else f"PyTorch's int4 kernel is vectorized only for AVX2 and AVX-512 ({cpu.isa})"


def bf16_dot_unavailable() -> str | None:
    return native_gemv.unavailable() or (None if native_gemv.bf16_dot() else
                                         f"the CPU reports no AVX512-BF16 ({CpuCapabilities.detect().isa})")


def bf16_dot_rows(linear: nn.Linear, x: Tensor) -> tuple[Tensor, Tensor]:
    """The AVX512-BF16 dot-product kernel's fp32 outputs against float64's product of the same bf16 numbers."""
    linear = in_dtype(linear, x)
    bias = None if linear.bias is None else linear.bias.detach().float()
    return native_gemv.gemv_bf16_dot(linear.weight.detach(), x, bias), float64_linear(linear, x)


def rounded_product(linear: nn.Linear, x: Tensor) -> tuple[Tensor, Tensor]:
    """The bound dot product writing bf16 (`DenseProduct(x, torch.bfloat16)`, as a bf16 `NativeLinear` calls it), which
    must equal its fp32 output converted by PyTorch bit for bit, against float64's product."""
    linear = in_dtype(linear, x)
    product = native_gemv.dense_product(linear.weight.detach(), None if linear.bias is None else
                                        linear.bias.detach().float())
    written, converted = product(x, torch.bfloat16), product(x).to(torch.bfloat16)
    assert written.dtype == torch.bfloat16 and torch.equal(written.view(torch.int16), converted.view(torch.int16)), \
        "the product's bf16 output differs from its fp32 output converted"
    return written, float64_linear(linear, x)


def bound_product(linear: nn.Linear, x: Tensor) -> tuple[Tensor, Tensor]:
    """One `DenseProduct` (the weight's checks and addresses taken once) called on the rows, on their first row alone
    (one call of one row after a call of several) and on the rows in the other dtype (bf16 rows: the dot product where
    the CPU has it; fp32 ones: widened), stacked, against float64's products of the numbers each call was given."""
    linear = in_dtype(linear, x)
    bias = None if linear.bias is None else linear.bias.detach().float()
    product = native_gemv.dense_product(linear.weight.detach(), bias)
    other = x.to(torch.bfloat16 if x.dtype == torch.float32 else torch.float32)
    calls = (x, x[:1], other)
    return torch.cat([product(rows) for rows in calls]), torch.cat([float64_linear(linear, rows) for rows in calls])


def int8_rows(linear: nn.Linear, x: Tensor) -> tuple[Tensor, Tensor]:
    """The captured one-row step's int8 product against the dequantized weight's."""
    weight, scales = quantize_rows(linear.weight)
    dequantized = weight.double() * scales.double()[:, None]
    return row_int8_products(x, weight, scales), x.double() @ dequantized.t()


def float_rows(linear: nn.Linear, x: Tensor) -> tuple[Tensor, Tensor]:
    """The captured one-row step's product (a reduction over each weight row) against float64's."""
    linear = in_dtype(linear, x)
    return row_products(x, linear.weight.detach(), None if linear.bias is None else linear.bias.detach()), \
        float64_linear(linear, x)


@dataclass(frozen=True)
class LinearPath:
    """A fast linear layer: `run(linear, x)` -> (its output, the reference's), for x (M, K) in `dtypes`."""

    name: str
    run: Callable[[nn.Linear, Tensor], tuple[Tensor, Tensor]]
    dtypes: tuple[str, ...]
    unavailable: Callable[[], str | None] = lambda: None
    pinned: tuple[LinearCase, ...] = ()  # cases always run, before the drawn ones
    rows: st.SearchStrategy[int] = st.integers(0, 17)  # the row counts drawn (none: an empty batch)


def layer_and_reference(make, reference=None):
    """A run that builds the layer from an nn.Linear in x's dtype and compares it with `reference(layer, linear,
    x)` (default: float64's product)."""
    def run(linear: nn.Linear, x: Tensor) -> tuple[Tensor, Tensor]:
        linear = in_dtype(linear, x)
        layer = make(linear)
        expected = float64_linear(linear, x) if reference is None else reference(layer, linear, x)
        return layer(x), expected
    return run


def traced(make, reference):
    """A run that builds the layer as `layer_and_reference` does, then exports it as the captured step traces its
    layers (`captured_step.STEP_FORMS`: one row as it is, several with the row count symbolic, from 2) and compares
    the exported layer's output with `reference(layer, linear, x)`; the eager layer's must be the same bit for bit."""
    def run(linear: nn.Linear, x: Tensor) -> tuple[Tensor, Tensor]:
        linear = in_dtype(linear, x)
        layer = make(linear)
        dynamic = ({0: torch.export.Dim("rows", min=2)},) if x.shape[0] > 1 else None
        out = torch.export.export(layer, (x,), dynamic_shapes=dynamic).module()(x)
        torch.testing.assert_close(out, layer(x), rtol=0, atol=0, msg="the traced layer differs from the eager one")
        return out, reference(layer, linear, x)
    return run


# int8's crash (in-width 172, two rows, AVX2) and the widths about it; an input at an odd offset
INT8_PINNED = tuple(LinearCase(k, n, rows, "bf16", True, offset, 0)
                    for k, n, rows, offset in ((172, 64, 2, 0), (172, 172, 5, 0), (40, 3, 4, 0), (64, 48, 2, 1)))
# the native quantized layers: in-width 172 (int4 pads it to 192), four rows and a tail, and past the rows their kernel
# takes (the dequantized product), at an odd offset
NATIVE_PINNED = tuple(LinearCase(k, n, rows, "fp32", True, offset, 0) for k, n, rows, offset in (
    (172, 64, 5, 0), (33, 7, 4, 3), (64, 48, NATIVE_QUANTIZED_ROWS + 1, 1)))
# the bf16 dot product: a row of 16 and 32 inputs exactly, one past them (the masked tail), four rows and a tail
BF16_DOT_PINNED = tuple(LinearCase(k, n, rows, "bf16", True, 1, 0) for k, n, rows in (
    (16, 5, 1), (33, 7, 5), (64, 3, 4), (65, 9, 9), (172, 64, 2)))
# row counts about the native quantized products' limit, where a traced step's symbolic row count meets it
ABOUT_THE_ROW_LIMIT = st.one_of(st.integers(NATIVE_QUANTIZED_ROWS - 2, NATIVE_QUANTIZED_ROWS + 2),
                                st.integers(1, 2 * NATIVE_QUANTIZED_ROWS))
LINEAR_PATHS = [
    LinearPath("int8", layer_and_reference(Int8Linear, lambda layer, linear, x: layer.reference(x)),
               ("fp32", "bf16"), pinned=INT8_PINNED),
    LinearPath("int8-dynamic", layer_and_reference(Int8DynamicLinear, lambda layer, linear, x: layer.reference(x)),
               ("fp32",), unavailable=dynamic_quantization_available),
    LinearPath("int4", layer_and_reference(Int4Linear, lambda layer, linear, x: int4_reference(linear, x)),
               ("fp32", "bf16"), unavailable=int4_kernel, pinned=(LinearCase(172, 64, 2, "bf16", False, 0, 0),)),
    LinearPath("transposed", layer_and_reference(TransposedLinear), ("fp32", "bf16")),
    LinearPath("packed", layer_and_reference(PackedLinear), ("bf16",), unavailable=onednn_packs),
    LinearPath("gemv+packed", layer_and_reference(GemvPackedLinear), ("bf16",), unavailable=onednn_packs),
    LinearPath("gemv", layer_and_reference(GemvLinear), ("bf16",)),
    LinearPath("native", layer_and_reference(NativeLinear), ("fp32", "bf16"), unavailable=native_gemv.unavailable,
               pinned=(LinearCase(172, 64, 3, "fp32", True, 1, 0), LinearCase(172, 64, 33, "bf16", True, 1, 0))),
    LinearPath("native+packed", layer_and_reference(NativePackedLinear), ("bf16",),
               unavailable=lambda: native_gemv.unavailable() or onednn_packs()),
    LinearPath("native product, bound once", bound_product, ("fp32", "bf16"), unavailable=native_gemv.unavailable,
               pinned=BF16_DOT_PINNED),
    LinearPath("native bf16 dot product", bf16_dot_rows, ("bf16",), unavailable=bf16_dot_unavailable,
               pinned=BF16_DOT_PINNED),
    LinearPath("native bf16 dot product, written in bf16", rounded_product, ("bf16",),
               unavailable=bf16_dot_unavailable, pinned=BF16_DOT_PINNED),
    LinearPath("int8-native", layer_and_reference(NativeInt8Linear, lambda layer, linear, x: layer.reference(x)),
               ("fp32", "bf16"), unavailable=native_gemv.unavailable, pinned=NATIVE_PINNED),
    LinearPath("int4-native", layer_and_reference(
        NativeInt4Linear, lambda layer, linear, x: int4_reference(linear, x, native=True)), ("fp32", "bf16"),
        unavailable=native_gemv.unavailable, pinned=NATIVE_PINNED),
    LinearPath("int8-native, traced", traced(NativeInt8Linear, lambda layer, linear, x: layer.reference(x)),
               ("fp32", "bf16"), unavailable=native_gemv.unavailable, pinned=NATIVE_PINNED, rows=ABOUT_THE_ROW_LIMIT),
    LinearPath("int4-native, traced", traced(
        NativeInt4Linear, lambda layer, linear, x: int4_reference(linear, x, native=True)), ("fp32", "bf16"),
        unavailable=native_gemv.unavailable, pinned=NATIVE_PINNED, rows=ABOUT_THE_ROW_LIMIT),
    LinearPath("captured step, products", float_rows, ("fp32", "bf16")),
    LinearPath("captured step, int8 products", int8_rows, ("fp32", "bf16")),
]


def linear_cases(path: LinearPath) -> st.SearchStrategy[LinearCase]:
    return st.builds(LinearCase, in_features=WIDTHS, out_features=WIDTHS, rows=path.rows,
                     dtype=st.sampled_from(path.dtypes), bias=st.booleans(), offset=st.integers(0, 7),
                     seed=st.integers(0, 2**16), column_major=st.booleans())


def edge_cases(path: LinearPath) -> tuple[LinearCase, ...]:
    """Cases every linear path meets besides its own pinned ones: no rows (an empty batch), and rows laid out column
    by column, at a width the kernels take without padding (64) and at one they pad (172)."""
    return tuple(LinearCase(k, 48, rows, dtype, True, 0, 0, column_major=rows > 0)
                 for k in (64, 172) for dtype in path.dtypes for rows in (0, 3))


def check_linear(path: LinearPath, case: LinearCase) -> None:
    linear, x = case.linear(), case.input()
    with torch.no_grad():
        out, expected = path.run(linear, x)
    assert out.shape == expected.shape, f"{path.name}: shape {tuple(out.shape)}, expected {tuple(expected.shape)}"
    # bf16 rounds each output to 8 bits; the int8 and int4 layers with PyTorch's kernels compute in bf16 whatever the
    # input's dtype (the native ones in fp32)
    exact = ("transposed", "captured step, products", "native", "native bf16 dot product", "native product, bound once",
             "int8-native", "int4-native", "int8-native, traced", "int4-native, traced")  # fp32 arithmetic
    fp32_sums = case.dtype == "fp32" or path.name in ("native bf16 dot product", "native product, bound once")
    tolerance = 1e-5 if fp32_sums and path.name in exact else 2e-2
    # relative to the sizes of the terms summed, not of the sum: rounding in another order of summation is a share
    # of sum |x_k w_k|, which an output of terms that cancel (0.0087 from 17 terms of sum 1.07) is far below
    terms = x.double().abs() @ linear.weight.detach().double().abs().T  # (rows, out_features)
    sizes = torch.cat([expected.double().abs().flatten(), terms.flatten(), torch.zeros(1, dtype=torch.float64)])
    scale = float(sizes.max()) + 1e-6  # the zero: no rows, no sizes
    torch.testing.assert_close(out.double(), expected.double(), atol=tolerance * scale, rtol=0)


# attention -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AttentionCase:
    batch: int
    kv_heads: int
    group: int  # query heads per key/value head
    queries: int
    cached: int  # keys before the queries' own (a KV cache); the queries are the last `queries` positions
    head_dim: int
    dtype: str
    mask: str  # "none", "causal", "causal+padding" (some keys of each sequence hidden, as a padded batch's are)
    strided: bool  # q, k, v as views into one fused projection's output, as `Attention` splits them
    seed: int

    def tensors(self) -> tuple[Tensor, Tensor, Tensor]:
        """q (B, H, T, D), k and v (B, Hkv, S, D)."""
        generator = torch.Generator().manual_seed(self.seed)
        heads, keys, dtype = self.kv_heads * self.group, self.queries + self.cached, DTYPES[self.dtype]
        if self.strided:  # (B, S, H + 2 Hkv, D): q on the last T positions, k and v on all of them
            fused = torch.randn(self.batch, keys, heads + 2 * self.kv_heads, self.head_dim, generator=generator)
            fused = fused.to(dtype).transpose(1, 2)  # (B, H + 2 Hkv, S, D)
            q = fused[:, :heads, self.cached:]
            return q, fused[:, heads: heads + self.kv_heads], fused[:, heads + self.kv_heads:]
        q = torch.randn(self.batch, heads, self.queries, self.head_dim, generator=generator).to(dtype)
        k, v = (torch.randn(self.batch, self.kv_heads, keys, self.head_dim, generator=generator).to(dtype)
                for _ in range(2))
        return q, k, v

    def bias(self) -> Tensor | None:
        """(B, 1, T, S) additive: -inf where a query may not look, or None."""
        if self.mask == "none":
            return None
        keys = self.queries + self.cached
        positions = torch.arange(self.cached, keys)[:, None]  # (T, 1): the queries' own positions
        allowed = (torch.arange(keys)[None, :] <= positions).expand(self.batch, 1, self.queries, keys)
        if self.mask == "causal+padding":  # each sequence hides some of its keys, never a query's own
            hidden = torch.rand(self.batch, 1, 1, keys, generator=torch.Generator().manual_seed(self.seed)) < 0.3
            own = torch.arange(keys)[None, :] == positions  # (T, S)
            allowed = allowed & (~hidden | own)
        return torch.zeros(allowed.shape).masked_fill(~allowed, float("-inf"))


def attention_reference(q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """softmax(q k^T / sqrt(D) + bias) v in float64, each key/value head repeated for its group of query heads."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(group, dim=1) for t in (k, v))  # (B, H, S, D)
    scores = q.double() @ k.transpose(-2, -1) * q.shape[-1] ** -0.5  # (B, H, T, S)
    return torch.softmax(scores if bias is None else scores + bias.double(), dim=-1) @ v  # (B, H, T, D)


def causal_flag(case: AttentionCase) -> AttentionMask | None:
    """Causality alone over a square of queries and keys, as the kernels take it without a tensor; else None."""
    return AttentionMask(case.queries, causal=True) if case.mask == "causal" and not case.cached else None


def sdpa(case: AttentionCase, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    causal = causal_flag(case)
    return attend(q, k, v, None if causal else bias, causal=causal, scale=q.shape[-1] ** -0.5, dropout=0.0,
                  grouped=case.group > 1)


def math_kernel(case: AttentionCase, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """`attend` with a math kernel that covers every length: `grouped_attention`'s float32 products."""
    everywhere = MathKernel("cpu", q.dtype, AttentionKernelLimits(decode_keys=10**6, pass_keys=10**6))
    causal = causal_flag(case)
    return attend(q, k, v, None if causal else bias, causal=causal, scale=q.shape[-1] ** -0.5, dropout=0.0,
                  grouped=case.group > 1, math_kernel=everywhere)


@dataclass(frozen=True)
class AttentionPath:
    """An attention kernel: `run(case, q, k, v, bias)` -> (B, H, T, D), held equal to `attention_reference`."""

    name: str
    run: Callable[[AttentionCase, Tensor, Tensor, Tensor, Tensor | None], Tensor]
    dtypes: tuple[str, ...] = ("fp32", "bf16")
    unavailable: Callable[[], str | None] = lambda: None
    queries: st.SearchStrategy[int] = st.integers(1, 17)  # the query counts drawn
    pinned: tuple[AttentionCase, ...] = ()  # cases always run, before the drawn ones


def one_query(case: AttentionCase, q: Tensor, k: Tensor, v: Tensor, bias: Tensor | None) -> Tensor:
    """`attend` with the inference plan's math kernel and its native one-query kernel first: a single query whose bias
    hides no key (none, or causality alone for the newest query) goes to `native_gemv.attend_one` (the output must be
    that kernel's, bit for bit); one whose padding hides keys, to the float32 products."""
    everywhere = MathKernel("cpu", q.dtype, AttentionKernelLimits(decode_keys=10**6, pass_keys=10**6),
                            one_query=native_gemv.attend_one_query)
    hides = bias is not None and bool(torch.isinf(bias).any())
    scale = q.shape[-1] ** -0.5
    out = attend(q, k, v, bias if hides else None, scale=scale, dropout=0.0, grouped=case.group > 1,
                 math_kernel=everywhere)
    if not hides:
        assert torch.equal(out, native_gemv.attend_one(q, k, v, scale)), "attend did not take the one-query kernel"
    return out


# one key (an empty cache), head widths below, at and past a vector, grouped queries, a strided fused projection
ONE_QUERY_PINNED = tuple(AttentionCase(batch, kv, group, 1, cached, dim, dtype, "none", strided, 0)
                         for batch, kv, group, cached, dim, strided in ((1, 1, 1, 0, 1, False), (2, 2, 3, 20, 64, True),
                                                                        (1, 3, 2, 9, 7, False), (2, 1, 3, 5, 80, True))
                         for dtype in ("fp32", "bf16"))
ATTENTION_PATHS = [  # a new attention kernel joins here
    AttentionPath("SDPA", sdpa),
    AttentionPath("math kernel", math_kernel),
    AttentionPath("native one-query kernel", one_query, unavailable=native_gemv.unavailable, queries=st.just(1),
                  pinned=ONE_QUERY_PINNED),
    AttentionPath("grouped_attention", lambda case, q, k, v, bias: grouped_attention(q, k, v, bias)),
]


def attention_cases(path: AttentionPath) -> st.SearchStrategy[AttentionCase]:
    return st.builds(AttentionCase, batch=st.integers(1, 2), kv_heads=st.integers(1, 3), group=st.integers(1, 3),
                     queries=path.queries, cached=st.integers(0, 20), head_dim=st.integers(1, 80),
                     dtype=st.sampled_from(path.dtypes), mask=st.sampled_from(["none", "causal", "causal+padding"]),
                     strided=st.booleans(), seed=st.integers(0, 2**16))


def check_attention(path: AttentionPath, case: AttentionCase) -> None:
    q, k, v = case.tensors()
    bias = case.bias()
    with torch.no_grad():
        out = path.run(case, q, k, v, bias)
    expected = attention_reference(q, k, v, bias)
    assert out.shape == expected.shape and out.dtype == q.dtype, f"{path.name}: {out.shape} {out.dtype}"
    tolerance = 1e-4 if case.dtype == "fp32" else 2e-2  # bf16: each output rounded to 8 bits
    torch.testing.assert_close(out.double(), expected, atol=tolerance, rtol=tolerance)


# the run -------------------------------------------------------------------------------------------------------
def holds(name: str, cases: st.SearchStrategy, check: Callable, pinned: tuple, examples: int) -> bool:
    """Run `check` on the pinned cases and `examples` drawn ones; False (after hypothesis printed the falsifying
    case) where one failed."""
    @settings(max_examples=examples, database=None, deadline=None, print_blob=True,
              suppress_health_check=list(HealthCheck))
    @given(case=cases)
    def property_holds(case):
        print(f"case {name}: {case}", flush=True)  # before it runs: a crash names its case
        check(case)

    for case in pinned:
        property_holds = example(case=case)(property_holds)
    try:
        property_holds()
    except Exception as err:  # the falsifying example and the failure, then the other paths
        print(f"FAILED {name}: {type(err).__name__}: {err}", flush=True)
        return False
    print(f"held {name}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=4, help="drawn cases per path (besides the pinned ones)")
    parser.add_argument("paths", nargs="*", help="the paths to check (default: all)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cpu = CpuCapabilities.detect()
    print(f"{cpu.summary()}, PyTorch {torch.__version__}", flush=True)
    ok = True
    for path in [*LINEAR_PATHS, *ATTENTION_PATHS]:
        if args.paths and path.name not in args.paths:
            continue
        reason = path.unavailable()
        if reason is not None:
            print(f"skipped {path.name}: {reason}", flush=True)
            continue
        if isinstance(path, LinearPath):
            ok &= holds(path.name, linear_cases(path), lambda case, path=path: check_linear(path, case),
                        path.pinned + edge_cases(path), args.examples)
        else:
            ok &= holds(path.name, attention_cases(path), lambda case, path=path: check_attention(path, case),
                        path.pinned, args.examples)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
