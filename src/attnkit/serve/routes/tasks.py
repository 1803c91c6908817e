"""POST /v1/{method}: the run's task method as the task registry names it (translate, classify, tag, fill_mask),
over one text or a list of them, the model read `TEXTS_PER_TURN` texts at a time (`serve/state.py`)."""

from __future__ import annotations

import dataclasses

from fastapi import APIRouter, Request

from attnkit.serve.errors import APIError
from attnkit.serve.routes.operations import MODELS
from attnkit.serve.schemas import TaskRequest
from attnkit.serve.state import ServerState, written


def router(state: ServerState) -> APIRouter:
    """The task endpoint: mounted after every other /v1/ router, since its path matches any /v1/ name."""
    routes = APIRouter()
    pipeline = state.pipeline

    def refused(method: str) -> APIError:
        """The answer to /v1/{method} asked with a verb it does not take: 405 with the verb it takes where the run
        serves it (POST for the endpoints the registry names, GET for /v1/models), else 404, whatever the verb."""
        path = f"/v1/{method}"
        allow = "POST" if path in state.endpoints() else "GET" if path == MODELS else None
        if allow is not None:
            return APIError(405, f"{path} takes {allow}", headers={"Allow": allow})
        return APIError(404, f"no endpoint {path}; this run serves {', '.join(state.endpoints()) or 'none'}")

    @routes.post("/v1/{method}")
    async def task_method(method: str, request: Request):
        if method not in pipeline.methods or method == "generate":
            raise refused(method)
        body = await state.body(request, TaskRequest)
        state.check_model(body.model)
        texts = [body.input] if isinstance(body.input, str) else body.input
        results = await state.in_turns(texts, lambda part, _start: getattr(pipeline, method)(part))
        for index, result in enumerate(results):
            _refuse_cut_off(index, result, pipeline.config.max_seq_len)
        return await written({"object": "list", "model": state.model_id, "task": method,
                              "data": [{"index": i, "result": _plain(r)} for i, r in enumerate(results)]})

    @routes.api_route("/v1/{method}", methods=["GET", "HEAD", "OPTIONS", "PUT", "PATCH", "DELETE"])
    async def other_verb(method: str):
        """A /v1/ name asked with another verb than POST (`refused`: the POST route alone would make every name's GET
        a 405)."""
        raise refused(method)

    return routes


def _refuse_cut_off(index: int, result, context: int) -> None:
    """400 for a result that labels words the model never read (a tagger's words past its context): their labels
    would be made up, not predicted."""
    if isinstance(result, list) and any(getattr(item, "cut_off", False) for item in result):
        cut = sum(item.cut_off for item in result)
        raise APIError(400, f"input[{index}]: {cut} of its {len(result)} words lie past the model's context of "
                       f"{context} tokens and cannot be labelled; split the text into shorter pieces", param="input")


def _plain(result):
    """A task method's result as JSON: dataclasses as dicts, the rest as it is."""
    if dataclasses.is_dataclass(result):
        return dataclasses.asdict(result)
    return result
