"""`python -m benchmarks packing`: packed rows against padded rows on a real corpus (`attnkit train --pack`).

Multi30k's English training captions (../shared/data/multi30k/train.en), one document per line, characters. The
same decoder (Llama-2 block, 2 layers, width 128, 4 heads) trains on rows of 128 positions two ways, taking turns
round by round: padded (one caption per row, the rest padding: causal attention alone keeps a caption from seeing
its padding) and packed (`data/packing.py`: whole captions one after another, a document mask, positions restarting
at each). Reported: the padding share of each layout, ms per step, and tokens per second of real tokens (positions
that predict a token), the figure that says how much more text a step trains on.

    python -m benchmarks packing [--rounds 3] [--steps 10] [--threads 1]

Results: benchmarks/results/packing-cpu.json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
import torch

from attnkit import ModelConfig, build_model
from attnkit.data.packing import PackedRows, document_ends, pack_rows, pieces
from attnkit.experiments.base import device_name
from attnkit.outputs import atomic_write
from attnkit.tokenize import CharTokenizer
from benchmarks.common import DATA, RESULTS, load_averages


def rows(seq_len: int) -> tuple[CharTokenizer, dict[str, PackedRows]]:
    """The captions as characters, one document per line, in padded and packed rows."""
    text = (DATA / "multi30k" / "train.en").read_text(encoding="utf-8")
    tokenizer = CharTokenizer(sorted(set(text)))
    tokens = np.array(tokenizer.encode(text), dtype=np.int64)
    cut = pieces(document_ends(tokens, tokenizer, "lines"), seq_len)
    return tokenizer, {layout: pack_rows(tokens, cut, seq_len, packed=layout == "packed")
                       for layout in ("padded", "packed")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks packing", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="training steps per layout per round")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer, layouts = rows(args.seq_len)
    torch.manual_seed(0)
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, d_model=128, n_layers=2, n_heads=4,
                         d_ff=352, max_seq_len=args.seq_len, position="rope", norm="rms", activation="swiglu",
                         bias=False, dropout=0.0)
    model = build_model(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    generator = np.random.default_rng(0)

    def step(layout: str) -> int:
        batch = layouts[layout].batch(generator.integers(len(layouts[layout].labels), size=args.batch_size))
        documents = batch.document_ids if layout == "packed" else None  # padded: causality alone suffices
        loss = model(batch.input_ids, labels=batch.labels, position_ids=batch.position_ids, document_ids=documents,
                     return_logits=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return int((batch.labels >= 0).sum())

    for layout in layouts:  # warm-up
        step(layout)
    load_before = os.getloadavg()
    timings: dict[str, list[tuple[float, int]]] = {layout: [] for layout in layouts}
    for _ in range(args.rounds):
        for layout in layouts:
            start, real = time.perf_counter(), 0
            for _ in range(args.steps):
                real += step(layout)
            timings[layout].append((time.perf_counter() - start, real))
    results = []
    for layout, runs in timings.items():
        seconds = [s for s, _ in runs]
        tokens = sum(r for _, r in runs) / sum(seconds)
        results.append({"layout": layout, "rows": len(layouts[layout].labels),
                        "padding_share": layouts[layout].padding_share,
                        "ms_per_step": 1000 * statistics.median(seconds) / args.steps, "real_tokens_per_s": tokens})
    report = {"command": "python -m benchmarks packing " + " ".join(argv or []), "torch": torch.__version__,
              "machine": f"{device_name()}, {torch.backends.cpu.get_cpu_capability()} kernels ({platform.machine()})",
              "threads": args.threads, "load": load_averages(load_before, os.getloadavg()),
              "shape": f"batch {args.batch_size} x {args.seq_len}", "results": results}
    padded, packed = results
    lines = [f"# Packed against padded rows (Multi30k train.en, characters, a line a document; {report['shape']}, "
             f"{args.threads} thread(s), torch {torch.__version__})", "", f"Command: `{report['command']}` on "
             f"{report['machine']}; {report['load']}", "",
             "| rows | rows in the corpus | padding | ms/step | real tokens/s |", "|---|---|---|---|---|"]
    lines += [f"| {r['layout']} | {r['rows']:,} | {100 * r['padding_share']:.1f}% | {r['ms_per_step']:.1f} | "
              f"{r['real_tokens_per_s']:,.0f} |" for r in results]
    lines += ["", f"Packed: {packed['real_tokens_per_s'] / padded['real_tokens_per_s']:.2f}x the real tokens per "
                  f"second of padded rows, {padded['rows'] / packed['rows']:.2f}x fewer rows for the same captions."]
    atomic_write(RESULTS / "packing-cpu.json", json.dumps(report, indent=2) + "\n")
    atomic_write(RESULTS / "packing-cpu.md", "\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)
    return 0
