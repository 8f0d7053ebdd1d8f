"""Questions checked against their KB before the data stage writes them: what parses but cannot work.

Refused (a `SchemaError` naming the questions file, line and field):
- a topic entity that is not a node of the KB: no search could start there;
- an `intersect` question whose gold walks reach no node in common: its answers cannot be what
  the paths say.

Counted as a warning (legal, but suspicious), an error with `strict`:
- an answer whose id is not a node of the KB (a name-only answer, or a typo): the question can
  still be scored by name, but no walk reaches it;
- a gold path that reaches no answer (by id, or by a label that is one of the answer's names) from
  any topic entity (an intersect question: where its walks meet): the path, which the warm-up
  teaches and the path reward scores, ends at something else.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kgreasoner.kg.base import KnowledgeGraph, execute_path
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import QAExample, SchemaError, iter_json_lines

if TYPE_CHECKING:
    from kgreasoner.data.datasets import Dataset
    from kgreasoner.kg.memory import MemoryKG


@dataclass
class QuestionWarnings:
    """Counts of legal but suspicious cases, and where the first of each is."""

    answers_not_in_kb: int = 0
    gold_paths_missing_answers: int = 0
    first: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        return {
            "answers_not_in_kb": self.answers_not_in_kb,
            "gold_paths_missing_answers": self.gold_paths_missing_answers,
        }

    def add(self, kind: str, message: str, strict: bool) -> None:
        if strict:
            raise SchemaError(message + " (--strict)")
        setattr(self, kind, getattr(self, kind) + 1)
        self.first.setdefault(kind, message)


def check_questions(dataset: Dataset, kg: MemoryKG, strict: bool = False) -> QuestionWarnings:
    """Refuse what cannot work and count what is suspicious (see the module docstring) in the dataset's KB file."""
    where = _Locator(dataset)
    warnings = QuestionWarnings()
    for example in dataset.examples:
        for i, topic in enumerate(example.topic_entities):
            if topic.id not in kg:
                raise SchemaError(
                    f"{where(example)}: field 'topic_entities[{i}].id': {topic.id!r} is not a node of "
                    f"{dataset.kb_path}; no search could start there"
                )
        if example.intersect and example.gold_paths:
            _check_walks_meet(example, kg, where)
        for i, answer in enumerate(example.answers):
            if answer.id not in kg:
                message = (
                    f"{where(example)}: field 'answers[{i}].id': {answer.id!r} is not a node of {dataset.kb_path}"
                )
                warnings.add("answers_not_in_kb", message, strict)
        missing = _path_missing_answers(example, kg)
        if missing is not None:
            warnings.add("gold_paths_missing_answers", f"{where(example)}: {missing}", strict)
    return warnings


def _path_missing_answers(example: QAExample, kg: KnowledgeGraph) -> str | None:
    """What is wrong with the example's first gold path that reaches no answer, else None."""
    if not example.answers:
        return None
    ids = {answer.id for answer in example.answers}
    names = {normalize_answer(form) for answer in example.answers for form in answer.surface_forms()}

    def answers_in(nodes: set[str]) -> bool:
        return bool(nodes & ids) or any(normalize_answer(kg.label(node)) in names for node in nodes)

    if example.intersect:
        walks = [execute_path(kg, t.id, p) for t, p in zip(example.topic_entities, example.gold_paths)]
        met = set.intersection(*walks) if walks else set()
        if walks and not answers_in(met):
            return (
                f"field 'gold_paths': the walks meet at {_some(kg, met)}, none of them an answer ({_answers(example)})"
            )
        return None
    for i, path in enumerate(example.gold_paths):
        reached = set().union(*(execute_path(kg, topic.id, path) for topic in example.topic_entities))
        if not answers_in(reached):
            return (
                f"field 'gold_paths[{i}]': {' / '.join(path)} from {', '.join(t.id for t in example.topic_entities)} "
                f"reaches {_some(kg, reached)}, none of them an answer ({_answers(example)})"
            )
    return None


def _some(kg: KnowledgeGraph, nodes: set[str], shown: int = 3) -> str:
    """`n node(s): label, label, ...` of a few of `nodes`, sorted for a stable message."""
    labels = sorted(kg.label(node) for node in nodes)
    more = f", ... ({len(labels) - shown} more)" if len(labels) > shown else ""
    return f"{len(labels)} node(s)" + (f": {', '.join(map(repr, labels[:shown]))}{more}" if labels else "")


def _answers(example: QAExample) -> str:
    return ", ".join(repr(answer.name) for answer in example.answers)


def _check_walks_meet(example: QAExample, kg: KnowledgeGraph, where: _Locator) -> None:
    reached = [execute_path(kg, topic.id, path) for topic, path in zip(example.topic_entities, example.gold_paths)]
    if not set.intersection(*reached):
        walks = "; ".join(
            f"{topic.id} -> {' / '.join(path)}: {len(nodes)} node(s)"
            for topic, path, nodes in zip(example.topic_entities, example.gold_paths, reached)
        )
        raise SchemaError(
            f"{where(example)}: field 'gold_paths': the walks of this intersect question never meet "
            f"({walks}); an intersect question's answers are the nodes every walk reaches"
        )


class _Locator:
    """`questions.jsonl:LINE` of an example (its id's line, read once when first asked), else its id."""

    def __init__(self, dataset: Dataset) -> None:
        self.path: Path | None = dataset.questions_path
        self.name = dataset.name
        self._lines: dict[str, str] | None = None

    def __call__(self, example: QAExample) -> str:
        if self.path is None:
            return f"dataset {self.name!r}: example {example.id}"
        if self._lines is None:
            self._lines = {}
            for place, data in iter_json_lines(self.path):
                if isinstance(data, dict) and "id" in data:
                    self._lines.setdefault(str(data["id"]), place)
        return self._lines.get(example.id, f"{self.path}: example {example.id}")
