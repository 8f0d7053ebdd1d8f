import json

import pytest
import torch

from kgreasoner.models import load_model_and_tokenizer
from kgreasoner.training.hard_cases import HardCaseConfig, mine_hard_cases, per_example_loss, read_hard_ids, select_hard
from kgreasoner.training.warmup_data import encode_record, write_warmup


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
    out = mine_hard_cases(HardCaseConfig(model=str(tiny_checkpoint), trajectories=str(trajectories),
                                         output=str(tmp_path / "hard.jsonl"), epsilon=0.0))
    assert read_hard_ids(out) == {"q2"}
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    assert summary == {"scored": 2, "hard": 1, "epsilon": 0.0, "min_hops": 2}
    assert out.with_suffix(".png").stat().st_size > 1000


def test_cli_command_mines_and_reports(tiny_checkpoint, tmp_path, records, capsys):
    from kgreasoner.cli import main

    trajectories = write_warmup(records, tmp_path / "traj.jsonl")
    out = tmp_path / "hard.jsonl"
    assert main(["hard-cases", "--set", f"model={tiny_checkpoint}", "--set", f"trajectories={trajectories}",
                 "--set", f"output={out}", "--set", "epsilon=0.0", "--set", "plot=false"]) == 0
    assert capsys.readouterr().out == f"1 hard of 2 scored (epsilon 0.0000) -> {out}\n"
    assert read_hard_ids(out) == {"q2"} and not out.with_suffix(".png").exists()
