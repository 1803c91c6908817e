"""The encoder-decoder bottleneck, and attention as its fix (lecture: "what the Transformer replaced";
Cho et al. 2014, Bahdanau et al. 2015).

A recurrent encoder-decoder without attention hands the decoder one vector, the encoder's final state, however
long the source. With Bahdanau's attention the decoder looks back at every encoder state; the Transformer does
nothing else. Three models of similar size learn the synthetic copy task (reproduce a string over the 10 symbols a
to j) on the same examples for the same number of steps, then translate held-out strings greedily; exact match and
per-symbol accuracy are reported per source-length bucket. The claim, as measured: the model without attention
falls off with length and attention shrinks the fall-off (each attention model loses less accuracy from the
shortest bucket to the longest, starting where the model without attention starts: it copies the shortest strings
as well, within SHORT_MARGIN, for a model that learned to copy nothing loses nothing with length either). It does
not say attention removes it: at small budgets the attention models still copy the longest strings exactly far less
often than the shortest, and the verdict's reason gives those figures.
"""

from __future__ import annotations

import statistics
from functools import partial
from pathlib import Path

import torch
from torch import nn

from attnkit import presets
from attnkit.data import PairData
from attnkit.data.synthetic import SyntheticTask, make_task, synthetic_tokenizer
from attnkit.experiments.arms import Arm, is_number
from attnkit.experiments.base import Check, Progress, Result, Stored, experiment
from attnkit.experiments.plots import fit_value_axis, new_figure, save, series, spread_legend
from attnkit.generate.seq2seq import greedy_translate
from attnkit.models import build_model
from attnkit.models.recurrent import recurrent_seq2seq
from attnkit.tokenize import CharTokenizer
from attnkit.train.optim import lr_factor, make_optimizer

SETTINGS = {  # lengths (shortest, longest), length buckets, training examples, steps, batch, width
    "tiny": dict(lengths=(2, 8), buckets=[(2, 4), (5, 8)], n_train=256, steps=20, batch=32, width=32),
    "small": dict(lengths=(2, 32), buckets=[(2, 8), (9, 16), (17, 24), (25, 32)], n_train=20_000, steps=1_500,
                  batch=64, width=128),
    "full": dict(lengths=(2, 48), buckets=[(2, 12), (13, 24), (25, 36), (37, 48)], n_train=50_000, steps=4_000,
                 batch=64, width=256),
}
N_TEST_PER_BUCKET = {"tiny": 16, "small": 200, "full": 500}
SHORT_MARGIN = 0.1  # per-symbol accuracy on the shortest strings an attention model may lack and still "start there"


def models(width: int, vocab_size: int, max_len: int) -> dict[str, nn.Module]:
    """GRU without attention, GRU with Bahdanau attention (both with a bidirectional encoder of width/2 a
    direction), and a Transformer encoder-decoder of the same width, 1 + 1 layers (parameters within 2x)."""
    gru = dict(src_vocab_size=vocab_size, tgt_vocab_size=vocab_size, embedding_dim=width // 2, hidden=width,
               encoder_hidden=width // 2, n_layers=1, cell="gru", bidirectional=True, share_vocabulary=True)
    transformer = presets.get("vaswani-tiny", vocab_size=vocab_size, d_model=width, n_layers=1,
                              n_heads=max(width // 32, 1), d_ff=2 * width, max_seq_len=max_len + 2,
                              label_smoothing=0.0, dropout=0.0)
    return {
        "GRU, no attention": recurrent_seq2seq(attention="none", **gru),
        "GRU + Bahdanau attention": recurrent_seq2seq(attention="bahdanau", **gru),
        "Transformer": build_model(transformer),
    }


def train(model: nn.Module, data: PairData, steps: int, *, lr: float, warmup: int, progress: Progress | None = None,
          desc: str = "training") -> float:
    """Teacher-forced training with AdamW, warmup then cosine; returns the last step's loss. progress: shows the
    steps as `desc` (default: a log line every fifth of them)."""
    optimizer = make_optimizer(model, lr=lr, weight_decay=0.01)
    model.train()
    epoch, batches, loss = 0, iter(()), torch.tensor(float("nan"))
    for step in (progress or Progress()).steps(steps, desc):
        batch = next(batches, None)
        if batch is None:
            batches = data.iter_epoch(epoch)
            epoch += 1
            batch = next(batches)
        for group in optimizer.param_groups:
            group["lr"] = lr * lr_factor("cosine", step, warmup=warmup, progress=step / steps)
        loss = model(batch.src_ids, batch.tgt_in, src_mask=batch.src_mask, tgt_mask=batch.tgt_mask,
                     labels=batch.tgt_out, return_logits=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    return loss.item()


def train_and_score(model: nn.Module, data: PairData, tests: dict[tuple[int, int], SyntheticTask], *, steps: int,
                    lr: float, warmup: int, progress: Progress, desc: str, tokenizer: CharTokenizer,
                    ids: dict[str, int]) -> tuple[dict[str, float], Arm]:
    """One arm: `train` the model, then its exact and per-symbol accuracy copying each length bucket's strings
    (greedy decoding), with the last step's loss; the scores also as the arm to keep."""
    progress.phase(f"training {desc} ({steps} steps), then translating {len(tests)} length buckets")
    score = {"final loss": train(model, data, steps, lr=lr, warmup=warmup, progress=progress, desc=desc)}
    for (first, last), task in tests.items():
        sources = tokenizer.encode_batch([e.source for e in task.examples])
        sources = [[*source, tokenizer.eos_id] for source in sources]
        predictions = [tokenizer.decode(t) for t in greedy_translate(model, sources, **ids)]
        score[f"exact {first}-{last}"] = task.score(predictions)
        score[f"per symbol {first}-{last}"] = sum(
            symbol_accuracy(p, e.target) for p, e in zip(predictions, task.examples, strict=True)) / len(task)
    return score, Arm(score)


def saved_scores(arm: Arm, buckets: list[tuple[int, int]]) -> dict[str, float]:
    """The scores a saved arm holds, checked before use: `train_and_score`'s metrics for `buckets`, in its order,
    each a number; anything else is a ValueError (the arm is then rerun)."""
    names = ["final loss", *(f"{kind} {first}-{last}" for first, last in buckets for kind in ("exact", "per symbol"))]
    if list(arm.values) != names or not all(map(is_number, arm.values.values())):
        raise ValueError(f"its scores are not {', '.join(names)}, each a number")
    return {name: float(arm.values[name]) for name in names}


def symbol_accuracy(prediction: str, target: str) -> float:
    """The share of positions the prediction gets right, over the longer of the two: a missing symbol is wrong, and
    so is one past the target's end (a copy with extra symbols after it is no perfect copy)."""
    return sum(p == t for p, t in zip(prediction, target, strict=False)) / max(len(target), len(prediction))


def plot(stored: Stored, out: Path) -> list[str]:
    """Exact and per-symbol accuracy by source length for each model, mean and each seed, on 0-1 axes."""
    labels = [column.removeprefix("exact ") for column in stored.rows[0] if column.startswith("exact ")]
    fig, axes = new_figure(12.5, 4, ncols=2)
    for ax, metric in zip(axes, ("exact", "per symbol"), strict=True):
        for index, row in enumerate(stored.rows):
            columns = [f"{metric} {label}" for label in labels]
            spread = series(ax, range(len(labels)), [row[c] for c in columns],
                            seeds=stored.spread([(index, c) for c in columns]), label=row["model"])
        ax.set_xticks(range(len(labels)), labels)  # buckets such as "2-4" by position (as text, read as dates)
        ax.set(xlabel="source length (symbols)", ylabel=f"{metric} accuracy", title=f"copy task, {metric} match")
        fit_value_axis(ax, "fraction")
    spread_legend(axes[1], over=f"mean of {stored.seeds} seeds", spread=spread, loc="upper left",
                  bbox_to_anchor=(1.01, 1))  # beside the panel: no line or seed hidden under it
    save(fig, out / "accuracy_by_length.png")
    return ["accuracy_by_length.png"]


def drop(per_seed: list[dict[str, float]], first: str, last: str) -> list[float]:
    """Per seed: the per-symbol accuracy lost from the shortest bucket (`first`, e.g. "2-8") to the longest."""
    return [score[f"per symbol {first}"] - score[f"per symbol {last}"] for score in per_seed]


def checks(scores: dict[str, list[dict[str, float]]], first: str, last: str) -> list[Check]:
    """The checks of the claim, from each model's scores per seed (model -> per seed: metric -> value). For each
    attention model: it loses less per-symbol accuracy from the shortest bucket (`first`) to the longest (`last`)
    than the GRU without attention, and it starts where that model starts: on the shortest strings it is short of
    that model's per-symbol accuracy by less than SHORT_MARGIN.

    The fall-off difference is the attention model's shortfall at `first` plus its lead at `last`, so a model that
    learned to copy nothing passes it; the start check bounds the part a shortfall can play by SHORT_MARGIN. A start
    above the other model's is no shortfall (it counts as 0): it leaves more to lose, and the other model's
    seed-to-seed spread below it is no noise in whether the attention model starts where that one does."""
    plain = "GRU, no attention"
    attended = [name for name in scores if name != plain]

    def shortfall(name: str) -> list[float]:  # per seed: per-symbol accuracy short of the plain GRU's at `first`
        return [max(p[f"per symbol {first}"] - a[f"per symbol {first}"], 0.0)
                for p, a in zip(scores[plain], scores[name], strict=True)]

    falls = [Check.over(f"per-symbol accuracy lost from {first} to {last} symbols: without attention minus {name}",
                        [p - a for p, a in zip(drop(scores[plain], first, last), drop(scores[name], first, last),
                                               strict=True)])
             for name in attended]
    starts = [Check.over(f"{name} copies the shortest strings as well, within {SHORT_MARGIN * 100:g} points: "
                         f"{SHORT_MARGIN:g} minus its per-symbol accuracy at {first} symbols short of without "
                         "attention's (none where above)",
                         [SHORT_MARGIN - short for short in shortfall(name)])
              for name in attended]
    return falls + starts


def describe(rows: list[dict], mean_drop: dict[str, float], first: str, last: str, seeds: int) -> str:
    """The verdict's reason: each model's change in per-symbol accuracy and its exact copies from the shortest
    bucket to the longest, as measured (what they mean is the checks' to say)."""
    change = ", ".join(f"{name} {-mean_drop[name]:+.0%}" for name in mean_drop)
    exact = ", ".join(f"{row['model']} {row[f'exact {first}']:.0%} -> {row[f'exact {last}']:.0%}" for row in rows)
    return (f"from {first} to {last} symbols per-symbol accuracy changes by: {change} (mean of {seeds} seeds); "
            f"exact copies: {exact}")


@experiment(
    "bottleneck",
    claim="an encoder-decoder without attention squeezes the source into one vector and falls off with source "
    "length; attention (Bahdanau's, or the Transformer's) shrinks the fall-off",
    lecture="What the Transformer replaced: the RNN encoder-decoder and attention added to it",
    plot=plot,
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    s = SETTINGS[budget]
    tokenizer = synthetic_tokenizer()
    low, high = s["lengths"]
    train_task = make_task("copy", s["n_train"], seed=1, min_len=low, max_len=high)
    tests = {bucket: make_task("copy", N_TEST_PER_BUCKET[budget], seed=2 + i, min_len=bucket[0], max_len=bucket[1])
             for i, bucket in enumerate(s["buckets"])}
    ids = dict(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id, max_length=high + 4)
    labels = [f"{first}-{last}" for first, last in s["buckets"]]

    scores: dict[str, list[dict[str, float]]] = {}  # model -> per seed: metric -> value
    parameters = {}
    for seed in range(seeds):
        data = PairData.from_pairs(train_task.pairs(), tokenizer, batch_size=s["batch"], seed=seed)
        torch.manual_seed(seed)
        for name, model in models(s["width"], tokenizer.vocab_size, high).items():
            lr, warmup = (1e-3, s["steps"] // 10) if name == "Transformer" else (3e-3, s["steps"] // 20)
            desc = f"{name}, seed {seed}"
            parameters[name] = sum(p.numel() for p in model.parameters())

            trained = partial(train_and_score, model, data, tests, steps=s["steps"], lr=lr, warmup=warmup,
                              progress=progress, desc=desc, tokenizer=tokenizer, ids=ids)
            restored = partial(saved_scores, buckets=s["buckets"])
            setting = {"model": name, "seed": seed, "settings": s, "tests": N_TEST_PER_BUCKET[budget]}
            scores.setdefault(name, []).append(progress.arm(desc, setting, trained, restored))
    rows = [{"model": name, "parameters": parameters[name],
             **{metric: statistics.fmean(score[metric] for score in per_seed) for metric in per_seed[0]}}
            for name, per_seed in scores.items()]

    first, last = labels[0], labels[-1]
    mean_drop = {name: statistics.fmean(drop(per_seed, first, last)) for name, per_seed in scores.items()}
    plain_row, attention_row = rows[0], rows[1]
    key = (f"per-symbol accuracy at {last} symbols: {plain_row[f'per symbol {last}']:.0%} without attention, "
           f"{attention_row[f'per symbol {last}']:.0%} with")
    reason = describe(rows, mean_drop, first, last, seeds)
    per_seed = [{metric: [score[metric] for score in scores[row["model"]]] for metric in scores[row["model"]][0]}
                for row in rows]
    return Result(checks(scores, first, last), reason, key, rows, [], per_seed)
