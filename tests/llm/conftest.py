"""A tiny real checkpoint and a local server that lists its models as `vllm serve` does."""

from __future__ import annotations

import dataclasses
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kgreasoner.models import TinyModelConfig, build_tiny
from kgreasoner.tokenizer import TokenizerConfig


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    config = dataclasses.replace(
        TinyModelConfig(), hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=32,
        intermediate_size=64, max_position_embeddings=512, tokenizer=TokenizerConfig(num_handles=4))
    out = tmp_path_factory.mktemp("tiny_llm") / "final"
    build_tiny(config, ["what time zone is utah in", "Mountain Time Zone"], out)
    return out


class _Models(BaseHTTPRequestHandler):
    def do_GET(self):
        raw = json.dumps({"data": [{"id": "served-model"}, {"id": "other"}]}).encode()
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def log_message(self, *args):
        pass


@pytest.fixture
def models_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Models)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


class _Scripted(BaseHTTPRequestHandler):
    """Answers each request with the next (status, JSON or text body) of `server.script` (the last one
    repeats) and records (method, path, Authorization header, JSON body) in `server.requests`."""

    def _answer(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        self.server.requests.append((self.command, self.path, self.headers.get("Authorization"), body))
        status, reply = self.server.script[min(len(self.server.requests), len(self.server.script)) - 1]
        raw = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if isinstance(reply, str) else "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


@pytest.fixture
def scripted_server():
    """`start(*replies)`: a local HTTP server answering with `replies` in turn; its base URL ends in /v1."""
    servers = []

    def start(*replies):
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
        server.script, server.requests = list(replies), []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        server.base_url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()
