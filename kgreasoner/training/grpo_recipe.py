"""The GRPO recipe (`GRPORecipe`, `configs/*/grpo.yaml`): the run's data, model, rollout and episodes, and
TRL's own settings under `trainer:` (`GRPO_TRAINER`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from kgreasoner.records.splits import DEFAULT_SPLIT_SCHEME, SCHEMES, SPLIT_SCHEME_HELP
from kgreasoner.retrieval.tool import ToolConfig
from kgreasoner.rollout.types import RolloutConfig
from kgreasoner.training.common import (
    POLICY_DTYPE_HELP,
    LoraSettings,
    TrainerFields,
    TrainerPassthrough,
    trainer_help,
)

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
    "hard_cases.threshold (a question is hard below this success rate) and hard_cases.replay (the share of every "
    "batch from the other questions)"
)
REMOVED_KEYS = {
    "hard_case_trajectories": f"{WARMUP_MINING}; guided groups take their gold rows from guidance.trajectories",
    "hard_case_quantile": WARMUP_MINING,
}
"""Recipe keys that are gone, and what to set instead."""
MOVED_KEYS = {
    "hard_threshold": "hard_cases.threshold",
    "hard_replay": "hard_cases.replay",
    "guidance_trajectories": "guidance.trajectories",
    "gold_advantage": "guidance.gold_advantage",
    "dev_eval_steps": "dev_eval.steps",
    "dev_eval_questions": "dev_eval.questions",
    "dev_eval_batch_size": "dev_eval.batch_size",
    "choose_final": "dev_eval.choose_final",
    "search_reward": "rewards.search_form",
}
"""Recipe keys that moved into a group, and their place now."""
GROUP_WAS = {
    "hard_cases": f"hard_cases is now a mapping ({{threshold, replay}}), no longer a file: {WARMUP_MINING}; the mined "
    "set is saved in episode-<k>/hard_cases.jsonl",
    "guidance": "guidance is now a mapping: its mode is guidance.mode (guidance: {mode: gold})",
}
"""Group keys that held a single value before, and what a recipe that gives them one must write instead."""


@dataclass
class Episode:
    """One pass of GRPO over a question set."""

    data: str = field(
        default="all",
        metadata={
            "help": "all: every training question; hard: the hard cases, the questions episode 1's groups got "
            "partly or wholly wrong (hard_cases.threshold); frontier: the questions with some but not all rollouts "
            "right in episode 1, plus a replay share of the rest (frontier_replay)"
        },
    )
    num_train_epochs: float = field(default=1.0, metadata={"help": "passes over this episode's questions"})
    max_steps: int = field(default=-1, metadata={"help": "cap on optimiser steps in this episode (-1: epochs)"})

    def __post_init__(self) -> None:
        if self.data not in EPISODE_DATA:
            raise ValueError(f"episode data must be one of {EPISODE_DATA}, got {self.data!r}")


@dataclass
class Rewards:
    """The summed reward R = w_s R_search + w_f R_format + w_a R_answer (paper: all weights 1), each weight keyed
    by its reward's name, and the search reward's form."""

    search: float = field(default=1.0, metadata={"help": "weight of the search reward (its form: search_form)"})
    format: float = field(default=1.0, metadata={"help": "weight of the 0.5 format reward"})
    answer: float = field(default=1.0, metadata={"help": "weight of the 1.0 answer reward"})
    search_form: str = field(
        default="paper",
        metadata={
            "help": "search reward form (kgreasoner.rewards.SEARCH_FORMS), n the searches that returned triples, "
            "h the question's hop count: paper min(0.5 n, 0.8); hops 0.8 min(n, h) / h (each search up to the hop "
            "count earns a share; unknown h: paper's); correct (paper's, paid only with a right answer); "
            "correct_hops (hops', paid only with a right answer); path (0.8 x the share of the gold path the "
            "searches walked in order, or 0.8 once the answer is shown)"
        },
    )

    def __post_init__(self) -> None:
        from kgreasoner.rewards import SEARCH_FORMS

        if self.search_form not in SEARCH_FORMS:
            raise ValueError(f"rewards.search_form must be one of {SEARCH_FORMS}, got {self.search_form!r}")

    def weights(self, names: list[str]) -> list[float]:
        """The weights of the reward functions named `names` (TRL's `reward_weights`, in their order):
        `search_reward` takes `search`, and so on."""
        return [getattr(self, name.removesuffix("_reward")) for name in names]


@dataclass
class HardCases:
    """A hard episode's questions (`data: hard`, `kgreasoner.training.hard_cases`)."""

    threshold: float = field(
        default=1.0,
        metadata={
            "help": "a hard episode's questions: those whose last group in episode 1 had a success rate (right "
            "answers of the policy's own rollouts, gold rows not counted) below this, every hop count eligible; "
            "1.0: any wrong rollout, 0.5: right in fewer than half. Questions episode 1 never sampled are not hard "
            "(kgreasoner.training.hard_cases); the set is saved in the episode's folder and a resumed run reuses it"
        },
    )
    replay: float = field(
        default=0.25,
        metadata={
            "help": "share of every batch (generation batch) of a hard episode drawn from the other training "
            "questions, hop counts in turn (seeded), so what the policy already answers, 1-hop questions "
            "included, stays in training; to the nearest question, at least one while above 0 (0: hard cases only)"
        },
    )

    def __post_init__(self) -> None:
        if not 0.0 < self.threshold <= 1.0:
            raise ValueError(f"hard_cases.threshold must be in (0, 1], got {self.threshold}")
        if not 0.0 <= self.replay < 1.0:
            raise ValueError(f"hard_cases.replay must be in [0, 1), got {self.replay}")


@dataclass
class Guidance:
    """What a group with no right answer gets (`kgreasoner.training.guidance`)."""

    mode: str = field(
        default="none",
        metadata={
            "help": "none; gold (its last row becomes the question's warm-up trajectory, an off-policy row; at most "
            "one a group); gold_prefix (its last row is rolled out again after the warm-up trajectory's first h-1 "
            "search turns, given with no loss, so the model takes the last hop itself; 1-hop questions are left as "
            "they are)"
        },
    )
    trajectories: str | None = field(
        default=None,
        metadata={
            "help": "warm-up records (JSONL, data_gen.warmup's all.jsonl) the gold rows come from. Made with the "
            "training tool's settings, so their answers resolve"
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

    def __post_init__(self) -> None:
        from kgreasoner.training.guidance import GUIDANCE

        if self.mode not in GUIDANCE:
            raise ValueError(f"guidance.mode must be one of {GUIDANCE}, got {self.mode!r}")
        if self.mode != "none" and not self.trajectories:
            raise ValueError(
                f"guidance.mode: {self.mode} needs the gold trajectories: set guidance.trajectories "
                "to the warm-up records, data_gen.warmup's all.jsonl"
            )
        if not 0.0 <= self.gold_advantage < float("inf"):
            raise ValueError(f"guidance.gold_advantage must be a finite number >= 0, got {self.gold_advantage}")


@dataclass
class DevEvaluation:
    """Greedy Hits@1 on the dev split during the run, and the final model it chooses
    (`grpo_callbacks.DevEval`, `kgreasoner.training.checkpoint_choice`)."""

    steps: int = field(
        default=0,
        metadata={"help": "greedy Hits@1 on a fixed dev sample every N optimiser steps and before the first (0: off)"},
    )
    questions: int = field(
        default=150,
        metadata={
            "help": "size of that dev sample (stratified by hops); every saved checkpoint is evaluated on it too "
            "(the final choice, choose_final, measures the whole dev split)"
        },
    )
    batch_size: int = field(
        default=32,
        metadata={
            "help": "dev questions a rank rolls out in one engine call (greedy, through rollout_backend), for the "
            "dev sample and for the whole dev split alike: that many rows share the KV cache at once; a rank's "
            "share takes ceil(share / this) calls"
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

    def __post_init__(self) -> None:
        if self.steps < 0 or self.questions < 1:
            raise ValueError(
                f"dev_eval.steps must be >= 0 and dev_eval.questions >= 1, got {self.steps} and {self.questions}"
            )
        if self.batch_size < 1:
            raise ValueError(f"dev_eval.batch_size must be >= 1, got {self.batch_size}")
        if self.choose_final not in (None, "best_dev", "last"):
            raise ValueError(f"dev_eval.choose_final must be best_dev or last, got {self.choose_final!r}")
        if self.choose_final == "best_dev" and not self.steps:
            raise ValueError(
                "dev_eval.choose_final: best_dev needs dev evaluation: set dev_eval.steps (or choose_final: last)"
            )

    @property
    def final(self) -> str:
        """The final choice: `choose_final`, by default best_dev when dev evaluation is on, else last."""
        return self.choose_final or ("best_dev" if self.steps else "last")


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
        if key in MOVED_KEYS:
            return f"{key} is now {MOVED_KEYS[key]}"
        return super().misplaced_key(key)

    @classmethod
    def old_forms(cls, data: dict[str, Any]) -> list[str]:
        """`kgreasoner.config.from_dict`'s hint for a group key given the single value it held before."""
        return [GROUP_WAS[key] for key in GROUP_WAS if key in data and not isinstance(data[key], dict)]

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
    split_scheme: str = field(default=DEFAULT_SPLIT_SCHEME, metadata={"help": SPLIT_SCHEME_HELP})
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
    hard_cases: HardCases = field(
        default_factory=HardCases, metadata={"help": "a hard episode's questions and its replay share"}
    )
    guidance: Guidance = field(
        default_factory=Guidance, metadata={"help": "what a group with no right answer gets, and its gold rows"}
    )
    frontier_replay: float = field(
        default=0.25,
        metadata={
            "help": "share of a frontier episode's questions drawn (seeded) from those episode 1 got all right or all "
            "wrong, so what the policy already answers is kept; guided groups teach the all-wrong ones"
        },
    )
    max_questions: int | None = field(default=None, metadata={"help": "use only the first N training questions"})
    rewards: Rewards = field(
        default_factory=Rewards, metadata={"help": "reward weights, keyed by reward, and the search reward's form"}
    )
    order: str = field(
        default="stratified",
        metadata={
            "help": "question order: stratified (hop counts take turns for the whole epoch, scarcer ones recycled, "
            "questions shuffled within a hop count; seeded) or shuffled (TRL's seeded shuffle each epoch; a hard "
            "episode keeps its own batches, its hard questions shuffled once)"
        },
    )
    dev_eval: DevEvaluation = field(
        default_factory=DevEvaluation,
        metadata={"help": "greedy Hits@1 on the dev split during the run, and the final model it chooses"},
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
        for key, group in (("hard_cases", HardCases), ("guidance", Guidance)):
            if not isinstance(getattr(self, key), group):  # a single value, where the key held one before
                raise ValueError(GROUP_WAS[key])
        if not self.episodes:
            raise ValueError("episodes must not be empty")
        self.episodes = [Episode(**e) if isinstance(e, dict) else e for e in self.episodes]
        if self.episodes[0].data != "all":
            raise ValueError("episode 1 must train on all questions (data: all), as in the paper")
        self.TRAINER.check(self.trainer)
        if self.setting("num_generations") < 2:
            raise ValueError("trainer.num_generations must be >= 2: GRPO compares rollouts of one question")
        self.weights_dtype()  # refuses a dtype that cannot train
        self._check_choices()
        if not 0.0 <= self.frontier_replay < 1.0:
            raise ValueError(f"frontier_replay must be in [0, 1), got {self.frontier_replay}")
        if self.length_chunk_rows < 1:
            raise ValueError(f"length_chunk_rows must be >= 1, got {self.length_chunk_rows}")
        if self.max_prompt_tokens < 1:
            raise ValueError(f"max_prompt_tokens must be >= 1, got {self.max_prompt_tokens}")
        self._check_trainer()

    def _check_choices(self) -> None:
        """Each setting that names one of a few choices names one of them."""
        from kgreasoner.training.trl_internals import IMPORTANCE_SAMPLING_MODES

        choices = (
            ("importance_sampling", self.importance_sampling, IMPORTANCE_SAMPLING_MODES),
            ("rollout_backend", self.rollout_backend, ("hf", "vllm")),
            ("split_scheme", self.split_scheme, SCHEMES),
            ("order", self.order, ("stratified", "shuffled")),
            ("trainer.scale_rewards", self.setting("scale_rewards"), SCALE_REWARDS),
        )
        for name, value, allowed in choices:
            if value not in allowed:
                raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}")

    def _check_trainer(self) -> None:
        """The `trainer:` settings a run cannot take: a schedule the episodes cannot share, and the fields of
        `UNSUPPORTED_TRAINER`."""
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
