"""`--budget gpu`: the sizes a GPU makes cheap, for the experiments whose claims are about GPUs
(rnn-vs-transformer-cost, transformer-plus-plus, with --device cuda); refused with the fix elsewhere."""

from __future__ import annotations

import pytest
import torch

from attnkit import ModelConfig, cli
from attnkit.errors import ConfigError
from attnkit.experiments import run_experiment
from attnkit.experiments.rnn_transformer_cost import SETTINGS
from attnkit.experiments.transformer_plus_plus import SIZES, plus_plus, vaswani
from attnkit.models import count_parameters


def test_the_gpu_budget_reaches_the_size_where_the_10x_claim_is_made():
    width, layers = SIZES["gpu"][-1]
    for fields in (vaswani(width, layers), plus_plus(width, layers)):
        assert count_parameters(ModelConfig(**fields, vocab_size=100)) >= 50_000_000
    assert max(SETTINGS["gpu"]["lengths"]) > max(SETTINGS["full"]["lengths"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for runs off a GPU")
@pytest.mark.parametrize("name", ["transformer-plus-plus", "rnn-vs-transformer-cost"])
def test_the_gpu_budget_off_a_gpu_is_refused_naming_the_fix(name, tmp_path):
    with pytest.raises(ConfigError, match="--budget gpu sizes a run for a GPU.*--device cuda.*this run is on cpu"):
        run_experiment(name, budget="gpu", out=tmp_path)
    assert not any(tmp_path.iterdir())


def test_the_gpu_budget_of_a_cpu_experiment_is_refused(tmp_path, capsys):
    with pytest.raises(ConfigError, match="'scaled-dot' runs on the CPU only: use --budget tiny, small or full"):
        run_experiment("scaled-dot", budget="gpu", out=tmp_path)
    assert cli.main(["experiment", "scaled-dot", "--budget", "gpu", "--out", str(tmp_path / "x")]) == 2
    assert "--budget tiny, small or full" in capsys.readouterr().err
