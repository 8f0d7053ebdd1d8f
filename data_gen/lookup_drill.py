"""Lookup drills: extra warm-up records that train reading a tool block line by line.

A trajectory looks up one line per tool block: the one its plan follows, whose tail handle it
copies. A tiny model sees so few of these lookups that it learns position shortcuts (the first
line's handle, the next number) instead of matching the relation. A drill record replays a
training trajectory up to one of its tool blocks, everything masked, then probes that block's
lines in random order: the start of each line, `(E2 Eva Braun, place of birth, `, is given
(masked) and the rest, `E4 Munich)`, is trained. Every trained token is what the line templates
have the model write after that block, so drills add lookups without teaching a new behaviour.

A probe needs a line whose tail is a handle and whose start no other line of the block shares
(two `cause of death` lines of one entity: either tail would be right, so neither is asked).

Experimental: kept for the study of tiny models' lookups (`docs/cpu-training.md`), where drills did
not help at the CPU budget; off unless a recipe sets `lookup_drills`, and no shipped recipe does.
"""

from __future__ import annotations

import random
import re
from collections import Counter

from kgreasoner.protocol import HANDLE_PATTERN, TRIPLES_CLOSE, TRIPLES_OPEN
from kgreasoner.records.trajectories import Segment, WarmupRecord

PROBE_SEPARATOR = ". "

# `(head, relation, tail)`: the relation is the last comma-free field before a tail that starts
# with a handle, so commas inside entity labels do not move the split.
_LINE = re.compile(r"^(\(.+, [^,]+, )(" + HANDLE_PATTERN + r"\b.*\))$")


def block_probes(block: str) -> list[tuple[str, str]]:
    """(given start, trained rest) of each line of a tool block that a probe can ask."""
    inner = block.strip()
    if not (inner.startswith(TRIPLES_OPEN) and inner.endswith(TRIPLES_CLOSE)):
        return []
    matches = [_LINE.match(line) for line in inner[len(TRIPLES_OPEN) : -len(TRIPLES_CLOSE)].strip().split("\n")]
    pairs = [(m.group(1), m.group(2)) for m in matches if m]
    starts = Counter(start for start, _ in pairs)
    return [(start, rest) for start, rest in pairs if starts[start] == 1]


def lookup_drills(record: WarmupRecord, rng: random.Random, limit: int, min_probes: int = 2) -> list[WarmupRecord]:
    """Up to `limit` drill records of `record`, each at a different tool block with >= `min_probes` probes."""
    blocks = [
        (index, probes)
        for index, segment in enumerate(record.segments)
        if not segment.train and len(probes := block_probes(segment.text)) >= min_probes
    ]
    drills = []
    for index, probes in sorted(rng.sample(blocks, min(limit, len(blocks)))):
        context = tuple(Segment(s.text, False) for s in record.segments[: index + 1])
        order = list(probes)
        rng.shuffle(order)
        asked: list[Segment] = []
        for number, (start, rest) in enumerate(order):
            asked += [Segment((PROBE_SEPARATOR if number else "") + start, False), Segment(rest, True)]
        drills.append(
            WarmupRecord(
                **{
                    **record.__dict__,
                    "id": f"{record.id}#drill{index}",
                    "segments": context + tuple(asked),
                    "kind": "drill",
                }
            )
        )
    return drills
