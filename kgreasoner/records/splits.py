"""Seeded train/dev/test splits for datasets that come without one.

`random` shuffles lines, as published PathQuestion numbers did. `grouped` keeps every
(topic entity, relation path) group on one side, so no paraphrase of a test question is seen in
training. Every report names the scheme and states the overlap `overlap_stats` measures.

`DEFAULT_SPLIT_SCHEME` is the default of every stage, config (`split_scheme`) and command
(`--split-scheme`) that splits a dataset, so stages run by hand on an unsplit dataset agree on its
test questions.
"""

from __future__ import annotations

import argparse
import math
import random
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from kgreasoner.records.schema import QAExample

SCHEMES = ("random", "grouped")
DEFAULT_SPLIT_SCHEME = "grouped"
SPLIT_SCHEME_HELP = (
    "how a dataset without a split is split 80/10/10: grouped (no (topic, path) group on two sides) or random; "
    "every stage (ranker, warm-up, GRPO, eval, serving) must use the same"
)
SPLIT_NAMES = ("train", "dev", "test")


def group_key(example: QAExample) -> tuple[Hashable, ...]:
    """(first topic entity, first gold path), or (first topic entity, sorted answer ids) without a path."""
    topic = example.topic_entities[0].id
    if example.gold_paths:
        return (topic, "path", example.gold_paths[0])
    return (topic, "answers", tuple(sorted(a.id for a in example.answers)))


def assign_splits(
    examples: Sequence[QAExample],
    split_scheme: str = DEFAULT_SPLIT_SCHEME,
    seed: int = 0,
    ratios: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> list[QAExample]:
    """The examples in their input order with `split` set; the same inputs and seed give the same split.

    `random` gives exactly round(n * ratio) dev and test examples. `grouped` shuffles the groups
    and cuts the shuffled sequence at the ratio boundaries, each group going where its middle
    falls, so sizes are within about half a group of the ratios.
    """
    if split_scheme not in SCHEMES:
        raise ValueError(f"split_scheme must be one of {SCHEMES}, got {split_scheme!r}")
    _check_ratios(ratios)
    n = len(examples)
    rng = random.Random(seed)
    labels = [""] * n
    if split_scheme == "random":
        order = list(range(n))
        rng.shuffle(order)
        n_dev, n_test = round(n * ratios[1]), round(n * ratios[2])
        n_train = n - n_dev - n_test
        for rank, i in enumerate(order):
            labels[i] = "train" if rank < n_train else "dev" if rank < n_train + n_dev else "test"
    else:
        groups: dict[Hashable, list[int]] = defaultdict(list)
        for i, example in enumerate(examples):
            groups[group_key(example)].append(i)
        # Shuffle keys in first-seen order (dicts keep it), so the result depends on the seed only.
        keys = list(groups)
        rng.shuffle(keys)
        cut_train, cut_dev = ratios[0] * n, (ratios[0] + ratios[1]) * n
        start = 0
        for key in keys:
            members = groups[key]
            middle = start + len(members) / 2
            split = "train" if middle <= cut_train else "dev" if middle <= cut_dev else "test"
            for i in members:
                labels[i] = split
            start += len(members)
    return [example.with_split(label) for example, label in zip(examples, labels)]


def add_split_scheme_argument(parser: argparse.ArgumentParser) -> None:
    """`--split-scheme` (default `DEFAULT_SPLIT_SCHEME`), and a refusal of the old `--scheme` that names it."""
    parser.add_argument("--split-scheme", default=DEFAULT_SPLIT_SCHEME, choices=SCHEMES, help=SPLIT_SCHEME_HELP)
    parser.add_argument("--scheme", action=_RenamedFlag, help=argparse.SUPPRESS)


class _RenamedFlag(argparse.Action):
    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        parser.error(f"{option_string} was renamed --split-scheme")


def _check_ratios(ratios: Sequence[float]) -> None:
    if len(ratios) != 3 or any(r < 0 for r in ratios) or not math.isclose(sum(ratios), 1.0, abs_tol=1e-6):
        raise ValueError(
            f"ratios must be three non-negative numbers (train, dev, test) summing to 1, got {tuple(ratios)}"
        )


@dataclass(frozen=True)
class SplitOverlap:
    """How many dev/test questions share their (topic, path) group with a training question."""

    sizes: dict[str, int]
    dev_seen: int
    test_seen: int

    @property
    def dev_share(self) -> float:
        return self.dev_seen / self.sizes["dev"] if self.sizes["dev"] else 0.0

    @property
    def test_share(self) -> float:
        """Share of test questions whose (topic, path) group also appears in train."""
        return self.test_seen / self.sizes["test"] if self.sizes["test"] else 0.0

    def describe(self) -> str:
        return (
            f"train/dev/test {self.sizes['train']}/{self.sizes['dev']}/{self.sizes['test']}; "
            f"(topic, path) groups seen in train: {self.test_share:.1%} of test, {self.dev_share:.1%} of dev"
        )


def overlap_stats(examples: Sequence[QAExample]) -> SplitOverlap:
    """Split sizes and the dev/test questions whose `group_key` also occurs in train."""
    sizes = {name: 0 for name in SPLIT_NAMES}
    for example in examples:
        if example.split in sizes:
            sizes[example.split] += 1
    train_groups = {group_key(e) for e in examples if e.split == "train"}
    seen = {
        name: sum(1 for e in examples if e.split == name and group_key(e) in train_groups) for name in ("dev", "test")
    }
    return SplitOverlap(sizes=sizes, dev_seen=seen["dev"], test_seen=seen["test"])
