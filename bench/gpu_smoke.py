"""GPU smoke run: SFT, then GRPO with hf rollouts, on a real architecture with random weights.

    python bench/gpu_smoke.py --out gpu-smoke.json                        # Qwen3-0.6B, full fine-tuning
    python bench/gpu_smoke.py --lora --gradient-checkpointing --model-config ../shared/models/qwen3/configs/Qwen3-8B \
        --out 8b.json
    python bench/gpu_smoke.py --deepspeed --ranks 2                       # ZeRO-3 on two GPUs (torchrun)
    python bench/gpu_smoke.py --shrink [--deepspeed] [--ranks 2]          # CPU size (part of `make test`)

The project's own stages run as they would in a recipe: the synthetic world and its warm-up
trajectories (`data_gen`), `train_sft`, then one GRPO episode built by `build_trainer` (our
`rollout_func` on the trainer's weights, TRL's loss). The model is the released `config.json` with
random weights, saved in bfloat16 as the released checkpoints are (with `--shrink` its body shrunk, for
a CPU), and the real tokenizer. Training runs as a real run does, loaded by the recipes'
`policy_dtype: auto`: float32 master weights with bf16 autocast on a GPU that has bf16 (`bf16: true`),
float32 on a CPU; with `--deepspeed` under ZeRO-3 (`configs/deepspeed/zero3.json`), bf16 weights whose
float32 masters DeepSpeed keeps. `--ranks N` (and `--deepspeed`,
even with one rank) starts the ranks through torchrun: NCCL between GPUs, gloo on a CPU. With `--lora`
GRPO starts from the random base, as a LoRA SFT leaves only an adapter.

The SFT stage checks that training moves the policy, and the run exits 1 if it does not: the loss on a
fixed batch (the first training rows) must fall from the first step to the last, and at least
`--min-moved` of the trained weights (their float32 masters; LoRA: the adapters) must change.
A policy loaded in bf16 with no float32 masters fails it: most updates of a small learning rate
round away.

For each stage it prints, and writes to `--out` as JSON (rank 0's figures): the step times; tokens
per second (SFT: the tokens TRL counts; GRPO: model-written tokens per rollout second, and prompt
plus completion tokens per second of the rest of the step); that training throughput as a share of
the card's dense bf16 peak (`PEAK_TFLOPS`, or `--peak-tflops`; a card not in the table gets no
share) in model FLOPs (6 per matmul parameter and token, 4 with LoRA, attention left out); and the
peak GPU memory, allocated (`torch.cuda.max_memory_allocated`) and reserved by the caching allocator
(`max_memory_reserved`, what runs out), beside `kgreasoner preflight`'s estimate for the same recipe
object, whole and without its fixed CUDA-context row (which both counters leave out).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from kgreasoner.records.paths import repo_root

MODELS = repo_root().parent / "shared" / "models"
SHRUNK = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
}
PEAK_TFLOPS = {
    "B200": 2250.0,
    "GH200": 989.0,
    "H200": 989.0,
    "H100 PCIe": 756.0,
    "H100": 989.0,
    "A100": 312.0,
    "L40S": 362.0,
    "L4": 121.0,
    "A10": 125.0,
    "RTX 4090": 165.0,
    "MI300X": 1307.0,
}
"""Dense bf16 tensor peak (no sparsity) of a card, by a word of its `torch.cuda.get_device_name()`; the first
key that matches wins (`H100 PCIe` before `H100`; `L4` does not match `L40S`). Vendors' figures."""
ZERO3 = repo_root() / "configs" / "deepspeed" / "zero3.json"
GIB = 1024**3


class StepClock(TrainerCallback):
    """Wall time of each optimiser step (the device synchronised at both ends) and TRL's token count."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self.num_tokens: list[float] = []
        self._started = 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        _sync()
        self._started = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        _sync()
        self.seconds.append(time.perf_counter() - self._started)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "num_tokens" in logs:
            self.num_tokens.append(float(logs["num_tokens"]))


class LearningCheck(TrainerCallback):
    """Whether training moved the policy: the loss on a fixed batch at the start and at the end of training,
    and the share of the trained weights (`requires_grad`: all of them, or LoRA's adapters) whose float32
    master changed. Every rank runs it (under ZeRO-3 a forward and a master's gather are collectives)."""

    def __init__(self, rows: list[dict[str, list[int]]], pad_id: int) -> None:
        width = max(len(r["input_ids"]) for r in rows)
        self.input_ids = torch.tensor([r["input_ids"] + [pad_id] * (width - len(r["input_ids"])) for r in rows])
        self.attention_mask = torch.tensor(
            [[1] * len(r["input_ids"]) + [0] * (width - len(r["input_ids"])) for r in rows]
        )
        trained = torch.tensor([r["assistant_masks"] + [0] * (width - len(r["assistant_masks"])) for r in rows])
        self.labels = self.input_ids.masked_fill(trained == 0, -100)
        self.losses: list[float] = []
        self.moved_share = 0.0
        self._start: dict[str, torch.Tensor] = {}

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.losses = [self._loss(model, args)]
        self._start = self._masters(model, args)

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.losses.append(self._loss(model, args))
        end = self._masters(model, args)
        moved = sum(int((end[name] != start).sum()) for name, start in self._start.items())
        self.moved_share = moved / max(sum(t.numel() for t in self._start.values()), 1)

    def _loss(self, model, args) -> float:
        device = args.device
        was_training = model.training
        model.eval()
        # as the training step computes it: bf16 autocast over float32 weights (DeepSpeed casts them itself)
        autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(args.bf16 and not args.deepspeed))
        with torch.no_grad(), autocast:
            out = model(
                input_ids=self.input_ids.to(device),
                attention_mask=self.attention_mask.to(device),
                labels=self.labels.to(device),
            )
        model.train(was_training)
        return float(out.loss)

    @staticmethod
    def _masters(model, args) -> dict[str, torch.Tensor]:
        """The float32 master of every trained weight, on the CPU: DeepSpeed's own copy under DeepSpeed (the
        module holds only this rank's bf16 shard), else the parameter itself."""
        masters = {}
        for name, param in model.named_parameters():
            if not param.requires_grad:
                continue
            if args.deepspeed:
                from deepspeed.utils import safe_get_full_fp32_param

                param = safe_get_full_fp32_param(param)
            masters[name] = param.detach().float().cpu().clone()
        return masters


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model-config",
        type=Path,
        default=MODELS / "qwen3" / "configs" / "Qwen3-0.6B",
        help="released config.json or its folder (default: Qwen3-0.6B in ../shared/models)",
    )
    parser.add_argument("--tokenizer", type=Path, default=MODELS / "qwen3", help="the real tokenizer's folder")
    parser.add_argument("--lora", action="store_true", help="LoRA adapters instead of full fine-tuning")
    parser.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        help="in both stages (the 8B run needs it: preflight puts GRPO at 78 GiB without)",
    )
    parser.add_argument(
        "--deepspeed", action="store_true", help=f"both stages under ZeRO-3 ({ZERO3.name}), started through torchrun"
    )
    parser.add_argument(
        "--ranks", type=int, default=1, help="processes, through torchrun (one GPU each; gloo between them on a CPU)"
    )
    parser.add_argument("--sft-steps", type=int, default=5)
    parser.add_argument("--sft-batch", type=int, default=4, help="SFT rows per rank and step (also the fixed batch)")
    parser.add_argument("--lr", type=float, default=1e-5, help="SFT learning rate")
    parser.add_argument(
        "--min-moved",
        type=float,
        default=0.5,
        help="share of the trained weights SFT must change, or the run fails (default 0.5)",
    )
    parser.add_argument("--grpo-steps", type=int, default=3, help="0: SFT only")
    parser.add_argument("--questions", type=int, default=2, help="questions per GRPO step")
    parser.add_argument("--generations", type=int, default=8, help="rollouts per question")
    parser.add_argument(
        "--max-new-tokens", type=int, default=None, help="model tokens per rollout (default 256; 16 with --shrink)"
    )
    parser.add_argument(
        "--shrink", action="store_true", help="CPU size: hidden 64, 2 layers, MLP 128, fp32, a few tokens per rollout"
    )
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=None,
        help=f"the card's dense bf16 peak (default by device name: {', '.join(PEAK_TFLOPS)})",
    )
    parser.add_argument("--work", type=Path, default=None, help="folder for data and checkpoints (default: a temp)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    for name in ("sft_steps", "sft_batch", "questions", "ranks"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.grpo_steps < 0:
        parser.error("--grpo-steps must be >= 0")
    if not 0.0 < args.min_moved <= 1.0:
        parser.error("--min-moved must be in (0, 1]")
    if args.generations < 2:
        parser.error("--generations must be >= 2: GRPO compares rollouts of one question")
    if args.max_new_tokens is None:
        args.max_new_tokens = 16 if args.shrink else 256
    return args


def model_config(args) -> dict:
    path = args.model_config / "config.json" if args.model_config.is_dir() else args.model_config
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        sys.exit(f"--model-config: {err}")
    raw.pop("torch_dtype", None)
    raw.pop("dtype", None)
    if args.shrink:
        raw.update(SHRUNK)
    return raw


def build_model(raw: dict, tokenizer_dir: Path, out: Path) -> Path:
    """The architecture with random weights (made in float32 on the GPU when there is one), saved in bfloat16
    as the released checkpoints are, with the real tokenizer: the recipes load it as they load those
    (`policy_dtype`), float32 masters included."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from kgreasoner.models import load_tokenizer

    raw = dict(raw)
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    generation = json.loads((tokenizer_dir / "generation_config.json").read_text(encoding="utf-8"))
    model.generation_config = GenerationConfig(
        eos_token_id=generation["eos_token_id"],
        pad_token_id=generation.get("pad_token_id"),
        bos_token_id=generation.get("bos_token_id"),
    )
    model.to(torch.bfloat16).save_pretrained(out)
    load_tokenizer(tokenizer_dir).save_pretrained(out)
    del model
    return out


def make_data(work: Path, questions: int, tool):
    """The synthetic world and one warm-up trajectory per training question."""
    from data_gen.synthetic import write_synthetic
    from data_gen.warmup import WarmupConfig, run

    data = write_synthetic(work / "data", seed=0, num_entities=300, num_questions=max(40, 4 * questions))
    warmup = work / "warmup.jsonl"
    run(
        WarmupConfig(
            dataset=str(data), output=str(warmup), num_examples=None, dev_examples=0, tool=tool, progress=False
        )
    )
    return data, warmup


def estimate(recipe, kind: str, model_dir: Path, ranks: int) -> dict:
    """`kgreasoner preflight`'s estimate for this recipe object on this device and rank count, in GiB."""
    from kgreasoner.training.preflight import OVERHEAD_BYTES, Report, check_recipe

    memory = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 80 * GIB
    report = Report(kind)
    check_recipe(recipe, kind, ranks, memory, model_dir / "config.json", report)
    if report.estimate is None:
        raise SystemExit(f"preflight could not estimate the {kind} recipe: {report.problems}")
    total = report.estimate.total
    return {
        "estimate_gib": round(total / GIB, 3),
        "estimate_allocated_gib": round((total - OVERHEAD_BYTES) / GIB, 3),
        "estimate_peak_phase": report.estimate.peak_phase,
        "preflight_problems": report.problems,
    }


def matmul_parameters(raw: dict) -> int:
    """Parameters a token multiplies through: all but an input embedding the LM head does not share."""
    from transformers import AutoConfig, AutoModelForCausalLM

    raw = dict(raw)
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    tied = model.get_output_embeddings().weight is model.get_input_embeddings().weight
    return total if tied else total - model.get_input_embeddings().weight.numel()


def peak_tflops(args) -> float | None:
    if args.peak_tflops is not None:
        return args.peak_tflops
    if not torch.cuda.is_available():
        return None
    return card_peak(torch.cuda.get_device_name(0))


def card_peak(name: str) -> float | None:
    """`PEAK_TFLOPS` of the first key that is a whole word (or words) of the device name; None if none is."""
    return next((value for key, value in PEAK_TFLOPS.items() if re.search(rf"\b{re.escape(key)}\b", name)), None)


def _begin_stage() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak() -> dict[str, float | None]:
    """This rank's peak GPU memory since the stage began: allocated by tensors, and reserved by the allocator."""
    if not torch.cuda.is_available():
        return {"peak_allocated_gib": None, "peak_reserved_gib": None}
    return {
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / GIB, 3),
        "peak_reserved_gib": round(torch.cuda.max_memory_reserved() / GIB, 3),
    }


def _share(tokens_per_s: float, flops_per_token: float, peak: float | None) -> float | None:
    return None if peak is None else round(tokens_per_s * flops_per_token / (peak * 1e12), 4)


def run_sft(args, model_dir: Path, warmup: Path, work: Path, gpu: bool) -> dict:
    from kgreasoner.models import load_tokenizer
    from kgreasoner.records.trajectories import read_warmup
    from kgreasoner.training.common import LoraSettings
    from kgreasoner.training.sft import SFTRecipe, train_sft
    from kgreasoner.training.warmup_data import encode_record

    tokenizer = load_tokenizer(model_dir)
    rows = [encode_record(r, tokenizer) for r in read_warmup(warmup) if r.split == "train"]
    longest = max(len(r["input_ids"]) for r in rows)
    recipe = SFTRecipe(
        model=str(model_dir),
        train_file=str(warmup),
        run_dir=str(work / "sft"),
        lora=LoraSettings(enabled=args.lora),
        trainer={
            "learning_rate": args.lr,
            "max_steps": args.sft_steps,
            "per_device_train_batch_size": args.sft_batch,
            "max_length": longest,
            "bf16": gpu and torch.cuda.is_bf16_supported(),
            "deepspeed": str(ZERO3) if args.deepspeed else None,
            "warmup_steps": 0.0,
            "lr_scheduler_type": "constant",
            "eval_steps": 0,
            "save_steps": 10**6,
            "logging_steps": 1,
            "report_to": [],
            "train_sampling_strategy": "random",
            "activation_checkpointing": args.gradient_checkpointing,
        },
    )
    figures = estimate(recipe, "sft", model_dir, args.ranks)
    _begin_stage()
    clock = StepClock()
    check = LearningCheck(rows[: args.sft_batch], tokenizer.pad_token_id)
    train_sft(recipe, callbacks=[clock, check])  # its final model is where the GRPO recipe starts
    tokens = clock.num_tokens[-1] if clock.num_tokens else 0.0
    seconds = sum(clock.seconds)
    figures.update(
        steps=len(clock.seconds),
        step_s=[round(s, 4) for s in clock.seconds],
        tokens=tokens,
        tokens_per_s=round(tokens / seconds, 1) if seconds else None,
        max_length=longest,
        loss_start=round(check.losses[0], 6),
        loss_end=round(check.losses[-1], 6),
        moved_share=round(check.moved_share, 6),
        **_peak(),
    )
    return figures


def grpo_recipe(args, model_path: Path, data: Path, tool_config, work: Path, gpu: bool):
    """The GRPO stage's recipe: one episode of `--grpo-steps` steps, `--questions` per rank and step."""
    from kgreasoner.config import from_dict
    from kgreasoner.training.grpo import GRPORecipe

    fields = dict(
        model=str(model_path),
        dataset=str(data),
        run_dir=str(work / "grpo"),
        tool={"entity_handles": tool_config.entity_handles, "top_k": tool_config.top_k},
        rollout={
            "max_new_tokens": args.max_new_tokens,
            "max_turn_tokens": args.max_new_tokens,
            "max_turns": 2,
            "max_tool_tokens": 256,
        },
        episodes=[{"data": "all", "max_steps": args.grpo_steps}],
        max_questions=args.questions * args.grpo_steps * args.ranks,
        rollout_backend="hf",
        lora={"enabled": args.lora},
        trainer={
            "num_generations": args.generations,
            "per_device_train_batch_size": args.generations,
            "gradient_accumulation_steps": args.questions,
            "bf16": gpu and torch.cuda.is_bf16_supported(),
            "deepspeed": str(ZERO3) if args.deepspeed else None,
            "report_to": [],
            "save_steps": 10**6,
            "seed": 0,
            "activation_checkpointing": args.gradient_checkpointing,
        },
    )
    return from_dict(GRPORecipe, fields, "the GRPO stage")


def run_grpo(recipe, figures: dict, data: Path) -> dict:
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.retrieval.tool import KGSearchTool
    from kgreasoner.training.grpo import build_trainer

    model_path = recipe.model
    dataset = load_dataset(str(data))
    examples = dataset.split("train")[: recipe.max_questions]
    tool = KGSearchTool(open_dataset_kg(dataset), recipe.tool)
    _begin_stage()
    trainer = build_trainer(recipe, 1, recipe.episodes[0], examples, str(model_path), tool)
    clock = StepClock()
    trainer.add_callback(clock)
    rollout = trainer.rollout_func
    rolled = {"seconds": [], "generated": [], "trained": []}

    def timed_rollout(prompts, trainer_):
        _sync()
        started = time.perf_counter()
        out = rollout(prompts, trainer_)
        _sync()
        rolled["seconds"].append(time.perf_counter() - started)
        rolled["generated"].append(sum(sum(mask) for mask in out["env_mask"]))
        rolled["trained"].append(sum(len(p) + len(c) for p, c in zip(out["prompt_ids"], out["completion_ids"])))
        return out

    trainer.rollout_func = timed_rollout
    trainer.train()
    generation_s, step_s = sum(rolled["seconds"]), sum(clock.seconds)
    train_s = step_s - generation_s
    figures.update(
        steps=len(clock.seconds),
        step_s=[round(s, 4) for s in clock.seconds],
        generation_s=[round(s, 4) for s in rolled["seconds"]],
        generated_tokens=sum(rolled["generated"]),
        generation_tokens_per_s=round(sum(rolled["generated"]) / generation_s, 1) if generation_s else None,
        train_tokens=sum(rolled["trained"]),
        train_tokens_per_s=round(sum(rolled["trained"]) / train_s, 1) if train_s > 0 else None,
        **_peak(),
    )
    del trainer
    return figures


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    gpu = torch.cuda.is_available()
    if gpu and args.shrink:
        sys.exit("--shrink is the CPU size (fp32); on a GPU run the real size")
    if gpu and args.ranks > torch.cuda.device_count():
        sys.exit(f"--ranks {args.ranks}: this machine has {torch.cuda.device_count()} GPUs")
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    if (args.ranks > 1 or args.deepspeed) and "LOCAL_RANK" not in os.environ:
        return launch(sys.argv[1:] if argv is None else argv, args.ranks, work)
    return run_rank(args, work, gpu)


def launch(argv: list[str], ranks: int, work: Path) -> int:
    """This script again in `ranks` processes through torchrun (one rendezvous on this machine), in one `work`."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}"]
    return subprocess.run([*command, __file__, *argv, "--work", str(work)], check=False).returncode


def run_rank(args, work: Path, gpu: bool) -> int:
    """Both stages on this rank; rank 0 prepares the data and model first, and prints and writes the figures."""
    import torch.distributed as dist

    from kgreasoner.retrieval.tool import ToolConfig
    from kgreasoner.training.common import start_process_group

    if args.deepspeed and not gpu:
        _without_shared_memory_collectives()
    start_process_group(1800.0)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    raw = model_config(args)
    tool = ToolConfig(entity_handles=False, top_k=5)
    questions = args.questions * args.grpo_steps * args.ranks
    if main_rank:
        work.mkdir(parents=True, exist_ok=True)
        make_data(work, questions, tool)
        build_model(raw, args.tokenizer, work / "model")
    if dist.is_initialized():
        dist.barrier()  # the others read what rank 0 wrote
    data, warmup, model_dir = work / "data", work / "warmup.jsonl", work / "model"
    # counted before the stages: under ZeRO-3 transformers builds every later model partitioned
    flops = (4 if args.lora else 6) * matmul_parameters(raw)
    peak = peak_tflops(args)
    # a LoRA SFT leaves only its adapter: GRPO then starts from the random base, with adapters of its own
    recipe = grpo_recipe(args, model_dir if args.lora else work / "sft" / "final", data, tool, work, gpu)
    grpo_estimate = estimate(recipe, "grpo", model_dir, args.ranks)  # as flops: before any ZeRO-3 stage
    sft = run_sft(args, model_dir, warmup, work, gpu)
    sft["train_share_of_peak"] = _share(sft["tokens_per_s"] or 0.0, flops, peak)
    grpo = None
    if args.grpo_steps:
        grpo = run_grpo(recipe, grpo_estimate, data)
        grpo["train_share_of_peak"] = _share(grpo["train_tokens_per_s"] or 0.0, flops, peak)
    figures = {
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "dtype": _dtype(args, gpu),
        "model_config": str(args.model_config),
        "shrink": args.shrink,
        "lora": args.lora,
        "deepspeed": str(ZERO3.relative_to(repo_root())) if args.deepspeed else None,
        "ranks": args.ranks,
        "gradient_checkpointing": args.gradient_checkpointing,
        "peak_tflops": peak,
        "flops_per_token": flops,
        "min_moved": args.min_moved,
        "learns": sft["loss_end"] < sft["loss_start"] and sft["moved_share"] >= args.min_moved,
        "sft": sft,
        "grpo": grpo,
    }
    if main_rank:
        print(report(figures))
        if args.out:
            args.out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0 if figures["learns"] else 1


def _dtype(args, gpu: bool) -> str:
    """How the stages hold and compute the weights (`policy_dtype: auto` under this run's settings)."""
    if not (gpu and torch.cuda.is_bf16_supported()):
        return "float32"
    if args.deepspeed:
        return "bf16 weights, DeepSpeed's float32 masters"
    return "bf16 base, float32 adapters" if args.lora else "float32 masters, bf16 autocast"


def _without_shared_memory_collectives() -> None:
    """DeepSpeed on a CPU compiles its shared-memory collectives on first use (a C++ build, minutes, and a
    lock that a killed build leaves behind); torch's gloo collectives are what a CPU smoke run needs.
    DeepSpeed reads which of its ops it may build from `deepspeed.ops.__compatible_ops__`, probed with
    compiler runs on first access; set here, none is built, and nothing is probed."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__ = {}


def report(figures: dict) -> str:
    peak = figures["peak_tflops"]
    lines = [
        f"device {figures['device']} ({figures['dtype']}), {figures['model_config']}"
        + (" shrunk" if figures["shrink"] else "")
        + (", LoRA" if figures["lora"] else ", full fine-tuning")
        + (f", DeepSpeed {figures['deepspeed']}" if figures["deepspeed"] else "")
        + f", {figures['ranks']} rank{'s' if figures['ranks'] > 1 else ''}"
    ]
    if peak is None and figures["device"] != "cpu":
        lines.append(f"peak FLOPs of {figures['device']} unknown: pass --peak-tflops for a share of peak")
    for stage in ("sft", "grpo"):
        f = figures[stage]
        if f is None:
            lines.append(f"{stage}: not run")
            continue
        memory = (
            "n/a (no GPU)"
            if f["peak_allocated_gib"] is None
            else f"{f['peak_allocated_gib']:.2f} GiB allocated, {f['peak_reserved_gib']:.2f} GiB reserved"
        )
        lines.append(f"{stage}: {f['steps']} steps, step s {f['step_s']}")
        lines.append(
            f"  peak memory {memory}; preflight {f['estimate_gib']:.2f} GiB ({f['estimate_allocated_gib']:.2f} "
            f"without the CUDA context; peak phase {f['estimate_peak_phase']})"
        )
        if stage == "sft":
            lines.append(f"  training {f['tokens_per_s']} tokens/s")
            falls = "falls" if f["loss_end"] < f["loss_start"] else "DOES NOT FALL"
            moved = "ok" if f["moved_share"] >= figures["min_moved"] else "TOO FEW"
            lines.append(f"  fixed-batch loss {f['loss_start']:.6f} -> {f['loss_end']:.6f} ({falls})")
            lines.append(
                f"  trained weights moved {100 * f['moved_share']:.2f}% (at least {100 * figures['min_moved']:g}%: "
                f"{moved})"
            )
        else:
            lines.append(
                f"  generation {f['generation_tokens_per_s']} tokens/s ({f['generated_tokens']} tokens), "
                f"training {f['train_tokens_per_s']} tokens/s"
            )
        if f["train_share_of_peak"] is not None:
            lines.append(f"  training at {100 * f['train_share_of_peak']:.1f}% of {peak:g} TFLOP/s")
    lines.append("policy learns" if figures["learns"] else "POLICY DOES NOT LEARN: the SFT stage left it unmoved")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
