"""The HTTP transport of every model endpoint the project calls: httpx requests, tenacity retries.

`JSONEndpoint(base_url)` sends JSON to paths under one base URL with one connection pool (safe to
use from many threads), the API key from the environment variable `api_key_env` as a bearer
token when it is set, and a timeout in seconds per request.

A transient failure (the endpoint unreachable, a timeout, HTTP 429 or 5xx) is logged as a warning
and tried again after `backoff`, `2 * backoff`, ... seconds (capped at `max_backoff`), up to
`retries` more times; then `EndpointUnavailable` names the URL, the attempts and the last cause.
Any other status (a 4xx) is the endpoint refusing this request: `EndpointRejected` at once,
neither retried nor an outage.
A reply that is not JSON is an `EndpointError`. All four are RuntimeErrors.

A caller's deadline (`deadline(at)`, a `time.monotonic()` instant) bounds every request made in its
context: each attempt's timeout is at most the time left, a backoff never sleeps past it, and the
reply is read chunk by chunk with the deadline checked between chunks, so an endpoint that stalls or
trickles its reply is cut off when the time runs out. Leaving the request closes its connection, so
the endpoint sees its client go; the caller gets `DeadlinePassed`, never retried. The deadline lives
in a context variable (as a request deadline does in gRPC or Go), so it reaches the endpoint through
the backends in between without a parameter on each; a helper that hands requests to other threads
copies the caller's context into them (`rollout.openai_backend.run_concurrently`).

This module imports nothing of kgreasoner, so every layer may use it.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import httpx
import tenacity

log = logging.getLogger(__name__)
TOO_MANY_REQUESTS = 429


class EndpointError(RuntimeError):
    """An endpoint request that gave no usable reply; `url` is the request's, `status` its HTTP status (None
    when no response came)."""

    def __init__(self, message: str, url: str, status: int | None = None) -> None:
        super().__init__(message)
        self.url = url
        self.status = status


class EndpointRejected(EndpointError):
    """The endpoint answered with a non-transient error status (a 4xx): this request is refused."""


class EndpointUnavailable(EndpointError):
    """Every attempt failed transiently: the endpoint is down, overloaded or too slow."""


class DeadlinePassed(EndpointError):
    """The caller's `deadline` passed before the endpoint replied: the request was abandoned (its
    connection closed), not retried."""


_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("kgreasoner_http_deadline", default=None)


@contextlib.contextmanager
def deadline(at: float | None) -> Iterator[None]:
    """Requests made in this context end by `at` (`time.monotonic()`; None: no limit of its own).

    A deadline set inside another keeps the earlier of the two.
    """
    outer = _DEADLINE.get()
    token = _DEADLINE.set(at if outer is None else outer if at is None else min(at, outer))
    try:
        yield
    finally:
        _DEADLINE.reset(token)


def time_left() -> float | None:
    """Seconds until the current context's deadline (negative once it passed); None without one."""
    at = _DEADLINE.get()
    return None if at is None else at - time.monotonic()


def is_transient(err: BaseException) -> bool:
    """Whether another attempt may succeed: no connection, a timeout, HTTP 429 or 5xx."""
    if isinstance(err, httpx.HTTPStatusError):
        status = err.response.status_code
        return status == TOO_MANY_REQUESTS or status >= 500
    return isinstance(err, httpx.TransportError)


def retry_policy(retries: int, backoff: float, max_backoff: float = 30.0) -> tenacity.Retrying:
    """`retries` further attempts after transient failures, exponential backoff from `backoff` seconds
    (never past the context's `deadline`); the last failure is re-raised as it was."""
    exponential = tenacity.wait_exponential(multiplier=backoff, max=max_backoff)

    def wait(state: tenacity.RetryCallState) -> float:
        left = time_left()
        return exponential(state) if left is None else max(0.0, min(exponential(state), left))

    return tenacity.Retrying(
        stop=tenacity.stop_after_attempt(retries + 1),
        wait=wait,
        retry=tenacity.retry_if_exception(is_transient),
        before_sleep=tenacity.before_sleep_log(log, logging.WARNING),
        reraise=True,
    )


class JSONEndpoint:
    """JSON requests to paths under `base_url`, with retries (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout: float = 120.0,
        retries: int = 2,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
    ) -> None:
        if retries < 0 or backoff < 0 or timeout <= 0:
            raise ValueError(f"retries and backoff must be >= 0 and timeout > 0, got {retries}, {backoff}, {timeout}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        key = os.environ.get(api_key_env) if api_key_env else None
        self._http = httpx.Client(headers={"Authorization": f"Bearer {key}"} if key else None, follow_redirects=True)

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: dict[str, Any]) -> Any:
        return self.request("POST", path, body)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The parsed JSON reply of `method base_url+path` (a JSON `body` when given)."""
        url = self.base_url + path
        try:
            response = retry_policy(self.retries, self.backoff, self.max_backoff)(self._send, method, url, body)
        except httpx.HTTPStatusError as err:
            status = err.response.status_code
            cause = f"HTTP {status}: {err.response.text[:300]}"
            if is_transient(err):
                raise EndpointUnavailable(self._gave_up(url, cause), url, status) from err
            raise EndpointRejected(f"{url} rejected the request: {cause}", url, status) from err
        except httpx.TransportError as err:
            raise EndpointUnavailable(self._gave_up(url, f"{type(err).__name__}: {err}"), url) from err
        try:
            return response.json()
        except ValueError as err:
            raise EndpointError(
                f"{url} replied with something other than JSON: {response.text[:200]!r}", url, response.status_code
            ) from err

    def _send(self, method: str, url: str, body: dict[str, Any] | None) -> httpx.Response:
        at = _DEADLINE.get()
        left = None if at is None else at - time.monotonic()
        if left is not None and left <= 0:
            raise DeadlinePassed(f"{url}: the request's deadline passed before it was sent", url)
        # httpx's timeouts bound each connect and each read, not the whole reply: the deadline is
        # also checked between the reply's chunks, so a reply trickled byte by byte cannot outlast it.
        bounded = left is not None and left < self.timeout
        timeout = self.timeout if left is None else min(self.timeout, left)
        chunks: list[bytes] = []
        try:
            with self._http.stream(method, url, json=body, timeout=timeout) as streamed:
                for chunk in streamed.iter_bytes():
                    chunks.append(chunk)
                    if at is not None and time.monotonic() >= at:
                        raise DeadlinePassed(self._abandoned(url, timeout), url, streamed.status_code)
        except httpx.TimeoutException as err:
            if bounded:  # the deadline, not the endpoint's own timeout, cut this attempt short
                raise DeadlinePassed(self._abandoned(url, timeout), url) from err
            raise
        # The body is already decoded (iter_bytes undoes any content encoding): no headers are carried over.
        response = httpx.Response(streamed.status_code, content=b"".join(chunks), request=streamed.request)
        response.raise_for_status()
        return response

    @staticmethod
    def _abandoned(url: str, seconds: float) -> str:
        return f"{url} gave no reply within the request's deadline ({seconds:.3g} s left when it was sent); abandoned"

    def _gave_up(self, url: str, cause: str) -> str:
        attempts = self.retries + 1
        return f"{url} failed after {attempts} attempt{'s' if attempts > 1 else ''}: {cause}"

    def close(self) -> None:
        self._http.close()
