"""Attention kernels side by side: PyTorch's fused `scaled_dot_product_attention` against attnkit's
`grouped_attention` (plain float32 matrix products), for the shapes the speed suite trains and decodes.

    python -m benchmarks attention [--threads 1] [--repeats 20]

Two workloads per shape and dtype: a causal training pass (forward and backward, T queries over T keys) and one
decoding query over S cached keys. The numbers decide `math_kernel_is_faster` in `layers/kernels.py`; they are
written to benchmarks/results/attention-kernels.json and a markdown table beside it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from attnkit.layers.kernels import grouped_attention
from attnkit.layers.masks import AttentionMask
from benchmarks.common import median_seconds, parse_args, write_results

# (batch, heads, head_dim, length): nanoGPT's CPU shape, the 6+6 encoder-decoder, nanoGPT's Shakespeare shape at
# 128 and 256 keys, and gpt2-124m's 512.
TRAIN_SHAPES = [(12, 4, 32, 64), (8, 8, 64, 64), (4, 6, 64, 128), (4, 6, 64, 256), (2, 12, 64, 512)]
DECODE_SHAPES = [(1, 6, 64, 144), (8, 12, 64, 144), (1, 12, 64, 512), (8, 12, 64, 512), (1, 12, 64, 2048)]


def _training_pass(kernel: str, shape: tuple[int, int, int, int], dtype: torch.dtype):
    batch, heads, dim, length = shape
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, length, dim, generator=generator, dtype=dtype).requires_grad_()
               for _ in range(3))
    grad = torch.randn(batch, heads, length, dim, generator=generator, dtype=dtype)
    mask = AttentionMask(length, causal=True).bias(length)  # (T, T): -inf above the diagonal

    def run() -> None:
        if kernel == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            out = grouped_attention(q, k, v, mask)
        out.backward(grad)
    return run


def _decoding_query(kernel: str, shape: tuple[int, int, int, int], dtype: torch.dtype):
    batch, heads, dim, keys = shape
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, 1, dim, generator=generator, dtype=dtype)
    k, v = (torch.randn(batch, heads, keys, dim, generator=generator, dtype=dtype) for _ in range(2))

    @torch.no_grad()
    def run() -> None:
        if kernel == "sdpa":
            F.scaled_dot_product_attention(q, k, v)
        else:
            grouped_attention(q, k, v, None)
    return run


def main(argv: list[str] | None = None) -> int:
    args = parse_args("attention", __doc__, argv, repeats=20)
    rows = []
    workloads = [("train", s, _training_pass) for s in TRAIN_SHAPES] + [("decode", s, _decoding_query)
                                                                         for s in DECODE_SHAPES]
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for workload, shape, make in workloads:
            times = {kernel: 1000 * median_seconds(make(kernel, shape, dtype), args.repeats)
                     for kernel in ("sdpa", "math")}
            row = {"workload": workload, "shape_BHDT": shape, "dtype": dtype_name, "sdpa_ms": times["sdpa"],
                   "math_ms": times["math"], "math_speedup": times["sdpa"] / times["math"]}
            rows.append(row)
            print(f"{workload:6s} {dtype_name} B,H,D,T={shape}: sdpa {times['sdpa']:8.3f} ms  "
                  f"math {times['math']:8.3f} ms  math speedup {row['math_speedup']:.2f}x", flush=True)
    table = ["| workload | dtype | B, H, D, T (decode: S keys) | SDPA ms | grouped_attention ms | speedup |",
             "|---|---|---|---|---|---|"]
    table += [f"| {r['workload']} | {r['dtype']} | {', '.join(map(str, r['shape_BHDT']))} | {r['sdpa_ms']:.3f} | "
              f"{r['math_ms']:.3f} | {r['math_speedup']:.2f}x |" for r in rows]
    write_results("attention-kernels", "attention", args, argv, rows, table)
    return 0
