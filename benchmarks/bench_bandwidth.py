"""How close one-token matrix products come to the machine's memory bandwidth: the ceiling of batch-1 decoding.

    python -m benchmarks bandwidth [--threads 1] [--repeats 7]

For the weight matrices of two decoders (the speed suite's small 6x384 model and `gpt2-124m`), cycled through in
order as one decoding step reads them (so they come from memory, not cache), it times: a plain sum over the same
weights (the read bandwidth any kernel could reach), `F.linear` on (N, K) weights (nn.Linear's layout), `addmm` on
(K, N) weights (`generate/decode_layout.py`), bf16 `F.linear`, and where oneDNN packs bf16 weights, bf16 weights
packed once for oneDNN and bf16 one-row products through ATen's matrix-vector kernel (the same module's
`PackedLinear` and `GemvPackedLinear`); PyTorch's int8-weight kernel (`generate/quantize.py`), its int4 kernel
where it is vectorized (`Int4Linear`), and, where FBGEMM runs, int8 weights with the row quantized to int8 as it
runs (`Int8DynamicLinear`); where the native kernels build (`generate/native_gemv.py`), their fp32 product and
their bf16 one, which widens the weights to fp32, and where the CPU reports AVX512-BF16 its dot product on a bf16
row (`gemv_bf16_dot`). The kernels take turns, pass by pass (which goes first alternating), so a machine
shared with other work slows them alike; each reports its median pass and, as the median over the passes, its rate
as a share of the bf16 sum's rate in the same pass. Results: benchmarks/results/bandwidth-<machine>.json and .md.
"""

from __future__ import annotations

import os
import statistics

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.generate import native_gemv
from attnkit.generate.decode_layout import GemvPackedLinear
from attnkit.generate.quantize import Int4Linear, Int8DynamicLinear, dynamic_quantization_available
from attnkit.machine import CpuCapabilities
from benchmarks.common import parse_args, timed_runs, write_results

MODELS = {"small 6x384": (6, 384, 65), "gpt2-124m": (12, 768, 50257)}  # layers, width, vocabulary
BF16_SUM = "sum (read only), bf16"  # the rate every kernel is compared with, pass by pass


def weight_shapes(n_layers: int, width: int, vocab: int) -> list[tuple[int, int]]:
    """(N, K) of every matrix one decoding step multiplies by: q, k, v, o, MLP up and down, then the output layer."""
    block = [(width, width)] * 4 + [(4 * width, width), (width, 4 * width)]
    return block * n_layers + [(vocab, width)]


def _linear(weight: torch.Tensor) -> nn.Linear:
    linear = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear.weight = nn.Parameter(weight, requires_grad=False)
    return linear


def kernels(shapes: list[tuple[int, int]]) -> dict[str, tuple[int, object]]:
    """name -> (bytes of weights read, a function doing one pass over all of them)."""
    generator = torch.Generator().manual_seed(0)
    fp32 = [torch.randn(n, k, generator=generator) for n, k in shapes]
    transposed = [w.t().contiguous() for w in fp32]
    bf16 = [w.bfloat16() for w in fp32]
    int8 = [torch.randint(-127, 128, (n, k), generator=generator, dtype=torch.int8) for n, k in shapes]
    scales = [torch.rand(n, generator=generator).bfloat16() for n, _ in shapes]
    rows = {k: torch.randn(1, k, generator=generator) for _, k in shapes}
    rows_bf16 = {k: x.bfloat16() for k, x in rows.items()}

    def nbytes(tensors: list[torch.Tensor]) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    table = {
        "sum (read only), fp32": (nbytes(fp32), lambda: [w.sum() for w in fp32]),
        "F.linear (N, K), fp32": (nbytes(fp32), lambda: [F.linear(rows[w.shape[1]], w) for w in fp32]),
        "addmm (K, N), fp32": (nbytes(transposed), lambda: [rows[w.shape[0]] @ w for w in transposed]),
        BF16_SUM: (nbytes(bf16), lambda: [w.sum() for w in bf16]),
        "F.linear (N, K), bf16": (nbytes(bf16), lambda: [F.linear(rows_bf16[w.shape[1]], w) for w in bf16]),
        "int8 weights, bf16": (nbytes(int8), lambda: [torch._weight_int8pack_mm(rows_bf16[w.shape[1]], w, s)
                                                      for w, s in zip(int8, scales, strict=True)]),
    }
    cpu = CpuCapabilities.detect()
    if cpu.onednn_bf16:  # the same bf16 weights, packed once for oneDNN, and kept as they are for one-row products
        gemv = [GemvPackedLinear(_linear(w)) for w in bf16]
        packed = [g.packed for g in gemv]  # the same packed weights, once
        table["packed once (decode_layout.PackedLinear), bf16"] = (
            nbytes(bf16), lambda: [p(rows_bf16[p.in_features]) for p in packed])
        table["ATen matrix-vector (decode_layout.GemvPackedLinear), bf16"] = (
            nbytes(bf16), lambda: [g(rows_bf16[g.in_features]) for g in gemv])
    if cpu.int4_kernel:  # 4-bit weights in groups of 32, bf16 products
        int4 = [Int4Linear(_linear(w)) for w in fp32]
        table["int4 weights (quantize.Int4Linear), bf16"] = (
            sum(nbytes([m.weight_packed, m.scales_and_zeros]) for m in int4),
            lambda: [m(rows_bf16[m.in_features]) for m in int4])
    if dynamic_quantization_available() is None:  # the same int8 weights, activations quantized as they run
        dynamic = [Int8DynamicLinear(_linear(w)) for w in fp32]
        table["int8 weights and activations (quantize.Int8DynamicLinear)"] = (
            nbytes(int8), lambda: [layer(rows[layer.in_features]) for layer in dynamic])
    if native_gemv.unavailable() is None:  # fp32 rows: the bf16 product widens the weights (no dot product)
        table["native (native_gemv.gemv_f32), fp32"] = (
            nbytes(fp32), lambda: [native_gemv.gemv_f32(w, rows[w.shape[1]]) for w in fp32])
        table["native, widened (native_gemv.gemv_bf16, fp32 row), bf16"] = (
            nbytes(bf16), lambda: [native_gemv.gemv_bf16(w, rows[w.shape[1]]) for w in bf16])
        if native_gemv.bf16_dot():
            table["native dot (native_gemv.gemv_bf16_dot, bf16 row), bf16"] = (
                nbytes(bf16), lambda: [native_gemv.gemv_bf16_dot(w, rows_bf16[w.shape[1]]) for w in bf16])
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args("bandwidth", __doc__, argv, repeats=7)
    rows = []
    for model, dims in MODELS.items():
        table = kernels(weight_shapes(*dims))
        for _, run in table.values():  # warm-up
            run()
        times: dict[str, list[float]] = {name: [] for name in table}
        for n in range(args.repeats):
            for name in (list(table) if n % 2 == 0 else list(reversed(table))):
                times[name].extend(timed_runs(table[name][1], 1, warmup=0))
        sum_bytes, sum_times = table[BF16_SUM][0], times[BF16_SUM]
        for name, (n_bytes, _) in table.items():
            seconds = statistics.median(times[name])
            pairs = zip(times[name], sum_times, strict=True)
            share = statistics.median(n_bytes * s / (sum_bytes * t) for t, s in pairs)
            rows.append({"model": model, "kernel": name, "weight_bytes": n_bytes, "ms": 1000 * seconds,
                         "gb_per_s": n_bytes / seconds / 1e9, "share_of_bf16_sum": share})
            print(f"{model:12s} {name:60s} {1000 * seconds:8.2f} ms  {n_bytes / seconds / 1e9:6.1f} GB/s  "
                  f"{share:4.0%} of the bf16 sum's rate", flush=True)
    table = [f"CPU: {CpuCapabilities.detect().summary()}; load average at the end {os.getloadavg()[0]:.1f}.", "",
             "| weights of | kernel | MB read | ms per pass (median) | GB/s | rate / the bf16 sum's (median of passes) "
             "|",
             "|---|---|---|---|---|---|"]
    table += [f"| {r['model']} | {r['kernel']} | {r['weight_bytes'] / 1e6:.1f} | {r['ms']:.2f} | {r['gb_per_s']:.1f} | "
              f"{r['share_of_bf16_sum']:.0%} |" for r in rows]
    write_results(f"bandwidth-{args.machine}", "bandwidth", args, argv, rows, table)
    return 0
