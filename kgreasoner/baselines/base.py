"""What every evaluated method shares: its result type, the `Method` interface, KG query counting,
and the parsing of answers written as `{A | B}` or as JSON.
"""

from __future__ import annotations

import abc
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kgreasoner.kg.base import Direction, KnowledgeGraph
from kgreasoner.llm.clients import MeteredLLM
from kgreasoner.protocol import split_answers
from kgreasoner.records.edges import Edge
from kgreasoner.records.schema import QAExample


@dataclass
class MethodResult:
    """One question's outcome, before scoring.

    `format_valid`: the method's final output followed its answer format (braces, JSON, the
    `<think>`/`<answer>` protocol). `usage` is set only by methods that generate without an
    `LLMClient` (the kgreasoner rollout); otherwise the harness counts the client's calls.
    """

    answers: list[str]
    format_valid: bool
    trace: Any = None
    kg_queries: int = 0
    error: str | None = None
    usage: dict[str, int] | None = None


class Method(abc.ABC):
    """A QA method: `answer(example, llm)` for one question, safe to call from several threads.

    Methods with `batched = True` answer whole batches at once (`answer_batch`), because their
    backend batches better than threads do.
    """

    name: str = "method"
    batched: bool = False
    uses_llm: bool = True
    kg: KnowledgeGraph | None = None
    """The KG the method searches, which the harness's failure classes read (None: none they can use)."""

    @abc.abstractmethod
    def answer(self, example: QAExample, llm: MeteredLLM | None) -> MethodResult:
        """Answer one question; `llm` is a per-question metered client (None when `uses_llm` is False)."""

    def client(self, llm: MeteredLLM | None) -> MeteredLLM:
        """`llm`, which the harness always gives a method with `uses_llm`; None is a caller's mistake, said so."""
        if llm is None:
            raise ValueError(f"method {self.name!r} needs an LLM client, got None")
        return llm

    def answer_batch(self, examples: Sequence[QAExample]) -> list[MethodResult]:
        raise NotImplementedError(f"{self.name} does not answer in batches")


class CountingKG(KnowledgeGraph):
    """A view of a KG that counts the queries made through it (one per `neighbors`, `relations`,
    `resolve` or `degree` call: what would be one SPARQL request). Labels are not counted: the
    backends fetch them with the edges."""

    def __init__(self, inner: KnowledgeGraph) -> None:
        self.inner = inner
        self.queries = 0

    def neighbors(
        self,
        entity: str,
        direction: Direction = "out",
        relations: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Edge]:
        self.queries += 1
        return self.inner.neighbors(entity, direction, relations, limit)

    def relations(self, entity: str, direction: Direction = "out") -> list[str]:
        self.queries += 1
        return self.inner.relations(entity, direction)

    def resolve(self, name: str) -> list[str]:
        self.queries += 1
        return self.inner.resolve(name)

    def degree(self, entity: str, direction: Direction = "both") -> int:
        self.queries += 1
        return self.inner.degree(entity, direction)

    def label(self, entity: str) -> str:
        return self.inner.label(entity)

    def is_unnamed(self, entity: str) -> bool:
        return self.inner.is_unnamed(entity)


_BRACED_AFTER = r"{marker}\s*\{{([^{{}}]*)\}}"


def braced_answers(text: str, marker: str = "Answer:") -> list[str] | None:
    """Answers of the LAST `marker {A | B}` in `text` (case-insensitive); None when there is none."""
    pattern = re.compile(_BRACED_AFTER.format(marker=re.escape(marker)), re.IGNORECASE)
    matches = pattern.findall(text)
    if not matches:
        return None
    return split_answers(matches[-1])


def first_line_answer(text: str, marker: str = "Answer:") -> list[str]:
    """Lenient fallback: the text after the last `marker` (or the first non-empty line), split on `|`."""
    lower = text.lower()
    at = lower.rfind(marker.lower())
    rest = text[at + len(marker) :] if at >= 0 else text
    line = next((ln.strip() for ln in rest.splitlines() if ln.strip()), "")
    return split_answers(line.strip("{} ."))


def json_object(text: str) -> dict | None:
    """The first JSON object in `text` that parses (None when there is none)."""
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\{", text)):
        try:
            value, _ = decoder.raw_decode(text[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value
    return None


def json_list(text: str) -> list | None:
    """The first JSON list in `text` that parses (None when there is none)."""
    decoder = json.JSONDecoder()
    for start in (m.start() for m in re.finditer(r"\[", text)):
        try:
            value, _ = decoder.raw_decode(text[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(value, list):
            return value
    return None


def as_answer_list(value: Any) -> list[str]:
    """A JSON answer value as a list: `"A | B"` -> [A, B]; lists kept; other scalars as text."""
    if value is None:
        return []
    if isinstance(value, list):
        return [str(v).strip() for v in value if str(v).strip()]
    return split_answers(str(value))


@dataclass
class Step:
    """One LLM step of a pipeline, kept in the trace (prompt kind, reply, what was parsed)."""

    kind: str
    reply: str
    parsed: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "reply": self.reply, "parsed": self.parsed, **self.extra}
