"""SoG's tool rules (k, p, table format), its turn loop, step cap and answers, with scripted replies."""

import pytest

from kgreasoner.baselines.sog import SoGConfig, SoGMethod
from kgreasoner.evaluation.metrics import hits_at_1
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.llm import ScriptedLLM
from kgreasoner.records.ids import make_literal
from kgreasoner.records.schema import QAExample

from .conftest import gold_llm

TRIPLES = (
    [("m.hub", "hub.thing.alpha", f"m.a{i}") for i in range(30)]
    + [("m.hub", "hub.thing.beta", f"m.b{i}") for i in range(20)]
    + [("m.hub", "hub.thing.gamma", f"m.c{i}") for i in range(11)]
    + [("m.big", "big.item.member", f"m.x{i}") for i in range(1200)]
    + [
        ("m.utah", "location.time_zone", "m.mtz"),
        ("m.utah", "location.founded", make_literal("1896")),
        ("m.colorado", "location.time_zone", "m.mtz"),
    ]
)
NAMES = {
    "m.hub": "Hub",
    "m.big": "Big",
    "m.utah": "Utah",
    "m.mtz": "Mountain | Time",
    "m.colorado": "Colorado",
    **{f"m.a{i}": f"Alpha {i}" for i in range(30)},
}


@pytest.fixture(scope="module")
def kg():
    return MemoryKG.from_triples(TRIPLES, NAMES)


def ask(topic, question="What is it?"):
    return QAExample.from_dict(
        {
            "id": "q",
            "question": question,
            "topic_entities": [{"id": topic, "name": NAMES[topic]}],
            "answers": [{"id": "m.mtz", "name": "Mountain | Time"}],
        }
    )


def replies(*texts):
    """A script that gives the replies in order, by counting the observations in the transcript."""
    return ScriptedLLM([lambda p: texts[min(p.count("\nObservation:\n"), len(texts) - 1)]])


def observation(llm, turn):
    return llm.prompts[turn + 1].rsplit("Observation:\n", 1)[1].rstrip("\n")


def test_more_than_k_rows_without_filter_gives_distinct_properties(kg):
    llm = replies('Action: search("m.hub", "outgoing", [])', "Final answer: {x}")
    result = SoGMethod(kg).answer(ask("m.hub"), llm)
    assert observation(llm, 0) == (
        "61 results, more than 50: only the distinct properties are listed. Search again with "
        "properties_to_filter_for.\n"
        "| property | propertyLabel |\n|---|---|\n"
        "| hub.thing.alpha | thing alpha |\n| hub.thing.beta | thing beta |\n| hub.thing.gamma | thing gamma |"
    )
    assert result.trace["steps"][0]["rows"] == 61 and result.kg_queries == 1


def test_a_filter_returns_rows_and_more_than_p_rows_are_truncated(kg):
    llm = replies(
        'Action: search("Hub", "outgoing", ["thing alpha"])',
        'Action: search("m.big", "outgoing", ["big.item.member"])',
        "Final answer: {x}",
    )
    SoGMethod(kg).answer(ask("m.hub"), llm)
    first = observation(llm, 0).splitlines()
    assert first[:3] == [
        "| property | propertyLabel | value | valueLabel |",
        "|---|---|---|---|",
        "| hub.thing.alpha | thing alpha | m.a0 | Alpha 0 |",
    ]
    assert len(first) == 32
    second = observation(llm, 1).splitlines()
    assert len(second) == 2 + 1000 + 1 and second[-1] == "Truncated: 1000 of 1200 rows shown."
    small = replies('Action: search("m.big", "outgoing", [])', "Final answer: {x}")
    SoGMethod(kg, SoGConfig(k=2000, p=3)).answer(ask("m.big"), small)
    assert observation(small, 0).splitlines()[-1] == "Truncated: 3 of 1200 rows shown."


def test_table_cells_directions_entities_and_the_final_answer(kg):
    llm = replies(
        'I look.\nAction: search("Utah", "outgoing", [])\nObservation: I imagine a result',
        'Action: search("m.mtz", "incoming", ["location.time_zone"])',
        "Both.\nFinal answer: {Mountain | Time}",
    )
    result = SoGMethod(kg).answer(ask("m.utah"), llm)
    assert observation(llm, 0) == (
        "| property | propertyLabel | value | valueLabel |\n|---|---|---|---|\n"
        "| location.time_zone | location time zone | m.mtz | Mountain \\| Time |\n"
        '| location.founded | location founded | "1896" | 1896 |'
    )
    assert "I imagine" not in llm.prompts[1]  # generation stops at "Observation:"
    assert llm.prompts[1].endswith(
        'I look.\nAction: search("Utah", "outgoing", [])\nObservation:\n' + observation(llm, 0) + "\n"
    )
    assert observation(llm, 1).splitlines()[2:] == [
        "| location.time_zone | location time zone | m.utah | Utah |",
        "| location.time_zone | location time zone | m.colorado | Colorado |",
    ]
    # `{Mountain | Time}` is read as two answers: the separator wins over a label that contains it.
    assert result.answers == ["Mountain", "Time"] and result.format_valid
    assert [s["kind"] for s in result.trace["steps"]] == ["search", "search", "final"] and result.kg_queries == 2


def test_unknown_entities_unreadable_actions_and_the_step_cap(kg):
    llm = replies(
        'Action: search("Nowhere", "outgoing", [])', "I am thinking", 'Action: search("m.utah", "incoming", [])'
    )
    result = SoGMethod(kg, SoGConfig(max_steps=4)).answer(ask("m.utah"), llm)
    assert observation(llm, 0).startswith('Unknown entity "Nowhere"')
    assert observation(llm, 1).startswith("Could not read an action.")
    assert observation(llm, 2) == "No results."
    assert len(llm.prompts) == 4 and result.trace["turns"] == 4
    assert result.answers == [] and result.format_valid is False
    assert result.kg_queries == 1 + 1 + 1  # resolve "Nowhere", then two neighbour queries


def test_end_to_end_on_the_synthetic_kg(synthetic_data):
    dataset, kg = synthetic_data
    method = SoGMethod(kg)
    llm = gold_llm(kg, dataset.examples, "sog")
    hits = 0
    for example in dataset.examples:
        metered = llm.metered()
        result = method.answer(example, metered)
        assert result.format_valid
        assert metered.usage.calls == result.kg_queries + 1  # one query per search, then the final answer
        hits += hits_at_1(result.answers, example.answers)
    assert hits == len(dataset.examples)
