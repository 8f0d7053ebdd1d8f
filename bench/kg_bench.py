"""One-hop neighbour latency (p50, p99) and throughput of the KG backends, as a Markdown table.

For each size, the synthetic generator (`data_gen.synthetic.write_synthetic`) writes a dataset
of about that many triples; the same triples are then served by `memory` (CSR arrays in this
process), `oxigraph` (the on-disk store, in this process) and `sparql` (HTTP to an
`oxigraph serve-read-only` on 127.0.0.1 over that store). Each backend answers the same seeded
sample of entities (`neighbors(entity, direction)`, one client, one call at a time, after a
warm-up). Datasets and stores are cached under `--work`, so only the first 1M run pays for
generating and loading.

    python bench/kg_bench.py [--work .cache/kg-bench] [--sizes 10k,1M] [--calls 2000]
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import numpy as np

from data_gen.synthetic import write_synthetic
from kgreasoner.kg.base import KnowledgeGraph, is_literal_id
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.kg.server import start_oxigraph_server
from kgreasoner.kg.sparql import SparqlKG

BACKENDS = ("memory", "oxigraph", "sparql")


def parse_size(text: str) -> int:
    """`10000`, `10k` or `1M` as an int."""
    text = text.strip().lower()
    factor = {"k": 1_000, "m": 1_000_000}.get(text[-1:], 1)
    digits = text[:-1] if factor > 1 else text
    try:
        value = int(float(digits) * factor)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--sizes: {text!r} is not a size like 10000, 10k or 1M") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"--sizes: {text!r} must be positive")
    return value


def dataset(work: Path, size: int, seed: int) -> tuple[Path, float | None]:
    """The dataset folder for `size` (generated unless cached) and the generation time if generated now."""
    folder = work / f"synthetic-{size}-seed{seed}"
    if (folder / "kb.tsv").exists() and (folder / "names.tsv").exists():
        return folder, None
    start = time.perf_counter()
    write_synthetic(folder, seed=seed, target_triples=size)
    return folder, time.perf_counter() - start


def store(work: Path, data: Path, size: int, seed: int) -> tuple[Path, float | None]:
    """The oxigraph store of `data` (bulk-loaded unless cached) and the load time if loaded now."""
    path = work / f"store-{size}-seed{seed}"
    if path.exists() and any(path.iterdir()):
        return path, None
    start = time.perf_counter()
    OxigraphKG.build(data, path).close()
    return path, time.perf_counter() - start


def sample_entities(kg: MemoryKG, calls: int, seed: int) -> list[str]:
    """`calls` non-literal entities drawn uniformly (with replacement), seeded."""
    rng = random.Random(seed)
    nodes = [n for n in kg.entities if not is_literal_id(n)]
    return [rng.choice(nodes) for _ in range(calls)]


def hub_entities(kg: MemoryKG, hubs: int, calls: int) -> list[str]:
    """The `hubs` highest-degree entities, cycled to `calls` calls (the slow end of a search)."""
    top = sorted(kg.entities, key=lambda n: (-kg.degree(n), n))[:hubs]
    return [top[i % len(top)] for i in range(calls)]


def time_calls(kg: KnowledgeGraph, entities: list[str], direction: str, warmup: int) -> dict:
    for entity in entities[:warmup]:
        kg.neighbors(entity, direction)
    latencies = np.empty(len(entities))
    edges = 0
    start = time.perf_counter()
    for i, entity in enumerate(entities):
        t0 = time.perf_counter()
        edges += len(kg.neighbors(entity, direction))
        latencies[i] = time.perf_counter() - t0
    total = time.perf_counter() - start
    return {
        "p50_ms": float(np.percentile(latencies, 50) * 1e3),
        "p99_ms": float(np.percentile(latencies, 99) * 1e3),
        "calls_per_s": len(entities) / total,
        "edges_per_call": edges / len(entities),
    }


def bench_size(args: argparse.Namespace, size: int) -> list[dict]:
    data, generated = dataset(args.work, size, args.seed)
    if generated is not None:
        print(f"# generated {data} in {generated:.1f} s", flush=True)
    start = time.perf_counter()
    memory = MemoryKG.from_file(data / "kb.tsv")
    memory_load = time.perf_counter() - start
    workloads = {"uniform": sample_entities(memory, args.calls, args.seed)}
    if args.hubs:
        workloads[f"top-{args.hubs} hubs"] = hub_entities(memory, args.hubs, max(args.hubs, args.calls // 10))
    rows = []

    def measure(kg: KnowledgeGraph, **row) -> None:
        for workload, entities in workloads.items():
            rows.append({"triples": memory.num_triples, "workload": workload, **row,
                         **time_calls(kg, entities, args.direction, args.warmup)})

    if "memory" in args.backends:
        measure(memory, backend="memory", open_s=memory_load)
    if "oxigraph" in args.backends or "sparql" in args.backends:
        path, loaded = store(args.work, data, size, args.seed)
        if loaded is not None:
            print(f"# bulk-loaded {path} in {loaded:.1f} s", flush=True)
        if "oxigraph" in args.backends:
            start = time.perf_counter()
            oxigraph = OxigraphKG(path)
            opened = time.perf_counter() - start
            measure(oxigraph, backend="oxigraph", open_s=opened, load="cached" if loaded is None else f"{loaded:.1f}")
            oxigraph.close()
        if "sparql" in args.backends:
            start = time.perf_counter()
            with start_oxigraph_server(path) as server:
                opened = time.perf_counter() - start
                sparql = SparqlKG(server.url, retries=0, max_rows=1_000_000)  # hubs are not truncated
                measure(sparql, backend="sparql (HTTP, oxigraph serve)", open_s=opened)
    return rows


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"neighbors(entity, direction={args.direction!r}), one client, after {args.warmup} warm-up calls: "
        f"{args.calls} calls on uniformly sampled entities (seed {args.seed}); "
        f"{max(args.hubs, args.calls // 10)} calls cycling over the {args.hubs} highest-degree entities.",
        "",
        "| triples | backend | workload | open (s) | bulk load (s) | p50 (ms) | p99 (ms) | calls/s | edges/call |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['triples']:,} | {row['backend']} | {row['workload']} | {row['open_s']:.2f} | {row.get('load', '')} "
            f"| {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['calls_per_s']:,.0f} | {row['edges_per_call']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path(".cache/kg-bench"), help="cache of datasets and stores")
    parser.add_argument("--sizes", default="10k,1M", help="comma-separated triple counts (10000, 10k, 1M)")
    parser.add_argument("--backends", default=",".join(BACKENDS), help=f"comma-separated subset of {','.join(BACKENDS)}")
    parser.add_argument("--calls", type=int, default=2000, help="timed neighbour calls per backend and size")
    parser.add_argument("--hubs", type=int, default=20, help="also time the N highest-degree entities (0: skip)")
    parser.add_argument("--warmup", type=int, default=100, help="untimed calls first")
    parser.add_argument("--direction", default="both", choices=("out", "in", "both"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    args.backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    unknown = sorted(set(args.backends) - set(BACKENDS))
    if unknown:
        parser.error(f"--backends: unknown {unknown}; choose from {BACKENDS}")
    try:
        sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    except argparse.ArgumentTypeError as err:
        parser.error(str(err))
    args.work.mkdir(parents=True, exist_ok=True)
    rows = []
    for size in sizes:
        rows.extend(bench_size(args, size))
    print(markdown(rows, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
