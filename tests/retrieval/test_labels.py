"""Ranker labels from gold paths: positives per hop, sampled negatives, mediators and inverse steps."""

from __future__ import annotations

import json

import pytest

from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.schema import Answer, QAExample, TopicEntity, write_jsonl
from kgreasoner.retrieval.labels import label_groups


@pytest.fixture
def kg() -> MemoryKG:
    return MemoryKG.from_triples(
        [
            ("1", "a", "2"),
            ("1", "b", "3"),
            ("2", "c", "4"),
            ("2", "d", "6"),
            ("2", "x", "9"),
            ("2", "y", "10"),
            ("4", "e", "5"),
            ("4", "f", "7"),
            ("11", "a", "2"),
            ("1", "m", "cvt"),
            ("cvt", "p", "12"),
            ("cvt", "q", "13"),
        ],
        names={n: f"n{n}" for n in ("1", "2", "3", "4", "5", "6", "7", "9", "10", "11", "12", "13")},
    )


def example(path, topic="1", qid="q1"):
    return QAExample(
        id=qid,
        question="q?",
        topic_entities=(TopicEntity(topic, f"n{topic}"),),
        answers=(Answer("5", "n5"),),
        gold_paths=(tuple(path),),
        hops=len(path),
    )


def summary(groups):
    return [(g.entity, g.hop, [c.path_relations for c in g.candidates], g.labels) for g in groups]


def test_every_candidate_labelled_along_the_gold_path(kg):
    groups = label_groups(kg, [example(["a", "c", "e"])], negative_ratio=None)
    assert summary(groups) == [
        ("1", 0, [("a",), ("b",), ("m", "p"), ("m", "q")], [1, 0, 0, 0]),
        ("2", 1, [("c",), ("d",), ("x",), ("y",), ("^a",), ("^a",)], [1, 0, 0, 0, 0, 0]),
        ("4", 2, [("e",), ("f",), ("^c",)], [1, 0, 0]),
    ]
    assert [c.target for c in groups[1].candidates][-2:] == ["1", "11"]


def test_negatives_are_sampled_at_the_ratio_with_a_seed(kg):
    groups = label_groups(kg, [example(["a", "c", "e"])], negative_ratio=1.0, seed=3)
    assert [(sum(g.labels), len(g.labels) - sum(g.labels)) for g in groups] == [(1, 1), (1, 1), (1, 1)]
    again = label_groups(kg, [example(["a", "c", "e"])], negative_ratio=1.0, seed=3)
    assert summary(groups) == summary(again)
    # Sampled candidates stay in KG order, positives always kept.
    assert all(g.labels[[c.path_relations for c in g.candidates].index((r,))] == 1 for g, r in zip(groups, "ace"))


def test_mediator_candidates_consume_two_relations_and_inverse_steps(kg):
    through = label_groups(kg, [example(["m", "q"])], negative_ratio=None)
    assert summary(through) == [("1", 0, [("a",), ("b",), ("m", "p"), ("m", "q")], [0, 0, 0, 1])]
    backwards = label_groups(kg, [example(["^a", "b"], topic="2")], negative_ratio=None)
    assert [(g.entity, g.hop, g.labels) for g in backwards] == [
        ("2", 0, [0, 0, 0, 0, 1, 1]),
        ("1", 1, [0, 1, 0, 0]),
    ]


def test_broken_gold_path_gives_no_group_and_output_is_jsonl(kg, tmp_path):
    assert label_groups(kg, [example(["zzz"])]) == []
    groups = label_groups(kg, [example(["a"])], negative_ratio=None)
    assert write_jsonl(groups, tmp_path / "labels.jsonl") == 1
    line = json.loads((tmp_path / "labels.jsonl").read_text().splitlines()[0])
    assert line["question_id"] == "q1" and line["entity"] == "1" and line["hop"] == 0
    assert line["candidates"][0] == {"relations": ["a"], "nodes": ["2"], "text": "a n2", "label": 1}
    with pytest.raises(ValueError, match="negative_ratio"):
        label_groups(kg, [example(["a"])], negative_ratio=-1)


def test_group_size_is_capped_at_hubs_keeping_positives(kg):
    groups = label_groups(kg, [example(["a", "c", "e"])], negative_ratio=None, max_candidates=2, seed=1)
    assert [(sum(g.labels), len(g.labels)) for g in groups] == [(1, 2), (1, 2), (1, 2)]
