"""The shared HTTP transport against a real local server: what is retried, how often, and what is reported."""

from __future__ import annotations

import logging
import re
import socket
import time

import pytest
import tenacity

from kgreasoner.llm import OpenAIClient
from kgreasoner.records.http import (
    DeadlinePassed,
    EndpointError,
    EndpointRejected,
    EndpointUnavailable,
    JSONEndpoint,
    deadline,
    retry_policy,
    time_left,
)
from kgreasoner.rollout.openai_backend import OpenAIBackend
from kgreasoner.rollout.types import SamplingParams

CHAT = {
    "choices": [{"message": {"content": "yes"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 4, "completion_tokens": 1},
}


@pytest.mark.parametrize("status", [400, 401, 404, 422])
def test_a_4xx_is_rejected_at_once_never_retried(scripted_server, status):
    server = scripted_server((status, {"error": "no such model"}))
    client = OpenAIClient(server.base_url, "m", retries=3, backoff=0.0)
    url = f"{server.base_url}/chat/completions"
    with pytest.raises(EndpointRejected) as caught:
        client.complete("q")
    assert str(caught.value) == f'{url} rejected the request: HTTP {status}: {{"error": "no such model"}}'
    assert not isinstance(caught.value, EndpointUnavailable)
    assert (caught.value.url, caught.value.status) == (url, status)
    assert len(server.requests) == 1
    assert client.usage.calls == 0


@pytest.mark.parametrize("status", [500, 502, 503, 429])
def test_a_5xx_or_429_is_retried_the_configured_times_then_names_the_endpoint(scripted_server, status, caplog):
    caplog.set_level(logging.WARNING, logger="kgreasoner.records.http")
    server = scripted_server((status, "overloaded"))
    client = OpenAIClient(server.base_url, "m", retries=3, backoff=0.0)
    url = f"{server.base_url}/chat/completions"
    with pytest.raises(EndpointUnavailable) as caught:
        client.complete("q")
    assert str(caught.value) == f"{url} failed after 4 attempts: HTTP {status}: overloaded"
    assert (caught.value.url, caught.value.status) == (url, status)
    assert len(server.requests) == 4
    assert all(r[:2] == ("POST", "/v1/chat/completions") for r in server.requests)
    retries = [r for r in caplog.records if r.name == "kgreasoner.records.http"]
    assert len(retries) == 3 and all(r.levelno == logging.WARNING and "Retrying" in r.getMessage() for r in retries)


def test_a_transient_failure_followed_by_success_returns_the_reply(scripted_server):
    server = scripted_server((503, "busy"), (500, "busy"), (200, CHAT))
    client = OpenAIClient(server.base_url, "m", retries=2, backoff=0.0)
    completion = client.complete("q")
    assert (completion.text, completion.prompt_tokens, completion.completion_tokens) == ("yes", 4, 1)
    assert len(server.requests) == 3
    assert client.usage.calls == 1


def test_no_retries_means_one_attempt(scripted_server):
    server = scripted_server((503, "busy"))
    with pytest.raises(EndpointUnavailable, match=r"/v1/models failed after 1 attempt: HTTP 503: busy$"):
        OpenAIClient(server.base_url, retries=0)
    assert [r[:2] for r in server.requests] == [("GET", "/v1/models")]


def test_a_refused_connection_is_retried_then_reported_as_unavailable():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
        base = f"http://127.0.0.1:{closed.getsockname()[1]}/v1"
        endpoint = JSONEndpoint(base, retries=2, backoff=0.0)
        with pytest.raises(EndpointUnavailable, match=rf"^{base}/completions failed after 3 attempts: ConnectError: "):
            endpoint.post("/completions", {})


def test_the_api_key_goes_as_a_bearer_token_only_when_set(scripted_server, monkeypatch):
    server = scripted_server((200, CHAT))
    monkeypatch.setenv("KG_TEST_KEY", "secret")
    OpenAIClient(server.base_url, "m", api_key_env="KG_TEST_KEY").complete("q")
    monkeypatch.delenv("KG_TEST_KEY")
    OpenAIClient(server.base_url, "m", api_key_env="KG_TEST_KEY").complete("q")
    assert [r[2] for r in server.requests] == ["Bearer secret", None]
    assert server.requests[0][3] == {
        "model": "m",
        "messages": [{"role": "user", "content": "q"}],
        "max_tokens": 256,
        "temperature": 0.0,
    }


def test_a_reply_that_is_not_json_is_an_endpoint_error_not_retried(scripted_server):
    server = scripted_server((200, "<html>proxy login</html>"))
    endpoint = JSONEndpoint(server.base_url, retries=3, backoff=0.0)
    with pytest.raises(EndpointError, match=r"/v1/models replied with something other than JSON: '<html>proxy login"):
        endpoint.get("/models")
    assert len(server.requests) == 1


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="retries and backoff must be >= 0 and timeout > 0, got -1, 0.5, 1.0"):
        JSONEndpoint("http://127.0.0.1:1/v1", retries=-1, timeout=1.0)


def test_waits_double_from_the_backoff_up_to_the_cap():
    policy = retry_policy(5, 0.5, max_backoff=3.0)
    state = tenacity.RetryCallState(policy, None, (), {})
    waits = []
    for attempt in range(1, 6):
        state.attempt_number = attempt
        waits.append(policy.wait(state))
    assert waits == [0.5, 1.0, 2.0, 3.0, 3.0]


COMPLETION = {"choices": [{"text": "<answer>x</answer>", "finish_reason": "stop"}], "usage": {"completion_tokens": 3}}


def _abandoned(url: str) -> str:
    left = r"\([0-9.e-]+ s left when it was sent\)"
    return rf"{re.escape(url)} gave no reply within the request's deadline {left}; abandoned"


@pytest.mark.parametrize("trickle", [False, True], ids=["silent", "trickling"])
def test_a_deadline_abandons_a_held_reply_and_closes_its_connection(stalling_server, trickle):
    server = stalling_server(lambda body: COMPLETION, stall=lambda body: True, trickle=trickle)
    endpoint = JSONEndpoint(server.base_url, timeout=120.0, retries=2, backoff=0.0)
    with deadline(time.monotonic() + 0.5), pytest.raises(DeadlinePassed) as caught:
        endpoint.post("/completions", {"prompt": "p"})
    assert re.fullmatch(_abandoned(f"{server.base_url}/completions"), str(caught.value))
    [held] = server.stalled  # abandoned, not retried
    assert held.ended.wait(30) and held.outcome == "disconnected"
    # without a deadline the same endpoint still waits for its reply
    server.release()
    assert endpoint.post("/completions", {"prompt": "p"}) == COMPLETION


def test_a_backoff_never_sleeps_past_the_deadline(scripted_server):
    policy = retry_policy(3, 600.0, max_backoff=6000.0)
    state = tenacity.RetryCallState(policy, None, (), {})
    state.attempt_number = 1
    assert policy.wait(state) == 600.0
    with deadline(time.monotonic() + 0.5):
        assert 0 < policy.wait(state) <= 0.5
    with deadline(time.monotonic() - 1):
        assert policy.wait(state) == 0
    # and the attempt after a backoff that reached the deadline is not sent
    server = scripted_server((503, "busy"))
    endpoint = JSONEndpoint(server.base_url, timeout=120.0, retries=3, backoff=600.0)
    with deadline(time.monotonic() + 0.5), pytest.raises(DeadlinePassed) as caught:
        endpoint.post("/completions", {"prompt": "p"})
    assert str(caught.value) == f"{server.base_url}/completions: the request's deadline passed before it was sent"
    assert len(server.requests) == 1


def test_deadlines_nest_to_the_earlier_and_end_with_their_block():
    assert time_left() is None
    now = time.monotonic()
    with deadline(now + 100):
        with deadline(now + 1000), deadline(None):
            assert 0 < time_left() <= 100
        with deadline(now + 1):
            assert time_left() <= 1
        assert 1 < time_left() <= 100
    assert time_left() is None


def test_the_deadline_reaches_requests_a_backend_sends_from_its_threads(stalling_server):
    server = stalling_server(lambda body: COMPLETION, stall=lambda body: body["prompt"] == "slow")
    backend = OpenAIBackend(server.base_url, "m", timeout=120.0, max_concurrency=4, retries=0)
    with deadline(time.monotonic() + 0.5):
        outputs = backend.complete_text(["slow", "fast", "slow"], [8, 8, 8], SamplingParams(), 0, [0, 1, 2])
    url = f"{server.base_url}/completions"
    assert outputs[1].error is None and outputs[1].text == "<answer>x</answer>"
    for output in (outputs[0], outputs[2]):
        assert re.fullmatch("completion request failed: " + _abandoned(url), output.error)
    assert len(server.stalled) == 2
    assert all(held.ended.wait(30) and held.outcome == "disconnected" for held in server.stalled)
