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
