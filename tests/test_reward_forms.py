"""The search reward's forms: the paper's, capped by the question's hops, paid only with a right answer."""

import pytest

from kgreasoner.rewards import SEARCH_FORMS, reward_functions, search_reward, shaped_search_reward

RIGHT = "<think> <search>A</search>\n<triples>\n(A, r, B)\n</triples>\n </think>\n<answer>B</answer>"
WRONG = RIGHT.replace("<answer>B</answer>", "<answer>C</answer>")


def _call(form: str, searches: list[int], hops: list[int], texts: list[str]) -> list[float]:
    return shaped_search_reward(form)(
        texts, num_searches=searches, hops=hops, completion_text=texts, answers=[["B"]] * len(texts)
    )


def test_paper_form_pays_every_search_up_to_the_cap():
    assert shaped_search_reward("paper") is search_reward
    assert _call("paper", [0, 1, 2, 3, 3], [1, 1, 1, 1, 3], [RIGHT, RIGHT, RIGHT, WRONG, WRONG]) == [
        0.0,
        0.5,
        0.8,
        0.8,
        0.8,
    ]


def test_hops_form_pays_no_search_beyond_what_the_question_needs():
    assert _call("hops", [1, 3, 3, 2], [1, 1, 2, 0], [WRONG] * 4) == [0.5, 0.5, 0.8, 0.8]


def test_correct_form_pays_only_with_a_right_answer():
    assert _call("correct", [2, 2, 0], [1, 1, 1], [RIGHT, WRONG, RIGHT]) == [0.8, 0.0, 0.0]


def test_correct_hops_form_needs_both():
    assert _call("correct_hops", [3, 3, 1], [1, 2, 2], [RIGHT, RIGHT, WRONG]) == [0.5, 0.8, 0.0]


def test_the_shaped_reward_keeps_trls_name_and_an_unknown_form_is_refused():
    assert [f.__name__ for f in reward_functions(search_form="correct_hops")] == [
        "search_reward",
        "format_reward",
        "answer_reward",
    ]
    with pytest.raises(ValueError, match="must be one of"):
        shaped_search_reward("always")
    assert set(SEARCH_FORMS) == {"paper", "hops", "correct", "correct_hops", "path"}
