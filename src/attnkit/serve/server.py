"""The HTTP server `attnkit serve` runs: uvicorn's, which on SIGINT or SIGTERM first ends the generation in flight
(each request answers 503), as vLLM's and llama.cpp's servers stop, instead of waiting for every reply to run to its
end (up to --timeout) before it lets go of the port."""

from __future__ import annotations

import socket

import uvicorn

from attnkit.serve.batching import Scheduler


class Server(uvicorn.Server):
    """uvicorn's server over an app whose generation runs on `scheduler` (None: a run that does not generate)."""

    def __init__(self, config: uvicorn.Config, scheduler: Scheduler | None) -> None:
        super().__init__(config)
        self.scheduler = scheduler

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """Close the scheduler (every request in flight or queued ends with a 503, `Scheduler.close`), then uvicorn's
        shutdown: stop listening, let the answers end, stop the app."""
        if self.scheduler is not None:
            self.scheduler.close()
        await super().shutdown(sockets=sockets)
