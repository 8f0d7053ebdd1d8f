"""The run's final model: the saved checkpoint with the best dev Hits@1, across episodes."""

import json
from pathlib import Path

import pytest

from kgreasoner.config import ConfigError, load_config
from kgreasoner.training.checkpoint_choice import apply_choice, choose, episode_ends
from kgreasoner.training.grpo import GRPORecipe

STEP_LOG = [
    {"episode": 1, "step": 0, "dev/hits1": 0.9},  # the warm-up: no candidate
    {"episode": 1, "step": 1, "loss": 0.1},
    {"episode": 1, "step": 2, "dev/hits1": 0.7},  # dev only, not saved
    {"episode": 1, "step": 4, "dev/hits1": 0.5, "checkpoint": 1},
    {"episode": 1, "step": 6, "dev/hits1": 0.6, "checkpoint": 1},  # episode 1's end
    {"episode": 2, "step": 0, "dev/hits1": 0.6},
    {"episode": 2, "step": 4, "dev/hits1": 0.6, "checkpoint": 1},  # ties episode 1's end, later
    {"episode": 2, "step": 5, "dev/hits1": 0.4, "checkpoint": 1},  # episode 2's end
]


def test_the_choice_is_the_saved_step_with_the_best_dev_hits_the_later_one_on_ties():
    assert (choose(STEP_LOG)["episode"], choose(STEP_LOG)["step"]) == (2, 4)
    assert (choose(STEP_LOG, available={(1, 6), (2, 5)})["episode"], choose(STEP_LOG, {(1, 6), (2, 5)})["step"]) == (
        1,
        6,
    )
    assert episode_ends(STEP_LOG) == {1: 6, 2: 5}
    assert choose([r for r in STEP_LOG if "checkpoint" not in r]) is None


def _model(folder: Path, tag: str) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"tag": tag}))
    return folder


def _run(tmp_path: Path, best_record: dict | None) -> Path:
    root = tmp_path / "run"
    _model(root / "episode-1" / "final", "e1-end")
    _model(root / "episode-2" / "final", "e2-end")
    _model(root / "best", "best")
    if best_record:
        (root / "best.json").write_text(json.dumps(best_record))
    (root / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in STEP_LOG))
    return root


def _tag(folder: Path) -> str:
    return json.loads((folder / "config.json").read_text())["tag"]


def test_the_last_episodes_final_gets_the_kept_best_and_chosen_json_says_which(tmp_path):
    root = _run(tmp_path, {"episode": 2, "step": 4, "dev/hits1": 0.6})
    summary = apply_choice(root, root / "steps.jsonl", 2, "best_dev")
    assert _tag(root / "episode-2" / "final") == "best"
    assert (
        json.loads((root / "chosen.json").read_text())
        == summary
        == {
            "choose_final": "best_dev",
            "episode": 2,
            "step": 4,
            "dev_hits1": 0.6,
            "source": str(root / "best"),
            "last": {"episode": 2, "step": 5, "dev_hits1": 0.4},
        }
    )


def test_without_a_kept_best_the_choice_is_among_the_episode_ends(tmp_path):
    root = _run(tmp_path, None)
    summary = apply_choice(root, root / "steps.jsonl", 2, "best_dev")
    assert (summary["episode"], summary["step"], summary["dev_hits1"]) == (1, 6, 0.6)
    assert _tag(root / "episode-2" / "final") == "e1-end" and _tag(root / "episode-1" / "final") == "e1-end"


def test_choose_final_last_keeps_the_last_step(tmp_path):
    root = _run(tmp_path, {"episode": 2, "step": 4, "dev/hits1": 0.6})
    summary = apply_choice(root, root / "steps.jsonl", 2, "last")
    assert (summary["episode"], summary["step"], summary["dev_hits1"]) == (2, 5, 0.4)
    assert _tag(root / "episode-2" / "final") == "e2-end"


def test_choose_final_defaults_to_best_dev_with_dev_evaluation_and_refuses_it_without():
    base = ["model=m", "dataset=d", "run_dir=o"]
    assert load_config(GRPORecipe, None, base + ["dev_eval_steps=5"]).choose_final == "best_dev"
    assert load_config(GRPORecipe, None, base).choose_final == "last"
    assert load_config(GRPORecipe, None, base).dev_eval_questions == 150
    with pytest.raises(ConfigError, match="choose_final: best_dev needs dev evaluation: set dev_eval_steps"):
        load_config(GRPORecipe, None, base + ["choose_final=best_dev"])


def test_the_demo_measures_dev_hits_on_at_least_150_questions():
    from kgreasoner.demo import DemoConfig

    config = load_config(DemoConfig, Path(__file__).resolve().parents[2] / "configs" / "demo" / "full.yaml")
    assert config.grpo.set["dev_eval_questions"] >= 150 and DemoConfig().grpo.set["dev_eval_questions"] >= 150
