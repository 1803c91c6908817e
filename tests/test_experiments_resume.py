"""A stopped experiment resumes from the arms it finished: each trained model is saved in OUT/arms as it finishes,
reused by a rerun of the same command only where it reads back whole and was made by the same experiment, budget,
setting and code, and the resumed run reaches the numbers an uninterrupted run reaches."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from attnkit.experiments import run_experiment
from attnkit.experiments.arms import Arm, Arms, source_digest

NAME = "position-extrapolation"  # a few seconds at tiny, its arms trained models, no timings among its numbers


def stop_after_first_arm(monkeypatch) -> None:
    """Ctrl-C as the first arm's files are written: what a user's interrupt leaves after one arm."""
    save = Arms._save

    def save_then_stop(self, *args):
        save(self, *args)
        raise KeyboardInterrupt

    monkeypatch.setattr(Arms, "_save", save_then_stop)


def numbers(result) -> tuple:
    return result.verdict, result.rows, [(check.what, check.difference, check.noise) for check in result.checks]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    return numbers(run_experiment(NAME, budget="tiny", out=tmp_path_factory.mktemp("whole")))


@pytest.mark.parametrize("damage", ["none", "tensors edited"])
def test_a_stopped_experiment_resumes_from_its_finished_arms_to_the_same_numbers(damage, uninterrupted, tmp_path,
                                                                                 monkeypatch, caplog):
    out = tmp_path / "out"
    with monkeypatch.context() as patch:
        stop_after_first_arm(patch)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(NAME, budget="tiny", out=out)
    saved = sorted(path.name for path in (out / "arms").iterdir())
    assert saved == ["sinusoidal-positions-seed-0.json", "sinusoidal-positions-seed-0.safetensors"]  # nothing partial
    assert not (out / "results.json").exists()
    if damage == "tensors edited":  # one byte of the weights flipped
        weights = out / "arms" / saved[1]
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(data)

    with caplog.at_level(logging.INFO, logger="attnkit.experiments"):
        resumed = run_experiment(NAME, budget="tiny", out=out)
    reused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("reusing sinusoidal")]
    rerun = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rerunning sinusoidal")]
    if damage == "none":
        assert reused and not rerun
    else:
        assert not reused and rerun and "changed after it was saved" in rerun[0]
    assert numbers(resumed) == uninterrupted
    assert not (out / "arms").exists()  # the run is written: its arms are not kept


def arm_of(value: float) -> tuple[float, Arm]:
    torch.randn(3)  # the random state moves, as training moves it
    return value, Arm({"loss": value}, {"weight": torch.full((2,), value)})


def restore(arm: Arm) -> float:
    assert torch.equal(arm.tensors["weight"], torch.full((2,), arm.values["loss"]))
    return arm.values["loss"]


@pytest.mark.parametrize(("change", "why"), [
    ({"budget": "small"}, "saved for budget 'tiny', this run's is 'small'"),
    ({"experiment": "other"}, "saved for experiment 'fake', this run's is 'other'"),
    ({"code": "new"}, "saved by other code (attnkit old, source old; now attnkit new, source new)"),
    ({"code": "new", "version": "attnkit old"}, "(attnkit old, source old; now attnkit old, source new)"),
    ({"setting": {"steps": 20, "seed": 0}}, "its setting differs (steps 10 -> 20)"),
])
def test_an_arm_saved_for_another_setting_budget_or_code_is_rerun_and_the_log_says_why(change, why, tmp_path,
                                                                                        caplog):
    def arms(**fields) -> Arms:
        named = {"experiment": "fake", "budget": "tiny", "code": "old", **fields}
        return Arms(tmp_path, **{"version": f"attnkit {named['code']}", **named})

    torch.manual_seed(0)
    assert arms().run("arm", {"steps": 10, "seed": 0}, lambda: arm_of(1.0), restore) == 1.0
    after_first = torch.get_rng_state()
    torch.manual_seed(1)  # a rerun starts elsewhere; reusing the arm puts the random state where the arm left it
    assert arms().run("arm", {"steps": 10, "seed": 0}, lambda: arm_of(2.0), restore) == 1.0
    assert torch.equal(torch.get_rng_state(), after_first)

    setting = change.pop("setting", {"steps": 10, "seed": 0})
    with caplog.at_level(logging.INFO, logger="attnkit.experiments.arms"):
        assert arms(**change).run("arm", setting, lambda: arm_of(3.0), restore) == 3.0
    assert any(why in r.getMessage() and r.getMessage().startswith("rerunning arm") for r in caplog.records), why


def test_an_arm_whose_values_were_edited_is_rerun(tmp_path, caplog):
    arms = Arms(tmp_path, experiment="fake", budget="tiny", code="same")
    arms.run("arm", {"seed": 0}, lambda: arm_of(1.0), restore)
    record = tmp_path / "arm.json"
    fields = json.loads(record.read_text())
    fields["values"]["loss"] = 0.5  # a loss changed by hand: its checksum no longer matches
    record.write_text(json.dumps(fields))
    with caplog.at_level(logging.INFO, logger="attnkit.experiments.arms"):
        assert arms.run("arm", {"seed": 0}, lambda: arm_of(2.0), restore) == 2.0
    assert any("changed after it was saved" in r.getMessage() for r in caplog.records)


@pytest.fixture
def fake_experiment(monkeypatch) -> list[str]:
    """Experiment "fake": one arm, "the arm"; the list the budget of each run that computed the arm."""
    from attnkit.experiments import REGISTRY
    from attnkit.experiments.base import Check, Experiment, Result

    computed = []

    def run(budget, out, progress, *, seeds):
        def compute():
            computed.append(budget)
            return arm_of(1.0)

        value = progress.arms.run("the arm", {"seed": 0}, compute, restore)
        return Result([Check.over("x", [value, value + 0.1])], "measured", "1", [{"x": value}])

    monkeypatch.setitem(REGISTRY, "fake", Experiment("fake", "a claim", "a lecture", run))
    return computed


def test_no_resume_runs_every_arm_afresh_and_a_finished_run_keeps_no_arms(tmp_path, fake_experiment):
    """--no-resume: the arms a stopped run left are not read; the run's own are removed once its results are out."""
    computed = fake_experiment
    out = tmp_path / "out"
    left = Arms(out / "arms", experiment="fake", budget="tiny", code=source_digest())
    left.run("the arm", {"seed": 0}, lambda: arm_of(1.0), restore)  # what a stopped run of the same command left
    run_experiment("fake", budget="tiny", out=out, resume=False)
    assert computed == ["tiny"] and not (out / "arms").exists()


def test_two_arms_whose_names_read_alike_keep_files_of_their_own(tmp_path):
    arms = Arms(tmp_path, experiment="fake", budget="tiny", code="same")
    arms.run("Transformer++ 64 x 2", {}, lambda: arm_of(1.0), restore)
    arms.run("Transformer 64 x 2", {}, lambda: arm_of(2.0), restore)
    again = Arms(tmp_path, experiment="fake", budget="tiny", code="same")
    assert again.run("Transformer++ 64 x 2", {}, lambda: arm_of(3.0), restore) == 1.0
    assert again.run("Transformer 64 x 2", {}, lambda: arm_of(4.0), restore) == 2.0
    assert again.reused == ["Transformer++ 64 x 2", "Transformer 64 x 2"]


@pytest.mark.slow  # two runs of the command in a process of its own: about 20 s
def test_ctrl_c_on_the_command_keeps_the_finished_arms_and_the_same_command_resumes(tmp_path):
    """A real SIGINT to `attnkit experiment` once its first arm is saved: it exits 130 leaving the finished arms and
    nothing partial (no results, no hidden half run beside --out); the same command then says it reuses them."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "attnkit", "experiment", NAME, "--budget", "tiny", "--no-progress", "--out",
               str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # as in a terminal
    deadline = time.monotonic() + 120
    while not list(out.glob("arms/*.json")) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    run.send_signal(signal.SIGINT)
    output = run.communicate(timeout=120)[0]
    assert run.returncode == 130, output
    assert sorted(path.name for path in out.iterdir()) == ["arms"]
    saved = list((out / "arms").iterdir())  # each finished arm's two files (its JSON last), no temporary file
    assert {path.suffix for path in saved} == {".json", ".safetensors"}
    assert all(path.with_suffix(".safetensors") in saved for path in saved if path.suffix == ".json")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["out"]
    again = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0, again.stderr
    assert "reusing sinusoidal positions, seed 0" in again.stdout + again.stderr
    assert not (out / "arms").exists() and (out / "results.json").is_file()


@pytest.mark.parametrize(("change", "why"), [
    ("threads", "threads"),  # a product over 2 threads sums in another order than over 1: the last digits move
    ("torch", "torch '0.0.1' -> "),
])
def test_an_arm_that_ran_under_another_torch_or_thread_count_is_rerun(change, why, tmp_path, monkeypatch, caplog):
    arms = Arms(tmp_path, experiment="fake", budget="tiny", code="same")
    threads = torch.get_num_threads()
    with monkeypatch.context() as then:
        if change == "threads":
            torch.set_num_threads(threads + 1)
        else:
            then.setattr(torch, "__version__", "0.0.1")
        try:
            arms.run("arm", {"seed": 0}, lambda: arm_of(1.0), restore)
        finally:
            torch.set_num_threads(threads)
    with caplog.at_level(logging.INFO, logger="attnkit.experiments.arms"):
        assert arms.run("arm", {"seed": 0}, lambda: arm_of(2.0), restore) == 2.0
    rerun = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rerunning arm")]
    assert rerun and "another PyTorch setup" in rerun[0] and why in rerun[0], rerun


def test_a_saved_random_state_pytorch_cannot_read_is_rerun_not_a_traceback(tmp_path, caplog):
    """An arm whose files agree with their checksums (rewritten whole) but whose random state is no generator state:
    the arm is rerun, saying why, where setting it raised out of the run."""
    from attnkit.checkpoint import digest, load_tensors, save_tensors

    arms = Arms(tmp_path, experiment="fake", budget="tiny", code="same")
    arms.run("arm", {"seed": 0}, lambda: arm_of(1.0), restore)
    weights, record_path = tmp_path / "arm.safetensors", tmp_path / "arm.json"
    tensors = load_tensors(weights)
    tensors["rng"] = tensors["rng"].float()
    save_tensors(tensors, weights)
    record = json.loads(record_path.read_text())
    record.pop("sha256")
    record["tensors_sha256"] = digest(weights)
    record["sha256"] = hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()  # as the JSON's own
    record_path.write_text(json.dumps(record))
    with caplog.at_level(logging.INFO, logger="attnkit.experiments.arms"):
        assert arms.run("arm", {"seed": 0}, lambda: arm_of(2.0), restore) == 2.0
    assert any("holds no random state PyTorch reads" in r.getMessage() for r in caplog.records)


def test_a_reused_arm_gives_back_its_values_in_the_order_it_saved_them(tmp_path):
    """bottleneck's table columns and its plot's length buckets follow its scores' order: a reused arm's scores
    read in another order (sorted: '17-24' before '2-8') drew a resumed run's buckets out of order."""
    scores = {"final loss": 0.1, "exact 2-8": 1.0, "exact 9-16": 0.9, "exact 17-24": 0.5, "per symbol 2-8": 1.0}
    arms = Arms(tmp_path, experiment="fake", budget="tiny", code="same")
    arms.run("arm", {"seed": 0}, lambda: (scores, Arm(scores)), lambda arm: arm.values)
    again = Arms(tmp_path, experiment="fake", budget="tiny", code="same")
    reused = again.run("arm", {"seed": 0}, lambda: ({}, Arm({})), lambda arm: arm.values)
    assert again.reused == ["arm"] and list(reused.items()) == list(scores.items())


@pytest.mark.parametrize("values", [
    {"final loss": 0.5, "exact 2-4": "1.0", "per symbol 2-4": 1.0},  # a score as text
    {"final loss": 0.5, "exact 2-4": 1.0},  # a metric missing
    {"final loss": 0.5, "exact 2-4": True, "per symbol 2-4": 1.0},  # true/false is no score
])
def test_bottleneck_reruns_an_arm_whose_saved_scores_are_not_its_metrics_as_numbers(values, tmp_path, caplog):
    """bottleneck's arms are its scores alone: a saved arm whose files agree with their checksums but whose scores
    are not the metrics it measures, each a number, is rerun (they went into the table and its means as they were)."""
    from functools import partial

    from attnkit.experiments.bottleneck import saved_scores

    scores = {"final loss": 0.5, "exact 2-4": 1.0, "per symbol 2-4": 0.75}
    restored = partial(saved_scores, buckets=[(2, 4)])
    arms = Arms(tmp_path, experiment="bottleneck", budget="tiny", code="same")
    arms.run("GRU, seed 0", {"seed": 0}, lambda: (values, Arm(values)), restored)  # what a stopped run saved
    again = Arms(tmp_path, experiment="bottleneck", budget="tiny", code="same")
    with caplog.at_level(logging.INFO, logger="attnkit.experiments.arms"):
        assert again.run("GRU, seed 0", {"seed": 0}, lambda: (scores, Arm(scores)), restored) == scores
    assert again.ran == ["GRU, seed 0"]
    assert any("its scores are not final loss, exact 2-4, per symbol 2-4" in r.getMessage() for r in caplog.records)
    again.run("GRU, seed 0", {"seed": 0}, lambda: ({}, Arm({})), restored)  # the scores it measured are reused
    assert again.reused == ["GRU, seed 0"]


def test_a_worker_copy_of_the_arms_counts_each_arm_once(tmp_path):
    """A worker process gets a pickled copy of the run's Arms, holding the arms the run had counted when it was
    copied; counting what the worker hands back added those again ("reused 3 of 4 arms" where 2 of 3 were)."""
    import pickle

    def compute(value):
        return lambda: (value, Arm({"value": value}))

    def restore(arm):
        return arm.values["value"]

    stopped = Arms(tmp_path, experiment="x", budget="tiny", code="same")
    stopped.run("first", {}, compute(1), restore)
    stopped.run("second", {}, compute(2), restore)
    arms = Arms(tmp_path, experiment="x", budget="tiny", code="same")  # the resumed run
    arms.run("first", {}, compute(1), restore)
    worker = pickle.loads(pickle.dumps(arms))
    assert worker.run("second", {}, compute(2), restore) == 2 and worker.run("third", {}, compute(3), restore) == 3
    arms.merge_worker(worker)
    assert (arms.reused, arms.ran) == (["first", "second"], ["third"])


@pytest.mark.parametrize("kind", ["a symbolic link", "a file"])
def test_an_arms_path_that_is_a_link_or_a_file_is_refused_before_anything_runs(kind, tmp_path, fake_experiment):
    """OUT/arms linked elsewhere would take the arms outside --out (and keep them there after the run); a file there
    failed once the first arm was trained."""
    from attnkit.errors import InputError

    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    if kind == "a file":
        (out / "arms").write_text("notes\n")
    else:
        (out / "arms").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(InputError, match=f"arms is {kind}, where the run keeps the arms it finishes"):
        run_experiment("fake", budget="tiny", out=out)
    assert fake_experiment == [] and not any(elsewhere.iterdir())


@pytest.mark.parametrize("change", [{"diverged": "false"}, {"val_loss": "2.5"}, {"losses": [2.0, None]},
                                    {"step_seconds": "0.1"}])
def test_a_saved_training_run_whose_values_are_of_another_kind_is_refused(change):
    """train_lm's arm read back: "false" for diverged read as a diverged run, a loss written as text as a number;
    each is refused (a ValueError, so that the arm is rerun) rather than used."""
    from attnkit.experiments.lm_runs import RunLog

    saved = {"losses": [2.0, 1.5], "val_loss": 1.6, "seconds": 3.0, "diverged": False, "step_seconds": [0.1, 0.1]}
    assert RunLog.from_values(saved, None).values() == saved
    with pytest.raises(ValueError, match="must be numbers, and diverged true or false"):
        RunLog.from_values({**saved, **change}, None)


def scaled(model, scale: float) -> None:
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.mul_(scale)


def test_train_lm_takes_a_partial_init_and_its_arguments_decide_the_arm(tmp_path):
    """An init given as functools.partial (no __qualname__) trains, where naming it in the arm's setting raised
    AttributeError; its arguments are part of the setting: the same run at another scale is trained, not reused."""
    from functools import partial

    from attnkit.config import ModelConfig
    from attnkit.experiments.base import Progress
    from attnkit.experiments.lm_runs import char_corpus, train_lm

    config = ModelConfig(family="decoder", d_model=32, n_heads=2, n_layers=1, max_seq_len=32)
    corpus = char_corpus(5_000)
    progress = Progress(arms=Arms(tmp_path, experiment="fake", budget="tiny", code="same"))
    for scale in (1.0, 1.0, 0.5):
        train_lm(config, corpus, steps=2, batch_size=2, seq_len=16, eval_batches=1,
                 init=partial(scaled, scale=scale), progress=progress, desc="the run")
    assert progress.arms.ran == ["the run", "the run"] and progress.arms.reused == ["the run"]


@pytest.mark.parametrize("stopped", [{"experiment": "other"}, {"budget": "small"}])
def test_the_arms_of_another_commands_stopped_run_are_kept_unless_no_resume_discards_them(stopped, tmp_path,
                                                                                          fake_experiment):
    """A run into an --out keeping the arms of another experiment's (or budget's) stopped run reran none of them and
    removed them all when it ended: hours of a stopped run lost to a quick one. It is refused, naming the run and
    the ways on; --no-resume discards them."""
    from attnkit.errors import InputError

    out = tmp_path / "out"
    left = Arms(out / "arms", **{"experiment": "fake", "budget": "tiny", **stopped}, code=source_digest())
    left.run("its arm", {"seed": 0}, lambda: arm_of(1.0), restore)
    kept = sorted((out / "arms").iterdir())
    ran = f"'{stopped.get('experiment', 'fake')}' at budget '{stopped.get('budget', 'tiny')}'"
    with pytest.raises(InputError, match=f"keeps the finished arms of a stopped run of {ran}: run that command again"):
        run_experiment("fake", budget="tiny", out=out)
    assert fake_experiment == [] and sorted((out / "arms").iterdir()) == kept
    run_experiment("fake", budget="tiny", out=out, resume=False)
    assert fake_experiment == ["tiny"] and not (out / "arms").exists()
