"""The shared HTTP transport against a real local server: what is retried, how often, and what is reported."""

from __future__ import annotations

import logging
import socket

import pytest
import tenacity

from kgreasoner.llm import OpenAIClient
from kgreasoner.llm.http import EndpointError, EndpointRejected, EndpointUnavailable, JSONEndpoint, retry_policy

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
    caplog.set_level(logging.WARNING, logger="kgreasoner.llm.http")
    server = scripted_server((status, "overloaded"))
    client = OpenAIClient(server.base_url, "m", retries=3, backoff=0.0)
    url = f"{server.base_url}/chat/completions"
    with pytest.raises(EndpointUnavailable) as caught:
        client.complete("q")
    assert str(caught.value) == f"{url} failed after 4 attempts: HTTP {status}: overloaded"
    assert (caught.value.url, caught.value.status) == (url, status)
    assert len(server.requests) == 4
    assert all(r[:2] == ("POST", "/v1/chat/completions") for r in server.requests)
    retries = [r for r in caplog.records if r.name == "kgreasoner.llm.http"]
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
