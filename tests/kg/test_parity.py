"""Every store answers the same inputs alike: an empty or inexpressible id is an id missing from the graph."""

from __future__ import annotations

import pytest

from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.kg.sparql import SparqlKG

NO_NODE = [
    "",  # empty
    "_:b1",  # a blank node, which no query can name
    '"unterminated',  # malformed literals
    '"x"^^<bad iri>',
    '"a"@',
    "\ud800",  # lone surrogates
    "e.\ud800x",
    "e.nobody",  # well formed, not in the graph
]


@pytest.fixture(scope="module")
def stores(small_kb, tmp_path_factory, oxigraph_server):
    store = OxigraphKG.build(small_kb.dir, tmp_path_factory.mktemp("parity") / "store")
    yield {
        "memory": MemoryKG.from_file(small_kb.dir / "kb.tsv"),
        "oxigraph": store,
        "sparql": SparqlKG(oxigraph_server(small_kb.dir)),
    }
    store.close()


def answers(kg, entity):
    """Everything the KnowledgeGraph interface says of `entity`, as one comparable value."""
    return {
        "neighbors": [kg.neighbors(entity, direction) for direction in ("out", "in", "both")],
        "limited": kg.neighbors(entity, "both", limit=1),
        "by_relation": kg.neighbors(entity, "both", relations=["time_zone"]),
        "as_relation": kg.neighbors("e.utah", "both", relations=[entity]),
        "label": kg.label(entity),
        "labels": kg.labels([entity, "e.utah"]),
        "degree": [kg.degree(entity, direction) for direction in ("out", "in", "both")],
        "unnamed": kg.is_unnamed(entity),
        "relations": kg.relations(entity, "both"),
        "relation_counts": kg.relation_counts(entity),
        "resolve": kg.resolve(entity),
    }


@pytest.mark.parametrize("entity", NO_NODE)
def test_every_store_answers_an_id_that_names_no_node_as_the_memory_store(stores, entity):
    expected = answers(stores["memory"], entity)
    assert expected["neighbors"] == [[], [], []] and expected["degree"] == [0, 0, 0]
    assert expected["label"] == ("" if entity == "" else entity.lstrip('"').split('"')[0])
    for name in ("oxigraph", "sparql"):
        assert answers(stores[name], entity) == expected, name


def test_the_search_context_of_ids_that_name_no_node_is_empty(stores):
    sparql = stores["sparql"]
    edges = sparql.neighbors_of_each(["e.utah", *NO_NODE], 3)
    assert edges[1:] == [[] for _ in NO_NODE]
    assert set(edges[0]) <= set(stores["memory"].neighbors("e.utah", "both")) and len(edges[0]) == 3
