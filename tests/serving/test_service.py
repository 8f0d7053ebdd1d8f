"""Timeouts with an in-process uvicorn server, the `kgreasoner answer` command, trace and metrics text."""

from __future__ import annotations

import dataclasses
import json
import re
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from kgreasoner.cli import main
from kgreasoner.config import from_dict
from kgreasoner.kg.base import KGError
from kgreasoner.records.schema import TopicEntity
from kgreasoner.rollout import RolloutEngine
from kgreasoner.serving.answer import render_trace
from kgreasoner.serving.app import create_app
from kgreasoner.serving.config import ServeConfig
from kgreasoner.serving.deadlines import Deadlines
from kgreasoner.serving.metrics import Metrics
from kgreasoner.serving.service import AnswerService
from kgreasoner.serving.validation import AnswerOptions, RequestError

from .conftest import SERVE_CONFIG


@pytest.fixture(scope="module")
def service(checkpoint, synthetic_dir):
    config = from_dict(ServeConfig, {**SERVE_CONFIG, "llm": f"hf:{checkpoint}", "kg": str(synthetic_dir)})
    service = AnswerService.open(config)
    yield service
    service.close()


def _serve_in_thread(app):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.05)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


def test_request_timeout_gives_504_and_the_server_keeps_serving(service, dataset):
    example = dataset.examples[0]
    body = {"question": example.question, "topic_entities": [{"id": t.id} for t in example.topic_entities]}
    service.config.request_timeout = 1e-4  # past before the first token
    server, thread, url = _serve_in_thread(create_app(service))
    try:
        reply = httpx.post(f"{url}/v1/answer", json=body, timeout=30)
        assert reply.status_code == 504
        assert reply.json()["error"] == {
            "message": "no answer within the request timeout of 0.0001 s",
            "type": "timeout",
            "param": None,
            "code": 504,
        }
        service.config.request_timeout = 60.0
        assert httpx.post(f"{url}/v1/answer", json=body, timeout=60).status_code == 200
        metrics = httpx.get(f"{url}/metrics", timeout=10).text
        assert 'kgreasoner_request_errors_total{endpoint="/v1/answer",kind="timeout"} 1' in metrics
    finally:
        service.config.request_timeout = 60.0
        server.should_exit = True
        thread.join(timeout=10)


def test_a_deadline_stops_generation_mid_row(service, dataset):
    example = dataset.examples[0]
    request = service.prepare(example.question, [{"id": example.topic_entities[0].id}])
    request.deadline = time.monotonic() - 1
    [late] = service._run_batch([request])
    assert late.timed_out and late.trajectory is None
    request = service.prepare(example.question, [{"id": example.topic_entities[0].id}])
    engine = service._engine(request.rollout)
    deadlines = Deadlines({0: time.monotonic() - 1}, 0.5)  # passes during the prefill
    [trajectory] = engine.run(
        [{"question": example.question, "topic_entities": list(example.topic_entities)}],
        [service.tool.session(example.question, list(example.topic_entities))],
        halt=deadlines,
    )
    assert (trajectory.finish_reason, trajectory.error) == (
        "error",
        "generation stopped: the request timeout (0.5 s) passed",
    )
    assert len(trajectory.completion_ids) == 1 and trajectory.error_kind == "halt"  # stopped at its first token
    # The stop rule belongs to that run only: the next one runs to its end.
    [trajectory] = engine.run(
        [{"question": example.question, "topic_entities": list(example.topic_entities)}],
        [service.tool.session(example.question, list(example.topic_entities))],
    )
    # (the tiny model may still end in a format error of its own: what must not recur is the deadline's stop)
    assert "request timeout" not in (trajectory.error or "") and len(trajectory.completion_ids) > 1


def test_prepare_names_the_field(service, dataset):
    topic = dataset.examples[0].topic_entities[0]
    with pytest.raises(RequestError, match=r"^options.max_new_tokens: 97 is above this server's limit of 96$"):
        service.prepare("q?", [topic.name], AnswerOptions(max_new_tokens=97))
    with pytest.raises(RequestError, match=r"^options: top_p must be in \(0, 1\], got 2"):
        service.prepare("q?", [topic.name], AnswerOptions(top_p=2.0))
    with pytest.raises(RequestError, match=r"^topic_entities\[0\]: must be a string or an object"):
        service.prepare("q?", [3])
    request = service.prepare("  q?  ", [topic.name], AnswerOptions(max_turns=1, temperature=0.5, seed=3))
    assert request.question == "q?" and request.topic_entities[0].id == topic.id
    assert request.rollout.max_turns == 1 and request.rollout.max_new_tokens == 96
    assert (request.sampling.temperature, request.sampling.seed) == (0.5, 3)


def test_answer_command_prints_traces_and_json(
    checkpoint, synthetic_dir, serve_config_file, dataset, tmp_path, capsys
):
    example = dataset.examples[0]
    topic = example.topic_entities[0]
    args = ["answer", "--model", str(checkpoint), "--kg", str(synthetic_dir), "--config", str(serve_config_file)]
    assert main(args + ["--question", example.question, "--topic", topic.name, "--color", "never"]) == 0
    trace = capsys.readouterr().out
    assert trace.startswith(f"Q q1: {example.question}\n  topic: {topic.name} ({topic.id})\n")
    assert f"  search    E1 -> {topic.name}  [" in trace and "finish: " in trace

    questions = tmp_path / "qs.jsonl"
    questions.write_text("".join(json.dumps(e.to_dict()) + "\n" for e in dataset.examples[:3]), encoding="utf-8")
    out = tmp_path / "answers.jsonl"
    assert main(args + ["--questions", str(questions), "--json", "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in records] == [e.id for e in dataset.examples[:3]]
    for record, example in zip(records, dataset.examples[:3]):
        assert record["gold"] == example.answer_names and isinstance(record["hit"], bool)
        assert record["searches"][0]["entity"] == example.topic_entities[0].id
    assert re.search(r"\nHits@1 \d\.\d{3} over 3 questions\n$", capsys.readouterr().err)  # after a loading bar

    questions.write_text(json.dumps({"question": "q?", "topic_entities": ["Nobody Known"]}) + "\n", encoding="utf-8")
    assert main(args + ["--questions", str(questions)]) == 1
    assert capsys.readouterr().err.endswith(
        f"kgreasoner answer: error: {questions}:1: topic_entities[0]: no entity named "
        "'Nobody Known' in the knowledge graph\n"
    )


def test_render_trace_shows_searches_backtracks_and_the_answer():
    text = (
        "<think> first Utah. <search>E1</search>\n<triples>\n(E1 Utah, capital, E2 Salt Lake City)\n</triples>\n"
        "wrong way. <search>E2 | backtrack</search>\n<triples>\nNothing left to backtrack to.\n</triples>\n"
        "</think>\n<answer>E2</answer>"
    )
    record = {
        "id": "q7",
        "question": "what is the capital of utah",
        "topic_entities": [{"id": "m.utah", "name": "Utah"}],
        "answers": ["Salt Lake City"],
        "finish_reason": "answer",
        "error": None,
        "trajectory": text,
        "searches": [
            {"query": "E1", "label": "Utah", "backtrack": False, "error": None, "num_triples": 1, "truncated": False},
            {
                "query": "E2 | backtrack",
                "label": "Salt Lake City",
                "backtrack": True,
                "error": "backtrack_at_root",
                "num_triples": 0,
                "truncated": False,
            },
        ],
        "usage": {"searches": 1, "backtracks": 1, "completion_tokens": 20, "seconds": 0.5},
        "gold": ["Salt Lake City"],
        "hit": True,
    }
    assert render_trace(record) == "\n".join(
        [
            "Q q7: what is the capital of utah",
            "  topic: Utah (m.utah)",
            "  think    first Utah.",
            "  search    E1 -> Utah  [1 triples]",
            "           (E1 Utah, capital, E2 Salt Lake City)",
            "  think    wrong way.",
            "  backtrack E2 | backtrack -> Salt Lake City  [backtrack_at_root]",
            "           Nothing left to backtrack to.",
            "  answer   E2 = Salt Lake City",
            "  finish: answer; 1 searches; 1 backtracks; 20 model tokens; 0.50 s; correct (gold: Salt Lake City)",
        ]
    )
    assert "\033[" in render_trace(record, color=True)


def test_render_trace_escapes_the_control_characters_of_every_text_it_shows():
    """Question, topic, model text, tool lines, labels, answers and error come from users, the KB and the model:
    an ANSI escape or a newline among them is shown as an escape, never sent to the terminal."""
    clear, csi, rtl = "\x1b[2J", "\x9b31m", "\u202e"
    record = {
        "id": f"q{clear}",
        "question": f"capital{clear} of utah\nQ forged",
        "topic_entities": [{"id": f"m.utah{csi}", "name": f"Utah{rtl}"}],
        "answers": [f"Salt{clear} Lake City"],
        "finish_reason": "answer",
        "error": f"late{clear}",
        "trajectory": f"<think> first{csi} Utah. <search>E1{clear}</search>\n<triples>\n(E1 Utah, motto, {clear})\n"
        f"</triples>\n</think>\n<answer>E2{csi}</answer>",
        "searches": [
            {
                "query": "E1",
                "label": f"Utah{clear}",
                "backtrack": False,
                "error": None,
                "num_triples": 1,
                "truncated": False,
            }
        ],
        "usage": {"searches": 1, "backtracks": 0, "seconds": 0.5},
        "gold": [f"Salt Lake City{clear}"],
        "hit": False,
    }
    assert render_trace(record) == "\n".join(
        [
            "Q q\\x1b[2J: capital\\x1b[2J of utah\\nQ forged",
            "  topic: Utah\\u202e (m.utah\\x9b31m)",
            "  think    first\\x9b31m Utah.",
            "  search    E1\\x1b[2J -> Utah\\x1b[2J  [1 triples]",
            "           (E1 Utah, motto, \\x1b[2J)",
            "  answer   E2\\x9b31m = Salt\\x1b[2J Lake City",
            "  finish: answer; 1 searches; 0 backtracks; 0.50 s; error: late\\x1b[2J; "
            "wrong (gold: Salt Lake City\\x1b[2J)",
        ]
    )
    colored = render_trace(record, color=True)
    assert "\x9b" not in colored and "\u202e" not in colored
    assert all(part.startswith(("[0m", "[1m", "[36m", "[2m", "[1;32m", "[31m")) for part in colored.split("\x1b")[1:])


def test_metrics_text_format():
    from prometheus_client.parser import text_string_to_metric_families

    metrics = Metrics(gauges={"kgreasoner_queue_depth": ("Waiting requests.", lambda: 2)})
    metrics.observe_request("/v1/answer", 200, 0.03)
    metrics.observe_request("/v1/answer", 422, 0.002)
    metrics.observe_answer(
        {
            "finish_reason": "answer",
            "searches": [{"error": None}, {"error": "unknown_entity"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "tool_tokens": None},
        }
    )
    metrics.observe_batch(3, 0.1)
    text = metrics.render()
    assert 'kgreasoner_requests_total{endpoint="/v1/answer",status="200"} 1.0\n' in text
    assert 'kgreasoner_request_errors_total{endpoint="/v1/answer",kind="invalid_request"} 1.0\n' in text
    assert 'kgreasoner_request_duration_seconds_bucket{endpoint="/v1/answer",le="0.005"} 1.0\n' in text
    assert 'kgreasoner_request_duration_seconds_bucket{endpoint="/v1/answer",le="0.05"} 2.0\n' in text
    assert 'kgreasoner_request_duration_seconds_count{endpoint="/v1/answer"} 2.0\n' in text
    assert 'kgreasoner_request_duration_seconds_sum{endpoint="/v1/answer"} 0.032\n' in text
    assert 'kgreasoner_tool_calls_total{error="unknown_entity"} 1.0\n' in text
    assert 'kgreasoner_tokens_total{kind="prompt"} 10.0\n' in text and 'kind="tool"' not in text
    assert (
        'kgreasoner_batch_size_bucket{le="2.0"} 0.0\n' in text
        and 'kgreasoner_batch_size_bucket{le="4.0"} 1.0\n' in text
    )
    assert text.endswith("# TYPE kgreasoner_queue_depth gauge\nkgreasoner_queue_depth 2.0\n")
    # Every family the service had before prometheus_client, under the same names and types.
    families = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert {
        name: families[name]
        for name in (
            "kgreasoner_requests",
            "kgreasoner_request_errors",
            "kgreasoner_request_duration_seconds",
            "kgreasoner_tool_calls",
            "kgreasoner_answers",
            "kgreasoner_tokens",
            "kgreasoner_batch_size",
            "kgreasoner_queue_depth",
        )
    } == {
        "kgreasoner_requests": "counter",
        "kgreasoner_request_errors": "counter",
        "kgreasoner_request_duration_seconds": "histogram",
        "kgreasoner_tool_calls": "counter",
        "kgreasoner_answers": "counter",
        "kgreasoner_tokens": "counter",
        "kgreasoner_batch_size": "histogram",
        "kgreasoner_queue_depth": "gauge",
    }


def _completions(request):
    """A stand-in generation server's `/v1/completions`: it always answers the first topic's handle."""
    return 200, {
        "choices": [
            {"text": "<think> done </think>\n<answer>E1", "finish_reason": "stop", "stop_reason": "</answer>"}
        ],
        "usage": {"completion_tokens": 6},
    }


def _openai_service(url: str, synthetic_dir, checkpoint) -> AnswerService:
    config = from_dict(
        ServeConfig,
        {
            **SERVE_CONFIG,
            "llm": f"openai:{url}#tiny",
            "kg": str(synthetic_dir),
            "tokenizer": str(checkpoint),
            "backend_timeout": 5.0,
        },
    )
    return AnswerService.open(config)


def test_openai_backend_renders_the_chat_template_and_fails_with_502_when_unreachable(
    checkpoint, synthetic_dir, dataset, openai_server
):
    example = dataset.examples[0]
    body = {"question": example.question, "topic_entities": [{"id": t.id} for t in example.topic_entities]}
    stub = openai_server(_completions)
    service = _openai_service(stub.base_url, synthetic_dir, checkpoint)
    server, thread, url = _serve_in_thread(create_app(service))
    try:
        record = httpx.post(f"{url}/v1/answer", json=body, timeout=30).json()
        assert record["answers"] == [example.topic_entities[0].name] and record["raw_answers"] == ["E1"]
        assert record["usage"]["completion_tokens"] is None  # text backends return no token ids
        [prompt] = [b["prompt"] for b in stub.bodies]
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
        assert httpx.get(f"{url}/health", timeout=10).json()["backend"] == "text"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        service.close()

    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))  # bound, never listening: connections are refused
    service = _openai_service(f"http://127.0.0.1:{closed.getsockname()[1]}/v1", synthetic_dir, checkpoint)
    server, thread, url = _serve_in_thread(create_app(service))
    try:
        reply = httpx.post(f"{url}/v1/answer", json=body, timeout=60)
        assert reply.status_code == 502
        assert reply.json()["error"]["message"].startswith("the generation backend failed: completion request failed")
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        service.close()
        closed.close()


def test_config_names_what_is_wrong():
    with pytest.raises(ValueError, match="vllm:URL sends token ids and needs `tokenizer`"):
        ServeConfig(llm="vllm:http://127.0.0.1:8000/v1")
    with pytest.raises(
        ValueError,
        match=(
            r"llm: unknown LLM spec .gpt:thing.: expected hf:PATH, vllm:PATH, vllm:URL\[#MODEL\] or "
            r"openai:URL\[#MODEL\]"
        ),
    ):
        ServeConfig(llm="gpt:thing")
    with pytest.raises(ValueError, match="request_timeout must be > 0"):
        ServeConfig(request_timeout=0)


def test_a_request_the_tokenizer_refuses_fails_alone_in_its_batch(service, dataset):
    """Requests built without `prepare` (whose Unicode check comes first) still fail one by one in the worker."""
    examples = dataset.examples[:3]
    good = [service.prepare(e.question, [{"id": e.topic_entities[0].id}]) for e in examples]
    bad_question = dataclasses.replace(good[0], id="bad-q", question="who \ud800?")
    topic = good[1].topic_entities[0]
    bad_topic = dataclasses.replace(good[1], id="bad-t", topic_entities=(TopicEntity(topic.id, "x\udc80"),))
    results = service.answer([good[0], bad_question, good[1], bad_topic, good[2]])
    assert [r.request.id for r in results] == [good[0].id, "bad-q", good[1].id, "bad-t", good[2].id]
    for answered in (results[0], results[2], results[4]):
        assert answered.refused is None and answered.trajectory.text.startswith("<think>")
        assert answered.batch_size == 3
    for answered, param in ((results[1], "question"), (results[3], "topic_entities[0].name")):
        assert answered.trajectory is None and answered.refused.param == param and answered.refused.status == 422
        assert answered.refused.message.startswith(
            f"{param}: cannot be tokenised by the model's tokenizer (TypeError: "
        )
        record = service.record(answered)
        assert record["finish_reason"] == "error" and record["error"] == answered.refused.message


def test_prepare_clamps_tiny_temperatures_and_checks_seeds(service, dataset):
    topic = dataset.examples[0].topic_entities[0]
    assert service.prepare("q?", [topic.name], AnswerOptions(temperature=1e-300)).sampling.temperature == 0.01
    assert service.prepare("q?", [topic.name], AnswerOptions(temperature=0.0)).sampling.temperature == 0.0
    with pytest.raises(
        RequestError,
        match=r"^options.seed: must be in \[-9223372036854775808, 9223372036854775807\], "
        r"got 18446744073709551616$",
    ):
        service.prepare("q?", [topic.name], AnswerOptions(seed=2**64))
    with pytest.raises(
        ValueError, match=r"^seed must be in \[-9223372036854775808, 9223372036854775807\], got -9223372036854775809$"
    ):
        ServeConfig(seed=-(2**63) - 1)
    with pytest.raises(ValueError, match="body_timeout must be > 0"):
        ServeConfig(body_timeout=0)


def test_an_upstream_that_writes_a_huge_search_gets_the_tool_s_refusal(synthetic_dir, dataset, openai_server):
    """A generation server that ignores `max_tokens` and writes a 100,000-character search: the tool refuses
    the query unread and says why, and the model's next turn still answers."""
    example = dataset.examples[0]
    huge = '<think> <search>E1 | ="' + "\\|" * 50_000 + '"'

    turns: list[str] = []

    def completions(request):
        turns.append(request.body["prompt"])
        text, stop = (huge, "</search>") if len(turns) == 1 else ("</think>\n<answer>E1", "</answer>")
        return 200, {"choices": [{"text": text, "finish_reason": "stop", "stop_reason": stop}]}

    stub = openai_server(completions)
    config = from_dict(ServeConfig, {**SERVE_CONFIG, "llm": f"openai:{stub.base_url}#tiny", "kg": str(synthetic_dir)})
    service = AnswerService.open(config)
    try:
        [answered] = service.answer([service.prepare(example.question, [{"id": example.topic_entities[0].id}])])
        record = service.record(answered)
    finally:
        service.close()
    [search] = record["searches"]
    assert search["error"] == "query_too_long" and search["num_triples"] == 0
    assert search["text"] == (
        "Search too long: 100008 characters, over the limit of 1000. Write one entity between the search tags "
        "(`NAME`, `NAME | relation` or `NAME | backtrack`)."
    )
    assert search["text"] in turns[1]  # what the model reads next
    assert record["answers"] == [example.topic_entities[0].name]


def test_a_search_s_label_comes_from_the_call_not_from_the_kg_after_generation(
    synthetic_dir, dataset, openai_server, monkeypatch
):
    """The model searches the topic, then an entity the first search showed; a KG whose label lookups fail
    once generation is over still gets both labels into the record, as the tool showed them."""
    example = dataset.examples[0]
    scripted = iter(
        [("<think> <search>E1", "</search>"), ("<search>E2", "</search>"), ("</think>\n<answer>E2", "</answer>")]
    )

    def completions(request):
        text, stop = next(scripted)
        return 200, {"choices": [{"text": text, "finish_reason": "stop", "stop_reason": stop}]}

    stub = openai_server(completions)
    config = from_dict(ServeConfig, {**SERVE_CONFIG, "llm": f"openai:{stub.base_url}#tiny", "kg": str(synthetic_dir)})
    service = AnswerService.open(config)
    try:
        [answered] = service.answer([service.prepare(example.question, [{"id": example.topic_entities[0].id}])])
        topic, neighbour = [call.entity for call in answered.trajectory.tool_calls]
        label = service.kg.label(neighbour)

        def down(entity):
            raise KGError("the knowledge graph went down")

        monkeypatch.setattr(service.kg, "label", down)
        record = service.record(answered)
    finally:
        service.close()
    assert topic == example.topic_entities[0].id and neighbour != topic
    assert [(s["entity"], s["label"], s["error"]) for s in record["searches"]] == [
        (topic, example.topic_entities[0].name, None),
        (neighbour, label, None),
    ]


def test_each_prompt_of_a_batch_is_tokenised_once(service, dataset, monkeypatch):
    examples = dataset.examples[:3]
    requests = [service.prepare(e.question, [{"id": e.topic_entities[0].id}]) for e in examples]
    encoded: list[str] = []
    encode = RolloutEngine.encode

    def counting(engine, text):
        encoded.append(text)
        return encode(engine, text)

    monkeypatch.setattr(RolloutEngine, "encode", counting)
    results = service.answer(requests)
    assert [r.refused for r in results] == [None] * 3
    assert [sum(e.question in text for text in encoded) for e in examples] == [1, 1, 1]
