"""Fixtures shared by every test directory.

- `oxigraph_server`: a real `oxigraph serve-read-only` over given triples (a factory).
- `synthetic_dir`: a small synthetic dataset folder (150 entities, 60 questions), made once.
- `tiny_checkpoint`: one untrained tiny Qwen3 checkpoint (`kgreasoner.models.build_tiny`), made once.
- `hub_dir`: a dataset folder whose entity `Hub` has 10,000 relations and 100,000 edges, made once.
- `openai_server`: stand-in OpenAI-compatible HTTP servers on 127.0.0.1 answering from a function.
- `stalling_server`: the same, holding chosen requests (silent or trickling) until released or abandoned.
"""

from __future__ import annotations

import dataclasses
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, NamedTuple

import pyoxigraph as ox
import pytest

from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.kg.server import OxigraphServer, start_oxigraph_server

TINY_MODEL_TEXTS = [
    # The hand-written questions, thoughts and triples of the llm and training tests.
    "what time zone is utah in",
    "Mountain Time Zone",
    "I need the time zone of Utah.",
    "Utah is in E2.",
    "(E1 Utah, time_zone, E2 Mountain_Time_Zone) (E1 Utah, capital, E3 Salt_Lake_City)",
    "what is the capital of france",
    "I need the capital of France.",
    "The capital is E2.",
    "(E1 France, capital, E2 Paris) (E1 France, currency, E3 Euro)",
]


@pytest.fixture(scope="session")
def oxigraph_server(tmp_path_factory):
    """A factory that starts a real `oxigraph serve-read-only` on a free 127.0.0.1 port.

    `oxigraph_server(triples, names=None)` loads triples (a TSV/NT path, a dataset folder or id
    tuples, as `OxigraphKG.build` takes them) into a fresh store; `oxigraph_server(
    raw_ntriples=TEXT)` loads N-Triples text as it is (for foreign vocabularies such as
    Freebase's `ns:`). Either way it waits until the server answers and returns the SPARQL query
    URL. Every server started is killed at the end of the session.
    """
    servers: list[OxigraphServer] = []

    def start(
        triples: str | Path | Iterable[tuple[str, str, str]] | None = None,
        names: str | Path | dict[str, str] | None = None,
        *,
        raw_ntriples: str | None = None,
    ) -> str:
        store_dir = tmp_path_factory.mktemp("oxigraph_server") / "store"
        if raw_ntriples is not None:
            store = ox.Store(str(store_dir))
            store.bulk_load(input=raw_ntriples.encode("utf-8"), format=ox.RdfFormat.N_TRIPLES)
            store.flush()
            del store  # closes it before the server opens the directory
        else:
            OxigraphKG.build(triples, store_dir, names=names).close()
        server = start_oxigraph_server(store_dir)
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory):
    """A small synthetic dataset folder (kb.tsv, names.tsv, questions.jsonl; seed 0, grouped split)."""
    from data_gen.synthetic import write_synthetic

    return write_synthetic(tmp_path_factory.mktemp("synthetic"), seed=0, num_entities=150, num_questions=60)


HUB_RELATIONS, HUB_EDGES_PER_RELATION = 10_000, 10


@pytest.fixture(scope="session")
def hub_dir(tmp_path_factory) -> Path:
    """kb.tsv + names.tsv: `hub` (named Hub) has HUB_RELATIONS relations `r00000`... of HUB_EDGES_PER_RELATION
    edges each (100,000 edges), to nodes named `N<relation>_<edge>`; a Freebase-sized hub, where one
    relation's listing entry alone is no problem but the listing of all is."""
    folder = tmp_path_factory.mktemp("hub")
    rows = (f"hub\tr{r:05d}\tn{r}_{e}\n" for r in range(HUB_RELATIONS) for e in range(HUB_EDGES_PER_RELATION))
    (folder / "kb.tsv").write_text("".join(rows), encoding="utf-8")
    names = (f"n{r}_{e}\tN{r}_{e}\n" for r in range(HUB_RELATIONS) for e in range(HUB_EDGES_PER_RELATION))
    (folder / "names.tsv").write_text("hub\tHub\n" + "".join(names), encoding="utf-8")
    return folder


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, synthetic_dir):
    """An untrained tiny Qwen3 (hidden 64, 2 layers) in a folder named `final`; its word-level
    tokenizer knows the synthetic set's questions and names and TINY_MODEL_TEXTS. It answers wrongly."""
    from kgreasoner.models import TinyModelConfig, build_tiny
    from kgreasoner.tokenizer import TokenizerConfig, read_training_texts

    config = dataclasses.replace(
        TinyModelConfig(),
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        intermediate_size=128,
        max_position_embeddings=2048,
        tokenizer=TokenizerConfig(num_handles=32),
    )
    out = tmp_path_factory.mktemp("tiny_model") / "final"
    texts = read_training_texts([synthetic_dir / "questions.jsonl", synthetic_dir / "names.tsv"])
    build_tiny(config, [*texts, *TINY_MODEL_TEXTS], out)
    return out


class Received(NamedTuple):
    """One request a stand-in server got: method, path, Authorization header and JSON body (None without one)."""

    method: str
    path: str
    authorization: str | None
    body: Any


@dataclasses.dataclass
class StandIn:
    """A running stand-in server: `base_url` ends in /v1; `requests` is what it received, in order."""

    base_url: str
    port: int
    requests: list[Received]

    @property
    def bodies(self) -> list[Any]:
        return [request.body for request in self.requests]


class _Handler(BaseHTTPRequestHandler):
    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        raw_body = self.rfile.read(length) if length else b""
        request = Received(
            self.command, self.path, self.headers.get("Authorization"), json.loads(raw_body) if raw_body else None
        )
        self.server.received.append(request)
        status, reply = self.server.reply(request)
        raw = reply.encode() if isinstance(reply, str) else json.dumps(reply).encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain" if isinstance(reply, str) else "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    do_GET = do_POST = _answer

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def openai_server():
    """`start(reply)`: a real HTTP server on a free 127.0.0.1 port standing in for an OpenAI-compatible
    endpoint (`/v1/chat/completions`, `/v1/completions`, `/v1/models`). `reply(request)` gives
    (status, JSON-able value or text) for each `Received` request; the server answers requests
    concurrently and is shut down when the test ends."""
    servers: list[ThreadingHTTPServer] = []

    def start(reply: Callable[[Received], tuple[int, Any]]) -> StandIn:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        server.reply, server.received = reply, []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        port = server.server_address[1]
        return StandIn(f"http://127.0.0.1:{port}/v1", port, server.received)

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


STALL_LIMIT = 60.0
"""Seconds a stalled request is held at most when nothing releases it or cuts it off (a test gone wrong)."""


@dataclasses.dataclass
class Stalled:
    """One request a `StallingServer` held: its JSON body, `outcome` once it ended (`disconnected`: the
    client closed the connection while it was held; `answered`: it was released and replied to), and
    `ended`, set then."""

    body: Any
    outcome: str | None = None
    ended: threading.Event = dataclasses.field(default_factory=threading.Event)


class StallingServer:
    """A stand-in generation server that holds chosen requests, for how clients cope with a stalled upstream.

    No LLM runs here, and a real one cannot be made to stall on cue: this real HTTP server on 127.0.0.1
    answers `/v1/completions` with `reply(body)` (a JSON-able completion), except for requests where
    `stall(body)` is true. Those are held: silently (`trickle=False`: nothing is sent) or with the reply's
    headers and then one byte every 50 ms (`trickle=True`), until the test calls `release()` (then the
    reply is sent; a trickled one is cut off) or the client closes the connection (seen on the socket
    at once), or STALL_LIMIT passes. Each held request is a `Stalled` in `stalled`, in arrival order;
    `events` is a log, in order, of `held`, `returned` (a held request answered) and `disconnected`
    entries, to which a test may add its own with `note`.
    """

    def __init__(self, reply: Callable[[Any], Any], stall: Callable[[Any], bool], trickle: bool = False) -> None:
        self.reply, self.stall, self.trickle = reply, stall, trickle
        self.stalled: list[Stalled] = []
        self.events: list[str] = []
        self.released = threading.Event()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _StallingHandler)
        self.server.daemon_threads = True
        self.server.stand_in = self
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def note(self, event: str) -> None:
        with self._lock:
            self.events.append(event)

    def release(self) -> None:
        """Answer every held request (and any later one) at once."""
        self.released.set()

    def wait_held(self, count: int, timeout: float = 60.0) -> list[Stalled]:
        """The first `count` held requests, once that many arrived (AssertionError after `timeout`)."""
        end = time.monotonic() + timeout
        while len(self.stalled) < count:
            assert time.monotonic() < end, f"{len(self.stalled)} of {count} requests reached the stand-in"
            time.sleep(0.02)
        return self.stalled[:count]

    def close(self) -> None:
        self.release()
        self.server.shutdown()
        self.server.server_close()


class _StallingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        stand_in: StallingServer = self.server.stand_in
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length)) if length else None
        raw = json.dumps(stand_in.reply(body)).encode()
        if not stand_in.stall(body) or stand_in.released.is_set():
            self._send(raw)
            return
        held = Stalled(body)
        with stand_in._lock:
            stand_in.stalled.append(held)
            stand_in.events.append("held")
        if stand_in.trickle:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw) + 10**6))
            self.end_headers()
        end = time.monotonic() + STALL_LIMIT
        while not stand_in.released.wait(0.05) and time.monotonic() < end:
            if self._client_gone() or (stand_in.trickle and not self._write(b" ")):
                held.outcome = "disconnected"
                stand_in.note("disconnected")
                held.ended.set()
                self.close_connection = True
                return
        if not stand_in.trickle:
            self._send(raw)
        held.outcome = "answered" if not stand_in.trickle else "cut off"  # a trickled reply is never finished
        stand_in.note("returned")
        held.ended.set()
        self.close_connection = True

    def _send(self, raw: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _client_gone(self) -> bool:
        """Whether the client closed its end: the socket reads as ended (or reset) instead of blocking."""
        readable, _, _ = select.select([self.connection], [], [], 0)
        if not readable:
            return False
        try:
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except OSError:
            return True

    def _write(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except OSError:
            return False

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def stalling_server():
    """`start(reply, stall, trickle=False)`: a running `StallingServer`, shut down when the test ends."""
    servers: list[StallingServer] = []

    def start(reply: Callable[[Any], Any], stall: Callable[[Any], bool], trickle: bool = False) -> StallingServer:
        servers.append(StallingServer(reply, stall, trickle))
        return servers[-1]

    yield start
    for server in servers:
        server.close()
