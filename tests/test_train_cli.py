"""`attnkit train` as a user meets it: every option explained, Ctrl-C (or SIGTERM) saves and says how to resume,
mistakes reported without a traceback."""

import argparse
import json
import os
import re
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


@pytest.mark.parametrize("sig", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)])
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


@pytest.mark.parametrize(("argv", "message"), [
    (["--sample-tokens", "-5"], "sample_tokens=-5 must be a number of tokens (0: no sample)"),
    (["--resume", "--overwrite"], "which --overwrite would replace: give one of the two"),
    (["--resume", "{out}/best", "--overwrite"], "which --overwrite would replace: give one of the two"),
    (["--tokenizer", "char", "--vocab-size", "500"],
     "--tokenizer char has its own vocabulary (a char tokenizer's is the text's characters): drop --vocab-size"),
])
def test_contradictory_or_negative_options_are_refused_before_anything_runs(tmp_path, capsys, argv, message):
    out = tmp_path / "run"
    assert cli.main(["train", "--out", str(out), *(a.format(out=out) for a in argv)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_resume_elsewhere_may_overwrite_the_new_out():
    run = cli.parse(["train", "--resume", "runs/a/best", "--out", "runs/b", "--overwrite"]).settings
    assert (run.resume, run.overwrite) == ("runs/a/best", True)


def test_a_model_config_that_is_a_directory_says_so(tmp_path, capsys):
    (tmp_path / "conf").mkdir()
    argv = ["train", "--model-config", str(tmp_path / "conf"), "--out", str(tmp_path / "run"), "--data",
            "synthetic:copy"]
    assert cli.main(argv) == 2
    assert f"config file {tmp_path / 'conf'} is a directory, not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize(("text", "split", "fix"), [
    ("one line of text\n", "training", "give more text (--data) or a shorter --seq-len"),
    ("a line of text\n" * 10, "validation", "give more text (--data), a shorter --seq-len or a larger --val-fraction"),
])
def test_language_model_data_too_short_for_a_window_names_the_file_and_the_fix_that_helps(tmp_path, capsys, text,
                                                                                          split, fix):
    data = tmp_path / "text.txt"
    data.write_text(text, encoding="utf-8")
    argv = ["train", "--data", str(data), "--tokenizer", "char", "--out", str(tmp_path / "run"), *TINY]
    assert cli.main(argv) == 2
    expected = f"the {split} split of {data} has 15 tokens, fewer than one window needs (25): {fix}"
    assert expected in capsys.readouterr().err


@pytest.mark.parametrize("task", ["lm", "mlm"])
@pytest.mark.parametrize("tokenizer", ["char", "bpe"])
def test_an_empty_training_file_is_named(tmp_path, capsys, task, tokenizer):
    data = tmp_path / "empty.txt"
    data.write_bytes(b"")
    argv = ["train", "--task", task, "--data", str(data), "--tokenizer", tokenizer, "--out", str(tmp_path / "run")]
    assert cli.main(argv) == 2
    message = f"the training text is empty: {data} hold(s) no bytes; give --data files with text"
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("flag, shown", [("--no-progress", False), ("--progress", True)])
def test_no_progress_hides_the_tokenizing_bar_too(tmp_path, capsys, flag, shown):
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    argv = [a for a in TINY if a != "--no-progress"]
    assert cli.main(["train", "--data", str(text), "--tokenizer", "char", "--out", str(tmp_path / "run"),
                     "--max-steps", "1", "--eval-every", "1", *argv, flag]) == 0
    assert ("tokenizing" in capsys.readouterr().err) == shown


def test_no_training_setting_shares_its_set_key_with_a_model_field():
    """`--set KEY=VALUE` goes to the model config and to the training settings alike when both have KEY, so a
    training setting named like a model field (the recurrent seq2seq's `attention=luong-general`) breaks one of them."""
    import dataclasses

    from attnkit.config import model_field_names
    from attnkit.train.trainer import TrainConfig

    assert {f.name for f in dataclasses.fields(TrainConfig)} & model_field_names() == set()


@pytest.mark.parametrize("budget, hint", [
    (["--max-steps", "2"], "--resume --max-steps N"),
    (["--max-steps", "100000", "--max-time", "0.2"], "--resume --max-time DURATION"),
])
def test_the_resume_hint_names_the_budget_that_ended_the_run(tmp_path, capsys, budget, hint):
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    assert cli.main(["train", "--data", str(text), "--tokenizer", "char", "--out", str(tmp_path / "run"),
                     "--sample-tokens", "0", "--eval-every", "100000", *TINY, *budget]) == 0
    assert capsys.readouterr().out.rstrip().endswith(hint)


def test_a_run_ends_saying_where_it_is_and_where_its_curves_and_metrics_are(tmp_path, capsys):
    """The closing lines name the run's best checkpoint, its loss curves and its metrics log, each of them there, and
    end with how to resume."""
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    assert cli.main(["train", "--data", str(text), "--tokenizer", "char", "--out", str(tmp_path / "run"),
                     "--sample-tokens", "0", "--eval-every", "100000", *TINY, "--max-steps", "2"]) == 0
    closing = "\n".join(capsys.readouterr().out.rstrip().splitlines()[-2:])
    named = re.findall(rf"{re.escape(str(tmp_path / 'run'))}/(best|plots/loss\.png|metrics\.jsonl)\b", closing)
    assert sorted(named) == ["best", "metrics.jsonl", "plots/loss.png"], closing
    assert all((tmp_path / "run" / name).exists() for name in named)
    assert closing.endswith("--resume --max-steps N")
