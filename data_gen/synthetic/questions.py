"""Questions over the world: relation paths asked about one topic entity, and multi-topic pairs.

The patterns are data, `patterns.yaml` beside this module: `PATTERNS` (one topic entity of a
type, a relation path, paraphrase templates with `{e}`) and `JOINT_PATTERNS` (two topic entities,
one path from each, templates with `{a}` and `{b}`). `make_questions` asks them of a built world,
answers each by executing its path(s) on the KG and assigns the splits.
"""

from __future__ import annotations

import datetime
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import yaml

from data_gen.synthetic.ontology import RELATIONS, XSD_DATE, XSD_INTEGER, inverse
from data_gen.synthetic.world import TYPE_SIZES, WorldBuilder
from kgreasoner.kg.base import execute_path
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.ids import INVERSE_PREFIX, is_literal_id, literal_value
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import Answer, QAExample, TopicEntity
from kgreasoner.records.splits import assign_splits

SOURCE = "synthetic"
MAX_ANSWERS = 10
PATTERNS_FILE = "patterns.yaml"


@dataclass(frozen=True)
class PathPattern:
    """A relation path asked about entities of type `start`, with paraphrase templates (`{e}` = topic)."""

    start: str
    path: tuple[str, ...]
    templates: tuple[str, ...]


@dataclass(frozen=True)
class JointPattern:
    """Two relation paths from topic entities of types `starts` that meet at the answers (`{a}`, `{b}` = topics)."""

    starts: tuple[str, str]
    paths: tuple[tuple[str, ...], tuple[str, ...]]
    templates: tuple[str, ...]


_STEPS = frozenset(RELATIONS) | {inverse(r) for r in RELATIONS}


def load_patterns(text: str | None = None) -> tuple[tuple[PathPattern, ...], tuple[JointPattern, ...]]:
    """The single- and multi-topic patterns of `patterns.yaml` (or of the YAML `text`), in file order.

    Raises ValueError naming the pattern when a type is not an entity type of the world, a path step
    is not one of its relations (`^` before one walks it backwards), or a template is empty or does
    not use exactly its kind's slots (`{e}`; `{a}` and `{b}`).
    """
    if text is None:
        text = resources.files(__package__).joinpath(PATTERNS_FILE).read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    if not isinstance(data, dict) or set(data) != {"single", "joint"}:
        raise ValueError(f"{PATTERNS_FILE}: the top level maps `single` and `joint` to lists of patterns")
    single = []
    for index, entry in enumerate(data["single"] or []):
        where = f"{PATTERNS_FILE}: single[{index}]"
        entry = _keys(where, entry, ("start", "path", "templates"))
        single.append(
            PathPattern(
                _types(where, [entry["start"]])[0],
                _path(where, entry["path"]),
                _templates(where, entry["templates"], ("e",)),
            )
        )
    joint = []
    for index, entry in enumerate(data["joint"] or []):
        where = f"{PATTERNS_FILE}: joint[{index}]"
        entry = _keys(where, entry, ("starts", "paths", "templates"))
        starts, paths = entry["starts"], entry["paths"]
        if not isinstance(starts, list) or len(starts) != 2 or not isinstance(paths, list) or len(paths) != 2:
            raise ValueError(f"{where}: `starts` and `paths` hold two entries each, one per topic entity")
        first, second = _types(where, starts)
        joint.append(
            JointPattern(
                (first, second),
                (_path(where, paths[0]), _path(where, paths[1])),
                _templates(where, entry["templates"], ("a", "b")),
            )
        )
    return tuple(single), tuple(joint)


def _keys(where: str, entry: Any, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(entry, dict) or set(entry) != set(keys):
        raise ValueError(f"{where}: a pattern has exactly the keys {', '.join(keys)}")
    return entry


def _types(where: str, types: list[Any]) -> list[str]:
    for kind in types:
        if kind not in TYPE_SIZES:
            raise ValueError(f"{where}: unknown entity type {kind!r}; types: {', '.join(TYPE_SIZES)}")
    return types


def _path(where: str, path: Any) -> tuple[str, ...]:
    if not isinstance(path, list) or not path:
        raise ValueError(f"{where}: a path is a non-empty list of relation ids")
    for step in path:
        if step not in _STEPS:
            raise ValueError(f"{where}: unknown relation {step!r} (`^` before a relation walks it backwards)")
    return tuple(path)


def _templates(where: str, templates: Any, slots: tuple[str, ...]) -> tuple[str, ...]:
    if not isinstance(templates, list) or not templates:
        raise ValueError(f"{where}: templates is a non-empty list of strings")
    for template in templates:
        if not isinstance(template, str) or not all("{" + slot + "}" in template for slot in slots):
            raise ValueError(f"{where}: template {template!r} must name {' and '.join('{' + s + '}' for s in slots)}")
        try:
            template.format(**{slot: "" for slot in slots})
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"{where}: template {template!r} has an unknown slot {err}; slots: {', '.join(slots)}"
            ) from None
    return tuple(templates)


PATTERNS, JOINT_PATTERNS = load_patterns()

_MONTHS = (
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
)


def literal_aliases(literal: str) -> tuple[str, ...]:
    """Other common spellings of a literal's value: dates in words, integers with thousands separators."""
    value = literal_value(literal)
    if literal.endswith(f"<{XSD_DATE}>"):
        day = datetime.date.fromisoformat(value)
        return (f"{_MONTHS[day.month - 1]} {day.day}, {day.year}", f"{day.day} {_MONTHS[day.month - 1]} {day.year}")
    if literal.endswith(f"<{XSD_INTEGER}>") and abs(int(value)) >= 1000:
        return (f"{int(value):,}",)
    return ()


def _step_starts(world: WorldBuilder) -> dict[str, np.ndarray]:
    """Path step (`rel` or `^rel`) -> the node indices that have at least one such edge."""
    starts: dict[str, list[np.ndarray]] = {}
    for relation, subjects, objects in world.chunks:
        starts.setdefault(relation, []).append(subjects)
        if isinstance(objects, np.ndarray):
            starts.setdefault(inverse(relation), []).append(objects)
    return {step: np.unique(np.concatenate(parts)) for step, parts in starts.items()}


def _unambiguous(names: list[str]) -> np.ndarray:
    """Mask of named entities whose name no other entity has, exactly or after normalisation."""
    exact = Counter(names)
    normalised = [normalize_answer(n) for n in names]
    loose = Counter(normalised)
    return np.array([exact[n] == 1 and loose[m] == 1 for n, m in zip(names, normalised)], dtype=bool)


def _make_answer(node: str, names: dict[str, str]) -> Answer:
    if is_literal_id(node):
        return Answer(id=node, name=literal_value(node), aliases=literal_aliases(node))
    return Answer(id=node, name=names[node])


def make_questions(
    world: WorldBuilder,
    ids: np.ndarray,
    names: dict[str, str],
    kg: MemoryKG,
    num_questions: int,
    seed: int,
    multi_topic_share: float = 0.0,
) -> list[QAExample]:
    """Questions balanced over 1, 2 and 3 hops, answers by executing each path on `kg`; `multi_topic_share`
    of them multi-topic (`_joint_drafts`).

    Patterns of a hop count take turns; each turn tries the pattern's next candidate topic (an
    unambiguously named entity of the right type with the path's first edge). Accepted (topic,
    path) groups get one to three paraphrases.
    """
    rng = world.rng
    starts = _step_starts(world)
    clear = _unambiguous(world.names)
    # Multi-topic questions first: the joint patterns may find fewer pairs than asked, and single ones fill in.
    joint = _joint_drafts(world, ids, names, kg, round(num_questions * multi_topic_share), clear)
    single = num_questions - len(joint)
    targets = [single // 3 + (1 if h < single % 3 else 0) for h in range(3)]
    drafts: list[tuple[str, PathPattern, str, tuple[Answer, ...]]] = []
    for hops, target in zip((1, 2, 3), targets):
        patterns = [p for p in PATTERNS if len(p.path) == hops]
        queues = []
        for pattern in patterns:
            typed = world.ranges[pattern.start]
            candidates = np.intersect1d(typed, starts.get(pattern.path[0], np.empty(0, np.int64)))
            queues.append(rng.permutation(candidates[clear[candidates]]).tolist())
        cursors = [0] * len(patterns)
        made = 0
        while made < target and any(c < len(q) for c, q in zip(cursors, queues)):
            for k, pattern in enumerate(patterns):
                if made >= target or cursors[k] >= len(queues[k]):
                    continue
                topic = ids[queues[k][cursors[k]]]
                cursors[k] += 1
                reached = execute_path(kg, topic, pattern.path)
                reached.discard(topic)
                if not 0 < len(reached) <= MAX_ANSWERS:
                    continue
                answers = tuple(sorted((_make_answer(x, names) for x in reached), key=lambda a: (a.name, a.id)))
                count = min(target - made, int(rng.integers(1, min(3, len(pattern.templates)) + 1)))
                for t in rng.permutation(len(pattern.templates))[:count].tolist():
                    drafts.append((topic, pattern, pattern.templates[t], answers))
                made += count
    order = rng.permutation(len(drafts) + len(joint)).tolist()
    examples = []
    for n, i in enumerate(order):
        common = dict(id=f"{SOURCE}-{seed}-{n:05d}", source=SOURCE)
        if i >= len(drafts):
            topics, pair, template, answers = joint[i - len(drafts)]
            examples.append(
                QAExample(
                    question=template.format(a=names[topics[0]], b=names[topics[1]]),
                    topic_entities=tuple(TopicEntity(id=t, name=names[t]) for t in topics),
                    answers=answers,
                    gold_paths=pair.paths,
                    hops=max(map(len, pair.paths)),
                    intersect=True,
                    **common,
                )
            )
            continue
        topic, pattern, template, answers = drafts[i]
        examples.append(
            QAExample(
                question=template.format(e=names[topic]),
                topic_entities=(TopicEntity(id=topic, name=names[topic]),),
                answers=answers,
                gold_paths=(pattern.path,),
                hops=len(pattern.path),
                **common,
            )
        )
    return assign_splits(examples, "grouped", seed=seed)


def _backwards(path: Sequence[str]) -> tuple[str, ...]:
    """The path walked from its end back to its start."""
    return tuple(r[len(INVERSE_PREFIX) :] if r.startswith(INVERSE_PREFIX) else inverse(r) for r in reversed(path))


def _joint_drafts(
    world: WorldBuilder, ids: np.ndarray, names: dict[str, str], kg: MemoryKG, count: int, clear: np.ndarray
) -> list[tuple[tuple[str, str], JointPattern, str, tuple[Answer, ...]]]:
    """`count` multi-topic drafts, the joint patterns taking turns.

    Each turn draws a first topic with the first path's first edge, then tries, in a seeded order,
    the second topics that reach one of its answers by the second path; the first pair whose
    common answers are at most MAX_ANSWERS and fewer than either path's own answers is kept.
    """
    if count == 0:  # draws nothing from the world's generator: without them the questions are as they always were
        return []
    rng = world.rng
    starts = _step_starts(world)
    unambiguous = {ids[i] for i in np.flatnonzero(clear).tolist()}
    typed = {kind: set(ids[world.ranges[kind]].tolist()) for pattern in JOINT_PATTERNS for kind in pattern.starts}
    queues = []
    for pattern in JOINT_PATTERNS:
        firsts = np.intersect1d(
            world.ranges[pattern.starts[0]], starts.get(pattern.paths[0][0], np.empty(0, np.int64))
        )
        queues.append(rng.permutation(firsts[clear[firsts]]).tolist())
    cursors = [0] * len(JOINT_PATTERNS)
    drafts: list[tuple[tuple[str, str], JointPattern, str, tuple[Answer, ...]]] = []
    while len(drafts) < count and any(c < len(q) for c, q in zip(cursors, queues)):
        for k, pattern in enumerate(JOINT_PATTERNS):
            if len(drafts) >= count or cursors[k] >= len(queues[k]):
                continue
            first = ids[queues[k][cursors[k]]]
            cursors[k] += 1
            reached = sorted(execute_path(kg, first, pattern.paths[0]) - {first})
            if not reached:
                continue
            seconds = sorted(
                {
                    t
                    for meeting in reached
                    for t in execute_path(kg, meeting, _backwards(pattern.paths[1]))
                    if t in typed[pattern.starts[1]] and t in unambiguous and t != first
                }
            )
            for index in rng.permutation(len(seconds)).tolist():
                second = seconds[index]
                other = execute_path(kg, second, pattern.paths[1]) - {second}
                both = set(reached) & other
                if 0 < len(both) <= MAX_ANSWERS and both != set(reached) and both != other:
                    answers = tuple(sorted((_make_answer(x, names) for x in both), key=lambda a: (a.name, a.id)))
                    template = pattern.templates[int(rng.integers(len(pattern.templates)))]
                    drafts.append(((first, second), pattern, template, answers))
                    break
    return drafts
