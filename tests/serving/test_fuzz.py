"""Seeded fuzzing of the live `kgreasoner serve`: bad requests sent in the same batches as valid ones.

Every mutated request breaks exactly one field with a value that is invalid whatever the model
does, so the expected answer is known: a 4xx JSON error whose `param` names that field; never
a 500. The valid requests sent beside them must all answer 200. Bounded: a fixed seed, a fixed
number of rounds, and a time limit.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import time

import httpx

from .test_http import _body, _questions

SEED = 20261125
ROUNDS = 6
BAD_PER_ROUND = 14
VALID_PER_ROUND = 4
TIME_LIMIT = 240.0

JUNK_VALUES = [None, 7, -1, 1.5, True, [], {}, "", "   ", [None], {"x": 1}, "\ud800", "a\udfffb", "x" * 2_000]
NOT_A_STRING = [None, 7, 1.5, True, [], {}, ["q"], {"q": 1}]
BAD_QUESTIONS = NOT_A_STRING + ["", "   \n\t ", "\ud800", "who\udc00?", "x" * 301]
BAD_TOPIC_LISTS = NOT_A_STRING[:-2] + [
    "Somebody",
    [],
    [7],
    [None],
    [{}],
    [{"id": 7}],
    [{"name": ""}],
    [{"id": "  "}],
    [{"id": "\ud83d"}],
    ["zz no such entity zz"],
    [{"id": "zz.none"}],
    ["a", "b", "c", "d", "e"],
    [{"id": "x", "kind": "y"}],
    [["nested"]],
]
BAD_OPTIONS = {
    "max_turns": [-1, 99, 1.5, "2", True, [], 2**70],
    "max_new_tokens": [0, -5, 97, 10**9, "9", 1.0],
    "temperature": [-1, -1e-300, "hot", [], float("nan"), float("inf"), -float("inf")],
    "top_p": [0, 1e-300, -0.5, 1.0001, 2, float("nan"), "1"],
    "top_k": [-1, 1.5, "3", False],
    "seed": [2**64, 2**63, -(2**63) - 1, 1.5, "7", True, 10**30],
    "stop": ["x"],  # an unknown option
}


def _raw(body) -> bytes:
    """JSON as a hostile client may write it: lone surrogates escaped, NaN and Infinity bare."""
    return json.dumps(body).encode("ascii")


def _mutations(rng: random.Random, valid: dict) -> list[tuple[bytes, int, str]]:
    """(raw body, expected status, expected param prefix) per bad request."""
    out = []
    for _ in range(BAD_PER_ROUND):
        kind = rng.choice(["question", "topics", "option", "extra", "id", "raw"])
        body = json.loads(json.dumps(valid))
        if kind == "question":
            body["question"] = rng.choice(BAD_QUESTIONS)
            out.append((_raw(body), 422, "question"))
        elif kind == "topics":
            body["topic_entities"] = rng.choice(BAD_TOPIC_LISTS)
            out.append((_raw(body), 422, "topic_entities"))
        elif kind == "option":
            name = rng.choice(sorted(BAD_OPTIONS))
            body["options"] = {name: rng.choice(BAD_OPTIONS[name])}
            out.append((_raw(body), 422, f"options.{name}"))
        elif kind == "extra":
            field = rng.choice(["questoin", "topic", "Question", "options2"])
            body[field] = rng.choice(JUNK_VALUES)
            out.append((_raw(body), 422, field))
        elif kind == "id":
            body["id"] = rng.choice([7, [], "x" * 201, {"a": 1}])
            out.append((_raw(body), 422, "id"))
        else:
            raw = _raw(body)
            choice = rng.choice(["cut", "bytes", "deep", "huge", "not-object"])
            if choice == "cut":
                out.append((raw[: rng.randrange(1, len(raw) - 1)], 400, "body"))
            elif choice == "bytes":
                cut = rng.randrange(1, len(raw) - 1)
                out.append((raw[:cut] + rng.choice([b"\xff", b"\xc3(", b"\xed\xa0\x80"]) + raw[cut:], 400, "body"))
            elif choice == "deep":
                depth = rng.choice([100, 2000, 6000])  # past Python's recursion limit, the body cannot be parsed
                expected = (422, "question") if depth < 1000 else (400, "body")
                out.append((raw[:-1] + b', "question": ' + b"[" * depth + b"]" * depth + b"}", *expected))
            elif choice == "huge":
                out.append((_raw({**body, "question": "x" * 17_000}), 413, "body"))
            else:
                out.append((_raw(rng.choice([[body], "text", 3, None])), 422, "body"))
    return out


def _post(server: str, raw: bytes) -> httpx.Response:
    return httpx.post(f"{server}/v1/answer", content=raw, headers={"content-type": "application/json"}, timeout=120)


def test_fuzzed_requests_get_4xx_naming_the_field_and_their_batches_succeed(server, dataset):
    rng = random.Random(SEED)
    examples = _questions(dataset, VALID_PER_ROUND * 2)
    start = time.monotonic()
    seen_statuses: dict[int, int] = {}
    for round_ in range(ROUNDS):
        valid = [_body(e) for e in examples[(round_ % 2) * VALID_PER_ROUND :][:VALID_PER_ROUND]]
        bad = _mutations(rng, valid[0])
        jobs = [(_raw(b), 200, "") for b in valid] + bad
        rng.shuffle(jobs)
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            replies = list(pool.map(lambda job: _post(server, job[0]), jobs))
        for (raw, status, param), reply in zip(jobs, replies):
            where = f"round {round_}: {raw[:160]!r} -> {reply.status_code} {reply.text[:300]}"
            seen_statuses[reply.status_code] = seen_statuses.get(reply.status_code, 0) + 1
            if status == 200:
                assert reply.status_code == 200, where
                assert reply.json()["trajectory"].startswith("<think>"), where
                continue
            assert reply.status_code == status, where
            error = reply.json()["error"]
            assert error["code"] == reply.status_code and error["param"], where
            assert error["param"].startswith(param), where
            if reply.status_code == 422:
                assert error["message"].startswith(error["param"]), where
            assert "Traceback" not in reply.text, where
    assert time.monotonic() - start < TIME_LIMIT
    assert sum(seen_statuses.values()) == ROUNDS * (VALID_PER_ROUND + BAD_PER_ROUND)
    assert seen_statuses[200] == ROUNDS * VALID_PER_ROUND and 500 not in seen_statuses


def test_fuzzed_chat_requests_get_4xx_naming_the_field_beside_valid_ones(server, dataset):
    rng = random.Random(SEED + 1)
    examples = _questions(dataset, 4)
    valid = [
        {"messages": [{"role": "user", "content": e.question}], "topic_entities": [{"id": e.topic_entities[0].id}]}
        for e in examples
    ]
    user = valid[0]["messages"][0]
    cases = [({"messages": rng.choice(NOT_A_STRING[:-2] + [[]])}, 422, "messages")] + [
        ({"messages": [{"role": rng.choice(["robot", "", 7, None]), "content": "q?"}]}, 422, "messages.0.role"),
        ({"messages": [{"role": "user", "content": rng.choice(NOT_A_STRING)}]}, 422, "messages.0.content"),
        ({"messages": [{"role": "user", "content": "who\ud800?"}]}, 422, "messages[0].content"),
        (
            {"messages": [{"role": "user", "content": "who? Topic Entity: A\ud800, B"}], "topic_entities": None},
            422,
            "messages[0].content",
        ),
        ({"messages": [user, {"role": "system", "content": "x"}]}, 422, "messages[1].role"),
        (
            {"messages": [{"role": "user", "content": "no topic marker"}], "topic_entities": None},
            422,
            "topic_entities",
        ),
        ({"model": "other-model"}, 404, "model"),
        ({"n": rng.choice([2, 0, 5])}, 400, "n"),
        ({"stream": True}, 400, "stream"),
        ({"temperature": rng.choice([-1, float("nan"), "warm"])}, 422, "temperature"),
        ({"top_p": rng.choice([0, 1e-300, 3, float("inf")])}, 422, "top_p"),
        ({"seed": rng.choice([2**64, -(2**63) - 1, 0.5])}, 422, "seed"),
        ({"max_tokens": rng.choice([0, -1, "many"])}, 422, "max_tokens"),
        ({"max_turns": rng.choice([-1, 99])}, 422, "max_turns"),
        ({"topic_entities": rng.choice(BAD_TOPIC_LISTS[6:])}, 422, "topic_entities"),
    ]
    jobs = [(_raw(b), 200, "") for b in valid] + [
        (_raw({**valid[0], **patch}), status, param) for patch, status, param in cases
    ]
    rng.shuffle(jobs)
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        replies = list(
            pool.map(
                lambda job: httpx.post(
                    f"{server}/v1/chat/completions",
                    content=job[0],
                    timeout=120,
                    headers={"content-type": "application/json"},
                ),
                jobs,
            )
        )
    for (raw, status, param), reply in zip(jobs, replies):
        where = f"{raw[:200]!r} -> {reply.status_code} {reply.text[:300]}"
        assert reply.status_code == status, where
        if status == 200:
            assert reply.json()["choices"][0]["message"]["content"].startswith("<think>"), where
            continue
        error = reply.json()["error"]
        assert error["param"] and error["param"].startswith(param) and error["message"].startswith(error["param"]), (
            where
        )
