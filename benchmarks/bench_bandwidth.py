"""How close one-token matrix products come to the machine's memory bandwidth: the ceiling of batch-1 decoding.

    python -m benchmarks bandwidth [--threads 1] [--repeats 7]

For the weight matrices of two decoders (the speed suite's small 6x384 model and `gpt2-124m`), cycled through in
order as one decoding step reads them (so they come from memory, not cache), it times: a plain sum over the same
weights (the read bandwidth any kernel could reach), `F.linear` on (N, K) weights (nn.Linear's layout), `addmm` on
(K, N) weights (`generate/decode_layout.py`), bf16 `F.linear`, bf16 weights packed once for oneDNN (the same
module), PyTorch's int8-weight kernel (`generate/quantize.py`), and, where FBGEMM runs, int8 weights with the
row quantized to int8 as it runs (the same module's `Int8DynamicLinear`). Results:
benchmarks/results/bandwidth.json and a markdown table beside it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.generate.decode_layout import PackedLinear
from attnkit.generate.quantize import Int8DynamicLinear, dynamic_quantization_available
from benchmarks.common import median_seconds, parse_args, write_results

MODELS = {"small 6x384": (6, 384, 65), "gpt2-124m": (12, 768, 50257)}  # layers, width, vocabulary


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
    packed = [PackedLinear(_linear(w)) for w in bf16]  # the same weights, packed once for oneDNN

    def nbytes(tensors: list[torch.Tensor]) -> int:
        return sum(t.numel() * t.element_size() for t in tensors)

    table = {
        "sum (read only), fp32": (nbytes(fp32), lambda: [w.sum() for w in fp32]),
        "F.linear (N, K), fp32": (nbytes(fp32), lambda: [F.linear(rows[w.shape[1]], w) for w in fp32]),
        "addmm (K, N), fp32": (nbytes(transposed), lambda: [rows[w.shape[0]] @ w for w in transposed]),
        "sum (read only), bf16": (nbytes(bf16), lambda: [w.sum() for w in bf16]),
        "F.linear (N, K), bf16": (nbytes(bf16), lambda: [F.linear(rows_bf16[w.shape[1]], w) for w in bf16]),
        "packed once (decode_layout.PackedLinear), bf16": (nbytes(bf16), lambda: [p(rows_bf16[p.in_features])
                                                                          for p in packed]),
        "int8 weights, bf16": (nbytes(int8), lambda: [torch._weight_int8pack_mm(rows_bf16[w.shape[1]], w, s)
                                                      for w, s in zip(int8, scales, strict=True)]),
    }
    if dynamic_quantization_available() is None:  # the same int8 weights, activations quantized as they run
        dynamic = [Int8DynamicLinear(_linear(w)) for w in fp32]
        table["int8 weights and activations (quantize.Int8DynamicLinear)"] = (
            nbytes(int8), lambda: [layer(rows[layer.in_features]) for layer in dynamic])
    return table


def main(argv: list[str] | None = None) -> int:
    args = parse_args("bandwidth", __doc__, argv, repeats=7)
    rows = []
    for model, dims in MODELS.items():
        for name, (n_bytes, run) in kernels(weight_shapes(*dims)).items():
            seconds = median_seconds(run, args.repeats)
            rows.append({"model": model, "kernel": name, "weight_bytes": n_bytes, "ms": 1000 * seconds,
                         "gb_per_s": n_bytes / seconds / 1e9})
            print(f"{model:12s} {name:24s} {1000 * seconds:8.2f} ms  {n_bytes / seconds / 1e9:6.1f} GB/s", flush=True)
    table = ["| weights of | kernel | MB read | ms per pass | GB/s |", "|---|---|---|---|---|"]
    table += [f"| {r['model']} | {r['kernel']} | {r['weight_bytes'] / 1e6:.1f} | {r['ms']:.2f} | {r['gb_per_s']:.1f} |"
              for r in rows]
    write_results("bandwidth", "bandwidth", args, argv, rows, table)
    return 0
