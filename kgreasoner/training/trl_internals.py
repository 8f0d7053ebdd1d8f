"""Every use of TRL's private parts, in one place, checked against the TRL release it was written for.

TRL makes no promise about underscored names, its `trainer.utils` and `kernels` modules, or the
attributes of its trainers and vLLM wrapper: a minor release may rename or change any of them.
The rest of kgreasoner uses TRL's public API (`GRPOTrainer`, `GRPOConfig`, `SFTTrainer`, ...) and
reaches anything else through this module, so a TRL upgrade is checked here, and the import
refuses a TRL outside `TESTED_TRL` with an error naming that range (`pyproject.toml` pins the same).

What is here:
- `EpochSeededRepeatSampler`: TRL's `RepeatSampler` (`trainer.utils`), its shuffle seeded per epoch, which
  `scoring_trainer_class` trains on (its `_get_train_sampler`), so a resumed run reads the epoch it resumes in.
- `scoring_trainer_class`: `GRPOTrainer` with `_compute_loss` and `_get_per_token_logps_and_entropies`
  overridden to score only where the loss reads, in length chunks (`length_chunks`), through TRL's
  fused LM head with its `_use_triton` device test patched; its `create_optimizer` / `create_scheduler`
  follow the run's one schedule (`episode_schedule.RunSchedule`, set transformers' `_created_lr_scheduler`);
  its `_generate_and_score_completions` logs what TRL's importance-sampling correction of vLLM rollouts
  dropped or capped (`importance_sampling_counts`, TRL's ratio recomputed; `IMPORTANCE_SAMPLING_MODES`).
- `GuidedRowAdvantages` (`guided_trainer_class`): `_calculate_rewards` and `_generate_and_score_completions`
  overridden so guided rows train with the recipe's `guidance.gold_advantage`, out of their group's mean and std and of
  TRL's reward figures (`_metrics`, `_logs`).
- `log_metric` / `add_metric`: TRL's per-step metric buffers (`_log_metric`, `_metrics`).
- `vllm_engine`: the colocated `vllm.LLM` and its tensor-parallel group (`vllm_generation.llm/.tp_group`);
  `sync_vllm_weights`: the engine given the current weights outside TRL's generation (`_last_loaded_step`).
- `send_unfused_experts`: TRL's weight sync reads the weights through `vllm_weights.vllm_named_weights`
  (`_iter_named_params`), so fused MoE experts reach vLLM under the names its loader takes, and a colocated
  engine loads them one trainer tensor a call (`sync_weights`);
  `colocated_engine_args`: the engine TRL starts (`VLLMGeneration._init_vllm`, its module's `LLM`) gets
  `vllm_weights.vllm_engine_args` (Triton MoE kernels, which a weight sync reloads correctly).
- `reusing_vllm_engine`: builds a trainer that drives an earlier trainer's colocated engine;
  `release_trainer` frees a finished trainer's memory (its engine's reference to the policy included).
- TRL's fused-head pieces and tile sizes: `FusedCausalLMOutput`, `add_fused_lm_head`,
  `TOKEN_CHUNK_SIZE`, `CHUNKED_LOGPROB_CHUNK_SIZE`.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import trl
from packaging.version import Version

TESTED_TRL = (">=1.16", "<1.17")
"""The TRL releases this module was read against and tested with (`pyproject.toml` pins the same)."""
IMPORTANCE_SAMPLING_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
"""TRL's `vllm_importance_sampling_mode` values (`GRPOTrainer._generate_and_score_completions`)."""


def check_trl_version(version: str | None = None) -> None:
    """Raise ImportError unless `version` (default: the installed TRL's) lies in `TESTED_TRL`."""
    version = trl.__version__ if version is None else version
    low, high = (Version(bound.lstrip("<>=")) for bound in TESTED_TRL)
    if not low <= Version(Version(version).base_version) < high:
        spec = ",".join(TESTED_TRL)
        raise ImportError(
            f"kgreasoner overrides TRL internals read in trl{spec}, but trl {version} is installed: "
            f"pip install 'trl{spec}' (or pip install -c constraints-gpu.txt ...)"
        )


check_trl_version()

from trl.kernels.chunked_logprob import TOKEN_CHUNK_SIZE  # noqa: E402  (after the version check)
from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE as CHUNKED_LOGPROB_CHUNK_SIZE  # noqa: E402
from trl.trainer.utils import FusedCausalLMOutput, RepeatSampler, add_fused_lm_head  # noqa: E402

from kgreasoner.training.common import SamplerEpoch  # noqa: E402

__all__ = [
    "CHUNKED_LOGPROB_CHUNK_SIZE",
    "EpochSeededRepeatSampler",
    "FusedCausalLMOutput",
    "GUIDED_COLUMN",
    "GuidedRowAdvantages",
    "IMPORTANCE_SAMPLING_MODES",
    "TESTED_TRL",
    "TOKEN_CHUNK_SIZE",
    "add_fused_lm_head",
    "add_metric",
    "check_trl_version",
    "colocated_engine_args",
    "guided_trainer_class",
    "importance_sampling_counts",
    "length_chunks",
    "log_metric",
    "release_trainer",
    "reusing_vllm_engine",
    "scoring_trainer_class",
    "send_unfused_experts",
    "sync_vllm_weights",
    "vllm_engine",
]


def log_metric(trainer, name: str, value: float) -> None:
    """A figure of this rank for the step, through the path TRL's reward functions get (averaged over ranks)."""
    trainer._log_metric(name, value)


def add_metric(trainer, name: str, value: float) -> None:
    """A figure already the same on every rank, straight into the buffer TRL logs the step from."""
    trainer._metrics["train"][name].append(value)


def vllm_engine(trainer) -> tuple[Any, Any]:
    """The trainer's colocated `vllm.LLM` and its tensor-parallel group (None without tensor parallelism)."""
    generation = trainer.vllm_generation
    group = getattr(generation, "tp_group", None) if generation.tensor_parallel_size > 1 else None
    return generation.llm, group


def sync_vllm_weights(trainer) -> None:
    """Load the trainer's current weights into its vLLM engine unless this step's are there already.

    TRL syncs (`vllm_generation.sync_weights`, a collective under ZeRO-3) only before its own generation of
    a step, and marks the step it loaded (`_last_loaded_step`); generation outside it (a dev evaluation
    after a step) syncs here and marks the step the same way, so TRL's next generation does not load again.
    """
    if trainer.state.global_step != trainer._last_loaded_step:
        trainer.vllm_generation.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step


@contextlib.contextmanager
def reusing_vllm_engine(previous):
    """A `GRPOTrainer` built inside this context drives `previous`'s colocated vLLM engine (None: its own).

    A second `vllm.LLM` in one process needs the first torn down, which vLLM does not do reliably for
    an engine inside torchrun's ranks (`external_launcher`). TRL's `VLLMGeneration` is built as usual
    (the new trainer's model, accelerator and settings) except that, instead of starting an engine,
    it takes over the previous one; the first weight sync of the new trainer then loads its weights.
    """
    if previous is None or not getattr(previous, "use_vllm", False):
        yield
        return
    import trl.trainer.grpo_trainer as grpo_trainer

    kept = previous.vllm_generation
    stock = grpo_trainer.VLLMGeneration
    if kept.mode != "colocate":
        raise ValueError("only a colocated vLLM engine can be handed to the next trainer")

    class KeptEngine(stock):
        def _init_vllm(self):
            self.llm = kept.llm
            if hasattr(kept, "tp_group"):
                self.tp_group = kept.tp_group
            self._llm_weights_sleeping = False

    grpo_trainer.VLLMGeneration = KeptEngine
    try:
        yield
    finally:
        grpo_trainer.VLLMGeneration = stock


def send_unfused_experts(trainer) -> None:
    """Make TRL's weight sync to vLLM (colocated `load_weights` and the server's stream) send unfused experts,
    and load a colocated engine with one `load_weights` call per trainer tensor.

    Overrides TRL private `VLLMGeneration._iter_named_params` (on this instance), through which both of
    `VLLMGeneration.sync_weights`'s modes read the weights (`kgreasoner.training.vllm_weights` says why).
    A model with fused experts of an unknown layout is refused here, before the first sync.

    Also overrides `sync_weights` of a colocated engine: TRL calls the engine's `load_weights` once per name it
    reads, and each call rebuilds vLLM's parameter map (and a MoE model's expert mapping). Unfused, Qwen3-30B-A3B's
    48 layers of 128 experts are 18,867 names, so as many calls a sync; here the names of one trainer tensor (a
    fused expert tensor's 384) go in one call, inside the ZeRO-3 gather of that tensor: 531 calls. A server
    streams the tensors instead, and sleep mode (refused by the recipe) wakes the engine first: both keep TRL's.
    """
    from kgreasoner.training.vllm_weights import check_unfusable, vllm_named_weights

    generation = trainer.vllm_generation
    model = generation.model
    model_type = model.config.model_type
    check_unfusable(model_type, (name for name, _ in model.named_parameters()))
    named_params = generation._iter_named_params
    generation._iter_named_params = lambda: vllm_named_weights(named_params(), model_type)
    stock_sync = generation.sync_weights

    def sync_weights() -> None:
        if generation.mode != "colocate" or generation.enable_sleep_mode:
            return stock_sync()
        engine = generation.llm.llm_engine.model_executor.driver_worker.model_runner.model
        for name, tensor in named_params():  # one tensor at a time, gathered while its pairs load
            engine.load_weights(list(vllm_named_weights([(name, tensor)], model_type)))
        generation.llm.reset_prefix_cache()

    generation.sync_weights = sync_weights


@contextlib.contextmanager
def colocated_engine_args():
    """A `GRPOTrainer` built inside this context starts its colocated `vllm.LLM` with kgreasoner's engine
    arguments for the model it serves (`vllm_weights.vllm_engine_args`) beside TRL's own.

    TRL builds the engine in private `VLLMGeneration._init_vllm` from the `LLM` name of its module, with no way
    to pass more arguments; that name is wrapped for the duration. Without vLLM installed it is left alone (TRL
    refuses `use_vllm` itself).
    """
    import trl.generation.vllm_generation as module

    stock = getattr(module, "LLM", None)
    if stock is None:
        yield
        return
    from transformers import AutoConfig

    from kgreasoner.training.vllm_weights import vllm_engine_args

    def llm(*args, **kwargs):
        config = AutoConfig.from_pretrained(kwargs["model"], trust_remote_code=kwargs.get("trust_remote_code", False))
        return stock(*args, **vllm_engine_args(config), **kwargs)

    module.LLM = llm
    try:
        yield
    finally:
        module.LLM = stock


def release_trainer(trainer) -> None:
    """Drop what a finished trainer holds on the accelerator: policy, reference model, optimiser,
    scheduler, DeepSpeed engine, and the cached blocks. A colocated vLLM engine (`trainer.vllm_generation`)
    survives for `reusing_vllm_engine`, without its reference to the policy."""
    import gc

    import torch

    trainer.accelerator.free_memory()
    for owner in (trainer, trainer.callback_handler):
        for name in ("model", "model_wrapped", "ref_model", "optimizer", "lr_scheduler", "deepspeed"):
            if getattr(owner, name, None) is not None:
                setattr(owner, name, None)
    if getattr(trainer, "vllm_generation", None) is not None:
        trainer.vllm_generation.model = None
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


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
        rows = order[offset : offset + rows_per_chunk]
        end = int(ends[rows].max())
        chunks.append((rows, min(int(starts[rows].min()), end), end))
    return chunks


def importance_sampling_counts(old, sampling, mask, mode: str, clip_min: float | None, clip_max: float | None):
    """What TRL's importance-sampling correction does to one generation batch, as counts (a float tensor, to sum
    over ranks): model tokens, tokens it gives weight 0, tokens whose ratio it clips, rows with a model token,
    and rows all of whose model tokens get weight 0.

    The ratio is TRL's (`_generate_and_score_completions`): exp(old - sampling) on each model token (`mask`
    1), a NaN sampling logprob (one the engine could not score) counting as no difference, or for the
    `sequence_*` modes exp of their sum over the row, applied to each of its tokens. Outside
    [clip_min, clip_max] (None: unbounded) the `*_mask` modes set it to 0 and the `*_truncate` modes clip it.
    """
    import torch

    if mode not in IMPORTANCE_SAMPLING_MODES:
        raise ValueError(f"importance sampling mode must be one of {IMPORTANCE_SAMPLING_MODES}, got {mode!r}")
    kept = mask.bool()
    difference = torch.nan_to_num((old - sampling) * mask, nan=0.0)
    if mode.startswith("sequence"):
        difference = difference.sum(dim=-1, keepdim=True)
    ratio = torch.exp(difference)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    outside = ((ratio < low) | (ratio > high)).expand_as(kept) & kept
    dropped = outside if mode.endswith("mask") else torch.zeros_like(outside)
    rows = kept.any(dim=-1)
    return torch.stack(
        [
            kept.sum(),
            dropped.sum(),
            (outside & ~dropped).sum(),
            rows.sum(),
            (rows & (dropped == kept).all(dim=-1)).sum(),
        ]
    ).float()


class EpochSeededRepeatSampler(RepeatSampler):
    """TRL's `RepeatSampler` whose shuffle is drawn from `seed + epoch` (given by `set_epoch`).

    TRL's draws each epoch's order in turn from one generator seeded when the sampler is built. A run resumed
    mid-epoch builds it anew, so its first epoch read the first epoch's order whatever epoch it resumed in.
    """

    epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        if self.shuffle and self.seed is not None:
            self.generator.manual_seed(self.seed + self.epoch)
        return super().__iter__()


def scoring_trainer_class():
    """TRL's GRPOTrainer, projecting through the vocabulary only where the loss reads.

    The loss reads the log-probabilities of model-written completion tokens (completion mask times
    env_mask). TRL's fused LM head scores only labelled positions on GPUs, but on other devices it
    scores every position, prompt and tool blocks included: with a tiny model's vocabulary
    projection twice the size of its body, and tool blocks 80% of a completion, most of a CPU step
    went to logits the loss multiplies by zero. Here those positions get label -100 and the fused
    head runs on the labelled rows only, on every device. Log-probabilities and gradients at the
    positions the loss reads are unchanged (tested). The others (tool blocks, gold prefixes, the
    appended end id, padding) carry the batch's old log-probabilities, so the ratio there is exactly
    1: a 0 beside an old logprob below -88.7 (a tool token the policy finds unlikely, likelier at a
    low temperature) overflowed exp(new - old), and inf x mask 0 made the whole loss NaN. The
    reference logprobs there are set to the same values, so the KL term reads 0 where the mask does
    (TRL's own path scores those positions and can overflow there too). TRL's loss multiplies every
    such position by 0, so the loss is TRL's own wherever that is finite (tested bit for bit).

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
        _scored = None  # the loss mask of the batch `_compute_loss` is scoring
        _unscored = None  # what the log-probabilities are where that mask is 0: its old ones, when it has them
        length_chunk_rows = 4
        run_schedule = None  # kgreasoner.training.episode_schedule.RunSchedule: the episode's place in the run
        train_sampler = None

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(SamplerEpoch(self))

        def _get_train_sampler(self, dataset=None):
            # transformers' override point; TRL's sampler as an `EpochSeededRepeatSampler`
            stock = super()._get_train_sampler(dataset)
            self.train_sampler = EpochSeededRepeatSampler(
                stock.data_source,
                stock.mini_repeat_count,
                stock.batch_size,
                stock.repeat_count,
                stock.shuffle,
                stock.seed,
            )
            return self.train_sampler

        def create_optimizer(self, model=None):
            # transformers' override point; with a run schedule, episode k > 1 continues episode k - 1's AdamW state
            optimizer = super().create_optimizer(model)
            if self.run_schedule is not None:
                self.run_schedule.load_optimizer(optimizer)
            return optimizer

        def create_scheduler(self, num_training_steps, optimizer=None):
            # transformers' override point; the episode's window of the run's one schedule
            if self.run_schedule is None or self.lr_scheduler is not None:
                return super().create_scheduler(num_training_steps, optimizer)
            optimizer = self.optimizer if optimizer is None else optimizer
            self.lr_scheduler = self.run_schedule.scheduler(optimizer, self.args, num_training_steps)
            self._created_lr_scheduler = True  # transformers' flag: a later train() call builds it anew
            return self.lr_scheduler

        def _compute_loss(self, model, inputs):
            mask = inputs["completion_mask"]
            self._scored = mask if inputs.get("tool_mask") is None else mask * inputs["tool_mask"]
            # Without old logprobs TRL takes the new ones as old (a ratio of 1 everywhere): 0 is then safe.
            self._unscored = inputs.get("old_per_token_logps")
            reference = inputs.get("ref_per_token_logps")
            if reference is not None and self._unscored is not None:
                # exp(ref - new) must not overflow where new is the old logprob and the mask reads nothing
                inputs = {**inputs, "ref_per_token_logps": reference.where(self._scored.bool(), self._unscored)}
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self._scored = self._unscored = None

        def _generate_and_score_completions(self, inputs):
            output = super()._generate_and_score_completions(inputs)
            if self.use_vllm and self.vllm_importance_sampling_correction:
                # What the importance-sampling correction dropped or capped, over every rank's rows of the batch
                mask = output["completion_mask"]
                if output.get("tool_mask") is not None:
                    mask = mask * output["tool_mask"]
                counts = importance_sampling_counts(
                    output["old_per_token_logps"],
                    output["sampling_per_token_logps"],
                    mask,
                    self.vllm_importance_sampling_mode,
                    self.vllm_importance_sampling_clip_min,
                    self.vllm_importance_sampling_clip_max,
                )
                tokens, dropped, capped, rows, dropped_rows = self.accelerator.reduce(counts, reduction="sum").tolist()
                metrics = self._metrics["train" if self.model.training else "eval"]
                metrics["rollout/is_dropped"].append(dropped / max(tokens, 1.0))
                metrics["rollout/is_capped"].append(capped / max(tokens, 1.0))
                metrics["rollout/is_dropped_rows"].append(dropped_rows / max(rows, 1.0))
            return output

        def _get_per_token_logps_and_entropies(
            self,
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=None,
            compute_entropy=False,
            compute_aux_loss=False,
            **multimodal,
        ):
            if self._scored is None or compute_aux_loss or any(v is not None for v in multimodal.values()):
                return super()._get_per_token_logps_and_entropies(
                    model,
                    input_ids,
                    attention_mask,
                    logits_to_keep,
                    batch_size,
                    compute_entropy,
                    compute_aux_loss,
                    **multimodal,
                )
            prompt_width = input_ids.size(1) - logits_to_keep
            logps = torch.zeros(input_ids.size(0), logits_to_keep, device=input_ids.device)
            entropies = torch.zeros_like(logps) if compute_entropy else None
            for rows, first, end in length_chunks(attention_mask, batch_size or self.length_chunk_rows):
                # Completion columns inside the chunk's span; at least one, so that a chunk whose rows keep no
                # completion token (truncated ones under mask_truncated_completions) still runs its forward, as
                # TRL's own path does: the loss then still hangs off the model (backward runs), and under ZeRO-3,
                # where every forward gathers the weights with the other ranks, each rank runs one per chunk.
                kept = max(end - prompt_width, 1)
                first, end = min(first, prompt_width), prompt_width + kept
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
            if self._unscored is not None:
                logps = logps.where(self._scored.bool(), self._unscored.to(logps.dtype))
            return logps, entropies, None

    return ScoringGRPOTrainer


GUIDED_COLUMN = "guided"
"""The rollout's column that marks a guided row (`kgreasoner.training.guidance`): a gold row, or a rollout after a
gold prefix."""


class GuidedRowAdvantages:
    """A mixin before `GRPOTrainer` (TRL 1.16): guided rows get an advantage set by the recipe, not by std scaling,
    and TRL's reward figures count the policy's own rows only.

    TRL computes the advantages inline in `_generate_and_score_completions`, right after `_calculate_rewards`
    hands it every rank's rewards: `(r - group mean) / (std + 1e-4)`, with nan-aware means and stds that leave
    out a row whose every reward is NaN (and give that row advantage 0). Here `_calculate_rewards` marks the
    rows of the rollout's `guided` column NaN, so:

    - the policy's rows get exactly the advantages TRL gives the group of the policy's rows alone (scale_rewards
      group, batch or none alike). Left in, one gold row would set them: it moves the group mean by 1/8 of its
      reward gap and, as the group's outlier, most of its std, so every policy row of a failed group is pushed
      down alike and their search and format differences shrink; its own advantage came out 7/sqrt(8) ~ 2.47
      beside 7 tied rows whatever the gap. A gold row's weight is then the recipe's, and nothing else's;
    - a guided row with a right answer (a gold row, whose record answers right; a rollout that answered right
      after its gold prefix) gets `guidance.gold_advantage`; one without gets 0: a wrong continuation after a prefix
      the policy did not choose is nothing to imitate, and pushing it down would punish the prefix's context;
    - TRL's `reward`, `reward_std` and `rewards/<name>/mean|std` are the policy's rows' (nanmean), and the
      guided rows' are logged apart: `guidance/gold_rows` (their number in the generation batch, every rank's)
      and `guidance/gold_<reward name>` (their mean, in a batch that has some). The completions table
      (`log_completions`) gets their real rewards and advantages back.

    A batch without the `guided` column (guidance off) is left to TRL as it is.
    """

    gold_advantage = 1.0
    _guided_rows = None  # every rank's guided marks and rewards, from _calculate_rewards to the advantages

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        import torch
        from accelerate.utils import gather

        rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
        if GUIDED_COLUMN not in inputs[0]:
            return rewards
        local = torch.tensor([float(x[GUIDED_COLUMN]) for x in inputs], device=rewards.device)
        guided = gather(local).bool()  # a collective, as TRL's gather of the rewards just before
        self._guided_rows = (guided, rewards[guided].clone())
        rewards[guided] = torch.nan  # out of the group's mean and std, and of TRL's reward figures
        return rewards

    def _generate_and_score_completions(self, inputs):
        import torch

        output = super()._generate_and_score_completions(inputs)
        if self._guided_rows is None:
            return output
        guided, their_rewards = self._guided_rows
        self._guided_rows = None
        right = their_rewards[:, self.reward_func_names.index("answer_reward")] > 0
        theirs = right.float() * self.gold_advantage  # one a guided row, in batch order
        advantages = torch.zeros(guided.numel(), device=guided.device)
        advantages[guided] = theirs
        rank = self.accelerator.process_index  # TRL's own slice of this rank's rows
        mine = slice(rank * len(inputs), (rank + 1) * len(inputs))
        local = output["advantages"]
        output["advantages"] = torch.where(guided[mine], advantages[mine].to(local.dtype), local)

        metrics = self._metrics["train" if self.model.training else "eval"]
        metrics["guidance/gold_rows"].append(float(guided.sum()))
        if guided.any():
            for i, name in enumerate(self.reward_func_names):
                metrics[f"guidance/gold_{name}"].append(their_rewards[:, i].mean().item())
        # TRL's completions table ends with this batch's rows: guided ones were logged with NaN rewards, advantage 0
        positions = guided.nonzero().flatten().tolist()
        for j, position in enumerate(positions):
            back = position - guided.numel()
            for i, name in enumerate(self.reward_func_names):
                self._logs["rewards"][name][back] = their_rewards[j, i].item()
            self._logs["advantages"][back] = theirs[j].item()
        return output


def guided_trainer_class(base, **settings):
    """`base` (a `GRPOTrainer` class) with `GuidedRowAdvantages` before it, and `settings` (class attributes
    such as `gold_advantage` and `length_chunk_rows`) in place of their defaults."""
    return type(base.__name__, (GuidedRowAdvantages, base), settings)
