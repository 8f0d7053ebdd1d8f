"""MemoryKG on the small hand-written graph: exact edges, labels, flags, limits, resolve, errors."""

from __future__ import annotations

import re

import pytest

from kgreasoner.cli import main
from kgreasoner.kg.base import execute_path
from kgreasoner.kg.commands import graph_stats
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.kg.rdf import ENTITY_NS, RDFS_LABEL, RELATION_NS
from kgreasoner.records.edges import Edge


@pytest.fixture(scope="module")
def kg(small_kb) -> MemoryKG:
    return MemoryKG.from_file(small_kb.dir / "kb.tsv")  # names.tsv beside it is picked up


def test_outgoing_edges_in_file_order_with_labels_and_flags(kg, small_kb):
    edges = kg.neighbors("e.utah", "out")
    assert [(e.relation, e.object) for e in edges] == [
        ("time_zone", "e.mtz"),
        ("capital", "e.slc"),
        ("contained_by", "e.usa"),
        ("population", small_kb.population),
        ("motto", small_kb.motto),
        ("postal_code", small_kb.code),
        ("governing_position", "cvt.1"),
    ]
    assert edges[0] == Edge("e.utah", "time_zone", "e.mtz", "Utah", "Mountain Time Zone", "out")
    assert edges[3].object_label == "3271616" and edges[3].object_is_literal and not edges[3].object_unnamed
    assert edges[4].object_label == "Industry" and edges[4].neighbor_is_literal
    mediator = edges[6]
    assert mediator.object_label == "cvt.1" and mediator.object_unnamed and mediator.neighbor_unnamed
    assert not mediator.object_is_literal


def test_incoming_and_both_directions(kg):
    incoming = kg.neighbors("e.mtz", "in")
    assert [(e.subject, e.relation, e.direction) for e in incoming] == [
        ("e.utah", "time_zone", "in"),
        ("e.slc", "time_zone", "in"),
        ("e.idaho", "time_zone", "in"),
    ]
    assert incoming[2].neighbor == "e.idaho" and incoming[2].neighbor_label == "Idaho"
    assert incoming[0].path_relation == "^time_zone"
    both = kg.neighbors("e.slc", "both")
    assert [(e.direction, e.neighbor) for e in both] == [
        ("out", "e.utah"),
        ("out", "e.mtz"),
        ("in", "e.utah"),
    ]


def test_mediator_node_edges_and_literal_with_datatype(kg, small_kb):
    out = kg.neighbors("cvt.1", "out")
    assert [(e.relation, e.object, e.object_label) for e in out] == [
        ("office_holder", "e.cox", "Spencer Cox"),
        ("from", small_kb.date, "2021-01-20"),
    ]
    assert all(e.subject_unnamed and e.subject_label == "cvt.1" for e in out)
    assert kg.is_unnamed("cvt.1") and not kg.is_unnamed("e.utah") and not kg.is_unnamed(small_kb.date)
    into_date = kg.neighbors(small_kb.date, "in")
    assert [(e.subject, e.relation) for e in into_date] == [("cvt.1", "from")]
    assert kg.neighbors(small_kb.date, "out") == []


def test_relations_filter_and_limit(kg):
    assert [e.object for e in kg.neighbors("e.utah", relations=["capital", "time_zone"])] == ["e.mtz", "e.slc"]
    assert kg.neighbors("e.utah", relations=["no_such_relation"]) == []
    assert [e.object for e in kg.neighbors("e.utah", limit=2)] == ["e.mtz", "e.slc"]
    assert kg.neighbors("e.utah", limit=0) == []
    # the limit counts across directions, outgoing first
    assert [(e.direction, e.neighbor) for e in kg.neighbors("e.slc", "both", limit=2)] == [
        ("out", "e.utah"),
        ("out", "e.mtz"),
    ]
    assert [e.direction for e in kg.neighbors("e.slc", "both", limit=3)] == ["out", "out", "in"]


def test_unknown_entity_and_bad_direction(kg):
    assert kg.neighbors("e.unknown", "both") == []
    assert kg.degree("e.unknown") == 0
    assert kg.label("e.unknown") == "e.unknown"
    with pytest.raises(ValueError, match="direction must be one of"):
        kg.neighbors("e.utah", "sideways")  # type: ignore[arg-type]


def test_degree(kg):
    assert (kg.degree("e.utah", "out"), kg.degree("e.utah", "in"), kg.degree("e.utah")) == (7, 1, 8)
    assert kg.degree("e.usa", "in") == 3


def test_resolve_exact_then_normalised(kg):
    assert kg.resolve("Utah") == ["e.utah", "e.beach"]  # namesakes, in first-seen order
    assert kg.resolve("utah") == ["e.utah", "e.beach"]  # only after normalisation
    assert kg.resolve("united_states") == ["e.usa"]  # case, underscores and articles ignored
    assert kg.resolve("e.cox") == ["e.cox"]  # an id resolves to itself
    assert kg.resolve("3271616") == ['"3271616"^^<http://www.w3.org/2001/XMLSchema#integer>']
    assert kg.resolve("cvt.1") == ["cvt.1"]  # by id only: unnamed nodes have no label to match
    assert kg.resolve("Nowhere") == []  # named, but not in any triple
    assert kg.resolve('Say "hi" {x} } ; DROP ALL >') == ["e.odd"]


def test_execute_path_through_mediator(kg, small_kb):
    assert execute_path(kg, "e.utah", ["governing_position", "office_holder"]) == {"e.cox"}
    assert execute_path(kg, "e.cox", ["^office_holder", "from"]) == {small_kb.date}


def test_without_names_ids_are_labels(small_kb):
    kg = MemoryKG.from_triples(small_kb.triples)
    edge = kg.neighbors("e.utah", relations=["governing_position"])[0]
    assert (edge.object_label, edge.object_unnamed) == ("cvt.1", False)
    assert kg.resolve("e.utah") == ["e.utah"]


def test_bad_tsv_line_names_file_and_line(tmp_path):
    path = tmp_path / "kb.tsv"
    path.write_text("a\tr\tb\n\nc\tr\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{path}:3: expected 3 tab-separated"):
        MemoryKG.from_file(path)


def test_bad_names_line_names_file_and_line(tmp_path):
    (tmp_path / "kb.tsv").write_text("a\tr\tb\n", encoding="utf-8")
    (tmp_path / "names.tsv").write_text("a\tA\nb\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{tmp_path / 'names.tsv'}:2: expected 'id<TAB>label'"):
        MemoryKG.from_file(tmp_path / "kb.tsv")


def test_negative_limit_is_refused_like_the_other_backends(kg):
    with pytest.raises(ValueError, match="limit: expected a non-negative int or None, got -2"):
        kg.neighbors("e.utah", limit=-2)
    with pytest.raises(ValueError, match="limit: expected a non-negative int or None, got True"):
        kg.neighbors("e.utah", limit=True)  # an int to Python, a slip to the caller


@pytest.mark.parametrize(
    "text, line, detail",
    [
        ("a\tr\tb\tx\nc\tr\td\ty\n", 1, "got 4 field(s)"),  # pandas would take column 1 as an index
        ("a\tr\tb\tx\nc\tr\td\n", 1, "got 4 field(s)"),
        ("a\tr\tb\n\nc\tr\td\tx\n", 3, "got 4 field(s)"),
        ("a\tr\tb\nc\t\td\n", 2, "got 3 field(s), some empty"),
    ],
)
def test_a_line_without_exactly_three_fields_is_named(tmp_path, text, line, detail):
    path = tmp_path / "kb.tsv"
    path.write_text(text, encoding="utf-8")
    message = f"{path}:{line}: expected 3 tab-separated non-empty fields (subject, relation, object), {detail}"
    with pytest.raises(ValueError) as err:
        MemoryKG.from_file(path)
    assert str(err.value) == message


@pytest.mark.parametrize(
    "text, line",
    [("Utah \tr\tb\n", 1), ("a\tr\tb\nc\tr\t Utah\n", 2), ("a\tr \tb\n", 1), ("a\tr\tb\nc\tr\td  \r\n", 2)],
)
def test_spaces_at_a_field_edge_are_refused(tmp_path, text, line):
    path = tmp_path / "kb.tsv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError) as err:
        MemoryKG.from_file(path)
    assert str(err.value) == (
        f"{path}:{line}: a field starts or ends with a space, which would make it a different id; remove the space"
    )


def test_empty_kb_and_bytes_that_are_not_utf8_are_named(tmp_path):
    path = tmp_path / "kb.tsv"
    path.write_bytes(b"")
    with pytest.raises(ValueError, match=rf"^{path}: no triples \(the file is empty\)"):
        MemoryKG.from_file(path)
    path.write_bytes(b"a\tr\tb\nc\tr\tUt\xe9h\n")
    with pytest.raises(ValueError, match=rf"^{path}:2: not UTF-8 \(byte 0xe9 at column 7\)$"):
        MemoryKG.from_file(path)
    path.write_bytes(b"a\tr\tb\n")
    (tmp_path / "names.tsv").write_bytes(b"a\tA\nb\t\xff\n")
    with pytest.raises(ValueError, match=rf"^{tmp_path / 'names.tsv'}:2: not UTF-8 \(byte 0xff at column 3\)$"):
        MemoryKG.from_file(path)


def test_an_id_with_an_edge_space_in_names_tsv_is_refused(tmp_path):
    (tmp_path / "kb.tsv").write_text("a\tr\tb\n", encoding="utf-8")
    (tmp_path / "names.tsv").write_text("a\tA\nb \tB\n", encoding="utf-8")
    with pytest.raises(ValueError) as err:
        MemoryKG.from_file(tmp_path / "kb.tsv")
    assert str(err.value) == (
        f"{tmp_path / 'names.tsv'}:2: the id starts or ends with a space, which would make it a "
        "different id; remove the space"
    )


def test_a_utf8_bom_is_not_part_of_the_first_id(tmp_path):
    (tmp_path / "kb.tsv").write_bytes("\ufeffe.utah\tcapital\te.slc\n".encode("utf-8"))
    (tmp_path / "names.tsv").write_bytes("\ufeffe.utah\tUtah\ne.slc\tSalt Lake City\n".encode("utf-8"))
    kg = MemoryKG.from_file(tmp_path / "kb.tsv")
    assert kg.entities == ["e.utah", "e.slc"]
    assert kg.label("e.utah") == "Utah" and not kg.is_unnamed("e.utah") and kg.resolve("Utah") == ["e.utah"]


def test_malformed_literals_are_refused_as_kg_load_refuses_them(tmp_path):
    path = tmp_path / "kb.tsv"
    for literal in ['"unterminated', '"x"^^<not an iri>', '"x"@', '"a"b"']:
        path.write_text(f'a\tr\t"ok"\nb\tr\t{literal}\n', encoding="utf-8")
        with pytest.raises(
            ValueError, match=rf"^{path}:2: {re.escape(repr(literal))} is not a valid N-Triples literal \("
        ):
            MemoryKG.from_file(path)
        with pytest.raises(
            ValueError, match=rf"^{path}:2: {re.escape(repr(literal))} is not a valid N-Triples literal \("
        ):
            OxigraphKG.build(path, tmp_path / "store")


def test_a_repeated_line_is_one_triple_in_every_backend(tmp_path, capsys):
    path = tmp_path / "kb.tsv"
    path.write_text("a\tr\tb\na\tr\tc\na\tr\tb\n", encoding="utf-8")
    kg = MemoryKG.from_file(path)
    assert kg.num_triples == 2 and [e.object for e in kg.neighbors("a")] == ["b", "c"] and kg.degree("b") == 1
    assert main(["kg", "load", str(path), "--store", str(tmp_path / "store")]) == 0
    assert (
        capsys.readouterr()
        .out.splitlines()[1]
        .startswith(f"kg load: 2 triples (1 repeated lines counted once) into {tmp_path / 'store'} in ")
    )
    store = OxigraphKG(tmp_path / "store")
    assert graph_stats(store)["triples"] == 2 == graph_stats(kg)["triples"] and len(store.neighbors("a")) == 2
    store.close()


def test_both_stores_read_an_ntriples_file_alike_and_take_names_given_beside_it(tmp_path):
    nt = tmp_path / "kb.nt"
    a, b = f"<{ENTITY_NS}m.a>", f"<{ENTITY_NS}m.b>"
    nt.write_text(f'{a} <{RELATION_NS}r.x> {b} .\n{a} <{RDFS_LABEL}> "Alpha" .\n', encoding="utf-8")
    for kg in (MemoryKG.from_file(nt), OxigraphKG.build(nt, tmp_path / "store")):
        assert [(e.subject, e.relation, e.object, e.subject_label) for e in kg.neighbors("m.a")] == [
            ("m.a", "r.x", "m.b", "Alpha")
        ]
    given = {"m.a": "Aleph", "m.b": "Beth"}
    for kg in (MemoryKG.from_file(nt, names=given), OxigraphKG.build(nt, tmp_path / "store2", names=given)):
        assert (kg.label("m.a"), kg.label("m.b")) == ("Aleph", "Beth")
