"""Families as registrations: old flat config.json files still load, no family tables outside the registry, the
recurrent families train, resume and load through the same trainer, and config values are type-checked."""

import functools
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import attnkit
from attnkit import cli, presets
from attnkit.checkpoint import load_config, load_model
from attnkit.config import ModelConfig, RecurrentLMConfig, RecurrentSeq2SeqConfig, TransformerConfig
from attnkit.errors import ConfigError
from attnkit.models import build_model, count_parameters, families, family_of
from attnkit.models.families import estimate_parameters
from attnkit.tasks import task_of_config
from attnkit.train import TrainRequest, prepare
from attnkit.train.job import DataConfig
from attnkit.train.trainer import TrainConfig

LEGACY = Path(__file__).parent / "data" / "legacy_runs"
SRC = Path(__file__).resolve().parents[1] / "src" / "attnkit"


@pytest.mark.parametrize("name", sorted(p.name for p in LEGACY.iterdir() if p.is_dir()))
def test_flat_config_json_of_each_family_loads_and_computes_the_same(name):
    run = LEGACY / name
    config = load_config(run)
    assert isinstance(config, TransformerConfig) and config.family in name
    assert type(config) is family_of(config).config
    model, _ = load_model(run)
    expected = load_file(str(run / "expected.safetensors"))
    ids = expected["input_ids"]
    with torch.no_grad():
        out = model(ids, torch.tensor([[1, 4, 6, 8]])) if task_of_config(config).decodes else model(ids)
    torch.testing.assert_close(out.logits, expected["logits"])
    assert ModelConfig.from_json(config.to_json()) == config  # the new format round-trips


def test_every_family_registers_once_and_builds_from_its_config():
    names = [f.name for f in families()]
    assert len(names) == len(set(names))
    assert {"decoder", "encoder", "encoder-decoder", "recurrent-lm", "recurrent-seq2seq", "conv-lm"} <= set(names)
    for family in families():
        config = family.config()
        assert config.family == family.name and type(ModelConfig(family=family.name)) is family.config
        assert isinstance(build_model(config), torch.nn.Module)


def test_no_table_outside_the_registry_keys_on_family_names():
    names = "|".join(re.escape(f.name) for f in families())
    patterns = [
        r"family\s*[!=]=",  # config.family == "decoder"
        r"\.family\s+(not\s+)?in\b",  # config.family in (...)
        rf"(?:^|[{{,])\s*[\"'](?:{names})[\"']\s*:",  # {"decoder": ...}
        r"\"family\"[^)\n]*\)\s*[!=]=",  # getattr(model, "family", None) == ...
    ]
    allowed = {SRC / "config.py", SRC / "models" / "families.py", SRC / "tasks" / "registry.py"}  # tasks name theirs
    found = [
        f"{path.relative_to(SRC)}:{n}: {line.strip()}"
        for path in SRC.rglob("*.py") if path not in allowed
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if any(re.search(p, line) for p in patterns)
    ]
    assert not found, "family names used as keys outside models/families.py:\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"family": "recurrent-lm", "d_model": 64}, ["d_model=64", "'decoder'", "recurrent-lm"]),
        ({"family": "recurrent-seq2seq", "n_heads": 4}, ["n_heads=4"]),
        ({"family": "decoder", "cell": "gru"}, ["cell='gru'", "recurrent-lm"]),
        ({"family": "encoder", "attention": "bahdanau"}, ["attention='bahdanau'", "recurrent-seq2seq"]),
        ({"family": "decoder", "pooling": "mean"}, ["pooling='mean'", "'encoder'"]),
        ({"family": "recurrent-lm", "cell": "transformer"}, ["cell='transformer'", "lstm"]),
        ({"family": "recurrent-lm", "hidden_size": 0}, ["hidden_size=0"]),
        ({"family": "recurrent-seq2seq", "attention": "luong-dot", "bidirectional": True}, ["luong-dot"]),
    ],
)
def test_fields_of_another_family_are_refused_at_construction(fields, names):
    with pytest.raises(ConfigError) as info:
        ModelConfig(**fields)
    for name in names:
        assert name in str(info.value)


@pytest.mark.parametrize(
    ("make", "names"),
    [
        (lambda: ModelConfig().with_overrides(["tie_embeddings=no"]), ["tie_embeddings='no'", "true or false"]),
        (lambda: ModelConfig.from_json('{"tie_embeddings": "false"}'), ["tie_embeddings='false'"]),
        (lambda: ModelConfig(dropout="0.1"), ["dropout='0.1'", "number"]),
        (lambda: ModelConfig(n_layers=True), ["n_layers=True", "integer"]),
        (lambda: ModelConfig(family="recurrent-lm", bidirectional=True), ["bidirectional"]),
        (lambda: RecurrentSeq2SeqConfig(bidirectional="yes"), ["bidirectional='yes'"]),
        (lambda: TrainConfig.from_dict({"lr": "1e-3"}), ["lr='1e-3'", "number"]),
        (lambda: TrainConfig.from_dict({"compile": "false"}), ["compile='false'"]),
        (lambda: TrainConfig.from_dict({"batch_size": 0}), ["batch_size=0"]),
        (lambda: DataConfig.from_dict({"seq_len": 0}), ["seq_len=0"]),
        (lambda: DataConfig.from_dict({"eval_batches": "3"}), ["eval_batches='3'", "integer"]),
        (lambda: ModelConfig(max_seq_len=0), ["max_seq_len=0"]),
    ],
)
def test_values_are_checked_against_their_declared_types(make, names):
    with pytest.raises(ConfigError) as info:
        make()
    for name in names:
        assert name in str(info.value)


def test_type_check_stores_what_the_type_says():
    config = ModelConfig.from_json('{"tie_embeddings": false, "dropout": 0}')
    assert config.tie_embeddings is False and isinstance(config.dropout, float)
    assert TrainConfig.from_dict({"lora_targets": ["q_proj"]}).lora_targets == ("q_proj",)


def test_a_change_of_family_keeps_the_shared_fields():
    config = presets.get("gpt2-tiny").replace(family="recurrent-lm")
    assert isinstance(config, RecurrentLMConfig) and config.n_layers == 2 and config.vocab_size == 512


@pytest.fixture
def small_data(monkeypatch):
    monkeypatch.setattr("attnkit.tasks.common.SYNTHETIC_SIZES", (400, 24))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


RECURRENT = [("lm", "rnn-lm-tiny", "synthetic:copy", "eval_batches=2"),
             ("translate", "gru-attn-seq2seq-tiny", "synthetic:reverse", "bleu_samples=4")]


@pytest.mark.parametrize(("task", "preset", "data", "evaluation"), RECURRENT)
def test_recurrent_families_train_resume_and_load_from_the_command_line(tmp_path, small_data, task, preset, data,
                                                                        evaluation):
    common = ["--task", task, "--preset", preset, "--data", data, "--batch-size", "4", "--eval-every", "3",
              "--no-progress", "--set", evaluation, "--set", "dropout=0.1"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert cli.main(["train", *common, "--out", str(whole), "--max-steps", "6"]) == 0
    assert cli.main(["train", *common, "--out", str(split), "--max-steps", "3"]) == 0
    assert cli.main(["train", "--out", str(split), "--resume", "--max-steps", "6", "--no-progress"]) == 0
    a, b = load_model(whole)[0].state_dict(), load_model(split)[0].state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # resumed bit for bit

    pipeline = attnkit.load(whole, device="cpu")
    assert type(pipeline.config) is type(presets.get(preset))
    if task == "lm":
        assert isinstance(pipeline.generate("abc", max_new_tokens=5, temperature=0)[0], str)
    else:
        greedy = pipeline.translate(["abc"])
        assert greedy == pipeline.translate(["abc"], beam_size=1) and isinstance(greedy[0], str)
        assert isinstance(pipeline.translate(["abc", "ba"], beam_size=3)[1], str)


def test_recurrent_lm_task_refuses_a_translate_preset(tmp_path, small_data):
    request = TrainRequest(out=str(tmp_path), task="lm", preset="gru-seq2seq-tiny",
                           data={"data": ("synthetic:copy",)}, progress=False)
    with pytest.raises(ConfigError, match="recurrent-lm"):
        prepare(request)


@pytest.mark.parametrize("fields", [dict(vocab_size=2**70), dict(d_model=2**62, n_heads=1), dict(d_ff=2**64),
                                    dict(max_seq_len=2**64), dict(family="recurrent-lm", hidden_size=2**64)])
def test_sizes_no_tensor_can_hold_are_a_config_error_naming_them(fields):
    """A config.json with a size beyond what a tensor can hold (damaged, or foreign) is refused naming the size, by
    the memory check every build goes through and by the parameter count, where torch's overflow came out of both."""
    config = ModelConfig(**fields)
    size = next(name for name in fields if name != "family")
    for make in (build_model, functools.partial(build_model, force=True), count_parameters,
                 estimate_parameters):
        with pytest.raises(ConfigError, match=rf"no tensor can hold \({size}={fields[size]}"):
            make(config)


@pytest.mark.parametrize("fields", [dict(d_ff=2**62, n_layers=10**6), dict(family="recurrent-seq2seq",
                                                                          hidden_size=2**40, n_layers=2**30)])
def test_a_deep_model_with_a_size_no_tensor_can_hold_is_refused_before_anything_is_built(fields, monkeypatch):
    """estimate_parameters counts a deep stack from one and two layers; a weight beyond int64 is refused by
    arithmetic first, where the shallow build's overflow sent it on to build all 10**6 layers."""
    monkeypatch.setattr(sys.modules[estimate_parameters.__module__], "count_parameters",
                        lambda model: pytest.fail("a model was built to be counted"))
    with pytest.raises(ConfigError, match="no tensor can hold"):
        estimate_parameters(ModelConfig(**fields))
