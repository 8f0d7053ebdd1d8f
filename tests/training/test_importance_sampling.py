"""TRL's importance-sampling correction of vLLM rollouts: a recipe choice that reaches TRL's config, and the
share of model tokens and rollouts it dropped or capped in the step log."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from kgreasoner.config import ConfigError, load_config
from kgreasoner.rollout.types import RolloutConfig
from kgreasoner.training.grpo import Episode, GRPORecipe, grpo_config

BASE = ["model=m", "dataset=d", "run_dir=o"]


def test_the_recipes_mode_reaches_trls_config(tmp_path):
    default = load_config(GRPORecipe, None, BASE)
    assert default.importance_sampling == "token_truncate"
    assert grpo_config(default, tmp_path, default.episodes[0]).vllm_importance_sampling_mode == "token_truncate"
    chosen = load_config(GRPORecipe, None, [*BASE, "importance_sampling=sequence_mask"])
    assert grpo_config(chosen, tmp_path, chosen.episodes[0]).vllm_importance_sampling_mode == "sequence_mask"
    with pytest.raises(
        ConfigError, match="vllm_importance_sampling_mode is set by kgreasoner from importance_sampling"
    ):
        load_config(GRPORecipe, None, [*BASE, "trainer.vllm_importance_sampling_mode=token_mask"])
    with pytest.raises(ConfigError, match="importance_sampling must be one of .*'sequence_mask'.*, got 'token'"):
        load_config(GRPORecipe, None, [*BASE, "importance_sampling=token"])


NAN = math.nan
# old - sampling logprob of each completion token; mask 0 on a tool token (row 0), padding and a masked row
DIFFERENCE = [
    [0.1, 5.0, 1.5, 0.0],  # token 2: exp(1.5) = 4.48 > 3; the row: exp(0.1 + 1.5) = 4.95 > 3
    [0.5, 0.5, 0.5, 0.5],  # every token exp(0.5) = 1.65; the row exp(2.0) = 7.39 > 3
    [NAN, -2.0, 0.2, 0.0],  # an unscored token (NaN); exp(-2) = 0.135; the row exp(-1.8) = 0.165
    [9.0, 9.0, 9.0, 9.0],  # a row with no model token
]
MASK = [[1, 0, 1, 0], [1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]]


@pytest.mark.parametrize(
    ("mode", "clip_min", "counts"),
    [
        # [model tokens, dropped tokens, capped tokens, rows with a model token, rows all dropped]
        ("token_mask", None, [9, 1, 0, 3, 0]),
        ("token_truncate", None, [9, 0, 1, 3, 0]),
        ("token_mask", 0.5, [9, 2, 0, 3, 0]),
        ("sequence_mask", None, [9, 6, 0, 3, 2]),
        ("sequence_truncate", None, [9, 0, 6, 3, 0]),
        ("sequence_mask", 0.5, [9, 9, 0, 3, 3]),
    ],
)
def test_the_counts_of_what_the_correction_drops_and_caps(mode, clip_min, counts):
    from kgreasoner.training.trl_internals import importance_sampling_counts

    sampling = torch.full((4, 4), -3.0)
    difference = torch.tensor(DIFFERENCE)
    old = torch.where(difference.isnan(), sampling, sampling + difference)
    sampling = torch.where(difference.isnan(), torch.full_like(sampling, NAN), sampling)
    got = importance_sampling_counts(old, sampling, torch.tensor(MASK), mode, clip_min, 3.0)
    assert got.tolist() == counts


@pytest.mark.slow
def test_the_step_log_carries_the_share_trls_correction_dropped(tiny_checkpoint, synthetic_dir, tmp_path):
    """vLLM cannot run on a CPU: the trainer is switched onto TRL's vLLM path once built (`use_vllm`, this
    step's weights marked loaded), and the engine's sampling logprobs are the hf rollout's own, lowered by
    1.5 on the first 2i model tokens of row i: a ratio of exp(1.5) = 4.5, which TRL's `token_mask` (cap 3)
    drops. The step log's shares must be what TRL's own importance-sampling ratio of the batch says."""
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
    from kgreasoner.training.grpo import build_trainer

    recipe = GRPORecipe(
        model=str(tiny_checkpoint),
        dataset=str(synthetic_dir),
        run_dir=str(tmp_path / "run"),
        tool=ToolConfig(entity_handles=True, top_k=5),
        rollout=RolloutConfig(max_new_tokens=16, max_turn_tokens=8, max_turns=1),
        episodes=[Episode("all", max_steps=1)],
        max_questions=8,
        importance_sampling="token_mask",
        trainer={"num_generations": 2, "per_device_train_batch_size": 8, "report_to": [], "beta": 0.0},
    )
    dataset = load_dataset(recipe.dataset, split_scheme=recipe.split_scheme, seed=recipe.split_seed)
    tool = KGSearchTool(open_dataset_kg(dataset), recipe.tool)
    trainer = build_trainer(recipe, 1, recipe.episodes[0], dataset.split("train")[:8], recipe.model, tool)
    assert trainer.vllm_importance_sampling_mode == "token_mask"
    trainer.use_vllm = True
    trainer._last_loaded_step = 0
    rollout = trainer.rollout_func

    def lowered(prompts, trainer_):
        out = rollout(prompts, trainer_)
        for i, (row, mask) in enumerate(zip(out["logprobs"], out["env_mask"])):
            model_tokens = [j for j, m in enumerate(mask) if m][: 2 * i]
            for j in model_tokens:
                row[j] -= 1.5
        return out

    trainer.rollout_func = lowered
    batches = []
    generate = trainer._generate_and_score_completions

    def recording(inputs):
        batches.append(generate(inputs))
        return batches[-1]

    trainer._generate_and_score_completions = recording
    trainer.train()
    [batch] = batches
    mask = (batch["completion_mask"] * batch["tool_mask"]).bool()
    dropped = (batch["importance_sampling_ratio"] == 0) & mask
    rows = mask.any(dim=1)
    all_dropped = rows & (dropped == mask).all(dim=1)
    assert 0 < all_dropped.sum() < rows.sum(), "no row, or every row, was dropped whole: the case shows nothing"
    [logged] = [json.loads(line) for line in (Path(recipe.run_dir) / "steps.jsonl").read_text().splitlines()]
    assert logged["rollout/is_dropped"] == pytest.approx(float(dropped.sum() / mask.sum()), abs=1e-12)
    assert logged["rollout/is_dropped_rows"] == pytest.approx(float(all_dropped.sum() / rows.sum()), abs=1e-12)
    assert logged["rollout/is_dropped"] != logged["rollout/is_dropped_rows"]
    assert logged["rollout/is_capped"] == 0.0
