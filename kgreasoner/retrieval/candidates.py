"""What a search offers: candidate neighbours of an entity, mediator nodes expanded through.

A candidate is one edge from the searched entity to a neighbour, or, when that neighbour is an
unnamed mediator (CVT-like) node, two edges: searched entity -> mediator -> a named node beyond.
The tool ranks and shows candidates; the ranker labels and scores them; both use these texts.
`RankedCandidates` holds a ranking whose tail (relation groups nobody scored, at a hub ranked
relation first) is built group by group only as far as it is read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.records.edges import Edge
from kgreasoner.retrieval.encoder import humanize_label, humanize_relation


@dataclass(frozen=True)
class Candidate:
    """One or two edges leading away from the searched entity (two when through a mediator)."""

    edges: tuple[Edge, ...]

    @property
    def target(self) -> str:
        """The node the candidate leads to (beyond the mediator, if any)."""
        return self.edges[-1].neighbor

    @property
    def target_label(self) -> str:
        return self.edges[-1].neighbor_label

    @property
    def path_relations(self) -> tuple[str, ...]:
        """Relations as a gold path writes them (`^rel` for an edge walked backwards)."""
        return tuple(edge.path_relation for edge in self.edges)

    @property
    def key(self) -> tuple[tuple[str, str], ...]:
        """(path relation, node reached) per step: identifies the candidate within one search."""
        return tuple((edge.path_relation, edge.neighbor) for edge in self.edges)

    def relation_text(self) -> str:
        return " ".join(relation_phrase(edge) for edge in self.edges)

    def text(self) -> str:
        """`relation + entity` text: what the embedding baseline compares to the question."""
        return f"{self.relation_text()} {humanize_label(self.target_label)}"


def relation_phrase(edge: Edge) -> str:
    """The relation as words, read from the queried side (`nationality`, or `nationality of` backwards)."""
    return relation_words(edge.relation, edge.direction)


def relation_words(relation: str, direction: str) -> str:
    """`relation_phrase` of any edge by `relation` in `direction` ("out" or "in")."""
    words = humanize_relation(relation)
    return words if direction == "out" else f"{words} of"


def edge_text(edge: Edge) -> str:
    """An edge as seen from its queried end: relation words and the neighbour's label."""
    return f"{relation_phrase(edge)} {humanize_label(edge.neighbor_label)}"


def gather_candidates(
    kg: KnowledgeGraph, entity: str, expand_mediators: bool = True, limit: int | None = None
) -> list[Candidate]:
    """Candidates of `entity` in KG order (outgoing edges first), each once.

    A mediator neighbour is replaced by one candidate per edge beyond it (the edge back to
    `entity` excluded); a mediator with nothing beyond stays a one-edge candidate. `limit` caps
    the edges fetched per node, which bounds the work at hubs.
    """
    seen: set[tuple[tuple[str, str], ...]] = set()
    candidates: list[Candidate] = []

    def add(candidate: Candidate) -> None:
        key = candidate.key  # built from every edge: once per candidate, not twice
        if key not in seen:
            seen.add(key)
            candidates.append(candidate)

    for edge in kg.neighbors(entity, "both", limit=limit):
        for candidate in expand(kg, edge, expand_mediators, limit):
            add(candidate)
    return candidates


def expand(kg: KnowledgeGraph, edge: Edge, expand_mediators: bool = True, limit: int | None = None) -> list[Candidate]:
    """The candidates of one edge at the searched entity: one per edge beyond a mediator neighbour
    (the edge back excluded), else the edge alone."""
    if expand_mediators and edge.neighbor_unnamed and not edge.neighbor_is_literal:
        beyond = [
            Candidate((edge, e)) for e in kg.neighbors(edge.neighbor, "both", limit=limit) if e.key() != edge.key()
        ]
        if beyond:
            return beyond
    return [Candidate((edge,))]


def group_candidates(
    kg: KnowledgeGraph,
    entity: str,
    relation: str,
    direction: str,
    start: int,
    stop: int,
    expand_mediators: bool = True,
    limit: int | None = None,
) -> list[Candidate]:
    """The candidates of edges start:stop of `entity`'s edges by `relation` in `direction`, in KG order."""
    edges = kg.neighbors(entity, direction, relations=[relation], limit=stop)[start:]  # type: ignore[arg-type]
    return [candidate for edge in edges for candidate in expand(kg, edge, expand_mediators, limit)]


@dataclass(frozen=True)
class PendingGroup:
    """Edges start:count of one relation in one direction at the searched entity, not built yet."""

    relation: str
    direction: str
    start: int
    count: int


class RankedCandidates(Sequence[Candidate]):
    """Candidates best first: `ranked`, then each pending group's candidates in KG order, a group
    built (by `build`) only when reading reaches it.

    `has(i)`, indexing, `after(i)` and iteration build no further than they read; `len()` builds
    every group (it is exact). A candidate met twice keeps its first place.
    """

    def __init__(
        self,
        ranked: Sequence[Candidate],
        pending: Sequence[PendingGroup] = (),
        build: Callable[[PendingGroup], list[Candidate]] | None = None,
    ) -> None:
        if pending and build is None:
            raise ValueError("pending groups need a build function")
        self._pending = list(pending)
        self._build = build
        if pending:
            self._items: list[Candidate] = []
            self._keys: set[tuple[tuple[str, str], ...]] = set()
            self._append(ranked)
        else:  # nothing will be appended: no keys to keep (the ranked candidates are distinct already)
            self._items = list(ranked)

    def _append(self, candidates: Sequence[Candidate]) -> None:
        for candidate in candidates:
            key = candidate.key
            if key not in self._keys:
                self._keys.add(key)
                self._items.append(candidate)

    def _grow(self) -> bool:
        """Build the next pending group; False when none is left."""
        if not self._pending:
            return False
        assert self._build is not None
        self._append(self._build(self._pending.pop(0)))
        return True

    def build_relations(self, relations: set[str]) -> None:
        """Build now every pending group by one of `relations`, whatever groups come before it: a search
        filtered by a relation reads that relation's candidates and no other's (they follow the candidates
        built so far, ahead of the groups still pending)."""
        wanted = [group for group in self._pending if group.relation in relations]
        if not wanted:
            return
        assert self._build is not None
        self._pending = [group for group in self._pending if group.relation not in relations]
        for group in wanted:
            self._append(self._build(group))

    def has(self, index: int) -> bool:
        """True when there is a candidate at `index` (>= 0), building groups only up to it."""
        while len(self._items) <= index and self._grow():
            pass
        return index < len(self._items)

    def after(self, index: int) -> Iterator[Candidate]:
        """The candidates from `index` on, built as the iteration reaches them."""
        while self.has(index):
            yield self._items[index]
            index += 1

    def __iter__(self) -> Iterator[Candidate]:
        return self.after(0)

    @overload
    def __getitem__(self, index: int) -> Candidate: ...

    @overload
    def __getitem__(self, index: slice) -> list[Candidate]: ...

    def __getitem__(self, index: int | slice) -> Candidate | list[Candidate]:
        if isinstance(index, slice) or index < 0:
            while self._grow():
                pass
            return self._items[index]
        if not self.has(index):
            raise IndexError(index)
        return self._items[index]

    def __len__(self) -> int:
        while self._grow():
            pass
        return len(self._items)

    def __bool__(self) -> bool:
        return self.has(0)

    def pending_counts(self) -> list[tuple[str, str, int]]:
        """(relation, direction, edges) of the groups not built yet, in ranked order."""
        return [(g.relation, g.direction, g.count - g.start) for g in self._pending]

    @property
    def built(self) -> list[Candidate]:
        """The candidates built so far, in ranked order."""
        return self._items


def candidate_context(kg: KnowledgeGraph, candidate: Candidate, max_context: int) -> list[Edge]:
    """The candidate target's own one-hop edges (at most `max_context`), minus the edge it came by."""
    if max_context <= 0:
        return []
    # One extra edge so that dropping the edge back still leaves max_context of them.
    return context_from(kg.neighbors(candidate.target, "both", limit=max_context + 1), candidate, max_context)


def context_from(edges: Sequence[Edge], candidate: Candidate, max_context: int) -> list[Edge]:
    """`candidate_context` out of the target's first `max_context + 1` edges, fetched beforehand."""
    came_by = candidate.edges[-1].key()
    return [e for e in edges if e.key() != came_by][:max_context]
