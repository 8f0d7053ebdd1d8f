"""The harness: records, resuming after an interruption, summaries and reports, the CLI."""

import argparse
import json

import pytest

from kgreasoner.baselines.base import Method, MethodResult
from kgreasoner.data import open_dataset_kg
from kgreasoner.evaluation import commands
from kgreasoner.evaluation.harness import evaluate_method, read_records, run_evaluation
from kgreasoner.evaluation.methods import EvalConfig, MethodContext, build_method
from kgreasoner.evaluation.report import RunInfo, render_markdown, summarize
from kgreasoner.llm import ScriptedLLM


class Interrupted(BaseException):
    """Stands for Ctrl-C / a killed job: not an Exception, so the harness does not record it."""


class FirstGold(Method):
    """Answers with the first gold name (and one LLM call), stopping the run at `stop_at`."""

    name = "first_gold"

    def __init__(self, stop_at=None, fail_on=()):
        self.seen = []
        self.stop_at = stop_at
        self.fail_on = set(fail_on)

    def answer(self, example, llm):
        if len(self.seen) == self.stop_at:
            raise Interrupted()
        self.seen.append(example.id)
        if example.id in self.fail_on:
            raise KeyError("boom")
        llm.complete("one two three")
        return MethodResult([example.answers[0].name], True, {"n": len(self.seen)}, kg_queries=2)


def test_interrupted_run_resumes_without_repeating(tmp_path, synthetic):
    examples = synthetic.split("train")[:8]
    path = tmp_path / "first_gold.jsonl"
    llm = ScriptedLLM([], default="x y")
    first = FirstGold(stop_at=3)
    with pytest.raises(Interrupted):
        evaluate_method(first, examples, path, llm=llm, workers=1, progress=False)
    assert [r["id"] for r in read_records(path)] == [e.id for e in examples[:3]]
    with open(path, "a", encoding="utf-8") as handle:  # a line cut in the middle of a write
        handle.write('{"id": "half-writ')
    second = FirstGold(fail_on={examples[5].id})
    records = evaluate_method(second, examples, path, llm=llm, workers=2, progress=False)
    assert sorted(second.seen) == sorted(e.id for e in examples[3:])
    assert [r["id"] for r in records] == [e.id for e in examples]
    assert len(path.read_text().splitlines()) == 8
    failed = next(r for r in records if r["id"] == examples[5].id)
    assert failed["error"] == "KeyError: 'boom'" and failed["answers"] == [] and failed["hits1"] == 0.0
    ok = records[0]
    assert ok["hits1"] == 1.0 and ok["llm_calls"] == 1 and ok["prompt_tokens"] == 3 and ok["completion_tokens"] == 2
    assert ok["kg_queries"] == 2 and ok["format_valid"] is True and ok["wall_time"] >= 0
    assert set(ok) == {
        "id",
        "method",
        "question",
        "hops",
        "gold",
        "answers",
        "hits1",
        "f1",
        "em",
        "precision",
        "recall",
        "format_valid",
        "llm_calls",
        "prompt_tokens",
        "completion_tokens",
        "kg_queries",
        "wall_time",
        "error",
        "trace",
        "failure",
    }
    third = FirstGold()
    evaluate_method(third, examples, path, llm=llm, progress=False)
    assert third.seen == []


def test_summary_and_markdown():
    records = [
        {
            "hops": 1,
            "hits1": 1.0,
            "f1": 1.0,
            "em": 1.0,
            "format_valid": True,
            "error": None,
            "llm_calls": 2,
            "prompt_tokens": 10,
            "completion_tokens": 4,
            "kg_queries": 1,
            "wall_time": 0.5,
        },
        {
            "hops": 2,
            "hits1": 0.0,
            "f1": 0.5,
            "em": 0.0,
            "format_valid": False,
            "error": "X",
            "llm_calls": 4,
            "prompt_tokens": 30,
            "completion_tokens": 6,
            "kg_queries": 3,
            "wall_time": 1.5,
        },
        {
            "hops": 2,
            "hits1": 1.0,
            "f1": 1.0,
            "em": 0.0,
            "format_valid": True,
            "error": None,
            "llm_calls": 0,
            "prompt_tokens": 20,
            "completion_tokens": 2,
            "kg_queries": 2,
            "wall_time": 1.0,
        },
    ]
    s = summarize(records)
    assert s["n"] == 3 and s["hits1"] == pytest.approx(2 / 3) and s["f1"] == pytest.approx(2.5 / 3)
    assert s["format_valid"] == pytest.approx(2 / 3) and s["errors"] == 1
    assert s["cost"] == {
        "llm_calls": 2.0,
        "prompt_tokens": 20.0,
        "completion_tokens": 4.0,
        "kg_queries": 2.0,
        "wall_time": 1.0,
    }
    assert s["by_hops"] == {
        "1": {"n": 1, "hits1": 1.0, "f1": 1.0, "em": 1.0, "kg_queries": 1.0},
        "2": {"n": 2, "hits1": 0.5, "f1": 0.75, "em": 0.0, "kg_queries": 2.5},
    }
    md = render_markdown(RunInfo("PQ-2H", "test", "grouped", 0, kg="memory:x"), {"tog": s})
    assert md.startswith("# Evaluation: PQ-2H, test split (grouped scheme, seed 0)\n")
    assert "| tog | 3 | 0.667 | 0.833 | 0.333 | 0.667 | 1 | 2.00 | 20 | 4 | 2.00 | 1.000 |" in md
    assert "| tog | 1.000 (1) | 0.500 (2) |" in md
    assert (
        "KG queries per question by hop count:\n\n| method | 1-hop | 2-hop |\n|---|---|---|\n| tog | 1.00 | 2.50 |"
        in md
    )
    assert s["distinct"] == 3 and "distinct texts" not in md


def test_repeated_questions_are_also_scored_once_each():
    row = {
        "hops": 2,
        "f1": 0.0,
        "em": 0.0,
        "format_valid": True,
        "error": None,
        "llm_calls": 1,
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "kg_queries": 1,
        "wall_time": 0.1,
    }
    records = (
        [{**row, "question": "q kerala", "hits1": 1.0}] * 4
        + [{**row, "question": "q kerala", "hits1": 0.0}]
        + [{**row, "question": "q other", "hits1": 0.0}]
    )
    s = summarize(records)
    assert s["hits1"] == pytest.approx(4 / 6) and s["distinct"] == 2 and s["hits1_distinct"] == pytest.approx(0.4)
    md = render_markdown(RunInfo("PQL-2H", "test", "grouped", 0), {"kgreasoner": s})
    assert (
        "kgreasoner: the 6 questions hold 2 distinct texts; Hits@1 over distinct questions (each the mean of its "
        "rows) 0.400." in md
    )


def test_run_evaluation_writes_reports_and_refuses_another_split(tmp_path, synthetic):
    kg = open_dataset_kg(synthetic)
    examples = synthetic.split("test")
    ctx = MethodContext(kg, None, EvalConfig())
    info = RunInfo(synthetic.name, "test", synthetic.split_scheme, synthetic.seed)
    summaries = run_evaluation(["oracle"], examples, ctx, tmp_path, info, progress=False)
    assert summaries["oracle"]["n"] == len(examples)
    data = json.loads((tmp_path / "summary.json").read_text())
    assert data["split"] == "test" and data["split_scheme"] == "given" and set(data["methods"]) == {"oracle"}
    assert "test split (given scheme)" in (tmp_path / "summary.md").read_text()
    with pytest.raises(ValueError, match="holds results of another evaluation \\(split: 'test' there, 'dev' now\\)"):
        run_evaluation(["oracle"], examples, ctx, tmp_path, RunInfo(synthetic.name, "dev", "given"), progress=False)
    with pytest.raises(ValueError, match="unknown method 'nope'"):
        build_method("nope", ctx)
    with pytest.raises(ValueError, match="method 'tog' needs an LLM"):
        build_method("tog", ctx)


def _cli(argv):
    parser = argparse.ArgumentParser(prog="kgreasoner")
    commands.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_cli_io_and_kgreasoner_with_a_real_tiny_model(tmp_path, synthetic_dir, tiny_checkpoint):
    """End to end with an untrained model: it answers wrongly; the bookkeeping must be right."""
    out = tmp_path / "run"
    argv = [
        "eval",
        "--methods",
        "io,kgreasoner,oracle",
        "--dataset",
        str(synthetic_dir),
        "--split",
        "test",
        "--llm",
        f"hf:{tiny_checkpoint}",
        "--out",
        str(out),
        "--limit",
        "4",
        "--no-progress",
        "--set",
        "max_tokens=8",
        "--set",
        "rollout.max_new_tokens=24",
        "--set",
        "rollout.max_turns=2",
        "--set",
        "tool.entity_handles=true",
        "--set",
        "batch_size=4",
    ]
    assert _cli(argv) == 0
    io = read_records(out / "io.jsonl")
    ours = read_records(out / "kgreasoner.jsonl")
    assert len(io) == len(ours) == 4
    for record in io:
        assert record["llm_calls"] == 1 and record["prompt_tokens"] > 20 and 1 <= record["completion_tokens"] <= 8
        assert record["kg_queries"] == 0 and record["trace"]["prompt"].startswith("Answer the question")
    for record in ours:
        calls = record["trace"]["num_tool_calls"]
        assert record["llm_calls"] == calls + 1 and record["kg_queries"] == calls
        assert 1 <= record["completion_tokens"] <= 24 and record["prompt_tokens"] > 100
        assert record["format_valid"] is False and record["error"] is None
    summary = json.loads((out / "summary.json").read_text())
    assert set(summary["methods"]) == {"io", "kgreasoner", "oracle"} and summary["llm"] == f"hf:{tiny_checkpoint}"
    assert summary["methods"]["kgreasoner"]["n"] == 4
    # A second run answers nothing again.
    before = (out / "io.jsonl").read_text()
    assert _cli(argv) == 0
    assert (out / "io.jsonl").read_text() == before
