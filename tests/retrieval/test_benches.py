"""bench/retrieval_bench.py and bench/embedding_table_bench.py run end to end on small sizes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


@pytest.mark.slow
def test_retrieval_bench_prints_the_ahead_rows_beside_the_cold_ones(tmp_path):
    command = [
        sys.executable,
        str(ROOT / "bench" / "retrieval_bench.py"),
        "--work",
        str(tmp_path),
        "--triples",
        "3000",
        "--encoder",
        "hashing",
        "--calls",
        "8",
        "--hubs",
        "2",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=ENV)
    assert done.returncode == 0, done.stderr
    rows = [
        line.strip("| ").split(" | ")
        for line in done.stdout.splitlines()
        if line.startswith("| memory") or line.startswith("| sparql")
    ]
    assert [row[:2] for row in rows] == [
        ["memory", "cold"],
        ["memory", "disk"],
        ["memory", "warm"],
        ["memory", "rerank"],
        ["memory", "ahead, new question"],
        ["memory", "ahead"],
        ["sparql", "cold"],
        ["sparql", "disk"],
        ["sparql", "warm"],
        ["sparql", "rerank"],
        ["sparql", "ahead"],
    ]
    encoded = {(row[0], row[1]): int(row[-1]) for row in rows}
    questions = encoded["memory", "ahead, new question"]
    assert encoded["memory", "cold"] > 100 and 1 <= questions <= 10
    assert encoded["memory", "ahead"] == encoded["sparql", "ahead"] == encoded["memory", "disk"] == 0
    notes = [line for line in done.stdout.splitlines() if line.startswith("embedded ahead, ")]
    assert [note.split(":")[0] for note in notes] == ["embedded ahead, memory", "embedded ahead, sparql"]
    assert "bytes a text" in notes[0] and "h per million texts" in notes[0]
    assert "a whole-graph `kg embed` of these " in done.stdout


@pytest.mark.slow
def test_embedding_table_bench_times_each_size(tmp_path):
    command = [
        sys.executable,
        str(ROOT / "bench" / "embedding_table_bench.py"),
        "--work",
        str(tmp_path),
        "--sizes",
        "1000,5000",
        "--chunk",
        "2000",
        "--calls",
        "5",
        "--per-call",
        "100",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=ROOT, env=ENV)
    assert done.returncode == 0, done.stderr
    rows = [
        line.strip("| ").split(" | ")
        for line in done.stdout.splitlines()
        if line.startswith("| ") and line[2].isdigit()
    ]
    assert [row[0] for row in rows] == ["1,000", "5,000"]
    assert list(tmp_path.iterdir()) == []  # each size's tables removed after timing
