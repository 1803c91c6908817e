"""Where an eager decoding token's time goes: attnkit's greedy decoding beside transformers' `generate` on a model of
the same configuration (`bench_generate`'s), CPU time per token, and attnkit's split by where it is spent.

    python -m benchmarks decode_profile [--repeats 3] [--new-tokens 64] [--shapes small gpt2-124m]

For each shape, in fp32 at batch 1 after a 16-token prompt: each side's CPU time per new token (this process's time,
`time.process_time`, which other jobs on a shared machine disturb less than the wall clock; the two alternate, median
of `--repeats`), their ratio, then one of attnkit's runs under cProfile with the same clock, its time summed by source
file. C functions (torch's operators, and the native kernels' ctypes call inside `native_gemv._dense`) are the
kernels; the Python around them is the per-token overhead a captured step (`--compile aot`) removes. A profiled run
takes about twice the time, most of the added time in the Python, so the split is read as shares. Results go to
benchmarks/results/decode-profile-cpu.json and .md, with the machine's capabilities and the load average.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time
from collections import Counter

import torch

from attnkit.machine import CpuCapabilities
from benchmarks.bench_generate import PROMPT_LEN, SHAPES, attnkit_model, runner, transformers_model
from benchmarks.common import write_report

KERNEL_FUNCTIONS = ("_dense",)  # Python functions whose own time is a native kernel's (the ctypes call inside)


def cpu_seconds(run, new_tokens: int) -> float:
    started = time.process_time()
    run(new_tokens)
    return time.process_time() - started


def profile_by_file(run, new_tokens: int) -> tuple[Counter, float]:
    """Profiled CPU seconds per token by source file (C functions as "kernels"), and the kernels' share."""
    profile = cProfile.Profile(time.process_time)
    profile.runcall(run, new_tokens)
    where: Counter = Counter()
    for (file, _, function), (_, _, own, _, _) in pstats.Stats(profile).stats.items():
        kernel = file == "~" or function in KERNEL_FUNCTIONS
        name = "kernels (torch operators, native ctypes calls)" if kernel else file.split("site-packages/")[-1]
        where[name.split("src/")[-1]] += own / new_tokens
    total = sum(where.values())
    return where, where["kernels (torch operators, native ctypes calls)"] / total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks decode_profile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    load_at_start = os.getloadavg()[0]
    rows, lines = [], []
    with torch.inference_mode():
        for shape_name in args.shapes:
            shape = SHAPES[shape_name]
            prompt = torch.randint(0, shape["vocab_size"], (1, PROMPT_LEN), generator=torch.Generator().manual_seed(0))
            torch.manual_seed(0)
            runs = {"attnkit": runner("attnkit", attnkit_model(shape, torch.float32, "cpu"), prompt),
                    "transformers": runner("transformers", transformers_model(shape, torch.float32, "cpu"), prompt)}
            for run in runs.values():
                run(4)  # warm-up
            samples = {side: [] for side in runs}
            for repeat in range(args.repeats):
                for side in (runs if repeat % 2 == 0 else reversed(list(runs))):
                    samples[side].append(cpu_seconds(runs[side], args.new_tokens) / args.new_tokens)
            ms = {side: statistics.median(times) * 1e3 for side, times in samples.items()}
            where, kernel_share = profile_by_file(runs["attnkit"], args.new_tokens)
            rows.append({"shape": shape_name, "cpu_ms_per_token": ms, "attnkit_profiled_ms_per_token_by_file": {
                name: round(seconds * 1e3, 4) for name, seconds in where.most_common()}, "kernel_share": kernel_share})
            lines += [f"### {shape_name}, fp32, batch 1", "",
                      f"CPU time per token: attnkit {ms['attnkit']:.2f} ms, transformers {ms['transformers']:.2f} ms "
                      f"(attnkit {ms['transformers'] / ms['attnkit']:.2f}x transformers' speed). Profiled attnkit: "
                      f"{kernel_share:.0%} of its time in kernels, so about {(1 - kernel_share) * ms['attnkit']:.2f} "
                      "ms a token of Python around them (the profiler's share, applied to the unprofiled time).", "",
                      "| where (attnkit, profiled) | ms per token | share |", "|---|---|---|"]
            total = sum(where.values())
            lines += [f"| {name} | {seconds * 1e3:.3f} | {seconds / total:.0%} |"
                      for name, seconds in where.most_common(12)] + [""]
            print("\n".join(lines[-16:]), flush=True)
    loads = (load_at_start, os.getloadavg()[0])
    header = (f"Eager greedy decoding, fp32, batch 1, {args.new_tokens} new tokens after {PROMPT_LEN}; one torch "
              f"thread; median of {args.repeats}. Machine: {CpuCapabilities.detect().summary()}; torch "
              f"{torch.__version__}. "
              f"1-minute load average at the start and the end: {loads[0]:.1f}, {loads[1]:.1f} ({os.cpu_count()} "
              f"cores). Command: `python -m benchmarks decode_profile {' '.join(argv or [])}`")
    write_report("decode-profile-cpu", {"machine": CpuCapabilities.detect().to_dict(), "load_average": loads,
                                        "torch": torch.__version__, "rows": rows}, "\n".join([header, "", *lines]))
    return 0
