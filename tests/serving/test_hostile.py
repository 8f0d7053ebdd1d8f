"""Hostile and careless clients against the live `kgreasoner serve`: each bad request fails alone, with a 4xx."""

from __future__ import annotations

import concurrent.futures
import json
import socket
import time
from urllib.parse import urlparse

import httpx
import pytest

from .conftest import SERVE_CONFIG
from .test_http import _body, _questions


def _post(url: str, body: dict, timeout: float = 60) -> httpx.Response:
    """POST JSON as curl would send it: a lone surrogate is a `\\ud800` escape (httpx cannot encode one)."""
    return httpx.post(
        url, content=json.dumps(body).encode("ascii"), timeout=timeout, headers={"content-type": "application/json"}
    )


def _error(reply: httpx.Response, status: int) -> dict:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    return reply.json()["error"]


def test_a_lone_surrogate_fails_alone_and_its_batch_succeeds(server, dataset):
    examples = _questions(dataset, 8)
    bad = {"question": "\ud800", "topic_entities": [examples[0].topic_entities[0].name]}
    bodies = [_body(e) for e in examples[:4]] + [bad] + [_body(e) for e in examples[4:]]
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        replies = list(pool.map(lambda b: _post(f"{server}/v1/answer", b, timeout=120), bodies))
    error = _error(replies[4], 422)
    assert error == {
        "message": "question: is not valid Unicode: a lone surrogate U+D800 at position 0",
        "type": "invalid_request_error",
        "param": "question",
        "code": 422,
    }
    valid = replies[:4] + replies[5:]
    assert [r.status_code for r in valid] == [200] * 8, [r.text for r in valid if r.status_code != 200]
    assert max(r.json()["usage"]["batch_size"] for r in valid) > 1


@pytest.mark.parametrize(
    "where, body, param, message",
    [
        (
            "topic",
            {"question": "q?", "topic_entities": ["a\udfffb"]},
            "topic_entities[0].name",
            "topic_entities[0].name: is not valid Unicode: a lone surrogate U+DFFF at position 1",
        ),
        (
            "topic id",
            {"question": "q?", "topic_entities": [{"id": "\ud83d"}]},
            "topic_entities[0].id",
            "topic_entities[0].id: is not valid Unicode: a lone surrogate U+D83D at position 0",
        ),
    ],
)
def test_lone_surrogates_in_topics_are_refused_naming_the_field(server, where, body, param, message):
    error = _error(_post(f"{server}/v1/answer", body), 422)
    assert (error["param"], error["message"]) == (param, message), where


def test_chat_content_with_a_lone_surrogate_is_refused(server):
    body = {"messages": [{"role": "user", "content": "who? Topic Entity: A\ud800, B"}]}
    error = _error(_post(f"{server}/v1/chat/completions", body), 422)
    assert error["param"] == "messages[0].content"
    assert error["message"] == "messages[0].content: is not valid Unicode: a lone surrogate U+D800 at position 1"


SAMPLING_CASES = [
    ({"top_p": 1e-300}, "options.top_p", "options.top_p: Input should be greater than or equal to 0.000001"),
    ({"top_p": float("nan")}, "options.top_p", "options.top_p: Input should be a finite number"),
    ({"temperature": float("inf")}, "options.temperature", "options.temperature: Input should be a finite number"),
    ({"seed": 2**64}, "options.seed", "options.seed: Input should be less than or equal to 9223372036854775807"),
    ({"seed": 2**63}, "options.seed", "options.seed: Input should be less than or equal to 9223372036854775807"),
    (
        {"seed": -(2**63) - 1},
        "options.seed",
        "options.seed: Input should be greater than or equal to -9223372036854775808",
    ),
]


@pytest.mark.parametrize("options, param, message", SAMPLING_CASES)
def test_out_of_range_sampling_options_get_422(server, dataset, options, param, message):
    [example] = _questions(dataset, 1)
    reply = _post(f"{server}/v1/answer", {**_body(example), "options": options})
    error = _error(reply, 422)
    assert (error["param"], error["message"]) == (param, message)
    chat = {
        "messages": [{"role": "user", "content": example.question}],
        "topic_entities": [{"id": example.topic_entities[0].id}],
        **options,
    }
    error = _error(_post(f"{server}/v1/chat/completions", chat), 422)
    assert (error["param"], error["message"]) == (param.removeprefix("options."), message.removeprefix("options."))


def test_extreme_but_valid_sampling_options_answer(server, dataset):
    [example] = _questions(dataset, 1)
    for options in (
        {"temperature": 1e-300, "seed": 1},
        {"temperature": 1.0, "top_p": 1e-6, "seed": 2**63 - 1},
        {"temperature": 5e-324, "seed": -(2**63)},
    ):
        reply = _post(f"{server}/v1/answer", {**_body(example), "options": options})
        assert reply.status_code == 200, (options, reply.text)
        assert reply.json()["trajectory"].startswith("<think>")


def test_head_health(server):
    reply = httpx.head(f"{server}/health", timeout=10)
    assert reply.status_code == 200 and reply.content == b""
    assert reply.headers["content-type"] == "application/json"


def test_a_client_trickling_its_body_gets_408_and_loses_its_connection(server):
    address = urlparse(server)
    limit = SERVE_CONFIG["body_timeout"]
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/answer HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
        )
        start, received = time.monotonic(), b""
        sock.settimeout(0.25)
        while time.monotonic() - start < limit + 10:
            try:
                sock.sendall(b" ")  # one byte every 0.25 s: each chunk arrives well within any per-read timeout
            except OSError:  # the server closed the connection
                break
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:  # our next byte met the closed socket: what came before it counts
                break
            if not chunk:
                break
            received += chunk
        elapsed = time.monotonic() - start
    assert elapsed >= limit  # and the 408 below came before the loop's own bound of limit + 10 s
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), received
    assert body.endswith(
        b'{"error":{"message":"request body not received within 2 s","type":"request_timeout",'
        b'"param":"body","code":408}}'
    )
    # The server is fine and serves the next client.
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200


def _exchange(server: str, raw: bytes, wait: float = 20) -> bytes:
    """Send `raw` on one connection and read what comes back until the server closes it (or `wait` passes)."""
    address = urlparse(server)
    received = b""
    with socket.create_connection((address.hostname, address.port), timeout=wait) as sock:
        sock.sendall(raw)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except (TimeoutError, ConnectionResetError):
                break
            if not chunk:
                break
            received += chunk
    return received


def test_a_body_framed_by_both_content_length_and_chunks_is_refused_and_the_request_behind_it_is_not_answered(
    server, dataset
):
    """The smuggling shape: a proxy that frames by Content-Length and a server that reads the chunks disagree on
    where the request ends, so the bytes after the chunks' end would be answered as a second request."""
    [example] = _questions(dataset, 1)
    body = json.dumps({**_body(example), "options": {"max_turns": 0}}).encode()
    smuggled = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n"
    chunks = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body) + smuggled
    head = (
        b"POST /v1/answer HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\ntransfer-encoding: chunked\r\n\r\n" % len(chunks)
    )
    received = _exchange(server, head + chunks)
    assert received.count(b"HTTP/1.1 ") == 1, received  # one answer: the smuggled request got none
    status, _, rest = received.partition(b"\r\n")
    assert status == b"HTTP/1.1 400 Bad Request", received
    headers, _, reply = rest.partition(b"\r\n\r\n")
    assert b"connection: close" in headers.lower()
    assert json.loads(reply)["error"] == {
        "message": "the request has both Content-Length and Transfer-Encoding; send one of them",
        "type": "invalid_request_error",
        "param": "headers",
        "code": 400,
    }
    assert httpx.get(f"{server}/health", timeout=10).status_code == 200


@pytest.mark.parametrize(
    ("content_type", "encoding", "status", "message"),
    [
        (
            "application/json; charset=latin-1",
            "utf-8",
            415,
            "charset 'latin-1' is not supported: a JSON body is UTF-8 (charset=utf-8, or none)",
        ),
        (
            'application/json; charset="UTF-16"',
            "utf-16",
            415,
            "charset 'utf-16' is not supported: a JSON body is UTF-8 (charset=utf-8, or none)",
        ),
        ("application/json; charset=utf-8", "latin-1", 400, "body: not UTF-8 (byte 0xfc at offset "),
        # what FastAPI alone would detect as UTF-16 and read: with a byte-order mark, and without one
        ("application/json", "utf-16", 400, "body: not UTF-8 (byte 0xff at offset 0); a JSON body is UTF-8"),
        ("application/json", "utf-16-le", 400, "body: not UTF-8 (byte 0xfc at offset "),
    ],
)
def test_a_body_in_another_charset_than_utf8_is_refused(server, dataset, content_type, encoding, status, message):
    [example] = _questions(dataset, 1)
    body = {**_body(example), "question": "Zürich " + example.question, "options": {"max_turns": 0}}
    reply = httpx.post(
        f"{server}/v1/answer",
        content=json.dumps(body, ensure_ascii=False).encode(encoding),
        headers={"content-type": content_type},
        timeout=60,
    )
    error = _error(reply, status)
    assert error["message"].startswith(message) and error["param"] == "body"
    # the same body in UTF-8, its charset said or not, is answered
    for header in ("application/json; charset=utf-8", "application/json"):
        ok = httpx.post(
            f"{server}/v1/answer", content=json.dumps(body).encode(), headers={"content-type": header}, timeout=60
        )
        assert ok.status_code == 200 and ok.json()["question"] == body["question"]


def test_an_ascii_body_in_utf16_is_refused_as_the_json_it_is_not(server, dataset):
    """UTF-16 of ASCII is valid UTF-8 (every other byte a NUL), which FastAPI alone would detect and decode."""
    [example] = _questions(dataset, 1)
    body = json.dumps({**_body(example), "options": {"max_turns": 0}}).encode("utf-16-le")
    reply = httpx.post(f"{server}/v1/answer", content=body, headers={"content-type": "application/json"}, timeout=60)
    assert _error(reply, 400)["message"] == "body: not valid JSON"


@pytest.mark.parametrize(
    ("path", "text", "key"),
    [
        ("/v1/answer", '{"question": "a?", "topic_entities": ["X"], "question": "b?"}', "question"),
        ("/v1/answer", '{"question": "a?", "topic_entities": [{"id": "x", "id": "y"}]}', "id"),
        ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "q", "role": "system"}]}', "role"),
    ],
)
def test_a_body_naming_a_key_twice_is_refused(server, path, text, key):
    reply = httpx.post(f"{server}{path}", content=text.encode(), headers={"content-type": "application/json"})
    assert _error(reply, 400) == {
        "message": f"body: key {key!r} appears twice in one object (a JSON reader keeps only the last value)",
        "type": "invalid_request_error",
        "param": "body",
        "code": 400,
    }
