"""The HTTP server `attnkit serve` runs: uvicorn's, which on SIGINT or SIGTERM first ends the work in flight (each
request answers 503), as vLLM's and llama.cpp's servers stop, instead of waiting for every reply to run to its end
(up to --timeout) before it lets go of the port."""

from __future__ import annotations

import socket
from collections.abc import Callable

import uvicorn


class Server(uvicorn.Server):
    """uvicorn's server over an app whose work in flight `end_work()` ends (the app's `state.close`,
    `ServerState.close`)."""

    def __init__(self, config: uvicorn.Config, end_work: Callable[[], None]) -> None:
        super().__init__(config)
        self.end_work = end_work

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """End the work in flight (every generation request in flight or queued, and each task request at its next
        turn, answers 503), then uvicorn's shutdown: stop listening, let the answers end, stop the app."""
        self.end_work()
        await super().shutdown(sockets=sockets)
