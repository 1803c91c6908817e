"""Time and memory per training step against sequence length: an LSTM language model and a Transformer decoder
of the same parameter count (lecture: "RNNs and parallelizability").

    python -m benchmarks recurrent [--threads 1] [--budget small|full]

The measurement is the `rnn-vs-transformer-cost` experiment (`attnkit.experiments.rnn_transformer_cost`): its
table, plot and verdict go to benchmarks/results/recurrent-steps/ (results.json, table.md, cost_by_length.png).
"""

from __future__ import annotations

import argparse

import torch

from attnkit.experiments import run_experiment
from benchmarks.common import RESULTS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks recurrent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--budget", choices=("small", "full"), default="full")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    result = run_experiment("rnn-vs-transformer-cost", budget=args.budget, out=RESULTS / "recurrent-steps")
    print(result.table_markdown())
    print(f"{result.verdict}: {result.reason}")
    return 0
