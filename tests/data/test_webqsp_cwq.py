"""The official WebQSP and CWQ releases: hand-made files in their exact schema (tests/data/fixtures)."""

import json
import logging
import shutil
from pathlib import Path

import pytest

from kgreasoner.data import load_dataset
from kgreasoner.records.schema import Answer, SchemaError, TopicEntity
from kgreasoner.records.webqsp_cwq import load_cwq, load_webqsp, split_from_filename

FIXTURES = Path(__file__).parent / "fixtures"
WEBQSP = FIXTURES / "webqsp-official"
CWQ = FIXTURES / "cwq-official"


def test_webqsp_train_file(caplog):
    with caplog.at_level(logging.WARNING):
        examples = load_webqsp(WEBQSP / "WebQSP.train.json")
    assert [e.id for e in examples] == ["WebQTrn-0", "WebQTrn-2"]  # WebQTrn-1 has no topic and no answer
    assert "skipped 1 question(s) with no answer or no topic entity (first: index 1)" in caplog.text
    bieber, utah = examples
    assert bieber.question == "what is the name of justin bieber brother?"
    assert bieber.topic_entities == (TopicEntity("m.06w2sn5", "Justin Bieber"),)  # both parses, one topic
    assert bieber.answers == (Answer("m.0gxnnwq", "Jaxon Bieber"), Answer("m.0gxnnwc", "Jazmyn Bieber"))
    assert bieber.gold_paths == (("people.person.sibling_s", "people.sibling_relationship.sibling"),)
    assert (bieber.hops, bieber.source, bieber.split) == (2, "WebQSP", "train")
    assert utah.answers == (Answer('"1896-01-04"', "1896-01-04"),)  # a Value answer gets a literal id
    assert (utah.hops, utah.split) == (1, "train")


def test_webqsp_folder_has_train_and_test():
    dataset = load_dataset("webqsp-official", root=FIXTURES)
    assert (dataset.name, dataset.kb_path, dataset.kg_spec, dataset.split_scheme) == ("WebQSP", None, None, "given")
    assert [(e.id, e.split) for e in dataset] == [
        ("WebQTrn-0", "train"),
        ("WebQTrn-2", "train"),
        ("WebQTest-0", "test"),
    ]
    assert [e.id for e in dataset.split("train")] == ["WebQTrn-0", "WebQTrn-2"]


def test_cwq_topics_come_from_the_sparql(caplog):
    with caplog.at_level(logging.WARNING):
        examples = load_cwq(CWQ / "ComplexWebQuestions_train.json")
    assert "ComplexWebQuestions_train.json: skipped 1 question(s)" in caplog.text  # the one with no answers
    (example,) = examples
    assert example.id == "WebQTrn-0_6a4b9d1ba3dbe0fa4f1f0a9e0e7d7f33"
    assert example.question == "What is the name of Justin Bieber's brother who is male?"
    # Every Freebase constant of the query, in order of first appearance, named by its mid.
    assert example.topic_entities == (TopicEntity("m.06w2sn5", "m.06w2sn5"), TopicEntity("m.05zppz", "m.05zppz"))
    assert example.answers == (Answer("m.0gxnnwq", "Jaxon Bieber", ("Jaxon",)),)
    assert (example.gold_paths, example.hops, example.source, example.split) == ((), 0, "CWQ", "train")


def test_cwq_folder_has_train_dev_and_test():
    dataset = load_dataset("cwq-official", root=FIXTURES)
    assert [(e.id[:10], e.split) for e in dataset] == [
        ("WebQTrn-0_", "train"),
        ("WebQTrn-2_", "dev"),
        ("WebQTest-7", "test"),
    ]
    test = dataset.split("test")[0]
    assert [t.id for t in test.topic_entities] == ["m.02hczc", "m.0ghkd"]  # m.02hczc is written twice
    assert dataset.split("dev")[0].answers[0].aliases == ("MST", "Mountain Standard Time")


def test_json_files_are_told_apart_by_shape(tmp_path):
    assert load_dataset(WEBQSP / "WebQSP.test.json").split("test")[0].id == "WebQTest-0"
    assert [e.split for e in load_dataset(CWQ / "ComplexWebQuestions_dev.json")] == ["dev"]
    tog = tmp_path / "cwq.json"  # ToG's CWQ: topic_entity given, one answer name, all test
    tog.write_text(
        json.dumps(
            [{"ID": "q1", "question": "Where?", "topic_entity": {"m.1": "A"}, "answer": "B", "sparql": "ns:m.1"}]
        )
    )
    (example,) = load_dataset(tog)
    assert (example.topic_entities, example.split) == ((TopicEntity("m.1", "A"),), "test")


@pytest.mark.parametrize(
    "name, split",
    [
        ("WebQSP.train.json", "train"),
        ("WebQSP.test.json", "test"),
        ("ComplexWebQuestions_dev.json", "dev"),
        ("validation-00000-of-00001.parquet", "dev"),
        ("train-00001-of-00002.parquet", "train"),
        ("test.jsonl", "test"),
    ],
)
def test_split_from_filename(name, split):
    assert split_from_filename(Path("/data") / name) == split


def test_split_from_filename_errors():
    with pytest.raises(
        ValueError,
        match=(
            r"^/d/WebQSP.json: the file name has no split word; name it with one of train, dev \(or validation\), "
            r"test$"
        ),
    ):
        split_from_filename("/d/WebQSP.json")
    with pytest.raises(ValueError, match=r"^x/train_test.json: the file name has several splits \(test, train\);"):
        split_from_filename("x/train_test.json")


def _write(tmp_path: Path, name: str, data) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def _webqsp_question() -> dict:
    return json.loads((WEBQSP / "WebQSP.test.json").read_text())["Questions"][0]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda q: q.pop("RawQuestion"), "Questions[0]: missing field 'RawQuestion'"),
        (lambda q: q.update(QuestionId=7), "Questions[0]: field 'QuestionId' must be a str, got int"),
        (
            lambda q: q["Parses"][0].update(TopicEntityMid=""),
            "Questions[0]: field 'Parses[0].TopicEntityMid' must be a non-empty string or null, got ''",
        ),
        (
            lambda q: q["Parses"][0].update(TopicEntityName=3),
            "Questions[0]: field 'Parses[0].TopicEntityName' must be a string or null",
        ),
        (
            lambda q: q["Parses"][0]["Answers"][0].pop("AnswerArgument"),
            "Questions[0]: missing field 'Parses[0].Answers[0].AnswerArgument'",
        ),
        (
            lambda q: q["Parses"][0].update(InferentialChain="a.b"),
            "Questions[0]: field 'Parses[0].InferentialChain' must be a list of relation strings",
        ),
    ],
)
def test_webqsp_errors_name_file_question_and_field(tmp_path, change, message):
    question = _webqsp_question()
    change(question)
    path = _write(
        tmp_path, "WebQSP.train.json", {"Version": "1.0", "FreebaseVersion": "2015-08-09", "Questions": [question]}
    )
    with pytest.raises(SchemaError) as err:
        load_webqsp(path)
    assert str(err.value) == f"{path}: {message}"


def test_webqsp_top_level_must_be_the_release(tmp_path):
    path = _write(tmp_path, "WebQSP.train.json", [_webqsp_question()])
    with pytest.raises(
        SchemaError,
        match=r'expected the WebQSP release\'s top level \{"Version", "FreebaseVersion", "Questions": \[...\]\}',
    ):
        load_webqsp(path)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.pop("sparql"), "record 0: missing field 'sparql'"),
        (lambda r: r.update(sparql=None), "record 0: field 'sparql' must be a str, got NoneType"),
        (lambda r: r.update(question="  "), "record 0: field 'question' is empty"),
        (
            lambda r: r["answers"][0].update(answer=""),
            "record 0: field 'answers[0].answer' must be a non-empty string",
        ),
    ],
)
def test_cwq_errors_name_file_record_and_field(tmp_path, change, message):
    record = json.loads((CWQ / "ComplexWebQuestions_test.json").read_text())[0]
    change(record)
    path = _write(tmp_path, "ComplexWebQuestions_test.json", [record])
    with pytest.raises(SchemaError) as err:
        load_cwq(path)
    assert str(err.value) == f"{path}: {message}"


def test_cwq_topics_keep_the_order_of_the_query(tmp_path):
    record = json.loads((CWQ / "ComplexWebQuestions_test.json").read_text())[0]
    record["sparql"] = " ".join(
        f"?x ns:r ns:{mid} ." for mid in ("m.05", "g.11b", "m.03", "m.04", "m.05", "m.01", "m.02")
    )
    path = _write(tmp_path, "ComplexWebQuestions_test.json", [record])
    assert [t.id for t in load_cwq(path)[0].topic_entities] == ["m.05", "g.11b", "m.03", "m.04", "m.01", "m.02"]


def test_cwq_record_without_freebase_constant_is_skipped(tmp_path, caplog):
    record = json.loads((CWQ / "ComplexWebQuestions_test.json").read_text())[0]
    record["sparql"] = 'SELECT ?x WHERE { ?x ns:common.topic.alias "Utah"@en }'
    path = _write(tmp_path, "ComplexWebQuestions_test.json", [record])
    with caplog.at_level(logging.WARNING):
        assert load_cwq(path) == []
    assert "skipped 1 question(s) with no answer or no topic entity (first: index 0)" in caplog.text


def test_release_folder_without_its_files(tmp_path):
    (tmp_path / "cwq-official").mkdir()
    shutil.copy(WEBQSP / "WebQSP.test.json", tmp_path / "cwq-official")
    with pytest.raises(
        FileNotFoundError, match=r"cwq-official: no file of CWQ \(looked for complexwebquestions_train.json, "
    ):
        load_dataset("cwq-official", root=tmp_path)
