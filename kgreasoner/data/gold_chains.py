"""Entity chains of a question's gold paths, and how far a rollout's searches went along them.

The `path` search reward (`kgreasoner.rewards`) pays for progress along the gold path, hop by hop.
A gold path `r1 ... rh` walked from a topic entity gives the levels L0 = {topic}, L1 = the entities
one `r1` step from it, ..., L(h-1); the last level Lh is the question's answers. A rollout's
successful searches, in order, each centred on one entity, reach:

- level k < h when it searched an entity of L(k-1) after it had reached level k-1 (L0 needs nothing:
  the topic is given). Searches out of order (an L2 entity before level 2) and off the path move
  nothing. A level made only of unnamed mediators (CVT-like nodes, which the tool shows through
  rather than lets the model search) is reached with the level before it.
- level h when an answer entity was shown in one of its tool blocks, by any search. A shortcut (a
  relation from the topic straight to the answer, or an entity off the path) thus scores the full
  path: the answer is what the path was for, the answer reward judges what the rollout made of it,
  and a gold path is only the shortest few relations the data names, not the only right way.

The score is the deepest level reached divided by h: the best of the alternative gold paths, and
for an `intersect` question (one walk per topic entity) the mean over the topic entities.

Chains are derived once per question (`GoldChains`) by walking the KG from the topic entity, the
first one unless the question is `intersect` (as path search and the oracle walk paths). A level
holds at most `max_level` entities (the first ones met, the frontier in the order it was found and
each entity's edges in the KG's order): a hub can't blow the walk up, at the cost that a rollout
searching an entity beyond the cap is not paid for that level, nor for the levels behind it unless
it is shown an answer. The answers are the question's answer ids plus the entities of the last
walked level whose label matches an answer's name or alias (name-only answers).

A chain is JSON (`{"levels": [[id, ...], ...], "answers": [id, ...], "mediators": [bool, ...]}`), and
a question's chains a JSON list of groups (one per walk start), each a list of alternative chains:
the form the GRPO dataset carries in its `gold_chains` column.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypedDict

from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.records.ids import INVERSE_PREFIX
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import QAExample

MAX_LEVEL = 200
"""Entities kept per level (as path search's `max_branch`)."""


class GoldChains:
    """`chains(example)`: the example's chains as a JSON string, walked once per example id."""

    def __init__(self, kg: KnowledgeGraph, max_level: int = MAX_LEVEL) -> None:
        if max_level < 1:
            raise ValueError(f"max_level must be >= 1, got {max_level}")
        self.kg = kg
        self.max_level = max_level
        self._cache: dict[str, str] = {}

    def __call__(self, example: QAExample) -> str:
        if example.id not in self._cache:
            self._cache[example.id] = json.dumps(gold_chains(self.kg, example, self.max_level))
        return self._cache[example.id]


def gold_chains(kg: KnowledgeGraph, example: QAExample, max_level: int = MAX_LEVEL) -> list[list[dict[str, Any]]]:
    """One group per walk start (the first topic entity, or each topic entity of an `intersect` question),
    each the chains of its alternative gold paths; `[]` when the example has no gold path."""
    if not example.gold_paths:
        return []
    if example.intersect:
        starts = [(topic.id, [path]) for topic, path in zip(example.topic_entities, example.gold_paths)]
    else:
        starts = [(example.topic_entities[0].id, list(example.gold_paths))]
    kg = kg.for_example(example.id)
    ids = [answer.id for answer in example.answers if answer.id]
    forms = {normalize_answer(form) for answer in example.answers for form in answer.surface_forms()}
    return [[_chain(kg, topic, path, ids, forms, max_level) for path in paths] for topic, paths in starts]


def _chain(
    kg: KnowledgeGraph, topic: str, path: Sequence[str], answer_ids: list[str], forms: set[str], max_level: int
) -> dict[str, Any]:
    levels = [[topic]]
    for relation in path:
        levels.append(_step(kg, levels[-1], relation, max_level))
    last = levels.pop()
    labels = kg.labels(last)
    named = [entity for entity in last if normalize_answer(labels.get(entity, entity)) in forms]
    answers = list(dict.fromkeys(answer_ids + named))
    mediators = [bool(level) and all(kg.is_unnamed(e) for e in level) for level in levels]
    return {"levels": levels, "answers": answers, "mediators": mediators}


def _step(kg: KnowledgeGraph, frontier: list[str], relation: str, max_level: int) -> list[str]:
    """The entities one `relation` step from `frontier` (`^rel` backwards), the first `max_level` met."""
    if relation.startswith(INVERSE_PREFIX):
        name, direction = relation[len(INVERSE_PREFIX) :], "in"
    else:
        name, direction = relation, "out"
    found: dict[str, None] = {}
    for entity in frontier:
        for edge in kg.neighbors(entity, direction, relations=[name], limit=max_level):  # type: ignore[arg-type]
            found.setdefault(edge.neighbor, None)
            if len(found) >= max_level:
                return list(found)
    return list(found)


@dataclass(frozen=True)
class _Chain:
    levels: tuple[frozenset[str], ...]
    answers: frozenset[str]
    mediators: tuple[bool, ...]

    @property
    def hops(self) -> int:
        return len(self.levels)


@lru_cache(maxsize=4096)
def _parse(chains: str) -> tuple[tuple[_Chain, ...], ...]:
    # A question's rollouts (a whole group) share one string: decoded once.
    groups = json.loads(chains) if chains else []
    return tuple(
        tuple(
            _Chain(
                tuple(frozenset(level) for level in chain["levels"]),
                frozenset(chain["answers"]),
                tuple(chain["mediators"]),
            )
            for chain in group
        )
        for group in groups
        if group
    )


class SearchStep(TypedDict):
    """One successful search of a rollout (`rollout.types.Trajectory.search_record`)."""

    entity: str | None
    """The id of the entity searched."""
    shown: list[str]
    """Ids of the entities the call's tool block showed."""


def chain_progress(chains: str, searches: Sequence[SearchStep]) -> float | None:
    """The rollout's progress along the chains, in [0, 1]; None when there are none (no gold path).

    `chains` is `GoldChains`'s JSON; `searches` the rollout's successful searches in order, each
    `{"entity": id searched, "shown": [ids in its tool block]}` (`Trajectory.search_record`).
    """
    groups = _parse(chains)
    if not groups:
        return None
    return sum(max(_progress(chain, searches) for chain in group) for group in groups) / len(groups)


def _progress(chain: _Chain, searches: Sequence[SearchStep]) -> float:
    if any(entity in chain.answers for search in searches for entity in search["shown"]):
        return 1.0
    deepest = 0
    for search in searches:
        if deepest < chain.hops - 1 and search["entity"] in chain.levels[deepest]:
            deepest += 1
            while deepest < chain.hops - 1 and chain.mediators[deepest]:
                deepest += 1
    return deepest / chain.hops
