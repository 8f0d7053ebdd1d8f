"""SFT warm-up (paper, Section 4.3): teach the tool-calling format before RL.

TRL's `SFTTrainer` on pre-tokenised trajectories: `input_ids` plus `assistant_masks`, so the
loss covers only model-written tokens (the prompt and every `<triples>` block are masked). TRL
builds labels from the mask. On Triton devices its fused LM head scores only labelled positions;
elsewhere `labelled_head` makes it do the same (on CPU the full-sequence projection dominated a step).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from accelerate.logging import get_logger

from kgreasoner.config import resolve_recipe
from kgreasoner.data.trajectories import read_warmup
from kgreasoner.training.common import LoraSettings, ddp_backend, ensure_model, last_complete_checkpoint, save_final
from kgreasoner.training.labelled_head import add_labelled_lm_head
from kgreasoner.training.warmup_data import encode_record

logger = get_logger(__name__)  # main process only unless a call says otherwise


@dataclass
class SFTRecipe:
    """Everything `train/sft.py` needs; one YAML per model size in `configs/*/sft.yaml`."""

    model: str = field(metadata={"help": "checkpoint directory or hub name of the base model"})
    train_file: str = field(metadata={"help": "warm-up trajectories (JSONL from data_gen/warmup.py)"})
    output_dir: str = field(metadata={"help": "where checkpoints, logs and the final model go"})
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
    learning_rate: float = field(default=1e-5, metadata={"help": "peak learning rate"})
    num_train_epochs: float = field(default=3.0, metadata={"help": "passes over the warm-up set"})
    max_steps: int = field(default=-1, metadata={"help": "stop after this many optimiser steps (-1: use epochs)"})
    per_device_train_batch_size: int = field(default=4, metadata={"help": "sequences per device and step"})
    per_device_eval_batch_size: int = field(default=8, metadata={"help": "sequences per device in evaluation"})
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per optimiser step"})
    lr_scheduler_type: str = field(default="cosine", metadata={"help": "transformers scheduler name"})
    warmup_ratio: float = field(default=0.03, metadata={"help": "share of steps with a linear LR warm-up"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    max_length: int = field(default=4096, metadata={"help": "longer trajectories are dropped (and counted), not cut"})
    bf16: bool = field(default=False, metadata={"help": "bf16 mixed precision (GPU, or CPU autocast)"})
    gradient_checkpointing: bool = field(default=False, metadata={"help": "trade compute for activation memory"})
    group_by_length: bool = field(default=True, metadata={"help": "batch trajectories of similar length together"})
    seed: int = field(default=0, metadata={"help": "seed of initialisation, shuffling and dropout"})
    logging_steps: int = field(default=10, metadata={"help": "log every N steps"})
    eval_steps: int = field(default=50, metadata={"help": "evaluate on dev every N steps"})
    save_steps: int = field(default=50, metadata={"help": "checkpoint every N steps (aligned with eval_steps)"})
    save_total_limit: int = field(default=2, metadata={"help": "checkpoints kept on disk"})
    early_stopping_patience: int = field(
        default=3, metadata={"help": "stop after N evaluations without a better dev loss (0: off)"}
    )
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"], metadata={"help": "trainer loggers"})
    deepspeed: str | None = field(default=None, metadata={"help": "DeepSpeed JSON (configs/deepspeed/zero*.json)"})
    lora: LoraSettings = field(default_factory=LoraSettings, metadata={"help": "LoRA adapters (PEFT)"})
    dataloader_num_workers: int = field(default=0, metadata={"help": "worker processes for batching"})
    trainer: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "further SFTConfig fields passed to TRL as given (e.g. {activation_offloading: true, "
            "torch_compile: true}); a field this recipe sets itself is refused"
        },
    )

    def __post_init__(self) -> None:
        if self.learning_rate <= 0:
            raise ValueError(f"learning_rate must be positive, got {self.learning_rate}")
        if self.max_length < 16:
            raise ValueError(f"max_length must be at least 16, got {self.max_length}")
        if self.eval_steps > 0 and self.save_steps % self.eval_steps:
            raise ValueError("save_steps must be a multiple of eval_steps (the best checkpoint is kept)")
        if not isinstance(self.trainer, dict):
            raise ValueError("trainer must be a mapping of SFTConfig field names to values")


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

    def encode(rows):
        nonlocal dropped
        out = []
        for record in rows:
            encoded = encode_record(record, tokenizer)
            if len(encoded["input_ids"]) > recipe.max_length:
                dropped += 1
                continue
            out.append(encoded)
        return out

    train = encode(train_records)
    dev = encode(dev_records)
    if not train:
        raise ValueError(f"{recipe.train_file}: no training trajectory fits max_length={recipe.max_length}")
    return Dataset.from_list(train), (Dataset.from_list(dev) if dev else None), dropped


def sft_config(recipe: SFTRecipe, has_eval: bool):
    """TRL's SFTConfig of the recipe, with the recipe's `trainer` mapping passed through.

    Build it before the model is loaded: with a ZeRO-3 DeepSpeed JSON, creating it registers the
    config that makes `from_pretrained` load the weights already partitioned (`zero.Init`);
    loaded first, every rank would hold the whole model in memory.
    """
    from trl import SFTConfig

    evaluate = has_eval and recipe.eval_steps > 0
    owned = dict(
        output_dir=recipe.output_dir,
        learning_rate=recipe.learning_rate,
        num_train_epochs=recipe.num_train_epochs,
        max_steps=recipe.max_steps,
        per_device_train_batch_size=recipe.per_device_train_batch_size,
        per_device_eval_batch_size=recipe.per_device_eval_batch_size,
        gradient_accumulation_steps=recipe.gradient_accumulation_steps,
        lr_scheduler_type=recipe.lr_scheduler_type,
        warmup_steps=recipe.warmup_ratio,
        weight_decay=recipe.weight_decay,
        max_length=recipe.max_length,
        bf16=recipe.bf16,
        gradient_checkpointing=recipe.gradient_checkpointing,
        train_sampling_strategy="group_by_length" if recipe.group_by_length else "random",
        seed=recipe.seed,
        data_seed=recipe.seed,
        logging_steps=recipe.logging_steps,
        eval_strategy="steps" if evaluate else "no",
        eval_steps=recipe.eval_steps if evaluate else None,
        save_strategy="steps",
        save_steps=recipe.save_steps,
        save_total_limit=recipe.save_total_limit,
        load_best_model_at_end=evaluate,
        metric_for_best_model="eval_loss" if evaluate else None,
        greater_is_better=False if evaluate else None,
        report_to=recipe.report_to,
        deepspeed=resolve_recipe(recipe.deepspeed),
        ddp_backend=ddp_backend(),
        dataloader_num_workers=recipe.dataloader_num_workers,
        completion_only_loss=False,
        use_cpu=not _has_gpu(),
    )
    clash = sorted(set(recipe.trainer) & set(owned))
    if clash:
        raise ValueError(f"trainer: {', '.join(clash)} set by the recipe's own fields; set them there")
    try:
        return SFTConfig(**owned, **recipe.trainer)
    except TypeError as err:
        raise ValueError(f"trainer: {err} (fields: trl.SFTConfig)") from err


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def train_sft(recipe: SFTRecipe, resume: bool = False, callbacks=()) -> Path:
    """Run the warm-up; returns the directory of the final (best on dev) model. `callbacks`: further
    `TrainerCallback`s (a benchmark's clocks)."""
    from transformers import EarlyStoppingCallback
    from trl import SFTTrainer

    from kgreasoner.models import load_model, load_tokenizer

    model_path = ensure_model(recipe.model, recipe.tiny_model, recipe.tokenizer_texts)
    tokenizer = load_tokenizer(model_path)
    train_set, dev_set, dropped = build_datasets(recipe, tokenizer)
    args = sft_config(recipe, has_eval=dev_set is not None)  # before the model: see sft_config
    if dropped:  # after the config, which sets up the process state the rank-aware logger reads
        logger.warning("dropped %d trajectories longer than max_length=%d", dropped, recipe.max_length)
    model = load_model(model_path, tokenizer)
    callbacks = list(callbacks)
    if dev_set is not None and recipe.early_stopping_patience > 0 and recipe.eval_steps > 0:
        callbacks.append(EarlyStoppingCallback(early_stopping_patience=recipe.early_stopping_patience))
    trainer = SFTTrainer(
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
    trainer.train(resume_from_checkpoint=_last_checkpoint(recipe.output_dir) if resume else None)
    return save_final(trainer, Path(recipe.output_dir) / "final", model_path)


def _last_checkpoint(output_dir: str) -> str | None:
    return last_complete_checkpoint(output_dir)
