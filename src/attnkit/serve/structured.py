"""Structured output in the chat API: `response_format` and `tools` as grammars the reply is held to
(`generate/constrained.py`), and the reply read back into OpenAI's message shape.

    response_format {"type": "json_object"}                    the reply is one JSON object
    response_format {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}
                                                               the reply is JSON valid under the schema
    tools [...] with tool_choice "auto" (the default)          free text (or JSON, with a response_format), or a call:
                                                               <tool_call>{"name": "f", "arguments": {...}}
    tool_choice "required", or {"type": "function", "function": {"name": "f"}}
                                                               a call of one of the tools (of f), its arguments valid
                                                               under the tool's `parameters` schema
    tool_choice "none"                                         the tools are neither shown nor called
    guided_regex "(yes|no)" (vLLM's; completions too)          text the regular expression matches whole
    guided_grammar "start: ..." (vLLM's; completions too)      text that parses by the Lark grammar (llguidance's)
    guided_json {...} (vLLM's; completions too)                JSON valid under the schema (an object or its text)
    guided_choice ["yes", "no"] (vLLM's; completions too)      exactly one of the strings

vLLM's fields each constrain the reply alone: one of them beside another, or beside a response_format or tools
shown, is refused naming them all.

A reply that is a call becomes `message.tool_calls` ([{"id", "type": "function", "function": {"name", "arguments"}}],
the arguments as JSON text) with `content` null and finish_reason "tool_calls", as OpenAI answers. The chat template
shows the model the tools (`serve/chat.py`); a run's own Jinja template gets them as `tools`, as transformers passes
them. One call per choice: `parallel_tool_calls` is taken either way (true lets a model call several; attnkit calls
at most one).
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from attnkit.chat_format import TOOL_CALL
from attnkit.errors import AttnkitError, InputError
from attnkit.generate.constrained import JSON_STYLE, Grammar, GrammarMask
from attnkit.generate.finite_schema import check_finite
from attnkit.serve.errors import APIError
from attnkit.serve.schemas import ChatRequest, Sampling

FREE_TEXT = r"/[^<](.|\n)*/"  # a reply that is no call: anything not starting with "<"
CUT_CALL = re.compile(r'\{"name": "(?P<name>[^"]+)", "arguments": (?P<arguments>.*)', re.DOTALL)  # JSON_STYLE's


def choice_grammar(choices: list[str]) -> Grammar:
    """Text that is exactly one of `choices` (vLLM's guided_choice): a regular expression of the alternatives, each
    character but an ASCII letter or digit written as its code point (`\\x{2E}`), so none is read as syntax."""
    escaped = ("".join(c if c.isascii() and c.isalnum() else f"\\x{{{ord(c):X}}}" for c in choice)
               for choice in choices)
    return Grammar.regex(f"({'|'.join(escaped)})")


GUIDED = {"guided_regex": Grammar.regex, "guided_grammar": Grammar.lark, "guided_json": Grammar.json_schema,
          "guided_choice": choice_grammar}  # vLLM's fields -> the Grammar each builds


@dataclass(frozen=True)
class Structured:
    """What a chat request asks of its reply: the grammar (None: free text), the tools shown and callable, and the
    request field a refusal names."""

    grammar: Grammar | None
    tools: tuple[dict, ...] = ()  # the tools offered, as the request gives them ({"type": "function", ...})
    param: str = "response_format"

    @classmethod
    def of(cls, body: Sampling) -> Structured | None:
        """The request's structured output (None: none asked for). Raises APIError 400 naming the field for a
        tool_choice that names no tool given, tools of the same name, a json_schema format without its schema, a
        guided field beside another constraint (naming them all), or a grammar or regular expression llguidance
        cannot build, with its reason (or no llguidance: the structured extra). Builds llguidance's grammar: call
        it off the event loop."""
        guided = [name for name in GUIDED if getattr(body, name) is not None]
        if guided:
            return cls._guided(body, guided)
        if not isinstance(body, ChatRequest):
            return None
        try:
            return cls._of(body)
        except (AttnkitError, ValueError) as error:
            field = "tools" if body.tools and body.tool_choice != "none" else "response_format"
            raise APIError(400, f"{field}: {error}", param=field) from None

    @classmethod
    def _of(cls, body: ChatRequest) -> Structured | None:
        form = _format_schema(body)
        if form is not None:
            _check_finite(form, "response_format")
        choice = body.tool_choice
        if choice is not None and choice != "none" and not body.tools:
            raise APIError(400, "tool_choice needs tools: give the functions in tools, or leave tool_choice out",
                           param="tool_choice")
        for index, tool in enumerate(body.tools or []):  # each tool given, at its place in the list (as OpenAI)
            parameters = tool.function.parameters
            if parameters is not None and parameters.get("type", "object") != "object":
                raise APIError(400, f"tools[{index}].function.parameters is a schema of type "
                               f"{json.dumps(parameters['type'])}; a function's arguments are a JSON object: give "
                               '{"type": "object", "properties": {...}}, as OpenAI requires', param="tools")
        tools = list(body.tools or []) if choice != "none" else []
        names = [tool.function.name for tool in tools]
        if len(set(names)) < len(names):
            raise APIError(400, f"tools: two tools share a name ({names}); give each its own", param="tools")
        if not isinstance(choice, str | None):
            if choice.function.name not in names:
                raise APIError(400, f"tool_choice names the function {choice.function.name!r}, which tools does not "
                               f"hold (it holds {names})", param="tool_choice")
            tools = [tool for tool in tools if tool.function.name == choice.function.name]
        if not tools:
            return cls(Grammar.json_schema(form)) if form is not None else None
        for tool in tools:
            if tool.function.parameters is not None:
                _check_finite(tool.function.parameters, "tools")
        calls = [_call_schema(tool.function.name, tool.function.parameters) for tool in tools]
        call = calls[0] if len(calls) == 1 else {"anyOf": calls}
        lines = [f'call: "{TOOL_CALL}" %json {json.dumps({**call, "x-guidance": JSON_STYLE})}']
        if choice is None or choice == "auto":  # the reply may also be no call
            reply = "TEXT?" if form is None else "reply"
            lines = [f"start: {reply} | call", *lines, f"TEXT: {FREE_TEXT}" if form is None else
                     f"reply: %json {json.dumps({**form, 'x-guidance': JSON_STYLE})}"]
        else:
            lines = ["start: call", *lines]
        offered = tuple(tool.model_dump(exclude_none=True) for tool in body.tools or [])
        return cls(Grammar.lark("\n".join(lines) + "\n"), offered, param="tools")

    @classmethod
    def _guided(cls, body: Sampling, guided: list[str]) -> Structured:
        """The grammar of the one guided field asked; 400 for it beside another constraint."""
        asked = [*guided, *_chat_constraints(body)]
        if len(asked) > 1:
            raise APIError(400, f"{' and '.join(asked)} each constrain the reply, which follows one constraint: "
                           "send one of them", param=asked[0])
        field = guided[0]
        try:
            return cls(GUIDED[field](getattr(body, field)), param=field)
        except (AttnkitError, ValueError) as error:
            raise APIError(400, f"{field}: {error}", param=field) from None

    def mask(self, tokenizer, rows: int) -> GrammarMask | None:
        """A GrammarMask of `rows` choices; APIError 400 naming the field when the grammar cannot be followed with
        this run's tokenizer (a schema llguidance refuses, a character the tokenizer lacks)."""
        try:
            return GrammarMask.of(self.grammar, tokenizer, rows)
        except AttnkitError as error:
            raise APIError(400, f"{self.param}: {error}", param=self.param) from None

    @property
    def withheld(self) -> bool:
        """Whether a streamed reply comes whole at its end: a call is known only once it has been read."""
        return bool(self.tools)

    def reply(self, text: str, reason: str) -> tuple[dict, str]:
        """The assistant message for the reply `text`, and its finish reason: a complete call becomes `tool_calls`
        ("tool_calls"); a call cut short (by max_tokens, or a stop string) keeps its reason and, as OpenAI answers
        one, no content: the call with its arguments so far once its name is whole; any other text stays content."""
        if not (self.tools and text.startswith(TOOL_CALL)):
            return {"role": "assistant", "content": text}, reason
        try:
            call = json.loads(text[len(TOOL_CALL):])
        except json.JSONDecodeError:  # cut short: the grammar wrote {"name": "f", "arguments": ... in this order
            cut = CUT_CALL.match(text[len(TOOL_CALL):])
            if cut is None:
                return {"role": "assistant", "content": ""}, reason
            return _call_message(cut["name"], cut["arguments"]), reason
        return _call_message(call["name"], json.dumps(call["arguments"])), "tool_calls"


def check_tool_turns(messages: list) -> None:
    """400 naming `messages` for a tool message that answers no call: one that follows no assistant message with
    tool_calls (only other tool messages between), or whose tool_call_id names none of that message's calls, as
    OpenAI refuses it (a template would render an answer to a question never asked)."""
    calls: set[str] | None = None  # the ids of the calls the latest assistant message made, while tools answer
    for index, message in enumerate(messages):
        if message.role == "assistant":
            calls = {call.id for call in message.tool_calls or []} or None
        elif message.role != "tool":
            calls = None
        elif calls is None:
            raise APIError(400, f"messages[{index}] is a tool message, but no assistant message with tool_calls comes "
                           "before it: a tool message answers a call of the assistant message just before it",
                           param="messages")
        elif message.tool_call_id is not None and message.tool_call_id not in calls:
            raise APIError(400, f"messages[{index}].tool_call_id is {message.tool_call_id!r}, which names none of the "
                           f"calls of the assistant message before it ({', '.join(map(repr, sorted(calls)))})",
                           param="messages")


def _call_message(name: str, arguments: str) -> dict:
    """An assistant message that calls `name` with `arguments` (JSON text), in OpenAI's shape."""
    function = {"name": name, "arguments": arguments}
    calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": function}]
    return {"role": "assistant", "content": None, "tool_calls": calls}


def _chat_constraints(body: Sampling) -> list[str]:
    """The chat fields that constrain the reply: a response_format other than text, and tools shown."""
    if not isinstance(body, ChatRequest):
        return []
    form = body.response_format
    return ([] if form is None or form.type == "text" else ["response_format"]) + \
        (["tools"] if body.tools and body.tool_choice != "none" else [])


def _check_finite(schema: dict, field: str) -> None:
    """400 naming `field` for a schema no finite JSON value satisfies (`generate/finite_schema.py`), before any
    grammar is built from it."""
    try:
        check_finite(schema)
    except InputError as error:
        raise APIError(400, f"{field}: {error}", param=field) from None


def _format_schema(body: ChatRequest) -> dict | None:
    """The JSON schema that response_format asks the reply to follow (None: free text); 400 for a json_schema
    given with another type, which would be dropped."""
    form = body.response_format
    if form is not None and form.type != "json_schema" and form.json_schema is not None:
        raise APIError(400, f'response_format: a json_schema is given with "type": "{form.type}", which does not '
                       'read it; send "type": "json_schema" to hold the reply to the schema, or leave json_schema '
                       "out", param="response_format")
    if form is None or form.type == "text":
        return None
    if form.type == "json_object":
        return {"type": "object"}
    if form.json_schema is None or form.json_schema.schema_ is None:
        raise APIError(400, 'response_format: {"type": "json_schema"} needs its json_schema: {"name": ..., "schema": '
                       "{...}}", param="response_format")
    return form.json_schema.schema_


def _call_schema(name: str, parameters: dict | None) -> dict:
    """The JSON schema of one call of tool `name`: {"name": name, "arguments": valid under its parameters}."""
    arguments = parameters if parameters is not None else {"type": "object"}
    return {"type": "object", "properties": {"name": {"const": name}, "arguments": arguments},
            "required": ["name", "arguments"], "additionalProperties": False}
