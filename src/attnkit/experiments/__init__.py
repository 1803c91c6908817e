"""The lectures' claims as experiments: `attnkit experiment NAME [--budget small|full] [--out DIR]`.

Each module states one claim and the lecture that makes it, runs through the public API, and returns a `Result`
ending in a verdict (held, did not hold at this scale, or mixed, and why); `run_experiment` writes its
`results.json`, `table.md` and PNG plots.
"""

from attnkit.experiments import (  # noqa: F401  (each module registers itself)
    ab_task,
    bottleneck,
    gqa_memory,
    kernel_regression,
    norm_placement,
    position_extrapolation,
    rnn_transformer_cost,
    scaled_dot,
    score_functions,
    transformer_plus_plus,
)
from attnkit.experiments.base import BUDGETS, REGISTRY, Result, get, run_experiment

__all__ = ["BUDGETS", "REGISTRY", "Result", "get", "run_experiment"]
