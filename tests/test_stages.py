"""The stage runner and store that `kgreasoner demo` and `kgreasoner ablate` share."""

import json
import os

import pytest
import torch

from kgreasoner.stages import Stage, StageRecordError, StageRunner, StageStore, default_threads, write_json


def _stage(calls: list[str], name: str = "sft") -> Stage:
    def run() -> dict:
        calls.append(name)
        sum(i * i for i in range(2_000_000))  # CPU time well above the clock tick (10 ms) to record
        return {"line": "trained", "steps": 3}

    return Stage(name, "SFT warm-up", ["python train/sft.py --config x.yaml"], run)


def test_a_stage_runs_once_then_its_record_is_found(tmp_path, capsys):
    store, calls = StageStore(tmp_path / "stages"), []
    runner = StageRunner(store, threads=2)
    record, ran = runner.run(_stage(calls), "[6/10] sft: SFT warm-up")
    assert ran and calls == ["sft"]
    assert capsys.readouterr().out.splitlines()[:2] == [
        "[6/10] sft: SFT warm-up (2 torch threads) ...",
        "    $ python train/sft.py --config x.yaml",
    ]
    on_disk = json.loads((tmp_path / "stages" / "sft.json").read_text())
    assert on_disk == record and store.records() == {"sft": record}
    assert set(record) == {"stage", "seconds", "cpu_seconds", "commands", "threads", "result"}
    assert record["result"] == {"line": "trained", "steps": 3} and record["threads"] == 2
    assert record["cpu_seconds"] > 0 and record["seconds"] > 0

    again, ran = runner.run(_stage(calls), "[6/10] sft: SFT warm-up")
    assert not ran and again == record and calls == ["sft"] and capsys.readouterr().out == ""


def test_keyed_stages_are_stored_by_content_key_beside_their_folder(tmp_path, capsys):
    store, calls = StageStore(tmp_path), []
    runner = StageRunner(store, threads=1, show_commands=False)
    record, ran = runner.run(_stage(calls), "    sft: SFT warm-up", key="abc", finish="    sft", made_by="full/seed-0")
    assert ran and record["key"] == "abc" and record["made_by"] == "full/seed-0"
    assert capsys.readouterr().out.splitlines()[0] == "    sft: SFT warm-up (1 torch thread) ..."
    assert (
        store.marker("sft", "abc") == tmp_path / "sft" / "abc.json"
        and store.folder("sft", "abc") == tmp_path / "sft" / "abc"
    )
    assert store.finished("sft", "abc") == record and store.finished("sft", "other") is None
    assert runner.run(_stage(calls), "    sft", key="other")[1] and calls == ["sft", "sft"]


def test_each_stage_runs_with_the_runners_threads_and_the_callers_count_comes_back(tmp_path, capsys):
    seen: list[int] = []

    def ranker() -> dict:
        seen.append(torch.get_num_threads())
        torch.set_num_threads(3)  # a stage (or a library it calls) that changes the count
        return {"line": "trained"}

    def sft() -> dict:
        seen.append(torch.get_num_threads())
        return {"line": "trained"}

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        runner = StageRunner(StageStore(tmp_path), threads=2, show_commands=False)
        runner.run(Stage("ranker", "GAT ranker", [], ranker), "[3/10] ranker: GAT ranker")
        assert torch.get_num_threads() == 1
        record, _ = runner.run(Stage("sft", "SFT warm-up", [], sft), "[6/10] sft: SFT warm-up")
        assert seen == [2, 2] and record["threads"] == 2 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(previous)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[3/10] ranker: GAT ranker (2 torch threads) ..."
    assert lines[2] == "[6/10] sft: SFT warm-up (2 torch threads) ..."


def test_the_default_thread_count_is_omp_num_threads_else_the_usable_cores_whatever_the_load(monkeypatch):
    monkeypatch.setattr(os, "getloadavg", lambda: (8.0, 8.0, 8.0))  # other jobs busy on every core
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert default_threads() == 3
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert default_threads() == len(os.sched_getaffinity(0))
    for bad in ("two", "0"):
        monkeypatch.setenv("OMP_NUM_THREADS", bad)
        with pytest.raises(ValueError, match=f"OMP_NUM_THREADS must be a positive integer .*got '{bad}'"):
            default_threads()


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        (
            '{"stage": "sft", "seconds": 1.0, "commands": [], "res',
            "not a readable stage record, cut short or not JSON",
        ),
        ("", "not a readable stage record, cut short or not JSON"),
        ('{"stage": "sft", "seconds": 1.0, "commands": []}', "stage record without 'result'"),
        ('{"stage": "sft", "seconds": 1.0, "commands": [], "result": {}}', "stage record without 'result.line'"),
        ('["sft"]', "a stage record is a JSON object, not list"),
    ],
)
def test_a_broken_stage_record_is_refused_naming_its_file(text, wrong, tmp_path):
    store, calls = StageStore(tmp_path / "stages"), []
    marker = tmp_path / "stages" / "sft.json"
    marker.parent.mkdir()
    marker.write_text(text)
    for read in (lambda: StageRunner(store, threads=1).run(_stage(calls), "sft"), store.records):
        with pytest.raises(StageRecordError) as refused:
            read()
        assert str(refused.value).startswith(f"{marker}: {wrong}")
        assert str(refused.value).endswith("; delete it and the stage runs again")
    assert calls == []


def test_a_record_is_replaced_whole_or_not_at_all(tmp_path):
    write_json(tmp_path / "sft.json", {"stage": "sft"})
    write_json(tmp_path / "sft.json", {"stage": "sft", "seconds": 2})
    assert [p.name for p in tmp_path.iterdir()] == ["sft.json"]
    assert json.loads((tmp_path / "sft.json").read_text()) == {"stage": "sft", "seconds": 2}
