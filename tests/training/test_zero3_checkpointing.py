"""ZeRO-3 with activation checkpointing: the DeepSpeed release pinned has the fix for frozen parameters, and
kgreasoner's own generation turns checkpointing back on the way TRL's generation does."""

from __future__ import annotations

import ast
import inspect
import operator
import re
import textwrap
from pathlib import Path

import pytest
from packaging.version import Version

from kgreasoner.config import ConfigError, load_config
from kgreasoner.rollout.types import RolloutConfig
from kgreasoner.training.grpo import Episode, GRPORecipe

REPO = Path(__file__).resolve().parents[2]
FROZEN_RECOMPUTE_FIX = Version("0.19.3")
"""The first DeepSpeed whose ZeRO-3 keeps a frozen parameter gathered through an activation-checkpoint
recompute (`update_recompute_parameters` in runtime/zero/partitioned_param_coordinator.py): before it,
LoRA's frozen base with checkpointing fails its backward with a CheckpointError (shape [N] vs [0])."""


def test_pyproject_requires_a_deepspeed_with_the_frozen_parameter_fix():
    text = (REPO / "pyproject.toml").read_text()
    [floor] = re.findall(r'"deepspeed>=([\d.]+)"', text)
    assert Version(floor) >= FROZEN_RECOMPUTE_FIX
    for constraints in sorted(REPO.glob("constraints-*.txt")):
        for pinned in re.findall(r"^deepspeed==([\d.]+)$", constraints.read_text(), re.M):
            assert Version(pinned) >= Version(floor), constraints.name


def _trls_generation_kwargs(trainer) -> list[dict]:
    """The keyword arguments of each `unwrap_model_for_generation` call in TRL's own generation
    (`GRPOTrainer._generate_single_turn`), read from its source and resolved on `trainer`; all but
    `generation_kwargs`, TRL's override of the model's generation config for transformers < 5 (the rollout
    engine samples with its own settings)."""
    from trl import GRPOTrainer

    tree = ast.parse(textwrap.dedent(inspect.getsource(GRPOTrainer._generate_single_turn)))
    calls = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "unwrap_model_for_generation"
    ]
    assert calls, "TRL's generation no longer calls unwrap_model_for_generation"
    found = []
    for call in calls:
        expressions = {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg != "generation_kwargs"}
        assert all(e.startswith("self.") for e in expressions.values()), expressions
        found.append({name: operator.attrgetter(e.removeprefix("self."))(trainer) for name, e in expressions.items()})
    return found


@pytest.mark.slow
def test_generation_turns_checkpointing_back_on_with_the_runs_kwargs(tiny_checkpoint, synthetic_dir, tmp_path):
    """A run with non-default checkpointing kwargs (`use_reentrant: true`): after the step's rollouts and after
    the dev split's verdicts, the policy checkpoints with those kwargs still, and each of our calls of TRL's
    generation context passes what TRL's own generation passes."""
    import trl.models

    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
    from kgreasoner.training.grpo import build_trainer
    from kgreasoner.training.grpo_rollout import PolicyRollouts, greedy_verdicts

    recipe = GRPORecipe(
        model=str(tiny_checkpoint),
        dataset=str(synthetic_dir),
        run_dir=str(tmp_path / "run"),
        tool=ToolConfig(entity_handles=True, top_k=5),
        rollout=RolloutConfig(max_new_tokens=12, max_turn_tokens=6, max_turns=1),
        episodes=[Episode("all", max_steps=1)],
        max_questions=4,
        trainer={
            "num_generations": 2,
            "per_device_train_batch_size": 4,
            "report_to": [],
            "save_steps": 10,
            "beta": 0.0,
            "activation_checkpointing": True,
            "activation_checkpointing_kwargs": {"use_reentrant": True},
        },
    )
    dataset = load_dataset(recipe.dataset, split_scheme=recipe.split_scheme, seed=recipe.split_seed)
    tool = KGSearchTool(open_dataset_kg(dataset), recipe.tool)
    trainer = build_trainer(recipe, 1, recipe.episodes[0], dataset.split("train")[:4], recipe.model, tool)
    real, calls = trl.models.unwrap_model_for_generation, []

    def recording(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    def checkpointing_kwargs() -> list[dict]:
        """The kwargs each checkpointed module hands torch's checkpoint (transformers binds them with partial)."""
        return [
            dict(module._gradient_checkpointing_func.keywords)
            for module in trainer.model.model.layers
            if module.gradient_checkpointing
        ]

    trl.models.unwrap_model_for_generation = recording
    try:
        trainer.train()
        assert checkpointing_kwargs() == [{"use_reentrant": True}] * len(trainer.model.model.layers)
        greedy_verdicts(PolicyRollouts("hf", recipe.rollout, tool), trainer, dataset.split("dev")[:2], 2)
        assert checkpointing_kwargs() == [{"use_reentrant": True}] * len(trainer.model.model.layers)
    finally:
        trl.models.unwrap_model_for_generation = real
    assert len(calls) == 2  # the step's rollouts, the dev split's verdicts
    trls = _trls_generation_kwargs(trainer)
    assert trls[0]["gradient_checkpointing_kwargs"] == {"use_reentrant": True}
    for args, kwargs in calls:
        assert args[0] is trainer.model_wrapped and args[1] is trainer.accelerator
        assert all(kwargs == expected for expected in trls)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("trainer.ds3_gather_for_generation=false", "ds3_gather_for_generation: False is not supported: the hf"),
        (
            "trainer.activation_checkpointing_kwargs={every_n_layers: 2, use_reentrant: false}",
            "activation_checkpointing_kwargs: every_n_layers is not supported: after each generation",
        ),
    ],
)
def test_settings_the_generation_context_cannot_honour_are_refused(setting, message):
    with pytest.raises(ConfigError, match=message):
        load_config(GRPORecipe, None, ["model=m", "dataset=d", "run_dir=o", setting])
