"""Question augmentations for warm-up records: paraphrase mixing and name dropout.

Both rewrite a training question before its trajectory is made, so the tool, the thinking and the
answer stay those of the real entities; dev and test questions are never touched.

- Paraphrase mixing: the question is reworded with the wording of a question of the same relation
  path about another topic entity (`what is the nation of {topic} 's couple ?`), so each wording
  is seen with more topic entities than the dataset pairs it with.
- Name dropout (experimental: a study of what tiny models tie a relation path to; no shipped
  recipe turns it on): the topic entity's name is replaced, in the question and in the topic
  entity the prompt and the tool print, by the name of another topic entity of the split. The
  entity itself (its id, so its triples) is unchanged: a model cannot tie a relation path to a name
  it read, only to the words that ask for the path.

A question whose topic name does not occur in it exactly once is left as it is (and counted).
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from kgreasoner.records.schema import QAExample, TopicEntity

TOPIC_SLOT = "{topic}"


@dataclass
class AugmentConfig:
    """Shares of training questions rewritten before their warm-up trajectory is made."""

    paraphrase_mixing: float = field(
        default=0.0,
        metadata={
            "help": (
                "share of training questions reworded with the wording of another question of the same relation "
                "path (another topic entity)"
            )
        },
    )
    name_dropout: float = field(
        default=0.0,
        metadata={
            "help": "[experimental] share of training questions whose topic entity is renamed (question, prompt and "
            "tool blocks) to another topic entity's name; its triples stay its own"
        },
    )

    def __post_init__(self) -> None:
        for name in ("paraphrase_mixing", "name_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise ValueError(f"augment.{name} must be in [0, 1], got {value}")

    @property
    def enabled(self) -> bool:
        return self.paraphrase_mixing > 0 or self.name_dropout > 0


def _topic_name(example: QAExample) -> str:
    topic = example.topic_entities[0]
    return topic.name or topic.id


def _wording(example: QAExample) -> str | None:
    """The question with its topic name as a slot, or None unless the name occurs exactly once."""
    name = _topic_name(example)
    return example.question.replace(name, TOPIC_SLOT) if example.question.count(name) == 1 else None


class QuestionAugmenter:
    """Rewrites training questions by `AugmentConfig`, seeded per question; `stats` counts what it did."""

    def __init__(self, examples: Sequence[QAExample], config: AugmentConfig, seed: int) -> None:
        self.config = config
        self.seed = seed
        self.stats: Counter[str] = Counter()
        self.wordings: dict[tuple[str, ...], list[tuple[str, str]]] = defaultdict(list)  # path -> (topic id, wording)
        for example in examples:
            wording = _wording(example)
            if example.gold_paths and wording is not None:
                self.wordings[example.gold_paths[0]].append((example.topic_entities[0].id, wording))
        self.names = sorted({_topic_name(e) for e in examples})

    def __call__(self, example: QAExample) -> QAExample:
        if example.split != "train" or not self.config.enabled:
            return example
        if _wording(example) is None:
            self.stats["augment_skipped:topic_name_not_once"] += 1
            return example
        rng = random.Random(f"{self.seed}|{example.id}|augment")
        question = example.question
        name = _topic_name(example)
        if example.gold_paths and rng.random() < self.config.paraphrase_mixing:
            topic = example.topic_entities[0].id
            others = sorted(
                {w for t, w in self.wordings.get(example.gold_paths[0], []) if t != topic} - {_wording(example)}
            )
            if others:
                question = rng.choice(others).replace(TOPIC_SLOT, name)
                self.stats["paraphrase_mixed"] += 1
        topics = example.topic_entities
        if rng.random() < self.config.name_dropout:
            candidates = [n for n in self.names if n != name and n not in question]
            if candidates:
                new = rng.choice(candidates)
                question = question.replace(name, new)
                topics = (TopicEntity(topics[0].id, new), *topics[1:])
                self.stats["name_dropped"] += 1
        if question == example.question and topics == example.topic_entities:
            return example
        return dataclasses.replace(example, question=question, topic_entities=topics)
