"""Where a batch-1 decoding token's time goes against the matrix-vector roofline: the whole eager step, its linear
layers as the step calls them, and their bound products alone (`native_gemv.DenseProduct`: the kernel's ctypes call
and its output tensor), per token.

    python -m benchmarks decode_parts [--dtypes fp32 bf16] [--rounds 5] [--case generate-small-b1]

The model is the speed suite's row (`speed.step_function`: the inference plan applied, as `attnkit generate` runs
it). Decoding one token reads every weight once, so the products' floor is the weights' bytes over the memory's rate:
the products' own rate (bytes over their time) says how near they are to it, and the rest of the token is
what the layers and the step add around them. Each part is timed in this process's CPU time (`time.process_time`,
which other jobs on a shared machine disturb less than the wall clock), the parts taking turns within each round,
best of `--rounds`. Beside them, the fp32 copies of a bf16 KV cache that the attention math kernel
(`layers.kernels.grouped_attention`) makes a token: its keys and values widened, at each length the generation reaches,
in every layer whose kernel covers that length (none in fp32, whose cache the kernel reads as it is). Results:
benchmarks/results/decode-parts-cpu.json and .md, with the machine's capabilities and the load average.
"""

from __future__ import annotations

import argparse
import os
import time

import torch

from attnkit.generate.decode_layout import NativeLinear
from attnkit.layers.attention import Attention
from attnkit.machine import CpuCapabilities
from benchmarks import speed
from benchmarks.common import load_averages, write_report

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CALLS = 100  # calls of each layer per timing of the layers' parts


def parts(case: speed.Case, dtype: str, rounds: int) -> dict:
    """Per token, in ms: the whole step, its native layers as called and their products; the weights' bytes a token."""
    model, step = speed.step_function(case, "attnkit", dtype)
    layers = [m for m in model.modules() if isinstance(m, NativeLinear)]
    if not layers:
        raise SystemExit(f"the plan gave this machine no native layers for {dtype}: nothing to split")
    rows = [torch.randn(1, 1, layer.in_features, dtype=DTYPES[dtype]) for layer in layers]  # (1, 1, K) each

    def called() -> None:
        for layer, x in zip(layers, rows, strict=True):
            layer(x)

    def products() -> None:
        for layer, x in zip(layers, rows, strict=True):
            layer.product(x.view(1, -1))

    caches = cache_copies(model, case, DTYPES[dtype])

    def widened() -> None:
        for keys in caches:
            keys.float()

    timings = {"step": [], "layers": [], "products": [], "cache_widened": []}
    with torch.no_grad():
        step()  # warm
        for _ in range(rounds):
            start = time.process_time()
            step()
            timings["step"].append((time.process_time() - start) / case.new_tokens)
            for name, run in (("layers", called), ("products", products), ("cache_widened", widened)):
                run()
                start = time.process_time()
                for _ in range(CALLS):
                    run()
                per = CALLS * (case.new_tokens if name == "cache_widened" else 1)  # the copies of every token at once
                timings[name].append((time.process_time() - start) / per)
    weight_bytes = sum(layer.weight.numel() * layer.weight.element_size() for layer in layers)
    best = {name: 1e3 * min(values) for name, values in timings.items()}
    return {"dtype": dtype, "layers": len(layers), "weight_mb": round(weight_bytes / 1e6, 2),
            **{f"{name}_ms": round(ms, 3) for name, ms in best.items()},
            "products_gb_per_s": round(weight_bytes / best["products"] / 1e6, 1),
            "cache_copies_per_token": round(len(caches) / case.new_tokens, 1)}


def cache_copies(model: torch.nn.Module, case: speed.Case, dtype: torch.dtype) -> list[torch.Tensor]:
    """The cache views the math kernel widens to fp32 over one generation: keys and values (1, Hkv, S, D), sliced
    from a buffer as the KV cache holds them, at each length S the decoding steps reach, for each attention layer whose
    kernel covers S. None in fp32 (the kernel reads an fp32 cache as it is), and none where the math kernel has a
    one-query kernel (`native_gemv.attend_one`, which reads a bf16 cache as it is)."""
    if dtype == torch.float32:
        return []
    query = torch.empty(1, 1, 1, 1, dtype=dtype)  # (B, H, T, D): one decoding query, which `covers` reads
    lengths = range(case.seq_len + 1, case.seq_len + case.new_tokens + 1)
    copies = []
    for layer in (m for m in model.modules() if isinstance(m, Attention) and m.math_kernel is not None
                  and m.math_kernel.one_query is None):
        buffer = torch.randn(1, layer.n_kv_heads, lengths[-1], layer.head_dim, dtype=dtype)  # (1, Hkv, S_max, D)
        copies += [buffer[:, :, :length] for length in lengths if layer.math_kernel.covers(query, length)] * 2
    return copies


def batch_one_case(parser: argparse.ArgumentParser, name: str) -> speed.Case:
    """The speed suite's batch-1 generation case `name`; the parser's error (exit 2) for any other."""
    case = next((c for c in speed.CASES if c.name == name and c.kind == "generate"), None)
    if case is None or case.batch_size != 1:
        parser.error(f"--case must name a batch-1 generation case of the speed suite, not {name!r}")
    return case


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks decode_parts", description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--case", default="generate-small-b1", help="a batch-1 generation case of the speed suite")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    case = batch_one_case(parser, args.case)
    load_before = os.getloadavg()
    rows = [parts(case, dtype, args.rounds) for dtype in args.dtypes]
    load_after = os.getloadavg()
    cpu = CpuCapabilities.detect().summary()
    lines = [f"`{case.name}`, one torch thread, per token, best of {args.rounds} rounds (CPU time). CPU: {cpu}; torch "
             f"{torch.__version__}; {load_averages(load_before, load_after)}. Command: `python -m benchmarks "
             f"decode_parts --dtypes {' '.join(args.dtypes)} --rounds {args.rounds} --case {case.name}`", "",
             "| dtype | weights read a token | whole step | linear layers as called | their products | products' rate "
             "| around the products | bf16 cache widened to fp32 (copies) |", "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['dtype']} | {r['weight_mb']} MB | {r['step_ms']} ms | {r['layers_ms']} ms | {r['products_ms']} ms "
              f"| {r['products_gb_per_s']} GB/s | {round(r['step_ms'] - r['products_ms'], 3)} ms "
              f"| {r['cache_widened_ms']} ms ({r['cache_copies_per_token']}) |"
              for r in rows]
    table = "\n".join(lines)
    print(table)
    write_report("decode-parts-cpu", {"args": vars(args), "cpu": cpu, "torch": torch.__version__, "rows": rows,
                                      "load_average_before": load_before, "load_average_after": load_after}, table)
    return 0
