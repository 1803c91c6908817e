"""The run directory: complete checkpoints or none, the last N and the best kept, RNG and optimizer state
restored exactly."""

import json
import random

import numpy as np
import pytest
import torch

from attnkit import ModelConfig, build_model
from attnkit.checkpoint import load_model, save_model
from attnkit.errors import CheckpointError
from attnkit.generate import load
from attnkit.tokenize import CharTokenizer
from attnkit.train import optim, state

CONFIG = ModelConfig(family="decoder", vocab_size=11, d_model=16, n_layers=1, n_heads=2, d_ff=32, max_seq_len=8)


def trained_pieces(seed=0):
    torch.manual_seed(seed)
    model = build_model(CONFIG)
    optimizer = optim.make_optimizer(model, lr=1e-2, weight_decay=0.1)
    model(torch.randint(0, 11, (2, 8)), labels=torch.randint(0, 11, (2, 8))).loss.backward()
    optimizer.step()
    return model, optimizer, CharTokenizer("abcdefg")


def save(run_dir, step, model, optimizer, tokenizer, **kwargs):
    return state.save_checkpoint(
        run_dir, model=model, config=CONFIG, optimizer=optimizer, tokenizer=tokenizer, task={"task": "lm"},
        train_state={"step": step, "note": f"state of step {step}"}, **kwargs,
    )


def test_keeps_the_last_n_and_the_best_and_mirrors_the_latest_at_the_top(tmp_path):
    model, optimizer, tokenizer = trained_pieces()
    for step in (10, 20, 30, 40):
        save(tmp_path, step, model, optimizer, tokenizer, keep=2, best=step == 20)
    assert [p.name for p in state.checkpoints(tmp_path)] == ["step_000030", "step_000040"]
    assert json.loads((tmp_path / "train_state.json").read_text())["step"] == 40
    assert json.loads((tmp_path / "best" / "train_state.json").read_text())["step"] == 20
    assert state.read_task(tmp_path) == {"task": "lm"}
    for directory in (tmp_path, tmp_path / "best", tmp_path / "checkpoints" / "step_000030"):
        loaded, config = load_model(directory)
        assert config == CONFIG
        for name, tensor in model.state_dict().items():
            assert torch.equal(loaded.state_dict()[name], tensor)
    pipeline = load(tmp_path, device="cpu")  # the generation side reads the same layout
    assert pipeline.tokenizer.fingerprint() == tokenizer.fingerprint()
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob(".*.tmp"))


def test_a_crash_while_saving_leaves_the_previous_checkpoint_whole(tmp_path, monkeypatch):
    model, optimizer, tokenizer = trained_pieces()
    save(tmp_path, 10, model, optimizer, tokenizer)
    changed, _, _ = trained_pieces(seed=1)

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(state, "save_tensors", crash)  # the model is written, then the optimizer state fails
    with pytest.raises(CheckpointError, match="saving checkpoint step_000020 .*: disk full.*already saved are intact"):
        save(tmp_path, 20, changed, optimizer, tokenizer)
    assert state.find_checkpoint(tmp_path).name == "step_000010"
    checkpoint = state.load_checkpoint(tmp_path)
    assert checkpoint.step == 10
    for name, tensor in model.state_dict().items():
        assert torch.equal(checkpoint.model.state_dict()[name], tensor)
        assert torch.equal(load_model(tmp_path)[0].state_dict()[name], tensor)


def test_a_full_disk_while_copying_to_best_says_so_and_that_a_resume_finishes_it(tmp_path, monkeypatch):
    model, optimizer, tokenizer = trained_pieces()

    def full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(state, "_mirror_dir", full)
    with pytest.raises(CheckpointError, match=r"copying checkpoint step_000010 to best/ in .*full.*already saved are "
                                              r"intact; --resume copies it to best/"):
        save(tmp_path, 10, model, optimizer, tokenizer, best=True)
    assert json.loads((tmp_path / "train_state.json").read_text())["step"] == 10  # the top level took its copy


def test_optimizer_state_round_trips_by_parameter_name(tmp_path):
    model, optimizer, tokenizer = trained_pieces()
    save(tmp_path, 1, model, optimizer, tokenizer)
    checkpoint = state.load_checkpoint(tmp_path)
    fresh = optim.make_optimizer(checkpoint.model, lr=1e-2, weight_decay=0.1)
    state.load_optimizer_tensors(fresh, checkpoint.optimizer, source="test")
    for name, param in checkpoint.model.named_parameters():
        original = optimizer.state[dict(model.named_parameters())[name]]
        restored = fresh.state[param]
        assert set(restored) == set(original) == {"step", "exp_avg", "exp_avg_sq"}
        for key in original:
            assert torch.equal(restored[key], original[key]), (name, key)


def test_optimizer_state_of_another_model_is_refused(tmp_path):
    model, optimizer, _ = trained_pieces()
    other = build_model(CONFIG.replace(n_layers=2))
    with pytest.raises(CheckpointError, match="different model"):
        state.load_optimizer_tensors(optim.make_optimizer(other, lr=1e-3, weight_decay=0.0),
                                     state.optimizer_tensors(optimizer), source="x")


def test_rng_states_round_trip_through_json():
    state.seed_all(3)
    saved = json.loads(json.dumps(state.capture_rng()))
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(3)  # move every generator on
    state.restore_rng(saved)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[:2] == expected[:2] and torch.equal(got[2], expected[2])


def test_find_checkpoint_explains_an_empty_directory(tmp_path):
    with pytest.raises(CheckpointError, match="nothing to resume.*drop --resume"):
        state.find_checkpoint(tmp_path)


def test_find_checkpoint_sends_a_model_without_training_state_to_init_from(tmp_path):
    model, _, tokenizer = trained_pieces()
    save_model(model, CONFIG, tmp_path)  # as attnkit convert and attnkit average write one
    with pytest.raises(CheckpointError, match=rf"nothing to resume in {tmp_path}: it holds a model .* but no training "
                                              rf"state .*--init-from {tmp_path} --out NEW_RUN"):
        state.find_checkpoint(tmp_path)


def test_config_differences_name_each_field():
    assert state.config_differences({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 4}) == ["b: 2 -> 3", "c: None -> 4"]
