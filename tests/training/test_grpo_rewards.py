"""The recipe's reward options reach TRL: advantage scaling in its config, the `path` search reward in a real step."""

import pytest

from kgreasoner.retrieval.tool import ToolConfig
from kgreasoner.rollout.types import RolloutConfig
from kgreasoner.training.grpo import Episode, GRPORecipe, grpo_config
from kgreasoner.training.grpo_recipe import Rewards


def _recipe(out, **overrides) -> GRPORecipe:
    fields = dict(model="unused", dataset="unused", run_dir=str(out), trainer={"report_to": []})
    trainer = {**fields.pop("trainer"), **overrides.pop("trainer", {})}
    return GRPORecipe(**{**fields, **overrides, "trainer": trainer})


@pytest.mark.parametrize("scaling", ["group", "batch", "none"])
def test_scale_rewards_reaches_trls_config(tmp_path, scaling):
    recipe = _recipe(tmp_path, trainer={"scale_rewards": scaling})
    assert grpo_config(recipe, tmp_path / "episode-1", recipe.episodes[0]).scale_rewards == scaling


def test_scale_rewards_defaults_to_group_and_refuses_other_values(tmp_path):
    assert _recipe(tmp_path).setting("scale_rewards") == "group"
    with pytest.raises(
        ValueError, match=r"trainer.scale_rewards must be one of \('group', 'batch', 'none'\), got 'std'"
    ):
        _recipe(tmp_path, trainer={"scale_rewards": "std"})


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A small synthetic dataset and a tiny untrained model whose tokenizer knows its words."""
    from data_gen.synthetic import write_synthetic
    from kgreasoner.models import TinyModelConfig, build_tiny
    from kgreasoner.tokenizer import TokenizerConfig, read_training_texts

    root = tmp_path_factory.mktemp("path-reward")
    data = write_synthetic(root / "data", seed=0, num_entities=300, num_questions=120)
    config = TinyModelConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        intermediate_size=128,
        tokenizer=TokenizerConfig(num_handles=16),
    )
    build_tiny(config, read_training_texts([data / "questions.jsonl", data / "kb.tsv"]), root / "tiny")
    return root


@pytest.mark.slow
def test_a_grpo_step_with_the_path_search_reward_logs_what_it_pays(world, tmp_path):
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.data.gold_chains import GoldChains
    from kgreasoner.retrieval.tool import KGSearchTool
    from kgreasoner.training.grpo import build_trainer

    recipe = _recipe(
        tmp_path / "run",
        model=str(world / "tiny"),
        dataset=str(world / "data"),
        tool=ToolConfig(entity_handles=True, top_k=5),
        rewards=Rewards(search_form="path"),
        rollout=RolloutConfig(max_new_tokens=32, max_turn_tokens=16, max_turns=2),
        episodes=[Episode("all", max_steps=1)],
        trainer={
            "num_generations": 2,
            "per_device_train_batch_size": 4,
            "learning_rate": 1e-3,
            "beta": 0.0,
            "save_steps": 1,
        },
    )
    dataset = load_dataset(recipe.dataset, split_scheme=recipe.split_scheme, seed=recipe.split_seed)
    examples = {e.id: e for e in dataset.split("train")[:8]}
    tool = KGSearchTool(open_dataset_kg(dataset), recipe.tool)
    trainer = build_trainer(recipe, 1, recipe.episodes[0], list(examples.values()), recipe.model, tool)
    assert trainer.reward_func_names[0] == "search_reward"
    # Spies that call the real rollout and reward and keep what passed between them.
    rollouts, calls = [], []
    rollout, search = trainer.rollout_func, trainer.reward_funcs[0]

    def recorded_rollout(prompts, trainer):
        rollouts.append(rollout(prompts, trainer))
        return rollouts[-1]

    def recorded_search(**kwargs):
        calls.append((kwargs, search(**kwargs)))
        return calls[-1][1]

    trainer.rollout_func, trainer.reward_funcs[0] = recorded_rollout, recorded_search
    trainer.train()

    [(kwargs, paid)] = calls
    [output] = rollouts
    chains = GoldChains(tool.kg)
    assert kwargs["gold_chains"] == [chains(examples[i]) for i in kwargs["id"]]
    assert all(c.startswith('[[{"levels": [[') for c in kwargs["gold_chains"])  # the synthetic set has gold paths
    assert kwargs["search_record"] == output["search_record"] and len(paid) == 4
    assert all(0.0 <= v <= 0.8 for v in paid)
    [logged] = [row for row in trainer.state.log_history if "rewards/search_reward/mean" in row]
    assert logged["rewards/search_reward/mean"] == pytest.approx(sum(paid) / len(paid))


def test_the_rollouts_judge_an_answer_right_as_the_answer_reward_pays_it():
    """One judge (`rewards.is_right`): the rollout figures, the guided groups and dev evaluation
    (`right_answers` on trajectories) call right exactly the rows the answer reward pays, as TRL hands it the
    dataset's answer forms and the rollout's resolved answers and tool spans."""
    from kgreasoner.records.schema import Answer, QAExample, TopicEntity
    from kgreasoner.rewards import answer_reward
    from kgreasoner.rollout.types import Trajectory
    from kgreasoner.training.grpo_rollout import right_answers

    paris = QAExample(
        "q", "the capital of France?", (TopicEntity("m.fr", "France"),), (Answer("m.p", "Paris", ("City of Light",)),)
    )

    def row(text: str, resolved: list[str]) -> Trajectory:
        return Trajectory(0, [1], [2], [1], [-0.1], text, [], "answer", resolved_answers=resolved)

    rows = [
        row("<answer>paris</answer>", ["paris"]),  # normalised
        row("<answer>E1</answer>", ["City of Light"]),  # a handle the session resolved to an alias
        row("<answer>Lyon</answer>", ["Lyon"]),
        row("<answer>Paris</answer>", []),  # the session found no answer: the text is not read again
    ]
    right = right_answers(rows, [paris] * len(rows))
    paid = answer_reward(
        [t.text for t in rows],
        answers=[Answer("m.p", "Paris", ("City of Light",)).surface_forms()] * len(rows),
        resolved_answers=[t.resolved_answers for t in rows],
        tool_spans=[t.tool_spans for t in rows],
    )
    assert right == [True, True, False, False]
    assert [p > 0 for p in paid] == right
