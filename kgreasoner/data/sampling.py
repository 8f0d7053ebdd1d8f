"""Seeded orders of QA examples in which every prefix is stratified by hop count and relation path.

A warm-up takes the first few hundred examples of such an order and sees every hop count and as
many relation paths as fit; GRPO walks its questions in such an order, so that a batch of a few
questions holds multi-hop and short chains alike instead of whatever a shuffle happened to draw.
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Hashable, Sequence, TypeVar

from kgreasoner.data.schema import QAExample

T = TypeVar("T")


def path_key(example: QAExample) -> tuple[str, ...]:
    """The example's first gold relation path (empty when it has none)."""
    return tuple(example.gold_paths[0]) if example.gold_paths else ()


def hop_count(example: QAExample) -> int:
    """`hops` as given, else the length of the first gold path (0: unknown)."""
    return example.hops or len(path_key(example))


def interleave(groups: Sequence[Sequence[T]]) -> list[T]:
    """Round robin over the groups: one item of each in turn until all are used up."""
    out: list[T] = []
    longest = max((len(g) for g in groups), default=0)
    for position in range(longest):
        out.extend(group[position] for group in groups if position < len(group))
    return out


def _grouped(items: Sequence[T], key, rng: random.Random) -> list[list[T]]:
    """Items grouped by `key`, each group shuffled, groups in a shuffled order (keys sorted first, for determinism)."""
    groups: dict[Hashable, list[T]] = defaultdict(list)
    for item in items:
        groups[key(item)].append(item)
    ordered = [groups[k] for k in sorted(groups, key=repr)]
    for group in ordered:
        rng.shuffle(group)
    rng.shuffle(ordered)
    return ordered


def stratified_order(examples: Sequence[QAExample], seed: int | str = 0) -> list[QAExample]:
    """All examples, reordered: hop counts take turns, and within a hop count relation paths take turns.

    Deterministic for the same examples and seed. The first k items hold about k / H examples of each
    of the H hop counts (while each lasts) and, within a hop count, one example per relation path
    before any path gets a second.
    """
    rng = random.Random(f"{seed}|stratified")
    by_hops = []
    for group in sorted(_grouped(examples, hop_count, rng), key=lambda g: hop_count(g[0])):
        by_hops.append(interleave(_grouped(group, path_key, rng)))
    return interleave(by_hops)
