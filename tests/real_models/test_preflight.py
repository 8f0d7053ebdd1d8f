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
MODEL_CONFIGS = {
    "qwen3-8b": "qwen3/configs/Qwen3-8B",
    "llama3.1-8b": "llama3.1",
    "qwen3-30b-a3b": "qwen3/configs/Qwen3-30B-A3B",
}
GPU_RECIPES = sorted(p for p in CONFIGS.glob("*/*.yaml") if p.parent.name in MODEL_CONFIGS)


def _argv(recipe: Path, world: Path, *extra: str) -> list[str]:
    from kgreasoner.records.trajectories import write_warmup

    data = write_warmup(warmup_records(world), world.parent / "preflight-warmup.jsonl")
    # the recipes' data and warm-up checkpoints exist only on a training machine: point them here
    fields = [f"train_file={data}"] if recipe.stem == "sft" else [f"dataset={world}"]
    return [
        "preflight",
        str(recipe),
        "--model-config",
        str(MODELS / MODEL_CONFIGS[recipe.parent.name]),
        *(arg for field in fields for arg in ("--set", field)),
        *extra,
    ]


def test_every_gpu_recipe_is_covered():
    assert {(p.parent.name, p.stem) for p in GPU_RECIPES} == {(m, s) for m in MODEL_CONFIGS for s in ("sft", "grpo")}


@pytest.mark.parametrize("recipe", GPU_RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_gpu_recipes_fit_eight_80gib_gpus(recipe, world, capsys):
    code = main(_argv(recipe, world, "--gpus", "8", "--gpu-memory", "80GiB"))
    out = capsys.readouterr()
    assert code == 0, out.err
    assert out.out.rstrip().endswith("preflight passed")
    for row in ("weights", "gradients", "optimiser", "activations", "LM head tile", "peak"):
        assert f"\n{row} " in out.out, row
    assert "fits: " in out.out and "of 80.0 GiB per GPU on 8 GPUs" in out.out


def test_a_recipe_given_too_few_gpus_is_refused_with_what_to_change(world, capsys):
    code = main(_argv(CONFIGS / "qwen3-8b" / "grpo.yaml", world, "--gpus", "1", "--gpu-memory", "80GB"))
    err = capsys.readouterr().err
    assert code == 1
    assert "FAIL: the recipe needs " in err
    assert "per GPU (peak: training step) but a GPU has 74.5 GiB (1 GPUs); change one of: " in err
    assert "configs/deepspeed/zero3-offload.json" in err and "more GPUs than 1" in err
    assert err.rstrip().endswith("preflight failed")


def test_a_colocated_vllm_share_too_small_for_the_weights_is_refused(world, capsys):
    code = main(
        _argv(
            CONFIGS / "qwen3-30b-a3b" / "grpo.yaml",
            world,
            "--gpus",
            "8",
            "--gpu-memory",
            "80GiB",
            "--set",
            "trainer.vllm_tensor_parallel_size=1",
        )
    )
    err = capsys.readouterr().err
    assert code == 1
    assert (
        "FAIL: vLLM's share (37.6 GiB) cannot hold the bf16 weights (56.9 GiB per GPU at "
        "vllm_tensor_parallel_size 1) and a KV cache: raise trainer.vllm_gpu_memory_utilization to at least 0.79, "
        "or raise trainer.vllm_tensor_parallel_size"
    ) in err


def test_an_empty_train_split_and_a_missing_model_config_are_reported(world, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    code = main(
        [
            "preflight",
            str(CONFIGS / "qwen3-8b" / "sft.yaml"),
            "--gpus",
            "8",
            "--gpu-memory",
            "80GiB",
            "--set",
            f"train_file={empty}",
            "--set",
            f"model={tmp_path / 'nowhere'}",
        ]
    )
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
    done = subprocess.run(
        [
            sys.executable,
            str(repo / "train" / "sft.py"),
            "--config",
            str(recipe),
            "--dry-run",
            "--gpus",
            "8",
            "--gpu-memory",
            "80GiB",
            *argv[2:],
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.rstrip().endswith("preflight passed")


def _vllm_context(monkeypatch, context):
    """Build GRPOConfig as training/grpo.py does, with vLLM's context set as given: None is the recipe as it
    stood when grpo_config set no `vllm_max_model_length`; "rollout" is the rollout's longest sequence, the
    context grpo_config gives vLLM now (a no-op where it already does)."""
    import kgreasoner.training.grpo as grpo
    from kgreasoner.training.preflight import sequence_tokens

    built = grpo.grpo_config

    def grpo_config(recipe, output_dir, episode):
        args = built(recipe, output_dir, episode)
        if context is None or args.vllm_max_model_length is None:
            args.vllm_max_model_length = None if context is None else sequence_tokens(recipe, "grpo")
        return args

    monkeypatch.setattr(grpo, "grpo_config", grpo_config)


def test_llama_grpo_without_a_vllm_context_is_refused_and_passes_with_the_rollouts(world, capsys, monkeypatch):
    """vLLM with no max_model_len takes Llama 3.1's 131,072 positions: 16 GiB of KV for one sequence, more than
    a 24 GiB share (TRL's default 0.3) leaves after 15 GiB of weights, so vLLM would refuse to start."""
    recipe = CONFIGS / "llama3.1-8b" / "grpo.yaml"
    share = ("--set", "trainer.vllm_gpu_memory_utilization=0.3")
    _vllm_context(monkeypatch, None)
    code = main(_argv(recipe, world, "--gpus", "8", "--gpu-memory", "80GiB", *share))
    err = capsys.readouterr().err
    assert code == 1
    assert (
        "FAIL: vLLM cannot start: its share (24.0 GiB) less the bf16 weights (15.0 GiB per GPU at "
        "vllm_tensor_parallel_size 1) and its 4096-token profiling forward (0.7 GiB) leaves 8.3 GiB of KV cache, "
        "and one sequence of its 131072-token context (vllm_max_model_length unset: vLLM takes the model's "
        "max_position_embeddings) needs 16.0 GiB: give vLLM the rollout's 7681-token context "
        "(vllm_max_model_length), or raise trainer.vllm_gpu_memory_utilization to at least 0.4"
    ) in err

    _vllm_context(monkeypatch, "rollout")
    code = main(_argv(recipe, world, "--gpus", "8", "--gpu-memory", "80GiB", *share))
    out = capsys.readouterr().out
    assert code == 0
    assert "ok: vLLM: one 7681-token sequence (0.94 GiB of KV) fits the 8.3 GiB its share leaves" in out


def test_a_vllm_context_shorter_than_the_rollouts_is_refused(world, capsys, monkeypatch):
    _vllm_context(monkeypatch, "rollout")
    code = main(
        _argv(
            CONFIGS / "qwen3-8b" / "grpo.yaml",
            world,
            "--gpus",
            "8",
            "--gpu-memory",
            "80GiB",
            "--set",
            "rollout.max_new_tokens=8192",
        )
    )
    assert code == 0, capsys.readouterr().err  # the rollout's own length is what vLLM gets
    import kgreasoner.training.grpo as grpo

    built = grpo.grpo_config

    def short(recipe, output_dir, episode):
        args = built(recipe, output_dir, episode)
        args.vllm_max_model_length = 4096
        return args

    monkeypatch.setattr(grpo, "grpo_config", short)
    code = main(_argv(CONFIGS / "qwen3-8b" / "grpo.yaml", world, "--gpus", "8", "--gpu-memory", "80GiB"))
    assert code == 1
    assert (
        "FAIL: vLLM's context (4096 tokens, vllm_max_model_length) is shorter than a rollout may grow (7681 = "
        "max_prompt_tokens 512 + rollout.max_new_tokens + rollout.max_turns x rollout.max_tool_tokens + 1)"
    ) in capsys.readouterr().err


def _estimate(recipe, world, *overrides, gpus=8):
    from kgreasoner.training.preflight import GIB, preflight

    report = preflight(
        CONFIGS / recipe / "grpo.yaml",
        gpus,
        80 * GIB,
        MODELS / MODEL_CONFIGS[recipe],
        [f"dataset={world}", *overrides],
    )
    return report, {(row.phase, row.name): row.size for row in report.estimate.rows}


def test_hf_rollouts_hold_the_whole_generation_batch_and_the_gathered_weights(world, monkeypatch):
    """Qwen3-8B with hf rollouts: TRL generates 4 x 8 = 32 rows a GPU at once, and ZeRO-3 gathers the whole
    model for it. Counted as 4 rows beside the training step, this recipe looked like 40 of 80 GiB."""
    from kgreasoner.training.preflight import GENERATION, GIB, TRAINING

    _vllm_context(monkeypatch, "rollout")
    report, rows = _estimate("qwen3-8b", world, "rollout_backend=hf")
    kv_token = 2 * 36 * 8 * 128 * 2  # keys and values, 36 layers, 8 heads of 128, bf16
    assert rows[GENERATION, "hf rollout KV cache"] == 32 * (7681 + 64) * kv_token * 1.5
    assert rows[GENERATION, "tool-block cache copy"] == 31 * (7681 + 64) * kv_token
    assert rows[GENERATION, "ZeRO-3 gathered"] == 8_190_735_360 * 2
    assert report.estimate.peak_phase == GENERATION and report.estimate.total > 80 * GIB
    assert report.estimate.phase_total(TRAINING) < 40 * GIB  # alone, the training step fits
    assert not report.ok
    assert "(peak: hf rollouts)" in report.problems[0]
    assert (
        "a smaller generation batch (32 rows a GPU: trainer.per_device_train_batch_size x "
        "trainer.gradient_accumulation_steps" in report.problems[0]
    )


def test_episode_one_leaves_nothing_alive(world, monkeypatch):
    """Episode 1's trainer, DeepSpeed engine and vLLM are released before episode 2 is built (its hard cases
    mined from a file, with no model): the estimate is one episode's phases. Where episode 2 was built beside
    episode 1's live state, the GPU held their sum: more than 80 GiB."""
    from kgreasoner.training.preflight import GIB, OVERHEAD_BYTES, TRAINING

    _vllm_context(monkeypatch, "rollout")
    report, rows = _estimate("qwen3-8b", world)
    estimate = report.estimate
    assert report.ok and estimate.phases == [TRAINING]
    held = estimate.held(TRAINING)  # episode 1's trainer, engine and vLLM
    assert held == sum(
        rows[TRAINING, name] for name in ("weights", "gradients", "optimiser", "reference model", "vLLM (colocated)")
    )
    assert rows[TRAINING, "vLLM (colocated)"] == 0.45 * 80 * GIB
    # as it would be: episode 2 built beside episode 1's live state (one CUDA context between them)
    assert round((held + estimate.phase_total(TRAINING) - OVERHEAD_BYTES) / GIB, 1) == 123.0
    assert estimate.total == estimate.phase_total(TRAINING)
    assert round(estimate.total / GIB, 1) == 71.8


def test_a_gpu_count_the_vllm_tensor_parallel_size_does_not_divide_is_refused(world, capsys):
    """The 30B-A3B recipe runs vLLM with tensor parallelism 4: TRL refuses 6 ranks, only after loading the models."""
    recipe = CONFIGS / "qwen3-30b-a3b" / "grpo.yaml"
    code = main(_argv(recipe, world, "--gpus", "6", "--gpu-memory", "80GiB"))
    err = capsys.readouterr().err
    assert code == 1
    assert (
        "FAIL: trainer.vllm_tensor_parallel_size 4 does not divide the 6 GPUs: TRL splits the ranks into vLLM groups "
        "of 4 and refuses the run after loading the models; run on a multiple of 4 GPUs (4 or 8), or set "
        "trainer.vllm_tensor_parallel_size to a divisor of 6 (1, 2, 3, 6)"
    ) in err
    code = main(_argv(recipe, world, "--gpus", "8", "--gpu-memory", "80GiB"))
    assert code == 0
    assert "ok: vLLM: 8 GPUs make 2 tensor-parallel group(s) of 4" in capsys.readouterr().out


@pytest.mark.parametrize("stage", ["sft", "grpo"])
def test_lora_on_the_30b_moe_recipes_keeps_a_dropout_peft_takes(stage, world, capsys):
    """PEFT adapts Qwen3-MoE's fused experts (one tensor per projection) through its ParamWrapper, which refuses any
    dropout: the shipped recipes set 0, so turning LoRA on works; a nonzero dropout is reported with what to set."""
    recipe = CONFIGS / "qwen3-30b-a3b" / f"{stage}.yaml"
    code = main(_argv(recipe, world, "--gpus", "8", "--gpu-memory", "80GiB", "--set", "lora.enabled=true"))
    out = capsys.readouterr().out
    assert code == 0 and out.rstrip().endswith("preflight passed")
    code = main(_argv(recipe, world, "--gpus", "8", "--set", "lora.enabled=true", "--set", "lora.dropout=0.05"))
    err = capsys.readouterr().err
    assert code == 1
    assert (
        "FAIL: lora.dropout 0.05: PEFT adapts qwen3_moe's fused MoE experts (model.layers.0.mlp.experts.gate_up_proj, "
        "...) through its ParamWrapper, which takes no dropout (lora.ParamWrapper does not work with lora_dropout "
        "!= 0.): set lora.dropout: 0"
    ) in err


def test_the_host_memory_a_cpu_offload_pins_is_checked_per_host(world, capsys):
    """The 30B-A3B GRPO recipe offloads the optimiser: 30.53B parameters x 16 B (fp32 master, Adam's two moments,
    the fp32 gradient partition) = 455.0 GiB pinned on a host of 8 GPUs, half that per host over two hosts."""
    recipe = CONFIGS / "qwen3-30b-a3b" / "grpo.yaml"
    figure = (
        "the DeepSpeed JSON (configs/deepspeed/zero3-offload.json) offloads to the CPU {} GiB (pinned) per host "
        "(optimiser: 30.53B trainable x 16 B (fp32 master 4, Adam moments 8, fp32 gradients 4){})"
    )
    code = main(_argv(recipe, world, "--gpus", "8", "--gpu-memory", "80GiB", "--host-memory", "256GiB"))
    err = capsys.readouterr().err
    assert code == 1
    assert (
        "FAIL: " + figure.format("455.0", "") + ", more than a host's 256.0 GiB (--host-memory); change one of: "
        "more hosts than 1 (8 GPUs, --gpus-per-host 8); lora.enabled: true"
    ) in err
    code = main(_argv(recipe, world, "--gpus", "16", "--gpu-memory", "80GiB", "--host-memory", "256"))
    out = capsys.readouterr().out
    assert code == 0
    assert "ok: host memory: 227.5 of 256.0 GiB per host: " + figure.format("227.5", " x 8/16 GPUs on a host") in out
    code = main(_argv(recipe, world, "--gpus", "8", "--gpu-memory", "80GiB"))  # no GPU here: the figure is a warning
    out = capsys.readouterr().out
    assert code == 0
    assert "WARN: host memory not checked (pass --host-memory): " + figure.format("455.0", "") in out


def test_dev_evaluation_runs_on_the_runs_backend(world, monkeypatch, capsys):
    """dev_eval.choose_final best_dev (dev evaluation's default) measures each save on the whole dev split through
    the run's own rollout backend, as the dev curve does: on the 30B-A3B recipe's vLLM it runs in the engine's share
    (no hf phase: the recipe fits by its training step, 72.3 GiB), on hf in calls of dev_eval.batch_size rows with the
    whole bf16 model gathered on every GPU (56.9 GiB more), which the report names as the peak."""
    from kgreasoner.training.preflight import DEV_EVAL, GIB, TRAINING

    _vllm_context(monkeypatch, "rollout")
    report, rows = _estimate("qwen3-30b-a3b", world, "dev_eval.steps=50")
    assert round(report.estimate.phase_total(TRAINING) / GIB, 1) == 72.3
    assert DEV_EVAL not in report.estimate.phases and report.ok

    on_hf = ("dev_eval.steps=50", "rollout_backend=hf", "dev_eval.batch_size=64", "dev_eval.questions=1000")
    report, rows = _estimate("qwen3-30b-a3b", world, *on_hf)
    assert rows[DEV_EVAL, "ZeRO-3 gathered"] == 30_532_122_624 * 2
    assert rows[DEV_EVAL, "hf rollout KV cache"] == 64 * (7681 + 64) * (2 * 48 * 4 * 128 * 2) * 1.5
    assert not report.ok


def test_on_vllm_the_whole_dev_splits_calls_count_among_the_engines_rows(world):
    """On vLLM each save's measurement on the whole dev split hands the engine dev_eval.batch_size rows a call
    (a CWQ-sized split fills every call): 64 rows, more than the generation batch's 4 x 8 = 32 and the dev
    sample's share of 19 (150 questions over 8 GPUs), which are what the engine takes with choose_final last."""
    from kgreasoner.config import load_config
    from kgreasoner.training.grpo import GRPORecipe, grpo_config
    from kgreasoner.training.preflight import vllm_rows

    for final, expected in (("best_dev", (64, "a dev batch: dev_eval.batch_size 64")), ("last", (32, None))):
        sets = [f"dataset={world}", "dev_eval.steps=10", "dev_eval.batch_size=64", f"dev_eval.choose_final={final}"]
        recipe = load_config(GRPORecipe, CONFIGS / "qwen3-8b" / "grpo.yaml", sets)
        rows, what = vllm_rows(recipe, grpo_config(recipe, world / "run", recipe.episodes[0]), 8)
        assert rows == expected[0] and (expected[1] is None or what == expected[1])


def test_the_dev_curve_on_hf_holds_a_batch_of_dev_eval_batch_size_rows(world, monkeypatch):
    """A rank rolls out its share of the dev sample (150 questions over 8 GPUs: 19) in batches of at most
    dev_eval.batch_size rows, beside the trainer's state and, under ZeRO-3, the whole gathered model."""
    from kgreasoner.training.preflight import DEV_EVAL

    _vllm_context(monkeypatch, "rollout")
    kv_row = (7681 + 64) * (2 * 36 * 8 * 128 * 2)  # Qwen3-8B: 36 layers, 8 key/value heads of 128, bf16
    for size, batch in (("32", 19), ("8", 8)):
        overrides = (
            "rollout_backend=hf",
            "dev_eval.steps=10",
            "dev_eval.choose_final=last",
            f"dev_eval.batch_size={size}",
        )
        report, rows = _estimate("qwen3-8b", world, *overrides)
        assert rows[DEV_EVAL, "hf rollout KV cache"] == batch * kv_row * 1.5
        assert rows[DEV_EVAL, "ZeRO-3 gathered"] == 8_190_735_360 * 2


def test_a_vllm_kv_cache_smaller_than_the_rollout_batch_is_a_warning_naming_the_share(world, capsys):
    """Qwen3-8B at vLLM share 0.3 keeps 8.1 GiB of KV, 58,890 tokens, against 32 rows of up to 7,681 tokens: vLLM
    would preempt and recompute. 0.63 would hold them, more than the GPU has beside the training step (0.55)."""
    recipe = CONFIGS / "qwen3-8b" / "grpo.yaml"
    share = "trainer.vllm_gpu_memory_utilization=0.3"
    code = main(_argv(recipe, world, "--gpus", "8", "--gpu-memory", "80GiB", "--set", share))
    out = capsys.readouterr().out
    assert code == 0
    assert (
        "WARN: vLLM's KV cache holds 58,890 tokens: vllm_gpu_memory_utilization 0.3 x 80.0 GiB = 24.0 GiB, less 15.9 "
        "GiB of bf16 weights and profiling forward, leaves 8.1 GiB at 144 KiB a token; a rollout batch is 32 rows a "
        "GPU (the generation batch: trainer.per_device_train_batch_size 4 x steps_per_generation 8) = 32 rows x 7681 "
        "tokens = 245,792 tokens (33.8 GiB) at their longest, so vLLM preempts rows and recomputes them: holding them "
        "takes a share of 0.63, and the GPU has room for at most 0.55 beside the 35.8 GiB of the rest of its peak (at "
        "0.55: 26 rows at their longest); change one of: trainer.vllm_gpu_memory_utilization (up to that)"
    ) in out


def test_a_share_that_holds_the_rollout_batch_is_named_and_then_passes(world, capsys):
    """Qwen3-30B-A3B, tensor parallelism 4: an engine serves 4 ranks' 32 rows, each GPU a quarter of the key/value
    heads (24 KiB a token); a share of 0.47 holds all 128 rows at their longest and leaves the GPU room."""
    recipe = CONFIGS / "qwen3-30b-a3b" / "grpo.yaml"
    code = main(
        _argv(
            recipe, world, "--gpus", "8", "--set", "trainer.vllm_gpu_memory_utilization=0.35", "--host-memory", "1TiB"
        )
    )
    out = capsys.readouterr().out
    assert code == 0
    assert (
        "x 4 ranks per engine (vllm_tensor_parallel_size) = 128 rows x 7681 tokens = 983,168 tokens (22.5 GiB) at "
        "their longest, so vLLM preempts rows and recomputes them: raise trainer.vllm_gpu_memory_utilization to 0.47 "
        "(0.47 x 80.0 GiB = 37.6 GiB; the GPU then holds 72.3 of 80.0 GiB at its peak)"
    ) in out
    code = main(
        _argv(
            recipe, world, "--gpus", "8", "--set", "trainer.vllm_gpu_memory_utilization=0.47", "--host-memory", "1TiB"
        )
    )
    out = capsys.readouterr().out
    assert code == 0 and "WARN" not in out
    assert "ok: vLLM: its KV cache (23.3 GiB, 1,018,007 tokens) holds a rollout batch at its longest (128 rows" in out
