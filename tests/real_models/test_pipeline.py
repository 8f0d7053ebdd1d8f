"""SFT -> GRPO -> eval -> serve -> export on real architectures with their real vocabularies.

`warm_checkpoint` (conftest) is the random-weight model SFT-trained on the two warm-up trajectories;
its greedy rollout retraces them token for token, which pins every id and mask below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from kgreasoner.protocol import check_format
from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams

from .conftest import END_OF_TURN, QUESTIONS, QWEN3_THINK, TOOL, tokenizer_of, warmup_records

# Random-weight models of the real architectures through whole stages: `make test` runs them,
# `make test-fast` does not.
pytestmark = pytest.mark.slow

ROLLOUT = {"max_new_tokens": 64, "max_turn_tokens": 48, "max_turns": 2}


def _tool(world):
    from kgreasoner.kg.open import open_kg
    from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig

    return KGSearchTool(open_kg(f"memory:{world}"), ToolConfig(**TOOL))


def _ids(tokenizer, text):
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_greedy_rollout_retraces_the_warmup_with_its_masks(arch, warm_checkpoint, world):
    from kgreasoner.data import load_dataset
    from kgreasoner.models import load_model_and_tokenizer
    from kgreasoner.rollout.hf_backend import HFBackend

    model, tokenizer = load_model_and_tokenizer(warm_checkpoint, padding_side="left")
    examples = load_dataset(str(world)).split("test")
    engine = RolloutEngine(HFBackend(model, tokenizer), _tool(world), RolloutConfig(**ROLLOUT))
    trajectories = engine.run(examples, sampling=SamplingParams(temperature=0.0))
    for trajectory, record in zip(trajectories, warmup_records(world)):
        pieces = [_ids(tokenizer, s.text) for s in record.segments]
        assert trajectory.completion_ids == pieces[0] + pieces[1] + pieces[2]  # stopped right after </answer>
        assert trajectory.env_mask == [1] * len(pieces[0]) + [0] * len(pieces[1]) + [1] * len(pieces[2])
        assert trajectory.text == record.completion and trajectory.finish_reason == "answer"
        assert check_format(trajectory.text, trajectory.tool_spans).valid
        assert trajectory.completion_ids[0] == (QWEN3_THINK if arch == "qwen3" else _ids(tokenizer, "<think>")[0])
    assert [t.resolved_answers for t in trajectories] == [[q[3]] for q in QUESTIONS]
    # the model learned to end its turn: after </answer> it writes the template's end-of-turn token
    record = warmup_records(world)[0]
    from kgreasoner.training.warmup_data import encode_record

    ids = encode_record(record, tokenizer)["input_ids"][:-1]
    import torch

    with torch.no_grad():
        next_id = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
    assert next_id == END_OF_TURN[arch][1]


def _grpo_recipe(warm_checkpoint, world, out, **fields):
    from kgreasoner.training.grpo import GRPORecipe

    base = dict(
        model=str(warm_checkpoint),
        dataset=str(world),
        run_dir=str(out),
        tool=TOOL,
        rollout=ROLLOUT,
        episodes=[{"data": "all", "max_steps": 2}],
        trainer=dict(
            num_generations=2,
            per_device_train_batch_size=2,
            learning_rate=1e-3,
            beta=0.0,
            report_to=[],
            save_steps=2,
            temperature=1.0,
            seed=3,
        ),
    )
    base.update(fields)
    from kgreasoner.config import load_config

    path = out.parent / f"{out.name}.json"
    path.write_text(json.dumps(base))
    return load_config(GRPORecipe, path)


def test_grpo_steps_pass_the_env_mask_to_the_loss(arch, warm_checkpoint, world, tmp_path):
    from kgreasoner.data import load_dataset
    from kgreasoner.training.grpo import Episode, build_trainer

    recipe = _grpo_recipe(warm_checkpoint, world, tmp_path / "grpo")
    examples = load_dataset(str(world)).split("train")
    trainer = build_trainer(recipe, 1, Episode("all", max_steps=2), examples, str(warm_checkpoint), _tool(world))
    rolled, scored = [], []
    rollout, compute_loss = trainer.rollout_func, trainer._compute_loss

    def recording_rollout(prompts, trainer_):
        out = rollout(prompts, trainer_)
        rolled.extend(zip(out["completion_ids"], out["env_mask"]))
        return out

    def recording_loss(model, inputs):
        for ids, completion, tool in zip(
            inputs["completion_ids"].tolist(), inputs["completion_mask"].tolist(), inputs["tool_mask"].tolist()
        ):
            n = sum(completion)
            scored.append((ids[:n], tool[:n]))
        return compute_loss(model, inputs)

    trainer.rollout_func, trainer._compute_loss = recording_rollout, recording_loss
    trainer.train()
    assert trainer.state.global_step == 2 and len(rolled) == 4
    with_tool = [mask for _, mask in rolled if 0 in mask]
    assert with_tool, "the warm model searched in none of its rollouts"
    # what the loss masks is exactly what the rollout said the tool wrote
    assert sorted(map(str, scored)) == sorted(str((list(ids), list(mask))) for ids, mask in rolled)
    logged = trainer.state.log_history[0]
    assert {"rewards/format_reward/mean", "rewards/answer_reward/mean", "rewards/search_reward/mean"} <= set(logged)


def test_a_finished_lora_episode_is_not_trained_again_on_resume(arch, warm_checkpoint, world, tmp_path, monkeypatch):
    if arch != "qwen3":
        pytest.skip("one architecture is enough for the resume logic")
    import kgreasoner.training.grpo as grpo

    recipe = _grpo_recipe(
        warm_checkpoint,
        world,
        tmp_path / "lora",
        episodes=[{"data": "all", "max_steps": 1}],
        lora={"enabled": True, "r": 4, "alpha": 8},
    )
    final = grpo.train_grpo(recipe)
    # the adapter merged into a full model (what the next episode and vLLM load), the adapter beside it
    assert (final / "config.json").is_file() and not (final / "adapter_config.json").exists()
    assert (final.with_name("final-adapter") / "adapter_config.json").is_file()

    def no_training(*args, **kwargs):
        raise AssertionError("a finished episode was trained again")

    monkeypatch.setattr(grpo, "build_trainer", no_training)
    assert grpo.train_grpo(recipe, resume=True) == final


def test_eval_command_with_an_hf_model(arch, warm_checkpoint, world, tmp_path, capsys):
    from kgreasoner.cli import main

    out = tmp_path / "eval"
    code = main(
        [
            "eval",
            "--methods",
            "kgreasoner",
            "--dataset",
            str(world),
            "--split",
            "test",
            "--llm",
            f"hf:{warm_checkpoint}",
            "--out",
            str(out),
            "--no-progress",
            "--set",
            "tool.entity_handles=false",
            "--set",
            "rollout.max_new_tokens=64",
            "--set",
            "rollout.max_turn_tokens=48",
        ]
    )
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (out / "kgreasoner.jsonl").read_text().splitlines()]
    assert [(r["answers"], r["hits1"], r["format_valid"]) for r in rows] == [([q[3]], 1.0, True) for q in QUESTIONS]


def test_hf_client_loads_float32_on_cpu(warm_checkpoint):
    import torch

    from kgreasoner.llm import HFClient
    from kgreasoner.models import inference_dtype

    client = HFClient.load(warm_checkpoint)
    assert next(client.model.parameters()).dtype == torch.float32
    assert (inference_dtype("cpu"), inference_dtype("cuda"), inference_dtype("cuda:1")) == (
        "float32",
        "bfloat16",
        "bfloat16",
    )


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs a GPU")
def test_hf_client_loads_bfloat16_on_a_gpu(warm_checkpoint):
    import torch

    from kgreasoner.llm import HFClient

    client = HFClient.load(warm_checkpoint)
    assert next(client.model.parameters()).dtype == torch.bfloat16
    assert client.complete("hello", max_tokens=4).completion_tokens >= 1


def test_serve_answers_over_http_in_process(arch, warm_checkpoint, world):
    from fastapi.testclient import TestClient

    from kgreasoner.retrieval.tool import ToolConfig
    from kgreasoner.serving.app import create_app
    from kgreasoner.serving.config import ServeConfig
    from kgreasoner.serving.service import AnswerService

    config = ServeConfig(
        llm=f"hf:{warm_checkpoint}", kg=f"memory:{world}", tool=ToolConfig(**TOOL), rollout=RolloutConfig(**ROLLOUT)
    )
    service = AnswerService.open(config)
    try:
        with TestClient(create_app(service)) as client:
            reply = client.post("/v1/answer", json={"question": QUESTIONS[1][1], "topic_entities": [QUESTIONS[1][2]]})
            assert reply.status_code == 200, reply.text
            body = reply.json()
    finally:
        service.close()
    assert body["answers"] == ["Paris"] and body["finish_reason"] == "answer"
    assert body["trajectory"] == warmup_records(world)[1].completion
    assert body["usage"]["tool_calls"] == 1


def test_export_keeps_the_logits_and_stops_at_the_end_of_turn(arch, warm_checkpoint, tmp_path):
    from kgreasoner.serving.export import export_checkpoint

    manifest = export_checkpoint(warm_checkpoint, tmp_path / "export")
    assert END_OF_TURN[arch][1] in manifest["eos_token_id"]
    assert manifest["probe_max_logit_difference"] == 0.0 and not manifest["merged_adapter"]


def test_export_merges_an_adapter_whose_base_is_a_hub_name(arch, random_checkpoint, tmp_path):
    """An adapter trained from `Qwen/Qwen3-0.6B` names that hub id; export finds it in the local hub cache."""
    if arch != "qwen3":
        pytest.skip("one architecture is enough for the hub-name lookup")
    import shutil

    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    cache = tmp_path / "hub"
    snapshot = cache / "models--Qwen--Qwen3-0.6B" / "snapshots" / ("0" * 40)
    shutil.copytree(random_checkpoint, snapshot)
    (cache / "models--Qwen--Qwen3-0.6B" / "refs").mkdir()
    (cache / "models--Qwen--Qwen3-0.6B" / "refs" / "main").write_text("0" * 40)
    base = AutoModelForCausalLM.from_pretrained(random_checkpoint, dtype=torch.float32)
    adapted = get_peft_model(
        base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    )
    adapted.peft_config["default"].base_model_name_or_path = "Qwen/Qwen3-0.6B"
    adapted.save_pretrained(tmp_path / "adapter")
    assert (
        json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["base_model_name_or_path"]
        == "Qwen/Qwen3-0.6B"
    )
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kgreasoner.cli",
            "export",
            str(tmp_path / "adapter"),
            "--out",
            str(tmp_path / "merged"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    manifest = json.loads((tmp_path / "merged" / "export.json").read_text())
    assert manifest["merged_adapter"] and manifest["base"] == "Qwen/Qwen3-0.6B"
    assert manifest["probe_max_logit_difference"] < 1e-4
    assert 151645 in manifest["eos_token_id"]
    assert (
        tokenizer_of("qwen3").get_vocab()
        == __import__("transformers").AutoTokenizer.from_pretrained(tmp_path / "merged").get_vocab()
    )
