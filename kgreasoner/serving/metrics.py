"""Counters and histograms of the HTTP service, exposed by `prometheus_client` in the Prometheus
text format (0.0.4) at `/metrics`.

Each `Metrics` has its own registry, so several services (or tests) in one process count apart.
prometheus_client's metrics are thread-safe: the batching worker and the event loop both record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Seconds; from a cached tiny-model answer to a long trajectory of a large model."""
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4


class _Gauges(Collector):
    """Gauges read when `/metrics` is scraped: name -> (help, callable)."""

    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]]) -> None:
        self.gauges = gauges

    def collect(self) -> Iterator[Metric]:
        for name, (help_text, read) in sorted(self.gauges.items()):
            yield GaugeMetricFamily(name, help_text, value=read())


class Metrics:
    """What `/metrics` shows: requests, errors, latency, tool calls, tokens, batches, queue."""

    def __init__(self, gauges: dict[str, tuple[str, Callable[[], float]]] | None = None) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "kgreasoner_requests", "HTTP requests by endpoint and status code.", ["endpoint", "status"], registry=r
        )
        self.errors = Counter(
            "kgreasoner_request_errors",
            "HTTP requests answered with a 4xx or 5xx status, by endpoint and error kind.",
            ["endpoint", "kind"],
            registry=r,
        )
        self.latency = Histogram(
            "kgreasoner_request_duration_seconds",
            "Time from request to response, by endpoint.",
            ["endpoint"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tool_calls = Counter(
            "kgreasoner_tool_calls",
            "KG search tool calls resolved by the server, by error kind (none: triples or a clean result).",
            ["error"],
            registry=r,
        )
        self.finish_reasons = Counter(
            "kgreasoner_answers", "Finished trajectories by finish reason.", ["finish_reason"], registry=r
        )
        self.tokens = Counter(
            "kgreasoner_tokens",
            "Tokens of answered trajectories: prompt, completion (model-written) and tool (inserted).",
            ["kind"],
            registry=r,
        )
        self.batch_sizes = Histogram(
            "kgreasoner_batch_size",
            "Requests generated together in one rollout batch.",
            buckets=BATCH_BUCKETS,
            registry=r,
        )
        self.gauges = dict(gauges or {})
        """name -> (help, callable read at scrape time); entries may be added until the first scrape and after."""
        r.register(_Gauges(self.gauges))

    def observe_request(self, endpoint: str, status: int, seconds: float, error_kind: str | None = None) -> None:
        self.requests.labels(endpoint, str(status)).inc()
        self.latency.labels(endpoint).observe(seconds)
        if status >= 400:
            self.errors.labels(endpoint, error_kind or _status_kind(status)).inc()

    def observe_answer(self, record: dict[str, Any]) -> None:
        """Tool calls (by error kind, `none` for a successful call), finish reason and tokens of one answer."""
        self.finish_reasons.labels(str(record.get("finish_reason"))).inc()
        for search in record.get("searches") or []:
            self.tool_calls.labels(search.get("error") or "none").inc()
        usage = record.get("usage") or {}
        for kind in ("prompt_tokens", "completion_tokens", "tool_tokens"):
            if usage.get(kind) is not None:
                self.tokens.labels(kind.removesuffix("_tokens")).inc(int(usage[kind]))

    def observe_batch(self, size: int, seconds: float) -> None:
        self.batch_sizes.observe(size)

    def render(self) -> str:
        return generate_latest(self.registry).decode("utf-8")


def _status_kind(status: int) -> str:
    return {
        400: "bad_request",
        404: "not_found",
        405: "method_not_allowed",
        413: "too_large",
        422: "invalid_request",
        503: "unavailable",
        504: "timeout",
    }.get(status, "client_error" if status < 500 else "server_error")
