"""Structured output in the server: the batching scheduler masks each constrained request's rows beside free ones in
one step (each gets what it gets alone), and the HTTP API's response_format and tools give text that parses and
validates, streamed and not, with tool calls in OpenAI's shape; vLLM's guided_regex, guided_grammar, guided_json and
guided_choice, on both endpoints, give text the expression matches, the grammar parses, the schema validates or
one of the choices is."""

from __future__ import annotations

import json
import re

import pytest
import torch

pytest.importorskip("llguidance", reason="structured output needs the structured extra: pip install "
                    "'attnkit[structured]'")
jsonschema = pytest.importorskip("jsonschema")

from generate_models import tiny_model  # noqa: E402
from test_generate_constrained import BOUND_TOKENS, BOUNDED, JSON_CHARS, SMALL  # noqa: E402
from test_serve_batching import Recorded, drain  # noqa: E402

from attnkit.generate import GREEDY, SamplingConfig, generate_tokens, make_generator  # noqa: E402
from attnkit.generate.constrained import Grammar, GrammarMask, Matcher  # noqa: E402
from attnkit.generate.sampling import choice_seed  # noqa: E402
from attnkit.serve.batching import Scheduler  # noqa: E402
from attnkit.serve.structured import Structured  # noqa: E402
from attnkit.tokenize import CharTokenizer  # noqa: E402

TOKENIZER = CharTokenizer(JSON_CHARS)
CONTEXT = 96


def test_constrained_and_free_requests_share_steps_and_each_gets_its_own():
    model = tiny_model(vocab_size=TOKENIZER.vocab_size, max_seq_len=CONTEXT, **SMALL)[0]
    eos = frozenset({TOKENIZER.eos_id})
    requests = [  # (prompt, sampling, n, schema or None)
        ("a", GREEDY, 1, None),
        ("person:", SamplingConfig(temperature=1.0), 2, BOUNDED),
        ("b", SamplingConfig(temperature=0.8), 1, None),
        ("x", GREEDY, 1, {"type": "array", "items": {"enum": ["yes", "no"]}, "minItems": 1, "maxItems": 3}),
    ]
    scheduler = Scheduler(model, context_len=CONTEXT, pad_id=TOKENIZER.pad_id, max_rows=8)
    recorded = []
    for seed, (prompt, sampling, n, schema) in enumerate(requests):
        job = Recorded(TOKENIZER.encode(prompt), BOUND_TOKENS, sampling=sampling, seed=seed, n=n, stop_ids=eos)
        job.job.grammar = GrammarMask.of(Grammar.json_schema(schema), TOKENIZER, n) if schema else None
        scheduler.submit(job.job)
        recorded.append(job)
    drain(scheduler)
    assert scheduler.steps < sum(len(t) for job in recorded for t in job.tokens)  # the requests shared steps
    for job, (_, sampling, n, schema) in zip(recorded, requests, strict=True):
        grammar = GrammarMask.of(Grammar.json_schema(schema), TOKENIZER, n) if schema else None
        alone = generate_tokens(model, [job.job.prompt] * n, max_new_tokens=BOUND_TOKENS, context_len=CONTEXT,
                                sampling=sampling, generator=[make_generator(choice_seed(job.job.seed, i), "cpu")
                                                              for i in range(n)], stop_ids=eos,
                                grammar=grammar)
        assert job.tokens == alone
        if schema is not None:
            assert job.reasons == ["stop"] * n
            for tokens in job.tokens:
                jsonschema.validate(json.loads(TOKENIZER.decode(tokens)), schema)


def test_a_request_whose_grammar_gets_stuck_fails_alone():
    no_z = CharTokenizer('{}"abc')
    model = tiny_model(vocab_size=no_z.vocab_size, max_seq_len=CONTEXT, **SMALL)[0]
    scheduler = Scheduler(model, context_len=CONTEXT, pad_id=no_z.pad_id, max_rows=4)
    stuck = Recorded(no_z.encode("a"), 8, seed=1)
    stuck.job.grammar = GrammarMask.of(Grammar.json_schema({"enum": ["zz"]}), no_z, 1)
    free = Recorded(no_z.encode("b"), 8, seed=2)
    for job in (stuck, free):
        scheduler.submit(job.job)
    with torch.inference_mode():
        drain(scheduler)
    assert stuck.reasons == ["error"] and "cannot go on" in str(stuck.job.failure)
    assert free.reasons == ["length"] and len(free.tokens[0]) == 8


def test_a_requests_choices_copy_one_matcher_whose_first_mask_was_computed_as_the_request_was_read(monkeypatch):
    """Each of a request's n choices built its own matcher, and each but the first computed its first mask on the
    scheduler's thread, where every running request waits for it (a regular expression such as `a{100000}` takes a
    second there): the request's grammar is built once, its first mask computed off that thread (`Structured.mask`
    runs as the request is read) and the matcher copied for each choice, each moving on apart."""
    built = []
    build = Matcher.__init__
    monkeypatch.setattr(Matcher, "__init__", lambda self, *args: built.append(args) or build(self, *args))
    grammar = Grammar.regex("(ab|ba){1,3}")
    mask = Structured(grammar, param="guided_regex").mask(TOKENIZER, 4)
    assert len(built) == 1 and len(mask) == 4
    a, b = TOKENIZER.encode("ab")
    assert not mask.advance(0, a) and not mask.advance(1, b)
    allowed = mask.allowed(TOKENIZER.vocab_size)  # (4, V)
    assert allowed[0].nonzero().flatten().tolist() == [b] and allowed[1].nonzero().flatten().tolist() == [a]
    start = GrammarMask.of(grammar, TOKENIZER, 1).allowed(TOKENIZER.vocab_size)[0]  # a matcher of its own
    assert start.nonzero().flatten().tolist() == sorted([a, b])
    assert torch.equal(allowed[2], start) and torch.equal(allowed[3], start)  # the others moved on apart


# Over HTTP, with the official client ---------------------------------------------------------------------------------
openai = pytest.importorskip("openai", reason="the openai client is in the dev extras")
pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")

from serve_helpers import running_server  # noqa: E402

WEATHER = {"type": "object", "properties": {"city": {"enum": ["paris", "oslo"]}, "days": {"type": "integer",
           "minimum": 1, "maximum": 7}}, "required": ["city", "days"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the forecast",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {},
                                                                               "additionalProperties": False}}}]
CALL_TOKENS = 100  # more characters than any call of TOOLS, its <tool_call> marker included
ENDLESS = {"type": "object", "properties": {"next": {"$ref": "#"}}, "required": ["next"]}  # no finite value
TREE = {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#"}, "maxItems": 2}},
        "required": ["kids"], "additionalProperties": False}  # recursive, and ends where a list is empty


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A random tiny decoder whose char tokenizer writes JSON and tool calls, served; the official client on it."""
    from attnkit import build_model
    from attnkit.checkpoint import save_model
    from attnkit.config import ModelConfig

    tokenizer = CharTokenizer(JSON_CHARS + "<>_")
    torch.manual_seed(0)
    config = ModelConfig(family="decoder", vocab_size=tokenizer.vocab_size, max_seq_len=1024, **SMALL)
    directory = tmp_path_factory.mktemp("structured-run")
    save_model(build_model(config).eval(), config, directory)
    tokenizer.save(directory / "tokenizer")
    with running_server(directory, max_batch=16) as (url, app):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="unused", timeout=60, max_retries=0), url, directory


def ask(client, **fields):
    fields = {"max_tokens": BOUND_TOKENS, **fields}
    return client.chat.completions.create(model=None, messages=[{"role": "user", "content": "hello"}], **fields)


def schema_format(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "record", "schema": schema, "strict": True}}


def test_response_format_json_schema_validates_whole_and_streamed(served):
    client = served[0]
    answer = ask(client, response_format=schema_format(BOUNDED), n=3, seed=1)
    for choice in answer.choices:
        jsonschema.validate(json.loads(choice.message.content), BOUNDED)
        assert choice.finish_reason == "stop"
    texts: dict[int, str] = {}
    for chunk in ask(client, response_format=schema_format(BOUNDED), n=2, seed=2, stream=True):
        for choice in chunk.choices:
            texts[choice.index] = texts.get(choice.index, "") + (choice.delta.content or "")
    assert len(texts) == 2
    for text in texts.values():
        jsonschema.validate(json.loads(text), BOUNDED)


def test_response_format_json_object_is_an_object(served):
    answer = ask(served[0], response_format={"type": "json_object"}, temperature=0.7, seed=3, max_tokens=200)
    text = answer.choices[0].message.content
    assert text.startswith("{")
    if answer.choices[0].finish_reason == "stop":  # else max_tokens cut a long object short, as OpenAI's would
        assert isinstance(json.loads(text), dict)


def test_a_required_tool_call_comes_in_openais_shape(served):
    client = served[0]
    answer = ask(client, tools=TOOLS, tool_choice="required", n=2, seed=4, max_tokens=CALL_TOKENS)
    for choice in answer.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.content is None
        (call,) = choice.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        arguments = json.loads(call.function.arguments)
        if call.function.name == "get_weather":
            jsonschema.validate(arguments, WEATHER)
        else:
            assert call.function.name == "get_time" and arguments == {}
    weather = {"type": "function", "function": {"name": "get_weather"}}
    named = ask(client, tools=TOOLS, tool_choice=weather, seed=5, max_tokens=CALL_TOKENS)
    call = named.choices[0].message.tool_calls[0]
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER)
    streamed = list(ask(client, tools=TOOLS, tool_choice=weather, seed=5, max_tokens=CALL_TOKENS, stream=True))
    calls = [c.delta.tool_calls for chunk in streamed for c in chunk.choices if c.delta.tool_calls]
    assert len(calls) == 1 and calls[0][0].index == 0
    assert calls[0][0].function.arguments == call.function.arguments  # the same seed: the same call
    assert streamed[-1].choices[0].finish_reason == "tool_calls"


def test_auto_tool_choice_answers_text_or_a_valid_call_and_takes_the_tools_answer_back(served):
    client = served[0]
    kinds = set()
    for seed in range(4):
        choice = ask(client, tools=TOOLS, seed=seed, temperature=1.0, max_tokens=CALL_TOKENS).choices[0]
        if choice.message.tool_calls:
            kinds.add("call")
            assert choice.finish_reason == "tool_calls"
            (call,) = choice.message.tool_calls
            assert call.function.name in ("get_weather", "get_time")
            json.loads(call.function.arguments)
        else:
            kinds.add("text")
            assert not choice.message.content.startswith("<")
    assert kinds
    turns = [{"role": "user", "content": "weather?"},
             {"role": "assistant", "content": None, "tool_calls": [{"id": "call_1", "type": "function", "function": {
                 "name": "get_weather", "arguments": '{"city": "oslo", "days": 2}'}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "rain"}]
    answer = client.chat.completions.create(model=None, messages=turns, tools=TOOLS, tool_choice="none",
                                            max_tokens=5, seed=0)
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.choices[0].message.tool_calls is None


def test_constrained_and_free_http_requests_together_each_get_what_they_asked(served):
    import attnkit

    client, _, run = served
    lm = attnkit.load(run, device="cpu")
    free_prompt = "User: hello\nAssistant:"
    asks = [dict(response_format=schema_format(BOUNDED), seed=s) for s in range(3)]
    asks += [dict(tools=TOOLS, tool_choice="required", seed=s, max_tokens=CALL_TOKENS) for s in range(3)]
    asks += [dict(seed=s, temperature=0.9) for s in range(3)]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(asks)) as pool:
        answers = list(pool.map(lambda fields: ask(client, **fields).choices[0], asks))
    for fields, choice in zip(asks, answers, strict=True):
        if "response_format" in fields:
            jsonschema.validate(json.loads(choice.message.content), BOUNDED)
        elif "tools" in fields:
            assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        else:
            alone = lm.generate(free_prompt, max_new_tokens=BOUND_TOKENS, temperature=0.9, seed=fields["seed"],
                                stop=["\nUser:", "\nSystem:"])[0]
            assert choice.message.content == alone


@pytest.mark.parametrize(("fields", "param", "words"), [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}, "tools": TOOLS}, "tool_choice", "'nope'"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": TOOLS + TOOLS[:1]}, "tools", "share a name"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "needs its json_schema"),
    ({"response_format": schema_format({"type": "bogus"})}, "response_format", "cannot be followed"),
    ({"response_format": schema_format({"$ref": "#"})}, "response_format", "$ref cycle with nothing else to end it (#"),
    ({"response_format": schema_format({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                        "$ref": "#/$defs/a"})},
     "response_format", "#/$defs/a -> #/$defs/b -> #/$defs/a"),
    ({"response_format": schema_format(ENDLESS)}, "response_format", "requires itself forever (# -> #/properties/next"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": ENDLESS}}], "tool_choice": "required"},
     "tools", "requires itself forever"),
    ({"response_format": schema_format({"type": "object", "properties": {"x": {"enum": []}}, "required": ["x"]})},
     "response_format", "#/properties/x allows no value"),
    ({"response_format": {"type": "json_object", "json_schema": {"name": "r", "schema": BOUNDED}}}, "response_format",
     '"type": "json_object", which does not read it'),
    ({"response_format": {"type": "text", "json_schema": {"name": "r", "schema": BOUNDED}}}, "response_format",
     '"type": "text"'),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}],
      "tool_choice": "required"}, "tools", 'tools[0].function.parameters is a schema of type "string"'),
    ({"tools": [{"type": "function", "function": {"name": "f"}},
                {"type": "function", "function": {"name": "g", "parameters": {"type": "array"}}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tools", 'tools[1].function.parameters is a schema of type "array"'),  # its place in tools, not among the chosen
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]},
     "messages", "messages[1] is a tool message, but no assistant message with tool_calls comes before it"),
    ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}, {"role": "tool", "tool_call_id": "c2",
                                                                      "content": "rain"}]},
     "messages", "messages[3].tool_call_id is 'c2', which names none of the calls of the assistant message before it"),
])
def test_bad_structured_requests_are_refused_naming_the_field(served, fields, param, words):
    import httpx

    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, **fields}
    answer = httpx.post(f"{served[1]}/v1/chat/completions", json=body, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"]


def test_chat_templates_show_the_tools_and_earlier_calls():
    from attnkit.serve.chat import ChatTemplate
    from attnkit.serve.schemas import Message

    turns = [{"role": "user", "content": "weather?"},
             {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {
                 "name": "get_weather", "arguments": '{"city": "oslo", "days": 2}'}}]},
             {"role": "tool", "tool_call_id": "call_1", "content": "rain"}]
    messages = [Message.model_validate(turn).rendered() for turn in turns]
    lines = ChatTemplate().render(messages, TOOLS).splitlines()
    assert lines[0].startswith("System: Tools you may call, replying <tool_call>") and '"get_time"' in lines[0]
    call = '<tool_call>{"name": "get_weather", "arguments": {"city": "oslo", "days": 2}}'
    assert lines[1:] == ["User: weather?", f"Assistant: {call}", "Tool: rain", "Assistant:"]
    source = "{% for t in tools %}{{ t.function.name }};{% endfor %}{% for m in messages %}{{ m.role }}|{% endfor %}"
    assert ChatTemplate(source).render(messages, TOOLS) == "get_weather;get_time;user|assistant|tool|"
    assert "Tools" not in ChatTemplate().render(messages)


def test_the_clients_own_replies_go_back_as_history(served):
    """`messages.append(resp.choices[0].message.model_dump())`: OpenAI's response fields (refusal, annotations, audio,
    function_call) come back at null, and the server takes them, after a call and after text alike."""
    client = served[0]
    messages = [{"role": "user", "content": "weather?"}]
    called = client.chat.completions.create(model=None, messages=messages, tools=TOOLS, tool_choice="required",
                                            seed=1, max_tokens=CALL_TOKENS).choices[0].message
    messages.append(called.model_dump())
    assert {"refusal", "annotations", "audio", "function_call"} <= messages[-1].keys()
    messages.append({"role": "tool", "tool_call_id": called.tool_calls[0].id, "content": "rain"})
    replied = client.chat.completions.create(model=None, messages=messages, max_tokens=5, seed=0).choices[0].message
    messages += [replied.model_dump(), {"role": "user", "content": "and tomorrow?"}]
    again = client.chat.completions.create(model=None, messages=messages, max_tokens=5, seed=0)
    assert again.choices[0].message.role == "assistant"
    asked = {**replied.model_dump(), "refusal": "I won't"}  # a value that asks for something is still refused
    with pytest.raises(openai.BadRequestError, match="refusal"):
        client.chat.completions.create(model=None, messages=[messages[0], asked], max_tokens=2)


def test_a_tool_call_cut_by_max_tokens_leaks_no_markers(served):
    """As OpenAI answers a call that max_tokens cuts short: finish_reason "length", no <tool_call> in the content, and
    the call with its arguments so far once its name is whole, whole and streamed."""
    client = served[0]
    weather = {"type": "function", "function": {"name": "get_weather"}}
    named = len('<tool_call>{"name": "get_weather", "arguments": {"city')  # the name whole, the arguments begun
    for limit in (named - 30, named):
        choice = ask(client, tools=TOOLS, tool_choice=weather, seed=4, max_tokens=limit).choices[0]
        assert choice.finish_reason == "length" and not choice.message.content
        if limit == named:
            (call,) = choice.message.tool_calls
            assert call.function.name == "get_weather" and call.function.arguments == '{"city'
        else:
            assert choice.message.tool_calls is None
        streamed = list(ask(client, tools=TOOLS, tool_choice=weather, seed=4, max_tokens=limit, stream=True))
        content = "".join(c.delta.content or "" for chunk in streamed for c in chunk.choices)
        calls = [call for chunk in streamed for c in chunk.choices for call in c.delta.tool_calls or []]
        assert not content and streamed[-1].choices[0].finish_reason == "length"
        assert [call.function.name for call in calls] == (["get_weather"] if limit == named else [])


def test_a_recursive_schema_that_can_end_is_served(served):
    answer = ask(served[0], response_format=schema_format(TREE), seed=0, temperature=0.5, max_tokens=200)
    choice = answer.choices[0]
    assert choice.message.content.startswith('{"kids": [')
    if choice.finish_reason == "stop":  # else max_tokens cut a deep tree short, as OpenAI's would
        jsonschema.validate(json.loads(choice.message.content), TREE)


PAIR = 'start: "[" NUM ", " NUM "]"\nNUM: /[0-9]{1,2}/\n'  # a list of two numbers under 100, as JSON writes it


def test_guided_regex_holds_completions_and_chat_replies_at_temperature_1(served):
    """vLLM's guided_regex, sent as its clients send it (extra_body): every sampled reply matches it whole."""
    client = served[0]
    pattern = "(cat|dog)-[0-9]{2,3}"
    completed = client.completions.create(model=None, prompt="pet:", max_tokens=20, temperature=1.0, seed=7, n=3,
                                          extra_body={"guided_regex": pattern})
    chatted = ask(client, max_tokens=20, temperature=1.0, seed=7, n=3, extra_body={"guided_regex": pattern})
    texts = [c.text for c in completed.choices] + [c.message.content for c in chatted.choices]
    for text in texts:
        assert re.fullmatch(pattern, text), text
    assert len(set(texts)) > 1  # sampled, not one text forced
    assert {c.finish_reason for c in [*completed.choices, *chatted.choices]} == {"stop"}


def test_guided_grammar_replies_parse_by_the_lark_grammar(served):
    client = served[0]
    completed = client.completions.create(model=None, prompt="pair:", max_tokens=20, temperature=1.0, seed=2, n=2,
                                          extra_body={"guided_grammar": PAIR})
    chatted = ask(client, max_tokens=20, temperature=1.0, seed=2, extra_body={"guided_grammar": PAIR})
    for text in [c.text for c in completed.choices] + [chatted.choices[0].message.content]:
        assert re.fullmatch(r"\[[0-9]{1,2}, [0-9]{1,2}\]", text), text
        pair = json.loads(text)
        assert len(pair) == 2 and all(0 <= number < 100 for number in pair)


@pytest.mark.parametrize(("endpoint", "fields", "param", "words"), [
    ("completions", {"guided_regex": "(ab"}, "guided_regex", "unclosed group"),
    ("chat/completions", {"guided_regex": "(ab"}, "guided_regex", "unclosed group"),
    ("completions", {"guided_grammar": "start: foo"}, "guided_grammar", 'unknown name: "foo"'),
    ("chat/completions", {"guided_grammar": "start: foo"}, "guided_grammar", 'unknown name: "foo"'),
    ("completions", {"guided_regex": "a", "guided_grammar": PAIR}, "guided_regex",
     "guided_regex and guided_grammar each constrain"),
    ("chat/completions", {"guided_regex": "a", "response_format": {"type": "json_object"}}, "guided_regex",
     "guided_regex and response_format each constrain"),
    ("chat/completions", {"guided_grammar": PAIR, "tools": TOOLS}, "guided_grammar",
     "guided_grammar and tools each constrain"),
    ("completions", {"guided_json": "{not json"}, "guided_json", "the JSON schema is not JSON"),
    ("chat/completions", {"guided_json": {"$ref": "#"}}, "guided_json", "guided_json: the schema has a $ref cycle"),
    ("completions", {"guided_choice": []}, "guided_choice", "guided_choice"),
    ("completions", {"guided_json": BOUNDED, "guided_choice": ["a"]}, "guided_json",
     "guided_json and guided_choice each constrain"),
    ("chat/completions", {"guided_choice": ["a"], "tools": TOOLS}, "guided_choice",
     "guided_choice and tools each constrain"),
    ("chat/completions", {"guided_json": BOUNDED, "response_format": {"type": "json_object"}}, "guided_json",
     "guided_json and response_format each constrain"),
])
def test_bad_or_double_guided_fields_are_refused_naming_them(served, endpoint, fields, param, words):
    import httpx

    asked = {"prompt": "hi"} if endpoint == "completions" else {"messages": [{"role": "user", "content": "hi"}]}
    answer = httpx.post(f"{served[1]}/v1/{endpoint}", json={**asked, "max_tokens": 4, **fields}, timeout=60)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == param and words in error["message"], error


def test_a_guided_choice_of_strings_that_are_not_text_is_refused_naming_it(served):
    import httpx

    body = {"prompt": "hi", "max_tokens": 4, "guided_choice": ["yes", 1]}
    answer = httpx.post(f"{served[1]}/v1/completions", json=body, timeout=60)
    assert answer.status_code == 422, answer.text  # a wrong type, as for every field (serve/schemas.py)
    assert answer.json()["error"]["param"] == "guided_choice", answer.text


CHOICES = ["yes", "no", "not sure", "-1.5", "{x}"]  # a space, a dot and braces: read as text, not syntax


def test_guided_choice_replies_are_each_exactly_one_choice_at_temperature_1(served):
    client = served[0]
    completed = client.completions.create(model=None, prompt="ok?", max_tokens=20, temperature=1.0, seed=3, n=4,
                                          extra_body={"guided_choice": CHOICES})
    chatted = ask(client, max_tokens=20, temperature=1.0, seed=3, n=4, extra_body={"guided_choice": CHOICES})
    texts = [c.text for c in completed.choices] + [c.message.content for c in chatted.choices]
    assert all(text in CHOICES for text in texts), texts
    assert len(set(texts)) > 1  # sampled among them, not one forced
    assert {c.finish_reason for c in [*completed.choices, *chatted.choices]} == {"stop"}


def test_guided_json_replies_validate_against_the_schema_given_as_object_or_text(served):
    client = served[0]
    completed = client.completions.create(model=None, prompt="person:", max_tokens=BOUND_TOKENS, temperature=1.0,
                                          seed=5, n=2, extra_body={"guided_json": BOUNDED})
    chatted = ask(client, temperature=1.0, seed=5, extra_body={"guided_json": json.dumps(BOUNDED)})
    for choice, text in [(c, c.text) for c in completed.choices] + [(chatted.choices[0],
                                                                     chatted.choices[0].message.content)]:
        assert choice.finish_reason == "stop", text
        jsonschema.validate(json.loads(text), BOUNDED)
