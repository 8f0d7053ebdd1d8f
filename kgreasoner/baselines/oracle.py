"""The oracle: walks each question's gold relation path through the real search tool, as a model could.

The retrieval upper bound: at every hop it searches each frontier entity with the same
`KGSearchTool` the model uses and follows the next gold relation over the triples the tool
actually showed. Every named entity the walk reaches is searched, even when a line already shown
leads on from it (a path back near the topic, "the children of X's parents", needs the parents'
other children, which only a search of the parents shows). Where the tool's `more:` line says the
entity has unseen lines by the gold relation, the oracle pages through them with
`NAME | REL` until none is left, so top-k cuts no branch; where the listing does not name the gold
relation but says more relations are left unnamed (a hub's), it lists them with `NAME | relations`
until the gold one is named or none is left. An unnamed mediator is not searched when
a shown line already leaves it by the next relation: the tool expands mediators, so paging
through the relation that reaches one shows every edge beyond it. No LLM is used.

Multi-topic questions (`QAExample.intersect`): each gold path is walked from its own topic entity
in the same session, and the answers are the entities every walk reached, in the first walk's
order.

Trace: per branch (topic, path) and hop, the entities searched, the filtered pages and how many
nodes were reached; `recall` is the share of the answers that executing the gold path(s) on the
whole KG gives that the walk reached. A topic entity, when a path returns to it, is the last answer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kgreasoner.baselines.base import Method, MethodResult
from kgreasoner.kg.base import KnowledgeGraph, execute_path
from kgreasoner.llm.clients import MeteredLLM
from kgreasoner.protocol import QUERY_SEPARATOR, RELATIONS_MARK, ToolResult
from kgreasoner.records.ids import INVERSE_PREFIX
from kgreasoner.records.schema import QAExample, TopicEntity
from kgreasoner.retrieval.tool import KGSearchTool, SearchSession

Shown = dict[tuple[str, str, str], None]


@dataclass
class OracleConfig:
    """Oracle settings (YAML section `oracle` of the eval config)."""

    max_frontier: int = field(
        default=200,
        metadata={
            "help": "entities searched per hop (the first reached); bounds the work where a hop reaches a hub's "
            "neighbours"
        },
    )
    max_pages: int = field(
        default=100,
        metadata={
            "help": "filtered pages (`NAME | REL`) and relation listings (`NAME | relations`) per entity and hop, "
            "beyond its first search"
        },
    )

    def __post_init__(self) -> None:
        if self.max_frontier < 1 or self.max_pages < 0:
            raise ValueError(
                f"oracle max_frontier must be >= 1 and max_pages >= 0, got {self.max_frontier} and {self.max_pages}"
            )


class OracleMethod(Method):
    name = "oracle"
    uses_llm = False

    def __init__(self, tool: KGSearchTool, config: OracleConfig | None = None) -> None:
        self.tool = tool
        self.config = config or OracleConfig()

    def answer(self, example: QAExample, llm: MeteredLLM | None = None) -> MethodResult:
        if not example.gold_paths:
            return MethodResult([], False, {"reason": "no gold path"})
        branches = (
            list(zip(example.topic_entities, example.gold_paths))
            if example.intersect
            else [(example.topic_entities[0], example.gold_paths[0])]
        )
        kg = self.tool.kg.for_example(example.id)
        walk = _Walk(
            self.tool.session(example.question, list(example.topic_entities), example_id=example.id), kg, self.config
        )
        reached_sets: list[list[str]] = []
        full: set[str] | None = None
        trace_branches = []
        for topic, path in branches:
            reached, hops = walk.branch(topic, path)
            reached_sets.append(reached)
            trace_branches.append({"topic": topic.id, "path": list(path), "hops": hops})
            executed = execute_path(kg, topic.id, path)
            full = executed if full is None else full & executed
        common = set.intersection(*(set(r) for r in reached_sets))
        topics = {t.id for t, _ in branches}
        reached = [e for e in reached_sets[0] if e in common]
        # A path may lead back to the topic (a spouse's spouse): it goes last, so that a question
        # asking for someone else scores that one, and one whose answer is the topic still has it.
        reached = [e for e in reached if e not in topics] + [e for e in reached if e in topics]
        full = full or set()
        recall = len(set(reached) & full) / len(full) if full else 0.0
        answers = list(dict.fromkeys(kg.label(e) for e in reached))
        trace = {
            "path": list(branches[0][1]),
            "hops": trace_branches[0]["hops"],
            "recall": recall,
            "answers_total": len(full),
        }
        if example.intersect:
            trace["branches"] = trace_branches
        return MethodResult(answers, True, trace, kg_queries=walk.session.num_calls)


class _Walk:
    """The searches of one question: what the tool showed and what each entity's listing still offers."""

    def __init__(self, session: SearchSession, kg: KnowledgeGraph, config: OracleConfig) -> None:
        self.session = session
        self.kg: KnowledgeGraph = kg
        self.config = config
        self.shown: Shown = {}
        self.searched: set[str] = set()
        self.unseen: dict[str, dict[str, int]] = {}  # entity -> its last listing (filter name -> count)
        self.unlisted: dict[str, int] = {}  # entity -> relations no listing has named yet

    def branch(self, topic: TopicEntity, path: tuple[str, ...]) -> tuple[list[str], list[dict[str, Any]]]:
        frontier = [topic.id]
        hops = []
        for relation in path:
            name, backwards = (
                (relation[len(INVERSE_PREFIX) :], True) if relation.startswith(INVERSE_PREFIX) else (relation, False)
            )
            searched, pages = [], 0
            for entity in frontier[: self.config.max_frontier]:
                if self.kg.is_unnamed(entity) and _leaves(self.shown, entity, name, backwards):
                    continue
                searched.append(entity)
                pages += self.exhaust(entity, name)
            frontier = _follow(self.shown, frontier, name, backwards)
            hops.append({"relation": relation, "searched": searched, "pages": pages, "reached": len(frontier)})
            if not frontier:
                break
        return frontier, hops

    def exhaust(self, entity: str, relation: str) -> int:
        """Search `entity` (once per question), then page through its unseen lines by `relation`, listing the
        entity's unnamed relations first while the listing does not name it; the count of calls after the search."""
        if entity not in self.searched:
            self.searched.add(entity)
            self.record(entity, self.session.call(entity))
        wanted = self.session.filter_name(entity, relation)
        pages = 0
        named = False
        while pages < self.config.max_pages:
            if wanted in self.unseen.get(entity, {}):
                named = True
                query = f"{entity} {QUERY_SEPARATOR} {wanted}"
            elif not named and self.unlisted.get(entity):
                query = f"{entity} {QUERY_SEPARATOR} {RELATIONS_MARK}"
            else:
                break
            pages += 1
            self.record(entity, self.session.call(query))
        return pages

    def record(self, entity: str, result: ToolResult) -> None:
        for edge in result.edges:
            self.shown.setdefault(edge.key(), None)
        ok = result.error is None and result.entity == entity
        self.unseen[entity] = dict(result.more) if ok else {}
        self.unlisted[entity] = result.unlisted if ok else 0


def _leaves(shown: Shown, entity: str, relation: str, backwards: bool) -> bool:
    return any((o if backwards else s) == entity and r == relation for s, r, o in shown)


def _follow(shown: Shown, frontier: list[str], relation: str, backwards: bool) -> list[str]:
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
