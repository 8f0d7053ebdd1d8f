"""The loss override (`trl_internals.scoring_trainer_class`) against TRL 1.16's own `_compute_loss`, on a real
trainer and the tiny model: the same loss to the last bit where TRL's is finite, a loss that backward runs
through when no token is kept, and one forward per chunk whatever the masks."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kgreasoner.rollout.types import RolloutConfig
from kgreasoner.training.grpo import Episode, GRPORecipe


def _recipe(tiny_checkpoint, synthetic_dir, out: Path, rollout: RolloutConfig | None = None, **trainer) -> GRPORecipe:
    from kgreasoner.retrieval.tool import ToolConfig

    return GRPORecipe(
        model=str(tiny_checkpoint),
        dataset=str(synthetic_dir),
        run_dir=str(out),
        tool=ToolConfig(entity_handles=True, top_k=5),
        rollout=rollout or RolloutConfig(max_new_tokens=24, max_turn_tokens=12, max_turns=2),
        episodes=[Episode("all", max_steps=1)],
        max_questions=8,
        trainer={
            "num_generations": 2,
            "per_device_train_batch_size": 4,
            "learning_rate": 1e-3,
            "report_to": [],
            "save_steps": 10,
            "beta": 0.0,
            **trainer,
        },
    )


def _trainer(recipe: GRPORecipe):
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.retrieval.tool import KGSearchTool
    from kgreasoner.training.grpo import build_trainer

    dataset = load_dataset(recipe.dataset, scheme=recipe.split_scheme, seed=recipe.split_seed)
    tool = KGSearchTool(open_dataset_kg(dataset), recipe.tool)
    examples = dataset.split("train")[: recipe.max_questions]
    return build_trainer(recipe, 1, recipe.episodes[0], examples, recipe.model, tool)


def _stock_loss(trainer, inputs) -> torch.Tensor:
    """TRL's own path: its `_compute_loss`, whose `_get_per_token_logps_and_entropies` scores every position."""
    from trl import GRPOTrainer

    return GRPOTrainer._compute_loss(trainer, trainer.model, inputs)


def _forwards(model) -> list[int]:
    """A counter of the model's forward calls (the policy's top module: one per chunk scored)."""
    calls: list[int] = []
    model.register_forward_pre_hook(lambda module, args: calls.append(1))
    return calls


@pytest.mark.slow
def test_a_step_whose_rows_are_all_masked_trains_and_matches_trls_loss(tiny_checkpoint, synthetic_dir, tmp_path):
    """Every rollout stops at its token budget (two tokens), so TRL's `mask_truncated_completions` masks every
    row: no token is kept. The step must still run its backward, with the loss TRL's own path gives, and
    the forward must run once per chunk as with kept tokens (under ZeRO-3 each forward is a collective)."""
    recipe = _recipe(
        tiny_checkpoint,
        synthetic_dir,
        tmp_path / "run",
        RolloutConfig(max_new_tokens=2, max_turn_tokens=2, max_turns=1),
        mask_truncated_completions=True,
        per_device_train_batch_size=8,  # two chunks of length_chunk_rows 4
    )
    trainer = _trainer(recipe)
    seen = []
    compute_loss = trainer._compute_loss

    def recording(model, inputs):
        seen.append(inputs)
        return compute_loss(model, inputs)

    trainer._compute_loss = recording
    trainer.train()  # before: "element 0 of tensors does not require grad and does not have a grad_fn"
    assert trainer.state.global_step == 1 and seen
    for inputs in seen:
        assert inputs["completion_mask"].sum() == 0, "a row ended before its budget: the batch is not all masked"
        calls = _forwards(trainer.model)
        ours = compute_loss(trainer.model, inputs)
        rows = inputs["completion_ids"].size(0)
        assert rows == 8 and len(calls) == 2 == -(-rows // trainer.length_chunk_rows)
        assert torch.equal(ours, _stock_loss(trainer, inputs))
        ours.backward()  # the loss hangs off the model
