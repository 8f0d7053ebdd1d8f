"""PaRoG's plan / tentative answer / per-sub-objective selection / refine / final flow, scripted."""

import json

import pytest

from kgreasoner.baselines.parog import PaRoGMethod
from kgreasoner.evaluation.metrics import hits_at_1
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.llm import ScriptedLLM
from kgreasoner.records.schema import QAExample

from .conftest import gold_llm

TRIPLES = [
    ("m.f1", "film.directed_by", "m.ann"),
    ("m.ann", "person.nationality", "m.fr"),
    ("m.f1", "film.genre", "m.g1"),
    ("m.f1", "film.genre", "m.g2"),
]
NAMES = {"m.f1": "Film One", "m.ann": "Ann", "m.fr": "France", "m.g1": "Drama", "m.g2": "Horror"}
QUESTION = QAExample.from_dict(
    {
        "id": "q",
        "question": "What is the nationality of the director of Film One?",
        "topic_entities": [{"id": "m.f1", "name": "Film One"}],
        "answers": [{"id": "m.fr", "name": "France"}],
    }
)


@pytest.fixture(scope="module")
def kg():
    return MemoryKG.from_triples(TRIPLES, NAMES)


def scripted(relations=("film.directed_by", "person.nationality"), refine=("Bob", "France"), final='{"A": "Spain"}'):
    """Replies by prompt kind; the n-th relation / refine prompt gets the n-th scripted value."""
    counts = {"relations": 0, "refine": 0}

    def rule(prompt):
        end = prompt.rstrip().rsplit("\n", 1)[-1]
        if end == "Sub-objectives:":
            return 'Plan: ["find the director of Film One", "find the nationality of that director"]'
        if end == "Tentative answers:":
            return '[{"A": "Bob", "R": "I recall"}, {"A": "Spain", "R": "I recall"}]'
        if end == "Selection:" and "Relations:" in prompt:
            counts["relations"] += 1
            chosen = relations[counts["relations"] - 1]
            return json.dumps({"relations": [chosen] if chosen else []})
        if end == "Selection:":
            return '{"entities": ["Drama"]}'
        if end == "Refined answer:":
            counts["refine"] += 1
            return json.dumps({"A": refine[counts["refine"] - 1], "R": "because"})
        return final

    return ScriptedLLM([rule])


def test_kg_evidence_wins_and_earlier_answers_seed_later_objectives(kg):
    llm = scripted()
    result = PaRoGMethod(kg).answer(QUESTION, llm)
    assert [s["kind"] for s in result.trace["steps"]] == [
        "plan",
        "tentative",
        "relations",
        "refine",
        "relations",
        "refine",
        "final",
    ]
    first, second = result.trace["sub_answers"]
    assert first["tentative"] == ["Bob"] and first["answers"] == ["Ann"] and first["overruled"] is True
    assert first["evidence"] == [["Film One", "film.directed_by", "Ann"]]
    assert "Current entities: Ann\n" in llm.prompts[4]  # the first answer seeds the second sub-objective
    assert "Relations:\nperson.nationality\n^film.directed_by\nSelection:" in llm.prompts[4]
    assert "Tentative answer: Spain\nEvidence:\n(Ann, person.nationality, France)" in llm.prompts[5]
    assert second["answers"] == ["France"] and second["overruled"] is False
    assert result.answers == ["France"] and result.format_valid  # the final "Spain" conflicts with the KG
    assert result.trace["steps"][-1]["parsed"] == {"final": ["Spain"], "kept": ["France"], "overruled": True}
    assert result.kg_queries == 2


def test_without_evidence_the_llm_answer_stands_and_is_resolved_on_the_kg(kg):
    llm = scripted(relations=(None, "person.nationality"), refine=("Ann", "France"), final='{"A": "France", "R": "r"}')
    result = PaRoGMethod(kg).answer(QUESTION, llm)
    first, second = result.trace["sub_answers"]
    assert first["evidence"] == [] and first["answers"] == ["Ann"] and first["overruled"] is False
    assert "Evidence:\n(no evidence found)\n" in llm.prompts[3]
    assert second["answers"] == ["France"] and result.answers == ["France"]
    assert result.kg_queries == 1 + 1 + 1  # neighbours of Film One, resolve "Ann", neighbours of Ann


def test_several_candidates_go_through_entity_selection_and_bad_json_is_format_invalid(kg):
    llm = scripted(relations=("film.genre", "x"), refine=("Drama | Comedy", "y"), final="France, surely")
    result = PaRoGMethod(kg).answer(QUESTION, llm)
    assert [s["kind"] for s in result.trace["steps"]][2:5] == ["relations", "entities", "refine"]
    assert "Candidates:\nDrama\nHorror\nSelection:" in llm.prompts[3]
    first = result.trace["sub_answers"][0]
    assert first["evidence"] == [["Film One", "film.genre", "Drama"]]
    assert first["answers"] == ["Drama"] and first["overruled"] is True  # "Comedy" has no KG support
    assert result.format_valid is False


def test_end_to_end_on_the_synthetic_kg(synthetic_data):
    dataset, kg = synthetic_data
    method = PaRoGMethod(kg)
    llm = gold_llm(kg, dataset.examples, "parog")
    hits = 0
    for example in dataset.examples:
        result = method.answer(example, llm)
        assert result.format_valid
        # The script's refined and final answers are always "Wrong Guess": KG evidence overrules them.
        assert all(s["overruled"] for s in result.trace["sub_answers"] if s["evidence"])
        assert "Wrong Guess" not in result.answers
        hits += hits_at_1(result.answers, example.answers)
    assert hits >= 0.9 * len(dataset.examples)
