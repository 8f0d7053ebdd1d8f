"""The recipe's reward options reach TRL: advantage scaling in its config."""

import pytest

from kgreasoner.training.grpo import Episode, GRPORecipe, grpo_config


def _recipe(out, **overrides) -> GRPORecipe:
    fields = dict(model="unused", dataset="unused", output_dir=str(out), report_to=[])
    return GRPORecipe(**{**fields, **overrides})


@pytest.mark.parametrize("scaling", ["group", "batch", "none"])
def test_scale_rewards_reaches_trls_config(tmp_path, scaling):
    recipe = _recipe(tmp_path, scale_rewards=scaling)
    assert grpo_config(recipe, tmp_path / "episode-1", recipe.episodes[0]).scale_rewards == scaling


def test_scale_rewards_defaults_to_group_and_refuses_other_values(tmp_path):
    assert _recipe(tmp_path).scale_rewards == "group"
    with pytest.raises(ValueError, match=r"scale_rewards must be one of \('group', 'batch', 'none'\), got 'std'"):
        _recipe(tmp_path, scale_rewards="std")
    with pytest.raises(ValueError, match="trainer: scale_rewards set by the recipe's own fields"):
        grpo_config(_recipe(tmp_path, trainer={"scale_rewards": "batch"}), tmp_path, Episode())
