"""`kgreasoner ablate`: config errors, the settings each run's stages use, shared stages, the table."""

import dataclasses
import json
import re
import shlex
import time
from pathlib import Path

import pytest

from kgreasoner.ablate import (
    AblationConfig,
    PipelineRun,
    execute,
    make_demo,
    plan,
    render_table,
    summarize_results,
    training_cpu_seconds,
    write_outputs,
)
from kgreasoner.cli import build_parser, main
from kgreasoner.config import ConfigError, load_config, resolve_recipe
from kgreasoner.stages import Stage, stage_key

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "configs/ablations/quick.yaml"
PATHQUESTION = ROOT / "configs/ablations/pathquestion.yaml"
VARIANTS = [
    "full",
    "no_backtracking",
    "pipeline_tog",
    "no_warmup",
    "no_hard_cases",
    "no_guided_groups",
    "no_search_reward",
    "no_format_reward",
    "no_answer_reward",
    "no_context_aggregation",
    "sft_only",
]
UNIFIED_STAGES = ["data", "kg", "ranker", "warmup", "model", "sft", "grpo", "eval"]


def _runs(path: Path, out: Path, **kwargs) -> dict:
    return {(r.variant, r.seed): r for r in plan(load_config(AblationConfig, path), out, **kwargs)}


def _settings(run, stage: str) -> dict:
    """A stage config as a dict, with the run's own folder written as {run} (runs differ there)."""
    text = json.dumps(dataclasses.asdict(getattr(run.demo, stage).config), default=str)
    return json.loads(text.replace(str(run.folder), "{run}"))


def _diff(a: dict, b: dict, prefix: str = "") -> set[str]:
    """Dotted keys whose values differ."""
    keys = set()
    for key in set(a) | set(b):
        x, y = a.get(key), b.get(key)
        if isinstance(x, dict) and isinstance(y, dict):
            keys |= _diff(x, y, f"{prefix}{key}.")
        elif x != y:
            keys.add(f"{prefix}{key}")
    return keys


# --- config parsing -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", [QUICK, PATHQUESTION])
def test_both_yamls_hold_every_variant_with_two_seeds(path):
    config = load_config(AblationConfig, path)
    assert list(config.variants) == VARIANTS
    assert config.seeds == [0, 1] and config.reference == "full" and config.data_seed == 0
    assert all(v.help for v in config.variants.values())
    assert config.variants["pipeline_tog"].pipeline.set == {"method": "tog"}
    assert config.variants["no_backtracking"].set == {"warmup.set.correction_share": 0}


def test_defaults_and_config_errors_name_the_field(tmp_path):
    config = load_config(AblationConfig, None, ["variants={full: {}}"])
    assert config.seeds == [0, 1] and config.demo == "configs/demo/full.yaml" and config.variants["full"].set == {}
    cases = [
        (["variants.full.sett={a: 1}"], r"variants.full: unknown key\(s\) \['sett'\] for Variant"),
        (["variants.full.pipeline={config: x, sett: {}}"], r"variants.full: pipeline: unknown key\(s\) \['sett'\]"),
        (["variants.full.set={seed: 3}"], "variants.full: set: seed is set by the ablation"),
        (["variants.full={}", "set={seed: 3}"], "set: seed is set by the ablation"),
        (["variants.full={}", "reference=fulll"], "reference 'fulll' is not one of the variants"),
        (["variants.full={}", "seeds=[]"], "seeds must be a non-empty list of integers"),
        (["variants.full={}", "seeds=[1, 1]"], "seeds must not repeat a seed"),
        (["variants.full={}", "seeds=[a]"], "seeds must be a non-empty list of integers"),
        (["variants={a/b: {}}", "reference=a/b"], "name 'a/b' must be letters"),
        ([], "variants must map at least one variant"),
        (["variants.full={}", "seedz=[0]"], r"unknown key\(s\) \['seedz'\] for AblationConfig"),
    ]
    for sets, message in cases:
        with pytest.raises(ConfigError, match=message):
            load_config(AblationConfig, None, sets)


def test_bad_variant_settings_name_the_variant_stage_and_field(tmp_path):
    def config(*sets):
        return load_config(AblationConfig, QUICK, list(sets))

    with pytest.raises(ConfigError, match="variant no_backtracking: demo stage warmup: .*correction_share must be in"):
        plan(config("variants.no_backtracking.set={warmup.set.correction_share: 2}"), tmp_path)
    with pytest.raises(ConfigError, match=r"variant full: .*unknown key\(s\) \['sfft'\]"):
        plan(config("variants.full.set={sfft.set.max_steps: 3}"), tmp_path)
    with pytest.raises(ConfigError, match="variant pipeline_tog: demo stage pipeline: .*method must be one of"):
        plan(config("variants.pipeline_tog.pipeline.set={method: io}"), tmp_path)
    with pytest.raises(ConfigError, match="variant pipeline_tog: pipeline.set: output is set by the demo"):
        plan(config("variants.pipeline_tog.pipeline.set={method: tog, output: x}"), tmp_path)
    with pytest.raises(ConfigError, match="variant pipeline_tog: a pipeline variant is SFT-trained"):
        plan(config("variants.pipeline_tog.set={sft_warmup: false}"), tmp_path)
    with pytest.raises(ValueError, match="--only: nope not among the variants"):
        plan(config(), tmp_path, only=["full", "nope"])
    assert len(plan(config(), tmp_path, only=["no_warmup"], seeds=[3])) == 1


# --- the settings each run would use ---------------------------------------------------------------------------
@pytest.mark.parametrize("path", [QUICK, PATHQUESTION])
def test_variant_overrides_reach_the_stages_and_nothing_else_changes(path, tmp_path):
    runs = _runs(path, tmp_path)
    assert len(runs) == 22
    sft_only = runs["sft_only", 0]
    assert [s.name for s in sft_only.stages] == ["data", "kg", "ranker", "warmup", "model", "sft", "eval"]
    assert sft_only.demo.warmup_all_file == sft_only.demo.warmup_file == sft_only.demo.sft.config.train_file
    assert sft_only.final_evaluation()[0].parent.name == "sft"
    full = runs["full", 0]
    assert [s.name for s in full.stages] == UNIFIED_STAGES
    assert full.demo.warmup.config.correction_share == 0.3
    assert (
        full.demo.grpo.config.tool.ranking == "gat"
        and full.demo.grpo.config.tool.ranker_path == full.demo.paths["ranker"]
    )
    assert [e.data for e in full.demo.grpo.config.episodes] == ["all", "hard"]

    def changed(variant: str, stage: str) -> set[str]:
        return _diff(_settings(full, stage), _settings(runs[variant, 0], stage))

    # Warm-up without error correction: only that field of the warm-up, so everything downstream is retrained.
    assert runs["no_backtracking", 0].demo.warmup.config.correction_share == 0.0
    assert changed("no_backtracking", "warmup") == {"correction_share"}
    for stage in ("ranker", "model", "sft", "grpo", "eval"):
        assert changed("no_backtracking", stage) == set(), stage

    # A zero reward weight reaches the GRPO recipe (and TRL's reward_weights through it); nothing before GRPO changes.
    for name, weight in (("search", "search"), ("format", "format"), ("answer", "answer")):
        grpo = runs[f"no_{name}_reward", 0].demo.grpo.config
        assert dataclasses.asdict(grpo.rewards) == {
            **{k: 0.0 if k == weight else 1.0 for k in ("search", "format", "answer")},
            "search_form": "hops",
        }
        assert changed(f"no_{name}_reward", "grpo") == {f"rewards.{weight}"}
        for stage in ("warmup", "model", "sft", "eval"):
            assert changed(f"no_{name}_reward", stage) == set(), stage

    # Episode 2 over all questions, with the same step budgets.
    no_hard = runs["no_hard_cases", 0].demo.grpo.config
    assert [(e.data, e.max_steps) for e in no_hard.episodes] == [
        ("all", e.max_steps) for e in full.demo.grpo.config.episodes
    ]
    assert changed("no_hard_cases", "grpo") == {"episodes"}

    # Guided groups on in full (from the warm-up's records of every training question), off in no_guided_groups.
    assert full.demo.grpo.config.guidance.mode == "gold"
    assert full.demo.grpo.config.guidance.trajectories == full.demo.warmup_all_file
    assert runs["no_guided_groups", 0].demo.grpo.config.guidance.mode == "none"
    assert changed("no_guided_groups", "grpo") == {"guidance.mode"}

    # The ranking kind reaches the tool of the warm-up, GRPO and evaluation, with the ranker's text encoder.
    ctx = runs["no_context_aggregation", 0].demo
    for stage in ("warmup", "grpo", "eval"):
        tool = getattr(ctx, stage).config.tool
        assert tool.ranking == "embedding" and tool.ranker_path is None, stage
        assert (tool.encoder.kind, tool.encoder.hashing_dim) == (
            ctx.ranker.config.encoder.kind,
            ctx.ranker.config.encoder.hashing_dim,
        )
        assert changed("no_context_aggregation", stage) <= {"tool.ranking", "tool.ranker_path", "tool.encoder.kind"}
    assert ctx.ranker.config.encoder.kind == ("hashing" if path == QUICK else "minilm")

    # No warm-up: GRPO and the first evaluation start from the untrained base model; no SFT stage.
    no_warmup = runs["no_warmup", 0]
    assert [s.name for s in no_warmup.stages] == [s for s in UNIFIED_STAGES if s != "sft"]
    assert no_warmup.demo.grpo.config.model == no_warmup.demo.paths["base"]
    assert changed("no_warmup", "grpo") == {"model"}
    assert no_warmup.demo.first_eval == "base" and "eval/base" in no_warmup.stages[-1].commands[0]


@pytest.mark.parametrize("path", [QUICK, PATHQUESTION])
def test_the_pipeline_variant_trains_the_same_architecture_with_the_same_sft_budget(path, tmp_path):
    runs = _runs(path, tmp_path)
    full, tog = runs["full", 0], runs["pipeline_tog", 0]
    assert isinstance(tog.demo, PipelineRun) and tog.demo.method == "tog"
    assert [s.name for s in tog.stages] == ["data", "kg", "pipeline", "model", "sft", "eval"]
    steps = str(tog.folder / "pipeline" / "steps.jsonl")
    pipeline = tog.demo.pipeline.config
    assert (pipeline.method, pipeline.output, pipeline.dataset, pipeline.split_scheme) == (
        "tog",
        steps,
        tog.demo.paths["data"],
        full.demo.config.split_scheme,
    )
    assert pipeline.tog.few_shot is False  # configs/tiny-cpu/pipeline_sft.yaml
    assert tog.demo.eval.config.tog == pipeline.tog  # evaluation prompts are the trained ones
    assert _diff(_settings(full, "sft"), _settings(tog, "sft")) == {"train_file"}
    assert tog.demo.sft.config.train_file == steps
    assert _diff(_settings(full, "model"), _settings(tog, "model")) == set()
    build = build_parser().parse_args(shlex.split(tog.stages[3].commands[0])[1:])
    assert [str(p) for p in build.texts] == [tog.demo.kb_file, steps, tog.demo.paths["data"] + "/questions.jsonl"]
    assert str(build.out) == tog.demo.paths["base"]
    words = shlex.split(tog.stages[-1].commands[0])
    assert words[:4] == ["kgreasoner", "eval", "--methods", "tog"] and f"hf:{tog.demo.paths['sft']}/final" in words
    assert "tog.few_shot=false" in words


def test_seeds_reach_the_training_stages_while_data_kg_and_ranker_keep_data_seed(tmp_path):
    runs = _runs(QUICK, tmp_path)
    for seed in (0, 1):
        demo = runs["full", seed].demo
        assert demo.warmup.config.seed == demo.model.config.seed == seed
        assert demo.sft.config.setting("seed") == demo.grpo.config.setting("seed") == seed
    seed_one = runs["full", 1]
    data, _, ranker = seed_one.stages[:3]
    assert "--seed 0" in data.commands[0] and "seed=0" in shlex.split(ranker.commands[0])
    assert runs["pipeline_tog", 1].demo.pipeline.config.seed == 1


def test_every_printed_command_builds_the_config_the_run_uses(tmp_path):
    """Stage keys are made from the commands, so each must carry all of its stage's settings."""
    from data_gen.pipeline_sft import PipelineSFTConfig
    from data_gen.warmup import WarmupConfig
    from kgreasoner.evaluation.methods import EvalConfig
    from kgreasoner.training.grpo import GRPORecipe
    from kgreasoner.training.sft import SFTRecipe

    classes = {
        "warmup": WarmupConfig,
        "sft": SFTRecipe,
        "grpo": GRPORecipe,
        "pipeline": PipelineSFTConfig,
    }
    for run in _runs(QUICK, tmp_path, seeds=[1]).values():
        for stage in run.stages:
            words = shlex.split(stage.commands[0])
            if stage.name in classes:
                config = words[words.index("--config") + 1] if "--config" in words else None
                sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
                assert load_config(classes[stage.name], config, sets) == getattr(run.demo, stage.name).config, (
                    run.label,
                    stage.name,
                )
            if stage.name == "eval":
                for line in stage.commands:
                    args = build_parser().parse_args(shlex.split(line)[1:])
                    parsed = load_config(EvalConfig, args.config, args.overrides)
                    parsed.limit = args.limit
                    assert parsed == run.demo.eval.config, run.label


# --- shared stages --------------------------------------------------------------------------------------------
def test_runs_share_a_stage_exactly_when_their_settings_agree_up_to_it(tmp_path):
    runs = _runs(QUICK, tmp_path)

    def shared(a, b) -> list[str]:
        return [s for s in runs[a].keys if runs[a].keys[s] == runs[b].keys.get(s)]

    upto_sft = ["data", "kg", "ranker", "warmup", "model", "sft"]
    for variant in ("no_hard_cases", "no_guided_groups", "no_search_reward", "no_format_reward", "no_answer_reward"):
        assert shared(("full", 0), (variant, 0)) == upto_sft
    assert shared(("full", 0), ("no_warmup", 0)) == ["data", "kg", "ranker", "warmup", "model"]
    for variant in ("no_backtracking", "no_context_aggregation"):
        assert shared(("full", 0), (variant, 0)) == ["data", "kg", "ranker"]
    assert shared(("full", 0), ("full", 1)) == ["data", "kg", "ranker"]
    assert shared(("pipeline_tog", 0), ("full", 0)) == ["data", "kg"]
    assert shared(("pipeline_tog", 0), ("pipeline_tog", 1)) == ["data", "kg"]
    # The same settings planned into another OUT give the same keys (the run folder is left out).
    other = _runs(QUICK, tmp_path / "elsewhere", only=["full"], seeds=[0])
    assert other["full", 0].keys == runs["full", 0].keys


def test_a_stage_key_covers_the_recipe_file_the_command_names(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("max_steps: 10\n")

    def key(folder: Path) -> str:
        return stage_key(
            "prev",
            Stage("sft", "", [f"python train/sft.py --config {recipe} --set run_dir={folder}/sft"], dict),
            folder,
        )

    first = key(tmp_path / "a")
    assert key(tmp_path / "b") == first
    recipe.write_text("max_steps: 20\n")
    assert key(tmp_path / "a") != first


# --- the table --------------------------------------------------------------------------------------------------
def test_the_table_from_hand_made_results():
    def result(hits1: float, valid: float) -> dict:
        return {"hits1": hits1, "format_valid": valid, "n": 30}

    records = {
        "full": {0: result(0.5, 1.0), 1: result(0.4, 0.9)},
        "no_backtracking": {0: result(0.3, 1.0), 1: result(0.35, 0.8)},
        "no_warmup": {0: result(0.0, 0.0)},
        "no_search_reward": {7: result(0.9, 1.0)},  # a seed not asked for: not a row
        "pipeline_tog": {0: result(0.6, 0.5), 1: result(0.7, 0.7)},
    }
    rows = summarize_results(records, VARIANTS, [0, 1], "full")
    assert list(rows) == ["full", "no_backtracking", "pipeline_tog", "no_warmup"]
    assert rows["no_backtracking"]["mean"] == pytest.approx(0.325) and rows["no_backtracking"][
        "delta"
    ] == pytest.approx(-0.125)
    assert rows["no_warmup"]["mean"] is None and rows["no_warmup"]["hits1"] == {0: 0.0, 1: None}
    assert render_table(rows, [0, 1], "full") == [
        "| variant | Hits@1 seed 0 | Hits@1 seed 1 | mean | vs full | format-valid | training CPU s |",
        "|---|---|---|---|---|---|---|",
        "| full | 0.500 | 0.400 | 0.450 | reference | 0.950 | - |",
        "| no_backtracking | 0.300 | 0.350 | 0.325 | -0.125 | 0.900 | - |",
        "| pipeline_tog | 0.600 | 0.700 | 0.650 | +0.200 | 0.600 | - |",
        "| no_warmup | 0.000 | - | - | - | - | - |",
    ]
    # Without the reference's results the reference row is still there, and no difference is given.
    rows = summarize_results({"no_warmup": {0: result(0.25, 1.0)}}, VARIANTS, [0], "full")
    assert render_table(rows, [0], "full")[2:] == [
        "| full | - | - | reference | - | - |",
        "| no_warmup | 0.250 | 0.250 | - | 1.000 | - |",
    ]


def test_the_table_gives_hits1_by_hop_count_and_training_cpu_seconds_from_the_result_files(tmp_path):
    config = load_config(AblationConfig, QUICK)
    reference = make_demo(config, resolve_recipe(config.demo), "full", 0, tmp_path / "runs/full/seed-0")

    def write(name: str, seed: int, hits1: float, by_hops: dict, cpu: dict) -> None:
        stages = {
            stage: {"key": "k", "seconds": 1.0, "cpu_seconds": seconds, "ran": True} for stage, seconds in cpu.items()
        }
        record = {
            "variant": name,
            "seed": seed,
            "method": "kgreasoner",
            "hits1": hits1,
            "format_valid": 1.0,
            "n": 30,
            "oracle_hits1": 0.9,
            "hits1_by_hops": by_hops,
            "keys": {},
            "stages": stages,
        }
        (tmp_path / "runs" / name / f"seed-{seed}").mkdir(parents=True, exist_ok=True)
        (tmp_path / "runs" / name / f"seed-{seed}" / "result.json").write_text(json.dumps(record))

    # data, kg, warmup and eval are no training: only sft and grpo count
    write(
        "full",
        0,
        0.5,
        {"1": 0.8, "2": 0.4, "3": 0.1},
        {"data": 50.0, "warmup": 70.0, "sft": 100.0, "grpo": 310.0, "eval": 40.0},
    )
    write("full", 1, 0.4, {"1": 0.6, "2": 0.3, "3": 0.3}, {"sft": 110.0, "grpo": 332.0})
    write("sft_only", 0, 0.3, {"1": 0.5, "2": 0.2}, {"sft": 101.0, "eval": 30.0})
    write("sft_only", 1, 0.2, {"1": 0.3, "2": 0.1, "3": 0.0}, {"sft": 99.0})
    write("no_warmup", 0, 0.0, {"1": 0.0}, {"grpo": 200.0})
    # a result from before CPU seconds were recorded: no training CPU for its row
    write("no_hard_cases", 0, 0.1, {}, {"sft": None, "grpo": 5.0})
    write("no_hard_cases", 1, 0.1, {}, {"sft": 1.0, "grpo": 5.0})
    markdown = write_outputs(config, str(QUICK), reference, tmp_path, [0, 1]).read_text()
    table = [line for line in markdown.splitlines() if line.startswith("|")]
    assert table == [
        "| variant | Hits@1 seed 0 | Hits@1 seed 1 | mean | vs full | format-valid | 1-hop | 2-hop | 3-hop "
        "| training CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        "| full | 0.500 | 0.400 | 0.450 | reference | 1.000 | 0.700 | 0.350 | 0.200 | 426 |",
        "| no_warmup | 0.000 | - | - | - | - | - | - | - | - |",
        "| no_hard_cases | 0.100 | 0.100 | 0.100 | -0.350 | 1.000 | - | - | - | - |",
        "| sft_only | 0.300 | 0.200 | 0.250 | -0.200 | 1.000 | 0.400 | 0.150 | - | 100 |",
    ]
    saved = json.loads((tmp_path / "ablations.json").read_text())["variants"]
    assert saved["full"]["hits1_by_hops"] == {
        "1": pytest.approx(0.7),
        "2": pytest.approx(0.35),
        "3": pytest.approx(0.2),
    }
    assert saved["full"]["training_cpu_seconds"] == {"0": 410.0, "1": 442.0}
    assert saved["full"]["training_cpu_mean"] == 426.0
    assert saved["no_hard_cases"]["training_cpu_seconds"] == {"0": None, "1": 6.0}


@pytest.mark.parametrize(
    ("text", "wrong"),
    [
        ('{"variant": "full", "hits1": 0.5, "form', "not a readable run record, cut short or not JSON"),
        ('{"variant": "full", "format_valid": 1.0, "n": 30, "stages": {}}', "run record without 'hits1'"),
    ],
)
def test_a_broken_result_file_is_refused_naming_it(text, wrong, tmp_path):
    config = load_config(AblationConfig, QUICK)
    reference = make_demo(config, resolve_recipe(config.demo), "full", 0, tmp_path / "runs/full/seed-0")
    path = tmp_path / "runs" / "full" / "seed-0" / "result.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: {wrong}.*; delete it and the run runs again$"):
        write_outputs(config, str(QUICK), reference, tmp_path, [0])


def test_a_run_records_hits1_by_hop_count_and_the_cpu_seconds_of_each_stage(tmp_path):
    """The stages are stand-ins (training takes minutes): each burns some CPU, eval writes the summaries."""
    out = tmp_path / "ablate"
    [run] = plan(load_config(AblationConfig, QUICK), out, only=["full"], seeds=[0])
    summary = {
        "hits1": 0.5,
        "format_valid": 1.0,
        "n": 30,
        "by_hops": {
            "1": {"n": 10, "hits1": 0.8, "f1": 0.8, "em": 0.8},
            "2": {"n": 20, "hits1": 0.35, "f1": 0.4, "em": 0.3},
        },
    }

    def busy() -> dict:
        end = time.process_time() + 0.05
        while time.process_time() < end:
            pass
        return {"line": "done"}

    def evaluate() -> dict:
        evaluations = Path(run.demo.paths["eval"])
        for folder, method in (("grpo", "kgreasoner"), (run.demo.first_eval, "oracle")):
            (evaluations / folder).mkdir(parents=True, exist_ok=True)
            (evaluations / folder / "summary.json").write_text(json.dumps({"methods": {method: summary}}))
        return {"line": "evaluated"}

    run.stages = [Stage(s.name, s.title, s.commands, evaluate if s.name == "eval" else busy) for s in run.stages]
    record, earlier = execute(run, out, threads=1)
    assert not earlier and record["hits1_by_hops"] == {"1": 0.8, "2": 0.35}
    assert set(record["stages"]) == set(UNIFIED_STAGES)
    assert all(stage["cpu_seconds"] >= 0.04 for name, stage in record["stages"].items() if name != "eval")
    assert training_cpu_seconds(record) == pytest.approx(
        sum(record["stages"][name]["cpu_seconds"] for name in ("sft", "grpo"))
    )


# --- command line -------------------------------------------------------------------------------------------------
def test_the_command_line(tmp_path, capsys):
    args = build_parser().parse_args(
        [
            "ablate",
            "--config",
            str(QUICK),
            "--out",
            str(tmp_path),
            "--only",
            "full,no_warmup",
            "--seeds",
            "0,2",
            "--set",
            "data_seed=1",
        ]
    )
    assert (args.only, args.seeds, args.overrides, args.threads) == (["full", "no_warmup"], [0, 2], ["data_seed=1"], 0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["ablate", "--config", str(QUICK), "--out", str(tmp_path), "--seeds", "0,x"])
    assert main(["ablate", "--out", str(tmp_path)]) == 1
    assert "--config is required" in capsys.readouterr().err
    assert main(["ablate", "--config", str(QUICK), "--out", str(tmp_path), "--only", "nope"]) == 1
    assert "--only: nope not among the variants" in capsys.readouterr().err
    assert main(["ablate", "--config", str(QUICK), "--out", str(tmp_path), "--seeds", "1,1"]) == 1
    assert "--seeds must not repeat a seed" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists()  # settings are checked before any work


@pytest.mark.slow
def test_quick_ablation_of_two_variants_end_to_end_then_resumes(tmp_path, capsys):
    out = tmp_path / "ablate"
    argv = [
        "ablate",
        "--config",
        str(QUICK),
        "--out",
        str(out),
        "--only",
        "full,no_search_reward",
        "--seeds",
        "0",
        "--threads",
        "1",
    ]
    started = time.perf_counter()
    assert main(argv) == 0
    first = time.perf_counter() - started
    log = capsys.readouterr().out
    assert "[1/2] full, seed 0: Hits@1 " in log and "ran data, kg, ranker, warmup, model, sft, grpo, eval" in log
    assert "[2/2] no_search_reward, seed 0: Hits@1 " in log and "ran grpo, eval" in log
    assert "reused data, kg, ranker, warmup, model, sft" in log

    # The second run's stage folders up to SFT are the first run's; its GRPO and evaluation its own.
    full, other = out / "runs/full/seed-0", out / "runs/no_search_reward/seed-0"
    for folder in ("data", "kg", "ranker", "warmup", "base", "sft"):
        assert (full / folder).is_symlink() and (full / folder).resolve() == (other / folder).resolve(), folder
    for folder in ("grpo", "eval"):
        assert (full / folder).resolve() != (other / folder).resolve()
    assert (other / "grpo/episode-2/final/config.json").exists()
    steps = [json.loads(x) for x in (other / "grpo/steps.jsonl").read_text().splitlines()]
    assert [(r["episode"], r["step"]) for r in steps if "loss" in r] == [(1, 1), (1, 2), (2, 1)]

    table = json.loads((out / "ablations.json").read_text())
    assert list(table["variants"]) == ["full", "no_search_reward"] and table["seeds"] == [0]
    for name in ("full", "no_search_reward"):
        record = json.loads((out / "runs" / name / "seed-0" / "result.json").read_text())
        row = table["variants"][name]
        assert row["hits1"] == {"0": record["hits1"]} and row["mean"] == record["hits1"] and record["n"] == 30
        assert row["oracle_hits1"] == {"0": record["oracle_hits1"]} and record["oracle_hits1"] > 0.5
    markdown = (out / "ablations.md").read_text()
    assert "- Seeds: 0 (" in markdown and "SFT 30 steps x 8 trajectories" in markdown
    assert "| variant | Hits@1 seed 0 | mean | vs full | format-valid |" in markdown
    assert f"| full | {table['variants']['full']['mean']:.3f} |" in markdown

    # A second invocation finds both runs finished and skips them.
    assert main(argv) == 0
    log = capsys.readouterr().out
    assert log.count("finished earlier, skipped") == 2 and "ran " not in log
    print(f"quick ablation of two variants: {first:.1f}s")
