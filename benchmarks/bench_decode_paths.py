"""Eager against captured batch-1 decoding of one model, in one process, and where each spends a token.

    python -m benchmarks decode_paths [--dtypes fp32 bf16] [--rounds 15] [--new-tokens 64]

The speed suite's 6-layer, 384-wide decoder (`bench_generate.SHAPES["small"]`) is built twice per dtype with the
inference plan applied: eagerly (the native products, `decode_layout.NativeLinear`) and with its decoding step
captured ahead of time (`--compile aot`, `captured_step.CapturedDecoding`; captured on first use and kept). The two
generate greedily after a 16-token prompt, taking turns, the order reversed every round; CPU time per token
(`time.process_time`, which other jobs on a shared machine disturb less than the wall clock), median of the rounds,
and the ratio is the median of the rounds' own ratios. Then each runs once under cProfile with the same clock: the
share of its time in kernels (torch's C functions, the native products' calls, the captured step's one call) against
the Python around them. One torch thread. Results: benchmarks/results/decode-paths-<isa>.json and .md, with the
CPU's capabilities and the load average.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time

import torch

from attnkit import build_model
from attnkit.generate.captured_step import CapturedDecoding
from attnkit.generate.decoder import generate_tokens
from attnkit.generate.pipeline import parse_dtype
from attnkit.generate.plan import plan_inference
from attnkit.machine import CpuCapabilities
from benchmarks.bench_generate import PROMPT_LEN, SHAPES, attnkit_config
from benchmarks.common import load_averages, write_report


def decoder(dtype: torch.dtype, compile: bool | str):
    """The small decoder in `dtype`, the plan applied, and a function generating n greedy tokens with it."""
    torch.manual_seed(0)
    model = build_model(attnkit_config(SHAPES["small"])).to(dtype=dtype)
    plan_inference(model, "decoder", compile=compile).apply(model)
    decoding = CapturedDecoding(model) if compile else None
    prompt = [[1] * PROMPT_LEN]
    return lambda n: generate_tokens(model, prompt, max_new_tokens=n, context_len=1024, decoding=decoding)


def kernel_share(run, new_tokens: int) -> tuple[float, float]:
    """Profiled CPU ms per token, and the share of it in kernels (C functions; the native products' calls)."""
    profile = cProfile.Profile(time.process_time)
    profile.runcall(run, new_tokens)
    stats = pstats.Stats(profile).stats
    total = sum(own for _, _, own, _, _ in stats.values())
    kernels = sum(own for (file, _, function), (_, _, own, _, _) in stats.items()
                  if file == "~" or (function == "__call__" and file.endswith("native_gemv.py")))
    return total / new_tokens * 1e3, kernels / total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks decode_paths", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    cpu, load_before, rows = CpuCapabilities.detect(), os.getloadavg(), []
    with torch.inference_mode():
        for name in args.dtypes:
            runs = {"eager": decoder(parse_dtype(name), False), "captured": decoder(parse_dtype(name), "aot")}
            for run in runs.values():  # warm-up (and the capture, where none is kept)
                run(8)
            ms: dict[str, list[float]] = {path: [] for path in runs}
            for round_ in range(args.rounds):
                for path in (list(runs) if round_ % 2 == 0 else list(reversed(runs))):
                    started = time.process_time()
                    runs[path](args.new_tokens)
                    ms[path].append((time.process_time() - started) / args.new_tokens * 1e3)
            ratio = statistics.median(e / c for e, c in zip(ms["eager"], ms["captured"], strict=True))
            profiled = {path: kernel_share(run, args.new_tokens) for path, run in runs.items()}
            rows.append({"dtype": name, "ms_per_token": {path: statistics.median(t) for path, t in ms.items()},
                         "eager_over_captured": ratio, "profiled": profiled})
            print(rows[-1], flush=True)
    lines = [f"CPU: {cpu.summary()}; one torch thread; the 6x384 decoder at batch 1, {args.new_tokens} new tokens "
             f"after {PROMPT_LEN}, {args.rounds} rounds in turns, CPU time; "
             f"{load_averages(load_before, os.getloadavg())}. Command: "
             f"`{' '.join(['python -m benchmarks decode_paths', *(argv or [])])}`", "",
             "| dtype | eager ms/token | captured ms/token | eager / captured time | eager profiled: in kernels | "
             "captured profiled: in kernels |", "|---|---|---|---|---|---|"]
    for r in rows:
        (eager_ms, eager_share), (captured_ms, captured_share) = r["profiled"]["eager"], r["profiled"]["captured"]
        lines.append(f"| {r['dtype']} | {r['ms_per_token']['eager']:.3f} | {r['ms_per_token']['captured']:.3f} | "
                     f"{r['eager_over_captured']:.2f}x | {eager_share:.0%} of {eager_ms:.2f} ms | {captured_share:.0%} "
                     f"of {captured_ms:.2f} ms |")
    write_report(f"decode-paths-{cpu.isa.split()[0].lower()}", {"cpu": cpu.to_dict(), "rows": rows}, "\n".join(lines))
    print("\n".join(lines))
    return 0
