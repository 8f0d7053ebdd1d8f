"""The search tool: resolution, handles, repeated search, backtracking and error texts."""

from __future__ import annotations

import pytest

from kgreasoner.kg.base import KGError
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.schema import TopicEntity
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig, relation_display, relation_key

UTAH = [TopicEntity("m.utah", "Utah")]
UTAH_LINES = [
    "(Utah, location.location.time_zones, Mountain Time Zone)",
    "(Utah, location.us_state.capital, Salt Lake City)",
    "(Utah, location.location.contains, Provo)",
    "(Utah, government.governmental_jurisdiction.governing_officials, m.cvt)",
    "(m.cvt, government.government_position_held.office_holder, Spencer Cox)",
    "(m.cvt, government.government_position_held.from, 2021-01-04)",
    "(Salt Lake City, location.location.containedby, Utah)",
]


def session(kg, question="what timezone is utah in", topics=UTAH, **config):
    return KGSearchTool(kg, ToolConfig(**config)).session(question, list(topics))


def test_search_shows_kg_order_with_mediator_expanded(utah_kg):
    s = session(utah_kg)
    result = s.call("Utah")
    assert result.error is None and result.entity == "m.utah" and not result.backtracked
    assert result.text == "\n".join(UTAH_LINES)
    # The mediator's first edge is printed once but belongs to both candidates through it.
    assert len(result.edges) == 8
    assert s.num_calls == 1 and s.num_backtracks == 0


def test_handles_are_assigned_in_order_of_appearance_and_resolve(utah_kg):
    s = session(utah_kg, entity_handles=True)
    assert s.shown_entities() == [("E1", "Utah")]
    text = s.call("E1").text.splitlines()
    assert text[0] == "(E1 Utah, location.location.time_zones, E2 Mountain Time Zone)"
    assert text[3] == "(E1 Utah, government.governmental_jurisdiction.governing_officials, E5 m.cvt)"
    assert text[5] == "(E5 m.cvt, government.government_position_held.from, E7 2021-01-04)"
    assert s.shown_entities()[:3] == [("E1", "Utah"), ("E2", "Mountain Time Zone"), ("E3", "Salt Lake City")]
    # A handle, a handle with its label copied after it, and the bare name all resolve.
    assert s.call("E2").text == "(E2 Mountain Time Zone, common.topic.alias, E8 MST)"
    assert s.call("Mountain Time Zone").error == "exhausted"
    assert s.call("E2 Mountain Time Zone").error == "exhausted"
    assert s.resolve_answer("E2 | Salt Lake City | Ogden") == ["Mountain Time Zone", "Salt Lake City", "Ogden"]


def test_relation_words_print_namespace_parts_and_keep_single_underscores(utah_kg):
    s = session(utah_kg, entity_handles=True, relation_format="words")
    lines = s.call("E1").text.splitlines()
    assert lines[0] == "(E1 Utah, location location time_zones, E2 Mountain Time Zone)"
    assert lines[4] == "(E5 m.cvt, government government_position_held office_holder, E6 Spencer Cox)"
    # PathQuestion's ids, a URI and an id without namespaces
    assert relation_display("__common__topic__notable_types", "words") == "common topic notable_types"
    assert relation_key("__common__topic__notable_types", "words") == "notable_types"
    assert relation_display("http://www.wikidata.org/prop/direct/P31", "words") == "P31"
    assert relation_display("place_of_birth", "words") == relation_key("place_of_birth", "words") == "place_of_birth"
    assert relation_key("people.person.spouse_s", "id") == "people.person.spouse_s"
    # a path relation walked backwards keeps its `^` (plans and hops write it so)
    assert relation_key("^__people__person__children", "words") == "^children"
    assert relation_key("^people.person.spouse_s", "id") == "^people.person.spouse_s"
    with pytest.raises(ValueError, match="relation_format must be one of"):
        ToolConfig(relation_format="label")


def test_handles_restart_in_every_session(utah_kg):
    tool = KGSearchTool(utah_kg, ToolConfig(entity_handles=True))
    first = tool.session("q", [TopicEntity("m.mtz", "Mountain Time Zone")])
    assert first.call("E1").text.startswith("(E1 Mountain Time Zone, common.topic.alias, E2 MST)")
    second = tool.session("q", UTAH)
    assert second.call("E1").text.splitlines()[0] == "(E1 Utah, location.location.time_zones, E2 Mountain Time Zone)"
    assert second.resolve_answer("E2") == ["Mountain Time Zone"]
    # Handles off: "E2" is just an unknown name.
    assert session(utah_kg).call("E2").error == "unknown_entity"


def test_names_resolve_only_among_shown_entities(utah_kg):
    s = session(utah_kg)
    unknown = s.call("Spencer Cox")
    assert unknown.error == "unknown_entity" and unknown.edges == []
    assert unknown.text == (
        'Unknown entity "Spencer Cox": it is not a topic entity or an entity shown so far. '
        "Search a topic entity (Utah) or an entity from the triples above."
    )
    s.call("utah")  # normalised match on the topic entity
    assert s.call("spencer  COX!").entity == "m.cox"  # normalised
    assert s.call("Spencer Coxx").entity == "m.cox"  # fuzzy (and now exhausted)
    close = s.call("Salt Lake")
    assert close.error == "unknown_entity"
    assert close.text == (
        'Unknown entity "Salt Lake": it is not a topic entity or an entity shown so far. Close names: Salt Lake City.'
    )
    assert s.call("m.cvt").entity == "m.cvt"  # mediators are named by id
    assert s.call("2021-01-04").entity == '"2021-01-04"'  # literals by value
    assert s.call("Texas").error == "unknown_entity"


def test_repeated_search_shows_next_best_unseen_then_exhausted(utah_kg):
    s = session(utah_kg, top_k=2)
    first = s.call("Utah")
    # Without a ranker the listing names the relations with the most unseen neighbours first.
    assert first.text.splitlines() == UTAH_LINES[:2] + [
        "more: government.governmental_jurisdiction.governing_officials (2), location.location.contains (1), "
        "location.location.containedby (1)"
    ]
    assert first.more == (
        ("government.governmental_jurisdiction.governing_officials", 2),
        ("location.location.contains", 1),
        ("location.location.containedby", 1),
    )
    assert s.call("Utah").text.splitlines() == UTAH_LINES[2:5] + [
        "more: government.governmental_jurisdiction.governing_officials (1), location.location.containedby (1)"
    ]
    # The mediator's edge is printed again: the new candidate goes through it too.
    third = s.call("Utah")
    assert third.text.splitlines() == [UTAH_LINES[3], UTAH_LINES[5], UTAH_LINES[6]]
    assert [e.object for e in third.edges] == ["m.cvt", '"2021-01-04"', "m.utah"]
    done = s.call("Utah")
    assert done.error == "exhausted" and done.entity == "m.utah"
    assert done.text == "All 6 neighbours of Utah have been shown. Search another entity or write `Utah | backtrack`."


def test_empty_neighbourhoods_and_empty_queries(utah_kg):
    s = session(utah_kg, topics=[TopicEntity("m.ghost", "Ghost"), UTAH[0]])
    ghost = s.call("Ghost")
    assert ghost.error == "no_neighbors"
    assert (
        ghost.text
        == "Ghost has no neighbours in the knowledge graph. Search another entity or write `Ghost | backtrack`."
    )
    s.call("Utah")
    provo = s.call("Provo")
    assert provo.error == "no_neighbors"
    assert provo.text.startswith("Provo has no neighbours besides the triples already shown.")
    assert s.call("   ").error == "empty_query"
    blank_backtrack = s.call(" | backtrack")
    assert blank_backtrack.error == "empty_query" and blank_backtrack.backtracked


def test_backtracking_walks_the_papers_example(path_kg):
    s = session(path_kg, question="q", topics=[TopicEntity("1", "1")], top_k=1)
    assert [s.call(n).text for n in ("1", "2", "4", "5")] == [
        "(1, a, 2)\nmore: b (1)",
        "(2, c, 4)\nmore: d (1)",
        "(4, e, 5)\nmore: f (1)",
        "(5, g, 8)",
    ]
    # 5 is a dead end: back to 4 and its next-best unseen candidate.
    back = s.call("5 | backtrack")
    assert (back.text, back.entity, back.backtracked, back.error) == ("(4, f, 7)", "4", True, None)
    # 4 has nothing left: up to 2, then to the topic entity 1.
    assert (s.call("5 | backtrack").text, s.call("5|BACKTRACK").text) == ("(2, d, 6)", "(1, b, 3)")
    root = s.call("5 | backtrack")
    assert root.error == "backtrack_at_root" and root.backtracked
    assert root.text == (
        "Nothing left to backtrack to: every neighbour on the path from 5 back to the topic "
        "entity has been shown. Search another entity shown above, or answer."
    )
    at_topic = s.call("1 | backtrack")
    assert at_topic.error == "backtrack_at_root"
    assert (
        at_topic.text
        == "1 is a topic entity: there is nothing to backtrack to. Search one of the entities shown so far."
    )
    assert s.num_backtracks == 5 and s.num_calls == 9


def test_max_chars_caps_lines_listing_and_errors_without_wasting_handles(utah_kg):
    s = session(utah_kg, max_chars=130, entity_handles=True)
    first = s.call("Utah")
    # The listing keeps its room and says how many relations it could not name; a relation too long for
    # what is left is skipped for a shorter one.
    assert first.text.splitlines() == [
        "(E1 Utah, location.location.time_zones, E2 Mountain Time Zone)",
        "more: location.us_state.capital (1) and 3 more relations",
    ]
    assert (first.more, first.unlisted) == ((("location.us_state.capital", 1),), 3)
    assert s.shown_entities() == [("E1", "Utah"), ("E2", "Mountain Time Zone")]
    # `NAME | relations` lists the relations no listing has named yet, then starts over.
    listed = s.call("Utah | relations")
    assert (listed.error, listed.edges, listed.unlisted) == (None, [], 1)
    assert listed.text == (
        "more: government.governmental_jurisdiction.governing_officials (2), "
        "location.location.contains (1) and 2 more relations"
    )
    last = s.call("E1 | Relations")
    assert (last.text, last.unlisted) == ("more: location.location.containedby (1) and 3 more relations", 0)
    again = s.call("Utah | relations")
    assert again.text.startswith("more: government.governmental_jurisdiction.governing_officials (2), ")
    assert s.call("Utah").text.splitlines()[0] == "(E1 Utah, location.us_state.capital, E3 Salt Lake City)"
    bad = s.call("Utah | nope")
    assert bad.text == (
        'E1 Utah has no relation "nope". Its relations: '
        "government.governmental_jurisdiction.governing_officials (2) and 4 more relations."
    )
    for call in (first, listed, last, again, bad):
        assert len(call.text) <= 130
    # A first candidate longer than the room is cut, never the cap passed.
    tight = session(utah_kg, max_chars=64, entity_handles=True)
    assert tight.call("Utah").text == "(E1 Utah, location.location.time_zones,\u2026\nmore: 4 relations"
    assert len(tight.call("Utah | " + "x" * 500).text) == 64
    with pytest.raises(ValueError, match="max_chars must be >= 64"):
        ToolConfig(max_chars=63)


class BrokenKG(MemoryKG):
    def neighbors(self, entity, direction="out", relations=None, limit=None):
        raise KGError("endpoint http://127.0.0.1:1/sparql refused the connection")


def test_backend_failure_is_a_result_not_an_exception():
    kg = BrokenKG.from_triples([("a", "r", "b")])
    result = session(kg, topics=[TopicEntity("a", "a")]).call("a")
    assert result.error == "kg_error" and result.entity == "a"
    assert (
        result.text
        == "The knowledge graph could not be queried: endpoint http://127.0.0.1:1/sparql refused the connection"
    )


def test_config_validation():
    with pytest.raises(ValueError, match="ranking must be one of"):
        ToolConfig(ranking="bm25")
    with pytest.raises(ValueError, match="needs ranker_path"):
        KGSearchTool(MemoryKG.from_triples([("a", "r", "b")]), ToolConfig(ranking="gat"))


def test_embedding_ranking_puts_the_matching_relation_first(utah_kg):
    from kgreasoner.retrieval.encoder import EncoderConfig

    config = dict(ranking="embedding", encoder=EncoderConfig(kind="hashing"), top_k=1)
    s = session(utah_kg, question="who is the office holder of utah government position", **config)
    assert s.call("Utah").text.splitlines()[:2] == UTAH_LINES[3:5]
    s = session(utah_kg, question="what time zones is utah in", **config)
    assert s.call("Utah").text.splitlines()[0] == UTAH_LINES[0]


def test_hubs_score_only_the_pool_closest_by_relation():
    from kgreasoner.retrieval.encoder import EncoderConfig

    triples = [(f"p{i}", "people.person.gender", "male") for i in range(6)] + [("male", "award.award.winner", "w1")]
    kg = MemoryKG.from_triples(triples)
    config = dict(ranking="embedding", encoder=EncoderConfig(kind="hashing"), rerank_pool=2, top_k=3)
    s = session(kg, question="which award winner is male", topics=[TopicEntity("male", "male")], **config)
    # Pool: the award edge and the first gender edge (a tie keeps KG order); the rest stay in KG order.
    assert s.call("male").text.splitlines() == [
        "(male, award.award.winner, w1)",
        "(p0, people.person.gender, male)",
        "(p1, people.person.gender, male)",
        "more: people.person.gender (4)",
    ]


def test_tool_config_loads_from_overrides():
    from kgreasoner.config import load_config

    config = load_config(
        ToolConfig, None, ["top_k=3", "encoder.kind=hashing", "entity_handles=true", "rerank_pool=null"]
    )
    assert (config.top_k, config.encoder.kind, config.entity_handles, config.rerank_pool) == (3, "hashing", True, None)


def hub_kg() -> MemoryKG:
    """A country with five citizens, three clubs and a relation named `backtrack`: in KG order every citizen
    line comes before any club."""
    triples = [(f"p{i}", "citizen_of", "fr") for i in range(5)] + [(f"c{i}", "based_in", "fr") for i in range(3)]
    triples += [("undo", "backtrack", "fr"), ("p0", "plays_for", "c0")]
    names = {
        "fr": "Freedonia",
        "undo": "Undo",
        **{f"p{i}": f"Player {i}" for i in range(5)},
        **{f"c{i}": f"Club {i}" for i in range(3)},
    }
    return MemoryKG.from_triples(triples, names)


FREEDONIA = [TopicEntity("fr", "Freedonia")]


def test_listing_names_every_relation_the_page_left_out():
    s = session(hub_kg(), question="q", topics=FREEDONIA, top_k=2)
    first = s.call("Freedonia")
    assert first.text == (
        "(Player 0, citizen_of, Freedonia)\n(Player 1, citizen_of, Freedonia)\n"
        "more: citizen_of (3), based_in (3), =backtrack (1)"
    )
    # Without the listing the clubs would be two pages away and unnamed; the line names them now.
    assert first.more == (("citizen_of", 3), ("based_in", 3), ("=backtrack", 1))
    # A page that shows the last unseen neighbours has no listing line.
    whole = session(hub_kg(), question="q", topics=FREEDONIA, top_k=20).call("Freedonia")
    assert whole.more == () and "more:" not in whole.text and len(whole.text.splitlines()) == 9


def test_relation_filter_pages_through_unseen_lines_then_says_so():
    s = session(hub_kg(), question="q", topics=FREEDONIA, top_k=2)
    s.call("Freedonia")
    page = s.call("Freedonia | based_in")
    assert (page.error, page.entity, page.relation) == (None, "fr", "based_in")
    # The page's listing names its own relation first while it has more.
    assert page.text == (
        "(Club 0, based_in, Freedonia)\n(Club 1, based_in, Freedonia)\n"
        "more: based_in (1), citizen_of (3), =backtrack (1)"
    )
    assert s.call("Freedonia | based_in").text == "(Club 2, based_in, Freedonia)\nmore: citizen_of (3), =backtrack (1)"
    done = s.call("Freedonia|based_in")
    assert done.error == "exhausted" and done.edges == []
    assert done.text == (
        "All 3 neighbours of Freedonia by based_in have been shown. Search another entity, "
        "another relation of Freedonia, or write `Freedonia | backtrack`."
    )
    # A line shown from its other end (Player 0 searched: its club) is not repeated by the hub's filter.
    assert s.call("Club 0").text == "(Player 0, plays_for, Club 0)"
    assert s.call("Freedonia | citizen_of").text == (
        "(Player 2, citizen_of, Freedonia)\n(Player 3, citizen_of, Freedonia)\nmore: citizen_of (1), =backtrack (1)"
    )
    # The plain search goes on after the filtered pages.
    assert s.call("Freedonia").text == "(Player 4, citizen_of, Freedonia)\n(Undo, backtrack, Freedonia)"
    assert s.num_calls == 7 and s.num_backtracks == 0


def test_a_relation_named_backtrack_is_listed_and_filtered_with_the_escape():
    s = session(hub_kg(), question="q", topics=FREEDONIA, top_k=1)
    s.call("Freedonia")
    back = s.call("Freedonia | backtrack")  # the mark keeps its meaning
    assert back.backtracked and back.error == "backtrack_at_root"
    escaped = s.call("Freedonia | =backtrack")
    assert escaped.error is None and escaped.text == "(Undo, backtrack, Freedonia)\nmore: citizen_of (4), based_in (3)"


def test_unknown_relation_is_named_with_the_entity_s_relations():
    s = session(hub_kg(), question="q", topics=FREEDONIA, top_k=2)
    bad = s.call("Freedonia | plays_for")
    assert bad.error == "unknown_relation" and bad.entity == "fr" and bad.edges == []
    assert bad.text == (
        'Freedonia has no relation "plays_for". Its relations: citizen_of (5), based_in (3), =backtrack (1).'
    )
    # ids and printed forms both name a relation, case and spacing aside
    words = session(
        MemoryKG.from_triples([("a", "film.film.genre", "g"), ("a", "film.film.genre", "h")]),
        question="q",
        topics=[TopicEntity("a", "a")],
        top_k=1,
        relation_format="words",
    )
    assert words.call("a").text == "(a, film film genre, g)\nmore: film film genre (1)"
    assert words.call("a | Film  film genre").text == "(a, film film genre, h)"
    assert words.call("a | film.film.genre").error == "exhausted"


def test_a_label_holding_the_bar_is_a_name_not_a_filter():
    kg = MemoryKG.from_triples([("x", "r", "y"), ("y", "s", "z")], {"x": "X", "y": "A | B", "z": "Z"})
    s = session(kg, question="q", topics=[TopicEntity("x", "X")])
    s.call("X")
    assert s.call("A | B").text == "(A | B, s, Z)"
    assert s.call("A | B | s").error == "exhausted"
    assert s.call("Nobody | r").error == "unknown_entity"


def test_a_handle_before_the_bar_filters_its_entity():
    s = session(hub_kg(), question="q", topics=FREEDONIA, top_k=2, entity_handles=True)
    assert s.call("E1").text.splitlines()[0] == "(E2 Player 0, citizen_of, E1 Freedonia)"
    for query in ("E1 | based_in", "E1 Freedonia | based_in", "E1|based_in"):
        page = session(hub_kg(), question="q", topics=FREEDONIA, top_k=2, entity_handles=True)
        page.call("E1")
        result = page.call(query)
        assert (result.error, result.entity, result.relation) == (None, "fr", "based_in"), query
        assert result.text.splitlines()[:2] == [
            "(E4 Club 0, based_in, E1 Freedonia)",
            "(E5 Club 1, based_in, E1 Freedonia)",
        ], query
