"""A deadline on a request's headers, which uvicorn does not have.

uvicorn's `timeout_keep_alive` runs only while a connection is idle between requests and is
cancelled by the first byte of the next one, and ASGI middleware sees a request only once its
headers are complete; so a client that sends one header line a second holds its connection (and
a slot of the server) as long as it likes. `header_timeout_protocol` wraps uvicorn's HTTP protocol
class (h11 or httptools, whichever uvicorn would pick): the clock starts when a connection opens,
or at the first byte of a later request on it, and stops when the request's headers are parsed
(the protocol starts a new request cycle then). Past the deadline the client gets a bare 408 and
the connection is closed (after a short linger, so the 408 is not lost to a reset). The body has its
own deadline (`ServeConfig.body_timeout`, in the app).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

logger = logging.getLogger(__name__)

TIMEOUT_RESPONSE = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
LINGER_SECONDS = 1.0
"""How long a timed-out connection is kept half-open after the 408: closing at once, with the client's
next header line in flight, would make the kernel answer it with a reset that discards the 408."""


def header_timeout_protocol(timeout: float, base: type | None = None) -> type:
    """A subclass of `base` (default: uvicorn's automatic choice) that closes a connection whose request
    headers take longer than `timeout` seconds; give it to `uvicorn.Config(http=...)`."""
    if base is None:
        from uvicorn.protocols.http.auto import AutoHTTPProtocol

        base = AutoHTTPProtocol

    class HeaderTimeoutProtocol(base):  # type: ignore[valid-type, misc]
        header_timeout = timeout

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._header_timer: asyncio.TimerHandle | None = None
            self._waiting_cycle: Any = None
            self._timed_out = False
            self._linger: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def data_received(self, data: bytes) -> None:
            if self._timed_out:
                return  # the 408 is sent: what the client still sends is dropped
            if self._header_timer is None and (self.cycle is None or self.cycle.response_complete):
                self._arm()  # the first byte of the next request on a kept-alive connection
            super().data_received(data)
            if self._header_timer is not None and self.cycle is not self._waiting_cycle:
                self._disarm()  # the headers are parsed: the protocol started a request cycle

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._linger is not None:
                self._linger.cancel()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._waiting_cycle = self.cycle
            self._header_timer = self.loop.call_later(self.header_timeout, self._headers_too_slow)

        def _disarm(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_too_slow(self) -> None:
            self._header_timer = None
            if self.transport.is_closing():
                return
            logger.warning(
                "closing a connection from %s: request headers not received within %g s",
                f"{self.client[0]}:{self.client[1]}" if self.client else "unknown client",
                self.header_timeout,
            )
            self.transport.write(TIMEOUT_RESPONSE)
            self._timed_out = True
            if self.transport.can_write_eof():
                self.transport.write_eof()  # the client reads the 408, then the end of the stream
                self._linger = self.loop.call_later(LINGER_SECONDS, self.transport.close)
            else:
                self.transport.close()

    HeaderTimeoutProtocol.__name__ = HeaderTimeoutProtocol.__qualname__ = f"HeaderTimeout{base.__name__}"
    return HeaderTimeoutProtocol
