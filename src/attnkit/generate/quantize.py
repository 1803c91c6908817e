"""Quantized weights for decoding: each linear layer's weight stored in 8 or 4 bits with scales.

Decoding one token at a time reads every weight once per token, so its speed is bounded by memory bandwidth, not
arithmetic. Storing weights in 8 bits instead of 16 halves the bytes read, and 4 bits halves them again. In 8 bits
each output row r keeps scale_r = max|W_r| / 127 and W_r ~ scale_r * round(W_r / scale_r) (symmetric,
per-channel, as in LLM.int8's weight-only baselines and gpt-fast's int8 mode). Three forms:

    "int8"          weights only (`Int8Linear`): activations stay bf16, products dequantize the weights
    "int8-dynamic"  weights and activations (`Int8DynamicLinear`, "W8A8"): each product's input is quantized to
                    8 bits at run time from its own range, and the product runs in integers, as llama.cpp's q8_0
                    quantizes the activations it multiplies by q8_0 weights
    "int4"          4-bit weights only (`Int4Linear`), in groups of 32 inputs with a scale and a zero each (as
                    gpt-fast's and torchao's int4 modes; llama.cpp's q4_0 also has blocks of 32): activations in bf16

Each kernel is given only the shapes it is safe for: a layer whose in-width the kernel cannot take as it is gets
zero inputs up to one it can (`padded_width`), and the plan says so (`--explain`).

The quality cost is measured, not assumed: `python -m benchmarks int8` reports perplexity for each.
"""

from __future__ import annotations

import functools
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.generate import native_gemv
from attnkit.generate.swap import swap_layers
from attnkit.machine import CpuCapabilities

INT4_GROUP = 32  # inputs per scale and zero (PyTorch's CPU kernel takes 32, 64, 128 or 256; q4_0's blocks are 32)
INT4_ROWS = 16  # the kernel takes output rows in blocks of 16: a layer with N rows gets zero rows up to a multiple
INT8_KERNEL_INPUTS = 16  # PyTorch's int8 kernel reads 16 bf16 inputs at a time on AVX-512, 8 on AVX2 (`Int8Linear`)


def row_scales(weight: Tensor) -> Tensor:
    """weight (N, K) -> fp32 scales (N,): max |W_r| / 127 for each output row r."""
    return (weight.detach().float().abs().amax(dim=1) / 127.0).clamp(min=1e-12)


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """weight (N, K) -> int8 weight (N, K) and fp32 scales (N,), symmetric per output row."""
    scales = row_scales(weight)  # (N,)
    q = torch.round(weight.detach().float() / scales[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scales


class Int8Linear(nn.Module):
    """A linear layer with an int8 weight and per-row scales. x (…, K) -> (…, N), in x's dtype.

    The product runs in bf16 through PyTorch's int8-weight kernel (`torch._weight_int8pack_mm`); `reference`
    dequantizes and multiplies, the readable path that tests hold it equal to.

    That kernel is safe only for some shapes, so the layer gives it only those. Its vectorized loops (PyTorch 2.13,
    `aten/src/ATen/native/cpu/int8mm_kernel.cpp`) read the bf16 rows 8 (AVX2) or 16 (AVX-512) inputs at a time
    with *aligned* vector loads (and, on AVX-512, the int8 weight rows too), and step through the K inputs in those
    strides with no remainder loop. With K not a multiple of the stride, a row after the first starts off a vector
    boundary and its load faults (on AVX2 with 2 or more rows, on AVX-512 with one too), or the last stride reads
    past the row's end (a wrong sum); rows that do not start on a 16- or 32-byte boundary fault at any K (each case
    measured in its own process: docs/guides/inference-plan.md; `tests/test_fast_paths_property.py` keeps
    checking). So the weight is stored with zero inputs up to a multiple of `INT8_KERNEL_INPUTS` (which both
    strides divide; the zeros add nothing to the sums) and each call's rows are copied into a new zero-padded
    buffer, which PyTorch allocates 64-byte aligned.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight, scales = quantize_rows(linear.weight)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.padding = padded_width(self.in_features, INT8_KERNEL_INPUTS) - self.in_features
        self.register_buffer("weight", F.pad(weight, (0, self.padding)))  # (N, K') int8, zeros after K
        self.register_buffer("scales", scales.to(torch.bfloat16))  # (N,)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(torch.bfloat16))

    def forward(self, x: Tensor) -> Tensor:
        # (M, K'), a new buffer, row by row (a copy keeps a column-major input's strides, which the kernel refuses)
        rows = F.pad(x.reshape(-1, self.in_features).to(torch.bfloat16), (0, self.padding)).contiguous()
        out = torch._weight_int8pack_mm(rows, self.weight, self.scales)  # (M, N)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def reference(self, x: Tensor) -> Tensor:
        dequantized = int8_dequantized(self.weight[:, : self.in_features], self.scales)  # (N, K)
        bias = None if self.bias is None else self.bias.float()
        return F.linear(x.float(), dequantized, bias).to(x.dtype)


def padded_width(inputs: int, multiple: int) -> int:
    """The in-width a kernel taking inputs in multiples of `multiple` is given for a layer of `inputs` inputs: the
    next multiple (`INT8_KERNEL_INPUTS` for int8, `INT4_GROUP` for int4)."""
    return -(-inputs // multiple) * multiple


@functools.cache
def reduce_range() -> bool:
    """Whether activations take 0..127 rather than 0..255: where the CPU reports no AVX-512 VNNI, FBGEMM multiplies
    8-bit pairs into saturating 16-bit sums, which full-range activations could overflow (PyTorch's x86 default,
    `reduce_range`). With VNNI the full range is safe and a little more precise. Read once, when first asked."""
    return "avx512_vnni" not in CpuCapabilities.detect().flags


def dynamic_quantization_available() -> str | None:
    """None when `Int8DynamicLinear` can run here, else why not."""
    engine = torch.backends.quantized.engine
    if engine not in ("x86", "fbgemm"):
        return (f"int8-dynamic needs PyTorch's FBGEMM quantized engine (x86 CPUs); this one uses {engine!r}: "
                "use quantize='int8' (--int8) instead")
    return None


class Int8DynamicLinear(nn.Module):
    """A linear layer with int8 weights (per-row scales, as `Int8Linear`) whose input is quantized to 8 bits when
    it runs, so the product is an integer one. x (…, K) -> (…, N), in x's dtype; CPU, inference only.

    The input gets a scale and zero point from its range [min(x, 0), max(x, 0)] over 0..255 (0..127 without
    AVX-512 VNNI: `reduce_range`). The kernel is FBGEMM's dynamic quantized linear
    (`torch.ops.quantized.linear_dynamic`, which `torch.ao.nn.quantized.dynamic.Linear` runs; `python -m benchmarks
    bandwidth` compares it with the weight-only kernel on a machine). It takes one range per call: for one row
    (batch-1 decoding) that is the row's own; a call with several rows scales each row to a peak of 1 first and back
    after (a linear map commutes with scaling a row), so a row of small numbers keeps its precision beside a row of
    large ones. `reference` computes the same numbers step by step. PyTorch has deprecated building quantized
    tensors (which packing the weight needs) in favour of torchao; its warning is silenced for that one call.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # (N, K)
        scales = row_scales(weight)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.reduce_range = reduce_range()
        self.activation_levels = 127 if self.reduce_range else 255
        with warnings.catch_warnings():  # round(W / scale) per row, as `quantize_rows`, with no fp32 copy of W
            warnings.filterwarnings("ignore", message=".*quantized tensor creation functions", category=UserWarning)
            quantized = torch.quantize_per_channel(weight, scales.double(), torch.zeros_like(scales, dtype=torch.long),
                                                   0, torch.qint8)
        # the only copy of the weight: FBGEMM's layout, with the bias (`weight_and_scales` reads it back)
        self.packed = torch.ops.quantized.linear_prepack(quantized, self.bias)

    def weight_and_scales(self) -> tuple[Tensor, Tensor]:
        """The int8 weight (N, K) and its fp32 scales (N,), unpacked."""
        quantized, _ = torch.ops.quantized.linear_unpack(self.packed)
        return quantized.int_repr(), quantized.q_per_channel_scales().float()

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features).float()  # (M, K)
        if rows.shape[0] == 1:  # the call's range is the row's
            out = torch.ops.quantized.linear_dynamic(rows, self.packed, self.reduce_range)  # (1, N)
        else:  # one range per row: rows scaled to a peak of 1, outputs scaled back around the bias
            peaks = rows.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)  # (M, 1)
            out = torch.ops.quantized.linear_dynamic(rows / peaks, self.packed, self.reduce_range)  # (M, N)
            out = out * peaks if self.bias is None else torch.addcmul(self.bias, out - self.bias, peaks)
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def reference(self, x: Tensor) -> Tensor:
        """The same numbers step by step: rows scaled to a peak of 1, one 8-bit grid over the call's range, the
        product of dequantized numbers in fp32, rows scaled back. (One row needs no scaling: its grid scales
        with it.)"""
        rows = x.reshape(-1, self.in_features).float()  # (M, K)
        if rows.shape[0] == 0:  # an empty batch has no range
            return x.new_empty((*x.shape[:-1], self.out_features))
        peaks = rows.abs().amax(dim=1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)  # (M, 1)
        scaled = rows / peaks
        low, high = scaled.min().clamp(max=0), scaled.max().clamp(min=0)  # the grid spans 0
        step = (high - low) / self.activation_levels
        zero = torch.round(-low / step).clamp(0, self.activation_levels)
        # the grid spans the range in `activation_levels` steps, but values round into uint8's 0..255 (the top of
        # the range may round to one step above it)
        dequantized = (torch.round(scaled / step + zero).clamp(0, 255) - zero) * step  # (M, K)
        weight, scales = self.weight_and_scales()
        out = F.linear(dequantized, int8_dequantized(weight, scales)) * peaks  # (M, K) @ (K, N) -> (M, N)
        out = out if self.bias is None else out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def quantize_groups(weight: Tensor, group: int = INT4_GROUP) -> tuple[Tensor, Tensor, Tensor]:
    """weight (N, K) -> 4-bit codes (N, K) as int32 in 0..15, scales and zeros (N, K / group), fp32: each group of
    `group` inputs in a row spreads its [min, max] over the 16 codes, and W ~ (code - 8) * scale + zero
    (asymmetric, as gpt-fast's `group_quantize_tensor`; zero is the value of code 8)."""
    rows, inputs = weight.shape
    groups = weight.detach().float().reshape(rows, inputs // group, group)  # (N, K / G, G)
    low, high = groups.amin(dim=-1, keepdim=True), groups.amax(dim=-1, keepdim=True)
    scales = ((high - low) / 15).clamp(min=1e-6)  # (N, K / G, 1)
    codes = torch.round((groups - low) / scales).clamp(0, 15).to(torch.int32)
    return codes.reshape(rows, inputs), scales.squeeze(-1), (low + 8 * scales).squeeze(-1)


def int4_grid(weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """weight (N, K) -> `quantize_groups` of it over K' = `padded_width(K, INT4_GROUP)` inputs: a row whose groups do
    not tile it is continued with copies of its last weight, which keep the last group's range its own weights'
    (the inputs they meet are zeros, so they add nothing to a product)."""
    padding = padded_width(weight.shape[1], INT4_GROUP) - weight.shape[1]
    return quantize_groups(F.pad(weight.detach().float()[None], (0, padding), mode="replicate")[0])  # (N, K')


def int4_reference(linear: nn.Linear, x: Tensor, *, native: bool = False) -> Tensor:
    """What `Int4Linear(linear)(x)` computes, step by step in fp32: x rounded to bf16, times `linear`'s 4-bit grid
    (`int4_grid`) with scales and zeros rounded to bf16 as PyTorch's kernel stores them; with `native`, what
    `NativeInt4Linear(linear)(x)` computes: x as it is, scales and zeros in fp32. x (…, K) -> (…, N), in x's dtype."""
    codes, scales, zeros = int4_grid(linear.weight)  # (N, K'), (N, K' / G) twice
    stored = torch.float32 if native else torch.bfloat16
    scales, zeros = (t.to(stored).float().repeat_interleave(INT4_GROUP, dim=1) for t in (scales, zeros))  # (N, K')
    weight = ((codes.float() - 8) * scales + zeros)[:, : linear.in_features]  # (N, K)
    bias = None if linear.bias is None else linear.bias.detach().to(stored).float()
    inputs = x.float() if native else x.bfloat16().float()
    return F.linear(inputs, weight, bias).to(x.dtype)


class Int4Linear(nn.Module):
    """A linear layer with 4-bit weights in groups of `INT4_GROUP` inputs (`int4_grid`). x (…, K) -> (…, N), in x's
    dtype; products in bf16; CPU, inference only. `int4_reference` computes the same numbers step by step.

    The kernel is PyTorch's CPU int4 matrix product (`torch.ops.aten._weight_int4pack_mm_for_cpu`, tinygemm's
    layout, which torchao's `Int4CPULayout` and gpt-fast call too): private, because PyTorch has no public int4
    matrix product or packed int4 tensor (torchao's quantized tensors wrap these ops). Its packed layout depends on
    the CPU's vector level, so the packed weight is not saved or moved; its fast paths are for bf16 inputs on AVX2 and
    AVX-512 (the inference plan uses it only there: `CpuCapabilities.int4_kernel`). A layer whose output count is
    not a multiple of `INT4_ROWS` gets zero rows up to one, cut from the output; one whose input count is not a
    multiple of `INT4_GROUP` gets inputs up to one (`int4_grid`), and each call's rows get zeros there.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        rows, inputs = linear.weight.shape
        codes, scales, zeros = int4_grid(linear.weight)  # (N, K'), (N, K' / G) twice
        padded_rows = padded_width(rows, INT4_ROWS) - rows
        codes = F.pad(codes, (0, 0, 0, padded_rows))  # (N', K'): zero rows, cut from the output
        scales, zeros = (F.pad(t, (0, 0, 0, padded_rows)) for t in (scales, zeros))  # (N', K' / G)
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 1)  # (N', K' / 2) uint8
        self.register_buffer("weight_packed", packed, persistent=False)
        # (K' / G, N', 2): each group's scale and zero for every output row, in the activations' dtype
        scales_and_zeros = torch.stack([scales, zeros], dim=-1).transpose(0, 1).contiguous().to(torch.bfloat16)
        self.register_buffer("scales_and_zeros", scales_and_zeros, persistent=False)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().to(torch.bfloat16))
        self.in_features, self.out_features = inputs, rows
        self.padding = codes.shape[1] - inputs

    def forward(self, x: Tensor) -> Tensor:
        rows = F.pad(x.reshape(-1, self.in_features).to(torch.bfloat16), (0, self.padding)).contiguous()  # (M, K')
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, self.weight_packed, INT4_GROUP, self.scales_and_zeros)
        out = out[:, : self.out_features]  # (M, N)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


NATIVE_QUANTIZED_ROWS = 32  # rows up to which the native int8 and int4 products take the hand-written kernel


def native_int8_product(weight: Tensor, scales: Tensor, rows: Tensor, bias: Tensor | None) -> Tensor:
    """rows (M, K) @ (weight * scales[:, None])^T + bias -> (M, N) fp32, for an int8 weight (N, K) with fp32 scales
    (N,): up to `NATIVE_QUANTIZED_ROWS` rows through the hand-written kernel (`native_gemv.gemv_i8`), more through the
    weight dequantized for the call and nn.Linear's product. Eager layers call it for more rows than that (fewer go
    through the kernel bound once, `NativeInt8Linear.product`), a traced step as the operator `native_int8_op`, which
    applies the same limit to the row count it meets when it runs."""
    if rows.shape[0] > NATIVE_QUANTIZED_ROWS:
        return F.linear(rows.float(), int8_dequantized(weight, scales), bias)
    return native_gemv.gemv_i8(weight, scales, rows, bias)


def int8_dequantized(weight: Tensor, scales: Tensor) -> Tensor:
    """An int8 weight (N, K) and its per-row scales (N,) (`quantize_rows`) -> the weight (N, K) in fp32, weight *
    scale: what every int8 layer's `reference` and the native product beyond `NATIVE_QUANTIZED_ROWS` rows multiply
    by."""
    return weight.float() * scales.float()[:, None]


def int4_dequantized(codes: Tensor, scales: Tensor, offsets: Tensor) -> Tensor:
    """4-bit codes (N, K' / 2) from `native_gemv.pack_int4`, scales and offsets (N, K' / G) fp32 -> the weight
    (N, K') in fp32, as the native kernel computes with it: code * scale + offset."""
    unpacked = native_gemv.unpack_int4(codes).float()  # (N, K')
    scales, offsets = (t.repeat_interleave(INT4_GROUP, dim=1) for t in (scales, offsets))
    return unpacked * scales + offsets


def native_int4_product(codes: Tensor, scales: Tensor, offsets: Tensor, rows: Tensor, bias: Tensor | None) -> Tensor:
    """rows (M, K') @ W^T + bias -> (M, N) fp32 for 4-bit weights (`int4_dequantized`), rows zero-padded to whole
    groups: up to `NATIVE_QUANTIZED_ROWS` rows through the hand-written kernel (`native_gemv.gemv_i4`), more through
    the weight dequantized for the call. Eager layers call it as it is, a traced step as the operator
    `native_int4_op`, which applies the same limit to the row count it meets when it runs."""
    if rows.shape[0] > NATIVE_QUANTIZED_ROWS:
        return F.linear(rows, int4_dequantized(codes, scales, offsets), bias)
    return native_gemv.gemv_i4(codes, scales, offsets, rows, bias)


# The products as PyTorch operators, for a compiled or captured step (`native_gemv.tracing`): a traced step's row
# count may be symbolic (the captured several-row step serves any batch size), so the row limit is applied inside the
# operator, when it runs, and never fixed into the graph.
native_int8_op = torch.library.custom_op("attnkit::native_int8_product", native_int8_product, mutates_args=())
native_int4_op = torch.library.custom_op("attnkit::native_int4_product", native_int4_product, mutates_args=())


@native_int8_op.register_fake
def _(weight: Tensor, scales: Tensor, rows: Tensor, bias: Tensor | None) -> Tensor:
    return rows.new_empty(rows.shape[0], weight.shape[0], dtype=torch.float32)


@native_int4_op.register_fake
def _(codes: Tensor, scales: Tensor, offsets: Tensor, rows: Tensor, bias: Tensor | None) -> Tensor:
    return rows.new_empty(rows.shape[0], codes.shape[0], dtype=torch.float32)


class NativeInt8Linear(nn.Module):
    """A linear layer with an int8 weight and per-row scales (`quantize_rows`) whose products take fp32 inputs
    (`native_int8_product`): up to `NATIVE_QUANTIZED_ROWS` rows through the hand-written kernel (each weight widened
    to fp32 as it is read; eagerly, bound once to the layer's tensors, `native_gemv.DenseProduct`), more through the
    weight dequantized for the call and nn.Linear's product, eagerly and in a captured step alike. x (…, K) -> (…, N),
    in x's dtype; CPU with AVX2 and FMA, inference only. `reference` computes the same numbers step by step.

    Where `Int8Linear` runs PyTorch's kernel, which is vectorized only for bf16 inputs (and its fp32 inputs take a
    scalar loop), this layer keeps a model's fp32 activations as they are: a quarter of fp32's weight bytes per token
    with fp32's arithmetic. Every in-width is taken as it is.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight, scales = quantize_rows(linear.weight)
        self.register_buffer("weight", weight)  # (N, K) int8
        self.register_buffer("scales", scales)  # (N,) fp32
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.product = native_gemv.dense_product(self.weight, self.bias, self.scales)  # eager rows up to the limit

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)  # (M, K)
        if native_gemv.tracing():
            out = native_int8_op(self.weight, self.scales, rows, self.bias)  # (M, N) fp32
        elif rows.shape[0] > NATIVE_QUANTIZED_ROWS:
            out = native_int8_product(self.weight, self.scales, rows, self.bias)  # dequantized for the call
        else:  # bound again where `.to` or an assignment replaced the tensors
            out = native_gemv.layer_product(self, scales="scales")(rows)
        out = out.view(*x.shape[:-1], self.out_features)
        return out if x.dtype == torch.float32 else out.to(x.dtype)  # fp32 rows: no call to convert them

    def reference(self, x: Tensor) -> Tensor:
        return F.linear(x.float(), int8_dequantized(self.weight, self.scales), self.bias).to(x.dtype)  # (…, N)


class NativeInt4Linear(nn.Module):
    """A linear layer with 4-bit weights in groups of `INT4_GROUP` inputs (`int4_grid`, as `Int4Linear`) whose
    products take fp32 inputs (`native_int4_product`): up to `NATIVE_QUANTIZED_ROWS` rows through the hand-written
    kernel (each group's codes widened to fp32, multiplied, then scaled once, its zero applied through the group's
    sum of inputs), more through the weight dequantized for the call, eagerly and in a captured step alike.
    x (…, K) -> (…, N), in x's dtype; CPU with AVX2 and FMA, inference only. `int4_reference(linear, x, native=True)`
    computes the same numbers step by step. Scales are kept in fp32 with each group's offset (zero - 8 * scale), which
    the kernel reads without converting (it is bound by its arithmetic, not by reading these); a layer whose in-width
    is not a multiple of `INT4_GROUP` gets inputs up to one (`int4_grid`), and each call's rows get zeros there.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        codes, scales, zeros = int4_grid(linear.weight)  # (N, K'), (N, K' / G) twice
        self.register_buffer("codes", native_gemv.pack_int4(codes))  # (N, K' / 2) uint8
        self.register_buffer("scales", scales.contiguous())  # (N, K' / G) fp32
        self.register_buffer("offsets", (zeros - 8 * scales).contiguous())  # (N, K' / G) fp32
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.padding = codes.shape[1] - linear.in_features

    def forward(self, x: Tensor) -> Tensor:
        padded = F.pad(x.reshape(-1, self.in_features).float(), (0, self.padding))  # (M, K')
        product = native_int4_op if native_gemv.tracing() else native_int4_product
        out = product(self.codes, self.scales, self.offsets, padded, self.bias)  # (M, N) fp32
        return out.view(*x.shape[:-1], self.out_features).to(x.dtype)


QUANTIZE_FORMS = {"int8": Int8Linear, "int8-dynamic": Int8DynamicLinear, "int4": Int4Linear}


NATIVE_FORMS = {"int8": NativeInt8Linear, "int4": NativeInt4Linear}  # fp32 inputs, the hand-written kernels


def quantize_weights(model: nn.Module, form: str = "int8", *, native: bool = False) -> nn.Module:
    """Replace every nn.Linear in `model` (in place) by the layer of `QUANTIZE_FORMS[form]` (Int8Linear,
    Int8DynamicLinear, Int4Linear), or with `native`, of `NATIVE_FORMS[form]` (NativeInt8Linear, NativeInt4Linear);
    returns the model, for inference only.

    A tied output layer gets its own quantized copy; the embedding table it was tied to stays as it was.
    """
    make = NATIVE_FORMS[form] if native else QUANTIZE_FORMS[form]
    return swap_layers(model, nn.Linear, lambda linear: make(linear).to(linear.weight.device))
