"""Failure categories of wrong answers, read from the trace of a search trajectory.

Every wrong answer (Hits@1 = 0) whose trace carries the search record below gets exactly one
category: the first rule that holds. Correct answers get none (`failure` is null), and so do the
records of methods whose traces lack the record (the pipeline baselines); the summary counts
those wrong answers as `uncategorised`.

The search record (`search_trace`, written by the kgreasoner method): the trajectory
summary (`text`, `finish_reason`, `error`, `answers` as written, `tool_calls` with `query`,
`error`, `entity`, `backtracked`) plus
- per tool call, `shown`: the triples it showed (its `ToolCall.edges`) as `[from, relation, to]`
  steps read from the searched side (`^rel` for an edge walked backwards, as gold paths write it; a
  mediator candidate gives two steps, the second one from the mediator). A tool block the engine cut
  keeps the triples whose two labels are printed in the part the model read; a call that failed
  (exception, timeout) showed nothing;
- `entities`: `[id, handle, label]` of the topic entities and every entity shown (the calls'
  `ToolCall.labels`), in order of appearance (handle "" when handles are off).

The model's path. The calls are replayed as a walk; each search moves the model to the entity
the tool resolved:
- to entity e from the deepest entity p of the current path whose searches showed e: a triple
  (p, r, e) is the relation `r`, a mediator candidate p -> m -> e the relations `r1, r2`; several
  triples linking p and e are alternatives. Otherwise a topic entity starts a new path, and an
  entity shown only from off the path continues the path its shower had when last searched
  (a searched entity that was never shown in what the model read starts a path of its own);
- `NAME | backtrack` moves back to the entity whose next candidates the tool showed;
- the answer is placed the same way after the last call. It is the first `<answer>` part (what
  Hits@1 scores), resolved as the tool resolves names: a handle, an id, an exact label, then a
  normalised label; among entities sharing that label, the one whose path agrees best with gold
  (the latest shown on a tie).
Agreement of a path with the gold paths: its relations (alternatives chosen to agree longest)
compared with each gold path; exact when equal to one, else the longest common prefix.

Rules, in order. Why this order: a row without an answer is explained by how it stopped, and a
copy failure comes first there because an unknown name is what sends a model into a loop; an
answer is then checked against what was shown, and a namesake goes before the relation check
because an ambiguous name, not the model's choice of triple, diverted the walk.
1. `invalid_format`: no answer, and the row stopped for a protocol reason rather than a limit
   (end of sequence without an answer, an empty answer block, `</search>` without `<search>`),
   or it reached a limit without ever writing `<think>` (it never entered the protocol).
   Detail: `finish_reason`, `errors` (check_format's). A row that answered is judged on its
   answer even when check_format rejects its layout (the record's `format_valid` says so).
2. `copy_failure`: a search named an entity that is neither a topic entity nor shown (the tool
   answered `unknown_entity`): a misspelt or memorised name, an unseen handle. Detail: the first
   such `call` (1-based) and its `query`.
3. `loop_or_turn_limit`: no answer within the limits (finish reason `max_turns` or
   `max_tokens`). Detail: `finish_reason`, `tool_calls`, `repeated` (the most repeated query
   and how often, when one was written at least twice; else null).
4. `other`, reason `rollout_error`: no answer because the backend failed. Detail: `error`.
5. `answer_not_in_context`: the answer names no entity the model was shown (topic entities and
   tool output). Detail: `answer`.
6. `other`, reason `no_gold_path`: the example has no gold path to compare with.
7. `data_ambiguity`, kind `namesake`: a search on the answer's path was written as a name (not a
   handle or an id; of a filtered search `NAME | REL`, its NAME part) that, normalised, another shown
   entity's label matches too (a name several entities bear exactly the tool answers with all of them,
   for the model to pick by handle or id; one that only a normalised label shares, it takes as
   written), and with that namesake in its place (the later relations kept) the path agrees with gold
   on more hops. Detail: `call`, `query`, `chosen`, `namesake` (ids), `path`, `path_with_namesake`.
8. `wrong_relation`: the path equals no gold path. At hop k (1-based, counting relations; the
   first k-1 agree with a gold path) the model followed `taken` where the gold paths that agree
   so far have `gold` (a list). `taken` is null when the model answered before hop k, `gold` is
   empty when it went past the end of those gold paths. Detail also: `path` (relations),
   `entities` (labels along the walk, from its start) and `gold_shown`: whether a search had shown
   a `gold` relation from the entity where the walk left the gold path (true: the model chose
   another line or stopped; false: no search showed the right line there, because the tool's
   ranking or page cut it or because the model never searched that entity).
9. `data_ambiguity`, kind `other_object`: the path equals a gold path but ends at an entity that
   is not a gold answer (another object of the right relations); kind `gold_label` when that
   entity is a gold answer's id whose label matches none of the gold names. Detail: `path`,
   `answer`, `answer_id`, and given a KG, `gold_path_reaches` (entities the gold path reaches
   from the walk's start) and `reached_by_gold_path`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kgreasoner.kg.base import KnowledgeGraph, execute_path
from kgreasoner.protocol import (
    SEARCH_CLOSE,
    THINK_OPEN,
    TRIPLES_CLOSE,
    check_format,
    is_handle,
    last_open_search,
    split_relation_filter,
    split_search_query,
)
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import QAExample, TopicEntity

if TYPE_CHECKING:
    from kgreasoner.retrieval.tool import SearchSession
    from kgreasoner.rollout.types import Trajectory

CATEGORIES = (
    "wrong_relation",
    "copy_failure",
    "data_ambiguity",
    "loop_or_turn_limit",
    "invalid_format",
    "answer_not_in_context",
    "other",
)
"""Every category (in the order of the issue's list; the rules apply in the docstring's order)."""

TITLES = {
    "wrong_relation": "wrong relation",
    "copy_failure": "copy failure",
    "data_ambiguity": "data ambiguity",
    "loop_or_turn_limit": "loop / turn limit",
    "invalid_format": "invalid format",
    "answer_not_in_context": "answer not in context",
    "other": "other",
}

LIMIT_REASONS = ("max_turns", "max_tokens")

TRACE_FIELDS = ("text", "finish_reason", "answers", "tool_calls", "entities")

Relations = tuple[str, ...]


def search_trace(
    trajectory: Trajectory, session: SearchSession, topic_entities: Sequence[TopicEntity]
) -> dict[str, Any]:
    """The trajectory's summary with the search record (module docstring): `shown` per call from its
    `ToolCall.edges`, `entities` from the topic entities and the calls' `ToolCall.labels`, with the
    handles of `session`, the row's session."""
    summary: dict[str, Any] = trajectory.summary()
    labels = {topic.id: session.label_of(topic.id) or topic.name for topic in topic_entities}
    for call, record in zip(trajectory.tool_calls, summary["tool_calls"]):
        for entity, label in call.labels.items():
            labels.setdefault(entity, label)
        steps: list[list[str]] = []
        for edge in call.edges:
            step = [edge.subject if edge.direction == "out" else edge.object, edge.path_relation, edge.neighbor]
            if step not in steps:  # a mediator's first edge comes once per candidate beyond it
                steps.append(step)
        record["shown"] = steps
    summary["entities"] = [[e, session.handle_of(e), label] for e, label in labels.items()]
    return summary


def has_search_record(trace: Any) -> bool:
    """True when `trace` carries what the categories are computed from."""
    return (
        isinstance(trace, dict)
        and all(k in trace for k in TRACE_FIELDS)
        and all(isinstance(c, dict) and "shown" in c for c in trace["tool_calls"])
    )


def classify_failure(
    example: QAExample, trace: Any, correct: bool, kg: KnowledgeGraph | None = None
) -> dict[str, Any] | None:
    """`{"category", "detail"}` of a wrong answer (module docstring); None when correct or untraced."""
    if correct or not has_search_record(trace):
        return None
    category, detail = _classify(example, trace, kg)
    return {"category": category, "detail": detail}


@dataclass(frozen=True)
class _Node:
    """One entity of the walk and the ways the previous entity led to it (none at the start)."""

    entity: str
    links: tuple[Relations, ...]


def _leaving(path: Sequence[_Node], relations: Relations, k: int, calls: Sequence[dict[str, Any]]) -> set[str]:
    """Where the walk left the gold path: the entities its first `k` relations reach.

    The last walk node reached by at most `k` relations, then (inside a mediator step) along the
    shown triples with the remaining ones.
    """
    at, offset = path[0].entity, 0
    for node in path[1:]:
        step = next((alt for alt in node.links if relations[offset : offset + len(alt)] == alt), None)
        if step is None or offset + len(step) > k:
            break
        offset += len(step)
        at = node.entity
    reached = {at}
    for relation in relations[offset:k]:
        reached = {s[2] for call in calls for s in call["shown"] if s[0] in reached and s[1] == relation}
    return reached


@dataclass(frozen=True)
class _Search:
    call: int
    query: str
    entity: str
    namesakes: tuple[tuple[str, tuple[_Node, ...]], ...]
    """Earlier-shown entities with the chosen one's label, each with the path it would have had."""


@dataclass(frozen=True)
class _Match:
    exact: bool
    agree: int
    relations: Relations
    """The path's relations, alternatives chosen to agree with `gold` as long as they can."""

    def key(self) -> tuple[bool, int]:
        return (self.exact, self.agree)


def _classify(example: QAExample, trace: dict[str, Any], kg: KnowledgeGraph | None) -> tuple[str, dict[str, Any]]:
    calls, finish, answers = trace["tool_calls"], trace["finish_reason"], trace["answers"]
    protocol_stop = finish in ("eos", "answer") or (finish == "error" and _orphan_search_close(trace["text"]))
    if not answers and (protocol_stop or (finish in LIMIT_REASONS and THINK_OPEN not in trace["text"])):
        return "invalid_format", {
            "finish_reason": finish,
            "errors": check_format(trace["text"], trace.get("tool_spans")).errors,
        }
    for index, call in enumerate(calls, 1):
        if call.get("error") == "unknown_entity":
            return "copy_failure", {"call": index, "query": call["query"]}
    if finish in LIMIT_REASONS:
        counts = Counter(call["query"].strip() for call in calls)
        query, times = counts.most_common(1)[0] if counts else ("", 0)
        repeated = {"query": query, "times": times} if times >= 2 else None
        return "loop_or_turn_limit", {"finish_reason": finish, "tool_calls": len(calls), "repeated": repeated}
    if not answers:
        return "other", {"reason": "rollout_error", "error": trace.get("error")}

    golds = [tuple(path) for path in example.gold_paths]
    walk = _Walk(trace, [t.id for t in example.topic_entities])
    placed = [(e, path) for e in walk.resolve(answers[0]) if (path := walk.place(e)) is not None]
    if not placed:
        return "answer_not_in_context", {"answer": answers[0]}
    if not golds:
        return "other", {"reason": "no_gold_path"}
    answer, path = placed[0]
    best = _match(path, golds)
    for entity, candidate in placed[1:]:
        match = _match(candidate, golds)
        if match.key() > best.key():
            answer, path, best = entity, candidate, match

    namesake = _namesake(walk, path, best, golds)
    if namesake is not None:
        return "data_ambiguity", namesake
    if not best.exact:
        k = best.agree
        taken = best.relations[k] if k < len(best.relations) else None
        gold = list(dict.fromkeys(g[k] for g in golds if len(g) > k and g[:k] == best.relations[:k]))
        left_from = _leaving(path, best.relations, k, calls)
        shown = any(step[0] in left_from and step[1] in gold for call in calls for step in call["shown"])
        return "wrong_relation", {
            "hop": k + 1,
            "taken": taken,
            "gold": gold,
            "path": list(best.relations),
            "entities": [walk.label(n.entity) for n in path],
            "gold_shown": shown,
        }
    gold_ids = {a.id for a in example.answers}
    detail: dict[str, Any] = {
        "kind": "gold_label" if answer in gold_ids else "other_object",
        "path": list(best.relations),
        "answer": walk.label(answer),
        "answer_id": answer,
    }
    if kg is not None:
        reached = execute_path(kg.for_example(example.id), path[0].entity, best.relations)
        detail["gold_path_reaches"] = len(reached)
        detail["reached_by_gold_path"] = answer in reached
    return "data_ambiguity", detail


def _orphan_search_close(text: str) -> bool:
    """The text ends with `</search>` that has no `<search>` in its turn (the engine's malformed call)."""
    turn = text[text.rfind(TRIPLES_CLOSE) + len(TRIPLES_CLOSE) :] if TRIPLES_CLOSE in text else text
    turn = turn.rstrip()
    return turn.endswith(SEARCH_CLOSE) and last_open_search(turn) is None


class _Walk:
    """The trace's calls replayed as a walk (module docstring, "The model's path")."""

    def __init__(self, trace: dict[str, Any], topics: Sequence[str]) -> None:
        self.topics = set(topics)
        self.labels = {e: label for e, _, label in trace["entities"]}
        self.by_handle = {h: e for e, h, _ in trace["entities"] if h}
        self.latest_first = [e for e, _, _ in reversed(trace["entities"])]
        self.links: dict[tuple[str, str], list[Relations]] = {}
        self.showers: dict[str, list[str]] = {}
        self.seen: set[str] = set(self.topics)
        self.path: list[_Node] = []
        self.placed: dict[str, list[_Node]] = {}
        self.searches: list[_Search] = []
        for index, call in enumerate(trace["tool_calls"], 1):
            self._replay(index, call)

    def label(self, entity: str) -> str:
        return self.labels.get(entity, entity)

    def resolve(self, text: str) -> list[str]:
        """Entities the answer text names, latest shown first (the tool's order of rules)."""
        text = text.strip()
        head = text.split(maxsplit=1)[0] if text else ""
        if is_handle(head) and head in self.by_handle:
            return [self.by_handle[head]]
        if text in self.labels:
            return [text]
        exact = [e for e in self.latest_first if self.labels[e] == text]
        if exact:
            return exact
        wanted = normalize_answer(text)
        return [e for e in self.latest_first if wanted and normalize_answer(self.labels[e]) == wanted]

    def written_name(self, query: str, entity: str) -> str:
        """The name part of a search, read as the tool reads it: the whole text when it names `entity`, else the
        part before a relation filter (`NAME | REL`)."""
        name, _ = split_search_query(query)
        parts = split_relation_filter(name)
        if parts is not None and entity not in self.resolve(name):
            return parts[0]
        return name

    def place(self, entity: str) -> list[_Node] | None:
        """The path after moving to `entity` now; None when it was never shown to the model."""
        for depth in range(len(self.path) - 1, -1, -1):
            shower = self.path[depth].entity
            if shower != entity and (shower, entity) in self.links:
                return self.path[: depth + 1] + [_Node(entity, tuple(self.links[(shower, entity)]))]
        if entity in self.topics:
            return [_Node(entity, ())]
        for shower in reversed(self.showers.get(entity, [])):
            if shower != entity:
                base = self.placed.get(shower) or [_Node(shower, ())]
                return base + [_Node(entity, tuple(self.links[(shower, entity)]))]
        return None

    def _replay(self, index: int, call: dict[str, Any]) -> None:
        entity = call.get("entity")
        if entity is None:
            return
        if call.get("backtracked"):
            if call.get("error") is None:  # the tool showed the next candidates of `entity`
                on_path = [n.entity for n in self.path]
                if entity in on_path:
                    self.path = self.path[: len(on_path) - on_path[::-1].index(entity)]
                else:
                    self.path = self.placed.get(entity) or self.place(entity) or [_Node(entity, ())]
        else:
            name = self.written_name(call["query"], entity)
            head = name.split(maxsplit=1)[0] if name else ""
            namesakes: list[tuple[str, tuple[_Node, ...]]] = []
            if not (is_handle(head) and head in self.by_handle) and name != entity:
                wanted = normalize_answer(self.label(entity))
                for other in self.latest_first:
                    if other != entity and other in self.seen and normalize_answer(self.label(other)) == wanted:
                        other_path = self.place(other)
                        if other_path is not None:
                            namesakes.append((other, tuple(other_path)))
            self.path = self.place(entity) or [_Node(entity, ())]
            self.placed[entity] = self.path
            self.searches.append(_Search(index, call["query"], entity, tuple(namesakes)))
        self._add(entity, call.get("shown") or [])

    def _add(self, shower: str, steps: Sequence[Sequence[str]]) -> None:
        found: dict[str, list[Relations]] = {}
        for source, relation, target in steps:
            if source == shower:
                found.setdefault(target, []).append((relation,))
        for source, relation, target in steps:
            if source != shower:  # the step beyond a mediator the shower leads to
                for first in list(found.get(source, [])):
                    if len(first) == 1:
                        found.setdefault(target, []).append((first[0], relation))
            self.seen.update((source, target))
        for target, ways in found.items():
            links = self.links.setdefault((shower, target), [])
            links.extend(w for w in ways if w not in links)
            self.showers.setdefault(target, []).append(shower)


def _match(path: Sequence[_Node], golds: Sequence[Relations]) -> _Match:
    """The best agreement of the path with any gold path (exact first, then the longest prefix)."""
    steps = [node.links for node in path[1:]]
    best: _Match | None = None
    for gold in golds:
        for match in _follow(steps, gold):
            if best is None or match.key() > best.key():
                best = match
    assert best is not None  # golds is never empty here
    return best


def _follow(steps: Sequence[tuple[Relations, ...]], gold: Relations) -> Iterator[_Match]:
    """Agreements of every choice of alternatives, branching only while they match `gold`."""

    def go(j: int, taken: Relations) -> Iterator[_Match]:
        position = len(taken)
        if j == len(steps):
            yield _Match(position == len(gold), position, taken)
            return
        for way in steps[j]:
            if gold[position : position + len(way)] == way:
                yield from go(j + 1, taken + way)
            else:
                common = next(
                    (i for i, (a, b) in enumerate(zip(way, gold[position:])) if a != b),
                    min(len(way), len(gold) - position),
                )
                rest = tuple(r for ways in steps[j + 1 :] for r in ways[0])
                yield _Match(False, position + common, taken + way + rest)

    yield from go(0, ())


def _namesake(walk: _Walk, path: Sequence[_Node], best: _Match, golds: Sequence[Relations]) -> dict[str, Any] | None:
    entities = [n.entity for n in path]
    for search in walk.searches:
        if search.entity not in entities or not search.namesakes:
            continue
        at = len(entities) - 1 - entities[::-1].index(search.entity)
        for other, other_path in search.namesakes:
            rest = path[at + 1 :]
            swapped = _match(list(other_path) + list(rest), golds)
            if swapped.key() > best.key():
                return {
                    "kind": "namesake",
                    "call": search.call,
                    "query": search.query,
                    "chosen": search.entity,
                    "namesake": other,
                    "path": list(best.relations),
                    "path_with_namesake": list(swapped.relations),
                }
    return None


def summarize_failures(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts of the categories over wrong answers, the uncategorised ones, wrong relations by hop and unshown gold."""
    counts = {category: 0 for category in CATEGORIES}
    by_hop: Counter[int] = Counter()
    uncategorised = not_shown = 0
    for record in records:
        if float(record["hits1"]) == 1.0:
            continue
        failure = record.get("failure")
        if failure is None:
            uncategorised += 1
            continue
        counts[failure["category"]] += 1
        if failure["category"] == "wrong_relation":
            by_hop[int(failure["detail"]["hop"])] += 1
            not_shown += failure["detail"].get("gold_shown") is False
    return {
        "counts": counts,
        "uncategorised": uncategorised,
        "wrong_relation_by_hop": {str(h): by_hop[h] for h in sorted(by_hop)},
        "wrong_relation_gold_not_shown": not_shown,
    }


def failure_table(summaries: dict[str, dict[str, Any]]) -> list[str]:
    """Markdown lines of the failure table; none when no method has a categorised wrong answer."""
    rows = {name: s["failures"] for name, s in summaries.items() if s.get("failures")}
    if not any(sum(f["counts"].values()) for f in rows.values()):
        return []
    lines = [
        "",
        "Wrong answers by failure category (kgreasoner/evaluation/failures.py; wrong relation by hop, "
        "and how often the tool never showed a gold relation there, in parentheses):",
        "",
        "| method | wrong | " + " | ".join(TITLES[c] for c in CATEGORIES) + " | uncategorised |",
        "|---|---|" + "---|" * (len(CATEGORIES) + 1),
    ]
    for name, f in rows.items():
        cells = [str(f["counts"][c]) for c in CATEGORIES]
        if f["wrong_relation_by_hop"]:
            hops = ", ".join(f"hop {h}: {n}" for h, n in f["wrong_relation_by_hop"].items())
            missed = f.get("wrong_relation_gold_not_shown", 0)
            cells[CATEGORIES.index("wrong_relation")] += f" ({hops}; gold not shown: {missed})"
        wrong = sum(f["counts"].values()) + f["uncategorised"]
        lines.append(f"| {name} | {wrong} | " + " | ".join(cells) + f" | {f['uncategorised']} |")
    return lines
