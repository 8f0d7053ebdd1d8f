import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kgreasoner.config import ConfigError, load_config
from kgreasoner.models import load_model_and_tokenizer
from kgreasoner.records.trajectories import write_warmup
from kgreasoner.training.common import last_complete_checkpoint
from kgreasoner.training.sft import SFTRecipe, build_datasets, train_sft

REPO = Path(__file__).resolve().parents[2]


def _recipe(tmp_path, checkpoint, records, **overrides) -> SFTRecipe:
    train = [r.__class__(**{**r.__dict__, "id": f"{r.id}-{i}"}) for i in range(8) for r in records]
    path = write_warmup(train, tmp_path / "warmup.jsonl")
    fields = dict(
        model=str(checkpoint),
        train_file=str(path),
        run_dir=str(tmp_path / "sft"),
        trainer={
            "learning_rate": 1e-2,
            "max_steps": 12,
            "per_device_train_batch_size": 4,
            "warmup_steps": 0.0,
            "logging_steps": 1,
            "eval_steps": 0,
            "save_steps": 6,
            "report_to": [],
            "seed": 0,
        },
    )
    fields.update(overrides, trainer={**fields["trainer"], **overrides.get("trainer", {})})
    return SFTRecipe(**fields)


def test_labels_are_minus_100_outside_model_spans(tiny_checkpoint, records, tmp_path):
    recipe = _recipe(tmp_path, tiny_checkpoint, records)
    _, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    train, dev, dropped = build_datasets(recipe, tokenizer)
    assert dev is None and dropped == 0 and len(train) == 16
    assert set(train.column_names) == {"input_ids", "assistant_masks"}
    short = _recipe(tmp_path, tiny_checkpoint, records, trainer={"max_length": 16})
    with pytest.raises(ValueError, match="no training trajectory fits max_length=16"):
        build_datasets(short, tokenizer)


def test_sft_learns_the_trajectories_and_saves_a_loadable_model(tiny_checkpoint, records, tmp_path):
    # 24 steps: at lr 1e-2 the loss spikes at step 4, and at step 12 it has halved or not by the batches' order
    recipe = _recipe(tmp_path, tiny_checkpoint, records, trainer={"max_steps": 24})
    final = train_sft(recipe)
    state = json.loads((Path(recipe.run_dir) / "checkpoint-24" / "trainer_state.json").read_text())
    losses = [row["loss"] for row in state["log_history"] if "loss" in row]
    assert len(losses) == 24 and losses[-1] < 0.5 * losses[0]
    model, tokenizer = load_model_and_tokenizer(final)
    assert tokenizer.convert_tokens_to_ids("</answer>") in model.generation_config.eos_token_id


def test_a_lora_warm_up_saves_the_merged_model_as_final(tiny_checkpoint, records, tmp_path):
    """GRPO, vLLM and evaluation load the warm-up's `final` as a model: a LoRA run's adapter is merged into it."""
    import torch
    from safetensors.torch import load_file

    from kgreasoner.training.common import LoraSettings

    recipe = _recipe(
        tmp_path,
        tiny_checkpoint,
        records,
        lora=LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"]),
        trainer={"max_steps": 4, "save_steps": 4},
    )
    final = train_sft(recipe)
    assert (final / "config.json").is_file() and not (final / "adapter_config.json").exists()
    assert (final.with_name("final-adapter") / "adapter_config.json").is_file()
    base, merged = load_file(tiny_checkpoint / "model.safetensors"), load_file(final / "model.safetensors")
    assert set(merged) == set(base)
    changed = sorted(k for k in base if not torch.equal(base[k], merged[k]))
    assert changed and all("q_proj" in k or "v_proj" in k for k in changed), changed
    model, tokenizer = load_model_and_tokenizer(final)
    assert tokenizer.convert_tokens_to_ids("</answer>") in model.generation_config.eos_token_id


def test_resume_continues_from_the_last_checkpoint(tiny_checkpoint, records, tmp_path):
    first = _recipe(tmp_path, tiny_checkpoint, records, trainer={"max_steps": 6})
    train_sft(first)
    resumed = _recipe(tmp_path, tiny_checkpoint, records, trainer={"max_steps": 12})
    train_sft(resumed, resume=True)
    state = json.loads((Path(resumed.run_dir) / "checkpoint-12" / "trainer_state.json").read_text())
    steps = [row["step"] for row in state["log_history"] if "loss" in row]
    assert steps == list(range(1, 13))


def test_recipe_validation_names_the_field(tmp_path):
    bad = tmp_path / "sft.yaml"
    bad.write_text("model: m\ntrain_file: t\nrun_dir: o\ntrainer: {learning_rate: -1}\n")
    with pytest.raises(ConfigError, match=f"{bad}: trainer.learning_rate must be positive"):
        load_config(SFTRecipe, bad)


@pytest.mark.slow
def test_torchrun_two_processes_on_cpu(tiny_checkpoint, records, tmp_path):
    recipe = _recipe(tmp_path, tiny_checkpoint, records, trainer={"max_steps": 3, "save_steps": 3})
    config = tmp_path / "sft.yaml"
    config.write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in recipe.__dict__.items() if k != "lora") + "\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(REPO / "train" / "sft.py"),
            "--config",
            str(config),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    state = json.loads((Path(recipe.run_dir) / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["global_step"] == 3
    assert (Path(recipe.run_dir) / "final" / "model.safetensors").exists()


@pytest.mark.slow
def test_a_short_warm_up_writes_the_format_on_held_out_questions(warm_policy):
    """Measured 1.00 format-valid (40 test questions, greedy) for this recipe; asserted with margin.

    At 150 steps the same recipe gave 0.875 or 0.025 depending on one sentence of the tool's text: too close to
    the edge of learning the format to test anything."""
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.models import load_model_and_tokenizer
    from kgreasoner.protocol import check_format
    from kgreasoner.retrieval.tool import KGSearchTool
    from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams
    from kgreasoner.rollout.hf_backend import HFBackend

    model_dir, data, tool_config = warm_policy
    dataset = load_dataset(str(data))
    test = dataset.split("test")
    model, tokenizer = load_model_and_tokenizer(str(model_dir))
    engine = RolloutEngine(
        HFBackend(model, tokenizer),
        KGSearchTool(open_dataset_kg(dataset), tool_config),
        RolloutConfig(max_new_tokens=256, max_turns=6),
    )
    trajectories = engine.run(test, sampling=SamplingParams(temperature=0.0))
    valid = sum(check_format(t.text).valid for t in trajectories) / len(trajectories)
    assert len(test) >= 30
    assert valid >= 0.8, f"format-valid {valid:.2f} on {len(test)} test questions"
    assert all(t.num_searches >= 1 for t in trajectories if check_format(t.text).valid)


class _KilledAfterSave(Exception):
    pass


def test_a_run_killed_mid_epoch_resumes_with_the_uninterrupted_run_s_losses(tiny_checkpoint, records, tmp_path):
    """Killed right after the step-6 checkpoint (half way through the second epoch of 4 steps) and resumed, the
    run logs the same loss at every later step as a run that was never stopped: same batches, same dropout."""
    from transformers import TrainerCallback

    class KillAfterSave(TrainerCallback):
        def on_save(self, args, state, control, **kwargs):
            if state.global_step == 6:
                raise _KilledAfterSave

    def losses(recipe) -> dict[int, float]:
        state = json.loads((Path(recipe.run_dir) / "checkpoint-12" / "trainer_state.json").read_text())
        return {row["step"]: row["loss"] for row in state["log_history"] if "loss" in row}

    trainer = {"save_steps": 3, "train_sampling_strategy": "group_by_length"}
    (tmp_path / "whole").mkdir()
    (tmp_path / "killed").mkdir()
    whole = _recipe(tmp_path / "whole", tiny_checkpoint, records, trainer=trainer)
    train_sft(whole)
    killed = _recipe(tmp_path / "killed", tiny_checkpoint, records, trainer=trainer)
    with pytest.raises(_KilledAfterSave):
        train_sft(killed, callbacks=[KillAfterSave()])
    assert last_complete_checkpoint(killed.run_dir).endswith("checkpoint-6")
    train_sft(killed, resume=True)
    expected, resumed = losses(whole), losses(killed)
    assert sorted(resumed) == list(range(1, 13))
    assert {s: resumed[s] for s in range(7, 13)} == {s: expected[s] for s in range(7, 13)}
