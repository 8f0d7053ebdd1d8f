"""`kgreasoner ablate`: the paper's ablations at small scale, the same tiny backbone and budget, one table.

    kgreasoner ablate --config configs/ablations/pathquestion.yaml --out outputs/ablations/pq-2h
    kgreasoner ablate --config configs/ablations/quick.yaml --out /tmp/ablate --only full,no_search_reward --seeds 0

A variant is a named set of `kgreasoner demo` settings on top of one base demo YAML, or the
same-backbone pipeline baseline (`pipeline`: the tiny architecture SFT-trained on a pipeline's LLM
steps, then evaluated with that method). Each variant x seed is one run, `OUT/runs/VARIANT/seed-S`:
a demo folder whose stage folders are links into `OUT/stages/STAGE/KEY`. KEY hashes the stage's
command, the recipe files it names and every earlier stage's key, so runs whose settings agree up
to a stage share it and it is computed once: data, KG and ranker by every run, warm-up, model and
SFT by the variants that differ only in GRPO (per seed). Data, KG and ranker are made with
`data_seed` in every run; a run's seed drives the warm-up sampling, model initialisation, SFT,
GRPO and evaluation. A finished stage leaves `OUT/stages/STAGE/KEY.json` and is
skipped, a finished run leaves `result.json` and is skipped, so an interrupted ablation resumes;
changed settings give new keys instead of reusing outputs made with the old ones.

Output, rewritten after every run: `OUT/ablations.md` and `OUT/ablations.json`, one row per
variant: Hits@1 of its final checkpoint on the test split per seed, the mean over seeds, the
difference to the reference variant's mean, the format-valid rate, Hits@1 by hop count and the CPU
seconds of training (the `TRAINING_STAGES`), both means over the seeds.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgreasoner.config import ConfigError, add_config_arguments, describe, from_dict, load_config, resolve_recipe
from kgreasoner.demo import STAGE_FOLDERS, Demo, DemoConfig, StageRecipe, overrides
from kgreasoner.stages import (
    Stage,
    StageInput,
    StageRunner,
    StageStore,
    default_threads,
    log_progress,
    read_record,
    stage_key,
    write_json,
)

SEED_FREE_STAGES = ("data", "kg", "ranker")
"""Stages made with `data_seed` in every run, so that every run sees the same questions, KG and ranker."""
RESULT_FILE = "result.json"
RUN_FIELDS = ("hits1", "format_valid", "n", "stages")
"""What the table reads of a run's `RESULT_FILE` (`execute` writes it)."""
TRAINING_STAGES = ("sft", "grpo")
"""The stages whose CPU seconds a row's training cost sums: SFT and GRPO (its hard cases mined within)."""
VARIANT_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


@dataclass
class Variant:
    """One row of the table: demo settings on top of the base, or the same-backbone pipeline."""

    help: str = field(default="", metadata={"help": "what the variant changes (listed under the table)"})
    set: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "DemoConfig overrides on top of the base, dotted keys as `kgreasoner demo --set` takes them "
            "(warmup.set.correction_share: 0, grpo.set.rewards.search: 0, tool.ranking: embedding)"
        },
    )
    pipeline: StageRecipe | None = field(
        default=None,
        metadata={
            "help": "instead of the unified model: `kgreasoner pipeline-sft` recipe (config + set, method tog or "
            "sog): the tiny model is SFT-trained on that pipeline's LLM steps with the demo's SFT recipe and "
            "budget, then evaluated with that method (no GRPO)"
        },
    )

    def __post_init__(self) -> None:
        if not isinstance(self.set, dict):
            raise ValueError("set must be a mapping of DemoConfig fields (dotted keys) to values")
        if isinstance(self.pipeline, dict):
            self.pipeline = from_dict(StageRecipe, self.pipeline, "pipeline")
        if "seed" in self.set:
            raise ValueError("set: seed is set by the ablation (seeds, data_seed); leave it out")


@dataclass
class AblationConfig:
    """Settings of `kgreasoner ablate` (configs/ablations/*.yaml)."""

    demo: str = field(
        default="configs/demo/full.yaml",
        metadata={
            "help": "the base `kgreasoner demo` settings every variant starts from (DemoConfig YAML; relative paths: "
            "from the current directory, else the repository)"
        },
    )
    set: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "DemoConfig overrides for every variant, dotted keys as `kgreasoner demo --set` takes them "
            "(data: PQ-2H)"
        },
    )
    seeds: list[int] = field(
        default_factory=lambda: [0, 1],
        metadata={"help": "one run per variant and seed; the seed drives warm-up sampling, model init, SFT and GRPO"},
    )
    data_seed: int = field(
        default=0,
        metadata={"help": "seed of the data (synthetic world), the KG and the ranker, the same in every run"},
    )
    reference: str = field(default="full", metadata={"help": "the variant every other is compared with (its name)"})
    variants: dict[str, Variant] = field(
        default_factory=dict,
        metadata={"help": "name -> Variant (help, set, pipeline), in table order; names are folder names"},
    )

    def __post_init__(self) -> None:
        if not isinstance(self.set, dict):
            raise ValueError("set must be a mapping of DemoConfig fields (dotted keys) to values")
        if "seed" in self.set:
            raise ValueError("set: seed is set by the ablation (seeds, data_seed); leave it out")
        check_seeds(self.seeds, "seeds")
        if not isinstance(self.variants, dict) or not self.variants:
            raise ValueError("variants must map at least one variant name to its settings")
        variants = {}
        for name, value in self.variants.items():
            if not isinstance(name, str) or not VARIANT_NAME.match(name):
                raise ValueError(
                    f"variants: name {name!r} must be letters, digits, '_', '-' or '.' (it names a folder)"
                )
            variants[name] = (
                from_dict(Variant, value or {}, f"variants.{name}") if not isinstance(value, Variant) else value
            )
        self.variants = variants
        if self.reference not in self.variants:
            raise ValueError(f"reference {self.reference!r} is not one of the variants {list(self.variants)}")


def check_seeds(seeds: Any, name: str) -> list[int]:
    if (
        not isinstance(seeds, (list, tuple))
        or not seeds
        or any(isinstance(s, bool) or not isinstance(s, int) for s in seeds)
    ):
        raise ValueError(f"{name} must be a non-empty list of integers, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"{name} must not repeat a seed, got {list(seeds)}")
    return list(seeds)


# --- the pipeline baseline as a run ---------------------------------------------------------------------
class PipelineRun(Demo):
    """The same-backbone pipeline baseline (`bench/same_backbone.sh` as demo stages): the demo's data and
    KG, the pipeline's LLM steps answered by the gold-path teacher (`kgreasoner pipeline-sft`), the tiny
    model and its tokenizer built on the KB and those records, SFT with the demo's recipe and budget,
    and `kgreasoner eval --methods METHOD` with the method settings the records were made with."""

    def __init__(self, config: DemoConfig, pipeline: StageRecipe, out: Path) -> None:
        from data_gen.pipeline_sft import PipelineSFTConfig
        from kgreasoner.evaluation.methods import EvalConfig

        if not config.sft_warmup:
            raise ConfigError("a pipeline variant is SFT-trained: sft_warmup must stay true")
        super().__init__(config, out)
        self.paths["pipeline"] = str(out / "pipeline")
        self.pipeline = self._stage_config(
            PipelineSFTConfig,
            "pipeline",
            {
                "dataset": self.paths["data"],
                "output": self.train_file,
                "split_scheme": config.split_scheme,
                "split_seed": config.split_seed,
                "seed": config.seed,
                "tokenizer": None,
                "summary": None,
                "progress": False,
            },
            recipe=pipeline,
        )
        self.method = self.pipeline.config.method
        # Evaluation prompts must be the trained ones: the method settings come from the pipeline recipe.
        settings = overrides(dataclasses.asdict(getattr(self.pipeline.config, self.method)), f"{self.method}.")
        sets = (*self.eval.sets, *settings)
        evaluation = load_config(EvalConfig, self.eval.path, list(sets))
        evaluation.limit = self.eval.config.limit
        self.eval = StageInput(evaluation, self.eval.path, sets)

    def sft_train_file(self) -> str:
        return str(self.out / "pipeline" / "steps.jsonl")

    def stages(self) -> list[Stage]:
        demo = {s.name: s for s in super().stages()}
        pipeline = Stage(
            "pipeline",
            f"{self.method} steps by the gold-path teacher",
            [self.pipeline.command("kgreasoner", "pipeline-sft")],
            self.run_pipeline,
        )
        evaluation = Stage(
            "eval",
            f"evaluation of {self.method}",
            [self.eval_command(self.method, self.sft_final, self.method)],
            self.run_pipeline_eval,
        )
        return [demo["data"], demo["kg"], pipeline, demo["model"], demo["sft"], evaluation]

    def run_pipeline(self) -> dict[str, Any]:
        from data_gen.pipeline_sft import run

        summary = run(self.pipeline.config)
        train = summary["by_split"].get("train", {})
        return {
            "line": f"{summary['records']} records from {train.get('questions', 0)} training questions "
            f"(+ dev); teacher Hits@1 {train.get('teacher_hits_at_1', 0):.3f}"
        }

    def run_pipeline_eval(self) -> dict[str, Any]:
        summary = self._evaluate(self.sft_final, [self.method], Path(self.paths["eval"]) / self.method)[self.method]
        return {"hits1": round(summary["hits1"], 4), "line": f"Hits@1 {self.method} {summary['hits1']:.3f}"}


# --- planning the runs -------------------------------------------------------------------------------------
@dataclass
class Run:
    """One variant x seed: its demo object (the settings each stage uses), its stages in order and their keys."""

    variant: str
    seed: int
    folder: Path
    demo: Demo
    stages: list[Stage]
    keys: dict[str, str]

    @property
    def label(self) -> str:
        return f"{self.variant}, seed {self.seed}"

    def final_evaluation(self) -> tuple[Path, str]:
        """The summary.json of the run's final checkpoint and the method whose row counts."""
        if isinstance(self.demo, PipelineRun):
            return Path(self.demo.paths["eval"]) / self.demo.method / "summary.json", self.demo.method
        final = "grpo" if self.demo.config.rl else self.demo.first_eval
        return Path(self.demo.paths["eval"]) / final / "summary.json", "kgreasoner"


def variant_settings(config: AblationConfig, base: str | None, name: str, seed: int) -> DemoConfig:
    """The DemoConfig of one variant with one seed: the base YAML, the shared overrides, the variant's."""
    variant = config.variants[name]
    sets = overrides(config.set) + overrides(variant.set) + [f"seed={seed}"]
    try:
        return load_config(DemoConfig, base, sets)
    except ConfigError as err:
        raise ConfigError(f"variant {name}: {err}") from err


def make_demo(config: AblationConfig, base: str | None, name: str, seed: int, folder: Path) -> Demo:
    variant = config.variants[name]
    settings = variant_settings(config, base, name, seed)
    try:
        return PipelineRun(settings, variant.pipeline, folder) if variant.pipeline else Demo(settings, folder)
    except ConfigError as err:
        raise ConfigError(f"variant {name}: {err}") from err


def plan(
    config: AblationConfig, out: Path, only: Sequence[str] | None = None, seeds: Sequence[int] | None = None
) -> list[Run]:
    """Every run to do (variants in config order, each over the seeds), all settings validated up front."""
    names = list(config.variants)
    if only:
        unknown = [n for n in only if n not in config.variants]
        if unknown:
            raise ValueError(f"--only: {', '.join(unknown)} not among the variants {names}")
        names = [n for n in names if n in only]
    base = resolve_recipe(config.demo)
    runs = []
    for name in names:
        for seed in seeds or config.seeds:
            folder = out / "runs" / name / f"seed-{seed}"
            demo = make_demo(config, base, name, seed, folder)
            fixed = {
                s.name: s
                for s in make_demo(config, base, name, config.data_seed, folder).stages()
                if s.name in SEED_FREE_STAGES
            }
            stages = [fixed.get(s.name, s) for s in demo.stages() if s.name != "report"]
            keys, previous = {}, ""
            for stage in stages:
                previous = keys[stage.name] = stage_key(previous, stage, folder)
            runs.append(Run(name, seed, folder, demo, stages, keys))
    return runs


# --- running -------------------------------------------------------------------------------------------
def _link(path: Path, target: Path) -> None:
    """`path` -> `target` as a relative link (OUT can move); a link made for other settings is replaced."""
    relative = os.path.relpath(target, path.parent)
    if path.is_symlink():
        if os.readlink(path) == relative:
            return
        path.unlink()
    elif path.exists():
        raise ValueError(f"{path} is not a link made by kgreasoner ablate; use another --out")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(relative, target_is_directory=True)


def execute(run: Run, out: Path, threads: int) -> tuple[dict[str, Any], bool]:
    """Run (or find finished) every stage of one run; returns its result record and whether it was done earlier."""
    record_path = run.folder / RESULT_FILE
    if record_path.exists():
        record = read_record(record_path, RUN_FIELDS, "run")
        if record.get("keys") == run.keys:
            return record, True
    (out / "cache").mkdir(parents=True, exist_ok=True)
    _link(run.folder / "cache", out / "cache")  # the embedding cache, shared by every run
    store = StageStore(out / "stages")
    runner = StageRunner(store, threads, show_commands=False)
    stages: dict[str, dict[str, Any]] = {}
    for stage in run.stages:
        key = run.keys[stage.name]
        folder = store.folder(stage.name, key)
        folder.mkdir(parents=True, exist_ok=True)
        _link(run.folder / STAGE_FOLDERS.get(stage.name, stage.name), folder)
        record, ran = runner.run(
            stage,
            f"    {stage.name}: {stage.title}",
            key=key,
            finish=f"    {stage.name}",
            made_by=f"{run.variant}/seed-{run.seed}",
        )
        stages[stage.name] = {
            "key": key,
            "seconds": record["seconds"],
            "cpu_seconds": record.get("cpu_seconds"),
            "ran": ran,
        }
    summary_path, method = run.final_evaluation()
    summary = json.loads(summary_path.read_text(encoding="utf-8"))["methods"][method]
    record = {
        "variant": run.variant,
        "seed": run.seed,
        "method": method,
        "hits1": summary["hits1"],
        "format_valid": summary["format_valid"],
        "n": summary["n"],
        "oracle_hits1": oracle_hits1(run),
        "hits1_by_hops": {hops: group["hits1"] for hops, group in summary.get("by_hops", {}).items()},
        "keys": run.keys,
        "stages": stages,
    }
    write_json(record_path, record)
    return record, False


def oracle_hits1(run: Run) -> float | None:
    """Hits@1 of the gold path walked with the run's tool (a unified run's first evaluation): how much
    the tool's ranking alone allows; None for a pipeline run."""
    if isinstance(run.demo, PipelineRun):
        return None
    path = Path(run.demo.paths["eval"]) / run.demo.first_eval / "summary.json"
    return json.loads(path.read_text(encoding="utf-8"))["methods"]["oracle"]["hits1"]


def run_line(number: int, total: int, run: Run, record: dict[str, Any], earlier: bool) -> str:
    head = (
        f"[{number}/{total}] {run.label}: Hits@1 {record['hits1']:.3f}, format-valid {record['format_valid']:.3f} "
        f"({record['n']} test questions)"
    )
    if earlier:
        return f"{head}; finished earlier, skipped"
    ran = [name for name, s in record["stages"].items() if s["ran"]]
    reused = [name for name, s in record["stages"].items() if not s["ran"]]
    seconds = sum(record["stages"][name]["seconds"] for name in ran)
    return f"{head}; ran {', '.join(ran) or 'nothing'} ({seconds:.1f}s)" + (
        f", reused {', '.join(reused)}" if reused else ""
    )


# --- the table ---------------------------------------------------------------------------------------------
def training_cpu_seconds(record: dict[str, Any]) -> float | None:
    """CPU seconds of a run's `TRAINING_STAGES` (each counted whole, shared with other runs or not);
    None for a record without stages, or with a training stage that has none recorded (a result from
    before they were)."""
    if "stages" not in record:
        return None
    seconds = [stage.get("cpu_seconds") for name, stage in record["stages"].items() if name in TRAINING_STAGES]
    return None if any(s is None for s in seconds) else sum(seconds)


def _mean(values: Sequence[float | None]) -> float | None:
    numbers = [v for v in values if v is not None]
    return None if not values or len(numbers) < len(values) else sum(numbers) / len(numbers)


def summarize_results(
    records: dict[str, dict[int, dict[str, Any]]], variants: Sequence[str], seeds: Sequence[int], reference: str
) -> dict[str, dict[str, Any]]:
    """Per variant (those with a result, and the reference): Hits@1, format-valid, the oracle's Hits@1 and
    the training CPU seconds per seed, the means over the seeds (None until every seed finished), the
    difference to the reference's mean, and the mean Hits@1 by hop count (None unless every seed has it)."""
    rows: dict[str, dict[str, Any]] = {}
    for name in variants:
        found = records.get(name, {})
        if name != reference and not any(seed in found for seed in seeds):
            continue
        hits = {seed: found[seed]["hits1"] if seed in found else None for seed in seeds}
        valid = {seed: found[seed]["format_valid"] if seed in found else None for seed in seeds}
        complete = all(seed in found for seed in seeds)
        rows[name] = {
            "hits1": hits,
            "format_valid": valid,
            "n": {seed: found[seed]["n"] if seed in found else None for seed in seeds},
            "oracle_hits1": {seed: found[seed].get("oracle_hits1") if seed in found else None for seed in seeds},
            "mean": _mean(list(hits.values())) if complete else None,
            "format_valid_mean": _mean(list(valid.values())) if complete else None,
        }
        by_hops = {seed: found[seed].get("hits1_by_hops", {}) if seed in found else {} for seed in seeds}
        hop_counts = sorted({h for groups in by_hops.values() for h in groups}, key=int)
        rows[name]["hits1_by_hops"] = {h: _mean([by_hops[seed].get(h) for seed in seeds]) for h in hop_counts}
        cpu = {seed: training_cpu_seconds(found[seed]) if seed in found else None for seed in seeds}
        rows[name]["training_cpu_seconds"] = cpu
        rows[name]["training_cpu_mean"] = _mean(list(cpu.values()))
    ref = rows.get(reference, {}).get("mean")
    for name, row in rows.items():
        row["delta"] = None if ref is None or row["mean"] is None or name == reference else row["mean"] - ref
    return rows


def _cell(value: float | None, signed: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.3f}" if signed else f"{value:.3f}"


def render_table(rows: dict[str, dict[str, Any]], seeds: Sequence[int], reference: str) -> list[str]:
    """The Markdown table: variant, Hits@1 per seed, mean, difference to the reference, format-valid, mean
    Hits@1 by hop count (the hop counts of any row), mean training CPU seconds."""
    hop_counts = sorted({h for row in rows.values() for h in row.get("hits1_by_hops", {})}, key=int)
    lines = [
        "| variant | "
        + " | ".join(f"Hits@1 seed {s}" for s in seeds)
        + f" | mean | vs {reference} | "
        + "format-valid | "
        + "".join(f"{h}-hop | " for h in hop_counts)
        + "training CPU s |",
        "|---|" + "---|" * len(seeds) + "---|---|---|" + "---|" * len(hop_counts) + "---|",
    ]
    for name, row in rows.items():
        delta = "reference" if name == reference else _cell(row["delta"], signed=True)
        cells = [_cell(row["hits1"][s]) for s in seeds] + [_cell(row["mean"]), delta, _cell(row["format_valid_mean"])]
        cells += [_cell(row.get("hits1_by_hops", {}).get(h)) for h in hop_counts]
        cpu = row.get("training_cpu_mean")
        cells.append("-" if cpu is None else f"{cpu:.0f}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


def budget_line(demo: Demo) -> str:
    """The training and evaluation budget every variant shares, as the reference run uses it."""
    sft, grpo, model = demo.sft.config, demo.grpo.config, demo.model.config
    episodes = ", ".join(
        f"episode {i} {e.max_steps} step{'s' * (e.max_steps != 1)} ({e.data})" for i, e in enumerate(grpo.episodes, 1)
    )
    limit = "" if demo.config.eval_questions is None else f" (at most {demo.config.eval_questions})"
    sft_setting, grpo_setting = sft.setting, grpo.setting
    return (
        f"model hidden {model.hidden_size}, {model.num_layers} layers, trained from scratch; "
        f"SFT {sft_setting('max_steps')} steps x {sft_setting('per_device_train_batch_size')} trajectories "
        f"(lr {sft_setting('learning_rate'):g}); GRPO {episodes}, {grpo_setting('num_generations')} rollouts per "
        f"question, {grpo_setting('per_device_train_batch_size')} completions per step "
        f"(lr {grpo_setting('learning_rate'):g}); greedy evaluation on the test split{limit}"
    )


def render_markdown(
    title: str,
    notes: Sequence[str],
    table: Sequence[str],
    variants: dict[str, Variant],
    rows: dict[str, dict[str, Any]],
) -> str:
    lines = [f"# {title}", "", *[f"- {note}" for note in notes], "", *table, "", "Variants:", ""]
    lines += [f"- `{name}`: {variants[name].help}" for name in rows]
    lines += [
        "",
        "`-`: not run yet. The mean and the difference are over every seed; format-valid is the mean "
        "rate of replies in the method's own format (the think/search/answer protocol for the unified "
        "variants, the pipeline's answer format for a pipeline row). The h-hop columns are the mean Hits@1 on "
        "the test questions of h hops; training CPU s the mean CPU seconds of the SFT and GRPO "
        "stages (each counted whole, though runs share a stage). ablations.json also gives each run's oracle "
        "Hits@1 (the gold path walked with that run's tool: what its ranking allows).",
        "",
    ]
    return "\n".join(lines)


def write_outputs(
    config: AblationConfig, config_path: str | None, demo: Demo, out: Path, seeds: Sequence[int]
) -> Path:
    """OUT/ablations.md and OUT/ablations.json from every finished run of the config's variants;
    `demo` is the reference's (the budget and data it states)."""
    records: dict[str, dict[int, dict[str, Any]]] = {}
    for name in config.variants:
        for seed in seeds:
            path = out / "runs" / name / f"seed-{seed}" / RESULT_FILE
            if path.exists():
                records.setdefault(name, {})[seed] = read_record(path, RUN_FIELDS, "run")
    rows = summarize_results(records, list(config.variants), seeds, config.reference)
    data = (
        f"{demo.source} ({demo.config.split_scheme} split)"
        if demo.source != "synthetic"
        else "synthetic KG and questions"
    )
    computed = {
        (name, s["key"]): s["seconds"]
        for by_seed in records.values()
        for record in by_seed.values()
        for name, s in record["stages"].items()
    }
    notes = [
        f"Data: {data}; Hits@1 of each run's final checkpoint on the test split.",
        f"Seeds: {', '.join(map(str, seeds))} (warm-up sampling, model initialisation, SFT, GRPO); data, "
        f"KG and ranker made once with seed {config.data_seed}.",
        f"Budget, the same for every variant: {budget_line(demo)}.",
        f"Settings: {config_path or 'defaults'} on top of {config.demo}"
        + (f" with {', '.join(overrides(config.set))}" if config.set else "")
        + "; each variant's changes are listed below.",
        f"Compute: {sum(computed.values()) / 60:.1f} min of stages (a stage shared by several runs counted once).",
    ]
    table = render_table(rows, seeds, config.reference)
    markdown = out / "ablations.md"
    markdown.write_text(
        render_markdown(f"Ablations: {demo.source}", notes, table, config.variants, rows), encoding="utf-8"
    )
    write_json(
        out / "ablations.json",
        {
            "config": config_path,
            "demo": config.demo,
            "set": config.set,
            "data": demo.source,
            "split": "test",
            "seeds": list(seeds),
            "data_seed": config.data_seed,
            "reference": config.reference,
            "budget": budget_line(demo),
            "variants": {
                name: {"help": config.variants[name].help, **{k: _by_seed(v) for k, v in row.items()}}
                for name, row in rows.items()
            },
            "compute_seconds": round(sum(computed.values()), 2),
        },
    )
    return markdown


def _by_seed(value: Any) -> Any:
    return {str(k): v for k, v in value.items()} if isinstance(value, dict) else value


def run_ablation(
    config: AblationConfig,
    out: str | Path,
    only: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    threads: int | None = None,
    config_path: str | None = None,
) -> Path:
    """Plan every run (validating all settings), run or skip each, write the table after each; returns ablations.md."""
    import torch

    out = Path(out)
    seeds = check_seeds(list(seeds), "--seeds") if seeds else config.seeds
    runs = plan(config, out, only, seeds)
    reference = make_demo(
        config,
        resolve_recipe(config.demo),
        config.reference,
        seeds[0],
        out / "runs" / config.reference / f"seed-{seeds[0]}",
    )
    log_progress()
    threads = threads or default_threads()
    torch.set_num_threads(threads)
    print(
        f"kgreasoner ablate: {len(runs)} runs ({len({r.variant for r in runs})} variants x seeds "
        f"{', '.join(map(str, seeds))}) -> {out} ({threads} torch thread{'s' * (threads > 1)})",
        flush=True,
    )
    started = time.perf_counter()
    markdown = out / "ablations.md"
    for number, run in enumerate(runs, 1):
        print(f"[{number}/{len(runs)}] {run.label} ...", flush=True)
        record, earlier = execute(run, out, threads)
        print(run_line(number, len(runs), run, record, earlier), flush=True)
        markdown = write_outputs(config, config_path, reference, out, seeds)
    print(f"kgreasoner ablate: finished in {time.perf_counter() - started:.1f}s; table: {markdown}", flush=True)
    return markdown


# --- command line ------------------------------------------------------------------------------------------
def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _seeds(text: str) -> list[int]:
    try:
        return [int(part) for part in _names(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--seeds takes integers separated by commas, got {text!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "ablate",
        help="the paper's ablations at small scale: one run per variant and seed, one table",
        description=(
            __doc__
            + "\nFields of the --config YAML (AblationConfig):\n"
            + describe(AblationConfig)
            + "\n\nFields of each variant (Variant):\n"
            + describe(Variant)
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser)
    parser.add_argument("--out", required=True, type=Path, help="folder of the runs, the shared stages and the table")
    parser.add_argument(
        "--only", type=_names, default=None, help="run only these variants (names separated by commas)"
    )
    parser.add_argument("--seeds", type=_seeds, default=None, help="seeds separated by commas (default: the config's)")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch CPU threads of every stage (0: OMP_NUM_THREADS when set, else every core this process may use)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.config is None:
        raise ValueError(
            "--config is required: configs/ablations/pathquestion.yaml, configs/ablations/quick.yaml or your own"
        )
    if args.threads < 0:
        raise ValueError(f"--threads must be >= 0, got {args.threads}")
    config = load_config(AblationConfig, args.config, args.overrides)
    run_ablation(config, args.out, args.only, args.seeds, args.threads or None, str(args.config))
    return 0
