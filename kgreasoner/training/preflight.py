"""`kgreasoner preflight CONFIG`: check a GPU recipe before anyone spends GPU hours on it.

    kgreasoner preflight configs/qwen3-8b/grpo.yaml --gpus 8 --gpu-memory 80GiB
    torchrun --nproc_per_node 8 train/grpo.py --config configs/qwen3-8b/grpo.yaml --dry-run

In order: the recipe parses (SFT or GRPO, told apart by `train_file` / `dataset`); TRL's own
config builds from it (`SFTConfig` / `GRPOConfig`, DeepSpeed JSON included); the training data
loads and its train split is not empty; the model is built on the meta device from its
`config.json` (no weights, no memory); and the memory one GPU needs is estimated and compared
with `--gpu-memory`. Any failure is reported with what to change, and the command exits 1.

The estimate, per GPU, in bytes (N = GPUs, P = parameters, T = trainable parameters):
- weights: P x 2 (bf16) or 4, divided by N under ZeRO-3;
- gradients: T x the weight bytes, divided by N under ZeRO-2 and 3;
- optimiser: Adam's fp32 moments (8 bytes) plus, with bf16, fp32 master weights (4), per trainable
  parameter, divided by N under ZeRO-1, 2 and 3; 0 when the DeepSpeed JSON offloads it to the CPU;
- ZeRO-3 gathering: the largest layer, twice (the one running and the one prefetched);
- GRPO's reference model (beta > 0, full fine-tuning): another copy of the weights, sharded as they are;
- activations: per token and layer, the stored layer input (hidden x 2 bytes) with gradient
  checkpointing plus one layer's working set being recomputed, or every layer's working set
  ((12 hidden + 3 MLP width) x 2 bytes) without it; the batch is `per_device_train_batch_size`
  sequences of the longest length (SFT `max_length`; GRPO `PROMPT_TOKENS` + every model token +
  every tool block the rollout allows);
- LM head: TRL projects through the vocabulary in tiles of `TOKEN_CHUNK_SIZE` tokens by
  `_CHUNKED_LOGPROB_CHUNK_SIZE` vocabulary columns (its fused LM head, used by both trainers), so
  the logits never take batch x length x vocabulary; one tile in fp32, with its gradient;
- vLLM (GRPO, colocated): `vllm_gpu_memory_utilization` of the GPU, which must itself hold the
  bf16 weights (split over `vllm_tensor_parallel_size`) with room for a KV cache;
- hf rollouts (GRPO, `rollout_backend: hf`): the KV cache of a generation batch;
- CUDA context and allocator slack: `OVERHEAD_BYTES`.
It is an estimate, deliberately on the high side (every sequence at its longest).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

GIB = 1024 ** 3
OVERHEAD_BYTES = 2 * GIB
PROMPT_TOKENS = 512
"""Prompt budget of a GRPO sequence: the protocol's system prompt (~300 tokens with Qwen3's
template) plus the question and topic entities."""
KV_CACHE_FLOOR = 0.1
"""Share of vLLM's memory that must be left for its KV cache once the weights are in."""


@dataclass
class Estimate:
    """Memory of one GPU, row by row, against its budget."""

    rows: list[tuple[str, float, str]] = field(default_factory=list)
    """(what, bytes, how it was counted)."""
    budget: float = 0.0

    def add(self, name: str, size: float, note: str) -> None:
        self.rows.append((name, float(size), note))

    @property
    def total(self) -> float:
        return sum(size for _, size, _ in self.rows)

    def table(self) -> str:
        width = max(len(name) for name, _, _ in self.rows + [("total", 0, "")])
        lines = [f"{'per GPU':<{width}}  {'GiB':>8}  how"]
        for name, size, note in self.rows:
            lines.append(f"{name:<{width}}  {size / GIB:8.2f}  {note}")
        lines.append(f"{'total':<{width}}  {self.total / GIB:8.2f}  of {self.budget / GIB:.2f} GiB")
        return "\n".join(lines)


@dataclass
class Report:
    """What `preflight` found: the checks passed, the problems, and the memory estimate."""

    kind: str
    checks: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    estimate: Estimate | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def render(self) -> str:
        lines = [f"preflight ({self.kind}):"] + [f"  ok: {c}" for c in self.checks]
        if self.estimate is not None:
            lines += ["", self.estimate.table(), ""]
        lines += [f"  FAIL: {p}" for p in self.problems]
        lines.append("preflight passed" if self.ok else "preflight failed")
        return "\n".join(lines)


def parse_size(text: str) -> float:
    """`80GiB`, `80GB`, `81920MiB`, `80` (GiB) -> bytes."""
    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"--gpu-memory {text!r}: expected a size such as 80GiB or 80GB")
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


def preflight(config: str | Path, gpus: int, gpu_memory: float, model_config: str | Path | None = None,
              overrides: list[str] | None = None) -> Report:
    """Run every check of a recipe; never raises for a problem of the recipe, it reports it."""
    from kgreasoner.config import load_config

    overrides = list(overrides or [])
    kind = recipe_kind(config, overrides)
    report = Report(kind)
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    if kind == "sft":
        from kgreasoner.training.sft import SFTRecipe as Recipe
    else:
        from kgreasoner.training.grpo import GRPORecipe as Recipe
    recipe = load_config(Recipe, config, overrides)
    report.checks.append(f"{config} parses as {Recipe.__name__}")
    # the meta model first: a ZeRO-3 TRL config, once built, makes `from_config` start `zero.Init`
    model = _meta_model(recipe, model_config, report)
    args = _trl_config(recipe, kind, report)
    _check_data(recipe, kind, report)
    if args is not None and model is not None:
        report.estimate = estimate_memory(recipe, kind, args, model, gpus, gpu_memory)
        _judge(report, recipe, kind, args, model, gpus, gpu_memory)
    return report


def _trl_config(recipe, kind: str, report: Report):
    try:
        if kind == "sft":
            from kgreasoner.training.sft import sft_config

            args = sft_config(recipe, has_eval=False)
        else:
            from kgreasoner.training.grpo import grpo_config

            args = grpo_config(recipe, Path(recipe.output_dir) / "episode-1", recipe.episodes[0])
    except Exception as err:  # TRL's own validation: the recipe cannot train as written
        report.problems.append(f"TRL's {'SFT' if kind == 'sft' else 'GRPO'}Config refuses the recipe: {err}")
        return None
    report.checks.append(f"TRL {type(args).__name__} builds" + (f" with {recipe.deepspeed}" if recipe.deepspeed else ""))
    return args


def _check_data(recipe, kind: str, report: Report) -> None:
    try:
        if kind == "sft":
            from kgreasoner.data.trajectories import read_warmup

            records = read_warmup(recipe.train_file)
            train = records if recipe.eval_file else [r for r in records if r.split != "dev"]
            where = recipe.train_file
        else:
            from kgreasoner.data import load_dataset

            dataset = load_dataset(recipe.dataset, scheme=recipe.split_scheme, seed=recipe.split_seed)
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
        report.problems.append(f"model config of {recipe.model!r} not found (on a machine without the hub, pass "
                               f"--model-config PATH to a config.json or its folder): {err}")
        return None
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    if recipe.lora.enabled:
        from peft import get_peft_model

        model = get_peft_model(model, recipe.lora.peft_config())
    report.checks.append(f"{config.model_type} from {source} on the meta device: "
                         f"{_count(model.parameters()) / 1e9:.2f}B parameters")
    return model


def _count(parameters) -> int:
    return sum(p.numel() for p in {id(p): p for p in parameters}.values())


def _deepspeed(recipe) -> dict[str, Any]:
    if not recipe.deepspeed:
        return {}
    return json.loads(Path(recipe.deepspeed).read_text(encoding="utf-8"))


def _zero_stage(ds: dict[str, Any]) -> int:
    return int((ds.get("zero_optimization") or {}).get("stage", 0))


def _offloaded(ds: dict[str, Any], what: str) -> bool:
    target = (ds.get("zero_optimization") or {}).get(f"offload_{what}") or {}
    return target.get("device") in ("cpu", "nvme")


def sequence_tokens(recipe, kind: str) -> int:
    """The longest sequence one training row can be."""
    if kind == "sft":
        return recipe.max_length
    rollout = recipe.rollout
    return PROMPT_TOKENS + rollout.max_new_tokens + rollout.max_turns * rollout.max_tool_tokens


def estimate_memory(recipe, kind: str, args, model, gpus: int, gpu_memory: float) -> Estimate:
    """Bytes one GPU needs for this recipe (see the module docstring for the accounting)."""
    from kgreasoner.training.trl_internals import TOKEN_CHUNK_SIZE
    from kgreasoner.training.trl_internals import CHUNKED_LOGPROB_CHUNK_SIZE as _CHUNKED_LOGPROB_CHUNK_SIZE

    config = model.config if not hasattr(model, "get_base_model") else model.get_base_model().config
    estimate = Estimate(budget=gpu_memory)
    ds = _deepspeed(recipe)
    stage = _zero_stage(ds)
    bf16 = bool(recipe.bf16)
    width = 2 if bf16 else 4
    total = _count(model.parameters())
    trainable = _count(p for p in model.parameters() if p.requires_grad)
    shard3 = gpus if stage >= 3 else 1
    zero = f"ZeRO-{stage}" if stage else "no ZeRO"
    estimate.add("weights", total * width / shard3, f"{total / 1e9:.2f}B x {width} B" + (f" / {gpus}" if shard3 > 1 else ""))
    grad_shard = gpus if stage >= 2 else 1
    estimate.add("gradients", trainable * width / grad_shard,
                 f"{trainable / 1e9:.2f}B trainable x {width} B" + (f" / {gpus}" if grad_shard > 1 else ""))
    if _offloaded(ds, "optimizer"):
        estimate.add("optimiser", 0.0, "offloaded to the CPU by the DeepSpeed JSON")
    else:
        per = 8 + (4 if bf16 else 0)
        opt_shard = gpus if stage >= 1 else 1
        estimate.add("optimiser", trainable * per / opt_shard,
                     f"Adam: {per} B per trainable parameter" + (f" / {gpus} ({zero})" if opt_shard > 1 else ""))
    if stage >= 3:
        largest = max(_count(m.parameters()) for m in _layers(model))
        estimate.add("ZeRO-3 gathered", 2 * largest * width, f"largest layer ({largest / 1e6:.0f}M) twice")
    if kind == "grpo" and recipe.beta > 0 and not recipe.lora.enabled:
        estimate.add("reference model", total * width / shard3, f"beta {recipe.beta:g}: a frozen copy")
    hidden, layers = config.hidden_size, config.num_hidden_layers
    mlp = _mlp_width(config)
    tokens = recipe.per_device_train_batch_size * sequence_tokens(recipe, kind)
    working = tokens * (12 * hidden + 3 * mlp) * 2
    if recipe.gradient_checkpointing:
        estimate.add("activations", tokens * hidden * 2 * layers + working,
                     f"{tokens} tokens: layer inputs kept, one layer recomputed (checkpointing)")
    else:
        estimate.add("activations", working * layers, f"{tokens} tokens x {layers} layers (no checkpointing)")
    vocab_tile = min(_CHUNKED_LOGPROB_CHUNK_SIZE, config.vocab_size)
    estimate.add("LM head tile", 2 * min(TOKEN_CHUNK_SIZE, tokens) * vocab_tile * 4,
                 f"TRL's fused head: {min(TOKEN_CHUNK_SIZE, tokens)} tokens x {vocab_tile} columns, fp32, with grad")
    if kind == "grpo" and args.use_vllm:
        share = args.vllm_gpu_memory_utilization
        estimate.add("vLLM (colocated)", share * gpu_memory, f"vllm_gpu_memory_utilization {share:g}")
    elif kind == "grpo":
        kv = _kv_bytes(config) * tokens
        estimate.add("hf rollout KV cache", kv, f"{tokens} tokens of keys and values")
    estimate.add("CUDA context, slack", OVERHEAD_BYTES, "fixed")
    return estimate


def _layers(model):
    """The modules ZeRO-3 gathers one at a time: the decoder layers and the embeddings."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
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


def _kv_bytes(config) -> int:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * 2


def _judge(report: Report, recipe, kind: str, args, model, gpus: int, gpu_memory: float) -> None:
    estimate = report.estimate
    if kind == "grpo" and args.use_vllm:
        weights = _count(model.parameters()) * 2  # vLLM serves bf16 weights, whole, split only by its own TP
        tp = args.vllm_tensor_parallel_size
        share = args.vllm_gpu_memory_utilization * gpu_memory
        if weights / tp > share * (1 - KV_CACHE_FLOOR):
            need = math.ceil(weights / tp / (1 - KV_CACHE_FLOOR) / gpu_memory * 100) / 100
            report.problems.append(
                f"vLLM's share ({share / GIB:.1f} GiB) cannot hold the bf16 weights ({weights / tp / GIB:.1f} GiB per "
                f"GPU at vllm_tensor_parallel_size {tp}) and a KV cache: raise trainer.vllm_gpu_memory_utilization "
                f"to at least {need:g}, or raise trainer.vllm_tensor_parallel_size")
    if estimate.total > gpu_memory:
        hints = []
        if _zero_stage(_deepspeed(recipe)) < 3:
            hints.append("deepspeed: configs/deepspeed/zero3.json (shards weights, gradients and optimiser)")
        if not _offloaded(_deepspeed(recipe), "optimizer"):
            hints.append("a DeepSpeed JSON that offloads the optimiser (configs/deepspeed/zero3-offload.json)")
        if not recipe.gradient_checkpointing:
            hints.append("gradient_checkpointing: true")
        if recipe.per_device_train_batch_size > 1:
            hints.append(f"a smaller per_device_train_batch_size (now {recipe.per_device_train_batch_size}) with a "
                         "larger gradient_accumulation_steps")
        if not recipe.lora.enabled:
            hints.append("lora.enabled: true")
        hints.append(f"more GPUs than {gpus}")
        report.problems.append(
            f"the recipe needs {estimate.total / GIB:.1f} GiB per GPU but a GPU has {gpu_memory / GIB:.1f} GiB "
            f"({gpus} GPUs); change one of: " + "; ".join(hints))
    else:
        report.checks.append(f"fits: {estimate.total / GIB:.1f} of {gpu_memory / GIB:.1f} GiB per GPU on {gpus} GPUs")


def default_gpus() -> int:
    import torch

    return int(os.environ.get("WORLD_SIZE") or torch.cuda.device_count() or 1)


def default_gpu_memory() -> str:
    import torch

    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_properties(0).total_memory / GIB:.2f}GiB"
    return "80GiB"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--gpus", type=int, default=None,
                        help="GPUs the run uses (default: WORLD_SIZE, else the GPUs here, else 1)")
    parser.add_argument("--gpu-memory", default=None,
                        help="memory of one GPU, e.g. 80GiB (default: this machine's first GPU, else 80GiB)")
    parser.add_argument("--model-config", type=Path, default=None,
                        help="config.json (or its folder) to build the model from instead of the recipe's model "
                             "(for machines without the hub, or before the warm-up checkpoint exists)")


def run_preflight(config: str | Path, overrides: list[str], args: argparse.Namespace) -> int:
    report = preflight(config, args.gpus or default_gpus(), parse_size(args.gpu_memory or default_gpu_memory()),
                       args.model_config, overrides)
    print(report.render(), file=sys.stdout if report.ok else sys.stderr)
    return 0 if report.ok else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "preflight", help="check a GPU recipe (TRL config, data, model, memory per GPU) before training",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", type=Path, help="an SFT or GRPO recipe YAML (configs/*/sft.yaml, grpo.yaml)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a recipe field (dotted keys for nested ones)")
    add_arguments(parser)
    parser.set_defaults(func=lambda args: run_preflight(args.recipe, args.overrides, args))
