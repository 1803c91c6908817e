"""Pre-norm trains deep stacks without warmup; post-norm does not (Xiong et al. 2020; lecture: "Add & Norm").

Post-norm (Vaswani et al. 2017) normalises after each residual sum; pre-norm (GPT-2, Llama) normalises inside the
branch and keeps an identity path from the output to the input. Xiong et al. show that at initialisation post-norm's
expected gradients grow toward the output layers, so a full learning rate from step one derails it, the more so the
deeper the stack and the higher the rate; pre-norm trains well without warmup.

Their analysis assumes the original initialisation, under which every sublayer's output is as large as its input:
Xavier-uniform weights and embeddings of unit scale (`paper_init`). attnkit's default (GPT-2's: N(0, 0.02) weights,
residual projections shrunk by 1/sqrt(2N), embeddings of std 0.02) makes the branches small at initialisation, so a
post-norm stack starts close to the identity: the paper's effect does not show under it, and a post-norm stack's
first norm then divides embeddings of std 0.02, which makes the first block's gradient the largest. This experiment
runs in the paper's setting: `paper_init`, Adam(W) at a learning rate where post-norm's failure shows, no clipping,
and either no warmup or a linear warmup over the first fifth of the steps.

Each depth trains character models with both placements, with and without warmup, over several seeds; the table
gives the final validation loss (mean over seeds; a diverged run counts as
a model that learned nothing, ln V) and each block's gradient norm at initialisation,
and the plots the loss curves, the gradient norm per block and the loss by depth.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import statistics
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from matplotlib import ticker
from torch import nn

from attnkit.config import ModelConfig
from attnkit.experiments.arms import Arms
from attnkit.experiments.base import Check, Progress, Result, experiment
from attnkit.experiments.lm_runs import Corpus, char_corpus, initial_model, train_lm
from attnkit.experiments.plots import fit_value_axis, new_figure, running_mean, save, series, spread_legend
from attnkit.models.attention_capture import transformer_blocks

WIDTH, SEQ_LEN, BATCH = 64, 64, 16
SETTINGS = {  # depths, steps, learning rate, corpus bytes
    "tiny": dict(depths=[1, 2], steps=4, lr=1e-3, corpus=20_000),
    "small": dict(depths=[2, 6], steps=150, lr=1e-3, corpus=300_000),
    "full": dict(depths=[2, 12], steps=100, lr=1e-3, corpus=1_000_000),  # 12 layers: post-norm's failure shows
}
INIT_BATCHES = 8  # batches the gradient at initialisation is averaged over


def paper_init(model: nn.Module) -> None:
    """The original Transformer's initialisation, as Xiong et al. analyse it: Xavier-uniform weights, zero biases,
    token embeddings N(0, 1/C) (multiplied by sqrt(C) in the forward pass: unit scale), norms at gain 1, and no
    shrinking of the residual projections. Embeddings come last: a tied output layer keeps the embedding's init."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
    for module in model.modules():
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=module.embedding_dim**-0.5)


def config(depth: int, placement: str) -> ModelConfig:
    return ModelConfig(family="decoder", d_model=WIDTH, n_heads=4, n_layers=depth, d_ff=4 * WIDTH, position="rope",
                       norm_position=placement, max_seq_len=SEQ_LEN, scale_embeddings=True)


def gradients_at_init(model: nn.Module, corpus: Corpus, *, seed: int) -> list[float]:
    """Each block's feed-forward weight gradient norm (W1 and W2 together: Xiong et al.'s W^FFN) at initialisation,
    averaged over INIT_BATCHES batches with no update between them; first block first. Before any clipping."""
    generator = torch.Generator().manual_seed(seed)
    blocks = [block.module for block in transformer_blocks(model)]
    totals = [0.0] * len(blocks)
    model.train()
    for _ in range(INIT_BATCHES):
        x, y = corpus.data.sample_batch("train", BATCH, SEQ_LEN, generator)  # (B, T), (B, T)
        model.zero_grad(set_to_none=True)
        model(x, labels=y, return_logits=False).loss.backward()
        for index, block in enumerate(blocks):
            weights = [p.grad for name, p in block.mlp.named_parameters() if name.endswith("weight")]
            totals[index] += float(torch.nn.utils.get_total_norm(weights)) / INIT_BATCHES
    model.zero_grad(set_to_none=True)
    return totals


@dataclass
class SeedRuns:
    """One seed's share of the experiment: val loss, training curve and whether it diverged per (depth, placement,
    schedule), and the FFN gradient per block at initialisation per (depth, placement[, "GPT-2 init"])."""

    seed: int
    losses: dict[tuple, float] = field(default_factory=dict)
    curves: dict[tuple, list[float]] = field(default_factory=dict)
    diverged: dict[tuple, bool] = field(default_factory=dict)
    grads: dict[tuple, list[float]] = field(default_factory=dict)


def run_seed(seed: int, placement: str, *, budget: str, progress: Progress | None = None) -> SeedRuns:
    """Every depth and schedule of the budget with one seed and one placement (a worker process runs one)."""
    s = SETTINGS[budget]
    progress = progress or Progress()
    corpus = char_corpus(s["corpus"])
    runs = SeedRuns(seed)
    for depth in s["depths"]:
        for init, key in ((paper_init, (depth, placement)), (None, (depth, placement, "GPT-2 init"))):
            model = initial_model(config(depth, placement), corpus, seed)
            if init is not None:
                init(model)
            runs.grads[key] = gradients_at_init(model, corpus, seed=seed)
        for label, warmup in warmups(s["steps"]).items():
            desc = f"{depth} layers, {placement}-norm, {label}, seed {seed}"
            progress.phase(f"training {desc}")
            log = train_lm(config(depth, placement), corpus, steps=s["steps"], seq_len=SEQ_LEN, batch_size=BATCH,
                           lr=s["lr"], warmup=warmup, clip=0.0, seed=seed, init=paper_init, progress=progress,
                           desc=desc)
            # a diverged run counts as a model that learned nothing
            runs.losses[(depth, placement, label)] = math.log(corpus.vocab_size) if log.diverged else log.val_loss
            runs.diverged[(depth, placement, label)] = log.diverged
            runs.curves[(depth, placement, label)] = log.losses
    return runs


def run_seed_in_worker(seed: int, placement: str, *, budget: str, arms: Arms | None) -> tuple[SeedRuns, Arms | None]:
    """`run_seed` in a worker process, with the worker's copy of the run's arms, which holds the arms it reused and
    ran: the run adds them to its own (`Arms.merge_worker`) for its summary of what it reused."""
    return run_seed(seed, placement, budget=budget, progress=Progress(arms=arms)), arms


def warmups(steps: int) -> dict[str, int]:
    return {"no warmup": 0, "warmup": max(steps // 5, 1)}


def _worker_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")


@experiment(
    "norm-placement",
    claim="pre-norm trains well without warmup; post-norm without warmup trains worse than pre-norm, more so as "
    "depth grows, and warmup helps it more; at initialisation post-norm's gradients grow toward the output",
    lecture="Add & Norm: residual connections and LayerNorm placement (Xiong et al. 2020)",
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    s = SETTINGS[budget]
    depths, steps, lr = s["depths"], s["steps"], s["lr"]
    jobs = [(seed, placement) for seed in range(seeds) for placement in ("pre", "post")]
    if budget == "tiny":
        parts = [run_seed(seed, placement, budget=budget, progress=progress) for seed, placement in jobs]
    else:  # the (seed, placement) pairs are independent: one process each (their progress lines interleave)
        progress.phase(f"{len(jobs)} processes, one per seed and placement, {len(depths) * 2} training runs each")
        with ProcessPoolExecutor(len(jobs), mp_context=multiprocessing.get_context("spawn"),
                                 initializer=_worker_logging) as pool:
            # each worker keeps its arms where this run keeps them (their names differ by seed and placement)
            each = partial(run_seed_in_worker, budget=budget, arms=progress.arms)
            parts = []
            for part, arms in pool.map(each, *zip(*jobs, strict=True)):
                parts.append(part)
                if progress.arms is not None:
                    progress.arms.merge_worker(arms)
    per_seed = [SeedRuns(seed) for seed in range(seeds)]
    for part in parts:
        for field_name in ("losses", "curves", "diverged", "grads"):
            getattr(per_seed[part.seed], field_name).update(getattr(part, field_name))
    losses = {key: [runs.losses[key] for runs in per_seed] for key in sorted(per_seed[0].losses)}
    diverged = {key: sum(runs.diverged[key] for runs in per_seed) for key in per_seed[0].diverged}
    curves = per_seed[0].curves
    grads = {key: [runs.grads[key] for runs in per_seed] for key in per_seed[0].grads}

    def mean_grads(depth: int, placement: str, *init: str) -> list[float]:
        return [statistics.fmean(column) for column in zip(*grads[(depth, placement, *init)], strict=True)]

    rows = []
    for (depth, placement, label), values in losses.items():
        norms, default = mean_grads(depth, placement), mean_grads(depth, placement, "GPT-2 init")
        rows.append({"layers": depth, "norm": placement, "schedule": label, "val loss": statistics.fmean(values),
                     "seed spread": statistics.stdev(values), "diverged": diverged[(depth, placement, label)],
                     "FFN grad norm at init, first block": norms[0], "last block": norms[-1],
                     "same, GPT-2 init: first": default[0], "last": default[-1]})

    deep, shallow = depths[-1], depths[0]

    def per_seed(depth: int, placement: str, label: str) -> list[float]:
        return losses[(depth, placement, label)]

    def gap(depth: int) -> list[float]:  # post-norm's loss above pre-norm's, both without warmup, per seed
        return [post - pre for post, pre in zip(per_seed(depth, "post", "no warmup"),
                                                 per_seed(depth, "pre", "no warmup"), strict=True)]

    def warmup_gain(placement: str) -> list[float]:
        return [no - yes for no, yes in zip(per_seed(deep, placement, "no warmup"), per_seed(deep, placement, "warmup"),
                                            strict=True)]

    checks = [
        Check.over(f"post-norm's validation loss minus pre-norm's, no warmup, {deep} layers (nats)", gap(deep)),
        Check.over(f"warmup helps post-norm: its loss without warmup minus with, {deep} layers (nats)",
                   warmup_gain("post")),
        Check.over(f"what warmup gains post-norm minus what it gains pre-norm, {deep} layers (nats)",
                   [post - pre for post, pre in zip(warmup_gain("post"), warmup_gain("pre"), strict=True)]),
        Check.over(f"post-norm's gap to pre-norm without warmup at {deep} layers minus at {shallow} (nats)",
                   [d - s for d, s in zip(gap(deep), gap(shallow), strict=True)]),
        Check.over(f"post-norm's FFN gradient at initialisation, last block over first, {deep} layers (log ratio)",
                   [math.log(seed_norms[-1] / seed_norms[0]) for seed_norms in grads[(deep, "post")]]),
    ]

    fig, axes = new_figure(10, 12, nrows=3)  # one panel per row: each as wide as the page shows it
    for (depth, placement, label), curve in curves.items():
        if depth == deep:
            axes[0].plot(range(1, len(curve) + 1), running_mean(curve), label=f"{placement}-norm, {label}")
    axes[0].set(xlabel="step", ylabel="training loss (mean of 10 steps)",
                title=f"{deep} layers, lr {lr:g}, no clipping (seed 0)")
    fit_value_axis(axes[0], "level")
    axes[0].legend(loc="upper left", bbox_to_anchor=(1.01, 1))
    for placement, colour in (("pre", "tab:blue"), ("post", "tab:orange")):
        for init, style in (((), "-"), (("GPT-2 init",), ":")):
            blocks = range(1, deep + 1)
            by_block = [list(block) for block in zip(*grads[(deep, placement, *init)], strict=True)]  # per seed
            label = f"{placement}-norm" + (", attnkit's default (GPT-2) init" if init else "")
            spread = series(axes[1], blocks, mean_grads(deep, placement, *init), seeds=by_block, color=colour,
                            linestyle=style, marker="" if init else "o", label=label)
    axes[1].set(xlabel="block (1 = nearest the input)", ylabel="FFN weight gradient norm",
                title="gradient per block at initialisation")
    for ax in axes[:2]:  # steps and blocks are counted: whole numbers on the axis
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    fit_value_axis(axes[1], "log")
    spread_legend(axes[1], over=f"mean of {seeds} seeds", spread=spread, loc="upper left",
                  bbox_to_anchor=(1.01, 1))  # beside the panel: every part of it holds a line
    for placement in ("pre", "post"):
        for label, style in (("no warmup", "-"), ("warmup", "--")):
            spread = series(axes[2], depths, [statistics.fmean(per_seed(d, placement, label)) for d in depths],
                            seeds=[per_seed(d, placement, label) for d in depths], linestyle=style,
                            label=f"{placement}-norm, {label}")
    axes[2].set(xlabel="layers", ylabel="validation loss (nats/char)", title=f"after {steps} steps")
    axes[2].set_xticks(depths, [str(d) for d in depths])
    fit_value_axis(axes[2], "level")
    spread_legend(axes[2], over=f"mean of {seeds} seeds", spread=spread, loc="upper left", bbox_to_anchor=(1.01, 1))
    save(fig, out / "norm_placement.png")

    def mean(depth: int, placement: str, label: str) -> float:
        return statistics.fmean(per_seed(depth, placement, label))

    reason = (f"at {deep} layers, lr {lr:g}, paper initialisation, validation loss after {steps} steps (mean of "
              f"{seeds} seeds; a diverged run counts as ln V): without warmup pre-norm "
              f"{mean(deep, 'pre', 'no warmup'):.3f}, "
              f"post-norm {mean(deep, 'post', 'no warmup'):.3f}; with warmup pre {mean(deep, 'pre', 'warmup'):.3f}, "
              f"post {mean(deep, 'post', 'warmup'):.3f}; post-norm's FFN gradient at initialisation is "
              f"{mean_grads(deep, 'post')[-1] / mean_grads(deep, 'post')[0]:.2f}x as large at the last block as at "
              f"the first (pre-norm {mean_grads(deep, 'pre')[-1] / mean_grads(deep, 'pre')[0]:.2f}x; under attnkit's "
              f"default GPT-2 init, post-norm "
              f"{mean_grads(deep, 'post', 'GPT-2 init')[-1] / mean_grads(deep, 'post', 'GPT-2 init')[0]:.2f}x)")
    key = (f"{deep} layers without warmup: post-norm {mean(deep, 'post', 'no warmup'):.2f} vs pre-norm "
           f"{mean(deep, 'pre', 'no warmup'):.2f}")
    return Result(checks, reason, key, rows, ["norm_placement.png"])
