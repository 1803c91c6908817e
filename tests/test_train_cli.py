"""`attnkit train` as a user meets it: every option explained, Ctrl-C (or SIGTERM) saves and says how to resume,
mistakes reported without a traceback."""

import argparse
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from attnkit import cli, options
from attnkit.train.precision import TRAIN_DTYPES

TINY = ["--set", "d_model=32", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "d_ff=64",
        "--set", "max_seq_len=24", "--batch-size", "4", "--no-progress"]


def train_parser() -> argparse.ArgumentParser:
    sub = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["train"]


def test_help_explains_every_option(capsys):
    parser = train_parser()
    with pytest.raises(SystemExit):
        cli.main(["train", "--help"])
    text = capsys.readouterr().out
    for action in parser._actions:
        assert action.help and len(action.help) > 10, action.option_strings
        for option in action.option_strings:
            assert option in text
    for word in ("cosine", "noam", "constant", "bf16", "--resume", "synthetic:"):
        assert word in text
    dtype = next(action for action in parser._actions if "--dtype" in action.option_strings)
    assert tuple(dtype.choices) == TRAIN_DTYPES  # the CLI offers every training precision, and only those


@pytest.mark.parametrize(("text", "seconds"), [("300", 300.0), ("90s", 90.0), ("5m", 300.0), ("1.5h", 5400.0)])
def test_durations(text, seconds):
    assert options.duration(text) == seconds


def test_bad_duration_is_refused():
    with pytest.raises(argparse.ArgumentTypeError, match="no duration"):
        options.duration("five minutes")


def test_a_mistake_is_reported_without_a_traceback(tmp_path, capsys):
    code = cli.main(["train", "--data", "synthetic:copy", "--out", str(tmp_path), "--set", "colour=red"])
    assert code == 2
    err = capsys.readouterr().err
    assert "attnkit: error: --set colour: no such setting" in err and "Traceback" not in err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_finishes_the_step_saves_and_says_how_to_resume(tmp_path, sig):
    out = tmp_path / "run"
    command = [sys.executable, "-m", "attnkit.cli", "train", "--data", "synthetic:copy", "--out", str(out),
               "--max-steps", "100000", "--eval-every", "3", *TINY]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while not (out / "checkpoints").is_dir() and time.monotonic() < deadline and process.poll() is None:
            time.sleep(0.2)
        assert process.poll() is None, process.communicate()
        process.send_signal(sig)
        _, err = process.communicate(timeout=120)
    finally:
        process.kill()
    assert process.returncode == 128 + sig, err
    assert "Traceback" not in err
    assert f"stopped by {signal.Signals(sig).name} after step" in err
    assert f"Resume with: attnkit train --out {out} --resume" in err
    step = json.loads((out / "train_state.json").read_text())["step"]
    assert f"after step {step};" in err
    assert (out / "checkpoints" / f"step_{step:06d}" / "model.safetensors").is_file()
    assert max(json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()) == step
    code = cli.main(["train", "--out", str(out), "--resume", "--max-steps", str(step + 2), "--sample-tokens", "4",
                     "--no-progress"])
    assert code == 0
    assert json.loads((out / "train_state.json").read_text())["step"] == step + 2
    assert (out / "plots" / "loss.png").read_bytes()[:4] == b"\x89PNG"
