"""Every user-facing list of supported Hugging Face architectures names exactly the registered ones: the messages,
`attnkit convert --help`, and the docs' generated table. A family added to the registry appears in each of them."""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from attnkit import ConfigError, build_model, presets
from attnkit.cli import main
from attnkit.interop import hf_config, keymaps
from attnkit.tasks import HFClass, register, task_spec, unregister

ROOT = Path(__file__).resolve().parents[1]
# A Hugging Face model class as transformers names them: GPT2LMHeadModel, BertForMaskedLM, MarianMTModel, ...
# (not the AutoModel loaders)
CLASS = re.compile(r"\b(?!Auto)[A-Z][A-Za-z0-9]*(?:Model|For[A-Z][A-Za-z]*)\b")
HAND_LIST = re.compile(r"(GPT-2|Llama|Mistral|BERT|Marian)(, (GPT-2|Llama|Mistral|BERT|Marian)){2,}")


def _registered() -> set[str]:
    return {a for family in keymaps.FAMILIES.values() for a in family.architectures}


def _classes(text: str) -> set[str]:
    return set(CLASS.findall(text))


def _unknown_type_message() -> str:
    with pytest.raises(ConfigError) as err:
        hf_config.family_of({"model_type": "t5"}, "config.json")
    return str(err.value)


def _unwritable_message() -> str:
    config = presets.get("gpt2-tiny", position="alibi")
    with pytest.raises(ConfigError) as err:
        hf_config.match_family(config, lambda family: None)
    return str(err.value)


def _docs_table() -> str:
    """What the docs hook writes for `<!-- generated: hf_architectures -->`."""
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks" / "generated.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    page = SimpleNamespace(file=SimpleNamespace(src_uri="guides/huggingface.md"))
    return hooks.on_page_markdown("<!-- generated: hf_architectures -->\n", page, SimpleNamespace(docs_dir="docs"),
                                  None)


def test_the_registry_holds_each_class_once_and_mistral():
    names = keymaps.architecture_names()
    assert len(names) == len(set(names)) and set(names) == _registered()
    assert {"MistralForCausalLM", "LlamaForCausalLM", "GPT2LMHeadModel", "MarianMTModel"} <= set(names)


def test_every_list_names_exactly_the_registered_architectures(capsys):
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    lists = {
        "supported_text": keymaps.supported_text(),
        "convert --help": capsys.readouterr().out,
        "unknown model_type": _unknown_type_message(),
        "no layout holds the model": _unwritable_message(),
        "docs table": _docs_table(),
    }
    for where, text in lists.items():
        assert _classes(text) == _registered(), where
        for family in keymaps.FAMILIES.values():
            assert family.model_type in text or family.name in text, (where, family.model_type)


def test_a_registered_family_and_a_tasks_class_appear_in_every_generated_list(monkeypatch):
    """A family brings its bare class; a task's registration brings the classes with its head (`HFClass`)."""
    extra = dataclasses.replace(keymaps.GPT2, model_type="fake2", name="Fake-2", own_architectures={"Fake2Model": {}},
                                default_architecture="Fake2Model")
    monkeypatch.setitem(keymaps.FAMILIES, "fake2", extra)
    task = register(dataclasses.replace(task_spec("tag"), name="fake-tag", command=None,
                                        hf_architectures=(HFClass("Fake2ForTokenClassification", "fake2"),)))
    try:
        assert extra.architectures["Fake2ForTokenClassification"] == task.head_of("decoder")
        for text in (keymaps.supported_text(), keymaps.supported_lines(), keymaps.supported_table(), _docs_table(),
                     _unwritable_message()):
            assert {"Fake2ForTokenClassification", "Fake2Model"} <= _classes(text)
            assert _classes(text) == _registered()
    finally:
        unregister(task.name)


def test_docs_pages_use_the_generated_table_and_hold_no_hand_written_list():
    for page in ("docs/guides/huggingface.md", "docs/user-guide/hugging-face.md"):
        text = (ROOT / page).read_text()
        assert "<!-- generated: hf_architectures -->" in text, page
        assert not HAND_LIST.search(text), page
    for path in ("README.md", "src/attnkit/cli.py"):
        assert not HAND_LIST.search((ROOT / path).read_text()), path
    for module in ("hf.py", "hf_config.py", "hf_weights.py", "keymaps.py"):  # the Hugging Face way in and out
        assert not HAND_LIST.search((ROOT / "src" / "attnkit" / "interop" / module).read_text()), module


def test_writing_prefers_the_class_a_model_came_from():
    """A Mistral without a window is also a Llama: written as whichever the converted run came from."""
    config = presets.get("llama2-tiny", bias=False)
    state = build_model(config).state_dict()

    def names(family):
        from attnkit.interop.hf_weights import hf_tensor_names

        return hf_tensor_names(state, family, config)

    assert hf_config.match_family(config, names)[1] == "LlamaForCausalLM"
    assert hf_config.match_family(config, names, prefer="MistralForCausalLM")[1] == "MistralForCausalLM"
    windowed = dataclasses.replace(config, attention_window=8)
    assert hf_config.match_family(windowed, names, prefer="LlamaForCausalLM")[1] == "MistralForCausalLM"


@pytest.mark.parametrize(("changes", "names"), [
    ({"sliding_window": "4096"}, ["attention_window='4096'", "integer"]),
    ({"max_position_embeddings": None}, ["max_seq_len=None", "integer"]),
])
def test_a_mistral_window_or_context_of_the_wrong_type_is_a_config_error_naming_it(changes, names):
    """The window is compared with the context only when both are integers: a string or null in config.json is the
    ConfigError naming the field that a ModelConfig gives, never a TypeError."""
    hf = {"model_type": "mistral", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
          "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128,
          "sliding_window": 8, **changes}
    family = keymaps.FAMILIES["mistral"]
    with pytest.raises(ConfigError) as info:
        hf_config.config_from_hf(hf, family, "MistralForCausalLM", tensor_names=(), source="config.json")
    for name in names:
        assert name in str(info.value)
