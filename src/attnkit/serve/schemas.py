"""The request bodies, in the OpenAI API's shapes (the fields attnkit serves; others are ignored).

Types are strict: "5" is not an integer here, so a wrong type is answered 422 naming the field; a value of the
right type out of its range is answered 400 naming it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MAX_STOPS = 4  # as OpenAI


class Sampling(BaseModel):
    """The decoding fields completions and chat completions share."""

    model_config = ConfigDict(strict=True, extra="ignore")

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


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    include_usage: bool = False


class CompletionRequest(Sampling):
    prompt: str | Annotated[list[str], Field(min_length=1)]


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "user", "assistant", "developer"]
    content: str


class ChatRequest(Sampling):
    messages: Annotated[list[Message], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    input: str | Annotated[list[str], Field(min_length=1)]
    encoding_format: Literal["float"] = "float"


class TaskRequest(BaseModel):
    """A task endpoint's body (/v1/translate, /v1/classify, /v1/tag, /v1/fill_mask): the texts."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    input: str | Annotated[list[str], Field(min_length=1)]


class ExploreRequest(BaseModel):
    """The explorer's analysis of one text (a translation run's source, with an optional target)."""

    model_config = ConfigDict(strict=True, extra="ignore")

    text: Annotated[str, Field(min_length=1)]
    target: str | None = None


class StepRequest(ExploreRequest):
    """One head's computation for one query token, step by step."""

    layer: Annotated[int, Field(ge=0)] = 0
    head: Annotated[int, Field(ge=0)] = 0
    query: Annotated[int, Field(ge=0)] = 0
    kind: Literal["self", "causal", "cross"] | None = None


Sampling.model_rebuild()
