"""Four attention scores in the same block (lecture: "Attention Score Functions").

    dot         q . k                      no parameters
    scaled_dot  q . k / sqrt(D)            no parameters; the fused kernels' score
    bilinear    q^T W k                    D^2 parameters per layer
    additive    w^T tanh(W1 q + W2 k)      an MLP over every (query, key) pair: a (T, S, A) tensor per head

The same small character decoder is trained with each score for the same number of steps; the table gives the
validation loss and the time per training step. The yardstick of "learns" is the same block with its attention
output held at zero, trained with the same steps and seeds: it reads the current character alone (a bigram model),
so a score that does no better has not learned to attend.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import torch
from matplotlib import ticker
from torch import nn

from attnkit.config import ModelConfig
from attnkit.experiments.base import Check, Progress, Result, experiment
from attnkit.experiments.lm_runs import char_corpus, train_lm
from attnkit.experiments.plots import draw_spread, fit_value_axis, new_figure, running_mean, save, spread_legend
from attnkit.models import count_parameters

SCORES = ("dot", "scaled_dot", "bilinear", "additive")
STEPS = {"tiny": 3, "small": 200, "full": 800}


@torch.no_grad()
def without_attention(model: nn.Module) -> None:
    """Hold every attention layer's output at zero (o_proj zeroed and frozen): the block then reads the current
    token alone, since nothing else reaches its residual stream."""
    for name, module in model.named_modules():
        if name.endswith("o_proj"):
            for parameter in module.parameters():
                parameter.zero_()
                parameter.requires_grad_(False)


@experiment(
    "score-functions",
    claim="dot, scaled dot, bilinear and additive scores all learn; the additive (Bahdanau) score costs the most "
    "time (an MLP over every query-key pair), and scaled dot learns as well as the best of them",
    lecture="Attention Score Functions (Luong et al. 2015; Bahdanau et al. 2015; Vaswani et al. 2017)",
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    steps = STEPS[budget]
    corpus = char_corpus({"tiny": 20_000, "small": 300_000, "full": 1_000_000}[budget])
    runs: dict[str, list] = {score: [] for score in SCORES}  # per seed: (val loss, ms per step)
    curves, parameters, unattended = {}, {}, []  # unattended: per seed, the block without attention's val loss
    block = ModelConfig(family="decoder", d_model=64, n_heads=4, n_layers=2, d_ff=256, score="dot",
                        position="rope", max_seq_len=64, vocab_size=corpus.vocab_size)  # each score replaces "dot"
    for seed in range(seeds):
        for score in SCORES:  # the scores take turns, so load from other work falls on all of them alike
            config = block.replace(score=score)
            desc = f"{score} score, seed {seed}"
            progress.phase(f"training {desc}")
            log = train_lm(config, corpus, steps=steps, seq_len=64, lr=3e-3, seed=seed, progress=progress, desc=desc)
            runs[score].append((log.val_loss, log.median_step_ms))
            curves.setdefault(score, log.losses)
            parameters[score] = count_parameters(config)
        desc = f"no attention, seed {seed}"
        progress.phase(f"training {desc}")
        log = train_lm(block, corpus, steps=steps, seq_len=64, lr=3e-3, seed=seed,
                       init=without_attention, progress=progress, desc=desc)
        unattended.append(log.val_loss)
        curves.setdefault("no attention", log.losses)
    rows = [{"score": score, "parameters": parameters[score],
             "val loss": statistics.fmean(loss for loss, _ in runs[score]),
             "ms per step": statistics.fmean(ms for _, ms in runs[score])} for score in SCORES]

    fig, axes = new_figure(11, 3.6, ncols=2)
    for score, losses in curves.items():
        axes[0].plot(range(1, len(losses) + 1), running_mean(losses, window=25), label=score,
                     **({"linestyle": "--", "color": "grey"} if score == "no attention" else {}))
    axes[0].set(xlabel="step", ylabel="training loss (mean of 25 steps)", title="same block, four scores (seed 0)")
    axes[0].xaxis.set_major_locator(ticker.MaxNLocator(integer=True))  # steps are counted from 1
    fit_value_axis(axes[0], "level")
    axes[0].legend()
    names = [r["score"] for r in rows]
    bars = axes[1].bar(names, [r["ms per step"] for r in rows], label="mean")
    spread = draw_spread(axes[1], names, [r["ms per step"] for r in rows], colour="black",
                         seeds=[[ms for _, ms in runs[score]] for score in names])
    axes[1].set(ylabel="ms per training step", title="cost of a step")
    fit_value_axis(axes[1], "from zero")
    spread_legend(axes[1], over=f"mean of {seeds} seeds", spread=spread, handles=[bars], loc="upper left")
    save(fig, out / "scores.png")

    def per_seed(score: str, index: int) -> list[float]:
        return [run[index] for run in runs[score]]

    others = [score for score in SCORES if score != "additive"]
    best = [min(losses) for losses in zip(*(per_seed(score, 0) for score in SCORES), strict=True)]
    checks = [
        Check.over("additive's ms per step minus the slowest other score's",
                   [additive - max(rest) for additive, *rest in zip(per_seed("additive", 1),
                                                                     *(per_seed(s, 1) for s in others), strict=True)]),
        Check.over("scaled dot's validation loss within 0.1 nats of the best score's: 0.1 minus the gap",
                   [0.1 - (scaled - low) for scaled, low in zip(per_seed("scaled_dot", 0), best, strict=True)]),
        Check.over("every score learns to attend: the validation loss of the block with attention's output held at "
                   "zero minus the worst score's (nats)",
                   [alone - max(losses) for alone, *losses in zip(unattended, *(per_seed(s, 0) for s in SCORES),
                                                                   strict=True)]),
    ]
    reason = (f"mean of {seeds} seeds: validation loss " + ", ".join(f"{r['score']} {r['val loss']:.3f}" for r in rows)
              + f" (the block without attention, reading the current character alone: "
                f"{statistics.fmean(unattended):.3f})"
              + "; ms per step " + ", ".join(f"{r['score']} {r['ms per step']:.0f}" for r in rows))
    by_score = {r["score"]: r for r in rows}
    key = (f"additive {by_score['additive']['ms per step'] / by_score['scaled_dot']['ms per step']:.1f}x the time of "
           f"scaled dot per step")
    return Result(checks, reason, key, rows, ["scores.png"])
