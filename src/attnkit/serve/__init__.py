"""`attnkit serve`: one run over HTTP in the OpenAI API's shapes, with continuous batching, and the explorer page.

    settings.py   ServeSettings: the command's flags
    app.py        the FastAPI app: endpoints, body limits, errors, logs, metrics
    batching.py   continuous batching over the KV cache (a request joins and leaves between steps)
    schemas.py    the request bodies;  errors.py  OpenAI-style error JSON;  chat.py  chat templates
    metrics.py    Prometheus text;  explorer.py  the explorer's numbers;  static/  its page (HTML, JS, CSS)

FastAPI and uvicorn come with the `serve` extra (`pip install attnkit[serve]`); `serve(settings)` needs them,
this package's other modules import without them where they can.
"""

from __future__ import annotations

import logging
import os

from attnkit.errors import InputError
from attnkit.serve.settings import API_KEY_ENV, LOCAL_HOSTS, ServeSettings

__all__ = ["ServeSettings", "build_app", "serve"]

log = logging.getLogger(__name__)


def _with_key(settings: ServeSettings) -> ServeSettings:
    """The settings with the API key from the environment when none was given; InputError when a host other than
    this machine's loopback is asked for without a key."""
    from dataclasses import replace

    key = settings.api_key or os.environ.get(API_KEY_ENV) or None
    if settings.host not in LOCAL_HOSTS and not key:
        raise InputError(f"--host {settings.host} opens the server beyond this machine: give --api-key KEY (or set "
                         f"{API_KEY_ENV}), or keep the default --host 127.0.0.1")
    for name in ("max_batch", "max_queue", "max_tokens", "max_body"):
        if getattr(settings, name) < 1:
            raise InputError(f"--{name.replace('_', '-')} must be at least 1")
    if settings.timeout <= 0:
        raise InputError("--timeout must be a positive number of seconds")
    return replace(settings, api_key=key)


def build_app(settings: ServeSettings):
    """Load the run and build its app (`serve/app.py`), without starting a server."""
    try:
        from attnkit.serve.app import create_app
    except ImportError as error:
        raise InputError(f"attnkit serve needs FastAPI and uvicorn: pip install 'attnkit[serve]' ({error})") from None
    from attnkit.generate import load

    settings = _with_key(settings)
    pipeline = load(settings.run, device=settings.device, dtype=settings.dtype)
    if settings.explain and pipeline.plan is not None:
        log.info("%s", pipeline.plan.explain())
    return create_app(pipeline, settings.run, settings)


def serve(settings: ServeSettings) -> int:
    """Serve the run until interrupted (Ctrl-C)."""
    settings = _with_key(settings)
    try:
        import uvicorn
    except ImportError:
        raise InputError("attnkit serve needs FastAPI and uvicorn: pip install 'attnkit[serve]'") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    app = build_app(settings)
    log.info("serving %s at http://%s:%d/ (explorer at /, API under /v1/)", settings.run, settings.host, settings.port)
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning")
    return 0
