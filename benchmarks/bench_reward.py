"""A reward model learns a known preference, and best-of-N with it raises the reward of what a model writes.

    python -m benchmarks reward [--pretrain-steps 300] [--reward-steps 60] [--prompts 32] [--threads 1]

The preference has a known answer: pairs of continuations of Python standard-library lines (the built-in text),
the chosen in capitals, the rejected the same words in lower case (`tests/test_dpo.py`'s pairs). So the true reward
of any text is known, its share of capital letters, and the learnt one can be checked against it.

    1. a 64-wide, 2-layer character decoder pretrained on the standard-library files (`attnkit train`)
    2. `attnkit train --task reward --init-from` it on 320 pairs, 64 held out: held-out pairwise accuracy and loss at
       each evaluation
    3. best-of-N (`attnkit.generate.best_of_n`, temperature 1, 16 new tokens, seed 0) on `--prompts` held-out
       prompts for N = 1, 2, 4, 8, 16: the mean learnt reward of the kept text, and its true reward (capitals)

Writes benchmarks/results/reward-best-of-n.json and .md, and docs/guides/reward-best-of-n.png. CPU, one thread: a
few minutes. The load average is recorded with the result.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import sysconfig
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
STEM = "reward-best-of-n"  # benchmarks/results/STEM.json and .md
PICTURE = HERE.parent / "docs" / "guides" / "reward-best-of-n.png"
TINY = ["d_model=64", "n_layers=2", "n_heads=4", "d_ff=256", "max_seq_len=64"]
NS = (1, 2, 4, 8, 16)


def stdlib_files() -> list[Path]:
    return sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:12]


def stdlib_lines(count: int) -> list[str]:
    """Lines whose characters 14 to 26 are mostly lower-case letters, spread over the files."""
    found = []
    for path in stdlib_files():
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            line = line.strip()
            if len(line) >= 30 and sum(c.islower() for c in line[14:26]) >= 6:
                found.append(line)
    return found[:: max(1, len(found) // count)][:count]


def capitals(text: str) -> float:
    """The true reward: the share of the text's letters that are capitals (0 for a text with none)."""
    letters = [c for c in text if c.isalpha()]
    return sum(c.isupper() for c in letters) / len(letters) if letters else 0.0


def mean_and_error(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error."""
    mean = sum(values) / len(values)
    spread = math.sqrt(sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1))
    return mean, spread / math.sqrt(len(values))


def fresh_head(folder: Path) -> dict:
    """The held-out scores before training: the pretrained body under a fresh head, as the run starts (the same
    loader as --init-from; the head drawn from seed 0)."""
    import torch

    from attnkit import build_model
    from attnkit.chat_format import DEFAULT_FORMAT
    from attnkit.data.preferences import read_pairs
    from attnkit.tasks.reward import REWARD, RewardOptions, reward_scores, rows_of_pairs
    from attnkit.train.finetune import load_body, read_source, target_config

    source = read_source(folder / "base")
    torch.manual_seed(0)
    model = build_model(target_config(source, spec=REWARD, assignments=[]))
    load_body(model, source)
    data = rows_of_pairs(read_pairs(folder / "val.jsonl"), template=DEFAULT_FORMAT, tokenizer=source.tokenizer,
                         seq_len=64, batch_size=16)
    scores = reward_scores(model.eval(), data, RewardOptions())
    return {k: scores[k] for k in ("val_loss", "accuracy", "margin")}


def run(args: argparse.Namespace, folder: Path) -> dict:
    from attnkit import cli, load
    from attnkit.generate import best_of_n
    from attnkit.train import TrainRequest, prepare

    prepare(TrainRequest(out=str(folder / "base"), overrides=TINY, progress=False,
                         data={"data": tuple(map(str, stdlib_files())), "tokenizer": "char"},
                         settings=dict(max_steps=args.pretrain_steps, batch_size=16, lr=3e-3, warmup=10,
                                       eval_every=args.pretrain_steps, seed=0, instruments=False))).fit()
    lines = stdlib_lines(384)
    pairs = [{"prompt": line[:14], "chosen": line[14:26].upper(), "rejected": line[14:26].lower()} for line in lines]
    for name, part in (("train.jsonl", pairs[:-64]), ("val.jsonl", pairs[-64:])):
        (folder / name).write_text("".join(json.dumps(p) + "\n" for p in part), encoding="utf-8")
    every = max(1, args.reward_steps // 12)
    code = cli.main(["train", "--task", "reward", "--init-from", str(folder / "base"), "--data",
                     str(folder / "train.jsonl"), "--val-data", str(folder / "val.jsonl"), "--out", str(folder / "rm"),
                     "--batch-size", "16", "--lr", "3e-4", "--warmup", "5", "--seed", "0", "--no-progress",
                     "--no-instruments", "--max-steps", str(args.reward_steps), "--eval-every", str(every)])
    if code:
        raise SystemExit(f"the reward run failed ({code})")
    records = [json.loads(line) for line in (folder / "rm" / "metrics.jsonl").read_text().splitlines()]
    curve = [{"step": 0, **fresh_head(folder)}]
    curve += [{k: r[k] for k in ("step", "val_loss", "accuracy", "margin")} for r in records if "val_loss" in r]
    policy, reward = load(folder / "base"), load(folder / "rm")
    prompts = [p["prompt"] for p in pairs[-args.prompts:]]
    rows = []
    for n in NS:
        kept = best_of_n(policy, reward, prompts, n=n, seed=0, max_new_tokens=16, temperature=1.0)
        learnt, true = mean_and_error([k.reward for k in kept]), mean_and_error([capitals(k.text) for k in kept])
        rows.append({"n": n, "reward": learnt[0], "reward_se": learnt[1], "capitals": true[0], "capitals_se": true[1],
                     "example": kept[0].text})
    return {"curve": curve, "best_of_n": rows,
            "settings": {**vars(args), "model": TINY, "pairs_train": len(pairs) - 64, "pairs_held_out": 64},
            "load_average": os.getloadavg(), "threads": args.threads}


def plot(result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    steps = [r["step"] for r in result["curve"]]
    left.plot(steps, [r["accuracy"] for r in result["curve"]], "o-", label="held-out pairwise accuracy")
    left.plot(steps, [r["val_loss"] for r in result["curve"]], "s--", label="held-out ranking loss")
    left.axhline(0.5, color="grey", lw=0.8, ls=":")
    left.set(xlabel="reward-model training step", title="The reward model learns the preference", ylim=(0, 1.05))
    left.legend(loc="center right")
    ns = [r["n"] for r in result["best_of_n"]]
    right.errorbar(ns, [r["reward"] for r in result["best_of_n"]], [r["reward_se"] for r in result["best_of_n"]],
                   fmt="o-", capsize=3, color="C0", label="learnt reward of the kept text")
    right.set(xscale="log", xlabel="N (samples drawn, best kept)", ylabel="learnt reward",
              title="Best-of-N raises the reward of the outputs")
    right.set_xticks(ns, [str(n) for n in ns])
    twin = right.twinx()
    twin.errorbar(ns, [r["capitals"] for r in result["best_of_n"]], [r["capitals_se"] for r in result["best_of_n"]],
                  fmt="s--", capsize=3, color="C3", label="true reward: share of capitals")
    twin.set_ylabel("share of capital letters", color="C3")
    lines = right.get_legend_handles_labels()[0] + twin.get_legend_handles_labels()[0]
    right.legend(lines, [h.get_label() for h in lines], loc="upper left", fontsize=8)
    fig.tight_layout()
    PICTURE.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(PICTURE, dpi=110)


def table(result: dict) -> str:
    lines = ["# Reward model and best-of-N (`python -m benchmarks reward`)", "",
             f"Settings: {json.dumps(result['settings'])}; load average {result['load_average']}.", "",
             "| step | held-out loss | held-out accuracy | margin |", "| --- | --- | --- | --- |"]
    lines += [f"| {r['step']} | {r['val_loss']:.4f} | {r['accuracy']:.3f} | {r['margin']:.3f} |"
              for r in result["curve"]]
    lines += ["", "| N | learnt reward of the kept text | true reward (share of capitals) | first prompt's text |",
              "| --- | --- | --- | --- |"]
    lines += [f"| {r['n']} | {r['reward']:.3f} +- {r['reward_se']:.3f} | {r['capitals']:.3f} +- {r['capitals_se']:.3f}"
              f" | `{r['example']!r}` |" for r in result["best_of_n"]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks reward", description=__doc__.split("\n\n")[0])
    parser.add_argument("--pretrain-steps", type=int, default=300)
    parser.add_argument("--reward-steps", type=int, default=60)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    import torch

    from benchmarks.common import write_report

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        result = run(args, Path(folder))
    write_report(STEM, result, table(result))
    plot(result)
    print(table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
