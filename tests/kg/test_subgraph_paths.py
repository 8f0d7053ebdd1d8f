"""Gold paths of RoG's questions, which come without any: derived on each question's own subgraph
(`with_derived_paths`), and the ranker's labels made there, over hand-made records in RoG's JSONL
schema."""

import json

import pytest

from kgreasoner.data import load_dataset, open_dataset_kg
from kgreasoner.data.path_search import with_derived_paths
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.schema import Answer, QAExample, TopicEntity
from kgreasoner.retrieval.labels import label_groups

# The same two people in every record. q-cvt's graph has the marriage through a mediator (a mid,
# so an unnamed node); q-direct's has a direct edge as well, which q-cvt must not see; q-lost's
# graph does not hold the answer; q-two asks for one of Ada's two children, whom one backward
# edge names alone.
RECORDS = [
    {
        "id": "q-cvt",
        "question": "who is ada's husband",
        "answer": ["Bob"],
        "q_entity": ["Ada"],
        "graph": [
            ["Ada", "people.person.spouse_s", "m.01"],
            ["m.01", "people.marriage.spouse", "Bob"],
            ["Ada", "people.person.place_of_birth", "Lyon"],
        ],
    },
    {
        "id": "q-direct",
        "question": "who did ada marry",
        "answer": ["Bob"],
        "q_entity": ["Ada"],
        "graph": [
            ["Ada", "people.person.married_to", "Bob"],
            ["Ada", "people.person.spouse_s", "m.01"],
            ["m.01", "people.marriage.spouse", "Bob"],
        ],
    },
    {
        "id": "q-lost",
        "question": "where was bob born",
        "answer": ["Paris"],
        "q_entity": ["Bob"],
        "graph": [["Bob", "people.person.nationality", "France"], ["France", "location.country.capital", "Lyon"]],
    },
    {
        "id": "q-two",
        "question": "who is a child of ada",
        "answer": ["Cy"],
        "q_entity": ["Ada"],
        "graph": [
            ["Ada", "people.person.children", "Cy"],
            ["Ada", "people.person.children", "Dee"],
            ["Cy", "people.person.parents", "Ada"],
            ["Ada", "people.person.place_of_birth", "Lyon"],
        ],
    },
]


@pytest.fixture
def dataset(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps({**r, "a_entity": r["answer"], "choices": []}) + "\n" for r in RECORDS))
    return load_dataset(path)


def test_paths_are_derived_on_each_questions_own_subgraph(dataset):
    kg = open_dataset_kg(dataset)
    derived = {e.id: with_derived_paths(e, kg) for e in dataset.examples}
    assert {qid: (e.gold_paths, e.hops) for qid, e in derived.items()} == {
        # Through the mediator: the direct edge of q-direct's graph is not in q-cvt's.
        "q-cvt": ((("people.person.spouse_s", "people.marriage.spouse"),), 2),
        # The shortest length only: the 2-hop path through the mediator is not kept.
        "q-direct": ((("people.person.married_to",),), 1),
        # No path: the answer is not in the subgraph; the question stays as it was.
        "q-lost": ((), 0),
        # Only Cy names Ada as a parent (1/1); Ada's children are Cy and Dee (1/2): most precise first.
        "q-two": ((("^people.person.parents",), ("people.person.children",)), 1),
    }
    assert derived["q-lost"] is dataset.examples[2]


def test_given_paths_and_shared_kgs_are_left_alone(dataset):
    kg = open_dataset_kg(dataset)
    given = QAExample(**{**dataset.examples[0].__dict__, "gold_paths": (("people.person.married_to",),), "hops": 1})
    assert with_derived_paths(given, kg) is given
    # One KG for every question (a KB file, Freebase): paths come from `kgreasoner prepare-data`, not here.
    shared = MemoryKG.from_triples([("Ada", "people.person.married_to", "Bob")])
    example = QAExample(
        id="q",
        question="who did ada marry",
        topic_entities=(TopicEntity("Ada", "Ada"),),
        answers=(Answer("Bob", "Bob"),),
    )
    assert with_derived_paths(example, shared) is example


def test_ranker_labels_derive_paths_and_read_each_questions_own_subgraph(dataset):
    groups = label_groups(open_dataset_kg(dataset), dataset.examples, negative_ratio=None)
    assert [
        (g.question_id, g.entity, g.hop, [(c.path_relations, c.target) for c in g.candidates], g.labels)
        for g in groups
    ] == [
        # Ada's candidates in q-cvt's graph: the marriage through the mediator, and her birthplace.
        (
            "q-cvt",
            "Ada",
            0,
            [
                (("people.person.spouse_s", "people.marriage.spouse"), "Bob"),
                (("people.person.place_of_birth",), "Lyon"),
            ],
            [1, 0],
        ),
        # In q-direct's graph the direct edge, which q-cvt's candidates above do not have.
        (
            "q-direct",
            "Ada",
            0,
            [(("people.person.married_to",), "Bob"), (("people.person.spouse_s", "people.marriage.spouse"), "Bob")],
            [1, 0],
        ),
        # q-lost has no path, so no group; q-two's Ada is labelled once, along its first path.
        (
            "q-two",
            "Ada",
            0,
            [
                (("people.person.children",), "Cy"),
                (("people.person.children",), "Dee"),
                (("people.person.place_of_birth",), "Lyon"),
                (("^people.person.parents",), "Cy"),
            ],
            [0, 0, 0, 1],
        ),
    ]
