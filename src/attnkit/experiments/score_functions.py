"""Four attention scores in the same block (lecture: "Attention Score Functions").

    dot         q . k                      no parameters
    scaled_dot  q . k / sqrt(D)            no parameters; the fused kernels' score
    bilinear    q^T W k                    D^2 parameters per layer
    additive    w^T tanh(W1 q + W2 k)      an MLP over every (query, key) pair: a (T, S, A) tensor per head

The same small character decoder is trained with each score for the same number of steps; the table gives the
validation loss and the time per training step.
"""

from __future__ import annotations

from pathlib import Path

from attnkit.config import ModelConfig
from attnkit.experiments.base import Result, experiment
from attnkit.experiments.lm_runs import char_corpus, train_lm
from attnkit.experiments.plots import new_figure, running_mean, save
from attnkit.models import count_parameters

SCORES = ("dot", "scaled_dot", "bilinear", "additive")


@experiment(
    "score-functions",
    claim="dot, scaled dot, bilinear and additive scores all learn; the additive (Bahdanau) score costs the most "
    "time and memory (an MLP over every query-key pair), scaled dot the least at comparable quality",
    lecture="Attention Score Functions (Luong et al. 2015; Bahdanau et al. 2015; Vaswani et al. 2017)",
)
def run(budget: str, out: Path) -> Result:
    steps = {"tiny": 3, "small": 200, "full": 800}[budget]
    corpus = char_corpus({"tiny": 20_000, "small": 300_000, "full": 1_000_000}[budget])
    rows, curves = [], {}
    for score in SCORES:
        config = ModelConfig(family="decoder", d_model=64, n_heads=4, n_layers=2, d_ff=256, score=score,
                             position="rope", max_seq_len=64, vocab_size=corpus.vocab_size)
        log = train_lm(config, corpus, steps=steps, seq_len=64, lr=3e-3)
        curves[score] = log.losses
        rows.append({"score": score, "parameters": count_parameters(config), "val loss": log.val_loss,
                     "ms per step": log.median_step_ms})

    fig, axes = new_figure(11, 3.6, ncols=2)
    for score, losses in curves.items():
        axes[0].plot(running_mean(losses, window=25), label=score)
    axes[0].set(xlabel="step", ylabel="training loss (mean of 25 steps)", title="same block, four scores")
    axes[0].legend()
    axes[1].bar([r["score"] for r in rows], [r["ms per step"] for r in rows])
    axes[1].set(ylabel="ms per training step", title="cost of a step")
    save(fig, out / "scores.png")

    by_score = {r["score"]: r for r in rows}
    additive_slowest = max(rows, key=lambda r: r["ms per step"])["score"] == "additive"
    best = min(r["val loss"] for r in rows)
    comparable = by_score["scaled_dot"]["val loss"] <= best + 0.1
    all_learn = all(r["val loss"] < rows[0]["val loss"] + 1.0 for r in rows)
    checks = [additive_slowest, comparable, all_learn]
    verdict = "held" if all(checks) else ("did not hold at this scale" if not any(checks) else "mixed")
    reason = ("validation loss " + ", ".join(f"{r['score']} {r['val loss']:.3f}" for r in rows)
              + "; ms per step " + ", ".join(f"{r['score']} {r['ms per step']:.0f}" for r in rows))
    key = (f"additive {by_score['additive']['ms per step'] / by_score['scaled_dot']['ms per step']:.1f}x the time of "
           f"scaled dot per step")
    return Result(verdict, reason, key, rows, ["scores.png"])
