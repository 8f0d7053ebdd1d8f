"""`kgreasoner prepare-data` on careless input: errors name the problem; nothing stale or overwritten survives."""

from __future__ import annotations

import json

import pytest

from kgreasoner.cli import main
from kgreasoner.data import load_dataset
from kgreasoner.data.prepare import prepare_dataset

KB = "e.utah\tcapital\te.slc\ne.slc\tcontained_by\te.utah\n"
NAMES = "e.utah\tUtah\ne.slc\tSalt Lake City\n"


def _question(qid: str, path: list[str], split: str = "train") -> str:
    return (
        json.dumps(
            {
                "id": qid,
                "question": "what is the capital of utah",
                "split": split,
                "topic_entities": [{"id": "e.utah", "name": "Utah"}],
                "answers": [{"id": "e.slc", "name": "Salt Lake City"}],
                "gold_paths": [path],
            }
        )
        + "\n"
    )


def _folder(path, names: bool = True, gold: list[str] | None = None):
    path.mkdir()
    (path / "kb.tsv").write_text(KB, encoding="utf-8")
    if names:
        (path / "names.tsv").write_text(NAMES, encoding="utf-8")
    (path / "questions.jsonl").write_text(
        _question("q1", gold or ["capital"]) + _question("q2", ["^contained_by"], "test"), encoding="utf-8"
    )
    return path


def test_preparing_into_the_source_folder_is_refused_and_changes_nothing(tmp_path, capsys):
    source = _folder(tmp_path / "d")
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    assert main(["prepare-data", str(source), "--out", str(source)]) == 1
    assert capsys.readouterr().err == (
        f"kgreasoner prepare-data: error: --out {source} is the source dataset's own "
        "folder; write the prepared dataset to another one\n"
    )
    assert {p.name: p.read_bytes() for p in source.iterdir()} == before


def test_a_second_run_from_another_source_leaves_no_stale_names(tmp_path):
    out = tmp_path / "out"
    prepare_dataset(str(_folder(tmp_path / "named")), out)
    assert load_dataset(out).names_path == out / "names.tsv"
    prepare_dataset(str(_folder(tmp_path / "plain", names=False)), out)
    assert sorted(p.name for p in out.iterdir()) == ["kb.tsv", "prepare.json", "questions.jsonl"]
    assert load_dataset(out).names_path is None


def test_a_gold_path_with_a_relation_the_kb_lacks_is_refused(tmp_path):
    source = _folder(tmp_path / "d", gold=["capital", "time_zone"])
    with pytest.raises(ValueError) as err:
        prepare_dataset(str(source), tmp_path / "out")
    assert str(err.value) == (
        f"dataset 'd': example q1: gold path ['capital', 'time_zone'] uses relation 'time_zone', "
        f"which {source / 'kb.tsv'} does not have"
    )
    assert not (tmp_path / "out").exists()


def _write(folder, *records: dict):
    folder.mkdir()
    (folder / "kb.tsv").write_text(KB, encoding="utf-8")
    (folder / "names.tsv").write_text(NAMES, encoding="utf-8")
    lines = [_question("q1", ["capital"])] + [json.dumps(r) + "\n" for r in records]
    (folder / "questions.jsonl").write_text("".join(lines), encoding="utf-8")
    return folder


def _record(qid: str, **fields) -> dict:
    return {
        "id": qid,
        "question": "which city",
        "split": "train",
        "topic_entities": [{"id": "e.utah", "name": "Utah"}],
        "answers": [{"id": "e.slc", "name": "Salt Lake City"}],
        "gold_paths": [["capital"]],
        **fields,
    }


def test_a_topic_entity_the_kb_lacks_is_refused(tmp_path, capsys):
    source = _write(tmp_path / "d", _record("q2", topic_entities=[{"id": "e.nowhere", "name": "Nowhere"}]))
    assert main(["prepare-data", str(source), "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (
        f"kgreasoner prepare-data: error: {source / 'questions.jsonl'}:2: field 'topic_entities[0].id': "
        f"'e.nowhere' is not a node of {source / 'kb.tsv'}; no search could start there\n"
    )
    assert not (tmp_path / "out").exists()


def test_hops_that_no_gold_path_walks_are_refused(tmp_path, capsys):
    source = _write(tmp_path / "d", _record("q2", hops=3))
    message = (
        f"{source / 'questions.jsonl'}:2: field 'hops' is 3, but the gold paths have 1 relation(s); "
        "correct hops or the paths"
    )
    assert main(["prepare-data", str(source), "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == f"kgreasoner prepare-data: error: {message}\n"
    with pytest.raises(ValueError) as err:  # the dataset folder loader itself
        load_dataset(source)
    assert str(err.value) == message


def test_intersect_walks_that_never_meet_are_refused(tmp_path, capsys):
    topics = [{"id": "e.utah", "name": "Utah"}, {"id": "e.slc", "name": "Salt Lake City"}]
    meets = _record("q2", topic_entities=topics, gold_paths=[["capital"], ["contained_by", "capital"]], intersect=True)
    assert prepare_dataset(str(_write(tmp_path / "ok", meets)), tmp_path / "ok-out")["gold_paths"]["given"] == 2
    source = _write(tmp_path / "d", {**meets, "gold_paths": [["capital"], ["capital"]]})
    assert main(["prepare-data", str(source), "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (
        f"kgreasoner prepare-data: error: {source / 'questions.jsonl'}:2: field 'gold_paths': the walks of this "
        "intersect question never meet (e.utah -> capital: 1 node(s); e.slc -> capital: 0 node(s)); an intersect "
        "question's answers are the nodes every walk reaches\n"
    )


def test_an_answer_the_kb_lacks_is_a_warning_in_the_summary_and_an_error_with_strict(tmp_path, capsys):
    source = _write(
        tmp_path / "d",
        _record("q2", answers=[{"id": "e.slc"}, {"id": "e.ogden", "name": "Ogden"}]),
        _record("q3", answers=["Salt Lake City"]),
    )
    first = f"{source / 'questions.jsonl'}:2: field 'answers[1].id': 'e.ogden' is not a node of {source / 'kb.tsv'}"
    assert main(["prepare-data", str(source), "--out", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert json.loads((tmp_path / "out" / "prepare.json").read_text())["warnings"] == {
        "answers_not_in_kb": 2,
        "gold_paths_missing_answers": 0,  # q3's answer has no id, but its name is the label the path reaches
    }
    assert captured.err == (
        f"prepare-data: warning: {first} (and any others counted in prepare.json; --strict refuses them)\n"
    )
    assert main(["prepare-data", str(source), "--out", str(tmp_path / "strict"), "--strict"]) == 1
    assert capsys.readouterr().err == f"kgreasoner prepare-data: error: {first} (--strict)\n"
    assert not (tmp_path / "strict").exists()


def test_a_literal_as_a_subject_is_refused_naming_file_and_line(tmp_path, capsys):
    source = _folder(tmp_path / "d")
    (source / "kb.tsv").write_text(KB + '"1847"\tyear_founded_of\te.slc\n', encoding="utf-8")
    assert main(["prepare-data", str(source), "--out", str(tmp_path / "out")]) == 1
    assert capsys.readouterr().err == (
        f"kgreasoner prepare-data: error: {source / 'kb.tsv'}:3: field 'subject' is the literal \"1847\"; in RDF "
        "only an object can be a literal, so no store can hold this triple: make the subject an id, or write the "
        "triple the other way round with an inverse relation\n"
    )
    assert not (tmp_path / "out").exists()


def test_a_gold_path_that_reaches_no_answer_is_a_warning_and_an_error_with_strict(tmp_path, capsys):
    source = _write(
        tmp_path / "d",
        # asks for the state, but the path walks to the capital
        _record("q2", answers=[{"id": "e.utah", "name": "Utah"}]),
        _record("q3", answers=[{"id": "e.utah", "name": "Utah"}], gold_paths=[["capital", "contained_by"]]),
        _record(
            "q4", answers=[{"id": "e.utah", "name": "Utah"}], gold_paths=[["capital", "contained_by"], ["capital"]]
        ),
    )
    first = (
        f"{source / 'questions.jsonl'}:2: field 'gold_paths[0]': capital from e.utah reaches 1 node(s): "
        "'Salt Lake City', none of them an answer ('Utah')"
    )
    assert main(["prepare-data", str(source), "--out", str(tmp_path / "out")]) == 0
    assert json.loads((tmp_path / "out" / "prepare.json").read_text())["warnings"] == {
        "answers_not_in_kb": 0,
        "gold_paths_missing_answers": 2,  # q2, and q4's second path
    }
    assert capsys.readouterr().err == (
        f"prepare-data: warning: {first} (and any others counted in prepare.json; --strict refuses them)\n"
    )
    assert main(["prepare-data", str(source), "--out", str(tmp_path / "strict"), "--strict"]) == 1
    assert capsys.readouterr().err == f"kgreasoner prepare-data: error: {first} (--strict)\n"
