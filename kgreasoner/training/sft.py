"""SFT warm-up (paper, Section 4.3): teach the tool-calling format before RL.

TRL's `SFTTrainer` on pre-tokenised trajectories: `input_ids` plus `assistant_masks`, so the
loss covers only model-written tokens (the prompt and every `<triples>` block are masked). TRL
builds labels from the mask. On Triton devices its fused LM head scores only labelled positions;
elsewhere `labelled_head` makes it do the same (on CPU the full-sequence projection dominated a step).

The training order is a function of the seed and the epoch (`EpochSeededLengthSampler`), so a run resumed
from a checkpoint half way through an epoch meets the same batches as one that was never stopped.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from accelerate.logging import get_logger
from torch.utils.data import Sampler

from kgreasoner.records.trajectories import read_warmup
from kgreasoner.training.common import (
    POLICY_DTYPE_HELP,
    LoraSettings,
    SamplerEpoch,
    TrainerFields,
    TrainerPassthrough,
    ddp_backend,
    ensure_model,
    last_complete_checkpoint,
    save_final,
    start_process_group,
    trainer_help,
)
from kgreasoner.training.labelled_head import add_labelled_lm_head
from kgreasoner.training.warmup_data import encode_record

logger = get_logger(__name__)  # main process only unless a call says otherwise


SFT_TRAINER = TrainerFields(
    config="SFTConfig",
    defaults={
        "learning_rate": 1e-5,
        "per_device_train_batch_size": 4,
        "lr_scheduler_type": "cosine",
        "warmup_steps": 0.03,  # a share of the steps below 1
        "max_length": 4096,  # longer trajectories are dropped (and counted), never cut
        "bf16": False,  # on where the recipe says so: CPU runs stay in float32
        "activation_checkpointing": False,
        "train_sampling_strategy": "group_by_length",  # trajectories of similar length batched together
        "seed": 0,
        "eval_steps": 50,  # 0: no evaluation
        "save_steps": 50,  # a multiple of eval_steps: the best checkpoint on dev is kept
        "save_total_limit": 2,
        "report_to": ["tensorboard"],
    },
    derived={
        "output_dir": "run_dir",
        "eval_strategy": "eval_file (or train_file's dev records) and trainer.eval_steps",
        "load_best_model_at_end": "the dev set: the best checkpoint on dev loss ends the run",
        "metric_for_best_model": "the dev set: the best checkpoint on dev loss ends the run",
        "greater_is_better": "the dev set: the best checkpoint on dev loss ends the run",
        "save_strategy": "trainer.save_steps (checkpoints every save_steps steps)",
        "completion_only_loss": "the trajectories' assistant masks (the loss covers model-written tokens only)",
        "ddp_backend": "the launch (nccl with GPUs, gloo without, none in one process)",
        "use_cpu": "the machine (CPU where there is no GPU)",
    },
)
"""TRL's SFTConfig as an SFT recipe's `trainer:` mapping reaches it."""


@dataclass
class SFTRecipe(TrainerPassthrough):
    """Everything `train/sft.py` needs; one YAML per model size in `configs/*/sft.yaml`. TRL's own settings
    (learning rate, batch sizes, steps, `max_length`, ...) go under `trainer:` (`SFT_TRAINER`)."""

    TRAINER: ClassVar[TrainerFields] = SFT_TRAINER

    model: str = field(metadata={"help": "checkpoint directory or hub name of the base model"})
    train_file: str = field(metadata={"help": "warm-up trajectories (JSONL from data_gen/warmup.py)"})
    run_dir: str = field(
        metadata={"help": "the run's folder (TRL's output_dir): its checkpoints, logs and the final model"}
    )
    tiny_model: str | None = field(
        default=None,
        metadata={"help": "TinyModelConfig YAML: build a tiny model into `model` first when it does not exist"},
    )
    tokenizer_texts: list[str] = field(
        default_factory=list, metadata={"help": "files the tiny model's tokenizer is trained on"}
    )
    eval_file: str | None = field(
        default=None, metadata={"help": "dev trajectories; default: records of train_file with split 'dev'"}
    )
    early_stopping_patience: int = field(
        default=3, metadata={"help": "stop after N evaluations without a better dev loss (0: off)"}
    )
    lora: LoraSettings = field(default_factory=LoraSettings, metadata={"help": "LoRA adapters (PEFT)"})
    policy_dtype: str = field(default="auto", metadata={"help": POLICY_DTYPE_HELP})
    trainer: dict[str, Any] = field(
        default_factory=dict,
        metadata=trainer_help("SFTConfig", "{learning_rate: 1.0e-5, max_steps: 300, activation_offloading: true}"),
    )

    def __post_init__(self) -> None:
        self.TRAINER.check(self.trainer)
        self.weights_dtype()  # refuses a dtype that cannot train
        if self.setting("learning_rate") <= 0:
            raise ValueError(f"trainer.learning_rate must be positive, got {self.setting('learning_rate')}")
        if self.setting("max_length") < 16:
            raise ValueError(f"trainer.max_length must be at least 16, got {self.setting('max_length')}")
        eval_steps, save_steps = self.setting("eval_steps"), self.setting("save_steps")
        if eval_steps > 0 and save_steps % eval_steps:
            raise ValueError(
                "trainer.save_steps must be a multiple of trainer.eval_steps (the best checkpoint is kept)"
            )


def build_datasets(recipe: SFTRecipe, tokenizer):
    """Tokenised train and dev sets; returns them with the number of over-long trajectories dropped."""
    from datasets import Dataset

    records = read_warmup(recipe.train_file)
    if recipe.eval_file:
        train_records, dev_records = records, read_warmup(recipe.eval_file)
    else:
        train_records = [r for r in records if r.split != "dev"]
        dev_records = [r for r in records if r.split == "dev"]
    dropped = 0
    max_length = recipe.setting("max_length")

    def encode(rows):
        nonlocal dropped
        out = []
        for record in rows:
            encoded = encode_record(record, tokenizer)
            if len(encoded["input_ids"]) > max_length:
                dropped += 1
                continue
            out.append(encoded)
        return out

    train = encode(train_records)
    dev = encode(dev_records)
    if not train:
        raise ValueError(f"{recipe.train_file}: no training trajectory fits max_length={max_length}")
    return Dataset.from_list(train), (Dataset.from_list(dev) if dev else None), dropped


def sft_config(recipe: SFTRecipe, has_eval: bool):
    """TRL's SFTConfig: the recipe's `trainer` mapping over kgreasoner's defaults (`SFT_TRAINER`).

    Build it before the model is loaded: with a ZeRO-3 DeepSpeed JSON, creating it registers the
    config that makes `from_pretrained` load the weights already partitioned (`zero.Init`);
    loaded first, every rank would hold the whole model in memory.
    """
    evaluate = has_eval and recipe.setting("eval_steps") > 0
    return recipe.TRAINER.build(
        recipe.trainer,
        dict(
            output_dir=recipe.run_dir,
            eval_strategy="steps" if evaluate else "no",
            load_best_model_at_end=evaluate,
            metric_for_best_model="eval_loss" if evaluate else None,
            greater_is_better=False if evaluate else None,
            save_strategy="steps",
            completion_only_loss=False,
            ddp_backend=ddp_backend(),
            use_cpu=not _has_gpu(),
        ),
    )


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


class EpochSeededLengthSampler(Sampler[int]):
    """transformers' `group_by_length` order (`get_length_grouped_indices`), drawn from a generator seeded with
    `seed + epoch`.

    transformers' own `LengthGroupedSampler` draws the train order from torch's global RNG when the epoch's
    iteration starts. The trainer restores that RNG from a checkpoint only after skipping the epoch's trained
    batches, so a run resumed mid-epoch read that epoch in another order than the run it continues.
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int) -> None:
        self.lengths, self.batch_size, self.seed, self.epoch = lengths, batch_size, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        import torch
        from transformers.trainer_pt_utils import get_length_grouped_indices

        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        return iter(get_length_grouped_indices(self.lengths, self.batch_size, generator=generator))


def _sft_trainer(**kwargs):
    """TRL's `SFTTrainer` whose `group_by_length` train order is an `EpochSeededLengthSampler`."""
    from transformers.trainer_pt_utils import LengthGroupedSampler
    from trl import SFTTrainer

    class SeededOrderSFTTrainer(SFTTrainer):
        train_sampler = None  # the EpochSeededLengthSampler, once the train dataloader is built

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.add_callback(SamplerEpoch(self))

        def _get_train_sampler(self, train_dataset=None):
            # transformers' override point. The `random` strategy's sampler becomes accelerate's seedable one,
            # already seeded per epoch; `sequential` has no randomness.
            sampler = super()._get_train_sampler(train_dataset)
            if not isinstance(sampler, LengthGroupedSampler):
                return sampler
            seed = self.args.data_seed if self.args.data_seed is not None else self.args.seed
            self.train_sampler = EpochSeededLengthSampler(sampler.lengths, sampler.batch_size, seed)
            return self.train_sampler

    return SeededOrderSFTTrainer(**kwargs)


def train_sft(recipe: SFTRecipe, resume: bool = False, callbacks=()) -> Path:
    """Run the warm-up; returns the directory of the final (best on dev) model. `callbacks`: further
    `TrainerCallback`s (a benchmark's clocks)."""
    from transformers import EarlyStoppingCallback

    from kgreasoner.models import load_model, load_tokenizer

    start_process_group(recipe.setting("ddp_timeout"))  # before the tiny-model build opens one
    model_path = ensure_model(recipe.model, recipe.tiny_model, recipe.tokenizer_texts)
    tokenizer = load_tokenizer(model_path)
    train_set, dev_set, dropped = build_datasets(recipe, tokenizer)
    args = sft_config(recipe, has_eval=dev_set is not None)  # before the model: see sft_config
    if dropped:  # after the config, which sets up the process state the rank-aware logger reads
        logger.warning("dropped %d trajectories longer than max_length=%d", dropped, args.max_length)
    model = load_model(model_path, tokenizer, dtype=recipe.weights_dtype())
    callbacks = list(callbacks)
    if args.load_best_model_at_end and recipe.early_stopping_patience > 0:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=recipe.early_stopping_patience))
    trainer = _sft_trainer(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=dev_set,
        processing_class=tokenizer,
        peft_config=recipe.lora.peft_config(),
        callbacks=callbacks,
    )
    if not _has_gpu():
        # PEFT injects its adapters into `model` itself, so the patch also serves a LoRA run
        add_labelled_lm_head(model)
    trainer.train(resume_from_checkpoint=_last_checkpoint(recipe.run_dir) if resume else None)
    return save_final(trainer, Path(recipe.run_dir) / "final", model_path)


def _last_checkpoint(output_dir: str) -> str | None:
    return last_complete_checkpoint(output_dir)
