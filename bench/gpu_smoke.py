"""One-GPU smoke run: SFT, then GRPO with hf rollouts, on a real architecture with random weights.

    python bench/gpu_smoke.py --out gpu-smoke.json                        # Qwen3-0.6B, full fine-tuning
    python bench/gpu_smoke.py --lora --gradient-checkpointing --model-config ../shared/models/qwen3/configs/Qwen3-8B \
        --out 8b.json
    python bench/gpu_smoke.py --shrink                                    # CPU size (part of `make test`)

The project's own stages run as they would in a recipe: the synthetic world and its warm-up
trajectories (`data_gen`), `train_sft`, then one GRPO episode built by `build_trainer` (our
`rollout_func` on the trainer's weights, TRL's loss). The model is the released `config.json` with
random weights (bf16 on a GPU; with `--shrink` its body shrunk, fp32, for a CPU) and the real
tokenizer. With `--lora` GRPO starts from the random base, as a LoRA SFT leaves only an adapter.

For each stage it prints, and writes to `--out` as JSON: the step times; tokens per second (SFT:
the tokens TRL counts; GRPO: model-written tokens per rollout second, and prompt plus completion
tokens per second of the rest of the step); that training throughput as a share of the card's dense
bf16 peak (model FLOPs, 6 per matmul parameter and token, 4 with LoRA, attention left out); and the
peak GPU memory (`torch.cuda.max_memory_allocated`) beside `kgreasoner preflight`'s estimate for
the same recipe object, whole and without its fixed CUDA-context row (which that counter leaves out).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from transformers import TrainerCallback

from kgreasoner.data.paths import repo_root

MODELS = repo_root().parent / "shared" / "models"
SHRUNK = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 32,
}
PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0}
"""Dense bf16 peak of a card, by a name its `torch.cuda.get_device_name()` contains (SXM figures)."""
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
    parser.add_argument("--sft-steps", type=int, default=5)
    parser.add_argument("--grpo-steps", type=int, default=3)
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
        help="the card's dense bf16 peak (default by device name: H100 and H200 989)",
    )
    parser.add_argument("--work", type=Path, default=None, help="folder for data and checkpoints (default: a temp)")
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args(argv)
    for name in ("sft_steps", "grpo_steps", "questions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1")
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


def build_model(raw: dict, tokenizer_dir: Path, out: Path, dtype: torch.dtype) -> Path:
    """The architecture with random weights (made on the GPU when there is one), saved with the real tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from kgreasoner.models import load_tokenizer

    raw = dict(raw)
    config = AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    generation = json.loads((tokenizer_dir / "generation_config.json").read_text(encoding="utf-8"))
    model.generation_config = GenerationConfig(
        eos_token_id=generation["eos_token_id"],
        pad_token_id=generation.get("pad_token_id"),
        bos_token_id=generation.get("bos_token_id"),
    )
    model.save_pretrained(out)
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


def estimate(recipe, kind: str, model_dir: Path) -> dict:
    """`kgreasoner preflight`'s estimate for this recipe object on this device, in GiB."""
    from kgreasoner.training.preflight import OVERHEAD_BYTES, Report, check_recipe

    memory = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 80 * GIB
    report = Report(kind)
    check_recipe(recipe, kind, 1, memory, model_dir / "config.json", report)
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
    name = torch.cuda.get_device_name(0)
    return next((value for key, value in PEAK_TFLOPS.items() if key in name), None)


def _begin_stage() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _peak() -> float | None:
    return round(torch.cuda.max_memory_allocated() / GIB, 3) if torch.cuda.is_available() else None


def _share(tokens_per_s: float, flops_per_token: float, peak: float | None) -> float | None:
    return None if peak is None else round(tokens_per_s * flops_per_token / (peak * 1e12), 4)


def run_sft(args, model_dir: Path, warmup: Path, work: Path, gpu: bool) -> tuple[dict, Path]:
    from kgreasoner.data.trajectories import read_warmup
    from kgreasoner.models import load_tokenizer
    from kgreasoner.training.common import LoraSettings
    from kgreasoner.training.sft import SFTRecipe, train_sft
    from kgreasoner.training.warmup_data import encode_record

    tokenizer = load_tokenizer(model_dir)
    longest = max(len(encode_record(r, tokenizer)["input_ids"]) for r in read_warmup(warmup))
    recipe = SFTRecipe(
        model=str(model_dir),
        train_file=str(warmup),
        run_dir=str(work / "sft"),
        lora=LoraSettings(enabled=args.lora),
        trainer={
            "learning_rate": 1e-5,
            "max_steps": args.sft_steps,
            "per_device_train_batch_size": 4,
            "max_length": longest,
            "bf16": gpu,
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
    figures = estimate(recipe, "sft", model_dir)
    _begin_stage()
    clock = StepClock()
    final = train_sft(recipe, callbacks=[clock])
    tokens = clock.num_tokens[-1] if clock.num_tokens else 0.0
    seconds = sum(clock.seconds)
    figures.update(
        steps=len(clock.seconds),
        step_s=[round(s, 4) for s in clock.seconds],
        tokens=tokens,
        tokens_per_s=round(tokens / seconds, 1) if seconds else None,
        peak_gib=_peak(),
        max_length=longest,
    )
    return figures, final


def run_grpo(args, model_path: Path, model_dir: Path, data: Path, tool_config, work: Path, gpu: bool) -> dict:
    from kgreasoner.config import load_config
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.retrieval.tool import KGSearchTool
    from kgreasoner.training.grpo import GRPORecipe, build_trainer

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
        max_questions=args.questions * args.grpo_steps,
        rollout_backend="hf",
        lora={"enabled": args.lora},
        trainer={
            "num_generations": args.generations,
            "per_device_train_batch_size": args.generations,
            "gradient_accumulation_steps": args.questions,
            "bf16": gpu,
            "report_to": [],
            "save_steps": 10**6,
            "seed": 0,
            "activation_checkpointing": args.gradient_checkpointing,
        },
    )
    path = work / "grpo.json"
    path.write_text(json.dumps(fields), encoding="utf-8")
    recipe = load_config(GRPORecipe, path)
    figures = estimate(recipe, "grpo", model_dir)
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
        peak_gib=_peak(),
    )
    del trainer
    return figures


def main(argv: list[str] | None = None) -> int:
    from kgreasoner.retrieval.tool import ToolConfig

    args = parse_args(argv)
    gpu = torch.cuda.is_available()
    if gpu and args.shrink:
        sys.exit("--shrink is the CPU size (fp32); on a GPU run the real size")
    work = args.work or Path(tempfile.mkdtemp(prefix="gpu-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    raw = model_config(args)
    tool = ToolConfig(entity_handles=False, top_k=5)
    data, warmup = make_data(work, args.questions * args.grpo_steps, tool)
    model_dir = build_model(raw, args.tokenizer, work / "model", torch.bfloat16 if gpu else torch.float32)
    sft, sft_final = run_sft(args, model_dir, warmup, work, gpu)
    # a LoRA SFT leaves only its adapter: GRPO then starts from the random base, with adapters of its own
    grpo = run_grpo(args, model_dir if args.lora else sft_final, model_dir, data, tool, work, gpu)
    peak = peak_tflops(args)
    flops = (4 if args.lora else 6) * matmul_parameters(raw)
    sft["train_share_of_peak"] = _share(sft["tokens_per_s"] or 0.0, flops, peak)
    grpo["train_share_of_peak"] = _share(grpo["train_tokens_per_s"] or 0.0, flops, peak)
    figures = {
        "device": torch.cuda.get_device_name(0) if gpu else "cpu",
        "dtype": "bfloat16" if gpu else "float32",
        "model_config": str(args.model_config),
        "shrink": args.shrink,
        "lora": args.lora,
        "gradient_checkpointing": args.gradient_checkpointing,
        "peak_tflops": peak,
        "flops_per_token": flops,
        "sft": sft,
        "grpo": grpo,
    }
    print(report(figures))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")
    return 0


def report(figures: dict) -> str:
    lines = [
        f"device {figures['device']} ({figures['dtype']}), {figures['model_config']}"
        + (" shrunk" if figures["shrink"] else "")
        + (", LoRA" if figures["lora"] else ", full fine-tuning")
    ]
    for stage in ("sft", "grpo"):
        f = figures[stage]
        peak = "n/a (no GPU)" if f["peak_gib"] is None else f"{f['peak_gib']:.2f} GiB"
        lines.append(f"{stage}: {f['steps']} steps, step s {f['step_s']}")
        lines.append(
            f"  peak memory {peak}; preflight {f['estimate_gib']:.2f} GiB ({f['estimate_allocated_gib']:.2f} "
            f"without the CUDA context; peak phase {f['estimate_peak_phase']})"
        )
        if stage == "sft":
            lines.append(f"  training {f['tokens_per_s']} tokens/s")
        else:
            lines.append(
                f"  generation {f['generation_tokens_per_s']} tokens/s ({f['generated_tokens']} tokens), "
                f"training {f['train_tokens_per_s']} tokens/s"
            )
        if f["train_share_of_peak"] is not None:
            lines.append(f"  training at {100 * f['train_share_of_peak']:.1f}% of {figures['peak_tflops']:g} TFLOP/s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
