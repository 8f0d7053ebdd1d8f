"""Seeded splits: deterministic, right sizes, and `grouped` never shares a (topic, path) group."""

import pytest

from kgreasoner.data import load_dataset
from kgreasoner.records.schema import Answer, QAExample, TopicEntity
from kgreasoner.records.splits import assign_splits, group_key, overlap_stats


def make_examples(num_groups=60):
    """Groups of 1 to 5 paraphrases each: (topic t{g % 17}, path r{g}), 180 examples."""
    examples = []
    for g in range(num_groups):
        for k in range(1 + g % 5):
            examples.append(
                QAExample(
                    id=f"g{g}-{k}",
                    question=f"paraphrase {k} of question {g}",
                    topic_entities=(TopicEntity(f"t{g % 17}", f"t{g % 17}"),),
                    answers=(Answer(f"a{g}", f"a{g}"),),
                    gold_paths=((f"r{g}", "r_last"),),
                    hops=2,
                )
            )
    return examples


def sizes(examples):
    return [sum(e.split == s for e in examples) for s in ("train", "dev", "test")]


@pytest.mark.parametrize("scheme", ["random", "grouped"])
def test_deterministic_for_a_seed_and_order_kept(scheme):
    examples = make_examples()
    first = assign_splits(examples, scheme, seed=3)
    again = assign_splits(examples, scheme, seed=3)
    other = assign_splits(examples, scheme, seed=4)
    assert [e.split for e in first] == [e.split for e in again]
    assert [e.split for e in first] != [e.split for e in other]
    assert [e.id for e in first] == [e.id for e in examples]
    assert all(e.split == "" for e in examples)  # inputs untouched
    assert first[0].with_split("") == examples[0]


def test_random_sizes_are_exact():
    examples = make_examples()  # 180
    assert sizes(assign_splits(examples, "random", seed=0)) == [144, 18, 18]
    assert sizes(assign_splits(examples[:101], "random", seed=0)) == [81, 10, 10]
    assert sizes(assign_splits(examples, "random", seed=0, ratios=(0.5, 0.0, 0.5))) == [90, 0, 90]


def test_grouped_has_no_shared_group_and_near_ratios():
    examples = assign_splits(make_examples(), "grouped", seed=0)
    sides = {}
    for e in examples:
        sides.setdefault(group_key(e), set()).add(e.split)
    assert all(len(s) == 1 for s in sides.values())
    train, dev, test = sizes(examples)
    # Within half of the largest group (5) of the exact 144/18/18.
    assert abs(dev - 18) <= 3 and abs(test - 18) <= 3 and train + dev + test == 180
    stats = overlap_stats(examples)
    assert (stats.test_seen, stats.dev_seen, stats.test_share) == (0, 0, 0.0)


def test_group_key_without_gold_path_uses_sorted_answers():
    def example(answers):
        return QAExample(
            id="x", question="q", topic_entities=(TopicEntity("t", "t"),), answers=tuple(Answer(a, a) for a in answers)
        )

    assert group_key(example(["b", "a"])) == group_key(example(["a", "b"])) == ("t", "answers", ("a", "b"))
    assert group_key(example(["a"])) != group_key(example(["a", "b"]))


def test_overlap_stats_counts_test_questions_seen_in_train():
    base = make_examples(3)  # groups of 1, 2 and 3 examples
    labels = ["train", "train", "test", "dev", "test", "test"]
    stats = overlap_stats([e.with_split(s) for e, s in zip(base, labels)])
    # group 1 = examples 1-2 (train, test): 1 test seen; group 2 = examples 3-5: none in train.
    assert stats.sizes == {"train": 2, "dev": 1, "test": 3}
    assert (stats.test_seen, stats.dev_seen) == (1, 0)
    assert stats.test_share == pytest.approx(1 / 3)
    assert stats.describe() == "train/dev/test 2/1/3; (topic, path) groups seen in train: 33.3% of test, 0.0% of dev"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"split_scheme": "by_topic"}, "split_scheme must be one of"),
        ({"ratios": (0.8, 0.1)}, "ratios must be three non-negative numbers"),
        ({"ratios": (0.8, 0.3, -0.1)}, "ratios must be three non-negative numbers"),
        ({"ratios": (0.8, 0.1, 0.2)}, "summing to 1, got (0.8, 0.1, 0.2)"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError) as err:
        assign_splits(make_examples(2), **kwargs)
    assert message in str(err.value)


@pytest.mark.pathquestion
def test_pq2h_random_overlaps_heavily_grouped_not_at_all(pathquestion_dir):
    random_split = load_dataset("PQ-2H", split_scheme="random", root=pathquestion_dir)
    grouped = load_dataset("PQ-2H", split_scheme="grouped", root=pathquestion_dir)
    assert (random_split.split_scheme, grouped.split_scheme) == ("random", "grouped")
    assert sizes(random_split.examples) == [1526, 191, 191]
    random_stats, grouped_stats = overlap_stats(random_split.examples), overlap_stats(grouped.examples)
    print(f"PQ-2H random: {random_stats.describe()}\nPQ-2H grouped: {grouped_stats.describe()}")
    assert random_stats.test_share > 0.9  # measured 97.9% with seed 0: paraphrases on both sides
    assert grouped_stats.test_seen == 0 and grouped_stats.dev_seen == 0
    train, dev, test = sizes(grouped.examples)
    assert abs(dev - 191) <= 10 and abs(test - 191) <= 10
