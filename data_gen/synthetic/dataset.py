"""A synthetic dataset: `generate` builds the world and asks its questions, deterministically per seed;
`write_synthetic` and `write_data` write it as a dataset folder (`kb.tsv`, `names.tsv`, `questions.jsonl`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from data_gen.synthetic.questions import make_questions
from data_gen.synthetic.world import MID_SPACE, WorldBuilder, build_world, make_mids, scale_for
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.ids import INVERSE_PREFIX, is_literal_id
from kgreasoner.records.schema import QAExample, write_jsonl

DEFAULT_QUESTIONS = 3000
DEFAULT_MULTI_TOPIC_SHARE = 0.1


@dataclass
class SyntheticData:
    """A generated world and its questions.

    Attributes:
        subjects, relations, objects: the triples as three equal-length object arrays of ids.
        names: id -> label of every named entity (mediators and literals have none).
        examples: the questions, splits assigned (grouped scheme, seeded).
        nodes_by_type: entity type (`person`, `city`, ...) or mediator kind (`people.marriage`,
            `film.performance`, ...) -> the ids of its nodes (every one has an edge).
        mediator_kinds: the keys of `nodes_by_type` that are mediator kinds.
        seed, scale: what the world was generated from (`scale_for`).
    """

    subjects: np.ndarray
    relations: np.ndarray
    objects: np.ndarray
    names: dict[str, str]
    examples: list[QAExample]
    nodes_by_type: dict[str, list[str]] = field(default_factory=dict)
    mediator_kinds: tuple[str, ...] = ()
    seed: int = 0
    scale: float = 1.0

    @property
    def num_triples(self) -> int:
        return len(self.subjects)

    def triples(self) -> Iterator[tuple[str, str, str]]:
        return zip(self.subjects.tolist(), self.relations.tolist(), self.objects.tolist())

    def kg(self) -> MemoryKG:
        """The world as an embedded KG (mediators unnamed, literals flagged)."""
        return MemoryKG(self.subjects, self.relations, self.objects, self.names)

    def stats(self) -> dict[str, object]:
        """Sizes worth printing: triples, node kinds, hubs, questions per hop, splits, backward steps."""
        degrees = pd.Series(np.concatenate([self.subjects, self.objects])).value_counts(sort=False)
        nodes = degrees.index.to_numpy(dtype=object)
        literal = np.fromiter((is_literal_id(x) for x in nodes), dtype=bool, count=len(nodes))
        degrees = degrees.to_numpy()
        top = int(np.argmax(degrees))
        steps = [r for e in self.examples for r in e.gold_paths[0]]
        return {
            "triples": self.num_triples,
            "relation_types": len(set(self.relations.tolist())),
            "named_entities": len(self.names),
            "mediators": sum(len(self.nodes_by_type[kind]) for kind in self.mediator_kinds),
            "literals": int(literal.sum()),
            "max_degree": int(degrees[top]),
            "max_degree_entity": f"{nodes[top]} ({self.names.get(str(nodes[top]), '?')})",
            "nodes_with_degree_200+": int((degrees >= 200).sum()),
            "questions": len(self.examples),
            "questions_by_hops": dict(sorted(Counter(e.hops for e in self.examples).items())),
            "splits": dict(Counter(e.split for e in self.examples)),
            "backward_step_share": round(sum(r.startswith(INVERSE_PREFIX) for r in steps) / max(1, len(steps)), 3),
        }


def _materialise(world: WorldBuilder, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The edge chunks as id triples in chunk order, each distinct triple once.

    Independent draws (a co-director, a second genre, a second parent) may repeat an edge.
    """
    subjects = np.concatenate([ids[s] for _, s, _ in world.chunks])
    relations = np.concatenate([np.full(len(s), r, dtype=object) for r, s, _ in world.chunks])
    objects = np.concatenate(
        [ids[o] if isinstance(o, np.ndarray) else np.asarray(o, dtype=object) for _, _, o in world.chunks]
    )
    keep = ~pd.DataFrame({"s": subjects, "r": relations, "o": objects}).duplicated().to_numpy()
    return subjects[keep], relations[keep], objects[keep]


def generate(
    seed: int = 0,
    num_entities: int | None = None,
    target_triples: int | None = None,
    num_questions: int = DEFAULT_QUESTIONS,
    multi_topic_share: float = DEFAULT_MULTI_TOPIC_SHARE,
) -> SyntheticData:
    """Generate the world and its questions, deterministically from `seed`.

    Args:
        seed: everything (names, edges, mids, questions, splits) follows from it.
        num_entities: about this many named entities (default: about 2,800). The world is
            sized for this many; the few drawn with no edge at all (an unused time zone, say)
            are left out, up to 3% in the smallest worlds, under 1% from the default size up.
        target_triples: at least this many triples (default: about 20k); when both are given
            the larger world wins.
        num_questions: how many questions, a third per hop count (fewer when the world has too
            few distinct (topic, path) groups, as tiny worlds may).
        multi_topic_share: the share of them that are multi-topic (two topic entities, answers
            the intersection of their paths); the rest are balanced over hop counts.
    """
    if num_questions < 0:
        raise ValueError(f"num_questions must be >= 0, got {num_questions}")
    if not 0.0 <= multi_topic_share <= 1.0:
        raise ValueError(f"multi_topic_share must be in [0, 1], got {multi_topic_share}")
    scale = scale_for(num_entities, target_triples)
    while True:
        rng = np.random.default_rng(seed)
        world = build_world(rng, scale)
        ids = make_mids(world.num_nodes, int(rng.integers(MID_SPACE)))
        subjects, relations, objects = _materialise(world, ids)
        if target_triples is None or len(subjects) >= target_triples:
            break
        scale *= 1.02 * target_triples / len(subjects)  # rare: the estimate fell short; grow and redo
    # A few drawn entities (a time zone no city chose, say) have no edge: they are not in the KG.
    used = np.zeros(world.num_nodes, dtype=bool)
    for _, s, o in world.chunks:
        used[s] = True
        if isinstance(o, np.ndarray):
            used[o] = True
    names = {ids[i]: world.names[i] for i in np.flatnonzero(used[: len(world.names)]).tolist()}
    kg = MemoryKG(subjects, relations, objects, names)
    examples = make_questions(world, ids, names, kg, num_questions, seed, multi_topic_share)
    nodes_by_type = {kind: ids[idx[used[idx]]].tolist() for kind, idx in world.ranges.items()}
    for kind, parts in world.mediator_ranges.items():
        nodes_by_type[kind] = ids[np.concatenate(parts)].tolist()
    return SyntheticData(
        subjects, relations, objects, names, examples, nodes_by_type, tuple(world.mediator_ranges), seed, scale
    )


def write_synthetic(
    out_dir: str | Path,
    seed: int = 0,
    target_triples: int | None = None,
    num_entities: int | None = None,
    num_questions: int = DEFAULT_QUESTIONS,
    multi_topic_share: float = DEFAULT_MULTI_TOPIC_SHARE,
) -> Path:
    """Generate (see `generate`) and write `kb.tsv`, `names.tsv` and `questions.jsonl` into `out_dir`.

    The same arguments give byte-identical files. Returns `out_dir`.
    """
    data = generate(
        seed,
        num_entities=num_entities,
        target_triples=target_triples,
        num_questions=num_questions,
        multi_topic_share=multi_topic_share,
    )
    return write_data(data, out_dir)


def write_data(data: SyntheticData, out_dir: str | Path) -> Path:
    """Write an already generated world as a dataset folder."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "kb.tsv", "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(f"{s}\t{r}\t{o}\n" for s, r, o in data.triples())
    with open(out / "names.tsv", "w", encoding="utf-8", newline="\n") as handle:
        handle.writelines(f"{node}\t{label}\n" for node, label in data.names.items())
    write_jsonl(data.examples, out / "questions.jsonl")
    return out
