"""Eager decoding of one model in each weight layout the inference plan may choose, taking turns, and where its
time goes: is bf16 faster than fp32, and why not.

    python -m benchmarks layouts [--only generate-gpt2-124m-b1] [--turns 7] [--tokens 32] [--threads 1] [--peer]

For each generation case of the speed suite, the same random weights are prepared in each layout (`plan_inference`
with a profile naming the layout): fp32 on transposed weights, bf16 packed once for oneDNN, bf16 with single rows
through ATen's matrix-vector kernel (`gemv+packed`) and through the native kernel (`native+packed`; on a CPU with
AVX512-BF16 its dot product, and the same layer again with bf16 rows widened to fp32 as on a CPU without it, the
kernel before the dot product); `--peer` adds llama.cpp's BF16 on the same weights, in the same process. All decode
greedily in turns, the order reversing every turn, and
each reports its median time a token and its speed over fp32's as the median of the turns' own ratios. Then each step
is profiled (`torch.profiler`): self time a token, the part spent in matrix products, and operations a token. The
bytes a step reads (`speed.bytes_read_per_token`) over the time a token give the rate each layout reached; `python -m
benchmarks bandwidth` gives the rate a plain sum reaches. Results: benchmarks/results/layouts-<machine>.json and .md.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from unittest import mock

import torch
from torch.profiler import ProfilerActivity, profile

from attnkit import build_model
from attnkit.generate import generate_tokens, native_gemv
from attnkit.generate.plan import plan_inference
from attnkit.machine import DEFAULT_PROFILE, CpuCapabilities, Profile
from benchmarks import peers, speed
from benchmarks.common import write_results

LAYOUTS = (("fp32", "transposed"), ("bf16", "packed"), ("bf16", "gemv+packed"), ("bf16", "native+packed"))
WIDENED = ("bf16", "native+packed, widened")  # native+packed with the bf16 dot product switched off
PEER = ("bf16", "llama.cpp BF16")
PRODUCTS = ("addmm", "aten::mm", "linear_pointwise", "aten::mv")  # the profiler's names for the matrix products


def prepared(case: speed.Case, weights: dict, dtype: str, layout: str) -> torch.nn.Module:
    model = build_model(speed.attnkit_config(case)).eval()
    model.load_state_dict(weights)
    model.to(speed.DTYPES[dtype])
    layouts = Profile(attention=DEFAULT_PROFILE.attention, decode_linear={dtype: layout}, source=layout)
    return plan_inference(model, case.family, profile=layouts).apply(model)


def profiled(run, tokens: int) -> dict:
    """Self time, time in matrix products and operations, a token, from one profiled generation."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events) / 1e3 / tokens
    products = sum(e.self_cpu_time_total for e in events if any(p in e.key for p in PRODUCTS)) / 1e3 / tokens
    return {"self_ms": total, "products_ms": products, "ops": sum(e.count for e in events) / tokens}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks layouts", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="*", default=["generate-gpt2-124m-b1"], help="generation cases")
    parser.add_argument("--turns", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=32, help="tokens generated in each turn")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--machine", default=platform.node() or "cpu")
    parser.add_argument("--peer", action="store_true", help="also llama.cpp's BF16 on the same weights")
    args = own = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    cpu = CpuCapabilities.detect()
    if not cpu.onednn_bf16:
        print(f"oneDNN packs no bf16 weights on this CPU ({cpu.summary()}): only nn.Linear's bf16 layout runs here")
        return 2
    rows = []
    for case in (c for c in speed.CASES if c.kind == "generate" and c.name in own.only):
        torch.manual_seed(0)
        weights = build_model(speed.attnkit_config(case)).state_dict()
        prompts = torch.randint(2, case.vocab_size, (case.batch_size, case.seq_len),
                                generator=torch.Generator().manual_seed(0)).tolist()
        runs, read = {}, {}
        for dtype, layout in LAYOUTS:
            model = prepared(case, weights, dtype, layout)
            context = model.stack.embeddings.max_positions
            runs[(dtype, layout)] = lambda m=model, c=context, p=prompts: generate_tokens(
                m, p, max_new_tokens=own.tokens, context_len=c)
            read[(dtype, layout)] = speed.bytes_read_per_token(model)
        if native_gemv.bf16_dot():  # the same native layer, its bf16 rows widened as without AVX512-BF16
            def widened(run=runs[("bf16", "native+packed")]):
                with mock.patch.object(native_gemv, "bf16_dot", lambda cpu=None: False):
                    run()
            runs[WIDENED], read[WIDENED] = widened, read[("bf16", "native+packed")]
        if own.peer and peers.unavailable("llama.cpp") is None:
            fp32_model = build_model(speed.attnkit_config(case)).eval()
            fp32_model.load_state_dict(weights)
            ids = torch.tensor(prompts)
            peer_run, _ = peers.llama_cpp_generate(fp32_model, "llama.cpp", "bf16", ids, own.tokens, args.threads)
            runs[PEER], read[PEER] = peer_run, speed.gguf_bytes(fp32_model, "llama.cpp", "bf16")
        for run in runs.values():
            run()
        seconds: dict[tuple, list[float]] = {key: [] for key in runs}
        for n in range(own.turns):
            for key in (list(runs) if n % 2 == 0 else list(reversed(runs))):
                start = time.perf_counter()
                runs[key]()
                seconds[key].append(time.perf_counter() - start)
        fp32 = seconds[LAYOUTS[0]]
        for key, times in seconds.items():
            ms = 1000 * statistics.median(times) / own.tokens
            row = {"case": case.name, "dtype": key[0], "layout": key[1], "ms_per_token": ms,
                   "speed_vs_fp32": statistics.median(f / t for f, t in zip(fp32, times, strict=True)),
                   "bytes_per_token": read[key], "gb_per_s": read[key] / ms / 1e6,
                   **(profiled(runs[key], own.tokens) if key != PEER else {"products_ms": 0.0, "self_ms": 0.0,
                                                                            "ops": 0.0})}
            rows.append(row)
            print(f"{case.name} {key[0]} {key[1]:12s} {ms:7.1f} ms/token  {row['speed_vs_fp32']:.2f}x fp32  "
                  f"{row['gb_per_s']:5.1f} GB/s  products {row['products_ms']:.1f} of {row['self_ms']:.1f} ms "
                  f"self time ({row['ops']:.0f} ops)", flush=True)
    table = [f"CPU: {cpu.summary()}; load average at the end {os.getloadavg()[0]:.1f}; {own.turns} turns of "
             f"{own.tokens} tokens.", "",
             "| case | dtype | layout | ms a token (median) | speed / fp32's (median of turns) | weights read GB/s "
             "| profiled: products / self time a token, ms | operations a token |", "|---|---|---|---|---|---|---|---|"]
    table += [f"| {r['case']} | {r['dtype']} | {r['layout']} | {r['ms_per_token']:.1f} | {r['speed_vs_fp32']:.2f}x | "
              f"{r['gb_per_s']:.1f} | {r['products_ms']:.1f} / {r['self_ms']:.1f} | {r['ops']:.0f} |" for r in rows]
    write_results(f"layouts-{args.machine}", "layouts", args, argv, rows, table)
    return 0
