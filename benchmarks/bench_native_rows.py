"""How many rows the native matrix-vector products should take before a matrix kernel: `decode_layout.NATIVE_ROWS`.

    python -m benchmarks native_rows [--rows 1 2 3 4 6 8] [--rounds 7] [--shapes 384x1152 768x3072 3072x768]

For each (in, out) shape and row count, the native product (`native_gemv.dense_product`: fp32 weights through
`gemv_f32`; bf16 weights and rows through `gemv_bf16_dot` where the CPU has AVX512-BF16, else `gemv_bf16` with the rows
widened) against the matrix kernel a `NativeLinear` hands more rows to: MKL's fp32 product (nn.Linear), and for bf16
oneDNN's packed weight (`decode_layout.PackedLinear`) where oneDNN packs bf16, else the weight widened to fp32 for
the call. The weights are repeated up to about 64 MB of fp32 so that each product reads them from memory, as
decoding does. Each timing is this process's CPU time (`time.process_time`, which other jobs on a shared machine
disturb less than the wall clock) for one pass over the copies, one torch thread; the two kernels alternate, the
order reversed every round, and each reports its median round. Results: benchmarks/results/native-rows-<isa>.json and
.md, with the CPU's capabilities and the load average.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.generate import native_gemv
from attnkit.generate.decode_layout import NATIVE_ROWS, PackedLinear
from attnkit.machine import CpuCapabilities
from benchmarks.common import load_averages, write_report

WEIGHTS_MB = 64


def products(dtype: torch.dtype, k: int, n: int, cpu: CpuCapabilities) -> tuple[dict[str, list], str]:
    """Copies of one (n, k) layer in `dtype` up to `WEIGHTS_MB` of fp32, as each kernel's callables; the matrix
    kernel's name."""
    copies = max(1, WEIGHTS_MB * 2**20 // (4 * k * n))
    layers = [nn.Linear(k, n).to(dtype) for _ in range(copies)]
    native = [native_gemv.dense_product(layer.weight.detach(), layer.bias.detach().float()) for layer in layers]
    if dtype == torch.float32:
        return {"native": native, "matrix": layers}, "MKL (nn.Linear)"
    if cpu.onednn_bf16:
        return {"native": native, "matrix": [PackedLinear(layer) for layer in layers]}, "oneDNN, packed weight"
    widened = [lambda x, layer=layer: F.linear(x.float(), layer.weight.float(), layer.bias.float())
               for layer in layers]
    return {"native": native, "matrix": widened}, "MKL, weight widened to fp32"


def cpu_ms(calls: list, x: torch.Tensor) -> float:
    started = time.process_time()
    for call in calls:
        call(x)
    return (time.process_time() - started) * 1e3


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks native_rows", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 2, 3, 4, 6, 8])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shapes", nargs="+", default=["384x1152", "768x3072", "3072x768"],
                        help="(in)x(out) widths of the layers timed")
    args = parser.parse_args(argv)
    reason = native_gemv.unavailable()
    if reason is not None:
        parser.error(f"the native kernels cannot run here: {reason}")
    torch.set_num_threads(1)
    cpu = CpuCapabilities.detect()
    load_before, results = os.getloadavg(), []
    with torch.inference_mode():
        for dtype in (torch.float32, torch.bfloat16):
            for shape in args.shapes:
                k, n = (int(width) for width in shape.split("x"))
                kernels, matrix = products(dtype, k, n, cpu)
                for rows in args.rows:
                    x = torch.randn(rows, k).to(dtype)
                    times: dict[str, list[float]] = {name: [] for name in kernels}
                    for name in kernels:  # warm-up
                        cpu_ms(kernels[name], x)
                    for round_ in range(args.rounds):
                        for name in (list(kernels) if round_ % 2 == 0 else list(reversed(kernels))):
                            times[name].append(cpu_ms(kernels[name], x))
                    ms = {name: statistics.median(t) / len(kernels[name]) for name, t in times.items()}
                    results.append({"dtype": str(dtype).removeprefix("torch."), "shape": shape, "rows": rows,
                                    "matrix_kernel": matrix, "ms": ms,
                                    "matrix_over_native": ms["matrix"] / ms["native"]})
                    print(results[-1], flush=True)
    load_after = os.getloadavg()
    dot = "bf16 rows through AVX512-BF16's dot product" if native_gemv.bf16_dot() else "bf16 weights widened to fp32"
    lines = [f"CPU: {cpu.summary()}; one torch thread; {dot}; NATIVE_ROWS = {NATIVE_ROWS}; {args.rounds} rounds, "
             f"CPU time per product, median; {load_averages(load_before, load_after)}. Command: `python -m benchmarks "
             f"native_rows {' '.join(argv if argv is not None else [])}`", "",
             "| dtype | shape (in x out) | rows | native ms | matrix kernel | matrix ms | matrix / native time |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['dtype']} | {r['shape']} | {r['rows']} | {r['ms']['native']:.4f} | {r['matrix_kernel']} | "
              f"{r['ms']['matrix']:.4f} | {r['matrix_over_native']:.2f}x |" for r in results]
    report = {"cpu": cpu.to_dict(), "load_average": [load_before, load_after], "native_rows": NATIVE_ROWS,
              "bf16_dot": native_gemv.bf16_dot(), "results": results}
    write_report(f"native-rows-{cpu.isa.split()[0].lower()}", report, "\n".join(lines))
    print("\n".join(lines))
    return 0
