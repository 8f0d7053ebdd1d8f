"""Every shipped recipe parses into its documented dataclass."""

from pathlib import Path

import pytest

from kgreasoner.config import load_config
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
