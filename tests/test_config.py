"""ModelConfig validation: every invalid combination fails at construction, naming the field and the fix."""

import json
import logging

import pytest

from attnkit import ConfigError, ModelConfig, build_model, count_parameters, presets
from attnkit.checkpoint import load_config
from attnkit.version import installed_version


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
        ({"position": "sinusoidal", "d_model": 33, "n_heads": 3}, ["sinusoidal", "d_model=33", "even"]),
        ({"family": "encoder-decoder", "position": "sinusoidal", "d_model": 45, "n_heads": 5}, ["d_model=45"]),
        ({"attention_window": 300, "max_seq_len": 256}, ["attention_window=300", "max_seq_len=256"]),
        ({"attention_window": 4, "global_every": 3, "n_layers": 2}, ["global_every=3", "n_layers=2"]),
        ({"norm_eps": float("inf")}, ["norm_eps=inf", "finite"]),
        ({"rope_theta": float("inf"), "position": "rope"}, ["rope_theta=inf"]),
        ({"attn_softcap": float("inf")}, ["attn_softcap=inf"]),
        ({"d_model": -32}, ["d_model=-32"]),
        ({"n_kv_heads": -2}, ["n_kv_heads=-2"]),
        ({"head_dim": 0}, ["head_dim=0"]),
    ],
)
def test_invalid_configs_name_the_field_and_fix(fields, names):
    with pytest.raises(ConfigError) as info:
        ModelConfig(**fields)
    for name in names:
        assert name in str(info.value)


def test_a_negative_size_is_not_told_that_0_has_no_meaning():
    with pytest.raises(ConfigError, match=r"dilation_base=-2 must be positive: a size or count is never below 0$"):
        ModelConfig(family="conv-lm", dilation_base=-2)
    with pytest.raises(ConfigError, match="kernel_size=0 must be positive; 0 has no meaning here"):
        ModelConfig(family="conv-lm", kernel_size=0)


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


@pytest.mark.parametrize(
    ("data", "names"),
    [
        (b"\xff\xfe\x00garbage", ["not UTF-8", "0xff"]),
        (b'{"d_model": 64, "n_layers": 3, "d_model": 32}', ["d_model", "twice"]),
        (b'{"d_model": 1' + b"0" * 5000 + b"}", ["not valid JSON", "too long"]),
        (b'{"norm_eps": NaN}', ["norm_eps=nan", "finite"]),
        (b'{"vocab_size": 1' + b"0" * 400 + b"}", ["vocab_size is an integer of 1329 bits"]),
        (b'{"norm_eps": -1' + b"0" * 400 + b"}", ["norm_eps=-inf", "finite"]),
        (b"[" * 100_000, ["not valid JSON"]),
    ],
)
def test_a_config_file_read_back_is_checked(tmp_path, data, names):
    """A damaged config.json (not UTF-8, a key given twice, a number too long to read, NaN, an integer beyond a
    float, nested without end) is refused with one ConfigError naming the file's problem, never a traceback or a
    silently chosen value."""
    path = tmp_path / "config.json"
    path.write_bytes(data)
    for source in (path, data.decode("utf-8", errors="replace")):  # a path, and the text itself
        if source is not path and b"\xff" in data:
            continue
        with pytest.raises(ConfigError) as info:
            ModelConfig.from_json(source)
        for name in names:
            assert name in str(info.value)


def test_resolved_fills_in_what_none_stands_for_and_keeps_the_config_as_written():
    config = ModelConfig(d_model=64, n_heads=8, n_kv_heads=2)
    assert (config.resolved.head_dim, config.resolved.n_kv_heads) == (8, 2) and config.head_dim is None
    assert ModelConfig(norm_position="post").resolved.final_norm is False
    assert ModelConfig(norm_position="pre").resolved.final_norm is True
    assert ModelConfig(family="encoder-decoder", n_layers=3).resolved.n_decoder_layers == 3
    assert ModelConfig(family="recurrent-seq2seq", hidden_size=32).resolved.embedding_dim == 32
    assert config.replace(d_model=128).resolved.head_dim == 16  # None still means d_model // n_heads
    assert config.resolved.to_dict()["head_dim"] == 8 and config.to_dict()["head_dim"] is None
    assert count_parameters(build_model(config)) == count_parameters(build_model(config.resolved))


def test_old_names_of_resolved_values_are_read_from_config_json_with_a_warning(tmp_path, caplog):
    """A config.json naming kv_heads, head_size, use_final_norm (the attributes beside n_kv_heads, head_dim and
    final_norm before one name per concept) still loads, and the warning names the key to write."""
    written = ModelConfig(d_model=64, n_heads=8, n_kv_heads=2, head_dim=16, norm_position="post", final_norm=True)
    old = written.to_dict()
    for old_name, new_name in (("kv_heads", "n_kv_heads"), ("head_size", "head_dim"), ("use_final_norm", "final_norm")):
        old[old_name] = old.pop(new_name)
    (tmp_path / "config.json").write_text(json.dumps(old))
    with caplog.at_level(logging.WARNING, logger="attnkit.config"):
        assert ModelConfig.from_json(tmp_path / "config.json") == written
    for old_name, new_name in (("kv_heads", "n_kv_heads"), ("head_size", "head_dim"), ("use_final_norm", "final_norm")):
        assert any(f"'{old_name}' is now called '{new_name}'" in record.message for record in caplog.records)
    with pytest.raises(ConfigError, match="kv_heads is the old name of n_kv_heads"):
        ModelConfig(kv_heads=2, n_kv_heads=2, n_heads=4)
    with pytest.warns(DeprecationWarning, match=r"config.resolved.n_kv_heads"):
        assert written.kv_heads == 2  # the old attribute, resolved
    with pytest.raises(AttributeError):
        ModelConfig(family="decoder").n_decoder_layers  # noqa: B018  (an encoder-decoder's field only)


def test_a_config_json_written_before_the_window_checks_still_loads_as_the_model_it_built(tmp_path, caplog):
    """A window longer than max_seq_len hid no key, and a global_every beyond every stack made no layer global:
    refused when a config is made (or read as a new config), such a config.json of an old run reads as the same
    model (no window, 0), with a warning naming the field."""
    written = ModelConfig(d_model=32, n_heads=4, max_seq_len=64, position="rope", attention_window=8).to_dict()
    cases = [({"attention_window": 100}, {"attention_window": None}),
             ({"attention_window": 100, "global_every": 2}, {"attention_window": None, "global_every": 0}),
             ({"global_every": 3}, {"global_every": 0})]
    written.pop("global_every")  # a hand-written file may leave it out
    for old, read in cases:
        (tmp_path / "config.json").write_text(json.dumps({**written, **old}))
        caplog.clear()  # this case's warning, not an earlier one's
        with caplog.at_level(logging.WARNING, logger="attnkit.config"):
            config = load_config(tmp_path)
        assert {name: getattr(config, name) for name in read} == read
        assert any(name in record.message for record in caplog.records for name in old)
        with pytest.raises(ConfigError):
            ModelConfig(**{**written, **old})


@pytest.mark.parametrize(("change", "named"), [
    ({"format_version": 2}, "names the field format_version, unknown to this attnkit"),
    ({"format_version": 2, "moe_experts": 8}, "names fields format_version, moe_experts, unknown to this attnkit"),
    ({"family": "state-space"}, "names family='state-space', which this attnkit does not have (it has decoder, "),
])
def test_a_config_json_from_a_newer_attnkit_says_so_and_what_to_do(tmp_path, change, named):
    """A run's config.json with a field or family this attnkit lacks was most likely written by a newer one: the
    error names the file and what it holds, says so, and says to upgrade (it listed the family's fields, or the
    families, as if the run were a typo of the user's)."""
    (tmp_path / "config.json").write_text(json.dumps({**ModelConfig(d_model=32, n_heads=4).to_dict(), **change}))
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'config.json'} {named}")
    assert str(err.value).endswith(f"probably saved by a newer attnkit than this one ({installed_version()}); upgrade "
                                   f"attnkit (pip install -U attnkit) to load it, or, if {tmp_path / 'config.json'} "
                                   "was edited by hand, undo the edit")
    with pytest.raises(ConfigError, match="^unknown config field 'format_version'|^family='state-space' is not a"):
        ModelConfig.from_dict({**ModelConfig().to_dict(), **change})  # a new config: a mistake of the user's


def test_a_new_config_file_with_a_window_that_changes_nothing_is_refused(tmp_path):
    """`attnkit train --model-config FILE` reads a new config: a window longer than max_seq_len is refused naming
    the field, not read as none (a later `--set max_seq_len=2048` would then train with full attention)."""
    path = tmp_path / "new.json"
    path.write_text(json.dumps({"position": "rope", "attention_window": 512, "max_seq_len": 256}))
    with pytest.raises(ConfigError, match="attention_window=512 is longer than max_seq_len=256"):
        ModelConfig.from_json(path)
    path.write_text(json.dumps({"position": "rope", "attention_window": 8, "global_every": 3, "n_layers": 2}))
    with pytest.raises(ConfigError, match="global_every=3"):
        ModelConfig.from_json(path)


def test_an_old_encoder_decoder_config_reads_its_decoder_layers_before_the_window_read_back(tmp_path):
    """decoder_layers (n_decoder_layers's old name) is the decoder's depth when global_every is read back: 4 of a
    6-layer decoder made its 4th layer global, so it is kept, not read as 0 (a different model)."""
    fields = {"family": "encoder-decoder", "d_model": 32, "n_heads": 4, "position": "rope", "max_seq_len": 64,
              "attention_window": 8, "global_every": 4, "n_layers": 2, "decoder_layers": 6}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    config = load_config(tmp_path)
    assert (config.global_every, config.n_decoder_layers, config.attention_window) == (4, 6, 8)


@pytest.mark.parametrize(("value", "fix"), [("64", "write the number without quotes"), (True, "give an integer"),
                                             (2.5, "give an integer"), ([64], "give an integer")])
def test_a_number_field_of_another_type_is_told_the_fix_that_fits_what_was_written(value, fix):
    with pytest.raises(ConfigError) as refused:
        ModelConfig(family="decoder", d_model=value)
    assert str(refused.value).endswith(fix), str(refused.value)
