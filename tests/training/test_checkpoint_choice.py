"""The run's final model: the warm-up or a save, by Hits@1 on the whole dev split with a per-hop guard."""

import json
import shutil
from pathlib import Path

import pytest

from kgreasoner.config import ConfigError, load_config
from kgreasoner.retrieval.tool import ToolConfig
from kgreasoner.training.checkpoint_choice import apply_choice, choose, episode_ends, floors, judge
from kgreasoner.training.grpo_recipe import DevEvaluation, GRPORecipe


def _row(episode, step, hop1, hop2, n1=100, n2=100, **extra):
    """A candidate row as BestKeeper writes it: Hits@1 on the whole dev split, overall and per hop count."""
    return {
        "episode": episode,
        "step": step,
        "candidate": 1,
        "dev_split/hits1": (hop1 * n1 + hop2 * n2) / (n1 + n2),
        "dev_split/hits1_hop1": hop1,
        "dev_split/questions_hop1": n1,
        "dev_split/hits1_hop2": hop2,
        "dev_split/questions_hop2": n2,
        **extra,
    }


# The warm-up: 1-hop 0.8 of 100 (SE 0.04, floor 0.76), 2-hop 0.2 of 100 (SE 0.04, floor 0.16).
WARMUP = _row(1, 0, 0.8, 0.2)
STEP_LOG = [
    WARMUP,
    {"episode": 1, "step": 1, "loss": 0.1},
    {"episode": 1, "step": 2, "dev/hits1": 0.9, "checkpoint": 1},  # the periodic curve's sample: no candidate
    _row(1, 4, 0.70, 0.60),  # best overall (0.65), but 1-hop fell 0.10 > one SE: refused
    _row(1, 6, 0.77, 0.45),  # 0.61; 1-hop 0.03 down, within one SE: eligible. Episode 1's end
    {"episode": 2, "step": 0, "dev/hits1": 0.6},
    _row(2, 4, 0.76, 0.46),  # 0.61, ties episode 1's end, later: eligible and chosen
    _row(2, 5, 0.80, 0.15),  # 0.475; 2-hop 0.05 down: refused. Episode 2's end
]


def test_the_guard_refuses_a_better_overall_save_whose_one_hop_fell_by_more_than_one_standard_error():
    best, verdicts = judge(STEP_LOG)
    assert (best["episode"], best["step"]) == (2, 4)
    assert [((v["row"]["episode"], v["row"]["step"]), v["refused_for_hops"]) for v in verdicts] == [
        ((1, 0), []),
        ((1, 4), [1]),
        ((1, 6), []),
        ((2, 4), []),
        ((2, 5), [2]),
    ]
    assert floors(WARMUP) == pytest.approx({1: 0.76, 2: 0.16})
    kept = choose(STEP_LOG, available={(1, 0), (1, 6), (2, 5)})
    assert (kept["episode"], kept["step"]) == (1, 6)
    assert episode_ends(STEP_LOG) == {1: 6, 2: 5}
    assert choose([r for r in STEP_LOG if "candidate" not in r]) is None


def test_the_warm_up_is_chosen_when_every_save_is_worse_and_a_rate_of_0_or_1_has_no_error():
    worse = [WARMUP, _row(1, 4, 0.79, 0.19), _row(1, 6, 0.9, 0.0)]
    assert choose(worse) is WARMUP
    # p = 1: any miss of that hop count refuses; p = 0: that hop count cannot fall
    whole = _row(1, 0, 1.0, 0.0, n1=40, n2=10)
    assert floors(whole) == {1: 1.0, 2: 0.0}
    assert judge([whole, _row(1, 2, 0.975, 1.0, n1=40, n2=10)])[1][1]["refused_for_hops"] == [1]
    assert choose([whole, _row(1, 2, 1.0, 0.0, n1=40, n2=10)])["step"] == 2  # a tie: the later


def _model(folder: Path, tag: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"tag": tag}))
    return folder


def _run(tmp_path: Path, best_record: dict | None, rows=STEP_LOG) -> Path:
    root = tmp_path / "run"
    _model(tmp_path / "warmup", "warmup")
    _model(root / "episode-1" / "final", "e1-end")
    _model(root / "episode-2" / "final", "e2-end")
    _model(root / "best", "best")
    if best_record:
        (root / "best.json").write_text(json.dumps(best_record))
    (root / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def _tag(folder: Path) -> str:
    return json.loads((folder / "config.json").read_text())["tag"]


def test_the_last_episodes_final_gets_the_kept_best_and_chosen_json_says_why(tmp_path):
    root = _run(tmp_path, {"episode": 2, "step": 4, "dev_split/hits1": 0.61})
    summary = apply_choice(root, root / "steps.jsonl", 2, "best_dev", str(tmp_path / "warmup"))
    assert _tag(root / "episode-2" / "final") == "best"
    assert json.loads((root / "chosen.json").read_text()) == summary
    assert {k: summary[k] for k in ("episode", "step", "dev_hits1", "warmup", "source", "last")} == {
        "episode": 2,
        "step": 4,
        "dev_hits1": 0.61,
        "warmup": False,
        "source": str(root / "best"),
        "last": {"episode": 2, "step": 5, "dev_hits1": 0.475},
    }
    assert summary["warmup_floor_by_hop"] == pytest.approx({"1": 0.76, "2": 0.16})
    assert [(c["step"], c["warmup"], c["refused_for_hops"], c["weights_kept"]) for c in summary["candidates"]] == [
        (0, True, [], True),
        (4, False, [1], False),
        (6, False, [], True),
        (4, False, [], True),
        (5, False, [2], True),
    ]
    assert summary["candidates"][1]["by_hop"] == {"1": 0.70, "2": 0.60}


def test_without_a_kept_best_the_choice_is_among_the_kept_weights(tmp_path):
    root = _run(tmp_path, None)
    summary = apply_choice(root, root / "steps.jsonl", 2, "best_dev", str(tmp_path / "warmup"))
    assert (summary["episode"], summary["step"], summary["dev_hits1"]) == (1, 6, 0.61)
    assert _tag(root / "episode-2" / "final") == "e1-end" and _tag(root / "episode-1" / "final") == "e1-end"


def test_the_warm_up_wins_when_every_save_is_worse_and_the_last_final_holds_its_weights(tmp_path):
    rows = [WARMUP, _row(1, 6, 0.9, 0.05), _row(2, 5, 0.79, 0.19)]
    root = _run(tmp_path, None, rows)
    summary = apply_choice(root, root / "steps.jsonl", 2, "best_dev", str(tmp_path / "warmup"))
    assert (summary["episode"], summary["step"], summary["warmup"]) == (1, 0, True)
    assert summary["source"] == str(tmp_path / "warmup")
    assert _tag(root / "episode-2" / "final") == "warmup"


def test_choose_final_last_keeps_the_last_step(tmp_path):
    root = _run(tmp_path, {"episode": 2, "step": 4, "dev_split/hits1": 0.61})
    summary = apply_choice(root, root / "steps.jsonl", 2, "last", str(tmp_path / "warmup"))
    assert (summary["episode"], summary["step"], summary["dev_hits1"], summary["warmup"]) == (2, 5, 0.475, False)
    assert _tag(root / "episode-2" / "final") == "e2-end"


def test_choose_final_defaults_to_best_dev_with_dev_evaluation_and_refuses_it_without():
    base = ["model=m", "dataset=d", "run_dir=o"]
    assert load_config(GRPORecipe, None, base + ["dev_eval.steps=5"]).dev_eval.final == "best_dev"
    assert load_config(GRPORecipe, None, base).dev_eval.final == "last"
    assert load_config(GRPORecipe, None, base).dev_eval.questions == 150
    with pytest.raises(ConfigError, match="choose_final: best_dev needs dev evaluation: set dev_eval.steps"):
        load_config(GRPORecipe, None, base + ["dev_eval.choose_final=best_dev"])


def test_the_demo_measures_dev_hits_on_at_least_150_questions():
    from kgreasoner.demo import DemoConfig

    config = load_config(DemoConfig, Path(__file__).resolve().parents[2] / "configs" / "demo" / "full.yaml")
    assert config.grpo.set["dev_eval"]["questions"] >= 150 and DemoConfig().grpo.set["dev_eval"]["questions"] >= 150


TOOL = ToolConfig(entity_handles=True, top_k=5)


@pytest.fixture
def memorised_warmup(synthetic_dir, tmp_path):
    """A dataset whose dev split repeats 8 of its training questions (under new ids), and a tiny model SFT-trained on
    those 8 questions' gold trajectories until it answers some: a warm-up with a dev Hits@1 above 0 in seconds.
    Returns (model directory, dataset folder)."""
    from data_gen.warmup import WarmupConfig, run
    from kgreasoner.models import TinyModelConfig, build_tiny
    from kgreasoner.tokenizer import TokenizerConfig, read_training_texts
    from kgreasoner.training.sft import SFTRecipe, train_sft

    data = tmp_path / "data"
    shutil.copytree(synthetic_dir, data)
    rows = [json.loads(line) for line in (data / "questions.jsonl").read_text().splitlines()]
    kept = [r for r in rows if r["split"] == "train"][:8]
    repeated = [{**r, "id": r["id"] + "-dev", "split": "dev"} for r in kept]
    rows = [r for r in rows if r["split"] != "dev"] + repeated
    (data / "questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    every = tmp_path / "all.jsonl"
    run(
        WarmupConfig(
            dataset=str(data), output=str(every), num_examples=None, dev_examples=0, tool=TOOL, progress=False
        )
    )
    ids = {r["id"] for r in kept}
    gold = tmp_path / "gold.jsonl"
    gold.write_text("".join(line + "\n" for line in every.read_text().splitlines() if json.loads(line)["id"] in ids))
    config = TinyModelConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        intermediate_size=128,
        tokenizer=TokenizerConfig(num_handles=16),
    )
    build_tiny(config, read_training_texts([data / "kb.tsv", every]), tmp_path / "tiny")
    final = train_sft(
        SFTRecipe(
            model=str(tmp_path / "tiny"),
            train_file=str(gold),
            run_dir=str(tmp_path / "sft"),
            trainer={
                "learning_rate": 3e-3,
                "max_steps": 150,
                "per_device_train_batch_size": 8,
                "warmup_steps": 0.0,
                "eval_steps": 0,
                "save_steps": 150,
                "logging_steps": 50,
                "report_to": [],
            },
        )
    )
    return final, data


def test_a_grpo_run_that_only_makes_the_warm_up_worse_ends_with_the_warm_up(memorised_warmup, tmp_path):
    """A real run at a ruinous learning rate: every save answers worse than the warm-up on the whole dev split."""
    from safetensors.torch import load_file

    from kgreasoner.data import load_dataset
    from kgreasoner.rollout.types import RolloutConfig
    from kgreasoner.training.grpo import Episode, train_grpo

    model, data = memorised_warmup
    out = tmp_path / "run"
    recipe = GRPORecipe(
        model=str(model),
        dataset=str(data),
        run_dir=str(out),
        tool=TOOL,
        rollout=RolloutConfig(max_new_tokens=192, max_turn_tokens=48, max_turns=5),
        episodes=[Episode("all", max_steps=2)],
        max_questions=8,
        dev_eval=DevEvaluation(steps=1, questions=2),
        trainer={
            "num_generations": 4,
            "per_device_train_batch_size": 8,
            "learning_rate": 0.05,
            "beta": 0.0,
            "report_to": [],
            "save_steps": 1,
        },
    )
    final = train_grpo(recipe)
    chosen = json.loads((out / "chosen.json").read_text())
    assert [(c["episode"], c["step"], c["warmup"]) for c in chosen["candidates"]] == [
        (1, 0, True),
        (1, 1, False),
        (1, 2, False),
    ]
    warmup = chosen["candidates"][0]
    assert warmup["dev_hits1"] > max(c["dev_hits1"] for c in chosen["candidates"][1:])
    assert (chosen["episode"], chosen["step"], chosen["warmup"], chosen["source"]) == (1, 0, True, str(model))
    # every candidate was measured on the whole dev split (8 questions), not the dev curve's sample of 2
    assert len(load_dataset(str(data)).split("dev")) == 8
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    counted = [
        sum(v for k, v in r.items() if k.startswith("dev_split/questions_hop")) for r in rows if "candidate" in r
    ]
    assert counted == [8, 8, 8]
    weights, start = load_file(final / "model.safetensors"), load_file(Path(model) / "model.safetensors")
    assert final == out / "episode-1" / "final" and all(t.equal(start[k]) for k, t in weights.items())
