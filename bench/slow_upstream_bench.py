"""Fast requests beside slow ones, and a slow one past its deadline, on an `openai:` backend.

    .venv/bin/python bench/slow_upstream_bench.py [--fast 24] [--slow 8] [--slow-turn 4] [--timeout 3]

No LLM runs here: the generation server is a stand-in on 127.0.0.1 that answers every turn after
`--fast-turn` seconds (0.1), except for questions starting `Slowly:`, whose turns take `--slow-turn`
seconds (4). Each question takes two turns: a search of its topic's handle, then an answer (one
turn, the answer, for questions that also start `At once:`). The
script starts `kgreasoner serve --llm openai:STAND-IN` (the kgreasoner on PYTHONPATH, else the
installed one, so the same script measures any checkout) and prints:

- fast alone: `--fast` requests sent at once; their p50 / p95 / max latency;
- fast + slow: `--slow` slow requests, then `--fast` fast ones at once: the fast ones' latencies;
- lone slow: one slow request of one turn, then one of two, on a server with
  `request_timeout: --timeout`: its status, its latency and whether the stand-in saw its calls
  abandoned (the client hung up) or answered them.

Measured on 2 shared cores (load 1) with the defaults;
before: one rollout batch at a time, rows in lockstep, the deadline asked between turns only;
after: each request its own rollout on a generation server, its deadline bounding each upstream call:

    case                                before p50 / p95 / max        after p50 / p95 / max
    24 fast alone                       1.04 / 1.30 / 1.36 s          0.76 / 0.83 / 0.83 s
    24 fast beside 8 slow               8.66 / 8.81 / 8.96 s          1.02 / 1.23 / 1.23 s
    lone slow (1 turn), timeout 3 s     200 after 4.04 s, answered    504 after 3.07 s, abandoned
    lone slow (2 turns), timeout 3 s    504 after 4.05 s, answered    504 after 3.03 s, abandoned
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import yaml

SLOW = "Slowly:"
AT_ONCE = "At once:"
SEARCH_TURN = "<think> look it up <search>E1</search>"
"""The stand-in's first turn (the server puts back the stop tag it cut)."""


class StandIn(ThreadingHTTPServer):
    """The stand-in generation server (`/v1/completions`); `outcomes` notes how each slow call ended."""

    daemon_threads = True

    def __init__(self, fast_turn: float, slow_turn: float) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fast_turn, self.slow_turn = fast_turn, slow_turn
        self.outcomes: list[str] = []


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: StandIn

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        prompt = body["prompt"]
        slow = SLOW in prompt
        if (
            SEARCH_TURN in prompt or AT_ONCE in prompt
        ):  # its search went in (with the tool's block): answer the handle it showed
            text, stop = "<think> found it </think>\n<answer>E1", "</answer>"
        else:
            text, stop = SEARCH_TURN.removesuffix("</search>"), "</search>"
        if not self._hold(self.server.slow_turn if slow else self.server.fast_turn):
            self.server.outcomes.append("abandoned")
            self.close_connection = True
            return
        if slow:
            self.server.outcomes.append("answered")
        raw = json.dumps(
            {
                "choices": [{"text": text, "finish_reason": "stop", "stop_reason": stop}],
                "usage": {"completion_tokens": 8},
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _hold(self, seconds: float) -> bool:
        """Wait `seconds` as a model generating would; False when the client hung up meanwhile."""
        end = time.monotonic() + seconds
        while (left := end - time.monotonic()) > 0:
            readable, _, _ = select.select([self.connection], [], [], min(left, 0.05))
            if readable:
                try:
                    if self.connection.recv(1, socket.MSG_PEEK) == b"":
                        return False
                except OSError:
                    return False
        return True

    def log_message(self, *args: Any) -> None:
        pass


def start_server(upstream: str, data: Path, config: Path, cwd: Path) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "kgreasoner.cli", "serve", "--llm", f"openai:{upstream}#stand-in"]
    command += ["--kg", str(data), "--config", str(config), "--host", "127.0.0.1", "--port", "0"]
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in process.stdout:
        match = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        if match:
            threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
            url = match.group(1)
            break
    else:
        raise RuntimeError(f"kgreasoner serve exited with {process.wait()}")
    end = time.monotonic() + 120
    while time.monotonic() < end:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError(f"{url}/health did not answer")


def ask(url: str, body: dict) -> tuple[int, float]:
    start = time.perf_counter()
    reply = httpx.post(f"{url}/v1/answer", json=body, timeout=600)
    return reply.status_code, time.perf_counter() - start


def spread(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):>7.2f} {p95:>7.2f} {ordered[-1]:>7.2f}"


def run_mix(url: str, fast: list[dict], slow: list[dict]) -> tuple[list[float], list[int]]:
    """The fast requests' latencies (all sent once the slow ones are), and every status."""
    with concurrent.futures.ThreadPoolExecutor(len(fast) + len(slow)) as pool:
        slow_futures = [pool.submit(ask, url, body) for body in slow]
        fast_futures = [pool.submit(ask, url, body) for body in fast]
        fast_results = [f.result() for f in fast_futures]
        statuses = [status for status, _ in fast_results] + [f.result()[0] for f in slow_futures]
    return [seconds for _, seconds in fast_results], statuses


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--fast", type=int, default=24, help="fast requests")
    parser.add_argument("--slow", type=int, default=8, help="slow requests beside them")
    parser.add_argument("--fast-turn", type=float, default=0.1, help="seconds the stand-in takes per fast turn")
    parser.add_argument("--slow-turn", type=float, default=4.0, help="seconds the stand-in takes per slow turn")
    parser.add_argument("--timeout", type=float, default=3.0, help="request_timeout of the lone slow request")
    args = parser.parse_args()
    from data_gen.synthetic import write_synthetic
    from kgreasoner.data import load_dataset

    upstream = StandIn(args.fast_turn, args.slow_turn)
    threading.Thread(target=upstream.serve_forever, daemon=True).start()
    upstream_url = f"http://127.0.0.1:{upstream.server_address[1]}/v1"
    with tempfile.TemporaryDirectory(prefix="slow-upstream-bench-") as tmp:
        tmp = Path(tmp)
        data = write_synthetic(tmp / "data", seed=0)
        examples = load_dataset(data, split="test").examples

        def body(i: int, slow: bool, at_once: bool = False) -> dict:
            e = examples[i % len(examples)]
            question = f"{SLOW} {AT_ONCE if at_once else ''} {e.question}" if slow else e.question
            return {"question": question, "topic_entities": [{"id": t.id} for t in e.topic_entities]}

        fast = [body(i, False) for i in range(args.fast)]
        slow = [body(i, True) for i in range(args.slow)]
        base = {"tool": {"entity_handles": True, "top_k": 10}, "rollout": {"max_turns": 3}, "max_queue": 1024}
        print(
            f"openai backend over a stand-in: fast turn {args.fast_turn:g} s, slow turn {args.slow_turn:g} s, "
            f"2 turns a question, {os.cpu_count()} CPUs (load {os.getloadavg()[0]:.1f})"
        )
        print(f"{'case':<34} {'p50 s':>7} {'p95 s':>7} {'max s':>7}  statuses")
        for timeout, cases in ((120.0, ("fast", "mix")), (args.timeout, ("lone 1", "lone 2"))):
            config = tmp / f"serve-{timeout:g}.yaml"
            config.write_text(yaml.safe_dump({**base, "request_timeout": timeout}), encoding="utf-8")
            process, url = start_server(upstream_url, data, config, cwd=tmp)
            try:
                ask(url, fast[0])  # warm-up
                for case in cases:
                    if case == "fast":
                        latencies, statuses = run_mix(url, fast, [])
                        name = f"{args.fast} fast alone"
                    elif case == "mix":
                        latencies, statuses = run_mix(url, fast, slow)
                        name = f"{args.fast} fast beside {args.slow} slow"
                    else:
                        upstream.outcomes.clear()
                        turns = int(case.split()[1])
                        status, seconds = ask(url, body(0, True, at_once=turns == 1))
                        time.sleep(0.5)  # let the stand-in note how the call ended
                        latencies, statuses = [seconds], [status]
                        name = f"lone slow ({turns} turn{'s' * (turns > 1)}), timeout {timeout:g} s"
                    counts = {s: statuses.count(s) for s in sorted(set(statuses))}
                    extra = f"; upstream calls {', '.join(upstream.outcomes)}" if case.startswith("lone") else ""
                    print(f"{name:<34} {spread(latencies)}  {counts}{extra}", flush=True)
            finally:
                process.terminate()
                process.wait(timeout=60)
    upstream.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
