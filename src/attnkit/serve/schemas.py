"""The request bodies, in the OpenAI API's shapes: the fields attnkit serves, and no other.

Types are strict: "5" is not an integer here, so a wrong type is answered 422 naming the field; a value of the
right type out of its range is answered 400 naming it. A field the server does not take is answered 400 naming it,
never ignored: OpenAI's fields that attnkit does not honour (`best_of`, `functions`, `dimensions`, ...) pass only at
the neutral value clients send by default (`NOT_HONOURED`), which asks for nothing. Beside OpenAI's sampling fields,
vLLM's are taken under vLLM's names (`top_k`, `min_p`, `repetition_penalty`, `stop_token_ids`, `ignore_eos`,
`min_tokens`), as clients send them (the openai client's `extra_body`).
Chat's `response_format`, `tools` and `tool_choice`, and vLLM's `guided_regex`, `guided_grammar`, `guided_json`
and `guided_choice` (both endpoints), are honoured through structured output (`serve/structured.py`).

A prompt is text, or token ids, as OpenAI's completions take it: a string, a list of strings, a list of token ids
(one prompt), or a list of such lists. A chat message's content is a string or a list of text parts
(`[{"type": "text", "text": ...}]`), joined with newlines as vLLM joins them.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, model_validator
from pydantic_core import PydanticCustomError

MAX_STOPS = 4  # as OpenAI
# A stop string's characters at most: a stream holds back as much of its text (it may be a stop's start), and one
# longer than any reply could hold is never met
MAX_STOP_CHARS = 1000
MAX_TOP_LOGPROBS = 20  # alternatives per token at most (OpenAI's chat limit; vLLM's default max_logprobs)

_OFF = (None, False)
SAMPLING_NOT_HONOURED: dict[str, tuple] = {  # field -> its neutral values (compared with their types)
    "user": None, "store": _OFF,
    "metadata": (None, {}), "service_tier": (None, "auto", "default"),
}
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]
SHOWN_CHARS = 40  # of a value that is no token id, in its refusal


def check_token_ids(value: Any) -> Any:
    """A prompt of token ids (a list of ids, or a list of such lists) checked id by id, so that a bad one is refused
    as a token id, by its place: the union it belongs to would report its text member's complaint ("should be a
    valid string"). Text (a string, a list of strings) and other values go on to the union's own checks."""
    if not isinstance(value, list) or all(isinstance(item, str) for item in value):
        return value
    nested = any(isinstance(item, list) for item in value)
    for i, row in enumerate(value if nested else [value]):
        where = f"[{i}]" if nested else ""
        if not isinstance(row, list):
            raise PydanticCustomError("list_type", "{where} is {value}, not a list of token ids: give every prompt as "
                                      "token ids, or every one as text", {"where": where, "value": _shown(row)})
        if not row:
            raise PydanticCustomError("too_short", "{where} is an empty list: a prompt of token ids holds at least "
                                      "one", {"where": where})
        for j, token in enumerate(row):
            if isinstance(token, bool) or not isinstance(token, int):
                raise PydanticCustomError("int_type", "{where} is {value}, not a token id: token ids are whole "
                                          "numbers from 0 (or give the prompt as text)",
                                          {"where": f"{where}[{j}]", "value": _shown(token)})
            if token < 0:
                raise PydanticCustomError("greater_than_equal", "the token id at {where} is {value}; token ids are "
                                          "whole numbers from 0", {"where": f"{where}[{j}]", "value": token})
    return value


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= SHOWN_CHARS else text[:SHOWN_CHARS] + "..."


def one_or_many(prompt: Any) -> list:
    """A prompt field's prompts: [prompt] for one (a string, or a list of token ids), else the list."""
    return [prompt] if isinstance(prompt, str) or isinstance(prompt[0], int) else prompt


Prompts = Annotated[str | Annotated[list[str], Field(min_length=1)] | TokenIds
                    | Annotated[list[TokenIds], Field(min_length=1)], BeforeValidator(check_token_ids)]


class Body(BaseModel):
    """A request body: strict types, no field beyond those declared. A field of `NOT_HONOURED` (a field name ->
    its neutral values, or None for metadata any value of which asks for nothing) is dropped at a neutral value
    and refused otherwise (`not_honoured`)."""

    model_config = ConfigDict(strict=True, extra="forbid")
    NOT_HONOURED: ClassVar[dict[str, tuple | None]] = {}

    @model_validator(mode="before")
    @classmethod
    def _drop_neutral(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        return {name: value for name, value in data.items() if not cls.neutral(name, value)}

    @classmethod
    def neutral(cls, name: str, value: Any) -> bool:
        """Whether `name` is a field this body does not honour and `value` asks nothing of it."""
        if name not in cls.NOT_HONOURED:
            return False
        values = cls.NOT_HONOURED[name]
        return values is None or any(type(value) is type(v) and value == v for v in values)

    @classmethod
    def not_honoured(cls, name: str) -> str | None:
        """The refusal of a value of `name` that asks for something this server does not do; None for no such field."""
        values = cls.NOT_HONOURED.get(name, ())
        if name not in cls.NOT_HONOURED or values is None:
            return None
        neutral = " or ".join("null" if v is None else repr(v) for v in values)
        return f"{name}: this server does not honour it; leave it out (or send {neutral})"


class Sampling(Body):
    """The decoding fields completions and chat completions share."""

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0.0, le=2.0)] = 1.0
    top_p: Annotated[float, Field(gt=0.0, le=1.0)] | None = None
    # not in OpenAI's API; as vLLM and llama.cpp take it: 0 and -1 keep every token (read as None)
    top_k: Annotated[int, Field(ge=-1), AfterValidator(lambda k: k if k >= 1 else None)] | None = None
    stop: (Annotated[str, Field(max_length=MAX_STOP_CHARS)]
           | Annotated[list[Annotated[str, Field(min_length=1, max_length=MAX_STOP_CHARS)]],
                       Field(max_length=MAX_STOPS)]
           | None) = None
    seed: int | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None  # {token id: -100 to 100}, added to its logit before sampling
    presence_penalty: float | None = None  # -2 to 2: a generated token's logit less by this once it has appeared
    frequency_penalty: float | None = None  # -2 to 2: ... less by this times the times it has appeared (OpenAI's)
    repetition_penalty: float = 1.0  # vLLM's (CTRL's): tokens of the prompt and reply less likely; 1 is off
    min_p: float = 0.0  # vLLM's: tokens less likely than min_p times the likeliest are dropped; 0 is off
    stop_token_ids: list[Annotated[int, Field(ge=0)]] | None = None  # vLLM's: tokens that end a choice, unreturned
    ignore_eos: bool = False  # vLLM's: EOS does not end a choice
    min_tokens: Annotated[int, Field(ge=0)] = 0  # vLLM's: EOS and stop_token_ids are held back until this many
    guided_regex: Annotated[str, Field(min_length=1)] | None = None  # vLLM's: the reply matches it whole
    guided_grammar: Annotated[str, Field(min_length=1)] | None = None  # vLLM's: the reply parses by this Lark grammar
    guided_json: dict[str, Any] | str | None = None  # vLLM's: the reply is JSON valid under this schema
    guided_choice: Annotated[list[str], Field(min_length=1)] | None = None  # vLLM's: the reply is one of these


class StreamOptions(Body):
    include_usage: bool = False  # a last chunk, with no choices, carries the request's usage
    continuous_usage_stats: bool = False  # vLLM's: with include_usage, every chunk carries the usage so far


class CompletionRequest(Sampling):
    NOT_HONOURED = {**SAMPLING_NOT_HONOURED, "best_of": (None, 1), "suffix": (None, "")}

    prompt: Prompts
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None  # the likeliest alternatives per token
    echo: bool = False  # the prompt before the completion, in the text and the logprobs

    @property
    def prompts(self) -> list[str] | list[list[int]]:
        """The prompts, each a string or a list of token ids."""
        return one_or_many(self.prompt)


class TextPart(Body):
    type: Literal["text"]
    text: str


class CalledFunction(Body):
    name: str
    arguments: str  # JSON text, as the reply gave it


class ToolCall(Body):
    """A call an earlier assistant message made (sent back with the tool's answer)."""

    id: str
    type: Literal["function"]
    function: CalledFunction


class Message(Body):
    """A chat turn. The fields of OpenAI's reply message beyond these pass at null (and `annotations` empty), so a
    client can send its replies back as history: `messages.append(reply.model_dump())`, as vLLM takes them."""

    NOT_HONOURED = {"name": None,  # a participant's name: the default template does not show it
                    "refusal": (None,), "annotations": (None, []), "audio": (None,), "function_call": (None,)}

    role: Literal["system", "user", "assistant", "developer", "tool"]
    content: str | Annotated[list[TextPart], Field(min_length=1)] | None = None  # None: an assistant's calls alone
    tool_calls: list[ToolCall] | None = None  # an assistant message's calls
    tool_call_id: str | None = None  # a tool message: the call it answers

    @model_validator(mode="after")
    def _content_or_calls(self) -> Message:
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is missing: only an assistant message with tool_calls may leave it out")
        return self

    def rendered(self) -> dict:
        """{"role", "content"} with the content's text parts joined by newlines (None as ""); an assistant's
        `tool_calls` ([{"type", "function": {"name", "arguments"}}], the arguments read from their JSON text where
        they parse, as chat templates expect) and a tool message's `tool_call_id` where given."""
        content = self.content or ""
        text = content if isinstance(content, str) else "\n".join(part.text for part in content)
        rendered = {"role": self.role, "content": text}
        if self.tool_calls:
            rendered["tool_calls"] = [{"id": call.id, "type": "function", "function": {
                "name": call.function.name, "arguments": _json_or_text(call.function.arguments)}}
                for call in self.tool_calls]
        if self.tool_call_id is not None:
            rendered["tool_call_id"] = self.tool_call_id
        return rendered


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


class JSONSchemaFormat(Body):
    """response_format's json_schema: the schema the reply follows (`strict` taken either way: it always does)."""

    name: Annotated[str, Field(min_length=1, max_length=64)]
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Body):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None


class FunctionDefinition(Body):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments (none: any JSON object)
    strict: bool | None = None  # taken either way: the arguments always follow the schema


class Tool(Body):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(Body):
    name: str


class NamedToolChoice(Body):
    type: Literal["function"]
    function: FunctionName


class ChatRequest(Sampling):
    NOT_HONOURED = {**SAMPLING_NOT_HONOURED, "functions": (None, []), "function_call": (None, "none"),
                    "modalities": (None, ["text"])}

    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False  # each new token's log-probability
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None  # and its likeliest alternatives
    response_format: ResponseFormat | None = None  # JSON, or JSON of a schema (serve/structured.py)
    tools: list[Tool] | None = None  # functions the reply may call (serve/structured.py)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # taken either way: a reply makes at most one call


class TokenizeRequest(Body):
    """POST /tokenize, in vLLM's shapes: a `prompt`, or chat `messages` (with the `tools` offered) rendered by the
    run's chat template. add_special_tokens (default: true for a prompt, false for messages): a prompt's tokens as
    /v1/completions feeds them (BOS before an empty prompt), else the tokenizer's alone; the rendered messages'
    tokens as /v1/chat/completions feeds them, with BOS first as well when true."""

    model: str | None = None
    prompt: str | None = None
    messages: Annotated[list[Message], Field(min_length=1)] | None = None
    tools: list[Tool] | None = None
    add_generation_prompt: bool = True  # messages: end with the assistant's turn begun
    add_special_tokens: bool | None = None
    return_token_strs: bool = False  # each token's text as well


class DetokenizeRequest(Body):
    """POST /detokenize, in vLLM's shape: token ids back to text."""

    model: str | None = None
    tokens: list[Annotated[int, Field(ge=0)]]


class EmbeddingRequest(Body):
    NOT_HONOURED = {"dimensions": (None,), "user": None}

    model: str | None = None
    input: Prompts  # texts or token ids, as OpenAI's (its client sends ids when it splits long texts itself)
    encoding_format: Literal["float", "base64"] = "float"  # base64: little-endian float32 bytes, as OpenAI's

    @property
    def inputs(self) -> list[str] | list[list[int]]:
        """The inputs, each a string or a list of token ids."""
        return one_or_many(self.input)


class TaskRequest(Body):
    """A task endpoint's body (/v1/translate, /v1/classify, /v1/tag, /v1/fill_mask): the texts."""

    model: str | None = None
    input: str | Annotated[list[str], Field(min_length=1)]


class ExploreRequest(Body):
    """The explorer's analysis of one text (a translation run's source, with an optional target)."""

    text: Annotated[str, Field(min_length=1)]
    target: str | None = None


class ModelViewRequest(ExploreRequest):
    """The whole model's stages for one text, read at one query token (None: the last); a translation run's
    decoder reads `target` (none: the model's own translation) at `query`, its encoder the source at
    `source_query`."""

    query: Annotated[int, Field(ge=0)] | None = None
    source_query: Annotated[int, Field(ge=0)] | None = None


class StepRequest(ExploreRequest):
    """One head's computation for one query token, step by step."""

    layer: Annotated[int, Field(ge=0)] = 0
    head: Annotated[int, Field(ge=0)] = 0
    query: Annotated[int, Field(ge=0)] = 0
    kind: Literal["self", "causal", "cross"] | None = None


Sampling.model_rebuild()


def openapi(bodies: dict[str, type[Body]], *, title: str, limits: dict[str, int] | None = None) -> dict:
    """An OpenAPI 3.1 document of the POST endpoints `bodies` ({path: its body}), their bodies' JSON Schemas in its
    components, with this server's `limits` ({integer field: its maximum}, e.g. its --max-tokens): what clients and
    schema-driven tests (schemathesis) read at GET /openapi.json."""
    components: dict[str, dict] = {}
    paths = {}
    for path, body in bodies.items():
        schema = body.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(schema.pop("$defs", {}))
        components[body.__name__] = schema
        for name, field in schema.get("properties", {}).items():
            for branch in [field, *field.get("anyOf", [])]:
                if name in (limits or {}) and branch.get("type") == "integer":
                    branch["maximum"] = min(branch.get("maximum", limits[name]), limits[name])
        paths[path] = {"post": {
            "operationId": path.strip("/").replace("/", "_"),
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{body.__name__}"}}}},
            "responses": {"200": {"description": "the answer"},
                          "400": {"description": "a value out of range, or a field the server does not take"},
                          "422": {"description": "a field of the wrong type, or missing"}}}}
    return {"openapi": "3.1.0", "info": {"title": title, "version": "1"}, "paths": paths,
            "components": {"schemas": components}}
