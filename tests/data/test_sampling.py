"""Stratified orders: every prefix covers hop counts and relation paths in turn."""

from collections import Counter

from kgreasoner.records.sampling import hop_count, interleave, stratified_order
from kgreasoner.records.schema import Answer, QAExample, TopicEntity


def _example(i: int, path: tuple[str, ...], hops: int | None = None) -> QAExample:
    return QAExample(
        id=f"q{i}",
        question=f"question {i}",
        topic_entities=(TopicEntity("t", "t"),),
        answers=(Answer("a", "a"),),
        gold_paths=(path,),
        hops=len(path) if hops is None else hops,
    )


def _examples() -> list[QAExample]:
    # 12 one-hop on two paths (9 + 3), 4 two-hop on one path, 2 three-hop.
    one = [_example(i, ("born_in",)) for i in range(9)] + [_example(9 + i, ("died_in",)) for i in range(3)]
    two = [_example(20 + i, ("born_in", "country")) for i in range(4)]
    three = [_example(30 + i, ("born_in", "country", "capital")) for i in range(2)]
    return one + two + three


def test_interleave_takes_one_of_each_group_in_turn():
    assert interleave([[1, 2, 3], ["a"], [10, 20]]) == [1, "a", 10, 2, 20, 3]
    assert interleave([]) == []


def test_hop_counts_take_turns_while_each_lasts():
    order = stratified_order(_examples(), seed=0)
    assert sorted(e.id for e in order) == sorted(e.id for e in _examples())
    assert [hop_count(e) for e in order[:6]] == [1, 2, 3, 1, 2, 3]
    assert [hop_count(e) for e in order[6:8]] == [1, 2]
    assert {hop_count(e) for e in order[10:]} == {1}


def test_relation_paths_take_turns_within_a_hop_count():
    one_hop = [e for e in stratified_order(_examples(), seed=3) if hop_count(e) == 1]
    # The rarer path is not left to the end: its 3 questions come in the first 6 one-hop picks.
    assert Counter(e.gold_paths[0] for e in one_hop[:6]) == {("born_in",): 3, ("died_in",): 3}


def test_the_order_is_seeded():
    ids = lambda seed: [e.id for e in stratified_order(_examples(), seed)]  # noqa: E731
    assert ids(0) == ids(0)
    assert ids(0) != ids(1)


def test_hops_fall_back_to_the_path_length():
    assert hop_count(_example(1, ("a", "b"), hops=0)) == 2


def test_balanced_order_keeps_every_hop_count_in_turn_for_the_whole_epoch():
    from kgreasoner.records.sampling import balanced_order

    order = balanced_order(_examples(), seed=0)
    assert len(order) == 3 * 12  # three hop counts, the largest group has 12
    assert [hop_count(e) for e in order] == [1, 2, 3] * 12
    assert {e.id for e in order} == {e.id for e in _examples()}
    one_hop = [e.id for e in order if hop_count(e) == 1]
    assert sorted(one_hop) == sorted(e.id for e in _examples() if hop_count(e) == 1)  # the largest group once
    assert balanced_order(_examples(), seed=0) == order
    assert balanced_order([], seed=0) == []
