"""The search reward's forms: the paper's, shared out over the question's hops, paid only with a right answer."""

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


SEARCHES = [0, 1, 2, 3, 4]
PAPER = [0.0, 0.5, 0.8, 0.8, 0.8]  # min(0.5 n, 0.8), whatever the hops
HOPS = {  # 0.8 min(n, h) / h: each search up to the hop count earns its share of the cap
    1: [0.0, 0.8, 0.8, 0.8, 0.8],
    2: [0.0, 0.4, 0.8, 0.8, 0.8],
    3: [0.0, 0.8 / 3, 1.6 / 3, 0.8, 0.8],
}


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_each_form_pays_exactly_its_formula_for_0_to_4_searches(hops):
    assert _call("paper", SEARCHES, [hops] * 5, [WRONG] * 5) == PAPER
    assert _call("hops", SEARCHES, [hops] * 5, [WRONG] * 5) == pytest.approx(HOPS[hops], abs=1e-12)
    assert _call("correct_hops", SEARCHES, [hops] * 5, [RIGHT] * 5) == pytest.approx(HOPS[hops], abs=1e-12)
    assert _call("correct_hops", SEARCHES, [hops] * 5, [WRONG] * 5) == [0.0] * 5


def test_hops_form_pays_a_third_search_on_a_3_hop_question_and_none_beyond_the_hops():
    two, three, four = _call("hops", [2, 3, 4], [3, 3, 3], [WRONG] * 3)
    assert two < three == four == 0.8
    assert _call("hops", [1, 2], [1, 1], [WRONG] * 2) == [0.8, 0.8]  # a needless second search earns nothing


def test_hops_form_pays_the_papers_form_where_the_hops_are_unknown():
    assert _call("hops", SEARCHES, [0] * 5, [WRONG] * 5) == PAPER
    assert shaped_search_reward("hops")([WRONG] * 5, num_searches=SEARCHES, completion_text=[WRONG] * 5) == PAPER


def test_correct_form_pays_only_with_a_right_answer():
    assert _call("correct", [2, 2, 0], [1, 1, 1], [RIGHT, WRONG, RIGHT]) == [0.8, 0.0, 0.0]


def test_correct_hops_form_needs_both():
    assert _call("correct_hops", [3, 1, 1], [1, 2, 2], [RIGHT, RIGHT, WRONG]) == [0.8, 0.4, 0.0]


def test_the_shaped_reward_keeps_trls_name_and_an_unknown_form_is_refused():
    assert [f.__name__ for f in reward_functions(search_form="correct_hops")] == [
        "search_reward",
        "format_reward",
        "answer_reward",
    ]
    with pytest.raises(ValueError, match="must be one of"):
        shaped_search_reward("always")
    assert set(SEARCH_FORMS) == {"paper", "hops", "correct", "correct_hops", "path"}
