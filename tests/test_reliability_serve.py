"""`attnkit serve` against clients that hold connections open without finishing a request (a slow-loris attack):
a request's head (request line and headers) sent in part, or trickled a byte at a time, is closed once --timeout
has passed since its first byte, so such clients cannot each keep a connection, and a file descriptor, for good;
requests sent whole are answered meanwhile."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="attnkit serve needs the serve extra: pip install 'attnkit[serve]'")
httpx = pytest.importorskip("httpx")

from serve_helpers import free_port, tiny_run, wait_until_up  # noqa: E402

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


def test_the_head_deadline_closes_request_heads_sent_in_part_or_trickled(tmp_path):
    import uvicorn

    from attnkit.serve import ServeSettings, build_app
    from attnkit.serve.server import head_deadline

    port = free_port()
    app = build_app(ServeSettings(run=str(tiny_run(tmp_path)), port=port, timeout=TIMEOUT))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           http=head_deadline(TIMEOUT)))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + BOUND
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
            time.sleep(0.05)
        _slow_heads_are_closed(port)
    finally:
        server.should_exit = True
        thread.join(timeout=BOUND)


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
