"""Recurrence against self-attention: the cost of a training step as the sequence grows (lecture: "RNNs and
parallelizability"; Vaswani et al. 2017, table 1).

    layer            work per layer   sequential steps   memory kept for backward
    recurrent        O(T d^2)         O(T)               O(T d)
    self-attention   O(T^2 d)         O(1)               O(T^2) per head when the weights are materialised

An LSTM language model and a Transformer decoder with the same number of parameters take one training step
(forward, backward, AdamW) on batches of T tokens, T from short to long. Reported per length: time per step and
per token, and the bytes autograd keeps for the backward pass (measured with `saved_tensors_hooks`), beside the
attention matrices' size had they been materialised (the fused kernel keeps only a row statistic instead).

The lectures' point is about parallel hardware (CMU 11-711, USC CSCI 499: the Transformer trains in parallel on GPUs
where the RNN cannot), so with `--device cuda` it runs on the GPU, and its verdict also asks whether the Transformer
took less time per token than the LSTM at the longest length there. On one CPU thread there is little parallel
hardware to use, and the verdict says so.

The timings are taken in rounds, after one untimed round: each round times each model at each length in turn, the
two models side by side (which goes first swapped every round), as the faster of two training steps (a slower one
waited on other work on the machine), and every growth is read within a round. A machine that slows down or speeds
up as the run goes on (other work on it starting or ending) then moves a round's short and long timings, and the two
models', alike, where timing each model's lengths one after another, the Transformer's first, put a minute of drift
between the timings compared.

The control is a length where T does not grow: each round ends by timing the short length again, and the
Transformer's growth in time per token beyond the LSTM's from the round's first timing of it to this one must stay
within +-CONTROL_MARGIN. What is left of a drift inside one round shows there, where the claim's cause, a longer T,
is absent.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from attnkit import presets
from attnkit.config import RecurrentLMConfig
from attnkit.experiments.base import Check, Progress, Result, Stored, experiment
from attnkit.experiments.plots import fit_value_axis, log_log_axes, new_figure, save, series, spread_legend
from attnkit.models import build_model, count_parameters
from attnkit.models.recurrent import RecurrentLM
from attnkit.models.recurrent.rnn import Cell

VOCAB = 256  # bytes
# where T does not grow the claim must not show: the Transformer's growth in time per token beyond the LSTM's, timing
# the short length again at the end of a round, stays within +-this (what drifts within a round, not with T). Like the
# LSTM's flat bound (growth under 1.5) it is attnkit's, set before any run: the lectures name no amount
CONTROL_MARGIN = 0.25
SETTINGS = {  # Transformer width and layers, batch, lengths, timing rounds (the default --seeds)
    "tiny": dict(width=32, layers=1, batch=2, lengths=[8, 16, 32], repeats=2),
    "small": dict(width=128, layers=2, batch=4, lengths=[16, 64, 256, 1024], repeats=3),
    "full": dict(width=256, layers=4, batch=4, lengths=[16, 32, 64, 128, 256, 512, 1024, 2048], repeats=5),
    "gpu": dict(width=768, layers=6, batch=8, lengths=[64, 256, 1024, 2048, 4096], repeats=5),  # --device cuda
}


def transformer(width: int, layers: int, max_len: int) -> nn.Module:
    config = presets.get("gpt2-tiny", vocab_size=VOCAB, d_model=width, n_layers=layers, n_heads=max(width // 64, 1),
                         d_ff=4 * width, position="rope", max_seq_len=max_len, dropout=0.0)
    return build_model(config)


def matched_recurrent(target: int, *, embedding_dim: int, n_layers: int = 2, cell: Cell = "lstm",
                      vocab_size: int = VOCAB) -> RecurrentLM:
    """The recurrent language model (an LSTM unless `cell` says otherwise; tied embeddings) whose parameter count is
    closest to `target`, found by its hidden width; built from its `recurrent-lm` config, as `attnkit train` builds
    it."""

    def sized(hidden: int) -> RecurrentLM:
        return build_model(RecurrentLMConfig(vocab_size=vocab_size, embedding_dim=embedding_dim, hidden_size=hidden,
                                             n_layers=n_layers, cell=cell, tie_embeddings=True))

    high = 1
    while count_parameters(sized(high)) < target:  # double up to a width with enough parameters, then bisect
        high *= 2
    low = high // 2 + 1
    while low < high:  # the smallest hidden width with at least `target` parameters
        mid = (low + high) // 2
        low, high = (mid + 1, high) if count_parameters(sized(mid)) < target else (low, mid)
    return min((sized(max(low - 1, 1)), sized(low)), key=lambda m: abs(count_parameters(m) - target))


def prepare_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch: int,
                 length: int) -> tuple[Callable[[], float], int]:
    """One untimed training step of `model` on a batch of `length` tokens (AdamW allocates its state on the first),
    which measures the bytes autograd saves for its backward pass; returns a function that takes two more steps and
    gives the faster one's seconds (on the model's device, waited for), and those bytes."""
    device = next(model.parameters()).device
    ids = torch.randint(0, VOCAB, (batch, length + 1), generator=torch.Generator().manual_seed(length)).to(device)
    x, y = ids[:, :-1], ids[:, 1:]  # (B, T), (B, T)
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved: dict[int, int] = {}  # storage address -> bytes: a tensor saved twice is kept once; weights not counted

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in weights:
            saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x, labels=y, return_logits=False).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)

    def one_step() -> float:
        start = time.perf_counter()
        model(x, labels=y, return_logits=False).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    def timed_step() -> float:  # the faster of two steps: a slower one waited on other work (timeit's advice)
        return min(one_step(), one_step())

    return timed_step, sum(saved.values())


def plot(stored: Stored, out: Path) -> list[str]:
    """Time per step, time per token (median and each timing round) and memory kept for backward by T, log-log,
    each value axis at least a decade tall."""
    rows = stored.rows
    fig, axes = new_figure(15, 4, ncols=3)
    for name, marker in (("LSTM", "o"), ("Transformer", "s")):
        points = [(index, r) for index, r in enumerate(rows) if r["model"] == name]
        lengths = [r["T"] for _, r in points]
        label = f"{name} ({points[0][1]['parameters'] / 1e6:.2f}M parameters)"
        for ax, column in zip(axes, ("ms per step", "us per token"), strict=False):
            repeats = series(ax, lengths, [r[column] for _, r in points], marker=marker, label=label,
                             unit="round", seeds=stored.spread([(i, column) for i, _ in points]))
        axes[2].plot(lengths, [r["saved for backward (MB)"] for _, r in points], marker=marker, label=label)
    transformer_rows = [r for r in rows if r["model"] == "Transformer"]
    axes[2].plot([r["T"] for r in transformer_rows],
                 [r["attention matrices if materialised (MB)"] for r in transformer_rows], linestyle="--",
                 color="grey", label="attention matrices, if materialised")
    for ax, title, unit in zip(axes, ("time per training step", "time per token", "memory kept for backward"),
                               ("ms per step", "µs per token", "MB kept for backward"), strict=True):
        ax.set(xlabel="sequence length T", ylabel=unit, title=title)
        log_log_axes(ax, sorted({r["T"] for r in rows}))
        fit_value_axis(ax, "log")
        ax.grid(True, which="both", alpha=0.3)
    spread_legend(axes[0], over=f"median of {stored.seeds} rounds, each the faster of two steps", spread=repeats)
    axes[2].legend(fontsize=8)
    save(fig, out / "cost_by_length.png")
    return ["cost_by_length.png"]


@experiment(
    "rnn-vs-transformer-cost",
    claim="recurrence costs O(T) sequential steps while self-attention computes every position at once at "
    "O(T^2 d): the LSTM's time per token stays flat as T grows, the Transformer's grows with T, and so does the "
    "attention matrix's memory (quadratically)",
    lecture="RNNs and parallelizability (Vaswani et al. 2017, table 1)",
    devices=("cpu", "cuda"),
    default_seeds=lambda budget: SETTINGS[budget]["repeats"],  # timing rounds: the noise of a timing
    plot=plot,
)
def run(budget: str, out: Path, progress: Progress, *, seeds: int, device: str = "cpu") -> Result:
    s = SETTINGS[budget]
    torch.manual_seed(0)
    models = {"Transformer": transformer(s["width"], s["layers"], max(s["lengths"]))}
    models["LSTM"] = matched_recurrent(count_parameters(models["Transformer"]), embedding_dim=s["width"])
    on_gpu = torch.device(device).type == "cuda"
    for model in models.values():
        model.to(device)
    heads = max(s["width"] // 64, 1)
    short, long = s["lengths"][1], s["lengths"][-1]
    steps, saved = {}, {}  # (model, T) -> a function timing one training step, the bytes kept for backward
    for name, model in models.items():
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        for length in s["lengths"]:
            steps[(name, length)], saved[(name, length)] = prepare_step(model, optimizer, s["batch"], length)
    # times: (model, T, or "again": T=short timed last in each round) -> seconds, one a round. Each round times one
    # step of each length in turn, the two models side by side (their order swapped every round), so a machine that
    # slows or speeds up over the run moves a round's short and long timings, and both models', alike
    def one_round(order: list[str]) -> dict[tuple[str, int | str], float]:  # (model, T or "again") -> seconds
        return {(name, length): steps[(name, short if length == "again" else length)]()
                for length in [*s["lengths"], "again"] for name in order}

    progress.phase("warm-up round, untimed: the first steps at each length, one after another, run slow")
    one_round(list(models))
    times: dict[tuple[str, int | str], list[float]] = {(name, length): [] for name in models
                                                       for length in [*s["lengths"], "again"]}
    for round_ in range(seeds):
        progress.phase(f"timing round {round_ + 1} of {seeds}: each model at T="
                       + ", ".join(map(str, s["lengths"])) + f", then T={short} again")
        for key, seconds in one_round(list(models) if round_ % 2 == 0 else list(reversed(models))).items():
            times[key].append(seconds)
    rows = []
    for name, model in models.items():
        for length in s["lengths"]:
            seconds = statistics.median(times[(name, length)])
            attention_matrix = 4 * s["batch"] * heads * length * length * s["layers"] if name == "Transformer" else 0
            rows.append({"model": name, "parameters": count_parameters(model), "T": length,
                         "ms per step": 1e3 * seconds, "us per token": 1e6 * seconds / (s["batch"] * length),
                         "sequential steps": length if name == "LSTM" else s["layers"],
                         "saved for backward (MB)": saved[(name, length)] / 2**20,
                         "attention matrices if materialised (MB)": attention_matrix / 2**20})

    def per_token(name: str, index: int) -> float:
        return [r for r in rows if r["model"] == name][index]["us per token"]

    def growth(name: str, to: int | str = long) -> list[float]:  # per round: time per token at `to` over at short
        length = short if to == "again" else to
        return [(late / length) / (early / short) for early, late in zip(times[(name, short)], times[(name, to)],
                                                                          strict=True)]

    # per round: the Transformer's growth beyond the LSTM's where T does not grow, what drift a round holds
    drifts = [t - r for t, r in zip(growth("Transformer", "again"), growth("LSTM", "again"), strict=True)]
    lstm_growth = per_token("LSTM", -1) / per_token("LSTM", 1)
    transformer_growth = per_token("Transformer", -1) / per_token("Transformer", 1)
    checks = [
        Check.over(f"the Transformer's growth in time per token from T={short} to {long} minus the LSTM's",
                   [t - r for t, r in zip(growth("Transformer"), growth("LSTM"), strict=True)], unit="rounds"),
        Check.over(f"the LSTM's time per token stays flat: 1.5 minus its growth from T={short} to {long}",
                   [1.5 - g for g in growth("LSTM")], unit="rounds"),
        *(Check.over(f"control, T unchanged (T={short} timed again at the end of each round): {CONTROL_MARGIN:g} "
                     f"{sign} the Transformer's growth in time per token minus the LSTM's",
                     [CONTROL_MARGIN - side * drift for drift in drifts], unit="rounds")
          for sign, side in (("minus", 1), ("plus", -1))),
    ]
    if on_gpu:  # the parallel claim itself: at the longest length the Transformer's step is the cheaper per token
        checks.append(Check.over(
            f"on the GPU at T={long}: the LSTM's time per token over the Transformer's, minus 1",
            [lstm / transformer - 1 for lstm, transformer in zip(times[("LSTM", long)], times[("Transformer", long)],
                                                                 strict=True)], unit="rounds"))
    key = (f"time per token from T={short} to {long}: LSTM x{lstm_growth:.2f}, Transformer x{transformer_growth:.2f}; "
           f"LSTM {long} sequential steps vs {s['layers']} layers")
    reason = (f"per token, the LSTM's step time changes x{lstm_growth:.2f} from T={short} to T={long} and the "
              f"Transformer's x{transformer_growth:.2f} (medians of {seeds} steps); at T={long} the LSTM takes "
              f"{per_token('LSTM', -1) / per_token('Transformer', -1):.2f}x the Transformer's time per token")
    grows = transformer_growth > lstm_growth
    if not grows:
        reason += (" (at these widths the Transformer's O(T^2 d) attention is still small beside its O(T d^2) "
                   "projections)")
    if on_gpu:
        reason += (f"; measured on {torch.cuda.get_device_name(device)}, where the Transformer's positions run in "
                   "parallel")
    elif per_token("LSTM", -1) < per_token("Transformer", -1):
        reason += (f"; with {torch.get_num_threads()} CPU thread(s) there is little parallel hardware for the "
                   "Transformer's O(1) sequential depth to use, which is where a GPU changes the picture "
                   "(attnkit experiment rnn-vs-transformer-cost --device cuda)")
    per_seed = [{"ms per step": [1e3 * t for t in times[(row["model"], row["T"])]],
                 "us per token": [1e6 * t / (s["batch"] * row["T"]) for t in times[(row["model"], row["T"])]]}
                for row in rows]
    return Result(checks, reason, key, rows, [], per_seed)
