"""The HTTP service (FastAPI): the server owns the KG tool and resolves every `<search>` itself.

Endpoints:
- `POST /v1/answer` `{question, topic_entities, options}` -> `{answers, trajectory, searches, usage, ...}`.
  `topic_entities` are names/ids (strings) or `{"id", "name"}` objects; `options` may lower
  `max_turns` / `max_new_tokens` and set `temperature`, `top_p`, `top_k`, `seed`.
- `POST /v1/chat/completions`: OpenAI-compatible. The last message must be the user's question;
  topic entities come from a `topic_entities` field, else from the protocol's user-turn layout
  (`protocol.USER_TEMPLATE`: the question, `protocol.TOPIC_MARKER`, then the names). The server
  builds the protocol prompt itself (other messages are not used), runs the whole trajectory with
  its tool, and returns it as the assistant message's content, with the structured answer attached
  as `trajectory`.
  `max_tokens` above the server's limit is lowered to it; `stream`, `n > 1` and fields it does not
  honour (`tools`, `logprobs`, `response_format`, `stop`, ...: `UNHONOURED_CHAT_FIELDS`) are refused.
- `GET /v1/models`, `GET /metrics` (Prometheus text).
- `GET|HEAD /health`: 200 `{"status": "ok", ..., "kg": {"status": "ok"}}` while the KG answers a trivial
  query within `HEALTH_KG_TIMEOUT`; else 503 (with `Retry-After`) and `"status": "degraded"`, the KG's
  `{"status": "unavailable", "error"}` saying why, as every question would get 503 then.

Errors are JSON in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, `param` naming the
field at fault: 400 bad JSON (not UTF-8, or an object naming a key twice, included), an unsupported
option, or both Content-Length and Transfer-Encoding (the connection is closed), 404 unknown model or
path, 408 body not received within `body_timeout` (the connection is closed), 413 body over
`max_body_bytes`, 415 a `charset` other than UTF-8, 422 a field that fails validation (text that is not
valid Unicode included) or a topic entity the KG does not have, 502 the generation backend failed or the
KG endpoint refused a query, 503 queue full or KG unreachable (with `Retry-After`), 504 the request
timeout passed, 500 anything else (logged on the server; the client gets the exception's type, never a
stack trace).
Each request is validated and tokenised on its own, so a bad one fails alone, never its batch.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kgreasoner.kg.base import KGError
from kgreasoner.protocol import TOPIC_MARKER, TOPIC_SEPARATOR, split_user_turn
from kgreasoner.records.schema import DuplicateKeyError, loads_json
from kgreasoner.serving.batching import ServiceBusy
from kgreasoner.serving.config import SEED_RANGE
from kgreasoner.serving.metrics import CONTENT_TYPE, Metrics
from kgreasoner.serving.service import AnswerService
from kgreasoner.serving.validation import AnswerOptions, AnswerRequest, RequestError, check_unicode, kg_failure

logger = logging.getLogger(__name__)

ENDPOINTS = ("/v1/answer", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
WAIT_GRACE = 2.0
"""Seconds past a request's deadline the handler waits for the batch that stopped it."""
RETRY_AFTER_SECONDS = 5
"""Retry-After of every 503: the SPARQL client has already retried for a few seconds by then."""
HEALTH_KG_TIMEOUT = 2.0
"""Seconds `/health` waits for the KG's answer to one trivial query before it reports the KG unavailable."""
MIN_TOP_P = 1e-6
"""Smaller top_p rounds to 0 in float32 and the nucleus then drops every token (NaN probabilities)."""


class TopicIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    id: StrictStr | None = None
    name: StrictStr | None = None


class OptionsIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    max_turns: StrictInt | None = Field(default=None, ge=0)
    max_new_tokens: StrictInt | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, ge=MIN_TOP_P, le=1, allow_inf_nan=False)
    top_k: StrictInt | None = Field(default=None, ge=0)
    seed: StrictInt | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])


class AnswerIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    question: StrictStr
    topic_entities: list[StrictStr | TopicIn] = Field(min_length=1)
    options: OptionsIn = Field(default_factory=OptionsIn)
    id: StrictStr | None = Field(default=None, max_length=200)


class ChatMessageIn(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)
    role: Literal["system", "user", "assistant", "developer"]
    content: StrictStr


UNHONOURED_CHAT_FIELDS = {
    "tools": "the server runs its own KG search tool and returns the whole trajectory",
    "tool_choice": "the server runs its own KG search tool and returns the whole trajectory",
    "functions": "the server runs its own KG search tool and returns the whole trajectory",
    "function_call": "the server runs its own KG search tool and returns the whole trajectory",
    "logprobs": "the trajectory is returned without token log-probabilities",
    "top_logprobs": "the trajectory is returned without token log-probabilities",
    "response_format": "the answer is the protocol's <answer> block, in the trajectory's own layout",
    "stop": "a trajectory stops at </answer>, max_tokens or max_turns",
    "logit_bias": "sampling takes temperature, top_p and seed only",
    "presence_penalty": "sampling takes temperature, top_p and seed only",
    "frequency_penalty": "sampling takes temperature, top_p and seed only",
}
"""Chat fields that would change what a client gets, but that this server does not honour: each is
refused (400, naming it) unless it has its off value, so no client believes it took effect."""
OFF_VALUES: tuple[object, ...] = (None, False, 0, [], {}, {"type": "text"})


class ChatIn(BaseModel):
    """The OpenAI fields this server reads; others are ignored, except `UNHONOURED_CHAT_FIELDS` when set."""

    model_config = ConfigDict(extra="allow", strict=True)
    messages: list[ChatMessageIn] = Field(min_length=1)
    model: StrictStr | None = None
    topic_entities: list[StrictStr | TopicIn] | None = None
    max_tokens: StrictInt | None = Field(default=None, ge=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)
    max_turns: StrictInt | None = Field(default=None, ge=0)
    temperature: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(default=None, ge=MIN_TOP_P, le=1, allow_inf_nan=False)
    seed: StrictInt | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    stream: bool | None = None
    n: StrictInt | None = None


def error_response(
    status: int, message: str, kind: str = "invalid_request_error", param: str | None = None
) -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 503 else None
    return JSONResponse(
        status_code=status,
        headers=headers,
        content={"error": {"message": message, "type": kind, "param": param, "code": status}},
    )


class _Guard:
    """ASGI middleware: refuses bodies over the limit (413) or slower than the body timeout (408), and
    records every response in the metrics."""

    def __init__(self, app: ASGIApp, max_body_bytes: int, body_timeout: float, metrics: Metrics) -> None:
        self.app = app
        self.limit = max_body_bytes
        self.body_timeout = body_timeout
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        endpoint = scope["path"] if scope["path"] in ENDPOINTS else "other"
        status = {"code": 500}

        async def record_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            headers = dict(scope.get("headers") or [])
            if b"content-length" in headers and b"transfer-encoding" in headers:
                # A proxy that frames the body by its length and this server, which reads the chunks, would
                # disagree on where the request ends: what follows the chunks would be answered as a request
                # of its own (smuggled past the proxy). Refused, and the connection closed with what is unread.
                response = error_response(
                    400, "the request has both Content-Length and Transfer-Encoding; send one of them", param="headers"
                )
                response.headers["Connection"] = "close"
                await response(scope, receive, record_send)
                return
            try:
                # One deadline for the whole body: a per-chunk timeout would let a client that
                # trickles a byte at a time hold its connection forever.
                body = await asyncio.wait_for(self._read_limited(scope, receive), self.body_timeout)
            except asyncio.TimeoutError:
                response = error_response(
                    408, f"request body not received within {self.body_timeout:g} s", "request_timeout", "body"
                )
                # The unread rest of the body makes the connection unusable: close it, or the
                # client goes on holding it.
                response.headers["Connection"] = "close"
                await response(scope, receive, record_send)
                return
            if body is None:
                response = error_response(
                    413,
                    f"request body is larger than this server's limit of {self.limit} bytes",
                    "request_too_large",
                    "body",
                )
                response.headers["Connection"] = "close"
                await response(scope, receive, record_send)
                return

            refused = _refused_body(headers, body)
            if refused is not None:
                await refused(scope, receive, record_send)
                return

            async def replay() -> Message:
                nonlocal body
                chunk, body = body, b""
                return {"type": "http.request", "body": chunk, "more_body": False}

            await self.app(scope, replay if scope["method"] in ("POST", "PUT", "PATCH") else receive, record_send)
        finally:
            self.metrics.observe_request(endpoint, status["code"], time.perf_counter() - start)

    async def _read_limited(self, scope: Scope, receive: Receive) -> bytes | None:
        """The whole body, or None when it exceeds the limit (declared or actual)."""
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return b""
        declared = dict(scope.get("headers") or []).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.limit:
            return None
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                break
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        return b"".join(chunks)


def _refused_body(headers: dict[bytes, bytes], body: bytes) -> JSONResponse | None:
    """The error for a JSON body FastAPI would read other than as sent, else None: a `charset` other than UTF-8
    (415; JSON is UTF-8, and FastAPI decodes it so whatever the header says), bytes that are not UTF-8 (which
    FastAPI would decode as UTF-16 or UTF-32 when they look like it), an object naming a key twice (FastAPI
    keeps the last value). Bodies FastAPI does not read as JSON (another media type) are left to it."""
    media, _, parameters = headers.get(b"content-type", b"").decode("latin-1").partition(";")
    media = media.strip().lower()
    if not body or not (media in ("", "application/json") or media.endswith("+json")):
        return None
    for parameter in parameters.split(";"):
        name, _, value = parameter.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            return error_response(
                415,
                f"charset {charset!r} is not supported: a JSON body is UTF-8 (charset=utf-8, or none)",
                param="body",
            )
    try:
        text = body.decode("utf-8-sig")  # a byte-order mark is allowed, as FastAPI allows it
    except UnicodeDecodeError as err:
        return error_response(
            400,
            f"body: not UTF-8 (byte 0x{body[err.start]:02x} at offset {err.start}); a JSON body is UTF-8",
            param="body",
        )
    try:
        loads_json(text)
    except DuplicateKeyError as err:
        return error_response(400, f"body: {err}", param="body")
    except json.JSONDecodeError:
        return error_response(400, "body: not valid JSON", param="body")
    except RecursionError:
        return None  # FastAPI says so itself (400)
    return None


def create_app(service: AnswerService, metrics: Metrics | None = None) -> ASGIApp:
    """The FastAPI app over an open `AnswerService`, behind the body guard (the caller closes the service)."""
    metrics = metrics or Metrics()
    metrics.gauges.setdefault(
        "kgreasoner_queue_depth", ("Requests waiting for a rollout batch.", lambda: service.queue_depth)
    )
    app = FastAPI(title="kgreasoner", version="0.1.0", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.service, app.state.metrics = service, metrics

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, err: RequestValidationError) -> JSONResponse:
        problems = err.errors()
        if any(p.get("type") == "json_invalid" for p in problems):
            return error_response(400, "body: not valid JSON", param="body")
        parts, first = [], None
        for problem in problems[:5]:
            where = ".".join(str(x) for x in problem.get("loc", ())[1:]) or "body"
            first = first or where
            parts.append(f"{where}: {problem.get('msg', 'invalid')}")
        return error_response(422, "; ".join(parts), param=first)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, err: RequestError) -> JSONResponse:
        return error_response(err.status, err.message, err.kind, err.param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, err: StarletteHTTPException) -> JSONResponse:
        if err.status_code == 400:  # FastAPI could not parse the body (e.g. JSON nested past Python's recursion limit)
            return error_response(400, f"body: could not be parsed as JSON ({err.detail})", param="body")
        messages = {
            404: f"no such endpoint: {request.method} {request.url.path}",
            405: f"method {request.method} is not allowed on {request.url.path}",
        }
        return error_response(err.status_code, messages.get(err.status_code, str(err.detail)), "invalid_request_error")

    @app.exception_handler(Exception)
    async def _crash(request: Request, err: Exception) -> JSONResponse:
        logger.exception("unhandled error on %s", request.url.path)
        return error_response(500, f"internal error ({type(err).__name__}); see the server log", "server_error")

    @app.api_route("/health", methods=["GET", "HEAD"])
    async def health() -> JSONResponse:
        # The KG is asked once, briefly: a service whose KG endpoint is down answers every question 503,
        # and a load balancer reading 200 here would go on sending it questions.
        try:
            await run_in_threadpool(service.kg.check, HEALTH_KG_TIMEOUT)
            kg: dict[str, Any] = {"status": "ok"}
        except KGError as err:
            kg = {"status": "unavailable", "error": str(err)}
        up = kg["status"] == "ok"
        return JSONResponse(
            {
                "status": "ok" if up else "degraded",
                "model": service.model_name,
                "backend": service.kind,
                "queue_depth": service.queue_depth,
                "kg": kg,
            },
            status_code=200 if up else 503,
            headers=None if up else {"Retry-After": str(RETRY_AFTER_SECONDS)},
        )

    @app.get("/metrics")
    async def prometheus() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": service.model_name, "object": "model", "owned_by": "kgreasoner"}]}

    @app.post("/v1/answer")
    async def answer(body: AnswerIn) -> JSONResponse:
        options = AnswerOptions(**body.options.model_dump())
        topics = [t if isinstance(t, str) else t.model_dump(exclude_none=True) for t in body.topic_entities]
        prepared = await run_in_threadpool(service.prepare, body.question, topics, options, body.id)
        record = await _run(service, metrics, prepared)
        return JSONResponse(record)

    @app.post("/v1/chat/completions")
    async def chat(body: ChatIn) -> JSONResponse:
        if body.stream:
            raise RequestError("stream", "streaming is not supported: the trajectory is returned whole", status=400)
        if body.n not in (None, 1):
            raise RequestError("n", "only n=1 is supported", status=400)
        for name, value in (body.model_extra or {}).items():
            if name in UNHONOURED_CHAT_FIELDS and value not in OFF_VALUES:
                raise RequestError(name, f"not supported: {UNHONOURED_CHAT_FIELDS[name]}; leave it out", status=400)
        if body.model is not None and body.model != service.model_name:
            raise RequestError(
                "model",
                f"model {body.model!r} is not served here; this server serves {service.model_name!r}",
                status=404,
                kind="model_not_found",
            )
        last = body.messages[-1]
        if last.role != "user":
            raise RequestError(
                f"messages[{len(body.messages) - 1}].role",
                f"the last message must be the user's question, got role {last.role!r}",
            )
        cap = service.config.rollout.max_new_tokens
        asked = body.max_completion_tokens or body.max_tokens
        options = AnswerOptions(
            max_turns=body.max_turns,
            max_new_tokens=None if asked is None else min(asked, cap),
            temperature=body.temperature,
            top_p=body.top_p,
            seed=body.seed,
        )
        content = f"messages[{len(body.messages) - 1}].content"
        if body.topic_entities is not None:
            question = last.content
            topics: Any = [t if isinstance(t, str) else t.model_dump(exclude_none=True) for t in body.topic_entities]
        else:
            question, topics = await run_in_threadpool(_split_user_turn, service, last.content, content)
        try:
            prepared = await run_in_threadpool(service.prepare, question, topics, options)
        except RequestError as err:  # name the chat body's own field, not the /v1/answer one
            param = content if err.param == "question" else (err.param or "").removeprefix("options.") or None
            if param == err.param:
                raise
            raise RequestError(param, str(err).removeprefix(f"{err.param}: "), err.status, err.kind) from err
        record = await _run(service, metrics, prepared)
        usage = record["usage"]
        prompt, completion = usage.get("prompt_tokens") or 0, usage.get("completion_tokens") or 0
        finish = "length" if record["finish_reason"] in ("max_tokens", "max_turns") else "stop"
        return JSONResponse(
            {
                "id": f"chatcmpl-{prepared.id}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": service.model_name,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": record["trajectory"]},
                        "finish_reason": finish,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
                "trajectory": record,
            }
        )

    return _Guard(app, service.config.max_body_bytes, service.config.body_timeout, metrics)


async def _run(service: AnswerService, metrics: Metrics, prepared: AnswerRequest) -> dict:
    """Queue a prepared request, wait for its batch, and turn failures into RequestErrors."""
    try:
        future = service.submit(prepared)
    except ServiceBusy as err:
        raise RequestError(None, str(err), status=503, kind="overloaded") from err
    deadline = prepared.deadline
    timeout = None if deadline is None else max(0.0, deadline - time.monotonic()) + WAIT_GRACE
    try:
        answered = await asyncio.wait_for(asyncio.wrap_future(future), timeout)
    except asyncio.TimeoutError as err:
        raise RequestError(
            None,
            f"no answer within the request timeout of {service.config.request_timeout:g} s",
            status=504,
            kind="timeout",
        ) from err
    except ServiceBusy as err:
        raise RequestError(None, str(err), status=503, kind="overloaded") from err
    except Exception as err:  # the batch crashed; the worker logged the trace
        raise RequestError(
            None, f"generation failed ({type(err).__name__}: {str(err)[:200]})", status=500, kind="server_error"
        ) from err
    if answered.refused is not None:
        raise answered.refused
    if answered.timed_out:
        raise RequestError(
            None,
            f"no answer within the request timeout of {service.config.request_timeout:g} s",
            status=504,
            kind="timeout",
        )
    if answered.backend_error is not None:
        raise RequestError(
            None, f"the generation backend failed: {answered.backend_error[:300]}", status=502, kind="backend_error"
        )
    record = service.record(answered)
    metrics.observe_answer(record)
    return record


def _split_user_turn(service: AnswerService, content: str, param: str) -> tuple[str, list[str]]:
    """A user turn in the protocol's layout -> (question, names); a whole name containing ', ' is kept whole."""
    split = split_user_turn(content)
    if split is None:
        raise RequestError(
            "topic_entities",
            f"name the topic entities: send a 'topic_entities' list, or end the "
            f"user message with '{TOPIC_MARKER} NAME[{TOPIC_SEPARATOR}NAME]'",
        )
    question, tail = split
    if TOPIC_SEPARATOR not in tail:
        return question, [tail]
    check_unicode(param, tail)
    try:
        whole = service.kg.resolve(tail)
    except KGError as err:
        raise kg_failure(param, err) from err
    if whole:
        return question, [tail]
    return question, [name.strip() for name in tail.split(TOPIC_SEPARATOR) if name.strip()]
