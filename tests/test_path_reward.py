"""The `path` search reward: progress along the gold path, on rollouts of the real engine and search tool
over a small in-memory KG (the model's turns are scripted: `ScriptedText` stands for it)."""

import json

import pytest

from kgreasoner.data.gold_chains import GoldChains, chain_progress, gold_chains
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.schema import QAExample
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
from kgreasoner.rewards import SEARCH_CAP, SEARCH_FORMS, reward_functions, shaped_search_reward
from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams
from kgreasoner.rollout.types import TextBackend, TextOutput, trl_rollout_output

TRIPLES = [
    ("m.ada", "father", "m.byron"),
    ("m.byron", "born_in", "m.london"),
    ("m.london", "in_country", "m.england"),
    ("m.ada", "mother", "m.annabella"),
    ("m.annabella", "born_in", "m.seaham"),
    ("m.seaham", "in_country", "m.england"),
    ("m.ada", "citizen_of", "m.england"),
    ("m.london", "mayor", "m.khan"),
    ("m.byron", "spouse", "m.annabella"),
    ("m.ada", "education", "m.cvt"),
    ("m.cvt", "institution", "m.oxford"),
    ("m.oxford", "in_country", "m.england"),
]
NAMES = {
    "m.ada": "Ada",
    "m.byron": "Byron",
    "m.london": "London",
    "m.england": "England",
    "m.annabella": "Annabella",
    "m.seaham": "Seaham",
    "m.khan": "Khan",
    "m.oxford": "Oxford",
}
KG = MemoryKG.from_triples(TRIPLES, NAMES)  # m.cvt has no name: an unnamed mediator
ADA = {"id": "m.ada", "name": "Ada"}
ENGLAND = {"id": "m.england", "name": "England"}
FATHER_PATH = ["father", "born_in", "in_country"]
MOTHER_PATH = ["mother", "born_in", "in_country"]
FULL = SEARCH_CAP


def question(paths, answers=(ENGLAND,), topics=(ADA,), **extra) -> QAExample:
    return QAExample.from_dict(
        {
            "id": "q",
            "question": "in which country was ada's father born",
            "topic_entities": list(topics),
            "answers": list(answers),
            "gold_paths": paths,
            **extra,
        }
    )


class ScriptedText(TextBackend):
    """Stands for the model behind a text endpoint (a test can't sample the searches it needs): turn t writes
    `<search>QUERY</search>` for the t-th query, then the answer."""

    def __init__(self, queries):
        self.turns = [f"<think> <search>{q}</search>" for q in queries] + ["</think>\n<answer>England</answer>"]

    def complete_text(self, prompts, budgets, sampling, turn, indices):
        return [TextOutput(text=self.turns[turn], finish_reason="stop", num_tokens=3) for _ in indices]


def rollout(example: QAExample, *queries: str):
    tool = KGSearchTool(KG, ToolConfig(top_k=10))
    session = tool.session(example.question, list(example.topic_entities), example_id=example.id)
    [trajectory] = RolloutEngine(ScriptedText(queries), None, RolloutConfig(max_turns=8)).run(
        [example.question], [session], SamplingParams(temperature=0.0)
    )
    return trajectory


def path_reward(example: QAExample, *queries: str) -> float:
    """The reward as TRL hands it the columns: the dataset's and those the rollout returned."""
    trajectory = rollout(example, *queries)
    columns = trl_rollout_output([trajectory], end_token_id=0)
    [value] = shaped_search_reward("path")(
        [trajectory.text],
        gold_chains=[GoldChains(KG)(example)],
        hops=[example.hops],
        answers=[["England"]],
        **{k: columns[k] for k in ("completion_text", "tool_spans", "num_searches", "search_record")},
    )
    return value


THREE_HOPS = question([FATHER_PATH])


def test_the_chains_of_a_gold_path_are_its_entity_levels_and_its_answers():
    [[chain]] = gold_chains(KG, THREE_HOPS)
    assert chain == {
        "levels": [["m.ada"], ["m.byron"], ["m.london"]],
        "answers": ["m.england"],
        "mediators": [False, False, False],
    }


def test_no_search_scores_zero():
    assert path_reward(THREE_HOPS) == 0.0


def test_the_first_hop_only_scores_a_third_of_a_three_hop_path():
    # the topic entity searched by the gold relation: its block shows Byron (level 1), not London or England
    assert path_reward(THREE_HOPS, "Ada | father") == pytest.approx(FULL / 3)


def test_two_hops_in_order_score_two_thirds_and_the_answer_shown_scores_the_full_path():
    assert path_reward(THREE_HOPS, "Ada | father", "Byron | born_in") == pytest.approx(FULL * 2 / 3)
    assert path_reward(THREE_HOPS, "Ada | father", "Byron | born_in", "London | in_country") == pytest.approx(FULL)


def test_out_of_order_searches_do_not_count():
    two_topics = question([FATHER_PATH], topics=(ADA, {"id": "m.byron", "name": "Byron"}))
    # Byron (level 1's entity) searched before the topic entity: it moves nothing, the later topic search level 1
    assert path_reward(two_topics, "Byron | born_in", "Ada | mother") == pytest.approx(FULL / 3)
    assert path_reward(two_topics, "Ada | mother", "Byron | born_in") == pytest.approx(FULL * 2 / 3)
    # an entity of level 2 searched before level 2 was reached: London's block (its mayor) moves nothing
    assert path_reward(two_topics, "Byron | born_in", "London | mayor", "Ada | mother") == pytest.approx(FULL / 3)


def test_a_shortcut_that_shows_the_answer_scores_the_full_path():
    # Ada's unfiltered block shows (Ada, citizen_of, England): the answer reached with one search
    assert path_reward(THREE_HOPS, "Ada") == pytest.approx(FULL)


def test_alternative_paths_score_the_best_one():
    both = question([FATHER_PATH, MOTHER_PATH])
    # along the mother path two levels in order, along the father path one: the mother path counts
    assert path_reward(both, "Ada | mother", "Annabella | born_in") == pytest.approx(FULL * 2 / 3)
    assert path_reward(question([FATHER_PATH]), "Ada | mother", "Annabella | born_in") == pytest.approx(FULL / 3)


def test_an_intersect_question_scores_the_mean_over_its_topic_entities():
    london = {"id": "m.london", "name": "London"}
    intersect = question(
        [["father", "born_in"], ["^in_country"]], answers=(london,), topics=(ADA, ENGLAND), intersect=True
    )
    # Ada's walk: level 1 of 2; England's 1-hop walk: nothing until London is shown
    assert path_reward(intersect, "Ada | father") == pytest.approx(FULL * (1 / 2 + 0) / 2)
    assert path_reward(intersect, "Ada | father", "Byron | born_in") == pytest.approx(FULL)


def test_a_failed_search_does_not_count():
    trajectory = rollout(THREE_HOPS, "Zorro", "Ada | nonsense", "Ada | father")
    assert [c.error for c in trajectory.tool_calls] == ["unknown_entity", "unknown_relation", None]
    assert trajectory.search_record == [{"entity": "m.ada", "shown": ["m.ada", "m.byron"]}]
    assert path_reward(THREE_HOPS, "Zorro", "Ada | nonsense") == 0.0


def test_a_level_of_unnamed_mediators_is_reached_with_the_level_before_it():
    studied = question([["education", "institution", "in_country"]])
    # the tool shows through the mediator: Ada's education block holds Oxford, level 2's entity
    assert path_reward(studied, "Ada | education") == pytest.approx(FULL * 2 / 3)
    assert path_reward(studied, "Ada | education", "Oxford | in_country") == pytest.approx(FULL)


def test_without_a_gold_path_the_hops_form_scores_instead():
    unknown = question([], hops=2)
    assert GoldChains(KG)(unknown) == "[]"
    assert chain_progress("[]", []) is None
    # one successful search of a 2-hop question: 0.8 * min(1, 2) / 2, as the hops form pays
    assert path_reward(unknown, "Zorro", "Ada | father") == pytest.approx(0.4)
    assert path_reward(question([], hops=1), "Ada | father", "Byron") == pytest.approx(0.8)


def test_a_level_keeps_at_most_max_level_entities():
    fan = [("a", "r", "b0"), ("a", "r", "b1"), ("c12", "t", "z")]
    fan += [(f"b{i}", "s", f"c{i}{j}") for i in range(2) for j in range(3)]
    hub = MemoryKG.from_triples(fan)
    example = QAExample.from_dict(
        {
            "id": "h",
            "question": "q",
            "topic_entities": [{"id": "a", "name": "a"}],
            "answers": ["z"],
            "gold_paths": [["r", "s", "t"]],
        }
    )
    [[chain]] = gold_chains(hub, example)
    assert chain["levels"] == [["a"], ["b0", "b1"], ["c00", "c01", "c02", "c10", "c11", "c12"]]
    # capped at 3: the first three met, over the whole level, not per entity
    assert gold_chains(hub, example, max_level=3)[0][0]["levels"] == [["a"], ["b0", "b1"], ["c00", "c01", "c02"]]
    # capped at 1, b1 falls out of level 1: a search of it (on the real path) is not paid for level 2
    searches = [{"entity": "a", "shown": ["b1"]}, {"entity": "b1", "shown": ["c12"]}]
    assert chain_progress(json.dumps(gold_chains(hub, example)), searches) == pytest.approx(2 / 3)
    assert chain_progress(json.dumps(gold_chains(hub, example, max_level=1)), searches) == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="max_level must be >= 1"):
        GoldChains(hub, max_level=0)


def test_chains_are_walked_once_per_question():
    chains = GoldChains(KG)
    calls = []
    original = KG.neighbors

    def counted(*args, **kwargs):
        calls.append(args)
        return original(*args, **kwargs)

    KG.neighbors = counted
    try:
        first = chains(THREE_HOPS)
        walked = len(calls)
        assert chains(THREE_HOPS) is first and len(calls) == walked == 3
    finally:
        del KG.neighbors


def test_the_path_form_is_named_for_trl_and_refuses_rows_without_its_columns():
    assert "path" in SEARCH_FORMS
    assert reward_functions(search_form="path")[0].__name__ == "search_reward"
    with pytest.raises(ValueError, match=r"needs the columns \['gold_chains'\]"):
        shaped_search_reward("path")(["x"], search_record=[[]])
    with pytest.raises(ValueError, match=r"needs the columns \['gold_chains', 'search_record'\]"):
        shaped_search_reward("path")(["x"])
