"""The HTTP app of `attnkit serve`: one run behind the OpenAI API's shapes, and the explorer page, assembled from
one router per endpoint family (`serve/routes/`) over the state they share (`serve/state.py`).

    POST /v1/completions        text completion (stream: server-sent events ending with [DONE])
    POST /v1/chat/completions   chat, the messages rendered by the run's chat template (`serve/chat.py`)
    POST /v1/embeddings         encoder runs: the mean of the last layer's states, normalised (floats or base64)
    POST /v1/{method}           the run's task method, as the task registry says (translate, classify, tag, ...)
    POST /tokenize, /detokenize a prompt's or chat's token ids with the context's length, and back (vLLM's shapes)
    GET  /v1/models[/{id}]      the one model served, under each of its names (--served-model-name)
    GET  /health, /metrics      liveness, Prometheus text (`serve/metrics.py`)
    GET  /version               attnkit's version (vLLM's endpoint)
    GET  /openapi.json          the request bodies' schemas, per endpoint served (`serve/schemas.py`)
    GET  /                      the explorer (`serve/static/`), its numbers under /api/ (`serve/explorer.py`)

The event loop only reads bodies within --max-body, queues and streams: parsing, tokenizing, templates, grammars and
every model call run on worker threads, so that no request, however large, stalls another. Generation runs on the
batching scheduler's thread (`serve/batching.py`); the other endpoints run the model a few texts at a time, each
turn holding the model, within the server's timeout: a request past it is answered 504. Each malformed or hostile
body gets an OpenAI-style 4xx (`serve/errors.py`, `serve/bodies.py`) and no traceback ever leaves the server.
"""

from __future__ import annotations

import gc
import hmac
import logging
import re
import time
import uuid
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.staticfiles import StaticFiles
from starlette.datastructures import MutableHeaders
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from attnkit.generate.pipeline import Pipeline
from attnkit.serve.errors import SHUTTING_DOWN, APIError
from attnkit.serve.routes import completions, embeddings, explorer, operations, tasks, tokenize
from attnkit.serve.settings import ServeSettings
from attnkit.serve.state import ServerState

log = logging.getLogger("attnkit.serve")

OPEN_PATHS = ("/", "/health")  # served without the API key, with the explorer's files under /static/
REQUEST_ID = re.compile(r"[\x21-\x7e]{1,128}")  # a client's X-Request-Id kept as given: printable, no spaces


def create_app(pipeline: Pipeline, run_dir: str | Path, settings: ServeSettings) -> FastAPI:
    """The app serving `pipeline` (loaded from `run_dir`) as `settings` say; the scheduler starts with the app."""
    state = ServerState.of(pipeline, Path(run_dir), settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        # What is loaded now (the model, the libraries: hundreds of thousands of objects) is left out of the
        # collector's full passes, which a request of many small objects sets off: each would visit them all, holding
        # the interpreter, the event loop too, for tenths of a second. Let go when the server stops.
        gc.collect()
        gc.freeze()
        if state.scheduler is not None:
            state.scheduler.start()
        yield
        if state.scheduler is not None:
            state.scheduler.stop()
        gc.unfreeze()

    app = FastAPI(title="attnkit", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=explorer.STATIC), name="static")
    for family in (operations, completions, embeddings, tokenize, explorer, tasks):  # tasks last: /v1/{method}
        app.include_router(family.router(state))

    app.add_middleware(Guard, state=state, api_key=settings.api_key)

    @app.exception_handler(APIError)
    async def api_error(_request: Request, error: APIError):
        return error.response()

    @app.exception_handler(RequestValidationError)  # a query or path parameter (bodies are read in `bodies.py`)
    async def parameter_error(_request: Request, error: RequestValidationError):
        first = error.errors()[0]
        name = str(first["loc"][-1])
        return APIError(422, f"{name}: {first['msg']}", param=name).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, error: StarletteHTTPException):
        message = "no such endpoint" if error.status_code == 404 else str(error.detail)
        return APIError(error.status_code, message, headers=error.headers).response()  # a 405's Allow

    if settings.allowed_origins:  # added after Guard, so outside it: a browser's preflight is answered before the key
        app.add_middleware(CORSMiddleware, allow_origins=list(settings.allowed_origins), allow_methods=["*"],
                           allow_headers=["*"], expose_headers=["X-Request-Id"])
    app.state.scheduler = state.scheduler  # for tests and embedding applications: the batching scheduler (None: no LM)
    app.state.model_lock = state.model_lock  # held while the model runs, by the scheduler and every other endpoint
    app.state.close = state.close  # the server is shutting down: end what runs with a 503 (`serve/server.py`)
    app.state.drain = state.drain  # ... first refuse new requests and let those in flight end (--shutdown-timeout)
    return app


class Guard:
    """Every HTTP request: its id (`X-Request-Id`, echoed or made), the API key, and its log line and counters once its
    answer has ended: a stream when its last event is sent, with the status it ended with (`Answer.stream` leaves it in
    the request's state), 499 for a client that left before the end (or before its body's end); a failure answers 500
    without its traceback (the log keeps it). Plain ASGI, not Starlette's BaseHTTPMiddleware, under which a route never
    sees its client leave (`Request.is_disconnected` stays False), so a request answered whole would run to its end for
    nobody."""

    def __init__(self, app, *, state: ServerState, api_key: str | None) -> None:
        self.app, self.state, self.metrics, self.api_key = app, state, state.metrics, api_key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request = Request(scope)
        given = request.headers.get("x-request-id", "")
        request_id = given if REQUEST_ID.fullmatch(given) else uuid.uuid4().hex  # echoed, or made (as vLLM's)
        status, ended = None, False

        async def sending(message) -> None:
            nonlocal status, ended
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableHeaders(scope=message)["X-Request-Id"] = request_id
            await send(message)
            ended = ended or message["type"] == "http.response.body" and not message.get("more_body", False)

        self.state.in_flight += 1
        try:
            if self.api_key and not _open(request.url.path) and not _authorised(request, self.api_key):
                await APIError(401, "a valid API key is needed: send it as 'Authorization: Bearer KEY'"
                               ).response()(scope, receive, sending)
            elif self.state.draining and request.url.path != "/metrics":
                await APIError(503, SHUTTING_DOWN).response()(scope, receive, sending)
            else:
                await self.app(scope, receive, sending)
        except ClientDisconnect:  # the client left while its body arrived: nobody to answer, nothing failed (499)
            pass
        except Exception:  # a failure answers 500 without its traceback (after its headers: it ends); the log keeps it
            log.exception("%s %s failed", request.method, request.url.path)
            if status is None:
                await APIError(500, "the server failed to answer this request; its log says why"
                               ).response()(scope, receive, sending)
            status = 500
        finally:
            self.state.in_flight -= 1
            if status is None or not ended and status < 400:
                status = 499  # the client left (or the server let go of it) before the answer's end: nginx's code
            elif ended and status != 500:
                status = scope.get("state", {}).get("status", status)  # a stream's own ending
            seconds = time.perf_counter() - start
            self.metrics.record(getattr(scope.get("route"), "path", "unmatched"), status, seconds)
            log.info("%s %s %d %.3fs request %s", request.method, request.url.path, status, seconds, request_id)


def _open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith("/static/")


def _authorised(request: Request, key: str) -> bool:
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {key}".encode())
