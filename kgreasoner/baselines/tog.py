"""ToG (Think-on-Graph, Sun et al., ICLR 2024): LLM-guided beam search over the KG.

Per depth (up to D): for each beam entity, list its relations (outgoing and incoming) and let
the LLM keep at most W with scores (relation pruning); follow each kept relation to its
candidate entities and let the LLM score them (entity scoring; no call when one candidate is
left, as in ToG); keep the W best (entity, relation, tail) by relation score x entity score; add
them to the reasoning triplets; ask the LLM whether the triplets suffice (sufficiency check);
if yes, ask for the answer. When the beam empties or depth D is reached, the LLM answers with
the triplets gathered so far.

As in ToG's code: a chosen relation counts as outgoing when the entity has it as an outgoing
relation, else as incoming; more than `max_candidates` candidates are cut to a seeded random
sample of `retain_candidates`; unnamed (mediator) candidates are scored without the LLM only
when all candidates are unnamed, else they are dropped.

`mode`:
- `faithful`: ToG's public code writes the incoming-edge entity query with the entity in the
  predicate slot and the relation in the object slot (`?x <entity> <relation>`), so incoming
  relations can be chosen but never reach an entity. This mode runs that same query on our KG.
- `fixed`: the incoming query is `?x <relation> <entity>`, as intended.
Unlike ToG's code, literal values are kept as candidates (ToG keeps only `m.` ids).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from kgreasoner.baselines import tog_prompts as prompts
from kgreasoner.baselines.base import CountingKG, Method, MethodResult, Step
from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.llm.clients import MeteredLLM
from kgreasoner.records.schema import QAExample

TOG_MODES = ("faithful", "fixed")
UNNAMED = "unnamed node"


@dataclass
class ToGConfig:
    """Think-on-Graph settings (YAML section `tog` of the eval config)."""

    width: int = field(
        default=3, metadata={"help": "beam width W: relations kept per entity and entities kept per depth"}
    )
    depth: int = field(default=3, metadata={"help": "maximum search depth D"})
    mode: str = field(default="faithful", metadata={"help": "faithful (ToG's incoming-edge query bug) or fixed"})
    max_candidates: int = field(
        default=20, metadata={"help": "candidates per (entity, relation) before sampling kicks in"}
    )
    retain_candidates: int = field(
        default=5, metadata={"help": "size of the seeded random sample when there are too many"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the candidate sampling"})
    max_tokens: int | None = field(default=None, metadata={"help": "reply budget per LLM step (None: the client's)"})
    few_shot: bool = field(
        default=True,
        metadata={
            "help": "a worked example in the relation and entity prompts; false for a model fine-tuned on these "
            "prompts (same-backbone runs), which needs none, and must then be false in training and evaluation alike"
        },
    )

    def __post_init__(self) -> None:
        if self.mode not in TOG_MODES:
            raise ValueError(f"tog mode must be one of {TOG_MODES}, got {self.mode!r}")
        if self.width < 1 or self.depth < 1 or self.retain_candidates < 1 or self.max_candidates < 1:
            raise ValueError("tog width, depth, max_candidates and retain_candidates must be >= 1")


@dataclass(frozen=True)
class _Path:
    """One kept (entity, relation, tail) with its score and direction."""

    entity: str
    relation: str
    outgoing: bool
    tail: str
    score: float


class ToGMethod(Method):
    name = "tog"

    def __init__(self, kg: KnowledgeGraph, config: ToGConfig | None = None) -> None:
        self.kg: KnowledgeGraph = kg
        self.config = config or ToGConfig()

    def answer(self, example: QAExample, llm: MeteredLLM | None) -> MethodResult:
        client = self.client(llm)
        cfg = self.config
        kg = CountingKG(self.kg)
        rng = random.Random(f"{cfg.seed}:{example.id}")
        question = example.question
        beam = [t.id for t in example.topic_entities]
        names = {t.id: t.name for t in example.topic_entities}
        triplets: list[tuple[str, str, str]] = []
        steps: list[Step] = []
        expansions: list[dict[str, Any]] = []

        def label(entity: str) -> str:
            if entity not in names:
                names[entity] = UNNAMED if kg.is_unnamed(entity) else kg.label(entity)
            return names[entity]

        def ask(kind: str, prompt: str) -> str:
            reply = client.complete(prompt, cfg.max_tokens).text
            steps.append(Step(kind, reply))
            return reply

        stop_reason = "depth"
        for depth in range(1, cfg.depth + 1):
            chosen: list[tuple[str, str, bool, float]] = []  # (entity, relation, outgoing, relation score)
            for entity in beam:
                out_relations = kg.relations(entity, "out")
                options = list(dict.fromkeys(out_relations + kg.relations(entity, "in")))
                if not options:
                    continue
                reply = ask(
                    "relations", prompts.relation_prompt(question, label(entity), options, cfg.width, cfg.few_shot)
                )
                picked = prompts.parse_scored(reply, options)[: cfg.width]
                steps[-1].parsed = picked
                chosen.extend((entity, rel, rel in out_relations, score) for rel, score in picked)
            candidates: list[_Path] = []
            for entity, relation, outgoing, rel_score in chosen:
                tails = self._expand(kg, entity, relation, outgoing)
                expansions.append(
                    {
                        "depth": depth,
                        "entity": entity,
                        "relation": relation,
                        "direction": "out" if outgoing else "in",
                        "tails": len(tails),
                    }
                )
                if len(tails) >= cfg.max_candidates:
                    tails = rng.sample(tails, cfg.retain_candidates)
                for tail, score in self._score(question, label(entity), relation, tails, rel_score, label, ask):
                    candidates.append(_Path(entity, relation, outgoing, tail, score))
            kept = [p for p in sorted(candidates, key=lambda p: -p.score) if p.score > 0][: cfg.width]
            if not kept:
                stop_reason = "empty beam"
                break
            for p in kept:
                head, tail = (p.entity, p.tail) if p.outgoing else (p.tail, p.entity)
                triplet = (label(head), p.relation, label(tail))
                if triplet not in triplets:
                    triplets.append(triplet)
            reply = ask("sufficiency", prompts.sufficiency_prompt(question, triplets))
            enough = prompts.parse_sufficient(reply)
            steps[-1].parsed = enough
            if enough:
                stop_reason = "sufficient"
                break
            beam = list(dict.fromkeys(p.tail for p in kept))
        reply = ask("answer", prompts.answer_prompt(question, triplets))
        answers, valid = prompts.parse_answer(reply)
        steps[-1].parsed = answers
        trace = {
            "mode": self.config.mode,
            "stop": stop_reason,
            "triplets": [list(t) for t in triplets],
            "expansions": expansions,
            "steps": [s.to_dict() for s in steps],
        }
        return MethodResult(answers, valid, trace, kg_queries=kg.queries)

    def _expand(self, kg: KnowledgeGraph, entity: str, relation: str, outgoing: bool) -> list[str]:
        """Entities one `relation` step from `entity`, with ToG's query in `faithful` mode."""
        if outgoing:
            edges = kg.neighbors(entity, "out", relations=[relation])
            return list(dict.fromkeys(e.object for e in edges))
        if self.config.mode == "faithful":
            # ToG's `?tail <entity> <relation>`: subjects of edges whose predicate is the entity
            # and whose object is the relation id. Asked of a real KG it finds nothing.
            edges = kg.neighbors(relation, "in", relations=[entity])
            return list(dict.fromkeys(e.subject for e in edges))
        edges = kg.neighbors(entity, "in", relations=[relation])
        return list(dict.fromkeys(e.subject for e in edges))

    def _score(
        self, question: str, entity_label: str, relation: str, tails: list[str], rel_score: float, label: Any, ask: Any
    ) -> list[tuple[str, float]]:
        """(tail, relation score x entity score) per candidate, as ToG's entity scoring does it."""
        if not tails:
            return []
        named = [t for t in tails if label(t) != UNNAMED]
        if not named:
            return [(t, rel_score / len(tails)) for t in tails]
        if len(named) == 1:
            return [(named[0], rel_score)]
        shown = list(dict.fromkeys(label(t) for t in named))
        reply = ask("entities", prompts.entity_prompt(question, entity_label, relation, shown, self.config.few_shot))
        scores = dict(prompts.parse_scored(reply, shown))
        return [(t, rel_score * scores.get(label(t), 0.0)) for t in named]
