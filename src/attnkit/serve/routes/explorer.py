"""GET / and /api/*: the explorer page (`serve/static/`) and the numbers it draws (`serve/explorer.py`), each
model call on a worker thread holding the model, within the server's timeout."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse
from starlette.concurrency import run_in_threadpool

from attnkit.errors import AttnkitError
from attnkit.serve.errors import APIError
from attnkit.serve.schemas import ExploreRequest, ModelViewRequest, StepRequest
from attnkit.serve.state import ServerState, written

STATIC = Path(__file__).parents[1] / "static"


def router(state: ServerState) -> APIRouter:
    routes = APIRouter()
    explorer = state.explorer

    @routes.get("/")
    async def page():
        return FileResponse(STATIC / "index.html")

    @routes.get("/api/info")
    async def info():
        return {"model": state.model_id, **explorer.info()}

    @routes.post("/api/analyze")
    async def analyze(request: Request):
        body = await state.body(request, ExploreRequest)
        return await written(await state.held(lambda: explorer.analyze(body.text, body.target)))

    @routes.post("/api/step")
    async def step(request: Request):
        body = await state.body(request, StepRequest)
        return await written(await state.held(lambda: explorer.step(
            body.text, target=body.target, kind=body.kind, layer=body.layer, head=body.head, query=body.query)))

    @routes.post("/api/model")
    async def whole_model(request: Request):  # each stage with its shape, read at one token (serve/model_view.py)
        body = await state.body(request, ModelViewRequest)
        return await written(await state.held(lambda: explorer.whole_model(
            body.text, body.query, target=body.target, source_query=body.source_query)))

    @routes.post("/api/inspect")
    async def inspect_text(request: Request):  # head importance and the logit lens (serve/inspect_view.py)
        body = await state.body(request, ExploreRequest)
        return await written(await state.held(lambda: explorer.inspect(body.text, body.target)))

    @routes.post("/api/sae")
    async def sae_features(request: Request):  # the SAE served with --sae on the text (serve/sae_view.py)
        body = await state.body(request, ExploreRequest)
        return await written(await state.held(lambda: explorer.sae_features(body.text, body.target)))

    @routes.get("/api/training")
    async def training(since: int = 0):
        return await written(await run_in_threadpool(explorer.training_metrics, max(since, 0)))

    @routes.get("/api/experiments")
    async def experiments_list():
        return await written(await run_in_threadpool(explorer.experiments))

    @routes.get("/api/experiments/{name}/{plot}")
    async def experiment_plot(name: str, plot: str):
        try:
            return FileResponse(await run_in_threadpool(explorer.experiment_plot, name, plot))
        except AttnkitError as error:
            raise APIError(404, str(error)) from None

    return routes
