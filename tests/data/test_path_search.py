"""Gold-path derivation for questions without paths, and `prepare_dataset` folders (`--data PATH`)."""

import json

import pytest

from kgreasoner.data import load_dataset, open_dataset_kg
from kgreasoner.data.path_search import PathSearch, add_gold_paths, find_paths
from kgreasoner.data.prepare import prepare_dataset, source_name
from kgreasoner.kg.base import execute_path
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.schema import Answer, QAExample, TopicEntity, read_jsonl

# Ada was born in Lyon (in France), married Bob through a mediator m1, and has a 1987 birth year.
# Cy was also born in Lyon; Dee in Paris (in France); Lyon and Paris share France.
TRIPLES = [
    ("ada", "born_in", "lyon"),
    ("cy", "born_in", "lyon"),
    ("dee", "born_in", "paris"),
    ("lyon", "in_country", "france"),
    ("paris", "in_country", "france"),
    ("france", "capital", "paris"),
    ("ada", "spouse_s", "m1"),
    ("bob", "spouse_s", "m1"),
    ("m1", "spouse", "ada"),
    ("m1", "spouse", "bob"),
    ("ada", "birth_year", '"1987"'),
    ("eve", "knows", "zed"),
]
NAMES = {n: n.capitalize() for n in ("ada", "bob", "cy", "dee", "lyon", "paris", "france", "eve", "zed")}


@pytest.fixture
def kg() -> MemoryKG:
    s, r, o = zip(*TRIPLES)
    return MemoryKG(s, r, o, NAMES)


def example(topic: str, *answers: Answer, paths=(), hops: int = 0, qid: str = "q") -> QAExample:
    return QAExample(
        id=qid,
        question=f"question about {topic}",
        topic_entities=(TopicEntity(topic, NAMES[topic]),),
        answers=answers,
        gold_paths=paths,
        hops=hops,
    )


def test_one_hop_forward_and_backward(kg):
    assert find_paths(kg, example("ada", Answer("lyon", "Lyon"))) == [("born_in",)]
    assert find_paths(kg, example("lyon", Answer("ada", "Ada"))) == [("^born_in",)]


def test_only_the_shortest_length_is_kept_forward_steps_first_among_equals(kg):
    # Paris from Lyon: France's capital, or France's other cities (Lyon itself is the topic and
    # dropped): both reach Paris only; the path without a backward step comes first.
    found = find_paths(kg, example("lyon", Answer("paris", "Paris")))
    assert found == [("in_country", "capital"), ("in_country", "^in_country")]
    # Ada's country: 2 hops; no 3-hop path is added after it.
    assert find_paths(kg, example("ada", Answer("france", "France"))) == [("born_in", "in_country")]


def test_precision_orders_paths_of_equal_length(kg):
    # Dee from Paris: ^born_in reaches Dee only (1/1). Cy from Ada: (born_in, ^born_in) reaches
    # Cy (Ada is the topic and is dropped): 1/1, the only 2-hop candidate with a hit.
    assert find_paths(kg, example("paris", Answer("dee", "Dee"))) == [("^born_in",)]
    assert find_paths(kg, example("ada", Answer("cy", "Cy"))) == [("born_in", "^born_in")]
    # Cy or Dee from France: (capital, ^born_in) reaches Dee only (1/1) and comes before
    # (^in_country, ^born_in), which reaches Ada, Cy and Dee (2/3).
    assert find_paths(kg, example("france", Answer("cy", "Cy"), Answer("dee", "Dee"))) == [
        ("capital", "^born_in"),
        ("^in_country", "^born_in"),
    ]


def test_mediator_paths_literals_by_label_and_the_topic_only_when_it_is_an_answer(kg):
    # Four 2-hop paths through the mediator reach Bob only; forward first, then by name, three kept.
    assert find_paths(kg, example("ada", Answer("bob", "Bob"))) == [
        ("spouse_s", "spouse"),
        ("^spouse", "spouse"),
        ("spouse_s", "^spouse_s"),
    ]
    # A literal answer named by its value (the id in the question file differs from the KG's).
    assert find_paths(kg, example("ada", Answer("y1987", "1987"))) == [("birth_year",)]
    # The topic as its own answer ("the spouse of Ada's spouse"): paths back to it count. Only
    # Ada has her birth year (1/1); the marriage reaches Ada and Bob (1/2).
    assert find_paths(kg, example("ada", Answer("ada", "Ada")), PathSearch(max_paths=2)) == [
        ("birth_year", "^birth_year"),
        ("spouse_s", "spouse"),
    ]


def test_nothing_found_within_max_hops(kg):
    assert find_paths(kg, example("eve", Answer("ada", "Ada"))) == []
    assert find_paths(kg, example("ada", Answer("france", "France")), PathSearch(max_hops=1)) == []
    assert find_paths(kg, example("eve", Answer("nobody", "Nobody"))) == []


def test_hub_fan_out_is_not_extended(kg):
    # France's cities (2 nodes) exceed max_branch=1, so the 2-hop path through them is never built.
    assert find_paths(kg, example("france", Answer("ada", "Ada")), PathSearch(max_branch=1)) == []
    assert find_paths(kg, example("france", Answer("ada", "Ada"))) == [("^in_country", "^born_in")]


def test_add_gold_paths_fills_only_missing_ones_and_counts(kg):
    given = example("ada", Answer("lyon", "Lyon"), paths=(("born_in",),), hops=1, qid="given")
    missing = example("ada", Answer("france", "France"), qid="missing")
    stuck = example("eve", Answer("ada", "Ada"), qid="stuck")
    out, report = add_gold_paths([given, missing, stuck], kg)
    assert out[0] is given
    assert out[1].gold_paths == (("born_in", "in_country"),) and out[1].hops == 2
    assert out[2] is stuck
    assert report.as_dict() == {"given": 1, "derived": 1, "not_found": 1, "derived_by_length": {"2": 1}}


def test_source_names():
    assert source_name("pathquestion:PQL-3H") == "PQL-3H"
    assert source_name("pathquestion") == "PQ-2H"
    assert source_name("data/folder") == "data/folder"
    with pytest.raises(ValueError, match="unknown PathQuestion set 'PQ-9H'"):
        source_name("pathquestion:PQ-9H")


def test_prepare_a_folder_without_paths_or_splits(tmp_path):
    """The synthetic set with its gold paths and splits removed: derived paths reach the gold
    answers, and the grouped split is made on them."""
    from data_gen.synthetic import write_synthetic

    source = write_synthetic(tmp_path / "full", seed=0, num_entities=300, num_questions=120)
    original = {e.id: e for e in read_jsonl(source / "questions.jsonl")}
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("kb.tsv", "names.tsv"):
        (bare / name).write_bytes((source / name).read_bytes())
    with open(bare / "questions.jsonl", "w", encoding="utf-8") as handle:
        for e in original.values():
            record = e.to_dict()
            del record["gold_paths"], record["hops"], record["split"]
            handle.write(json.dumps(record) + "\n")

    summary = prepare_dataset(str(bare), tmp_path / "out", split_scheme="grouped", seed=0)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == ["kb.tsv", "names.tsv", "prepare.json", "questions.jsonl"]
    assert json.loads((out / "prepare.json").read_text()) == summary
    assert summary["gold_paths"]["derived"] == 120 and summary["gold_paths"]["not_found"] == 0
    assert summary["split_scheme"] == "grouped" and sum(summary["splits"].values()) == 120
    dataset = load_dataset(out)
    assert dataset.split_scheme == "given" and {e.split for e in dataset} == {"train", "dev", "test"}
    kg = open_dataset_kg(dataset)
    same_first = multi_topic = 0
    for e in dataset:
        gold = {a.id for a in e.answers}
        if e.intersect:  # one path per topic entity, each reaching every answer
            assert e.hops == max(map(len, e.gold_paths)) and len(e.gold_paths) == len(e.topic_entities)
            for topic, path in zip(e.topic_entities, e.gold_paths):
                assert gold <= execute_path(kg, topic.id, path), (e.id, path)
            multi_topic += 1
        else:
            assert e.hops == len(e.gold_paths[0]) <= original[e.id].hops
            for path in e.gold_paths:
                assert execute_path(kg, e.topic_entities[0].id, path) & gold, (e.id, path)
        same_first += e.gold_paths[0] == original[e.id].gold_paths[0]
    assert multi_topic == sum(e.intersect for e in original.values()) > 0
    # Shortest first finds the generator's own path first for most questions (a shorter
    # coincidental path wins for the rest, e.g. a 3-hop question with a 1-hop shortcut).
    assert same_first >= 0.6 * len(dataset)


def test_prepare_keeps_given_paths_and_splits_and_refuses_a_kb_less_source(tmp_path):
    from data_gen.synthetic import write_synthetic

    source = write_synthetic(tmp_path / "syn", seed=0, num_entities=300, num_questions=60)
    summary = prepare_dataset(str(source), tmp_path / "out")
    assert summary["split_scheme"] == "given" and summary["gold_paths"] == {
        "given": 60,
        "derived": 0,
        "not_found": 0,
        "derived_by_length": {},
    }
    assert (tmp_path / "out" / "questions.jsonl").read_text() == (source / "questions.jsonl").read_text()
    with pytest.raises(ValueError, match="has no KB file"):
        prepare_dataset(str(source / "questions.jsonl"), tmp_path / "nokb")
