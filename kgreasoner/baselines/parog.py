"""PaRoG (Plan-Answer-Refine-on-Graph): plan sub-objectives, answer tentatively, refine on the KG.

1. Plan: the LLM splits the question into sub-objectives (a JSON list of strings).
2. Answer: the LLM gives a tentative answer to every sub-objective from its own knowledge
   (a JSON list of {"A", "R"} objects: answer and reason).
3. Per sub-objective, in order, starting from the topic entities for the first and from the
   previous sub-objective's answers for the later ones (earlier sub-answers seed later ones):
   the LLM selects relations among those of the current entities (`rel` outgoing, `^rel`
   incoming; JSON {"relations": [...]}), the relations are followed, and the LLM selects the
   entities that answer the sub-objective (JSON {"entities": [...]}; no call for one candidate).
4. Refine: the LLM sees the tentative answer and the KG evidence (triples reaching the selected
   entities) and writes the sub-answer as JSON {"A", "R"}. KG evidence wins on conflict: when
   there is evidence, refined answers that name no entity in it are replaced by the selected
   KG entities (refined answers that do are kept).
5. Final answer: JSON {"A", "R"} from the question and the sub-answers; the same rule applies
   against the last sub-objective's evidence. Format-valid means the final reply parsed as a
   JSON object with "A".
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kgreasoner.baselines.base import (
    CountingKG,
    Method,
    MethodResult,
    Step,
    as_answer_list,
    json_list,
    json_object,
)
from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.llm.clients import MeteredLLM
from kgreasoner.protocol import ANSWER_SEPARATOR
from kgreasoner.records.ids import INVERSE_PREFIX
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import QAExample

PLAN_PROMPT = """Break the question into the smallest sequence of sub-objectives, each one step from an \
entity already known (a topic entity or an earlier sub-objective's answer) to a new one. Reply with a \
JSON list of strings only.
Question: {question}
Topic entities: {topics}
Sub-objectives:
"""

TENTATIVE_PROMPT = """For each sub-objective, give your best tentative answer from what you know. Reply \
with a JSON list holding one object per sub-objective: {{"A": answer, "R": one-sentence reason}}.
Question: {question}
Sub-objectives:
{objectives}
Tentative answers:
"""

RELATION_PROMPT = """Select the relations to follow from the current entities to reach the answer of the \
sub-objective. A relation written ^relation points into the entity. Reply with JSON only: \
{{"relations": [chosen relations, copied exactly]}}.
Question: {question}
Sub-objective: {objective}
Current entities: {entities}
Relations:
{relations}
Selection:
"""

ENTITY_PROMPT = """Select the candidate entities that answer the sub-objective. Reply with JSON only: \
{{"entities": [chosen candidates, copied exactly]}}.
Question: {question}
Sub-objective: {objective}
Candidates:
{candidates}
Selection:
"""

REFINE_PROMPT = """Refine the tentative answer of the sub-objective with the knowledge graph evidence. \
When they disagree, the evidence is right. Reply with JSON only: {{"A": answer (several joined by |), \
"R": one-sentence reason}}.
Question: {question}
Sub-objective: {objective}
Tentative answer: {tentative}
Evidence:
{evidence}
Refined answer:
"""

FINAL_PROMPT = """Answer the question from the answers of its sub-objectives. Reply with JSON only: \
{{"A": answer (several joined by |), "R": one-sentence reason}}.
Question: {question}
Sub-objectives and answers:
{steps}
Final answer:
"""

NO_EVIDENCE = "(no evidence found)"


@dataclass
class PaRoGConfig:
    """PaRoG settings (YAML section `parog` of the eval config)."""

    max_objectives: int = field(default=4, metadata={"help": "sub-objectives kept from the plan"})
    max_relations: int = field(default=3, metadata={"help": "relations followed per sub-objective"})
    max_entities: int = field(
        default=10, metadata={"help": "entities kept per sub-objective (they seed the next one)"}
    )
    max_candidates: int = field(default=50, metadata={"help": "candidates shown to the entity-selection step"})
    max_tokens: int | None = field(default=None, metadata={"help": "reply budget per LLM step (None: the client's)"})

    def __post_init__(self) -> None:
        if min(self.max_objectives, self.max_relations, self.max_entities, self.max_candidates) < 1:
            raise ValueError("parog max_objectives, max_relations, max_entities and max_candidates must be >= 1")


def parse_plan(reply: str, question: str, limit: int) -> list[str]:
    """A JSON list of strings, else numbered/bulleted lines, else the question itself."""
    value = json_list(reply)
    items = [str(v).strip() for v in value if str(v).strip()] if value else []
    if not items:
        items = [ln.strip().lstrip("-*0123456789.) ").strip() for ln in reply.splitlines()]
        items = [ln for ln in items if ln]
    return (items or [question])[:limit]


def parse_answer_object(reply: str) -> tuple[list[str], str] | None:
    """(answers, reason) of a JSON {"A", "R"} reply; None without a JSON object holding "A"."""
    value = json_object(reply)
    if value is None or "A" not in value:
        return None
    return as_answer_list(value["A"]), str(value.get("R", ""))


def parse_tentative(reply: str, count: int) -> list[list[str]]:
    """Tentative answers per sub-objective (a JSON list of {"A"} objects); missing ones are empty."""
    value = json_list(reply) or []
    out = [as_answer_list(v.get("A")) if isinstance(v, dict) else as_answer_list(v) for v in value]
    return (out + [[] for _ in range(count)])[:count]


def parse_selection(reply: str, key: str, options: list[str]) -> list[str]:
    """Options named in JSON {key: [...]} (exact, else normalised match); else options quoted in the text."""
    value = json_object(reply)
    names = value.get(key) if isinstance(value, dict) else None
    by_norm = {normalize_answer(o): o for o in options}
    chosen: list[str] = []
    if isinstance(names, list):
        for name in names:
            text = str(name).strip()
            option = text if text in options else by_norm.get(normalize_answer(text))
            if option is not None and option not in chosen:
                chosen.append(option)
        return chosen
    return [o for o in options if f'"{o}"' in reply]


class PaRoGMethod(Method):
    name = "parog"

    def __init__(self, kg: KnowledgeGraph, config: PaRoGConfig | None = None) -> None:
        self.kg: KnowledgeGraph = kg
        self.config = config or PaRoGConfig()

    def answer(self, example: QAExample, llm: MeteredLLM | None) -> MethodResult:
        client = self.client(llm)
        cfg = self.config
        kg = CountingKG(self.kg)
        steps: list[Step] = []

        def ask(kind: str, prompt: str) -> str:
            reply = client.complete(prompt, cfg.max_tokens).text
            steps.append(Step(kind, reply))
            return reply

        question = example.question
        topics = ", ".join(t.name for t in example.topic_entities)
        plan = parse_plan(
            ask("plan", PLAN_PROMPT.format(question=question, topics=topics)), question, cfg.max_objectives
        )
        steps[-1].parsed = plan
        numbered = "\n".join(f"{i + 1}. {o}" for i, o in enumerate(plan))
        tentative = parse_tentative(
            ask("tentative", TENTATIVE_PROMPT.format(question=question, objectives=numbered)), len(plan)
        )
        steps[-1].parsed = tentative

        current = {t.id: t.name for t in example.topic_entities}  # id -> label of the entities in hand
        sub_answers: list[dict[str, Any]] = []
        for objective, guess in zip(plan, tentative):
            selected, evidence = self._walk(kg, question, objective, current, ask, steps)
            reply = ask(
                "refine",
                REFINE_PROMPT.format(
                    question=question,
                    objective=objective,
                    tentative=f" {ANSWER_SEPARATOR} ".join(guess) or "(none)",
                    evidence="\n".join(f"({h}, {r}, {t})" for h, r, t in evidence) or NO_EVIDENCE,
                ),
            )
            parsed = parse_answer_object(reply)
            refined = parsed[0] if parsed else []
            answers, overruled = _kg_wins(refined, list(selected.values()))
            steps[-1].parsed = {"refined": refined, "kept": answers, "overruled": overruled}
            sub_answers.append(
                {
                    "objective": objective,
                    "tentative": guess,
                    "answers": answers,
                    "evidence": [list(e) for e in evidence],
                    "overruled": overruled,
                }
            )
            if selected:
                by_label = {normalize_answer(v): k for k, v in selected.items()}
                current = {by_label[normalize_answer(a)]: a for a in answers if normalize_answer(a) in by_label}
            else:
                current = self._resolve_names(kg, answers) or current

        lines = "\n".join(
            f"{i + 1}. {s['objective']} -> {f' {ANSWER_SEPARATOR} '.join(s['answers']) or '(none)'}"
            for i, s in enumerate(sub_answers)
        )
        reply = ask("final", FINAL_PROMPT.format(question=question, steps=lines))
        parsed = parse_answer_object(reply)
        final = parsed[0] if parsed else []
        last = sub_answers[-1]["answers"] if sub_answers and sub_answers[-1]["evidence"] else []
        answers, overruled = _kg_wins(final, last)
        steps[-1].parsed = {"final": final, "kept": answers, "overruled": overruled}
        trace = {"plan": plan, "sub_answers": sub_answers, "steps": [s.to_dict() for s in steps]}
        return MethodResult(answers, parsed is not None, trace, kg_queries=kg.queries)

    def _walk(
        self, kg: KnowledgeGraph, question: str, objective: str, current: dict[str, str], ask: Any, steps: list[Step]
    ) -> tuple[dict[str, str], list[tuple[str, str, str]]]:
        """Relation then entity selection from `current`: (selected id -> label, evidence triples)."""
        cfg = self.config
        edges_by_relation: dict[str, list[tuple[str, str, str, str]]] = {}  # rel -> (entity, tail, head lbl, tail lbl)
        for entity in current:
            for edge in kg.neighbors(entity, "both"):
                key = edge.path_relation
                edges_by_relation.setdefault(key, []).append(
                    (
                        entity,
                        edge.neighbor,
                        _label(kg, edge.subject, edge.subject_label),
                        _label(kg, edge.object, edge.object_label),
                    )
                )
        options = list(edges_by_relation)
        if not options:
            return {}, []
        reply = ask(
            "relations",
            RELATION_PROMPT.format(
                question=question,
                objective=objective,
                entities=", ".join(current.values()),
                relations="\n".join(options),
            ),
        )
        relations = parse_selection(reply, "relations", options)[: cfg.max_relations]
        steps[-1].parsed = relations
        reached: dict[str, str] = {}
        evidence: dict[str, list[tuple[str, str, str]]] = {}
        for relation in relations:
            name = relation[len(INVERSE_PREFIX) :] if relation.startswith(INVERSE_PREFIX) else relation
            for _, tail, head_label, tail_label in edges_by_relation[relation]:
                tail_name = head_label if relation.startswith(INVERSE_PREFIX) else tail_label
                reached.setdefault(tail, tail_name)
                evidence.setdefault(tail, []).append((head_label, name, tail_label))
        if not reached:
            return {}, []
        candidates = list(reached)[: cfg.max_candidates]
        if len(candidates) > 1:
            shown = list(dict.fromkeys(reached[c] for c in candidates))
            reply = ask(
                "entities", ENTITY_PROMPT.format(question=question, objective=objective, candidates="\n".join(shown))
            )
            picked = set(parse_selection(reply, "entities", shown))
            steps[-1].parsed = sorted(picked)
            candidates = [c for c in candidates if reached[c] in picked] or candidates
        selected = {c: reached[c] for c in candidates[: cfg.max_entities]}
        triples = [t for c in selected for t in evidence[c]]
        return selected, list(dict.fromkeys(triples))

    @staticmethod
    def _resolve_names(kg: KnowledgeGraph, names: list[str]) -> dict[str, str]:
        found: dict[str, str] = {}
        for name in names:
            for entity in kg.resolve(name)[:1]:
                found[entity] = name
        return found


def _label(kg: KnowledgeGraph, entity: str, label: str) -> str:
    """Unnamed mediators are shown by id, so that later steps can name them."""
    return entity if kg.is_unnamed(entity) else label


def _kg_wins(answers: list[str], kg_answers: list[str]) -> tuple[list[str], bool]:
    """Keep the answers the KG evidence names; if none of them does, take the KG's (when it has any)."""
    if not kg_answers:
        return answers, False
    known = {normalize_answer(a): a for a in kg_answers}
    kept = [known[normalize_answer(a)] for a in answers if normalize_answer(a) in known]
    if kept:
        return list(dict.fromkeys(kept)), len(kept) < len(answers)
    return list(kg_answers), True
