"""The memory store's relation index: filtered fetches and per-relation counts equal a walk over the triples."""

from __future__ import annotations

import random

import pytest

from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.edges import Edge


def random_graph(seed: int) -> tuple[list[tuple[str, str, str]], dict[str, str]]:
    """Two hubs of a few hundred edges over six relations, a mediator, literals, self-loops and repeats."""
    rng = random.Random(seed)
    triples = []
    for _ in range(900):
        s = "hub" if rng.random() < 0.3 else rng.choice(["hub2", *[f"n{i}" for i in range(40)]])
        o = "hub2" if rng.random() < 0.2 else rng.choice(["hub", "cvt", '"7"', *[f"n{i}" for i in range(40)]])
        triples.append((s, rng.choice(["r0", "r1", "r2", "r3", "r4", "r5"]), o))
    triples += [("hub", "r0", "hub"), ("cvt", "r1", "n1"), ("hub", "r2", "n3")]  # a self-loop and a repeat
    names = {n: n.upper() for n in ["hub", "hub2", *[f"n{i}" for i in range(40)]]}
    return triples, names


def walk(triples, names, entity, direction, relations=None, limit=None) -> list[Edge]:
    """The edges a per-edge walk over the distinct triples in file order finds, outgoing first."""
    distinct = list(dict.fromkeys(triples))

    def label(x):
        return names.get(x, x.strip('"'))

    def lit(x):
        return x.startswith('"')

    def unnamed(x):
        return not lit(x) and x not in names

    out = [
        Edge(s, r, o, label(s), label(o), "out", lit(o), unnamed(s), unnamed(o))
        for s, r, o in distinct
        if s == entity and (relations is None or r in relations)
    ]
    inc = [
        Edge(s, r, o, label(s), label(o), "in", lit(o), unnamed(s), unnamed(o))
        for s, r, o in distinct
        if o == entity and (relations is None or r in relations)
    ]
    edges = {"out": out, "in": inc, "both": out + inc}[direction]
    return edges if limit is None else edges[:limit]


@pytest.mark.parametrize("seed", [0, 1])
def test_every_fetch_equals_the_walk_edge_for_edge_in_order(seed):
    triples, names = random_graph(seed)
    kg = MemoryKG.from_triples(triples, names)
    filters = [None, ["r2"], ["r4", "r0"], ["r1", "unknown"], ["unknown"], []]
    checked = 0
    for entity in ["hub", "hub2", "n3", "cvt", '"7"', "absent"]:
        for direction in ("out", "in", "both"):
            for relations in filters:
                for limit in (None, 0, 1, 37, 10_000):
                    assert kg.neighbors(entity, direction, relations, limit) == walk(
                        triples, names, entity, direction, relations, limit
                    ), (entity, direction, relations, limit)
                    checked += 1
    assert checked == 6 * 3 * 6 * 5
    assert min(kg.degree("hub"), kg.degree("hub2")) > 100  # the hubs are big enough to have several edges per relation


def test_relation_counts_come_in_first_edge_order_and_sum_to_the_degree():
    triples = [
        ("a", "r2", "x"),
        ("a", "r1", "y"),
        ("a", "r2", "z"),
        ("b", "r1", "a"),
        ("a", "r3", "a"),
        ("a", "r2", "x"),
    ]
    kg = MemoryKG.from_triples(triples)
    assert kg.relation_counts("a") == [
        ("r2", "out", 2),
        ("r1", "out", 1),
        ("r3", "out", 1),
        ("r1", "in", 1),
        ("r3", "in", 1),
    ]
    assert kg.relation_counts("a", "in") == [("r1", "in", 1), ("r3", "in", 1)]
    assert kg.relation_counts("nobody") == [] and kg.relation_counts("x", "out") == []
    # the generic count over every edge (what the other backends do) agrees
    assert KnowledgeGraph.relation_counts(kg, "a") == kg.relation_counts("a")
    for seed in (0, 1):
        big = MemoryKG.from_triples(*random_graph(seed))
        for entity in ("hub", "hub2", "n5"):
            assert big.relation_counts(entity) == KnowledgeGraph.relation_counts(big, entity)
            assert sum(n for _, _, n in big.relation_counts(entity)) == big.degree(entity)


def test_triples_lists_every_distinct_edge_grouped_by_subject():
    triples, names = random_graph(0)
    kg = MemoryKG.from_triples(triples, names)
    listed = list(kg.triples())
    assert sorted(listed) == sorted(set(triples))
    subjects = [s for s, _, _ in listed]
    assert subjects == sorted(subjects, key=kg.entities.index)
