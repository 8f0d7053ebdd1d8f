"""The service over a real `oxigraph serve` SPARQL endpoint that is killed and restarted.

During an outage every request that needs the KG gets 503 with Retry-After (never 500), a
trajectory that finished is never lost, and the service recovers by itself once the endpoint is back.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
import time

import httpx
import pytest
import yaml

from kgreasoner.config import from_dict
from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.kg.server import free_port, start_oxigraph_server
from kgreasoner.kg.sparql import SparqlKG
from kgreasoner.serving.app import RETRY_AFTER_SECONDS, create_app
from kgreasoner.serving.config import ServeConfig
from kgreasoner.serving.service import AnswerService, open_backend

from .conftest import SERVE_CONFIG, serve
from .test_http import _body, _questions
from .test_service import _serve_in_thread


class Endpoint:
    """`oxigraph serve-read-only` over one store, on one fixed 127.0.0.1 port, that can be killed and restarted."""

    def __init__(self, store) -> None:
        self.store = store
        self.port = free_port()
        self.server = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/query"

    def start(self) -> None:
        self.server = start_oxigraph_server(self.store, port=self.port)

    def kill(self) -> None:
        self.server.process.kill()  # SIGKILL: an outage, not a clean shutdown
        self.server.stop()


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory, synthetic_dir):
    store = tmp_path_factory.mktemp("serve_store") / "store"
    OxigraphKG.build(synthetic_dir, store).close()
    endpoint = Endpoint(store)
    yield endpoint
    endpoint.server.stop()


@pytest.fixture()
def sparql_service(checkpoint, endpoint):
    config = from_dict(ServeConfig, {**SERVE_CONFIG, "llm": f"hf:{checkpoint}", "kg": f"sparql:{endpoint.url}"})
    backend, name, close = open_backend(config)
    service = AnswerService(
        config, backend, SparqlKG(endpoint.url, retries=1, backoff=0.05), model_name=name, close=close
    )
    yield service
    service.close()


def _unavailable(reply: httpx.Response, param: str) -> None:
    assert reply.status_code == 503, reply.text
    assert reply.headers["retry-after"] == str(RETRY_AFTER_SECONDS)
    error = reply.json()["error"]
    assert error["type"] == "kg_unavailable" and error["param"] == param and error["code"] == 503
    assert error["message"].startswith(f"{param}: the knowledge graph could not be queried: SPARQL endpoint ")


def test_both_endpoints_answer_503_with_retry_after_during_an_outage(sparql_service, endpoint, dataset):
    [example] = _questions(dataset, 1)
    name = example.topic_entities[0].name
    chat = {"messages": [{"role": "user", "content": f"{example.question} Topic Entity: {name}, {name}"}]}
    server, thread, url = _serve_in_thread(create_app(sparql_service))
    try:
        endpoint.kill()
        try:
            _unavailable(httpx.post(f"{url}/v1/answer", json=_body(example), timeout=60), "topic_entities[0]")
            _unavailable(httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60), "messages[0].content")
        finally:
            endpoint.start()
        assert httpx.post(f"{url}/v1/answer", json=_body(example), timeout=60).status_code == 200
        reply = httpx.post(f"{url}/v1/chat/completions", json=chat, timeout=60)
        assert reply.status_code == 200, reply.text
        assert [t["id"] for t in reply.json()["trajectory"]["topic_entities"]] == [example.topic_entities[0].id] * 2
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_health_says_degraded_with_503_while_the_kg_endpoint_is_down(sparql_service, endpoint):
    server, thread, url = _serve_in_thread(create_app(sparql_service))
    try:
        reply = httpx.get(f"{url}/health", timeout=30)
        assert reply.status_code == 200 and reply.json()["status"] == "ok" and reply.json()["kg"] == {"status": "ok"}
        endpoint.kill()
        try:
            reply = httpx.get(f"{url}/health", timeout=30)
            assert reply.status_code == 503 and reply.headers["retry-after"] == str(RETRY_AFTER_SECONDS)
            body = reply.json()
            assert body["status"] == "degraded" and body["kg"]["status"] == "unavailable"
            assert body["kg"]["error"].startswith(f"SPARQL endpoint {endpoint.url} did not answer: ")
            assert httpx.head(f"{url}/health", timeout=30).status_code == 503
        finally:
            endpoint.start()
        assert httpx.get(f"{url}/health", timeout=30).json()["status"] == "ok"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_trajectory_finished_before_the_kg_died_is_kept_whole(sparql_service, endpoint, dataset):
    examples = _questions(dataset, 4)
    requests = [sparql_service.prepare(e.question, [{"id": e.topic_entities[0].id}]) for e in examples]
    answered = sparql_service.answer(requests)
    endpoint.kill()
    try:
        records = [sparql_service.record(a) for a in answered]
    finally:
        endpoint.start()
    for record, done, example in zip(records, answered, examples):
        assert record["trajectory"] == done.trajectory.text and record["answers"] == list(
            done.trajectory.resolved_answers
        )
        first = record["searches"][0]
        assert first["entity"] == example.topic_entities[0].id and first["label"] == example.topic_entities[0].name
        for search in record["searches"]:  # each call carried its label: the dead KG is not asked
            assert (search["label"] is None) == (search["entity"] is None)


@pytest.mark.slow
def test_kill_and_restart_under_load(checkpoint, endpoint, dataset, tmp_path):
    """`kgreasoner serve` over the endpoint, 4 clients sending all along: up, killed for a while, restarted."""
    config = tmp_path / "serve.yaml"
    config.write_text(yaml.safe_dump({**SERVE_CONFIG, "torch_threads": 1}), encoding="utf-8")
    examples = _questions(dataset, 8)
    bodies = [_body(e) for e in examples] + [
        {"question": e.question, "topic_entities": [e.topic_entities[0].name]} for e in examples
    ]
    phase = ["up"]
    replies: dict[str, list[httpx.Response]] = collections.defaultdict(list)
    stop = threading.Event()

    def client(start: int) -> None:
        for i in range(start, 10_000, 4):
            if stop.is_set():
                return
            sent_in = phase[0]
            reply = httpx.post(f"{url}/v1/answer", json=bodies[i % len(bodies)], timeout=60)
            replies[f"{sent_in}->{phase[0]}"].append(reply)

    def wait_for(condition, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while not condition():
            assert time.monotonic() < deadline, {k: [r.status_code for r in v] for k, v in replies.items()}
            time.sleep(0.1)

    with serve(checkpoint, f"sparql:{endpoint.url}", config) as url:
        with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
            clients = [pool.submit(client, start) for start in range(4)]
            try:
                wait_for(lambda: len(replies["up->up"]) >= 8, 60)
                phase[0] = "down"
                endpoint.kill()
                try:
                    wait_for(lambda: sum(r.status_code == 503 for r in replies["down->down"]) >= 4, 60)
                finally:
                    phase[0] = "back"
                    endpoint.start()
                wait_for(lambda: sum(r.status_code == 200 for r in replies["back->back"]) >= 8, 60)
            finally:
                stop.set()
                for future in clients:
                    future.result()
    statuses = {key: collections.Counter(r.status_code for r in group) for key, group in replies.items()}
    assert set(statuses["up->up"]) == {200}, statuses
    assert set().union(*statuses.values()) <= {200, 503}, statuses  # never a 500, never a lost answer
    assert statuses["down->down"][503] >= 4 and statuses["back->back"][200] >= 8, statuses
    for reply in (r for group in replies.values() for r in group):
        if reply.status_code == 503:
            _unavailable(reply, "topic_entities[0]")
        else:
            assert reply.json()["trajectory"].startswith("<think>")


def test_an_endpoint_that_refuses_queries_is_a_502_not_an_outage(checkpoint, endpoint, dataset):
    refusing = endpoint.url.replace("/query", "/update")  # a read-only server answers 403 to every query there
    config = from_dict(ServeConfig, {**SERVE_CONFIG, "llm": f"hf:{checkpoint}", "kg": f"sparql:{refusing}"})
    backend, name, close = open_backend(config)
    kg = SparqlKG(refusing, retries=3, backoff=0.05)
    service = AnswerService(config, backend, kg, model_name=name, close=close)
    server, thread, url = _serve_in_thread(create_app(service))
    try:
        [example] = _questions(dataset, 1)
        reply = httpx.post(f"{url}/v1/answer", json=_body(example), timeout=60)
        assert reply.status_code == 502 and "retry-after" not in reply.headers
        error = reply.json()["error"]
        assert (error["type"], error["param"]) == ("kg_rejected", "topic_entities[0]")
        assert error["message"].startswith(
            f"topic_entities[0]: the knowledge graph refused the query: SPARQL endpoint "
            f"{refusing} rejected a query: HTTP 403"
        )
        assert kg.queries_sent == 1  # not retried
        health = httpx.get(f"{url}/health", timeout=30)
        assert health.status_code == 503 and health.json()["kg"]["error"].startswith(
            f"SPARQL endpoint {refusing} rejected a query: HTTP 403"
        )
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        service.close()
