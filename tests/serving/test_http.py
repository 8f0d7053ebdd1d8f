"""The HTTP service, live: `kgreasoner serve` on 127.0.0.1 with a tiny trained model and the real tool."""

from __future__ import annotations

import concurrent.futures
import re
import socket
import time

import httpx
import pytest
import yaml

from kgreasoner.protocol import format_tool_block
from kgreasoner.rollout.engine import TRUNCATION_NOTE

from .conftest import SERVE_CONFIG, serve


def _questions(dataset, count: int):
    """Test questions with pairwise different topic entities (so no two sessions could look alike)."""
    chosen, topics = [], set()
    for example in dataset.examples:
        key = example.topic_entities[0].id
        if key not in topics:
            topics.add(key)
            chosen.append(example)
        if len(chosen) == count:
            return chosen
    raise AssertionError(f"the synthetic set has fewer than {count} distinct topic entities")


def _body(example) -> dict:
    return {"question": example.question, "topic_entities": [{"id": t.id} for t in example.topic_entities]}


def _assert_searches_replay(record: dict, example, tool) -> None:
    """Every search in the record gives exactly the same tool text in a fresh session of this question."""
    session = tool.session(example.question, list(example.topic_entities))
    for search in record["searches"]:
        result = session.call(search["query"])
        if search["truncated"]:  # the engine kept the lines that fit max_tool_tokens and noted the rest
            shown, lines = search["text"].splitlines(), result.text.splitlines()
            kept = len(shown) - 1
            assert shown[:kept] == lines[:kept] and kept < len(lines)
            assert shown[-1] == TRUNCATION_NOTE.format(count=len(lines) - kept)
        else:
            assert search["text"] == result.text
        assert search["entity"] == result.entity and search["error"] == result.error
        assert format_tool_block(search["text"]) in record["trajectory"]


def test_answer_endpoint_returns_the_trajectory_with_searches_run_by_the_server(server, dataset, tool):
    [example] = _questions(dataset, 1)
    reply = httpx.post(f"{server}/v1/answer", json={**_body(example), "id": "my-q"}, timeout=60)
    assert reply.status_code == 200, reply.text
    record = reply.json()
    assert set(record) == {
        "id",
        "question",
        "topic_entities",
        "model",
        "answers",
        "raw_answers",
        "finish_reason",
        "error",
        "trajectory",
        "searches",
        "usage",
        "warnings",
    }
    assert record["id"] == "my-q" and record["question"] == example.question and record["warnings"] == []
    topic = example.topic_entities[0]
    assert record["topic_entities"] == [{"id": topic.id, "name": topic.name}]
    assert record["trajectory"].startswith("<think><search>E1</search>")
    first = record["searches"][0]
    assert first["query"] == "E1" and first["entity"] == topic.id and first["label"] == topic.name
    assert first["error"] is None and first["num_triples"] > 0 and f"E1 {topic.name}" in first["text"]
    _assert_searches_replay(record, example, tool)
    usage = record["usage"]
    assert usage["tool_calls"] == len(record["searches"]) and usage["searches"] >= 1
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0 and usage["tool_tokens"] > 0
    if record["finish_reason"] == "answer":
        assert record["raw_answers"] and record["raw_answers"][0].startswith("E")
        assert record["answers"] and not record["answers"][0].startswith("E")  # a handle resolved to its label


def test_topic_entities_by_name_and_options(server, dataset):
    [example] = _questions(dataset, 1)
    topic = example.topic_entities[0]
    body = {"question": example.question, "topic_entities": [topic.name], "options": {"max_turns": 0}}
    record = httpx.post(f"{server}/v1/answer", json=body, timeout=60).json()
    assert record["topic_entities"] == [{"id": topic.id, "name": topic.name}]
    # No tool call allowed: the first </search> ends the trajectory and the tool never runs.
    assert record["finish_reason"] == "max_turns" and record["searches"] == []


def test_a_topic_name_the_kg_contradicts_is_replaced_by_its_label_with_a_warning(server, dataset):
    [first, second] = _questions(dataset, 2)
    topic, other = first.topic_entities[0], second.topic_entities[0]
    body = {
        "question": first.question,
        "topic_entities": [{"id": topic.id, "name": other.name}],
        "options": {"max_turns": 0},
    }
    record = httpx.post(f"{server}/v1/answer", json=body, timeout=60).json()
    assert record["topic_entities"] == [{"id": topic.id, "name": topic.name}]
    assert record["warnings"] == [
        f"topic_entities[0].name: {other.name!r} is not a name of {topic.id!r} in the knowledge graph; "
        f"its label {topic.name!r} is used"
    ]
    body["topic_entities"] = [{"id": topic.id, "name": topic.name}]  # its own name: nothing to say
    assert httpx.post(f"{server}/v1/answer", json=body, timeout=60).json()["warnings"] == []


def test_chat_completions_resolves_searches_on_the_server(server, dataset, tool):
    [example] = _questions(dataset, 1)
    topic = example.topic_entities[0]
    models = httpx.get(f"{server}/v1/models", timeout=10).json()
    name = models["data"][0]["id"]
    body = {
        "model": name,
        "messages": [
            {"role": "system", "content": "ignored"},
            {"role": "user", "content": f"{example.question} Topic Entity: {topic.name}"},
        ],
        "temperature": 0,
        "max_tokens": 10_000,
        "presence_penalty": 0,
    }
    reply = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    chat = reply.json()
    assert chat["object"] == "chat.completion" and chat["model"] == name and chat["id"].startswith("chatcmpl-")
    [choice] = chat["choices"]
    record = chat["trajectory"]
    assert choice["message"] == {"role": "assistant", "content": record["trajectory"]}
    assert choice["finish_reason"] == ("length" if record["finish_reason"] in ("max_tokens", "max_turns") else "stop")
    assert record["topic_entities"] == [{"id": topic.id, "name": topic.name}]
    assert chat["usage"]["total_tokens"] == chat["usage"]["prompt_tokens"] + chat["usage"]["completion_tokens"]
    _assert_searches_replay(record, example, tool)
    # Greedy: the same question through /v1/answer gives the same trajectory.
    direct = httpx.post(f"{server}/v1/answer", json=_body(example), timeout=60).json()
    assert direct["trajectory"] == record["trajectory"]
    # Topic entities may also come as a field, with the bare question as the message.
    fielded = httpx.post(
        f"{server}/v1/chat/completions",
        timeout=60,
        json={"messages": [{"role": "user", "content": example.question}], "topic_entities": [{"id": topic.id}]},
    ).json()
    assert fielded["choices"][0]["message"]["content"] == record["trajectory"]


def test_concurrent_requests_never_mix_sessions(server, dataset, tool):
    examples = _questions(dataset, 12)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(examples)) as pool:
        replies = list(pool.map(lambda e: httpx.post(f"{server}/v1/answer", json=_body(e), timeout=120), examples))
    records = []
    for example, reply in zip(examples, replies):
        assert reply.status_code == 200, reply.text
        record = reply.json()
        records.append(record)
        assert record["question"] == example.question
        assert record["topic_entities"][0]["id"] == example.topic_entities[0].id
        assert record["searches"] and record["searches"][0]["entity"] == example.topic_entities[0].id
        # Each request's tool texts are exactly those of its own fresh session: handles numbered from
        # its own topic, nothing "already shown" by another request.
        _assert_searches_replay(record, example, tool)
    assert max(r["usage"]["batch_size"] for r in records) > 1  # they really ran together
    assert len({r["searches"][0]["text"] for r in records}) == len(examples)


BAD_REQUESTS = [
    ({}, 422, "question: Field required"),
    ({"question": 7, "topic_entities": ["x"]}, 422, "question: Input should be a valid string"),
    ({"question": "q?", "topic_entities": "Somebody"}, 422, "topic_entities: Input should be a valid list"),
    ({"question": "q?", "topic_entities": []}, 422, "topic_entities: List should have at least 1 item"),
    ({"question": "q?", "topic_entities": [{"name": "x", "kind": "y"}]}, 422, "Extra inputs are not permitted"),
    ({"question": "q?", "topic_entities": ["x"], "questoin": "typo"}, 422, "questoin: Extra inputs are not permitted"),
    ({"question": "   ", "topic_entities": ["x"]}, 422, "question: is empty"),
    ({"question": "x" * 301, "topic_entities": ["x"]}, 422, "question: has 301 characters; the limit is 300"),
    (
        {"question": "q?", "topic_entities": ["No Such Entity Anywhere"]},
        422,
        "topic_entities[0]: no entity named 'No Such Entity Anywhere' in the knowledge graph",
    ),
    (
        {"question": "q?", "topic_entities": [{"id": "m.nope"}]},
        422,
        "topic_entities[0].id: 'm.nope' is not an entity of the knowledge graph",
    ),
    ({"question": "q?", "topic_entities": [{}]}, 422, "topic_entities[0]: needs an 'id' or a 'name'"),
    ({"question": "q?", "topic_entities": ["a", "b", "c", "d", "e"]}, 422, "names 5 entities; the limit is 4"),
    (
        {"question": "q?", "topic_entities": ["x"], "options": {"max_turns": 99}},
        422,
        "options.max_turns: 99 is above this server's limit of 3",
    ),
    (
        {"question": "q?", "topic_entities": ["x"], "options": {"temperature": -1}},
        422,
        "options.temperature: Input should be greater than or equal to 0",
    ),
    (
        {"question": "q?", "topic_entities": ["x"], "options": {"max_new_tokens": "9"}},
        422,
        "options.max_new_tokens: Input should be a valid integer",
    ),
]


@pytest.mark.parametrize("body, status, message", BAD_REQUESTS)
def test_bad_answer_requests_get_4xx_with_a_clear_message(server, body, status, message):
    reply = httpx.post(f"{server}/v1/answer", json=body, timeout=30)
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert message in error["message"] and error["code"] == status
    assert "Traceback" not in reply.text


def test_malformed_and_oversized_bodies(server):
    bad_json = httpx.post(
        f"{server}/v1/answer", content=b'{"question": ', timeout=30, headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 400 and bad_json.json()["error"]["message"] == "body: not valid JSON"
    huge = {"question": "q?", "topic_entities": ["x" * (SERVE_CONFIG["max_body_bytes"] + 1)]}
    too_big = httpx.post(f"{server}/v1/answer", json=huge, timeout=30)
    assert too_big.status_code == 413
    assert too_big.json()["error"]["message"] == "request body is larger than this server's limit of 16384 bytes"

    def chunks():
        for _ in range(20):  # no content-length: the limit is enforced while reading
            yield b" " * 1024

    streamed = httpx.post(
        f"{server}/v1/answer", content=chunks(), timeout=30, headers={"content-type": "application/json"}
    )
    assert streamed.status_code == 413
    missing = httpx.get(f"{server}/v2/nothing", timeout=10)
    assert missing.status_code == 404 and missing.json()["error"]["message"] == "no such endpoint: GET /v2/nothing"
    wrong_method = httpx.get(f"{server}/v1/answer", timeout=10)
    assert wrong_method.status_code == 405


def test_bad_chat_requests(server, dataset):
    [example] = _questions(dataset, 1)
    user = {"role": "user", "content": f"{example.question} Topic Entity: {example.topic_entities[0].name}"}
    cases = [
        ({"messages": [user], "stream": True}, 400, "stream: streaming is not supported"),
        ({"messages": [user], "n": 3}, 400, "n: only n=1 is supported"),
        ({"messages": [user], "model": "gpt-x"}, 404, "model: model 'gpt-x' is not served here"),
        ({"messages": []}, 422, "messages: List should have at least 1 item"),
        (
            {"messages": [user, {"role": "assistant", "content": "hi"}]},
            422,
            "messages[1].role: the last message must be the user's question",
        ),
        ({"messages": [{"role": "user", "content": "who is it?"}]}, 422, "topic_entities: name the topic entities"),
        (
            {"messages": [{"role": "user", "content": "who? Topic Entity: Nobody Known"}]},
            422,
            "no entity named 'Nobody Known'",
        ),
        ({"messages": [{"role": "robot", "content": "x"}]}, 422, "messages.0.role: Input should be"),
    ]
    for body, status, message in cases:
        reply = httpx.post(f"{server}/v1/chat/completions", json=body, timeout=30)
        assert reply.status_code == status, (body, reply.text)
        assert message in reply.json()["error"]["message"], reply.text


def test_health_and_metrics(server, dataset):
    health = httpx.get(f"{server}/health", timeout=10).json()
    assert health["status"] == "ok" and health["backend"] == "step" and health["queue_depth"] == 0
    [example] = _questions(dataset, 1)
    assert httpx.post(f"{server}/v1/answer", json=_body(example), timeout=60).status_code == 200
    assert httpx.post(f"{server}/v1/answer", json={}, timeout=60).status_code == 422
    reply = httpx.get(f"{server}/metrics", timeout=10)
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = reply.text

    def value(pattern: str) -> float:
        match = re.search("^" + re.escape(pattern) + r" (\S+)$", text, re.MULTILINE)
        assert match, f"{pattern} not in /metrics"
        return float(match.group(1))

    assert value('kgreasoner_requests_total{endpoint="/v1/answer",status="200"}') >= 1
    assert value('kgreasoner_request_errors_total{endpoint="/v1/answer",kind="invalid_request"}') >= 1
    count = value('kgreasoner_request_duration_seconds_count{endpoint="/v1/answer"}')
    assert value('kgreasoner_request_duration_seconds_bucket{endpoint="/v1/answer",le="+Inf"}') == count
    assert value('kgreasoner_tool_calls_total{error="none"}') >= 1
    assert value('kgreasoner_tokens_total{kind="completion"}') >= 1
    assert value("kgreasoner_batch_size_count") >= 1 and value("kgreasoner_queue_depth") == 0
    assert "# TYPE kgreasoner_request_duration_seconds histogram" in text


def _trickle_headers(url: str, seconds: float) -> tuple[float, bytes]:
    """Open a connection and send one header line every 0.2 s; (seconds until the server closed it, its reply)."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=0.2) as connection:
        start = time.monotonic()
        connection.sendall(b"POST /v1/answer HTTP/1.1\r\nHost: x\r\n")
        reply = b""
        while time.monotonic() - start < seconds:
            try:
                chunk = connection.recv(4096)
            except TimeoutError:
                try:
                    connection.sendall(b"X-Slow: 1\r\n")
                except OSError:  # the server closed it between our read and write
                    break
                continue
            if not chunk:
                break
            reply += chunk
        return time.monotonic() - start, reply


def test_clients_trickling_headers_are_cut_off_at_the_header_timeout(server, dataset):
    limit = SERVE_CONFIG["header_timeout"]
    with concurrent.futures.ThreadPoolExecutor(30) as pool:
        slow = [pool.submit(_trickle_headers, server, limit + 10) for _ in range(30)]
        [example] = _questions(dataset, 1)
        assert httpx.post(f"{server}/v1/answer", json=_body(example), timeout=60).status_code == 200
        results = [future.result() for future in slow]
    for seconds, reply in results:
        assert limit - 0.1 < seconds < limit + 2.0, seconds
        assert reply == b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        (
            "tools",
            [{"type": "function", "function": {"name": "f"}}],
            "the server runs its own KG search tool and returns the whole trajectory",
        ),
        ("logprobs", True, "the trajectory is returned without token log-probabilities"),
        (
            "response_format",
            {"type": "json_object"},
            "the answer is the protocol's <answer> block, in the trajectory's own layout",
        ),
        ("stop", ["\n"], "a trajectory stops at </answer>, max_tokens or max_turns"),
    ],
)
def test_chat_fields_the_server_does_not_honour_are_refused_by_name(server, dataset, field, value, why):
    [example] = _questions(dataset, 1)
    user = {"role": "user", "content": f"{example.question} Topic Entity: {example.topic_entities[0].name}"}
    reply = httpx.post(f"{server}/v1/chat/completions", json={"messages": [user], field: value}, timeout=30)
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"] == {
        "message": f"{field}: not supported: {why}; leave it out",
        "type": "invalid_request_error",
        "param": field,
        "code": 400,
    }
    # Their off values, as OpenAI clients send by default, are accepted.
    off = {"tools": [], "logprobs": False, "response_format": {"type": "text"}, "stop": None}[field]
    accepted = httpx.post(f"{server}/v1/chat/completions", json={"messages": [user], field: off}, timeout=60)
    assert accepted.status_code == 200, accepted.text


@pytest.mark.slow
def test_a_hub_s_searches_reach_the_client_within_max_chars(checkpoint, hub_dir, tmp_path):
    """A hub of 10,000 relations served with room for whole tool blocks: every search text fits the tool's
    max_chars, its listing included (once a `more:` line of every relation, a 329 KB reply)."""
    max_chars = 2000  # the server's ToolConfig default
    config = tmp_path / "serve.yaml"
    config.write_text(
        yaml.safe_dump(
            {**SERVE_CONFIG, "torch_threads": 1, "rollout": {**SERVE_CONFIG["rollout"], "max_tool_tokens": 4096}}
        )
    )
    with serve(checkpoint, str(hub_dir), config) as url:
        answer = httpx.post(
            f"{url}/v1/answer",
            timeout=120,
            json={"question": "which relation of the hub", "topic_entities": [{"id": "hub"}]},
        )
        chat = httpx.post(
            f"{url}/v1/chat/completions",
            timeout=120,
            json={"messages": [{"role": "user", "content": "which relation of the hub Topic Entity: Hub"}]},
        )
    for reply, record in ((answer, answer.json()), (chat, chat.json().get("trajectory"))):
        assert reply.status_code == 200, reply.text[:500]
        assert len(reply.content) < 8 * max_chars * (len(record["searches"]) + 1)
        assert record["searches"], "the served model searches the topic first"
        first = record["searches"][0]
        assert first["entity"] == "hub" and not first["truncated"] and first["text"].startswith("(E1 Hub, r")
        assert re.search(r"\nmore: r.* and \d+ more relations$", first["text"])
        assert all(len(search["text"]) <= max_chars for search in record["searches"])
