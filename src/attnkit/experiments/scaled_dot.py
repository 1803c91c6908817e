"""Why the dot product is scaled by 1/sqrt(D) (Vaswani et al. 2017, 3.2.1; lecture: "Attention Score Functions").

If the components of q and k are independent with mean 0 and variance 1, q . k has variance D: as the head
dimension grows, unscaled scores spread out, the softmax saturates (one key takes nearly all the weight) and its
gradients vanish. Dividing by sqrt(D) keeps the scores' variance at 1 whatever D is.

Two measurements on one-layer character models with each score at several D: at initialisation, how saturated the
freshly built model's attention is (the largest weight of its rows on validation windows); after training, the
validation loss and the trained attention's largest weight and entropy. Beside them, as an illustration of the
argument above, the softmax's largest weight and entropy over 64 keys for unit-variance random q and k.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import torch

from attnkit.config import ModelConfig
from attnkit.experiments.base import Check, Progress, Result, Stored, experiment
from attnkit.experiments.lm_runs import char_corpus, initial_model, train_lm
from attnkit.experiments.plots import fit_value_axis, new_figure, save, series, spread_legend
from attnkit.layers.attention import DotScore
from attnkit.train.instruments import attention_entropy

N_KEYS = 64
STEPS = {"tiny": 3, "small": 150, "full": 600}  # training steps of the trained comparison


def config(head_dim: int, score: str) -> ModelConfig:
    """The one-layer character model of head dimension `head_dim` (two heads) that both measurements use."""
    return ModelConfig(family="decoder", d_model=2 * head_dim, n_heads=2, n_layers=1, d_ff=4 * head_dim, score=score,
                       position="rope", max_seq_len=64)


def saturation(head_dim: int, scale: float, generator: torch.Generator) -> tuple[float, float]:
    """Mean largest weight and mean entropy (in nats) of softmax(scale * q . k) over N_KEYS keys for unit-variance
    random q and k (an illustration; the checks read the models)."""
    q = torch.randn(256, 1, 1, head_dim, generator=generator)  # (B, H, T, D)
    k = torch.randn(256, 1, N_KEYS, head_dim, generator=generator)  # (B, H, S, D)
    return _peak_and_entropy(torch.softmax(DotScore(scale)(q, k), dim=-1))  # weights (B, H, 1, S)


@torch.no_grad()
def model_saturation(model: torch.nn.Module, corpus) -> tuple[float, float]:
    """Mean largest weight and mean entropy (nats) of a one-layer model's attention rows on validation windows;
    causal row i spreads over i + 1 keys, the same for every score, so the two scores compare."""
    model.eval()
    x, _ = corpus.data.sample_batch("val", 16, 64, torch.Generator().manual_seed(1))  # (B, T)
    return _peak_and_entropy(model(x, need_weights=True).attentions[0]["self"])  # weights (B, H, T, T)


def _peak_and_entropy(weights: torch.Tensor) -> tuple[float, float]:
    """Mean largest weight and mean entropy (nats) of attention rows (B, H, T, S)."""
    return float(weights.max(-1).values.mean()), float(attention_entropy(weights))


def plot(stored: Stored, out: Path) -> list[str]:
    """The freshly built model's largest attention weight (0 to 1), the random vectors' entropy (from 0, with the
    uniform softmax's), validation loss after training (an axis at least 10% of the loss tall) and the trained
    attention's largest weight (0 to 1), by D; mean and each seed."""
    fig, axes = new_figure(20, 3.6, ncols=4)
    panels = (("max weight, model at init", "mean largest attention weight", "model at initialisation", "fraction"),
              ("entropy", "softmax entropy (nats)", f"random q, k, {N_KEYS} keys", "from zero"),
              ("val loss", "validation loss (nats/char)", f"after {STEPS[stored.budget]} steps", "level"),
              ("max weight, trained", "mean largest attention weight", "trained attention", "fraction"))
    for ax, (column, ylabel, title, scale) in zip(axes, panels, strict=True):
        shown = [(index, row["D"]) for index, row in enumerate(stored.rows) if row.get(f"dot {column}") is not None]
        dims = [dim for _, dim in shown]
        for name, label in (("dot", "dot"), ("scaled", "scaled dot")):
            cells = [(index, f"{name} {column}") for index, _ in shown]
            spread = series(ax, dims, [stored.rows[i][c] for i, c in cells], seeds=stored.spread(cells), label=label)
        if column == "entropy":
            ax.axhline(math.log(N_KEYS), linestyle=":", color="grey", label=f"uniform (log {N_KEYS})")
        ax.set(xscale="log", xlabel="head dimension D", ylabel=ylabel, title=title)
        ax.set_xticks(dims, [str(d) for d in dims])
        ax.minorticks_off()
        fit_value_axis(ax, scale)
        spread_legend(ax, over=f"mean of {stored.seeds} seeds", spread=spread)
    save(fig, out / "saturation.png")
    return ["saturation.png"]


@experiment(
    "scaled-dot",
    claim="without the 1/sqrt(D) scale, dot-product attention saturates as the head dimension D grows (softmax "
    "close to one-hot, small gradients) and trains worse; scaled dot product stays well-conditioned",
    lecture="Attention Score Functions: scaled dot product (Vaswani et al. 2017, 3.2.1)",
    plot=plot,
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    init_dims = [16, 32, 64, 128, 256, 512] if budget != "tiny" else [16, 64]
    train_dims = {"tiny": [8, 16], "small": [16, 64, 128], "full": [16, 64, 256]}[budget]
    steps = STEPS[budget]
    corpus = char_corpus({"tiny": 20_000, "small": 300_000, "full": 1_000_000}[budget])
    init_columns = ("dot max weight", "dot entropy", "scaled max weight", "scaled entropy",
                    "dot max weight, model at init", "scaled max weight, model at init")
    init_rows = []
    per_dim: dict[int, dict[str, list[float]]] = {}  # D -> column -> its value per seed
    for dim in init_dims:
        progress.phase(f"measuring attention at initialisation, D={dim}")
        per_seed = []
        for seed in range(seeds):
            generator = torch.Generator().manual_seed(seed)
            built = []  # the largest weight of each score's model as train_lm builds it for this seed
            for score in ("dot", "scaled_dot"):
                built.append(model_saturation(initial_model(config(dim, score), corpus, seed), corpus)[0])
            per_seed.append((*saturation(dim, 1.0, generator), *saturation(dim, dim**-0.5, generator), *built))
        per_dim[dim] = dict(zip(init_columns, map(list, zip(*per_seed, strict=True)), strict=True))
        init_rows.append({"D": dim, **{column: statistics.fmean(values) for column, values in per_dim[dim].items()}})

    train_rows, gaps = [], []  # gaps: per seed, unscaled loss minus scaled at the largest D
    for dim in train_dims:
        row: dict = {"D": dim}
        results: dict[str, list[tuple[float, float, float]]] = {"dot": [], "scaled": []}
        for seed in range(seeds):
            for score, name in (("dot", "dot"), ("scaled_dot", "scaled")):
                desc = f"{name} score, D={dim}, seed {seed}"
                progress.phase(f"training {desc}")
                log = train_lm(config(dim, score), corpus, steps=steps, seq_len=64, lr=3e-3, seed=seed,
                               progress=progress, desc=desc)
                results[name].append((log.val_loss, *model_saturation(log.model, corpus)))
        for name, per_seed in results.items():
            columns = (f"{name} val loss", f"{name} max weight, trained", f"{name} entropy, trained")
            per_dim.setdefault(dim, {}).update(zip(columns, map(list, zip(*per_seed, strict=True)), strict=True))
            loss, peak, entropy = (statistics.fmean(v) for v in zip(*per_seed, strict=True))
            row[f"{name} val loss"], row[f"{name} max weight, trained"], row[f"{name} entropy, trained"] = \
                loss, peak, entropy
        gaps = [dot[0] - scaled[0] for dot, scaled in zip(results["dot"], results["scaled"], strict=True)]
        train_rows.append(row)

    rows = [{**row, **next((t for t in train_rows if t["D"] == row["D"]), {})} for row in init_rows]
    rows = sorted(rows + [t for t in train_rows if t["D"] not in init_dims], key=lambda row: row["D"])
    low_init, top_init, top_train = init_rows[0], init_rows[-1], train_rows[-1]
    at_init = "max weight, model at init"
    low_seeds, top_seeds = per_dim[low_init["D"]], per_dim[top_init["D"]]  # column -> its value per seed
    checks = [
        Check.over(f"at initialisation: the unscaled model's mean largest attention weight at D={top_init['D']} "
                   f"minus at D={low_init['D']} (it saturates as D grows)",
                   [top - low for top, low in zip(top_seeds[f"dot {at_init}"], low_seeds[f"dot {at_init}"],
                                                  strict=True)]),
        Check.over(f"at initialisation, D={top_init['D']}: the unscaled model's mean largest attention weight minus "
                   "the scaled model's", [dot - scaled for dot, scaled in zip(top_seeds[f"dot {at_init}"],
                                                                              top_seeds[f"scaled {at_init}"],
                                                                              strict=True)]),
        Check.over(f"after training, D={top_train['D']}: unscaled dot's validation loss minus scaled dot's (nats)",
                   gaps),
    ]

    reason = (f"at initialisation the unscaled model's attention puts {top_init[f'dot {at_init}']:.0%} of a row's "
              f"weight on one key at D={top_init['D']} on average over {seeds} seeds "
              f"({low_init[f'dot {at_init}']:.0%} at D={low_init['D']}; scaled: {top_init[f'scaled {at_init}']:.0%} "
              f"and {low_init[f'scaled {at_init}']:.0%}; for unit-variance random q and k over {N_KEYS} keys, "
              f"{top_init['dot max weight']:.0%} and {low_init['dot max weight']:.0%} unscaled); after {steps} steps "
              f"at D={top_train['D']} the validation loss is {top_train['dot val loss']:.3f} unscaled vs "
              f"{top_train['scaled val loss']:.3f} scaled, and its trained attention puts "
              f"{top_train['dot max weight, trained']:.0%} of a row's weight on one key unscaled vs "
              f"{top_train['scaled max weight, trained']:.0%} scaled")
    key = (f"the model's largest attention weight at initialisation {top_init[f'dot {at_init}']:.2f} unscaled vs "
           f"{top_init[f'scaled {at_init}']:.2f} scaled at D={top_init['D']}")
    return Result(checks, reason, key, rows, [], [per_dim[row["D"]] for row in rows])
