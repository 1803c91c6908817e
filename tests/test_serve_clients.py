"""Clients that misbehave on the wire: one that leaves while its body is still arriving is counted as gone (499),
not as the server's failure (500 with a traceback in the log); one that sends its body too slowly is answered 408
within the server's timeout instead of holding a connection open for as long as it likes; one that leaves a stream
midway frees its rows."""

from __future__ import annotations

import logging
import socket
import time

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
httpx = pytest.importorskip("httpx")

from serve_helpers import running_server, tiny_run  # noqa: E402

TIMEOUT = 2.0  # the server's --timeout in these tests, seconds


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tiny_run(tmp_path_factory.mktemp("clients")), timeout=TIMEOUT) as (url, app):
        yield url


def _half_sent(url: str) -> socket.socket:
    """A connection that has sent its headers (a body of 100,000 bytes declared) and the body's first bytes."""
    port = int(url.rsplit(":", 1)[1])
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 100000\r\n\r\n{\"prompt\": ")
    return sock


def _reply(sock: socket.socket) -> str:
    """The server's whole answer on `sock`: read until the socket closes or the body its Content-Length declares has
    come (uvicorn writes the headers and the body apart, so one recv may hold only the headers)."""
    data = b""
    while True:
        head, sep, body = data.partition(b"\r\n\r\n")
        if sep:
            length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), None)
            if length is not None and len(body) >= length:
                return data.decode()
        chunk = sock.recv(4096)
        if not chunk:
            return data.decode()
        data += chunk


def _count(url: str, status: int) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(f'attnkit_requests_total{{path="/v1/completions",status="{status}"}}'):
            return float(line.split()[1])
    return 0.0


def test_a_client_leaving_mid_body_is_499_not_a_failure(server, caplog):
    before = _count(server, 499), _count(server, 500)
    with caplog.at_level(logging.INFO, logger="attnkit.serve"):
        sock = _half_sent(server)
        time.sleep(0.3)  # the server is reading the body
        sock.close()
        deadline = time.monotonic() + 30
        while _count(server, 499) == before[0] and _count(server, 500) == before[1] and time.monotonic() < deadline:
            time.sleep(0.05)
    assert (_count(server, 499), _count(server, 500)) == (before[0] + 1, before[1])
    assert not [record for record in caplog.records if record.exc_info], "a client leaving logged a traceback"


def test_a_body_sent_too_slowly_is_refused_within_the_timeout(server):
    sock = _half_sent(server)
    with sock:
        started = time.monotonic()
        reply = _reply(sock)  # the server answers while the body is still missing
        waited = time.monotonic() - started
    assert reply.startswith("HTTP/1.1 408"), reply[:200]
    assert "--timeout" in reply and "body" in reply
    assert waited < 25  # not held until the socket's own timeout (30 s)


def test_a_body_sent_slowly_but_steadily_for_longer_than_the_timeout_is_read_whole(server):
    body = b'{"prompt": "the cat", "max_tokens": 2' + b" " * 60 + b"}"
    port = int(server.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % len(body))
        try:
            for start in range(0, len(body), 16):  # 7 pieces, TIMEOUT / 4 apart: the whole takes 1.75 TIMEOUT
                sock.sendall(body[start:start + 16])
                time.sleep(TIMEOUT / 4)
        except OSError:  # the server answered before the body was whole, and closed the connection
            pass
        reply = _reply(sock)
    assert reply.startswith("HTTP/1.1 200"), reply[:300]


def test_the_408_closes_the_connection_the_slow_body_held(server):
    sock = _half_sent(server)
    with sock:
        reply = _reply(sock)
        sock.settimeout(3 * TIMEOUT)  # the 408 has come: the server's next word is the end of the connection
        try:
            rest = sock.recv(1)
        except TimeoutError:
            rest = None
    assert reply.startswith("HTTP/1.1 408"), reply[:200]
    assert "connection: close" in reply.lower(), reply[:200]
    assert rest == b"", "the server kept the connection open after its 408, waiting for the rest of the body"


def test_a_query_parameter_of_the_wrong_type_is_answered_in_the_apis_error_shape(server):
    reply = httpx.get(f"{server}/api/training", params={"since": "x"}, timeout=30)
    assert reply.status_code == 422
    error = reply.json()["error"]
    assert error["param"] == "since" and "since" in error["message"] and "integer" in error["message"]


def test_a_streaming_client_that_leaves_mid_stream_frees_its_rows(tmp_path):
    """A client that reads a few chunks of a stream of two choices and closes the connection: its rows leave the
    batch ("cancelled") long before its 900 tokens a choice were written, and the server answers the next request."""
    run = tiny_run(tmp_path, max_seq_len=1024)
    body = {"prompt": "ab", "max_tokens": 900, "n": 2, "stream": True, "ignore_eos": True}
    with running_server(run, timeout=60, max_tokens=1000) as (url, app):
        scheduler = app.state.scheduler
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as raw:
            assert raw.status_code == 200
            lines = raw.iter_lines()
            assert sum(next(lines).startswith("data: {") for _ in range(4)) >= 2
        deadline = time.monotonic() + 30
        while scheduler.running_rows and time.monotonic() < deadline:
            time.sleep(0.02)
        assert scheduler.running_rows == 0 and scheduler.tokens < 2 * 900
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": "ab", "max_tokens": 3, "ignore_eos": True},
                            timeout=30)
        assert answer.status_code == 200 and answer.json()["usage"]["completion_tokens"] == 3
