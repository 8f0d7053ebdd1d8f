"""Questions checked against their KB before the data stage writes them: what parses but cannot work.

Refused (a `SchemaError` naming the questions file, line and field):
- a topic entity that is not a node of the KB: no search could start there;
- an `intersect` question whose gold walks reach no node in common: its answers cannot be what
  the paths say.

Counted as a warning (legal, but suspicious), an error with `strict`:
- an answer whose id is not a node of the KB (a name-only answer, or a typo): the question can
  still be scored by name, but no walk reaches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kgreasoner.data.schema import QAExample, SchemaError, iter_json_lines
from kgreasoner.kg.base import KnowledgeGraph, execute_path

if TYPE_CHECKING:
    from kgreasoner.data.datasets import Dataset
    from kgreasoner.kg.memory import MemoryKG


@dataclass
class QuestionWarnings:
    """Counts of legal but suspicious cases, and where the first of each is."""

    answers_not_in_kb: int = 0
    first: dict[str, str] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        return {"answers_not_in_kb": self.answers_not_in_kb}


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
            if answer.id in kg:
                continue
            message = f"{where(example)}: field 'answers[{i}].id': {answer.id!r} is not a node of {dataset.kb_path}"
            if strict:
                raise SchemaError(message + " (--strict)")
            warnings.answers_not_in_kb += 1
            warnings.first.setdefault("answers_not_in_kb", message)
    return warnings


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
