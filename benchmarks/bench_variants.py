"""`python -m benchmarks variants`: each attention variant's training step against plain causal attention's on this
CPU at a small shape (4 layers, width 128, 4 heads, vocabulary 2,048, batch 8 x 256, bf16 autocast, eager as the CPU
plan trains), the rows `python -m benchmarks gpu` times at GPT-2's shape on a GPU (`bench_gpu.variant_rows`):
ALiBi, a sliding window of T/4 and packed documents, each through SDPA with a dense (T, S) bias and through the
reference path's plain products; FlexAttention's rows are skipped with the reason (no backward on the CPU). Then the
same variants' inference forward passes (fp32, no gradients), where FlexAttention runs on the CPU: compiled
FlexAttention against SDPA with the dense bias, the measurement behind the CPU plan leaving FlexAttention off by
default.

    python -m benchmarks variants [--rounds 3] [--steps 5] [--threads 1]

Results: benchmarks/results/variants-cpu.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import torch

from attnkit import build_model, presets
from attnkit.layers.kernels import use_flex_attention
from attnkit.outputs import atomic_write
from benchmarks.bench_gpu import VARIANTS, TrainShape, token_stream, variant_rows, variants_markdown
from benchmarks.common import RESULTS

SMALL = TrainShape(4, 128, 4, 2048, 256, 8)


def forward_rows(shape: TrainShape, rounds: int) -> list[dict]:
    """Each variant's inference forward pass (fp32, no gradients) through compiled FlexAttention and through SDPA with a
    dense bias, taking turns; ms per pass (median of the rounds), after a first pass that compiles."""
    rows = []
    for name, (overrides, packed) in VARIANTS.items():
        config = presets.get("gpt2-124m", vocab_size=shape.vocab_size, n_layers=shape.n_layers, d_model=shape.d_model,
                             n_heads=shape.n_heads, d_ff=4 * shape.d_model, max_seq_len=shape.seq_len, dropout=0.0,
                             **overrides(shape))
        model = build_model(config).eval()
        ids = torch.from_numpy(token_stream(shape)[: shape.batch_size * shape.seq_len].astype("int64")).view(
            shape.batch_size, shape.seq_len)
        documents = (torch.arange(shape.seq_len) * 3 // shape.seq_len).expand(shape.batch_size, -1) if packed else None
        times: dict[str, list[float]] = {"FlexAttention": [], "SDPA dense bias": []}
        with torch.no_grad():
            for _ in range(rounds + 1):  # the first round compiles
                for kernel in times:
                    use_flex_attention(model, kernel == "FlexAttention")
                    start = time.perf_counter()
                    model(ids, document_ids=documents)
                    times[kernel].append(1000 * (time.perf_counter() - start))
        rows += [{"part": "forward", "impl": f"{name}, {kernel}", "first_ms": ms[0],
                  "ms_per_pass": statistics.median(ms[1:])} for kernel, ms in times.items()]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks variants", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="training steps per row per round")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = variant_rows(SMALL, torch.device("cpu"), rounds=args.rounds, steps=args.steps, warmup=1, compile="off")
    forward = forward_rows(SMALL, args.rounds)
    report = {"command": "python -m benchmarks variants " + " ".join(argv or []), "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(), "threads": args.threads,
              "load_average": os.getloadavg()[0], "results": rows + forward}
    lines = [f"# Attention variants on the CPU ({args.threads} thread(s), torch {torch.__version__}, load average "
             f"{report['load_average']:.1f} at the end)", "", f"Command: `{report['command']}`", "",
             *variants_markdown(rows, "Training steps (4 layers, width 128, 4 heads, vocabulary 2,048, batch 8 x 256, "
                                      "bf16 autocast, eager)"),
             "## Inference forward passes (the same shape, fp32, no gradients)", "",
             "| variant, kernel | ms/pass | first pass (compiles) ms |", "|---|---|---|",
             *(f"| {r['impl']} | {r['ms_per_pass']:.1f} | {r['first_ms']:,.0f} |" for r in forward), ""]
    atomic_write(RESULTS / "variants-cpu.json", json.dumps(report, indent=2) + "\n")
    atomic_write(RESULTS / "variants-cpu.md", "\n".join(lines))
    print("\n".join(lines), flush=True)
    return 0 if all("error" not in r for r in rows) else 1
