"""The lecture's A/B task: one attention layer finds the B; the plain average of embeddings loses it.

Sequences of As and Bs; the answer is B if any B occurs, else A. Attention does "random access" into the context:
a query that looks for B puts nearly all its weight on a B wherever it is, so the pooled vector is B's embedding
at any length. The plain average (a deep averaging network's pooling) sees only the fraction of Bs, which is 1/T
for one B in T tokens: a threshold learned on short sequences misses a lone B in a long one.

Both models: embeddings (C = 16) -> pooling -> linear classifier. Attention pooling is attnkit's `Attention` with
one learned query (cross-attention from that query to the embeddings, dot score). Trained on lengths 1 to 8,
tested on lengths 4, 16 and 64 with exactly one B in the positive half.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from torch import Tensor, nn

from attnkit.experiments.base import SEEDS, Check, Progress, Result, Stored, experiment
from attnkit.experiments.plots import fit_value_axis, heatmap_axes, new_figure, save, series, spread_legend
from attnkit.layers.attention import Attention
from attnkit.layers.masks import AttentionMask

PAD, A, B = 0, 1, 2
DIM = 16


class PooledClassifier(nn.Module):
    """ids (N, T), mask (N, T) -> logits (N, 2) and, with attention, the query's weights over tokens (N, T)."""

    def __init__(self, *, attend: bool) -> None:
        super().__init__()
        self.embed = nn.Embedding(3, DIM, padding_idx=PAD)
        self.attention = Attention(DIM, 1, score="dot", bias=False) if attend else None
        self.query = nn.Parameter(torch.randn(1, 1, DIM) * 0.1) if attend else None
        self.classify = nn.Linear(DIM, 2)

    def forward(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor | None]:
        tokens = self.embed(ids)  # (N, T, C)
        if self.attention is None:
            pooled = (tokens * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)  # (N, C)
            return self.classify(pooled), None
        query = self.query.expand(len(ids), 1, DIM)  # (N, 1, C)
        padding = AttentionMask(1, attention_mask=mask)  # the one query sees the real tokens only
        pooled, weights = self.attention(query, context=tokens, mask=padding, need_weights=True)  # (N, 1, C)
        return self.classify(pooled[:, 0]), weights[:, 0, 0]  # (N, 2), (N, T)


def make_batch(n: int, lengths: tuple[int, int], generator: torch.Generator, *, single_b: bool) -> tuple[Tensor, ...]:
    """n sequences with lengths in [lo, hi]; half contain B (one B, or a random number of them)."""
    lo, hi = lengths
    length = torch.randint(lo, hi + 1, (n,), generator=generator)
    ids = torch.full((n, hi), PAD)
    positions = torch.arange(hi)[None, :]
    mask = positions < length[:, None]  # (N, T)
    ids[mask] = A
    labels = (torch.rand(n, generator=generator) < 0.5).long()  # 1: contains B
    for row in torch.nonzero(labels).flatten().tolist():
        count = 1 if single_b else int(torch.randint(1, int(length[row]) + 1, (), generator=generator))
        where = torch.randperm(int(length[row]), generator=generator)[:count]
        ids[row, where] = B
    return ids, mask, labels


def train(model: PooledClassifier, steps: int, generator: torch.Generator, progress: Progress, desc: str) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=0.03)
    for _ in progress.steps(steps, desc):
        ids, mask, labels = make_batch(64, (1, 8), generator, single_b=False)
        loss = nn.functional.cross_entropy(model(ids, mask)[0], labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


@torch.no_grad()
def accuracy(model: PooledClassifier, length: int, generator: torch.Generator) -> float:
    ids, mask, labels = make_batch(1000, (length, length), generator, single_b=True)
    return float((model(ids, mask)[0].argmax(-1) == labels).float().mean())


def plot(stored: Stored, out: Path) -> list[str]:
    """Test accuracy by length for each pooling, mean and each seed, on a 0-1 axis."""
    lengths = [int(column.rsplit(" ", 1)[1]) for column in stored.rows[0] if column.startswith("accuracy, length")]
    fig, ax = new_figure(5, 3.5)
    for index, row in enumerate(stored.rows):
        columns = [f"accuracy, length {n}" for n in lengths]
        spread = series(ax, lengths, [row[c] for c in columns], seeds=stored.spread([(index, c) for c in columns]),
                        label=row["pooling"])
    ax.set(xscale="log", xlabel="sequence length (one B in positives)", ylabel="test accuracy",
           title="A/B task: attention vs plain average")
    fit_value_axis(ax, "fraction")
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.minorticks_off()
    spread_legend(ax, over=f"mean of {stored.seeds} seeds", spread=spread, loc="lower left")
    save(fig, out / "accuracy.png")
    return ["accuracy.png"]


@experiment(
    "ab-task",
    claim="one attention layer solves the A/B task (B if any B, else A) at any length, where the plain average of "
    "the embeddings fails on long sequences",
    lecture="Attention (the A/B running example: attention as random access into the context)",
    default_seeds=lambda budget: SEEDS[budget] + (budget != "tiny"),  # seconds each
    plot=plot,
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    steps = {"tiny": 60, "small": 300, "full": 1000}[budget]
    lengths = (4, 16, 64)
    accuracies: dict[str, list[dict[int, float]]] = {"attention": [], "plain average": []}  # per seed, per length
    models = {}
    for seed in range(seeds):
        for name, attend in (("attention", True), ("plain average", False)):
            torch.manual_seed(seed)
            model = PooledClassifier(attend=attend)
            train(model, steps, torch.Generator().manual_seed(1000 + seed), progress, f"{name}, seed {seed}")
            # each seed its own test sequences: their sampling noise belongs to the seeds' spread, as the training's
            accuracies[name].append({n: accuracy(model, n, torch.Generator().manual_seed(1000 * seed + n))
                                     for n in lengths})
            models.setdefault(name, model)  # the pictures: seed 0
    rows = [{"pooling": name, **{f"accuracy, length {n}": statistics.fmean(a[n] for a in per_seed) for n in lengths}}
            for name, per_seed in accuracies.items()]
    longest = lengths[-1]
    checks = [
        Check.over(f"attention's accuracy minus the plain average's at length {longest}",
                   [a[longest] - p[longest] for a, p in zip(accuracies["attention"], accuracies["plain average"],
                                                            strict=True)]),
        Check.over(f"the plain average's accuracy at length {lengths[0]} minus at {longest}",
                   [p[lengths[0]] - p[longest] for p in accuracies["plain average"]]),
        Check.over(f"attention's accuracy at length {longest} minus 0.99 (it solves the task at any length)",
                   [a[longest] - 0.99 for a in accuracies["attention"]]),
    ]

    examples = ["AABA", "BAAA", "AAAA", "AAAAAAAABAAAAAAA"]
    ids = torch.full((len(examples), 16), PAD)
    for row, text in enumerate(examples):
        ids[row, : len(text)] = torch.tensor([A if c == "A" else B for c in text])
    with torch.no_grad():
        weights = models["attention"](ids, ids != PAD)[1]  # (4, 16)
    fig, ax = new_figure(9, 2.8)
    heatmap_axes(ax, weights, title="the learned query's attention over each sequence (seed 0)", xlabel="position",
                 ylabel="sequence", yticklabels=examples)
    for row, text in enumerate(examples):
        for col, char in enumerate(text):
            ax.text(col, row, char, ha="center", va="center", color="white", fontsize=8)
    save(fig, out / "attention.png")

    attention_long, average_long = rows[0][f"accuracy, length {longest}"], rows[1][f"accuracy, length {longest}"]
    reason = (f"at length {longest} with one B, attention pooling scores {attention_long:.1%} and the plain average "
              f"{average_long:.1%} (mean of {seeds} seeds, trained on lengths 1-8 for {steps} steps)")
    per_seed = [{f"accuracy, length {n}": [a[n] for a in accuracies[row["pooling"]]] for n in lengths} for row in rows]
    return Result(checks, reason, f"{attention_long:.0%} vs {average_long:.0%} at length {longest}", rows,
                  ["attention.png"], per_seed)
