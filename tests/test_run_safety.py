"""Nothing lost, nothing silent: --overwrite keeps the old run until the new one has a checkpoint, one process owns
a run directory, damaged checkpoints are refused by name and resumes fall back past them, and a kill at any point of
a save or a fork leaves a run that both resuming and `attnkit.load` accept."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from test_train_state import save, trained_pieces

import attnkit
from attnkit.checkpoint import CHECKSUMS_FILE, WEIGHTS_FILE
from attnkit.errors import CheckpointError, ConfigError, InputError
from attnkit.train import TrainRequest, prepare, rundir, state
from attnkit.train.memory import check_fits
from attnkit.train.trainer import Trainer

TINY = ["d_model=32", "n_layers=1", "n_heads=2", "d_ff=64", "max_seq_len=24"]
KILLED = 77  # the exit status of a process killed at a fault point


@pytest.fixture(autouse=True)
def small_synthetic_sets(monkeypatch):
    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (400, 16))


def request(out, *, overrides=(), data="synthetic:copy", task="lm", steps=2, **flags) -> TrainRequest:
    settings = dict(max_steps=steps, batch_size=4, warmup=1, eval_every=2, seed=3)
    return TrainRequest(out=str(out), task=task, overrides=[*TINY, *overrides], progress=False,
                        data={"data": (data,), "eval_batches": 1}, settings=settings, **flags)


def trained_run(out) -> dict:
    """A finished two-step run in `out`; returns its top-level train state."""
    prepare(request(out)).fit()
    return json.loads((out / "train_state.json").read_text())


def weights(path) -> dict[str, torch.Tensor]:
    return attnkit.load(path, device="cpu").model.state_dict()


# --overwrite -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("mistake", [
    dict(overrides=["lr=-1"]),
    dict(data="no/such/file.txt"),
    dict(overrides=["no_such_setting=1"]),
    dict(preset="no-such-preset"),
])
def test_overwrite_with_a_mistake_leaves_the_old_run_whole(tmp_path, mistake):
    before = trained_run(tmp_path)
    files = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises((ConfigError, InputError)):
        prepare(request(tmp_path, overwrite=True, **mistake))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == files
    assert json.loads((tmp_path / "train_state.json").read_text()) == before
    state.resume_checkpoint(tmp_path)


def test_overwrite_keeps_the_old_run_aside_until_the_first_checkpoint(tmp_path, monkeypatch):
    old = trained_run(tmp_path)
    trainer = prepare(request(tmp_path, overwrite=True, overrides=["d_model=16"]))
    (aside,) = tmp_path.glob(".replaced-*")
    assert (aside / "checkpoints").is_dir() and not (tmp_path / "checkpoints").exists()

    def broken_step():
        raise RuntimeError("the new run fails before its first checkpoint")

    monkeypatch.setattr(trainer, "train_step", broken_step)
    with pytest.raises(RuntimeError, match="first checkpoint"):
        trainer.fit()
    assert not list(tmp_path.glob(".replaced-*"))
    assert json.loads((tmp_path / "train_state.json").read_text()) == old  # put back whole
    assert attnkit.load(tmp_path, device="cpu").config.d_model == 32

    prepare(request(tmp_path, overwrite=True, overrides=["d_model=16"])).fit()
    assert not list(tmp_path.glob(".replaced-*"))
    assert attnkit.load(tmp_path, device="cpu").config.d_model == 16


def run_python(code: str, **kwargs) -> subprocess.Popen:
    path = os.pathsep.join([str(Path(__file__).parent), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


def test_a_run_killed_before_its_first_checkpoint_gives_back_the_run_it_replaced(tmp_path):
    old = trained_run(tmp_path)
    child = run_python(f"""
        import os, signal
        import attnkit.tasks.common
        import attnkit.train.job as job
        from test_run_safety import request
        attnkit.tasks.common.SYNTHETIC_SIZES = (400, 16)
        job.prepare(request({str(tmp_path)!r}, overwrite=True))
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    _, err = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, err
    (aside,) = tmp_path.glob(".replaced-*")
    assert not (tmp_path / "train_state.json").exists()
    with pytest.raises(CheckpointError) as err:  # loading says where the run is and how to get it back
        attnkit.load(tmp_path, device="cpu")
    assert f"the run it replaces waits in {aside}" in str(err.value) and "--resume" in str(err.value)
    assert attnkit.load(aside, device="cpu").config.d_model == 32
    trainer = prepare(request(tmp_path, resume=True))  # the next run in the directory puts it back first
    assert trainer.step == old["step"]
    assert not list(tmp_path.glob(".replaced-*"))


def test_a_run_killed_before_its_first_checkpoint_is_started_again_with_overwrite(tmp_path):
    """Nothing to resume and a directory that holds a run: the two refusals agree on the way out (--overwrite),
    rather than each sending the user to the other's flag."""
    child = run_python(f"""
        import os, signal
        import attnkit.tasks.common
        import attnkit.train.trainer as trainer
        import attnkit.train.job as job
        from test_run_safety import request
        attnkit.tasks.common.SYNTHETIC_SIZES = (400, 16)
        trainer.save_checkpoint = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
        job.prepare(request({str(tmp_path)!r})).fit()
    """)
    _, err = child.communicate(timeout=120)
    assert child.returncode == -signal.SIGKILL, err
    assert (tmp_path / "metrics.jsonl").is_file() and not state.checkpoints(tmp_path)
    with pytest.raises(CheckpointError, match="stopped before its first checkpoint") as resumed:
        prepare(request(tmp_path, resume=True))
    with pytest.raises(ConfigError, match="stopped before its first checkpoint") as fresh:
        prepare(request(tmp_path))
    for refusal in (resumed, fresh):
        assert "--overwrite" in str(refusal.value) and "pass --resume" not in str(refusal.value)
    prepare(request(tmp_path, overwrite=True)).fit()
    assert state.resume_checkpoint(tmp_path).step == 2


def test_a_model_folder_without_checkpoints_is_not_called_a_run_killed_before_its_first(tmp_path):
    """A folder `attnkit convert` or `attnkit average` wrote holds a model and no checkpoint, as a run killed before
    its first checkpoint holds none: only the killed run is told to start again with --overwrite, which would move
    the model aside."""
    from attnkit import ModelConfig, build_model
    from attnkit.checkpoint import save_model

    config = ModelConfig(family="decoder", vocab_size=20, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=16)
    save_model(build_model(config), config, tmp_path)
    with pytest.raises(ConfigError) as fresh:
        prepare(request(tmp_path))
    with pytest.raises(CheckpointError) as resumed:
        prepare(request(tmp_path, resume=True))
    for refusal in (fresh, resumed):
        assert "stopped before its first checkpoint" not in str(refusal.value)
    assert "already holds a run" in str(fresh.value) and "no train_state.json" in str(resumed.value)


# One process per run directory ---------------------------------------------------------------------------------
def test_one_process_owns_a_run_directory_and_a_dead_owner_leaves_no_lock(tmp_path):
    child = run_python(f"""
        import sys, time
        from attnkit.train import rundir
        rundir.claim({str(tmp_path)!r})
        print("claimed", flush=True)
        time.sleep(600)
    """)
    try:
        assert child.stdout.readline().strip() == "claimed"
        with pytest.raises(ConfigError, match=f"in use by another attnkit process \\(pid {child.pid} on "):
            prepare(request(tmp_path))
        assert not (tmp_path / "config.json").exists()
    finally:
        child.kill()
        child.communicate()
    trained_run(tmp_path)  # the kernel dropped the dead process's lock
    assert (tmp_path / "config.json").is_file()


def test_training_releases_the_directory_when_fit_ends(tmp_path):
    trained_run(tmp_path)
    assert tmp_path.resolve() not in rundir._held
    child = run_python(f"from attnkit.train import rundir; rundir.claim({str(tmp_path)!r}); print('ok')")
    assert child.communicate(timeout=60)[0].strip() == "ok"


# Integrity -------------------------------------------------------------------------------------------------------
def flip_byte(path: Path, offset: int = -100) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))  # in place, as a disk or a careless tool would


def test_a_damaged_checkpoint_is_refused_by_name_and_resume_takes_the_newest_intact_one(tmp_path, caplog):
    prepare(request(tmp_path, steps=4)).fit()
    newest = tmp_path / "checkpoints" / "step_000004"
    flip_byte(newest / WEIGHTS_FILE)
    with pytest.raises(CheckpointError, match=f"{newest / WEIGHTS_FILE} is damaged"):
        state.load_checkpoint(newest)
    with pytest.raises(CheckpointError, match=f"{newest / WEIGHTS_FILE} is damaged"):
        attnkit.load(newest)
    with caplog.at_level(logging.WARNING):
        resumed = prepare(request(tmp_path, resume=True))
    assert resumed.step == 2
    assert f"skipping {newest}" in caplog.text


def test_resuming_past_a_damaged_checkpoint_keeps_a_later_best_that_is_intact(tmp_path):
    """The resumed run goes on along the history `best/` belongs to; a fork asked for by path keeps it too."""
    run, fork = tmp_path / "run", tmp_path / "fork"
    prepare(request(run, steps=4)).fit()
    best = state.load_checkpoint(run / "best")
    assert best.step == 4
    flip_byte(run / "checkpoints" / "step_000004" / WEIGHTS_FILE)
    shutil.copytree(run, fork)
    resumed = prepare(request(run, resume=True))
    assert resumed.step == 2 and resumed.best == best.train_state["best"]  # only a better score replaces it
    assert [p.name for p in state.checkpoints(run)] == ["step_000002"]
    assert state.load_checkpoint(run / "best").step == 4
    forked = prepare(request(fork, resume=str(fork / "checkpoints" / "step_000002")))
    assert forked.step == 2 and forked.best == best.train_state["best"]
    assert state.load_checkpoint(fork / "best").step == 4


def test_a_resume_gives_best_the_checkpoint_whose_save_stopped_before_copying_it(tmp_path, caplog):
    """A full disk or a kill after the checkpoint is written and before best/ takes its copy left best/ an older (or
    no) model while the train state counts the newer score as the best: the resume copies it."""
    prepare(request(tmp_path, steps=4)).fit()
    newest = tmp_path / "checkpoints" / "step_000004"
    saved = json.loads((newest / "train_state.json").read_text())
    assert saved["evaluation"]["val_loss"] == saved["best"]  # step 4 scored best
    shutil.rmtree(tmp_path / "best")
    shutil.copytree(tmp_path / "checkpoints" / "step_000002", tmp_path / "best")  # best/ stopped at step 2
    with caplog.at_level(logging.WARNING):
        prepare(request(tmp_path, steps=4, resume=True))
    assert f"copied {newest} to best/" in caplog.text
    assert state.load_checkpoint(tmp_path / "best").step == 4
    shutil.rmtree(tmp_path / "best")  # none at all
    prepare(request(tmp_path, steps=4, resume=True))
    assert state.load_checkpoint(tmp_path / "best").step == 4


def test_a_resume_leaves_best_at_the_first_of_tied_scores(tmp_path, caplog, monkeypatch):
    """A later evaluation that only ties the best score is no better: a plain resume leaves best/ where it is."""
    monkeypatch.setattr(Trainer, "_evaluate", lambda self, model: {"val_loss": 2.0})
    prepare(request(tmp_path, steps=4)).fit()
    assert state.load_checkpoint(tmp_path / "best").step == 2
    with caplog.at_level(logging.WARNING):
        prepare(request(tmp_path, steps=8, resume=True))
    assert "to best/" not in caplog.text
    assert state.load_checkpoint(tmp_path / "best").step == 2


def test_a_plain_resume_hashes_no_file_of_an_earlier_best(tmp_path, monkeypatch):
    """best/ is checked only where the resume would keep it: when it was saved after the resumed step."""
    prepare(request(tmp_path, steps=4)).fit()
    hashed = []
    original = attnkit.checkpoint.digest
    monkeypatch.setattr(attnkit.checkpoint, "digest", lambda path: hashed.append(Path(path)) or original(path))
    prepare(request(tmp_path, steps=8, resume=True))
    assert hashed and not [path for path in hashed if (tmp_path / "best") in path.parents]


def test_a_first_score_of_nan_is_beaten_by_the_next(tmp_path, monkeypatch):
    monkeypatch.setattr(Trainer, "_evaluate", lambda self, model: {"val_loss": math.nan if self.step == 2 else 5.0})
    prepare(request(tmp_path, steps=4)).fit()
    assert state.load_checkpoint(tmp_path / "best").step == 4


def test_the_top_level_and_best_share_no_storage_with_the_checkpoint(tmp_path):
    trained_run(tmp_path)
    checkpoint = tmp_path / "checkpoints" / "step_000002"
    copies = [tmp_path / WEIGHTS_FILE, tmp_path / "best" / WEIGHTS_FILE]
    before = [p.read_bytes() for p in copies]
    with open(checkpoint / WEIGHTS_FILE, "r+b") as handle:  # damage the checkpoint's file in place
        handle.seek(-64, os.SEEK_END)
        handle.write(b"\0" * 64)
    assert [p.read_bytes() for p in copies] == before
    for path in copies:
        assert not os.path.samefile(path, checkpoint / WEIGHTS_FILE)
    attnkit.load(tmp_path / "best", device="cpu")


def test_a_damaged_or_missing_top_level_is_read_from_the_newest_checkpoint(tmp_path, caplog):
    trained_run(tmp_path)
    expected = weights(tmp_path / "checkpoints" / "step_000002")
    flip_byte(tmp_path / WEIGHTS_FILE)
    with caplog.at_level(logging.WARNING):
        pipeline = attnkit.load(tmp_path, device="cpu")
    assert "is damaged" in caplog.text and "step_000002" in caplog.text
    for name, tensor in pipeline.model.state_dict().items():
        assert torch.equal(tensor, expected[name])
    for name in ("config.json", WEIGHTS_FILE, "tokenizer", CHECKSUMS_FILE):  # killed before the first copy
        path = tmp_path / name
        shutil.rmtree(path) if path.is_dir() else path.unlink()
    assert attnkit.load(tmp_path, device="cpu").generate("a", max_new_tokens=2, temperature=0)


# A kill at every point of a save -------------------------------------------------------------------------------
def killed_at(point: int, action) -> bool:
    """Run `action` in a forked process that dies (no clean-up, as under SIGKILL) at its `point`-th rename in
    `attnkit.train.state` or `attnkit.train.rundir`. Returns False when the action finished before that point."""
    pid = os.fork()
    if pid == 0:
        calls = [0]

        def replace(*args, **kwargs):
            calls[0] += 1
            if calls[0] == point:
                os._exit(KILLED)
            os.replace(*args, **kwargs)

        fake = types.SimpleNamespace(**{name: getattr(os, name) for name in dir(os) if not name.startswith("__")})
        fake.replace = replace
        state.os = rundir.os = fake
        try:
            action()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) == KILLED


def assert_usable(run: Path, steps: set[int], *, had_best: bool = True) -> None:
    """`--resume` and `attnkit.load` both accept `run`, at one of `steps`; the next save cleans every leftover and
    leaves `best/` whole when the run `had_best` before the kill."""
    assert state.resume_checkpoint(run).step in steps
    attnkit.load(run, device="cpu")
    model, optimizer, tokenizer = trained_pieces()
    save(run, 90, model, optimizer, tokenizer, keep=2)
    hidden = [p for folder in (run, run / "checkpoints") for p in folder.iterdir() if p.name.startswith(".")]
    assert not hidden
    if had_best or (run / "best").exists():
        assert state.load_checkpoint(run / "best").step in steps | {10, 20, 30}


def fault_points(template: Path, tmp_path: Path, action, check) -> int:
    """Kill `action` at each of its renames in turn, each time in a fresh copy of `template`; returns how many."""
    point = 0
    while True:
        point += 1
        run = tmp_path / f"kill_{point}"
        shutil.copytree(template, run) if template.exists() else run.mkdir()
        if not killed_at(point, lambda run=run: action(run)):
            return point - 1
        check(run)


@pytest.mark.slow  # kills at every point (4 s); the first save's kill test stays
def test_a_kill_at_any_point_of_a_save_leaves_a_usable_run(tmp_path):
    model, optimizer, tokenizer = trained_pieces()
    template = tmp_path / "template"
    save(template, 10, model, optimizer, tokenizer, keep=2, best=True)
    save(template, 20, model, optimizer, tokenizer, keep=2, best=True)
    points = fault_points(template, tmp_path, lambda run: save(run, 30, model, optimizer, tokenizer, keep=2, best=True),
                          lambda run: assert_usable(run, {20, 30}))
    assert points >= 15  # every file of the checkpoint, its top-level and best/ copies, the swaps and the pruning


def test_a_kill_at_any_point_of_the_first_save_leaves_a_loadable_run_or_none(tmp_path):
    model, optimizer, tokenizer = trained_pieces()

    def check(run):
        if state.checkpoints(run):
            assert_usable(run, {10}, had_best=False)
        else:
            with pytest.raises(CheckpointError, match="nothing to resume"):
                state.resume_checkpoint(run)

    assert fault_points(tmp_path / "none", tmp_path, lambda run: save(run, 10, model, optimizer, tokenizer,
                                                                        best=True), check) >= 10


@pytest.mark.slow  # subprocesses (4 s)
def test_a_kill_while_a_fork_removes_later_checkpoints_leaves_a_usable_run(tmp_path):
    model, optimizer, tokenizer = trained_pieces()
    template = tmp_path / "template"
    for step in (10, 20, 30, 40):
        save(template, step, model, optimizer, tokenizer, keep=5, best=step == 30)
    points = fault_points(template, tmp_path, lambda run: state.remove_checkpoints_after(run, 10),
                          lambda run: assert_usable(run, {10, 20, 30, 40}, had_best=False))
    assert points >= 3
    state.remove_checkpoints_after(template, 10)
    assert [p.name for p in state.checkpoints(template)] == ["step_000010"]
    assert not (template / "best").exists()  # best/ came after the fork point
    assert json.loads((template / "train_state.json").read_text())["step"] == 10


def test_leftovers_of_interrupted_saves_are_cleaned_and_a_lone_best_old_is_put_back(tmp_path):
    model, optimizer, tokenizer = trained_pieces()
    save(tmp_path, 10, model, optimizer, tokenizer, best=True)
    os.replace(tmp_path / "best", tmp_path / ".best.old")  # killed between the two renames of a best/ swap
    (tmp_path / ".model.safetensors.123.tmp").write_bytes(b"x" * 100)
    (tmp_path / "checkpoints" / ".step_000020.tmp").mkdir()
    (tmp_path / "checkpoints" / ".step_000005.del").mkdir()
    save(tmp_path, 20, model, optimizer, tokenizer)
    assert state.load_checkpoint(tmp_path / "best").step == 10
    leftovers = [p for folder in (tmp_path, tmp_path / "checkpoints") for p in folder.iterdir()
                 if p.name.startswith(".")]
    assert not leftovers


# Data, paths and resources --------------------------------------------------------------------------------------
def test_a_one_class_training_file_is_an_error(tmp_path):
    data = tmp_path / "one.txt"
    data.write_text("".join(f"pos a fine film number {i}\n" for i in range(30)))
    with pytest.raises(InputError, match="holds one class only, 'pos'"):
        prepare(request(tmp_path / "run", task="classify", data=str(data), overrides=["tokenizer=char"]))
    assert not (tmp_path / "run").exists()  # the directory made for the run is taken back


def test_a_shard_index_naming_files_outside_its_directory_is_refused(tmp_path):
    from attnkit.interop.hf_weights import SAFETENSORS_INDEX, read_weights

    outside = tmp_path / "secret.safetensors"
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    from safetensors.torch import save_file

    save_file({"w": torch.zeros(2)}, str(outside))
    for name in ("../secret.safetensors", str(outside)):
        (model_dir / SAFETENSORS_INDEX).write_text(json.dumps({"weight_map": {"w": name}}))
        with pytest.raises(CheckpointError, match="not a file of .*shards must sit beside their index"):
            read_weights(model_dir)


def test_resuming_on_other_data_files_is_reported_as_a_changed_setting(tmp_path, caplog):
    first, second = tmp_path / "a.txt", tmp_path / "b.txt"
    for path in (first, second):
        path.write_text("the quick brown fox jumps over the lazy dog\n" * 60)
    prepare(request(tmp_path / "run", data=str(first), overrides=[], task="lm")).fit()
    with caplog.at_level(logging.WARNING):
        prepare(request(tmp_path / "run", data=str(second), resume=True))
    assert f"changed setting: data: ['{first}'] -> ['{second}']" in caplog.text


def test_a_model_too_large_for_memory_is_refused_before_allocating(tmp_path, monkeypatch):
    monkeypatch.setattr("attnkit.train.memory.free_bytes", lambda device: 2**30)
    with pytest.raises(ConfigError, match=r"6,476,656,640 parameters: .*96.5 GiB .*1.0 GiB free.*--force"):
        prepare(TrainRequest(out=str(tmp_path), preset="llama2-7b", data={"data": ("synthetic:copy",), "seq_len": 64}))
    check_fits(6_476_656_640, "fp32", torch.device("cpu"), force=True)


# One line instead of a traceback ---------------------------------------------------------------------------------
def cli_error(capsys, *argv) -> str:
    from attnkit import cli

    assert cli.main(list(argv)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("attnkit: error: ") and err.count("\n") == 1, err
    return err


TRAIN = ["--set", "d_model=32", "--set", "n_layers=1", "--set", "n_heads=2", "--set", "d_ff=64", "--set",
         "max_seq_len=24", "--batch-size", "4", "--max-steps", "2", "--eval-every", "2", "--no-progress"]


@pytest.mark.parametrize("failure", [
    OSError(28, "No space left on device"),
    SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)"),  # what it raises
])
def test_a_full_disk_during_a_save_is_one_line_and_keeps_what_was_saved(tmp_path, capsys, monkeypatch, failure):
    def full(*args, **kwargs):
        raise failure

    monkeypatch.setattr("attnkit.checkpoint.save_file", full)
    err = cli_error(capsys, "train", "--data", "synthetic:copy", "--out", str(tmp_path / "run"), *TRAIN)
    assert "step_000002" in err and "the disk is full; free some space" in err and "already saved are intact" in err
    assert not [p for p in (tmp_path / "run" / "checkpoints").iterdir()]  # no half-written checkpoint stays


def test_unwritable_outputs_are_one_line(tmp_path, capsys, monkeypatch):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert "--out " in cli_error(capsys, "train", "--data", "synthetic:copy", "--out", str(a_file), *TRAIN)
    err = cli_error(capsys, "train", "--data", "synthetic:copy", "--out", str(a_file / "run"), *TRAIN)
    assert "part of the path is a file" in err and "choose another --out" in err
    import errno

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(rundir.os, "open", read_only)
    err = cli_error(capsys, "train", "--data", "synthetic:copy", "--out", str(tmp_path / "ro"), *TRAIN)
    assert "the file system is read-only" in err and "choose another --out" in err


def test_special_files_are_refused_not_read(tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    err = cli_error(capsys, "train", "--data", str(fifo), "--out", str(tmp_path / "run"), *TRAIN)
    assert f"{fifo} is a FIFO, not a regular file" in err
    trained_run(tmp_path / "lm")
    err = cli_error(capsys, "classify", "--run", str(tmp_path / "lm"), "--input", str(fifo))
    assert "is a FIFO, not a regular file" in err
    assert "is a character device" in cli_error(capsys, "train", "--data", "/dev/zero", "--out",
                                                str(tmp_path / "run"), *TRAIN)


def test_non_utf8_standard_input_and_zero_batch_sizes_are_one_line(tmp_path):
    trained_run(tmp_path)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-m", "attnkit", "generate", "--run", str(tmp_path), "--prompt", "-"],
                          input=b"\xff\xfe caf\xe9", capture_output=True, env=env, timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err
    assert "standard input is not UTF-8 (byte 0xff at offset 0)" in err and "--prompt TEXT" in err
    prepare(request(tmp_path / "cls", task="classify", data="synthetic:ab")).fit()
    with pytest.raises(InputError, match="batch_size=0 must be a positive integer"):
        attnkit.load(tmp_path / "cls", device="cpu").classify(["ab"], batch_size=0)


def test_a_symbolic_link_loop_as_data_is_one_line(tmp_path, capsys):
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    err = cli_error(capsys, "train", "--data", str(tmp_path / "a"), "--out", str(tmp_path / "run"), *TRAIN)
    assert "is a symbolic link that loops back on itself" in err
    assert not (tmp_path / "run").exists()


def test_resume_falls_back_to_the_top_level_copy_when_every_checkpoint_is_damaged(tmp_path):
    trained_run(tmp_path)
    flip_byte(tmp_path / "checkpoints" / "step_000002" / "optimizer.safetensors")
    assert state.resume_checkpoint(tmp_path).path == tmp_path
    flip_byte(tmp_path / "optimizer.safetensors")
    with pytest.raises(CheckpointError, match="no checkpoint of .* is intact"):
        state.resume_checkpoint(tmp_path)
