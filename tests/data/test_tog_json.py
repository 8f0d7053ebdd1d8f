"""ToG-style JSON (the data/ folder of IDEA-FinAI/ToG): one hand-written record of each shape."""

import json

import pytest

from kgreasoner.data import load_dataset
from kgreasoner.records.schema import SchemaError
from kgreasoner.records.tog_json import detect_tog_format, load_tog_json, parse_tog_record

CWQ = {
    "ID": "WebQTrn-241_dfb6c97a",
    "compositionality_type": "conjunction",
    "question": "What country bordering France contains an airport that serves Nijmegen?",
    "sparql": "PREFIX ns: <http://rdf.freebase.com/ns/> SELECT DISTINCT ?x WHERE { }",
    "topic_entity": {"m.0f8l9c": "France", "m.05g2b": "Nijmegen"},
    "answer": "Germany",
}
CWQ_ORIGINAL = {
    "ID": "WebQTest-1311_a7365b8c",
    "question": "What country is home to Brussels?",
    "topic_entity": {"m.0177z": "Brussels"},
    "answers": [{"answer": "Belgium", "answer_id": "m.0154j", "aliases": ["Kingdom of Belgium"]}],
}
WEBQSP = {
    "QuestionId": "WebQTest-1472",
    "RawQuestion": "when did romney become governor?",
    "ProcessedQuestion": "when did romney become governor",
    "Parses": [
        {
            "ParseId": "WebQTest-1472.P0",
            "TopicEntityMid": "m.0271_s",
            "InferentialChain": [
                "government.politician.government_positions_held",
                "government.government_position_held.from",
            ],
            "Answers": [{"AnswerType": "Value", "AnswerArgument": "2003-01-02", "EntityName": None}],
        },
        {
            "ParseId": "WebQTest-1472.P1",
            "InferentialChain": None,
            "Answers": [
                {"AnswerType": "Value", "AnswerArgument": "2003-01-02", "EntityName": None},
                {"AnswerType": "Entity", "AnswerArgument": "m.0fkvn", "EntityName": "Governor"},
            ],
        },
    ],
    "topic_entity": {"m.0271_s": "Mitt Romney"},
}
GRAILQA = {
    "qid": 3200562005000,
    "question": "what software has genres that include microsoft outlook and feed reader?",
    "answer": [
        {"answer_type": "Entity", "answer_argument": "m.017xch", "entity_name": "Microsoft Outlook"},
        {"answer_type": "Entity", "answer_argument": "m.0gd_9", "entity_name": "IBM Notes"},
    ],
    "topic_entity": {"m.017xgd": "Personal information manager", "m.075x5v": "News aggregator"},
}
SIMPLEQA = {
    "topic_entity": {"m.02qkg8m": "Madam Satan"},
    "answer": "United States of America",
    "question": "where is the madam satan located",
    "relation": "country",
}


def test_cwq_record():
    example = parse_tog_record(CWQ, "cwq", 0, "cwq.json")
    assert example.id == "WebQTrn-241_dfb6c97a" and example.source == "CWQ" and example.split == "test"
    assert example.question == CWQ["question"]
    assert [(t.id, t.name) for t in example.topic_entities] == [("m.0f8l9c", "France"), ("m.05g2b", "Nijmegen")]
    assert [(a.id, a.name) for a in example.answers] == [("Germany", "Germany")]
    assert example.gold_paths == () and example.hops == 0


def test_cwq_original_answers_with_ids_and_aliases():
    (answer,) = parse_tog_record(CWQ_ORIGINAL, "cwq", 0).answers
    assert (answer.id, answer.name, answer.aliases) == ("m.0154j", "Belgium", ("Kingdom of Belgium",))


def test_webqsp_record_values_entities_and_chains():
    example = parse_tog_record(WEBQSP, "webqsp", 5)
    assert example.question == "when did romney become governor?"  # RawQuestion, as ToG reads it
    assert [(a.id, a.name) for a in example.answers] == [('"2003-01-02"', "2003-01-02"), ("m.0fkvn", "Governor")]
    assert example.gold_paths == (
        ("government.politician.government_positions_held", "government.government_position_held.from"),
    )
    assert example.hops == 2 and example.source == "WebQSP" and example.id == "WebQTest-1472"


def test_grailqa_record():
    example = parse_tog_record(GRAILQA, "grailqa", 0)
    assert example.id == "3200562005000" and example.source == "GrailQA"
    assert [(a.id, a.name) for a in example.answers] == [("m.017xch", "Microsoft Outlook"), ("m.0gd_9", "IBM Notes")]
    value = {**GRAILQA, "answer": [{"answer_type": "Value", "answer_argument": "1998"}]}
    assert [(a.id, a.name) for a in parse_tog_record(value, "grailqa", 0).answers] == [('"1998"', "1998")]


def test_simpleqa_record_numbered_by_position():
    example = parse_tog_record(SIMPLEQA, "simpleqa", 12)
    assert example.id == "SimpleQuestions-000012" and example.source == "SimpleQuestions"
    assert [a.name for a in example.answers] == ["United States of America"]
    assert example.topic_entities[0].name == "Madam Satan"
    assert parse_tog_record({**SIMPLEQA, "answer": ""}, "simpleqa", 12) is None  # nothing to score


@pytest.mark.parametrize(
    "record, name, fmt",
    [
        (CWQ, "x.json", "cwq"),
        (CWQ_ORIGINAL, "x.json", "cwq"),
        (WEBQSP, "x.json", "webqsp"),
        (GRAILQA, "x.json", "grailqa"),
        (SIMPLEQA, "x.json", "simpleqa"),
        (SIMPLEQA, "cwq.json", "cwq"),
        (GRAILQA, "graliqa.json", "grailqa"),
        (CWQ, "WebQSP.json", "webqsp"),
    ],
)
def test_format_from_file_name_then_shape(record, name, fmt):
    assert detect_tog_format(record, name) == fmt


@pytest.mark.parametrize(
    "record, fmt, message",
    [
        (
            {k: v for k, v in CWQ.items() if k != "question"},
            "cwq",
            "missing field 'question' (or RawQuestion, ProcessedQuestion)",
        ),
        ({k: v for k, v in CWQ.items() if k != "topic_entity"}, "cwq", "missing field 'topic_entity'"),
        ({**CWQ, "topic_entity": ["m.0f8l9c"]}, "cwq", "field 'topic_entity' must be a dict, got list"),
        ({**CWQ, "topic_entity": {}}, "cwq", "field 'topic_entity' is empty"),
        ({k: v for k, v in CWQ.items() if k != "answer"}, "cwq", "missing field 'answer'"),
        ({**CWQ, "question": 3}, "cwq", "field 'question' must be a non-empty string"),
        ({k: v for k, v in WEBQSP.items() if k != "Parses"}, "webqsp", "missing field 'Parses'"),
        (
            {**WEBQSP, "Parses": [{"Answers": [{"EntityName": "x"}]}]},
            "webqsp",
            "missing field 'Parses[0].Answers[0].AnswerArgument'",
        ),
        (
            {**WEBQSP, "Parses": [{"Answers": [], "InferentialChain": "a.b"}]},
            "webqsp",
            "field 'Parses[0].InferentialChain' must be a list",
        ),
        ({**GRAILQA, "answer": [{"entity_name": "x"}]}, "grailqa", "missing field 'answer[0].answer_argument'"),
        ({**SIMPLEQA, "answer": ["x"]}, "simpleqa", "field 'answer' must be a str, got list"),
        ("just a string", "cwq", "expected a JSON object, got str"),
    ],
)
def test_errors_name_file_record_and_field(record, fmt, message):
    with pytest.raises(SchemaError) as err:
        parse_tog_record(record, fmt, 4, "data/x.json")
    assert str(err.value).startswith("data/x.json: record 4: ")
    assert message in str(err.value)


def test_load_file_skips_unanswerable_and_reads_webqsp_wrapper(tmp_path, caplog):
    unanswerable = {**WEBQSP, "QuestionId": "WebQTest-9", "Parses": [{"Answers": []}]}
    path = tmp_path / "WebQSP.json"
    path.write_text(json.dumps({"Version": "1.0", "Questions": [WEBQSP, unanswerable, WEBQSP]}), encoding="utf-8")
    examples = load_tog_json(path)
    assert [e.id for e in examples] == ["WebQTest-1472", "WebQTest-1472"]
    assert "skipped 1 record(s) with no answers (first: record 1)" in caplog.text


def test_load_errors_name_the_file(tmp_path):
    path = tmp_path / "cwq.json"
    path.write_text('[\n  {"question": "q",\n  ]', encoding="utf-8")
    with pytest.raises(SchemaError, match=rf"^{path}:3: not valid JSON"):
        load_tog_json(path)
    path.write_text(json.dumps([CWQ, {**CWQ, "topic_entity": None}]), encoding="utf-8")
    with pytest.raises(SchemaError, match=rf"^{path}: record 1: field 'topic_entity' must be a dict, got NoneType"):
        load_tog_json(path)
    path.write_text(json.dumps({"question": "q"}), encoding="utf-8")
    with pytest.raises(SchemaError, match="expected a JSON array of records, got dict"):
        load_tog_json(path)


def test_load_dataset_keeps_the_test_split(tmp_path):
    path = tmp_path / "grailqa.json"
    path.write_text(json.dumps([GRAILQA, GRAILQA]), encoding="utf-8")
    dataset = load_dataset(path)
    assert (dataset.name, dataset.kb_path, dataset.split_scheme, len(dataset)) == ("grailqa", None, "given", 2)
    assert [e.split for e in dataset] == ["test", "test"]
    (tmp_path / "tog").mkdir()
    (tmp_path / "tog" / "SimpleQA.json").write_text(json.dumps([SIMPLEQA]), encoding="utf-8")
    named = load_dataset("SimpleQA", root=tmp_path)
    assert named.name == "SimpleQuestions" and named.examples[0].source == "SimpleQuestions"
    with pytest.raises(FileNotFoundError, match="no file for cwq"):
        load_dataset("cwq", root=tmp_path)
