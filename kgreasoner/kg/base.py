"""The `KnowledgeGraph` interface shared by every backend.

Entities and relations are strings in the id vocabulary of `kgreasoner.records.ids`: literals in their
N-Triples form, `^rel` for a relation walked backwards.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Sequence
from typing import Literal

from kgreasoner.records.edges import Edge
from kgreasoner.records.ids import INVERSE_PREFIX

Direction = Literal["out", "in", "both"]
DIRECTIONS: tuple[str, ...] = ("out", "in", "both")


class KGError(RuntimeError):
    """A knowledge-graph backend failed in a way the caller should report (not a bad entity)."""


class KGQueryRejected(KGError):
    """The backend refused one query for what it holds (an endpoint's 4xx), not an outage: retrying won't help."""


def check_direction(direction: str) -> None:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")


def check_limit(limit: int | None, name: str = "limit") -> int | None:
    """`neighbors`' limit as every backend takes it: None or an int >= 0. A bool is refused though
    Python counts it an int: `limit=True` is a slip, not a cap of one edge."""
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ValueError(f"{name}: expected a non-negative int or None, got {limit!r}")
    return limit


class KnowledgeGraph(abc.ABC):
    """Read access to a knowledge graph, the only thing the tool, baselines and data code use."""

    per_question: bool = False
    """True where every question searches its own graph (`for_example`), as in the `subgraph` backend."""

    @abc.abstractmethod
    def neighbors(
        self,
        entity: str,
        direction: Direction = "out",
        relations: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Edge]:
        """Edges at `entity`: outgoing, incoming or both (outgoing first).

        `relations` keeps only edges whose relation is in it; `limit` caps the number returned
        (per call, after filtering). An unknown entity has no neighbours.
        """

    @abc.abstractmethod
    def label(self, entity: str) -> str:
        """A human-readable name; the id itself for unnamed nodes, the value for literals."""

    @abc.abstractmethod
    def resolve(self, name: str) -> list[str]:
        """Entity ids whose label matches `name`: exact matches first, then normalised ones."""

    @abc.abstractmethod
    def degree(self, entity: str, direction: Direction = "both") -> int:
        """Number of edges at `entity` in `direction`."""

    def is_unnamed(self, entity: str) -> bool:
        """True for mediator (CVT-like) nodes that have no label of their own."""
        return False

    def labels(self, entities: Sequence[str]) -> dict[str, str]:
        """`label` of each entity; a remote backend fetches many in one request."""
        return {entity: self.label(entity) for entity in entities}

    def expresses(self, entity: str) -> bool:
        """False for an id this backend cannot write as a node (an empty one, or one a query cannot name: a
        blank node, a malformed literal, a lone surrogate). Such an id names no node, as an id missing from
        the graph names none, and every store answers for it alike: no edges, degree 0, no relations, not
        unnamed, its own text (a literal's value) as its label."""
        return bool(entity)

    def relations(self, entity: str, direction: Direction = "out") -> list[str]:
        """Distinct relations at `entity`, in first-seen order."""
        seen: dict[str, None] = {}
        for edge in self.neighbors(entity, direction):
            seen.setdefault(edge.relation, None)
        return list(seen)

    def relation_counts(self, entity: str, direction: Direction = "both") -> list[tuple[str, str, int]]:
        """(relation, "out" or "in", edges) for each relation at `entity`: outgoing first, each side in
        the order of the relation's first edge. Counted here from every edge; the memory store reads
        them from its relation index instead."""
        counts: dict[tuple[str, str], int] = {}
        for edge in self.neighbors(entity, direction):
            key = (edge.relation, edge.direction)
            counts[key] = counts.get(key, 0) + 1
        return [(relation, side, n) for (relation, side), n in counts.items()]

    def for_example(self, example_id: str | None) -> KnowledgeGraph:
        """The graph that one question searches: this whole graph, except in per-question
        backends (`subgraph`), which return the question's own view."""
        return self

    def check(self, timeout: float) -> None:  # noqa: B027 (optional: a store in this process is always up)
        """Raise `KGError` when the graph cannot answer a query now, within `timeout` seconds (a remote
        endpoint that is down or refusing); the default, a store in this process, always can."""

    def close(self) -> None:  # noqa: B027 (optional: a store without files or connections keeps it)
        """Release files or connections; the default has none."""

    def __enter__(self) -> KnowledgeGraph:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def follow(kg: KnowledgeGraph, entities: Iterable[str], relation: str) -> set[str]:
    """All nodes one `relation` step from `entities` (`^rel` walks backwards)."""
    if relation.startswith(INVERSE_PREFIX):
        rel, direction = relation[len(INVERSE_PREFIX) :], "in"
    else:
        rel, direction = relation, "out"
    found: set[str] = set()
    for entity in entities:
        for edge in kg.neighbors(entity, direction, relations=[rel]):  # type: ignore[arg-type]
            found.add(edge.neighbor)
    return found


def execute_path(kg: KnowledgeGraph, start: str, path: Sequence[str]) -> set[str]:
    """The set of nodes reached from `start` by following `path` relation by relation."""
    frontier = {start}
    for relation in path:
        frontier = follow(kg, frontier, relation)
        if not frontier:
            break
    return frontier
