"""Files a run reads back that were damaged, edited or left half-written, and outputs pointed at links: each is
refused in one line naming the file and the fix, never resumed from as a wrong state, never met as a traceback."""

from __future__ import annotations

import json
import shutil

import pytest
from test_run_safety import request, small_synthetic_sets  # noqa: F401  (the fixture, used by every test here)

from attnkit.checkpoint import CHECKSUMS_FILE
from attnkit.errors import CheckpointError, InputError
from attnkit.outputs import atomic_output
from attnkit.train import prepare, state


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A two-step run, trained once for the module."""
    out = tmp_path_factory.mktemp("finished") / "run"
    prepare(request(out)).fit()
    return out


@pytest.mark.parametrize("field, value", [
    ("step", -5), ("step", "x"), ("step", None), ("step", 1.5), ("step", True), ("tokens_seen", -1),
    ("evaluated_step", "2"), ("evaluated_step", -2), ("elapsed", float("nan")), ("elapsed", -3.0)])
def test_a_train_state_edited_outside_its_checksums_is_refused_by_field(finished, tmp_path, field, value):
    run = shutil.copytree(finished, tmp_path / "run")
    shutil.rmtree(run / "checkpoints")
    shutil.rmtree(run / "best", ignore_errors=True)
    (run / CHECKSUMS_FILE).unlink()  # unverified: the file's own contents are all that guard it
    saved = json.loads((run / "train_state.json").read_text())
    (run / "train_state.json").write_text(json.dumps({**saved, field: value}))
    with pytest.raises(CheckpointError, match=rf"train_state.json holds {field}=.*whole numbers"):
        state.resume_checkpoint(run, device="cpu")


def test_a_run_saved_before_its_first_evaluation_resumes_unverified(finished, tmp_path):
    """A save before any evaluation writes evaluated_step=-1 (the trainer's "not yet"), which is not damage."""
    run = shutil.copytree(finished, tmp_path / "run")
    shutil.rmtree(run / "checkpoints")
    shutil.rmtree(run / "best", ignore_errors=True)
    (run / CHECKSUMS_FILE).unlink()
    saved = json.loads((run / "train_state.json").read_text())
    (run / "train_state.json").write_text(json.dumps({**saved, "evaluated_step": -1}))
    assert state.resume_checkpoint(run, device="cpu").train_state["evaluated_step"] == -1


def test_a_train_state_that_is_not_an_object_is_refused(finished, tmp_path):
    run = shutil.copytree(finished, tmp_path / "run")
    shutil.rmtree(run / "checkpoints")
    shutil.rmtree(run / "best", ignore_errors=True)
    (run / CHECKSUMS_FILE).unlink()
    (run / "train_state.json").write_text("[1]")
    with pytest.raises(CheckpointError, match="holds a JSON list, not the object a save writes"):
        state.resume_checkpoint(run, device="cpu")


def test_an_output_directory_that_is_a_link_to_an_empty_directory_is_refused_and_the_target_untouched(tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "out"
    link.symlink_to(target)
    with pytest.raises(InputError, match="out is a link to .*elsewhere"):
        with atomic_output(link, directory=True, flag="--to-onnx") as partial:
            (partial / "model.onnx").write_bytes(b"graph")
    assert link.is_symlink() and not any(target.iterdir())
    with atomic_output(link, directory=True, overwrite=True, flag="--to-onnx") as partial:  # replaces the link
        (partial / "model.onnx").write_bytes(b"graph")
    assert not link.is_symlink() and (link / "model.onnx").read_bytes() == b"graph" and not any(target.iterdir())


def test_a_run_whose_tokenizer_has_no_hugging_face_form_is_named_by_its_output_not_a_temporary_folder(
        finished, tmp_path, caplog):
    from attnkit import cli

    out = tmp_path / "exported"
    with caplog.at_level("WARNING"):
        assert cli.main(["convert", str(finished), "--to-hf", str(out)]) == 0
    said = [r.getMessage() for r in caplog.records if "no Hugging Face form" in r.getMessage()]
    assert said == [f"a 'char' tokenizer has no Hugging Face form; {out} gets no tokenizer"]


@pytest.mark.parametrize("field, value", [("weight_decay", float("nan")), ("weight_decay", float("inf")),
                                          ("clip", float("nan")), ("lora_alpha", float("inf")),
                                          ("dist_timeout", float("inf"))])
def test_training_settings_that_would_turn_the_weights_to_nan_are_refused(field, value, tmp_path, capsys):
    from attnkit import cli
    from attnkit.errors import ConfigError
    from attnkit.train.trainer import TrainConfig

    with pytest.raises(ConfigError, match=f"{field}=(nan|inf) must be"):
        TrainConfig(**{field: value})
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({field: value}))  # JSON as Python writes it: NaN and Infinity
    assert cli.main(["train", "--config", str(settings), "--out", str(tmp_path / "run"), "--data", "synthetic:copy",
                     "--no-progress"]) == 2
    assert f"attnkit: error: {field}=" in capsys.readouterr().err


def test_a_tokenizer_that_reads_the_data_as_no_token_is_named_not_the_data(tmp_path):
    from attnkit.data.lm import token_cache
    from attnkit.tokenize import load_tokenizer, train_bpe

    text = tmp_path / "corpus.txt"
    text.write_text("the cat sat on the mat\n" * 20, encoding="utf-8")
    train_bpe([text.read_text()], vocab_size=300).save(tmp_path / "tok")
    saved = json.loads((tmp_path / "tok" / "tokenizer.json").read_text())
    saved["model"]["vocab"], saved["model"]["merges"] = {}, []  # a damaged vocabulary: no text maps to a token
    (tmp_path / "tok" / "tokenizer.json").write_text(json.dumps(saved))
    with pytest.raises(InputError, match=r"reads the 460 bytes .* as no token at all: its vocabulary covers none"):
        token_cache([text], load_tokenizer(tmp_path / "tok"), tmp_path / "cache")


@pytest.mark.parametrize("folder", ["checkpoints", "plots"])
def test_a_run_whose_own_folder_is_a_link_outside_it_is_refused_before_anything_is_written(finished, tmp_path,
                                                                                           folder):
    from attnkit.errors import ConfigError
    from attnkit.train import rundir

    run = shutil.copytree(finished, tmp_path / "run")
    outside = tmp_path / "outside"
    shutil.move(run / folder, outside)  # the folder's files now live outside the run, reached through a link
    (run / folder).symlink_to(outside)
    before = sorted(p.name for p in outside.iterdir())
    with pytest.raises(ConfigError, match=f"{folder} is a link to .*outside: a run writes and prunes"):
        rundir.claim(run)
    assert sorted(p.name for p in outside.iterdir()) == before
    rundir.release(run)


def test_a_run_lock_that_is_a_link_is_refused_and_its_target_left_whole(tmp_path):
    from attnkit.errors import ConfigError
    from attnkit.train import rundir

    victim = tmp_path / "notes.txt"
    victim.write_text("kept")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / rundir.LOCK_FILE).symlink_to(victim)  # claim would truncate and write the owner through it
    with pytest.raises(ConfigError, match=r"symbolic links \(.*\.lock\)"):
        rundir.claim(tmp_path / "run")
    assert victim.read_text() == "kept"


def test_a_run_folder_made_a_link_after_the_run_began_takes_no_checkpoint_and_loses_nothing(tmp_path):
    from attnkit.errors import ConfigError
    from attnkit.train import rundir

    outside = tmp_path / "outside"
    (outside / "step_000001").mkdir(parents=True)  # another folder's own files, which pruning would reach
    job = prepare(request(tmp_path / "run"))  # the run is claimed: its folders were checked then
    (tmp_path / "run" / "checkpoints").symlink_to(outside)
    try:
        with pytest.raises(ConfigError, match="checkpoints is a link to .*outside"):
            job.fit()
    finally:
        rundir.release(tmp_path / "run")
    assert [p.name for p in outside.iterdir()] == ["step_000001"]
