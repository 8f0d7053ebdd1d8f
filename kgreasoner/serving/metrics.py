"""Counters and histograms of the HTTP service, rendered in the Prometheus text format (0.0.4).

No client library: the service exposes a handful of series, and the text format is a few lines.
Every method is thread-safe (the batching worker and the event loop both record).
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter
from typing import Any, Callable

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Seconds; from a cached tiny-model answer to a long trajectory of a large model."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Histogram:
    """Cumulative buckets, sum and count per label tuple."""

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = tuple(sorted(buckets))
        self.series: dict[tuple, list] = {}

    def observe(self, labels: tuple, value: float) -> None:
        counts, total = self.series.setdefault(labels, [[0] * (len(self.buckets) + 1), 0.0])
        counts[bisect.bisect_left(self.buckets, value)] += 1
        self.series[labels][1] = total + value

    def lines(self, name: str, label_names: tuple[str, ...]) -> list[str]:
        out = []
        for labels, (counts, total) in sorted(self.series.items()):
            base = list(zip(label_names, labels))
            running = 0
            for bound, count in zip((*self.buckets, float("inf")), counts):
                running += count
                le = "+Inf" if bound == float("inf") else _number(bound)
                out.append(f"{name}_bucket{_labels(base + [('le', le)])} {running}")
            out.append(f"{name}_sum{_labels(base)} {_number(total)}")
            out.append(f"{name}_count{_labels(base)} {running}")
        return out


class Metrics:
    """What `/metrics` shows: requests, errors, latency, tool calls, tokens, batches, queue."""

    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]] | None = None) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, str]] = Counter()
        self.errors: Counter[tuple[str, str]] = Counter()
        self.latency = Histogram(LATENCY_BUCKETS)
        self.tool_calls: Counter[str] = Counter()
        self.finish_reasons: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()
        self.batch_sizes = Histogram(BATCH_BUCKETS)
        self.gauges = dict(gauges or {})
        """name -> (help, callable read at render time)."""

    def observe_request(self, endpoint: str, status: int, seconds: float, error_kind: str | None = None) -> None:
        with self._lock:
            self.requests[(endpoint, str(status))] += 1
            self.latency.observe((endpoint,), seconds)
            if status >= 400:
                self.errors[(endpoint, error_kind or _status_kind(status))] += 1

    def observe_answer(self, record: dict[str, Any]) -> None:
        """Tool calls (by error kind, `none` for a successful call), finish reason and tokens of one answer."""
        with self._lock:
            self.finish_reasons[str(record.get("finish_reason"))] += 1
            for search in record.get("searches") or []:
                self.tool_calls[search.get("error") or "none"] += 1
            usage = record.get("usage") or {}
            for kind in ("prompt_tokens", "completion_tokens", "tool_tokens"):
                if usage.get(kind) is not None:
                    self.tokens[kind.removesuffix("_tokens")] += int(usage[kind])

    def observe_batch(self, size: int, seconds: float) -> None:
        with self._lock:
            self.batch_sizes.observe((), size)

    def render(self) -> str:
        with self._lock:
            lines: list[str] = []
            _family(lines, "kgreasoner_requests_total", "counter", "HTTP requests by endpoint and status code.",
                    [(_labels([("endpoint", e), ("status", s)]), n) for (e, s), n in sorted(self.requests.items())])
            _family(lines, "kgreasoner_request_errors_total", "counter",
                    "HTTP requests answered with a 4xx or 5xx status, by endpoint and error kind.",
                    [(_labels([("endpoint", e), ("kind", k)]), n) for (e, k), n in sorted(self.errors.items())])
            lines += ["# HELP kgreasoner_request_duration_seconds Time from request to response, by endpoint.",
                      "# TYPE kgreasoner_request_duration_seconds histogram"]
            lines += self.latency.lines("kgreasoner_request_duration_seconds", ("endpoint",))
            _family(lines, "kgreasoner_tool_calls_total", "counter",
                    "KG search tool calls resolved by the server, by error kind (none: triples or a clean result).",
                    [(_labels([("error", k)]), n) for k, n in sorted(self.tool_calls.items())])
            _family(lines, "kgreasoner_answers_total", "counter", "Finished trajectories by finish reason.",
                    [(_labels([("finish_reason", k)]), n) for k, n in sorted(self.finish_reasons.items())])
            _family(lines, "kgreasoner_tokens_total", "counter",
                    "Tokens of answered trajectories: prompt, completion (model-written) and tool (inserted).",
                    [(_labels([("kind", k)]), n) for k, n in sorted(self.tokens.items())])
            lines += ["# HELP kgreasoner_batch_size Requests generated together in one rollout batch.",
                      "# TYPE kgreasoner_batch_size histogram"]
            lines += self.batch_sizes.lines("kgreasoner_batch_size", ())
        for name, (help_text, read) in sorted(self.gauges.items()):
            _family(lines, name, "gauge", help_text, [("", read())])
        return "\n".join(lines) + "\n"


def _family(lines: list[str], name: str, kind: str, help_text: str, samples: list[tuple[str, float]]) -> None:
    lines.append(f"# HELP {name} {help_text}")
    lines.append(f"# TYPE {name} {kind}")
    lines.extend(f"{name}{labels} {_number(value)}" for labels, value in samples)


def _labels(pairs: list[tuple[str, str]]) -> str:
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in pairs) + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int) or float(value).is_integer():
        return str(int(value))
    return repr(float(value))


def _status_kind(status: int) -> str:
    return {400: "bad_request", 404: "not_found", 405: "method_not_allowed", 413: "too_large",
            422: "invalid_request", 503: "unavailable", 504: "timeout"}.get(status, "client_error" if status < 500 else "server_error")
