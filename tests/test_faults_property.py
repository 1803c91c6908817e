"""Random configs and command lines through the validation layer: each ends in a config, parsed settings, or a
clear error (ConfigError, InputError, CheckpointError; a usage error, exit 2), never another exception."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnkit import cli
from attnkit.config import ModelConfig, model_field_names
from attnkit.errors import AttnkitError

VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-10**12, max_value=10**12),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.lists(st.integers(min_value=-3, max_value=64), max_size=3), st.dictionaries(st.text(max_size=3), st.none(),
                                                                                   max_size=2),
)
FIELDS = sorted(model_field_names()) + ["family", "no_such_field"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=6),
       st.sampled_from(["decoder", "encoder", "encoder-decoder", "recurrent-lm", "recurrent-seq2seq", None]))
def test_random_configs_give_a_config_or_a_clear_error(fields, family):
    if family is not None:
        fields = {**fields, "family": family}
    try:
        config = ModelConfig.from_dict(fields)
    except AttnkitError:
        return
    assert ModelConfig.from_json(config.to_json()) == config  # what was accepted writes and reads back


COMMANDS = [["train"], ["generate", "runs/none"], ["translate", "runs/none"], ["classify", "runs/none"],
            ["eval", "runs/none"], ["average", "runs/none"], ["tokenizer", "train"], ["presets"], ["experiment"]]
FLAGS = ["--max-steps", "--batch-size", "--lr", "--set", "--beam-size", "--length-penalty", "--max-length",
         "--max-new-tokens", "--temperature", "--top-k", "--top-p", "--last", "--vocab-size", "--max-prompt-bytes",
         "--out", "--data", "--prompt", "--text", "--window", "--stride", "--dtype", "--device", "--config",
         "--recipe", "--overwrite", "--resume", "--verify"]
WORDS = st.one_of(st.sampled_from(FLAGS), st.sampled_from(["0", "-1", "nan", "inf", "1e308", "x=1", "d_model=-4",
                                                           "lr=[[1]]", "", "-", "{{DATA}}", "$x$"]),
                  st.text(max_size=8))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(COMMANDS), st.lists(WORDS, max_size=6))
def test_random_command_lines_parse_to_settings_or_a_clear_error(command, words):
    argv = [*command, *words]
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            cli.invocation(cli.build_parser(argv).parse_args(argv))
        except SystemExit as stop:  # a usage error, printed by argparse
            assert stop.code in (0, 2), (argv, stop.code)
        except AttnkitError:
            pass


@pytest.mark.parametrize("text", ["[]", "5", "null", '"x"', '{"family": 5}', '{"n_layers": [[2]]}'])
def test_config_json_that_is_no_object_of_fields_is_a_clear_error(text):
    with pytest.raises(AttnkitError):
        ModelConfig.from_json(text if text.lstrip().startswith("{") else json.dumps({"family": json.loads(text)}))
