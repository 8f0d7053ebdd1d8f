"""Throughput and latency of `POST /v1/answer` at several client concurrencies (hf backend, tiny model).

    .venv/bin/python bench/serve_bench.py [--checkpoint DIR] [--concurrency 1 8 32] [--requests 64]

Starts `kgreasoner serve` on a free 127.0.0.1 port with the hf backend, then for each concurrency C
keeps C client threads busy until `--requests` answers came back, and prints requests/s, p50/p99
latency, the mean rollout batch size the server formed (from /metrics) and the mean completion
tokens per answer. Without `--checkpoint` it builds the synthetic KG and an untrained tiny model
(hidden 256, 4 layers, head_dim 64: the configs/tiny-cpu/model.yaml shape); an untrained model
writes until its token budget, so every request costs the full `max_new_tokens` (the worst case).
Questions are the synthetic test split's, cycled; greedy decoding.

Measured here (2 cores shared with a training job, load ~5; default model, 64 tokens per answer,
one torch thread): concurrency 1: 1.75 req/s, p50 0.55 s, p99 0.77 s; 8: 6.5 req/s, p50 1.20 s,
p99 1.33 s; 32: 11.1 req/s, p50 2.45 s, p99 2.57 s. With torch's default two threads on the same
shared cores, concurrency 32 gave 0.95 req/s (OpenMP threads spinning against the other job).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]


def build_model(data_dir: Path, out: Path) -> Path:
    from kgreasoner.config import load_config
    from kgreasoner.models import TinyModelConfig, build_tiny
    from kgreasoner.tokenizer import read_training_texts

    config = load_config(TinyModelConfig, REPO / "configs/tiny-cpu/model.yaml")
    build_tiny(config, read_training_texts([data_dir / "questions.jsonl", data_dir / "names.tsv"]), out)
    return out


def start_server(checkpoint: Path, kg: Path, config_path: Path) -> tuple[subprocess.Popen, str]:
    command = [
        sys.executable,
        "-m",
        "kgreasoner.cli",
        "serve",
        "--llm",
        f"hf:{checkpoint}",
        "--kg",
        str(kg),
        "--config",
        str(config_path),
        "--port",
        "0",
    ]
    process = subprocess.Popen(
        command,
        cwd=REPO,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    for line in process.stdout:
        match = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
        if match:
            threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
            url = match.group(1)
            break
    else:
        raise RuntimeError(f"kgreasoner serve exited with {process.wait()}")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    raise RuntimeError(f"{url}/health did not answer")


def batch_stats(url: str) -> tuple[float, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text

    def value(name: str) -> float:
        match = re.search(rf"^{re.escape(name)} (\S+)$", text, re.MULTILINE)
        return float(match.group(1)) if match else 0.0

    return value("kgreasoner_batch_size_sum"), value("kgreasoner_batch_size_count")


def run_level(url: str, bodies: list[dict], concurrency: int, total: int) -> dict:
    latencies: list[float] = []
    tokens: list[int] = []
    failures = 0
    lock = threading.Lock()
    counter = iter(range(total))

    def worker() -> None:
        nonlocal failures
        with httpx.Client(timeout=600) as client:
            for i in counter:
                start = time.perf_counter()
                reply = client.post(f"{url}/v1/answer", json=bodies[i % len(bodies)])
                elapsed = time.perf_counter() - start
                with lock:
                    if reply.status_code == 200:
                        latencies.append(elapsed)
                        tokens.append(reply.json()["usage"]["completion_tokens"])
                    else:
                        failures += 1

    batches_before = batch_stats(url)
    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for future in [pool.submit(worker) for _ in range(concurrency)]:
            future.result()
    wall = time.perf_counter() - start
    batches_after = batch_stats(url)
    rows = batches_after[0] - batches_before[0]
    count = batches_after[1] - batches_before[1]
    latencies.sort()
    return {
        "concurrency": concurrency,
        "requests": len(latencies),
        "failures": failures,
        "seconds": wall,
        "rps": len(latencies) / wall,
        "p50": statistics.median(latencies),
        "p99": latencies[min(len(latencies) - 1, int(round(0.99 * (len(latencies) - 1))))],
        "mean_batch": rows / count if count else 0.0,
        "tokens": statistics.mean(tokens) if tokens else 0.0,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", type=Path, help="model to serve (default: an untrained tiny model)")
    parser.add_argument("--data", type=Path, help="dataset folder (default: the synthetic set, generated)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--requests", type=int, default=64, help="answers per concurrency level")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="model tokens per answer (rollout limit)")
    parser.add_argument("--max-batch-size", type=int, default=32, help="server's rollout batch limit")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="server's torch threads (ServeConfig.torch_threads; 1 suits cores shared with other jobs)",
    )
    args = parser.parse_args()
    from data_gen.synthetic import write_synthetic
    from kgreasoner.data import load_dataset

    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        tmp = Path(tmp)
        data = args.data or write_synthetic(tmp / "data", seed=0)
        checkpoint = args.checkpoint or build_model(data, tmp / "model")
        config = {
            "tool": {"entity_handles": True, "top_k": 10},
            "rollout": {"max_turns": 4, "max_new_tokens": args.max_new_tokens, "max_turn_tokens": args.max_new_tokens},
            "max_batch_size": args.max_batch_size,
            "batch_wait": 0.01,
            "max_queue": 1024,
            "request_timeout": 600.0,
            "torch_threads": args.torch_threads,
        }
        (tmp / "serve.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
        examples = load_dataset(data, split="test").examples
        bodies = [
            {"question": e.question, "topic_entities": [{"id": t.id} for t in e.topic_entities]} for e in examples
        ]
        process, url = start_server(checkpoint, data, tmp / "serve.yaml")
        try:
            run_level(url, bodies, 1, 2)  # warm-up: first-call allocations
            print(
                f"POST /v1/answer, hf backend, {checkpoint.name}, max_new_tokens {args.max_new_tokens}, "
                f"server batch <= {args.max_batch_size}, {args.torch_threads} torch thread(s), "
                f"{args.requests} requests per level, {os.cpu_count()} CPUs (load {os.getloadavg()[0]:.1f})"
            )
            print(f"{'concurrency':>11} {'req/s':>8} {'p50 s':>8} {'p99 s':>8} {'batch':>6} {'tokens':>7} {'fail':>5}")
            for level in args.concurrency:
                r = run_level(url, bodies, level, args.requests)
                print(
                    f"{r['concurrency']:>11} {r['rps']:>8.2f} {r['p50']:>8.3f} {r['p99']:>8.3f} "
                    f"{r['mean_batch']:>6.1f} {r['tokens']:>7.1f} {r['failures']:>5}",
                    flush=True,
                )
        finally:
            process.terminate()
            process.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
