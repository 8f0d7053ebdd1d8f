"""Cold import time of a module: each run a fresh interpreter, so nothing is imported yet (the OS file cache is
warm after the first run, as it is on a machine that has run the package once).

    python -m bench.import_bench [--module kgreasoner.rollout.types] [--repeats 5]

Prints each run's import time in seconds (`time.perf_counter` around the import, inside the child), their
median and best, and which of the heavy libraries (torch, torch_geometric, transformers, pyoxigraph,
SPARQLWrapper, vllm) the import loaded. `kgreasoner.rollout.types`, the typed seam between the engine, its
backends and the search sessions, is meant to load none of them: target under 1 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

HEAVY = ("torch", "torch_geometric", "transformers", "pyoxigraph", "SPARQLWrapper", "vllm")

CHILD = """
import json, sys, time
start = time.perf_counter()
import {module}
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "heavy": [m for m in {heavy!r} if m in sys.modules]}}))
"""


def cold_import(module: str) -> dict:
    """One fresh interpreter's import of `module`: {"seconds": float, "heavy": [loaded heavy libraries]}."""
    code = CHILD.format(module=module, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module", default="kgreasoner.rollout.types", help="module to import")
    parser.add_argument("--repeats", type=int, default=5, help="fresh interpreters to time")
    args = parser.parse_args(argv)
    runs = [cold_import(args.module) for _ in range(args.repeats)]
    seconds = [r["seconds"] for r in runs]
    print(f"import {args.module}: " + ", ".join(f"{s:.3f}" for s in seconds) + " s")
    print(f"median {statistics.median(seconds):.3f} s, best {min(seconds):.3f} s")
    print("heavy libraries loaded: " + (", ".join(runs[-1]["heavy"]) or "none"))


if __name__ == "__main__":
    main()
