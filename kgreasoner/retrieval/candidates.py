"""What a search offers: candidate neighbours of an entity, mediator nodes expanded through.

A candidate is one edge from the searched entity to a neighbour, or, when that neighbour is an
unnamed mediator (CVT-like) node, two edges: searched entity -> mediator -> a named node beyond.
The tool ranks and shows candidates; the ranker labels and scores them; both use these texts.
"""

from __future__ import annotations

from dataclasses import dataclass

from kgreasoner.kg.base import Edge, KnowledgeGraph
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
    words = humanize_relation(edge.relation)
    return words if edge.direction == "out" else f"{words} of"


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
        if expand_mediators and edge.neighbor_unnamed and not edge.neighbor_is_literal:
            beyond = [e for e in kg.neighbors(edge.neighbor, "both", limit=limit) if e.key() != edge.key()]
            for second in beyond:
                add(Candidate((edge, second)))
            if beyond:
                continue
        add(Candidate((edge,)))
    return candidates


def candidate_context(kg: KnowledgeGraph, candidate: Candidate, max_context: int) -> list[Edge]:
    """The candidate target's own one-hop edges (at most `max_context`), minus the edge it came by."""
    if max_context <= 0:
        return []
    came_by = candidate.edges[-1].key()
    # One extra edge so that dropping the edge back still leaves max_context of them.
    edges = kg.neighbors(candidate.target, "both", limit=max_context + 1)
    return [e for e in edges if e.key() != came_by][:max_context]
