"""The oracle: walks each question's gold relation path through the real search tool.

The retrieval upper bound: at every hop it searches the frontier entities with the same
`KGSearchTool` the model uses (one page of `top_k` candidates each) and follows the next gold
relation(s) over the triples the tool actually showed. The answer is reached only if the right
triple is in the top-k at every hop. A mediator reached through an expanded candidate is not
searched again when the tool already showed the edge that leaves it. No LLM is used.

Trace: per hop the entities searched and reached; `recall` is the share of the nodes the gold
path reaches on the whole KG that the walk reached. The topic entity, when the path returns to
it, is the last answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kgreasoner.baselines.base import Method, MethodResult
from kgreasoner.data.schema import QAExample
from kgreasoner.kg.base import INVERSE_PREFIX, execute_path
from kgreasoner.retrieval.tool import KGSearchTool


@dataclass
class OracleConfig:
    """Oracle settings (YAML section `oracle` of the eval config)."""

    max_frontier: int = field(default=20, metadata={"help": "entities searched per hop (the first reached)"})

    def __post_init__(self) -> None:
        if self.max_frontier < 1:
            raise ValueError(f"oracle max_frontier must be >= 1, got {self.max_frontier}")


class OracleMethod(Method):
    name = "oracle"
    uses_llm = False

    def __init__(self, tool: KGSearchTool, config: OracleConfig | None = None) -> None:
        self.tool = tool
        self.config = config or OracleConfig()

    def answer(self, example: QAExample, llm: Any = None) -> MethodResult:
        if not example.gold_paths:
            return MethodResult([], False, {"reason": "no gold path"})
        path = example.gold_paths[0]
        topic = example.topic_entities[0]
        session = self.tool.session(example.question, list(example.topic_entities), example_id=example.id)
        shown: dict[tuple[str, str, str], None] = {}
        searched: set[str] = set()
        frontier = [topic.id]
        hops = []
        for relation in path:
            name, backwards = (relation[len(INVERSE_PREFIX):], True) if relation.startswith(INVERSE_PREFIX) else (relation, False)
            to_search = [e for e in frontier if e not in searched and not _leaves(shown, e, name, backwards)]
            for entity in to_search[: self.config.max_frontier]:
                searched.add(entity)
                for edge in session.call(entity).edges:
                    shown.setdefault(edge.key(), None)
            frontier = _follow(shown, frontier, name, backwards)
            hops.append({"relation": relation, "searched": to_search[: self.config.max_frontier], "reached": len(frontier)})
            if not frontier:
                break
        # A path may lead back to the topic (a spouse's spouse): it goes last, so that a question
        # asking for someone else scores that one, and one whose answer is the topic still has it.
        reached = [e for e in frontier if e != topic.id] + [e for e in frontier if e == topic.id]
        kg = self.tool.kg.for_example(example.id)
        full = execute_path(kg, topic.id, path)
        recall = len(set(reached) & full) / len(full) if full else 0.0
        answers = list(dict.fromkeys(kg.label(e) for e in reached))
        trace = {"path": list(path), "hops": hops, "recall": recall, "answers_total": len(full)}
        return MethodResult(answers, True, trace, kg_queries=session.num_calls)


def _leaves(shown: dict[tuple[str, str, str], None], entity: str, relation: str, backwards: bool) -> bool:
    return any((o if backwards else s) == entity and r == relation for s, r, o in shown)


def _follow(shown: dict[tuple[str, str, str], None], frontier: list[str], relation: str, backwards: bool) -> list[str]:
    """Nodes one step along `relation` from `frontier`, over shown triples only, in order shown."""
    sources = set(frontier)
    out: dict[str, None] = {}
    for s, r, o in shown:
        if r != relation:
            continue
        if backwards and o in sources:
            out.setdefault(s, None)
        elif not backwards and s in sources:
            out.setdefault(o, None)
    return list(out)
