"""Data and settings that do not match are said, not used: a training file rewritten since a run's tokenizer was
built, a recipe's model fields against a model named on the command line, and torchrun's launch variables."""

from __future__ import annotations

import logging

import pytest

from attnkit import cli
from attnkit.errors import ConfigError, InputError
from attnkit.train import TrainRequest, prepare
from attnkit.train.distributed import World

TINY = ["d_model=16", "n_layers=1", "n_heads=2", "d_ff=32", "max_seq_len=16"]


def lm_request(out, data, **flags) -> TrainRequest:
    return TrainRequest(out=str(out), task="lm", overrides=TINY, progress=False,
                        data={"data": (str(data),), "eval_batches": 1, "seq_len": 8, "tokenizer": "char"},
                        settings=dict(max_steps=1, batch_size=2, warmup=1, eval_every=1, seed=0), **flags)


def test_a_training_file_rewritten_since_the_runs_tokenizer_is_named_not_trained_on_as_unk(tmp_path, caplog):
    text = tmp_path / "text.txt"
    text.write_text("the quick brown fox jumps over the lazy dog\n" * 40)
    prepare(lm_request(tmp_path / "run", text)).fit()
    text.write_text("ΑΒΓΔ ΕΖΗΘ ΙΚΛΜ ΝΞΟΠ ΡΣΤΥ\n" * 80)  # rewritten: letters the run's tokenizer never saw
    with caplog.at_level(logging.WARNING), pytest.raises(InputError) as refusal:
        prepare(lm_request(tmp_path / "run", text, resume=True))
    message = str(refusal.value)
    assert "% of the tokens of" in message and str(text) in message and "are <unk>" in message
    assert "was the file rewritten" in message and "Train a new run on it" in message
    assert f"the data file {text.resolve()} changed since its tokens were cached" in caplog.text


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "0"}, {"WORLD_SIZE": "two"}, {"RANK": "2", "WORLD_SIZE": "2"},
                                 {"RANK": "-1"}, {"LOCAL_RANK": "x", "WORLD_SIZE": "1"}])
def test_torchruns_variables_are_checked_in_one_line(monkeypatch, capsys, tmp_path, env):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match="distributed launch variables") as refusal:
        World.from_env()
    assert all(f"{name}={value!r}" in str(refusal.value) for name, value in env.items())
    assert cli.main(["train", "--data", "synthetic:copy", "--out", str(tmp_path / "r"), "--max-steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "distributed launch variables" in err and err.count("\n") == 1 and "Traceback" not in err


def test_a_model_named_on_the_command_line_wins_over_a_recipes_model_fields(tmp_path):
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text("First Citizen:\nBefore we proceed any further\n")
    base = ["train", "--recipe", "shakespeare-char", "--data-root", str(tmp_path)]
    recipe = cli.parse(base).settings
    assert "d_model=128" in recipe.set  # the recipe's model when none is named
    named = cli.parse([*base, "--preset", "gpt2-tiny"]).settings
    assert named.preset == "gpt2-tiny" and not [s for s in named.set if s.startswith(("d_model=", "n_layers="))]
    assert cli.parse([*base, "--preset", "gpt2-tiny", "--set", "d_model=64"]).settings.set[-1] == "d_model=64"
    config = tmp_path / "model.json"
    config.write_text('{"family": "decoder", "d_model": 48, "n_heads": 2}')
    from_file = cli.parse([*base, "--model-config", str(config)]).settings
    assert not [s for s in from_file.set if s.startswith("d_model=")]
