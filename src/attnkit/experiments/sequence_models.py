"""Three types of sequence models and how far back each reads (lecture 004, "Three types of sequence models"):

    recurrence    conditions each representation on an encoding of the whole history      LSTM
    convolution   conditions it on local context, the receptive field R                    gated CNN (conv-lm)
    attention     conditions it on a weighted average of all tokens                        Transformer decoder

An LSTM, a gated convolutional LM (Dauphin et al. 2017; dilated, receptive field R) and a Transformer decoder
(rotary positions) of about the same number of parameters train for the same steps on the same characters (the
built-in corpus: the Python standard library's source). Each then predicts held-out tokens given only the last c
tokens before them, for c from a few tokens to the training length L, so that the loss as a function of c shows how
far back each model reaches:

    context given    ... t-L ............ t-R ........ t-4 .. t  ->  x[t+1]
    the convolution  reads                 |<--- R ---------->|       nothing before t-R+1, by construction
    LSTM, attention  read                  |<----------- L ---------------->|

What the framing predicts, as checks: attention and recurrence predict better with the tokens beyond R than
without them (their loss with c = R minus with c = L is positive); the convolution's loss with c = R and c = L is the
same (a fact of the model: a token outside the receptive field changes no logit). The control is the convolution's
own context: its loss falls from c = 2 to c = R, so a flat curve past R is a limit of its reach, not a model that
learned no context at all. The held-out loss of each at the full context is reported beside them, at equal size and
steps (the lecture ranks nothing there, so no check reads it).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from attnkit.config import ModelConfig
from attnkit.experiments.base import Check, Progress, Result, Stored, experiment
from attnkit.experiments.lm_runs import Corpus, char_corpus, train_lm
from attnkit.experiments.plots import fit_value_axis, new_figure, save, series, spread_legend
from attnkit.models import count_parameters

SETTINGS = {  # corpus characters, Transformer width, training steps, batch, training length L, the convolution's
    # kernel and layers (dilations 1, 2, 4, ...), the context lengths c scored, held-out windows, positions each
    "tiny": dict(chars=20_000, width=32, steps=25, batch=8, seq_len=32, kernel=3, conv_layers=2, cuts=[2, 7, 32],
                 windows=16, scored=4, lr=3e-3),
    "small": dict(chars=300_000, width=48, steps=400, batch=16, seq_len=64, kernel=3, conv_layers=3,
                  cuts=[2, 4, 8, 15, 32, 64], windows=128, scored=8, lr=3e-3),
    "full": dict(chars=1_000_000, width=64, steps=2_000, batch=16, seq_len=128, kernel=3, conv_layers=4,
                 cuts=[2, 4, 8, 16, 31, 64, 128], windows=256, scored=8, lr=2e-3),
}
MODELS = ("LSTM", "convolution", "attention")  # recurrence, convolution, attention (lecture 004's order)
FACT_TOLERANCE = 1e-5  # nats: what "the same loss" allows of float arithmetic


def transformer_config(width: int, seq_len: int, vocab: int) -> ModelConfig:
    return ModelConfig(family="decoder", vocab_size=vocab, d_model=width, n_layers=2, n_heads=max(width // 32, 1),
                       d_ff=4 * width, position="rope", norm="layer", norm_position="pre", activation="gelu",
                       max_seq_len=seq_len, dropout=0.0, tie_embeddings=True)


def conv_config(width: int, s: dict, vocab: int) -> ModelConfig:
    return ModelConfig(family="conv-lm", vocab_size=vocab, d_model=width, n_layers=s["conv_layers"],
                       kernel_size=s["kernel"], dilation_base=2, max_seq_len=s["seq_len"], dropout=0.0,
                       tie_embeddings=True)


def lstm_config(hidden: int, s: dict, vocab: int) -> ModelConfig:
    return ModelConfig(family="recurrent-lm", vocab_size=vocab, cell="lstm", n_layers=1, hidden_size=hidden,
                       embedding_dim=s["width"], max_seq_len=s["seq_len"], dropout=0.0, tie_embeddings=True)


def closest(make: Callable[[int], ModelConfig], target: int, widths: range) -> ModelConfig:
    """The config `make(width)` whose parameter count comes closest to `target`, over `widths` (the count grows with
    the width: bisected, counted on the meta device, nothing allocated)."""
    above = bisect.bisect_left(widths, target, key=lambda width: count_parameters(make(width)))
    candidates = widths[max(above - 1, 0) : above + 1]
    return make(min(candidates, key=lambda width: abs(count_parameters(make(width)) - target)))


def matched_configs(s: dict, vocab: int) -> dict[str, ModelConfig]:
    """The three models' configs: the Transformer's size sets the target; the convolution's width and the LSTM's
    hidden width (one layer, embeddings as wide as the Transformer's) are those whose counts come closest to it."""
    attention = transformer_config(s["width"], s["seq_len"], vocab)
    target, widths = count_parameters(attention), range(8, 4 * s["width"])
    return {"LSTM": closest(partial(lstm_config, s=s, vocab=vocab), target, widths),
            "convolution": closest(partial(conv_config, s=s, vocab=vocab), target, widths), "attention": attention}


@torch.no_grad()
def loss_by_context(model: nn.Module, corpus: Corpus, *, cuts: list[int], seq_len: int, windows: int,
                    scored: int) -> dict[int, float]:
    """Mean next-token loss (nats) on the last `scored` positions of `windows` held-out windows, each position given
    exactly its last c tokens, for each c in `cuts` (at most `seq_len`, the training length)."""
    model.eval()
    length = seq_len + scored - 1  # every scored position has seq_len tokens up to it
    x, y = next(corpus.data.iter_eval_batches("val", batch_size=windows, seq_len=length, max_batches=1))  # (N, W)
    losses = {}
    for cut in cuts:
        total = 0.0
        for t in range(seq_len - 1, length):  # the scored positions
            logits = model(x[:, t - cut + 1 : t + 1]).logits[:, -1]  # (N, c) -> (N, V): given the last c tokens
            total += F.cross_entropy(logits.float(), y[:, t]).item()
        losses[cut] = total / scored
    model.train()
    return losses


def plot(stored: Stored, out: Path) -> list[str]:
    """Held-out loss by the tokens of context given (log x), one line per model with its seeds, the convolution's
    receptive field marked."""
    rows = stored.rows
    fig, ax = new_figure(7.5, 4.5)
    spread = None
    cuts = [int(column.split("=")[1]) for column in rows[0] if column.startswith("loss, c=")]
    for index, (row, marker) in enumerate(zip(rows, ("o", "s", "^", "D", "v"), strict=False)):
        columns = [f"loss, c={cut}" for cut in cuts]
        label = f"{row['model']} ({row['parameters'] / 1e3:.0f}k parameters)"
        spread = series(ax, cuts, [row[c] for c in columns], marker=marker, label=label,
                        seeds=stored.spread([(index, c) for c in columns]))
    reach = next(row["receptive field"] for row in rows if row["receptive field"] is not None)
    ax.axvline(reach, color="grey", linestyle="--", linewidth=1)
    ax.annotate(f"convolution's receptive field R = {reach}", (reach, 1.0), xycoords=("data", "axes fraction"),
                xytext=(4, -12), textcoords="offset points", fontsize=8, color="grey")
    ax.set_xscale("log")
    ax.set_xticks(cuts, [str(c) for c in cuts])
    ax.minorticks_off()
    ax.set(xlabel="tokens of context given (c)", ylabel="held-out loss (nats per character)",
           title="how far back each sequence model reads")
    fit_value_axis(ax, "level")
    ax.grid(True, alpha=0.3)
    spread_legend(ax, over=f"mean of {stored.seeds} seeds", spread=spread, fontsize=8)
    save(fig, out / "loss_by_context.png")
    return ["loss_by_context.png"]


@experiment(
    "sequence-models",
    claim="recurrence encodes the whole history, convolution conditions on local context, attention on a weighted "
    "average of all tokens: at the same size and steps, the LSTM and the Transformer predict held-out text better "
    "with the tokens beyond the convolution's receptive field than without them, while the convolution cannot use "
    "them at all",
    lecture="Three types of sequence models: recurrence, convolution, attention (CMU 11-711, lecture 004)",
    plot=plot,
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int) -> Result:
    s = SETTINGS[budget]
    corpus = char_corpus(s["chars"])
    configs = matched_configs(s, corpus.vocab_size)
    reach = configs["convolution"].receptive_field
    cuts, full = s["cuts"], s["seq_len"]  # each budget's cuts hold R (tests/test_experiments_sequence_models.py)
    losses: dict[str, list[dict[int, float]]] = {name: [] for name in MODELS}  # per seed: c -> loss
    for seed in range(seeds):
        for name in MODELS:
            progress.phase(f"{name}, seed {seed}: {s['steps']} steps")
            run_log = train_lm(configs[name], corpus, steps=s["steps"], batch_size=s["batch"], seq_len=full,
                               lr=s["lr"], seed=seed, progress=progress, desc=f"{name}, seed {seed}")
            losses[name].append(loss_by_context(run_log.model, corpus, cuts=cuts, seq_len=full,
                                                windows=s["windows"], scored=s["scored"]))

    def gain(name: str, short: int, long: int) -> list[float]:  # per seed: loss with `short` tokens minus `long`
        return [by_cut[short] - by_cut[long] for by_cut in losses[name]]

    local = cuts[0]  # the control's short context
    conv_beyond = gain("convolution", reach, full)
    checks = [
        Check.over(f"attention reads past R = {reach}: its loss given {reach} tokens minus given {full} (nats)",
                   gain("attention", reach, full)),
        Check.over(f"recurrence reads past R = {reach}: the LSTM's loss given {reach} tokens minus given {full} (nats)",
                   gain("LSTM", reach, full)),
        Check.fact(f"the convolution reads nothing past R = {reach}: its loss given {reach} tokens equals its loss "
                   f"given {full} (within {FACT_TOLERANCE:g} nats, every seed)",
                   all(abs(g) <= FACT_TOLERANCE for g in conv_beyond)),
        Check.over(f"control: the convolution uses the context it reaches: its loss given {local} tokens minus given "
                   f"{reach} (nats)", gain("convolution", local, reach)),
    ]
    rows, per_seed = [], []
    for name in MODELS:
        config = configs[name]
        mean = {cut: statistics.fmean(by_cut[cut] for by_cut in losses[name]) for cut in cuts}
        rows.append({"model": name, "family": config.family, "parameters": count_parameters(config),
                     "receptive field": config.receptive_field if name == "convolution" else None,
                     **{f"loss, c={cut}": mean[cut] for cut in cuts},
                     f"gain from tokens past R (c={reach} -> {full})": mean[reach] - mean[full]})
        per_seed.append({f"loss, c={cut}": [by_cut[cut] for by_cut in losses[name]] for cut in cuts})

    def beyond(name: str) -> float:
        return statistics.fmean(gain(name, reach, full))

    key = (f"loss given {reach} tokens minus given {full}: attention {beyond('attention'):.3g}, LSTM "
           f"{beyond('LSTM'):.3g}, convolution {abs(beyond('convolution')):.1g} nats (R = {reach})")
    best = min(rows, key=lambda row: row[f"loss, c={full}"])
    reason = (f"on held-out characters, cutting the context from {full} tokens to the convolution's receptive field "
              f"R = {reach} changes the Transformer's loss by {beyond('attention'):+.3g} nats and the LSTM's by "
              f"{beyond('LSTM'):+.3g}, the convolution's by {abs(beyond('convolution')):.1g}; at {full} tokens of "
              f"context, after {s['steps']} steps at about {rows[-1]['parameters'] / 1e3:.0f}k parameters, the "
              f"{best['model']} predicts best ({best[f'loss, c={full}']:.3f} nats; mean of {seeds} seeds)")
    if not all(math.isfinite(v) for by_cut in losses.values() for seed in by_cut for v in seed.values()):
        reason += " (a run diverged: its losses are no numbers)"
    return Result(checks, reason, key, rows, [], per_seed)
