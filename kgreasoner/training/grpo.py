"""GRPO with tool-masked multi-turn rollouts (paper, Section 4.3 and Appendix A).

TRL's `GRPOTrainer` does the policy update; generation is ours: `rollout_func` runs the
`RolloutEngine` (search tool in the loop) on the trainer's current weights and hands back
`prompt_ids`, `completion_ids`, `logprobs` and `env_mask`, so tool-inserted tokens carry no
loss and sampled ids are never re-tokenised. The rewards are the paper's search, format and
answer components (`kgreasoner.rewards`), each logged by TRL under `rewards/<name>`.

Episodes: episode 1 trains on every training question for a stable initial policy; later
episodes train on the hard cases (`data: hard`, the paper's episode, its questions mined from the policy:
those episode 1's groups got partly or wholly wrong, with a replay share of the rest in every batch;
`kgreasoner.training.hard_cases`) or on
the frontier (`data: frontier`: the questions episode 1's groups answered sometimes but not always,
plus a replay share of the rest; `kgreasoner.training.frontier`). Questions come in a
stratified order (`order`, `kgreasoner.records.sampling.balanced_order`): hop counts take turns,
so every batch of a few questions holds multi-hop questions and short chains alike.

Guided groups (`guidance: gold`, `kgreasoner.training.guidance`): a group whose rollouts hold no right
answer trains on its question's gold warm-up trajectory in place of its last rollout, an off-policy row
with exact ids and masks; the groups are planned whole over every rank's rows. With `guidance: gold_prefix`
that row is rolled out again from the gold trajectory's first h - 1 search turns (no loss on them). A guided
row trains with the fixed advantage `gold_advantage` when it answers right (0 when not), and stays out of its
group's mean and std (`trl_internals.GuidedRowAdvantages`).

What shows learning, beside TRL's own `reward`, `rewards/<name>/mean` (the policy's own rows: guided rows are
logged apart, `guidance/gold_rows` and `guidance/gold_<name>`), `frac_reward_zero_std`
(groups whose rollouts all got one reward: no gradient) and `entropy`: searches and correct answers
per rollout by hop count (`rollout/searches_hop<h>`, `rollout/correct_hop<h>`), the share of groups whose
answers all got one reward and of groups guided, by hop count (`rollout/answer_tied_hop<h>`,
`rollout/guided_hop<h>`), the share of rows rolled out after a gold prefix that answered right
(`rollout/prefix_correct`), and greedy Hits@1 on a fixed dev sample every `dev_eval_steps` (`dev/hits1`,
also before the first step). Rollout figures go through TRL's own metric path (the `log_metric` its
reward functions get), which averages them over the ranks; under torchrun only the main process logs
progress. Each episode is one TRL run in `run_dir/episode-<k>` starting from the previous episode's final weights;
`--resume` continues the first unfinished episode from its last checkpoint. The episodes share one AdamW
state and one learning-rate schedule (`episode_carry`, `kgreasoner.training.episode_schedule`). With
`choose_final: best_dev` the last episode's `final` ends up holding the warm-up or the save of the whole
run with the best Hits@1 on the whole dev split, no hop count more than one standard error below the
warm-up's (`kgreasoner.training.checkpoint_choice`, `run_dir/chosen.json`).

With `rollout_backend: vllm` the step log also carries the shares of model tokens and of rollouts that
TRL's importance-sampling correction dropped or capped (`importance_sampling`: `rollout/is_dropped`,
`rollout/is_dropped_rows`, `rollout/is_capped`).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from accelerate import PartialState
from accelerate.logging import get_logger
from transformers import PreTrainedTokenizerBase, TrainerCallback

from kgreasoner.retrieval.tool import ToolConfig
from kgreasoner.rollout.types import RolloutConfig
from kgreasoner.training.checkpoint_choice import CHOSEN, BestKeeper, apply_choice
from kgreasoner.training.common import (
    POLICY_DTYPE_HELP,
    LoraSettings,
    TrainerFields,
    TrainerPassthrough,
    ddp_backend,
    generation_context,
    is_saved_model,
    last_complete_checkpoint,
    save_final,
    start_process_group,
    trainer_help,
)
from kgreasoner.training.episode_schedule import plan_episode
from kgreasoner.training.frontier import GROUPS_FILE, GroupLog, frontier_examples
from kgreasoner.training.hard_cases import hard_examples, replay_order, replay_slots
from kgreasoner.training.plots import STEP_LOG

if TYPE_CHECKING:
    from transformers import Trainer

EPISODE_DATA = ("all", "hard", "frontier")
UNSUPPORTED_TRAINER = {
    "vllm_enable_sleep_mode": (
        False,
        "the multi-turn rollout calls the engine's generate itself, and a sleeping "
        "engine's KV cache is never woken for it; remove it and lower "
        "vllm_gpu_memory_utilization if memory is short",
    ),
    "vllm_mode": ("colocate", "the multi-turn rollout drives TRL's colocated engine; remove vllm_mode"),
    "ds3_gather_for_generation": (
        True,
        "the hf rollouts and the dev evaluation decode with kgreasoner's own loop, which runs a different "
        "number of forwards on each rank and so needs the whole model gathered under ZeRO-3; remove it "
        "(a model too large to gather generates with rollout_backend: vllm)",
    ),
}
"""GRPOConfig fields a recipe's `trainer:` may not change from their value here, and what to do instead."""
SCALE_REWARDS = ("group", "batch", "none")
WARMUP_MINING = (
    "hard cases are mined from the policy's own groups in episode 1, not from the warm-up model: set "
    "hard_threshold (a question is hard below this success rate) and hard_replay (the share of every batch "
    "from the other questions)"
)
REMOVED_KEYS = {
    "hard_cases": f"{WARMUP_MINING}; the mined set is saved in episode-<k>/hard_cases.jsonl",
    "hard_case_trajectories": f"{WARMUP_MINING}; guided groups take their gold rows from guidance_trajectories",
    "hard_case_quantile": WARMUP_MINING,
}
"""Recipe keys that are gone, and what to set instead."""
logger = get_logger(__name__)  # main process only unless a call says otherwise


@dataclass
class Episode:
    """One pass of GRPO over a question set."""

    data: str = field(
        default="all",
        metadata={
            "help": "all: every training question; hard: the hard cases, the questions episode 1's groups got "
            "partly or wholly wrong (hard_threshold); frontier: the questions with some but not all rollouts right "
            "in episode 1, plus a replay share of the rest (frontier_replay)"
        },
    )
    num_train_epochs: float = field(default=1.0, metadata={"help": "passes over this episode's questions"})
    max_steps: int = field(default=-1, metadata={"help": "cap on optimiser steps in this episode (-1: epochs)"})

    def __post_init__(self) -> None:
        if self.data not in EPISODE_DATA:
            raise ValueError(f"episode data must be one of {EPISODE_DATA}, got {self.data!r}")


@dataclass
class RewardWeights:
    """Weights of the summed reward R = w_s R_search + w_f R_format + w_a R_answer (paper: all 1)."""

    search: float = field(
        default=1.0, metadata={"help": "weight of the search reward (its form: the recipe's search_reward)"}
    )
    format: float = field(default=1.0, metadata={"help": "weight of the 0.5 format reward"})
    answer: float = field(default=1.0, metadata={"help": "weight of the 1.0 answer reward"})


GRPO_TRAINER = TrainerFields(
    config="GRPOConfig",
    defaults={
        "beta": 1e-5,  # the paper's KL coefficient; 0 drops the reference model
        "loss_type": "grpo",
        "num_generations": 16,  # the paper's rollouts per question
        "per_device_train_batch_size": 16,
        "lr_scheduler_type": "constant",
        "bf16": False,  # on where the recipe says so: CPU runs stay in float32
        "activation_checkpointing": False,
        "seed": 0,  # also seeds the question order and the rollouts' sampling
        "logging_steps": 1,
        "save_steps": 10,
        "save_total_limit": 2,
        "report_to": ["tensorboard"],
    },
    derived={
        "output_dir": "run_dir (each episode trains in run_dir/episode-<k>)",
        "num_train_epochs": "episodes (each episode's num_train_epochs)",
        "max_steps": "episodes (each episode's max_steps)",
        "reward_weights": "rewards",
        "shuffle_dataset": "order",
        "use_vllm": "rollout_backend",
        "vllm_max_model_length": "the rollout's budget (max_prompt_tokens and rollout)",
        "max_completion_length": "the rollout's budget (rollout)",
        "model_init_kwargs": "policy_dtype (the dtype the policy loads in)",
        "vllm_importance_sampling_mode": "importance_sampling",
        "save_strategy": "trainer.save_steps (checkpoints every save_steps steps, which the final choice reads)",
        "ddp_backend": "the launch (nccl with GPUs, gloo without, none in one process)",
        "use_cpu": "the machine (CPU where there is no GPU)",
    },
)
"""TRL's GRPOConfig as a GRPO recipe's `trainer:` mapping reaches it."""


@dataclass
class GRPORecipe(TrainerPassthrough):
    """Everything `train/grpo.py` needs; one YAML per model size in `configs/*/grpo.yaml`. TRL's own settings
    (learning rate, beta, group size, sampling, batch sizes, ...) go under `trainer:` (`GRPO_TRAINER`); the
    rollouts sample with its temperature, top_p, top_k and seed."""

    TRAINER: ClassVar[TrainerFields] = GRPO_TRAINER

    @classmethod
    def misplaced_key(cls, key: str) -> str | None:
        """`kgreasoner.config.from_dict`'s hint for a key the recipe does not have: a removed one names its
        successors."""
        if key in REMOVED_KEYS:
            return f"{key} is no longer a setting: {REMOVED_KEYS[key]}"
        return super().misplaced_key(key)

    model: str = field(metadata={"help": "the SFT warm-up checkpoint (directory or hub name)"})
    dataset: str = field(metadata={"help": "dataset folder (kb.tsv + questions.jsonl) or benchmark name (PQ-2H, ...)"})
    run_dir: str = field(
        metadata={
            "help": "the run's folder: its episodes (TRL's output_dir each, a hard episode's mined set in it), logs "
            "and the final model"
        }
    )
    kg: str | None = field(
        default=None, metadata={"help": "KG spec (open_kg); default: the dataset's own kb in memory"}
    )
    split_scheme: str = field(
        default="grouped", metadata={"help": "random or grouped, where the dataset has no split"}
    )
    split_seed: int = field(default=0, metadata={"help": "seed of that split"})
    tool: ToolConfig = field(default_factory=ToolConfig, metadata={"help": "the KG search tool"})
    rollout: RolloutConfig = field(default_factory=RolloutConfig, metadata={"help": "rollout limits"})
    episodes: list[Episode] = field(
        default_factory=lambda: [Episode("all"), Episode("hard")],
        metadata={"help": "episode 1 on all questions, later ones on the hard cases (paper)"},
    )
    episode_carry: bool = field(
        default=True,
        metadata={
            "help": "episodes share one optimiser and one learning-rate schedule: episode k > 1 starts from episode "
            "k - 1's AdamW state, and trainer.lr_scheduler_type (its warm-up first) runs over the steps of all "
            "episodes (kgreasoner.training.episode_schedule); false: each episode restarts both (needed under "
            "DeepSpeed)"
        },
    )
    hard_threshold: float = field(
        default=1.0,
        metadata={
            "help": "a hard episode's questions: those whose last group in episode 1 had a success rate (right "
            "answers of the policy's own rollouts, gold rows not counted) below this, every hop count eligible; "
            "1.0: any wrong rollout, 0.5: right in fewer than half. Questions episode 1 never sampled are not hard "
            "(kgreasoner.training.hard_cases); the set is saved in the episode's folder and a resumed run reuses it"
        },
    )
    hard_replay: float = field(
        default=0.25,
        metadata={
            "help": "share of every batch (generation batch) of a hard episode drawn from the other training "
            "questions, hop counts in turn (seeded), so what the policy already answers, 1-hop questions "
            "included, stays in training; to the nearest question, at least one while above 0 (0: hard cases only)"
        },
    )
    guidance: str = field(
        default="none",
        metadata={
            "help": "what a group with no right answer gets (kgreasoner.training.guidance): none; gold (its last row "
            "becomes the question's warm-up trajectory, an off-policy row; at most one a group); gold_prefix "
            "(its last row is rolled out again after the warm-up trajectory's first h-1 search turns, given "
            "with no loss, so the model takes the last hop itself; 1-hop questions are left as they are)"
        },
    )
    gold_advantage: float = field(
        default=1.0,
        metadata={
            "help": "advantage of a guided row with a right answer (gold rows; a rollout after a gold prefix that "
            "answered right; one that missed gets 0), fixed rather than std-scaled: left to the group's std, one gold "
            "row beside 7 tied rows got 7/sqrt(8) ~ 2.47 whatever the reward gap. Guided rows stay out of their "
            "group's mean and std, so the policy's rows get the advantages of their own rows alone; 0 turns the gold "
            "rows' loss off"
        },
    )
    guidance_trajectories: str | None = field(
        default=None,
        metadata={
            "help": "warm-up records (JSONL, data_gen.warmup's all.jsonl) the gold rows come from. Made with the "
            "training tool's settings, so their answers resolve"
        },
    )
    frontier_replay: float = field(
        default=0.25,
        metadata={
            "help": "share of a frontier episode's questions drawn (seeded) from those episode 1 got all right or all "
            "wrong, so what the policy already answers is kept; guided groups teach the all-wrong ones"
        },
    )
    max_questions: int | None = field(default=None, metadata={"help": "use only the first N training questions"})
    rewards: RewardWeights = field(default_factory=RewardWeights, metadata={"help": "reward weights"})
    search_reward: str = field(
        default="paper",
        metadata={
            "help": "search reward form (kgreasoner.rewards.SEARCH_FORMS), n the searches that returned triples, "
            "h the question's hop count: paper min(0.5 n, 0.8); hops 0.8 min(n, h) / h (each search up to the hop "
            "count earns a share; unknown h: paper's); correct (paper's, paid only with a right answer); "
            "correct_hops (hops', paid only with a right answer); path (0.8 x the share of the gold path the "
            "searches walked in order, or 0.8 once the answer is shown)"
        },
    )
    order: str = field(
        default="stratified",
        metadata={
            "help": "question order: stratified (hop counts take turns for the whole epoch, scarcer ones recycled, "
            "questions shuffled within a hop count; seeded) or shuffled (TRL's seeded shuffle each epoch; a hard "
            "episode keeps its own batches, its hard questions shuffled once)"
        },
    )
    dev_eval_steps: int = field(
        default=0,
        metadata={"help": "greedy Hits@1 on a fixed dev sample every N optimiser steps and before the first (0: off)"},
    )
    dev_eval_questions: int = field(
        default=150,
        metadata={
            "help": "size of that dev sample (stratified by hops); every saved checkpoint is evaluated on it too "
            "(the final choice, choose_final, measures the whole dev split)"
        },
    )
    dev_eval_batch_size: int = field(
        default=32,
        metadata={
            "help": "dev questions a rank rolls out in one engine call (greedy, through rollout_backend): that many "
            "rows share the KV cache at once; a rank's share of the dev sample takes ceil(share / this) calls"
        },
    )
    choose_final: str | None = field(
        default=None,
        metadata={
            "help": "what the last episode's `final` holds at the end: best_dev (among the warm-up and every save, "
            "each measured on the whole dev split, the highest Hits@1 of those with no hop count more than one "
            "standard error below the warm-up's; run_dir/chosen.json says why) or last (the last step's weights); "
            "default best_dev when dev evaluation is on, else last"
        },
    )
    length_chunk_rows: int = field(
        default=4,
        metadata={
            "help": "the loss's forward runs over chunks of this many rows of similar length, each cut to its own "
            "tokens instead of the step's longest rollout (smaller: less padding, smaller matmuls)"
        },
    )
    lora: LoraSettings = field(default_factory=LoraSettings, metadata={"help": "LoRA adapters (PEFT)"})
    policy_dtype: str = field(default="auto", metadata={"help": POLICY_DTYPE_HELP})
    importance_sampling: str = field(
        default="token_truncate",
        metadata={
            "help": "with rollout_backend: vllm, how TRL weighs each model token by exp(trainer logprob - engine "
            "logprob) to correct for the engine sampling from slightly other probabilities than the trainer's "
            "(TRL's vllm_importance_sampling_mode; bounds trainer.vllm_importance_sampling_clip_max, 3, and "
            "_clip_min, none): token_truncate (each token's ratio clipped to the bounds: no rollout is dropped "
            "and a long one is not penalised for its length), token_mask (tokens outside the bounds get weight "
            "0), sequence_truncate or sequence_mask (one ratio per rollout, the product over its tokens, "
            "clipped, or the whole rollout dropped outside the bounds). Over a multi-turn rollout of thousands "
            "of model tokens small per-token differences compound: TRL's default, sequence_mask, then drops long "
            "rollouts, the multi-hop ones, for their length. The step log shows the shares: rollout/is_dropped "
            "(model tokens given weight 0), rollout/is_dropped_rows (rollouts all of whose tokens were), "
            "rollout/is_capped (tokens whose ratio was clipped)"
        },
    )
    rollout_backend: str = field(
        default="hf",
        metadata={
            "help": "hf (our batched KV-cache loop on the training weights) or vllm "
            "(TRL's colocated vLLM engine after its weight sync, driven from token ids)"
        },
    )
    max_prompt_tokens: int = field(
        default=512,
        metadata={
            "help": "longest prompt in tokens; longer questions are left out of training (with a warning). With the "
            "rollout limits it sizes vLLM's context (vllm_max_model_length) and TRL's max_completion_length"
        },
    )
    trainer: dict[str, Any] = field(
        default_factory=dict,
        metadata=trainer_help(
            "GRPOConfig", "{learning_rate: 1.0e-6, num_generations: 16, vllm_gpu_memory_utilization: 0.3}"
        ),
    )

    def __post_init__(self) -> None:
        if not self.episodes:
            raise ValueError("episodes must not be empty")
        self.episodes = [Episode(**e) if isinstance(e, dict) else e for e in self.episodes]
        if self.episodes[0].data != "all":
            raise ValueError("episode 1 must train on all questions (data: all), as in the paper")
        self.TRAINER.check(self.trainer)
        if self.setting("num_generations") < 2:
            raise ValueError("trainer.num_generations must be >= 2: GRPO compares rollouts of one question")
        self.weights_dtype()  # refuses a dtype that cannot train
        from kgreasoner.training.trl_internals import IMPORTANCE_SAMPLING_MODES

        if self.importance_sampling not in IMPORTANCE_SAMPLING_MODES:
            raise ValueError(
                f"importance_sampling must be one of {IMPORTANCE_SAMPLING_MODES}, got {self.importance_sampling!r}"
            )
        if self.rollout_backend not in ("hf", "vllm"):
            raise ValueError(f"rollout_backend must be hf or vllm, got {self.rollout_backend!r}")
        if self.split_scheme not in ("random", "grouped"):
            raise ValueError(f"split_scheme must be random or grouped, got {self.split_scheme!r}")
        from kgreasoner.rewards import SEARCH_FORMS

        if self.search_reward not in SEARCH_FORMS:
            raise ValueError(f"search_reward must be one of {SEARCH_FORMS}, got {self.search_reward!r}")
        if self.setting("scale_rewards") not in SCALE_REWARDS:
            raise ValueError(
                f"trainer.scale_rewards must be one of {SCALE_REWARDS}, got {self.setting('scale_rewards')!r}"
            )
        from kgreasoner.training.guidance import GUIDANCE

        if self.guidance not in GUIDANCE:
            raise ValueError(f"guidance must be one of {GUIDANCE}, got {self.guidance!r}")
        if self.guidance != "none" and not self.guidance_trajectories:
            raise ValueError(
                f"guidance: {self.guidance} needs the gold trajectories: set guidance_trajectories "
                "to the warm-up records, data_gen.warmup's all.jsonl"
            )
        if not 0.0 <= self.gold_advantage < float("inf"):
            raise ValueError(f"gold_advantage must be a finite number >= 0, got {self.gold_advantage}")
        if self.order not in ("stratified", "shuffled"):
            raise ValueError(f"order must be stratified or shuffled, got {self.order!r}")
        if not 0.0 < self.hard_threshold <= 1.0:
            raise ValueError(f"hard_threshold must be in (0, 1], got {self.hard_threshold}")
        if not 0.0 <= self.hard_replay < 1.0:
            raise ValueError(f"hard_replay must be in [0, 1), got {self.hard_replay}")
        if not 0.0 <= self.frontier_replay < 1.0:
            raise ValueError(f"frontier_replay must be in [0, 1), got {self.frontier_replay}")
        if self.choose_final is None:
            self.choose_final = "best_dev" if self.dev_eval_steps else "last"
        if self.choose_final not in ("best_dev", "last"):
            raise ValueError(f"choose_final must be best_dev or last, got {self.choose_final!r}")
        if self.choose_final == "best_dev" and not self.dev_eval_steps:
            raise ValueError("choose_final: best_dev needs dev evaluation: set dev_eval_steps (or choose_final: last)")
        if self.dev_eval_steps < 0 or self.dev_eval_questions < 1:
            raise ValueError(
                f"dev_eval_steps must be >= 0 and dev_eval_questions >= 1, got "
                f"{self.dev_eval_steps} and {self.dev_eval_questions}"
            )
        if self.dev_eval_batch_size < 1:
            raise ValueError(f"dev_eval_batch_size must be >= 1, got {self.dev_eval_batch_size}")
        if self.length_chunk_rows < 1:
            raise ValueError(f"length_chunk_rows must be >= 1, got {self.length_chunk_rows}")
        if self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        from kgreasoner.training.episode_schedule import check_run_schedule

        check_run_schedule(
            [e.max_steps for e in self.episodes],
            self.setting("lr_scheduler_type"),
            self.setting("warmup_steps"),
            self.setting("deepspeed"),
            self.episode_carry,
        )
        for name, value in self.trainer.items():
            if name in UNSUPPORTED_TRAINER and value != UNSUPPORTED_TRAINER[name][0]:
                raise ValueError(f"trainer: {name}: {value!r} is not supported: {UNSUPPORTED_TRAINER[name][1]}")
        layer_keys = sorted({"every_n_layers", "offload"} & set(self.setting("activation_checkpointing_kwargs") or {}))
        if layer_keys:
            raise ValueError(
                f"trainer: activation_checkpointing_kwargs: {', '.join(layer_keys)} is not supported: after each "
                "generation TRL's generation context turns checkpointing back on with these kwargs passed to "
                "torch's checkpoint, which takes neither; leave them out"
            )


def policy_rollouts(recipe, tool, trainer, prompts, examples, sampling, prefixes=None, evaluate=False) -> list:
    """The engine's rollouts of `prompts` (strings, or the QA examples themselves) in fresh sessions on the
    trainer's current weights, through the run's rollout backend: the training rollouts and the dev
    evaluation (greedy `sampling`, `evaluate`: the hf policy in eval mode) both come here.

    Every rank calls it together, with rows or none: under ZeRO-3 the hf generation context gathers the
    weights on all ranks at once, and vLLM's tensor-parallel group turns together. With vLLM the engine
    first gets the current weights when TRL has not loaded this step's yet (it does so only before its own
    generation, so a dev evaluation after a step would read the previous step's)."""
    from kgreasoner.rollout.engine import RolloutEngine
    from kgreasoner.rollout.hf_backend import HFBackend
    from kgreasoner.training.trl_internals import sync_vllm_weights, vllm_engine

    sessions = [tool.session(e.question, list(e.topic_entities), example_id=e.id) for e in examples]
    if recipe.rollout_backend == "vllm":
        from kgreasoner.rollout.vllm_backend import VLLMBackend

        sync_vllm_weights(trainer)
        # With tensor parallelism the ranks of a TP group share one engine: the backend gathers their requests.
        llm, tp_group = vllm_engine(trainer)
        backend = VLLMBackend(trainer.processing_class, llm=llm, tp_group=tp_group)
        return RolloutEngine(backend, None, recipe.rollout).run(prompts, sessions, sampling, prefixes=prefixes)
    with generation_context(trainer) as model:
        was_training = model.training
        if evaluate:
            model.eval()
        tokenizer = trainer.processing_class
        assert isinstance(tokenizer, PreTrainedTokenizerBase), "GRPO on text: a tokenizer"
        engine = RolloutEngine(HFBackend(model, tokenizer), None, recipe.rollout)
        trajectories = engine.run(prompts, sessions, sampling, prefixes=prefixes)
        model.train(was_training)
    return trajectories


def dev_batches(count: int, rank: int, world: int, size: int) -> list[list[int]]:
    """The dev sample's positions rank `rank` of `world` rolls out (every world-th from its own), in batches of
    at most `size`. Every rank gets as many batches as the largest share needs, the last ones empty where its
    share is smaller: each batch is a collective (ZeRO-3's gather, vLLM's tensor-parallel turns)."""
    mine = list(range(rank, count, world))
    largest = -(-count // world)  # rank 0's share, ceil(count / world)
    return [mine[start : start + size] for start in range(0, largest, size)]


class KGRollout:
    """TRL `rollout_func`: our engine and search tool on the trainer's current weights."""

    def __init__(self, recipe: GRPORecipe, tool, examples_by_prompt: dict[str, Any]) -> None:
        from kgreasoner.training.guidance import GoldTrajectories

        self.recipe = recipe
        self.tool = tool
        self.examples_by_prompt = examples_by_prompt
        self.rollout_seconds = 0.0
        gold = recipe.guidance_trajectories  # set whenever guidance is (GRPORecipe checks it)
        self.gold = GoldTrajectories(gold) if recipe.guidance != "none" and gold else None
        self.group_log: GroupLog | None = None  # each group's right answers, as sampled

    def __call__(self, prompts: list[str], trainer) -> dict[str, list]:
        from kgreasoner.rewards import answer_reward
        from kgreasoner.rollout.types import SamplingParams, trl_rollout_output
        from kgreasoner.training.trl_internals import GUIDED_COLUMN, log_metric

        started = time.perf_counter()
        examples = [self.examples_by_prompt[p] for p in prompts]
        # A different, reproducible stream per step and rank; resuming replays the same seeds.
        args = trainer.args
        seed = args.seed + 1_000_003 * trainer.state.global_step + 7919 * trainer.accelerator.process_index
        sampling = SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=seed)
        trajectories = self.generate(prompts, examples, sampling, trainer)
        correct = answer_reward(
            [t.text for t in trajectories],
            answers=[e.answers for e in examples],
            resolved_answers=[t.resolved_answers for t in trajectories],
            tool_spans=[t.tool_spans for t in trajectories],
        )
        if self.group_log is not None:  # on-policy counts: before any guided row replaces a rollout
            self.group_log.record(trainer, examples, correct)
        rows, group_figures = self.guide(trajectories, examples, correct, trainer, prompts, sampling)
        elapsed = time.perf_counter() - started
        self.rollout_seconds += elapsed
        fresh = [row for row, first in zip(rows, trajectories) if row is not first and row.prefix_tokens]
        tool_seconds = sum(c.seconds for t in [*trajectories, *fresh] for c in t.tool_calls)
        # TRL's metric path: it averages these over the ranks when it flushes the step's reward metrics
        figures = self.figures(trajectories, examples, correct, elapsed, tool_seconds) | group_figures
        for name, value in figures.items():
            log_metric(trainer, name, value)
        output = trl_rollout_output(rows, trainer.processing_class.eos_token_id)
        if self.gold is not None:  # the trainer's GuidedRowAdvantages reads it
            output[GUIDED_COLUMN] = [row is not first for row, first in zip(rows, trajectories)]
        return output

    def generate(self, prompts, examples, sampling, trainer, prefixes=None) -> list:
        """The engine's rollouts of `prompts` in fresh sessions on the trainer's current weights
        (`policy_rollouts`)."""
        return policy_rollouts(self.recipe, self.tool, trainer, prompts, examples, sampling, prefixes)

    def guide(self, trajectories, examples, correct, trainer, prompts, sampling) -> tuple[list, dict[str, float]]:
        """The rows TRL trains on (each planned guided row replaced by its gold row, or by a rollout after its
        gold prefix) and the group figures, both over whole groups gathered from every rank
        (`kgreasoner.training.guidance`); with gold prefixes, `rollout/prefix_correct` is the share of those
        rollouts that answered right (over every rank's; absent in a step that guided none)."""
        import dataclasses

        from accelerate.utils import gather_object

        from kgreasoner.records.sampling import hop_count
        from kgreasoner.rewards import answer_reward
        from kgreasoner.training.guidance import RowVerdict, gathered_plan, held

        prefixed = self.recipe.guidance == "gold_prefix"
        verdicts = [
            RowVerdict(bool(right), hop_count(e), self._guidable(e, prompt) if self.gold else False)
            for right, e, prompt in zip(correct, examples, prompts)
        ]
        group_plan, offset = gathered_plan(
            verdicts, trainer.args.num_generations, self.gold is not None, trainer.accelerator.process_index
        )
        rows, figures = list(trajectories), dict(group_plan.figures)
        mine = held(group_plan.guided, offset, len(rows))
        if prefixed and group_plan.guided:  # every rank knows the plan: all generate, with rows or none
            picked = [examples[i] for i in mine]
            prefixes = [self._prefix(examples[i], prompts[i]) for i in mine]
            # a stream of its own: the first pass's seed would redraw that pass's first tokens
            again = dataclasses.replace(sampling, seed=None if sampling.seed is None else sampling.seed + 500_009)
            continued = self.generate([prompts[i] for i in mine], picked, again, trainer, prefixes)
            for i, row in zip(mine, continued):
                rows[i] = dataclasses.replace(row, index=i)
            right = (
                answer_reward(
                    [t.text for t in continued],
                    answers=[e.answers for e in picked],
                    resolved_answers=[t.resolved_answers for t in continued],
                    tool_spans=[t.tool_spans for t in continued],
                )
                if continued
                else []
            )
            everyone = gather_object(list(right))  # a collective: every rank is here
            figures["rollout/prefix_correct"] = sum(everyone) / len(everyone)
        elif not prefixed:
            for i in mine:
                assert self.gold is not None  # a guided row exists only with gold trajectories
                e = examples[i]
                session = self.tool.session(e.question, list(e.topic_entities), example_id=e.id)
                rows[i] = self.gold.row(e, rows[i].prompt_ids, trainer.processing_class, session, index=i)
        return rows, figures

    def _prefix(self, example, prompt: str) -> list[str]:
        from kgreasoner.records.sampling import hop_count

        assert self.gold is not None  # asked only with gold trajectories
        return self.gold.prefix(example.id, hop_count(example), prompt, self.recipe.rollout.max_turns)

    def _guidable(self, example, prompt: str) -> bool:
        """The question has a gold row to give (gold), or a gold prefix of at least one turn (gold_prefix)."""
        if self.recipe.guidance == "gold_prefix":
            return bool(self._prefix(example, prompt))
        return self.gold is not None and example.id in self.gold

    @staticmethod
    def figures(trajectories, examples, correct, elapsed: float, tool_seconds: float) -> dict[str, float]:
        """This rank's rollout figures of one generation batch (the policy's own rollouts, before any guided
        row): `rollout/*` per rollout, `time/*` in seconds."""
        from kgreasoner.protocol import check_format
        from kgreasoner.records.sampling import hop_count

        n = max(len(trajectories), 1)
        by_hops: dict[int, list[tuple[int, float]]] = defaultdict(list)
        for trajectory, example, right in zip(trajectories, examples, correct):
            by_hops[hop_count(example)].append((trajectory.num_searches, right))
        figures = {}
        for hops, pairs in sorted(by_hops.items()):
            figures[f"rollout/searches_hop{hops}"] = sum(p[0] for p in pairs) / len(pairs)
            figures[f"rollout/correct_hop{hops}"] = sum(p[1] for p in pairs) / len(pairs)
        model_tokens = sum(t.num_model_tokens for t in trajectories)
        all_tokens = sum(len(t.completion_ids) for t in trajectories)
        figures.update(
            {
                "rollout/searches": sum(t.num_searches for t in trajectories) / n,
                "rollout/tool_calls": sum(t.num_tool_calls for t in trajectories) / n,
                "rollout/backtracks": sum(t.num_backtracks for t in trajectories) / n,
                "rollout/model_tokens": model_tokens / n,
                "rollout/tool_token_share": (all_tokens - model_tokens) / max(all_tokens, 1),
                "rollout/format_valid": sum(check_format(t.text, t.tool_spans).valid for t in trajectories) / n,
                "rollout/answered": sum(t.finish_reason == "answer" for t in trajectories) / n,
                "time/generation_s": elapsed - tool_seconds,
                "time/tool_s": tool_seconds,
            }
        )
        return figures


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
    """Greedy Hits@1 of the current policy on a fixed dev sample, before the first step, every N steps and
    at every save step (that row carries `"checkpoint": 1`: a candidate of `checkpoint_choice`).

    The curve RL is judged by: reward can rise while answers do not (a policy paid for searching
    learns to search). Rows go to the step log (`dev/hits1`) and through `trainer.log` to `report_to`.
    Every rank rolls out its share of the sample (every world_size-th question) greedily through the
    run's own rollout backend, as the training rollouts do (`policy_rollouts`: vLLM, or the hf policy
    in TRL's generation context), in batches of `dev_eval_batch_size` rows (`dev_batches`). Every rank
    runs as many batches as the largest share needs, empty ones included: under ZeRO-3 the hf context
    gathers the weights on all ranks together, and vLLM's tensor-parallel group turns together, so a
    rank left out would hang the others. The verdicts are gathered, and
    every rank computes the same figures; they join the trainer's metric buffer, so the next logged
    step carries them to `report_to` as well, and the main process writes the step log.
    """

    def __init__(self, recipe: GRPORecipe, examples, tool, step_log: StepLog) -> None:
        self.recipe = recipe
        self.examples = examples
        self.tool = tool
        self.step_log = step_log
        self.trainer: Trainer | None = None
        self.latest = (-1, 0.0)  # (step, dev Hits@1) of the last evaluation

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step == 0:
            self._evaluate(state)

    def on_step_end(self, args, state, control, **kwargs):
        # TRL's DefaultFlowCallback has run first and decided whether this step saves a checkpoint.
        if state.global_step % self.recipe.dev_eval_steps == 0 or control.should_save:
            self._evaluate(state, saved=control.should_save)

    def _evaluate(self, state, saved: bool = False) -> None:
        if not self.examples:
            return
        from accelerate.utils import gather_object

        from kgreasoner.records.sampling import hop_count
        from kgreasoner.rewards import answer_reward
        from kgreasoner.rollout.types import SamplingParams
        from kgreasoner.training.trl_internals import add_metric

        trainer = self.trainer
        assert trainer is not None, "set by build_trainer"
        accelerator = trainer.accelerator
        size = self.recipe.dev_eval_batch_size
        greedy = SamplingParams(temperature=0.0)
        positions, trajectories = [], []
        for batch in dev_batches(len(self.examples), accelerator.process_index, accelerator.num_processes, size):
            share = [self.examples[i] for i in batch]
            trajectories += policy_rollouts(self.recipe, self.tool, trainer, share, share, greedy, evaluate=True)
            positions += batch
        share = [self.examples[i] for i in positions]
        right = (
            answer_reward(
                [t.text for t in trajectories],
                answers=[e.answers for e in share],
                resolved_answers=[t.resolved_answers for t in trajectories],
                tool_spans=[t.tool_spans for t in trajectories],
            )
            if share
            else []
        )
        verdicts = sorted(gather_object([(i, r, t.num_searches) for i, r, t in zip(positions, right, trajectories)]))
        right = [r for _, r, _ in verdicts]
        logs = {"dev/hits1": sum(right) / len(right), "dev/searches": sum(n for _, _, n in verdicts) / len(verdicts)}
        for hops in sorted({hop_count(e) for e in self.examples}):
            picked = [r for r, e in zip(right, self.examples) if hop_count(e) == hops]
            logs[f"dev/hits1_hop{hops}"] = sum(picked) / len(picked)
        self.latest = (state.global_step, logs["dev/hits1"])
        if state.is_world_process_zero:
            self.step_log.append(state.global_step, {**logs, "checkpoint": 1} if saved else logs)
        for name, value in logs.items():
            add_metric(trainer, name, value)


def grpo_config(recipe: GRPORecipe, output_dir: Path, episode: Episode):
    """TRL's GRPOConfig of one episode: the recipe's `trainer` mapping over kgreasoner's defaults (`GRPO_TRAINER`).

    The lengths come from the recipe's own budget (`rollout.types.sequence_tokens`): vLLM's context
    holds the longest prompt plus the longest completion, instead of the model's whole context
    (131,072 tokens for Llama-3.1, whose KV cache for one such sequence does not fit vLLM's share), and
    `max_completion_length` is the longest completion the rollout hands TRL (`dr_grpo` divides by it).
    """
    import torch

    from kgreasoner.rollout.types import completion_tokens, sequence_tokens

    return recipe.TRAINER.build(
        recipe.trainer,
        dict(
            output_dir=str(output_dir),
            num_train_epochs=episode.num_train_epochs,
            max_steps=episode.max_steps,
            reward_weights=[recipe.rewards.search, recipe.rewards.format, recipe.rewards.answer],
            # a hard episode lays out its own batches (hard cases and replay): TRL must keep them
            shuffle_dataset=recipe.order == "shuffled" and episode.data != "hard",
            use_vllm=recipe.rollout_backend == "vllm",
            vllm_max_model_length=sequence_tokens(recipe.rollout, recipe.max_prompt_tokens),
            max_completion_length=completion_tokens(recipe.rollout),
            model_init_kwargs={"dtype": recipe.weights_dtype()},
            vllm_importance_sampling_mode=recipe.importance_sampling,
            save_strategy="steps",
            ddp_backend=ddp_backend(),
            use_cpu=not torch.cuda.is_available(),
        ),
    )


def _open_kg(recipe: GRPORecipe, dataset):
    if recipe.kg:
        from kgreasoner.kg.open import open_kg

        return open_kg(recipe.kg)
    from kgreasoner.data import open_dataset_kg

    return open_dataset_kg(dataset)


def _episode_dataset(examples, tokenizer, order: str, seed: int, max_prompt_tokens: int, chains=None, replay=None):
    """The episode's rows in training order (TRL keeps it unless the order is `shuffled`), and the
    number of questions left out because their prompt is longer than `max_prompt_tokens`; with
    `chains` (`GoldChains`) each row carries its question's gold chains for the `path` search reward.

    With `replay`, a hard episode's (other questions, questions per generation batch, share), the rows
    come in `hard_cases.replay_order`'s batches: the hard questions in `order` (`shuffled`: shuffled once,
    seeded), a share of every batch from the other questions. Long prompts are left out first, so no
    batch loses a question."""
    import random

    from datasets import Dataset

    from kgreasoner.protocol import build_prompt
    from kgreasoner.records.sampling import balanced_order, hop_count

    by_prompt: dict[str, Any] = {}
    prompts: dict[str, str] = {}  # question id -> its prompt

    def fitting(questions) -> list:
        kept = []
        for example in questions:
            prompt = build_prompt(example.question, list(example.topic_entities), tokenizer)
            if len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) <= max_prompt_tokens:
                by_prompt[prompt], prompts[example.id] = example, prompt
                kept.append(example)
        return kept

    kept = fitting(examples)
    dropped = len(examples) - len(kept)
    if order == "stratified":
        kept = balanced_order(kept, seed)
    elif replay is not None:
        random.Random(f"{seed}|hard").shuffle(kept)
    if replay is not None:
        others, per_batch, share = replay
        rest = fitting(others)
        dropped += len(others) - len(rest)
        kept = replay_order(kept, rest, per_batch, share, seed)
    rows = []
    for example in kept:
        prompt = prompts[example.id]
        forms = [form for answer in example.answers for form in answer.surface_forms()]
        rows.append({"prompt": prompt, "answers": forms, "id": example.id, "hops": hop_count(example)})
        if chains is not None:
            rows[-1]["gold_chains"] = chains(example)
    return Dataset.from_list(rows), by_prompt, dropped


def build_trainer(
    recipe: GRPORecipe,
    number: int,
    episode: Episode,
    examples,
    model_path: str,
    tool,
    dev_examples=(),
    engine_from=None,
    dev_split=(),
    replay=(),
):
    """The TRL trainer of one episode, our rollout as its `rollout_func`, our metrics as callbacks.

    `dev_examples` is the periodic dev curve's sample; `dev_split`, the whole dev split, measures the
    candidates of `choose_final: best_dev`. A hard episode's `examples` are its hard cases and `replay`
    the other training questions, a `hard_replay` share of every generation batch.

    With `engine_from` (the previous episode's trainer) a vLLM rollout drives that trainer's
    colocated engine instead of starting a second one in the process.
    """
    from transformers import AutoTokenizer

    from kgreasoner.data.gold_chains import GoldChains
    from kgreasoner.models import check_weights
    from kgreasoner.rewards import reward_functions
    from kgreasoner.training.trl_internals import (
        colocated_engine_args,
        guided_trainer_class,
        reusing_vllm_engine,
        scoring_trainer_class,
        send_unfused_experts,
    )

    root = Path(recipe.run_dir)
    args = grpo_config(recipe, root / f"episode-{number}", episode)  # sets up the process state the logger reads
    check_weights(model_path)  # TRL loads the model by its path
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    chains = GoldChains(tool.kg) if recipe.search_reward == "path" else None
    per_batch = args.generation_batch_size // args.num_generations
    mix = None
    if episode.data == "hard":
        mix = (list(replay), per_batch, recipe.hard_replay)
        logger.info(
            "episode %d: %d of every %d questions a batch from the %d other training questions",
            number,
            replay_slots(per_batch, recipe.hard_replay) if replay else 0,
            per_batch,
            len(replay),
        )
    data, by_prompt, dropped = _episode_dataset(
        examples, tokenizer, recipe.order, args.seed, recipe.max_prompt_tokens, chains, mix
    )
    if not len(data):
        raise ValueError(f"episode {number}: every prompt is longer than max_prompt_tokens={recipe.max_prompt_tokens}")
    if len(data) < args.generation_batch_size // args.num_generations:
        raise ValueError(
            f"episode {number}: {len(data)} questions, fewer than the "
            f"{args.generation_batch_size // args.num_generations} one generation batch takes "
            f"(per_device_train_batch_size x steps_per_generation x processes / num_generations): "
            "TRL would train no step; lower per_device_train_batch_size or give the episode more"
        )
    if dropped:
        logger.warning(
            "episode %d: left out %d questions whose prompt is longer than max_prompt_tokens=%d",
            number,
            dropped,
            recipe.max_prompt_tokens,
        )
    rollout = KGRollout(recipe, tool, by_prompt)
    rollout.group_log = group_log = GroupLog(root / f"episode-{number}" / GROUPS_FILE, args.num_generations)
    step_log = StepLog(root / STEP_LOG, number)
    metrics = RolloutMetrics(step_log, rollout)
    callbacks: list[TrainerCallback] = [metrics, group_log]
    dev_eval = None
    if recipe.dev_eval_steps and dev_examples:
        dev_eval = DevEval(recipe, dev_examples, tool, step_log)
        callbacks.append(dev_eval)
    keeper = None
    if recipe.choose_final == "best_dev" and dev_split:
        keeper = BestKeeper(root, number, model_path, dev_split, tool, recipe.rollout, step_log)
        callbacks.append(keeper)
    with reusing_vllm_engine(engine_from), colocated_engine_args():
        trainer = guided_trainer_class(scoring_trainer_class())(
            model=model_path,
            reward_funcs=reward_functions(search_form=recipe.search_reward),
            args=args,
            train_dataset=data,
            processing_class=tokenizer,
            peft_config=recipe.lora.peft_config(),
            rollout_func=rollout,
            callbacks=callbacks,
        )
    if args.use_vllm:
        send_unfused_experts(trainer)
    metrics.trainer = trainer
    if dev_eval is not None:
        dev_eval.trainer = trainer
    if keeper is not None:
        keeper.trainer = trainer
    trainer.length_chunk_rows = recipe.length_chunk_rows
    trainer.gold_advantage = recipe.gold_advantage
    return trainer


def train_grpo(recipe: GRPORecipe, resume: bool = False) -> Path:
    """Run every episode in turn; returns the final model directory of the last one.

    What is alive on each GPU, in order (what preflight adds up for episode 2):
    1. Episode k: its trainer (policy, reference model when beta > 0, optimiser states, DeepSpeed
       engine) and, with `rollout_backend: vllm`, one colocated vLLM engine.
    2. Between episodes: the finished trainer is saved, then released (`trl_internals.release_trainer`):
       policy, reference model, optimiser and DeepSpeed engine are dropped and the CUDA cache emptied
       before the next trainer is built. The vLLM engine alone stays alive (its weights and KV cache,
       `vllm_gpu_memory_utilization` of the GPU): episode k + 1's trainer drives the same engine
       (`engine_from`), whose first weight sync loads the new policy. So episode 2 holds what
       episode 1 held, no more. A hard episode's questions are mined here too, from the groups episode 1
       recorded (a file: no model).
    """

    from kgreasoner.data import load_dataset
    from kgreasoner.data.entity_names import with_kg_names
    from kgreasoner.retrieval.tool import KGSearchTool
    from kgreasoner.training.trl_internals import release_trainer

    start_process_group(recipe.setting("ddp_timeout"))  # before anything opens one
    dataset = load_dataset(recipe.dataset, scheme=recipe.split_scheme, seed=recipe.split_seed)
    train_examples = dataset.split("train")[: recipe.max_questions]
    if not train_examples:
        raise ValueError(f"dataset {recipe.dataset!r} has no training questions")
    tool = KGSearchTool(_open_kg(recipe, dataset), recipe.tool)
    # Topic entities the data names by id only (CWQ's Freebase mids) get the KG's names, which the prompt shows.
    train_examples = with_kg_names(train_examples, tool.kg)
    dev_examples = []
    if recipe.dev_eval_steps:
        from kgreasoner.records.sampling import stratified_order

        dev_examples = stratified_order(dataset.split("dev"), recipe.setting("seed"))[: recipe.dev_eval_questions]
        dev_examples = with_kg_names(dev_examples, tool.kg)
    dev_split = with_kg_names(dataset.split("dev"), tool.kg) if recipe.choose_final == "best_dev" else []
    root = Path(recipe.run_dir)
    root.mkdir(parents=True, exist_ok=True)
    finals = [root / f"episode-{number}" / "final" for number in range(1, len(recipe.episodes) + 1)]
    if any(e.data == "hard" for e in recipe.episodes):  # a batch too small for the replay share: refused now
        args = grpo_config(recipe, root / "episode-1", recipe.episodes[0])
        replay_slots(args.generation_batch_size // args.num_generations, recipe.hard_replay)
    model_path, previous = recipe.model, None
    for number, (episode, final) in enumerate(zip(recipe.episodes, finals), 1):
        episode_dir = final.parent
        if is_saved_model(final):
            model_path = str(final)
            logger.info("episode %d/%d already done: %s", number, len(recipe.episodes), final)
            continue
        examples = train_examples
        replay: list = []
        if episode.data == "hard":
            examples, replay = hard_examples(root, number, train_examples, recipe.hard_threshold)
        elif episode.data == "frontier":
            args = grpo_config(recipe, episode_dir, episode)
            per_batch = args.generation_batch_size // args.num_generations
            examples = frontier_examples(root, number, train_examples, recipe.frontier_replay, args.seed, per_batch)
        trainer = build_trainer(
            recipe, number, episode, examples, model_path, tool, dev_examples, previous, dev_split, replay
        )
        if recipe.episode_carry:
            max_steps = [e.max_steps for e in recipe.episodes]
            trainer.run_schedule = plan_episode(root, number, max_steps, recipe.lora.enabled)
        if trainer.is_world_process_zero():
            (root / CHOSEN).unlink(missing_ok=True)  # made before this episode changed
        checkpoint = last_complete_checkpoint(episode_dir) if resume else None
        logger.info(
            "episode %d/%d: %d %s questions from %s%s",
            number,
            len(recipe.episodes),
            len(examples),
            episode.data,
            model_path,
            f", resuming {checkpoint}" if checkpoint else "",
        )
        trainer.train(resume_from_checkpoint=checkpoint)
        model_path = str(save_final(trainer, final, model_path))
        release_trainer(trainer)
        previous = trainer if trainer.use_vllm else None  # kept for its vLLM engine only
    state = PartialState()  # set up by the trainers, or a bare single process when every episode was done
    if state.is_main_process and not (root / CHOSEN).is_file():
        chosen = apply_choice(root, root / STEP_LOG, len(recipe.episodes), recipe.choose_final or "last", recipe.model)
        logger.info(
            "final model: %s (dev Hits@1 %s), %s",
            "the warm-up" if chosen["warmup"] else f"episode {chosen['episode']} step {chosen['step']}",
            chosen["dev_hits1"],
            root / CHOSEN,
        )
    state.wait_for_everyone()
    return Path(model_path)
