"""bench/gpu_smoke.py at its CPU size: SFT then GRPO with hf rollouts on the shrunk Qwen3-0.6B, every figure
printed and written, so the GPU smoke run never rots: in one process, under DeepSpeed ZeRO-3, and on two
gloo ranks through torchrun, each showing that SFT moved the policy (its fixed-batch loss falls and its
weights change), and failing a run that does not."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT.parent / "shared" / "models"
SMOKE = ROOT / "bench" / "gpu_smoke.py"
needs_tokenizer = pytest.mark.skipif(
    not (MODELS / "qwen3" / "tokenizer.json").is_file(), reason=f"{MODELS} (real tokenizers) absent"
)
TINY = [
    "--shrink",
    "--sft-steps",
    "2",
    "--sft-batch",
    "1",
    "--lr",
    "1e-3",
    "--generations",
    "2",
    "--max-new-tokens",
    "8",
]
"""A CPU-size run: one row of SFT per rank and step, at a learning rate that moves a loss in two steps."""


def _smoke(tmp_path: Path, *options: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    out = tmp_path / "smoke.json"
    command = [sys.executable, str(SMOKE), *TINY, *options, "--work", str(tmp_path / "work"), "--out", str(out)]
    # this checkout's package, not another one installed in editable mode
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    return done, json.loads(out.read_text()) if out.is_file() else None


def _learned(done: subprocess.CompletedProcess, figures: dict) -> None:
    """The printed and written figures agree that SFT moved the policy."""
    sft = figures["sft"]
    assert figures["learns"] is True and figures["min_moved"] == 0.5
    assert 0 < sft["loss_end"] < sft["loss_start"]
    assert sft["moved_share"] == 1.0  # float32 AdamW moves every weight with a gradient; tied head: all have one
    assert f"fixed-batch loss {sft['loss_start']:.6f} -> {sft['loss_end']:.6f} (falls)" in done.stdout
    assert "trained weights moved 100.00% (at least 50%: ok)" in done.stdout
    assert done.stdout.rstrip().endswith("policy learns")


@pytest.mark.slow
@needs_tokenizer
def test_the_smoke_run_trains_both_stages_at_cpu_size_and_reports_every_figure(tmp_path):
    done, figures = _smoke(tmp_path, "--grpo-steps", "1", "--questions", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (figures["device"], figures["dtype"], figures["shrink"], figures["lora"]) == ("cpu", "float32", True, False)
    assert (figures["deepspeed"], figures["ranks"]) == (None, 1)
    sft, grpo = figures["sft"], figures["grpo"]
    assert sft["steps"] == len(sft["step_s"]) == 2 and grpo["steps"] == len(grpo["step_s"]) == 1
    assert sft["tokens"] > 0 and sft["tokens_per_s"] > 0
    assert 0 < grpo["generated_tokens"] <= 2 * 2 * 8  # 2 questions x 2 rollouts x at most 8 tokens
    assert grpo["generation_tokens_per_s"] > 0 and grpo["train_tokens"] > grpo["generated_tokens"]
    assert grpo["train_tokens_per_s"] > 0 and 0 < grpo["generation_s"][0] < grpo["step_s"][0]
    for stage in (sft, grpo):
        assert stage["peak_allocated_gib"] is None and stage["peak_reserved_gib"] is None  # no GPU here
        assert stage["train_share_of_peak"] is None
        assert stage["estimate_gib"] > stage["estimate_allocated_gib"] > 0 and stage["preflight_problems"] == []
        assert stage["estimate_peak_phase"] == "training step"
    assert f"grpo: 1 steps, step s {grpo['step_s']}" in done.stdout
    assert f"generation {grpo['generation_tokens_per_s']} tokens/s" in done.stdout
    assert "peak memory n/a (no GPU); preflight " in done.stdout
    _learned(done, figures)


@pytest.mark.slow
@needs_tokenizer
def test_the_smoke_run_trains_under_deepspeed_zero3(tmp_path):
    done, figures = _smoke(tmp_path, "--deepspeed", "--grpo-steps", "1", "--questions", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (figures["deepspeed"], figures["ranks"]) == ("configs/deepspeed/zero3.json", 1)
    assert "full fine-tuning, DeepSpeed configs/deepspeed/zero3.json, 1 rank" in done.stdout
    assert figures["grpo"]["steps"] == 1 and figures["grpo"]["generated_tokens"] > 0
    _learned(done, figures)


@pytest.mark.slow
@needs_tokenizer
def test_the_smoke_run_trains_on_two_gloo_ranks(tmp_path):
    done, figures = _smoke(tmp_path, "--ranks", "2", "--grpo-steps", "1", "--questions", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (figures["deepspeed"], figures["ranks"]) == (None, 2)
    assert "full fine-tuning, 2 ranks" in done.stdout
    assert done.stdout.count("policy learns") == 1  # rank 0 reports
    # two rows a step, one a rank: TRL counts both ranks' tokens
    assert figures["sft"]["tokens"] > 0 and figures["grpo"]["steps"] == 1
    _learned(done, figures)


@pytest.mark.slow
@needs_tokenizer
def test_a_run_that_leaves_the_policy_unmoved_fails(tmp_path):
    """At a learning rate of 1e-30 every float32 update rounds away: the run must say so and exit 1."""
    done, figures = _smoke(tmp_path, "--grpo-steps", "0", "--lr", "1e-30")
    assert done.returncode == 1, done.stderr[-3000:]
    sft = figures["sft"]
    assert sft["loss_end"] == sft["loss_start"] and sft["moved_share"] == 0.0 and figures["learns"] is False
    assert f"fixed-batch loss {sft['loss_start']:.6f} -> {sft['loss_end']:.6f} (DOES NOT FALL)" in done.stdout
    assert "trained weights moved 0.00% (at least 50%: TOO FEW)" in done.stdout
    assert "grpo: not run" in done.stdout
    assert done.stdout.rstrip().endswith("POLICY DOES NOT LEARN: the SFT stage left it unmoved")


def _module():
    spec = importlib.util.spec_from_file_location("gpu_smoke", SMOKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H100 PCIe", 756.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA GH200 480GB", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA A10", 125.0),
        ("NVIDIA L40S", 362.0),
        ("NVIDIA L4", 121.0),
        ("NVIDIA B200", 2250.0),
        ("NVIDIA GeForce RTX 4090", 165.0),
        ("AMD Instinct MI300X", 1307.0),
        ("Tesla T4", None),
        ("NVIDIA L40", None),
    ],
)
def test_peak_flops_by_card_name(name, peak):
    assert _module().card_peak(name) == peak


def test_an_unknown_card_is_named_and_given_no_share():
    module = _module()
    stage = {
        "steps": 1,
        "step_s": [1.0],
        "peak_allocated_gib": 1.5,
        "peak_reserved_gib": 2.25,
        "estimate_gib": 3.0,
        "estimate_allocated_gib": 2.0,
        "estimate_peak_phase": "training step",
        "tokens_per_s": 10.0,
        "loss_start": 2.0,
        "loss_end": 1.0,
        "moved_share": 0.75,
        "train_share_of_peak": None,
    }
    figures = {
        "device": "Tesla T4",
        "dtype": "float32",
        "model_config": "Qwen3-0.6B",
        "shrink": False,
        "lora": False,
        "deepspeed": None,
        "ranks": 1,
        "peak_tflops": module.peak_tflops(module.parse_args([])),
        "min_moved": 0.5,
        "learns": True,
        "sft": stage,
        "grpo": None,
    }
    text = module.report(figures)
    assert "peak FLOPs of Tesla T4 unknown: pass --peak-tflops for a share of peak" in text
    assert "peak memory 1.50 GiB allocated, 2.25 GiB reserved; preflight 3.00 GiB" in text
    assert "trained weights moved 75.00% (at least 50%: ok)" in text
    assert not re.search(r"% of .* TFLOP/s", text)
