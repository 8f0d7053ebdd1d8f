"""`Edge`, one triple as a graph returns it: what every store yields, the search tool shows and its results carry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kgreasoner.records.ids import INVERSE_PREFIX


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
