import json
from pathlib import Path

import pytest
import torch

from kgreasoner.data.trajectories import write_warmup
from kgreasoner.models import load_model_and_tokenizer
from kgreasoner.training.hard_cases import (
    HardCaseConfig,
    mine_hard_cases,
    per_example_loss,
    read_hard_ids,
    select_hard,
)
from kgreasoner.training.warmup_data import encode_record


def test_per_example_loss_matches_a_direct_computation(tiny_checkpoint, records):
    model, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    losses = per_example_loss(model, tokenizer, records, batch_size=2)
    for record, loss in zip(records, losses):
        encoded = encode_record(record, tokenizer)
        ids = torch.tensor([encoded["input_ids"]])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), dim=-1)
        targets = ids[0, 1:]
        picked = logprobs[torch.arange(len(targets)), targets]
        keep = torch.tensor(encoded["assistant_masks"][1:], dtype=torch.bool)
        assert loss == pytest.approx(float(-picked[keep].mean()), rel=1e-4)


def test_selection_keeps_multi_hop_above_epsilon(records):
    # q1 has 1 hop, q2 has 2
    hard, epsilon = select_hard(records, [9.0, 5.0], epsilon=4.0, quantile=0.5, min_hops=2)
    assert [h["id"] for h in hard] == ["q2"] and epsilon == 4.0
    hard, _ = select_hard(records, [9.0, 5.0], epsilon=6.0, quantile=0.5, min_hops=2)
    assert hard == []


def test_mine_writes_ids_summary_and_plot(tiny_checkpoint, tmp_path, records):
    trajectories = write_warmup(records, tmp_path / "traj.jsonl")
    out = mine_hard_cases(
        HardCaseConfig(
            model=str(tiny_checkpoint),
            trajectories=str(trajectories),
            output=str(tmp_path / "hard.jsonl"),
            epsilon=0.0,
        )
    )
    assert read_hard_ids(out) == {"q2"}
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary == {"scored": 2, "hard": 1, "epsilon": 0.0, "min_hops": 2}
    assert out.with_suffix(".png").stat().st_size > 1000


def test_cli_command_mines_and_reports(tiny_checkpoint, tmp_path, records, capsys):
    from kgreasoner.cli import main

    trajectories = write_warmup(records, tmp_path / "traj.jsonl")
    out = tmp_path / "hard.jsonl"
    assert (
        main(
            [
                "hard-cases",
                "--set",
                f"model={tiny_checkpoint}",
                "--set",
                f"trajectories={trajectories}",
                "--set",
                f"output={out}",
                "--set",
                "epsilon=0.0",
                "--set",
                "plot=false",
            ]
        )
        == 0
    )
    assert capsys.readouterr().out == f"1 hard of 2 scored (epsilon 0.0000) -> {out}\n"
    assert read_hard_ids(out) == {"q2"} and not out.with_suffix(".png").exists()


RANK_SCRIPT = """
import json, os, sys
from kgreasoner.training import hard_cases

scored = []
score = hard_cases.per_example_loss


def recording(model, tokenizer, records, *args, **kwargs):  # notes which trajectories this rank scored
    scored.extend(r.id for r in records)
    return score(model, tokenizer, records, *args, **kwargs)


hard_cases.per_example_loss = recording
model, trajectories, output = sys.argv[1:]
hard_cases.mine_hard_cases(hard_cases.HardCaseConfig(model=model, trajectories=trajectories, output=output,
                                                     batch_size=2, plot=False))
with open(f"{output}.rank{os.environ['RANK']}", "w") as handle:
    hard = sorted(hard_cases.read_hard_ids(output))
    json.dump({"scored": scored, "world": int(os.environ["WORLD_SIZE"]), "hard": hard}, handle)
"""


def _varied_records(records):
    """Nine trajectories of different lengths and hop counts, so shards and length-sorted batches differ."""
    import dataclasses

    out = []
    for i in range(9):
        base = records[i % 2]
        out.append(dataclasses.replace(base, id=f"r{i}", question=base.question + " please" * i, hops=1 + i % 3))
    return out


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_two_ranks_mine_the_same_hard_set_as_one_process(tiny_checkpoint, tmp_path, records):
    import os
    import subprocess
    import sys

    trajectories = write_warmup(_varied_records(records), tmp_path / "traj.jsonl")
    alone = mine_hard_cases(
        HardCaseConfig(
            model=str(tiny_checkpoint),
            trajectories=str(trajectories),
            output=str(tmp_path / "alone.jsonl"),
            batch_size=4,
            plot=False,
        )
    )
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    shared = tmp_path / "shared.jsonl"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(script),
            str(tiny_checkpoint),
            str(trajectories),
            str(shared),
        ],
        check=True,
        env=env,
        timeout=120,
        capture_output=True,
    )

    expected, got = _rows(alone), _rows(shared)
    assert len(expected) >= 2  # the quantile threshold keeps some of the seven multi-hop trajectories
    assert [r["id"] for r in got] == [r["id"] for r in expected]
    assert [r["hops"] for r in got] == [r["hops"] for r in expected]
    for mine, theirs in zip(got, expected):
        assert mine["loss"] == pytest.approx(theirs["loss"], abs=1e-5)
    summary_alone = json.loads(alone.with_suffix(".summary.json").read_text())
    summary_shared = json.loads(shared.with_suffix(".summary.json").read_text())
    assert summary_shared["epsilon"] == pytest.approx(summary_alone["epsilon"], abs=1e-5)
    assert {k: v for k, v in summary_shared.items() if k != "epsilon"} == {
        k: v for k, v in summary_alone.items() if k != "epsilon"
    }
    ids = [f"r{i}" for i in range(9)]
    for rank in (0, 1):
        report = json.loads(Path(f"{shared}.rank{rank}").read_text())
        # each rank scored only its own stride of the trajectories, and read the whole hard set back
        assert report["world"] == 2 and sorted(report["scored"]) == sorted(ids[rank::2])
        assert report["hard"] == sorted(r["id"] for r in expected)


def test_grpo_mines_hard_cases_once_from_its_warm_up_model(tiny_checkpoint, tmp_path, records):
    from kgreasoner.training.grpo import GRPORecipe, _hard_ids

    trajectories = write_warmup(_varied_records(records), tmp_path / "traj.jsonl")
    recipe = GRPORecipe(
        model=str(tiny_checkpoint),
        dataset="unused",
        run_dir=str(tmp_path / "grpo"),
        hard_case_trajectories=str(trajectories),
        hard_case_quantile=0.5,
    )
    mined = tmp_path / "grpo" / "hard_cases.jsonl"
    hard = _hard_ids(recipe)
    assert hard == {row["id"] for row in _rows(mined)} and len(hard) >= 2
    assert all(row["hops"] >= 2 for row in _rows(mined))
    mined.write_text('{"id": "kept"}\n')  # a resumed run reads the file it mined before
    assert _hard_ids(recipe) == {"kept"}
