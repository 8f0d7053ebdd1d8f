"""bench/pathquestion_table.py turns a grid cell's summaries, trainer state and stage times into table rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "pathquestion_table.py"


def result(hits1: float, distinct_hits1: float, wrong: dict[str, int], invalid: int = 0) -> dict:
    counts = {
        "wrong_relation": sum(wrong.values()),
        "copy_failure": 0,
        "data_ambiguity": 0,
        "loop_or_turn_limit": 0,
        "invalid_format": invalid,
        "answer_not_in_context": 0,
        "other": 0,
    }
    return {
        "methods": {
            "kgreasoner": {
                "n": 160,
                "distinct": 46,
                "hits1": hits1,
                "hits1_distinct": distinct_hits1,
                "format_valid": 0.99375,
                "failures": {"counts": counts, "wrong_relation_by_hop": wrong},
            }
        }
    }


def write(path: Path, content: dict | str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))


def make_cell(cell: Path) -> None:
    write(cell / "warmup.summary.json", {"dataset": "PQL-2H", "split_scheme": "grouped"})
    write(cell / "sft" / "checkpoint-900" / "trainer_state.json", {"global_step": 900, "best_model_checkpoint": None})
    write(
        cell / "sft" / "checkpoint-1000" / "trainer_state.json",
        {"global_step": 1000, "best_model_checkpoint": f"{cell}/sft/checkpoint-800"},
    )
    write(cell / "eval-off" / "summary.json", result(0.25625, 0.674, {"1": 4, "2": 105}))
    write(cell / "eval-on" / "summary.json", result(0.2625, 0.6957, {"1": 8, "2": 109}, invalid=1))
    write(cell / "eval-quotes" / "summary.json", result(0.30625, 0.8261, {"2": 105}))
    write(cell / "grpo-eval-on" / "summary.json", result(0.275, 0.7, {"2": 116}))
    write(
        cell / "times.tsv",
        "ranker\t60.0\t30.0\t1.0\nwarmup\t120.0\t50.0\t4.0\nbuild\t30.0\t9.0\t1.0\n"
        "sft\t1800.0\t1500.0\t20.0\ngrpo\t300.0\t250.0\t5.0\n",
    )


def run(*cells: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, cells)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


def test_rows_for_sft_and_grpo_with_training_minutes(tmp_path):
    make_cell(tmp_path / "cell")
    done = run(tmp_path / "cell")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("| set | split | training | SFT steps (best) | training wall / CPU min |")
    assert lines[2:] == [
        "| PQL-2H | grouped | SFT | 1,000 (800) | 33.5 / 26.9 | 160 (46) | 0.256 / 0.263 / 0.306 "
        "| 0.674 / 0.696 / 0.826 | 0.994 | wrong relation 117 (h1: 8, h2: 109); invalid 1 |",
        "| PQL-2H | grouped | SFT + GRPO | 1,000 (800) | 38.5 / 31.2 | 160 (46) | — / 0.275 / — "
        "| — / 0.700 / — | 0.994 | wrong relation 116 (h2: 116) |",
    ]


def test_a_cell_without_stage_times_has_no_training_minutes(tmp_path):
    make_cell(tmp_path / "cell")
    (tmp_path / "cell" / "times.tsv").unlink()
    done = run(tmp_path / "cell")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[2].split(" | ")[4] == "—"


def test_a_malformed_times_line_is_named_by_file_and_line(tmp_path):
    make_cell(tmp_path / "cell")
    with open(tmp_path / "cell" / "times.tsv", "a") as times:
        times.write("eval-on 12.0\n")
    done = run(tmp_path / "cell")
    assert done.returncode == 1
    assert (
        f"{tmp_path / 'cell' / 'times.tsv'}:6: expected stage, wall, user, system; got 'eval-on 12.0'" in done.stderr
    )
