"""The request bodies, in the OpenAI API's shapes: the fields attnkit serves, and no other.

Types are strict: "5" is not an integer here, so a wrong type is answered 422 naming the field; a value of the
right type out of its range is answered 400 naming it. A field the server does not take is answered 400 naming it,
never ignored: OpenAI's fields that attnkit does not honour (`frequency_penalty`, `best_of`, `tools`, `dimensions`,
...) pass only at the neutral value clients send by default (`NOT_HONOURED`), which asks for nothing.

A prompt is text, or token ids, as OpenAI's completions take it: a string, a list of strings, a list of token ids
(one prompt), or a list of such lists. A chat message's content is a string or a list of text parts
(`[{"type": "text", "text": ...}]`), joined with newlines as vLLM joins them.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_STOPS = 4  # as OpenAI
MAX_TOP_LOGPROBS = 20  # alternatives per token at most (OpenAI's chat limit; vLLM's default max_logprobs)

_OFF = (None, False)
SAMPLING_NOT_HONOURED: dict[str, tuple] = {  # field -> its neutral values (compared with their types)
    "frequency_penalty": (None, 0, 0.0), "presence_penalty": (None, 0, 0.0), "user": None, "store": _OFF,
    "metadata": (None, {}), "service_tier": (None, "auto", "default"),
}
TokenIds = Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1)]


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
    top_k: Annotated[int, Field(ge=1)] | None = None  # not in OpenAI's API; as vLLM and llama.cpp take it
    stop: str | Annotated[list[Annotated[str, Field(min_length=1)]], Field(max_length=MAX_STOPS)] | None = None
    seed: int | None = None
    n: Annotated[int, Field(ge=1, le=128)] = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    logit_bias: dict[str, float] | None = None  # {token id: -100 to 100}, added to its logit before sampling


class StreamOptions(Body):
    include_usage: bool = False


class CompletionRequest(Sampling):
    NOT_HONOURED = {**SAMPLING_NOT_HONOURED, "best_of": (None, 1), "suffix": (None, "")}

    prompt: str | Annotated[list[str], Field(min_length=1)] | TokenIds | Annotated[list[TokenIds], Field(min_length=1)]
    logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None  # the likeliest alternatives per token
    echo: bool = False  # the prompt before the completion, in the text and the logprobs

    @property
    def prompts(self) -> list[str] | list[list[int]]:
        """The prompts, each a string or a list of token ids."""
        one = isinstance(self.prompt, str) or isinstance(self.prompt[0], int)
        return [self.prompt] if one else self.prompt


class TextPart(Body):
    type: Literal["text"]
    text: str


class Message(Body):
    NOT_HONOURED = {"name": None}  # a participant's name: the default template does not show it

    role: Literal["system", "user", "assistant", "developer"]
    content: str | Annotated[list[TextPart], Field(min_length=1)]

    def rendered(self) -> dict[str, str]:
        """{"role", "content"} with the content's text parts joined by newlines."""
        text = self.content if isinstance(self.content, str) else "\n".join(part.text for part in self.content)
        return {"role": self.role, "content": text}


class ChatRequest(Sampling):
    NOT_HONOURED = {**SAMPLING_NOT_HONOURED, "tools": (None, []), "functions": (None, []),
                    "tool_choice": (None, "none"), "function_call": (None, "none"),
                    "parallel_tool_calls": (None, True, False), "response_format": (None, {"type": "text"}),
                    "modalities": (None, ["text"])}

    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    logprobs: bool = False  # each new token's log-probability
    top_logprobs: Annotated[int, Field(ge=0, le=MAX_TOP_LOGPROBS)] | None = None  # and its likeliest alternatives


class EmbeddingRequest(Body):
    NOT_HONOURED = {"dimensions": (None,), "user": None}

    model: str | None = None
    input: str | Annotated[list[str], Field(min_length=1)]
    encoding_format: Literal["float", "base64"] = "float"  # base64: little-endian float32 bytes, as OpenAI's


class TaskRequest(Body):
    """A task endpoint's body (/v1/translate, /v1/classify, /v1/tag, /v1/fill_mask): the texts."""

    model: str | None = None
    input: str | Annotated[list[str], Field(min_length=1)]


class ExploreRequest(Body):
    """The explorer's analysis of one text (a translation run's source, with an optional target)."""

    text: Annotated[str, Field(min_length=1)]
    target: str | None = None


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
