"""A GRPO run's episodes share one AdamW state and one learning-rate schedule; a resumed run goes on exactly."""

import dataclasses
import json
import shutil

import pytest
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from kgreasoner.config import ConfigError, load_config
from kgreasoner.retrieval.tool import ToolConfig
from kgreasoner.rollout.types import RolloutConfig
from kgreasoner.training.grpo import Episode, GRPORecipe, train_grpo
from kgreasoner.training.grpo_recipe import Guidance

LR = 1e-3
# linear over the run's 6 steps after 2 warm-up steps: s / 2, then (6 - s) / 4
RUN_SCHEDULE = [LR * f for f in (0.0, 0.5, 1.0, 0.75, 0.5, 0.25)]


class OptimizerSteps:
    """Every optimiser step of the process: its lr, and one parameter's AdamW state before and after it."""

    def __init__(self) -> None:
        self.before: list[tuple] = []
        self.after: list[tuple] = []

    def __enter__(self):
        self.handles = [
            register_optimizer_step_pre_hook(lambda optimizer, *_: self.before.append(self._state(optimizer))),
            register_optimizer_step_post_hook(lambda optimizer, *_: self.after.append(self._state(optimizer))),
        ]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self.handles:
            handle.remove()

    @staticmethod
    def _state(optimizer) -> tuple:
        group = optimizer.param_groups[0]
        state = optimizer.state.get(group["params"][-1], {})
        moment = state["exp_avg"].clone() if "exp_avg" in state else None
        return group["lr"], moment, float(state["step"]) if "step" in state else 0.0


TOOL = ToolConfig(entity_handles=True, top_k=5)


@pytest.fixture(scope="module")
def gold_file(synthetic_dir, tmp_path_factory):
    """Gold warm-up trajectories of every training question: guided groups give the untrained model's all-wrong
    groups a right row, so its steps have real gradients."""
    from data_gen.warmup import WarmupConfig, run

    path = tmp_path_factory.mktemp("gold") / "all.jsonl"
    run(
        WarmupConfig(
            dataset=str(synthetic_dir), output=str(path), num_examples=None, dev_examples=0, tool=TOOL, progress=False
        )
    )
    return path


def _recipe(model, data, gold, out) -> GRPORecipe:
    return GRPORecipe(
        model=str(model),
        dataset=str(data),
        run_dir=str(out),
        tool=TOOL,
        rollout=RolloutConfig(max_new_tokens=24, max_turn_tokens=12, max_turns=2),
        episodes=[Episode("all", max_steps=3), Episode("all", max_steps=3)],
        max_questions=12,
        guidance=Guidance("gold", str(gold)),
        trainer={
            "num_generations": 4,
            "per_device_train_batch_size": 8,
            "learning_rate": LR,
            "lr_scheduler_type": "linear",
            "warmup_steps": 2,
            "beta": 0.0,
            "report_to": [],
            "save_steps": 1,
            "save_total_limit": 2,
        },
    )


def test_episode_two_starts_from_episode_ones_adamw_state_on_the_runs_one_schedule(
    tiny_checkpoint, synthetic_dir, gold_file, tmp_path
):
    out = tmp_path / "run"
    with OptimizerSteps() as steps:
        train_grpo(_recipe(tiny_checkpoint, synthetic_dir, gold_file, out))
    assert [lr for lr, _, _ in steps.before] == RUN_SCHEDULE
    last_of_one, first_of_two = steps.after[2], steps.before[3]
    assert last_of_one[1].abs().sum() > 0, "episode 1 trained with no gradient: the moment proves nothing"
    assert first_of_two[1] is not None and first_of_two[1].equal(last_of_one[1])
    assert first_of_two[2] == last_of_one[2] == 3.0  # AdamW's step count runs on (its bias correction with it)

    # killed after episode 2's step 2: --resume takes the checkpoint's own optimiser and scheduler
    shutil.rmtree(out / "episode-2" / "final")
    shutil.rmtree(out / "episode-2" / "checkpoint-3")
    with OptimizerSteps() as resumed:
        train_grpo(_recipe(tiny_checkpoint, synthetic_dir, gold_file, out), resume=True)
    assert [lr for lr, _, _ in resumed.before] == RUN_SCHEDULE[5:]
    assert resumed.before[0][1].equal(steps.before[5][1]) and resumed.before[0][2] == 5.0


def test_a_recipe_whose_episodes_cannot_share_the_schedule_says_what_to_set():
    base = ["model=m", "dataset=d", "run_dir=o"]
    epochs = ["episodes=[{data: all, max_steps: 4}, {data: all}]"]
    with pytest.raises(ConfigError, match="episode\\(s\\) \\[2\\] set no max_steps.*give every episode after"):
        load_config(GRPORecipe, None, base + epochs + ["trainer.lr_scheduler_type=linear"])
    with pytest.raises(ConfigError, match="reads that total"):
        load_config(
            GRPORecipe,
            None,
            base + epochs + ["trainer.lr_scheduler_type=constant_with_warmup"] + ["trainer.warmup_steps=0.1"],
        )
    # a warm-up of a fixed count on a constant lr needs no total
    load_config(
        GRPORecipe,
        None,
        base + epochs + ["trainer.lr_scheduler_type=constant_with_warmup"] + ["trainer.warmup_steps=5"],
    )
    with pytest.raises(ConfigError, match="not done under DeepSpeed.*set episode_carry: false"):
        load_config(GRPORecipe, None, base + ["trainer.deepspeed=configs/deepspeed/zero2.json"])
    load_config(GRPORecipe, None, base + ["trainer.deepspeed=configs/deepspeed/zero2.json", "episode_carry=false"])


@pytest.mark.parametrize("order", ["stratified", "shuffled"])
def test_a_run_killed_mid_epoch_resumes_with_the_same_samples_and_losses(
    order, tiny_checkpoint, synthetic_dir, gold_file, tmp_path
):
    """Two questions a step, 8 questions: an epoch is 4 steps. The run is cut after its step-5 checkpoint (half way
    through the second epoch, whose shuffled order is not the first's) and resumed: every later step trains the
    same questions, samples the same rollouts and logs the same loss as the run that was never stopped."""
    recipe = dataclasses.replace(
        _recipe(tiny_checkpoint, synthetic_dir, gold_file, tmp_path / "run"),
        episodes=[Episode("all", max_steps=6)],
        max_questions=8,
        order=order,
    )
    recipe.trainer.update(save_total_limit=None, warmup_steps=0)
    train_grpo(recipe)
    episode = tmp_path / "run" / "episode-1"

    def logged() -> tuple[list, list, list]:
        state = json.loads((episode / "checkpoint-6" / "trainer_state.json").read_text())
        losses = [(row["step"], row["loss"]) for row in state["log_history"] if "loss" in row]
        steps = [json.loads(line) for line in (tmp_path / "run" / "steps.jsonl").read_text().splitlines()]
        groups = [json.loads(line) for line in (episode / "groups.jsonl").read_text().splitlines()]
        # the rollouts' lengths, rewards and answers; not the clocks
        return losses, [{k: v for k, v in row.items() if "time" not in k} for row in steps], groups

    whole = logged()
    assert [step for step, _ in whole[0]] == list(range(1, 7))
    # killed after checkpoint-5: what the kill leaves on disk (the logs keep rows past it; the resume drops them)
    shutil.rmtree(episode / "final")
    shutil.rmtree(episode / "checkpoint-6")
    train_grpo(recipe, resume=True)
    assert logged() == whole


def test_the_carried_adamw_state_loads_whatever_device_the_trainer_names(tmp_path):
    """A trainer's device is `cpu:0` once a process group exists; torch.load cannot map onto that name, so
    the previous episode's state is read onto the CPU and placed by `load_state_dict`."""
    import torch

    from kgreasoner.training.episode_schedule import RunSchedule

    weight = torch.nn.Parameter(torch.ones(3, device=torch.device("cpu", 0)))
    before = torch.optim.AdamW([weight], lr=0.1)
    weight.grad = torch.tensor([1.0, -2.0, 3.0])
    before.step()
    torch.save(before.state_dict(), tmp_path / "optimizer.pt")
    after = torch.optim.AdamW([weight], lr=0.5)
    RunSchedule(first_step=1, later_steps=None, carry_from=tmp_path / "optimizer.pt").load_optimizer(after)
    [state] = after.state.values()
    assert torch.equal(state["exp_avg"], torch.tensor([0.1, -0.2, 0.3])) and int(state["step"]) == 1
    assert after.param_groups[0]["lr"] == 0.1
