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
