"""GRPO throughput on CPU: rollouts per CPU-second, split into generation, tool and training.

    python bench/grpo_bench.py --model outputs/demo/sft/final --data outputs/demo/data \\
        [--steps 6] [--threads 1] [--set tool.ranking=gat --set tool.ranker_path=outputs/demo/ranker ...]

Every row runs TRL's GRPOTrainer for real (our rollout as its `rollout_func`, the demo's rewards)
on the same checkpoint and the same training questions, in one process, one after the other:

- `today`: the trainer as it was: TRL's GRPOTrainer as is (on a CPU its fused LM head projects
  every position through the vocabulary), the paper's ~260-token system prompt in every sequence,
  16 rollouts (2 questions x 8) per step;
- `compact`: the same with the compact prompt (the tiny model's chat template leaves the system
  turn out);
- `compact, scored`: and the LM head only at model-written completion tokens (the trainer the
  demo now uses);
- `..., 3 q/step` and `..., 8 q/step`: more questions per optimiser step (24 and 64 rollouts), so
  each decode step and each matmul covers more rows (the demo trains 3 a step);
- `..., chunks of N`: the loss's forward over chunks of N rows of similar length, each cut to its
  own tokens, instead of every row padded to the step's longest rollout (the default: 4).

The first step of each row is a warm-up and is left out of the figures. CPU-seconds are the
process's CPU time (all threads), so rows compare fairly whatever else the machine does; the
peak is measured in CPU time too.
Achieved FLOP/s counts 2 FLOPs per multiply-add of the model's linear layers (the body on every
position, the vocabulary projection where it runs: one per generated token; in training every
position with TRL's head on a CPU, model-written tokens with the scored one), forward x1 in
generation and x3 in training;
attention scores are left out (short sequences), so it is a lower bound. The peak is this
machine's fp32 matmul rate at the same thread count, measured first.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch


def matmul_peak(threads: int, size: int = 1024, seconds: float = 2.0) -> float:
    """fp32 FLOP/s of a square matmul at `threads` threads (the best of a few timed loops)."""
    torch.set_num_threads(threads)
    a, b = torch.randn(size, size), torch.randn(size, size)
    best = 0.0
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        started = time.process_time()  # CPU time: the peak of the cores we got, whatever else runs
        for _ in range(8):
            torch.mm(a, b)
        best = max(best, 8 * 2 * size**3 / max(time.process_time() - started, 1e-9))
    return best


def model_sizes(model_dir: str) -> tuple[int, int, int]:
    """(body parameters without embeddings, hidden size, vocabulary size) of a checkpoint's config."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    embed = model.get_input_embeddings().weight.numel()
    body = sum(p.numel() for p in model.parameters()) - embed
    if not config.tie_word_embeddings:
        body -= model.get_output_embeddings().weight.numel()
    return body, config.hidden_size, config.vocab_size


def with_template(model_dir: str, system_prompt: bool, work: Path) -> str:
    """A copy of the checkpoint whose chat template renders (or leaves out) the system turn: same weights."""
    from transformers import AutoTokenizer

    from kgreasoner.tokenizer import chat_template

    target = work / ("model-system" if system_prompt else "model-compact")
    if not target.exists():
        shutil.copytree(model_dir, target)
        tokenizer = AutoTokenizer.from_pretrained(target)
        tokenizer.chat_template = chat_template(system_prompt)
        tokenizer.save_pretrained(target)
    return str(target)


def run_row(name: str, recipe, steps: int, sizes: tuple[int, int, int], scored: bool) -> dict:
    from unittest import mock

    from trl import GRPOTrainer

    from kgreasoner.data import load_dataset
    from kgreasoner.retrieval.tool import KGSearchTool
    from kgreasoner.training import trl_internals
    from kgreasoner.training.grpo import Episode, _open_kg, build_trainer

    dataset = load_dataset(recipe.dataset)
    examples = dataset.split("train")[: recipe.max_questions]
    tool = KGSearchTool(_open_kg(recipe, dataset), recipe.tool)
    out = Path(recipe.run_dir)
    # The `today` rows reproduce the trainer before the scored LM head: TRL's own class.
    with mock.patch.object(
        trl_internals, "scoring_trainer_class", trl_internals.scoring_trainer_class if scored else lambda: GRPOTrainer
    ):
        trainer = build_trainer(recipe, 1, Episode("all", max_steps=steps), examples, recipe.model, tool)
    tokenizer = trainer.processing_class
    prompt_tokens = sum(
        len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in trainer.train_dataset["prompt"]
    ) / len(trainer.train_dataset)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    trainer.train()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if "loss" in r][1:]  # the first step warms caches and allocators
    shutil.rmtree(out, ignore_errors=True)

    def mean(key: str) -> float:
        return sum(r[key] for r in rows) / len(rows)

    per_step = recipe.setting("per_device_train_batch_size")
    body, hidden, vocab = sizes
    gen, tool_s, train, step = (
        mean("time/generation_s"),
        mean("time/tool_s"),
        mean("time/training_s"),
        mean("time/step_s"),
    )
    model_tokens = mean("rollout/model_tokens")
    completion = model_tokens / max(1e-9, 1 - mean("rollout/tool_token_share"))
    sequence = prompt_tokens + completion
    gen_flops = per_step * (2 * (body + hidden * vocab) * model_tokens + 2 * body * (sequence - model_tokens))
    # TRL's fused head on a CPU projects every position; the scored trainer only model-written tokens.
    train_flops = per_step * 3 * (2 * body * sequence + 2 * hidden * vocab * (model_tokens if scored else sequence))
    # CPU time of the measured steps: the run's CPU time scaled by their share of its wall time; each
    # phase gets its share of a step's CPU time, so FLOP/s compare with the CPU-time peak.
    measured_cpu = cpu * (step * len(rows)) / wall
    step_cpu = measured_cpu / len(rows)
    gen_cpu, train_cpu = step_cpu * gen / step, step_cpu * train / step
    return {
        "row": name,
        "rollouts_per_step": per_step,
        "prompt_tokens": round(prompt_tokens, 1),
        "sequence_tokens": round(sequence, 1),
        "step_s": round(step, 3),
        "generation_s": round(gen, 3),
        "tool_s": round(tool_s, 3),
        "training_s": round(train, 3),
        "rollouts_per_cpu_s": round(per_step * len(rows) / measured_cpu, 2),
        "gen_gflops": round(gen_flops / max(gen_cpu, 1e-9) / 1e9, 2),
        "train_gflops": round(train_flops / max(train_cpu, 1e-9) / 1e9, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="an SFT checkpoint of a tiny model (the demo's sft/final)")
    parser.add_argument("--data", required=True, help="its dataset folder (the demo's data/)")
    parser.add_argument("--config", default="configs/tiny-cpu/grpo.yaml", help="GRPO recipe the rows start from")
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], help="recipe overrides (tool, rollout)"
    )
    parser.add_argument("--steps", type=int, default=6, help="GRPO steps per row (the first is left out)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--questions", type=int, default=512, help="training questions the rows draw from")
    parser.add_argument(
        "--rows",
        default="",
        help="comma-separated row numbers to run (1 = today, always run: "
        "the others are compared with it); all by default",
    )
    args = parser.parse_args(argv)
    if args.steps < 2:
        parser.error("--steps must be >= 2: the first step of a row is not measured")

    from kgreasoner.config import load_config
    from kgreasoner.training.grpo import GRPORecipe

    torch.set_num_threads(args.threads)
    peak = matmul_peak(args.threads)
    torch.set_num_threads(args.threads)
    sizes = model_sizes(args.model)
    print(
        f"fp32 matmul peak at {args.threads} thread(s): {peak / 1e9:.1f} GFLOP/s; model body "
        f"{sizes[0]:,} parameters, hidden {sizes[1]}, vocabulary {sizes[2]:,}",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="grpo-bench-"))
    base = load_config(
        GRPORecipe,
        args.config,
        [
            f"model={args.model}",
            f"dataset={args.data}",
            f"run_dir={work}/run",
            "trainer.report_to=[]",
            "trainer.save_steps=100000",
            "trainer.learning_rate=1e-4",
            f"max_questions={args.questions}",
            *args.overrides,
        ],
    )
    system, compact = with_template(args.model, True, work), with_template(args.model, False, work)
    whole = 1 << 20  # rows per length chunk larger than any batch: the step's rows scored as one
    rows = [
        ("today", replace(base, model=system, per_device_train_batch_size=16, num_generations=8), False),
        ("compact", replace(base, model=compact, per_device_train_batch_size=16, num_generations=8), False),
        (
            "compact, scored",
            replace(base, model=compact, per_device_train_batch_size=16, num_generations=8, length_chunk_rows=whole),
            True,
        ),
        (
            "compact, scored, 3 q/step",
            replace(base, model=compact, per_device_train_batch_size=24, num_generations=8, length_chunk_rows=whole),
            True,
        ),
        (
            "compact, scored, 3 q/step, chunks of 8",
            replace(base, model=compact, per_device_train_batch_size=24, num_generations=8, length_chunk_rows=8),
            True,
        ),
        (
            "compact, scored, 3 q/step, chunks of 4",
            replace(base, model=compact, per_device_train_batch_size=24, num_generations=8, length_chunk_rows=4),
            True,
        ),
        (
            "compact, scored, 8 q/step, chunks of 8",
            replace(base, model=compact, per_device_train_batch_size=64, num_generations=8, length_chunk_rows=8),
            True,
        ),
    ]
    if args.rows:
        chosen = {1} | {int(n) for n in args.rows.split(",")}
        if not chosen <= set(range(1, len(rows) + 1)):
            parser.error(f"--rows: numbers from 1 to {len(rows)}, got {args.rows!r}")
        rows = [row for number, row in enumerate(rows, 1) if number in chosen]
    results = []
    header = (
        "row",
        "rollouts/step",
        "prompt tok",
        "seq tok",
        "step s",
        "gen s",
        "tool s",
        "train s",
        "rollouts/CPU-s",
        "gen GFLOP/s",
        "train GFLOP/s",
    )
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header), flush=True)
    for name, recipe, scored in rows:
        r = run_row(name, recipe, args.steps, sizes, scored)
        results.append(r)
        print("| " + " | ".join(str(v) for v in r.values()) + " |", flush=True)
    today = results[0]["rollouts_per_cpu_s"]
    for r in results[1:]:
        print(
            f"{r['row']}: {r['rollouts_per_cpu_s'] / today:.2f}x today's rollouts per CPU-second; training at "
            f"{100 * r['train_gflops'] * 1e9 / peak:.0f}% of the matmul peak, generation at "
            f"{100 * r['gen_gflops'] * 1e9 / peak:.0f}%"
        )
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
