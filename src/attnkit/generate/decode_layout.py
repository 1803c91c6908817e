"""Weights laid out for decoding: self-attention's q/k/v projections fused into one, and, on CPU, each linear layer's
weight stored transposed, (K, N) row-major (fp32), packed once into oneDNN's blocked layout (bf16), or both kept as
nn.Linear has it for single rows and packed for several (bf16), or, where oneDNN cannot pack, kept as loaded with
single rows through ATen's matrix-vector kernel, computed in fp32 (bf16). Which of these a loaded model gets is the
inference plan's choice (`generate/plan.py`), from what the CPU reports and what `attnkit tune` measured; the numbers
are nn.Linear's in every layout (up to the order of summation).

Fused q/k/v: decoding a token runs every layer's projections on a single row, where the cost of a kernel call
rivals its arithmetic; one [q; k; v] product per layer instead of three saves two calls per layer (as GPT-2's
`c_attn`, litgpt and gpt-fast keep them). `Attention.fuse_qkv` does it; the numbers are the same.

Transposed weights: decoding one token multiplies one row x (1, K) by every weight matrix, so its speed is the speed
of reading the weights. `nn.Linear` keeps W as (N, K) and computes x @ W^T, which BLAS runs as N dot products down
W's rows; with W^T stored contiguously the same product adds K scaled rows of W^T into one accumulator row, a
pattern that streams memory in order (`python -m benchmarks bandwidth` compares the two on a machine). The numbers
are those of `nn.Linear` up to the order of summation. GPT-2's Conv1D layers store weights this way.

Packed bf16 weights: `nn.Linear` in bf16 on CPU runs oneDNN, which lays the weight out in its own blocked format for
its kernels at every call; for a single row that reordering can cost more than the product. Packing each weight
once, as inductor does when it freezes weights, leaves one read of the packed weight per product, with the same
numbers bit for bit. oneDNN packs bf16 weights only on CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT
(`machine.CpuCapabilities.onednn_bf16`); elsewhere the plan keeps nn.Linear.

A single bf16 row, kept apart: batch-1 decoding reads each weight once per token, so bf16 should take about half of
fp32's time. oneDNN's packed product does not get there for one row: it reads one row's weights at a lower rate than
fp32's kernel reads its own, while ATen's own matrix-vector kernel, which PyTorch runs for a bf16 product when oneDNN
is switched off, reads them faster than either. For several rows (prefill, batched steps) that kernel is far
slower and the packed one stays best. `GemvPackedLinear` therefore holds both forms, the weight twice: nn.Linear's
(N, K) for one row, the packed one for several (`python -m benchmarks bandwidth` and `python -m benchmarks layouts`
measure these on a machine).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attnkit.blocks import TransformerBlock
from attnkit.errors import InputError
from attnkit.generate import native_gemv
from attnkit.generate.swap import swap_layers
from attnkit.machine import CpuCapabilities


class TransposedLinear(nn.Module):
    """A linear layer holding W^T (K, N) contiguously. x (..., K) -> (..., N); inference only."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.register_buffer("weight_t", linear.weight.detach().t().contiguous())  # (K, N)
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        rows = x.reshape(-1, self.in_features)  # (M, K)
        out = rows @ self.weight_t if self.bias is None else torch.addmm(self.bias, rows, self.weight_t)  # (M, N)
        return out.view(*x.shape[:-1], self.out_features)


class PackedLinear(nn.Module):
    """A bf16 linear layer whose weight oneDNN has packed once. x (..., K) -> (..., N), equal to nn.Linear's;
    inference only: the packed weight is an opaque oneDNN tensor, which cannot be saved, copied or moved."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        cpu = CpuCapabilities.detect()
        if not cpu.onednn_bf16:
            raise InputError(f"oneDNN packs bf16 weights only on CPUs with AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; "
                             f"this one reports {cpu.isa}: keep nn.Linear (the inference plan does)")
        self.register_buffer("weight_packed", pack(linear.weight), persistent=False)  # (N, K), oneDNN's blocked layout
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().clone())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: Tensor) -> Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), self.weight_packed, self.bias, "none", [], "")


def pack(weight: Tensor) -> Tensor:
    """A bf16 weight (N, K) packed by oneDNN for `PackedLinear`: an opaque tensor in oneDNN's blocked layout."""
    # oneDNN's public Python surface is torch.ops.mkldnn (as inductor's weight freezing calls it); the batch-size hint
    # 1 picks the layout for one decoding row per sequence, and any number of rows computes with it
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), 1)


class GemvLinear(nn.Module):
    """A bf16 linear layer for decoding on CPUs without bf16 arithmetic: one row through ATen's matrix-vector kernel,
    several through nn.Linear. x (..., K) -> (..., N), equal to nn.Linear's up to the order of summation; inference
    only.

    The weight stays bf16 (half of fp32's bytes: a one-row product is bound by reading it), and ATen's kernel widens
    each element to fp32 as it reads it and accumulates in fp32, which every CPU with AVX2 does at full width; where
    oneDNN cannot pack bf16 it runs a reference path for the same product instead. While oneDNN is enabled, ATen
    sends every bf16 product to it, and PyTorch has no per-call choice of CPU kernel; so oneDNN is switched off
    around a one-row product (`torch.backends.mkldnn.enabled`, a process-wide flag that is set back at once: a
    product another thread runs at that instant may take ATen's kernel too, with the same numbers up to rounding).
    Whether it is faster than nn.Linear on a CPU is measured (`attnkit tune`).
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.register_buffer("weight", linear.weight.detach())  # (N, K), the tensor as loaded (a tied table's too)
        self.register_buffer("_bias", None if linear.bias is None else linear.bias.detach())
        self.in_features, self.out_features = linear.in_features, linear.out_features

    @property
    def bias(self) -> Tensor | None:
        return self._bias

    def rows(self, x: Tensor) -> Tensor:
        """Several rows: nn.Linear's product."""
        return F.linear(x, self.weight, self.bias)

    def forward(self, x: Tensor) -> Tensor:
        if x.numel() != self.in_features:  # several rows
            return self.rows(x)
        enabled = torch.backends.mkldnn.enabled
        torch.backends.mkldnn.enabled = False
        try:
            return F.linear(x, self.weight, self.bias)  # (..., 1, N)
        finally:
            torch.backends.mkldnn.enabled = enabled


class GemvPackedLinear(GemvLinear):
    """A bf16 linear layer for decoding: one row through ATen's matrix-vector kernel on nn.Linear's (N, K) weight
    (`GemvLinear`), several rows through the same weight packed once for oneDNN (`PackedLinear`). x (..., K) ->
    (..., N), equal to nn.Linear's up to the order of summation; inference only, on CPUs where oneDNN packs bf16.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        self.packed = PackedLinear(linear)  # several rows; refuses a CPU where oneDNN cannot pack bf16
        self._bias = None  # the packed layer holds it
        self.register_load_state_dict_post_hook(repack)  # a loaded weight is the packed one's too

    @property
    def bias(self) -> Tensor | None:
        return self.packed.bias

    def rows(self, x: Tensor) -> Tensor:
        return self.packed(x)


def repack(layer: GemvPackedLinear, incompatible_keys: object = None) -> None:
    """Pack a `GemvPackedLinear`'s weight again after a state dict is loaded into it (a load_state_dict post-hook: the
    state dict holds the weight as loaded, not oneDNN's opaque copy)."""
    layer.packed.weight_packed = pack(layer.weight)


NATIVE_ROWS = 2  # rows up to which `NativeLinear` takes the hand-written product where a matrix kernel serves more
NATIVE_BF16_ROWS = 32  # the same for bf16 where oneDNN cannot pack it: nn.Linear's bf16 product is a slow reference


class NativeLinear(GemvLinear):
    """An fp32 or bf16 linear layer for decoding: a few rows through the hand-written matrix-vector product
    (`native_gemv`: the weight read as stored, four accumulators, fp32 arithmetic), more through a matrix kernel.
    x (..., K) -> (..., N), in x's dtype, equal to nn.Linear's up to the order of summation (and, for bf16, the fp32
    rounding of the output); inference only, on CPUs with AVX2 and FMA.

    The weight is the tensor as loaded (a tied output layer shares the embedding's table); its checks and address are
    taken once for the native calls (`native_gemv.DenseProduct`), again where it is replaced or its memory moves. The
    product's time is bound by reading the weight, and its kernel reads it at the memory's rate where MKL's fp32 product
    and ATen's bf16 one read it slower (`attnkit tune` measures them on a machine). fp32: up to `NATIVE_ROWS` rows, more
    through nn.Linear's product (MKL's, which reuses each weight it loads across rows). bf16: up to `NATIVE_BF16_ROWS`
    rows, since nn.Linear's bf16 product is oneDNN's reference path where oneDNN cannot pack bf16 (under AVX2, 4 to 32
    rows of GPT-2's block took 1.8-2.1x the native product's time), more through the weight widened to fp32 for the call
    and MKL's product; `NativePackedLinear` keeps oneDNN's packed weight for several rows where it can.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__(linear)
        self.register_buffer("bias_fp32", None, persistent=False)  # (N,): what the kernel adds (`widen_bias`)
        widen_bias(self)
        self.register_load_state_dict_post_hook(widen_bias)  # a loaded bias is the kernel's too
        self.product = native_gemv.dense_product(self.weight, self.bias_fp32)  # checked once, here

    @property
    def fp32(self) -> bool:
        """Whether the weight is fp32 now: `.to(dtype)` may have converted it since the layer was built."""
        return self.weight.dtype == torch.float32

    @property
    def max_rows(self) -> int:
        """Rows up to which the native product serves, for the weight's dtype now."""
        return NATIVE_ROWS if self.fp32 else NATIVE_BF16_ROWS

    def rows(self, x: Tensor) -> Tensor:
        """More rows than the native product takes: nn.Linear's product (fp32), or MKL's on the weight widened to
        fp32 for the call (bf16)."""
        if self.fp32:
            return super().rows(x)
        return F.linear(x.float(), self.weight.float(), self.bias_fp32).to(x.dtype)

    def forward(self, x: Tensor) -> Tensor:
        if x.numel() > self.max_rows * self.in_features:
            return self.rows(x)
        product = native_gemv.layer_product(self, bias="bias_fp32")  # bound again where `.to` replaced the tensors
        out = product(x.reshape(-1, self.in_features), x.dtype)  # (M, N) in x's dtype: bf16 written so by the kernel
        return out.view(*x.shape[:-1], self.out_features)


def widen_bias(layer: NativeLinear, incompatible_keys: object = None) -> None:
    """Set the fp32 bias a `NativeLinear`'s kernel adds from its bias (fp32's own tensor, or a copy), when it is built
    and after a state dict is loaded into it (a load_state_dict post-hook: the copy is not in the state dict)."""
    layer.bias_fp32 = None if layer.bias is None else layer.bias.detach().float()


class NativePackedLinear(NativeLinear, GemvPackedLinear):
    """A bf16 `NativeLinear` whose rows beyond `NATIVE_ROWS` go through the weight packed once for oneDNN
    (`GemvPackedLinear`): the weight held twice, on CPUs where oneDNN packs bf16."""

    max_rows = NATIVE_ROWS  # in every dtype: more rows go to oneDNN's packed product (`rows`)

    def rows(self, x: Tensor) -> Tensor:
        return GemvPackedLinear.rows(self, x)


def gemv_linear_weights(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of a bf16 `model` (in place) by a GemvLinear; returns the model, for inference only."""
    return swap_layers(model, nn.Linear, GemvLinear)


def gemv_pack_linear_weights(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of a bf16 `model` (in place) by a GemvPackedLinear; returns the model, for inference
    only. Each weight is held twice: as loaded, and packed."""
    return swap_layers(model, nn.Linear, GemvPackedLinear)


def native_linear_weights(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of an fp32 or bf16 `model` (in place) by a NativeLinear; returns the model, for
    inference only."""
    return swap_layers(model, nn.Linear, NativeLinear)


def native_pack_linear_weights(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of a bf16 `model` (in place) by a NativePackedLinear; returns the model, for inference
    only. Each weight is held twice: as loaded, and packed."""
    return swap_layers(model, nn.Linear, NativePackedLinear)


def pack_linear_weights(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of a bf16 `model` (in place) by a PackedLinear; returns the model, for inference only.

    A tied output layer gets its own packed copy (V x C more numbers held); the embedding keeps its table.
    """
    return swap_layers(model, nn.Linear, PackedLinear)


def transpose_linear_weights(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear of `model` (in place) by a TransposedLinear; returns the model, for inference only.

    A tied output layer gets its own transposed copy (V x C more numbers held); the embedding keeps its table.
    """
    return swap_layers(model, nn.Linear, TransposedLinear)


def fuse_qkv_projections(model: nn.Module) -> nn.Module:
    """Fuse the q/k/v projections of every block's self-attention (in place, for inference); returns the model."""
    for module in model.modules():
        if isinstance(module, TransformerBlock) and module.self_attn.qkv_proj is None:
            module.self_attn.fuse_qkv()
    return model.eval()
