"""Faults a hostile user finds next, each refused before it costs time or harms other work: damaged run files that
would build a model for minutes, and the like. Each test fails without the fix it holds."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from attnkit import build_model, cli
from attnkit import checkpoint as checkpoint_module
from attnkit.checkpoint import CHECKSUMS_FILE, CONFIG_FILE, load_model, save_model
from attnkit.config import ModelConfig
from attnkit.errors import CheckpointError, InputError
from attnkit.outputs import atomic_output, atomic_write


@pytest.fixture
def run(tmp_path) -> Path:
    """A tiny random decoder run (weights and config), without checksums: a directory written by hand, or one whose
    checksums.json was removed, so that only the files themselves are checked."""
    config = ModelConfig(vocab_size=12, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=24)
    save_model(build_model(config).eval(), config, tmp_path / "run")
    (tmp_path / "run" / CHECKSUMS_FILE).unlink()
    return tmp_path / "run"


def edit_config(run: Path, **changes) -> None:
    path = run / CONFIG_FILE
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_config_far_deeper_than_its_weights_is_refused_before_the_model_is_built(run, monkeypatch):
    # 100,000 layers of width 16 fit in memory (about 0.9 GB), so only strict loading refused them, after building
    # the model for many minutes and with a list of a million missing tensors
    edit_config(run, n_layers=100_000)

    def built(config, **_):
        raise AssertionError(f"a model of {config.n_layers} layers was built before the weights were compared")

    monkeypatch.setattr(checkpoint_module, "build_model", built)
    with pytest.raises(CheckpointError, match=r"config\.json describes a model of [\d,]+ parameters, but .*"
                                              r"model\.safetensors holds [\d,]+ values in all"):
        load_model(run)


def test_a_config_close_to_its_weights_still_gets_strict_loadings_list(run):
    edit_config(run, d_ff=40)  # a few more values than stored: each misshapen tensor is named, as before
    with pytest.raises(CheckpointError, match=r"shape mismatches: .*mlp\.up_proj\.weight: checkpoint \(32, 16\) vs "
                                              r"model \(40, 16\)"):
        load_model(run)


def test_a_hugging_face_config_far_deeper_than_its_weights_is_refused_before_the_model_is_built(tmp_path,
                                                                                                  monkeypatch):
    transformers = pytest.importorskip("transformers")
    from attnkit.interop import hf

    config = transformers.GPT2Config(n_embd=16, n_layer=1, n_head=2, vocab_size=40, n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(tmp_path / "gpt2")
    edit_config(tmp_path / "gpt2", n_layer=100_000)

    def built(config, **_):
        raise AssertionError(f"a model of {config.n_layers} layers was built before the weights were compared")

    monkeypatch.setattr(hf, "build_model", built)
    with pytest.raises(CheckpointError, match=r"gpt2/config\.json describes a model of [\d,]+ parameters, but the "
                                              r"weights of .*gpt2 holds [\d,]+ values in all"):
        hf.load(tmp_path / "gpt2")


@pytest.fixture
def fifo(tmp_path) -> Path:
    """A named pipe: as /dev/null or /dev/stdout, a path that exists and is no file, which renaming an output over it
    would replace (as root, `attnkit tune --out /dev/null` left /dev/null a regular file, for every process)."""
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


def test_an_output_is_never_renamed_over_a_device_a_pipe_or_a_socket(fifo):
    with pytest.raises(InputError, match=r"pipe is a device, a pipe or a socket, not a file"):
        atomic_write(fifo, "{}")
    with pytest.raises(InputError, match=r"--to-gguf .*pipe is a device, a pipe or a socket"):
        with atomic_output(fifo, directory=False, overwrite=True, flag="--to-gguf") as partial:
            partial.write_text("{}")
    assert stat.S_ISFIFO(fifo.stat().st_mode)


def test_attnkit_tune_refuses_a_pipe_as_its_profile_before_measuring(fifo, capsys):
    assert cli.main(["tune", "--quick", "--out", str(fifo)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"attnkit: error: --out {fifo} is a device, a pipe or a socket") and err.count("\n") == 1
    assert stat.S_ISFIFO(fifo.stat().st_mode)
