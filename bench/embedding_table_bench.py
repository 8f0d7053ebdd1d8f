"""What a table of embeddings made ahead costs to open and to look up, by the number of texts it holds.

`retrieval_bench.py` times first searches over a table of only the texts its searches read; a
whole-graph `kgreasoner kg embed` of its 1M triples writes about 1.24M texts. This writes tables of
`--sizes` texts (`text 0`, `text 1`, ...; random unit rows of MiniLM's 384 dimensions: lookups do not
depend on the values) as `kg embed` does, in chunk tables then merged, and times, in a new
`CachedEncoder` over each: opening it, and `--calls` lookups of `--per-call` texts never looked up
before (what a first search's few hundred texts cost), with the rows read from the page cache the
writing left warm (a cold disk adds its reads).

    python bench/embedding_table_bench.py --work /tmp/table-bench [--sizes 17000,1240000]
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np

from kgreasoner.retrieval.encoder import CachedEncoder, HashingEncoder

DIM = 384


class NoEncoder(HashingEncoder):
    """An encoder of MiniLM's size that must not run: every text looked up is in the table."""

    def encode(self, texts):
        raise AssertionError(f"{len(texts)} texts missed the table")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, required=True, help="folder for the tables (removed after each size)")
    parser.add_argument("--sizes", default="17000,1240000", help="texts per table, comma separated")
    parser.add_argument("--chunk", type=int, default=131072, help="texts per chunk table before the merge")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--per-call", type=int, default=300)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    print("| texts | write s | merge s | MB | open ms | lookup p50 ms | lookup p99 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for size in (int(s) for s in args.sizes.split(",")):
        folder = args.work / f"table-{size}"
        shutil.rmtree(folder, ignore_errors=True)
        writer = CachedEncoder(NoEncoder(DIM), folder)
        start = time.perf_counter()
        for lo in range(0, size, args.chunk):
            rows = rng.standard_normal((min(args.chunk, size - lo), DIM), dtype=np.float32)
            rows /= np.linalg.norm(rows, axis=1, keepdims=True)
            writer.add_table([f"text {i}" for i in range(lo, lo + len(rows))], rows)
        written = time.perf_counter() - start
        start = time.perf_counter()
        table = writer.merge_tables()
        merged = time.perf_counter() - start
        megabytes = sum(p.stat().st_size for p in table.parent.iterdir()) / 1e6
        start = time.perf_counter()
        reader = CachedEncoder(NoEncoder(DIM), folder)
        opened = time.perf_counter() - start
        order = rng.permutation(size)[: args.calls * args.per_call]
        latencies = []
        for call in range(min(args.calls, len(order) // args.per_call)):
            texts = [f"text {i}" for i in order[call * args.per_call : (call + 1) * args.per_call]]
            start = time.perf_counter()
            reader.encode(texts)
            latencies.append(time.perf_counter() - start)
        print(
            f"| {size:,} | {written:.1f} | {merged:.1f} | {megabytes:,.0f} | {1000 * opened:.1f} | "
            f"{1000 * np.percentile(latencies, 50):.2f} | {1000 * np.percentile(latencies, 99):.2f} |",
            flush=True,
        )
        del writer, reader
        shutil.rmtree(folder)


if __name__ == "__main__":
    main()
