"""Property tests: whatever a policy writes, parsing, the format check, the rewards and the search tool answer
without raising, and their results keep the protocol's invariants (10,000+ generated outputs per run)."""

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kgreasoner.kg.memory import MemoryKG
from kgreasoner.protocol import (
    MORE_PREFIX,
    TAGS,
    TRIPLES_CLOSE,
    TRIPLES_OPEN,
    check_format,
    last_open_search,
    listing_item,
    more_relations,
    parse_listing,
    parse_trajectory,
    read_relation_filter,
    relation_filter_text,
    split_search_query,
)
from kgreasoner.records.schema import TopicEntity
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
from kgreasoner.rewards import answer_reward, count_searches, format_reward, search_reward, shaped_search_reward

FRAGMENTS = st.sampled_from(
    [
        *TAGS,
        " ",
        "\n",
        "|",
        "backtrack",
        "E1",
        "E2",
        "Utah",
        "(Utah, time zone, E2 MT)",
        "<",
        ">",
        "</",
        "</triples><answer>X</answer>",
        "\ud800",
        "\x00",
        "é",
        "  ",
    ]
)
TEXT = st.lists(st.one_of(FRAGMENTS, st.text(max_size=6)), max_size=40).map("".join)
MANY = settings(max_examples=5000, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def text_and_spans(draw):
    text = draw(TEXT)
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=6)))
    return text, [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]


@pytest.mark.slow
@MANY
@given(text_and_spans())
def test_parsing_format_and_rewards_never_raise_and_keep_their_ranges(case):
    text, spans = case
    for tool_spans in (None, spans):
        parsed = parse_trajectory(text, tool_spans)
        report = check_format(text, tool_spans)
        assert report.valid == (not report.errors)
        if report.valid:
            assert parsed.answers, "a valid trajectory has a non-empty answer"
        assert count_searches(text, tool_spans) >= 0
    kwargs = dict(completion_text=[text], tool_spans=[spans], answers=[["X"]], hops=[2])
    assert format_reward([text], **kwargs)[0] in (0.0, 0.5)
    assert answer_reward([text], **kwargs)[0] in (0.0, 1.0)
    assert 0.0 <= search_reward([text], **kwargs)[0] <= 0.8
    assert 0.0 <= shaped_search_reward("correct_hops")([text], **kwargs)[0] <= 0.8


@pytest.mark.slow
@MANY
@given(TEXT)
def test_a_tool_block_hides_every_tag_a_label_prints(label):
    prefix = "<think> <search>Utah</search>"
    block = f"\n{TRIPLES_OPEN}\n(Utah, name, {label})\n{TRIPLES_CLOSE}\n"
    text = prefix + block + " </think>\n<answer>MT</answer>"
    spans = [(len(prefix), len(prefix) + len(block))]
    parsed = parse_trajectory(text, spans)
    assert parsed.answers == ["MT"]
    assert [s.query for s in parsed.searches] == ["Utah"]
    assert check_format(text, spans).valid
    assert answer_reward([text], completion_text=[text], tool_spans=[spans], answers=[["X"]]) == [0.0]
    last_open_search(prefix + label)


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.tuples(TEXT, st.integers(0, 10**6)), min_size=1, max_size=4), st.integers(0, 50))
def test_a_more_line_reads_back_as_the_relations_it_lists(items, left):
    line = MORE_PREFIX + " " + ", ".join(listing_item(relation_filter_text(r), n) for r, n in items)
    listed = parse_listing(line + (more_relations(left) if left else ""))
    assert [(read_relation_filter(name), count) for name, count in listed] == items


_KG = MemoryKG.from_triples(
    [("Utah", "time zone", "MT"), ("Utah", "capital", "Salt Lake City"), ("MT", "offset", "-7")]
)
_TOOL = KGSearchTool(_KG, ToolConfig(entity_handles=True, top_k=2, ranking="none"))


@settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(TEXT, min_size=1, max_size=4))
def test_the_search_tool_answers_every_argument_with_text(queries):
    session = _TOOL.session("what time zone is utah in", [TopicEntity("Utah", "Utah")])
    for query in ["Utah", *queries]:
        split_search_query(query)
        result = session.call(query)
        assert isinstance(result.text, str) and result.text
