"""open_kg: every spec scheme opens the right backend; bad specs fail clearly."""

from __future__ import annotations

import pytest

from kgreasoner.kg import MemoryKG, OxigraphKG, SparqlKG, open_kg, parse_spec


def test_memory_specs(small_kb):
    for spec in (f"memory:{small_kb.dir}", str(small_kb.dir), f"memory:{small_kb.dir / 'kb.tsv'}"):
        kg = open_kg(spec)
        assert isinstance(kg, MemoryKG)
        assert kg.label("e.utah") == "Utah"  # names.tsv beside kb.tsv is used
    kg = open_kg(f"memory:{small_kb.dir / 'kb.tsv'}", names={"e.utah": "UT"})
    assert kg.label("e.utah") == "UT" and kg.is_unnamed("e.slc")


def test_oxigraph_spec(small_kb, tmp_path):
    OxigraphKG.build(small_kb.dir, tmp_path / "store").close()
    with open_kg(f"oxigraph:{tmp_path / 'store'}") as kg:
        assert isinstance(kg, OxigraphKG)
        assert kg.resolve("Salt Lake City") == ["e.slc"]


@pytest.mark.parametrize(
    "scheme, dialect", [("sparql", "generic"), ("sparql+freebase", "freebase"), ("sparql+wikidata", "wikidata")]
)
def test_sparql_specs(scheme, dialect):
    kg = open_kg(f"{scheme}:http://127.0.0.1:8890/sparql", timeout=5, retries=1)
    assert isinstance(kg, SparqlKG)
    assert (kg.endpoint, kg.dialect.name, kg.timeout, kg.retries) == ("http://127.0.0.1:8890/sparql", dialect, 5, 1)


def test_sparql_spec_against_live_server(oxigraph_server, small_kb):
    kg = open_kg("sparql:" + oxigraph_server(small_kb.dir))
    assert [e.subject for e in kg.neighbors("e.cox", "in")] == ["cvt.1"]


def test_bad_specs():
    with pytest.raises(
        ValueError, match=r"unknown KG spec scheme 'neo4j' in 'neo4j:bolt://x'; use one of memory, oxigraph"
    ):
        open_kg("neo4j:bolt://x")
    with pytest.raises(ValueError, match=r"write sparql:http://localhost:8890/sparql"):
        open_kg("http://localhost:8890/sparql")
    with pytest.raises(ValueError, match=r"names no path or URL after 'oxigraph:'"):
        open_kg("oxigraph:")
    with pytest.raises(ValueError, match=r"does not take option\(s\) timeout \(it takes: names\)"):
        open_kg("memory:kb.tsv", timeout=3)
    with pytest.raises(FileNotFoundError, match="KG file not found: no/such/kb.tsv"):
        open_kg("no/such/kb.tsv")
    with pytest.raises(FileNotFoundError, match="no oxigraph store at"):
        open_kg("oxigraph:no/such/store")
    assert parse_spec("C:/data/kb.tsv") == ("memory", "C:/data/kb.tsv")  # a one-letter scheme is a drive
