"""The original Transformer against the Llama-2-style "Transformer++" (lecture: "the recipe that changed";
Gu and Dao 2023 quote about 10x compute efficiency at scale).

    Vaswani-style   post-norm, LayerNorm, ReLU FFN (4C), sinusoidal positions added to embeddings scaled by
                    sqrt(C), multi-head attention, biases
    Transformer++   pre-norm, RMSNorm, SwiGLU FFN (8/3 C), rotary positions, grouped-query attention, no biases

Both decoders train at several sizes on the same character stream for the same number of tokens. Loss is plotted
against training FLOPs, and the compute multiplier is the ratio of the FLOPs each needs to reach the best loss the
Vaswani-style models reach (interpolated between sizes in log-FLOPs). An ablation switches each ingredient alone
into the Vaswani-style model at the middle size.
"""

from __future__ import annotations

import math
from pathlib import Path

from matplotlib.ticker import NullFormatter

from attnkit.config import ModelConfig
from attnkit.experiments.base import Result, experiment
from attnkit.experiments.lm_runs import char_corpus, train_lm, training_flops
from attnkit.experiments.plots import new_figure, save
from attnkit.models import count_parameters

SEQ_LEN, BATCH = 64, 16


def vaswani(width: int, layers: int) -> dict:
    return dict(family="decoder", d_model=width, n_layers=layers, n_heads=width // 32, d_ff=4 * width,
                norm_position="post", norm="layer", activation="relu", position="sinusoidal", bias=True,
                max_seq_len=SEQ_LEN, tie_embeddings=True, scale_embeddings=True)


PLUS_PLUS = dict(norm_position="pre", norm="rms", activation="swiglu", position="rope", bias=False,
                 scale_embeddings=False)
INGREDIENTS = {  # each changes the Vaswani-style model in one respect
    "pre-norm": dict(norm_position="pre"),
    "RMSNorm": dict(norm="rms"),
    "SwiGLU": dict(activation="swiglu"),  # at 8/3 C (filled in per size)
    "RoPE": dict(position="rope"),
    "GQA (kv = H/2)": dict(),  # kv heads filled in per size
    "no biases": dict(bias=False),
}


def swiglu_width(width: int) -> int:
    """SwiGLU's hidden width at 8/3 C, a multiple of 8: the parameters of a 4C ReLU FFN."""
    return 8 * ((8 * width // 3 + 7) // 8)


def plus_plus(width: int, layers: int) -> dict:
    return {**vaswani(width, layers), **PLUS_PLUS, "d_ff": swiglu_width(width), "n_kv_heads": max(width // 64, 1)}


def flops_to_reach(points: list[tuple[float, float]], target: float) -> float | None:
    """FLOPs at which the (FLOPs, loss) points, sorted by FLOPs, first reach `target`, interpolated in log-FLOPs."""
    for (f0, l0), (f1, l1) in zip(points, points[1:], strict=False):
        if l0 > target >= l1:
            t = (l0 - target) / (l0 - l1)
            return math.exp(math.log(f0) + t * (math.log(f1) - math.log(f0)))
    return points[0][0] if points and points[0][1] <= target else None


@experiment(
    "transformer-plus-plus",
    claim="the Llama-2-style Transformer++ (pre-RMSNorm, SwiGLU, RoPE, GQA, no biases) needs several times less "
    "training compute than the original Transformer for the same loss (about 10x at scale)",
    lecture="From the Transformer to Llama 2 (Gu and Dao 2023, figure 4's Transformer++ baseline)",
)
def run(budget: str, out: Path) -> Result:
    sizes = {"tiny": [(32, 1)], "small": [(64, 2), (128, 3), (192, 4)], "full": [(64, 2), (128, 3), (192, 4),
                                                                                (256, 6)]}[budget]
    steps = {"tiny": 3, "small": 200, "full": 1000}[budget]
    corpus = char_corpus({"tiny": 20_000, "small": 300_000, "full": 1_000_000}[budget])
    tokens = steps * BATCH * SEQ_LEN
    rows, points = [], {"Vaswani-style": [], "Transformer++": []}

    def train(name: str, fields: dict) -> dict:
        config = ModelConfig(**fields, vocab_size=corpus.vocab_size)
        log = train_lm(config, corpus, steps=steps, seq_len=SEQ_LEN, batch_size=BATCH, lr=2e-3)
        flops = training_flops(config, count_parameters(config), tokens, SEQ_LEN)
        return {"model": name, "width x layers": f"{config.d_model} x {config.n_layers}",
                "parameters": count_parameters(config), "training FLOPs": flops, "val loss": log.val_loss}

    for width, layers in sizes:
        for name, fields in (("Vaswani-style", vaswani(width, layers)), ("Transformer++", plus_plus(width, layers))):
            row = train(name, fields)
            rows.append(row)
            points[name].append((row["training FLOPs"], row["val loss"]))
    width, layers = sizes[len(sizes) // 2]
    per_size = {"SwiGLU": {"d_ff": swiglu_width(width)}, "GQA (kv = H/2)": {"n_kv_heads": max(width // 64, 1)}}
    for ingredient, change in INGREDIENTS.items():
        change = {**change, **per_size.get(ingredient, {})}
        rows.append(train(f"Vaswani + {ingredient}", {**vaswani(width, layers), **change}))

    fig, ax = new_figure(6, 4)
    for name, family_points in points.items():
        ax.plot(*zip(*family_points, strict=True), marker="o", label=name)
    ax.set(xscale="log", xlabel="training FLOPs", ylabel="validation loss (nats/char)",
           title=f"{tokens:,} training tokens per model")
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.legend()
    save(fig, out / "loss_vs_flops.png")

    target = min(loss for _, loss in points["Vaswani-style"])
    vaswani_flops = flops_to_reach(points["Vaswani-style"], target)
    plus_flops = flops_to_reach(points["Transformer++"], target)
    if plus_flops is None:
        multiplier, bound = None, ""
    else:
        multiplier = vaswani_flops / plus_flops
        bound = "at least " if plus_flops == points["Transformer++"][0][0] else ""
    if multiplier is None:
        verdict, key = "did not hold at this scale", "Transformer++ did not reach the Vaswani-style loss"
    else:
        verdict = "held" if multiplier >= 2 else ("mixed" if multiplier > 1 else "did not hold at this scale")
        key = f"{bound}{multiplier:.1f}x less compute for validation loss {target:.3f}"
    reason = (f"the best Vaswani-style loss {target:.3f} takes {vaswani_flops:.3g} FLOPs; Transformer++ reaches it "
              + (f"with {bound}{multiplier:.1f}x less compute" if multiplier else "at none of the sizes tried")
              + " (the lectures' 10x is measured at far larger scale)")
    return Result(verdict, reason, key, rows, ["loss_vs_flops.png"])
