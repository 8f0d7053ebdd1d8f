"""Run the `oxigraph` SPARQL server (PyPI package `oxigraph`) over a store on disk.

Shared by `kgreasoner kg serve` and the test fixture that gives the `sparql` backend a live
endpoint, so both start, probe and stop the server the same way.
"""

from __future__ import annotations

import ctypes
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import httpx
import tenacity

from kgreasoner.kg.base import KGError

LOOPBACK = "127.0.0.1"
_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def oxigraph_executable() -> str:
    """The `oxigraph` command: the one installed beside this Python first, else the one on PATH."""
    beside = Path(sys.executable).parent / "oxigraph"
    if beside.exists():
        return str(beside)
    found = shutil.which("oxigraph")
    if found is None:
        raise FileNotFoundError("the `oxigraph` command is not installed (pip install oxigraph)")
    return found


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port that is free on `host` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class OxigraphServer:
    """A running `oxigraph serve` process; `url` is the SPARQL query endpoint."""

    url: str
    process: subprocess.Popen
    log: IO[bytes] | None = field(default=None, repr=False)

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the server (kill it if it does not exit within `timeout`)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.log is not None:
            self.log.close()
            self.log = None

    def __enter__(self) -> OxigraphServer:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def start_oxigraph_server(
    store_dir: str | Path,
    host: str = LOOPBACK,
    port: int | None = None,
    read_only: bool = True,
    timeout_s: int | None = None,
    capture_output: bool = True,
    startup_timeout: float = 30.0,
) -> OxigraphServer:
    """Start `oxigraph serve[-read-only]` over `store_dir` and wait until it answers a query.

    Args:
        port: None picks a free port.
        read_only: `serve-read-only` (the store may be shared with other readers) or `serve`.
        timeout_s: the server's own per-query timeout, in seconds.
        capture_output: keep the server's output in a temporary file (shown if startup fails)
            instead of passing it through to this process's terminal.

    On Linux the server is stopped when the thread that started it ends (PR_SET_PDEATHSIG):
    start it from the main thread, or from a thread that outlives its use.
    """
    store_dir = Path(store_dir)
    if not store_dir.is_dir():
        raise FileNotFoundError(f"no oxigraph store at {store_dir}; build one with `kgreasoner kg load`")
    port = free_port(host) if port is None else port
    command = [
        oxigraph_executable(),
        "serve-read-only" if read_only else "serve",
        "--location",
        str(store_dir),
        "--bind",
        f"{host}:{port}",
    ]
    if timeout_s is not None:
        command += ["--timeout-s", str(timeout_s)]
    log = tempfile.TemporaryFile() if capture_output else None
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT if log else None, preexec_fn=_die_with_parent
    )
    url_host = f"[{host}]" if ":" in host else host
    server = OxigraphServer(url=f"http://{url_host}:{port}/query", process=process, log=log)
    try:
        _wait_until_ready(server, startup_timeout)
    except BaseException:
        server.stop()
        raise
    return server


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, ask to be sent SIGTERM when the parent dies, so a
    killed test run or `kg serve` does not leave a server behind. Elsewhere: nothing."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _wait_until_ready(server: OxigraphServer, timeout: float) -> None:
    """Ask `ASK {}` every 50 ms until the server answers 2xx; its exit or `timeout` seconds is a KGError."""

    def probe(client: httpx.Client) -> None:
        if server.process.poll() is not None:
            raise KGError(
                f"oxigraph server for {server.url} exited with code {server.process.returncode}: {_output(server)}"
            )
        client.get(server.url, params={"query": "ASK {}"}).raise_for_status()

    retrying = tenacity.Retrying(
        stop=tenacity.stop_after_delay(timeout),
        wait=tenacity.wait_fixed(0.05),
        retry=tenacity.retry_if_exception_type(httpx.HTTPError),
        reraise=True,
    )
    with httpx.Client(timeout=2.0) as client:
        try:
            retrying(probe, client)
        except httpx.HTTPError as err:
            raise KGError(
                f"oxigraph server at {server.url} did not answer within {timeout:.0f} s: {_output(server)}"
            ) from err


def _output(server: OxigraphServer) -> str:
    if server.log is None:
        return "(output went to the terminal)"
    server.log.seek(0)
    return server.log.read().decode("utf-8", "replace").strip()[-2000:] or "(no output)"
