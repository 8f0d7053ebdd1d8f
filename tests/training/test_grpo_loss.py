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

    dataset = load_dataset(recipe.dataset, split_scheme=recipe.split_scheme, seed=recipe.split_seed)
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


def _handmade_inputs(trainer, old_at: dict | None = None):
    """A batch of six rows the way TRL hands it to the loss: prompts padded on the left, completions on the
    right, two columns of tool output (loss mask 0) in every row, and old logprobs computed as TRL's
    `_generate_and_score_completions` computes them (its own scoring of every position, no grad)."""
    from trl import GRPOTrainer

    generator = torch.Generator().manual_seed(0)
    vocab = trainer.model.config.vocab_size
    rows, prompt, width = 6, 5, 9
    prompt_ids = torch.randint(3, vocab, (rows, prompt), generator=generator)
    prompt_mask = torch.ones(rows, prompt, dtype=torch.long)
    prompt_mask[1, :2] = 0
    prompt_mask[4, :1] = 0
    completion_ids = torch.randint(3, vocab, (rows, width), generator=generator)
    lengths = [9, 4, 7, 2, 9, 5]
    completion_mask = torch.tensor([[1] * n + [0] * (width - n) for n in lengths])
    tool_mask = torch.ones(rows, width, dtype=torch.long)
    tool_mask[:, 2:4] = 0
    ids = torch.cat([prompt_ids, completion_ids], dim=1)
    attention = torch.cat([prompt_mask, completion_mask], dim=1)
    with torch.no_grad():
        old, _, _ = GRPOTrainer._get_per_token_logps_and_entropies(
            trainer, trainer.model, ids, attention, width, batch_size=trainer.args.per_device_train_batch_size
        )
    return {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "tool_mask": tool_mask,
        "advantages": torch.tensor([1.0, -1.0, 0.5, -0.5, 0.0, 2.0]),
        "old_per_token_logps": old,
        "num_items_in_batch": (completion_mask * tool_mask).sum(),
    }


def _gradient(trainer, loss) -> torch.Tensor:
    trainer.model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])


@pytest.mark.slow
@pytest.mark.parametrize("loss_type", ["grpo", "dapo"])
def test_tool_tokens_the_policy_finds_unlikely_leave_the_loss_trls(
    tiny_checkpoint, synthetic_dir, tmp_path, loss_type
):
    """At temperature 0.01 the policy puts logprobs below -100 on some tool-output tokens (which it did not
    write). The override scored 0 there, exp(0 - old) overflowed and inf x mask 0 made the loss NaN.
    TRL's own path scores those positions too (new = old there) and its loss is finite: ours must be it,
    bit for bit, with its gradient (the chunked forward sums in another order: to 1e-6)."""
    recipe = _recipe(tiny_checkpoint, synthetic_dir, tmp_path / "run", temperature=0.01, loss_type=loss_type)
    trainer = _trainer(recipe)
    inputs = _handmade_inputs(trainer)
    tool_tokens = (inputs["tool_mask"] == 0) & (inputs["completion_mask"] == 1)
    assert inputs["old_per_token_logps"][tool_tokens].min() < -100, "no tool token as unlikely as the case needs"
    stock = _stock_loss(trainer, inputs)
    assert torch.isfinite(stock)
    assert torch.equal(trainer._compute_loss(trainer.model, inputs), stock)
    ours = _gradient(trainer, trainer._compute_loss(trainer.model, inputs))
    assert torch.allclose(ours, _gradient(trainer, _stock_loss(trainer, inputs)), atol=1e-6)


@pytest.mark.slow
def test_the_kl_term_reads_nothing_where_the_mask_reads_nothing(tiny_checkpoint, synthetic_dir, tmp_path):
    """With beta > 0, a reference model that finds a tool token 100 nats likelier than the policy does:
    exp(ref - new) overflows where new is the old logprob, and inf x mask 0 is NaN (in TRL's own path as
    well, which scores new = old there). The loss must be TRL's on the same batch with that reference
    logprob, which the mask multiplies by 0, left at the old one: bit for bit."""
    recipe = _recipe(tiny_checkpoint, synthetic_dir, tmp_path / "run", temperature=0.01, beta=0.04)
    trainer = _trainer(recipe)
    inputs = _handmade_inputs(trainer)
    old = inputs["old_per_token_logps"]
    tool_tokens = (inputs["tool_mask"] == 0) & (inputs["completion_mask"] == 1)
    assert old[tool_tokens].min() < -100, "no tool token as unlikely as the case needs"
    reference = old - 0.25  # elsewhere the reference differs a little: the KL term is not 0
    inputs["ref_per_token_logps"] = torch.where(tool_tokens, old + 100.0, reference)
    ours = trainer._compute_loss(trainer.model, inputs)
    assert torch.isfinite(ours)
    assert torch.equal(
        ours, _stock_loss(trainer, {**inputs, "ref_per_token_logps": torch.where(tool_tokens, old, reference)})
    )
