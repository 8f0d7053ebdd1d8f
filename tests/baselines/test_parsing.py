"""Each method's answer parsing on hand-written outputs."""

from kgreasoner.baselines import tog_prompts
from kgreasoner.baselines.base import braced_answers, first_line_answer, json_list, json_object
from kgreasoner.baselines.io import parse_io_reply
from kgreasoner.baselines.parog import parse_answer_object, parse_plan, parse_selection, parse_tentative
from kgreasoner.baselines.sog import SearchCall, parse_action, parse_final


def test_braces_and_lenient_fallback():
    assert braced_answers("Answer: {a} then later Answer: { B | C }") == ["B", "C"]
    assert braced_answers("answer:{x}") == ["x"]
    assert braced_answers("no braces here") is None
    assert first_line_answer("Reasoning...\nAnswer: Paris | Lyon.\nmore") == ["Paris", "Lyon"]
    assert first_line_answer("\n  Paris\nRome") == ["Paris"]


def test_io_and_cot_replies():
    assert parse_io_reply(" {Mountain Time Zone}") == (["Mountain Time Zone"], True)
    assert parse_io_reply("Utah is in... Answer: {MST | Mountain Time}", chain_of_thought=True) == (
        ["MST", "Mountain Time"],
        True,
    )
    assert parse_io_reply("Mountain Time Zone\nbecause") == (["Mountain Time Zone"], False)
    assert parse_io_reply(" {x}", chain_of_thought=True) == (["x"], False)
    assert parse_io_reply("") == ([], False)


def test_tog_replies():
    options = ["film.film.directed_by", "film.film.country", "people.person.nationality"]
    reply = (
        "{film.film.directed_by} (score: 0.7)\n{Film.Film.Country} (Score: 0.2)\n{invented.rel} (score: 0.1)\n"
        "{film.film.directed_by} (score: 0.05)\nfilm.film.country 0.3"
    )
    assert tog_prompts.parse_scored(reply, options) == [("film.film.directed_by", 0.7), ("film.film.country", 0.2)]
    assert tog_prompts.parse_scored("nothing", options) == []
    assert tog_prompts.parse_sufficient("{Yes}. The triplets say so.") is True
    assert tog_prompts.parse_sufficient("I think {no}, not yet {Yes}") is False
    assert tog_prompts.parse_sufficient("Yes") is None
    assert tog_prompts.parse_answer("So. Answer: {Salt Lake City}") == (["Salt Lake City"], True)
    assert tog_prompts.parse_answer("Salt Lake City") == (["Salt Lake City"], False)


def test_sog_actions_and_final_answers():
    assert parse_action('Thought.\nAction: search("Utah", "outgoing", ["time zone"])') == SearchCall(
        "Utah", "out", ("time zone",)
    )
    assert parse_action("search('m.1', 'incoming')") == SearchCall("m.1", "in", ())
    assert parse_action('search(entity="Utah", direction="in", properties_to_filter_for="capital")') == SearchCall(
        "Utah", "in", ("capital",)
    )
    assert parse_action('search("Utah", "outgoing", []) and then (maybe) more') == SearchCall("Utah", "out", ())
    assert parse_action('search("Utah", "sideways", [])') is None
    assert parse_action("search(Utah, outgoing)") is None  # not literals
    assert parse_action('search("", "out")') is None
    assert parse_action("I will answer now") is None
    assert parse_final("So.\nFinal answer: {Salt Lake City | SLC}") == ["Salt Lake City", "SLC"]
    assert parse_final("final answer: {x}") == ["x"]
    assert parse_final("Final answer: Salt Lake City") is None


def test_parog_replies():
    assert parse_plan('Plan: ["find the film", "find its director"]', "q", 4) == ["find the film", "find its director"]
    assert parse_plan("1. find the film\n2) find its director\n", "q", 4) == ["find the film", "find its director"]
    assert parse_plan('["a", "b", "c"]', "q", 2) == ["a", "b"]
    assert parse_plan("", "the question", 4) == ["the question"]
    assert parse_answer_object('Sure: {"A": "Paris | Lyon", "R": "the KG says so"}') == (
        ["Paris", "Lyon"],
        "the KG says so",
    )
    assert parse_answer_object('{"A": ["Paris", "Lyon"]}') == (["Paris", "Lyon"], "")
    assert parse_answer_object('{"answer": "Paris"}') is None
    assert parse_answer_object("Paris") is None
    assert parse_tentative('[{"A": "x", "R": "r"}, "y"]', 3) == [["x"], ["y"], []]
    assert parse_tentative("garbage", 2) == [[], []]
    options = ["film.film.directed_by", "^film.film.directed_by", "Salt Lake City"]
    assert parse_selection('{"relations": ["^film.film.directed_by", "made.up"]}', "relations", options) == [
        "^film.film.directed_by"
    ]
    assert parse_selection('{"entities": ["salt lake city"]}', "entities", options) == ["Salt Lake City"]
    assert parse_selection('I pick "Salt Lake City".', "entities", options) == ["Salt Lake City"]
    assert json_object('x {"a": {"b": 1}} y') == {"a": {"b": 1}}
    assert json_list("[1, 2") is None
