"""QA schema errors name file, line and field; answers normalise the same way everywhere."""

import dataclasses
import json

import pytest

from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import QAExample, SchemaError, read_jsonl, write_jsonl

GOOD = {
    "id": "q1",
    "question": "what timezone is utah in",
    "topic_entities": [{"id": "m.07srw", "name": "Utah"}],
    "answers": [{"id": "m.02hczc", "name": "Mountain Time Zone", "aliases": ["MST"]}],
    "gold_paths": [["location.location.time_zones"]],
    "split": "test",
}


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_round_trip_keeps_every_field_and_extra(tmp_path):
    example = QAExample.from_dict({**GOOD, "path_entities": ["m.07srw", "m.02hczc"]})
    assert example.hops == 1 and example.extra == {"path_entities": ["m.07srw", "m.02hczc"]}
    assert QAExample.from_dict(example.to_dict()) == example
    assert QAExample.from_dict(example.to_dict()).extra == example.extra
    path = tmp_path / "q.jsonl"
    assert write_jsonl([example, dataclasses.replace(example, id="q2", split="train")], path) == 2
    back = read_jsonl(path)
    assert [e.split for e in back] == ["test", "train"]
    assert back[0] == example and back[0].extra == example.extra


def test_bad_json_names_file_and_line(tmp_path):
    path = write_lines(tmp_path / "q.jsonl", [json.dumps(GOOD), "", '{"id": "q2", "question": '])
    with pytest.raises(SchemaError, match=rf"^{tmp_path}/q.jsonl:3: not valid JSON"):
        read_jsonl(path)


def test_missing_field_names_file_line_and_field(tmp_path):
    record = {k: v for k, v in GOOD.items() if k != "answers"}
    path = write_lines(tmp_path / "q.jsonl", [json.dumps(GOOD), json.dumps(record)])
    with pytest.raises(SchemaError, match=rf"^{tmp_path}/q.jsonl:2: missing field 'answers'$"):
        read_jsonl(path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"question": 7}, "field 'question' has type int"),
        ({"topic_entities": "Utah"}, "field 'topic_entities' has type str"),
        ({"topic_entities": [{"name": "Utah"}]}, "field 'topic_entities[0]' needs a string 'id'"),
        ({"answers": [{"aliases": ["x"]}]}, "field 'answers[0]' needs an 'id' or a 'name'"),
        ({"answers": [{"name": "A", "aliases": "B"}]}, "field 'answers[0].aliases' must be a list of strings"),
        ({"gold_paths": ["location.location.time_zones"]}, "field 'gold_paths' must be a list of lists"),
        ({"hops": "2"}, "field 'hops' has type str"),
        ({"split": "validation"}, "field 'split' must be one of train/dev/test, got 'validation'"),
    ],
)
def test_wrong_type_names_file_line_and_field(tmp_path, change, message):
    path = write_lines(tmp_path / "q.jsonl", [json.dumps({**GOOD, **change})])
    with pytest.raises(SchemaError) as err:
        read_jsonl(path)
    assert str(err.value).startswith(f"{path}:1: ")
    assert message in str(err.value)


@pytest.mark.parametrize(
    "a, b",
    [
        ("United Kingdom", "united kingdom"),  # case
        ("united_kingdom", "United Kingdom"),  # underscores vs spaces
        ("Washington, D.C.", "washington d c"),  # punctuation
        ("PG_(USA)", "pg usa"),  # PathQuestion names with parentheses
        ("The Beatles", "beatles"),  # leading article
        ("Gone with the Wind", "gone with wind"),  # inner article
        ("Beyoncé Knowles", "beyonce knowles"),  # accents
        ("São Paulo", "Sao_Paulo"),
        ("  A   Tale ", "tale"),  # whitespace
    ],
)
def test_normalize_answer_equates(a, b):
    assert normalize_answer(a) == normalize_answer(b)


def test_normalize_answer_exact_outputs_and_distinctions():
    assert normalize_answer("The_United-Kingdom!") == "united kingdom"
    assert normalize_answer("Ångström") == "angstrom"
    assert normalize_answer("Hard_Times_(live)") == "hard times live"
    assert normalize_answer("Hard_Times_(live)") != normalize_answer("Hard_Times")
    assert normalize_answer("Theatre") == "theatre"  # 'the' only as a whole word


def test_a_repeated_id_names_both_lines(tmp_path):
    path = write_lines(
        tmp_path / "q.jsonl",
        [json.dumps(GOOD), json.dumps({**GOOD, "id": "q2"}), "", json.dumps({**GOOD, "question": "again?"})],
    )
    with pytest.raises(SchemaError) as err:
        read_jsonl(path)
    assert str(err.value) == f"{path}:4: duplicate id 'q1' (first at {path}:1)"


@pytest.mark.parametrize("split, shown", [(0, "0"), (False, "false"), (1, "1"), (["test"], '["test"]')])
def test_a_split_that_is_not_a_string_is_refused(tmp_path, split, shown):
    path = write_lines(tmp_path / "q.jsonl", [json.dumps({**GOOD, "split": split})])
    with pytest.raises(SchemaError) as err:
        read_jsonl(path)
    assert str(err.value) == f"{path}:1: field 'split' must be a string (train, dev or test), got {shown}"


def test_null_split_and_a_byte_order_mark_are_fine(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({**GOOD, "split": None}).encode() + b"\n")
    [example] = read_jsonl(path)
    assert example.id == "q1" and example.split == ""


def test_unreadable_lines_are_named_not_raised_as_tracebacks(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b'\n{"id": "q\xff2"}\n')
    with pytest.raises(SchemaError, match=rf"^{path}:2: not UTF-8 \(byte 0xff at column 10\)$"):
        read_jsonl(path)
    path.write_text(json.dumps(GOOD) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n", encoding="utf-8")
    with pytest.raises(SchemaError, match=rf"^{path}:2: JSON nested too deeply$"):
        read_jsonl(path)
    path.write_text("\n \n", encoding="utf-8")
    with pytest.raises(SchemaError, match=rf"^{path}: no examples \(the file is empty\)$"):
        read_jsonl(path)


def test_a_multi_topic_example_needs_two_topics_and_one_path_per_topic_or_none(tmp_path):
    def example(topics: int, paths: int) -> dict:
        return {
            "id": "q",
            "question": "which player of club X is from Y?",
            "answers": [{"id": "p", "name": "P"}],
            "topic_entities": [{"id": f"t{i}", "name": f"T{i}"} for i in range(topics)],
            "gold_paths": [["plays_for"]] * paths,
            "intersect": True,
            "split": "train",
            "hops": 1,
        }

    for topics, paths, message in [
        (1, 1, "'intersect' needs two or more topic entities"),
        (2, 1, "'intersect' needs one gold path per topic entity, two or more"),
    ]:
        path = tmp_path / f"{topics}-{paths}.jsonl"
        path.write_text(json.dumps(example(topics, paths)) + "\n")
        with pytest.raises(SchemaError, match=f"{path}:1: example q: {message}"):
            read_jsonl(path)
    path = tmp_path / "no-paths.jsonl"  # a source without paths gets them from path search
    path.write_text(json.dumps(example(2, 0)) + "\n")
    assert [e.intersect for e in read_jsonl(path)] == [True]


def test_warm_up_records_go_through_the_one_jsonl_writer(tmp_path):
    from kgreasoner.records.schema import TopicEntity
    from kgreasoner.records.trajectories import Segment, WarmupRecord, read_warmup, write_warmup

    block = Segment("\n<triples>\n(Gödel, né à, Brno)\n</triples>\n", False)
    record = WarmupRecord(
        id="w1",
        question="où est né Gödel ?",
        topic_entities=(TopicEntity("e1", "Gödel"),),
        segments=(Segment("<think>", True), block),
    )
    path = write_warmup([record], tmp_path / "new" / "warmup.jsonl")
    assert path == tmp_path / "new" / "warmup.jsonl"
    assert "Gödel" in path.read_text(encoding="utf-8")  # written as it is, not \u-escaped
    assert read_warmup(path) == [record]


def test_a_line_over_the_size_limit_is_refused_naming_line_size_and_limit(tmp_path):
    from kgreasoner.records.schema import MAX_LINE_BYTES

    def line(qid: str, question_bytes: int) -> bytes:
        return json.dumps({**GOOD, "id": qid, "question": "x" * question_bytes}).encode()

    room = MAX_LINE_BYTES - len(line("q1", 0))
    at_limit = [line("q1", room), line("q2", room)]
    assert [len(x) for x in at_limit] == [MAX_LINE_BYTES] * 2
    path = tmp_path / "questions.jsonl"
    path.write_bytes(b"\n".join(at_limit))
    assert [len(e.question) for e in read_jsonl(path)] == [room, room]
    over = line("q3", 100 * MAX_LINE_BYTES)
    path.write_bytes(at_limit[0] + b"\n" + over + b"\n" + at_limit[1])
    with pytest.raises(SchemaError) as refused:
        read_jsonl(path)
    assert str(refused.value) == (
        f"{path}:2: a line of {len(over):,} bytes, over the limit of 1,048,576 bytes per line; "
        "no question, trajectory or triple is that long: is the file broken?"
    )
    path.write_bytes(over)  # the last line, without a newline
    with pytest.raises(SchemaError, match=f"^{path}:1: a line of {len(over):,} bytes, over the limit"):
        read_jsonl(path)


def test_an_object_naming_a_key_twice_is_refused_naming_line_and_key(tmp_path):
    line = json.dumps(GOOD)
    twice = line[:-1] + ', "question": "what time zone is france in"}'
    nested = json.dumps({**GOOD, "answers": "ANSWERS"}).replace('"ANSWERS"', '[{"id": "a", "name": "A", "id": "b"}]')
    path = tmp_path / "questions.jsonl"
    for text, key in ((twice, "question"), (nested, "id")):
        path.write_text(line + "\n" + text + "\n", encoding="utf-8")
        with pytest.raises(SchemaError) as refused:
            read_jsonl(path)
        assert str(refused.value) == (
            f"{path}:2: key {key!r} appears twice in one object (a JSON reader keeps only the last value)"
        )
