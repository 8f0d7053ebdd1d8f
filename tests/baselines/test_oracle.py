"""The oracle walks gold paths through the real search tool: searching what it reaches, paging where top-k cuts."""

import pytest

from kgreasoner.baselines.oracle import OracleMethod
from kgreasoner.data import QAExample
from kgreasoner.evaluation.metrics import hits_at_1
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig

TRIPLES = [("m.utah", "capital", "m.slc"), ("m.utah", "time_zone", "m.mtz"), ("m.utah", "gov.position", "m.cvt"),
           ("m.cvt", "gov.holder", "m.gov"), ("m.slc", "mayor", "m.erin")]
NAMES = {"m.utah": "Utah", "m.slc": "Salt Lake City", "m.mtz": "Mountain Time Zone", "m.gov": "Gov", "m.erin": "Erin"}


def ask(path, answer):
    return QAExample.from_dict({"id": "q", "question": "q?", "topic_entities": [{"id": "m.utah", "name": "Utah"}],
                                "answers": [{"id": answer, "name": NAMES[answer]}], "gold_paths": [path]})


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
    assert OracleMethod(tool).answer(QAExample.from_dict({
        "id": "n", "question": "q?", "topic_entities": [{"id": "m.utah"}], "answers": ["x"]})).format_valid is False


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
