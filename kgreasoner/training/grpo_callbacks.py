"""The GRPO run's callbacks: the step log (`StepLog`, `run_dir/steps.jsonl`), each step's timings
(`RolloutMetrics`) and the dev curve (`DevEval`): greedy Hits@1 on a fixed dev sample every `dev_eval.steps`
(`dev/hits1`, also before the first step). Under torchrun only the main process writes the step log.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from kgreasoner.training.grpo_rollout import greedy_verdicts

if TYPE_CHECKING:
    from kgreasoner.training.grpo_rollout import KGRollout, PolicyRollouts


class StepLog:
    """`run_dir/steps.jsonl`: one row per logged step with TRL's metrics and ours.

    On resume the rows after the checkpoint's step are dropped first, so a killed-and-resumed
    run has each step exactly once.
    """

    def __init__(self, path: Path, episode: int) -> None:
        self.path = path
        self.episode = episode

    def truncate_after(self, step: int) -> None:
        if not self.path.exists():
            return
        rows = [json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line.strip()]
        # A fresh start (step 0) writes its step-0 rows (the dev evaluation before training) anew.
        keep = [
            r
            for r in rows
            if r["episode"] < self.episode or (r["episode"] == self.episode and r["step"] <= step and step > 0)
        ]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in keep), encoding="utf-8")

    def append(self, step: int, logs: dict[str, Any]) -> None:
        row = {"episode": self.episode, "step": step, **{k: v for k, v in logs.items() if _is_number(v)}}
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps(row) + "\n")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class RolloutMetrics(TrainerCallback):
    """Times each step (`time/step_s`, `time/training_s`: the step less its rollouts) and writes the
    per-step JSONL (main process)."""

    def __init__(self, trainer, step_log: StepLog, rollout: KGRollout) -> None:
        self.trainer = trainer  # the metrics go into its buffer
        self.step_log = step_log
        self.rollout = rollout
        self.step_started = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.step_log.truncate_after(state.global_step)

    def on_step_begin(self, args, state, control, **kwargs):
        self.step_started = time.perf_counter()
        self.rollout.rollout_seconds = 0.0

    def on_step_end(self, args, state, control, **kwargs):
        import torch

        from kgreasoner.training.trl_internals import add_metric

        # TRL flushes metrics logged through its path at the next generation, a step late; the step's
        # own timings are averaged over the ranks here (every rank ends every step) and join the buffer
        # TRL logs from at this step, as its own `step_time` does.
        step_seconds = time.perf_counter() - self.step_started
        accelerator = self.trainer.accelerator
        local = torch.tensor([step_seconds, step_seconds - self.rollout.rollout_seconds], device=accelerator.device)
        step_s, training_s = accelerator.reduce(local, reduction="mean").tolist()
        add_metric(self.trainer, "time/step_s", step_s)
        add_metric(self.trainer, "time/training_s", training_s)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            # DevEval writes its own rows at the step it measured; the buffered copy arrives a step late.
            self.step_log.append(state.global_step, {k: v for k, v in logs.items() if not k.startswith("dev/")})


class DevEval(TrainerCallback):
    """Greedy Hits@1 of the current policy on a fixed dev sample (`examples`), before the first step, every
    `every` steps and at every save step (that row carries `"checkpoint": 1`: a candidate of
    `checkpoint_choice`).

    The curve RL is judged by: reward can rise while answers do not (a policy paid for searching
    learns to search). Rows go to the step log (`dev/hits1`) and through `trainer.log` to `report_to`.
    Every rank rolls out its share of the sample greedily through the run's own `rollouts`, as the
    training rollouts do, in calls of at most `batch_size` rows (`grpo_rollout.greedy_verdicts`). The
    verdicts are gathered, and every rank computes the same figures; they join the trainer's metric
    buffer, so the next logged step carries them to `report_to` as well, and the main process writes the
    step log.
    """

    def __init__(self, trainer, rollouts: PolicyRollouts, examples, every: int, batch_size: int, step_log: StepLog):
        self.trainer = trainer
        self.rollouts = rollouts
        self.examples = examples
        self.every = every
        self.batch_size = batch_size
        self.step_log = step_log
        self.latest = (-1, 0.0)  # (step, dev Hits@1) of the last evaluation

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self._evaluate(state)

    def on_step_end(self, args, state, control, **kwargs):
        # TRL's DefaultFlowCallback has run first and decided whether this step saves a checkpoint.
        if state.global_step % self.every == 0 or control.should_save:
            self._evaluate(state, saved=control.should_save)

    def _evaluate(self, state, saved: bool = False) -> None:
        if not self.examples:
            return
        from kgreasoner.records.sampling import hop_count
        from kgreasoner.training.trl_internals import add_metric

        verdicts = greedy_verdicts(self.rollouts, self.trainer, self.examples, self.batch_size)
        right = [r for r, _ in verdicts]
        logs = {"dev/hits1": sum(right) / len(right), "dev/searches": sum(n for _, n in verdicts) / len(verdicts)}
        for hops in sorted({hop_count(e) for e in self.examples}):
            picked = [r for r, e in zip(right, self.examples) if hop_count(e) == hops]
            logs[f"dev/hits1_hop{hops}"] = sum(picked) / len(picked)
        self.latest = (state.global_step, logs["dev/hits1"])
        if state.is_world_process_zero:
            self.step_log.append(state.global_step, {**logs, "checkpoint": 1} if saved else logs)
        for name, value in logs.items():
            add_metric(self.trainer, name, value)
