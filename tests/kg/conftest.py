"""A small hand-written graph shared by the KG backend tests, and backend-agnostic checks.

It has a mediator (CVT-like) node, literals with datatypes and a language tag, two nodes named
"Utah", a label that only matches after normalisation, and a name full of query syntax.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kgreasoner.kg.base import KnowledgeGraph

XSD = "http://www.w3.org/2001/XMLSchema#"
DATE = f'"2021-01-20"^^<{XSD}date>'
POPULATION = f'"3271616"^^<{XSD}integer>'
MOTTO = '"Industry"@en'
CODE = '"UT"'

TRIPLES = [
    ("e.utah", "time_zone", "e.mtz"),
    ("e.utah", "capital", "e.slc"),
    ("e.utah", "contained_by", "e.usa"),
    ("e.utah", "population", POPULATION),
    ("e.utah", "motto", MOTTO),
    ("e.utah", "postal_code", CODE),
    ("e.utah", "governing_position", "cvt.1"),
    ("cvt.1", "office_holder", "e.cox"),
    ("cvt.1", "from", DATE),
    ("e.slc", "contained_by", "e.utah"),
    ("e.slc", "time_zone", "e.mtz"),
    ("e.idaho", "time_zone", "e.mtz"),
    ("e.idaho", "contained_by", "e.usa"),
    ("e.beach", "contained_by", "e.fr"),
    ("e.odd", "contained_by", "e.usa"),
]
NAMES = {
    "e.utah": "Utah",
    "e.slc": "Salt Lake City",
    "e.mtz": "Mountain Time Zone",
    "e.usa": "The United States",
    "e.cox": "Spencer Cox",
    "e.idaho": "Idaho",
    "e.beach": "Utah",
    "e.fr": "France",
    "e.odd": 'Say "hi" {x} } ; DROP ALL >',
    "e.not_in_graph": "Nowhere",
}
# Entities whose neighbourhoods every backend must reproduce exactly.
PROBE_ENTITIES = ["e.utah", "cvt.1", "e.mtz", "e.usa", DATE, POPULATION, MOTTO, CODE, "e.odd", "e.unknown"]


@pytest.fixture(scope="session")
def small_kb(tmp_path_factory) -> SimpleNamespace:
    """The graph: `.dir` is a dataset folder (kb.tsv + names.tsv); the constants above as attributes."""
    folder = tmp_path_factory.mktemp("small_kb")
    (folder / "kb.tsv").write_text("".join(f"{s}\t{r}\t{o}\n" for s, r, o in TRIPLES), encoding="utf-8")
    (folder / "names.tsv").write_text("".join(f"{k}\t{v}\n" for k, v in NAMES.items()), encoding="utf-8")
    return SimpleNamespace(
        dir=folder, triples=TRIPLES, names=NAMES, date=DATE, population=POPULATION, motto=MOTTO, code=CODE
    )


def assert_same_graph(expected: KnowledgeGraph, actual: KnowledgeGraph) -> None:
    """`actual` gives the same edges, labels, flags, degrees and limits as `expected` on PROBE_ENTITIES.

    Edge order within one direction is backend-defined, so edges are compared as sets; with a
    limit, the edges must be that many of the full set, outgoing ones first.
    """
    for entity in PROBE_ENTITIES:
        for direction in ("out", "in", "both"):
            want = expected.neighbors(entity, direction)
            got = actual.neighbors(entity, direction)
            assert len(got) == len(want), (entity, direction)
            assert set(got) == set(want), (entity, direction)
            for limit in (0, 1, 2):
                limited = actual.neighbors(entity, direction, limit=limit)
                assert len(limited) == min(limit, len(want)), (entity, direction, limit)
                assert set(limited) <= set(want)
                outs = [e.direction for e in limited]
                assert outs == sorted(outs, key=lambda d: d != "out"), "outgoing edges come first"
            assert actual.degree(entity, direction) == expected.degree(entity, direction), (entity, direction)
            # each store orders a side's relations its own way; the counts are the same
            counts = actual.relation_counts(entity, direction)
            assert sorted(counts) == sorted(expected.relation_counts(entity, direction)), (entity, direction)
            assert [side for _, side, _ in counts] == sorted((s for _, s, _ in counts), key=lambda s: s != "out")
        relations = ["time_zone", "motto", "no_such_relation"]
        assert set(actual.neighbors(entity, "both", relations=relations)) == set(
            expected.neighbors(entity, "both", relations=relations)
        )
        assert actual.label(entity) == expected.label(entity), entity
        assert actual.is_unnamed(entity) == expected.is_unnamed(entity), entity
    for name in [
        "Utah",
        "utah",
        "united states",
        "Salt Lake City",
        "e.cox",
        "Nowhere",
        "3271616",
        'Say "hi" {x} } ; DROP ALL >',
    ]:
        assert sorted(actual.resolve(name)) == sorted(expected.resolve(name)), name


@pytest.fixture(scope="session")
def same_graph():
    """The backend-agnostic comparison, as a fixture so every test module can use it."""
    return assert_same_graph
