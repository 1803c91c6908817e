"""POST /v1/embeddings: an encoder run's embedding of each text, the mean of its last layer's states over the
text's tokens, normalised to length 1; as floats, or base64 as OpenAI's client asks by default."""

from __future__ import annotations

import base64
import dataclasses
import struct

import torch
from fastapi import APIRouter, Request

from attnkit.generate.pipeline import Pipeline
from attnkit.serve.errors import APIError
from attnkit.serve.schemas import EmbeddingRequest
from attnkit.serve.state import ServerState, written


def router(state: ServerState) -> APIRouter:
    routes = APIRouter()
    pipeline = state.pipeline

    @routes.post("/v1/embeddings")
    async def embeddings(request: Request):
        body = await state.body(request, EmbeddingRequest)
        state.check_model(body.model)
        if not state.embeds:
            raise APIError(404, f"embeddings come from encoder runs; this run is a {pipeline.family}",
                           code="endpoint_not_served")
        rows = await state.in_turns(body.inputs, lambda part, start: embed(pipeline, part, start))
        used = sum(row.tokens for row in rows)
        encode = _base64 if body.encoding_format == "base64" else list
        return await written({"object": "list", "model": state.model_id,
                              "data": [{"object": "embedding", "index": i, "embedding": encode(row.vector),
                                        "truncated": row.truncated} for i, row in enumerate(rows)],
                              "usage": {"prompt_tokens": used, "total_tokens": used}})

    return routes


@dataclasses.dataclass(frozen=True)
class Embedded:
    """One text's embedding, the tokens read, and whether the text was cut to the model's context to fit."""

    vector: list[float]
    tokens: int
    truncated: bool


def embed(pipeline: Pipeline, texts: list[str] | list[list[int]], start: int = 0) -> list[Embedded]:
    """Each text's embedding (a text given as a string, or as its tokens' ids): the mean of the encoder's last states
    over its tokens, of length 1. `start`: the first text's index in the request. APIError 400 for a token id beyond
    the vocabulary."""
    from attnkit.data.batching import pad

    vocab = pipeline.config.vocab_size
    for i, text in enumerate(texts):
        beyond = [token for token in text if token >= vocab] if not isinstance(text, str) else []
        if beyond:
            raise APIError(400, f"input[{start + i}]: token id {beyond[0]} is beyond the vocabulary of {vocab} "
                           f"tokens; give ids from 0 to {vocab - 1}", param="input")
    rows = [pipeline.classifier_ids(text, index=start + i) for i, text in enumerate(texts)]
    ids, mask = pad([row for row, _ in rows], pipeline.pad_id, device=pipeline.device)  # (B, T)
    hidden = pipeline.model(ids, attention_mask=mask).hidden_states.float()  # (B, T, C)
    weights = mask.unsqueeze(-1).float()
    mean = (hidden * weights).sum(dim=1) / weights.sum(dim=1)  # (B, C)
    vectors = torch.nn.functional.normalize(mean, dim=-1).tolist()
    return [Embedded(vector, len(row), truncated) for vector, (row, truncated) in zip(vectors, rows, strict=True)]


def _base64(vector: list[float]) -> str:
    """A vector as OpenAI sends `encoding_format="base64"`: its little-endian float32 bytes in base64."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")
