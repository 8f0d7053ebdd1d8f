"""Finding data folders and `load_dataset` on names, folders and files."""

import json
from pathlib import Path

import pytest

from kgreasoner.data import load_dataset, load_datasets, open_dataset_kg
from kgreasoner.kg.base import execute_path
from kgreasoner.records.pathquestion import PATHQUESTION_SETS
from kgreasoner.records.paths import DATA_ENV, find_data_dir, repo_root
from kgreasoner.records.schema import SchemaError


@pytest.fixture
def no_env(monkeypatch, tmp_path):
    """No $KGREASONER_DATA, and a current directory with no ../shared next to it."""
    monkeypatch.delenv(DATA_ENV, raising=False)
    work = tmp_path / "nowhere" / "cwd"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    return tmp_path


def test_explicit_path_is_the_folder_or_its_parent_and_never_falls_back(no_env, monkeypatch):
    folder = no_env / "data" / "pathquestion"
    folder.mkdir(parents=True)
    assert find_data_dir("pathquestion", no_env / "data") == folder
    assert find_data_dir("pathquestion", folder) == folder
    monkeypatch.setenv(DATA_ENV, str(no_env / "data"))
    with pytest.raises(FileNotFoundError) as err:
        find_data_dir("pathquestion", no_env / "missing")
    assert f"{no_env}/missing/pathquestion" in str(err.value)
    assert "zmtkeke/IRN" in str(err.value) and "COLING 2018" in str(err.value)


def test_env_then_cwd_relative_shared_data(no_env, monkeypatch):
    env_root, shared = no_env / "env", no_env / "clone" / ".." / "shared" / "data"
    (env_root / "foo").mkdir(parents=True)
    (no_env / "shared" / "data" / "foo").mkdir(parents=True)
    (no_env / "clone").mkdir()
    monkeypatch.chdir(no_env / "clone")
    assert find_data_dir("foo") == (shared / "foo").resolve()
    monkeypatch.setenv(DATA_ENV, str(env_root))
    assert find_data_dir("foo") == env_root / "foo"


def test_missing_folder_says_where_it_looked(no_env, monkeypatch):
    monkeypatch.setenv(DATA_ENV, str(no_env / "env"))
    with pytest.raises(FileNotFoundError) as err:
        find_data_dir("no-such-data")
    message = str(err.value)
    assert message.startswith("data folder 'no-such-data' not found; looked in:")
    assert str(no_env / "env" / "no-such-data") in message
    assert str(Path.cwd() / ".." / "shared" / "data" / "no-such-data") in message
    assert str(repo_root().parent / "shared" / "data" / "no-such-data") in message
    assert f"Set ${DATA_ENV}" in message


@pytest.mark.pathquestion
def test_repo_root_relative_shared_data(no_env, pathquestion_dir):
    # cwd has no ../shared and no env: only <clone>/../shared/data can be where it was found.
    expected = repo_root().parent / "shared" / "data" / "pathquestion"
    if pathquestion_dir != expected.resolve():
        pytest.skip(f"PathQuestion lives at {pathquestion_dir}, not next to the clone")
    assert find_data_dir("pathquestion") == expected.resolve()


def write_folder(folder, questions, names=True):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kb.tsv").write_text('m.utah\ttime_zone\tm.mst\nm.mst\tutc_offset\t"-7"\n', encoding="utf-8")
    if names:
        (folder / "names.tsv").write_text("m.utah\tUtah\nm.mst\tMountain Time Zone\n", encoding="utf-8")
    lines = [json.dumps(q) for q in questions]
    (folder / "questions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def question(i, split=None):
    record = {
        "id": f"q{i}",
        "question": f"what timezone is utah in ({i})",
        "topic_entities": [{"id": "m.utah", "name": "Utah"}],
        "answers": [{"id": "m.mst", "name": "Mountain Time Zone"}],
        "gold_paths": [["time_zone"]],
    }
    return {**record, "split": split} if split else record


def test_folder_without_splits_gets_a_seeded_split_and_its_kg(tmp_path):
    folder = write_folder(tmp_path / "tiny", [question(i) for i in range(20)])
    dataset = load_dataset(folder, split_scheme="random", seed=1)
    assert (dataset.name, dataset.kb_path, dataset.names_path) == ("tiny", folder / "kb.tsv", folder / "names.tsv")
    assert (dataset.split_scheme, dataset.seed) == ("random", 1)
    assert [len(dataset.split(s)) for s in ("train", "dev", "test")] == [16, 2, 2]
    assert [e.id for e in load_dataset(folder, split="test", split_scheme="random", seed=1)] == [
        e.id for e in dataset.split("test")
    ]
    kg = open_dataset_kg(dataset)
    assert kg.label("m.mst") == "Mountain Time Zone"
    assert execute_path(kg, "m.utah", dataset.examples[0].gold_paths[0]) == {"m.mst"}


def test_given_splits_are_kept_and_partial_ones_refused(tmp_path):
    folder = write_folder(tmp_path / "given", [question(0, "test"), question(1, "train")], names=False)
    dataset = load_dataset(folder, split_scheme="grouped")
    assert (dataset.split_scheme, dataset.seed, dataset.names_path) == ("given", None, None)
    assert [e.split for e in dataset] == ["test", "train"]
    write_folder(folder, [question(0, "test"), question(1)])
    with pytest.raises(SchemaError, match=r"dataset 'given': 1 of 2 examples have no split \(first: q1\)"):
        load_dataset(folder)


def test_jsonl_file_and_bad_inputs(tmp_path):
    path = tmp_path / "qs.jsonl"
    path.write_text("\n".join(json.dumps(question(i)) for i in range(10)), encoding="utf-8")
    dataset = load_dataset(path, split_scheme="grouped")
    assert (dataset.name, dataset.kb_path, dataset.split_scheme) == ("qs", None, "grouped")
    assert len({e.split for e in dataset}) == 1  # one (topic, path) group: one side
    with pytest.raises(ValueError, match="has no KB file"):
        open_dataset_kg(dataset)
    with pytest.raises(FileNotFoundError, match="a dataset folder needs questions.jsonl"):
        load_dataset(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"'nope' is neither a known dataset \(PQ-2H, .*cwq"):
        load_dataset("nope")
    with pytest.raises(ValueError, match="split_scheme must be one of"):
        load_dataset(path, split_scheme="topic")
    with pytest.raises(ValueError, match="split must be one of"):
        load_dataset(path, split="validation")
    with pytest.raises(ValueError, match=r"use load_datasets\(\)"):
        load_dataset("PathQuestion")


@pytest.mark.pathquestion
def test_pathquestion_loads_as_four_sets_each_with_its_kb(pathquestion_dir):
    datasets = load_datasets("pathquestion", split_scheme="grouped", root=pathquestion_dir)
    assert [d.name for d in datasets] == list(PATHQUESTION_SETS)
    assert [d.kb_path.name for d in datasets] == ["2H-kb.txt", "3H-kb.txt", "PQL2-KB.txt", "PQL3-KB.txt"]
    for dataset in datasets:
        assert {e.source for e in dataset} == {dataset.name} and dataset.split_scheme == "grouped"
        assert all(e.split for e in dataset)
    assert load_dataset("pql-3h_MORE", root=pathquestion_dir).name == "PQL-3H_more"
    assert [d.name for d in load_datasets("pq-2h", root=pathquestion_dir)] == ["PQ-2H"]
