"""A task of one's own, registered from outside the package (the example of docs/guides/tasks.md), trains,
evaluates, saves and serves through the public API and, found through the `attnkit.tasks` entry point, through
the command line, with no edit to attnkit."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import attnkit
from attnkit.tasks import task_names, unregister
from attnkit.train import TrainRequest, prepare
from attnkit.train.evaluate import evaluate_run

OWN_TASK = '''
"""length: is a line longer than 20 characters? An encoder classifier that reads plain lines and labels them itself."""

import torch

from attnkit.data import LabelledData, LabelVocab, pad, read_lines
from attnkit.tasks import EvalReport, TaskSpec, register
from attnkit.tasks.classify import ClassifyTask, predict_labels
from attnkit.tasks.common import split

LABELS = LabelVocab(("long", "short"))


def examples(path):
    return [(line, "long" if len(line) > 20 else "short") for line in read_lines(path) if line]


def batches(examples, tokenizer, max_len, batch_size=32, seed=0):
    return LabelledData.from_examples(examples, tokenizer, label_vocab=LABELS, max_len=max_len,
                                      batch_size=batch_size, seed=seed)


def make(ctx):
    train, val = split(examples(ctx.data.data[0]), ctx.data.val_fraction, ctx.seed)
    data = [batches(part, ctx.tokenizer, ctx.seq_len, ctx.batch_size, ctx.seed) for part in (train, val)]
    return ClassifyTask(*data), list(LABELS.labels)


def evaluate_files(ctx):
    rows = []
    for path in ctx.files:
        loss, truth, guesses = predict_labels(ctx.model, batches(examples(path), ctx.tokenizer, ctx.config.max_seq_len))
        rows.append({"file": path, "lines": len(truth), "accuracy": sum(map(int.__eq__, truth, guesses)) / len(truth)})
    return EvalReport("length", str(ctx.run), rows, columns=("file", "lines", "accuracy"))


@torch.inference_mode()
def judge(pipeline, texts):
    tok = pipeline.tokenizer
    ids, mask = pad([[tok.cls_id, *tok.encode(t), tok.sep_id] for t in texts], tok.pad_id, device=pipeline.device)
    return [pipeline.labels[i] for i in pipeline.model(ids, attention_mask=mask).logits.argmax(-1).tolist()]


register(TaskSpec(
    name="length", help="is a line longer than 20 characters (encoder)", families=("encoder",),
    head={"encoder_head": "classify", "mlm_transform": False}, make=make, evaluate_files=evaluate_files,
    method="judge", pipeline=judge, labelled=True, training_text=lambda data, seed: read_lines(data.data[0]),
    default_model=dict(family="encoder", d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=64,
                       encoder_head="classify", pooling="mean"),
))
'''


@pytest.fixture
def own_task(tmp_path, monkeypatch):
    """The module in a folder of its own, importable, and a text file of short and long lines."""
    folder = tmp_path / "plugin"
    folder.mkdir()
    (folder / "length_task.py").write_text(textwrap.dedent(OWN_TASK), encoding="utf-8")
    lines = [("a" * n if n % 2 else "b c " * (n // 4 + 1))[:n] for n in range(4, 40)] * 6
    (tmp_path / "lines.txt").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    monkeypatch.syspath_prepend(str(folder))
    torch.set_num_threads(1)
    yield folder
    unregister("length")
    sys.modules.pop("length_task", None)


def test_an_own_task_trains_evaluates_saves_and_serves_through_the_api(tmp_path, own_task):
    import length_task  # noqa: F401 (registers "length")

    assert "length" in task_names()
    run = tmp_path / "run"
    trainer = prepare(TrainRequest(out=str(run), task="length", data={"data": (str(tmp_path / "lines.txt"),),
                                                                       "tokenizer": "char"},
                                   settings=dict(max_steps=60, batch_size=16, eval_every=60, lr=3e-3),
                                   progress=False))
    result = trainer.fit()
    assert json.loads((run / "task.json").read_text())["task"] == "length"
    report = evaluate_run(run, [tmp_path / "lines.txt"])
    assert report.kind == "length" and report.rows[0]["lines"] == 216
    assert result.evaluation["accuracy"] > 0.5
    pipeline = attnkit.load(run)
    assert pipeline.methods == ("judge",) and not hasattr(pipeline, "classify")
    assert set(pipeline.judge(["tiny", "a much longer line than twenty characters"])) <= {"long", "short"}


@pytest.mark.slow  # installs a package and trains through the CLI (12 s); the registration tests stay
def test_an_own_task_found_through_its_entry_point_runs_from_the_command_line(tmp_path, own_task):
    """A distribution's entry point in the `attnkit.tasks` group: `attnkit train --task length` finds it."""
    info = own_task / "length_task-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: length-task\nVersion: 0.1\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[attnkit.tasks]\nlength = length_task\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(own_task), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    run = tmp_path / "cli-run"

    def attnkit_cli(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "attnkit", *argv], env=env, capture_output=True, text=True,
                              timeout=300)

    done = attnkit_cli("train", "--task", "length", "--data", str(tmp_path / "lines.txt"), "--tokenizer", "char",
                       "--max-steps", "20", "--batch-size", "16", "--eval-every", "20", "--out", str(run),
                       "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "validation: val_loss" in done.stdout
    done = attnkit_cli("eval", str(run), "--data", str(tmp_path / "lines.txt"))
    assert done.returncode == 0, done.stderr
    assert json.loads((run / "eval" / "eval.json").read_text())["kind"] == "length"
    assert (Path(run) / "model.safetensors").is_file()
