"""The recipe multi30k-transformer (Multi30k German to English, a small Transformer, 60 minutes on one CPU thread),
scored the ways the published figures are: every candidate model x decoder on the validation and test sets, each
on both BLEU protocols; plus ingredient ablations retrained for a short equal budget.

    python -m benchmarks multi30k_transformer [--train] [--run runs/multi30k-transformer] [--average 5 10]
                                              [--beam 5] [--ablations recipe no-label-smoothing ...]
                                              [--steps 700] [--threads 1]

Candidates (from one run, no retraining): its last checkpoint, best/ (best validation BLEU of the 200 greedy
validation sentences scored during training) and the mean of its last N checkpoints (`attnkit average`), each
decoded greedily and with beam search (--beam, length penalty 1). The chosen row is the one with the best
lowercased BLEU on the whole validation set (1,014 sentences); its test_2016_flickr figure is the recipe's result.

    sacreBLEU        cased, detokenized, 13a (the standard to report; its signature is recorded)
    lowercased       the published protocol (lowercased, tokenized): sacreBLEU with lowercase=True (13a splits
                     punctuation as spaCy does on these captions). Published: 36.5 for the small Transformer
                     (3+3 layers, width 256, 10 epochs on a GPU)

Ablations (--ablations): the recipe with one ingredient changed, each trained for the same short budget of
--steps optimizer steps (warmup 100, the cosine over those steps; a step count rather than seconds, so that
other jobs on the machine change the wall time but not the numbers) in runs/m30k-ablation-NAME, scored greedily
at its last checkpoint:

    recipe               the recipe as it is, for the same budget (the row to compare with)
    no-label-smoothing   label_smoothing 0
    token-batches        batches of about 2,000 source + target tokens (batch_tokens) instead of 64 sentences
                         (64 sentences hold 1,990 tokens on average, so each step sees as much)
    untied               separate input and output embedding tables (tie_embeddings false)

--equal-steps RUN... --at STEP...: runs of the recipe's own schedule with one change each (e.g. the recipe and
`--set tie_embeddings=false`, stopped early) scored greedily at the same checkpoints.

Results: benchmarks/results/multi30k-transformer.json and .md; the load average before and after each row.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from attnkit import cli, recipes
from attnkit.checkpoint import TOKENIZER_DIR, TRAIN_STATE_FILE, read_json
from attnkit.generate import load
from attnkit.tasks.bleu import translation_scores
from attnkit.tokenize import load_tokenizer
from attnkit.train.average import AVERAGE_FILE, average_run
from benchmarks.bench_train import machine, need
from benchmarks.common import DATA, RESULTS, ROOT

RECIPE = "multi30k-transformer"
PUBLISHED = 36.5  # lowercased, tokenized BLEU on test_2016_flickr
SPLITS = {"validation": "val", "test_2016_flickr": "test_2016_flickr"}
ABLATIONS = {
    "recipe": [],
    "no-label-smoothing": ["label_smoothing=0"],
    "token-batches": ["batch_tokens=2000"],
    "untied": ["tie_embeddings=false"],
}


def score(model_dir: Path, split: str, beam: int) -> dict[str, Any]:
    """Translate `split` with the model in `model_dir` (greedy for beam 1) and score both protocols."""
    folder = need(DATA / "multi30k")
    sources = (folder / f"{SPLITS[split]}.de").read_text(encoding="utf-8").splitlines()
    references = (folder / f"{SPLITS[split]}.en").read_text(encoding="utf-8").splitlines()
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    hypotheses = load(model_dir, device="cpu").translate(sources, beam_size=beam, batch_size=64)
    scores = translation_scores(hypotheses, references)
    return {"split": split, "decoder": "greedy" if beam == 1 else f"beam {beam}", "sentences": len(sources),
            "bleu": round(scores["bleu"], 2), "bleu_lowercased": round(scores["bleu_lowercased"], 2),
            "chrf": round(scores["chrf"], 2), "seconds": round(time.perf_counter() - start, 1),
            "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "signatures": {k: scores[k] for k in ("bleu_signature", "bleu_lowercased_signature")}}


def candidates(run: Path, averages: list[int]) -> dict[str, Path]:
    """The models one run offers: its last checkpoint, best/ and the mean of its last N checkpoints."""
    step = read_json(run / TRAIN_STATE_FILE)["step"]
    found = {f"last checkpoint (step {step})": run, "best/ (validation BLEU during training)": run / "best"}
    for n in averages:
        out = average_run(run, last=n)
        steps = read_json(out / AVERAGE_FILE)["steps"]
        found[f"average of the last {n} (steps {steps[0]}-{steps[-1]})"] = out
    return found


def epoch_tokens(run: Path) -> int:
    """Source + target tokens of one pass over the training pairs, as the run's batches count them (tokens and
    EOS on the source side, BOS and tokens on the target side)."""
    tokenizer = load_tokenizer(run / TOKENIZER_DIR)
    folder = need(DATA / "multi30k")
    total = 0
    for side in ("de", "en"):
        lines = (folder / f"train.{side}").read_text(encoding="utf-8").splitlines()
        total += sum(len(ids) + 1 for ids in tokenizer.encode_batch(lines))
    return total


def run_summary(run: Path) -> dict[str, Any]:
    """Steps, training seconds and epochs (tokens seen over the tokens of one pass) of a run."""
    state = read_json(run / TRAIN_STATE_FILE)
    return {"run_dir": str(run.relative_to(ROOT) if run.is_relative_to(ROOT) else run), "steps": state["step"],
            "train_seconds": round(state["elapsed"], 1), "tokens_seen": state["tokens_seen"],
            "epochs": round(state["tokens_seen"] / epoch_tokens(run), 2),
            "batch": state["data_config"].get("batch_tokens") or state["settings"]["batch_size"]}


def train(out: Path, extra: list[str]) -> dict[str, Any]:
    """`attnkit train --recipe multi30k-transformer` into `out`, with `extra` options on top."""
    load_before = os.getloadavg()[0]
    code = cli.main(["train", "--recipe", RECIPE, "--data-root", str(DATA), "--out", str(out), "--overwrite",
                     "--no-progress", *extra])
    if code != 0:
        sys.exit(f"training {out} failed with exit code {code}")
    return {"load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)]}


def evaluate_run(run: Path, args: argparse.Namespace) -> dict[str, Any]:
    rows = []
    for name, model_dir in candidates(run, args.average).items():
        for beam in (1, args.beam):
            for split in SPLITS:
                row = {"model": name, **score(model_dir, split, beam)}
                print(json.dumps({k: v for k, v in row.items() if k != "signatures"}), flush=True)
                rows.append(row)
    valid = [r for r in rows if r["split"] == "validation"]
    chosen = max(valid, key=lambda r: r["bleu_lowercased"])
    test = next(r for r in rows if r["split"] == "test_2016_flickr" and r["model"] == chosen["model"]
                and r["decoder"] == chosen["decoder"])
    return {**run_summary(run), "rows": rows, "chosen": {"model": chosen["model"], "decoder": chosen["decoder"],
                                                         "validation": chosen, "test": test},
            "published_bleu_lowercased": PUBLISHED}


def ablations(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for name in args.ablations:
        out = ROOT / "runs" / f"m30k-ablation-{name}"
        extra = ["--max-steps", str(args.steps), "--warmup", "100", "--eval-every", str(args.steps),
                 "--average-last", "0"]
        extra += ["--set", *ABLATIONS[name]] if ABLATIONS[name] else []
        trained = train(out, extra)
        row = {"ablation": name, "changes": ABLATIONS[name], **run_summary(out),
               "train_load_average_1m": trained["load_average_1m"], **greedy_scores(out)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def greedy_scores(model_dir: Path) -> dict[str, dict[str, Any]]:
    """{split: BLEU on both protocols, chrF, load average} of greedy translations of the validation and test sets."""
    keys = ("bleu", "bleu_lowercased", "chrf", "load_average_1m")
    return {split: {k: v for k, v in score(model_dir, split, 1).items() if k in keys} for split in SPLITS}


def equal_steps(runs: list[Path], steps: list[int]) -> list[dict[str, Any]]:
    """The checkpoints of several runs of one schedule (the recipe, one change each) at the same steps, greedy."""
    rows = []
    for run in runs:
        for step in steps:
            checkpoint = run / "checkpoints" / f"step_{step:06d}"
            row = {"run": run.name, "step": step, **greedy_scores(checkpoint)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def markdown(report: dict[str, Any]) -> list[str]:
    lines = [f"Multi30k de-en, recipe {RECIPE}; {os.cpu_count()} CPUs shared with other jobs, "
             f"{report['machine']['threads']} torch thread(s)."]
    main = report.get("run")
    if main:
        chosen = main["chosen"]
        lines += ["", f"Run {main['run_dir']}: {main['steps']} steps ({main['epochs']} epochs) in "
                      f"{main['train_seconds']:.0f} s of training. Chosen by lowercased BLEU on the whole validation "
                      f"set: {chosen['model']}, {chosen['decoder']}: test {chosen['test']['bleu_lowercased']} "
                      f"lowercased (published: {PUBLISHED}), sacreBLEU {chosen['test']['bleu']}.", "",
                  "| model | decoder | set | sacreBLEU (cased, detok.) | BLEU lowercased, tokenized | chrF | load "
                  "average (before, after) |", "|---|---|---|---|---|---|---|"]
        for r in main["rows"]:
            lines.append(f"| {r['model']} | {r['decoder']} | {r['split']} | {r['bleu']:.2f} | "
                         f"{r['bleu_lowercased']:.2f} | {r['chrf']:.2f} | {r['load_average_1m'][0]:.1f}, "
                         f"{r['load_average_1m'][1]:.1f} |")
        signatures = main["rows"][0]["signatures"]
        lines += ["", f"sacreBLEU: `{signatures['bleu_signature']}`; lowercased: "
                      f"`{signatures['bleu_lowercased_signature']}`"]
    if report.get("ablations"):
        lines += ["", "Ablations, each trained for the same number of steps (warmup 100, cosine), last checkpoint, "
                      "greedy:", "",
                  "| run | change | steps (epochs) | training seconds | load average while training | validation "
                  "sacreBLEU / lowercased | test sacreBLEU / lowercased |", "|---|---|---|---|---|---|---|"]
        for r in report["ablations"]:
            val, test = r["validation"], r["test_2016_flickr"]
            lines.append(f"| {r['ablation']} | {', '.join(r['changes']) or 'none'} | {r['steps']} ({r['epochs']}) | "
                         f"{r['train_seconds']:.0f} | "
                         f"{r['train_load_average_1m'][0]:.1f}, {r['train_load_average_1m'][1]:.1f} | "
                         f"{val['bleu']:.2f} / {val['bleu_lowercased']:.2f} | "
                         f"{test['bleu']:.2f} / {test['bleu_lowercased']:.2f} |")
    if report.get("equal_steps"):
        lines += ["", "Runs of the recipe's schedule (5,500 steps) compared at the same steps, greedy:", "",
                  "| run | step | validation sacreBLEU / lowercased | test sacreBLEU / lowercased |",
                  "|---|---|---|---|"]
        for r in report["equal_steps"]:
            val, test = r["validation"], r["test_2016_flickr"]
            lines.append(f"| {r['run']} | {r['step']} | {val['bleu']:.2f} / {val['bleu_lowercased']:.2f} | "
                         f"{test['bleu']:.2f} / {test['bleu_lowercased']:.2f} |")
    return lines


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks multi30k_transformer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, default=ROOT / "runs" / RECIPE, help="the recipe's run directory")
    parser.add_argument("--train", action="store_true", help="train the recipe into --run first (60 minutes)")
    parser.add_argument("--skip-run", action="store_true", help="score no run, only the ablations")
    parser.add_argument("--average", type=int, nargs="*", default=[5, 10], help="checkpoint counts to average")
    parser.add_argument("--beam", type=int, default=5, help="beam size beside greedy decoding")
    parser.add_argument("--ablations", nargs="*", default=[], choices=list(ABLATIONS))
    parser.add_argument("--steps", type=int, default=700, help="optimizer steps per ablation")
    parser.add_argument("--equal-steps", type=Path, nargs="*", default=[],
                        help="runs of the recipe's schedule to compare at the steps --at (e.g. tied and untied)")
    parser.add_argument("--at", type=int, nargs="*", default=[1000, 2000], help="steps for --equal-steps")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(args.threads)
    recipes.load(RECIPE)  # an unknown recipe fails here, before any work
    found: dict[str, Any] = {}
    if args.train:
        found["train_load_average_1m"] = train(args.run, [])["load_average_1m"]
    if not args.skip_run:
        found["run"] = evaluate_run(args.run, args)
    new_ablations = ablations(args) if args.ablations else []
    if args.equal_steps:
        found["equal_steps"] = equal_steps(args.equal_steps, args.at)
    path = RESULTS / "multi30k-transformer.json"  # read only now: another invocation may have written meanwhile
    report = json.loads(path.read_text()) if path.is_file() else {"benchmark": "multi30k-transformer"}
    report.update(found, machine=machine())
    if new_ablations:
        kept = [r for r in report.get("ablations", []) if r["ablation"] not in args.ablations]
        report["ablations"] = kept + new_ablations
    RESULTS.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n")
    (RESULTS / "multi30k-transformer.md").write_text("\n".join(markdown(report)) + "\n")
    print("\n".join(markdown(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
