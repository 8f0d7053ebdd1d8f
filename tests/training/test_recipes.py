"""Every shipped recipe parses into its documented dataclass."""

from pathlib import Path

import pytest

from kgreasoner.config import ConfigError, load_config
from kgreasoner.training.grpo import GRPORecipe
from kgreasoner.training.sft import SFTRecipe

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*/sft.yaml")), ids=lambda p: p.parent.name)
def test_sft_recipe_loads(path):
    assert load_config(SFTRecipe, path).train_file


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("*/grpo.yaml")), ids=lambda p: p.parent.name)
def test_grpo_recipe_loads(path):
    recipe = load_config(GRPORecipe, path)
    assert recipe.episodes[0].data == "all"


def test_paper_values_in_the_large_recipes():
    recipe = load_config(GRPORecipe, CONFIGS / "qwen3-8b" / "grpo.yaml")
    names = ("learning_rate", "beta", "epsilon", "num_generations", "temperature")
    assert tuple(recipe.setting(name) for name in names) == (1e-6, 1e-5, 0.2, 16, 1.0)


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("tiny-cpu/model*.yaml")), ids=lambda p: p.stem)
def test_tiny_model_recipes_load_with_heads_vllm_can_serve(path):
    from kgreasoner.models import TinyModelConfig

    config = load_config(TinyModelConfig, path)
    assert config.head_dim >= 32 and config.tokenizer.num_handles == 64


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("ablations/*.yaml")), ids=lambda p: p.stem)
def test_every_ablation_variants_grpo_settings_reach_the_recipe(path, tmp_path):
    """Each variant's `grpo.set.<key>` paths name fields of the recipe as it is: the plan builds every run's
    GRPO recipe from them, and each single value set lands on the field its path names."""
    from functools import reduce

    from kgreasoner.ablate import AblationConfig, Run, plan

    def field(at, name):  # a dataclass field, or a key of a mapping (`trainer:`)
        return at[name] if isinstance(at, dict) else getattr(at, name)

    config = load_config(AblationConfig, path)
    checked = 0
    for run in plan(config, tmp_path):
        for key, value in config.variants[run.variant].set.items():
            if isinstance(run, Run) and key.startswith("grpo.set.") and isinstance(value, (str, int, float)):
                assert reduce(field, key.split(".")[2:], run.demo.grpo.config) == value, (run.variant, key)
                checked += 1
    assert checked


OLD_FLAT = {
    "hard_threshold": (0.5, "hard_cases.threshold"),
    "hard_replay": (0.1, "hard_cases.replay"),
    "guidance_trajectories": ("all.jsonl", "guidance.trajectories"),
    "gold_advantage": (0.5, "guidance.gold_advantage"),
    "dev_eval_steps": (10, "dev_eval.steps"),
    "dev_eval_questions": (20, "dev_eval.questions"),
    "dev_eval_batch_size": (4, "dev_eval.batch_size"),
    "choose_final": ("last", "dev_eval.choose_final"),
    "search_reward": ("hops", "rewards.search_form"),
}


def test_a_recipe_in_the_old_flat_form_is_refused_naming_each_new_key(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text("model: m\ndataset: d\nrun_dir: o\n" + "".join(f"{k}: {v}\n" for k, (v, _) in OLD_FLAT.items()))
    with pytest.raises(ConfigError) as refused:
        load_config(GRPORecipe, path)
    moved = [f"{key} is now {new}" for key, (_, new) in sorted(OLD_FLAT.items())]
    assert str(refused.value) == f"{path}: " + "; ".join(moved)


def test_the_old_tiny_recipe_is_refused_in_one_message_naming_every_new_key(tmp_path):
    """guidance: gold beside guidance_trajectories, as the shipped tiny recipe read: both in one error."""
    path = tmp_path / "grpo.yaml"
    path.write_text("model: m\ndataset: d\nrun_dir: o\nguidance: gold\nguidance_trajectories: all.jsonl\n")
    with pytest.raises(ConfigError) as refused:
        load_config(GRPORecipe, path)
    assert str(refused.value) == (
        f"{path}: guidance_trajectories is now guidance.trajectories; "
        "guidance is now a mapping: its mode is guidance.mode (guidance: {mode: gold})"
    )


def test_an_old_guidance_mode_is_refused_naming_its_new_key(tmp_path):
    path = tmp_path / "grpo.yaml"
    path.write_text("model: m\ndataset: d\nrun_dir: o\nguidance: gold\n")
    with pytest.raises(ConfigError) as refused:
        load_config(GRPORecipe, path)
    assert (
        str(refused.value)
        == f"{path}: guidance is now a mapping: its mode is guidance.mode (guidance: {{mode: gold}})"
    )


def test_the_grouped_settings_load_from_their_groups():
    sets = [
        "model=m",
        "dataset=d",
        "run_dir=o",
        "hard_cases.replay=0.5",
        "guidance={mode: gold, trajectories: all.jsonl}",
        "dev_eval.steps=10",
        "rewards.search_form=path",
        "rewards.answer=2",
    ]
    recipe = load_config(GRPORecipe, None, sets)
    assert (recipe.hard_cases.threshold, recipe.hard_cases.replay) == (1.0, 0.5)
    assert (recipe.guidance.mode, recipe.guidance.trajectories, recipe.guidance.gold_advantage) == (
        "gold",
        "all.jsonl",
        1.0,
    )
    assert (recipe.dev_eval.steps, recipe.dev_eval.batch_size, recipe.dev_eval.final) == (10, 32, "best_dev")
    names = ["format_reward", "answer_reward", "search_reward"]  # weights go by name, whatever the order
    assert recipe.rewards.weights(names) == [1.0, 2.0, 1.0] and recipe.rewards.search_form == "path"


def test_every_grpo_setting_and_every_setting_of_its_groups_has_help_text():
    import dataclasses

    from kgreasoner.training.grpo_recipe import DevEvaluation, Guidance, HardCases, Rewards

    for group in (GRPORecipe, HardCases, Guidance, DevEvaluation, Rewards):
        missing = [f.name for f in dataclasses.fields(group) if not f.metadata.get("help")]
        assert missing == [], group.__name__
