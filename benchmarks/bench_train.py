"""Training benchmarks against published numbers, each through the same `attnkit.train` job the CLI runs.

    python -m benchmarks train shakespeare [--dtype fp32 bf16] [--threads N]
    python -m benchmarks train nanogpt [--seeds 1337 1]
    python -m benchmarks train recipes [--threads 1]
    python -m benchmarks train multi30k [--max-time 60m] [--threads N]
    python -m benchmarks train sst2 [--max-steps 2000] [--threads N]

shakespeare  Tiny Shakespeare, characters, nanoGPT's CPU setting (the recipe shakespeare-char): 4 layers, 4 heads,
             width 128, context 64, batch 12, 2,000 iterations, lr 1e-3 (warmup 100, cosine to 1e-4, beta2 0.99),
             dropout 0, learned positions, GELU, pre-norm LayerNorm, no biases. nanoGPT reports validation loss
             ~1.88. Validation loss here is over every validation token (non-overlapping windows of 64).
nanogpt      the same setting through nanoGPT's own model and train.py loop (benchmarks/nanogpt.py): its
             validation loss over every token, and ten of its 20-batch estimates (how it reports 1.88).
recipes      the recipes shakespeare-char and shakespeare-char-plus (the Llama-2-style block) and nanoGPT's loop,
             one after another in one process at the recipes' step count; writes each recipe's `result` into its
             file (src/attnkit/recipes/NAME.json) and train-recipes.json / .md.
multi30k     German to English, one shared byte-level BPE, a 3+3-layer width-256 encoder-decoder, trained for a
             time budget; sacreBLEU (detokenized, cased, 13a) of greedy translations of test_2016_flickr with the
             checkpoint that scored best on validation BLEU. Published: 36.5 (Transformer, lowercased, longer
             training), 28.3 (GRU with attention).
sst2         SST-2 sentences, BPE 4096, a 2-layer width-128 encoder (dropout 0.1, mean pooling) from scratch;
             dev accuracy at the end and the best over the evaluations (chosen on dev itself, so it flatters).
             A CNN from scratch: ~83% on test.

Results go to benchmarks/results/train-NAME.json and .md; run directories to runs/bench-NAME-*/.
Timings depend on the machine and on what else runs on it: the load average is recorded with every result.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import logging
import os
import platform
import shutil
import sys
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch

from attnkit import cli
from attnkit.experiments.base import device_name
from attnkit.generate import greedy_translate, load, translate_batched
from attnkit.recipes import RECIPE_DIR
from attnkit.train import TrainRequest, prepare
from benchmarks.common import DATA, RESULTS, ROOT
from benchmarks.nanogpt import GPT, GPTConfig, attnkit_state_dict, get_lr, train_step

RUNS = ROOT / "runs"

SHAKESPEARE_RECIPES = ("shakespeare-char", "shakespeare-char-plus")


def machine() -> dict[str, Any]:
    return {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "threads": torch.get_num_threads(), "processor": device_name(), "load_average_1m": os.getloadavg()[0]}


def need(path: Path) -> Path:
    if not path.exists():
        sys.exit(f"{path} is missing: the benchmark reads the shared data sets (see ../shared/data/README.md)")
    return path


def train(name: str, *, task: str, model: list[str], data: dict[str, Any], settings: dict[str, Any],
          translate=None, load_hf=None, preset: str | None = None) -> tuple[Any, Any, dict[str, Any]]:
    """Run one training job in a fresh runs/bench-NAME (from `preset`, else the task's default model, with the
    `model` overrides on top); returns (trainer, result, a summary row)."""
    out = RUNS / f"bench-{name}"
    request = TrainRequest(out=str(out), task=task, preset=preset, overrides=model, data=data, settings=settings,
                           overwrite=True, progress=False)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    trainer = prepare(request, translate=translate, load_hf=load_hf)
    setup = time.perf_counter() - start
    result = trainer.fit()
    row = {"run": name, "run_dir": str(out.relative_to(ROOT)), "steps": result.step,
           "train_seconds": round(result.elapsed, 1), "setup_seconds": round(setup, 1),
           "tokens_per_second": round(result.tokens_per_second), "tokens_seen": trainer.tokens_seen,
           "final": {k: round(v, 4) for k, v in result.evaluation.items()},
           "best": {trainer.task.metric: round(trainer.best, 4)}, "parameters": sum(
               p.numel() for p in trainer.model.parameters()),
           "load_average_1m": [load_before, os.getloadavg()[0]]}
    return trainer, result, row


def recipe_job(name: str, *argv: str) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    """The model assignments, data settings and training settings of the recipe `name`, as `attnkit train
    --recipe NAME --data-root ../shared/data ARGV...` builds them."""
    invocation = cli.parse(["train", "--recipe", name, "--data-root", str(need(DATA)), *argv])
    request = cli.train_request(invocation.settings, *invocation.sections)  # the data with each task's own options
    return list(request.overrides), {"task": request.task, **request.data}, dict(request.settings)


def shakespeare(args: argparse.Namespace) -> list[dict[str, Any]]:
    model, data, settings = recipe_job("shakespeare-char")
    rows = []
    for dtype in args.dtype:
        _, _, row = train(f"shakespeare-{dtype}", task=data["task"], model=model, data=data,
                          settings={**settings, "dtype": dtype})
        row["dtype"] = dtype
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def nanogpt_parity(V: int, T: int) -> dict[str, Any]:
    """The largest logit difference between attnkit's model of the setting and nanoGPT's, same weights."""
    from attnkit import ModelConfig, build_model

    torch.manual_seed(0)
    reference = GPT(GPTConfig(block_size=T, vocab_size=V, n_layer=4, n_head=4, n_embd=128, bias=False))
    ours = build_model(ModelConfig(vocab_size=V).with_overrides(recipe_job("shakespeare-char")[0]))
    ours.load_state_dict(attnkit_state_dict(reference), strict=False)  # lm_head is tied to the token embedding
    x = torch.randint(0, V, (4, T))
    with torch.no_grad():
        logits, _ = reference(x, targets=x)  # with targets, the logits at every position
        difference = (ours(x).logits - logits).abs().max().item()
    print(f"attnkit vs nanoGPT logits, same weights: max difference {difference:.3g}", flush=True)
    return {"run": "nanogpt-parity", "max_logit_difference": difference}


def nanogpt_reference(args: argparse.Namespace) -> list[dict[str, Any]]:
    """nanoGPT's model and train.py loop (shakespeare_char, CPU setting) re-run here: its validation loss over every
    token, and ten of its 20-batch estimates (the way it reports 1.88)."""
    text = need(DATA / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    return [nanogpt_parity(len(set(text)), 64), *(nanogpt_train(seed, 2000) for seed in args.seeds)]


def nanogpt_train(seed: int, steps: int) -> dict[str, Any]:
    """nanoGPT's model.py (`nanogpt.GPT`, no biases) through its train.py loop (`nanogpt.train_step`) as its README's
    CPU run sets it (`--device=cpu --compile=False --block_size=64 --batch_size=12 --n_layer=4 --n_head=4
    --n_embd=128 --dropout=0.0`, lr_decay_iters = max_iters = `steps`), without its evaluations; one row of
    results."""
    text = need(DATA / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    stoi = {c: i for i, c in enumerate(sorted(set(text)))}
    data = torch.tensor([stoi[c] for c in text])
    train_data, val_data = data[: int(len(data) * 0.9)], data[int(len(data) * 0.9) :]
    T, B = 64, 12

    def batch(d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(d) - T, (B,))
        return torch.stack([d[i : i + T] for i in ix]), torch.stack([d[i + 1 : i + 1 + T] for i in ix])

    torch.manual_seed(seed)
    model = GPT(GPTConfig(block_size=T, vocab_size=len(stoi), n_layer=4, n_head=4, n_embd=128, bias=False))
    optimizer = model.configure_optimizers(0.1, 1e-3, (0.9, 0.99), "cpu")
    schedule = functools.partial(get_lr, learning_rate=1e-3, warmup_iters=100, lr_decay_iters=steps, min_lr=1e-4)
    step = train_step(model, optimizer, lambda: batch(train_data), forward=model, ctx=contextlib.nullcontext(),
                      lr=schedule, grad_clip=1.0)
    load_before = os.getloadavg()[0]
    start = time.perf_counter()
    for _ in range(steps):
        step()
    seconds = time.perf_counter() - start
    model.eval()
    with torch.no_grad():
        windows = torch.stack([val_data[i : i + T + 1] for i in range(0, len(val_data) - T, T)])
        full = model(windows[:, :-1], windows[:, 1:].contiguous())[1].item()  # model.py views the targets
        estimates = [sum(model(*batch(val_data))[1].item() for _ in range(20)) / 20 for _ in range(10)]
    row = {"run": f"nanogpt-reference-seed{seed}", "seed": seed, "steps": steps, "val_loss_every_token": round(full, 4),
           "val_loss_20_batch_estimates": [round(e, 3) for e in estimates], "train_seconds": round(seconds, 1),
           "tokens_per_second": round(steps * B * T / seconds), "parameters": model.get_num_params(non_embedding=False),
           "load_average_1m": [load_before, os.getloadavg()[0]]}
    print(json.dumps(row), flush=True)
    return row


def shakespeare_recipes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """shakespeare-char, shakespeare-char-plus and nanoGPT's loop, one after another at the recipes' step count;
    each recipe's `result` is written into its file, the table into train-recipes.md."""
    rows = []
    for name in SHAKESPEARE_RECIPES:
        model, data, settings = recipe_job(name)
        _, _, row = train(name, task=data["task"], model=model, data=data, settings=settings)
        rows.append({**row, "recipe": name, "val_loss_every_token": row["final"]["val_loss"]})
        print(json.dumps(rows[-1]), flush=True)
    rows.append(nanogpt_train(settings["seed"], settings["max_steps"]))
    for row in rows[:-1]:
        record_result(row, reference=rows[-1], threads=torch.get_num_threads())
    header = ["| run | block | parameters | steps | validation loss (every token) | train seconds | tokens/s | load "
              "before, after |", "|---|---|---|---|---|---|---|---|"]
    blocks = {"shakespeare-char": "GPT-2", "shakespeare-char-plus": "Llama 2"}
    table = [f"| {row['run']} | {blocks.get(row['run'], 'GPT-2 (nanoGPT model.py)')} | {row['parameters']:,} | "
             f"{row['steps']} | {row['val_loss_every_token']:.4f} | {row['train_seconds']:.1f} | "
             f"{row['tokens_per_second']:,} | {', '.join(f'{x:.2f}' for x in row['load_average_1m'])} |"
             for row in rows]
    about = machine()
    intro = (f"`python -m benchmarks train recipes --threads {about['threads']}`, {date.today().isoformat()}: "
             f"{about['processor']}, {about['threads']} torch thread(s), torch {about['torch']}. Train seconds "
             "include attnkit's evaluations over every validation token every eval_every steps and its checkpoints; "
             "nanoGPT's loop is timed without evaluation.")
    (RESULTS / "train-recipes.md").write_text("\n".join([intro, "", *header, *table]) + "\n")
    return rows


def record_result(row: dict[str, Any], *, reference: dict[str, Any], threads: int) -> None:
    """Write the measured figures into the recipe's file as its `result`."""
    path = RECIPE_DIR / f"{row['recipe']}.json"
    recipe = json.loads(path.read_text(encoding="utf-8"))
    about = machine()
    recipe["result"] = {
        "summary": f"validation loss {row['val_loss_every_token']:.3f} per character (every validation token) after "
                   f"{row['steps']:,} steps, {row['train_seconds']:.0f} s on {threads} thread{'s' * (threads > 1)} "
                   f"of a {about['cpus']}-core {about['processor']}; nanoGPT's own loop in the same run: "
                   f"{reference['val_loss_every_token']:.3f}, {reference['train_seconds']:.0f} s",
        "metrics": {"val_loss_every_token": row["val_loss_every_token"],
                    "val_perplexity": row["final"]["val_ppl"]},
        "steps": row["steps"], "train_seconds": row["train_seconds"], "tokens_per_second": row["tokens_per_second"],
        "parameters": row["parameters"], "machine": f"{about['cpus']}-core {about['processor']}",
        "threads": threads, "torch": about["torch"], "load_average": [round(x, 2) for x in row["load_average_1m"]],
        "date": date.today().isoformat(),
        "command": f"OMP_NUM_THREADS={threads} attnkit train --recipe {row['recipe']} --data-root ../shared/data",
        "measured_by": "python -m benchmarks train recipes --threads 1 (benchmarks/results/train-recipes.md)",
        "reference": {"run": "nanoGPT's model.py and train.py loop, same steps, same run",
                      "val_loss_every_token": reference["val_loss_every_token"],
                      "train_seconds": reference["train_seconds"]},
    }
    path.write_text(json.dumps(recipe, indent=2) + "\n", encoding="utf-8")


def multi30k(args: argparse.Namespace) -> list[dict[str, Any]]:
    from sacrebleu.metrics import BLEU

    folder = need(DATA / "multi30k")
    trainer, result, row = train(
        "multi30k", task="translate", model=[],
        data={"data": (str(folder),), "src_lang": "de", "tgt_lang": "en", "tokenizer": "bpe", "vocab_size": 8000,
              "bleu_samples": 300},
        settings=dict(max_steps=args.max_steps or 100_000, max_time=args.max_time, batch_size=64, lr=1e-3, warmup=200,
                      schedule="cosine", weight_decay=0.01, beta2=0.98, clip=1.0, eval_every=args.eval_every,
                      seed=1),
        translate=translate_batched,
    )
    sources = (folder / "test_2016_flickr.de").read_text(encoding="utf-8").splitlines()
    references = (folder / "test_2016_flickr.en").read_text(encoding="utf-8").splitlines()
    best = load(RUNS / "bench-multi30k" / "best", device="cpu")
    tokenizer = best.tokenizer
    hypotheses = []
    for start in range(0, len(sources), 100):
        batch = [tokenizer.encode(s) + [tokenizer.eos_id] for s in sources[start : start + 100]]
        ids = greedy_translate(best.model, batch, bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id,
                               pad_id=tokenizer.pad_id, max_length=128)
        hypotheses.extend(tokenizer.decode(row) for row in ids)
    metric = BLEU()  # sacreBLEU's defaults: 13a tokenization of detokenized text, cased
    bleu = metric.corpus_score(hypotheses, [references])
    row.update(test_bleu=round(bleu.score, 2), bleu=str(bleu), bleu_signature=str(metric.get_signature()),
               time_budget_seconds=args.max_time, examples=list(zip(sources[:3], hypotheses[:3], strict=True)))
    print(json.dumps(row), flush=True)
    return [row]


def sst2(args: argparse.Namespace) -> list[dict[str, Any]]:
    folder = need(DATA / "sst2")
    _, _, row = train(
        "sst2", task="classify", model=[],
        data={"data": (str(folder / "stsa.binary.train"),), "val_data": (str(folder / "stsa.binary.dev"),),
              "tokenizer": "bpe", "vocab_size": 4096},
        settings=dict(max_steps=args.max_steps or 2000, batch_size=32, lr=5e-4, warmup=100, weight_decay=0.1,
                      clip=1.0, eval_every=100, seed=1),
    )
    print(json.dumps(row), flush=True)
    return [row]


BENCHMARKS = {"shakespeare": shakespeare, "nanogpt": nanogpt_reference, "recipes": shakespeare_recipes,
              "multi30k": multi30k, "sst2": sst2}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(BENCHMARKS))
    parser.add_argument("--dtype", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    parser.add_argument("--max-time", type=float, default=3600.0, help="multi30k: seconds of training")
    parser.add_argument("--max-steps", type=int, help="multi30k, sst2: optimizer steps at most (100000, 2000)")
    parser.add_argument("--eval-every", type=int, default=1000, help="multi30k: steps between evaluations")
    parser.add_argument("--seeds", type=int, nargs="*", default=[1337], help="nanogpt: seeds to train (none: parity)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = BENCHMARKS[args.name](args)
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"train-{args.name}.json"
    earlier = json.loads(path.read_text())["rows"] if path.is_file() else []
    names = {row["run"] for row in rows}
    for row in rows:
        row["machine"] = machine()
    report = {"benchmark": args.name, "rows": [r for r in earlier if r["run"] not in names] + rows}
    path.write_text(json.dumps(report, indent=1) + "\n")
    for row in rows:
        plot = ROOT / row.get("run_dir", "-") / "plots" / "loss.png"
        if plot.is_file():
            shutil.copy(plot, RESULTS / f"train-{row['run']}-loss.png")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
