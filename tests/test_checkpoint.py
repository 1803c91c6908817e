"""Checkpoints: safetensors + JSON, atomic, strict; a corrupted or mismatched one is refused by name."""

import json

import pytest
import torch

from attnkit import CheckpointError, build_model, presets
from attnkit.checkpoint import (
    CHECKSUMS_FILE,
    WEIGHTS_FILE,
    load_model,
    load_tensors,
    read_labels,
    save_model,
    save_tensors,
)


@pytest.mark.parametrize("name", ["gpt2-tiny", "llama2-tiny", "bert-tiny", "vaswani-tiny"])
def test_round_trip_gives_identical_weights(tmp_path, name):
    config = presets.get(name)
    model = build_model(config)
    save_model(model, config, tmp_path)
    loaded, loaded_config = load_model(tmp_path)
    assert loaded_config == config
    for (key, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), key


def test_tied_weights_are_stored_once(tmp_path):
    config = presets.get("gpt2-tiny")
    save_model(build_model(config), config, tmp_path)
    names = set(load_tensors(tmp_path / WEIGHTS_FILE))
    assert "stack.embeddings.token.weight" in names and "lm_head.weight" not in names


def test_truncated_file_is_refused(tmp_path):
    config = presets.get("gpt2-tiny")
    save_model(build_model(config), config, tmp_path)
    path = tmp_path / WEIGHTS_FILE
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=f"{path} is damaged: its SHA-256 differs"):
        load_model(tmp_path)
    (tmp_path / CHECKSUMS_FILE).unlink()  # a directory written by hand or before checksums: safetensors' own check
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        load_model(tmp_path)


def test_mismatched_checkpoint_lists_tensor_names(tmp_path):
    config = presets.get("gpt2-tiny")
    tensors = load_tensors_after_save(tmp_path, config)
    tensors.pop("stack.blocks.1.mlp.up_proj.bias")
    tensors["stack.blocks.0.extra.weight"] = torch.zeros(2)
    tensors["stack.final_norm.weight"] = torch.zeros(7)
    save_tensors(tensors, tmp_path / WEIGHTS_FILE)
    with pytest.raises(CheckpointError) as info:
        load_model(tmp_path, verify=False)  # past the checksums, which this rewrite would fail
    message = str(info.value)
    assert "missing tensors: stack.blocks.1.mlp.up_proj.bias" in message
    assert "unexpected tensors: stack.blocks.0.extra.weight" in message
    assert "stack.final_norm.weight: checkpoint (7,) vs model (64,)" in message


def test_config_disagreeing_with_weights_is_refused(tmp_path):
    config = presets.get("gpt2-tiny")
    save_model(build_model(config), config, tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["d_ff"] = 128
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError, match="config.json is damaged"):
        load_model(tmp_path)
    with pytest.raises(CheckpointError, match="up_proj.weight: checkpoint \\(256, 64\\) vs model \\(128, 64\\)"):
        load_model(tmp_path, verify=False)


def test_missing_files_are_named(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        load_model(tmp_path)


def test_a_failed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    config = presets.get("gpt2-tiny")
    model = build_model(config)
    save_model(model, config, tmp_path)
    before = (tmp_path / WEIGHTS_FILE).read_bytes()

    def broken_save(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr("attnkit.checkpoint.save_file", broken_save)
    with pytest.raises(CheckpointError, match=f"cannot finish writing {tmp_path / WEIGHTS_FILE}: disk full"):
        save_model(model, config, tmp_path)
    assert (tmp_path / WEIGHTS_FILE).read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [CHECKSUMS_FILE, "config.json", WEIGHTS_FILE]


def test_a_really_full_disk_is_one_line_though_safetensors_reports_no_oserror(small_disk):
    """safetensors reports a failed write as its own SafetensorError ("... (os error 28)"), not an OSError."""
    path = small_disk / WEIGHTS_FILE
    with pytest.raises(CheckpointError) as err:
        save_tensors({"w": torch.zeros(100_000)}, path)  # 400 KB for a 64 KiB disk
    one_line = f"cannot finish writing {path}: the disk is full; free some space, or write to another disk"
    assert str(err.value) == one_line
    assert not list(small_disk.iterdir())  # the temporary file is gone: the space is free again


def load_tensors_after_save(directory, config):
    save_model(build_model(config), config, directory)
    return load_tensors(directory / WEIGHTS_FILE)


@pytest.mark.parametrize("content, expected", [('{"labels": ["neg", "pos"]}', ["neg", "pos"]), ('[0, 1]', ["0", "1"])])
def test_labels_read_in_either_written_form(tmp_path, content, expected):
    (tmp_path / "labels.json").write_text(content)
    assert read_labels(tmp_path) == expected


@pytest.mark.parametrize("content, expected", [('{"labels": "neg"}', "must hold the class names"),
                                               ('["neg", ', "not readable JSON")])
def test_damaged_labels_are_a_checkpoint_error_naming_the_file(tmp_path, content, expected):
    (tmp_path / "labels.json").write_text(content)
    with pytest.raises(CheckpointError, match=expected) as caught:
        read_labels(tmp_path)
    assert "labels.json" in str(caught.value)


def test_a_run_without_labels_has_none(tmp_path):
    assert read_labels(tmp_path) is None
