"""The HTTP server `attnkit serve` runs: uvicorn's, which on SIGINT or SIGTERM first ends the work in flight (each
request answers 503), as vLLM's and llama.cpp's servers stop, instead of waiting for every reply to run to its end
(up to --timeout) before it lets go of the port. A client that still holds its connection (half a body sent, an
answer not read) is waited for SHUTDOWN_GRACE_S at most; then the server stops and the process exits 0, a stop it
was asked for (uvicorn would raise the signal again once stopped, so that the process died of it: status 143)."""

from __future__ import annotations

import signal
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

SHUTDOWN_GRACE_S = 5.0  # seconds a stop waits for connections to end once the work in flight has been ended


class Server(uvicorn.Server):
    """uvicorn's server over an app whose work in flight `end_work()` ends (the app's `state.close`,
    `ServerState.close`)."""

    def __init__(self, config: uvicorn.Config, end_work: Callable[[], None]) -> None:
        config.timeout_graceful_shutdown = SHUTDOWN_GRACE_S
        super().__init__(config)
        self.end_work = end_work

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """A signal to stop: stop (a second SIGINT, at once), as uvicorn does, without raising the signal again after
        the stop."""
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True
        else:
            self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """End the work in flight (every generation request in flight or queued, and each task request at its next
        turn, answers 503), then uvicorn's shutdown: stop listening, let the answers end (SHUTDOWN_GRACE_S at most),
        stop the app."""
        self.end_work()
        await super().shutdown(sockets=sockets)
