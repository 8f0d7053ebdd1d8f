"""Stand-in model servers for the llm tests, on the shared `openai_server` fixture (tests/conftest.py);
the tiny checkpoint is the shared `tiny_checkpoint`."""

from __future__ import annotations

import pytest


@pytest.fixture
def models_server(openai_server):
    """A server that lists its models as `vllm serve` does; its base URL ends in /v1."""
    models = {"data": [{"id": "served-model"}, {"id": "other"}]}
    return openai_server(lambda request: (200, models) if request.path == "/v1/models" else (404, models)).base_url


@pytest.fixture
def scripted_server(openai_server):
    """`start(*replies)`: a server answering each request with the next (status, JSON or text body) of
    `replies` (the last one repeats); `.base_url` ends in /v1, `.requests` holds (method, path,
    Authorization header, JSON body) per request."""

    def start(*replies):
        def reply(request):
            return replies[min(len(server.requests), len(replies)) - 1]

        server = openai_server(reply)
        return server

    return start
