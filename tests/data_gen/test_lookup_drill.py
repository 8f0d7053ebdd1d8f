"""Lookup drills: probes of one tool block's lines, everything but each line's tail masked."""

from __future__ import annotations

import random

from data_gen.lookup_drill import block_probes, lookup_drills
from kgreasoner.protocol import format_tool_block
from kgreasoner.records.trajectories import Segment, WarmupRecord

FIRST = format_tool_block("(E1 Adolf Hitler, spouse, E2 Eva Braun)\n(E1 Adolf Hitler, profession, E3 Artist)")
SECOND = format_tool_block(
    "(E2 Eva Braun, place of birth, E4 Munich)\n"
    "(E2 Eva Braun, cause of death, E5 Cyanide poisoning)\n"
    "(E2 Eva Braun, cause of death, E6 Suicide)\n"
    "(E7 Gretl Braun, sibling, E2 Eva Braun)\n"
    "(E2 Eva Braun, date of birth, 1912)"
)


def record() -> WarmupRecord:
    return WarmupRecord(
        id="q7",
        question="where was adolf hitler's wife born",
        topic_entities=(),
        kind="gold",
        hops=2,
        segments=(
            Segment("<think> Path: spouse, place of birth. <search>E1</search>", True),
            Segment(FIRST, False),
            Segment("(E1 Adolf Hitler, spouse, E2 Eva Braun). Next I search E2. <search>E2</search>", True),
            Segment(SECOND, False),
            Segment(
                "(E2 Eva Braun, place of birth, E4 Munich). So the answer is E4. </think>\n<answer>E4</answer>", True
            ),
        ),
    )


def test_probes_split_before_the_tail_handle_and_skip_shared_starts_and_literals():
    assert block_probes(SECOND) == [
        ("(E2 Eva Braun, place of birth, ", "E4 Munich)"),
        ("(E7 Gretl Braun, sibling, ", "E2 Eva Braun)"),
    ]
    commas = format_tool_block("(E1 Paris, Texas, country, E2 United States)\n(E1 Paris, Texas, mayor, E3 Smith, Jr.)")
    assert block_probes(commas) == [
        ("(E1 Paris, Texas, country, ", "E2 United States)"),
        ("(E1 Paris, Texas, mayor, ", "E3 Smith, Jr.)"),
    ]
    assert block_probes(format_tool_block('Unknown entity "E9": search a topic entity.')) == []


def test_a_drill_masks_the_trajectory_up_to_its_block_and_trains_only_the_line_tails():
    drills = lookup_drills(record(), random.Random(0), limit=5)
    assert [d.id for d in drills] == ["q7#drill1", "q7#drill3"]
    assert {d.kind for d in drills} == {"drill"} and {d.question for d in drills} == {record().question}
    second = drills[1]
    assert second.segments[:4] == tuple(Segment(s.text, False) for s in record().segments[:4])
    asked = second.segments[4:]
    assert [s.train for s in asked] == [False, True, False, True]
    assert sorted(s.text for s in asked if s.train) == ["E2 Eva Braun)", "E4 Munich)"]
    assert not asked[0].text.startswith(". ") and asked[2].text.startswith(". (")
    text = "".join(s.text for s in asked)
    assert text in (
        "(E2 Eva Braun, place of birth, E4 Munich). (E7 Gretl Braun, sibling, E2 Eva Braun)",
        "(E7 Gretl Braun, sibling, E2 Eva Braun). (E2 Eva Braun, place of birth, E4 Munich)",
    )


def test_limit_min_probes_and_seed():
    assert len(lookup_drills(record(), random.Random(0), limit=1)) == 1
    assert lookup_drills(record(), random.Random(0), limit=0) == []
    assert lookup_drills(record(), random.Random(0), limit=2, min_probes=3) == []
    orders = {
        tuple(s.text for s in lookup_drills(record(), random.Random(seed), limit=2)[0].segments) for seed in range(20)
    }
    assert len(orders) == 2  # both probe orders occur
    assert lookup_drills(record(), random.Random(3), limit=2) == lookup_drills(record(), random.Random(3), limit=2)
