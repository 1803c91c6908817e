"""Multi30k German to English with the lectures' three translators, each trained for the same time budget through
the shared trainer (`attnkit train`'s job), then scored on test_2016_flickr.

    python -m benchmarks multi30k_recurrent [--max-time 600] [--models gru gru-attn transformer] [--threads 1]

    gru           preset gru-seq2seq: GRU encoder 512 -> final state -> GRU decoder 512, embeddings 256 (the bottleneck)
    gru-attn      preset gru-attn-seq2seq: bidirectional GRU encoder 512, GRU decoder 512, Bahdanau attention
    transformer   `attnkit train --task translate`'s default: 3+3 layers, width 256, 8 heads, pre-norm, label
                  smoothing 0.1 (the model of `python -m benchmarks train multi30k`)

All three read one shared byte-level BPE of 8,000 (trained on the training pairs), batches of 64 pairs, AdamW
lr 1e-3 (warmup 200, then a cosine to 1e-4 over the time budget: the trainer's schedule follows whichever of
steps and time runs out first), clipping at 1; the
checkpoint with the best validation BLEU (200 sentences) translates the test set greedily. Two BLEU figures:

    sacreBLEU      cased, detokenized, 13a (the standard to report; its signature is recorded)
    published      lowercased and tokenized, as the published Multi30k tutorials score it (spaCy tokens, torchtext's
                   BLEU): here sacreBLEU with lowercase=True, whose 13a tokenizer splits punctuation as spaCy does on
                   these captions. Published: GRU 20.6, GRU + Bahdanau 28.3, Transformer 36.5.

Results go to benchmarks/results/multi30k-recurrent-Nmin.json and .md (N: the budget in minutes), run directories
to runs/bench-m30k-NAME/.
The load average before and after each run is recorded: the budget buys fewer steps on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Any

import torch

from attnkit.generate import load, translate_batched
from attnkit.tasks.bleu import translation_scores
from benchmarks.bench_train import RUNS, machine, need, train
from benchmarks.common import DATA, RESULTS

MODELS = {"gru": "gru-seq2seq", "gru-attn": "gru-attn-seq2seq", "transformer": None}  # name -> preset
PUBLISHED = {"gru": 20.6, "gru-attn": 28.3, "transformer": 36.5}  # lowercased, tokenized BLEU
PAIRS_PER_EPOCH = 29_000


def run_model(name: str, args: argparse.Namespace) -> dict[str, Any]:
    folder = need(DATA / "multi30k")
    _, result, row = train(
        f"m30k-{name}", task="translate", preset=MODELS[name], model=[],
        data={"data": (str(folder),), "src_lang": "de", "tgt_lang": "en", "tokenizer": "bpe", "vocab_size": 8000,
              "bleu_samples": 200},
        settings=dict(max_steps=100_000, max_time=args.max_time, batch_size=64, lr=1e-3, warmup=200,
                      schedule="cosine", weight_decay=0.01, beta2=0.98, clip=1.0, eval_every=args.eval_every, seed=1),
        translate=translate_batched,
    )
    sources = (folder / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    references = (folder / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    pipeline = load(RUNS / f"bench-m30k-{name}" / "best", device="cpu")
    start = time.perf_counter()
    hypotheses = pipeline.translate(sources, batch_size=100)
    scores = translation_scores(hypotheses, references)
    row.update(model=name, preset=MODELS[name] or "translate default", time_budget_seconds=args.max_time,
               epochs=round(result.step * 64 / PAIRS_PER_EPOCH, 2), test_sacrebleu=round(scores["bleu"], 2),
               sacrebleu_signature=scores["bleu_signature"], test_chrf=round(scores["chrf"], 2),
               test_bleu_lowercased=round(scores["bleu_lowercased"], 2),
               lowercased_signature=scores["bleu_lowercased_signature"],
               published_bleu=PUBLISHED[name], translate_seconds=round(time.perf_counter() - start, 1),
               examples=list(zip(sources[:3], hypotheses[:3], strict=True)))
    print(json.dumps(row), flush=True)
    return row


def table(rows: list[dict[str, Any]]) -> list[str]:
    lines = ["| model | parameters | steps (epochs) in the budget | load average (before, after) | sacreBLEU "
             "(cased, detok.) | BLEU lowercased, tokenized | published |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        load_before, load_after = r["load_average_1m"]
        lines.append(f"| {r['model']} ({r['preset']}) | {r['parameters'] / 1e6:.1f}M | {r['steps']} "
                     f"({r['epochs']}) | {load_before:.1f}, {load_after:.1f} | {r['test_sacrebleu']:.2f} | "
                     f"{r['test_bleu_lowercased']:.2f} | {r['published_bleu']} |")
    if rows:
        lines += ["", f"sacreBLEU: `{rows[0]['sacrebleu_signature']}`; lowercased: "
                      f"`{rows[0]['lowercased_signature']}`"]
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks multi30k_recurrent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-time", type=float, default=600.0, help="seconds of training per model")
    parser.add_argument("--eval-every", type=int, default=250, help="steps between evaluations")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    stem = f"multi30k-recurrent-{args.max_time / 60:g}min"
    path = RESULTS / f"{stem}.json"
    earlier = json.loads(path.read_text())["rows"] if path.is_file() else []
    rows = []
    for name in args.models:
        rows.append({**run_model(name, args), "machine": machine()})
        kept = [r for r in earlier if r["model"] not in {row["model"] for row in rows}]
        RESULTS.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"benchmark": "multi30k-recurrent", "rows": kept + rows}, indent=1) + "\n")
    every = sorted([r for r in earlier if r["model"] not in args.models] + rows, key=lambda r: list(MODELS).index(
        r["model"]))
    header = (f"Multi30k de-en, test_2016_flickr, greedy; {args.max_time:.0f} s of training per model, "
              f"{args.threads} torch thread(s), {os.cpu_count()} CPUs shared with other jobs.")
    (RESULTS / f"{stem}.md").write_text("\n".join([header, "", *table(every)]) + "\n")
    print("\n".join(table(every)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
