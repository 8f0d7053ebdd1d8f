"""The `KnowledgeGraph` interface shared by every backend.

Entities are strings. What the string is depends on the backend: a name (PathQuestion TSV),
a Freebase mid (`m.07srw`), a Wikidata id (`Q30`), or a literal. Literals use the N-Triples
lexical form (`"1987-03-02"^^<http://www.w3.org/2001/XMLSchema#date>`, `"42"`, `"Utah"@en`)
so that one string identifies one node in every backend.

Relations in a path may carry a leading `^` to mean "follow the edge backwards" (as in SPARQL
property paths): `^people.person.nationality` goes from a country to its nationals.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

Direction = Literal["out", "in", "both"]
DIRECTIONS: tuple[str, ...] = ("out", "in", "both")
INVERSE_PREFIX = "^"


def is_literal_id(entity: str) -> bool:
    """True when `entity` is written as an N-Triples literal (it starts with a double quote)."""
    return entity.startswith('"')


def literal_value(entity: str) -> str:
    """The lexical form of an N-Triples literal (`"42"^^<...#int>` -> `42`), its escapes read (`\\n`, `\\t`,
    `\\u001B`: pyoxigraph writes control characters so); other ids unchanged."""
    if not is_literal_id(entity):
        return entity
    end = entity.rfind('"')
    if end <= 0:
        return entity[1:]
    body = entity[1:end]
    if "\\" not in body:
        return body
    return _NT_ESCAPE.sub(_unescape, body)


_NT_ESCAPE = re.compile(r"\\(?:u([0-9A-Fa-f]{4})|U([0-9A-Fa-f]{8})|([tbnrf\"'\\]))")
"""N-Triples' escapes in a literal: UCHAR (`\\uXXXX`, `\\UXXXXXXXX`) and ECHAR (`\\t`, `\\n`, `\\"`, ...)."""
_ECHAR = {"t": "\t", "b": "\b", "n": "\n", "r": "\r", "f": "\f", '"': '"', "'": "'", "\\": "\\"}


def _unescape(match: re.Match[str]) -> str:
    code = match.group(1) or match.group(2)
    if code is None:
        return _ECHAR[match.group(3)]
    value = int(code, 16)
    return chr(value) if value <= 0x10FFFF else match.group()


def make_literal(value: str, datatype: str | None = None, lang: str | None = None) -> str:
    """The N-Triples form of a literal value, the inverse of `literal_value`."""
    body = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    if datatype:
        return f'"{body}"^^<{datatype}>'
    if lang:
        return f'"{body}"@{lang}'
    return f'"{body}"'


@dataclass(frozen=True)
class Edge:
    """One triple seen from the entity that was queried.

    `direction` is "out" when the queried entity is the subject and "in" when it is the object;
    `neighbor` is the node at the other end either way.
    """

    subject: str
    relation: str
    object: str
    subject_label: str
    object_label: str
    direction: Literal["out", "in"]
    object_is_literal: bool = False
    subject_unnamed: bool = False
    object_unnamed: bool = False

    @property
    def neighbor(self) -> str:
        return self.object if self.direction == "out" else self.subject

    @property
    def neighbor_label(self) -> str:
        return self.object_label if self.direction == "out" else self.subject_label

    @property
    def neighbor_unnamed(self) -> bool:
        return self.object_unnamed if self.direction == "out" else self.subject_unnamed

    @property
    def neighbor_is_literal(self) -> bool:
        return self.object_is_literal if self.direction == "out" else False

    @property
    def path_relation(self) -> str:
        """The relation as written in a gold path: `^rel` when walked backwards."""
        return self.relation if self.direction == "out" else INVERSE_PREFIX + self.relation

    def key(self) -> tuple[str, str, str]:
        return (self.subject, self.relation, self.object)


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
