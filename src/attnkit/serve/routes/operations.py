"""GET /health, /version (attnkit's, as vLLM's /version gives its own), /metrics (Prometheus text,
`serve/metrics.py`), /openapi.json (the request bodies' schemas, per endpoint served, `serve/schemas.py`) and
/v1/models[/{id}] (the one model served)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse

from attnkit.serve.errors import STOPPED, APIError
from attnkit.serve.schemas import (
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    ExploreRequest,
    ModelViewRequest,
    StepRequest,
    TaskRequest,
    TokenizeRequest,
    openapi,
)
from attnkit.serve.state import ServerState
from attnkit.version import installed_version

MODELS = "/v1/models"  # the one /v1/ name served to GET (the task router answers its other verbs: 405)


def router(state: ServerState) -> APIRouter:
    routes = APIRouter()
    settings, scheduler, pipeline = state.settings, state.scheduler, state.pipeline

    @routes.get("/health")
    async def health():
        if scheduler is not None and scheduler.stopped:  # no generation request would ever be answered
            raise APIError(503, STOPPED)
        return {"status": "ok", "model": state.model_id}

    release = {"version": installed_version()}  # "unknown (not installed)" from a checkout

    @routes.get("/version")
    async def attnkit_version():
        return release

    @routes.get("/metrics")
    async def prometheus():
        return PlainTextResponse(state.metrics.text(scheduler), media_type="text/plain; version=0.0.4")

    @routes.get("/openapi.json")
    async def openapi_document():
        bodies = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatRequest,
                  "/v1/embeddings": EmbeddingRequest}
        bodies = {path: body for path, body in bodies.items() if path in state.endpoints()}
        bodies |= {path: TaskRequest for path in state.endpoints() if path not in bodies}
        bodies |= {"/tokenize": TokenizeRequest, "/detokenize": DetokenizeRequest}
        bodies |= {"/api/analyze": ExploreRequest, "/api/step": StepRequest, "/api/inspect": ExploreRequest,
                   "/api/model": ModelViewRequest}
        most = {"max_tokens": settings.max_tokens, "max_completion_tokens": settings.max_tokens,
                "n": scheduler.most_choices if scheduler is not None else settings.max_batch}
        return openapi(bodies, title=f"attnkit serve: {state.model_id}", limits=most)

    def card(name: str) -> dict:
        """The model under one of its names, with vLLM's `root` (what it serves: the run) and `max_model_len`."""
        return {"id": name, "object": "model", "created": state.created, "owned_by": "attnkit",
                "root": state.run_name, "max_model_len": pipeline.config.max_seq_len, "family": pipeline.family,
                "task": pipeline.task.name if pipeline.task else None, "endpoints": state.endpoints()}

    @routes.get(MODELS)
    async def models():
        return {"object": "list", "data": [card(name) for name in state.names]}

    @routes.get(MODELS + "/{name}")
    async def model(name: str):
        state.check_model(name)
        return card(name)

    return routes
