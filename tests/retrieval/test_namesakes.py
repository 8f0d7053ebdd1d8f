"""Entities that share a label: the load says so, and a search by that name lists each of them."""

from __future__ import annotations

import logging

import pytest

from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.records.schema import TopicEntity
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig

TRIPLES = [
    ("m.usa", "contains", "m.sf_il"),
    ("m.usa", "contains", "m.sf_ma"),
    ("m.usa", "contains", "m.boston"),
    ("m.sf_il", "mayor", "m.misty"),
    ("m.sf_ma", "mayor", "m.domenic"),
]
NAMES = {
    "m.usa": "USA",
    "m.sf_il": "Springfield",
    "m.sf_ma": "Springfield",
    "m.boston": "Boston",
    "m.misty": "Misty Buscher",
    "m.domenic": "Domenic Sarno",
}
USA = [TopicEntity("m.usa", "USA")]
WARNING_TAIL = (
    "; a search by such a name lists every entity that bears it (the model picks one by handle or id), "
    "and a topic given by that name takes the first"
)


def write_kb(folder, names):
    (folder / "kb.tsv").write_text("".join(f"{s}\t{r}\t{o}\n" for s, r, o in TRIPLES), encoding="utf-8")
    (folder / "names.tsv").write_text("".join(f"{k}\t{v}\n" for k, v in names.items()), encoding="utf-8")
    return folder


def load(store, folder, tmp_path):
    if store == "memory":
        return MemoryKG.from_file(folder / "kb.tsv")
    return OxigraphKG.build(folder, tmp_path / "store")


@pytest.mark.parametrize("store", ["memory", "oxigraph"])
def test_a_shared_label_is_named_at_load_with_its_count(store, tmp_path, caplog):
    folder = write_kb(tmp_path, NAMES)
    with caplog.at_level(logging.WARNING, logger="kgreasoner.kg.kb_checks"):
        load(store, folder, tmp_path)
    assert [r.getMessage() for r in caplog.records] == [
        f'{folder / "names.tsv"}: 1 label is borne by several entities: "Springfield" (2 entities){WARNING_TAIL}'
    ]


def test_the_warning_names_the_most_shared_labels_and_counts_the_rest(tmp_path, caplog):
    names = dict(NAMES) | {f"m.x{i}": f"Town {i // (2 + (i < 3))}" for i in range(16)}
    names |= {"m.y0": "Red\x1b[31mTown", "m.y1": "Red\x1b[31mTown"}  # printed as tool text prints it
    folder = write_kb(tmp_path, names)
    with caplog.at_level(logging.WARNING, logger="kgreasoner.kg.kb_checks"):
        MemoryKG.from_file(folder / "kb.tsv")
    [message] = [r.getMessage() for r in caplog.records]
    assert message == (
        f'{folder / "names.tsv"}: 9 labels are borne by several entities: "Town 0" (3 entities), '
        '"Red\\u001b[31mTown" (2 entities), "Springfield" (2 entities), "Town 2" (2 entities), '
        f'"Town 3" (2 entities) and 4 more labels{WARNING_TAIL}'
    )


@pytest.mark.parametrize("store", ["memory", "oxigraph"])
@pytest.mark.parametrize("handles", [False, True])
def test_a_name_search_lists_every_entity_that_bears_it(store, handles, tmp_path):
    kg = load(store, write_kb(tmp_path, NAMES), tmp_path)
    session = KGSearchTool(kg, ToolConfig(entity_handles=handles)).session("who is the mayor", USA)
    first = session.call("USA")
    # in order of appearance, which follows the store's edge order
    order = [e.neighbor for e in first.edges if e.neighbor in ("m.sf_il", "m.sf_ma")]
    if handles:
        items, by = [f"{session.handle_of(e)} Springfield" for e in order], "handle"
    else:
        items, by = [f"Springfield (id {e})" for e in order], "id"
    expected = f'"Springfield" names 2 entities shown so far: {"; ".join(items)}. Search one by its {by}.'
    for query in ["Springfield", "springfield", "Springfeld", "Springfield | mayor", "Springfield | backtrack"]:
        result = session.call(query)
        written = query.split(" | ")[0]
        assert (result.error, result.entity, result.edges) == ("ambiguous_entity", None, []), query
        assert result.text == expected.replace('"Springfield"', f'"{written}"', 1), query
        assert result.backtracked == query.endswith("backtrack")
    # each is reached by its handle or id
    for entity, mayor in [("m.sf_il", "m.misty"), ("m.sf_ma", "m.domenic")]:
        name = session.handle_of(entity) if handles else entity
        assert [e.object for e in session.call(name).edges] == [mayor]
    # an answer naming the label keeps it
    assert session.resolve_answer("Springfield") == ["Springfield"]


def test_many_namesakes_are_listed_as_far_as_max_chars_allows():
    kg = MemoryKG.from_triples(
        [("hub", "has", f"t{i:02d}") for i in range(30)], {"hub": "Hub"} | {f"t{i:02d}": "Town" for i in range(30)}
    )
    session = KGSearchTool(kg, ToolConfig(top_k=30, max_chars=200)).session("q", [TopicEntity("hub", "Hub")])
    assert len(session.call("Hub").edges) == 30
    result = session.call("Town")
    assert result.error == "ambiguous_entity" and len(result.text) <= 200
    assert result.text == (
        '"Town" names 30 entities shown so far: Town (id t00); Town (id t01); Town (id t02); Town (id t03); '
        "Town (id t04); Town (id t05); Town (id t06); Town (id t07) and 22 more. Search one by its id."
    )
