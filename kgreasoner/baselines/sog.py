"""SoG (Search-on-Graph): the LLM navigates the KG with one tool, turn by turn.

The tool is `search(entity, direction, properties_to_filter_for)`: the facts at `entity`
(`outgoing` or `incoming`), optionally only those whose property is in the filter list. Rules
from the paper: more than k (= 50) rows and no filter -> only the distinct properties are
returned, so the LLM filters next; more than p (= 1,000) rows -> the table is truncated to p
rows. Results are markdown tables `| property | propertyLabel | value | valueLabel |`.

Each LLM turn sees the whole transcript and writes either an action,
`Action: search("Utah", "outgoing", ["location.location.time_zones"])`, or
`Final answer: {A | B}`. The paper sets no step cap; here `max_steps` LLM turns bound a
question, after which it has no answer. An action that cannot be read gets an observation
saying so (it costs a step). Entities are named by id or by a label shown so far.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import Any

from kgreasoner.baselines.base import CountingKG, Method, MethodResult, Step, braced_answers
from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.llm.clients import MeteredLLM
from kgreasoner.records.edges import Edge
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import QAExample
from kgreasoner.retrieval.encoder import humanize_relation

DIRECTIONS = {"outgoing": "out", "out": "out", "incoming": "in", "in": "in"}
OBSERVATION = "Observation:"

SYSTEM_PROMPT = """Answer the question by searching a knowledge graph. You have one tool:
search(entity, direction, properties_to_filter_for)
- entity: an entity id or name: a topic entity, or a value from an earlier result;
- direction: "outgoing" (facts where the entity is the subject) or "incoming" (where it is the object);
- properties_to_filter_for: a list of properties to keep, or [] for all.
With an empty filter, an entity with more than {k} facts returns only its distinct properties: \
search it again with a filter. More than {p} rows are truncated.
Results are markdown tables. Each turn, write one short thought and then one line:
Action: search("entity", "outgoing", [])
When you know the answer, write instead:
Final answer: {{answer | another answer}}

Question: {question}
Topic entities: {topics}
"""

_ACTION = re.compile(r"search\s*\((.*)\)", re.DOTALL)
_FINAL = re.compile(r"final answer\s*:", re.IGNORECASE)


@dataclass
class SoGConfig:
    """Search-on-Graph settings (YAML section `sog` of the eval config)."""

    k: int = field(
        default=50, metadata={"help": "rows above which an unfiltered search returns only distinct properties"}
    )
    p: int = field(default=1000, metadata={"help": "rows above which a result table is truncated"})
    max_steps: int = field(default=10, metadata={"help": "LLM turns per question (the paper gives no cap)"})
    max_tokens: int | None = field(default=None, metadata={"help": "reply budget per turn (None: the client's)"})

    def __post_init__(self) -> None:
        if self.k < 1 or self.p < 1 or self.max_steps < 1:
            raise ValueError("sog k, p and max_steps must be >= 1")


@dataclass(frozen=True)
class SearchCall:
    entity: str
    direction: str
    properties: tuple[str, ...]


def parse_action(reply: str) -> SearchCall | None:
    """The first `search(...)` call in `reply` (positional or keyword arguments); None if unreadable."""
    match = _ACTION.search(reply)
    if match is None:
        return None
    body = match.group(1)
    # The call may be followed by prose with more parentheses: retry shorter closing positions.
    ends = [i for i, c in enumerate(body) if c == ")"][::-1]
    for text in [body] + [body[:i] for i in ends]:
        try:
            call = ast.parse(f"search({text})", mode="eval").body
            assert isinstance(call, ast.Call)
            args = [ast.literal_eval(a) for a in call.args]
            kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords}
        except (SyntaxError, ValueError, AssertionError, TypeError):
            continue
        return _call_from(args, kwargs)
    return None


def _call_from(args: list, kwargs: dict) -> SearchCall | None:
    names = ("entity", "direction", "properties_to_filter_for")
    values = dict(zip(names, args))
    for key, value in kwargs.items():
        values["properties_to_filter_for" if key in ("properties", "filter") else key] = value
    entity, direction = values.get("entity"), values.get("direction", "outgoing")
    props = values.get("properties_to_filter_for") or []
    if isinstance(props, str):
        props = [props]
    if not isinstance(entity, str) or not entity.strip() or not isinstance(direction, str):
        return None
    if direction.strip().lower() not in DIRECTIONS or not isinstance(props, (list, tuple)):
        return None
    return SearchCall(entity.strip(), DIRECTIONS[direction.strip().lower()], tuple(str(p) for p in props))


def parse_final(reply: str) -> list[str] | None:
    """Answers of `Final answer: {A | B}` (None when the reply has none)."""
    return braced_answers(reply, marker="Final answer:")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def result_table(edges: list[Edge], filtered: bool, k: int, p: int, label: Any) -> str:
    """The tool's markdown answer for the rows of one search (see the module docstring)."""
    if not edges:
        return "No results."
    if not filtered and len(edges) > k:
        props = list(dict.fromkeys(e.relation for e in edges))
        lines = [
            f"{len(edges)} results, more than {k}: only the distinct properties are listed. "
            "Search again with properties_to_filter_for.",
            "| property | propertyLabel |",
            "|---|---|",
        ]
        lines += [f"| {_cell(r)} | {_cell(humanize_relation(r))} |" for r in props]
        return "\n".join(lines)
    lines = ["| property | propertyLabel | value | valueLabel |", "|---|---|---|---|"]
    for edge in edges[:p]:
        lines.append(
            f"| {_cell(edge.relation)} | {_cell(humanize_relation(edge.relation))} | "
            f"{_cell(edge.neighbor)} | {_cell(label(edge.neighbor))} |"
        )
    if len(edges) > p:
        lines.append(f"Truncated: {p} of {len(edges)} rows shown.")
    return "\n".join(lines)


class SoGMethod(Method):
    name = "sog"

    def __init__(self, kg: KnowledgeGraph, config: SoGConfig | None = None) -> None:
        self.kg: KnowledgeGraph = kg
        self.config = config or SoGConfig()

    def answer(self, example: QAExample, llm: MeteredLLM | None) -> MethodResult:
        client = self.client(llm)
        cfg = self.config
        kg = CountingKG(self.kg)
        labels: dict[str, str] = {t.id: t.name for t in example.topic_entities}
        topics = ", ".join(f"{t.name} ({t.id})" for t in example.topic_entities)
        transcript = SYSTEM_PROMPT.format(k=cfg.k, p=cfg.p, question=example.question, topics=topics)
        steps: list[Step] = []

        def label(entity: str) -> str:
            if entity not in labels:
                labels[entity] = kg.label(entity)
            return labels[entity]

        answers: list[str] | None = None
        for _ in range(cfg.max_steps):
            reply = client.complete(transcript, cfg.max_tokens, stop=(OBSERVATION,)).text
            action, final = parse_action(reply), parse_final(reply)
            final_at = _FINAL.search(reply)
            action_at = _ACTION.search(reply)
            if final is not None and (
                action is None or (final_at and action_at and final_at.start() < action_at.start())
            ):
                answers = final
                steps.append(Step("final", reply, final))
                break
            if action is None:
                observation = (
                    'Could not read an action. Write Action: search("entity", "outgoing", []) '
                    "or Final answer: {answer}."
                )
                steps.append(Step("unreadable", reply))
            else:
                observation, rows = self._search(kg, action, labels, label)
                steps.append(
                    Step("search", reply, [action.entity, action.direction, list(action.properties)], {"rows": rows})
                )
            transcript += reply.rstrip() + f"\n{OBSERVATION}\n{observation}\n"
        trace = {"steps": [s.to_dict() for s in steps], "turns": len(steps)}
        valid = answers is not None
        return MethodResult(answers or [], valid, trace, kg_queries=kg.queries)

    def _search(self, kg: KnowledgeGraph, call: SearchCall, labels: dict[str, str], label: Any) -> tuple[str, int]:
        entity = self._entity(kg, call.entity, labels)
        if entity is None:
            return f'Unknown entity "{call.entity}": use an id or a name from the question or earlier results.', 0
        edges = kg.neighbors(entity, call.direction)  # type: ignore[arg-type]
        if call.properties:
            wanted = {normalize_answer(p) for p in call.properties}
            edges = [
                e
                for e in edges
                if normalize_answer(e.relation) in wanted or normalize_answer(humanize_relation(e.relation)) in wanted
            ]
        return result_table(edges, bool(call.properties), self.config.k, self.config.p, label), len(edges)

    @staticmethod
    def _entity(kg: KnowledgeGraph, name: str, labels: dict[str, str]) -> str | None:
        """An id seen so far, a label seen so far (latest first), else the KG's own resolution."""
        if name in labels:
            return name
        wanted = normalize_answer(name)
        for entity, text in reversed(list(labels.items())):
            if text == name or normalize_answer(text) == wanted:
                return entity
        found = kg.resolve(name)
        return found[0] if found else None
