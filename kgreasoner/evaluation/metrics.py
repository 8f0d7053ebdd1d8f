"""Answer metrics: Hits@1, and F1 / exact match over answer sets.

Every comparison goes through `kgreasoner.data.normalize_answer`. A gold answer counts as
matched by a prediction when the normalised prediction equals the normalised name, an alias or
the id of that answer (`Answer.surface_forms`).

Definitions (P = the distinct non-empty normalised predictions, G = the gold answers):
- Hits@1: 1 when the FIRST prediction matches some gold answer, else 0 (no prediction: 0).
- precision = |{p in P that match some gold answer}| / |P|;
  recall = |{g in G matched by some p in P}| / |G|; F1 = their harmonic mean (0 when P is empty).
- EM: 1 when precision = recall = 1, i.e. every prediction is a gold answer and every gold
  answer is predicted (aliases of one answer count once), else 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import Answer


@dataclass(frozen=True)
class AnswerScores:
    hits1: float
    precision: float
    recall: float
    f1: float
    em: float


def gold_form_sets(answers: Sequence[Answer]) -> list[set[str]]:
    """Per gold answer, its normalised surface forms (empty forms dropped)."""
    return [{f for f in (normalize_answer(s) for s in a.surface_forms()) if f} for a in answers]


def distinct_predictions(predictions: Sequence[str]) -> list[str]:
    """Normalised predictions, empty ones dropped, each once, in order."""
    seen: dict[str, None] = {}
    for prediction in predictions:
        norm = normalize_answer(prediction)
        if norm:
            seen.setdefault(norm, None)
    return list(seen)


def hits_at_1(predictions: Sequence[str], answers: Sequence[Answer]) -> float:
    """1.0 when the first prediction names a gold answer."""
    if not predictions:
        return 0.0
    first = normalize_answer(predictions[0])
    return float(bool(first) and any(first in forms for forms in gold_form_sets(answers)))


def score_answers(predictions: Sequence[str], answers: Sequence[Answer]) -> AnswerScores:
    """Hits@1, precision, recall, F1 and EM of one question (see the module docstring)."""
    gold = gold_form_sets(answers)
    predicted = distinct_predictions(predictions)
    hits1 = hits_at_1(predictions, answers)
    if not predicted or not gold:
        return AnswerScores(hits1, 0.0, 0.0, 0.0, 0.0)
    right = sum(any(p in forms for forms in gold) for p in predicted)
    found = sum(any(p in forms for p in predicted) for forms in gold)
    precision, recall = right / len(predicted), found / len(gold)
    f1 = 0.0 if right == 0 else 2 * precision * recall / (precision + recall)
    em = float(right == len(predicted) and found == len(gold))
    return AnswerScores(hits1, precision, recall, f1, em)
