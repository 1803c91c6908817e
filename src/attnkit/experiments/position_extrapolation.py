"""Which position schemes carry a model past the length it was trained on (lecture: "position information";
Press et al. 2022, "Train short, test long").

Decoders that differ only in their position scheme train on the same character stream at one context length,
then are scored on validation windows from half that length to eight times it. A learned table has no row past
its last position, so that model refuses longer inputs (the error is the result); sinusoidal, Shaw's relative,
rotary and ALiBi positions accept any length, and the loss says how well they use it. Without positions a
causal decoder still runs at any length (the mask itself leaks position).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import get_args

import torch
from torch import nn

from attnkit import presets
from attnkit.config import Position
from attnkit.errors import InputError
from attnkit.experiments.base import Check, Progress, Result, Stored, experiment
from attnkit.experiments.lm_runs import char_corpus, train_lm
from attnkit.experiments.plots import fit_value_axis, new_figure, save, series, spread_legend

SCHEMES = [s for s in ("sinusoidal", "learned", "relative", "rope", "alibi", "none") if s in get_args(Position)]
SETTINGS = {  # training context, evaluation lengths, steps, width, corpus bytes
    "tiny": dict(context=16, lengths=[8, 16, 32, 64], steps=4, width=32, corpus=20_000),
    "small": dict(context=128, lengths=[64, 128, 256, 512, 1024], steps=300, width=128, corpus=300_000),
    "full": dict(context=128, lengths=[64, 128, 256, 512, 1024], steps=1500, width=192, corpus=1_000_000),
}
EVAL_TOKENS = 16_384  # validation tokens scored at each length


def unit_scale_tokens(model: nn.Module) -> None:
    """Token embeddings of std C^-0.5, as fairseq's Transformer starts them: multiplied by sqrt(C) (Vaswani et al.,
    3.4) they enter at unit scale, the size of the sinusoidal table's entries. GPT-2's std 0.02 would start them at
    a third of the table's size (0.23 against 0.71 an entry at C = 128), and the model would first have to grow its
    tokens out of the table's shadow: a handicap inside the training window, not a finding about positions."""
    token = model.stack.embeddings.token
    nn.init.normal_(token.weight, std=token.embedding_dim**-0.5)


@torch.no_grad()
def loss_at_length(model: torch.nn.Module, data, length: int) -> float:
    """Mean next-token loss over every position of validation windows `length` tokens long."""
    model.eval()
    total, count = 0.0, 0
    batch = max(1, EVAL_TOKENS // (4 * length))
    for x, y in data.iter_eval_batches("val", batch_size=batch, seq_len=length, max_batches=4):
        total += model(x, labels=y, return_logits=False).loss.item() * y.numel()
        count += y.numel()
    return total / count


def plot(stored: Stored, out: Path) -> list[str]:
    """Validation loss by evaluation length per position scheme (mean and each seed), the training length marked;
    the loss axis at least 10% of its value tall."""
    s = SETTINGS[stored.budget]
    fig, ax = new_figure(8.5, 4.5)
    for index, row in enumerate(stored.rows):
        lengths = [n for n in s["lengths"] if row[f"loss at {n}"] is not None]
        label = row["position"] + (f" (refuses past {lengths[-1]})" if row.get("refused") else "")
        spread = series(ax, lengths, [row[f"loss at {n}"] for n in lengths], label=label,
                        seeds=stored.spread([(index, f"loss at {n}") for n in lengths]))
    ax.axvline(s["context"], color="grey", linestyle="--", linewidth=1)
    fit_value_axis(ax, "level")
    ax.text(s["context"], ax.get_ylim()[1], " training length", va="top", fontsize=8, color="grey")
    ax.set_xscale("log", base=2)
    ax.set_xticks(s["lengths"], [str(n) for n in s["lengths"]])
    ax.minorticks_off()
    ax.set(xlabel="evaluation length (tokens)", ylabel="validation loss (nats/char)",
           title=f"trained at {s['context']} tokens, {s['steps']} steps")
    spread_legend(ax, over=f"mean of {stored.seeds} seeds", spread=spread, loc="upper left", bbox_to_anchor=(1.01, 1))
    save(fig, out / "loss_by_length.png")
    return ["loss_by_length.png"]


@experiment(
    "position-extrapolation",
    claim="learned positions cannot go past the training length; sinusoidal, relative, rotary and ALiBi positions "
    "run at any length, and ALiBi (the bias built for it) extrapolates best",
    lecture="Position information (Shaw et al. 2018; Su et al. 2021; Press et al. 2022)",
    plot=plot,
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    s = SETTINGS[budget]
    corpus = char_corpus(s["corpus"])
    losses: dict[str, list[dict[int, float | None]]] = {scheme: [] for scheme in SCHEMES}  # per seed, per length
    refusal: dict[str, str] = {}
    for seed in range(seeds):
        for scheme in SCHEMES:
            config = presets.get("gpt2-tiny", vocab_size=corpus.vocab_size, d_model=s["width"], n_layers=2,
                                 n_heads=max(s["width"] // 32, 1), d_ff=4 * s["width"], position=scheme,
                                 max_seq_len=s["context"], dropout=0.0,
                                 # a fixed table of unit amplitude would drown token embeddings of std 0.02:
                                 # Vaswani et al. (3.4) scale the embeddings by sqrt(d_model) under sinusoidal,
                                 # from embeddings of std 1/sqrt(d_model) (unit_scale_tokens)
                                 scale_embeddings=scheme == "sinusoidal")
            desc = f"{scheme} positions, seed {seed}"
            progress.phase(f"training {desc}")
            log = train_lm(config, corpus, steps=s["steps"], seq_len=s["context"], batch_size=16, lr=2e-3, seed=seed,
                           init=unit_scale_tokens if scheme == "sinusoidal" else None, progress=progress, desc=desc)
            by_length: dict[int, float | None] = {}
            for length in s["lengths"]:
                try:
                    by_length[length] = loss_at_length(log.model, corpus.data, length)
                except InputError as error:  # the learned table ends at the training length: that is the finding
                    by_length[length] = None
                    refusal.setdefault(scheme, str(error).split(";")[0])
            losses[scheme].append(by_length)
    rows = []
    for scheme, per_seed in losses.items():
        row: dict = {"position": scheme}
        for length in s["lengths"]:
            values = [by_length[length] for by_length in per_seed]
            row[f"loss at {length}"] = None if None in values else statistics.fmean(values)
        rows.append({**row, "refused": refusal.get(scheme, "")})

    context, longest = s["context"], s["lengths"][-1]

    def growth(scheme: str) -> list[float]:  # per seed: loss at the longest length minus at the training length
        return [by_length[longest] - by_length[context] for by_length in losses[scheme]]

    running = [scheme for scheme in SCHEMES if all(b[longest] is not None for b in losses[scheme])]
    rivals = [scheme for scheme in running if scheme != "alibi"]
    checks = [
        Check.fact(f"learned positions refuse inputs past {context} tokens", "learned" in refusal),
        Check.fact("sinusoidal, relative, rotary and ALiBi positions run at every length",
                   all(scheme in running for scheme in ("sinusoidal", "relative", "rope", "alibi"))),
    ]
    if "alibi" in running and rivals:
        checks.append(Check.over(
            f"ALiBi extrapolates best: the least loss growth from {context} to {longest} tokens among the others "
            "minus ALiBi's (nats)",
            [min(rest) - alibi for alibi, *rest in zip(growth("alibi"), *map(growth, rivals), strict=True)]))
    mean_growth = {scheme: statistics.fmean(growth(scheme)) for scheme in running}
    best = min(mean_growth, key=mean_growth.get)
    key = f"loss change from {context} to {longest} tokens: " + ", ".join(
        f"{p} {g:+.2g}" for p, g in sorted(mean_growth.items(), key=lambda item: item[1]))
    reason = (f"learned positions {'refused' if 'learned' in refusal else 'accepted'} inputs past {context} tokens; "
              f"of the rest, {best} degraded least ({mean_growth[best]:+.3f} nats from {context} to {longest}, mean "
              f"of {seeds} seeds)")
    per_seed = [{f"loss at {n}": [b[n] for b in losses[row["position"]]] for n in s["lengths"]
                 if row[f"loss at {n}"] is not None} for row in rows]
    return Result(checks, reason, key, rows, [], per_seed)
