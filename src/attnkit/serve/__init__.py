"""`attnkit serve`: one run over HTTP in the OpenAI API's shapes, with continuous batching, and the explorer page.

    settings.py   ServeSettings: the command's flags
    app.py        the FastAPI app: the API key, logs and counters, with the routers of routes/ (one per endpoint
                  family: completions and chat, embeddings, tokenize, tasks, explorer, operations) over state.py
    state.py      what the routers share (the run, settings, scheduler, model lock), model calls off the loop
    bodies.py     request bodies read within --max-body and checked;  schemas.py  their models
    generation.py one prompt's job on the scheduler;  answer.py  the response, whole or streamed
    batching.py   continuous batching over the KV cache (a request joins and leaves between steps);  waiting.py
                  the requests waiting to join, taking turns
    speculative.py with --draft: the rows that decode with the draft, a round after each of batching's steps
    listen.py     the port and host checked and bound before the run loads
    server.py     uvicorn's server, which ends the work in flight (503) as soon as it is told to stop, and closes
                  a connection whose request head comes too slowly
    errors.py     OpenAI-style error JSON;  chat.py  chat templates;  structured.py  response_format, tools, guided_*
    logprobs.py   log-probabilities in the API's shapes (logprobs, top_logprobs, echo)
    metrics.py    Prometheus text;  explorer.py  the explorer's numbers;  static/  its page (HTML, JS, CSS)
    model_view.py, inspect_view.py, sae_view.py  the explorer's whole-model, inspect and SAE panels

FastAPI and uvicorn come with the `serve` extra (`pip install attnkit[serve]`); `serve(settings)` needs them,
this package's other modules import without them where they can.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from attnkit.errors import InputError
from attnkit.run_settings import draft_tokens_flag
from attnkit.serve.listen import bind, check_port, is_local, url
from attnkit.serve.settings import API_KEY_ENV, ServeSettings

__all__ = ["ServeSettings", "build_app", "serve"]

log = logging.getLogger(__name__)


def _checked(settings: ServeSettings) -> ServeSettings:
    """The settings with the API key from the environment when none was given; InputError for a port that is no
    TCP port, a host that is no address, a host other than this machine's loopback asked for without a key, a
    limit below 1, or --draft-tokens without --draft."""
    from dataclasses import replace

    check_port(settings.port)
    key = settings.api_key or os.environ.get(API_KEY_ENV) or None
    if not is_local(settings.host) and not key:
        raise InputError(f"--host {settings.host} opens the server beyond this machine: give --api-key KEY (or set "
                         f"{API_KEY_ENV}), or keep the default --host 127.0.0.1")
    for name in ("max_batch", "max_queue", "max_tokens", "max_body"):
        if getattr(settings, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1")
    if settings.prefix_cache_mib < 0:
        raise InputError("--prefix-cache-mib must be at least 0 (or turn the cache off: --no-prefix-cache)")
    if settings.timeout <= 0:
        raise InputError("--timeout must be a positive number of seconds")
    draft_tokens_flag(settings.draft, settings.draft_tokens)
    if settings.shutdown_timeout < 0:
        raise InputError("--shutdown-timeout must be 0 (end the requests in flight at once) or a positive number of "
                         "seconds to let them finish")
    return replace(settings, api_key=key)


SERVE_EXTRA = ("fastapi", "uvicorn", "pydantic")  # the modules `pip install 'attnkit[serve]'` brings


@contextmanager
def _serve_extra() -> Iterator[None]:
    """An ImportError of a module of the serve extra (`ImportError.name`) as an InputError naming the install; any
    other (a fault in attnkit's own modules, a broken dependency of theirs) goes through as it is."""
    try:
        yield
    except ImportError as error:
        if (error.name or "").partition(".")[0] not in SERVE_EXTRA:
            raise
        raise InputError(f"attnkit serve needs FastAPI and uvicorn: pip install 'attnkit[serve]' ({error})") from None


def build_app(settings: ServeSettings):
    """Load the run and build its app (`serve/app.py`), without starting a server."""
    with _serve_extra():
        from attnkit.serve.app import create_app
    from attnkit.generate import load

    settings = _checked(settings)
    pipeline = load(settings.run, **settings.load_options())
    if settings.explain and pipeline.plan is not None:
        log.info("%s", pipeline.plan.explain())
    return create_app(pipeline, settings.run, settings)


def serve(settings: ServeSettings) -> int:
    """Serve the run until interrupted (Ctrl-C) or stopped; the exit status (`Server.exit_status`): 0 after SIGTERM,
    130 after SIGINT, 1 where the server never started. The port is bound before the run loads (`serve/listen.py`)."""
    settings = _checked(settings)
    with _serve_extra():
        import uvicorn

        from attnkit.serve.server import SHUTDOWN_GRACE_S, Server, head_deadline
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    with bind(settings.host, settings.port) as sock:
        app = build_app(settings)
        log.info("serving %s at %s (explorer at /, API under /v1/)", settings.run, url(sock))
        config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
                                http=head_deadline(settings.timeout))
        server = Server(config, app.state.close, drain=app.state.drain, drain_seconds=settings.shutdown_timeout)
        try:
            server.run(sockets=[sock])
        except SystemExit:  # uvicorn's own exit where the app's startup failed (its log says why)
            if server.started:
                raise
    return server.exit_status
