"""The language models with their own decoding state share `StatefulLM` (models/stateful_lm.py): runs that the
recurrent LM and encoder-decoder wrote before it took over their output layer still load, compute the same logits,
and the same seed still builds the same weights (tests/data/stateful_runs/README.md says how they were made)."""

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnkit.checkpoint import load_model
from attnkit.models import build_model

RUNS = Path(__file__).parent / "data" / "stateful_runs"


@pytest.mark.parametrize("name", sorted(p.name for p in RUNS.iterdir() if p.is_dir()))
def test_runs_written_before_stateful_lm_load_and_compute_the_same(name):
    model, config = load_model(RUNS / name, require_checksums=True)
    expected = load_file(str(RUNS / name / "expected.safetensors"))
    inputs = [expected["input_ids"]] + ([expected["decoder_input_ids"]] if "decoder_input_ids" in expected else [])
    with torch.no_grad():
        logits = model.eval()(*inputs).logits
    torch.testing.assert_close(logits, expected["logits"])
    torch.manual_seed(0)  # as make.py built them
    fresh = build_model(config).state_dict()
    stored = model.state_dict()
    assert fresh.keys() == stored.keys()
    for key in stored:
        torch.testing.assert_close(fresh[key], stored[key], rtol=0, atol=0, msg=key)
