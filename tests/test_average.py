"""Checkpoint averaging (`attnkit average`): the mean of the last N checkpoints' weights, written as a run that
loads and translates; mismatched checkpoints are refused by name."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_finetune import finetune, mlm_run, texts  # noqa: F401 (fixtures: an MLM run and labelled texts)
from test_train import request, small_and_single_threaded  # noqa: F401 (a fixture: one thread)

from attnkit import cli
from attnkit.checkpoint import CHECKSUMS_FILE, CONFIG_FILE, WEIGHTS_FILE, digest, load_model, read_checksums
from attnkit.errors import CheckpointError, InputError
from attnkit.generate import load
from attnkit.train import prepare
from attnkit.train.average import AVERAGE_FILE, average_run, average_tensors


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A tiny translator with checkpoints at steps 2, 4 and 6."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("avg") / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (400, 16))
        prepare(request(out, "translate", max_steps=6, eval_every=2, keep=3)).fit()
    torch.set_num_threads(threads)
    return out


def step(run, n):
    return run / "checkpoints" / f"step_{n:06d}"


def weights(directory):
    return load_file(str(directory / WEIGHTS_FILE))


def test_the_average_of_two_checkpoints_is_their_elementwise_mean(run, tmp_path):
    out = average_run(run, last=2, out=tmp_path / "avg")
    a, b, mean = weights(step(run, 4)), weights(step(run, 6)), weights(out)
    assert mean.keys() == a.keys()
    assert any(not torch.equal(a[k], b[k]) for k in a)  # the two differ, so the test can fail
    for name in a:
        torch.testing.assert_close(mean[name], ((a[name].double() + b[name].double()) / 2).float(), rtol=0, atol=0)
    assert json.loads((out / AVERAGE_FILE).read_text())["steps"] == [4, 6]


def test_a_lora_runs_checkpoints_average_with_their_adapters_folded_in(texts, mlm_run, tmp_path):  # noqa: F811
    """The mean of the merged weights W + alpha / r * B A (the mean of B and of A apart would not give it)."""
    lora = tmp_path / "lora"
    prepare(finetune(lora, texts, mlm_run, lora_rank=2, max_steps=4, eval_every=2)).fit()
    out = average_run(lora, last=2)
    merged = [load(step(lora, n), device="cpu").model.state_dict() for n in (2, 4)]
    averaged = load(out, device="cpu").model.state_dict()
    assert averaged.keys() == merged[0].keys()
    for name, tensor in averaged.items():
        torch.testing.assert_close(tensor, (merged[0][name] + merged[1][name]) / 2, rtol=1e-6, atol=1e-7)


def test_the_average_of_identical_checkpoints_is_the_checkpoint(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    for n in (7, 8):
        shutil.copytree(step(copy, 2), step(copy, n))
    out = average_run(copy, last=2)
    assert out == copy / "average-last-2"
    for name, tensor in weights(step(copy, 2)).items():
        assert torch.equal(weights(out)[name], tensor), name


def test_the_average_loads_translates_and_carries_checksums(run, tmp_path):
    out = average_run(run, last=3, out=tmp_path / "avg")
    assert set(read_checksums(out)) >= {CONFIG_FILE, WEIGHTS_FILE, AVERAGE_FILE}
    model, _ = load_model(out)
    expected = {k: sum(weights(step(run, n))[k].double() for n in (2, 4, 6)) / 3 for k in weights(out)}
    state = model.state_dict()
    for name, tensor in expected.items():
        torch.testing.assert_close(state[name].double(), tensor, rtol=0, atol=1e-7)
    translations = load(out, device="cpu").translate(["abc", "hello"], beam_size=2, max_length=8)
    assert len(translations) == 2 and all(isinstance(t, str) for t in translations)
    average_run(run, last=2, out=out)  # an earlier average is replaced
    assert json.loads((out / AVERAGE_FILE).read_text())["steps"] == [4, 6]


def test_mismatched_checkpoints_are_refused_naming_the_tensors(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    last = step(copy, 6)
    tensors = weights(last)
    renamed = next(iter(tensors))
    tensors[renamed + "_other"] = tensors.pop(renamed)
    save_file(tensors, str(last / WEIGHTS_FILE), metadata={"format": "pt"})
    digests = read_checksums(last)
    digests[WEIGHTS_FILE] = digest(last / WEIGHTS_FILE)
    (last / CHECKSUMS_FILE).write_text(json.dumps({"sha256": digests}))
    with pytest.raises(CheckpointError, match=f"only in .*step_000004: {renamed}"):
        average_run(copy, last=2)
    states = [{"w": torch.zeros(2, 3)}, {"w": torch.zeros(3, 2)}]
    with pytest.raises(CheckpointError, match=r"w: \(2, 3\) torch.float32 vs \(3, 2\)"):
        average_tensors(states, ["a", "b"])


def test_configs_that_differ_are_refused(run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    config = json.loads((step(copy, 6) / CONFIG_FILE).read_text())
    config["dropout"] = 0.5
    (step(copy, 6) / CONFIG_FILE).write_text(json.dumps(config))
    digests = read_checksums(step(copy, 6))
    digests[CONFIG_FILE] = digest(step(copy, 6) / CONFIG_FILE)
    (step(copy, 6) / CHECKSUMS_FILE).write_text(json.dumps({"sha256": digests}))
    with pytest.raises(CheckpointError, match="configs differ in dropout"):
        average_run(copy, last=2)


def test_bad_requests_say_what_to_do(run, tmp_path):
    with pytest.raises(InputError, match="holds only 3 checkpoints"):
        average_run(run, last=4)
    with pytest.raises(InputError, match="no checkpoints/step_"):
        average_run(tmp_path, last=1)
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not an earlier average"):
        average_run(run, last=1, out=tmp_path / "taken")
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_the_command_line(run, tmp_path, capsys):
    assert cli.main(["average", str(run), "--last", "2", "--out", str(tmp_path / "avg")]) == 0
    assert "steps 4, 6" in capsys.readouterr().out
    assert cli.main(["average", str(run), "--last", "1", "--out", str(tmp_path / "one")]) == 0
    assert "the weights of step 6 into" in capsys.readouterr().out
    assert cli.main(["average", str(run), "--last", "0"]) == 2
    assert "last=0" in capsys.readouterr().err


def test_average_last_must_be_a_kept_checkpoint_count():
    from attnkit.errors import ConfigError
    from attnkit.train.trainer import TrainConfig

    with pytest.raises(ConfigError, match="average_last=4 must lie in 0..keep"):
        TrainConfig(keep=3, average_last=4)


@pytest.mark.slow
def test_training_averages_its_last_checkpoints_at_the_end(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (200, 16))
    out = tmp_path / "run"
    tiny = ["d_model=32", "n_layers=1", "n_heads=2", "d_ff=64", "max_seq_len=24"]
    code = cli.main(["train", "--task", "translate", "--data", "synthetic:reverse", "--tokenizer", "char",
                     "--max-steps", "6", "--eval-every", "2", "--batch-size", "8", "--average-last", "2",
                     "--bleu-samples", "4", "--no-progress", "--out", str(out), "--set", *tiny])
    assert code == 0
    assert f"averaged the last 2 checkpoints: {out / 'average-last-2'}" in capsys.readouterr().out
    assert json.loads((out / "average-last-2" / AVERAGE_FILE).read_text())["steps"] == [4, 6]


def test_eval_scores_the_average_of_the_last_checkpoints(run, tmp_path, capsys):
    from attnkit.data.synthetic import make_task

    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in make_task("reverse", 6, seed=5).pairs()))
    assert cli.main(["eval", "--run", str(run), "--data", str(tsv), "--average-last", "2", "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert "bleu_lowercased" in printed and str(run / "average-last-2" / "eval" / "eval.json") in printed
    assert json.loads((run / "average-last-2" / AVERAGE_FILE).read_text())["steps"] == [4, 6]
