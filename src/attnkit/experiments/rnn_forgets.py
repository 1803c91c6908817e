"""Recurrent language models forget over long strings; self-attention reaches back as far as the context goes
(UT Austin CS 371N, lecture 10: "Why are RNNs bad? They 'forget' over long strings"; UC San Diego COGS 150:
"accurate predictions depend on words from a while ago").

The task makes "a while ago" a number: each sequence is d random symbols repeated, so from position d on the next
token is the one d positions back, and nothing nearer tells it.

    d = 4:   c a d b | c a d b | c a d b ...     scored: every next token whose copy lies d back
             ^-------^ the token to predict sits d positions before it

An LSTM, a plain (Elman, tanh) RNN and a Transformer decoder (rotary positions) of about the same number of
parameters each train on fresh sequences of one distance d for the same steps, then predict held-out sequences of
that d; next-token accuracy and loss are reported per distance. The claim, as measured: each recurrent model's
accuracy falls from the shortest distance to the longest, while the Transformer's stays within MARGIN of where it
starts. The control is the recurrent models at the shortest distance, where nothing is far back: there each must
predict as well as the Transformer (within MARGIN), so that a fall with distance is forgetting and not a model that
never learned the task.

MARGIN (10 points) is attnkit's bound, not the lectures': they say only that RNNs "forget", and name no amount. It
is the bound the bottleneck experiment gives its start check, and it is set before any run: a Transformer that loses
less than a tenth of its accuracy keeps it, against recurrent models that fall by most of theirs.

The checks read the shortest and the longest distance alone. Forgetting is a fall with distance, so a Transformer
short of its start at a middle distance but whole again at every longer one (the small run's d = 8, not learned in
its 300 steps) has not forgotten, and its check is not moved by it; the table and the plot give every distance.
"""

from __future__ import annotations

import statistics
from functools import partial
from pathlib import Path

import torch
from torch import nn

from attnkit import presets
from attnkit.experiments.arms import Arm, is_number
from attnkit.experiments.base import Check, Progress, Result, Stored, experiment
from attnkit.experiments.plots import fit_value_axis, new_figure, save, series, spread_legend
from attnkit.experiments.rnn_transformer_cost import matched_recurrent
from attnkit.models import build_model, count_parameters
from attnkit.train.optim import lr_factor, make_optimizer

VOCAB = 8  # symbols; chance accuracy 1/8
SETTINGS = {  # distances d, scored tokens per sequence, training steps, batch, Transformer width, held-out sequences
    "tiny": dict(distances=[2, 8], scored=8, steps=20, batch=8, width=32, tests=32),
    "small": dict(distances=[2, 4, 8, 16, 32, 64], scored=32, steps=300, batch=32, width=32, tests=256),
    "full": dict(distances=[2, 4, 8, 16, 32, 64, 128], scored=32, steps=1_000, batch=32, width=64, tests=512),
}
MODELS = ("LSTM", "RNN", "Transformer")
RECURRENT = {"LSTM": "lstm", "RNN": "rnn"}  # model -> its recurrent cell
LR = 3e-3  # peak learning rate, one for every model (the Transformer at 1e-3 learns the short distances slower)
MARGIN = 0.1  # accuracy the Transformer may lose with distance, a recurrent model lack at d=shortest (attnkit's)


def recall_batch(generator: torch.Generator, batch: int, distance: int, scored: int) -> tuple[torch.Tensor, ...]:
    """`batch` sequences of `distance` random symbols repeated, as (input ids, labels), each (B, d + scored - 1):
    labels[:, t] is the token after input t, -100 where it is not yet the copy of one d positions back (the first
    d - 1), so the loss and the accuracy read exactly `scored` tokens a sequence, each predictable from d back."""
    period = torch.randint(0, VOCAB, (batch, distance), generator=generator)  # (B, d)
    repeats = -(-(distance + scored) // distance)
    sequence = period.repeat(1, repeats)[:, :distance + scored]  # (B, d + scored)
    labels = sequence[:, 1:].clone()  # (B, d + scored - 1)
    labels[:, :distance - 1] = -100
    return sequence[:, :-1], labels


def held_out(seed: int, distance: int, tests: int, scored: int) -> tuple[torch.Tensor, ...]:
    """The `tests` held-out sequences of `distance` that seed `seed`'s models are scored on: `recall_batch` drawn
    from a generator of the seed and d alone, so the same for every model of a seed and each seed's own, their
    sampling noise part of the seeds' spread as the training's is (seed 0's are those every seed once shared)."""
    return recall_batch(torch.Generator().manual_seed(10_000 + 1_000 * seed + distance), tests, distance, scored)


def transformer(width: int, max_len: int) -> nn.Module:
    """The Transformer decoder: 2 layers of `width`, rotary positions (an offset of d is one relative position)."""
    return build_model(presets.get("gpt2-tiny", vocab_size=VOCAB, d_model=width, n_layers=2,
                                   n_heads=max(width // 16, 1), d_ff=2 * width, position="rope", max_seq_len=max_len,
                                   dropout=0.0))


def build(name: str, width: int, max_len: int, size: int) -> nn.Module:
    """`transformer`, or the recurrent language model of `name`'s cell (one layer, embeddings of `width`) whose
    parameter count is closest to `size` (the Transformer's)."""
    if name == "Transformer":
        return transformer(width, max_len)
    return matched_recurrent(size, embedding_dim=width, n_layers=1, cell=RECURRENT[name], vocab_size=VOCAB)


def train_and_score(model: nn.Module, *, distance: int, seed: int, s: dict, lr: float, progress: Progress,
                    desc: str) -> tuple[dict[str, float], Arm]:
    """One arm: AdamW (warmup, cosine, clipping) on fresh sequences of `distance` for the budget's steps, then
    next-token accuracy and loss (nats) on the seed's `held_out` sequences."""
    progress.phase(f"training {desc} ({s['steps']} steps)")
    draw = torch.Generator().manual_seed(seed)
    optimizer = make_optimizer(model, lr=lr, weight_decay=0.01)
    model.train()
    for step in progress.steps(s["steps"], desc):
        for group in optimizer.param_groups:
            group["lr"] = lr * lr_factor("cosine", step, warmup=s["steps"] // 10, progress=step / s["steps"])
        ids, labels = recall_batch(draw, s["batch"], distance, s["scored"])
        loss = model(ids, labels=labels, return_logits=False).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
    model.eval()
    ids, labels = held_out(seed, distance, s["tests"], s["scored"])
    with torch.no_grad():
        output = model(ids, labels=labels)
    scored = labels != -100  # (B, T)
    accuracy = (output.logits.argmax(-1)[scored] == labels[scored]).float().mean().item()
    score = {"accuracy": accuracy, "loss": output.loss.item()}
    return score, Arm(score)


def saved_score(arm: Arm) -> dict[str, float]:
    """A saved arm's accuracy and loss, checked before use (anything else is a ValueError: the arm is rerun)."""
    if sorted(arm.values) != ["accuracy", "loss"] or not all(map(is_number, arm.values.values())):
        raise ValueError("its values are not accuracy and loss, each a number")
    return {name: float(value) for name, value in arm.values.items()}


def plot(stored: Stored, out: Path) -> list[str]:
    """Next-token accuracy and loss by distance d per model (mean and each seed), chance marked; d on a log axis."""
    distances = sorted({row["d"] for row in stored.rows})
    fig, axes = new_figure(12.5, 4, ncols=2)
    for ax, column, scale in zip(axes, ("accuracy", "loss (nats)"), ("fraction", "from zero"), strict=True):
        for model in dict.fromkeys(row["model"] for row in stored.rows):
            points = [(index, row) for index, row in enumerate(stored.rows) if row["model"] == model]
            spread = series(ax, [row["d"] for _, row in points], [row[column] for _, row in points],
                            seeds=stored.spread([(index, column) for index, _ in points]),
                            label=f"{model} ({points[0][1]['parameters']:,} parameters)")
        chance = 1 / VOCAB if column == "accuracy" else torch.log(torch.tensor(float(VOCAB))).item()
        ax.axhline(chance, color="grey", linestyle="--", linewidth=1)
        ax.text(distances[0], chance, " chance", va="bottom", fontsize=8, color="grey")
        ax.set_xscale("log", base=2)
        ax.set_xticks(distances, [str(d) for d in distances])
        ax.minorticks_off()
        ax.set(xlabel="distance d to the token predicted", ylabel=f"next-token {column}",
               title=f"the next token is the one d back: {column}")
        fit_value_axis(ax, scale)
    spread_legend(axes[0], over=f"mean of {stored.seeds} seeds", spread=spread, loc="center right")
    save(fig, out / "accuracy_by_distance.png")
    return ["accuracy_by_distance.png"]


def checks(accuracy: dict[tuple[str, int], list[float]], shortest: int, longest: int) -> list[Check]:
    """The checks of the claim from each (model, d)'s accuracy per seed: each recurrent model loses accuracy from
    the shortest distance to the longest; the Transformer loses less than MARGIN; and, the control, at the shortest
    distance each recurrent model is short of the Transformer's accuracy by less than MARGIN (a start above it is
    no shortfall), so that its fall is forgetting, not a task it never learned."""

    def fall(model: str) -> list[float]:  # per seed: accuracy at the shortest distance minus at the longest
        return [near - far for near, far in zip(accuracy[(model, shortest)], accuracy[(model, longest)], strict=True)]

    result = []
    for model in RECURRENT:
        result.append(Check.over(f"the {model} forgets: its accuracy at d={shortest} minus at d={longest}",
                                 fall(model)))
        result.append(Check.over(
            f"control, nothing far back: the {model} at d={shortest} predicts as well as the Transformer, within "
            f"{MARGIN * 100:g} points ({MARGIN:g} minus its shortfall, none where above)",
            [MARGIN - max(t - r, 0.0) for t, r in zip(accuracy[("Transformer", shortest)], accuracy[(model, shortest)],
                                                      strict=True)]))
    result.append(Check.over(f"the Transformer does not forget: {MARGIN:g} minus its accuracy lost from d={shortest} "
                             f"to d={longest}", [MARGIN - lost for lost in fall("Transformer")]))
    return result


@experiment(
    "rnn-forgets",
    claim="a recurrent language model forgets over long strings: where the next token is the one d positions back, "
    "its accuracy falls as d grows, while a Transformer decoder of about the same size, trained with the same steps, "
    "keeps it",
    lecture="Why RNNs are bad: they \"forget\" over long strings (CS 371N lecture 10; COGS 150)",
    plot=plot,
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    s = SETTINGS[budget]
    max_len = max(s["distances"]) + s["scored"]
    size = count_parameters(transformer(s["width"], max_len))
    accuracy: dict[tuple[str, int], list[float]] = {}  # (model, d) -> per seed
    losses: dict[tuple[str, int], list[float]] = {}
    sizes: dict[str, int] = {}
    for seed in range(seeds):
        for distance in s["distances"]:
            for name in MODELS:
                torch.manual_seed(1_000 * seed + distance)
                model = build(name, s["width"], max_len, size)
                sizes[name] = count_parameters(model)
                desc = f"{name}, d={distance}, seed {seed}"
                trained = partial(train_and_score, model, distance=distance, seed=seed, s=s, lr=LR,
                                  progress=progress, desc=desc)
                setting = {"model": name, "distance": distance, "seed": seed, "settings": s, "held out": "per seed"}
                score = progress.arm(desc, setting, trained, saved_score)
                accuracy.setdefault((name, distance), []).append(score["accuracy"])
                losses.setdefault((name, distance), []).append(score["loss"])
    rows = [{"model": name, "parameters": sizes[name], "d": distance,
             "accuracy": statistics.fmean(accuracy[(name, distance)]),
             "loss (nats)": statistics.fmean(losses[(name, distance)])}
            for name in MODELS for distance in s["distances"]]
    per_seed = [{"accuracy": accuracy[(row["model"], row["d"])], "loss (nats)": losses[(row["model"], row["d"])]}
                for row in rows]
    shortest, longest = s["distances"][0], s["distances"][-1]
    mean = {key: statistics.fmean(values) for key, values in accuracy.items()}
    key = f"accuracy at d={longest}: " + ", ".join(f"{name} {mean[(name, longest)]:.0%}" for name in MODELS)
    reason = (f"from d={shortest} to d={longest} next-token accuracy goes " + ", ".join(
        f"{name} {mean[(name, shortest)]:.0%} -> {mean[(name, longest)]:.0%}" for name in MODELS)
        + f" (chance {1 / VOCAB:.1%}; {s['steps']} steps each, mean of {seeds} seeds; parameters " + ", ".join(
        f"{name} {sizes[name]:,}" for name in MODELS) + ")")
    return Result(checks(accuracy, shortest, longest), reason, key, rows, [], per_seed)
