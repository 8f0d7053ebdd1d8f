"""OxigraphKG: bulk load once, reopen read-only, and agree with MemoryKG on the same triples."""

from __future__ import annotations

import pytest

from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.kg.rdf import ENTITY_NS, RDFS_LABEL, RELATION_NS, to_iri


@pytest.fixture(scope="module")
def store_dir(small_kb, tmp_path_factory):
    path = tmp_path_factory.mktemp("oxigraph") / "store"
    kg = OxigraphKG.build(small_kb.dir, path)
    assert kg.num_triples_loaded == len(small_kb.triples)
    kg.close()
    return path


@pytest.fixture(scope="module")
def kg(store_dir):
    return OxigraphKG(store_dir)


def test_reopened_store_matches_memory(kg, small_kb, same_graph):
    same_graph(MemoryKG.from_file(small_kb.dir / "kb.tsv"), kg)


def test_store_content_is_plain_rdf(kg):
    """A SPARQL client sees our IRIs and rdfs:label in the default graph, and nothing of the index."""
    utah, tz = to_iri("e.utah", ENTITY_NS), to_iri("time_zone", RELATION_NS)
    rows = list(kg.query(f"SELECT ?o ?l WHERE {{ <{utah}> <{tz}> ?o . ?o <{RDFS_LABEL}> ?l }}"))
    assert [(row["o"].value, row["l"].value) for row in rows] == [(ENTITY_NS + "e.mtz", "Mountain Time Zone")]
    (count,) = list(kg.query("SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o }"))
    assert int(count["n"].value) == 15 + 9  # edges + labels of the named nodes in the graph


def test_reopen_does_not_reload(store_dir):
    before = sorted(p.name for p in store_dir.iterdir())
    again = OxigraphKG(store_dir)
    assert again.degree("e.utah") == 8 and again.has_names
    assert sorted(p.name for p in store_dir.iterdir()) == before


def test_build_from_ntriples_and_iterable_agree(small_kb, tmp_path):
    from_tuples = OxigraphKG.build(small_kb.triples, tmp_path / "a", names=small_kb.names)
    nt = tmp_path / "kb.nt"
    lines = []
    for s, r, o in small_kb.triples:
        obj = o if o.startswith('"') else f"<{to_iri(o, ENTITY_NS)}>"
        lines.append(f"<{to_iri(s, ENTITY_NS)}> <{to_iri(r, RELATION_NS)}> {obj} .\n")
    for node, name in small_kb.names.items():
        name_literal = name.replace("\\", "\\\\").replace('"', '\\"')
        lines.append(f'<{to_iri(node, ENTITY_NS)}> <{RDFS_LABEL}> "{name_literal}"@en .\n')
    nt.write_text("".join(lines), encoding="utf-8")
    from_nt = OxigraphKG.build(nt, tmp_path / "b")
    for entity in ["e.utah", "cvt.1", small_kb.date]:
        assert set(from_nt.neighbors(entity, "both")) == set(from_tuples.neighbors(entity, "both"))
    assert from_nt.resolve("Utah") == from_tuples.resolve("Utah") != []


def test_without_names_nothing_is_unnamed(small_kb, tmp_path):
    kg = OxigraphKG.build(small_kb.triples, tmp_path / "s")
    assert not kg.has_names
    same = MemoryKG.from_triples(small_kb.triples)
    for entity in ["e.utah", "cvt.1"]:
        assert set(kg.neighbors(entity, "both")) == set(same.neighbors(entity, "both"))
    assert kg.resolve("e.utah") == ["e.utah"]


def test_build_refuses_non_empty_directory(small_kb, store_dir):
    with pytest.raises(ValueError, match=rf"{store_dir}: store directory exists and is not empty"):
        OxigraphKG.build(small_kb.triples, store_dir)


def test_bad_input_errors_name_the_source(tmp_path):
    with pytest.raises(FileNotFoundError, match="no oxigraph store at"):
        OxigraphKG(tmp_path / "missing")
    (tmp_path / "kb.tsv").write_text('a\tr\t"unterminated\n', encoding="utf-8")
    with pytest.raises(
        ValueError, match=rf"^{tmp_path / 'kb.tsv'}:1: '\"unterminated' is not a valid N-Triples literal"
    ):
        OxigraphKG.build(tmp_path / "kb.tsv", tmp_path / "s")
    assert not (tmp_path / "s").exists()  # refused before any store was made
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="dataset folder has no kb.tsv"):
        OxigraphKG.build(tmp_path / "empty", tmp_path / "t")


def test_a_load_that_fails_half_way_leaves_no_store(small_kb, tmp_path):
    """A malformed literal among id triples (which no file reader checked) fails in the middle of the bulk load:
    nothing is left in the folder, neither the store nor its unfinished copy; a folder that was empty stays so."""
    broken = [*small_kb.triples, ("e.utah", "motto", '"Industry')]
    new = tmp_path / "new" / "store"
    with pytest.raises(ValueError, match="triples: cannot store node '\"Industry'"):
        OxigraphKG.build(broken, new)
    assert list(new.parent.iterdir()) == []
    empty = tmp_path / "empty" / "store"
    empty.mkdir(parents=True)
    with pytest.raises(ValueError, match="triples: cannot store node '\"Industry'"):
        OxigraphKG.build(broken, empty)
    assert list(empty.parent.iterdir()) == [empty] and list(empty.iterdir()) == []
    with pytest.raises(ValueError, match="^triple 1: field 'subject' is the literal \"1815\"; in RDF only an object"):
        OxigraphKG.build([('"1815"', "year_of", "e.utah")], tmp_path / "lit")
    assert not (tmp_path / "lit").exists()


def test_hostile_ids_find_nothing(kg):
    for hostile in ['"', '"x"^^<bad iri>', "e.utah> <x", "_:bad id", "} ; DROP ALL"]:
        assert kg.neighbors(hostile, "both") == []
        assert kg.degree(hostile) == 0
        assert kg.resolve(hostile) == []
    assert kg.degree("e.utah") == 8


def test_negative_limit_is_refused(kg):
    with pytest.raises(ValueError, match="limit: expected a non-negative int or None, got -2"):
        kg.neighbors("e.utah", limit=-2)
    with pytest.raises(ValueError, match="limit: expected a non-negative int or None, got False"):
        kg.neighbors("e.utah", limit=False)
