"""One-hop neighbour latency (p50, p99) and throughput of the KG backends, as a Markdown table.

For each size, the synthetic generator (`data_gen.synthetic.write_synthetic`) writes a dataset
of about that many triples; the same triples are then served by `memory` (CSR arrays in this
process), `oxigraph` (the on-disk store, in this process) and `sparql` (HTTP to an
`oxigraph serve-read-only` on 127.0.0.1 over that store). Each backend answers the same seeded
sample of entities (`neighbors(entity, direction)`, one client, one call at a time, after a
warm-up), the highest-degree entities, and the first 64 edges of those hubs' biggest relation
(`neighbors(hub, direction, relations=[r], limit=64)`, what a relation-first search fetches for its
pool; the memory store reads them from its relation index without touching the hub's other edges).
Datasets and stores are cached under `--work`, so only the first 1M run pays for generating and loading.

    python bench/kg_bench.py [--work .cache/kg-bench] [--sizes 10k,1M] [--calls 2000]

`--memory-scale 1M,3M` measures instead what the `memory` store costs to hold: for each size, a
Freebase-shaped `kb.tsv` + `names.tsv` (mids, 2,000 relations, 80% of nodes named, a few literals)
is written, then loaded by `MemoryKG.from_file` in a fresh process that reports the load time and
its resident memory after loading (and at peak), per triple; the last line projects both to
Freebase's 1.9 billion triples linearly.
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from data_gen.synthetic import write_synthetic
from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.kg.server import start_oxigraph_server
from kgreasoner.kg.sparql import SparqlKG
from kgreasoner.records.ids import is_literal_id

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


def biggest_relation(kg: MemoryKG, entity: str, direction: str) -> list[str]:
    """The relation with the most edges at `entity` (the first such), as a `relations=` filter."""
    counts: dict[str, int] = {}
    for relation, _, n in kg.relation_counts(entity, direction):  # type: ignore[arg-type]
        counts[relation] = counts.get(relation, 0) + n
    return [max(counts, key=counts.__getitem__)]


def time_calls(
    kg: KnowledgeGraph, calls: list[tuple[str, list[str] | None, int | None]], direction: str, warmup: int
) -> dict:
    for entity, relations, limit in calls[:warmup]:
        kg.neighbors(entity, direction, relations, limit)
    latencies = np.empty(len(calls))
    edges = 0
    start = time.perf_counter()
    for i, (entity, relations, limit) in enumerate(calls):
        t0 = time.perf_counter()
        edges += len(kg.neighbors(entity, direction, relations, limit))
        latencies[i] = time.perf_counter() - t0
    total = time.perf_counter() - start
    return {
        "p50_ms": float(np.percentile(latencies, 50) * 1e3),
        "p99_ms": float(np.percentile(latencies, 99) * 1e3),
        "calls_per_s": len(calls) / total,
        "edges_per_call": edges / len(calls),
    }


def bench_size(args: argparse.Namespace, size: int) -> list[dict]:
    data, generated = dataset(args.work, size, args.seed)
    if generated is not None:
        print(f"# generated {data} in {generated:.1f} s", flush=True)
    start = time.perf_counter()
    memory = MemoryKG.from_file(data / "kb.tsv")
    memory_load = time.perf_counter() - start
    workloads = {"uniform": [(entity, None, None) for entity in sample_entities(memory, args.calls, args.seed)]}
    if args.hubs:
        hubs = hub_entities(memory, args.hubs, max(args.hubs, args.calls // 10))
        workloads[f"top-{args.hubs} hubs"] = [(hub, None, None) for hub in hubs]
        filters = {hub: biggest_relation(memory, hub, args.direction) for hub in set(hubs)}
        workloads[f"top-{args.hubs} hubs, one relation, 64 edges"] = [(hub, filters[hub], 64) for hub in hubs]
    rows = []

    def measure(kg: KnowledgeGraph, **row) -> None:
        for workload, calls in workloads.items():
            rows.append(
                {
                    "triples": memory.num_triples,
                    "workload": workload,
                    **row,
                    **time_calls(kg, calls, args.direction, args.warmup),
                }
            )

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


FREEBASE_TRIPLES = 1_900_000_000
_MEASURE = """
import json, resource, sys, time
from kgreasoner.kg.memory import MemoryKG
def rss():
    return int(next(l for l in open("/proc/self/status") if l.startswith("VmRSS")).split()[1]) * 1024
before = rss()
start = time.perf_counter()
kg = MemoryKG.from_file(sys.argv[1])
seconds = time.perf_counter() - start
print(json.dumps({"triples": kg.num_triples, "load_s": seconds, "rss": rss() - before,
                  "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before}))
"""


def write_scale_dataset(folder: Path, size: int, seed: int) -> Path:
    """`size` Freebase-shaped triples (power-law subjects, so there are hubs) as kb.tsv + names.tsv."""
    kb = folder / "kb.tsv"
    if kb.exists() and (folder / "names.tsv").exists():
        return kb
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    nodes = max(size // 4, 10)
    subjects = (rng.zipf(1.3, size) - 1) % nodes
    objects = rng.integers(0, nodes, size)
    relations = rng.integers(0, 2000, size)
    literal = rng.random(size) < 0.05
    with open(kb, "w", encoding="utf-8") as out:
        for s, r, o, lit in zip(subjects.tolist(), relations.tolist(), objects.tolist(), literal.tolist()):
            tail = f'"{o}"^^<http://www.w3.org/2001/XMLSchema#integer>' if lit else f"m.{o:x}"
            out.write(f"m.{s:x}\tdomain{r % 50}.type{r}.property_{r}\t{tail}\n")
    named = np.flatnonzero(rng.random(nodes) < 0.8)
    with open(folder / "names.tsv", "w", encoding="utf-8") as out:
        for n in named.tolist():
            out.write(f"m.{n:x}\tEntity number {n}\n")
    return kb


def memory_scale(args: argparse.Namespace, sizes: list[int]) -> str:
    lines = [
        "| triples | load (s) | RSS after load (MB) | bytes/triple | peak RSS (MB) | peak bytes/triple |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    last = None
    for size in sizes:
        kb = write_scale_dataset(args.work / f"scale-{size}-seed{args.seed}", size, args.seed)
        done = subprocess.run([sys.executable, "-c", _MEASURE, str(kb)], capture_output=True, text=True, check=True)
        last = json.loads(done.stdout.strip().splitlines()[-1])
        lines.append(
            f"| {last['triples']:,} | {last['load_s']:.1f} | {last['rss'] / 2**20:,.0f} | "
            f"{last['rss'] / last['triples']:.0f} | {last['peak'] / 2**20:,.0f} | "
            f"{last['peak'] / last['triples']:.0f} |"
        )
    if last is not None:
        scale = FREEBASE_TRIPLES / last["triples"]
        lines.append(
            f"| {FREEBASE_TRIPLES:,} (projected) | {last['load_s'] * scale:,.0f} | {last['rss'] * scale / 2**20:,.0f} "
            f"| "
            f"{last['rss'] / last['triples']:.0f} | {last['peak'] * scale / 2**20:,.0f} | "
            f"{last['peak'] / last['triples']:.0f} |"
        )
    return "\n".join(lines)


def markdown(rows: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"neighbors(entity, direction={args.direction!r}), one client, after {args.warmup} warm-up calls: "
        f"{args.calls} calls on uniformly sampled entities (seed {args.seed}); "
        f"{max(args.hubs, args.calls // 10)} calls cycling over the {args.hubs} highest-degree entities, "
        "all their edges and then the first 64 of their biggest relation.",
        "",
        "| triples | backend | workload | open (s) | bulk load (s) | p50 (ms) | p99 (ms) | calls/s | edges/call |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['triples']:,} | {row['backend']} | {row['workload']} | {row['open_s']:.2f} | "
            f"{row.get('load', '')} "
            f"| {row['p50_ms']:.3f} | {row['p99_ms']:.3f} | {row['calls_per_s']:,.0f} | {row['edges_per_call']:.1f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path(".cache/kg-bench"), help="cache of datasets and stores")
    parser.add_argument("--sizes", default="10k,1M", help="comma-separated triple counts (10000, 10k, 1M)")
    parser.add_argument(
        "--backends", default=",".join(BACKENDS), help=f"comma-separated subset of {','.join(BACKENDS)}"
    )
    parser.add_argument("--calls", type=int, default=2000, help="timed neighbour calls per backend and size")
    parser.add_argument("--hubs", type=int, default=20, help="also time the N highest-degree entities (0: skip)")
    parser.add_argument("--warmup", type=int, default=100, help="untimed calls first")
    parser.add_argument("--direction", default="both", choices=("out", "in", "both"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--memory-scale", help="instead: memory and load time of the memory store at these sizes (1M,3M)"
    )
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
    if args.memory_scale:
        try:
            scale_sizes = [parse_size(s) for s in args.memory_scale.split(",") if s.strip()]
        except argparse.ArgumentTypeError as err:
            parser.error(str(err))
        print(memory_scale(args, scale_sizes))
        return 0
    rows = []
    for size in sizes:
        rows.extend(bench_size(args, size))
    print(markdown(rows, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
