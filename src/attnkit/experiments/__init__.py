"""The lectures' claims as experiments: `attnkit experiment NAME [--budget small|full] [--out DIR]`.

Each module states one claim and the lecture that makes it, runs through the public API over several seeds, and
returns a `Result` with the checks its claim predicts; one rule (`base.verdict_of`) makes the verdict: held, did not
hold at this scale, mixed, or inconclusive at this budget where a difference is inside the noise across seeds.
`run_experiment` writes its `results.json`, `table.md` and PNG plots; `replot` redraws a stored run's plots from its
results.json.
"""

from attnkit.experiments import (  # noqa: F401  (each module registers itself)
    ab_task,
    bottleneck,
    gqa_memory,
    heads_specialise,
    kernel_regression,
    norm_placement,
    position_extrapolation,
    referent_head,
    rnn_forgets,
    rnn_transformer_cost,
    scaled_dot,
    score_functions,
    sequence_models,
    transformer_plus_plus,
)
from attnkit.experiments.base import BUDGETS, REGISTRY, Result, Stored, get, replot, run_experiment

__all__ = ["BUDGETS", "REGISTRY", "Result", "Stored", "get", "replot", "run_experiment"]
