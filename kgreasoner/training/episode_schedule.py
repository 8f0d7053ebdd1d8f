"""One optimiser and one learning-rate schedule across a GRPO run's episodes (`episode_carry: true`).

Each episode is a TRL trainer of its own, built on the previous episode's final weights. Left alone, each
would start AdamW afresh (zero moments and step counts, so full-size first updates) and its schedule from
step 0 (a constant lr at full size at once, or the warm-up again): every boundary would be a restart.
Instead episode k > 1 loads the AdamW state (moments and step counts) that episode k - 1 saved with its
last checkpoint (`optimizer.pt`, written at its final step), and every episode's scheduler is a window of
the run's one schedule: TRL's `lr_scheduler_type` over the optimiser steps of all episodes together, its
warm-up (`warmup_steps`: a count, or a share of that total when below 1) at the start of the run, read
from the step the earlier episodes reached.

The total is known before episode 1 only when every later episode sets `max_steps` (the questions of a
hard or frontier episode may be known only once earlier episodes ran), so a schedule that reads the total
(any decaying one, or a warm-up given as a share) needs that; `check_run_schedule` says so.

`--resume` inside an episode loads the checkpoint's own optimiser and scheduler state after these, so a
resumed episode continues exactly. With LoRA each episode trains fresh adapters on the merged weights of
the one before, so the old adapters' moments are not carried; the schedule is. Under DeepSpeed the
optimiser state lives in the engine's own checkpoint format, which this carry does not read: such a
recipe with several episodes must set `episode_carry: false` (each episode restarts AdamW and schedule).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kgreasoner.training.common import last_complete_checkpoint

OPTIMIZER_FILE = "optimizer.pt"  # what transformers' Trainer writes in each checkpoint
SCHEDULES_WITHOUT_TOTAL = ("constant", "constant_with_warmup", "inverse_sqrt")
"""lr_scheduler_type values whose lr never reads the total step count (with a warm-up given as a count)."""


def check_run_schedule(
    max_steps: Sequence[int], scheduler: str, warmup_steps: float, deepspeed: object, carry: bool
) -> None:
    """Raise ValueError for a recipe whose episodes cannot share one optimiser and schedule, saying what to set.

    `max_steps` holds each episode's cap (-1: by epochs); the rest are the recipe's trainer settings."""
    if not carry or len(max_steps) < 2:
        return
    if deepspeed:
        raise ValueError(
            "episodes carry AdamW's state from one to the next, which is not done under DeepSpeed (its engine keeps "
            "the state in its own checkpoint format): set episode_carry: false (each episode restarts AdamW and "
            "its schedule), or train one episode, or drop trainer.deepspeed"
        )
    if scheduler == "reduce_lr_on_plateau":
        raise ValueError(
            "trainer.lr_scheduler_type: reduce_lr_on_plateau has no step-indexed schedule for the episodes to share: "
            "choose another lr_scheduler_type or set episode_carry: false"
        )
    reads_total = scheduler not in SCHEDULES_WITHOUT_TOTAL or 0 < warmup_steps < 1
    unknown = [k for k, steps in enumerate(max_steps[1:], 2) if steps <= 0]
    if reads_total and unknown:
        raise ValueError(
            f"episodes share one learning-rate schedule over the run's total steps, and lr_scheduler_type "
            f"{scheduler!r} with warmup_steps {warmup_steps} reads that total; episode(s) {unknown} set no max_steps, "
            "so it is not known before episode 1: give every episode after the first a max_steps, or use "
            "lr_scheduler_type constant_with_warmup with warmup_steps a count (or set episode_carry: false)"
        )


@dataclass(frozen=True)
class RunSchedule:
    """Where one episode sits in the run's schedule, and the optimiser state it starts from."""

    first_step: int
    """Optimiser steps the earlier episodes made: this episode's step 0 is the run's step `first_step`."""
    later_steps: int | None
    """Steps of the episodes after this one (their max_steps), None when one of them sets none."""
    carry_from: Path | None
    """The previous episode's `optimizer.pt` to start from; None for episode 1 and under LoRA."""

    def total(self, steps: int) -> int:
        """The run's total optimiser steps given this episode's `steps` (what is known of it without later ones)."""
        return self.first_step + steps + (self.later_steps or 0)

    def load_optimizer(self, optimizer) -> None:
        """Continue from the previous episode's AdamW state: moments, step counts and hyperparameters.

        Read onto the CPU: `load_state_dict` moves each state to its parameter's device itself, and torch.load
        cannot map onto a device string such as `cpu:0` (the trainer's device once a process group exists).
        """
        import torch

        if self.carry_from is not None:
            optimizer.load_state_dict(torch.load(self.carry_from, map_location="cpu", weights_only=True))

    def scheduler(self, optimizer, args, steps: int):
        """A LambdaLR over this episode's `steps` whose step s has the run's lr at step first_step + s."""
        from torch.optim.lr_scheduler import LambdaLR

        run_lr = run_lr_lambda(args, self.total(steps))
        first = self.first_step
        return LambdaLR(optimizer, lambda step: run_lr(first + step))


def run_lr_lambda(args, total: int) -> Callable[[int], float]:
    """TRL's schedule (`lr_scheduler_type`, warm-up, its kwargs) over `total` steps as a factor of the lr.

    Built on a throwaway optimiser: transformers' schedules exist only as schedulers bound to one."""
    import torch
    from transformers import get_scheduler

    probe = get_scheduler(
        args.lr_scheduler_type,
        optimizer=torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0),
        num_warmup_steps=args.get_warmup_steps(total),
        num_training_steps=total,
        scheduler_specific_kwargs=args.lr_scheduler_kwargs,
    )
    return probe.lr_lambdas[0]


def episode_steps(episode_dir: Path) -> int:
    """Optimiser steps a finished episode made: the global step of its last checkpoint (saved at its end)."""
    checkpoint = last_complete_checkpoint(episode_dir)
    if checkpoint is None:
        raise ValueError(
            f"{episode_dir} holds no checkpoint-N: the next episode continues the run's optimiser and schedule from "
            "its last one (restore it, or set episode_carry: false)"
        )
    return int(json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8"))["global_step"])


def plan_episode(root: Path, number: int, max_steps: Sequence[int], lora: bool) -> RunSchedule:
    """Episode `number`'s place in the run (earlier episodes finished under `root/episode-<k>`)."""
    earlier = [root / f"episode-{k}" for k in range(1, number)]
    first_step = sum(episode_steps(folder) for folder in earlier)  # each has a checkpoint, or this says so
    later = max_steps[number:]
    carry_from = None
    if earlier and not lora:
        carry_from = Path(str(last_complete_checkpoint(earlier[-1]))) / OPTIMIZER_FILE
        if not carry_from.is_file():
            raise ValueError(f"{carry_from} is missing: episode {number} continues the optimiser state saved there")
    return RunSchedule(
        first_step=first_step,
        later_steps=sum(later) if all(steps > 0 for steps in later) else None,
        carry_from=carry_from,
    )
