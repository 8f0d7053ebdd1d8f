"""The stage runner and store that `kgreasoner demo` and `kgreasoner ablate` share."""

import json

import pytest

from kgreasoner.stages import Stage, StageRecordError, StageRunner, StageStore, write_json


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
        "[6/10] sft: SFT warm-up ...",
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
    assert capsys.readouterr().out.splitlines()[0] == "    sft: SFT warm-up ..."
    assert (
        store.marker("sft", "abc") == tmp_path / "sft" / "abc.json"
        and store.folder("sft", "abc") == tmp_path / "sft" / "abc"
    )
    assert store.finished("sft", "abc") == record and store.finished("sft", "other") is None
    assert runner.run(_stage(calls), "    sft", key="other")[1] and calls == ["sft", "sft"]


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
