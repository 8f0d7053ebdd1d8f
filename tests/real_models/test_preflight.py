"""`kgreasoner preflight` on every GPU recipe, with the released model configs standing in for the hub."""

from __future__ import annotations

from pathlib import Path

import pytest

from kgreasoner.cli import main

from .conftest import MODELS, warmup_records

# Random-weight models of the real architectures through whole stages: `make test` runs them,
# `make test-fast` does not.
pytestmark = pytest.mark.slow

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
MODEL_CONFIGS = {"qwen3-8b": "qwen3/configs/Qwen3-8B", "llama3.1-8b": "llama3.1",
                 "qwen3-30b-a3b": "qwen3/configs/Qwen3-30B-A3B"}
GPU_RECIPES = sorted(p for p in CONFIGS.glob("*/*.yaml") if p.parent.name in MODEL_CONFIGS)


def _argv(recipe: Path, world: Path, *extra: str) -> list[str]:
    from kgreasoner.data.trajectories import write_warmup

    data = write_warmup(warmup_records(world), world.parent / "preflight-warmup.jsonl")
    # the recipes' data and warm-up checkpoints exist only on a training machine: point them here
    field = f"train_file={data}" if recipe.stem == "sft" else f"dataset={world}"
    return ["preflight", str(recipe), "--model-config", str(MODELS / MODEL_CONFIGS[recipe.parent.name]),
            "--set", field, *extra]


def test_every_gpu_recipe_is_covered():
    assert {(p.parent.name, p.stem) for p in GPU_RECIPES} == {(m, s) for m in MODEL_CONFIGS for s in ("sft", "grpo")}


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_gpu_recipes_fit_eight_80gib_gpus(recipe, world, capsys):
    code = main(_argv(recipe, world, "--gpus", "8", "--gpu-memory", "80GiB"))
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.rstrip().endswith("preflight passed")
    for row in ("weights", "gradients", "optimiser", "activations", "LM head tile", "total"):
        assert f"\n{row} " in out.out, row
    assert "fits: " in out.out and "of 80.0 GiB per GPU on 8 GPUs" in out.out


def test_a_recipe_given_too_few_gpus_is_refused_with_what_to_change(world, capsys):
    code = main(_argv(CONFIGS / "qwen3-8b" / "grpo.yaml", world, "--gpus", "1", "--gpu-memory", "80GB"))
    err = capsys.readouterr().err
    assert code == 1
    assert "FAIL: the recipe needs " in err and "per GPU but a GPU has 74.5 GiB (1 GPUs); change one of: " in err
    assert "configs/deepspeed/zero3-offload.json" in err and "more GPUs than 1" in err
    assert err.rstrip().endswith("preflight failed")


def test_a_colocated_vllm_share_too_small_for_the_weights_is_refused(world, capsys):
    code = main(_argv(CONFIGS / "qwen3-30b-a3b" / "grpo.yaml", world, "--gpus", "8", "--gpu-memory", "80GiB",
                      "--set", "trainer.vllm_tensor_parallel_size=1"))
    err = capsys.readouterr().err
    assert code == 1
    assert ("FAIL: vLLM's share (28.0 GiB) cannot hold the bf16 weights (56.9 GiB per GPU at "
            "vllm_tensor_parallel_size 1) and a KV cache: raise trainer.vllm_gpu_memory_utilization to at least 0.79, "
            "or raise trainer.vllm_tensor_parallel_size") in err


def test_an_empty_train_split_and_a_missing_model_config_are_reported(world, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code = main(["preflight", str(CONFIGS / "qwen3-8b" / "sft.yaml"), "--gpus", "8", "--gpu-memory", "80GiB",
                 "--set", f"train_file={empty}", "--set", f"model={tmp_path / 'nowhere'}"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"FAIL: {empty}: the train split is empty" in err
    assert "FAIL: model config of " in err and "pass --model-config PATH" in err


def test_trl_bounds_the_logits_memory_itself():
    """TRL 1.16's fused LM head (both trainers) projects in tiles, never batch x length x vocabulary;
    the preflight's LM-head row is one such tile. If TRL changes this, the estimate must change too."""
    from trl.kernels.chunked_logprob import TOKEN_CHUNK_SIZE
    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE

    assert (TOKEN_CHUNK_SIZE, _CHUNKED_LOGPROB_CHUNK_SIZE) == (4096, 32768)


def test_train_scripts_dry_run(world, capsys):
    import os
    import subprocess
    import sys

    repo = CONFIGS.parent
    recipe = CONFIGS / "qwen3-8b" / "sft.yaml"
    argv = _argv(recipe, world)
    done = subprocess.run([sys.executable, str(repo / "train" / "sft.py"), "--config", str(recipe), "--dry-run",
                           "--gpus", "8", "--gpu-memory", "80GiB", *argv[2:]],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.rstrip().endswith("preflight passed")
