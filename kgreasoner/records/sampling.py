"""Seeded orders of QA examples, stratified by hop count (and relation path).

- `stratified_order`: every prefix covers hop counts and relation paths in turn. A warm-up takes
  the first few hundred examples and sees every hop count and as many relation paths as fit.
- `balanced_order`: hop counts take turns for a whole epoch, the scarcer ones recycled, while
  paths stay shuffled within a hop count. GRPO walks its questions in this order, so every batch
  of a few questions holds multi-hop questions and short chains alike, and what a batch looks like
  does not drift over the epoch (a path-by-path order front-loads rare paths, and a policy that
  follows its batches forgets them again).
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import TypeVar

from kgreasoner.records.schema import QAExample

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


def balanced_order(examples: Sequence[QAExample], seed: int | str = 0) -> list[QAExample]:
    """Hop counts in turn until the largest hop group is used once; smaller groups start over, reshuffled.

    Deterministic for the same examples and seed. Every example appears at least once; with H hop
    counts the order is H times the largest group long.
    """
    rng = random.Random(f"{seed}|balanced")
    groups = sorted(_grouped(examples, hop_count, rng), key=lambda g: hop_count(g[0]))
    longest = max((len(g) for g in groups), default=0)
    cycled = []
    for group in groups:
        items = list(group)
        while len(items) < longest:
            again = list(group)
            rng.shuffle(again)
            items.extend(again)
        cycled.append(items[:longest])
    return interleave(cycled)
