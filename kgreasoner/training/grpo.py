"""GRPO with tool-masked multi-turn rollouts (paper, Section 4.3 and Appendix A).

TRL's `GRPOTrainer` does the policy update; generation is ours: `rollout_func` runs the
`RolloutEngine` (search tool in the loop) on the trainer's current weights and hands back
`prompt_ids`, `completion_ids`, `logprobs` and `env_mask`, so tool-inserted tokens carry no
loss and sampled ids are never re-tokenised. The rewards are the paper's search, format and
answer components (`kgreasoner.rewards`), each logged by TRL under `rewards/<name>`.

Episodes: episode 1 trains on every training question for a stable initial policy; later
episodes train only on the hard cases (`kgreasoner.training.hard_cases`). Questions come in a
stratified order (`order`, `kgreasoner.data.sampling.balanced_order`): hop counts take turns,
so every batch of a few questions holds multi-hop questions and short chains alike.

What shows learning, beside TRL's own `reward`, `rewards/<name>/mean`, `frac_reward_zero_std`
(groups whose rollouts all got one reward: no gradient) and `entropy`: searches and correct answers
per rollout by hop count (`rollout/searches_hop<h>`, `rollout/correct_hop<h>`), and greedy Hits@1 on
a fixed dev sample every `dev_eval_steps` (`dev/hits1`, also before the first step). Rollout figures
go through TRL's own metric path (the `log_metric` its reward functions get), which averages them
over the ranks; under torchrun only the main process logs progress. Each episode is one
TRL run in `output_dir/episode-<k>` starting from the previous episode's final weights;
`--resume` continues the first unfinished episode from its last checkpoint.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerate.logging import get_logger
from transformers import TrainerCallback

from kgreasoner.config import resolve_recipe
from kgreasoner.retrieval.tool import ToolConfig
from kgreasoner.rollout.types import RolloutConfig
from kgreasoner.training.common import LoraSettings, ddp_backend, is_saved_model, last_complete_checkpoint
from kgreasoner.training.hard_cases import read_hard_ids
from kgreasoner.training.plots import STEP_LOG

EPISODE_DATA = ("all", "hard")
SCALE_REWARDS = ("group", "batch", "none")
logger = get_logger(__name__)  # main process only unless a call says otherwise


@dataclass
class Episode:
    """One pass of GRPO over a question set."""

    data: str = field(default="all", metadata={"help": "all: every training question; hard: the hard cases"})
    num_train_epochs: float = field(default=1.0, metadata={"help": "passes over this episode's questions"})
    max_steps: int = field(default=-1, metadata={"help": "cap on optimiser steps in this episode (-1: epochs)"})

    def __post_init__(self) -> None:
        if self.data not in EPISODE_DATA:
            raise ValueError(f"episode data must be one of {EPISODE_DATA}, got {self.data!r}")


@dataclass
class RewardWeights:
    """Weights of the summed reward R = w_s R_search + w_f R_format + w_a R_answer (paper: all 1)."""

    search: float = field(default=1.0, metadata={"help": "weight of min(0.5 n, 0.8)"})
    format: float = field(default=1.0, metadata={"help": "weight of the 0.5 format reward"})
    answer: float = field(default=1.0, metadata={"help": "weight of the 1.0 answer reward"})


@dataclass
class GRPORecipe:
    """Everything `train/grpo.py` needs; one YAML per model size in `configs/*/grpo.yaml`."""

    model: str = field(metadata={"help": "the SFT warm-up checkpoint (directory or hub name)"})
    dataset: str = field(metadata={"help": "dataset folder (kb.tsv + questions.jsonl) or benchmark name (PQ-2H, ...)"})
    output_dir: str = field(metadata={"help": "episodes, checkpoints, logs and the final model"})
    kg: str | None = field(default=None, metadata={"help": "KG spec (open_kg); default: the dataset's own kb in memory"})
    split_scheme: str = field(default="grouped", metadata={"help": "random or grouped, where the dataset has no split"})
    split_seed: int = field(default=0, metadata={"help": "seed of that split"})
    tool: ToolConfig = field(default_factory=ToolConfig, metadata={"help": "the KG search tool"})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"help": "rollout limits"})
    episodes: list[Episode] = field(
        default_factory=lambda: [Episode("all"), Episode("hard")],
        metadata={"help": "episode 1 on all questions, later ones on the hard cases (paper)"},
    )
    hard_cases: str | None = field(
        default=None, metadata={"help": "hard-case ids (JSONL from kgreasoner.training.hard_cases)"}
    )
    hard_case_trajectories: str | None = field(
        default=None,
        metadata={"help": "reference trajectories to mine hard cases from with `model` when hard_cases is unset"},
    )
    hard_case_quantile: float = field(default=0.5, metadata={"help": "epsilon = this quantile of the losses"})
    max_questions: int | None = field(default=None, metadata={"help": "use only the first N training questions"})
    learning_rate: float = field(default=1e-6, metadata={"help": "paper: 1e-6"})
    beta: float = field(default=1e-5, metadata={"help": "KL coefficient (paper: 1e-5; 0 drops the reference model)"})
    epsilon: float = field(default=0.2, metadata={"help": "PPO clip range (paper: 0.2)"})
    loss_type: str = field(default="grpo", metadata={"help": "TRL loss_type: grpo, dapo, dr_grpo, bnpo, ..."})
    scale_rewards: str = field(default="group", metadata={
        "help": "TRL scale_rewards: advantages divided by the reward spread of each question's group (group), of "
                "the whole batch (batch), or not at all (none)"})
    num_generations: int = field(default=16, metadata={"help": "rollouts per question (paper: 16)"})
    temperature: float = field(default=1.0, metadata={"help": "rollout temperature (paper: 1)"})
    top_p: float = field(default=1.0, metadata={"help": "rollout nucleus mass"})
    top_k: int = field(default=0, metadata={"help": "rollout top-k (0: off)"})
    per_device_train_batch_size: int = field(default=16, metadata={"help": "completions per device and micro-batch"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per optimiser step"})
    num_iterations: int = field(default=1, metadata={"help": "policy updates per generation batch (TRL mu)"})
    max_grad_norm: float = field(default=1.0, metadata={"help": "gradient clipping"})
    lr_scheduler_type: str = field(default="constant", metadata={"help": "transformers scheduler name"})
    rewards: RewardWeights = field(default_factory=RewardWeights, metadata={"help": "reward weights"})
    search_reward: str = field(default="paper", metadata={
        "help": "search reward form (kgreasoner.rewards.SEARCH_FORMS): paper min(0.5 n, 0.8); hops (n capped at "
                "the question's hop count); correct (paid only with a right answer); correct_hops (both); path "
                "(0.8 x the share of the gold path the searches walked in order, or 0.8 once the answer is shown)"})
    order: str = field(default="stratified", metadata={
        "help": "question order: stratified (hop counts take turns for the whole epoch, scarcer ones recycled, "
                "questions shuffled within a hop count; seeded) or shuffled (TRL's seeded shuffle each epoch)"})
    dev_eval_steps: int = field(default=0, metadata={
        "help": "greedy Hits@1 on a fixed dev sample every N optimiser steps and before the first (0: off)"})
    dev_eval_questions: int = field(default=64, metadata={"help": "size of that dev sample (stratified by hops)"})
    trainer: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "further GRPOConfig fields passed to TRL as given (e.g. {shuffle_dataset: false, "
                "vllm_gpu_memory_utilization: 0.3}); a field this recipe sets itself is refused"})
    bf16: bool = field(default=False, metadata={"help": "bf16 mixed precision"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "trade compute for memory"})
    length_chunk_rows: int = field(default=4, metadata={
        "help": "the loss's forward runs over chunks of this many rows of similar length, each cut to its own "
                "tokens instead of the step's longest rollout (smaller: less padding, smaller matmuls)"})
    seed: int = field(default=0, metadata={"help": "seed of shuffling and of rollout sampling"})
    logging_steps: int = field(default=1, metadata={"help": "log every N steps"})
    save_steps: int = field(default=10, metadata={"help": "checkpoint every N steps"})
    save_total_limit: int = field(default=2, metadata={"help": "checkpoints kept per episode"})
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"], metadata={"help": "trainer loggers"})
    deepspeed: str | None = field(default=None, metadata={"help": "DeepSpeed JSON (configs/deepspeed/zero*.json)"})
    lora: LoraSettings = field(default_factory=LoraSettings, metadata={"help": "LoRA adapters (PEFT)"})
    rollout_backend: str = field(
        default="hf", metadata={"help": "hf (our batched KV-cache loop on the training weights) or vllm "
                                        "(TRL's colocated vLLM engine after its weight sync, driven from token ids)"}
    )
    vllm_mode: str = field(default="colocate", metadata={
        "help": "vllm backend: colocate (server mode, TRL's `trl vllm-serve`, is not wired to the rollout yet)"})
    vllm_server_base_url: str | None = field(default=None, metadata={"help": "vllm server mode: its base URL"})

    def __post_init__(self) -> None:
        if not self.episodes:
            raise ValueError("episodes must not be empty")
        self.episodes = [Episode(**e) if isinstance(e, dict) else e for e in self.episodes]
        if self.episodes[0].data != "all":
            raise ValueError("episode 1 must train on all questions (data: all), as in the paper")
        if self.num_generations < 2:
            raise ValueError("num_generations must be >= 2: GRPO compares rollouts of one question")
        if self.rollout_backend not in ("hf", "vllm"):
            raise ValueError(f"rollout_backend must be hf or vllm, got {self.rollout_backend!r}")
        if self.rollout_backend == "vllm" and self.vllm_mode != "colocate":
            raise ValueError(f"vllm_mode must be colocate with rollout_backend vllm, got {self.vllm_mode!r}: "
                             "the multi-turn rollout drives TRL's colocated engine; server mode is not wired yet")
        if self.split_scheme not in ("random", "grouped"):
            raise ValueError(f"split_scheme must be random or grouped, got {self.split_scheme!r}")
        from kgreasoner.rewards import SEARCH_FORMS

        if self.search_reward not in SEARCH_FORMS:
            raise ValueError(f"search_reward must be one of {SEARCH_FORMS}, got {self.search_reward!r}")
        if self.scale_rewards not in SCALE_REWARDS:
            raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {self.scale_rewards!r}")
        if self.order not in ("stratified", "shuffled"):
            raise ValueError(f"order must be stratified or shuffled, got {self.order!r}")
        if self.dev_eval_steps < 0 or self.dev_eval_questions < 1:
            raise ValueError(f"dev_eval_steps must be >= 0 and dev_eval_questions >= 1, got "
                             f"{self.dev_eval_steps} and {self.dev_eval_questions}")
        if self.length_chunk_rows < 1:
            raise ValueError(f"length_chunk_rows must be >= 1, got {self.length_chunk_rows}")
        if not isinstance(self.trainer, dict):
            raise ValueError("trainer must be a mapping of GRPOConfig field names to values")


class KGRollout:
    """TRL `rollout_func`: our engine and search tool on the trainer's current weights."""

    def __init__(self, recipe: GRPORecipe, tool, examples_by_prompt: dict[str, Any]) -> None:
        self.recipe = recipe
        self.tool = tool
        self.examples_by_prompt = examples_by_prompt
        self.rollout_seconds = 0.0

    def __call__(self, prompts: list[str], trainer) -> dict[str, list]:
        from trl.models.utils import unwrap_model_for_generation

        from kgreasoner.rollout.engine import RolloutEngine
        from kgreasoner.rollout.hf_backend import HFBackend
        from kgreasoner.rollout.types import SamplingParams

        started = time.perf_counter()
        examples = [self.examples_by_prompt[p] for p in prompts]
        sessions = [self.tool.session(e.question, list(e.topic_entities), example_id=e.id) for e in examples]
        # A different, reproducible stream per step and rank; resuming replays the same seeds.
        seed = self.recipe.seed + 1_000_003 * trainer.state.global_step + 7919 * trainer.accelerator.process_index
        sampling = SamplingParams(temperature=self.recipe.temperature, top_p=self.recipe.top_p,
                                  top_k=self.recipe.top_k, seed=seed)
        if self.recipe.rollout_backend == "vllm":
            from kgreasoner.rollout.vllm_backend import VLLMBackend

            # TRL has synced the current weights into its engine just before calling us. With tensor
            # parallelism the ranks of a TP group share one engine: the backend gathers their requests.
            generation = trainer.vllm_generation
            backend = VLLMBackend(trainer.processing_class, llm=generation.llm,
                                  tp_group=getattr(generation, "tp_group", None)
                                  if generation.tensor_parallel_size > 1 else None)
            trajectories = RolloutEngine(backend, None, self.recipe.rollout).run(prompts, sessions, sampling)
        else:
            with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as model:
                was_training = model.training
                engine = RolloutEngine(HFBackend(model, trainer.processing_class), None, self.recipe.rollout)
                trajectories = engine.run(prompts, sessions, sampling)
                model.train(was_training)
        elapsed = time.perf_counter() - started
        self.rollout_seconds += elapsed
        tool_seconds = sum(c.seconds for t in trajectories for c in t.tool_calls)
        # TRL's metric path: it averages these over the ranks when it flushes the step's reward metrics
        for name, value in self.figures(trajectories, examples, elapsed, tool_seconds).items():
            trainer._log_metric(name, value)
        return {
            "prompt_ids": [t.prompt_ids for t in trajectories],
            "completion_ids": [t.completion_ids for t in trajectories],
            "logprobs": [t.logprobs for t in trajectories],
            "env_mask": [t.env_mask for t in trajectories],
            "num_searches": [t.num_searches for t in trajectories],
            "resolved_answers": [t.resolved_answers for t in trajectories],
            "completion_text": [t.text for t in trajectories],
            "tool_spans": [[list(span) for span in t.tool_spans] for t in trajectories],
            "search_record": [t.search_record for t in trajectories],
        }

    @staticmethod
    def figures(trajectories, examples, elapsed: float, tool_seconds: float) -> dict[str, float]:
        """This rank's rollout figures of one generation batch: `rollout/*` per rollout, `time/*` in seconds."""
        from kgreasoner.data.sampling import hop_count
        from kgreasoner.protocol import check_format
        from kgreasoner.rewards import answer_reward

        n = max(len(trajectories), 1)
        correct = answer_reward([t.text for t in trajectories], answers=[e.answers for e in examples],
                                resolved_answers=[t.resolved_answers for t in trajectories],
                                tool_spans=[t.tool_spans for t in trajectories])
        by_hops: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for trajectory, example, right in zip(trajectories, examples, correct):
            by_hops[hop_count(example)].append((trajectory.num_searches, right))
        figures = {}
        for hops, pairs in sorted(by_hops.items()):
            figures[f"rollout/searches_hop{hops}"] = sum(p[0] for p in pairs) / len(pairs)
            figures[f"rollout/correct_hop{hops}"] = sum(p[1] for p in pairs) / len(pairs)
        model_tokens = sum(t.num_model_tokens for t in trajectories)
        all_tokens = sum(len(t.completion_ids) for t in trajectories)
        figures.update({
            "rollout/searches": sum(t.num_searches for t in trajectories) / n,
            "rollout/tool_calls": sum(t.num_tool_calls for t in trajectories) / n,
            "rollout/backtracks": sum(t.num_backtracks for t in trajectories) / n,
            "rollout/model_tokens": model_tokens / n,
            "rollout/tool_token_share": (all_tokens - model_tokens) / max(all_tokens, 1),
            "rollout/format_valid": sum(check_format(t.text, t.tool_spans).valid for t in trajectories) / n,
            "rollout/answered": sum(t.finish_reason == "answer" for t in trajectories) / n,
            "time/generation_s": elapsed - tool_seconds,
            "time/tool_s": tool_seconds,
        })
        return figures


class StepLog:
    """`output_dir/steps.jsonl`: one row per logged step with TRL's metrics and ours.

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
        keep = [r for r in rows if r["episode"] < self.episode
                or (r["episode"] == self.episode and r["step"] <= step and step > 0)]
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

    def __init__(self, step_log: StepLog, rollout: KGRollout) -> None:
        self.step_log = step_log
        self.rollout = rollout
        self.trainer = None  # set once the trainer exists: the metrics go into its buffer
        self.step_started = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            self.step_log.truncate_after(state.global_step)

    def on_step_begin(self, args, state, control, **kwargs):
        self.step_started = time.perf_counter()
        self.rollout.rollout_seconds = 0.0

    def on_step_end(self, args, state, control, **kwargs):
        import torch

        # TRL flushes metrics logged through its path at the next generation, a step late; the step's
        # own timings are averaged over the ranks here (every rank ends every step) and join the buffer
        # TRL logs from at this step, as its own `step_time` does.
        step_seconds = time.perf_counter() - self.step_started
        accelerator = self.trainer.accelerator
        local = torch.tensor([step_seconds, step_seconds - self.rollout.rollout_seconds], device=accelerator.device)
        step_s, training_s = accelerator.reduce(local, reduction="mean").tolist()
        self.trainer._metrics["train"]["time/step_s"].append(step_s)
        self.trainer._metrics["train"]["time/training_s"].append(training_s)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and "loss" in logs:
            # DevEval writes its own rows at the step it measured; the buffered copy arrives a step late.
            self.step_log.append(state.global_step, {k: v for k, v in logs.items() if not k.startswith("dev/")})


class DevEval(TrainerCallback):
    """Greedy Hits@1 of the current policy on a fixed dev sample, before the first step and every N steps.

    The curve RL is judged by: reward can rise while answers do not (a policy paid for searching
    learns to search). Rows go to the step log (`dev/hits1`) and through `trainer.log` to `report_to`.
    Runs on the main process only; the others wait at the next collective. The figures join the
    trainer's metric buffer, so the next logged step carries them to `report_to` as well.
    """

    def __init__(self, recipe: GRPORecipe, examples, tool, step_log: StepLog) -> None:
        self.recipe = recipe
        self.examples = examples
        self.tool = tool
        self.step_log = step_log
        self.trainer = None

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self._evaluate(state)

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step % self.recipe.dev_eval_steps == 0:
            self._evaluate(state)

    def _evaluate(self, state) -> None:
        if not state.is_world_process_zero or not self.examples:
            return
        from kgreasoner.data.sampling import hop_count
        from kgreasoner.rewards import answer_reward
        from kgreasoner.rollout.engine import RolloutEngine
        from kgreasoner.rollout.hf_backend import HFBackend
        from kgreasoner.rollout.types import SamplingParams

        model = self.trainer.accelerator.unwrap_model(self.trainer.model)
        was_training = model.training
        model.eval()
        sessions = [self.tool.session(e.question, list(e.topic_entities), example_id=e.id) for e in self.examples]
        engine = RolloutEngine(HFBackend(model, self.trainer.processing_class), None, self.recipe.rollout)
        trajectories = engine.run(list(self.examples), sessions, SamplingParams(temperature=0.0))
        model.train(was_training)
        right = answer_reward([t.text for t in trajectories], answers=[e.answers for e in self.examples],
                              resolved_answers=[t.resolved_answers for t in trajectories],
                              tool_spans=[t.tool_spans for t in trajectories])
        logs = {"dev/hits1": sum(right) / len(right),
                "dev/searches": sum(t.num_searches for t in trajectories) / len(trajectories)}
        for hops in sorted({hop_count(e) for e in self.examples}):
            picked = [r for r, e in zip(right, self.examples) if hop_count(e) == hops]
            logs[f"dev/hits1_hop{hops}"] = sum(picked) / len(picked)
        self.step_log.append(state.global_step, logs)
        for name, value in logs.items():
            self.trainer._metrics["train"][name].append(value)


def length_chunks(attention_mask, rows_per_chunk: int):
    """Rows grouped by length, each group with the span of columns that holds its real tokens.

    `attention_mask` is TRL's (rows, prompt + completion) mask: prompts padded on the left,
    completions on the right. Rows are sorted by where their real tokens end and cut into groups of
    `rows_per_chunk`; each group comes with `(rows, first, end)`: the row indices (a tensor) and the
    columns `[first, end)` from its earliest real token to its latest. Every real token of every
    row lies in its group's span, so scoring the span loses nothing. A row with no real token at
    all adds nothing to its group's span.
    """
    import torch

    if rows_per_chunk < 1:
        raise ValueError(f"rows_per_chunk must be >= 1, got {rows_per_chunk}")
    width = attention_mask.size(1)
    real = attention_mask.bool()
    columns = torch.arange(width, device=attention_mask.device).expand_as(attention_mask)
    ends = torch.where(real, columns + 1, 0).amax(dim=1)
    starts = torch.where(real, columns, width).amin(dim=1)
    order = torch.argsort(ends, stable=True)
    chunks = []
    for offset in range(0, order.numel(), rows_per_chunk):
        rows = order[offset:offset + rows_per_chunk]
        end = int(ends[rows].max())
        chunks.append((rows, min(int(starts[rows].min()), end), end))
    return chunks


def _scoring_trainer_class():
    """TRL's GRPOTrainer, projecting through the vocabulary only where the loss reads.

    The loss reads the log-probabilities of model-written completion tokens (completion mask times
    env_mask). TRL's fused LM head scores only labelled positions on GPUs, but on other devices it
    scores every position, prompt and tool blocks included: with a tiny model's vocabulary
    projection twice the size of its body, and tool blocks 80% of a completion, most of a CPU step
    went to logits the loss multiplies by zero. Here those positions get label -100 and the fused
    head runs on the labelled rows only, on every device. Log-probabilities and gradients at the
    positions the loss reads are unchanged (tested); the others are 0.

    The batch is also scored in chunks of rows of similar length (`length_chunks`), each cut to its
    own span of real tokens: TRL pads every sequence to the longest rollout of the step, and one
    six-turn rollout among two-turn ones made most of the forward and backward run over padding.
    Cutting the shared left padding shifts every position of a row by the same amount, which
    rotary position embeddings leave unchanged (attention reads only position differences).
    """
    from unittest import mock

    import torch
    import trl.trainer.utils as trl_utils
    from trl import GRPOTrainer

    class ScoringGRPOTrainer(GRPOTrainer):
        _scored = None
        length_chunk_rows = 4

        def _compute_loss(self, model, inputs):
            mask = inputs["completion_mask"]
            self._scored = mask if inputs.get("tool_mask") is None else mask * inputs["tool_mask"]
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self._scored = None

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                               **multimodal):
            if self._scored is None or compute_aux_loss or any(v is not None for v in multimodal.values()):
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                    compute_aux_loss, **multimodal)
            prompt_width = input_ids.size(1) - logits_to_keep
            logps = torch.zeros(input_ids.size(0), logits_to_keep, device=input_ids.device)
            entropies = torch.zeros_like(logps) if compute_entropy else None
            for rows, first, end in length_chunks(attention_mask, batch_size or self.length_chunk_rows):
                kept = end - prompt_width  # completion columns inside the chunk's span
                if kept <= 0:
                    continue
                first = min(first, prompt_width)
                ids, attention = input_ids[rows, first:end], attention_mask[rows, first:end]
                columns = torch.arange(kept, device=logps.device)[None, :]
                labels = ids.masked_fill(attention == 0, -100)
                labels[:, :-kept] = -100
                labels[:, -kept:] = labels[:, -kept:].masked_fill(self._scored[rows, :kept] == 0, -100)
                with self.accelerator.autocast(), mock.patch.object(trl_utils, "_use_triton", lambda device: True):
                    outputs = model(input_ids=ids, attention_mask=attention, labels=labels, fused_lm_head=True)
                # index_put keeps the autograd graph of every chunk in the one tensor the loss reads
                logps = logps.index_put((rows[:, None], columns), outputs.log_probs[:, -kept:].float())
                if compute_entropy:
                    entropies = entropies.index_put((rows[:, None], columns), outputs.entropy[:, -kept:].float())
            return logps, entropies, None

    return ScoringGRPOTrainer


def grpo_config(recipe: GRPORecipe, output_dir: Path, episode: Episode):
    from trl import GRPOConfig

    import torch

    owned = dict(
        output_dir=str(output_dir),
        learning_rate=recipe.learning_rate,
        beta=recipe.beta,
        epsilon=recipe.epsilon,
        loss_type=recipe.loss_type,
        scale_rewards=recipe.scale_rewards,
        num_generations=recipe.num_generations,
        temperature=recipe.temperature,
        top_p=recipe.top_p,
        per_device_train_batch_size=recipe.per_device_train_batch_size,
        gradient_accumulation_steps=recipe.gradient_accumulation_steps,
        num_iterations=recipe.num_iterations,
        max_grad_norm=recipe.max_grad_norm,
        lr_scheduler_type=recipe.lr_scheduler_type,
        num_train_epochs=episode.num_train_epochs,
        max_steps=episode.max_steps,
        reward_weights=[recipe.rewards.search, recipe.rewards.format, recipe.rewards.answer],
        bf16=recipe.bf16,
        gradient_checkpointing=recipe.gradient_checkpointing,
        seed=recipe.seed,
        data_seed=recipe.seed,
        logging_steps=recipe.logging_steps,
        save_strategy="steps",
        save_steps=recipe.save_steps,
        save_total_limit=recipe.save_total_limit,
        report_to=recipe.report_to,
        deepspeed=resolve_recipe(recipe.deepspeed),
        ddp_backend=ddp_backend(),
        use_cpu=not torch.cuda.is_available(),
        use_vllm=recipe.rollout_backend == "vllm",
        vllm_mode=recipe.vllm_mode,
        vllm_server_base_url=recipe.vllm_server_base_url,
        log_completions=False,
        mask_truncated_completions=False,
        model_init_kwargs={"dtype": "bfloat16" if recipe.bf16 else "float32"},
        shuffle_dataset=recipe.order == "shuffled",
    )
    clash = sorted(set(recipe.trainer) & set(owned))
    if clash:
        raise ValueError(f"trainer: {', '.join(clash)} set by the recipe's own fields; set them there")
    try:
        return GRPOConfig(**owned, **recipe.trainer)
    except TypeError as err:
        raise ValueError(f"trainer: {err} (fields: trl.GRPOConfig)") from err


def _hard_ids(recipe: GRPORecipe) -> set[str]:
    if recipe.hard_cases:
        return read_hard_ids(recipe.hard_cases)
    if not recipe.hard_case_trajectories:
        raise ValueError("an episode trains on hard cases: set hard_cases or hard_case_trajectories")
    from kgreasoner.training.hard_cases import HardCaseConfig, mine_hard_cases

    output = Path(recipe.output_dir) / "hard_cases.jsonl"
    # Every rank sees the same answer: the file is written only after all ranks have scored.
    if not output.exists():
        mine_hard_cases(HardCaseConfig(model=recipe.model, trajectories=recipe.hard_case_trajectories,
                                       output=str(output), quantile=recipe.hard_case_quantile))
    return read_hard_ids(output)


def _open_kg(recipe: GRPORecipe, dataset):
    if recipe.kg:
        from kgreasoner.kg.open import open_kg

        return open_kg(recipe.kg)
    from kgreasoner.data import open_dataset_kg

    return open_dataset_kg(dataset)


def _episode_dataset(examples, tokenizer, order: str, seed: int, chains=None):
    """The episode's rows in training order (TRL keeps it unless the order is `shuffled`); with
    `chains` (`GoldChains`) each row carries its question's gold chains for the `path` search reward."""
    from datasets import Dataset

    from kgreasoner.data.sampling import balanced_order, hop_count
    from kgreasoner.protocol import build_prompt

    if order == "stratified":
        examples = balanced_order(examples, seed)
    rows, by_prompt = [], {}
    for example in examples:
        prompt = build_prompt(example.question, list(example.topic_entities), tokenizer)
        by_prompt[prompt] = example
        forms = [form for answer in example.answers for form in answer.surface_forms()]
        rows.append({"prompt": prompt, "answers": forms, "id": example.id, "hops": hop_count(example)})
        if chains is not None:
            rows[-1]["gold_chains"] = chains(example)
    return Dataset.from_list(rows), by_prompt


def build_trainer(recipe: GRPORecipe, number: int, episode: Episode, examples, model_path: str, tool,
                  dev_examples=()):
    """The TRL trainer of one episode, our rollout as its `rollout_func`, our metrics as callbacks."""
    from transformers import AutoTokenizer

    from kgreasoner.data.gold_chains import GoldChains
    from kgreasoner.rewards import reward_functions

    root = Path(recipe.output_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    chains = GoldChains(tool.kg) if recipe.search_reward == "path" else None
    data, by_prompt = _episode_dataset(examples, tokenizer, recipe.order, recipe.seed, chains)
    rollout = KGRollout(recipe, tool, by_prompt)
    step_log = StepLog(root / STEP_LOG, number)
    metrics = RolloutMetrics(step_log, rollout)
    callbacks = [metrics]
    if recipe.dev_eval_steps and dev_examples:
        callbacks.append(DevEval(recipe, dev_examples, tool, step_log))
    trainer = _scoring_trainer_class()(
        model=model_path,
        reward_funcs=reward_functions(search_form=recipe.search_reward),
        args=grpo_config(recipe, root / f"episode-{number}", episode),
        train_dataset=data,
        processing_class=tokenizer,
        peft_config=recipe.lora.peft_config(),
        rollout_func=rollout,
        callbacks=callbacks,
    )
    for callback in callbacks:
        callback.trainer = trainer
    trainer.length_chunk_rows = recipe.length_chunk_rows
    return trainer


def train_grpo(recipe: GRPORecipe, resume: bool = False) -> Path:
    """Run every episode in turn; returns the final model directory of the last one."""

    from kgreasoner.data import load_dataset
    from kgreasoner.data.entity_names import with_kg_names
    from kgreasoner.retrieval.tool import KGSearchTool

    dataset = load_dataset(recipe.dataset, scheme=recipe.split_scheme, seed=recipe.split_seed)
    train_examples = dataset.split("train")[: recipe.max_questions]
    if not train_examples:
        raise ValueError(f"dataset {recipe.dataset!r} has no training questions")
    tool = KGSearchTool(_open_kg(recipe, dataset), recipe.tool)
    # Topic entities the data names by id only (CWQ's Freebase mids) get the KG's names, which the prompt shows.
    train_examples = with_kg_names(train_examples, tool.kg)
    dev_examples = []
    if recipe.dev_eval_steps:
        from kgreasoner.data.sampling import stratified_order

        dev_examples = stratified_order(dataset.split("dev"), recipe.seed)[: recipe.dev_eval_questions]
        dev_examples = with_kg_names(dev_examples, tool.kg)
    root = Path(recipe.output_dir)
    root.mkdir(parents=True, exist_ok=True)
    model_path = recipe.model
    for number, episode in enumerate(recipe.episodes, 1):
        episode_dir = root / f"episode-{number}"
        final = episode_dir / "final"
        if is_saved_model(final):
            model_path = str(final)
            logger.info("episode %d/%d already done: %s", number, len(recipe.episodes), final)
            continue
        examples = train_examples
        if episode.data == "hard":
            hard = _hard_ids(recipe)
            examples = [e for e in train_examples if e.id in hard]
            if not examples:
                raise ValueError(f"episode {number}: none of the {len(hard)} hard-case ids is a training question")
        trainer = build_trainer(recipe, number, episode, examples, model_path, tool, dev_examples)
        checkpoint = last_complete_checkpoint(episode_dir) if resume else None
        logger.info("episode %d/%d: %d %s questions from %s%s", number, len(recipe.episodes), len(examples),
                    episode.data, model_path, f", resuming {checkpoint}" if checkpoint else "")
        trainer.train(resume_from_checkpoint=checkpoint)
        trainer.save_model(str(final))
        if trainer.is_world_process_zero():
            trainer.processing_class.save_pretrained(str(final))
            trainer.model.generation_config.save_pretrained(str(final))
        trainer.accelerator.wait_for_everyone()
        model_path = str(final)
    return Path(model_path)
