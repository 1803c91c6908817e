"""ModelConfig validation: every invalid combination fails at construction, naming the field and the fix."""

import json

import pytest

from attnkit import ConfigError, ModelConfig, presets


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        ({"d_model": 100, "n_heads": 3}, ["d_model=100", "n_heads=3"]),
        ({"n_heads": 6, "n_kv_heads": 4, "d_model": 96}, ["n_heads=6", "n_kv_heads=4"]),
        ({"position": "rope", "d_model": 36, "n_heads": 4}, ["rope", "head_dim=9"]),
        ({"score": "cosine"}, ["score='cosine'", "scaled_dot"]),
        ({"position": "xpos"}, ["position='xpos'", "alibi"]),
        ({"norm": "batch"}, ["norm='batch'", "rms"]),
        ({"activation": "tanh"}, ["activation='tanh'", "swiglu"]),
        ({"family": "rnn"}, ["family='rnn'", "encoder-decoder"]),
        ({"dropout": 1.0}, ["dropout=1.0", "[0, 1)"]),
        ({"dropout": -0.1}, ["dropout=-0.1"]),
        ({"attention_dropout": 1.5}, ["attention_dropout"]),
        ({"vocab_size": 0}, ["vocab_size=0"]),
        ({"n_layers": 2.5}, ["n_layers=2.5"]),
        ({"tgt_vocab_size": 10}, ["tgt_vocab_size", "encoder-decoder"]),
    ],
)
def test_invalid_configs_name_the_field_and_fix(fields, names):
    with pytest.raises(ConfigError) as info:
        ModelConfig(**fields)
    for name in names:
        assert name in str(info.value)


def test_json_round_trip_and_overrides(tmp_path):
    config = presets.get("llama2-tiny")
    assert ModelConfig.from_json(config.to_json()) == config
    path = tmp_path / "config.json"
    config.to_json(path)
    assert ModelConfig.from_json(path) == config
    changed = config.with_overrides(["n_layers=3", "position=learned", "dropout=0.1"])
    assert (changed.n_layers, changed.position, changed.dropout) == (3, "learned", 0.1)


def test_unknown_fields_and_presets_are_refused(tmp_path):
    with pytest.raises(ConfigError, match="n_layer"):
        ModelConfig.from_dict({"n_layer": 2})
    with pytest.raises(ConfigError, match="gpt2-124m"):
        presets.get("gpt5")
    with pytest.raises(ConfigError, match="key=value"):
        ModelConfig().with_overrides(["n_layers"])
    (tmp_path / "bad.json").write_text(json.dumps([1, 2]))
    with pytest.raises(ConfigError, match="object"):
        ModelConfig.from_json(tmp_path / "bad.json")


def test_derived_sizes():
    config = ModelConfig(d_model=64, n_heads=8, n_kv_heads=2)
    assert (config.head_size, config.kv_heads) == (8, 2)
    assert ModelConfig(norm_position="post").use_final_norm is False
    assert ModelConfig(norm_position="pre").use_final_norm is True
