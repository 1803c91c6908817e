"""The HTTP server `attnkit serve` runs: uvicorn's, which on SIGINT or SIGTERM first ends the work in flight (each
request answers 503), as vLLM's and llama.cpp's servers stop, instead of waiting for every reply to run to its end
(up to --timeout) before it lets go of the port. With --shutdown-timeout SECONDS (vLLM's drain), it first refuses new
requests (503) and lets those in flight run on for that long at most, or until a second signal; then it ends the
rest. A client that still holds its connection (half a body sent, an answer not read) is waited for SHUTDOWN_GRACE_S
at most; then the server stops, and `exit_status` says how: 0 after SIGTERM, a stop a service manager asked for
(uvicorn would raise the signal again once stopped, so that the process died of it: status 143), 130 after SIGINT, an
interrupted command, as a shell (and uvicorn) reports it, so that `attnkit serve ... && next` does not go on, and 1
where the server never started.

A request's head (its request line and headers) must arrive whole within the server's --timeout of the connection
opening or the last answer ending (`HeadDeadline`, as nginx's client_header_timeout): uvicorn waits on a head sent in
part for as long as the client likes, so that clients sending a byte now and then (a slow-loris attack) each held a
connection, and a file descriptor, for good."""

from __future__ import annotations

import asyncio
import functools
import signal
import socket
from collections.abc import Awaitable, Callable
from types import FrameType

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

SHUTDOWN_GRACE_S = 5.0  # seconds a stop waits for connections to end once the work in flight has been ended (the
# uvicorn.Config's timeout_graceful_shutdown that `serve` gives)


class Server(uvicorn.Server):
    """uvicorn's server over an app whose work in flight `end_work()` ends (the app's `state.close`,
    `ServerState.close`); with `drain_seconds`, `drain(drain_seconds, hurried)` first refuses new requests and lets
    those in flight end for that long at most (`ServerState.drain`, --shutdown-timeout), or until a second signal."""

    def __init__(self, config: uvicorn.Config, end_work: Callable[[], None], *,
                 drain: Callable[[float, Callable[[], bool]], Awaitable[None]] | None = None,
                 drain_seconds: float = 0.0) -> None:
        super().__init__(config)
        self.end_work, self.drain, self.drain_seconds = end_work, drain, drain_seconds
        self.stopped_by: int | None = None  # the first signal that told the server to stop
        self.signals = 0  # signals to stop received: a second one ends the work in flight at once

    @property
    def exit_status(self) -> int:
        """The process's exit status once `run` has returned: 1 where the server never started (the app's startup
        failed), 130 (128 + SIGINT) after SIGINT, else 0."""
        if not self.started:
            return 1
        return 128 + signal.SIGINT if self.stopped_by == signal.SIGINT else 0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """A signal to stop: stop (a second SIGINT, at once), as uvicorn does, without raising the signal again after
        the stop."""
        if self.stopped_by is None:
            self.stopped_by = sig
        self.signals += 1
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """With drain seconds, let the work in flight end first (new requests answer 503); then end what is left (every
        generation request in flight or queued, and each task request at its next turn, answers 503), then uvicorn's
        shutdown: stop listening, let the answers end (SHUTDOWN_GRACE_S at most), stop the app."""
        if self.drain is not None and self.drain_seconds > 0:
            await self.drain(self.drain_seconds, lambda: self.signals > 1)
        self.end_work()
        await super().shutdown(sockets=sockets)


class HeadDeadline(H11Protocol):
    """uvicorn's HTTP/1.1 connection, closed where a request's head has not arrived whole `head_seconds` after the
    connection opened or the last answer ended (after an answer, a client that sends nothing is also closed by
    uvicorn's keep-alive timeout, 5 s, whichever comes first). The head's bytes coming one by one do not restart the
    clock.

    uvicorn has no public setting for this, so the class hooks H11Protocol's own methods (`connection_made`,
    `on_response_complete`, which each request's cycle calls when its answer ends, `connection_lost`) and reads its
    `loop`, `transport` and `cycle.response_complete`: the same in uvicorn 0.29 (the oldest the serve extra allows)
    and 0.54. Given as `http=`, it is the protocol where httptools is installed too (uvicorn's "auto" would take
    httptools' parser, which has no such hooks). tests/test_reliability_serve.py fails where uvicorn renames them
    (the hooks checked by name, the clock's start, restart and close each held through a served connection)."""

    def __init__(self, *args, head_seconds: float, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.head_seconds = head_seconds
        self.head_clock: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_clock()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._start_head_clock()  # the next request's head

    def connection_lost(self, exc: Exception | None) -> None:
        if self.head_clock is not None:
            self.head_clock.cancel()
        super().connection_lost(exc)

    def _start_head_clock(self) -> None:
        if self.head_clock is not None:
            self.head_clock.cancel()
        self.head_clock = self.loop.call_later(self.head_seconds, self._head_late)

    def _head_late(self) -> None:
        """Close the connection unless a request's head came since the clock started: its answer is then under way (a
        cycle not complete). A complete cycle is the last answer's, after which no head came whole."""
        if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
            self.transport.close()


def head_deadline(seconds: float) -> Callable[..., HeadDeadline]:
    """The protocol `uvicorn.Config(http=...)` takes for connections whose request heads have `seconds` to arrive."""
    return functools.partial(HeadDeadline, head_seconds=seconds)
