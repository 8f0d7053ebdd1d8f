"""Hop counts of RoG's questions, from their own subgraphs, and the hop-balanced order they feed."""

import json
import shutil
from collections import deque
from pathlib import Path

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kgreasoner.data import load_dataset
from kgreasoner.records.hops import BATCH_CELLS, subgraph_hops
from kgreasoner.records.rog import load_rog
from kgreasoner.records.sampling import balanced_order, hop_count
from kgreasoner.records.schema import SchemaError

FIXTURES = Path(__file__).parent / "fixtures"


def test_every_fixture_question_gets_its_hop_count():
    hops = {e.id[:10]: e.hops for name in ("rog-webqsp", "rog-cwq") for e in load_dataset(name, root=FIXTURES)}
    assert hops == {
        "WebQTest-0": 1,  # Utah -time_zones-> Mountain Time Zone
        "WebQTrn-0": 2,  # Justin Bieber -sibling_s-> mediator -sibling-> Jaxon Bieber
        "WebQTrn-1": 2,  # Natalie Portman and Star Wars: each through the performance mediator
        "WebQTest-7": 2,  # Mountain Time Zone and Provo: each through Utah to Salt Lake City
        # Male is one edge from Jaxon Bieber, but the question needs Justin Bieber's two: the largest counts
        "WebQTrn-0_": 2,
        "WebQTrn-2_": 2,  # Salt Lake City <-capital- Utah -time_zones-> Mountain Time Zone
    }


def _record(qid: str, topics: list[str], answers: list[str], graph: list[list[str]]) -> dict:
    return {
        "id": qid,
        "question": f"question {qid}?",
        "answer": answers,
        "q_entity": topics,
        "a_entity": answers,
        "graph": graph,
        "choices": [],
    }


# A chain a - b - c - d (edges pointing either way), a mediator-shaped detour, and questions on it.
CHAIN = [["a", "r1", "b"], ["c", "r2", "b"], ["c", "r3", "d"], ["a", "r4", "m.0x"], ["m.0x", "r5", "e"]]
EXTRA = [
    _record("three", ["a"], ["d"], CHAIN),  # walked forwards, backwards, forwards
    _record("nearest", ["a"], ["d", "e"], CHAIN),  # the nearest answer counts: e, two edges through the mediator
    _record("absent", ["a"], ["z"], CHAIN),  # the answer is not in the subgraph: unknown
    _record("stray", ["q", "a"], ["c"], CHAIN + [["q", "r6", "p"]]),  # q reaches no answer: a's count
    _record("itself", ["c", "a"], ["c"], CHAIN),  # c is the answer (0) and a two edges from it
    _record("no-graph", ["a"], ["d"], []),
]


def test_longer_paths_and_questions_without_a_path(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in EXTRA), encoding="utf-8")
    assert [(e.id, e.hops) for e in load_rog(path)] == [
        ("three", 3),
        ("nearest", 2),
        ("absent", 0),
        ("stray", 2),
        ("itself", 2),
        ("no-graph", 0),
    ]


def test_balanced_order_takes_rog_hop_counts_in_turn():
    order = balanced_order(load_rog(FIXTURES / "rog-webqsp"), seed=0)
    assert [hop_count(e) for e in order] == [1, 2, 1, 2]
    assert sorted(e.id for e in order if e.hops == 2) == ["WebQTrn-0", "WebQTrn-1"]


def test_balanced_order_interleaves_three_hop_counts(tmp_path):
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in EXTRA[:2]), encoding="utf-8")
    (tmp_path / "test.jsonl").write_text((FIXTURES / "rog-webqsp" / "test.jsonl").read_text(encoding="utf-8"))
    examples = [e for e in load_rog(tmp_path)] + load_rog(FIXTURES / "rog-webqsp" / "train.jsonl")
    order = balanced_order(examples, seed=1)
    assert [hop_count(e) for e in order] == [1, 2, 3] * 3
    assert {e.id for e in order} == {e.id for e in examples}


def _reference_hops(topics: list[str], answers: list[str], graph: list[list[str]]) -> int:
    """Breadth-first search one topic at a time, edges both ways: the plain definition."""
    links: dict[str, set[str]] = {}
    for head, _, tail in graph:
        links.setdefault(head, set()).add(tail)
        links.setdefault(tail, set()).add(head)
    best = 0
    for topic in topics:
        seen, queue = {topic: 0}, deque([topic])
        while queue:
            node = queue.popleft()
            if node in answers:
                best = max(best, seen[node])
                break
            for other in sorted(links.get(node, ())):
                if other not in seen:
                    seen[other] = seen[node] + 1
                    queue.append(other)
    return best


NODES = st.sampled_from("abcdefgh")
ROWS = st.lists(
    st.tuples(
        st.lists(NODES, min_size=1, max_size=3),
        st.lists(NODES, min_size=1, max_size=2),
        st.lists(st.tuples(NODES, st.sampled_from(["r", "s"]), NODES), max_size=12),
    ),
    min_size=1,
    max_size=7,
)


@settings(max_examples=150, deadline=None)
@given(ROWS, st.sampled_from([1, 40, BATCH_CELLS]))
def test_vectorised_search_matches_a_search_per_question(rows, batch_cells):
    """Rows share node names but never edges, in any batching."""
    names = pa.list_(pa.string())
    table = pa.table(
        {
            "q_entity": pa.array([r[0] for r in rows], names),
            "answer": pa.array([r[1] for r in rows], names),
            "graph": pa.array([[list(t) for t in r[2]] for r in rows], pa.list_(names)),
        }
    )
    expected = [_reference_hops(topics, answers, [list(t) for t in graph]) for topics, answers, graph in rows]
    assert subgraph_hops(table["graph"], table["q_entity"], table["answer"], batch_cells) == expected


def test_a_split_reads_only_its_own_files(tmp_path):
    """Every record's graph is searched when its file is read, so a split leaves the other files unread:
    a broken training file does not stop the test split from loading."""
    shutil.copytree(FIXTURES / "rog-cwq", tmp_path / "rog-cwq")
    (tmp_path / "rog-cwq" / "train.jsonl").write_text('{"id": "x", "graph": [["a", "r"]]}\n', encoding="utf-8")
    test = load_dataset("rog-cwq", split="test", root=tmp_path)
    assert [(e.id[:10], e.split, e.hops) for e in test] == [("WebQTest-7", "test", 2)]
    with pytest.raises(SchemaError, match=r"train.jsonl:1: missing field 'question'"):
        load_dataset("rog-cwq", root=tmp_path)
