"""`python -m benchmarks variants`: each attention variant's training step against plain causal attention's on this
CPU at a small shape (4 layers, width 128, 4 heads, vocabulary 2,048, batch 8 x 256, bf16 autocast, eager as the CPU
plan trains), the rows `python -m benchmarks gpu` times at GPT-2's shape on a GPU (`bench_gpu.variant_rows`):
ALiBi, a sliding window of T/4 and packed documents, each through SDPA with a dense (T, S) bias and through the
reference path's plain products; FlexAttention's rows are skipped with the reason (no backward on the CPU).

    python -m benchmarks variants [--rounds 3] [--steps 5] [--threads 1]

Results: benchmarks/results/variants-cpu.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import torch

from attnkit.outputs import atomic_write
from benchmarks.bench_gpu import TrainShape, variant_rows, variants_markdown
from benchmarks.common import RESULTS

SMALL = TrainShape(4, 128, 4, 2048, 256, 8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks variants", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5, help="training steps per row per round")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = variant_rows(SMALL, torch.device("cpu"), rounds=args.rounds, steps=args.steps, warmup=1, compile="off")
    report = {"command": "python -m benchmarks variants " + " ".join(argv or []), "torch": torch.__version__,
              "machine": platform.processor() or platform.machine(), "threads": args.threads,
              "load_average": os.getloadavg()[0], "results": rows}
    lines = [f"# Attention variants on the CPU ({args.threads} thread(s), torch {torch.__version__}, load average "
             f"{report['load_average']:.1f} at the end)", "", f"Command: `{report['command']}`", "",
             *variants_markdown(rows, "Training steps (4 layers, width 128, 4 heads, vocabulary 2,048, batch 8 x 256, "
                                      "bf16 autocast, eager)")]
    atomic_write(RESULTS / "variants-cpu.json", json.dumps(report, indent=2) + "\n")
    atomic_write(RESULTS / "variants-cpu.md", "\n".join(lines))
    print("\n".join(lines), flush=True)
    return 0 if all("error" not in r for r in rows) else 1
