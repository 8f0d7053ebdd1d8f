"""One split setting: every stage, run with its defaults on a dataset without a split, tests on the same questions.

A stage that split an unsplit dataset its own way would train on another stage's test questions. Each
stage's defaults come from its own config class or argument parser; where the stage's own code is cheap
to run on a small dataset (`prepare-data`, `eval --methods oracle`, the ranker's loader, the labelling
command, `answer`'s question reader), it runs and its test questions are read from what it did.
"""

from __future__ import annotations

import json

import pytest

from data_gen.pipeline_sft import PipelineSFTConfig
from data_gen.synthetic import write_synthetic
from data_gen.warmup import WarmupConfig
from kgreasoner.cli import build_parser
from kgreasoner.config import ConfigError, load_config
from kgreasoner.data import load_dataset
from kgreasoner.demo import DemoConfig
from kgreasoner.retrieval import labels
from kgreasoner.retrieval.training import RankerTrainConfig, _load
from kgreasoner.serving.answer import _inputs
from kgreasoner.serving.config import ServeConfig
from kgreasoner.training.grpo import GRPORecipe


@pytest.fixture(scope="module")
def unsplit(tmp_path_factory) -> str:
    """A synthetic dataset folder whose questions carry no split."""
    folder = write_synthetic(tmp_path_factory.mktemp("unsplit"), seed=0, num_entities=150, num_questions=60)
    questions = folder / "questions.jsonl"
    rows = [json.loads(line) for line in questions.read_text(encoding="utf-8").splitlines()]
    questions.write_text("".join(json.dumps({**row, "split": ""}) + "\n" for row in rows), encoding="utf-8")
    return str(folder)


def _split_ids(data: str, scheme: str, seed: int) -> list[str]:
    return sorted(e.id for e in load_dataset(data, split_scheme=scheme, seed=seed).split("test"))


def _run_cli(argv: list[str]) -> None:
    args = build_parser(argv[0]).parse_args(argv)
    assert args.func(args) == 0


def test_every_stage_tests_on_the_same_questions_of_an_unsplit_dataset(unsplit, tmp_path):
    # the two schemes pick different test questions here, so a stage with the other default shows
    assert _split_ids(unsplit, "random", 0) != _split_ids(unsplit, "grouped", 0)
    seen: dict[str, list[str]] = {"load_dataset": sorted(e.id for e in load_dataset(unsplit, split="test"))}

    warmup = load_config(WarmupConfig, None, [f"dataset={unsplit}", f"output={tmp_path}/warmup.jsonl"])
    seen["warmup"] = _split_ids(unsplit, warmup.split_scheme, warmup.split_seed)
    pipeline = load_config(PipelineSFTConfig, None, ["method=tog", f"dataset={unsplit}", f"output={tmp_path}/p.jsonl"])
    seen["pipeline-sft"] = _split_ids(unsplit, pipeline.split_scheme, pipeline.split_seed)
    recipe = load_config(GRPORecipe, None, ["model=m", f"dataset={unsplit}", f"run_dir={tmp_path}/grpo"])
    seen["grpo"] = _split_ids(unsplit, recipe.split_scheme, recipe.split_seed)
    demo = load_config(DemoConfig, None, [f"data={unsplit}"])
    seen["demo"] = _split_ids(unsplit, demo.split_scheme, demo.split_seed)

    seen["ranker"] = sorted(e.id for e in _load(load_config(RankerTrainConfig, None, [f"data={unsplit}"])).test)

    _run_cli(["prepare-data", unsplit, "--out", str(tmp_path / "prepared")])
    seen["prepare-data"] = sorted(e.id for e in load_dataset(tmp_path / "prepared", split="test"))

    out = tmp_path / "eval"
    _run_cli(["eval", "--methods", "oracle", "--dataset", unsplit, "--out", str(out), "--no-progress"])
    seen["eval"] = sorted(json.loads(line)["id"] for line in (out / "oracle.jsonl").read_text().splitlines())

    labels.main(["--data", unsplit, "--split", "test", "--negative-ratio", "-1", "--out", str(tmp_path / "g.jsonl")])
    groups = (json.loads(line) for line in (tmp_path / "g.jsonl").read_text().splitlines())
    seen["labels"] = sorted({group["question_id"] for group in groups})

    answer = build_parser("answer").parse_args(["answer", "--dataset", unsplit])
    items, _ = _inputs(answer, load_config(ServeConfig))
    seen["answer"] = sorted(item["id"] for _, item in items)

    stages_by_ids: dict[tuple[str, ...], list[str]] = {}
    for stage, ids in seen.items():
        stages_by_ids.setdefault(tuple(ids), []).append(stage)
    assert len(stages_by_ids) == 1, f"stages that test on different questions: {list(stages_by_ids.values())}"
    assert seen["eval"], "the dataset has test questions"


def test_the_old_scheme_key_is_refused_naming_split_scheme(tmp_path):
    recipe = tmp_path / "ranker.yaml"
    recipe.write_text("data: PQ-2H\nscheme: grouped\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=rf"^{recipe}: scheme was renamed split_scheme"):
        load_config(RankerTrainConfig, recipe)
    with pytest.raises(ConfigError, match=r"^defaults: scheme was renamed split_scheme"):
        load_config(RankerTrainConfig, None, ["data=PQ-2H", "scheme=random"])


@pytest.mark.parametrize("command", ["eval", "answer", "prepare-data", "labels"])
def test_the_old_scheme_flag_is_refused_naming_split_scheme(command, capsys):
    with pytest.raises(SystemExit) as exit_:
        if command == "labels":
            labels.main(["--scheme", "grouped"])
        else:
            build_parser(command).parse_args([command, "--scheme", "grouped"])
    assert exit_.value.code == 2
    assert "error: --scheme was renamed --split-scheme" in capsys.readouterr().err
