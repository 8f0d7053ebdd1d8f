"""Starting `oxigraph serve`: the readiness probe waits for a 2xx, and names a server that exits or stays silent."""

from __future__ import annotations

import socket
import subprocess
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyoxigraph as ox
import pytest

from kgreasoner.kg.base import KGError
from kgreasoner.kg.server import OxigraphServer, _wait_until_ready, free_port, start_oxigraph_server


class _Warming(BaseHTTPRequestHandler):
    """503 for the first `server.busy` requests, then 200; records each request's path and query."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.server.paths.append(self.path)
        self.send_response(503 if len(self.server.paths) <= self.server.busy else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def alive_process():
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()
    process.wait()


def test_the_probe_asks_until_the_server_answers_2xx(alive_process):
    stand_in = ThreadingHTTPServer(("127.0.0.1", 0), _Warming)
    stand_in.paths, stand_in.busy = [], 3
    threading.Thread(target=stand_in.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{stand_in.server_address[1]}/query"
        _wait_until_ready(OxigraphServer(url, alive_process), timeout=30)
    finally:
        stand_in.shutdown()
        stand_in.server_close()
    assert stand_in.paths == ["/query?query=ASK+%7B%7D"] * 4


def test_a_server_that_never_answers_is_named_after_the_timeout(alive_process):
    url = f"http://127.0.0.1:{free_port()}/query"  # nothing listens there
    with pytest.raises(
        KGError, match=rf"^oxigraph server at {url} did not answer within 1 s: \(output went to the terminal\)$"
    ):
        _wait_until_ready(OxigraphServer(url, alive_process), timeout=1.0)


def test_a_server_that_exits_is_named_with_its_output(tmp_path):
    store = tmp_path / "store"
    created = ox.Store(str(store))
    created.flush()
    del created  # closes it before the server opens the directory
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(
            KGError,
            match=rf"^oxigraph server for http://127.0.0.1:{port}/query exited with code \d+: "
            r".*Address already in use",
        ):
            start_oxigraph_server(store, port=port)
