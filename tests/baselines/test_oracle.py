"""The oracle walks gold paths through the real search tool: searching what it reaches, paging where top-k cuts."""

import pytest

from kgreasoner.baselines.oracle import OracleConfig, OracleMethod
from kgreasoner.evaluation.metrics import hits_at_1
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.schema import QAExample
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig

TRIPLES = [
    ("m.utah", "capital", "m.slc"),
    ("m.utah", "time_zone", "m.mtz"),
    ("m.utah", "gov.position", "m.cvt"),
    ("m.cvt", "gov.holder", "m.gov"),
    ("m.slc", "mayor", "m.erin"),
]
NAMES = {"m.utah": "Utah", "m.slc": "Salt Lake City", "m.mtz": "Mountain Time Zone", "m.gov": "Gov", "m.erin": "Erin"}


def ask(path, answer):
    return QAExample.from_dict(
        {
            "id": "q",
            "question": "q?",
            "topic_entities": [{"id": "m.utah", "name": "Utah"}],
            "answers": [{"id": answer, "name": NAMES[answer]}],
            "gold_paths": [path],
        }
    )


@pytest.fixture(scope="module")
def kg():
    return MemoryKG.from_triples(TRIPLES, NAMES)


def test_a_relation_cut_by_top_k_is_paged_with_the_filter(kg):
    question = ask(["time_zone"], "m.mtz")
    narrow = OracleMethod(KGSearchTool(kg, ToolConfig(top_k=1))).answer(question)
    # The first page shows the capital and lists `time_zone (1)`; one filtered page shows it.
    assert narrow.answers == ["Mountain Time Zone"] and narrow.trace["recall"] == 1.0 and narrow.kg_queries == 2
    assert narrow.trace["hops"] == [{"relation": "time_zone", "searched": ["m.utah"], "pages": 1, "reached": 1}]
    wide = OracleMethod(KGSearchTool(kg, ToolConfig(top_k=2))).answer(question)
    assert wide.answers == ["Mountain Time Zone"] and wide.kg_queries == 1


def test_two_hops_and_a_mediator_expanded_by_the_tool(kg):
    tool = KGSearchTool(kg, ToolConfig(top_k=10))
    mayor = OracleMethod(tool).answer(ask(["capital", "mayor"], "m.erin"))
    assert mayor.answers == ["Erin"] and mayor.kg_queries == 2
    assert [h["searched"] for h in mayor.trace["hops"]] == [["m.utah"], ["m.slc"]]
    governor = OracleMethod(tool).answer(ask(["gov.position", "gov.holder"], "m.gov"))
    assert governor.answers == ["Gov"] and governor.kg_queries == 1  # the mediator's edge was already shown
    assert (
        OracleMethod(tool)
        .answer(
            QAExample.from_dict({"id": "n", "question": "q?", "topic_entities": [{"id": "m.utah"}], "answers": ["x"]})
        )
        .format_valid
        is False
    )


def test_hits_at_1_is_1_wherever_the_gold_path_is_within_top_k(synthetic_data):
    dataset, kg = synthetic_data
    everything = OracleMethod(KGSearchTool(kg, ToolConfig(top_k=1000, max_chars=10**6)))
    for example in dataset.examples:
        result = everything.answer(example)
        assert hits_at_1(result.answers, example.answers) == 1.0 and result.trace["recall"] == 1.0
    top10 = OracleMethod(KGSearchTool(kg, ToolConfig(top_k=10)))
    pages = 0
    for example in dataset.examples:
        result = top10.answer(example)
        assert hits_at_1(result.answers, example.answers) == 1.0 and result.trace["recall"] == 1.0
        pages += sum(hop["pages"] for hop in result.trace["hops"])
    assert pages > 0  # the default top-k cuts some gold relations on this KG: the filter brought them back


def hub_world():
    """Freedonia: 30 citizens and 15 clubs; Rovers: 15 players; every hub has more lines than top_k (10) over
    several relations, and in KG order citizens come before clubs, so a first page of Freedonia shows no club."""
    triples = [(f"p{i}", "citizen_of", "fr") for i in range(30)]
    triples += [(f"c{i}", "based_in", "fr") for i in range(15)]
    triples += [(f"q{i}", "plays_for", "rovers") for i in range(15)]  # q0..q14 play for Rovers
    triples += [(f"q{i}", "citizen_of", "fr") for i in range(10, 15)]  # ... and five of them are from Freedonia
    triples += [(f"q{i}", "citizen_of", "sylvania") for i in range(10)]
    triples += [("rovers", "based_in", "c_city"), ("c_city", "located_in", "sylvania"), ("rovers", "coach", "boss")]
    triples += [(f"p{i}", "plays_for", f"c{i % 15}") for i in range(30)]
    names = {
        "fr": "Freedonia",
        "sylvania": "Sylvania",
        "rovers": "Rovers",
        "c_city": "Capital City",
        "boss": "Boss",
        **{f"p{i}": f"Player {i}" for i in range(30)},
        **{f"q{i}": f"Rover {i}" for i in range(15)},
        **{f"c{i}": f"Club {i}" for i in range(15)},
    }
    kg = MemoryKG.from_triples(triples, names)

    def ask_(n, topics, paths, answers, intersect=False):
        return QAExample.from_dict(
            {
                "id": f"h{n}",
                "question": "q?",
                "answers": [{"id": a, "name": names[a]} for a in answers],
                "topic_entities": [{"id": t, "name": names[t]} for t in topics],
                "gold_paths": paths,
                "intersect": intersect,
            }
        )

    questions = [
        ask_(0, ["fr"], [["^based_in"]], [f"c{i}" for i in range(15)]),  # the clubs of Freedonia
        ask_(1, ["fr"], [["^based_in", "^plays_for"]], [f"p{i}" for i in range(30)]),  # who plays for its clubs
        ask_(2, ["rovers", "fr"], [["^plays_for"], ["^citizen_of"]], [f"q{i}" for i in range(10, 15)], intersect=True),
        ask_(
            3, ["rovers", "sylvania"], [["^plays_for"], ["^citizen_of"]], [f"q{i}" for i in range(10)], intersect=True
        ),
        ask_(4, ["rovers"], [["based_in", "located_in"]], ["sylvania"]),  # no hub on the way
    ]
    return kg, questions


def test_hubs_over_top_k_hide_no_way_from_the_oracle():
    kg, questions = hub_world()
    tool = KGSearchTool(kg, ToolConfig(top_k=10))
    oracle = OracleMethod(tool)
    results = [oracle.answer(q) for q in questions]
    assert [hits_at_1(r.answers, q.answers) for r, q in zip(results, questions)] == [1.0] * len(questions)
    assert [r.trace["recall"] for r in results] == [1.0] * len(questions)
    # The intersection: the five Rovers who are citizens of Freedonia, no other player of either topic.
    assert sorted(results[2].answers) == [f"Rover {i}" for i in range(10, 15)]
    assert [b["topic"] for b in results[2].trace["branches"]] == ["rovers", "fr"]
    # The plain top-k would have hidden the way: Freedonia's first page shows only citizens, and it is the
    # listing that names the clubs.
    first = tool.session("q?", list(questions[0].topic_entities)).call("Freedonia")
    assert "based_in" not in first.text.split("\nmore:")[0] and first.more == (("citizen_of", 25), ("based_in", 15))
    plain = [OracleMethod(tool, OracleConfig(max_pages=0)).answer(q) for q in questions]
    assert [hits_at_1(r.answers, q.answers) for r, q in zip(plain, questions)] == [0.0, 0.0, 0.0, 1.0, 1.0]
    assert [r.trace["recall"] for r in plain] == [0.0, 0.0, 0.0, 0.8, 1.0]  # Rovers' first page: 8 of its 15 players


def many_relations_hub(relations: int = 400):
    """A hub with `relations` relations of three edges each and one more, `zz_gold`, of one edge whose
    neighbour leads on by `leads_to`: by count the gold relation comes last in every listing."""
    triples = [("hub", f"rel_{r:03d}", f"n{r}_{i}") for r in range(relations) for i in range(3)]
    triples += [("hub", "zz_gold", "mid"), ("mid", "leads_to", "end"), ("hub", "backtrack", "undo")]
    names = {"hub": "Hub", "mid": "Mid", "end": "End", "undo": "Undo"}
    kg = MemoryKG.from_triples(triples, names)
    questions = [
        QAExample.from_dict(
            {
                "id": f"h{n}",
                "question": "q?",
                "topic_entities": [{"id": "hub", "name": "Hub"}],
                "answers": [{"id": answer, "name": names[answer]}],
                "gold_paths": [path],
            }
        )
        for n, (path, answer) in enumerate(
            [(["zz_gold"], "mid"), (["zz_gold", "leads_to"], "end"), (["backtrack"], "undo")]
        )
    ]
    return kg, questions


def test_a_gold_relation_past_the_first_listing_is_listed_with_relations_pages():
    kg, questions = many_relations_hub()
    tool = KGSearchTool(kg, ToolConfig(top_k=10))
    first = tool.session("q?", list(questions[0].topic_entities)).call("Hub")
    assert "zz_gold" not in first.text and first.unlisted > 0 and len(first.text) <= 2000
    assert first.text.splitlines()[-1].endswith(f" and {first.unlisted} more relations")
    for question in questions:
        result = OracleMethod(tool).answer(question)
        assert hits_at_1(result.answers, question.answers) == 1.0 and result.trace["recall"] == 1.0
        # the search, the relations pages up to the one naming the gold relation, its filtered page
        assert result.trace["hops"][0]["pages"] >= 3
    # Without the relations pages the listing never names the gold relation.
    stuck = OracleMethod(tool, OracleConfig(max_pages=1)).answer(questions[0])
    assert stuck.answers == []
