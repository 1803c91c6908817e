"""Speculative decoding: greedy tokens per second of a target run alone against the same run with a smaller draft
run (`attnkit generate --draft`), for several numbers of draft tokens, with the draft's acceptance rate.

    python -m benchmarks speculative --target runs/shakespeare-256x6 --draft runs/shakespeare-96x2 \
        [--draft-tokens 2 4 6] [--new-tokens 120] [--rounds 3] [--threads 1]

Both runs are trained on the same text with one tokenizer (`attnkit train --tokenizer TARGET/tokenizer`). Each
round decodes the same prompts (lines of held-out text, one at a time) target alone, then with each K, in a
different order each round; the speed-up is the median over rounds of each round's ratio to the target alone in that
round. The texts are checked equal to the target's own (greedy). Results go to
benchmarks/results/speculative-cpu.json and .md, with the CPU and the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

import attnkit
from attnkit.generate.decoder import generate_tokens
from attnkit.generate.speculative import speculative_generate
from attnkit.machine import CpuCapabilities
from benchmarks.common import load_averages, write_report

PROMPTS = ("ROMEO:\nWhat light is", "First Citizen:\nWe are", "KING HENRY:\nNow, my lords,", "MENENIUS:\nWhy, how")


def measure(target_dir: Path, draft_dir: Path, draft_tokens: list[int], *, new_tokens: int, rounds: int,
            clock: Callable[[], float] = time.perf_counter) -> tuple[list[dict], dict[str, tuple[int, int, int]]]:
    """Greedy decoding of PROMPTS one at a time, target alone and with each K in `draft_tokens`, in turn for `rounds`
    rounds, every text checked equal to the target's own: a row per mode (tokens/s at the median round, the median
    of each round's ratio to the target alone, the acceptance) and the runs' sizes (width, layers, d_ff). `clock`
    times a round (`time.process_time`: this process's CPU time, where the machine is shared)."""
    target, draft = attnkit.load(target_dir, device="cpu"), attnkit.load(draft_dir, device="cpu")
    prompts = [target.prompt_ids(p, index=i) for i, p in enumerate(PROMPTS)]
    context = min(target.config.max_seq_len, draft.config.max_seq_len)
    modes = ["alone", *draft_tokens]
    seconds: dict[object, list[float]] = {mode: [] for mode in modes}
    accepted = {k: [0, 0] for k in draft_tokens}
    with torch.inference_mode():
        reference = [generate_tokens(target.model, [p], max_new_tokens=new_tokens, context_len=context)[0]
                     for p in prompts]  # also the warm-up
        for round_ in range(rounds):
            order = modes[round_ % len(modes):] + modes[:round_ % len(modes)]
            for mode in order:
                start = clock()
                for prompt, expected in zip(prompts, reference, strict=True):
                    if mode == "alone":
                        tokens = generate_tokens(target.model, [prompt], max_new_tokens=new_tokens,
                                                 context_len=context)
                    else:
                        tokens, stats = speculative_generate(target.model, draft.model, [prompt], draft_tokens=mode,
                                                             max_new_tokens=new_tokens, context_len=context)
                        accepted[mode][0] += stats.accepted
                        accepted[mode][1] += stats.drafted
                    if tokens[0] != expected:
                        raise SystemExit(f"K={mode}: the text differs from the target's own")
                seconds[mode].append(clock() - start)
    tokens = new_tokens * len(prompts)
    rows = []
    for mode in modes:
        ratios = [alone / s for alone, s in zip(seconds["alone"], seconds[mode], strict=True)]
        drafted = accepted[mode][1] if mode != "alone" else 0
        rows.append({"draft_tokens": mode, "tokens_per_s": tokens / statistics.median(seconds[mode]),
                     "speedup": statistics.median(ratios),
                     "acceptance": accepted[mode][0] / drafted if drafted else None})
    sizes = {name: (run.config.d_model, run.config.n_layers, run.config.d_ff)
             for name, run in (("target", target), ("draft", draft))}
    return rows, sizes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks speculative", description=__doc__.split("\n")[0])
    parser.add_argument("--target", required=True, type=Path)
    parser.add_argument("--draft", required=True, type=Path)
    parser.add_argument("--draft-tokens", type=int, nargs="+", default=[2, 4, 6])
    parser.add_argument("--new-tokens", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    before = os.getloadavg()
    rows, sizes = measure(args.target, args.draft, args.draft_tokens, new_tokens=args.new_tokens, rounds=args.rounds)
    after = os.getloadavg()
    cpu = CpuCapabilities.detect().summary()
    report = {"cpu": cpu, "threads": args.threads, "new_tokens": args.new_tokens, "prompts": len(PROMPTS),
              "rounds": args.rounds, "sizes": sizes, "rows": rows, "load": load_averages(before, after)}
    lines = [f"Greedy decoding, {len(PROMPTS)} prompts x {args.new_tokens} new tokens, batch 1, {args.threads} "
             f"thread(s), {args.rounds} rounds in turn; target width {sizes['target'][0]}, {sizes['target'][1]} "
             f"layers, d_ff {sizes['target'][2]}; draft width {sizes['draft'][0]}, {sizes['draft'][1]} layers, d_ff "
             f"{sizes['draft'][2]}. CPU: {cpu}; {report['load']}.", "",
             "| decoding | tokens/s | speed-up vs target alone (median of rounds) | acceptance |", "|---|---|---|---|"]
    for row in rows:
        name = "target alone" if row["draft_tokens"] == "alone" else f"draft, K = {row['draft_tokens']}"
        rate = "" if row["acceptance"] is None else f"{row['acceptance']:.1%}"
        lines.append(f"| {name} | {row['tokens_per_s']:.1f} | {row['speedup']:.2f}x | {rate} |")
    table = "\n".join(lines)
    write_report("speculative-cpu", report, table)
    print(table)
    return 0
