"""`attnkit serve` told to stop (SIGINT, Ctrl-C; SIGTERM, as a service manager stops it) while replies are being
generated: it ends them at once, each answering 503 (a stream with its error event and [DONE]), and exits without a
traceback, instead of generating every reply to its end (up to --timeout) first."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
httpx = pytest.importorskip("httpx")

from serve_helpers import free_port, tiny_run, wait_until_up  # noqa: E402

from attnkit.serve.server import SHUTDOWN_GRACE_S  # noqa: E402

TIMEOUT = 60  # seconds the server may take to start, a request to end, the server to exit
LONG = {"prompt": "the cat", "max_tokens": 2000, "ignore_eos": True, "seed": 0}  # seconds of steps on any CPU


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory.mktemp("shutdown"), "decoder", d_model=128, n_layers=4, d_ff=256,
                    max_seq_len=2048)


def _gauge(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=TIMEOUT).text.splitlines():
        if line.startswith(f"attnkit_{name} "):
            return float(line.split()[1])
    raise AssertionError(f"/metrics has no attnkit_{name}")


@pytest.mark.parametrize("sent", [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],
                         ids=["SIGINT", "SIGTERM"])  # one path in uvicorn; the default suite starts one server
def test_a_signal_ends_the_replies_in_flight_with_503_and_the_server_exits_cleanly(run, sent):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen([sys.executable, "-m", "attnkit", "serve", str(run), "--port", str(port),
                               "--max-tokens", "2000"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    answers: dict[str, object] = {}
    try:
        deadline = time.monotonic() + TIMEOUT
        wait_until_up(server, url, TIMEOUT)

        def whole() -> None:
            answers["whole"] = httpx.post(f"{url}/v1/completions", json=LONG, timeout=TIMEOUT)

        def streamed() -> None:
            with httpx.stream("POST", f"{url}/v1/completions", json={**LONG, "stream": True},
                              timeout=TIMEOUT) as response:
                answers["stream"] = [line for line in response.iter_lines() if line]

        clients = [threading.Thread(target=whole), threading.Thread(target=streamed)]
        for client in clients:
            client.start()
        while _gauge(url, "num_requests_running") < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _gauge(url, "num_requests_running") == 2, "the replies did not start"
        server.send_signal(sent)
        for client in clients:
            client.join(TIMEOUT)
        _, log = server.communicate(timeout=TIMEOUT)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    whole, events = answers["whole"], answers["stream"]
    assert whole.status_code == 503 and "shutting down" in whole.json()["error"]["message"]
    errors = [json.loads(line[6:])["error"] for line in events if '"error": {' in line]
    assert [error["message"] for error in errors] == [whole.json()["error"]["message"]]
    assert events[-1] == "data: [DONE]" and len(events) < LONG["max_tokens"]  # ended early, not at max_tokens
    assert "Traceback" not in log and log.count("POST /v1/completions 503") == 2, log
    # SIGTERM: a stop asked for, not a death by the signal (143); SIGINT: an interruption, as a shell reports one
    assert server.returncode == (130 if sent == signal.SIGINT else 0), log


@contextmanager
def _draining(run, monkeypatch, max_tokens: int):
    """A server with --shutdown-timeout TIMEOUT and --max-batch 1 in a thread, its steps slowed to outlast a drain's
    poll, streaming a reply of `max_tokens` and holding a second in its queue when it is told to stop (SIGTERM); yields
    (server, each reply's events, the 503 a request sent after the signal got) once that refusal came, and waits for
    the replies and the server to end after."""
    import uvicorn

    from attnkit.serve import ServeSettings, build_app
    from attnkit.serve.server import Server

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    app = build_app(ServeSettings(run=str(run), port=port, max_tokens=2000, max_batch=1, shutdown_timeout=TIMEOUT))
    server = Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"), app.state.close,
                    drain=app.state.drain, drain_seconds=TIMEOUT)
    scheduler = app.state.scheduler
    step = scheduler.decoding.step
    monkeypatch.setattr(scheduler.decoding, "step", lambda *args: time.sleep(0.01) or step(*args))  # outlasts a poll
    body = {**LONG, "max_tokens": max_tokens, "stream": True, "stream_options": {"include_usage": True}}
    events: list[list[str]] = [[], []]

    def streamed(reply: int) -> None:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=TIMEOUT) as response:
            events[reply].extend(line for line in response.iter_lines() if line)

    serving = threading.Thread(target=server.run, daemon=True)  # no signal handlers off the main thread: handle_exit
    serving.start()
    deadline = time.monotonic() + TIMEOUT
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    clients = [threading.Thread(target=streamed, args=(reply,)) for reply in range(2)]
    for client in clients:
        client.start()
    while (scheduler.running_requests < 1 or scheduler.queue_length < 1) and time.monotonic() < deadline:
        time.sleep(0.01)  # one reply running, the other queued
    server.handle_exit(signal.SIGTERM, None)
    while httpx.get(f"{url}/health", timeout=TIMEOUT).status_code == 200 and time.monotonic() < deadline:
        time.sleep(0.01)  # the server has not begun to stop yet (a request sent now would wait behind the replies)
    refused = httpx.post(f"{url}/v1/completions", json={"prompt": "a", "max_tokens": 2}, timeout=TIMEOUT)
    try:
        yield server, events, refused
    finally:
        for client in clients:
            client.join(TIMEOUT)
        serving.join(TIMEOUT)
        assert not serving.is_alive()


def test_with_a_shutdown_timeout_sigterm_lets_the_replies_in_flight_end_and_refuses_new_ones(run, monkeypatch):
    """vLLM's --shutdown-timeout: a stop ended every reply in flight at once (503); with the option, SIGTERM lets the
    reply in flight, and the one waiting in the queue, run to their ends (every token, [DONE], no error) while a
    request sent after the signal answers 503, and then the server stops, its exit status 0."""
    with _draining(run, monkeypatch, max_tokens=100) as (server, replies, refused):
        assert refused.status_code == 503 and "shutting down" in refused.json()["error"]["message"]
    for events in replies:
        assert not any('"error": {' in line for line in events) and events[-1] == "data: [DONE]", events[-3:]
        assert json.loads(events[-2][6:])["usage"]["completion_tokens"] == 100
    assert server.exit_status == 0


def test_a_second_sigterm_ends_the_drain_and_the_replies_in_flight_with_503(run, monkeypatch):
    """While the server lets the replies in flight end, a second SIGTERM (or Ctrl-C) stops it at once: the reply
    still running, and the one queued, end with the 503 error event and [DONE], short of their tokens, and the server
    exits 0."""
    with _draining(run, monkeypatch, max_tokens=1500) as (server, replies, refused):
        assert refused.status_code == 503
        server.handle_exit(signal.SIGTERM, None)
    for events in replies:
        errors = [json.loads(line[6:])["error"] for line in events if line.startswith('data: {"error"')]
        assert [error["type"] for error in errors] == ["server_error"] and "shutting down" in errors[0]["message"]
        assert events[-1] == "data: [DONE]" and json.loads(events[-2][6:])["usage"]["completion_tokens"] < 1500
    assert server.exit_status == 0


def test_sigterm_with_a_client_that_never_ends_its_body_exits_0_within_the_grace(run):
    """A client that sends half a body and then nothing would hold uvicorn's graceful shutdown until --timeout (or,
    with no timeout, forever); the server waits SHUTDOWN_GRACE_S for it, then lets go and exits 0, the status a
    service manager reads as a clean stop (uvicorn re-raised the signal, so the process died of it: 143)."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "attnkit", "serve", str(run), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_until_up(server, f"http://127.0.0.1:{port}", TIMEOUT)
        with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as stalled:
            stalled.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 1000\r\n\r\n{\"prompt\": ")
            time.sleep(0.3)
            server.send_signal(signal.SIGTERM)
            _, log = server.communicate(timeout=SHUTDOWN_GRACE_S + 20)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    assert server.returncode == 0, log
    assert "Traceback" not in log, log


def _failing_app():
    """An app whose startup (its lifespan) fails."""
    from contextlib import asynccontextmanager

    from fastapi import FastAPI

    @asynccontextmanager
    async def failing(_app):
        raise RuntimeError("the app could not start")
        yield

    app = FastAPI(lifespan=failing)
    app.state.close = lambda: None

    async def drain(_seconds, _hurried) -> None:
        pass

    app.state.drain = drain
    return app


def test_a_server_whose_startup_fails_exits_1(tmp_path, monkeypatch):
    """The app's startup fails: uvicorn never serves, and the command says so with its status."""
    import attnkit.serve as serving

    monkeypatch.setattr(serving, "build_app", lambda settings: _failing_app())
    assert serving.serve(serving.ServeSettings(run=str(tmp_path), port=free_port())) == 1


def test_serve_gives_its_grace_and_the_server_keeps_a_callers(tmp_path, monkeypatch):
    import uvicorn

    import attnkit.serve as serving
    from attnkit.serve import server as server_module

    graces, original = [], server_module.Server

    class Recorded(original):
        def __init__(self, config: uvicorn.Config, end_work, **drain) -> None:
            graces.append(config.timeout_graceful_shutdown)
            super().__init__(config, end_work, **drain)

    monkeypatch.setattr(server_module, "Server", Recorded)
    monkeypatch.setattr(serving, "build_app", lambda settings: _failing_app())
    serving.serve(serving.ServeSettings(run=str(tmp_path), port=free_port()))
    own = original(uvicorn.Config(_failing_app(), timeout_graceful_shutdown=1.5), lambda: None)
    assert graces == [SHUTDOWN_GRACE_S] and own.config.timeout_graceful_shutdown == 1.5
