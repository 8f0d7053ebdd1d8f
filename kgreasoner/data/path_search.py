"""Candidate gold relation paths for questions that come without them (`--data PATH`).

Warm-up trajectories, ranker labels, the oracle and the `grouped` split all read `gold_paths`.
A dataset that gives only topic entities and answers gets them here: a breadth-first search over
relation paths from the topic entity, both edge directions (`^rel` walks an edge backwards, as
in `kgreasoner.kg.base`), one hop more per level, stopping at the first level where some path
reaches an answer. Only paths of that shortest length are kept, the most precise first
(precision = answers among the nodes the path reaches; ties: fewer backward steps, then by name,
so a marriage is walked `spouse_s, spouse` rather than backwards); longer paths that also reach an answer
are mostly coincidences (two people who share a hub country) and would teach wrong relations.

A node counts as an answer when its id is an answer id or its label, normalised, is one of the
answers' surface forms (so literal values and name-only answers match). The topic entity counts
only when it is itself a gold answer (PathQuestion asks "the child of X's parent" meaning X);
otherwise a path through a marriage, which leads back to it, would always hit. Paths whose node set grows past
`max_branch` (fan-out through a hub) are not extended further; they stay candidates at their own
length only.

RoG's subgraph datasets come without paths too; there each question is searched on its own
subgraph (`kg.for_example(id)`), on demand (`with_derived_paths`), by the warm-up, the ranker's
labels and `kgreasoner eval`.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from tqdm import tqdm

from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.records.ids import INVERSE_PREFIX
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import QAExample, hops_fit


@dataclass(frozen=True)
class PathSearch:
    """Limits of the search (fields of `kgreasoner prepare-data` and of the demo's data stage)."""

    max_hops: int = field(default=3, metadata={"help": "longest relation path searched"})
    max_paths: int = field(default=3, metadata={"help": "candidate paths kept per question (the most precise first)"})
    max_branch: int = field(default=200, metadata={"help": "a path reaching more nodes than this is not extended"})
    neighbor_limit: int | None = field(default=10000, metadata={"help": "edges fetched per node"})

    def __post_init__(self) -> None:
        if self.max_hops < 1 or self.max_paths < 1 or self.max_branch < 1:
            raise ValueError("max_hops, max_paths and max_branch must be >= 1")
        if self.neighbor_limit is not None and self.neighbor_limit < 1:
            raise ValueError("neighbor_limit must be >= 1 or None")


def find_paths(kg: KnowledgeGraph, example: QAExample, search: PathSearch = PathSearch()) -> list[tuple[str, ...]]:
    """The shortest relation paths from the example's first topic entity to any of its answers.

    A multi-topic example (`intersect`) gets one path per topic entity, in their order: each
    topic's most precise shortest path to the answers (the answers are what every path reaches);
    none at all when some topic has none.
    """
    if example.intersect:
        paths = []
        for topic in example.topic_entities:
            found = _paths_from(kg, topic.id, example, search)
            if not found:
                return []
            paths.append(found[0])
        return paths
    return _paths_from(kg, example.topic_entities[0].id, example, search)


def _paths_from(kg: KnowledgeGraph, start: str, example: QAExample, search: PathSearch) -> list[tuple[str, ...]]:
    answer_ids = {a.id for a in example.answers}
    forms = {normalize_answer(f) for a in example.answers for f in a.surface_forms()}
    labels: dict[str, bool] = {}
    edges: dict[str, list] = {}

    def is_answer(node: str) -> bool:
        if node in answer_ids:
            return True
        if node not in labels:
            labels[node] = normalize_answer(kg.label(node)) in forms
        return labels[node]

    keep_start = is_answer(start)
    level: dict[tuple[str, ...], set[str]] = {(): {start}}
    for _ in range(search.max_hops):
        reached: dict[tuple[str, ...], set[str]] = {}
        for path, nodes in level.items():
            for node in sorted(nodes):
                if node not in edges:
                    edges[node] = kg.neighbors(node, "both", limit=search.neighbor_limit)
                for edge in edges[node]:
                    reached.setdefault(path + (edge.path_relation,), set()).add(edge.neighbor)
        scored = []
        for path, nodes in reached.items():
            if not keep_start:
                nodes.discard(start)
            hits = sum(1 for n in nodes if is_answer(n))
            if hits:
                backwards = sum(r.startswith(INVERSE_PREFIX) for r in path)
                scored.append((-hits / len(nodes), backwards, path))
        if scored:
            return [path for *_, path in sorted(scored)[: search.max_paths]]
        level = {p: n for p, n in reached.items() if n and len(n) <= search.max_branch}
        if not level:
            break
    return []


@dataclass
class PathReport:
    """What `add_gold_paths` did, for the data stage's summary."""

    given: int = 0
    derived: int = 0
    not_found: int = 0
    derived_lengths: Counter[int] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        return {
            "given": self.given,
            "derived": self.derived,
            "not_found": self.not_found,
            "derived_by_length": {str(k): v for k, v in sorted(self.derived_lengths.items())},
        }


def add_gold_paths(
    examples: Sequence[QAExample], kg: KnowledgeGraph, search: PathSearch = PathSearch()
) -> tuple[list[QAExample], PathReport]:
    """Examples without gold paths get the shortest candidates `find_paths` finds (and `hops` their
    length when it was 0); examples with paths are kept as they are, as are those with none found."""
    report = PathReport()
    out = []
    for example in tqdm(examples, desc="searching gold paths", unit="question", disable=None):
        if example.gold_paths:
            report.given += 1
            out.append(example)
            continue
        paths = find_paths(kg, example, search)
        if not paths:
            report.not_found += 1
            out.append(example)
            continue
        report.derived += 1
        derived = _with_paths(example, paths)
        report.derived_lengths[derived.hops] += 1
        out.append(derived)
    return out, report


def with_derived_paths(example: QAExample, kg: KnowledgeGraph, search: PathSearch = PathSearch()) -> QAExample:
    """The example with the paths `find_paths` finds on its own subgraph when it has none and `kg`
    is per question (`kg.per_question`: RoG's subgraphs); otherwise (or when none is found) as it is.

    One question at a time, when a command reaches it: loading RoG's records stays as fast as
    any other dataset's, and a warm-up that takes 500 of CWQ's 27,639 training questions searches
    about those only. A shared KG's questions get theirs once, from `kgreasoner prepare-data`:
    searching a whole KG (Freebase over SPARQL) on every run would be slow.
    """
    if example.gold_paths or not kg.per_question:
        return example
    paths = find_paths(kg.for_example(example.id), example, search)
    return _with_paths(example, paths) if paths else example


def _with_paths(example: QAExample, paths: list[tuple[str, ...]]) -> QAExample:
    """The example with derived `paths`, and `hops` their length where it had none or one they do not
    walk (a multi-topic example's: its longest path's)."""
    hops = max(map(len, paths)) if example.intersect else len(paths[0])
    # A given count the derived paths do not walk would make a file its own reader refuses.
    kept = example.hops if hops_fit(example.hops, paths, example.intersect) else 0
    return QAExample(**{**example.__dict__, "gold_paths": tuple(paths), "hops": kept or hops})
