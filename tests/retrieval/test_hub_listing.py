"""A Freebase-sized hub (10,000 relations, 100,000 edges) through every backend: no tool text passes max_chars."""

from __future__ import annotations

import pytest

from kgreasoner.data.schema import TopicEntity
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.kg.sparql import SparqlKG
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
