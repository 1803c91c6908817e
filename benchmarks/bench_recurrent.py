"""Time per training step against sequence length: an LSTM language model and a Transformer decoder of the same
parameter count (lecture: "RNNs and parallelizability").

    python -m benchmarks recurrent [--threads 1] [--repeats 3] [--lengths 16 32 ... 1024] [--batch 4]

The LSTM takes T steps one after another, each a small matrix product: O(T) sequential work of O(H^2) each. The
Transformer computes every position at once in large matrix products, but its attention grows as O(T^2 d). A
step is forward, backward and an AdamW update on `batch` sequences of T tokens. Results go to
benchmarks/results/recurrent-steps.json and .md, and the plot to recurrent-steps.png.
"""

from __future__ import annotations

import argparse

import torch
from matplotlib.figure import Figure

from attnkit import ModelConfig, build_model
from attnkit.models.recurrent import RecurrentLM
from benchmarks.common import RESULTS, median_seconds, parse_args, write_results

VOCAB = 256  # bytes
TRANSFORMER = dict(family="decoder", vocab_size=VOCAB, d_model=256, n_layers=4, n_heads=4, d_ff=1024,
                   position="rope", max_seq_len=1024, tie_embeddings=True)
LSTM_LAYERS, LSTM_EMBEDDING = 2, 256


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _lstm(hidden: int) -> RecurrentLM:
    return RecurrentLM(vocab_size=VOCAB, embedding_dim=LSTM_EMBEDDING, hidden=hidden, n_layers=LSTM_LAYERS,
                       cell="lstm", tie_embeddings=True)


def matched_lstm(target: int) -> RecurrentLM:
    """The 2-layer LSTM whose parameter count is closest to `target` (the count grows with the hidden width)."""
    low, high = 1, 4096
    while low < high:  # the smallest width with at least `target` parameters
        mid = (low + high) // 2
        low, high = (mid + 1, high) if _parameters(_lstm(mid)) < target else (low, mid)
    return min((_lstm(low - 1), _lstm(low)), key=lambda m: abs(_parameters(m) - target))


def _training_step(model: torch.nn.Module, batch: int, length: int):
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, VOCAB, (batch, length + 1), generator=generator)
    x, y = ids[:, :-1], ids[:, 1:]
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def run() -> None:
        model(x, targets=y, return_logits=False).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return run


def plot(rows: list[dict], path, *, threads: int, batch: int) -> None:
    figure = Figure(figsize=(10, 4))
    total, per_token = figure.subplots(1, 2)
    for name, marker in (("lstm", "o"), ("transformer", "s")):
        points = [r for r in rows if r["model"] == name]
        lengths = [r["length"] for r in points]
        label = f"{name} ({points[0]['parameters'] / 1e6:.2f}M parameters)"
        total.plot(lengths, [r["ms_per_step"] for r in points], marker=marker, label=label)
        per_token.plot(lengths, [r["us_per_token"] for r in points], marker=marker, label=label)
    for axes, title, unit in ((total, "time per training step", "ms"), (per_token, "time per token", "us")):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("sequence length T")
        axes.set_ylabel(unit)
        axes.set_title(title)
        axes.grid(True, which="both", alpha=0.3)
        axes.legend()
    figure.suptitle(f"forward + backward + AdamW, batch {batch}, CPU, {threads} thread(s)")
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    extra = argparse.ArgumentParser(add_help=False)
    extra.add_argument("--lengths", type=int, nargs="+", default=[16, 32, 64, 128, 256, 512, 1024])
    extra.add_argument("--batch", type=int, default=4)
    known, rest = extra.parse_known_args(argv)
    args = parse_args("recurrent", __doc__, rest, repeats=3)
    torch.manual_seed(0)
    transformer = build_model(ModelConfig(**TRANSFORMER))
    lstm = matched_lstm(_parameters(transformer))
    rows = []
    for name, model in (("lstm", lstm), ("transformer", transformer)):
        model.train()
        for length in known.lengths:
            seconds = median_seconds(_training_step(model, known.batch, length), args.repeats)
            rows.append({"model": name, "parameters": _parameters(model), "length": length, "batch": known.batch,
                         "ms_per_step": round(seconds * 1e3, 2),
                         "us_per_token": round(seconds * 1e6 / (known.batch * length), 2)})
            print(rows[-1], flush=True)
    by_length = {(r["model"], r["length"]): r for r in rows}
    table = [f"LSTM: 2 layers, hidden {lstm.rnn.hidden_size}, embedding {LSTM_EMBEDDING}, "
             f"{_parameters(lstm):,} parameters. Transformer: 4 layers, width 256, 4 heads, d_ff 1024, RoPE, "
             f"{_parameters(transformer):,} parameters. Batch {known.batch}; forward + backward + AdamW.", "",
             "| T | LSTM ms/step | Transformer ms/step | LSTM / Transformer | LSTM us/token | Transformer us/token |",
             "|---:|---:|---:|---:|---:|---:|"]
    for length in known.lengths:
        lstm_row, transformer_row = by_length[("lstm", length)], by_length[("transformer", length)]
        table.append(f"| {length} | {lstm_row['ms_per_step']} | {transformer_row['ms_per_step']} | "
                     f"{lstm_row['ms_per_step'] / transformer_row['ms_per_step']:.2f} | {lstm_row['us_per_token']} | "
                     f"{transformer_row['us_per_token']} |")
    write_results("recurrent-steps", "recurrent", args, argv, rows, table)
    plot(rows, RESULTS / "recurrent-steps.png", threads=args.threads, batch=known.batch)
    print("\n".join(table))
    return 0
