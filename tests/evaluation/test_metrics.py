import pytest

from kgreasoner.evaluation.metrics import distinct_predictions, hits_at_1, score_answers
from kgreasoner.records.schema import Answer

GOLD = (Answer("m.1", "The United Kingdom", ("UK",)), Answer("m.2", "France"))


def test_hits_at_1_scores_only_the_first_answer_after_normalisation():
    assert hits_at_1(["united-kingdom!", "Spain"], GOLD) == 1.0
    assert hits_at_1(["uk"], GOLD) == 1.0  # an alias
    assert hits_at_1(["m.2"], GOLD) == 1.0  # the id
    assert hits_at_1(["Spain", "France"], GOLD) == 0.0
    assert hits_at_1([], GOLD) == 0.0
    assert hits_at_1(["the"], GOLD) == 0.0  # normalises to nothing


def test_set_f1_and_em():
    exact = score_answers(["France", "United Kingdom"], GOLD)
    assert (exact.precision, exact.recall, exact.f1, exact.em) == (1.0, 1.0, 1.0, 1.0)
    # Two forms of one answer count once on the gold side, twice on the prediction side (both right).
    aliases = score_answers(["UK", "United Kingdom"], GOLD)
    assert (aliases.precision, aliases.recall, aliases.em) == (1.0, 0.5, 0.0)
    assert aliases.f1 == pytest.approx(2 / 3)
    partial = score_answers(["France", "Spain", "Italy", "Peru"], GOLD)
    assert (partial.precision, partial.recall) == (0.25, 0.5)
    assert partial.f1 == pytest.approx(2 * 0.25 * 0.5 / 0.75)
    assert partial.hits1 == 1.0 and partial.em == 0.0
    wrong = score_answers(["Spain"], GOLD)
    assert (wrong.f1, wrong.em, wrong.hits1) == (0.0, 0.0, 0.0)
    assert score_answers([], GOLD).f1 == 0.0


def test_distinct_predictions_drop_empty_and_repeats():
    assert distinct_predictions(["France", "france ", "", "The", "Spain"]) == ["france", "spain"]
