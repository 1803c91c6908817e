"""Ctrl-C during `attnkit train`, then `--resume`, ends where the run would have ended uninterrupted: the same weights,
AdamW moments, RNG and data position, and the same logged losses after the stop, bit for bit (CPU, fp32, one thread).

The interrupted run is a real process sent a real SIGINT while it trains; the uninterrupted run and the resume run
in this process, through the same `attnkit.cli.main`."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from attnkit import cli
from attnkit.train.trainer import Trainer

MAX_STEPS, SIGNAL_AFTER = 40, 12  # the child is sent SIGINT once its metrics show step SIGNAL_AFTER
THROTTLE = 1.0  # s each child step past SIGNAL_AFTER waits first: the parent's window to signal before the run ends
# dropout on (the RNG state matters), two micro-batches a step, warmup then cosine, evaluations before and after
SETTINGS = ["--tokenizer", "char", "--seq-len", "24", "--set", "d_model=32", "--set", "n_layers=1",
            "--set", "n_heads=2", "--set", "d_ff=64", "--set", "max_seq_len=24", "--set", "dropout=0.1",
            "--batch-size", "4", "--grad-accum", "2", "--max-steps", str(MAX_STEPS), "--warmup", "5",
            "--schedule", "cosine", "--lr", "3e-3", "--eval-every", "10", "--eval-batches", "2", "--seed", "3",
            "--compile", "off", "--no-progress", "--sample-tokens", "0"]
# The child is `attnkit train` itself; each step past SIGNAL_AFTER first waits THROTTLE s, so the signal lands
# while a step is under way (it must finish, be saved, and be the step the resume starts after).
# The signal handler also leaves a file saying it ran, so that a second Ctrl-C is sent after the first is taken.
CHILD = textwrap.dedent(f"""
    import pathlib, sys, time
    from attnkit import cli
    from attnkit.train import trainer
    step, handle = trainer.Trainer.train_step, trainer._StopOnSignal._handle
    def throttled(self):
        if self.step >= {SIGNAL_AFTER}:
            time.sleep({THROTTLE})
        step(self)
    def handled(self, signum, frame):
        handle(self, signum, frame)
        pathlib.Path(sys.argv[-1]).write_text("taken")
    trainer.Trainer.train_step, trainer._StopOnSignal._handle = throttled, handled
    sys.exit(cli.main(sys.argv[1:-1]))
""")


def text_file(path: Path) -> Path:
    words = "the cat sat on a mat and a dog ran far from home while birds sang".split()
    draw = random.Random(1)
    path.write_text("\n".join(" ".join(draw.choice(words) for _ in range(12)) for _ in range(300)))
    return path


def logged_steps(run: Path) -> list[dict]:
    """Every train, eval and instruments record of metrics.jsonl (a partly written last line is not yet a record)."""
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return records


def train_state(run: Path) -> dict:
    """train_state.json less the seconds trained, which no two runs share."""
    state = json.loads((run / "train_state.json").read_text())
    del state["elapsed"]
    return state


def wait_for(ready, process: subprocess.Popen, what: str, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if process.poll() is not None:
            pytest.fail(f"the run ended before {what}: {process.communicate()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.02)


def wait_for_step(process: subprocess.Popen, run: Path, step: int, *, timeout: float) -> None:
    def reached() -> bool:
        return any(r["kind"] == "train" and r["step"] >= step for r in logged_steps(run))

    wait_for(reached, process, f"step {step} in {run / 'metrics.jsonl'}", timeout=timeout)


def assert_same_records(a: list[dict], b: list[dict]) -> None:
    assert len(a) == len(b), f"{len(a)} records, uninterrupted {len(b)}"
    for mine, theirs in zip(a, b, strict=True):
        assert mine == theirs, f"resumed {mine} != uninterrupted {theirs}"


def assert_same_tensors(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what: str) -> None:
    assert a.keys() == b.keys(), what
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), f"{what}: {name} differs"


@pytest.mark.parametrize("presses", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_ctrl_c_then_resume_ends_bit_for_bit_where_the_uninterrupted_run_ends(tmp_path, presses):
    """One Ctrl-C: the step under way finishes and is saved. Two: the run stops at once, unsaved, says which
    checkpoint (the last evaluation's) the resume starts from, and the resume still ends bit for bit."""
    data = text_file(tmp_path / "text.txt")
    whole, stopped = tmp_path / "whole", tmp_path / "stopped"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    taken = tmp_path / "signal-taken"
    argv = ["train", "--data", str(data), "--out", str(stopped), *SETTINGS, str(taken)]
    child = subprocess.Popen([sys.executable, "-c", CHILD, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=env)
    try:
        assert cli.main(["train", "--data", str(data), "--out", str(whole), *SETTINGS]) == 0  # while the child starts
        wait_for_step(child, stopped, SIGNAL_AFTER, timeout=120)
        child.send_signal(signal.SIGINT)
        if presses == 2:  # once the first is taken: two sent at once may arrive as one
            wait_for(taken.is_file, child, "the first SIGINT taken", timeout=120)
            child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 128 + signal.SIGINT, err
    stop = train_state(stopped)["step"]
    assert err.count("stopping after this step and saving a checkpoint") == 1, err  # said when taken, not at the end
    if presses == 1:
        assert SIGNAL_AFTER <= stop < MAX_STEPS, f"stopped after step {stop}: {err}"
        assert f"stopped by SIGINT after step {stop}" in err
    else:
        assert stop == 10, err  # the evaluation before SIGNAL_AFTER
        assert re.search(rf"stopped at once by a second SIGINT after step 1[23], unsaved; the last checkpoint is "
                         rf"{re.escape(str(stopped / 'checkpoints' / 'step_000010'))}\. Resume with: attnkit train "
                         rf"--out {re.escape(str(stopped))} --resume", err), err

    assert cli.main(["train", "--out", str(stopped), "--resume", "--no-progress", "--sample-tokens", "0"]) == 0

    assert_same_records(logged_steps(stopped), logged_steps(whole))  # losses, rates, gradient norms, evaluations
    assert train_state(stopped) == train_state(whole)  # RNG states, data position, tokens seen, best
    assert_same_tensors(load_file(stopped / "model.safetensors"), load_file(whole / "model.safetensors"), "weights")
    assert_same_tensors(load_file(stopped / "optimizer.safetensors"), load_file(whole / "optimizer.safetensors"),
                        "AdamW state")


def test_two_ctrl_c_before_the_first_checkpoint_say_there_is_nothing_to_resume(tmp_path, monkeypatch, caplog):
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signal handlers are installed only by the main thread; a SIGINT here would stop the tests")
    def pressed_twice(self):
        signal.raise_signal(signal.SIGINT)  # its handler runs before this returns: stop after this step
        signal.raise_signal(signal.SIGINT)  # the second: stop at once, before the step has trained

    monkeypatch.setattr(Trainer, "train_step", pressed_twice)
    argv = ["train", "--data", str(text_file(tmp_path / "text.txt")), "--out", str(tmp_path / "run"), *SETTINGS]
    assert cli.main(argv) == 128 + signal.SIGINT
    assert "stopped at once by a second SIGINT after step 0, before any checkpoint was written: nothing to resume; " \
           "start again" in caplog.text
