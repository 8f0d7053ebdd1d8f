"""bench/gpu_smoke.py at its CPU size: SFT then GRPO with hf rollouts on the shrunk Qwen3-0.6B, every figure
printed and written, so the GPU smoke run never rots."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT.parent / "shared" / "models"


@pytest.mark.slow
@pytest.mark.skipif(not (MODELS / "qwen3" / "tokenizer.json").is_file(), reason=f"{MODELS} (real tokenizers) absent")
def test_the_smoke_run_trains_both_stages_at_cpu_size_and_reports_every_figure(tmp_path):
    out = tmp_path / "smoke.json"
    command = [
        sys.executable,
        str(ROOT / "bench" / "gpu_smoke.py"),
        "--shrink",
        "--sft-steps",
        "2",
        "--grpo-steps",
        "1",
        "--questions",
        "2",
        "--generations",
        "2",
        "--max-new-tokens",
        "8",
        "--work",
        str(tmp_path / "work"),
        "--out",
        str(out),
    ]
    # this checkout's package, not another one installed in editable mode
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())
    assert (figures["device"], figures["dtype"], figures["shrink"], figures["lora"]) == ("cpu", "float32", True, False)
    sft, grpo = figures["sft"], figures["grpo"]
    assert sft["steps"] == len(sft["step_s"]) == 2 and grpo["steps"] == len(grpo["step_s"]) == 1
    assert sft["tokens"] > 0 and sft["tokens_per_s"] > 0
    assert 0 < grpo["generated_tokens"] <= 2 * 2 * 8  # 2 questions x 2 rollouts x at most 8 tokens
    assert grpo["generation_tokens_per_s"] > 0 and grpo["train_tokens"] > grpo["generated_tokens"]
    assert grpo["train_tokens_per_s"] > 0 and 0 < grpo["generation_s"][0] < grpo["step_s"][0]
    for stage in (sft, grpo):
        assert stage["peak_gib"] is None and stage["train_share_of_peak"] is None  # no GPU here
        assert stage["estimate_gib"] > stage["estimate_allocated_gib"] > 0 and stage["preflight_problems"] == []
        assert stage["estimate_peak_phase"] == "training step"
    assert f"grpo: 1 steps, step s {grpo['step_s']}" in done.stdout
    assert f"generation {grpo['generation_tokens_per_s']} tokens/s" in done.stdout
    assert "peak memory n/a (no GPU); preflight " in done.stdout
