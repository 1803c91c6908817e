"""Runs written by the code before the redesign (commit 6709840, the parent of 0f9e0de, efc4f4f and 41b2c60: one
flat ModelConfig, the old position code, the hand-written command line) still load, compute the same function,
generate the same text and resume training with today's code.

tests/data/legacy_runs/decoder-run-6709840 is a whole run directory that code's `attnkit train` wrote (a tiny
GPT-2-shaped decoder, char tokenizer, 4 steps, checkpoints at steps 2 and 4, best/, train_state.json, optimizer
state, token cache, metrics.jsonl; only the two PNGs under plots/ were left out). decoder-hf-gpt2-converted-6709840
is that code's `attnkit convert --from-hf` of a tiny random GPT2LMHeadModel with a word-level tokenizer.json.
Each holds expected.safetensors (an input and the old code's logits; for the run, also the logits after the old
code resumed it to step 6) and expected.json (the old code's greedy text; for the run, its train losses of steps
1 to 6). test_families.py's flat-config test reads these two as well.
"""

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import attnkit
from attnkit import cli
from attnkit.checkpoint import load_config, load_model
from attnkit.config import TransformerConfig
from attnkit.train import TrainRequest, prepare
from attnkit.train.metrics import MetricsLog

LEGACY = Path(__file__).parent / "data" / "legacy_runs"
RUN = LEGACY / "decoder-run-6709840"
CONVERTED = LEGACY / "decoder-hf-gpt2-converted-6709840"
# the text the old run trained on (it was /tmp/legacy_make/tiny.txt; train_state.json keeps that absolute path)
LINES = ["the quick brown fox jumps over the lazy dog.", "a small model reads a small text.",
         "attention is what the tokens pay to each other.", "old runs must still load and resume."]
TEXT = "\n".join(LINES * 12) + "\n"


@pytest.fixture(autouse=True)
def single_threaded():
    """The old code recorded everything on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _recorded(run):
    return load_file(str(run / "expected.safetensors")), json.loads((run / "expected.json").read_text())


def _copy_with_data(tmp_path):
    """A copy of the old run (never train inside tests/data) and the text it trained on."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run)
    data = tmp_path / "tiny.txt"
    data.write_text(TEXT, encoding="utf-8")
    return run, data


def _train_losses(run):
    """{step: loss} of the run's logged training steps."""
    return {r["step"]: r["loss"] for r in MetricsLog(run / "metrics.jsonl").records("train")}


@pytest.mark.parametrize("run", [RUN, CONVERTED], ids=lambda p: p.name)
def test_old_run_loads_and_generates_what_the_old_code_did(run):
    assert not (run / "checksums.json").exists()  # written before checkpoints carried checksums
    config = load_config(run)
    assert isinstance(config, TransformerConfig) and config.family == "decoder"
    expected, recorded = _recorded(run)
    pipeline = attnkit.load(run, device="cpu")  # fused q/k/v and transposed weights: the inference layout
    with torch.no_grad():
        torch.testing.assert_close(pipeline.model(expected["input_ids"]).logits, expected["logits"])
    text = pipeline.generate(recorded["prompt"], max_new_tokens=recorded["max_new_tokens"], temperature=0,
                             stop_at_eos=False)
    assert text == [recorded["greedy"]]


def test_old_run_resumes_from_the_command_line_as_the_old_code_did(tmp_path):
    """`attnkit train --resume` continues the finished 4-step run to step 6: the same losses the old code logged
    when it resumed the same run, and the same weights (logits) at the end."""
    run, data = _copy_with_data(tmp_path)
    code = cli.main(["train", "--out", str(run), "--resume", "--max-steps", "6", "--data", str(data),
                     "--device", "cpu", "--sample-tokens", "0", "--no-progress"])
    assert code == 0
    assert json.loads((run / "train_state.json").read_text())["step"] == 6
    expected, recorded = _recorded(RUN)
    assert _train_losses(run) == pytest.approx(dict(recorded["train_losses"]), rel=1e-5, abs=1e-6)
    model, _ = load_model(run)
    with torch.no_grad():
        torch.testing.assert_close(model(expected["input_ids"]).logits, expected["resumed_logits"])
    text = attnkit.load(run, device="cpu").generate("the ", max_new_tokens=5, temperature=0, stop_at_eos=False)
    assert len(text) == 1 and text[0]


def test_old_checkpoint_forks_and_retraces_the_old_steps(tmp_path):
    """Resumed from the old run's step-2 checkpoint into a new directory, today's trainer takes steps 3 and 4 as
    the old code took them: its logged losses and the old step_000004 weights."""
    source, data = _copy_with_data(tmp_path)
    fork = tmp_path / "fork"
    trainer = prepare(TrainRequest(out=str(fork), resume=str(source / "checkpoints" / "step_000002"),
                                   data={"data": (str(data),)}, device="cpu", progress=False))
    assert trainer.step == 2
    trainer.fit()
    old_losses = _train_losses(RUN)
    assert {step: loss for step, loss in _train_losses(fork).items() if step > 2} == pytest.approx(
        {3: old_losses[3], 4: old_losses[4]}, rel=1e-5, abs=1e-6)
    new, old = load_model(fork)[0].state_dict(), load_file(str(RUN / "checkpoints" / "step_000004" /
                                                                "model.safetensors"))
    for name, tensor in old.items():
        torch.testing.assert_close(new[name], tensor, msg=name)
