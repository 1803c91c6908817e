"""The HTTP app of `attnkit serve`: one run behind the OpenAI API's shapes, and the explorer page.

    POST /v1/completions        text completion (stream: server-sent events ending with [DONE])
    POST /v1/chat/completions   chat, the messages rendered by the run's chat template (`serve/chat.py`)
    POST /v1/embeddings         encoder runs: the mean of the last layer's states, normalised (floats or base64)
    POST /v1/{method}           the run's task method, as the task registry says (translate, classify, tag, ...)
    GET  /v1/models[/{id}]      the one model served
    GET  /health, /metrics      liveness, Prometheus text (`serve/metrics.py`)
    GET  /openapi.json          the request bodies' schemas, per endpoint served (`serve/schemas.py`)
    GET  /                      the explorer (`serve/static/`), its numbers under /api/ (`serve/explorer.py`)

Generation runs on the batching scheduler's thread (`serve/batching.py`); the event loop only parses, queues and
streams. Log-probabilities (`logprobs`, `top_logprobs`, `echo`) are the model's own, before sampling reshapes them
(`serve/logprobs.py`); usage counts each prompt once, however many choices (`n`) continue it, as OpenAI does.
Every request body is read with a size limit and parsed here, so each malformed or hostile body gets an
OpenAI-style 4xx (`serve/errors.py`) and no traceback ever leaves the server. A request that fails fails alone.
The other endpoints run the model `TEXTS_PER_TURN` texts at a time, each turn holding the model, within the
server's timeout: a request past it is answered 504 and holds the model no longer than one turn.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import functools
import json
import logging
import re
import struct
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import torch
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from attnkit.checkpoint import TOKENIZER_DIR
from attnkit.errors import AttnkitError
from attnkit.generate.pipeline import Pipeline, TextTracker
from attnkit.generate.sampling import SamplingError, check_sampling
from attnkit.models import family_of
from attnkit.serve.batching import GenerationJob, QueueFull, Scheduler
from attnkit.serve.chat import chat_template
from attnkit.serve.errors import APIError
from attnkit.serve.explorer import Explorer
from attnkit.serve.logprobs import ChoiceScores, Scored, chat_logprobs, completion_logprobs, prompt_scores
from attnkit.serve.metrics import Metrics
from attnkit.serve.schemas import (
    Body,
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    ExploreRequest,
    ModelViewRequest,
    Sampling,
    StepRequest,
    TaskRequest,
    openapi,
)
from attnkit.serve.settings import ServeSettings
from attnkit.serve.structured import Structured

log = logging.getLogger("attnkit.serve")

STATIC = Path(__file__).parent / "static"
RANGE_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal", "too_long", "too_short",
                "string_too_short", "string_too_long", "literal_error"}  # a value of the right type out of range
TOKEN_ID = re.compile(r"[0-9]+")  # a logit_bias key
UNION_MEMBER = re.compile(r"^(str|int|float|bool|constrained-.*|.*\[.*\])$")  # pydantic's name of a union's member
TEXTS_PER_TURN = 16  # texts the model reads in one turn of a task endpoint, between checks of the deadline
DEFAULT_COMPLETION_TOKENS = 16  # max_tokens of a completion that names none (as OpenAI)
RETRY_AFTER_SECONDS = 1
OPEN_PATHS = ("/", "/health")  # served without the API key, with the explorer's files under /static/


def create_app(pipeline: Pipeline, run_dir: str | Path, settings: ServeSettings) -> FastAPI:
    """The app serving `pipeline` (loaded from `run_dir`) as `settings` say; the scheduler starts with the app."""
    run_dir = Path(run_dir)
    model_id = run_dir.resolve().name
    scheduler = None
    if "generate" in pipeline.methods:
        scheduler = Scheduler(pipeline.model, context_len=pipeline.config.max_seq_len, pad_id=pipeline._pad_id,
                              max_rows=settings.max_batch, max_waiting=settings.max_queue, decoding=pipeline.decoding)
    experiments = Path(settings.experiments) if settings.experiments else Path.cwd() / "docs" / "experiments"
    explorer = Explorer(pipeline, run_dir, watch=Path(settings.watch or run_dir), experiments=experiments)
    template = chat_template(run_dir / TOKENIZER_DIR)
    metrics = Metrics()
    model_lock = scheduler.lock if scheduler is not None else threading.Lock()  # one model call at a time
    created = int(time.time())

    @asynccontextmanager
    async def lifespan(_app: FastAPI):
        if scheduler is not None:
            scheduler.start()
        yield
        if scheduler is not None:
            scheduler.stop()

    app = FastAPI(title="attnkit", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    # Every request: the key, the log line, the counters, and no traceback out --------------------------------
    @app.middleware("http")
    async def log_and_guard(request: Request, call_next):
        start = time.perf_counter()
        path = request.url.path
        if settings.api_key and not _open(path) and not _authorised(request, settings.api_key):
            response = APIError(401, "a valid API key is needed: send it as 'Authorization: Bearer KEY'").response()
        else:
            try:
                response = await call_next(request)
            except Exception:  # a failure answers 500 without its traceback; the log keeps it
                log.exception("%s %s failed", request.method, path)
                response = APIError(500, "the server failed to answer this request; its log says why").response()
        seconds = time.perf_counter() - start
        route = request.scope.get("route")
        metrics.record(getattr(route, "path", "unmatched"), response.status_code, seconds)
        log.info("%s %s %d %.3fs", request.method, path, response.status_code, seconds)
        return response

    @app.exception_handler(APIError)
    async def api_error(_request: Request, error: APIError):
        return error.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, error: StarletteHTTPException):
        message = "no such endpoint" if error.status_code == 404 else str(error.detail)
        return APIError(error.status_code, message).response()

    async def body_of(request: Request, schema: type[Body]):
        return _validate(schema, await _read_json(request, settings.max_body))

    def check_model(name: str | None) -> None:
        if name is not None and name != model_id:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {model_id!r}",
                           param="model", code="model_not_found")

    # OpenAI API --------------------------------------------------------------------------------------------------
    def card() -> dict:
        return {"id": model_id, "object": "model", "created": created, "owned_by": "attnkit",
                "family": pipeline.family, "task": pipeline.task.name if pipeline.task else None,
                "endpoints": endpoints()}

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [card()]}

    @app.get("/v1/models/{name}")
    async def model(name: str):
        check_model(name)
        return card()

    # a model that reads a whole text at once and decodes nothing (an encoder): its last states embed the text
    embeds = family_of(pipeline.config).state is None

    def endpoints() -> list[str]:
        served = [f"/v1/{method}" for method in pipeline.methods if method != "generate"]
        if "generate" in pipeline.methods:
            served = ["/v1/completions", "/v1/chat/completions"]
        if embeds:
            served.append("/v1/embeddings")
        return served

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await body_of(request, CompletionRequest)
        check_model(body.model)
        return await generate(request, body, body.prompts, "text_completion", stops=(),
                              max_tokens=body.max_tokens if body.max_tokens is not None else DEFAULT_COMPLETION_TOKENS,
                              logprobs=body.logprobs, echo=body.echo)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await body_of(request, ChatRequest)
        check_model(body.model)
        if body.top_logprobs is not None and not body.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true as well", param="top_logprobs")
        structured = Structured.of(body)  # response_format and tools: a grammar the reply is held to
        try:
            prompt = template.render([m.rendered() for m in body.messages], structured.tools if structured else ())
        except Exception as error:  # a template that fails on these messages (e.g. roles it does not allow)
            raise APIError(400, f"the chat template cannot render these messages: {error}", param="messages") from None
        limit = body.max_completion_tokens if body.max_completion_tokens is not None else body.max_tokens
        return await generate(request, body, [prompt], "chat.completion", stops=template.stops, max_tokens=limit,
                              logprobs=(body.top_logprobs or 0) if body.logprobs else None, structured=structured)

    async def generate(request: Request, body: Sampling, prompts: list[str] | list[list[int]], kind: str, *,
                       stops: tuple[str, ...], max_tokens: int | None, logprobs: int | None = None,
                       echo: bool = False, structured: Structured | None = None):
        if scheduler is None:
            raise APIError(404, f"this run ({pipeline.family}) does not generate text; its endpoints are "
                           f"{', '.join(endpoints()) or 'none'}", code="endpoint_not_served")
        if len(prompts) > settings.max_queue:  # they could never wait in the queue together: no retry succeeds
            raise APIError(400, f"this request has {len(prompts)} prompts; this server queues at most "
                           f"{settings.max_queue} (--max-queue): send at most that many per request", param="prompt")
        jobs = [_Generation(pipeline, p, body, index, stops=stops, max_tokens=max_tokens, settings=settings,
                            chat=kind == "chat.completion", logprobs=logprobs, echo=echo, structured=structured)
                for index, p in enumerate(prompts)]
        if echo and logprobs is not None:  # the prompt's own tokens, scored by one forward pass each
            deadline = time.monotonic() + settings.timeout
            for job in jobs:
                job.prompt_scores = (await run_in_threadpool(_held, model_lock, deadline, lambda job=job: prompt_scores(
                    pipeline.model, job.prompt_ids, logprobs, pipeline.tokenizer))).entries
        for job in jobs:
            try:
                scheduler.submit(job.job)
            except QueueFull:
                _cancel(jobs)
                raise APIError(429, "the server is busy (its queue is full); try again shortly",
                               headers={"Retry-After": str(RETRY_AFTER_SECONDS)}) from None
            except AttnkitError as error:
                _cancel(jobs)
                raise APIError(400, str(error), param="max_tokens" if "max_tokens" in str(error) else "n") from None
        usage = bool(body.stream_options and body.stream_options.include_usage)
        answer = _Answer(kind, model_id, jobs, include_usage=usage, tokenizer=pipeline.tokenizer)
        if body.stream:
            return StreamingResponse(answer.stream(request), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        try:
            return JSONResponse(await answer.whole(request, settings.timeout))
        except ClientGone:
            return Response(status_code=499)  # nobody reads it: the client has gone (nginx's code for this)

    @app.post("/v1/embeddings")
    async def embeddings(request: Request):
        body = await body_of(request, EmbeddingRequest)
        check_model(body.model)
        if not embeds:
            raise APIError(404, f"embeddings come from encoder runs; this run is a {pipeline.family}",
                           code="endpoint_not_served")
        texts = [body.input] if isinstance(body.input, str) else body.input
        rows = await run_in_threadpool(_in_turns, model_lock, settings.timeout, texts,
                                       lambda part, start: embed(pipeline, part, start))
        used = sum(row.tokens for row in rows)
        encode = _base64 if body.encoding_format == "base64" else list
        return {"object": "list", "model": model_id,
                "data": [{"object": "embedding", "index": i, "embedding": encode(row.vector),
                          "truncated": row.truncated} for i, row in enumerate(rows)],
                "usage": {"prompt_tokens": used, "total_tokens": used}}

    @app.post("/v1/{method}")
    async def task_method(method: str, request: Request):
        if method not in pipeline.methods or method == "generate":
            raise APIError(404, f"no endpoint /v1/{method}; this run serves {', '.join(endpoints()) or 'none'}")
        body = await body_of(request, TaskRequest)
        check_model(body.model)
        texts = [body.input] if isinstance(body.input, str) else body.input
        results = await run_in_threadpool(_in_turns, model_lock, settings.timeout, texts,
                                          lambda part, _start: getattr(pipeline, method)(part))
        for index, result in enumerate(results):
            _refuse_cut_off(index, result, pipeline.config.max_seq_len)
        return {"object": "list", "model": model_id, "task": method,
                "data": [{"index": i, "result": _plain(r)} for i, r in enumerate(results)]}

    # Operations --------------------------------------------------------------------------------------------------
    @app.get("/health")
    async def health():
        return {"status": "ok", "model": model_id}

    @app.get("/openapi.json")
    async def openapi_document():
        bodies = {"/v1/completions": CompletionRequest, "/v1/chat/completions": ChatRequest,
                  "/v1/embeddings": EmbeddingRequest}
        bodies = {path: body for path, body in bodies.items() if path in endpoints()}
        bodies |= {path: TaskRequest for path in endpoints() if path not in bodies}
        bodies |= {"/api/analyze": ExploreRequest, "/api/step": StepRequest, "/api/inspect": ExploreRequest,
                   "/api/model": ModelViewRequest}
        most = {"max_tokens": settings.max_tokens, "max_completion_tokens": settings.max_tokens,
                "n": settings.max_batch}
        return openapi(bodies, title=f"attnkit serve: {model_id}", limits=most)

    @app.get("/metrics")
    async def prometheus():
        tokens = scheduler.tokens if scheduler else 0
        text = metrics.text(tokens=tokens, queue_length=scheduler.queue_length if scheduler else 0,
                            batch_size=scheduler.running_rows if scheduler else 0)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    # The explorer ------------------------------------------------------------------------------------------------
    @app.get("/")
    async def page():
        return FileResponse(STATIC / "index.html")

    @app.get("/api/info")
    async def info():
        return {"model": model_id, **explorer.info()}

    @app.post("/api/analyze")
    async def analyze(request: Request):
        body = await body_of(request, ExploreRequest)
        return await run_in_threadpool(_held, model_lock, time.monotonic() + settings.timeout,
                                       lambda: explorer.analyze(body.text, body.target))

    @app.post("/api/step")
    async def step(request: Request):
        body = await body_of(request, StepRequest)
        return await run_in_threadpool(_held, model_lock, time.monotonic() + settings.timeout, lambda: explorer.step(
            body.text, target=body.target, kind=body.kind, layer=body.layer, head=body.head, query=body.query))

    @app.post("/api/model")
    async def whole_model(request: Request):  # each stage with its shape, read at one token (serve/model_view.py)
        body = await body_of(request, ModelViewRequest)
        return await run_in_threadpool(_held, model_lock, time.monotonic() + settings.timeout,
                                       lambda: explorer.whole_model(body.text, body.query))

    @app.post("/api/inspect")
    async def inspect_text(request: Request):  # head importance and the logit lens (serve/inspect_view.py)
        body = await body_of(request, ExploreRequest)
        return await run_in_threadpool(_held, model_lock, time.monotonic() + settings.timeout,
                                       lambda: explorer.inspect(body.text, body.target))

    @app.get("/api/training")
    async def training(since: int = 0):
        return await run_in_threadpool(explorer.training_metrics, max(since, 0))

    @app.get("/api/experiments")
    async def experiments_list():
        return await run_in_threadpool(explorer.experiments)

    @app.get("/api/experiments/{name}/{plot}")
    async def experiment_plot(name: str, plot: str):
        try:
            return FileResponse(await run_in_threadpool(explorer.experiment_plot, name, plot))
        except AttnkitError as error:
            raise APIError(404, str(error)) from None

    app.state.scheduler = scheduler  # for tests and embedding applications: the batching scheduler (None: no LM)
    app.state.model_lock = model_lock  # held while the model runs, by the scheduler and every other endpoint
    return app


def _cancel(generations: list[_Generation]) -> None:
    for generation in generations:
        generation.job.cancel()


def _held(lock: threading.Lock, deadline: float, call: Callable):
    """Run `call` holding the model's lock, waiting for it until `deadline` (time.monotonic()) at most: 504 after.
    The library's own refusals (AttnkitError) become a 400."""
    if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
        raise APIError(504, "the request took longer than the server's timeout waiting for the model")
    try:
        with torch.inference_mode():
            return call()
    except AttnkitError as error:
        raise APIError(400, str(error)) from None
    finally:
        lock.release()


def _in_turns(lock: threading.Lock, timeout: float, texts: list[str], call: Callable[[list[str], int], list]) -> list:
    """`call(part, start)` over `texts`, TEXTS_PER_TURN at a time, each turn holding the model (`_held`); 504 once
    `timeout` seconds have passed, checked before each turn, so that no request holds the model past its timeout by
    more than one turn. A refusal in a later turn says where its count of texts starts."""
    deadline = time.monotonic() + timeout
    results = []
    for start in range(0, len(texts), TEXTS_PER_TURN):
        if time.monotonic() > deadline:
            raise APIError(504, f"the request took longer than the server's timeout ({timeout:g} s); "
                           f"{start} of its {len(texts)} texts were read: send fewer texts per request")
        try:
            results += _held(lock, deadline, functools.partial(call, texts[start:start + TEXTS_PER_TURN], start))
        except APIError as error:
            if error.status == 400 and start:
                error.message += f" (texts counted from input[{start}])"
            raise
    return results


def _refuse_cut_off(index: int, result, context: int) -> None:
    """400 for a result that labels words the model never read (a tagger's words past its context): their labels
    would be made up, not predicted."""
    if isinstance(result, list) and any(getattr(item, "cut_off", False) for item in result):
        cut = sum(item.cut_off for item in result)
        raise APIError(400, f"input[{index}]: {cut} of its {len(result)} words lie past the model's context of "
                       f"{context} tokens and cannot be labelled; split the text into shorter pieces", param="input")


@dataclasses.dataclass(frozen=True)
class Embedded:
    """One text's embedding, the tokens read, and whether the text was cut to the model's context to fit."""

    vector: list[float]
    tokens: int
    truncated: bool


def embed(pipeline: Pipeline, texts: list[str], start: int = 0) -> list[Embedded]:
    """Each text's embedding: the mean of the encoder's last states over its tokens, of length 1. `start`: the
    first text's index in the request (for the log)."""
    from attnkit.data.batching import pad

    rows = [pipeline.classifier_ids(text, index=start + i) for i, text in enumerate(texts)]
    ids, mask = pad([row for row, _ in rows], pipeline._pad_id, device=pipeline.device)  # (B, T)
    hidden = pipeline.model(ids, attention_mask=mask).hidden_states.float()  # (B, T, C)
    weights = mask.unsqueeze(-1).float()
    mean = (hidden * weights).sum(dim=1) / weights.sum(dim=1)  # (B, C)
    vectors = torch.nn.functional.normalize(mean, dim=-1).tolist()
    return [Embedded(vector, len(row), truncated) for vector, (row, truncated) in zip(vectors, rows, strict=True)]


def _base64(vector: list[float]) -> str:
    """A vector as OpenAI sends `encoding_format="base64"`: its little-endian float32 bytes in base64."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _plain(result):
    """A task method's result as JSON: dataclasses as dicts, the rest as it is."""
    if dataclasses.is_dataclass(result):
        return dataclasses.asdict(result)
    return result


def _open(path: str) -> bool:
    return path in OPEN_PATHS or path.startswith("/static/")


def _authorised(request: Request, key: str) -> bool:
    import hmac

    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {key}".encode())


async def _read_json(request: Request, limit: int):
    """The body as JSON: 413 beyond `limit` bytes (counted as it arrives), 400 for bytes that are not UTF-8 JSON."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise APIError(413, f"the request body has {declared} bytes; this server takes at most {limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise APIError(413, f"the request body is larger than {limit} bytes, the most this server takes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise APIError(400, f"the request body is not valid UTF-8 (byte {error.start}); send JSON in UTF-8") from None
    try:
        return json.loads(text)
    except RecursionError:
        raise APIError(400, "the request body nests too deeply to read; send a flat JSON object") from None
    except json.JSONDecodeError as error:
        raise APIError(400, f"the request body is not JSON: {error.msg} at character {error.pos}") from None


def _validate(schema: type[Body], data):
    """The body as `schema`: 422 for a wrong type or a missing field, 400 for a value out of range, a field the
    server does not take, or text that UTF-8 cannot encode; each naming the field."""
    if not isinstance(data, dict):
        raise APIError(422, f"the request body must be a JSON object, not {type(data).__name__}")
    try:
        _check_encodable(data)
        return schema.model_validate(data)
    except ValidationError as error:
        first = _reported(error, data)
        loc = [part for part in first["loc"] if not (isinstance(part, str) and UNION_MEMBER.match(part))]
        field = str(loc[0]) if loc else None  # the top-level field, as OpenAI's param names it
        where = ".".join(str(part) for part in loc)
        if first["type"] == "extra_forbidden":
            if len(loc) > 1:
                raise APIError(400, f"{where}: this server takes no such field there", param=field) from None
            known = ", ".join(schema.model_fields)
            raise APIError(400, schema.not_honoured(field) or f"{where}: this server takes no such field (the fields "
                           f"it takes: {known})", param=field) from None
        status = 400 if first["type"] in RANGE_ERRORS else 422
        raise APIError(status, f"{where}: {first['msg']}", param=field) from None
    except RecursionError:
        raise APIError(400, "the request body nests too deeply to read; send a flat JSON object") from None


def _reported(error: ValidationError, data: dict) -> dict:
    """The error to report: the first, unless it lies in a union (a field's, or a nested one's such as a message's
    content) and the value has the type of another member (a list of five stop strings is "at most 4 items", not
    "should be a valid string"); of several such members, the one whose error lies deepest, the member the value
    came closest to (a list of token-id lists with a negative id: that id, not "should be a valid string")."""
    errors = error.errors(include_url=False)
    first = errors[0]
    loc = first["loc"]
    at = next((i for i, part in enumerate(loc) if i and isinstance(part, str) and UNION_MEMBER.match(part)), None)
    if at is None:
        return first
    value = data
    for part in loc[:at]:  # the union's value in the body
        fits = isinstance(value, dict) and part in value or isinstance(value, list) and isinstance(part, int)
        value = value[part] if fits and (isinstance(value, dict) or part < len(value)) else None
    kind = "list" if isinstance(value, list) else "str" if isinstance(value, str) else None
    same = [e for e in errors if e["loc"][:at] == loc[:at] and len(e["loc"]) > at
            and str(e["loc"][at]).split("[")[0] in (kind, f"constrained-{kind}")]
    return max(same, key=lambda e: len(e["loc"])) if same else first


def _check_encodable(data) -> None:
    """400 naming the first string (or key) that UTF-8 cannot encode: a lone surrogate such as "\\ud800", which
    JSON's escapes can write but no tokenizer reads. Walked without recursion (the body may nest deeply)."""
    stack: list[tuple[tuple, object]] = [((), data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, dict):
            stack += [((*path, key), key) for key in value] + [((*path, k), v) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [((*path, i), v) for i, v in enumerate(value)]
        elif isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as error:
                where = ".".join(str(part) for part in path) or "the body"
                raise APIError(400, f"{where}: the text holds a lone surrogate ({value[error.start]!a}) at "
                               f"character {error.start}, which UTF-8 cannot encode; send valid Unicode text",
                               param=str(path[0]) if path else None) from None


def _prompt_ids(pipeline: Pipeline, prompt: str | list[int], index: int) -> list[int]:
    """A prompt's token ids: a text's as `Pipeline.generate` encodes it, or the ids given (400 for one beyond the
    vocabulary)."""
    if isinstance(prompt, str):
        try:
            return pipeline.prompt_ids(prompt, index=index)
        except AttnkitError as error:
            raise APIError(400, str(error), param="prompt") from None
    vocab = pipeline.config.vocab_size
    beyond = [token for token in prompt if token >= vocab]
    if beyond:
        raise APIError(400, f"prompt {index}: token id {beyond[0]} is beyond the vocabulary of {vocab} tokens; give "
                       f"ids from 0 to {vocab - 1}", param="prompt")
    return list(prompt)


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    """OpenAI's `logit_bias` ({"token id": bias}) with integer keys; 400 for a key that is no token id."""
    if not bias:
        return None
    bad = [key for key in bias if not TOKEN_ID.fullmatch(key)]
    if bad:
        raise APIError(400, f"logit_bias: the key {bad[0]!r} is no token id; give token ids as decimal strings, e.g. "
                       '{"15": -100}', param="logit_bias")
    return {int(key): value for key, value in bias.items()}


class _Generation:
    """One prompt of a request: its job on the scheduler and the events it sends back to the event loop."""

    def __init__(self, pipeline: Pipeline, prompt: str | list[int], body: Sampling, index: int, *,
                 stops: tuple[str, ...], max_tokens: int | None, settings: ServeSettings, chat: bool,
                 logprobs: int | None = None, echo: bool = False, structured: Structured | None = None) -> None:
        """logprobs: the alternatives reported per token (None: no log-probabilities); echo: the prompt's text comes
        before each choice's; structured: the grammar each choice is held to, and how its reply is read."""
        self.loop = asyncio.get_running_loop()
        self.events: asyncio.Queue = asyncio.Queue()
        self.index = index
        ids = _prompt_ids(pipeline, prompt, index)
        context = pipeline.config.max_seq_len
        if len(ids) >= context:
            raise APIError(400, f"the prompt has {len(ids)} tokens; this model's context holds {context}, so the "
                           "prompt must be shorter to leave room for new tokens",
                           param="messages" if chat else "prompt")
        room = min(settings.max_tokens, context - len(ids))
        if max_tokens is None:
            max_tokens = room
        if max_tokens > room:
            raise APIError(400, f"max_tokens={max_tokens} is more than this request may generate: at most {room} "
                           f"(the server's limit is {settings.max_tokens}; the prompt has {len(ids)} tokens of the "
                           f"context's {context})", param="max_tokens")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or ())
        if "" in stop:
            raise APIError(400, "a stop string is empty; give non-empty stop strings", param="stop")
        try:
            sampling, seed = check_sampling(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p,
                                            logit_bias=_logit_bias(body.logit_bias),
                                            vocab_size=pipeline.config.vocab_size, seed=body.seed)
        except SamplingError as error:
            raise APIError(400, str(error), param=error.field) from None
        self.prompt_ids = ids
        self.prompt_tokens = len(ids)
        self.completion_tokens = 0
        self.echo = "" if not echo else prompt if isinstance(prompt, str) else pipeline.tokenizer.decode(ids)
        self.prompt_scores: list[Scored] = []  # the echoed prompt's tokens, scored (echo with logprobs)
        self.scores = [ChoiceScores(pipeline.tokenizer) for _ in range(body.n)] if logprobs is not None else None
        self.streamed = [0] * body.n  # characters of each choice's text sent so far
        self.structured = structured
        streamed = body.stream and not (structured and structured.withheld)  # a tool call comes whole at the end
        self.tracker = TextTracker(pipeline.tokenizer, body.n, [*stop, *stops], self._text if streamed else None)
        eos = pipeline.tokenizer.eos_id
        self.job = GenerationJob(
            prompt=ids, max_new_tokens=max_tokens, sampling=sampling, on_token=self._token, on_finish=self._finish,
            n=body.n, seed=seed, stop_ids=frozenset({eos} if eos is not None else ()),
            deadline=time.monotonic() + settings.timeout, top_logprobs=logprobs,
            on_logprobs=self._scored if logprobs is not None else None,
            grammar=structured.mask(pipeline.tokenizer, body.n) if structured else None)

    # on the scheduler's thread
    def _scored(self, choice: int, token: int, logprob: float, top: list[tuple[int, float]]) -> None:
        self.scores[choice].add(token, logprob, top)

    def _token(self, choice: int, token: int) -> bool:
        self.completion_tokens += 1
        return self.tracker.push(choice, token)

    def _text(self, choice: int, piece: str) -> None:
        self.streamed[choice] += len(piece)
        scored = self.scores[choice].settled(self.streamed[choice]) if self.scores is not None else None
        self.loop.call_soon_threadsafe(self.events.put_nowait, ("text", choice, piece, scored))

    def _finish(self, reasons: list[str]) -> None:
        texts = self.tracker.finish()
        timed_out = time.monotonic() > self.job.deadline
        scored = None if self.scores is None else [
            scores.settled(len(text), final=True) for scores, text in zip(self.scores, texts, strict=True)]
        self.loop.call_soon_threadsafe(self.events.put_nowait, ("finish", texts, reasons, timed_out, scored))


def _failure(job: GenerationJob) -> APIError:
    """The error a failed job answers: 400 with the library's refusal (AttnkitError), else 500 (the log says why)."""
    if isinstance(job.failure, AttnkitError):
        return APIError(400, f"generation refused this request: {job.failure}")
    return APIError(500, "generation failed; the server's log says why")


class ClientGone(Exception):
    """The client closed its connection before the answer was complete."""


async def _next_event(generation: _Generation, request: Request, poll: float = 0.25):
    """The generation's next event. ClientGone once the client has gone away, a "finish" event with every choice
    cancelled once the deadline has passed (both checked every `poll` seconds, whatever the scheduler does)."""
    while True:
        try:
            return await asyncio.wait_for(generation.events.get(), timeout=poll)
        except TimeoutError:
            if await request.is_disconnected():
                raise ClientGone from None
            if time.monotonic() > generation.job.deadline:
                generation.job.cancel()
                return ("finish", [""] * generation.job.n, ["cancelled"] * generation.job.n, True, None)


class _Answer:
    """The response to a request of one or more prompts: whole (JSON) or streamed (server-sent events)."""

    def __init__(self, kind: str, model_id: str, generations: list[_Generation], *, include_usage: bool,
                 tokenizer) -> None:
        self.kind, self.model_id, self.generations = kind, model_id, generations
        self.include_usage, self.tokenizer = include_usage, tokenizer
        self.id = ("chatcmpl-" if kind == "chat.completion" else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())

    def _choice_index(self, generation: _Generation, choice: int) -> int:
        return generation.index * generation.job.n + choice

    def usage(self) -> dict:
        prompt = sum(g.prompt_tokens for g in self.generations)  # once per prompt, as OpenAI counts
        completion = sum(g.completion_tokens for g in self.generations)
        return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

    def cancel(self) -> None:
        for generation in self.generations:
            generation.job.cancel()

    async def whole(self, request: Request, timeout: float) -> dict:
        """Wait for every prompt's end (cancelled when the client goes away); the OpenAI response body."""
        choices = []
        try:
            for generation in self.generations:
                while True:
                    event = await _next_event(generation, request)
                    if event[0] == "finish":
                        break
                _, texts, reasons, timed_out, scored = event
                if "error" in reasons:
                    raise _failure(generation.job)
                if timed_out and "cancelled" in reasons:
                    raise APIError(504, f"the request took longer than the server's timeout ({timeout:g} s)")
                choices += [self._choice(generation, c, text, reason, scored and scored[c]) for c, (text, reason) in
                            enumerate(zip(texts, reasons, strict=True))]
        finally:
            self.cancel()  # anything still running (a client gone, an error) ends at the next step
        return {"id": self.id, "object": self.kind, "created": self.created, "model": self.model_id,
                "choices": choices, "usage": self.usage()}

    def _choice(self, generation: _Generation, choice: int, text: str, reason: str, scored: list[Scored] | None
                ) -> dict:
        index = self._choice_index(generation, choice)
        if self.kind == "chat.completion":
            message, reason = self._message(generation, text, reason)
            return {"index": index, "message": message, "finish_reason": reason,
                    "logprobs": self._logprobs(generation, scored)}
        return {"index": index, "text": generation.echo + text, "finish_reason": reason,
                "logprobs": self._logprobs(generation, scored, echoed=True)}

    @staticmethod
    def _message(generation: _Generation, text: str, reason: str) -> tuple[dict, str]:
        """A chat choice's message and finish reason: a tool call read out of its text (`serve/structured.py`)."""
        if generation.structured is None:
            return {"role": "assistant", "content": text}, reason
        return generation.structured.reply(text, reason)

    def _withheld(self, generation: _Generation, texts: list[str], reasons: list[str]) -> tuple[str | None, list[str]]:
        """For a stream whose replies come whole at their end (tool calls): the chunk with each choice's message (None
        for others), and the finish reasons it gives."""
        if generation.structured is None or not generation.structured.withheld:
            return None, reasons
        deltas, finished = [], []
        for choice, (text, reason) in enumerate(zip(texts, reasons, strict=True)):
            message, reason = self._message(generation, text, reason)
            calls = [{"index": i, **call} for i, call in enumerate(message.get("tool_calls") or [])]
            delta = {"tool_calls": calls} if calls else {"content": message["content"]}
            deltas.append({"index": self._choice_index(generation, choice), "delta": delta, "finish_reason": None,
                           "logprobs": None})
            finished.append(reason)
        return self._chunk(deltas), finished

    def _logprobs(self, generation: _Generation, scored: list[Scored] | None, *, echoed: bool = False) -> dict | None:
        """A choice's `logprobs` object for the tokens `scored` (None when none were asked for); completions' with the
        echoed prompt's tokens first when `echoed`."""
        if generation.scores is None:
            return None
        if self.kind == "chat.completion":
            return chat_logprobs(self.tokenizer, scored)
        entries = [*generation.prompt_scores, *scored] if echoed else scored
        offsets = [0] * len(generation.prompt_scores) if echoed else []
        offsets += [len(generation.echo)] * len(scored)
        return completion_logprobs(self.tokenizer, entries, offsets)

    def _chunk(self, choices: list[dict], usage: dict | None = None) -> str:
        kind = "chat.completion.chunk" if self.kind == "chat.completion" else "text_completion"
        payload = {"id": self.id, "object": kind, "created": self.created, "model": self.model_id,
                   "choices": choices}
        if usage is not None:
            payload["usage"] = usage
        return f"data: {json.dumps(payload)}\n\n"

    def _delta(self, generation: _Generation, choice: int, text: str | None, reason: str | None, *,
               first: bool = False, scored: list[Scored] | None = None) -> dict:
        index = self._choice_index(generation, choice)
        if self.kind == "chat.completion":
            logprobs = None if first else self._logprobs(generation, scored or [])
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text else {})
            return {"index": index, "delta": delta, "finish_reason": reason, "logprobs": logprobs}
        logprobs = self._logprobs(generation, [] if first else scored or [], echoed=first)
        return {"index": index, "text": text or "", "finish_reason": reason, "logprobs": logprobs}

    async def stream(self, request: Request) -> AsyncIterator[str]:
        """Server-sent events: a chunk per settled piece of text, a last chunk per choice with its finish reason,
        the usage when asked for, then [DONE]. A client that goes away cancels the generation."""
        try:
            if self.kind == "chat.completion":  # the role first
                yield self._chunk([self._delta(g, c, None, None, first=True)
                                   for g in self.generations for c in range(g.job.n)])
            elif any(g.echo for g in self.generations):  # the prompt first
                yield self._chunk([self._delta(g, c, g.echo, None, first=True)
                                   for g in self.generations for c in range(g.job.n)])
            for generation in self.generations:
                while True:
                    event = await _next_event(generation, request)
                    if event[0] == "text":
                        _, choice, piece, scored = event
                        yield self._chunk([self._delta(generation, choice, piece, None, scored=scored)])
                        continue
                    _, texts, reasons, timed_out, scored = event
                    whole, reasons = self._withheld(generation, texts, reasons)
                    if whole is not None and "error" not in reasons:
                        yield whole
                    if "error" in reasons:
                        yield f"data: {json.dumps(_failure(generation.job).body())}\n\n"
                    elif timed_out and "cancelled" in reasons:
                        error = APIError(504, "the request took longer than the server's timeout")
                        yield f"data: {json.dumps(error.body())}\n\n"
                    yield self._chunk([self._delta(generation, c, None, reason, scored=scored and scored[c])
                                       for c, reason in enumerate(reasons)])
                    break
            if self.include_usage:
                yield self._chunk([], self.usage())
            yield "data: [DONE]\n\n"
        except ClientGone:
            return
        finally:
            self.cancel()
