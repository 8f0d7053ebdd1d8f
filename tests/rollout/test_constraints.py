"""Constrained decoding pieces that need no model: shown lines, config checks."""

from __future__ import annotations

import pytest

from kgreasoner.rollout import RolloutConfig
from kgreasoner.rollout.constraints import quoted_lines


def test_quoted_lines_are_the_triple_lines_without_parentheses():
    blocks = [
        "(E1 Utah, capital, E2 Salt Lake City)\n(E3 Colorado, time_zone, E4 Mountain Time Zone)",
        'Unknown entity "E9": it is not a topic entity or an entity shown so far.',
        "(E2 Salt Lake City, mayor, E5 Erin)\n[2 more lines cut: tool output limit]\n()",
    ]
    assert quoted_lines(blocks) == [
        "E1 Utah, capital, E2 Salt Lake City",
        "E3 Colorado, time_zone, E4 Mountain Time Zone",
        "E2 Salt Lake City, mayor, E5 Erin",
    ]


def test_constrained_quotes_need_constrained_decoding():
    with pytest.raises(ValueError, match="constrained_quotes needs constrained_decoding: true"):
        RolloutConfig(constrained_quotes=True)
    assert RolloutConfig(constrained_decoding=True, constrained_quotes=True).constrained_quotes


def test_a_quote_may_close_with_the_parenthesis_fused_to_the_next_mark():
    from kgreasoner.rollout.constraints import ConstraintVocabulary, RowConstraint
    from kgreasoner.tokenizer import TokenizerConfig, train_tokenizer

    tokenizer = train_tokenizer(
        ["(E1 utah, capital, E2 salt_lake_city). Next I search E2.", "a (b), c"], TokenizerConfig(num_handles=8)
    )

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    assert len(encode(").")) == len(encode("),")) == 1 and len(encode(");")) == 2  # its own tokens for `).` and `),`
    row = RowConstraint(ConstraintVocabulary(encode), lambda: [], lambda: ["E1 utah, capital, E2 salt_lake_city"])
    written = encode("so (")
    row.observe(written)
    for step, token in enumerate(encode("E1 utah, capital, E2 salt_lake_city")):
        assert row.allowed() == [token] or step == 0 and token in row.allowed()  # first: or a leading space
        written.append(token)
        row.observe(written)
    assert sorted(row.allowed()) == sorted([encode(")")[0], encode(").")[0], encode("),")[0]])
    row.observe(written + encode(")."))
    assert not row.active


def test_listed_relations_are_what_more_lines_name():
    from kgreasoner.rollout.constraints import listed_relations

    blocks = [
        "(E2 Pat, citizen_of, E1 Freedonia)\nmore: citizen_of (29), based_in (15), =backtrack (1)",
        "(E3 Club 0, based_in, E1 Freedonia)\nmore: film film genre (3), based_in (14)",
        "All 3 neighbours of X have been shown.",
    ]
    assert listed_relations(blocks) == ["citizen_of", "based_in", "=backtrack", "film film genre"]
    # Quoted relations keep their commas, parentheses and escaped bars; the count of unnamed ones is no relation.
    hub = [
        'more: ="born \\| in" (2), ="a, b (c)" (1), rock and roll (4), ==eq (3) and 2998 more relations',
        "more: 3000 relations",
    ]
    assert listed_relations(hub) == ['="born \\| in"', '="a, b (c)"', "rock and roll", "==eq"]


def test_a_constrained_search_may_filter_by_a_listed_relation_only():
    import re

    from kgreasoner.rollout.constraints import ConstraintVocabulary, RowConstraint, turn_regex
    from kgreasoner.tokenizer import TokenizerConfig, train_tokenizer

    pattern = turn_regex(["E1"], None, ["citizen_of", "film film genre"])
    assert re.fullmatch(pattern, "<think> more <search>E1 | film film genre</search>")
    assert re.fullmatch(pattern, "<think> back <search>E1 | backtrack</search>")
    assert re.fullmatch(pattern, "<think> list <search>E1 | relations</search>")
    assert not re.fullmatch(pattern, "<think> x <search>E1 | plays_for</search>")
    tokenizer = train_tokenizer(
        ["<search>E1 | citizen_of</search> E1 | backtrack plays_for"], TokenizerConfig(num_handles=4)
    )

    def encode(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    tails = {name: encode(f" | {name}") for name in ("citizen_of", "backtrack", "plays_for")}
    shared = 0  # the tokens of ` | ` both tails start with
    while tails["citizen_of"][shared] == tails["backtrack"][shared]:
        shared += 1
    for listed, allowed in (([], False), (["citizen_of"], True)):
        row = RowConstraint(ConstraintVocabulary(encode), lambda: ["E1"], None, lambda listed=listed: listed)
        written = encode("<search>")
        row.observe(written)
        for token in encode("E1") + tails["backtrack"][:shared]:
            written.append(token)
            row.observe(written)
        assert (tails["citizen_of"][shared] in row.allowed()) == allowed
        assert tails["plays_for"][shared] not in row.allowed() and tails["backtrack"][shared] in row.allowed()
