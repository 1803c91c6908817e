"""`attnkit serve` against clients that hold connections open without finishing a request (a slow-loris attack):
a request's head (request line and headers) sent in part, or trickled a byte at a time, is closed once --timeout
has passed since the connection opened or its last answer ended, so such clients cannot each keep a connection,
and a file descriptor, for good; requests sent whole are answered meanwhile."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
httpx = pytest.importorskip("httpx")

from serve_helpers import free_port, running_server, tiny_run, wait_until_up  # noqa: E402

TIMEOUT = 2  # the server's --timeout, seconds
BOUND = 60  # seconds the server may take to start, a request to end, a connection to be closed


def _closed(sock: socket.socket) -> bool:
    """Whether the server closed `sock` (it reads the end of the stream, or a reset)."""
    sock.setblocking(False)
    try:
        return sock.recv(4096) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def _slow_heads_are_closed(port: int) -> None:
    """Three connections that never finish a request's head: each is closed within BOUND, and a whole request sent
    meanwhile is answered."""
    url = f"http://127.0.0.1:{port}"
    clients: list[socket.socket] = []
    try:
        clients = [socket.create_connection(("127.0.0.1", port), timeout=BOUND) for _ in range(3)]
        clients[0].sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")  # a head sent in part, then nothing
        clients[1].sendall(b"POST /v1/completions HTTP/1.1\r\nX-Pad: ")  # a header trickled a byte at a time
        # clients[2] sends nothing at all
        answer = httpx.post(f"{url}/v1/completions", json={"prompt": "the cat", "max_tokens": 3}, timeout=BOUND)
        assert answer.status_code == 200, answer.text  # a whole request is answered beside them
        deadline = time.monotonic() + BOUND
        while not all(_closed(client) for client in clients) and time.monotonic() < deadline:
            try:
                clients[1].send(b"a")
            except OSError:  # closed by the server: the next _closed reads it
                pass
            time.sleep(0.2)
        assert [_closed(client) for client in clients] == [True, True, True], "a part-sent head held its connection"
    finally:
        for client in clients:
            client.close()


@pytest.fixture(scope="module")
def port(tmp_path_factory):
    """A server in a thread whose connections are kept as `attnkit serve` keeps them (`running_server`), --timeout
    TIMEOUT."""
    with running_server(tiny_run(tmp_path_factory.mktemp("slow-heads")), timeout=TIMEOUT) as (url, _app):
        yield int(url.rsplit(":", 1)[1])


def test_the_head_deadline_closes_request_heads_sent_in_part_or_trickled(port):
    _slow_heads_are_closed(port)


def test_the_head_deadline_hooks_uvicorns_own_methods():
    """HeadDeadline overrides H11Protocol's methods (uvicorn has no public setting for a head's deadline): each must be
    uvicorn's own, else the override is a method nobody calls and the deadline is gone without an error."""
    import asyncio

    from uvicorn.protocols.http.h11_impl import H11Protocol

    from attnkit.serve.server import HeadDeadline

    hooked = {name for name in vars(HeadDeadline) if not name.startswith("_") and callable(vars(HeadDeadline)[name])}
    assert hooked == {"connection_made", "on_response_complete", "connection_lost"}
    for name in hooked:
        assert name in vars(H11Protocol) and getattr(H11Protocol, name) is not getattr(asyncio.Protocol, name, None)


def test_the_head_clock_restarts_when_an_answer_ends(port):
    """The clock started when the connection opened is started again as each answer ends (uvicorn's
    on_response_complete): a head sent within --timeout of the last answer is answered, though more than --timeout
    after the connection opened."""
    head, body = _request(b'{"prompt": "a", "max_tokens": 2}')
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND) as client:
        time.sleep(0.9 * TIMEOUT)  # the first head comes just in time
        client.sendall(head + body)
        assert _answers(client, 1) == [b"HTTP/1.1 200 OK"]
        time.sleep(0.3 * TIMEOUT)  # past the first clock's end, well within the restarted one
        client.sendall(head + body)
        assert _answers(client, 1) == [b"HTTP/1.1 200 OK"]


def _answers(sock: socket.socket, count: int) -> list[bytes]:
    """The status lines of the next `count` answers on `sock` (each body read whole, by its Content-Length)."""
    reader = sock.makefile("rb")
    statuses = []
    for _ in range(count):
        statuses.append(reader.readline().rstrip())
        length = 0
        while (line := reader.readline()) not in (b"\r\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        reader.read(length)
    return statuses


def _request(body: bytes) -> tuple[bytes, bytes]:
    head = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body))
    return head, body


def test_a_body_sent_slowly_after_a_whole_head_is_answered(port):
    """The deadline is the head's: a body that comes in pieces, each pause within --timeout, over more than --timeout
    in all, is read whole and answered."""
    head, body = _request(b'{"prompt": "the cat", "max_tokens": 3, "seed": 0}')
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND) as client:
        client.sendall(head)
        pieces = [body[i:i + 10] for i in range(0, len(body), 10)]
        for piece in pieces:
            time.sleep(1.5 * TIMEOUT / len(pieces) + 0.1)  # in all past the deadline, each pause within --timeout
            client.sendall(piece)
        assert _answers(client, 1) == [b"HTTP/1.1 200 OK"]


def test_pipelined_requests_are_each_answered_in_turn(port):
    head, body = _request(b'{"prompt": "a", "max_tokens": 2}')
    with socket.create_connection(("127.0.0.1", port), timeout=BOUND) as client:
        client.sendall((head + body) * 3)  # three requests in one write, before any answer
        assert _answers(client, 3) == [b"HTTP/1.1 200 OK"] * 3


def test_a_kept_alive_connection_idle_past_the_deadline_is_replaced_not_failed(port):
    """A client that keeps connections (httpx, under the openai client) and waits longer than --timeout between
    requests: the server closed the idle connection, and the pool opens another for the next request."""
    url = f"http://127.0.0.1:{port}"
    body = {"prompt": "the cat", "max_tokens": 2}
    with httpx.Client(timeout=BOUND, transport=httpx.HTTPTransport(retries=0)) as client:  # no retry hides a failure
        ends = []  # the client's end of each request's connection
        for pause in (0, 2 * TIMEOUT):  # the next head is late: the server has closed the connection (well before,
            # on a loaded machine too: a close racing the next request would be the client's to retry, never done here)
            time.sleep(pause)
            answer = client.post(f"{url}/v1/completions", json=body)
            assert answer.status_code == 200
            ends.append(answer.extensions["network_stream"].get_extra_info("client_addr"))
    assert ends[0] != ends[1], "the idle connection was not closed (uvicorn's keep-alive is 5 s, the deadline 2 s)"


@pytest.mark.slow  # a server process of its own (about 10 s to start); the test above holds the deadline itself
def test_attnkit_serve_closes_request_heads_sent_in_part_after_its_timeout(tmp_path):
    run: Path = tiny_run(tmp_path)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "attnkit", "serve", str(run), "--port", str(port),
                               "--timeout", str(TIMEOUT)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        wait_until_up(server, f"http://127.0.0.1:{port}", BOUND)
        _slow_heads_are_closed(port)
    finally:
        server.send_signal(signal.SIGINT)
        server.communicate(timeout=BOUND)
