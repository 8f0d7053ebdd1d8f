"""README's "Train on GPUs", the steps that run on a CPU, on the hand-made RoG CWQ records
(tests/data/fixtures/rog-cwq: one train, one dev, one test question, none with a gold path): the
ranker (one epoch), both warm-up commands and the oracle's eval, as the README writes them, from
a scratch working folder. The gold paths are derived on each question's own subgraph."""

import json
import runpy
import sys
from pathlib import Path

from kgreasoner.cli import main as kgreasoner
from kgreasoner.records.trajectories import read_warmup

ROOT = Path(__file__).parents[2]
FIXTURES = ROOT / "tests" / "data" / "fixtures"
TRAIN_ID = "WebQTrn-0_6a4b9d1ba3dbe0fa4f1f0a9e0e7d7f33"
DEV_ID = "WebQTrn-2_1f0a3e5c7b9d2f4a6c8e0b1d3f5a7c9e"
TEST_ID = "WebQTest-7_9d8c7b6a5f4e3d2c1b0a9f8e7d6c5b4a"


def test_train_on_gpus_steps_2_and_5_run_on_the_fixtures(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KGREASONER_DATA", str(FIXTURES))
    monkeypatch.chdir(tmp_path)

    # 2. the ranker, with a one-epoch budget
    monkeypatch.setattr(
        sys,
        "argv",
        [
            "train/ranker.py",
            "--config",
            str(ROOT / "configs/ranker.yaml"),
            "--set",
            "data=rog-cwq",
            "--set",
            "out_dir=checkpoints/ranker",
            "--set",
            "epochs=1",
        ],
    )
    runpy.run_path(str(ROOT / "train/ranker.py"), run_name="__main__")
    meta = json.loads(Path("checkpoints/ranker/ranker.json").read_text())
    assert meta["trained_on"] == {
        "data": "RoG-CWQ",
        "split_scheme": "given",
        "split_seed": 0,
        "train_questions": 1,
        "train_groups": 1,
    }
    # KG order: the dev question's gold relation is second of Utah's two, the test question's
    # third of three; each question's other group (one hop back from its topic) has one candidate.
    assert meta["dev"]["none"] == {"recall@1": 0.5, "recall@3": 1.0, "recall@5": 1.0, "mrr": 0.75, "groups": 2.0}
    assert meta["test"]["none"] == {"recall@1": 0.5, "recall@3": 1.0, "recall@5": 1.0, "mrr": 2 / 3, "groups": 2.0}

    # 2. the warm-up trajectories for SFT, then one per training question for the gold rows of guided groups
    tool = ["--set", "tool.ranking=gat", "--set", "tool.ranker_path=checkpoints/ranker"]
    assert (
        kgreasoner(
            [
                "warmup",
                "--config",
                str(ROOT / "configs/warmup.yaml"),
                "--set",
                "dataset=rog-cwq",
                *tool,
                "--set",
                "output=checkpoints/warmup/warmup.jsonl",
            ]
        )
        == 0
    )
    assert (
        kgreasoner(
            [
                "warmup",
                "--config",
                str(ROOT / "configs/warmup.yaml"),
                "--set",
                "dataset=rog-cwq",
                "--set",
                "num_examples=all",
                *tool,
                "--set",
                "dev_examples=0",
                "--set",
                "output=checkpoints/warmup/all_train.jsonl",
            ]
        )
        == 0
    )
    warmup = read_warmup("checkpoints/warmup/warmup.jsonl")
    assert [(r.id, r.kind, r.hops, r.split) for r in warmup] == [
        (TRAIN_ID, "gold", 2, "train"),
        (DEV_ID, "gold", 2, "dev"),
    ]
    assert warmup[1].completion == (
        "<think> To answer this I first need what has us state capital Salt Lake City. <search>Salt Lake City</search>"
        "\n<triples>\n(Utah, location.us_state.capital, Salt Lake City)\n</triples>\n"
        "From these triples, Utah has us state capital Salt Lake City. So the next step is the location time zones "
        "of Utah. <search>Utah</search>\n<triples>\n(Utah, location.location.time_zones, Mountain Time Zone)\n"
        "</triples>\nHere Utah has location time zones Mountain Time Zone. Therefore the answer is Mountain Time "
        "Zone. </think>\n<answer>Mountain Time Zone</answer>"
    )
    # one record per training question: the gold rows guided groups train on
    assert [(r.id, r.kind, r.hops, r.split) for r in read_warmup("checkpoints/warmup/all_train.jsonl")] == [
        (TRAIN_ID, "gold", 2, "train")
    ]

    # 5. the oracle on the test questions: the search tool along the derived path, no LLM
    capsys.readouterr()
    assert (
        kgreasoner(
            [
                "eval",
                "--methods",
                "oracle",
                "--dataset",
                "rog-cwq",
                "--split",
                "test",
                "--out",
                "runs/oracle-cwq",
                "--no-progress",
            ]
        )
        == 0
    )
    assert "| oracle | 1.000 (1) |" in capsys.readouterr().out  # Hits@1 of its one 2-hop question
    rows = [json.loads(line) for line in Path("runs/oracle-cwq/oracle.jsonl").read_text().splitlines()]
    assert [(r["id"], r["hops"], r["answers"], r["hits1"], r["trace"]["path"]) for r in rows] == [
        (TEST_ID, 2, ["Salt Lake City"], 1.0, ["^location.location.time_zones", "location.us_state.capital"])
    ]


def test_a_stratified_warmup_derives_every_path_before_ordering_by_hops(tmp_path, monkeypatch):
    monkeypatch.setenv("KGREASONER_DATA", str(FIXTURES))
    output = tmp_path / "warmup.jsonl"
    assert (
        kgreasoner(
            [
                "warmup",
                "--config",
                str(ROOT / "configs/warmup.yaml"),
                "--set",
                "dataset=rog-cwq",
                "--set",
                "sample=stratified",
                "--set",
                f"output={output}",
            ]
        )
        == 0
    )
    assert [(r.id, r.hops, r.split) for r in read_warmup(output)] == [(TRAIN_ID, 2, "train"), (DEV_ID, 2, "dev")]
