"""One filter grammar: every relation the tool lists is written in a form the filter reads back to it alone."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgreasoner.data.schema import TopicEntity
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.protocol import (
    last_open_search,
    read_relation_filter,
    relation_filter_text,
    split_relation_filter,
    split_search_query,
)
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig, parse_listing

HUB = [TopicEntity("h", "Hub")]
AWKWARD = [
    "born | in",
    "a|b",
    "=eq",
    "=",
    "==",
    "backtrack",
    "Backtrack",
    " backtrack ",
    "relations",
    "^born_in",
    "born_in",
    "Born_In",
    "born  in",
    " born in",
    "x\\",
    "\\|",
    '"q"',
    "a, b (2)",
    "é ü",
    "日本語",
    "x</search>",
    "<think>",
    "line\nbreak",
    "tab\there",
    "\u2028",
    "film.film.genre",
    "film film genre",
    "film__film__genre",
    "http://x.org/r#genre",
    "genre",
]
RELATION = st.one_of(
    st.sampled_from(AWKWARD),
    st.text(
        st.one_of(st.characters(blacklist_categories=("Cs",)), st.sampled_from('|=^ \\"(),<>')),
        min_size=1,
        max_size=12,
    ),
)


def hub_kg(relations: list[str]) -> MemoryKG:
    """Relation number i has i + 1 edges from the hub, to nodes named after nothing."""
    triples = [("h", relation, f"n{i}_{j}") for i, relation in enumerate(relations) for j in range(i + 1)]
    return MemoryKG.from_triples(triples, {"h": "Hub"})


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(RELATION, min_size=1, max_size=6, unique=True), st.sampled_from(["id", "words"]))
def test_filtering_by_the_printed_form_returns_exactly_that_relation_s_edges(relations, relation_format):
    kg = hub_kg(relations)
    tool = KGSearchTool(kg, ToolConfig(top_k=1, max_chars=10**5, relation_format=relation_format))
    session = tool.session("q", HUB)
    first = session.call("Hub")
    names = {relation: session.filter_name("h", relation) for relation in relations}
    assert len(set(names.values())) == len(relations)
    # The listing prints each relation with unseen edges once, as filter_name gives it and its parser reads it.
    listing = [line for line in first.text.split("\n") if line.startswith("more:")]
    assert parse_listing(listing[0] if listing else "") == list(first.more)
    assert {name for name, _ in first.more} <= set(names.values())
    wide = KGSearchTool(kg, ToolConfig(top_k=100, max_chars=10**5, relation_format=relation_format))
    for index, relation in enumerate(relations):
        query = last_open_search(f"<think> <search>Hub | {names[relation]}</search>")
        result = wide.session("q", HUB).call(query)
        assert result.error is None, (relation, names[relation], result.text)
        assert [edge.relation for edge in result.edges] == [relation] * (index + 1)


def test_the_listed_form_of_a_relation_holding_a_bar_or_an_escape_filters_it():
    kg = hub_kg(["born | in", "=eq", "backtrack", "relations", "a, b (2)"])
    session = KGSearchTool(kg, ToolConfig(top_k=1)).session("q", HUB)
    first = session.call("Hub")
    assert first.text.split("\n")[-1] == 'more: ="a, b (2)" (5), =relations (4), =backtrack (3), ==eq (2)'
    session = KGSearchTool(kg, ToolConfig(top_k=1)).session("q", HUB)
    session.call("Hub")
    assert session.filter_name("h", "born | in") == '="born \\| in"'
    assert session.filter_name("h", "relations") == "=relations"
    for name, relation in [
        ('="born \\| in"', "born | in"),
        ("==eq", "=eq"),
        ("=backtrack", "backtrack"),
        ("=relations", "relations"),
        ('="a, b (2)"', "a, b (2)"),
    ]:
        page = KGSearchTool(kg, ToolConfig(top_k=10)).session("q", HUB).call(f"Hub | {name}")
        assert {edge.relation for edge in page.edges} == {relation}, name
    # after the bar the marks keep their meaning
    assert session.call("Hub | relations").text.startswith("more: ")
    assert session.call("Hub | backtrack").error == "backtrack_at_root"


def test_the_grammar_is_protocol_s_and_reads_every_string_back():
    for relation in AWKWARD + [""]:
        written = relation_filter_text(relation)
        assert read_relation_filter(written) == relation
        assert split_relation_filter(f"A | B | {written}") == ("A | B", written)
        assert split_search_query(f"A | B | {written}") == (f"A | B | {written}", False)
        assert "\n" not in written and "</" not in written
    assert split_search_query("A | B | Backtrack ") == ("A | B", True)
    assert read_relation_filter('="unterminated') == '"unterminated'
