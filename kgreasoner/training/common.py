"""Pieces every trainer shares: the `trainer:` passthrough to TRL's config, LoRA settings, distributed backend,
the tiny-model build, progress output."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import torch
from transformers import TrainerCallback

if TYPE_CHECKING:
    from transformers import TrainingArguments

Args = TypeVar("Args", bound="TrainingArguments")
REFUSED_ALIASES = {
    "gradient_checkpointing": "gradient_checkpointing is transformers' deprecated alias: set activation_checkpointing"
}
"""TRL fields a `trainer:` mapping may not name, and what to set instead."""


@dataclass(frozen=True)
class TrainerFields:
    """How a recipe's `trainer:` mapping becomes TRL's config (`trl.SFTConfig`, `trl.GRPOConfig`).

    The mapping goes to the config as written, over `defaults` (kgreasoner's values of TRL fields where they
    differ from TRL's, each said why where it is defined) and under the fields kgreasoner sets itself
    (`derived`: field -> the recipe setting that decides it, which a mapping naming the field is pointed to).
    A DeepSpeed path (`configs/deepspeed/...`) is resolved as every recipe path is.
    """

    config: str
    """The class name in `trl`."""
    defaults: Mapping[str, Any]
    derived: Mapping[str, str]

    def config_class(self) -> type[TrainingArguments]:
        import trl

        cls: type[TrainingArguments] = getattr(trl, self.config)
        return cls

    def fields(self) -> dict[str, dataclasses.Field[Any]]:
        return {f.name: f for f in dataclasses.fields(self.config_class()) if f.init}

    def check(self, trainer: object) -> None:
        """Refuse a mapping that is not one, names a field kgreasoner sets, or names no field of the config."""
        if not isinstance(trainer, dict):
            raise ValueError(f"trainer must be a mapping of {self.config} field names to values")
        for name in trainer:
            if name in self.derived:
                raise ValueError(f"trainer: {name} is set by kgreasoner from {self.derived[name]}; leave it out")
            if name in REFUSED_ALIASES:
                raise ValueError(f"trainer: {REFUSED_ALIASES[name]}")
        unknown = sorted(set(trainer) - set(self.fields()))
        if unknown:
            raise ValueError(f"trainer: {', '.join(map(str, unknown))} is not a field of trl.{self.config}")

    def value(self, trainer: Mapping[str, Any], name: str) -> Any:
        """The value the config gets for TRL field `name`: the mapping's, else kgreasoner's default, else TRL's."""
        if name in trainer:
            return trainer[name]
        if name in self.defaults:
            return self.defaults[name]
        spec = self.fields()[name]
        if spec.default_factory is not dataclasses.MISSING:
            return spec.default_factory()
        return spec.default

    def build(self, trainer: Mapping[str, Any], derived: Mapping[str, Any]) -> Any:
        """TRL's config of the mapping over the defaults, with the derived fields (exactly `self.derived`'s)."""
        from kgreasoner.config import resolve_recipe

        assert set(derived) == set(self.derived), sorted(set(derived) ^ set(self.derived))
        # data_seed unset would let accelerate's seedable sampler take torch's initial seed: the data order follows
        # the run's seed unless the mapping seeds it apart
        settings = {"data_seed": self.value(trainer, "seed"), **self.defaults, **trainer, **derived}
        if isinstance(settings.get("deepspeed"), str):
            settings["deepspeed"] = resolve_recipe(settings["deepspeed"])
        try:
            return self.config_class()(**settings)
        except TypeError as err:
            raise ValueError(f"trainer: {err} (fields: trl.{self.config})") from err

    def misplaced(self, key: str) -> str | None:
        """What to say of a recipe's top-level `key` that is a field of the TRL config."""
        if key in self.derived:
            return f"{key} is set by kgreasoner from {self.derived[key]}"
        if key in self.fields():
            return f"{key} is a {self.config} field: set it under trainer:"
        return None


POLICY_DTYPES = ("auto", "float32", "bfloat16")
POLICY_DTYPE_HELP = (
    "dtype the trained model's weights load in: auto (float32 for a full fine-tune outside DeepSpeed: the "
    "optimiser updates float32 master weights while trainer.bf16 runs the compute under bfloat16 autocast, "
    "mixed precision; bfloat16 with trainer.bf16 under DeepSpeed, whose optimiser keeps float32 masters of "
    "its own, and with LoRA, whose frozen base needs none (PEFT keeps the adapters in float32); float32 "
    "without trainer.bf16), float32, or bfloat16 (refused for a full fine-tune outside DeepSpeed: AdamW "
    "steps on bfloat16 weights round most updates of a small learning rate away, and nothing is learned)"
)


def policy_dtype(choice: str, bf16: bool, deepspeed: object, lora: bool) -> str:
    """The dtype a trained model's weights load in (`POLICY_DTYPE_HELP`): `choice` is the recipe's
    `policy_dtype`, the others its `trainer.bf16`, `trainer.deepspeed` and `lora.enabled`. A choice that
    cannot train is refused naming the setting."""
    if choice not in POLICY_DTYPES:
        raise ValueError(f"policy_dtype must be one of {POLICY_DTYPES}, got {choice!r}")
    masters_elsewhere = bool(deepspeed) or lora  # DeepSpeed's own float32 masters, or a frozen base
    if choice == "bfloat16" and not masters_elsewhere:
        raise ValueError(
            "policy_dtype: bfloat16 trains every weight in bfloat16 with no float32 master (no trainer.deepspeed, "
            "no lora): AdamW's updates at a small learning rate round away and nothing is learned; set "
            "policy_dtype: auto (float32 masters, bf16 autocast with trainer.bf16), or train under trainer.deepspeed"
        )
    if choice != "auto":
        return choice
    return "bfloat16" if bf16 and masters_elsewhere else "float32"


class TrainerPassthrough:
    """A recipe whose `trainer:` mapping goes to a TRL config (`TRAINER` says which and how), and which trains
    a model (`policy_dtype`, with or without `lora`)."""

    TRAINER: ClassVar[TrainerFields]
    trainer: dict[str, Any]
    policy_dtype: str
    lora: LoraSettings

    def setting(self, name: str) -> Any:
        """The value TRL's config gets for `name` (before the config exists: datasets, validation)."""
        return self.TRAINER.value(self.trainer, name)

    def weights_dtype(self) -> str:
        """The dtype the trained model's weights load in (`policy_dtype`); raises ValueError for one that cannot
        train."""
        return policy_dtype(self.policy_dtype, self.setting("bf16"), self.setting("deepspeed"), self.lora.enabled)

    @classmethod
    def misplaced_key(cls, key: str) -> str | None:
        """`kgreasoner.config.from_dict`'s hint for a top-level key the recipe does not have."""
        return cls.TRAINER.misplaced(key)


def trainer_help(config: str, example: str) -> dict[str, str]:
    """The `metadata` of a recipe's `trainer` field."""
    return {
        "help": f"fields of trl.{config}, passed as given over kgreasoner's defaults (e.g. {example}); "
        "the fields kgreasoner derives from the recipe are refused, naming the setting to change"
    }


@dataclass
class LoraSettings:
    """Low-rank adapters through PEFT; off by default (full fine-tuning)."""

    enabled: bool = field(default=False, metadata={"help": "train LoRA adapters instead of all weights"})
    r: int = field(default=16, metadata={"help": "adapter rank"})
    alpha: int = field(default=32, metadata={"help": "scaling numerator (alpha / r)"})
    dropout: float = field(default=0.05, metadata={"help": "dropout on the adapter input"})
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        metadata={"help": "module names that get adapters"},
    )

    def __post_init__(self) -> None:
        if self.r <= 0:
            raise ValueError(f"lora.r must be positive, got {self.r}")

    def peft_config(self):
        if not self.enabled:
            return None
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            task_type="CAUSAL_LM",
        )


class SamplerEpoch(TrainerCallback):
    """Give `trainer.train_sampler` (a train order seeded with the seed plus the epoch, or None) its epoch as
    each epoch begins.

    The trainer's own `set_epoch` reaches the sampler through accelerate's wrappers, except on a run resumed
    mid-epoch over several processes, where it is wrapped once more (the skip of the trained batches over the
    split between processes). The state's epoch always has the epoch as its whole part: a resumed run starts
    from the checkpoint's (1.5: the second epoch), and each epoch ends on a whole number.
    """

    def __init__(self, trainer) -> None:
        self.trainer = trainer

    def on_epoch_begin(self, args, state, control, **kwargs):
        if self.trainer.train_sampler is not None:
            self.trainer.train_sampler.set_epoch(math.floor(state.epoch))


def ddp_backend() -> str | None:
    """Under torchrun: NCCL where there are GPUs, gloo on CPU. A single process needs none."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    return "nccl" if torch.cuda.is_available() else "gloo"


def start_process_group(timeout_s: float) -> None:
    """Under torchrun, open the process group now, with `timeout_s` (the recipe's `ddp_timeout`) for its
    collectives; in one process, or when a group exists, do nothing.

    Whatever opens the group first sets its timeout for the whole run: accelerate's `PartialState` (the
    tiny-model build) opens one with torch's default, and DeepSpeed and TRL's own state then
    reuse it as it is. So a stage calls this before anything else, and a rank that waits at a barrier while
    rank 0 merges, saves or copies a model waits as long as the recipe says.
    """
    from datetime import timedelta

    backend = ddp_backend()
    if backend is None or torch.distributed.is_initialized():
        return
    if backend == "nccl":  # each rank's collectives on its own GPU, as accelerate would place them
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    torch.distributed.init_process_group(backend, timeout=timedelta(seconds=timeout_s))


def generation_context(trainer):
    """TRL's context for generating with the trainer's policy (`trl.models.unwrap_model_for_generation`), called
    as TRL's own generation calls it (`GRPOTrainer._generate_single_turn`).

    Under ZeRO-3 it gathers the whole model on every rank: the rollout engine's decoding loop runs a
    different number of forwards on each rank, which a model left sharded (layer-wise gathers, each a
    collective) cannot take, so GRPO recipes refuse `ds3_gather_for_generation: false`. Activation
    checkpointing is off while generating and comes back on with the run's own
    `activation_checkpointing_kwargs` (left out, it came back with transformers' defaults, whatever the
    run had set).
    """
    from trl.models import unwrap_model_for_generation

    return unwrap_model_for_generation(
        trainer.model_wrapped,
        trainer.accelerator,
        gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
        gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
    )


def ensure_model(model: str, tiny_model: str | None, tokenizer_texts: list[str]) -> str:
    """Return `model`, first building a tiny model there from its YAML when it does not exist yet.

    Under torchrun the main process builds and the others wait, so ranks never race on the files.
    """
    if tiny_model is None or (Path(model) / "config.json").exists():
        return model
    from accelerate import PartialState

    with PartialState().main_process_first():
        if not (Path(model) / "config.json").exists():
            from kgreasoner.config import load_config
            from kgreasoner.models import TinyModelConfig, build_tiny
            from kgreasoner.tokenizer import read_training_texts

            build_tiny(load_config(TinyModelConfig, tiny_model), read_training_texts(tokenizer_texts), model)
    return model


def last_complete_checkpoint(output_dir: str | Path) -> str | None:
    """The newest `checkpoint-N` under `output_dir` that the trainer finished writing, or None.

    A run killed while saving leaves a newer checkpoint folder without `trainer_state.json` (the
    trainer writes it last); resuming from that folder would fail, so it is passed over.
    """
    folder = Path(output_dir)
    if not folder.is_dir():
        return None
    steps = [
        (int(p.name.split("-")[1]), p)
        for p in folder.glob("checkpoint-*")
        if p.name.split("-")[1].isdigit() and (p / "trainer_state.json").is_file()
    ]
    return str(max(steps)[1]) if steps else None


def is_saved_model(folder: str | Path) -> bool:
    """True when `folder` holds a finished model (`save_final` writes `config.json` last of all)."""
    return (Path(folder) / "config.json").is_file()


def save_final(trainer, final: str | Path, base: str) -> Path:
    """Save the trained model as a full checkpoint in `final`, every rank together; returns `final`.

    The next stage (a later GRPO episode, vLLM, evaluation) loads `final` as a model. A LoRA run's
    trainer saves only its adapter, which no `from_pretrained` of a model reads; so the adapter goes
    beside it (`<final>-adapter`), and the main process merges it into `base`, the model the run
    started from, and saves the merged model. Everything is written to `<final>.partial` first and
    renamed at the end, so a run killed while saving leaves no `final` that `is_saved_model` accepts.
    """
    import shutil

    final = Path(final)
    partial = final.with_name(final.name + ".partial")
    if trainer.is_world_process_zero() and partial.exists():
        shutil.rmtree(partial)
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(partial))  # a collective under ZeRO-3: the weights are gathered for it
    if trainer.is_world_process_zero():
        if (partial / "adapter_config.json").is_file():
            from peft import PeftModel
            from transformers import AutoModelForCausalLM

            adapter = final.with_name(final.name + "-adapter")
            if adapter.exists():
                shutil.rmtree(adapter)
            partial.rename(adapter)
            merged = PeftModel.from_pretrained(
                AutoModelForCausalLM.from_pretrained(base, dtype="auto"), str(adapter)
            ).merge_and_unload()
            merged.save_pretrained(str(partial))
        trainer.model.generation_config.save_pretrained(str(partial))
        trainer.processing_class.save_pretrained(str(partial))
        if final.exists():
            shutil.rmtree(final)
        partial.rename(final)
    trainer.accelerator.wait_for_everyone()
    return final


def finish_distributed() -> None:
    """Tear down the process group torchrun's trainer opened, every rank together.

    Left to interpreter exit, the gloo group's threads can be destroyed while still joinable,
    and a rank that finished training aborts (SIGABRT) and fails the whole launch.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def show_progress() -> None:
    """Send kgreasoner's INFO lines (episode starts, ...) to stderr; other libraries stay at warnings.
    The training modules log through accelerate's logger, so under torchrun only the main process writes."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("kgreasoner").setLevel(logging.INFO)


def report(message: str) -> None:
    """Print a line the user reads (the final model's path) once, from the main process under torchrun."""
    from accelerate import PartialState

    if PartialState().is_main_process:
        print(message)
