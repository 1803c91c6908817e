"""Exports carry the chat format `attnkit serve` chats in: attnkit's own Jinja template renders what the server's
Python renders (tools, calls with and without text, tool turns), with and without trim_blocks; `--to-hf` writes it
into tokenizer_config.json, where transformers' `apply_chat_template` gives the server's prompt (a run's own template
too); and a chat template that cannot be read or rendered is refused before anything is written."""

from __future__ import annotations

import json

import pytest
from export_runs import ENCODERS, LAYOUTS, random_run, tokenizer

from attnkit.chat_format import DEFAULT_CHAT_TEMPLATE, DEFAULT_FORMAT, STOP_STRINGS
from attnkit.errors import InputError
from attnkit.serve.chat import ChatTemplate, chat_template

jinja2 = pytest.importorskip("jinja2", reason="chat templates are Jinja")

WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Wetter in einer Stadt, z. B. Zürich",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                           "required": ["city"]}}}
CLOCK = {"type": "function", "function": {"name": "now", "parameters": {"type": "object", "properties": {}}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Zürich"}}}
CONVERSATIONS = [  # (messages, tools)
    ([], []),
    ([{"role": "user", "content": "Hello!"}], []),
    ([{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi {{ there }}\n  you"},
      {"role": "assistant", "content": "Hi."}, {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": "Who are you?"}], []),
    ([{"role": "user", "content": "Weather in Zürich?"}], [WEATHER, CLOCK]),
    ([{"role": "system", "content": "Use tools."}, {"role": "user", "content": "Weather in Zürich?"},
      {"role": "assistant", "content": None, "tool_calls": [CALL]},
      {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}], [WEATHER]),
    ([{"role": "user", "content": "Both?"},
      {"role": "assistant", "content": "Checking.", "tool_calls": [CALL, {**CALL, "function": {
          "name": "now", "arguments": "not json"}}]},
      {"role": "tool", "content": "18 C"}, {"role": "tool", "content": "noon"}], [WEATHER, CLOCK]),
    ([{"role": "assistant", "content": "", "tool_calls": [CALL]}], []),
]


def transformers_tojson(value, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """`tojson` as transformers defines it for chat templates (json.dumps, keys in order, non-ASCII kept)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@pytest.mark.parametrize("trim", [True, False])  # transformers renders with trim_blocks and lstrip_blocks, llama.cpp
def test_attnkits_template_renders_what_the_server_renders(trim):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    environment = ImmutableSandboxedEnvironment(trim_blocks=trim, lstrip_blocks=trim)
    environment.filters["tojson"] = transformers_tojson
    template = environment.from_string(DEFAULT_CHAT_TEMPLATE)
    for messages, tools in CONVERSATIONS:
        for prompt in (True, False):  # a reply's prompt, and the conversation alone (as /tokenize can ask)
            for eos in ("", "<eos>"):  # the server's text has none: EOS after a reply is a token (`chat_ids`)
                served = ChatTemplate(eos_token=eos).render([{**m, "content": m["content"] or ""} for m in messages],
                                                            tools, add_generation_prompt=prompt)
                assert template.render(messages=messages, tools=tools or None, add_generation_prompt=prompt,
                                       eos_token=eos) == served
            assert "None" not in served and "tool:" not in served
    with_tools = ChatTemplate().render(CONVERSATIONS[4][0], CONVERSATIONS[4][1])
    assert with_tools.startswith("System: Tools you may call") and "\nTool: 18 C, sunny\nAssistant:" in with_tools
    assert STOP_STRINGS == ChatTemplate().stops


def test_to_hf_carries_the_servers_chat_format_for_apply_chat_template(tmp_path):
    transformers = pytest.importorskip("transformers", reason="reads the directory as users do")
    from attnkit.interop.hf import convert_to_hf

    run = random_run(tmp_path, LAYOUTS["default"])
    convert_to_hf(run, tmp_path / "hf")
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    ours = ChatTemplate(eos_token=theirs.eos_token)  # EOS after each reply, as chat fine-tuning learns it
    for messages, tools in CONVERSATIONS[1:]:  # transformers refuses an empty conversation
        rendered = theirs.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=True)
        assert rendered == ours.render([{**m, "content": m["content"] or ""} for m in messages], tools)
    messages = CONVERSATIONS[2][0]
    ids = theirs.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    assert ids == DEFAULT_FORMAT.chat_ids(tokenizer(), messages)  # what attnkit serve feeds the model
    assert ids.count(tokenizer().eos_id) == 1  # after the earlier reply

    own = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}{{ eos_token }}{% endfor %}<|assistant|>"
    config = json.loads((run / "tokenizer" / "tokenizer_config.json").read_text()) if (
        run / "tokenizer" / "tokenizer_config.json").is_file() else {}
    (run / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": own}))
    convert_to_hf(run, tmp_path / "hf", overwrite=True)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    messages = CONVERSATIONS[2][0]
    served = chat_template(run / "tokenizer", tokenizer().specials)
    assert served.source == own
    assert theirs.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == served.render(messages)


def test_to_hf_of_an_encoder_carries_no_chat_template(tmp_path):
    from attnkit.interop.hf import convert_to_hf

    run = random_run(tmp_path, {**LAYOUTS["default"], **ENCODERS["classify"], "position": "learned", "norm": "layer",
                                "activation": "gelu", "bias": True}, name="encoder")
    convert_to_hf(run, tmp_path / "hf")
    assert "chat_template" not in json.loads((tmp_path / "hf" / "tokenizer_config.json").read_text())


def test_a_chat_template_that_cannot_be_read_or_rendered_is_refused_before_writing(tmp_path):
    pytest.importorskip("gguf", reason="GGUF export needs the gguf package (pip install 'attnkit[export]')")
    from attnkit.interop.gguf import convert_to_gguf

    run = random_run(tmp_path, LAYOUTS["default"])
    out = tmp_path / "model.gguf"
    binary = tmp_path / "model.bin"
    binary.write_bytes(bytes(range(256)) * 4)
    with pytest.raises(InputError, match="is not a text file"):
        convert_to_gguf(run, out, type="f32", chat_template=binary)
    broken = tmp_path / "broken.jinja"
    broken.write_text("{% for m in messages %}{{ m['content'] }")
    with pytest.raises(InputError, match=r"broken.jinja is not a valid Jinja template \(TemplateSyntaxError at line 1"):
        convert_to_gguf(run, out, type="f32", chat_template=broken)
    failing = tmp_path / "failing.jinja"
    failing.write_text("{{ messages[0]['content'].nothing() }}")
    with pytest.raises(InputError, match="failing.jinja fails on a sample conversation"):
        convert_to_gguf(run, out, type="f32", chat_template=failing)
    refusing = tmp_path / "refusing.jinja"  # refuses system turns on purpose, as some models' templates do
    refusing.write_text("{% if messages[0]['role'] == 'system' %}{{ raise_exception('no system turns') }}{% endif %}"
                        "{% for m in messages %}{{ m['content'] }}{% endfor %}")
    convert_to_gguf(run, out, type="f32", chat_template=refusing)
    out.unlink()
    config = run / "tokenizer" / "tokenizer_config.json"
    config.write_text("{\"chat_template\": ")
    with pytest.raises(InputError, match="tokenizer_config.json is not JSON"):
        convert_to_gguf(run, out, type="f32")
    config.write_text(json.dumps({"chat_template": "{% if %}"}))
    with pytest.raises(InputError, match="the chat template of .*tokenizer_config.json is not a valid Jinja"):
        convert_to_gguf(run, out, type="f32")
    assert not out.exists()


def test_a_model_converted_from_hugging_face_keeps_its_chat_template_for_serve_and_the_way_back(tmp_path):
    transformers = pytest.importorskip("transformers", reason="reads the directories as users do")
    from interop_models import hf_model, word_tokenizer

    from attnkit.interop.hf import convert_from_hf, convert_to_hf

    own = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}<s>assistant:"
    source = tmp_path / "source"
    hf_model("gpt2", source)
    word_tokenizer(source)
    settings = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(json.dumps({**settings, "chat_template": own}))
    convert_from_hf(source, tmp_path / "run")
    messages = CONVERSATIONS[2][0]
    expected = transformers.AutoTokenizer.from_pretrained(source).apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True)
    assert chat_template(tmp_path / "run" / "tokenizer", {}).render(messages) == expected  # serve chats in it
    convert_to_hf(tmp_path / "run", tmp_path / "back")
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "back").apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True) == expected

    convert_from_hf(tmp_path / "back", tmp_path / "again")  # the way round again: the same template and no stops
    assert chat_template(tmp_path / "again" / "tokenizer", {}).source == own

    convert_to_hf(random_run(tmp_path, LAYOUTS["default"], name="fresh"), tmp_path / "attnkits")  # attnkit's format
    convert_from_hf(tmp_path / "attnkits", tmp_path / "attnkits-run")  # and back: still attnkit's, with its stops
    served = chat_template(tmp_path / "attnkits-run" / "tokenizer", {})
    assert served.source is None and served.stops == STOP_STRINGS

    settings["chat_template"] = "{% for %}"
    (source / "tokenizer_config.json").write_text(json.dumps(settings))
    with pytest.raises(InputError, match="the chat template of .*source/tokenizer_config.json is not a valid Jinja"):
        convert_from_hf(source, tmp_path / "broken")
    assert not (tmp_path / "broken").exists()
