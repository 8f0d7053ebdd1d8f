"""One trajectory written against a live search session (`TrajectoryWriter`), the moves it may take
(`Route`, `Step`), the skip it may end in (`Skip`), and rewrites of a finished record: blocks
shuffled (`shuffle_blocks`), handles renumbered (`renumber_handles`)."""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from data_gen.warmup.config import WarmupConfig
from data_gen.warmup.templates import PLAN_SEPARATOR, SLOTS
from kgreasoner.kg.base import KnowledgeGraph, follow
from kgreasoner.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    ANSWER_SEPARATOR,
    BACKTRACK_MARK,
    HANDLE_PATTERN,
    HANDLE_PREFIX,
    MORE_PREFIX,
    QUERY_SEPARATOR,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    ToolResult,
    format_tool_block,
)
from kgreasoner.records.ids import INVERSE_PREFIX, is_literal_id
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import QAExample, TopicEntity
from kgreasoner.records.trajectories import Segment, WarmupRecord
from kgreasoner.retrieval.encoder import humanize_relation
from kgreasoner.retrieval.tool import KGSearchTool, SearchSession, relation_key, triple_line


class Skip(Exception):
    """The question yields no trajectory; `reason` is counted in the summary."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Route:
    """The gold path walked: from which topic entity, along which relations."""

    topic: TopicEntity
    path: tuple[str, ...]


@dataclass(frozen=True)
class Step:
    """A move the shown triples support: from `source` along `relations` (1, or 2 through a mediator) to `target`."""

    source: str
    relations: tuple[str, ...]
    target: str


class Walker(Protocol):
    """What a writer reads from the generator that drives it (`walk.WarmupGenerator`)."""

    kg: KnowledgeGraph
    tool: KGSearchTool
    config: WarmupConfig
    templates: dict[str, tuple[str, ...]]
    stats: Counter[str]

    def reaches_gold(self, example: QAExample, entity: str, rest: Sequence[str]) -> bool: ...


class TrajectoryWriter:
    """Builds one trajectory against a live session: trained text, tool blocks, what was shown."""

    def __init__(self, generator: Walker, example: QAExample, route: Route, rng: random.Random) -> None:
        self.g = generator
        self.example = example
        self.route = route
        self.allowed: set[str] | None = None  # the answers an earlier route of a multi-topic question showed
        self.rng = rng
        self.kg = generator.kg.for_example(example.id)  # the question's own subgraph in a per-question KG
        self.session: SearchSession = generator.tool.session(
            example.question, list(example.topic_entities), example_id=example.id
        )
        self.segments: list[Segment] = []
        self.buffer = THINK_OPEN + " "
        self.labels: dict[str, str] = {t.id: t.name or self.kg.label(t.id) for t in example.topic_entities}
        self.forward: dict[tuple[str, str], list[str]] = {}  # (node, path relation) -> nodes, in shown order
        self.searched: set[str] = set()
        self.repeats = 0
        self.backtracks = 0
        self.dead_ends = 0  # first-shown entities searched and backtracked from (pick: first_shown)
        self.picks = 0  # points where the walk chose the next entity (or the answer)
        self.backtrack_outcome = ""  # parent / ancestor / error:KIND, after a detour
        # tool block index -> its lines by candidate and its listing line (shuffle_triples)
        self.units: dict[int, tuple[list[list[str]], list[str]]] = {}
        # (trained segment index, offset of the thought in it, template text, action) per thought
        self.thoughts: list[tuple[int, int, str, str]] = []

    # --- names ---
    def query(self, entity: str) -> str:
        """What goes inside `<search>`/`<answer>`: the handle, else the label as the tool showed it."""
        return self.session.handle_of(entity) or self.labels[entity]

    def ref(self, entity: str) -> str:
        """How the thinking names an entity."""
        handle = self.session.handle_of(entity)
        if handle and self.g.config.thought_names:
            return f"{handle} {self.labels[entity]}"
        return handle or self.labels[entity]

    def unique_label(self, entity: str) -> bool:
        """True when no other shown entity has the same label (searching by name finds this one)."""
        wanted = normalize_answer(self.labels[entity])
        return sum(1 for other, label in self.labels.items() if normalize_answer(label) == wanted) == 1

    # --- text ---
    def template(self, group: str, **slots: str) -> str:
        values = {slot: "" for slot in SLOTS}
        plan = f" {PLAN_SEPARATOR} ".join(self.relation_key(r) for r in self.route.path)
        values.update(question=self.example.question, plan=plan, **slots)
        return self.rng.choice(self.g.templates[group]).format(**values)

    def think(self, hint: str, action: str) -> None:
        """Append the template thought before `action` (one per trained segment; a teacher may rewrite it later)."""
        self.thoughts.append((len(self.segments), len(self.buffer), hint, action))
        self.buffer += hint + " "

    def search(self, query: str) -> ToolResult:
        self.buffer += f"{SEARCH_OPEN}{query}{SEARCH_CLOSE}"
        self.segments.append(Segment(self.buffer, True))
        result = self.session.call(query)
        self.segments.append(Segment(format_tool_block(result.text), False))
        self.buffer = ""
        for edge in result.edges:
            for node, label in ((edge.subject, edge.subject_label), (edge.object, edge.object_label)):
                self.labels.setdefault(node, label)
            self.forward.setdefault((edge.subject, edge.relation), []).append(edge.object)
            self.forward.setdefault((edge.object, INVERSE_PREFIX + edge.relation), []).append(edge.subject)
        if self.g.config.shuffle_triples and result.edges:
            self.note_units(result)
        return result

    def note_units(self, result: ToolResult) -> None:
        """Remember the last block's lines grouped by candidate (a mediator's lines stay with its first edge),
        and its `more:` line, which stays last.

        A candidate's first edge is queried from the shown entity, a second one from the mediator.
        The block is left out of shuffling (and counted) if the lines rebuilt here differ from the tool's.
        """
        units: dict[str, list[str]] = {}
        unit: list[str] | None = None
        seen: set[str] = set()
        for edge in result.edges:
            line = triple_line(
                self.display(edge.subject),
                edge.relation,
                self.display(edge.object),
                self.g.config.tool.relation_format,
            )
            if (edge.subject if edge.direction == "out" else edge.object) == result.entity:
                unit = units.setdefault(line, [])
            if unit is not None and line not in seen:
                seen.add(line)
                unit.append(line)
        lines = result.text.split("\n")
        listing = [line for line in lines if line.startswith(MORE_PREFIX)]
        if sorted(seen) == sorted(line for line in lines if line not in listing) and sum(
            map(len, units.values())
        ) == len(seen):
            self.units[len(self.segments) - 1] = ([u for u in units.values() if u], listing)
        else:
            self.g.stats["shuffle_block_kept"] += 1

    def display(self, entity: str) -> str:
        handle = self.session.handle_of(entity)
        return f"{handle} {self.labels[entity]}" if handle else self.labels[entity]

    def search_entity(self, entity: str, backtrack: bool = False, relation: str | None = None) -> ToolResult:
        """Search `entity` (its next page by `relation` when given, as the listing names it), or backtrack from it."""
        query = self.query(entity)
        if relation is not None:
            query = f"{query} {QUERY_SEPARATOR} {relation}"
        if backtrack:
            query = f"{query} {QUERY_SEPARATOR} {BACKTRACK_MARK}"
            self.backtracks += 1
        result = self.search(query)
        if result.entity != entity and not backtrack:
            raise Skip("name_resolves_elsewhere")
        self.searched.add(entity)
        return result

    def finish(self, answers: list[str]) -> None:
        answer = f" {ANSWER_SEPARATOR} ".join(self.query(a) for a in answers)
        self.buffer = self.buffer.rstrip() + f" {THINK_CLOSE}\n{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"
        self.segments.append(Segment(self.buffer, True))
        self.buffer = ""

    # --- the graph as shown ---
    def steps(self, source: str, hop: int) -> list[Step]:
        """Moves from `source` along the gold path at `hop` that the shown triples support and that still
        reach an answer."""
        path = self.route.path
        found: list[Step] = []
        frontier = [(source, ())]
        while frontier:
            node, taken = frontier.pop(0)
            relation = path[hop + len(taken)]
            for target in dict.fromkeys(self.forward.get((node, relation), [])):
                relations = taken + (relation,)
                end = hop + len(relations)
                through = self.kg.is_unnamed(target) and not is_literal_id(target) and end < len(path)
                if through and self.forward_from(target, path[end]):
                    frontier.append((target, relations))
                    continue
                if end == len(path) and self.allowed is not None and target not in self.allowed:
                    continue
                if self.g.reaches_gold(self.example, target, path[end:]):
                    found.append(Step(source, relations, target))
        # Moves that end at a named node first: searching a bare mediator is the fallback.
        found.sort(key=lambda s: self.kg.is_unnamed(s.target) and not is_literal_id(s.target))
        return list(dict.fromkeys(found))

    def forward_from(self, node: str, relation: str) -> bool:
        return bool(self.forward.get((node, relation)))

    def neighbours(self, source: str) -> list[Step]:
        """Every move from `source` the shown triples support (any relation, mediators passed through), in
        shown order."""
        moves: list[Step] = []
        for (node, relation), targets in self.forward.items():
            if node != source:
                continue
            for target in targets:
                if self.kg.is_unnamed(target) and not is_literal_id(target):
                    for (mid, second), beyond in self.forward.items():
                        if mid == target:
                            moves.extend(Step(source, (relation, second), b) for b in beyond if b != source)
                else:
                    moves.append(Step(source, (relation,), target))
        return list(dict.fromkeys(moves))

    def step_relations(self, source: str, hop: int) -> tuple[str, ...]:
        """The relations the next search from `source` covers: one, or more through unnamed nodes."""
        path = self.route.path
        nodes = follow(self.kg, [source], path[hop])
        end = hop + 1
        while end < len(path) and nodes and all(self.kg.is_unnamed(n) and not is_literal_id(n) for n in nodes):
            nodes = follow(self.kg, nodes, path[end])
            end += 1
        return tuple(path[hop:end])

    # --- phrases ---
    def need(self, source: str, relations: Sequence[str]) -> str:
        if all(r.startswith(INVERSE_PREFIX) for r in relations):
            return f"what has {relation_words(relations[::-1])} {self.ref(source)}"
        return f"the {relation_words(relations)} of {self.ref(source)}"

    def fact(self, step: Step) -> str:
        """The step as a sentence read along the triples (a backwards step from its far end)."""
        if all(r.startswith(INVERSE_PREFIX) for r in step.relations):
            return f"{self.ref(step.target)} has {relation_words(step.relations[::-1])} {self.ref(step.source)}"
        return f"{self.ref(step.source)} has {relation_words(step.relations)} {self.ref(step.target)}"

    def hop(self, step: Step) -> str:
        """The step along the path with each relation's key as the triples print it (`^` marks an incoming edge)."""
        return " ".join([self.ref(step.source), *map(self.relation_key, step.relations), self.ref(step.target)])

    def line(self, step: Step) -> str:
        """The triple line the step follows, exactly as the tool printed it; a step through a mediator as `hop`."""
        if len(step.relations) != 1:
            return self.hop(step)
        relation = step.relations[0]
        ends = (step.target, step.source) if relation.startswith(INVERSE_PREFIX) else (step.source, step.target)
        return triple_line(
            self.display(ends[0]),
            relation.removeprefix(INVERSE_PREFIX),
            self.display(ends[1]),
            self.g.config.tool.relation_format,
        )

    def relation_key(self, path_relation: str) -> str:
        """A path relation (`^rel` backwards) as plans and hops write it: the last word its triple line prints."""
        return relation_key(path_relation, self.g.config.tool.relation_format)


_HANDLE_TOKEN = re.compile(rf"\b{HANDLE_PATTERN}\b")


def shuffle_blocks(
    record: WarmupRecord, units: dict[int, tuple[list[list[str]], list[str]]], rng: random.Random, handles: set[str]
) -> WarmupRecord:
    """The record with each noted tool block's candidates in a random order (its `more:` line last) and
    handles renumbered.

    Handles (only tokens in `handles`, the ones the session gave out) are renumbered in order of
    first appearance over the whole completion, topic entities keeping E1.., so the record reads
    as if a tool that showed the candidates in this order had made it.
    """
    segments = list(record.segments)
    for index, (groups, listing) in units.items():
        order = list(groups)
        rng.shuffle(order)
        segments[index] = Segment(
            format_tool_block("\n".join([line for unit in order for line in unit] + listing)), False
        )
    mapping = {f"{HANDLE_PREFIX}{i}": f"{HANDLE_PREFIX}{i}" for i in range(1, len(record.topic_entities) + 1)}
    for segment in segments:
        for token in _HANDLE_TOKEN.findall(segment.text):
            if token in handles and token not in mapping:
                mapping[token] = f"{HANDLE_PREFIX}{len(mapping) + 1}"
    renamed = tuple(
        Segment(_HANDLE_TOKEN.sub(lambda m: mapping.get(m.group(0), m.group(0)), s.text), s.train) for s in segments
    )
    return WarmupRecord(**{**record.__dict__, "segments": renamed})


def renumber_handles(record: WarmupRecord, rng: random.Random, pool: int) -> WarmupRecord:
    """The record with every handle but the topic entities' (E1..) given a random unused number <= `pool`.

    The handles are the ones the tool blocks print; one mapping serves the whole record, so each
    search, step and answer still names the entity its line shows.
    """
    fixed = len(record.topic_entities)
    shown = sorted(
        {
            t
            for s in record.segments
            if not s.train
            for t in _HANDLE_TOKEN.findall(s.text)
            if int(t[len(HANDLE_PREFIX) :]) > fixed
        },
        key=lambda t: int(t[len(HANDLE_PREFIX) :]),
    )
    if len(shown) > pool - fixed:
        raise Skip("handle_pool_too_small")
    numbers = rng.sample(range(fixed + 1, pool + 1), len(shown))
    mapping = {t: f"{HANDLE_PREFIX}{n}" for t, n in zip(shown, numbers)}
    renamed = tuple(
        Segment(_HANDLE_TOKEN.sub(lambda m: mapping.get(m.group(0), m.group(0)), s.text), s.train)
        for s in record.segments
    )
    return WarmupRecord(**{**record.__dict__, "segments": renamed})


def relation_words(relations: Sequence[str]) -> str:
    """Relations as words for the thinking text; a mediator step joins its two with ` / `."""
    return " / ".join(humanize_relation(r) for r in relations)
