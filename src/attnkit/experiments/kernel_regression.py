"""Nadaraya-Watson kernel regression is attention (lecture: "Attention & Transformers", the soft lookup).

To predict y at a query x, weigh every training pair (x_i, y_i) by how close x_i is to x and average the y_i:

    f(x) = sum_i softmax_i(-(x - x_i)^2 w^2 / 2) y_i        queries: x, keys: x_i, values: y_i

The Gaussian kernel's softmax is attention's: -(x - x_i)^2 / 2 = x x_i - x_i^2 / 2 - x^2 / 2, and the last term is
the same for every key, so it is a dot-product score plus a per-key bias. With w = 1 the method has no parameters
(Nadaraya 1964, Watson 1964); a learned bandwidth w makes it the simplest trainable attention (d2l.ai 11.2), fitted
here by leave-one-out: each training point queries the others.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor

from attnkit.experiments.base import Result, experiment
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


@experiment(
    "kernel-regression",
    claim="Nadaraya-Watson kernel regression is attention: softmax of negative squared distances over training "
    "inputs (keys) weighs their targets (values); it fits a curve the plain average cannot, and a learned "
    "bandwidth sharpens the weights",
    lecture="Attention & Transformers: non-Transformer examples, Nadaraya-Watson kernel regression",
)
def run(budget: str, out: Path) -> Result:
    n_train = {"tiny": 20, "small": 50, "full": 100}[budget]
    steps = {"tiny": 20, "small": 300, "full": 1000}[budget]
    generator = torch.Generator().manual_seed(0)
    x_train = torch.sort(torch.rand(n_train, generator=generator) * 5).values
    y_train = true_function(x_train) + 0.5 * torch.randn(n_train, generator=generator)
    x_test = torch.arange(0, 5, 0.1)
    y_true = true_function(x_test)

    fixed, fixed_weights = kernel_attention(x_test, x_train, y_train, torch.tensor(1.0))
    bandwidth = fit_bandwidth(x_train, y_train, steps=steps)
    learned, learned_weights = kernel_attention(x_test, x_train, y_train, bandwidth)
    average = y_train.mean().expand_as(x_test)

    def mse(prediction: Tensor) -> float:
        return float(((prediction - y_true) ** 2).mean())

    rows = [
        {"method": "plain average (no attention)", "bandwidth": None, "test MSE": mse(average),
         "mean max weight": 1 / n_train},
        {"method": "Nadaraya-Watson, w = 1", "bandwidth": 1.0, "test MSE": mse(fixed),
         "mean max weight": float(fixed_weights.max(-1).values.mean())},
        {"method": "Nadaraya-Watson, learned w", "bandwidth": float(bandwidth), "test MSE": mse(learned),
         "mean max weight": float(learned_weights.max(-1).values.mean())},
    ]

    fig, ax = new_figure(7, 4)
    ax.plot(x_test, y_true, label="truth", color="black")
    ax.plot(x_test, average, label="plain average", linestyle=":")
    ax.plot(x_test, fixed, label="attention, w = 1")
    ax.plot(x_test, learned, label=f"attention, learned w = {float(bandwidth):.2f}")
    ax.scatter(x_train, y_train, s=12, alpha=0.5, label="training pairs (keys, values)")
    ax.set(xlabel="x (query)", ylabel="y", title="Nadaraya-Watson regression as attention")
    ax.legend(fontsize=8)
    save(fig, out / "fit.png")

    fig, axes = new_figure(10, 4, ncols=2)
    for ax, weights, title in ((axes[0], fixed_weights, "w = 1"), (axes[1], learned_weights, "learned w")):
        heatmap_axes(ax, weights, title=f"attention weights, {title}", xlabel="training point (key), sorted by x",
                     ylabel="test point (query), by x")
    save(fig, out / "weights.png")

    beats_average = rows[1]["test MSE"] < rows[0]["test MSE"] / 2
    sharper = rows[2]["mean max weight"] > rows[1]["mean max weight"]
    verdict = "held" if beats_average and sharper else ("mixed" if beats_average or sharper else
                                                         "did not hold at this scale")
    reason = (f"test MSE {rows[0]['test MSE']:.3f} for the plain average, {rows[1]['test MSE']:.3f} for attention "
              f"with w = 1 and {rows[2]['test MSE']:.3f} with the learned w = {float(bandwidth):.2f}, whose weights "
              f"are {'sharper' if sharper else 'not sharper'} (mean max weight {rows[2]['mean max weight']:.2f} vs "
              f"{rows[1]['mean max weight']:.2f})")
    key = f"MSE {rows[0]['test MSE']:.2f} (average) -> {rows[1]['test MSE']:.2f} (attention) -> " \
          f"{rows[2]['test MSE']:.2f} (learned w)"
    return Result(verdict, reason, key, rows, ["fit.png", "weights.png"])
