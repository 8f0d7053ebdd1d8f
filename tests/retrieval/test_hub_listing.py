"""A Freebase-sized hub (10,000 relations, 100,000 edges) through every backend: no tool text passes max_chars."""

from __future__ import annotations

import pytest

from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.kg.sparql import SparqlKG
from kgreasoner.records.schema import TopicEntity
from kgreasoner.retrieval.encoder import EncoderConfig
from kgreasoner.retrieval.tool import ERRORS, KGSearchTool, ToolConfig

HUB = [TopicEntity("hub", "Hub")]
FIRST_LISTED = "Hub | {first}"
"""A filter by the first relation the second page listed (which depends on the order the backend gives edges in)."""
QUERIES = [
    "Hub",
    "Hub",
    "Hub | nonexistent",
    "Hub | relations",
    "Hub | relations",
    FIRST_LISTED,
    "Hub | r09999",
    "Hub | =" + '"' + "x" * 5000 + '"',
    "Hub | backtrack",
    "N0_0",
    "N0_0 | backtrack",
    "Nobody " * 1000,
    "Hub | " + "r, " * 3000,
]


def calls(kg, **config):
    """Every QUERIES call's result, in order, over one session."""
    session = KGSearchTool(kg, ToolConfig(**config)).session("which relation of the hub", HUB)
    results = [session.call(QUERIES[0])]
    for query in QUERIES[1:]:
        results.append(session.call(query.format(first=results[1].more[0][0]) if query == FIRST_LISTED else query))
    return results


def assert_capped(results, max_chars=2000):
    for query, result in zip(QUERIES, results):
        assert len(result.text) <= max_chars, (query[:40], len(result.text))
        assert result.error is None or result.error in ERRORS
    first = results[0]
    # The first page names the likeliest relations and says how many it left out.
    assert first.error is None and first.unlisted > 0
    assert first.text.split("\n")[-1].endswith(f" and {first.unlisted} more relations")
    assert first.text.split("\n")[-1].startswith("more: r")
    listed = results[3]
    assert listed.error is None and listed.edges == [] and listed.more
    assert not {name for name, _ in listed.more} & {name for name, _ in first.more + results[1].more}
    assert results[2].error == "unknown_relation" and results[2].text.endswith(" more relations.")
    assert results[5].error is None and {e.relation for e in results[5].edges} == {results[1].more[0][0]}


@pytest.fixture(scope="module")
def memory_hub(hub_dir):
    return MemoryKG.from_file(hub_dir / "kb.tsv")


@pytest.mark.slow
@pytest.mark.parametrize("ranking", ["none", "embedding"])
def test_a_hub_through_the_memory_store(memory_hub, ranking):
    results = calls(memory_hub, ranking=ranking, encoder=EncoderConfig(kind="hashing"))
    assert_capped(results)
    if ranking == "embedding":  # relation first: every relation is counted, built or not
        assert results[0].unlisted + len(results[0].more) == 10_000
        assert results[6].error is None and {e.relation for e in results[6].edges} == {"r09999"}


@pytest.mark.slow
def test_a_hub_through_the_oxigraph_store(hub_dir, tmp_path):
    results = calls(OxigraphKG.build(hub_dir, tmp_path / "store"))
    assert_capped(results)


@pytest.mark.slow
def test_a_hub_through_a_sparql_endpoint(oxigraph_server, hub_dir):
    kg = SparqlKG(oxigraph_server(hub_dir))
    results = calls(kg)
    assert_capped(results)
    # Tighter caps hold as well.
    assert all(len(r.text) <= 300 for r in calls(kg, max_chars=300, top_k=3))


@pytest.fixture(scope="module")
def every_store(memory_hub, hub_dir, tmp_path_factory, oxigraph_server):
    store = OxigraphKG.build(hub_dir, tmp_path_factory.mktemp("hub_store") / "store")
    yield {"memory": memory_hub, "oxigraph": store, "sparql": SparqlKG(oxigraph_server(hub_dir))}
    store.close()


def _page(kg, query, **config):
    return KGSearchTool(kg, ToolConfig(**config)).session("which relation of the hub", HUB).call(query)


@pytest.mark.slow
def test_every_relation_of_a_hub_is_reachable_by_its_filter_with_one_answer_on_every_store(every_store):
    """10,000 relations of 10 edges: the first fetch (neighbor_limit, 10,000 edges) holds 1,000 of them, a
    different 1,000 on each store; a filter reaches any of the 10,000, on each store alike."""
    for relation in ["r00000", "r00999", "r01000", "r05000", "r09999"]:
        answers = {}
        for name, kg in every_store.items():
            result = _page(kg, f"Hub | {relation}", top_k=4)
            assert result.error is None, (name, relation, result.text)
            assert {(e.relation, e.neighbor) for e in result.edges} <= {
                (relation, f"n{int(relation[1:])}_{i}") for i in range(10)
            }
            lines = result.text.split("\n")
            assert len(lines) == 5 and lines[-1].startswith(f"more: {relation} (6), ")
            answers[name] = (len(result.edges), result.more[0], result.unlisted + len(result.more))
        assert set(answers.values()) == {(4, (relation, 6), 10_000)}, answers
    for name, kg in every_store.items():  # a relation the hub lacks is still unknown
        assert _page(kg, "Hub | r10000").error == "unknown_relation", name


@pytest.mark.slow
def test_a_listing_counts_a_relation_s_edges_past_the_fetch(every_store):
    """neighbor_limit 15: the first fetch holds one relation whole and 5 edges of another; the listing
    (all of it, in a roomy max_chars) counts every relation at its 10 edges, and paging through one by its
    filter shows all 10."""
    for name, kg in every_store.items():
        first = _page(kg, "Hub", top_k=1, neighbor_limit=15, max_chars=10**6)
        shown = first.edges[0].relation
        counts = dict(first.more)
        assert len(counts) == 10_000 and first.unlisted == 0, name
        assert counts.pop(shown) == 9 and set(counts.values()) == {10}, name
        session = KGSearchTool(kg, ToolConfig(top_k=3, neighbor_limit=15)).session("q", HUB)
        second = sorted(first.more)[1][0]
        pages = [session.call(f"Hub | {second}") for _ in range(5)]
        neighbours = [e.neighbor for page in pages for e in page.edges]
        assert sorted(neighbours) == sorted(f"n{int(second[1:])}_{i}" for i in range(10)), name
        assert [page.error for page in pages] == [None] * 4 + ["exhausted"], name
