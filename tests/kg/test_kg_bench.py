"""bench/kg_bench.py runs end to end on the small size and prints one table row per backend."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_prints_a_row_per_backend_and_caches_its_inputs(tmp_path):
    command = [sys.executable, str(ROOT / "bench" / "kg_bench.py"), "--work", str(tmp_path), "--sizes", "10k",
               "--calls", "30", "--warmup", "5", "--hubs", "3"]
    first = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    rows = [line for line in first.stdout.splitlines() if line.startswith("| 1")]
    assert [row.split(" | ")[1:3] for row in rows] == [
        [backend, workload]
        for backend in ("memory", "oxigraph", "sparql (HTTP, oxigraph serve)")
        for workload in ("uniform", "top-3 hubs")
    ]
    assert "# bulk-loaded" in first.stdout
    for workload in ("uniform", "top-3 hubs"):  # every backend returned the same number of edges
        assert len({row.rstrip(" |").rsplit(" | ", 1)[1] for row in rows if f"| {workload} |" in row}) == 1
    second = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert second.returncode == 0 and "# generated" not in second.stdout and "| cached |" in second.stdout
    bad = subprocess.run(command[:4] + ["--sizes", "ten"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert bad.returncode == 2 and "--sizes: 'ten' is not a size like 10000, 10k or 1M" in bad.stderr
