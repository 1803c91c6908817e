"""One decoding query's attention on the CPU: SDPA, the math kernel's float32 products (`grouped_attention`) and the
native one-query kernel (`native_gemv.attend_one`), then the whole eager token of the speed suite's row with the
one-query kernel on and off (the plan's `MathKernel.one_query`).

    python -m benchmarks decode_attention [--keys 16 80 144 512] [--rounds 5] [--token-rounds 11]
                                          [--case generate-small-b1]

Each kernel times (1, H, 1, D) queries against S cached keys (views into a longer buffer, as a KV cache holds them),
the kernels taking turns within each round, best of `--rounds`, in this process's CPU time (`time.process_time`), one
thread. The token rows swap the one-query kernel in and out of the plan's math kernel on the live model, in turns,
and give the median of the rounds' ratios. Results: benchmarks/results/decode-attention-cpu.json and .md, with the
CPU's capabilities and the load average; `plan.ONE_QUERY_SPEEDUP` quotes each dtype's range of the kernel rows.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import time

import torch
import torch.nn.functional as F

from attnkit.generate import native_gemv
from attnkit.layers.attention import Attention
from attnkit.layers.kernels import grouped_attention, use_math_kernel
from attnkit.machine import CpuCapabilities
from benchmarks import speed
from benchmarks.bench_decode_parts import batch_one_case
from benchmarks.common import load_averages, write_report

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
CALLS = 500  # calls per timing of a kernel


def per_call_us(run, rounds: int, others: list) -> float:
    """Best of `rounds` timings of `run` (CPU time, us a call); `others` run between them, so the kernels take turns."""
    best = float("inf")
    for _ in range(rounds):
        for other in others:
            other()
        run()
        start = time.process_time()
        for _ in range(CALLS):
            run()
        best = min(best, (time.process_time() - start) / CALLS * 1e6)
    return best


def kernel_rows(dtype: torch.dtype, keys: list[int], heads: int, head_dim: int, rounds: int) -> list[dict]:
    rows = []
    for length in keys:
        q = torch.randn(1, heads, 1, head_dim, dtype=dtype)  # (B, H, 1, D)
        k, v = (torch.randn(1, heads, 2 * length, head_dim, dtype=dtype)[:, :, :length] for _ in range(2))
        scale = head_dim**-0.5
        kernels = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v, scale=scale),  # noqa: B023
                   "math": lambda: grouped_attention(q, k, v, None, scale=scale),  # noqa: B023
                   "native": lambda: native_gemv.attend_one(q, k, v, scale)}  # noqa: B023
        times = {name: per_call_us(run, rounds, [r for n, r in kernels.items() if n != name])
                 for name, run in kernels.items()}
        rows.append({"keys": length, **{f"{name}_us": round(t, 1) for name, t in times.items()},
                     "math_over_native": round(times["math"] / times["native"], 2),
                     "sdpa_over_native": round(times["sdpa"] / times["native"], 2)})
    return rows


def token_row(case: speed.Case, dtype: str, rounds: int) -> dict | None:
    """The eager token with the one-query kernel off / on, in turns: median of the rounds' time ratios."""
    model, step = speed.step_function(case, "attnkit", dtype)
    layer = next(m for m in model.modules() if isinstance(m, Attention))
    if layer.math_kernel is None or layer.math_kernel.one_query is None:
        return None  # the plan gave this dtype no one-query kernel here
    on, off = layer.math_kernel, dataclasses.replace(layer.math_kernel, one_query=None)
    ratios, best = [], {"off": float("inf"), "on": float("inf")}
    with torch.no_grad():
        step()
        for index in range(rounds):
            times = {}
            for name, kernel in ((("off", off), ("on", on)) if index % 2 == 0 else (("on", on), ("off", off))):
                use_math_kernel(model, kernel)
                start = time.process_time()
                step()
                times[name] = (time.process_time() - start) / case.new_tokens
                best[name] = min(best[name], times[name])
            ratios.append(times["on"] / times["off"])
    use_math_kernel(model, on)
    return {"dtype": dtype, "rounds": rounds, "on_over_off_median": round(statistics.median(ratios), 3),
            "off_ms_best": round(1e3 * best["off"], 3), "on_ms_best": round(1e3 * best["on"], 3)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks decode_attention", description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="generate-small-b1", help="a batch-1 generation case of the speed suite")
    parser.add_argument("--keys", type=int, nargs="+", default=[16, 80, 144, 512], help="cached keys the kernels read")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the kernels' timings")
    parser.add_argument("--token-rounds", type=int, default=11, help="rounds of the token off and on")
    args = parser.parse_args(argv)
    case = batch_one_case(parser, args.case)
    torch.set_num_threads(1)
    reason = native_gemv.unavailable()
    if reason is not None:
        raise SystemExit(f"the native kernels cannot run here: {reason}")
    load_before = os.getloadavg()
    heads = case.n_heads
    kernels = {name: kernel_rows(dtype, args.keys, heads, case.d_model // heads, args.rounds)
               for name, dtype in DTYPES.items()}
    tokens = [row for name in DTYPES if (row := token_row(case, name, args.token_rounds)) is not None]
    load_after = os.getloadavg()
    cpu = CpuCapabilities.detect().summary()
    lines = [f"One decoding query, (1, {heads}, 1, {case.d_model // heads}) against S keys; one torch thread, CPU time "
             f"a call, best of {args.rounds} rounds in turns. CPU: {cpu}; torch {torch.__version__}; "
             f"{load_averages(load_before, load_after)}. Command: `python -m benchmarks decode_attention --keys "
             f"{' '.join(map(str, args.keys))} --rounds {args.rounds} --token-rounds {args.token_rounds} --case "
             f"{case.name}`", "",
             "| dtype | keys | SDPA us | float32 products us | native one-query us | products / native "
             "| SDPA / native |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {name} | {r['keys']} | {r['sdpa_us']} | {r['math_us']} | {r['native_us']} | {r['math_over_native']}x "
              f"| {r['sdpa_over_native']}x |" for name, rows in kernels.items() for r in rows]
    lines += ["", f"`{case.name}`, eager, the plan's math kernel with the one-query kernel off and on in turns:", "",
              "| dtype | rounds | ms a token, off (best) | on (best) | on / off, median of the rounds |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['dtype']} | {r['rounds']} | {r['off_ms_best']} | {r['on_ms_best']} | {r['on_over_off_median']} |"
              for r in tokens]
    table = "\n".join(lines)
    print(table)
    write_report("decode-attention-cpu", {"args": vars(args), "cpu": cpu, "torch": torch.__version__,
                                          "kernels": kernels, "tokens": tokens, "load_average_before": load_before,
                                          "load_average_after": load_after}, table)
    return 0
