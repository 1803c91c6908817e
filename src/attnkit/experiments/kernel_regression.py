"""Nadaraya-Watson kernel regression is attention (lecture: "Attention & Transformers", the soft lookup).

To predict y at a query x, weigh every training pair (x_i, y_i) by how close x_i is to x and average the y_i:

    f(x) = sum_i softmax_i(-(x - x_i)^2 w^2 / 2) y_i        queries: x, keys: x_i, values: y_i

The Gaussian kernel's softmax is attention's: -(x - x_i)^2 / 2 = x x_i - x_i^2 / 2 - x^2 / 2, and the last term is
the same for every key, so it is a dot-product score plus a per-key bias. With w = 1 the method has no parameters
(Nadaraya 1964, Watson 1964); a learned bandwidth w makes it the simplest trainable attention (d2l.ai 11.2), fitted
here by leave-one-out: each training point queries the others. The whole is repeated over several draws of the
noisy training pairs, whose spread is the noise the differences must clear.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from torch import Tensor

from attnkit.experiments.base import SEEDS, Check, Progress, Result, experiment
from attnkit.experiments.plots import heatmap_axes, new_figure, save


def true_function(x: Tensor) -> Tensor:
    return 2 * torch.sin(x) + x**0.8


def kernel_attention(queries: Tensor, keys: Tensor, values: Tensor, bandwidth: Tensor) -> tuple[Tensor, Tensor]:
    """queries (Q,), keys and values (K,) -> predictions (Q,) and attention weights (Q, K), rows summing to 1."""
    scores = -((queries[:, None] - keys[None, :]) * bandwidth) ** 2 / 2  # (Q, K)
    weights = torch.softmax(scores, dim=-1)
    return weights @ values, weights


def fit_bandwidth(x: Tensor, y: Tensor, *, steps: int) -> Tensor:
    """w minimising the leave-one-out squared error of the training set (each point attends to the others)."""
    bandwidth = torch.ones((), requires_grad=True)
    optimizer = torch.optim.Adam([bandwidth], lr=0.1)
    others = ~torch.eye(len(x), dtype=torch.bool)  # (K, K): a point never sees itself
    for _ in range(steps):
        scores = -((x[:, None] - x[None, :]) * bandwidth) ** 2 / 2
        weights = torch.softmax(scores.masked_fill(~others, float("-inf")), dim=-1)
        loss = ((weights @ y - y) ** 2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return bandwidth.detach()


def fit(n_train: int, steps: int, seed: int) -> dict:
    """One draw of noisy training pairs: the plain average, Nadaraya-Watson with w = 1 and with a learned w."""
    generator = torch.Generator().manual_seed(seed)
    x_train = torch.sort(torch.rand(n_train, generator=generator) * 5).values
    y_train = true_function(x_train) + 0.5 * torch.randn(n_train, generator=generator)
    x_test = torch.arange(0, 5, 0.1)
    fixed, fixed_weights = kernel_attention(x_test, x_train, y_train, torch.tensor(1.0))
    bandwidth = fit_bandwidth(x_train, y_train, steps=steps)
    learned, learned_weights = kernel_attention(x_test, x_train, y_train, bandwidth)
    y_true = true_function(x_test)

    def mse(prediction: Tensor) -> float:
        return float(((prediction - y_true) ** 2).mean())

    return {"x_train": x_train, "y_train": y_train, "x_test": x_test, "y_true": y_true, "bandwidth": float(bandwidth),
            "average": y_train.mean().expand_as(x_test), "fixed": fixed, "learned": learned,
            "fixed_weights": fixed_weights, "learned_weights": learned_weights,
            "mse": {"average": mse(y_train.mean().expand_as(x_test)), "fixed": mse(fixed), "learned": mse(learned)},
            "max weight": {"average": 1 / n_train, "fixed": float(fixed_weights.max(-1).values.mean()),
                           "learned": float(learned_weights.max(-1).values.mean())}}


@experiment(
    "kernel-regression",
    claim="Nadaraya-Watson kernel regression is attention: softmax of negative squared distances over training "
    "inputs (keys) weighs their targets (values); it fits a curve the plain average cannot, and a learned "
    "bandwidth sharpens the weights",
    lecture="Attention & Transformers: non-Transformer examples, Nadaraya-Watson kernel regression",
    default_seeds=lambda budget: 2 * SEEDS[budget],  # draws of the training pairs are cheap
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    n_train = {"tiny": 20, "small": 50, "full": 100}[budget]
    steps = {"tiny": 20, "small": 300, "full": 1000}[budget]
    fits = []
    for seed in range(seeds):
        progress.phase(f"fitting draw {seed + 1} of {seeds} ({n_train} training pairs, {steps} bandwidth steps)")
        fits.append(fit(n_train, steps, seed))
    methods = {"average": "plain average (no attention)", "fixed": "Nadaraya-Watson, w = 1",
               "learned": "Nadaraya-Watson, learned w"}
    rows = [{"method": label, "bandwidth": {"average": None, "fixed": 1.0}.get(key, statistics.fmean(
                f["bandwidth"] for f in fits)),
             "test MSE": statistics.fmean(f["mse"][key] for f in fits),
             "mean max weight": statistics.fmean(f["max weight"][key] for f in fits)} for key, label in methods.items()]
    checks = [
        Check.over("the plain average's test MSE minus attention's (w = 1)",
                   [f["mse"]["average"] - f["mse"]["fixed"] for f in fits], unit="draws of the data"),
        Check.over("the learned bandwidth's mean largest weight minus w = 1's",
                   [f["max weight"]["learned"] - f["max weight"]["fixed"] for f in fits], unit="draws of the data"),
    ]

    first = fits[0]  # the pictures: the first draw
    fig, ax = new_figure(7, 4)
    ax.plot(first["x_test"], first["y_true"], label="truth", color="black")
    ax.plot(first["x_test"], first["average"], label="plain average", linestyle=":")
    ax.plot(first["x_test"], first["fixed"], label="attention, w = 1")
    ax.plot(first["x_test"], first["learned"], label=f"attention, learned w = {first['bandwidth']:.2f}")
    ax.scatter(first["x_train"], first["y_train"], s=12, alpha=0.5, label="training pairs (keys, values)")
    ax.set(xlabel="x (query)", ylabel="y", title="Nadaraya-Watson regression as attention (first draw)")
    ax.legend(fontsize=8)
    save(fig, out / "fit.png")

    fig, axes = new_figure(10, 4, ncols=2)
    for ax, weights, title in ((axes[0], first["fixed_weights"], "w = 1"),
                               (axes[1], first["learned_weights"], "learned w")):
        heatmap_axes(ax, weights, title=f"attention weights, {title}", xlabel="training point (key), sorted by x",
                     ylabel="test point (query), by x")
    save(fig, out / "weights.png")

    reason = (f"over {seeds} draws of {n_train} noisy pairs, mean test MSE {rows[0]['test MSE']:.3f} for the plain "
              f"average, {rows[1]['test MSE']:.3f} for attention with w = 1 and {rows[2]['test MSE']:.3f} with the "
              f"learned w (mean {rows[2]['bandwidth']:.2f}); mean largest weight {rows[2]['mean max weight']:.2f} "
              f"learned vs {rows[1]['mean max weight']:.2f} at w = 1")
    key = f"MSE {rows[0]['test MSE']:.2f} (average) -> {rows[1]['test MSE']:.2f} (attention) -> " \
          f"{rows[2]['test MSE']:.2f} (learned w)"
    return Result(checks, reason, key, rows, ["fit.png", "weights.png"])
