"""A tiny model SFT-ed briefly on warm-up trajectories of the shared synthetic KG (`synthetic_dir`), and a live server.

The model is trained for a few dozen steps only: enough to open with `<think>` and search the
topic entity's handle (every warm-up trajectory starts that way), so the server's tool is really
called; its answers are mostly wrong, which these tests do not look at.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
import yaml

from kgreasoner.data import load_dataset, open_dataset_kg
from kgreasoner.models import TinyModelConfig, build_tiny
from kgreasoner.protocol import format_tool_block
from kgreasoner.records.trajectories import Segment, WarmupRecord, write_warmup
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
from kgreasoner.tokenizer import TokenizerConfig, read_training_texts
from kgreasoner.training.sft import SFTRecipe, train_sft

REPO = Path(__file__).resolve().parents[2]
TOOL = {"entity_handles": True, "top_k": 4}
SERVE_CONFIG = {
    "tool": TOOL,
    "rollout": {"max_turns": 3, "max_new_tokens": 96, "max_turn_tokens": 48},
    "max_question_chars": 300,
    "max_topic_entities": 4,
    "max_body_bytes": 16384,
    "body_timeout": 2.0,
    "header_timeout": 1.0,
    "max_batch_size": 16,
    "batch_wait": 0.05,
    "request_timeout": 60.0,
}


@pytest.fixture(scope="session")
def dataset(synthetic_dir):
    return load_dataset(synthetic_dir)


@pytest.fixture(scope="session")
def tool(dataset):
    """The same tool configuration as the server's, for replaying its searches locally."""
    return KGSearchTool(open_dataset_kg(dataset), ToolConfig(**TOOL))


def short_records(dataset, tool) -> list[WarmupRecord]:
    """One short trajectory per train question: search the topic (E1), then answer the first entity shown.

    Only tags and handles (one token each) are written, with real tool blocks in between, so the
    model learns the protocol's shape (think, search, read, answer) in a few steps; what it
    answers does not matter here.
    """
    records = []
    for example in dataset.split("train"):
        session = tool.session(example.question, list(example.topic_entities))
        result = session.call("E1")
        if result.error is not None:
            continue
        records.append(
            WarmupRecord(
                id=example.id,
                question=example.question,
                topic_entities=example.topic_entities,
                segments=(
                    Segment("<think><search>E1</search>", True),
                    Segment(format_tool_block(result.text), False),
                    Segment("</think>\n<answer>E2</answer>", True),
                ),
                hops=example.hops,
            )
        )
    return records


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory, synthetic_dir, dataset, tool):
    root = tmp_path_factory.mktemp("serve_model")
    config = dataclasses.replace(
        TinyModelConfig(),
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        intermediate_size=128,
        max_position_embeddings=1024,
        tokenizer=TokenizerConfig(num_handles=32),
    )
    build_tiny(
        config, read_training_texts([synthetic_dir / "questions.jsonl", synthetic_dir / "names.tsv"]), root / "base"
    )
    write_warmup(short_records(dataset, tool), root / "warmup.jsonl")
    recipe = SFTRecipe(
        model=str(root / "base"),
        train_file=str(root / "warmup.jsonl"),
        run_dir=str(root / "sft"),
        trainer={
            "learning_rate": 1e-2,
            "max_steps": 24,
            "per_device_train_batch_size": 8,
            "warmup_steps": 0.0,
            "max_length": 1024,
            "eval_steps": 0,
            "save_steps": 24,
            "report_to": [],
            "seed": 0,
        },
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 64-wide model gains nothing from a second thread, and loses much on shared cores
    try:
        return train_sft(recipe)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def serve_config_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("serve_config") / "serve.yaml"
    # One torch thread in the server process: the test process and other jobs share the cores.
    path.write_text(yaml.safe_dump({**SERVE_CONFIG, "torch_threads": 1}), encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def server(checkpoint, synthetic_dir, serve_config_file):
    """`kgreasoner serve` in a subprocess on a free 127.0.0.1 port; yields its base URL."""
    with serve(checkpoint, str(synthetic_dir), serve_config_file) as url:
        yield url


@contextlib.contextmanager
def serve(checkpoint, kg: str, config_file):
    """Run `kgreasoner serve --kg KG` on a free 127.0.0.1 port until the block ends; yields its base URL."""
    command = [
        sys.executable,
        "-m",
        "kgreasoner.cli",
        "serve",
        "--llm",
        f"hf:{checkpoint}",
        "--kg",
        kg,
        "--config",
        str(config_file),
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = _wait_for_url(process, timeout=120)
        # Keep reading its log so a full pipe never blocks the server.
        threading.Thread(target=lambda: [None for _ in process.stdout], daemon=True).start()
        _wait_healthy(url, process, timeout=60)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_for_url(process: subprocess.Popen, timeout: float) -> str:
    deadline, seen = time.monotonic() + timeout, []
    while time.monotonic() < deadline:
        ready, _, _ = select.select([process.stdout], [], [], 0.5)
        if ready:
            line = process.stdout.readline()
            if not line and process.poll() is not None:
                break
            seen.append(line)
            match = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
            if match:
                return match.group(1)
        elif process.poll() is not None:
            break
    raise RuntimeError("kgreasoner serve did not announce its URL:\n" + "".join(seen[-30:]))


def _wait_healthy(url: str, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"kgreasoner serve exited with {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url}/health did not answer within {timeout} s")
