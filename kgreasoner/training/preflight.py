"""`kgreasoner preflight CONFIG`: check a GPU recipe before anyone spends GPU hours on it.

    kgreasoner preflight configs/qwen3-8b/grpo.yaml --gpus 8 --gpu-memory 80GiB
    torchrun --nproc_per_node 8 train/grpo.py --config configs/qwen3-8b/grpo.yaml --dry-run

In order: the recipe parses (SFT or GRPO, told apart by `train_file` / `dataset`); TRL's own
config builds from it (`SFTConfig` / `GRPOConfig`, DeepSpeed JSON included); with colocated vLLM,
the GPUs split evenly into its tensor-parallel groups; the training data loads and its train split
is not empty; the model is built on the meta device from its
`config.json` (no weights, no memory); and the memory one GPU needs is estimated and compared
with `--gpu-memory`. Any failure is reported with what to change, and the command exits 1.

The estimate, per GPU, in bytes, phase by phase; the peak is the largest phase (N = GPUs,
P = parameters, T = trainable parameters). A training step holds:
- weights: P x 2 (bf16) or 4, divided by N under ZeRO-3 (LoRA adapters in fp32 outside DeepSpeed,
  as PEFT keeps them under a bf16 base; a full fine-tune outside DeepSpeed keeps fp32 masters,
  `policy_dtype`);
- gradients: T x the trained weights' bytes, divided by N under ZeRO-2 and 3;
- optimiser: under DeepSpeed, Adam's fp32 moments (8 bytes) plus, with bf16, fp32 master weights (4),
  per trainable parameter, divided by N under ZeRO-1, 2 and 3; 0 when the DeepSpeed JSON offloads it
  to the CPU; without DeepSpeed, torch's Adam: two moments in the trained parameters' dtype;
- ZeRO-3 gathering: the largest layer, twice (the one running and the one prefetched);
- GRPO's reference model (beta > 0, full fine-tuning): another copy of the weights, sharded as they are;
- activations: per token and layer, the stored layer input (hidden x 2 bytes) with gradient
  checkpointing plus one layer's working set being recomputed, or every layer's working set
  ((12 hidden + 3 MLP width) x 2 bytes) without it; the batch is `per_device_train_batch_size`
  sequences of the longest length (SFT `max_length`; GRPO `max_prompt_tokens` + every model token +
  every tool block the rollout allows + the end id);
- LM head: TRL projects through the vocabulary in tiles of `TOKEN_CHUNK_SIZE` tokens by
  `CHUNKED_LOGPROB_CHUNK_SIZE` vocabulary columns (its fused LM head, used by both trainers), so
  the logits never take batch x length x vocabulary; one tile in fp32, with its gradient;
- vLLM (GRPO, colocated): `vllm_gpu_memory_utilization` of the GPU, held all run. It must hold the
  bf16 weights (split over `vllm_tensor_parallel_size`), the activations of its profiling forward and
  the KV cache of one sequence of its whole context, which is `vllm_max_model_length` or, unset,
  the model's `max_position_embeddings`; and that context must hold the longest rollout. A KV cache
  that cannot hold the rollout batch at its longest (a rank's generation batch, times the ranks of a
  tensor-parallel group, which share one engine) is a warning, with the share that would hold it;
- CUDA context and allocator slack: `OVERHEAD_BYTES`.
With `rollout_backend: hf`, the rollouts of a step are their own phase: the trainer's state (weights,
optimiser, reference; DeepSpeed's gradient buffers), under ZeRO-3 the whole model gathered for
generation, and the KV cache of TRL's whole generation batch (per GPU: per_device_train_batch_size x
steps_per_generation rows) at the longest rollout, with the backend's buffer growth and the copy
a tool block runs on. Dev evaluation on hf is a phase of the same kind, beside vLLM's share when the run
has one: the dev curve's batches of `dev_eval.batch_size` rows when the run's backend is hf (on vLLM they
run in the engine's share), and with `dev_eval.choose_final: best_dev` each save's measurement on the whole dev
split, in batches of as many rows. Episode 1's trainer and vLLM are released before a
later episode is built, so later episodes repeat episode 1's phases (a hard episode's questions are mined
from a file episode 1 wrote, with no model).
Host memory: a DeepSpeed JSON that offloads to the CPU pins, per trainable parameter, the fp32 master
weight, Adam's two moments and the fp32 gradient partition (16 B), and with `offload_param` the weights
too; a host holds the shares of its `--gpus-per-host` ranks, compared with `--host-memory`.
It is an estimate, deliberately on the high side (every sequence at its longest).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 1024**3
OVERHEAD_BYTES = 2 * GIB
KV_CACHE_FLOOR = 0.1
"""Share of vLLM's memory that must be left for its KV cache once the weights are in."""
VLLM_BATCHED_TOKENS = 4096
"""`max_num_batched_tokens` TRL 1.16 gives its colocated engine: the size of vLLM's profiling forward,
whose activations vLLM takes out of its share before the KV cache."""
KV_BUFFER_GROWTH = 1.5
"""The hf backend's KV buffer holds up to half its filled length again as spare columns
(`rollout.hf_backend._BufferedLayer`)."""
VLLM_ROW = "vLLM (colocated)"
"""The estimate's row of the colocated engine's share, held in every phase of a vLLM run."""
GPUS_PER_HOST = 8
"""GPUs a host holds unless `--gpus-per-host` says otherwise: the ranks of one host pin their offloaded states
in that host's memory."""

DEV_EVAL, GENERATION, TRAINING = PHASES = ("dev evaluation", "hf rollouts", "training step")
"""The phases of a run, in the order GRPO goes through them: dev evaluation on hf (before the first step,
then between steps and at saves), then per step the rollouts and the loss. Later episodes repeat the steps
of episode 1, whose trainer and vLLM are released before the next is built."""


@dataclass
class Row:
    """One holder of GPU memory in one phase."""

    phase: str
    name: str
    size: float
    note: str
    held: bool = False
    """Kept from step to step by the trainer (weights, optimiser, vLLM): what a finished episode leaves
    alive until its trainer is released."""


@dataclass
class Estimate:
    """Memory of one GPU, phase by phase and row by row, against its budget; the peak is the largest phase."""

    rows: list[Row] = field(default_factory=list)
    budget: float = 0.0

    def add(self, phase: str, name: str, size: float, note: str, held: bool = False) -> None:
        self.rows.append(Row(phase, name, float(size), note, held))

    @property
    def phases(self) -> list[str]:
        """The phases with rows, in the order a run goes through them."""
        return sorted(dict.fromkeys(row.phase for row in self.rows), key=PHASES.index)

    def phase_total(self, phase: str) -> float:
        return sum(row.size for row in self.rows if row.phase == phase)

    def held(self, phase: str) -> float:
        """What the trainer of `phase` keeps between steps (and after its episode, until released)."""
        return sum(row.size for row in self.rows if row.phase == phase and row.held)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phase_total)

    @property
    def total(self) -> float:
        """The peak: the largest phase (phases never overlap)."""
        return self.phase_total(self.peak_phase)

    def table(self) -> str:
        width = max(len(row.name) for row in self.rows + [Row("", "phase total", 0, "")])
        lines = [f"{'per GPU':<{width}}  {'GiB':>8}  how"]
        for phase in self.phases:
            lines.append(f"[{phase}]")
            for row in (r for r in self.rows if r.phase == phase):
                lines.append(f"{row.name:<{width}}  {row.size / GIB:8.2f}  {row.note}")
            lines.append(f"{'phase total':<{width}}  {self.phase_total(phase) / GIB:8.2f}")
        lines.append(f"{'peak':<{width}}  {self.total / GIB:8.2f}  {self.peak_phase}, of {self.budget / GIB:.2f} GiB")
        return "\n".join(lines)


@dataclass
class Report:
    """What `preflight` found: the checks passed, the problems, and the memory estimate."""

    kind: str
    checks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """What would not stop the run but costs it (time, or a check that could not be made); `ok` ignores them."""
    estimate: Estimate | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        lines = [f"preflight ({self.kind}):"] + [f"  ok: {c}" for c in self.checks]
        if self.estimate is not None:
            lines += ["", self.estimate.table(), ""]
        lines += [f"  WARN: {w}" for w in self.warnings]
        lines += [f"  FAIL: {p}" for p in self.problems]
        lines.append("preflight passed" if self.ok else "preflight failed")
        return "\n".join(lines)


def parse_size(text: str, option: str = "--gpu-memory") -> float:
    """`80GiB`, `80GB`, `81920MiB`, `80` (GiB) -> bytes."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"{option} {text!r}: expected a size such as 80GiB or 80GB")
    unit = (match.group(2) or "GiB").upper()
    base = 1024 if "I" in unit else 1000
    return float(match.group(1)) * base ** "KMGT".index(unit[0]) * base


def recipe_kind(path: str | Path, overrides: list[str]) -> str:
    """sft when the recipe names a `train_file`, grpo when it names a `dataset`."""
    import yaml

    data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    keys = set(data) | {item.split("=", 1)[0].strip() for item in overrides}
    if "train_file" in keys:
        return "sft"
    if "dataset" in keys:
        return "grpo"
    raise ValueError(f"{path}: neither an SFT recipe (train_file) nor a GRPO recipe (dataset)")


def preflight(
    config: str | Path,
    gpus: int,
    gpu_memory: float,
    model_config: str | Path | None = None,
    overrides: list[str] | None = None,
    host_memory: float | None = None,
    gpus_per_host: int = GPUS_PER_HOST,
) -> Report:
    """Run every check of a recipe; never raises for a problem of the recipe, it reports it. `host_memory` is
    one host's CPU memory in bytes (None: unknown, so what an offload needs is a warning, not a check)."""
    from kgreasoner.config import load_config

    overrides = list(overrides or [])
    kind = recipe_kind(config, overrides)
    report = Report(kind)
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    if gpus_per_host < 1:
        raise ValueError(f"--gpus-per-host must be >= 1, got {gpus_per_host}")
    from kgreasoner.training.grpo import GRPORecipe
    from kgreasoner.training.sft import SFTRecipe

    recipe_class: type[SFTRecipe | GRPORecipe] = SFTRecipe if kind == "sft" else GRPORecipe
    recipe = load_config(recipe_class, config, overrides)
    report.checks.append(f"{config} parses as {recipe_class.__name__}")
    check_recipe(recipe, kind, gpus, gpu_memory, model_config, report, host_memory, gpus_per_host)
    return report


def check_recipe(
    recipe,
    kind: str,
    gpus: int,
    gpu_memory: float,
    model_config: str | Path | None,
    report: Report,
    host_memory: float | None = None,
    gpus_per_host: int = GPUS_PER_HOST,
) -> None:
    """The checks of `preflight` on a recipe object (`SFTRecipe` or `GRPORecipe`); the estimate lands in
    `report.estimate`. `bench/gpu_smoke.py` calls this on the recipes it trains."""
    # the meta model first: a ZeRO-3 TRL config, once built, makes `from_config` start `zero.Init`
    model = _meta_model(recipe, model_config, report)
    args = _trl_config(recipe, kind, report)
    if kind == "grpo" and args is not None and args.use_vllm:
        _check_tensor_parallel(args, gpus, report)
    _check_data(recipe, kind, report)
    if args is not None and model is not None:
        report.estimate = estimate_memory(recipe, kind, args, model, gpus, gpu_memory)
        _judge(report, recipe, kind, args, model, gpus, gpu_memory)
        _judge_host(report, recipe, kind, args, model, gpus, host_memory, gpus_per_host)


def _trl_config(recipe, kind: str, report: Report):
    try:
        if kind == "sft":
            from kgreasoner.training.sft import sft_config

            args = sft_config(recipe, has_eval=False)
        else:
            from kgreasoner.training.grpo import grpo_config

            args = grpo_config(recipe, Path(recipe.run_dir) / "episode-1", recipe.episodes[0])
    except Exception as err:  # TRL's own validation: the recipe cannot train as written
        report.problems.append(f"TRL's {'SFT' if kind == 'sft' else 'GRPO'}Config refuses the recipe: {err}")
        return None
    report.checks.append(
        f"TRL {type(args).__name__} builds" + (f" with {recipe.setting('deepspeed')}" if args.deepspeed else "")
    )
    return args


def _check_tensor_parallel(args, gpus: int, report: Report) -> None:
    """TRL cuts the ranks into colocated vLLM groups of `vllm_tensor_parallel_size` consecutive ranks and refuses a
    world size that does not divide evenly, but only once the policy and reference model are loaded."""
    tp = args.vllm_tensor_parallel_size
    if gpus % tp == 0:
        report.checks.append(f"vLLM: {gpus} GPUs make {gpus // tp} tensor-parallel group(s) of {tp}")
        return
    multiples = " or ".join(str(n) for n in (gpus // tp * tp, gpus // tp * tp + tp) if n > 0)
    divisors = ", ".join(str(n) for n in range(1, gpus + 1) if gpus % n == 0)
    report.problems.append(
        f"trainer.vllm_tensor_parallel_size {tp} does not divide the {gpus} GPUs: TRL splits the ranks into "
        f"vLLM groups of {tp} and refuses the run after loading the models; run on a multiple of {tp} GPUs "
        f"({multiples}), or set trainer.vllm_tensor_parallel_size to a divisor of {gpus} ({divisors})"
    )


def _check_data(recipe, kind: str, report: Report) -> None:
    train: Sequence[object]
    try:
        if kind == "sft":
            from kgreasoner.records.trajectories import read_warmup

            records = read_warmup(recipe.train_file)
            train = records if recipe.eval_file else [r for r in records if r.split != "dev"]
            where = recipe.train_file
        else:
            from kgreasoner.data import load_dataset

            dataset = load_dataset(recipe.dataset, split_scheme=recipe.split_scheme, seed=recipe.split_seed)
            train = dataset.split("train")[: recipe.max_questions]
            where = f"dataset {recipe.dataset!r}"
    except (OSError, ValueError) as err:
        report.problems.append(f"training data: {err}")
        return
    if not train:
        report.problems.append(f"{where}: the train split is empty")
    else:
        report.checks.append(f"{where}: {len(train)} training {'trajectories' if kind == 'sft' else 'questions'}")


def _meta_model(recipe, model_config: str | Path | None, report: Report):
    """The model on the meta device (shapes only), from `model_config` or the recipe's model."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    source = str(model_config) if model_config else recipe.model
    try:
        if Path(source).is_file():
            config = AutoConfig.from_pretrained(Path(source).parent)
        else:
            config = AutoConfig.from_pretrained(source)
    except (OSError, ValueError) as err:
        report.problems.append(
            f"model config of {recipe.model!r} not found (on a machine without the hub, pass "
            f"--model-config PATH to a config.json or its folder): {err}"
        )
        return None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if recipe.lora.enabled:
        from peft import get_peft_model

        from kgreasoner.training.vllm_weights import is_fused_expert

        try:
            model = get_peft_model(model, recipe.lora.peft_config())
        except ValueError as err:  # PEFT's own checks of the adapter settings against this model
            fused = next((name for name, _ in model.named_parameters() if is_fused_expert(name)), None)
            if fused is not None and recipe.lora.dropout and "dropout" in str(err):
                report.problems.append(
                    f"lora.dropout {recipe.lora.dropout:g}: PEFT adapts {config.model_type}'s fused MoE experts "
                    f"({fused}, ...) through its ParamWrapper, which takes no dropout ({err}): set lora.dropout: 0"
                )
            else:
                report.problems.append(f"PEFT refuses the lora settings on {config.model_type}: {err}")
            return None
    report.checks.append(
        f"{config.model_type} from {source} on the meta device: {_count(model.parameters()) / 1e9:.2f}B parameters"
    )
    return model


def _count(parameters) -> int:
    return sum(p.numel() for p in {id(p): p for p in parameters}.values())


def _deepspeed(args) -> dict[str, Any]:
    """The DeepSpeed JSON of the TRL config (its path resolved when the config was built), or nothing."""
    if not args.deepspeed:
        return {}
    if isinstance(args.deepspeed, dict):
        return args.deepspeed
    return json.loads(Path(args.deepspeed).read_text(encoding="utf-8"))


def _zero_stage(ds: dict[str, Any]) -> int:
    return int((ds.get("zero_optimization") or {}).get("stage", 0))


def _offloaded(ds: dict[str, Any], what: str) -> bool:
    target = (ds.get("zero_optimization") or {}).get(f"offload_{what}") or {}
    return target.get("device") in ("cpu", "nvme")


def sequence_tokens(recipe, kind: str) -> int:
    """The longest sequence one training row can be (for GRPO also the context vLLM needs)."""
    if kind == "sft":
        return int(recipe.setting("max_length"))
    from kgreasoner.rollout.types import sequence_tokens as rollout_sequence_tokens

    return rollout_sequence_tokens(recipe.rollout, recipe.max_prompt_tokens)


def generation_rows(recipe, args, gpus: int) -> int:
    """Rows one rank generates in one batch: TRL's generation batch (by default per_device_train_batch_size x
    steps_per_generation, with steps_per_generation = gradient_accumulation_steps) split over the ranks."""
    if "generation_batch_size" in recipe.trainer:  # a global size: TRL divides it by the processes
        return math.ceil(args.generation_batch_size / gpus)
    return args.per_device_train_batch_size * args.steps_per_generation


def vllm_max_model_len(args, config) -> int:
    """The context vLLM is built with: `vllm_max_model_length`, or when unset the model's own
    `max_position_embeddings`, which vLLM then takes (131,072 tokens for Llama 3.1)."""
    return int(getattr(args, "vllm_max_model_length", None) or config.max_position_embeddings)


def estimate_memory(recipe, kind: str, args, model, gpus: int, gpu_memory: float) -> Estimate:
    """Bytes one GPU needs for this recipe, phase by phase (see the module docstring for the accounting)."""
    from kgreasoner.training.trl_internals import CHUNKED_LOGPROB_CHUNK_SIZE, TOKEN_CHUNK_SIZE

    config = _base(model).config
    estimate = Estimate(budget=gpu_memory)
    ds = _deepspeed(args)
    stage = _zero_stage(ds)
    # the weights as they load (`policy_dtype`), or as DeepSpeed casts the whole module with bf16
    width = 2 if recipe.weights_dtype() == "bfloat16" or (ds and args.bf16) else 4
    total = _count(model.parameters())
    trainable = _count(p for p in model.parameters() if p.requires_grad)
    # PEFT keeps adapters in float32 under a bf16 base; DeepSpeed casts the whole module to its dtype
    trained_width = 4 if recipe.lora.enabled and not ds else width
    shard3 = gpus if stage >= 3 else 1
    zero = f"ZeRO-{stage}" if stage else "no ZeRO"
    by = f" / {gpus}" if shard3 > 1 else ""
    held = [
        (
            "weights",
            ((total - trainable) * width + trainable * trained_width) / shard3,
            f"{total / 1e9:.2f}B x {width} B"
            + (f" (adapters x {trained_width} B)" if trained_width != width else "")
            + by,
        )
    ]
    grad_shard = gpus if stage >= 2 else 1
    held.append(
        (
            "gradients",
            trainable * trained_width / grad_shard,
            f"{trainable / 1e9:.2f}B trainable x {trained_width} B" + (f" / {gpus}" if grad_shard > 1 else ""),
        )
    )
    if _offloaded(ds, "optimizer"):
        held.append(("optimiser", 0.0, "offloaded to the CPU by the DeepSpeed JSON"))
    elif ds:
        per = 8 + (4 if args.bf16 else 0)
        opt_shard = gpus if stage >= 1 else 1
        held.append(
            (
                "optimiser",
                trainable * per / opt_shard,
                f"DeepSpeed Adam: {per} B per trainable parameter" + (f" / {gpus} ({zero})" if opt_shard > 1 else ""),
            )
        )
    else:
        held.append(
            (
                "optimiser",
                trainable * 2 * trained_width,
                f"torch Adam: two moments in the parameters' dtype ({2 * trained_width} B each)",
            )
        )
    if kind == "grpo" and args.beta > 0 and not recipe.lora.enabled:
        held.append(("reference model", total * width / shard3, f"beta {args.beta:g}: a frozen copy{by}"))
    if kind == "grpo" and args.use_vllm:
        share = args.vllm_gpu_memory_utilization
        context = vllm_max_model_len(args, config)
        held.append(
            (
                VLLM_ROW,
                share * gpu_memory,
                f"vllm_gpu_memory_utilization {share:g}: bf16 weights, KV cache for a {context}-token context",
            )
        )
    for name, size, note in held:
        estimate.add(TRAINING, name, size, note, held=True)

    hidden, layers = config.hidden_size, config.num_hidden_layers
    per_token = (12 * hidden + 3 * _mlp_width(config)) * 2  # one layer's working set, bf16
    if stage >= 3:
        largest = max(_count(m.parameters()) for m in _layers(model))
        estimate.add(TRAINING, "ZeRO-3 gathered", 2 * largest * width, f"largest layer ({largest / 1e6:.0f}M) twice")
    tokens = args.per_device_train_batch_size * sequence_tokens(recipe, kind)
    if args.activation_checkpointing:
        estimate.add(
            TRAINING,
            "activations",
            tokens * hidden * 2 * layers + tokens * per_token,
            f"{tokens} tokens: layer inputs kept, one layer recomputed (checkpointing)",
        )
    else:
        estimate.add(
            TRAINING,
            "activations",
            tokens * per_token * layers,
            f"{tokens} tokens x {layers} layers (no checkpointing)",
        )
    vocab_tile = min(CHUNKED_LOGPROB_CHUNK_SIZE, config.vocab_size)
    estimate.add(
        TRAINING,
        "LM head tile",
        2 * min(TOKEN_CHUNK_SIZE, tokens) * vocab_tile * 4,
        f"TRL's fused head: {min(TOKEN_CHUNK_SIZE, tokens)} tokens x {vocab_tile} columns, fp32, with grad",
    )
    estimate.add(TRAINING, "CUDA context, slack", OVERHEAD_BYTES, "fixed")

    if kind == "grpo" and not args.use_vllm:
        rows = generation_rows(recipe, args, gpus)
        _hf_generation_rows(
            estimate,
            GENERATION,
            rows,
            "the generation batch",
            recipe,
            args,
            config,
            held,
            total * width,
            stage,
            per_token,
        )
    if kind == "grpo" and hf_dev_rows(recipe, gpus):
        rows, what = max(hf_dev_rows(recipe, gpus))
        _hf_generation_rows(
            estimate, DEV_EVAL, rows, what, recipe, args, config, held, total * width, stage, per_token
        )
    return estimate


def hf_dev_rows(recipe, gpus: int) -> list[tuple[int, str]]:
    """The batches a rank's dev evaluation rolls out on the hf backend, as (rows, what): the dev curve's
    (`DevEval`) and, with `dev_eval.choose_final: best_dev`, each save's measurement on the whole dev split
    (`BestKeeper`), both in calls of at most `dev_eval.batch_size` rows through the run's backend (on vLLM they
    run in the engine's share). The whole split's calls are counted full: a dev split of CWQ's size gives every
    rank more questions than one call takes."""
    return _dev_rows(recipe, gpus) if recipe.dev_eval.steps and recipe.rollout_backend == "hf" else []


def _dev_rows(recipe, gpus: int) -> list[tuple[int, str]]:
    """The batches a rank's dev evaluation rolls out, as (rows, what), on whichever backend the run has."""
    size = recipe.dev_eval.batch_size
    rows = min(size, math.ceil(recipe.dev_eval.questions / gpus))
    batches = [(rows, f"dev_eval.batch_size {size}, of {recipe.dev_eval.questions} dev questions")]
    if recipe.dev_eval.final == "best_dev":
        batches.append(
            (size, f"dev_eval.choose_final: best_dev measures each save on the whole dev split, {size} a call")
        )
    return batches


def _hf_generation_rows(
    estimate: Estimate,
    phase: str,
    rows: int,
    what: str,
    recipe,
    args,
    config,
    held,
    full_weights: float,
    stage: int,
    per_token: int,
) -> None:
    """Rolling out `rows` rows at once on the hf backend (a step's rollouts, or a dev-evaluation batch): the
    trainer's state (and vLLM's share when the run has one), the batch's KV cache, and under ZeRO-3 the full
    weights, which `unwrap_model_for_generation` gathers for the whole generation."""
    for name, size, note in held:
        # outside DeepSpeed the trainer frees the gradients after each optimiser step (set to None)
        if name != "gradients" or args.deepspeed:
            estimate.add(phase, name, size, note, held=True)
    if stage >= 3:
        estimate.add(phase, "ZeRO-3 gathered", full_weights, "the whole model, gathered for generation")
    columns = sequence_tokens(recipe, "grpo") + recipe.rollout.compact_slack
    kv = _kv_bytes(config)
    estimate.add(
        phase,
        "hf rollout KV cache",
        rows * columns * kv * KV_BUFFER_GROWTH,
        f"{rows} rows ({what}) x {columns} columns, x {KV_BUFFER_GROWTH:g} buffer growth",
    )
    if recipe.rollout.max_turns and rows > 1:
        estimate.add(
            phase,
            "tool-block cache copy",
            (rows - 1) * columns * kv,
            "the calling rows' cache, copied to run a tool block",
        )
    forward = rows * max(recipe.max_prompt_tokens, recipe.rollout.max_tool_tokens)
    estimate.add(
        phase,
        "rollout forward",
        forward * per_token + rows * config.vocab_size * 4 * 4,
        f"{forward} prompt tokens through one layer; sampling logits",
    )
    estimate.add(phase, "CUDA context, slack", OVERHEAD_BYTES, "fixed")


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def _layers(model):
    """The modules ZeRO-3 gathers one at a time: the decoder layers and the embeddings."""
    base = _base(model)
    yield base.get_input_embeddings()
    if base.get_output_embeddings() is not None:
        yield base.get_output_embeddings()
    yield from base.model.layers


def _mlp_width(config) -> int:
    """The MLP width a token goes through (a MoE token: its experts' widths together)."""
    experts = getattr(config, "num_experts_per_tok", None)
    if experts and getattr(config, "moe_intermediate_size", None):
        return int(config.moe_intermediate_size) * int(experts)
    return int(config.intermediate_size)


def _kv_bytes(config, tensor_parallel: int = 1) -> int:
    """bf16 keys and values of one token, all layers, on one of `tensor_parallel` ranks (vLLM splits the
    key/value heads over them, replicating them when there are fewer heads than ranks)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    heads = max(1, config.num_key_value_heads // tensor_parallel)
    return 2 * config.num_hidden_layers * heads * head_dim * 2


def _judge(report: Report, recipe, kind: str, args, model, gpus: int, gpu_memory: float) -> None:
    estimate = report.estimate
    assert estimate is not None, "judged after the estimate"
    if kind == "grpo" and args.use_vllm:
        _judge_vllm(report, recipe, args, model, gpus, gpu_memory)
    if estimate.total > gpu_memory:
        hints = []
        peak = estimate.peak_phase
        if peak == GENERATION:
            rows = generation_rows(recipe, args, gpus)
            hints.append(
                f"a smaller generation batch ({rows} rows a GPU: trainer.per_device_train_batch_size x "
                "trainer.gradient_accumulation_steps, or trainer.steps_per_generation)"
            )
            hints.append("rollout_backend: vllm")
        if peak == DEV_EVAL:  # on hf only: on vLLM dev evaluation runs in the engine's share
            hints.append(f"a smaller dev_eval.batch_size (now {recipe.dev_eval.batch_size})")
            hints.append("rollout_backend: vllm (dev evaluation then runs in vLLM's share)")
            hints.append("dev_eval.steps: 0 (no dev evaluation)")
        if _zero_stage(_deepspeed(args)) < 3:
            hints.append("trainer.deepspeed: configs/deepspeed/zero3.json (shards weights, gradients and optimiser)")
        if not _offloaded(_deepspeed(args), "optimizer"):
            hints.append("a DeepSpeed JSON that offloads the optimiser (configs/deepspeed/zero3-offload.json)")
        if peak == TRAINING and not args.activation_checkpointing:
            hints.append("trainer.activation_checkpointing: true")
        if peak == TRAINING and args.per_device_train_batch_size > 1:
            hints.append(
                f"a smaller trainer.per_device_train_batch_size (now {args.per_device_train_batch_size}) with a "
                "larger trainer.gradient_accumulation_steps"
            )
        if not recipe.lora.enabled:
            hints.append("lora.enabled: true")
        hints.append(f"more GPUs than {gpus}")
        report.problems.append(
            f"the recipe needs {estimate.total / GIB:.1f} GiB per GPU (peak: {estimate.peak_phase}) but a GPU has "
            f"{gpu_memory / GIB:.1f} GiB ({gpus} GPUs); change one of: " + "; ".join(hints)
        )
    else:
        report.checks.append(
            f"fits: {estimate.total / GIB:.1f} of {gpu_memory / GIB:.1f} GiB per GPU on {gpus} GPUs "
            f"(peak: {estimate.peak_phase})"
        )


def _judge_vllm(report: Report, recipe, args, model, gpus: int, gpu_memory: float) -> None:
    """vLLM starts only when its share holds the bf16 weights, its profiling forward and the KV cache of one
    sequence of its whole context; the rollout's sequences must fit that context. Once it starts, a KV cache
    smaller than the rollout batch at its longest is a warning (`_judge_vllm_batch`)."""
    config = _base(model).config
    weights = _count(_base(model).parameters()) * 2  # vLLM serves bf16 weights, whole, split only by its own TP
    tp = args.vllm_tensor_parallel_size
    share = args.vllm_gpu_memory_utilization * gpu_memory
    if weights / tp > share * (1 - KV_CACHE_FLOOR):
        need = math.ceil(weights / tp / (1 - KV_CACHE_FLOOR) / gpu_memory * 100) / 100
        report.problems.append(
            f"vLLM's share ({share / GIB:.1f} GiB) cannot hold the bf16 weights ({weights / tp / GIB:.1f} GiB per "
            f"GPU at vllm_tensor_parallel_size {tp}) and a KV cache: raise trainer.vllm_gpu_memory_utilization "
            f"to at least {need:g}, or raise trainer.vllm_tensor_parallel_size"
        )
        return
    context = vllm_max_model_len(args, config)
    rollout = sequence_tokens(recipe, "grpo")
    profile = VLLM_BATCHED_TOKENS * (12 * config.hidden_size + 3 * _mlp_width(config)) * 2 // tp
    room = share - weights / tp - profile
    one = context * _kv_bytes(config, tp)
    unset = (
        ""
        if getattr(args, "vllm_max_model_length", None)
        else " (vllm_max_model_length unset: vLLM takes the model's max_position_embeddings)"
    )
    if one > room:
        need = math.ceil((weights / tp + profile + one) / gpu_memory * 100) / 100
        report.problems.append(
            f"vLLM cannot start: its share ({share / GIB:.1f} GiB) less the bf16 weights "
            f"({weights / tp / GIB:.1f} GiB "
            f"per GPU at vllm_tensor_parallel_size {tp}) and its {VLLM_BATCHED_TOKENS}-token profiling forward "
            f"({profile / GIB:.1f} GiB) leaves {room / GIB:.1f} GiB of KV cache, and one sequence of its "
            f"{context}-token context{unset} needs {one / GIB:.1f} GiB: give vLLM the rollout's {rollout}-token "
            f"context (vllm_max_model_length), or raise trainer.vllm_gpu_memory_utilization to at least {need:g}"
        )
    elif context < rollout:
        report.problems.append(
            f"vLLM's context ({context} tokens, vllm_max_model_length) is shorter than a rollout may grow "
            f"({rollout} = max_prompt_tokens {recipe.max_prompt_tokens} + rollout.max_new_tokens + "
            f"rollout.max_turns x rollout.max_tool_tokens + 1): those rollouts would end in an error"
        )
    else:
        report.checks.append(
            f"vLLM: one {context}-token sequence ({one / GIB:.2f} GiB of KV) fits the "
            f"{room / GIB:.1f} GiB its share leaves after the weights"
        )
        _judge_vllm_batch(report, recipe, args, config, gpus, gpu_memory, weights / tp + profile)


def vllm_rows(recipe, args, gpus: int) -> tuple[int, str]:
    """Rows one rank hands the colocated engine at once, and where they come from: TRL's generation batch, or a
    dev batch when that is larger (dev evaluation runs on vLLM when the run does; the whole dev split's
    measurement of `dev_eval.choose_final: best_dev` is counted in full calls, as in `hf_dev_rows`)."""
    rows = generation_rows(recipe, args, gpus)
    what = (
        f"the generation batch: trainer.per_device_train_batch_size {args.per_device_train_batch_size} x "
        f"steps_per_generation {args.steps_per_generation}"
    )
    if "generation_batch_size" in recipe.trainer:
        what = f"the generation batch: trainer.generation_batch_size {args.generation_batch_size} / {gpus} GPUs"
    if recipe.dev_eval.steps:
        dev = max(n for n, _ in _dev_rows(recipe, gpus))
        if dev > rows:
            return dev, f"a dev batch: dev_eval.batch_size {recipe.dev_eval.batch_size}"
    return rows, what


def _judge_vllm_batch(report: Report, recipe, args, config, gpus: int, gpu_memory: float, fixed: float) -> None:
    """Warn when vLLM's KV cache cannot hold the rows of a rollout batch at their longest (the engine of a
    tensor-parallel group serves the rows of all its ranks, each GPU holding its share of the key/value heads):
    vLLM then preempts rows and recomputes them. Names the share that holds them, when the GPU has room for it
    beside the rest of every phase vLLM is alive in, else the largest share that fits."""
    tp = args.vllm_tensor_parallel_size
    share = args.vllm_gpu_memory_utilization
    kv = _kv_bytes(config, tp)
    rollout = sequence_tokens(recipe, "grpo")
    rows, what = vllm_rows(recipe, args, gpus)
    engine_rows = rows * tp
    need = engine_rows * rollout * kv
    room = share * gpu_memory - fixed
    if need <= room:
        report.checks.append(
            f"vLLM: its KV cache ({room / GIB:.1f} GiB, {int(room // kv):,} tokens) holds a rollout batch at its "
            f"longest ({engine_rows} rows x {rollout} tokens = {engine_rows * rollout:,} tokens, {need / GIB:.1f} GiB)"
        )
        return
    per_engine = f" x {tp} ranks per engine (vllm_tensor_parallel_size)" if tp > 1 else ""
    arithmetic = (
        f"vLLM's KV cache holds {int(room // kv):,} tokens: vllm_gpu_memory_utilization {share:g} x "
        f"{gpu_memory / GIB:.1f} GiB = {share * gpu_memory / GIB:.1f} GiB, less {fixed / GIB:.1f} GiB of bf16 weights "
        f"and profiling forward, leaves {room / GIB:.1f} GiB at {kv / 1024:g} KiB a token; a rollout batch is {rows} "
        f"rows a GPU ({what}){per_engine} = {engine_rows} rows x {rollout} tokens = {engine_rows * rollout:,} tokens "
        f"({need / GIB:.1f} GiB) at their longest, so vLLM preempts rows and recomputes them"
    )
    estimate = report.estimate
    assert estimate is not None, "judged after the estimate"
    alive = [p for p in estimate.phases if any(r.phase == p and r.name == VLLM_ROW for r in estimate.rows)]
    rest = max(estimate.phase_total(p) - _row(estimate, p, VLLM_ROW) for p in alive)
    fits = math.floor((gpu_memory - rest) / gpu_memory * 100) / 100  # the largest share beside the rest
    wanted = math.ceil((fixed + need) / gpu_memory * 100) / 100
    if wanted <= fits:
        advice = (
            f"raise trainer.vllm_gpu_memory_utilization to {wanted:g} ({wanted:g} x {gpu_memory / GIB:.1f} GiB = "
            f"{wanted * gpu_memory / GIB:.1f} GiB; the GPU then holds {(rest + wanted * gpu_memory) / GIB:.1f} of "
            f"{gpu_memory / GIB:.1f} GiB at its peak)"
        )
    else:
        held = max(0, int((fits * gpu_memory - fixed) // (rollout * kv)))
        advice = (
            f"holding them takes a share of {wanted:g}, and the GPU has room for at most {fits:g} beside the "
            f"{rest / GIB:.1f} GiB of the rest of its peak (at {fits:g}: {held} rows at their longest); "
            "change one of: trainer.vllm_gpu_memory_utilization (up to that), fewer rows a generation "
            "(trainer.per_device_train_batch_size x trainer.gradient_accumulation_steps, or "
            "trainer.steps_per_generation)"
        )
        if tp == 1:
            advice += ", trainer.vllm_tensor_parallel_size 2 (halves the weights vLLM holds on a GPU)"
    report.warnings.append(f"{arithmetic}: {advice}")


def _row(estimate: Estimate, phase: str, name: str) -> float:
    return sum(row.size for row in estimate.rows if row.phase == phase and row.name == name)


def host_offload(recipe, kind: str, args, model) -> list[tuple[str, float, str]]:
    """What ZeRO's CPU offload keeps in pinned host memory for the whole run, all ranks together, as (what, bytes,
    how): with `offload_optimizer`, per trainable parameter its fp32 master weight,
    Adam's two fp32 moments and the fp32 gradient partition it reduces into (16 B, DeepSpeed's own
    `estimate_zero3_model_states_mem_needs` figure); with `offload_param`, the bf16 (or fp32) weights of the policy
    and of GRPO's reference model. Offload to NVMe keeps only buffers in host memory and is not counted."""
    ds = _deepspeed(args)
    zero = ds.get("zero_optimization") or {}
    rows: list[tuple[str, float, str]] = []
    if (zero.get("offload_optimizer") or {}).get("device") == "cpu":
        trainable = _count(p for p in model.parameters() if p.requires_grad)
        rows.append(
            (
                "optimiser",
                trainable * 16.0,
                f"{trainable / 1e9:.2f}B trainable x 16 B (fp32 master 4, Adam moments 8, fp32 gradients 4)",
            )
        )
    if (zero.get("offload_param") or {}).get("device") == "cpu":
        total = _count(model.parameters())
        width = 2 if args.bf16 else 4
        copies = 2 if kind == "grpo" and args.beta > 0 and not recipe.lora.enabled else 1
        rows.append(
            (
                "weights",
                total * width * copies,
                f"{total / 1e9:.2f}B x {width} B" + (" (policy and reference model)" if copies == 2 else ""),
            )
        )
    return rows


def _judge_host(
    report: Report, recipe, kind: str, args, model, gpus: int, host_memory: float | None, gpus_per_host: int
) -> None:
    """The pinned host memory a CPU offload needs on the fullest host, against `host_memory`."""
    rows = host_offload(recipe, kind, args, model)
    if not rows:
        return
    on_host = min(gpus, gpus_per_host)
    need = sum(size for _, size, _ in rows) * on_host / gpus
    share = "" if on_host == gpus else f" x {on_host}/{gpus} GPUs on a host"
    how = " + ".join(f"{what}: {note}" for what, _, note in rows)
    zero = _deepspeed(args).get("zero_optimization") or {}
    pinned = any((zero.get(f"offload_{what}") or {}).get("pin_memory") for what in ("optimizer", "param"))
    figure = (
        f"the DeepSpeed JSON ({recipe.setting('deepspeed')}) offloads to the CPU {need / GIB:.1f} GiB "
        f"{'(pinned) ' if pinned else ''}per host ({how}{share})"
    )
    if host_memory is None:
        report.warnings.append(f"host memory not checked (pass --host-memory): {figure}")
    elif need > host_memory:
        hints = [f"more hosts than {math.ceil(gpus / gpus_per_host)} ({gpus} GPUs, --gpus-per-host {gpus_per_host})"]
        if not recipe.lora.enabled:
            hints.append("lora.enabled: true (the optimiser's states then cover only the adapters)")
        hints.append(
            "a DeepSpeed JSON that keeps the optimiser on the GPUs (configs/deepspeed/zero3.json), if they hold it"
        )
        report.problems.append(
            f"{figure}, more than a host's {host_memory / GIB:.1f} GiB (--host-memory); change one of: "
            + "; ".join(hints)
        )
    else:
        report.checks.append(f"host memory: {need / GIB:.1f} of {host_memory / GIB:.1f} GiB per host: {figure}")


def default_gpus() -> int:
    import torch

    return int(os.environ.get("WORLD_SIZE") or torch.cuda.device_count() or 1)


def default_gpu_memory() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_properties(0).total_memory / GIB:.2f}GiB"
    return "80GiB"


def default_host_memory() -> float | None:
    """This machine's memory when it has a GPU (a training host); None elsewhere."""
    import torch

    if torch.cuda.is_available():
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    return None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gpus", type=int, default=None, help="GPUs the run uses (default: WORLD_SIZE, else the GPUs here, else 1)"
    )
    parser.add_argument(
        "--gpu-memory",
        default=None,
        help="memory of one GPU, e.g. 80GiB (default: this machine's first GPU, else 80GiB)",
    )
    parser.add_argument(
        "--host-memory",
        default=None,
        help="CPU memory of one host, e.g. 1TiB or 1024 (GiB), against what a DeepSpeed CPU offload pins there "
        "(default: this machine's when it has a GPU; elsewhere the figure is a warning)",
    )
    parser.add_argument(
        "--gpus-per-host",
        type=int,
        default=GPUS_PER_HOST,
        help=f"GPUs on one host: its ranks pin their offloaded states in its memory (default {GPUS_PER_HOST})",
    )
    parser.add_argument(
        "--model-config",
        type=Path,
        default=None,
        help="config.json (or its folder) to build the model from instead of the recipe's model "
        "(for machines without the hub, or before the warm-up checkpoint exists)",
    )


def run_preflight(config: str | Path, overrides: list[str], args: argparse.Namespace) -> int:
    report = preflight(
        config,
        args.gpus or default_gpus(),
        parse_size(args.gpu_memory or default_gpu_memory()),
        args.model_config,
        overrides,
        parse_size(args.host_memory, "--host-memory") if args.host_memory else default_host_memory(),
        args.gpus_per_host,
    )
    print(report.render(), file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "preflight",
        help="check a GPU recipe (TRL config, data, model, memory per GPU) before training",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("recipe", type=Path, help="an SFT or GRPO recipe YAML (configs/*/sft.yaml, grpo.yaml)")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a recipe field (dotted keys for nested ones)",
    )
    add_arguments(parser)
    parser.set_defaults(func=lambda args: run_preflight(args.recipe, args.overrides, args))
