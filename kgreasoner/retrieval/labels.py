"""Relevance labels for the GAT ranker, made from gold relation paths.

For each question and each hop of a gold path, the searched entity's candidates (as the tool
builds them, mediators expanded) are labelled: positive when the candidate's relations continue
the gold path at that hop, negative otherwise. Training groups keep `negative_ratio` negatives per
positive, sampled with a seed; evaluation groups keep every candidate (ratio None), so recall@k
and MRR are measured over the list the tool would rank. The next hop searches the positives'
targets (at most `max_frontier`, the question's own witness chain first when it has one).

    python -m kgreasoner.retrieval.labels --data PQ-3H --split train --out labels.jsonl
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kgreasoner.data.path_search import with_derived_paths
from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.records.schema import QAExample, write_jsonl
from kgreasoner.records.splits import add_split_scheme_argument
from kgreasoner.retrieval.candidates import Candidate, gather_candidates


@dataclass
class LabelledGroup:
    """The candidates of one searched entity for one question, with 0/1 labels."""

    question_id: str
    question: str
    entity: str
    hop: int
    candidates: list[Candidate]
    labels: list[int]

    def to_dict(self) -> dict[str, object]:
        return {
            "question_id": self.question_id,
            "question": self.question,
            "entity": self.entity,
            "hop": self.hop,
            "candidates": [
                {
                    "relations": list(c.path_relations),
                    "nodes": [e.neighbor for e in c.edges],
                    "text": c.text(),
                    "label": y,
                }
                for c, y in zip(self.candidates, self.labels)
            ],
        }


def label_groups(
    kg: KnowledgeGraph,
    examples: Iterable[QAExample],
    negative_ratio: float | None = 4.0,
    seed: int = 0,
    max_frontier: int = 4,
    expand_mediators: bool = True,
    neighbor_limit: int | None = 10000,
    max_candidates: int | None = 1000,
) -> list[LabelledGroup]:
    """Labelled groups along every gold path of every example (examples without one are skipped).

    Each question is labelled on the graph it searches, `kg.for_example(example.id)` (its own
    subgraph in a per-question KG, where its paths are derived when it has none).
    `max_candidates` caps a group's size at hubs (every positive kept, negatives sampled), which
    bounds the context fetched per group.
    """
    if negative_ratio is not None and negative_ratio < 0:
        raise ValueError(f"negative_ratio must be >= 0 or None, got {negative_ratio}")
    if max_frontier < 1:
        raise ValueError(f"max_frontier must be >= 1, got {max_frontier}")
    groups: list[LabelledGroup] = []
    for example in examples:
        example = with_derived_paths(example, kg)
        graph = kg.for_example(example.id)
        done: set[tuple[str, tuple[str, ...]]] = set()
        witness = list(example.extra.get("path_entities") or [])
        for path in example.gold_paths:
            for topic in example.topic_entities:
                frontier, hop = [topic.id], 0
                while hop < len(path) and frontier:
                    next_frontier: list[str] = []
                    step = 1
                    for entity in frontier:
                        if (entity, path[:hop]) in done:
                            continue
                        done.add((entity, path[:hop]))
                        candidates = gather_candidates(graph, entity, expand_mediators, neighbor_limit)
                        labels = [int(_continues(c, path, hop)) for c in candidates]
                        if not any(labels):
                            continue
                        step = len(next(c for c, y in zip(candidates, labels) if y).edges)
                        next_frontier.extend(c.target for c, y in zip(candidates, labels) if y)
                        keep = _sample(
                            labels,
                            negative_ratio,
                            max_candidates,
                            random.Random(f"{seed}|{example.id}|{entity}|{hop}"),
                        )
                        groups.append(
                            LabelledGroup(
                                example.id,
                                example.question,
                                entity,
                                hop,
                                [candidates[i] for i in keep],
                                [labels[i] for i in keep],
                            )
                        )
                    hop += step
                    frontier = _next_frontier(next_frontier, witness, max_frontier)
    return groups


def _continues(candidate: Candidate, path: Sequence[str], hop: int) -> bool:
    relations = candidate.path_relations
    return tuple(path[hop : hop + len(relations)]) == relations


def _sample(labels: list[int], ratio: float | None, cap: int | None, rng: random.Random) -> list[int]:
    """Indices kept, in KG order: every positive, `ratio` negatives per positive (all when None),
    and no more than `cap` candidates in all."""
    positives = [i for i, y in enumerate(labels) if y]
    negatives = [i for i, y in enumerate(labels) if not y]
    wanted = len(negatives) if ratio is None else int(round(ratio * len(positives)))
    if cap is not None:
        wanted = min(wanted, max(cap - len(positives), 0))
    if wanted < len(negatives):
        negatives = rng.sample(negatives, wanted)
    return sorted(positives + negatives)


def _next_frontier(reached: list[str], witness: list[str], cap: int) -> list[str]:
    unique = list(dict.fromkeys(reached))
    first = [e for e in unique if e in witness]
    return (first + [e for e in unique if e not in witness])[:cap]


def main(argv: list[str] | None = None) -> int:
    from kgreasoner.data import load_dataset, open_dataset_kg

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="dataset name (PQ-3H, ...) or folder (kb.tsv + questions.jsonl)")
    parser.add_argument("--split", default="train", choices=("train", "dev", "test"))
    add_split_scheme_argument(parser)
    parser.add_argument("--negative-ratio", type=float, default=4.0, help="negatives per positive; < 0 keeps all")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    dataset = load_dataset(args.data, split=args.split, split_scheme=args.split_scheme, seed=args.seed)
    kg = open_dataset_kg(dataset)
    ratio = None if args.negative_ratio < 0 else args.negative_ratio
    count = write_jsonl(label_groups(kg, dataset.examples, ratio, args.seed), args.out)
    print(f"{args.out}: {count} groups from {len(dataset.examples)} {args.split} questions of {dataset.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
