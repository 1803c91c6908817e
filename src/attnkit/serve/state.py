"""What every router of `attnkit serve` shares: the run served, its settings, the batching scheduler, the model's
lock and the counters; and the model's use by one request at a time, off the event loop, within the timeout."""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from attnkit.errors import AttnkitError
from attnkit.generate.captured_step import CapturedDecoding
from attnkit.generate.pipeline import Pipeline
from attnkit.layers.prefix_cache import PrefixCache
from attnkit.models import family_of
from attnkit.run_settings import draft_tokens_flag
from attnkit.serve.batching import Scheduler
from attnkit.serve.bodies import parse_body, read_body
from attnkit.serve.errors import SHUTTING_DOWN, APIError
from attnkit.serve.explorer import Explorer
from attnkit.serve.metrics import Metrics
from attnkit.serve.schemas import Body
from attnkit.serve.settings import ServeSettings
from attnkit.serve.speculative import SpeculativeScheduler

log = logging.getLogger("attnkit.serve")
DRAIN_POLL_S = 0.05  # how often a stop that lets the requests in flight end looks whether they have (`drain`)
TEXTS_PER_TURN = 16  # texts the model reads in one turn of a task endpoint, between checks of the deadline


@dataclass
class ServerState:
    """The served run and what the routers share. `scheduler` is None for a run that does not generate text."""

    pipeline: Pipeline
    settings: ServeSettings
    model_id: str  # the name answers carry: the first --served-model-name, else the run directory's name
    names: tuple[str, ...]  # every name a request may ask for (--served-model-name), model_id first
    run_name: str  # the run directory's name
    created: int  # when the server started (seconds since the epoch), as /v1/models gives it
    scheduler: Scheduler | None
    explorer: Explorer
    metrics: Metrics
    model_lock: threading.Lock  # held while the model runs: one model call at a time
    closing: threading.Event = field(default_factory=threading.Event)  # set: the server is shutting down (`close`)
    draining: bool = False  # the server is stopping: new requests are refused (503), those in flight run on (`drain`)
    in_flight: int = 0  # HTTP requests begun and not yet answered to their end (`app.Guard`, on the event loop)

    @classmethod
    def of(cls, pipeline: Pipeline, run_dir: Path, settings: ServeSettings) -> ServerState:
        scheduler, metrics = None, Metrics()
        if "generate" in pipeline.methods:
            prefix_cache = PrefixCache(max_bytes=settings.prefix_cache_mib << 20) if settings.prefix_cache else None
            scheduler = Scheduler(pipeline.model, context_len=pipeline.config.max_seq_len, pad_id=pipeline.pad_id,
                                  max_rows=settings.max_batch, max_waiting=settings.max_queue,
                                  decoding=pipeline.decoding, prefix_cache=prefix_cache,
                                  writable=pipeline.tokenizer.vocab_size,
                                  speculative=speculative_rows(pipeline, settings))
            for part in scheduler.parts:
                part.observe = metrics.observe  # each generation request's times, when it ends
            build_steps(pipeline.decoding, settings.max_batch)
        experiments = Path(settings.experiments) if settings.experiments else Path.cwd() / "docs" / "experiments"
        names = settings.served_model_name or (run_dir.resolve().name,)
        return cls(pipeline=pipeline, settings=settings, model_id=names[0], names=tuple(names),
                   run_name=run_dir.resolve().name, created=int(time.time()),
                   scheduler=scheduler,
                   explorer=Explorer(pipeline, run_dir, watch=Path(settings.watch or run_dir), experiments=experiments,
                                     sae=Path(settings.sae) if settings.sae else None),
                   metrics=metrics,
                   model_lock=scheduler.lock if scheduler is not None else threading.Lock())

    async def drain(self, seconds: float, hurried: Callable[[], bool]) -> None:
        """The server is stopping: refuse new requests (503, `app.Guard`) and wait up to `seconds` for those in flight
        to end, or until `hurried()` (a second signal); `close` ends the rest after. Runs on the event loop."""
        self.draining = True
        deadline = time.monotonic() + seconds
        if self.in_flight:
            log.info("stopping: letting %d requests in flight end (%g s at most)", self.in_flight, seconds)
        while self.in_flight and time.monotonic() < deadline and not hurried():
            await asyncio.sleep(DRAIN_POLL_S)

    def close(self) -> None:
        """The server is shutting down: end the generation in flight and queued (`Scheduler.close`), and the task
        endpoints' requests at their next turn (`in_turns`), each with a 503."""
        self.closing.set()
        if self.scheduler is not None:
            self.scheduler.close()

    @property
    def embeds(self) -> bool:
        """Whether the run reads a whole text at once and decodes nothing (an encoder): its last states embed it."""
        return family_of(self.pipeline.config).state is None

    def endpoints(self) -> list[str]:
        """The run's endpoints under /v1/, as the task registry says."""
        served = [f"/v1/{method}" for method in self.pipeline.methods if method != "generate"]
        if "generate" in self.pipeline.methods:
            served = ["/v1/completions", "/v1/chat/completions"]
        if self.embeds:
            served.append("/v1/embeddings")
        return served

    def check_model(self, name: str | None) -> None:
        """404 for a model name other than the names the model is served under (None: the one served)."""
        if name is not None and name not in self.names:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {self.model_id!r}"
                           + (f" (also named {', '.join(map(repr, self.names[1:]))})" if len(self.names) > 1 else ""),
                           param="model", code="model_not_found")

    async def body(self, request: Request, schema: type[Body]):
        """The request's body as `schema`: read within --max-body, then parsed and checked off the event loop."""
        raw = await read_body(request, self.settings.max_body, self.settings.timeout, self.closing)
        return await run_in_threadpool(parse_body, schema, raw, request.headers.get("content-type", ""))

    async def held(self, call: Callable):
        """`call()` on a worker thread, holding the model (`held`), within the server's timeout."""
        return await run_in_threadpool(held, self.model_lock, time.monotonic() + self.settings.timeout, call)

    async def in_turns(self, texts: list[str], call: Callable[[list[str], int], list]) -> list:
        """`call(part, start)` over `texts` on a worker thread, a turn at a time (`in_turns`)."""
        return await run_in_threadpool(in_turns, self.model_lock, self.settings.timeout, texts, call, self.closing)


async def written(content: Any) -> JSONResponse:
    """`content` as the JSON response FastAPI writes for a route's return value (`jsonable_encoder`, then
    `JSONResponse`), written on a worker thread: a large answer (an embedding per text, the explorer's attention
    maps) takes FastAPI's encoder tenths of a second, which on the event loop would hold every other request."""
    return await run_in_threadpool(lambda: JSONResponse(jsonable_encoder(content)))


def speculative_rows(pipeline: Pipeline, settings: ServeSettings) -> SpeculativeScheduler | None:
    """The scheduler of the rows that decode with --draft (`serve/speculative.py`), or None without one. The draft is
    loaded and checked before the server answers (`Pipeline.check_draft`): InputError, one line, for a draft of
    another vocabulary, family or device."""
    if settings.draft is None:
        return None
    draft_tokens = draft_tokens_flag(settings.draft, settings.draft_tokens)
    draft = pipeline.check_draft(settings.draft)
    log.info("speculative decoding with the draft %s, %d tokens a round", settings.draft, draft_tokens)
    return SpeculativeScheduler(pipeline.model, draft.model, draft_tokens=draft_tokens,
                                context_len=min(pipeline.config.max_seq_len, draft.config.max_seq_len),
                                pad_id=pipeline.pad_id, max_rows=settings.max_batch, max_waiting=settings.max_queue,
                                writable=pipeline.tokenizer.vocab_size)


def build_steps(decoding, max_rows: int) -> None:
    """Build every form of a captured decoding step (`--compile aot`) the scheduler will run, one row and several,
    before the server answers, saying each as it goes: built at the first batched step instead, its capture (tens of
    seconds) would hold every request in flight. Other decodings build nothing here."""
    if not isinstance(decoding, CapturedDecoding):
        return
    forms = [(1, "one row"), (2, "several rows")][:2 if max_rows > 1 else 1]
    for done, (rows, name) in enumerate(forms, 1):
        log.info("decoding step %d of %d (%s): building", done, len(forms), name)
        started = time.perf_counter()
        decoding.prepare(rows)
        log.info("decoding step %d of %d (%s): ready in %.1f s", done, len(forms), name, time.perf_counter() - started)


def held(lock: threading.Lock, deadline: float, call: Callable):
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


def in_turns(lock: threading.Lock, timeout: float, texts: list[str], call: Callable[[list[str], int], list],
             closing: threading.Event) -> list:
    """`call(part, start)` over `texts`, TEXTS_PER_TURN at a time, each turn holding the model (`held`); 504 once
    `timeout` seconds have passed, 503 once `closing` is set (the server is shutting down), both checked before each
    turn, so that no request holds the model past its timeout, or the server's stop, by more than one turn. A refusal
    names `input`, and in a later turn says where its count of texts starts."""
    deadline = time.monotonic() + timeout
    results = []
    for start in range(0, len(texts), TEXTS_PER_TURN):
        if closing.is_set():
            raise APIError(503, SHUTTING_DOWN)
        if time.monotonic() > deadline:
            raise APIError(504, f"the request took longer than the server's timeout ({timeout:g} s); "
                           f"{start} of its {len(texts)} texts were read: send fewer texts per request")
        try:
            results += held(lock, deadline, functools.partial(call, texts[start:start + TEXTS_PER_TURN], start))
        except APIError as error:
            if error.status == 400:
                error.param = error.param or "input"  # the texts' field
                if start:
                    error.message += f" (texts counted from input[{start}])"
            raise
    return results
