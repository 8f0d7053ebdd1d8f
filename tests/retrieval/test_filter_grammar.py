"""One filter grammar: every relation the tool lists is written in a form the filter reads back to it alone."""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgreasoner.kg.memory import MemoryKG
from kgreasoner.protocol import (
    last_open_search,
    parse_listing,
    parse_trajectory,
    read_relation_filter,
    relation_filter_text,
    split_relation_filter,
    split_search_query,
)
from kgreasoner.records.schema import TopicEntity
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig

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


def _reference_split(text: str) -> tuple[str, str] | None:
    """The grammar's own words, read character by character: the last bar with an even run of backslashes
    (none counts) right before it splits."""
    for position in range(len(text) - 1, -1, -1):
        if text[position] == "|":
            run = 0
            while run < position and text[position - run - 1] == "\\":
                run += 1
            if run % 2 == 0:
                return text[:position], text[position + 1 :]
    return None


def _reference_unquote(body: str) -> str | None:
    """A quoted body read left to right: `\\\\`, `\\"`, `\\|` and `\\uXXXX` escapes; a bare quote or bar, or any
    other escape, is no quoted body."""
    out, index = [], 0
    while index < len(body):
        char = body[index]
        if char in '"|':
            return None
        if char != "\\":
            out.append(char)
            index += 1
        elif body[index + 1 : index + 2] in ("\\", '"', "|"):
            out.append(body[index + 1])
            index += 2
        elif body[index + 1 : index + 2] == "u" and re.fullmatch("[0-9a-fA-F]{4}", body[index + 2 : index + 6]):
            out.append(chr(int(body[index + 2 : index + 6], 16)))
            index += 6
        else:
            return None
    return "".join(out)


ESCAPE_PARTS = ["\\", "\\", "\\", "|", "|", '"', "u", "U", "0", "5", "c", "D", "8", "e", "g", " ", "=", "<", "é", "\n"]
ESCAPY = st.lists(st.one_of(st.text(st.sampled_from(ESCAPE_PARTS), max_size=8), st.text(max_size=2)), max_size=6).map(
    "".join
)
"""Texts made mostly of backslashes, bars, quotes and `\\uXXXX` pieces, with any character between them."""


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ESCAPY)
def test_splitting_and_unquoting_read_as_the_character_by_character_reference(text):
    reference = _reference_split(text)
    expected = None
    if reference is not None and reference[0].strip() and reference[1].strip():
        expected = (reference[0].strip(), reference[1].strip())
    assert split_relation_filter(text) == expected
    backtrack = reference is not None and reference[1].strip().lower() == "backtrack"
    assert split_search_query(text) == ((reference[0].strip(), True) if backtrack else (text.strip(), False))
    unquoted = _reference_unquote(text)
    quoted = f'="{text}"'
    assert read_relation_filter(quoted) == (unquoted if unquoted is not None else quoted[1:].strip())


NAME = st.one_of(
    st.text(st.sampled_from(["\\", "|", '"', " ", "E", "1", "="]), max_size=12), st.text(max_size=12)
).filter(lambda name: name.strip() and "<" not in name)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(NAME, RELATION)
def test_a_filter_written_after_any_name_parses_back_to_its_relation(name, relation):
    written = relation_filter_text(relation)
    parsed = parse_trajectory(f"<think> <search>{name} | {written}</search>")
    [search] = parsed.searches
    assert not search.is_backtrack
    assert split_relation_filter(search.query) == (name.strip(), written)
    assert read_relation_filter(written) == relation


SIZES = [1_000, 32_000, 1_000_000]


@pytest.mark.parametrize("size", SIZES)
def test_queries_of_a_million_escapes_read_exactly(size):
    """Each shape at 1 KB to 1 MB reads back to the relation it spells; the tool with no length limit answers
    the filter in full, and with the default one refuses the query unread."""
    kg = hub_kg(["r0", "r1"])
    count = size // 2
    shapes = [
        ('="' + "\\|" * count + '"', "|" * count),
        ('="' + "\\\\" * count + '"', "\\" * count),
        ('="' + "\\u003c" * (size // 6) + '"', "<" * (size // 6)),
        ("\\|" * count, "\\|" * count),
    ]
    for written, relation in shapes:
        query = f"Hub | {written}"
        [search] = parse_trajectory(f"<think> <search>{query}</search>").searches
        assert search.query == query
        assert split_relation_filter(search.query) == ("Hub", written)
        assert read_relation_filter(written) == relation
        unlimited = KGSearchTool(kg, ToolConfig(max_query_chars=None)).session("q", HUB).call(search.query)
        echo = relation if len(relation) <= 80 else relation[:79] + "…"
        assert (unlimited.error, unlimited.text) == (
            "unknown_relation",
            f'Hub has no relation "{echo}". Its relations: r1 (2), r0 (1).',
        )
        refused = KGSearchTool(kg, ToolConfig()).session("q", HUB).call(search.query)
        if len(query) > 1000:
            assert refused.error == "query_too_long"
        else:
            assert refused.text == unlimited.text
    # a name full of escaped bars is one name: the last bare bar starts the filter
    name = "x\\|" * (size // 3)
    assert split_relation_filter(f"{name} | r1") == (name, "r1")


def test_an_over_long_search_is_answered_with_an_error_naming_the_limit():
    kg = hub_kg(["r0", "r1"])
    session = KGSearchTool(kg, ToolConfig(max_query_chars=12)).session("q", HUB)
    long = session.call("Hub | " + "\\|" * 4)
    assert (long.error, long.entity, long.edges) == ("query_too_long", None, [])
    assert long.text == (
        "Search too long: 14 characters, over the limit of 12. Write one entity between the search tags "
        "(`NAME`, `NAME | relation` or `NAME | backtrack`)."
    )
    assert session.call("Hub | " + "r" * 6).error == "unknown_relation"  # 12 characters: read
    assert [edge.relation for edge in session.call("Hub | r1").edges] == ["r1", "r1"]
    default = KGSearchTool(kg, ToolConfig()).session("q", HUB)
    assert default.call("x" * 1001).error == "query_too_long"
    assert default.call("x" * 1000).error == "unknown_entity"
    with pytest.raises(ValueError, match="max_query_chars must be >= 1 or None, got 0"):
        ToolConfig(max_query_chars=0)
