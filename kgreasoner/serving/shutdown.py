"""`StoppingServer`: uvicorn, stopping the answer service before it waits for open requests.

On SIGTERM or Ctrl-C uvicorn stops listening, then waits until every open request is answered. A
request waiting on a generation server that stalls would hold that wait until its deadline (two
minutes by default), and every request queued behind it longer still. `AnswerService.stop` runs
first: queued requests, and those waiting on a generation server, are answered 503 at once (their
upstream calls are left to end at their deadlines, in daemon threads the process does not wait
for); a model in this process finishes the batch it is running.
"""

from __future__ import annotations

import asyncio
import socket

import uvicorn

from kgreasoner.serving.service import AnswerService


class StoppingServer(uvicorn.Server):
    """A `uvicorn.Server` that calls `service.stop()` when its shutdown begins."""

    def __init__(self, config: uvicorn.Config, service: AnswerService) -> None:
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await asyncio.to_thread(self.service.stop)  # a local model's batch may take a while: not on the loop
        await super().shutdown(sockets)
