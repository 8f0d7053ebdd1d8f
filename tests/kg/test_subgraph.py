"""The subgraph backend over hand-made RoG records (tests/data/fixtures/rog-webqsp): each question
searches its own graph, through the KG interface, the search tool, evaluation and the oracle."""

from pathlib import Path

import pytest

from kgreasoner.baselines.oracle import OracleMethod
from kgreasoner.data import load_dataset, open_dataset_kg
from kgreasoner.evaluation.failures import classify_failure
from kgreasoner.kg import KGError, MemoryKG, open_kg
from kgreasoner.kg.subgraph import SubgraphKG
from kgreasoner.records.schema import Answer, QAExample, TopicEntity
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig

FIXTURES = Path(__file__).parents[1] / "data" / "fixtures"
ROG_WEBQSP = FIXTURES / "rog-webqsp"
BIEBER = [TopicEntity("Justin Bieber", "Justin Bieber")]


@pytest.fixture
def kg() -> SubgraphKG:
    return SubgraphKG.from_path(ROG_WEBQSP)


def _triples(edges):
    return [(e.subject, e.relation, e.object, e.direction) for e in edges]


def test_view_neighbours_labels_and_resolve(kg):
    assert len(kg) == 3 and "WebQTest-0" in kg and "WebQTest-9" not in kg
    view = kg.for_example("WebQTrn-0")
    assert isinstance(view, MemoryKG)
    assert _triples(view.neighbors("Justin Bieber", "out")) == [
        ("Justin Bieber", "people.person.sibling_s", "m.0gxnnwc", "out"),
        ("Justin Bieber", "people.person.nationality", "Canada", "out"),
    ]
    assert _triples(view.neighbors("Jaxon Bieber", "both")) == [
        ("Jaxon Bieber", "people.person.parents", "Jeremy Bieber", "out"),
        ("m.0gxnnwc", "people.sibling_relationship.sibling", "Jaxon Bieber", "in"),
    ]
    # Nodes are named by their labels; the mid RoG left for an unnamed node is a mediator.
    assert (view.label("Jaxon Bieber"), view.is_unnamed("Jaxon Bieber")) == ("Jaxon Bieber", False)
    assert (view.label("m.0gxnnwc"), view.is_unnamed("m.0gxnnwc")) == ("m.0gxnnwc", True)
    assert view.resolve("Jaxon Bieber") == ["Jaxon Bieber"]
    assert view.resolve("jaxon  BIEBER") == ["Jaxon Bieber"]
    assert view.resolve("Padmé Amidala") == []  # another question's node
    assert view.degree("Canada") == 2


def test_one_question_cannot_see_another_questions_triples(kg):
    # "Canada" is in both training graphs, with different edges.
    assert _triples(kg.for_example("WebQTrn-0").neighbors("Canada", "both")) == [
        ("Canada", "location.country.official_language", "English Language", "out"),
        ("Justin Bieber", "people.person.nationality", "Canada", "in"),
    ]
    assert _triples(kg.for_example("WebQTrn-1").neighbors("Canada", "both")) == [
        ("Canada", "location.country.capital", "Ottawa", "out"),
    ]
    assert kg.for_example("WebQTest-0").neighbors("Canada", "both") == []


def test_the_whole_store_gives_names_but_no_triples(kg):
    assert kg.label("Utah") == "Utah" and kg.is_unnamed("m.0k5s9k") and not kg.is_unnamed("Utah")
    for call in (lambda: kg.neighbors("Canada"), lambda: kg.degree("Canada"), lambda: kg.resolve("Canada")):
        with pytest.raises(
            KGError, match=r"every question has its own subgraph; call it on for_example\(example_id\)"
        ):
            call()
    with pytest.raises(
        ValueError,
        match=r"^a subgraph KG answers one question at a time: open the search session with the example's id",
    ):
        kg.for_example(None)
    with pytest.raises(
        KeyError,
        match=f"question 'WebQTrn-9' has no subgraph in {ROG_WEBQSP / 'test.jsonl'}, {ROG_WEBQSP / 'train.jsonl'}",
    ):
        kg.for_example("WebQTrn-9")


def test_views_are_cached_least_recently_used_first():
    kg = SubgraphKG.from_path(ROG_WEBQSP, cache_size=2)
    first = kg.for_example("WebQTrn-0")
    assert kg.for_example("WebQTrn-0") is first
    second = kg.for_example("WebQTrn-1")
    kg.for_example("WebQTrn-0")  # now the most recent: WebQTrn-1 goes next
    third = kg.for_example("WebQTest-0")
    assert kg.for_example("WebQTest-0") is third and kg.for_example("WebQTrn-0") is first
    assert kg.for_example("WebQTrn-1") is not second  # evicted, built again
    with pytest.raises(ValueError, match="cache_size must be >= 1, got 0"):
        SubgraphKG.from_path(ROG_WEBQSP, cache_size=0)


def test_an_id_in_two_files_is_refused(tmp_path):
    for name in ("train.jsonl", "test.jsonl"):
        (tmp_path / name).write_text((ROG_WEBQSP / "test.jsonl").read_text(), encoding="utf-8")
    with pytest.raises(ValueError) as err:
        SubgraphKG.from_path(tmp_path)
    assert (
        str(err.value) == f"{tmp_path / 'train.jsonl'}:1: question id 'WebQTest-0' also at {tmp_path / 'test.jsonl'}:1"
    )


def test_open_kg_spec_and_dataset_kg(kg):
    opened = open_kg(f"subgraph:{ROG_WEBQSP / 'train.jsonl'}", cache_size=4)
    assert isinstance(opened, SubgraphKG) and len(opened) == 2 and opened.cache_size == 4
    with pytest.raises(ValueError, match=r"does not take option\(s\) names \(it takes: cache_size\)"):
        open_kg(f"subgraph:{ROG_WEBQSP}", names={})
    dataset_kg = open_dataset_kg(load_dataset("rog-webqsp", root=FIXTURES))
    assert isinstance(dataset_kg, SubgraphKG) and len(dataset_kg) == 3


def test_tool_session_searches_the_questions_own_graph(kg):
    tool = KGSearchTool(kg, ToolConfig())
    session = tool.session("what is the name of justin bieber brother", BIEBER, example_id="WebQTrn-0")
    # The mediator is expanded: the sibling is shown through it.
    assert session.call("Justin Bieber").text == (
        "(Justin Bieber, people.person.sibling_s, m.0gxnnwc)\n"
        "(m.0gxnnwc, people.sibling_relationship.sibling, Jaxon Bieber)\n"
        "(Justin Bieber, people.person.nationality, Canada)"
    )
    assert session.call("Canada").text == "(Canada, location.country.official_language, English Language)"
    assert session.resolve_answer("jaxon bieber") == ["Jaxon Bieber"]
    other = tool.session(
        "what character did natalie portman play in star wars",
        [TopicEntity("Natalie Portman", "Natalie Portman")],
        example_id="WebQTrn-1",
    )
    assert other.call("Justin Bieber").error == "unknown_entity"
    assert other.call("Natalie Portman").text.startswith("(Natalie Portman, film.actor.film, m.0k5s9k)\n")
    with pytest.raises(ValueError, match="open the search session with the example's id"):
        tool.session("what is the name of justin bieber brother", BIEBER)


def test_evaluation_and_oracle_open_the_questions_graph(kg):
    tool = KGSearchTool(kg, ToolConfig())
    example = QAExample(
        id="WebQTrn-0",
        question="what is the name of justin bieber brother",
        topic_entities=tuple(BIEBER),
        answers=(Answer("Jaxon Bieber", "Jaxon Bieber"),),
        gold_paths=(("people.person.sibling_s", "people.sibling_relationship.sibling"),),
        split="train",
    )
    session = tool.session(example.question, list(example.topic_entities), example_id=example.id)
    assert [e.neighbor for e in session.call("Justin Bieber").edges] == ["m.0gxnnwc", "Jaxon Bieber", "Canada"]
    result = OracleMethod(tool).answer(example)
    assert (result.answers, result.trace["recall"], result.trace["answers_total"]) == (["Jaxon Bieber"], 1.0, 1)
    # A wrong answer that the gold path reaches in this question's graph (the failure categories
    # run the gold path on the same graph the model searched).
    trace = {
        "text": "<think> <search>Justin Bieber</search> </think><answer>Jaxon Bieber</answer>",
        "finish_reason": "answer",
        "answers": ["Jaxon Bieber"],
        "tool_calls": [
            {
                "query": "Justin Bieber",
                "error": None,
                "entity": "Justin Bieber",
                "backtracked": False,
                "shown": [
                    ["Justin Bieber", "people.person.sibling_s", "m.0gxnnwc"],
                    ["m.0gxnnwc", "people.sibling_relationship.sibling", "Jaxon Bieber"],
                ],
            }
        ],
        "entities": [
            ["Justin Bieber", "", "Justin Bieber"],
            ["m.0gxnnwc", "", "m.0gxnnwc"],
            ["Jaxon Bieber", "", "Jaxon Bieber"],
        ],
    }
    wrong = QAExample(**{**example.__dict__, "answers": (Answer("Jazmyn Bieber", "Jazmyn Bieber"),)})
    assert classify_failure(wrong, trace, False, kg) == {
        "category": "data_ambiguity",
        "detail": {
            "kind": "other_object",
            "path": list(example.gold_paths[0]),
            "answer": "Jaxon Bieber",
            "answer_id": "Jaxon Bieber",
            "gold_path_reaches": 1,
            "reached_by_gold_path": True,
        },
    }


def test_gat_ranking_reads_context_from_the_questions_graph(kg):
    import torch

    from kgreasoner.retrieval.encoder import EncoderConfig, build_encoder
    from kgreasoner.retrieval.ranker import GATRanker, RankerModelConfig

    torch.manual_seed(0)
    encoder = build_encoder(EncoderConfig(kind="hashing", hashing_dim=32))
    ranker = GATRanker(RankerModelConfig(dim=32, hidden=8, head_hidden=8, dropout=0.0)).eval()
    tool = KGSearchTool(kg, ToolConfig(ranking="gat"), ranker=ranker, encoder=encoder)
    result = tool.session("what is the name of justin bieber brother", BIEBER, example_id="WebQTrn-0").call(
        "Justin Bieber"
    )
    assert result.error is None
    assert sorted(e.key() for e in result.edges) == [
        ("Justin Bieber", "people.person.nationality", "Canada"),
        ("Justin Bieber", "people.person.sibling_s", "m.0gxnnwc"),
        ("m.0gxnnwc", "people.sibling_relationship.sibling", "Jaxon Bieber"),
    ]


def test_eval_command_runs_on_a_rog_folder(tmp_path):
    import json

    from kgreasoner.cli import main

    assert (
        main(
            [
                "eval",
                "--methods",
                "oracle",
                "--dataset",
                str(ROG_WEBQSP),
                "--split",
                "train",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 0
    )
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["kg"] == f"subgraph:{ROG_WEBQSP.resolve()}"
    rows = [json.loads(line) for line in (tmp_path / "oracle.jsonl").read_text().splitlines()]
    # RoG gives no gold paths: the oracle walks the ones derived on each question's subgraph, where
    # one search of the topic shows the mediator's edge too.
    assert [(r["id"], r["hops"], r["answers"], r["trace"]["path"], r["kg_queries"]) for r in rows] == [
        ("WebQTrn-0", 2, ["Jaxon Bieber"], ["people.person.sibling_s", "people.sibling_relationship.sibling"], 1),
        ("WebQTrn-1", 2, ["Padmé Amidala"], ["film.actor.film", "film.performance.character"], 1),
    ]
