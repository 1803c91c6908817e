"""Pre-norm trains deep stacks without warmup; post-norm needs it (Xiong et al. 2020; lecture: "Add & Norm").

Post-norm (Vaswani et al. 2017) normalises after each residual sum, so at initialisation the gradients of the
last layers are large and a full learning rate from step one can derail training; the learning-rate warmup is
what makes it work. Pre-norm (GPT-2, Llama) normalises inside the branch, keeps an identity path from output to
input, and its gradient norms are nearly the same at every depth.

Each depth trains a character model with both placements, with and without warmup, at one learning rate; the
table gives the final validation loss (nan: diverged) and the gradient norm of the first and last block over the
first steps, and the plots the loss curves and the per-block gradient norms at the greatest depth.
"""

from __future__ import annotations

import math
from pathlib import Path

from attnkit.config import ModelConfig
from attnkit.experiments.base import Result, experiment
from attnkit.experiments.lm_runs import char_corpus, train_lm
from attnkit.experiments.plots import new_figure, running_mean, save


@experiment(
    "norm-placement",
    claim="pre-norm trains well at any depth with or without warmup; post-norm needs warmup, and more so as depth "
    "grows (its gradients are largest near the output at initialisation)",
    lecture="Add & Norm: residual connections and LayerNorm placement (Xiong et al. 2020)",
)
def run(budget: str, out: Path) -> Result:
    depths = {"tiny": [2], "small": [2, 6, 12], "full": [2, 6, 12, 24]}[budget]
    steps = {"tiny": 4, "small": 150, "full": 500}[budget]
    warmups = {"no warmup": 0, "warmup": max(steps // 5, 1)}
    corpus = char_corpus({"tiny": 20_000, "small": 300_000, "full": 1_000_000}[budget])
    rows, logs = [], {}
    for depth in depths:
        for placement in ("pre", "post"):
            for label, warmup in warmups.items():
                config = ModelConfig(family="decoder", d_model=64, n_heads=4, n_layers=depth, d_ff=256,
                                     position="rope", norm_position=placement, max_seq_len=64)
                log = train_lm(config, corpus, steps=steps, seq_len=64, lr=3e-3, warmup=warmup, clip=0.0,
                               grad_norm_steps=min(5, steps))
                logs[(depth, placement, label)] = log
                rows.append({"layers": depth, "norm": placement, "schedule": label, "val loss": log.val_loss,
                             "diverged": log.diverged, "grad norm, first block": log.layer_grad_norms[0],
                             "grad norm, last block": log.layer_grad_norms[-1]})

    deepest = depths[-1]
    fig, axes = new_figure(11, 3.8, ncols=2)
    for (depth, placement, label), log in logs.items():
        if depth == deepest:
            axes[0].plot(running_mean(log.losses), label=f"{placement}-norm, {label}")
    axes[0].set(xlabel="step", ylabel="training loss (smoothed)", title=f"{deepest} layers, lr 3e-3, no clipping")
    axes[0].legend(fontsize=8)
    for placement in ("pre", "post"):
        norms = logs[(deepest, placement, "no warmup")].layer_grad_norms
        axes[1].plot(range(1, len(norms) + 1), norms, marker="o", label=f"{placement}-norm")
    axes[1].set(xlabel="block (1 = nearest the input)", ylabel="gradient norm, first steps", yscale="log",
                title="gradient norm per block at initialisation")
    axes[1].legend()
    save(fig, out / "norm_placement.png")

    def loss(depth: int, placement: str, label: str) -> float:
        value = logs[(depth, placement, label)].val_loss
        return math.inf if math.isnan(value) else value

    pre_fine = loss(deepest, "pre", "no warmup") <= loss(deepest, "pre", "warmup") + 0.1
    post_needs_warmup = loss(deepest, "post", "no warmup") > loss(deepest, "post", "warmup") + 0.05
    pre_beats_post = loss(deepest, "pre", "no warmup") < loss(deepest, "post", "no warmup")
    held = [pre_fine, post_needs_warmup, pre_beats_post]
    verdict = "held" if all(held) else ("did not hold at this scale" if not any(held) else "mixed")
    reason = (f"at {deepest} layers without warmup: pre-norm {loss(deepest, 'pre', 'no warmup'):.3f}, post-norm "
              f"{loss(deepest, 'post', 'no warmup'):.3f}; with warmup: pre {loss(deepest, 'pre', 'warmup'):.3f}, "
              f"post {loss(deepest, 'post', 'warmup'):.3f} (validation loss after {steps} steps, inf = diverged)")
    key = (f"post-norm {loss(deepest, 'post', 'no warmup'):.2f} without warmup vs {loss(deepest, 'post', 'warmup'):.2f}"
           f" with, at {deepest} layers")
    return Result(verdict, reason, key, rows, ["norm_placement.png"])
