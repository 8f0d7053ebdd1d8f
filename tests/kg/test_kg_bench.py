"""bench/kg_bench.py runs end to end on the small size and prints one table row per backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_bench_prints_a_row_per_backend_and_caches_its_inputs(tmp_path):
    command = [
        sys.executable,
        str(ROOT / "bench" / "kg_bench.py"),
        "--work",
        str(tmp_path),
        "--sizes",
        "10k",
        "--calls",
        "30",
        "--warmup",
        "5",
        "--hubs",
        "3",
    ]
    first = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    rows = [line for line in first.stdout.splitlines() if line.startswith("| 1")]
    assert [row.split(" | ")[1:3] for row in rows] == [
        [backend, workload]
        for backend in ("memory", "oxigraph", "sparql (HTTP, oxigraph serve)")
        for workload in ("uniform", "top-3 hubs", "top-3 hubs, one relation, 64 edges")
    ]
    assert "# bulk-loaded" in first.stdout
    for workload in (
        "uniform",
        "top-3 hubs",
        "top-3 hubs, one relation, 64 edges",
    ):  # every backend returned the same edges
        assert len({row.rstrip(" |").rsplit(" | ", 1)[1] for row in rows if f"| {workload} |" in row}) == 1
    per_call = {row.split(" | ")[2]: float(row.rstrip(" |").rsplit(" | ", 1)[1]) for row in rows}
    assert per_call["top-3 hubs, one relation, 64 edges"] == 64 < per_call["top-3 hubs"]
    second = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert second.returncode == 0 and "# generated" not in second.stdout and "| cached |" in second.stdout
    bad = subprocess.run(command[:4] + ["--sizes", "ten"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "--sizes: 'ten' is not a size like 10000, 10k or 1M" in bad.stderr


@pytest.mark.slow
def test_memory_scale_reports_bytes_and_load_time_per_size_and_the_freebase_projection(tmp_path):
    command = [
        sys.executable,
        str(ROOT / "bench" / "kg_bench.py"),
        "--work",
        str(tmp_path),
        "--memory-scale",
        "10k,20k",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    rows = [line.split(" | ") for line in done.stdout.splitlines() if line.startswith("| ") and line[2].isdigit()]
    distinct = [int(row[0].strip("| ").replace(",", "")) for row in rows[:2]]  # a random duplicate counts once
    assert 9_900 <= distinct[0] <= 10_000 and 19_800 <= distinct[1] <= 20_000
    assert rows[2][0] == "| 1,900,000,000 (projected)"
    assert all(float(row[3].replace(",", "")) > 0 for row in rows)  # bytes per triple measured, not zero
    assert rows[2][3] == rows[1][3]  # the projection scales the largest size's bytes per triple
