"""Four attention scores in the same block (lecture: "Attention Score Functions").

    dot         q . k                      no parameters
    scaled_dot  q . k / sqrt(D)            no parameters; the fused kernels' score
    bilinear    q^T W k                    D^2 parameters per layer
    additive    w^T tanh(W1 q + W2 k)      an MLP over every (query, key) pair: a (T, S, A) tensor per head

The same small character decoder is trained with each score for the same number of steps; the table gives the
validation loss and the time per training step.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from matplotlib import ticker

from attnkit.config import ModelConfig
from attnkit.experiments.base import Check, Progress, Result, experiment
from attnkit.experiments.lm_runs import char_corpus, train_lm
from attnkit.experiments.plots import draw_spread, fit_value_axis, new_figure, running_mean, save, spread_legend
from attnkit.models import count_parameters

SCORES = ("dot", "scaled_dot", "bilinear", "additive")


@experiment(
    "score-functions",
    claim="dot, scaled dot, bilinear and additive scores all learn; the additive (Bahdanau) score costs the most "
    "time (an MLP over every query-key pair), and scaled dot learns as well as the best of them",
    lecture="Attention Score Functions (Luong et al. 2015; Bahdanau et al. 2015; Vaswani et al. 2017)",
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    steps = {"tiny": 3, "small": 200, "full": 800}[budget]
    corpus = char_corpus({"tiny": 20_000, "small": 300_000, "full": 1_000_000}[budget])
    runs: dict[str, list] = {score: [] for score in SCORES}  # per seed: (val loss, ms per step)
    curves, parameters = {}, {}
    for seed in range(seeds):
        for score in SCORES:  # the scores take turns, so load from other work falls on all of them alike
            config = ModelConfig(family="decoder", d_model=64, n_heads=4, n_layers=2, d_ff=256, score=score,
                                 position="rope", max_seq_len=64, vocab_size=corpus.vocab_size)
            desc = f"{score} score, seed {seed}"
            progress.phase(f"training {desc}")
            log = train_lm(config, corpus, steps=steps, seq_len=64, lr=3e-3, seed=seed, progress=progress, desc=desc)
            runs[score].append((log.val_loss, log.median_step_ms))
            curves.setdefault(score, log.losses)
            parameters[score] = count_parameters(config)
    rows = [{"score": score, "parameters": parameters[score],
             "val loss": statistics.fmean(loss for loss, _ in runs[score]),
             "ms per step": statistics.fmean(ms for _, ms in runs[score])} for score in SCORES]

    fig, axes = new_figure(11, 3.6, ncols=2)
    for score, losses in curves.items():
        axes[0].plot(range(1, len(losses) + 1), running_mean(losses, window=25), label=score)
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
    frequencies = corpus.unigram_loss()  # learning only how often each character occurs is not learning to attend
    checks = [
        Check.over("additive's ms per step minus the slowest other score's",
                   [additive - max(rest) for additive, *rest in zip(per_seed("additive", 1),
                                                                     *(per_seed(s, 1) for s in others), strict=True)]),
        Check.over("scaled dot's validation loss within 0.1 nats of the best score's: 0.1 minus the gap",
                   [0.1 - (scaled - low) for scaled, low in zip(per_seed("scaled_dot", 0), best, strict=True)]),
        Check.over("every score learns more than how often each character occurs: the unigram model's validation "
                   "loss minus the worst score's (nats)",
                   [frequencies - max(losses) for losses in zip(*(per_seed(s, 0) for s in SCORES), strict=True)]),
    ]
    reason = (f"mean of {seeds} seeds: validation loss " + ", ".join(f"{r['score']} {r['val loss']:.3f}" for r in rows)
              + f" (character frequencies alone: {frequencies:.3f})"
              + "; ms per step " + ", ".join(f"{r['score']} {r['ms per step']:.0f}" for r in rows))
    by_score = {r["score"]: r for r in rows}
    key = (f"additive {by_score['additive']['ms per step'] / by_score['scaled_dot']['ms per step']:.1f}x the time of "
           f"scaled dot per step")
    return Result(checks, reason, key, rows, ["scores.png"])
