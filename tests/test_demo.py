"""`kgreasoner demo`: settings, the printed commands, and `--quick` end to end."""

import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kgreasoner.cli import build_parser, main
from kgreasoner.config import ConfigError, load_config
from kgreasoner.demo import STAGE_NAMES, Demo, DemoConfig, cli_value
from kgreasoner.demo_report import GRPO_METHOD, SFT_METHOD

ROOT = Path(__file__).resolve().parents[1]


def _leaves(values, prefix=""):
    """Every (dotted key, value) of a nested mapping."""
    for key, value in values.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def test_the_demo_defaults_live_in_democonfig_alone():
    """full.yaml names no setting, and quick.yaml only values that differ from DemoConfig's defaults, so no
    YAML repeats (and can drift from) a default."""
    import dataclasses

    import yaml

    assert yaml.safe_load((ROOT / "configs/demo/full.yaml").read_text()) is None
    assert load_config(DemoConfig, ROOT / "configs/demo/full.yaml") == DemoConfig()
    defaults = dict(_leaves(dataclasses.asdict(DemoConfig())))
    named = dict(_leaves(yaml.safe_load((ROOT / "configs/demo/quick.yaml").read_text())))
    assert named and [key for key, value in named.items() if defaults.get(key, object()) == value] == []


def test_a_stage_section_changes_only_the_fields_it_names():
    quick = load_config(DemoConfig, ROOT / "configs/demo/quick.yaml")
    assert quick.synthetic.num_questions == 300 and quick.sft.config == "configs/tiny-cpu/sft.yaml"
    changed = {"per_device_train_batch_size": 8, "max_steps": 150, "eval_steps": 50, "save_steps": 50}
    assert quick.sft.set["trainer"] == {**DemoConfig().sft.set["trainer"], **changed}
    assert quick.model.set == {"num_layers": 2, "tokenizer": {"system_prompt": False}}
    assert quick.warmup_examples == 60 and quick.grpo.set["dev_eval"]["steps"] == 2
    assert quick.grpo.set["rewards"]["search_form"] == "hops"  # the default's, kept
    tool = load_config(DemoConfig, None, ["tool.ranking=embedding"]).tool
    assert tool == {"entity_handles": True, "top_k": 10, "ranking": "embedding"}


@pytest.mark.parametrize("value", ["a b", "null", "3", 0.003, None, [], [{"data": "all", "max_steps": 30}], True])
def test_cli_values_parse_back(value):
    import yaml

    assert yaml.safe_load(cli_value(value)) == value


def _sets(words: list[str]) -> tuple[str | None, list[str]]:
    config = words[words.index("--config") + 1] if "--config" in words else None
    return config, [words[i + 1] for i, w in enumerate(words) if w == "--set"]


def test_every_printed_command_builds_the_config_the_demo_runs(tmp_path):
    """Each stage's command, parsed as the shell would split it, gives the same config object."""
    from data_gen.warmup import WarmupConfig
    from kgreasoner.evaluation.methods import EvalConfig
    from kgreasoner.models import TinyModelConfig
    from kgreasoner.retrieval.training import RankerTrainConfig
    from kgreasoner.training.grpo import GRPORecipe
    from kgreasoner.training.sft import SFTRecipe

    config = load_config(DemoConfig, ROOT / "configs/demo/quick.yaml", ["data=PQ-2H", "eval_questions=7"])
    demo = Demo(config, tmp_path / "out dir")  # a space, quoted in the commands
    stages = {s.name: s for s in demo.stages()}
    assert list(stages) == list(STAGE_NAMES)
    classes = {
        "ranker": (RankerTrainConfig, demo.ranker),
        "warmup": (WarmupConfig, demo.warmup),
        "model": (TinyModelConfig, demo.model),
        "sft": (SFTRecipe, demo.sft),
        "grpo": (GRPORecipe, demo.grpo),
    }
    for name, (cls, stage) in classes.items():
        (line,) = stages[name].commands
        path, sets = _sets(shlex.split(line))
        assert load_config(cls, path, sets) == stage.config, name
    for line in stages["eval"].commands:
        words = shlex.split(line)
        args = build_parser().parse_args(words[1:])
        parsed = load_config(EvalConfig, args.config, args.overrides)
        parsed.limit = args.limit
        assert parsed == demo.eval.config and args.limit == 7 and args.dataset == str(tmp_path / "out dir" / "data")
    assert demo.grpo.config.tool == demo.warmup.config.tool == demo.eval.config.tool
    assert demo.grpo.config.tool.ranking == "gat" and demo.grpo.config.tool.ranker_path == str(
        tmp_path / "out dir" / "ranker"
    )
    assert demo.grpo.config.rollout == demo.eval.config.rollout
    assert shlex.split(stages["data"].commands[0])[:3] == ["kgreasoner", "prepare-data", "PQ-2H"]
    build = build_parser().parse_args(shlex.split(stages["model"].commands[0])[1:])
    assert [str(p) for p in build.texts] == [
        demo.paths["data"] + "/kb.tsv",
        demo.warmup_file,
        demo.paths["data"] + "/questions.jsonl",
    ]
    assert build.text_splits == ["train"]


def test_bad_settings_name_the_stage_and_field(tmp_path):
    full = ROOT / "configs/demo/full.yaml"
    with pytest.raises(ConfigError, match="demo stage sft: .*unknown key.*'max_step'"):
        Demo(load_config(DemoConfig, full, ["sft.set.max_step=3"]), tmp_path)
    with pytest.raises(ConfigError, match="demo stage sft: .*max_steps is a SFTConfig field: set it under trainer:"):
        Demo(load_config(DemoConfig, full, ["sft.set.max_steps=3"]), tmp_path)
    with pytest.raises(ConfigError, match=r"sft.set: trainer.seed is set by the demo"):
        Demo(load_config(DemoConfig, full, ["sft.set.trainer.seed=3"]), tmp_path)
    with pytest.raises(ConfigError, match="grpo.set: run_dir is set by the demo"):
        Demo(load_config(DemoConfig, full, ["grpo.set.run_dir=x"]), tmp_path)
    with pytest.raises(ConfigError, match="demo stage ranker: .*encoder.kind must be one of"):
        Demo(load_config(DemoConfig, full, ["ranker.set.encoder.kind=bert"]), tmp_path)
    with pytest.raises(ConfigError, match="ranker.set: encoder.cache_dir is set by the demo"):
        Demo(load_config(DemoConfig, full, ["ranker.set.encoder.cache_dir=x"]), tmp_path)


def test_a_nested_override_changes_one_field_of_the_recipe_section(tmp_path):
    demo = Demo(
        load_config(DemoConfig, ROOT / "configs/demo/full.yaml", ["ranker.set.encoder.batch_size=7"]), tmp_path
    )
    encoder = demo.ranker.config.encoder
    assert (encoder.kind, encoder.batch_size, encoder.cache_dir) == (
        "minilm",
        7,
        str(tmp_path / "cache" / "embeddings"),
    )
    assert "encoder.batch_size=7" in demo.ranker.sets
    with pytest.raises(ConfigError, match="unknown key"):
        load_config(DemoConfig, None, ["sfft.set.max_steps=3"])
    assert main(["demo", "--quick", "--config", str(ROOT / "configs/demo/full.yaml"), "--out", str(tmp_path)]) == 1


@pytest.mark.slow
def test_quick_demo_end_to_end_then_resumes_by_skipping_every_stage(tmp_path, capsys):
    out = tmp_path / "demo"
    started = time.perf_counter()
    assert main(["demo", "--quick", "--out", str(out), "--threads", "1"]) == 0
    first = time.perf_counter() - started
    log = capsys.readouterr().out
    for number, name in enumerate(STAGE_NAMES, 1):
        assert f"[{number}/9] {name}: " in log
    assert log.count("    $ ") == 10  # one command per stage, two for the evaluation
    assert f"[{STAGE_NAMES.index('sft') + 1}/9] sft: SFT warm-up (1 torch thread) ..." in log
    # the quick world's oracle walks need up to 5 searches (99th percentile; the most 6): 6 turns fit
    budget = [line for line in log.splitlines() if line.startswith("kgreasoner demo: turn budget ")]
    assert len(budget) == 1 and budget[0].startswith("kgreasoner demo: turn budget 6 searches fits: ")

    # Stage outputs.
    data = out / "data"
    assert {p.name for p in data.iterdir()} >= {"kb.tsv", "names.tsv", "questions.jsonl"}
    assert json.loads((out / "kg" / "stats.json").read_text())["triples"] > 0
    assert (out / "ranker" / "ranker.json").exists() and (out / "ranker" / "model.safetensors").exists()
    warmup = [json.loads(x) for x in (out / "warmup" / "warmup.jsonl").read_text().splitlines()]
    assert {r["split"] for r in warmup} == {"train", "dev"}
    for model in ("base", "sft/final", "grpo/episode-1/final", "grpo/episode-2/final"):
        assert (out / model / "config.json").exists() and (out / model / "tokenizer.json").exists(), model
    # episode 2's hard cases: mined from episode 1's own groups, in the run's folder
    assert json.loads((out / "grpo" / "episode-2" / "hard_cases.json").read_text())["sampled"] > 0
    steps = [json.loads(x) for x in (out / "grpo" / "steps.jsonl").read_text().splitlines()]
    assert [(r["episode"], r["step"]) for r in steps if "loss" in r] == [
        (1, 1),
        (1, 2),
        (1, 3),
        (1, 4),
        (2, 1),
        (2, 2),
    ]
    # Greedy dev Hits@1 before each episode and every 2 steps (dev_eval.steps).
    assert [(r["episode"], r["step"]) for r in steps if "dev/hits1" in r] == [(1, 0), (1, 2), (1, 4), (2, 0), (2, 2)]
    # SFT learns from the first 60 training questions of the stratified order; guided groups' gold rows come
    # from every training question's trajectory.
    every = [json.loads(x) for x in (out / "warmup" / "all.jsonl").read_text().splitlines()]
    sample = {r["id"] for r in warmup if r["split"] == "train"}
    assert len(sample) == 60 and sample < {r["id"] for r in every if r["split"] == "train"}
    sft_eval = json.loads((out / "eval" / "sft" / "summary.json").read_text())
    grpo_eval = json.loads((out / "eval" / "grpo" / "summary.json").read_text())
    assert set(sft_eval["methods"]) == {"kgreasoner", "oracle"} and set(grpo_eval["methods"]) == {"kgreasoner"}
    assert sft_eval["methods"]["kgreasoner"]["n"] == 30 and sft_eval["methods"]["oracle"]["hits1"] > 0.5

    # The report folder: table rows per method, figures, every stage's command and time; no checkpoint.
    report = out / "report"
    assert {p.name for p in report.iterdir()} == {
        "report.md",
        "results.json",
        "sft_loss.png",
        "grpo_curves.png",
    }
    text = (report / "report.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    for method in (SFT_METHOD, GRPO_METHOD, "oracle"):
        row = next(r for r in rows if r.startswith(f"| {method} | 30 | "))
        assert len(row.split("|")) == 14  # n, Hits@1, F1, EM, format-valid, errors and five costs
    for name in STAGE_NAMES[:-1]:
        assert any(r.startswith(f"| {STAGE_NAMES.index(name) + 1} | {name} | ") for r in rows)
    assert "python train/sft.py --config" in text and "kgreasoner eval --methods kgreasoner,oracle" in text
    assert "\n- Turns: turn budget 6 searches fits: " in text
    for png in ("sft_loss.png", "grpo_curves.png"):
        assert (report / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in text
    results = json.loads((report / "results.json").read_text())
    assert set(results["methods"]) == {SFT_METHOD, GRPO_METHOD, "oracle"}

    # A second run finds every stage done and skips it.
    report_bytes = (report / "report.md").read_bytes()
    started = time.perf_counter()
    assert main(["demo", "--quick", "--out", str(out), "--threads", "1"]) == 0
    second = time.perf_counter() - started
    log = capsys.readouterr().out
    assert log.count("skipped") == 9 and "    $ " not in log
    assert (report / "report.md").read_bytes() == report_bytes
    print(f"quick demo: {first:.1f}s, resumed run {second:.2f}s")

    # Other settings into the same folder are refused, naming what differs.
    assert main(["demo", "--quick", "--out", str(out), "--set", "sft.set.trainer.max_steps=10"]) == 1
    assert "sft differ" in capsys.readouterr().err


def test_a_folder_made_before_a_setting_existed_resumes_with_its_default(tmp_path):
    import dataclasses

    import yaml

    from kgreasoner.demo import check_settings

    config = load_config(DemoConfig, ROOT / "configs/demo/quick.yaml")
    stored = dataclasses.asdict(config)
    del stored["sft_warmup"]  # demo.yaml of a run made before the field existed
    (tmp_path / "demo.yaml").write_text(yaml.safe_dump(stored, sort_keys=False))
    check_settings(tmp_path, config)
    with pytest.raises(ValueError, match=r"\(sft_warmup differ"):
        check_settings(tmp_path, dataclasses.replace(config, sft_warmup=False))


def _install(tmp_path: Path) -> Path:
    """`pip install --no-deps --target` of a copy of the checkout (so the build leaves nothing in it):
    a non-editable install, put first on the path of the child processes below."""
    source = tmp_path / "source"
    for name in ("kgreasoner", "data_gen", "configs"):
        shutil.copytree(ROOT / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


@pytest.mark.slow
def test_an_installed_package_runs_the_demo_from_any_folder(tmp_path):
    """The recipes ship as package data: from a folder with no `configs/`, the installed package's
    demo gets past the warm-up stage (which read `configs/tiny-cpu/templates-copy.yaml` from the
    current folder before) with every stage's recipe resolved up front; the run is stopped there."""
    target = _install(tmp_path)
    shipped = {
        p.relative_to(target / "kgreasoner" / "configs")
        for p in (target / "kgreasoner" / "configs").rglob("*")
        if p.is_file()
    }
    assert shipped == {p.relative_to(ROOT / "configs") for p in (ROOT / "configs").rglob("*") if p.is_file()}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    where = subprocess.run(
        [sys.executable, "-c", "import kgreasoner; print(kgreasoner.__file__)"],
        cwd=elsewhere,
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(target)
    command = [sys.executable, "-m", "kgreasoner.cli", "demo", "--quick", "--out", "out", "--threads", "1"]
    process = subprocess.Popen(
        command, cwd=elsewhere, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log = []
    try:
        for line in process.stdout:
            log.append(line)
            if line.startswith("[5/9] model"):
                break
    finally:
        process.kill()
        process.wait()
    text = "".join(log)
    assert "[4/9] warmup: " in text and line.startswith("[5/9] model"), text[-3000:]
    assert (elsewhere / "out" / "warmup" / "warmup.jsonl").read_text().strip()


def test_recipe_paths_resolve_against_the_packages_configs_from_any_folder(tmp_path, monkeypatch):
    from data_gen.warmup import load_templates
    from kgreasoner.config import PACKAGE_CONFIGS
    from kgreasoner.models import TinyModelConfig

    monkeypatch.chdir(tmp_path)
    quick = "configs/demo/quick.yaml"
    assert load_config(DemoConfig, quick) == load_config(DemoConfig, ROOT / quick)
    assert load_config(TinyModelConfig, "configs/tiny-cpu/model-1m.yaml").hidden_size > 0
    templates = "configs/tiny-cpu/templates-copy.yaml"
    assert load_templates(templates) == load_templates(ROOT / templates)
    # The whole demo's stage recipes (the warm-up's templates among them) are built from here.
    Demo(load_config(DemoConfig, "configs/demo/quick.yaml"), tmp_path / "out")
    with pytest.raises(ConfigError) as err:
        load_config(DemoConfig, "configs/demo/nothing.yaml")
    assert str(err.value) == (
        f"config file not found: configs/demo/nothing.yaml not found here ({tmp_path}) or in "
        f"the package's configs ({PACKAGE_CONFIGS})"
    )
    # A file of the current folder comes first.
    (tmp_path / "configs" / "demo").mkdir(parents=True)
    (tmp_path / "configs" / "demo" / "quick.yaml").write_text("eval_questions: 3\n", encoding="utf-8")
    assert load_config(DemoConfig, "configs/demo/quick.yaml").eval_questions == 3


def test_the_data_stage_summary_counts_the_warnings_of_its_questions(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "kb.tsv").write_text("e.utah\tcapital\te.slc\ne.slc\tcontained_by\te.utah\n", encoding="utf-8")
    questions = [
        {
            "id": f"q{i}",
            "question": "what is the capital of utah",
            "split": split,
            "topic_entities": [{"id": "e.utah"}],
            "answers": [{"id": answer}],
            "gold_paths": [["capital"]],
        }
        for i, (split, answer) in enumerate([("train", "e.slc"), ("dev", "e.slc"), ("test", "e.ogden")])
    ]
    (folder / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
    demo = Demo(load_config(DemoConfig, ROOT / "configs/demo/quick.yaml", [f"data={folder}"]), tmp_path / "out")
    result = demo.run_data()
    assert result["warnings"] == {"answers_not_in_kb": 1, "gold_paths_missing_answers": 1}
    assert result["line"] == (
        "3 questions (train/dev/test 1/1/1), 3 with gold paths; "
        "warnings: 1 answers not in kb, 1 gold paths missing answers"
    )


def test_the_turn_budget_is_the_oracles_99th_percentile_plus_one_and_never_lower():
    from kgreasoner.demo import turn_budget

    # nearest rank: the 99th of 100 counts is the 99th smallest
    assert turn_budget([2] * 99 + [9], 6).max_turns == 6
    raised = turn_budget([2] * 98 + [9, 9], 6)
    assert (raised.percentile, raised.most, raised.needed, raised.max_turns, raised.raised) == (9, 9, 10, 10, True)
    assert turn_budget([3, 1, 2], 2).max_turns == 4  # fewer than 100 counts: the most
    assert turn_budget([3, 1, 2], 4).max_turns == 4 and not turn_budget([3, 1, 2], 4).raised
    assert turn_budget([3, 1, 2], 12).max_turns == 12
    assert turn_budget([], 6).max_turns == 6 and turn_budget([], 6).line() == (
        "turn budget 6 searches (no warm-up trajectories to check it against)"
    )


def _hub_dataset(folder: Path) -> Path:
    """30 two-hop questions from one hub: its 30 `city` lines fill three pages of the tool (top_k 10, KG order),
    so the oracle walk pages through the listing before it reaches a question's city."""
    folder.mkdir()
    kb, names, questions = [], ["e.utopia\tUtopia"], []
    for i in range(30):
        kb += [f"e.utopia\tcity\te.city{i}", f"e.city{i}\tmayor\te.mayor{i}"]
        names += [f"e.city{i}\tCity {i}", f"e.mayor{i}\tMayor {i}"]
        questions.append(
            {
                "id": f"q{i}",
                "question": f"who is the mayor of city {i} of utopia",
                "split": "train" if i % 10 < 8 else "dev" if i % 10 == 8 else "test",
                "topic_entities": [{"id": "e.utopia", "name": "Utopia"}],
                "answers": [{"id": f"e.mayor{i}", "name": f"Mayor {i}"}],
                "gold_paths": [["city", "mayor"]],
            }
        )
    (folder / "kb.tsv").write_text("\n".join(kb) + "\n", encoding="utf-8")
    (folder / "names.tsv").write_text("\n".join(names) + "\n", encoding="utf-8")
    (folder / "questions.jsonl").write_text("".join(json.dumps(q) + "\n" for q in questions), encoding="utf-8")
    return folder


def test_a_dataset_whose_oracle_pages_past_max_turns_gets_a_raised_turn_budget(tmp_path, capsys):
    """The warm-up's oracle walks (real tool, real data stage) need 2, 3 or 4 searches for a 2-hop question; a
    budget of 2 is raised to 5 for GRPO and evaluation, their commands say so, and the log says why. A budget
    that fits (5, or 8) is kept."""
    from collections import Counter

    from kgreasoner.demo import oracle_searches
    from kgreasoner.evaluation.methods import EvalConfig
    from kgreasoner.training.grpo import GRPORecipe

    data = _hub_dataset(tmp_path / "hub")
    out = tmp_path / "out"

    def demo(max_turns: int) -> Demo:
        sets = [
            f"data={data}",
            "tool.ranking=none",
            "warmup.set.correction_share=0",
            f"rollout.max_turns={max_turns}",
            "eval_questions=2",
        ]
        return Demo(load_config(DemoConfig, ROOT / "configs/demo/quick.yaml", sets), out)

    tight = demo(2)
    tight.run_data()
    tight.run_warmup()
    capsys.readouterr()
    assert sorted(Counter(oracle_searches(tight.warmup_all_file)).items()) == [(2, 9), (3, 9), (4, 9)]
    budget = tight.fit_turn_budget()
    assert capsys.readouterr().out == (
        "kgreasoner demo: turn budget raised from 2 to 5 searches (rollout.max_turns): the warm-up's oracle "
        "trajectories need up to 4 searches (99th percentile of 27; the most 4), plus one spare\n"
    )
    assert (budget.configured, budget.max_turns) == (2, 5)
    assert tight.grpo.config.rollout.max_turns == tight.eval.config.rollout.max_turns == 5
    assert tight.eval.config.limit == 2
    stages = {s.name: s for s in tight.stages()}
    path, sets = _sets(shlex.split(stages["grpo"].commands[0]))
    assert load_config(GRPORecipe, path, sets) == tight.grpo.config
    for line in stages["eval"].commands:
        args = build_parser().parse_args(shlex.split(line)[1:])
        assert load_config(EvalConfig, args.config, args.overrides).rollout.max_turns == 5
    assert tight.fit_turn_budget() is budget and capsys.readouterr().out == ""  # once

    for max_turns in (5, 8):
        roomy = demo(max_turns)
        assert roomy.fit_turn_budget().max_turns == max_turns
        assert roomy.grpo.config.rollout.max_turns == roomy.eval.config.rollout.max_turns == max_turns
        assert [s for s in roomy.grpo.sets if s.startswith("rollout.max_turns=")] == [f"rollout.max_turns={max_turns}"]
        assert capsys.readouterr().out == (
            f"kgreasoner demo: turn budget {max_turns} searches fits: the warm-up's oracle trajectories need up to "
            "4 searches (99th percentile of 27; the most 4)\n"
        )
