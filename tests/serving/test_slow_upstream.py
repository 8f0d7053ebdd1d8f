"""A generation server that stalls: each request keeps its own deadline, and stalls no other request.

The service runs on 127.0.0.1 with an `openai:` backend whose upstream is the `stalling_server`
stand-in (no LLM runs here): it answers every request at once with a one-turn answer, except those
whose prompt holds SLOW, which it holds until the test releases them or the client hangs up.
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest
import yaml

from kgreasoner.config import from_dict
from kgreasoner.serving.app import create_app
from kgreasoner.serving.config import ServeConfig
from kgreasoner.serving.service import AnswerService

from .conftest import REPO, SERVE_CONFIG, _wait_for_url, _wait_healthy
from .test_service import _serve_in_thread

SLOW = "Slowly:"
"""Starts the question of a request whose upstream calls the stand-in holds."""


def _completion(body):
    """The stand-in's reply to any turn: the first topic's handle as the answer."""
    return {
        "choices": [
            {"text": "<think> done </think>\n<answer>E1", "finish_reason": "stop", "stop_reason": "</answer>"}
        ],
        "usage": {"completion_tokens": 6},
    }


def _is_slow(body) -> bool:
    return SLOW in body["prompt"]


def _body(dataset, i: int, slow: bool = False) -> dict:
    example = dataset.examples[i]
    question = f"{SLOW} {example.question}" if slow else example.question
    return {"question": question, "topic_entities": [{"id": t.id} for t in example.topic_entities]}


def _answer_of(dataset, i: int) -> list[str]:
    return [dataset.examples[i].topic_entities[0].name]


def _config(upstream, synthetic_dir, **fields) -> dict:
    return {**SERVE_CONFIG, "llm": f"openai:{upstream.base_url}#tiny", "kg": str(synthetic_dir), **fields}


@pytest.fixture
def serve_upstream(synthetic_dir):
    """`start(upstream, **config fields)`: an in-process service over that upstream on 127.0.0.1; its URL."""
    running = []

    def start(upstream, **fields) -> str:
        service = AnswerService.open(from_dict(ServeConfig, _config(upstream, synthetic_dir, **fields)))
        server, thread, url = _serve_in_thread(create_app(service))
        running.append((service, server, thread))
        return url

    yield start
    for service, server, thread in running:
        server.should_exit = True
        thread.join(timeout=30)
        service.close()


def test_a_stalled_upstream_call_is_cut_off_at_the_request_deadline(dataset, stalling_server, serve_upstream):
    upstream = stalling_server(_completion, stall=_is_slow)
    # One worker: the request after the slow one is answered only if the slow one let it go.
    url = serve_upstream(upstream, request_timeout=1.0, backend_timeout=120.0, backend_workers=1)
    reply = httpx.post(f"{url}/v1/answer", json=_body(dataset, 0, slow=True), timeout=120)
    assert reply.status_code == 504
    assert reply.json()["error"] == {
        "message": "no answer within the request timeout of 1 s",
        "type": "timeout",
        "param": None,
        "code": 504,
    }
    [held] = upstream.stalled
    # the upstream saw its client go while it still held the call: the call was cancelled, not waited for
    assert held.ended.wait(30) and held.outcome == "disconnected"
    record = httpx.post(f"{url}/v1/answer", json=_body(dataset, 1), timeout=120).json()
    assert record["answers"] == _answer_of(dataset, 1) and record["finish_reason"] == "answer"


def test_fast_requests_are_answered_while_slow_ones_stall(dataset, stalling_server, serve_upstream):
    upstream = stalling_server(_completion, stall=_is_slow)
    url = serve_upstream(upstream, request_timeout=120.0, backend_workers=4)

    def ask(i: int, slow: bool) -> httpx.Response:
        reply = httpx.post(f"{url}/v1/answer", json=_body(dataset, i, slow), timeout=300)
        if not slow:
            upstream.note(f"fast {i} answered")
        return reply

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        # the fast requests go in right behind the slow ones: in their batch, and in the batches after
        slow = [pool.submit(ask, i, True) for i in range(2)]
        fast = {i: pool.submit(ask, i, False) for i in range(2, 8)}
        concurrent.futures.wait(fast.values(), timeout=120)
        upstream.wait_held(2)  # both slow calls reached the upstream, and are held there
        upstream.release()
        replies = {i: future.result() for i, future in fast.items()}
        slow_replies = [future.result() for future in slow]
    for i, reply in replies.items():
        assert reply.status_code == 200 and reply.json()["answers"] == _answer_of(dataset, i)
    assert [reply.status_code for reply in slow_replies] == [200, 200]
    # every fast answer came back while both slow calls were still held upstream
    assert sorted(e.split()[0] for e in upstream.events[:8]) == ["fast"] * 6 + ["held"] * 2
    assert upstream.events[8:] == ["returned", "returned"]


@pytest.mark.slow
def test_an_upstream_that_stalls_forever_never_blocks_shutdown(dataset, stalling_server, synthetic_dir, tmp_path):
    upstream = stalling_server(_completion, stall=_is_slow)  # never released while the server runs
    config = tmp_path / "serve.yaml"
    fields = {"request_timeout": 600.0, "backend_timeout": 600.0}
    config.write_text(yaml.safe_dump({**SERVE_CONFIG, **fields}), encoding="utf-8")
    command = [
        *(sys.executable, "-m", "kgreasoner.cli", "serve", "--llm", f"openai:{upstream.base_url}#tiny"),
        *("--kg", str(synthetic_dir), "--config", str(config), "--host", "127.0.0.1", "--port", "0"),
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = _wait_for_url(process, timeout=120)
        threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
        _wait_healthy(url, process, timeout=60)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            reply = pool.submit(httpx.post, f"{url}/v1/answer", json=_body(dataset, 0, slow=True), timeout=300)
            [held] = upstream.wait_held(1)
            process.send_signal(signal.SIGTERM)
            # A generous ceiling, not a budget: without the fix the process waits out the 600 s deadline.
            # uvicorn ends by raising the signal it caught again, once its shutdown is done.
            assert process.wait(timeout=60) == -signal.SIGTERM
            assert not upstream.released.is_set() and held.ended.wait(30) and held.outcome == "disconnected"
            answered = reply.result()
        assert answered.status_code == 503
        assert answered.json()["error"]["message"] == "the service shut down while this request was running"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
