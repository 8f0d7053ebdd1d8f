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
    return json.dumps({"id": qid, "question": "what is the capital of utah", "split": split,
                       "topic_entities": [{"id": "e.utah", "name": "Utah"}],
                       "answers": [{"id": "e.slc", "name": "Salt Lake City"}], "gold_paths": [path]}) + "\n"


def _folder(path, names: bool = True, gold: list[str] | None = None):
    path.mkdir()
    (path / "kb.tsv").write_text(KB, encoding="utf-8")
    if names:
        (path / "names.tsv").write_text(NAMES, encoding="utf-8")
    (path / "questions.jsonl").write_text(_question("q1", gold or ["capital"]) + _question("q2", ["^contained_by"], "test"),
                                          encoding="utf-8")
    return path


def test_preparing_into_the_source_folder_is_refused_and_changes_nothing(tmp_path, capsys):
    source = _folder(tmp_path / "d")
    before = {p.name: p.read_bytes() for p in source.iterdir()}
    assert main(["prepare-data", str(source), "--out", str(source)]) == 1
    assert capsys.readouterr().err == (f"kgreasoner prepare-data: error: --out {source} is the source dataset's own "
                                       "folder; write the prepared dataset to another one\n")
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
    assert str(err.value) == (f"dataset 'd': example q1: gold path ['capital', 'time_zone'] uses relation 'time_zone', "
                              f"which {source / 'kb.tsv'} does not have")
    assert not (tmp_path / "out").exists()
