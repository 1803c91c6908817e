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

The models the lectures teach before these come along as baselines, with no check of their own: Bengio et al.'s
feed-forward LM over a window of R tokens (the convolution's reach, read by one layer), a deep averaging network
(the mean of every token so far: all of the history, in no order), both trained alike at the same size, and a
Kneser-Ney trigram counted on the training split (`models.ngram`), which reads 2 tokens whatever it is given.
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
from attnkit.models.ngram import NGramLM

SETTINGS = {  # corpus characters, Transformer width, training steps, batch, training length L, the convolution's
    # kernel and layers (dilations 1, 2, 4, ...), the context lengths c scored, held-out windows, positions each
    "tiny": dict(chars=20_000, width=32, steps=25, batch=8, seq_len=32, kernel=3, conv_layers=2, cuts=[2, 7, 32],
                 windows=16, scored=4, lr=3e-3),
    "small": dict(chars=300_000, width=48, steps=1_000, batch=16, seq_len=64, kernel=3, conv_layers=3,
                  cuts=[2, 4, 8, 15, 32, 64], windows=128, scored=8, lr=1e-2),
    "full": dict(chars=1_000_000, width=64, steps=2_000, batch=16, seq_len=128, kernel=3, conv_layers=4,
                 cuts=[2, 4, 8, 16, 31, 64, 128], windows=256, scored=8, lr=2e-3),
}
MODELS = ("LSTM", "convolution", "attention")  # recurrence, convolution, attention (lecture 004's order)
BASELINES = ("feed-forward window", "deep averaging")  # the feed-forward LMs before them, trained alike
SIZED = (*MODELS, *BASELINES)  # the rows whose size is a parameter count (the n-gram's: the n-grams it counted)
NGRAM_N = 3  # the counted baseline: a Kneser-Ney trigram, which reads the 2 tokens before each (the shortest cut)
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


def feedforward_config(hidden: int, s: dict, vocab: int, *, context: str, reach: int) -> ModelConfig:
    """Bengio et al.'s window over the last `reach` tokens (the convolution's receptive field: the same reach, read
    by one layer), or a deep averaging network's mean of every token so far (`reach` unused)."""
    window = {"context_size": reach} if context == "window" else {}
    return ModelConfig(family="feedforward-lm", vocab_size=vocab, context=context, **window,
                       embedding_dim=s["width"], hidden_size=hidden, n_layers=1, activation="tanh",
                       max_seq_len=s["seq_len"], dropout=0.0, tie_embeddings=True)


def closest(make: Callable[[int], ModelConfig], target: int, widths: range) -> ModelConfig:
    """The config `make(width)` whose parameter count comes closest to `target`, over `widths` (the count grows with
    the width: bisected, counted on the meta device, nothing allocated)."""
    above = bisect.bisect_left(widths, target, key=lambda width: count_parameters(make(width)))
    candidates = widths[max(above - 1, 0) : above + 1]
    return make(min(candidates, key=lambda width: abs(count_parameters(make(width)) - target)))


def matched_configs(s: dict, vocab: int) -> dict[str, ModelConfig]:
    """The trained models' configs: the Transformer's size sets the target; the convolution's width and the other
    models' hidden widths (one layer, embeddings as wide as the Transformer's) are those whose counts come closest to
    it."""
    attention = transformer_config(s["width"], s["seq_len"], vocab)
    target, widths = count_parameters(attention), range(8, 64 * s["width"])
    conv = closest(partial(conv_config, s=s, vocab=vocab), target, widths)
    window, average = (closest(partial(feedforward_config, s=s, vocab=vocab, context=context,
                                       reach=conv.receptive_field), target, widths)
                       for context in ("window", "average"))
    return {"LSTM": closest(partial(lstm_config, s=s, vocab=vocab), target, widths), "convolution": conv,
            "attention": attention, "feed-forward window": window, "deep averaging": average}


def held_out(corpus: Corpus, *, seq_len: int, windows: int, scored: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`windows` held-out windows x, y (N, seq_len + scored - 1), spread over the validation split: each of the last
    `scored` positions has seq_len tokens up to it."""
    length = seq_len + scored - 1
    return next(corpus.data.iter_eval_batches("val", batch_size=windows, seq_len=length, max_batches=1))


def ngram_loss(corpus: Corpus, *, seq_len: int, windows: int, scored: int) -> tuple[float, int]:
    """A Kneser-Ney `NGRAM_N`-gram counted on the training split, scored on the positions `loss_by_context` scores
    (it reads the NGRAM_N - 1 tokens before each, whatever the context given): its mean loss (nats) and the number of
    n-grams it counted."""
    vocab = corpus.vocab_size
    model = NGramLM(n=NGRAM_N, vocab_size=vocab, smoothing="kneser-ney")
    model.fit(torch.from_numpy(corpus.data.split("train").astype("int64")))
    x, y = held_out(corpus, seq_len=seq_len, windows=windows, scored=scored)  # (N, W)
    total = 0.0
    for t in range(seq_len - 1, x.shape[1]):
        context = torch.zeros_like(x[:, t])
        for back in range(NGRAM_N - 2, -1, -1):  # the context's tokens, oldest first, as one integer in base V
            context = context * vocab + x[:, t - back]
        total -= model.probability(context, y[:, t]).log().mean().item()
    return total / scored, len(model.tables[-1].codes)


@torch.no_grad()
def loss_by_context(model: nn.Module, corpus: Corpus, *, cuts: list[int], seq_len: int, windows: int,
                    scored: int) -> dict[int, float]:
    """Mean next-token loss (nats) on the last `scored` positions of `windows` held-out windows, each position given
    exactly its last c tokens, for each c in `cuts` (at most `seq_len`, the training length)."""
    model.eval()
    x, y = held_out(corpus, seq_len=seq_len, windows=windows, scored=scored)  # (N, W)
    losses = {}
    for cut in cuts:
        total = 0.0
        for t in range(seq_len - 1, x.shape[1]):  # the scored positions
            logits = model(x[:, t - cut + 1 : t + 1]).logits[:, -1]  # (N, c) -> (N, V): given the last c tokens
            total += F.cross_entropy(logits.float(), y[:, t]).item()
        losses[cut] = total / scored
    model.train()
    return losses


def plot(stored: Stored, out: Path) -> list[str]:
    """Held-out loss by the tokens of context given (log x), one line per model with its seeds, the convolution's
    receptive field marked."""
    rows = stored.rows
    fig, ax = new_figure(10, 4.5)
    spread = None
    cuts = [int(column.split("=")[1]) for column in rows[0] if column.startswith("loss, c=")]
    for index, (row, marker) in enumerate(zip(rows, ("o", "s", "^", "D", "v", "x"), strict=False)):
        columns = [f"loss, c={cut}" for cut in cuts]
        baseline = row["model"] not in MODELS  # the feed-forward and counted baselines: thin dashed lines
        size = f"{row['parameters'] / 1e3:.0f}k {'parameters' if row['model'] in SIZED else 'n-grams'}"
        spread = series(ax, cuts, [row[c] for c in columns], marker=marker, label=f"{row['model']} ({size})",
                        seeds=stored.spread([(index, c) for c in columns]), linestyle="--" if baseline else "-",
                        linewidth=1 if baseline else 2, markersize=4 if baseline else 6)
    reach = next(row["reads at most"] for row in rows if row["model"] == "convolution")
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
    spread_legend(ax, over=f"mean of {stored.seeds} seeds", spread=spread, fontsize=8, loc="center left",
                  bbox_to_anchor=(1.02, 0.5))  # beside the axes: the lines cross every corner
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
    trained = (*MODELS, *BASELINES)
    losses: dict[str, list[dict[int, float]]] = {name: [] for name in trained}  # per seed: c -> loss
    for seed in range(seeds):
        for name in trained:
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
    reads = {"convolution": reach, "feed-forward window": reach, f"{NGRAM_N}-gram": NGRAM_N - 1}  # tokens at most
    counted, n_grams = ngram_loss(corpus, seq_len=full, windows=s["windows"], scored=s["scored"])
    losses[f"{NGRAM_N}-gram"] = [dict.fromkeys(cuts, counted)] * seeds  # counted, not trained: alike every seed
    rows, per_seed = [], []
    for name in losses:
        config = configs.get(name)
        mean = {cut: statistics.fmean(by_cut[cut] for by_cut in losses[name]) for cut in cuts}
        rows.append({"model": name, "family": config.family if config else "n-gram (Kneser-Ney)",
                     "parameters": count_parameters(config) if config else n_grams, "reads at most": reads.get(name),
                     **{f"loss, c={cut}": mean[cut] for cut in cuts},
                     f"gain from tokens past R (c={reach} -> {full})": mean[reach] - mean[full]})
        per_seed.append({f"loss, c={cut}": [by_cut[cut] for by_cut in losses[name]] for cut in cuts})

    def beyond(name: str) -> float:
        return statistics.fmean(gain(name, reach, full))

    key = (f"loss given {reach} tokens minus given {full}: attention {beyond('attention'):.3g}, LSTM "
           f"{beyond('LSTM'):.3g}, convolution {abs(beyond('convolution')):.1g} nats (R = {reach})")
    best = min(rows[:len(MODELS)], key=lambda row: row[f"loss, c={full}"])
    reason = (f"on held-out characters, cutting the context from {full} tokens to the convolution's receptive field "
              f"R = {reach} changes the Transformer's loss by {beyond('attention'):+.3g} nats and the LSTM's by "
              f"{beyond('LSTM'):+.3g}, the convolution's by {abs(beyond('convolution')):.1g}; at {full} tokens of "
              f"context, after {s['steps']} steps at about {rows[2]['parameters'] / 1e3:.0f}k parameters, of the three "
              f"the {best['model']} predicts best ({best[f'loss, c={full}']:.3f} nats; mean of {seeds} seeds)")
    if not all(math.isfinite(v) for by_cut in losses.values() for seed in by_cut for v in seed.values()):
        reason += " (a run diverged: its losses are no numbers)"
    return Result(checks, reason, key, rows, [], per_seed)
