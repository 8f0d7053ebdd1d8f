import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kgreasoner.config import ConfigError, load_config
from kgreasoner.training.grpo import GRPORecipe
from kgreasoner.training.plots import plot_runs

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def grpo_world(tmp_path_factory):
    """A small synthetic dataset and a tiny untrained model whose tokenizer knows its words."""
    from data_gen.synthetic import write_synthetic
    from kgreasoner.models import TinyModelConfig, build_tiny
    from kgreasoner.tokenizer import TokenizerConfig, read_training_texts

    root = tmp_path_factory.mktemp("grpo")
    data = write_synthetic(root / "data", seed=0, num_entities=300, num_questions=120)
    config = TinyModelConfig(
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        intermediate_size=128,
        tokenizer=TokenizerConfig(num_handles=16),
    )
    build_tiny(config, read_training_texts([data / "questions.jsonl", data / "kb.tsv"]), root / "tiny")
    return root


def _write_recipe(world: Path, out: Path, **overrides) -> Path:
    recipe = {
        "model": str(world / "tiny"),
        "dataset": str(world / "data"),
        "run_dir": str(out),
        "tool": {"entity_handles": True, "top_k": 5},
        "rollout": {"max_new_tokens": 32, "max_turn_tokens": 16, "max_turns": 2},
        "episodes": [{"data": "all", "max_steps": 4}],
        "max_questions": 16,
        "trainer": {
            "num_generations": 2,
            "per_device_train_batch_size": 4,
            "learning_rate": 1e-3,
            "report_to": [],
            "save_steps": 1,
            "save_total_limit": 10,
        },
    }
    recipe.update(overrides, trainer={**recipe["trainer"], **overrides.get("trainer", {})})
    path = out.parent / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def _run(config: Path, *extra: str, nproc: int = 1, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc)]
    command = (launcher if nproc > 1 else [sys.executable]) + [
        str(REPO / "train" / "grpo.py"),
        "--config",
        str(config),
        *extra,
    ]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


def _steps(out: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (out / "steps.jsonl").read_text().splitlines()]


def test_recipe_rejects_a_hard_first_episode(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("model: m\ndataset: d\nrun_dir: o\nepisodes: [{data: hard}]\n")
    with pytest.raises(ConfigError, match="episode 1 must train on all questions"):
        load_config(GRPORecipe, path)


def test_recipe_rejects_vllm_server_mode_for_the_multi_turn_rollout():
    with pytest.raises(
        ConfigError,
        match="trainer: vllm_mode: 'server' is not supported: the multi-turn rollout "
        "drives TRL's colocated engine; remove vllm_mode",
    ):
        load_config(
            GRPORecipe,
            None,
            ["model=m", "dataset=d", "run_dir=o", "rollout_backend=vllm", "trainer.vllm_mode=server"],
        )


@pytest.mark.slow
def test_sigkill_then_resume_loses_and_repeats_no_step(grpo_world, tmp_path):
    out = tmp_path / "run"
    # Long enough that the kill after checkpoint-2 lands before the episode ends, however fast a step is.
    config = _write_recipe(grpo_world, out, episodes=[{"data": "all", "max_steps": 12}])
    process = _run(config, start_new_session=True)
    deadline = time.time() + 600
    while not (out / "episode-1" / "checkpoint-2" / "trainer_state.json").exists():
        assert process.poll() is None, process.stdout.read()[-3000:]
        assert time.time() < deadline, "no second checkpoint in 10 minutes"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()
    assert not (out / "episode-1" / "final").exists()
    resumed = _run(config, "--resume")
    log = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, log[-3000:]
    assert _steps(out) == list(range(1, 13))
    groups = [json.loads(x)["step"] for x in (out / "episode-1" / "groups.jsonl").read_text().splitlines()]
    assert groups == [step for step in range(1, 13) for _ in range(2)]  # two groups a step, once each
    state = json.loads((out / "episode-1" / "checkpoint-12" / "trainer_state.json").read_text())
    assert state["global_step"] == 12
    assert [row["step"] for row in state["log_history"] if "loss" in row] == list(range(1, 13))
    assert (out / "episode-1" / "final" / "model.safetensors").exists()
    png = plot_runs([out], tmp_path / "curves.png")
    assert png.stat().st_size > 10_000


@pytest.mark.slow
def test_torchrun_two_processes_run_two_steps(grpo_world, tmp_path):
    out = tmp_path / "ddp"
    config = _write_recipe(
        grpo_world, out, episodes=[{"data": "all", "max_steps": 2}], trainer={"per_device_train_batch_size": 2}
    )
    process = _run(config, nproc=2)
    log = process.communicate(timeout=900)[0]
    assert process.returncode == 0, log[-3000:]
    assert _steps(out) == [1, 2]
    row = json.loads((out / "steps.jsonl").read_text().splitlines()[-1])
    for key in (
        "rewards/search_reward/mean",
        "rewards/format_reward/mean",
        "rewards/answer_reward/mean",
        "rollout/searches",
        "rollout/backtracks",
        "rollout/format_valid",
        "rollout/tool_token_share",
        "completions/mean_length",
        "time/generation_s",
        "time/tool_s",
        "time/training_s",
    ):
        assert key in row, key


@pytest.mark.slow
def test_a_group_split_over_two_ranks_gets_one_gold_row(grpo_world, tmp_path):
    """Four rollouts a question on two ranks of two rows: each group is rows 0-1 of rank 0 and rows 0-1 of
    rank 1. The untrained model answers nothing, so every group is guided, and only its last row (rank 1's
    second) becomes the gold one: one gold row a step, which answers right, and the policy's three rows none
    (the guided marks are gathered from both ranks as the rewards are). A rank that planned alone would guide
    its own last row too (two gold rows), or none."""
    from data_gen.warmup import WarmupConfig, run
    from kgreasoner.retrieval.tool import ToolConfig

    trajectories = tmp_path / "all.jsonl"
    run(
        WarmupConfig(
            dataset=str(grpo_world / "data"),
            output=str(trajectories),
            num_examples=None,
            dev_examples=0,
            tool=ToolConfig(entity_handles=True, top_k=5),
            progress=False,
        )
    )
    out = tmp_path / "guided"
    config = _write_recipe(
        grpo_world,
        out,
        episodes=[{"data": "all", "max_steps": 2}],
        trainer={"num_generations": 4, "per_device_train_batch_size": 2},
        guidance={"mode": "gold", "trajectories": str(trajectories)},
    )
    process = _run(config, nproc=2)
    log = process.communicate(timeout=900)[0]
    assert process.returncode == 0, log[-3000:]
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["guidance/gold_rows"] == 1 and row["guidance/gold_answer_reward"] == 1.0
        assert row["rewards/answer_reward/mean"] == 0.0
        assert row["rollout/guided"] == 1.0 and row["rollout/answer_tied"] == 1.0
        assert any(key.startswith("rollout/guided_hop") for key in row)


@pytest.mark.slow
def test_gold_prefix_guided_rows_with_a_group_split_over_two_ranks(grpo_world, tmp_path):
    """`guidance.mode: gold_prefix` on two ranks of two rows, one group of four a step: the planned row is rank 1's
    second, so only rank 1 has a row to roll out after its gold prefix, and rank 0 joins that second
    generation with none (what ZeRO-3's gathered weights need; here, on CPU, the test shows such an empty call
    runs). Every multi-hop group is guided (the untrained model answers nothing), no 1-hop group is."""
    from data_gen.warmup import WarmupConfig, run
    from kgreasoner.retrieval.tool import ToolConfig

    trajectories = tmp_path / "all.jsonl"
    run(
        WarmupConfig(
            dataset=str(grpo_world / "data"),
            output=str(trajectories),
            num_examples=None,
            dev_examples=0,
            tool=ToolConfig(entity_handles=True, top_k=5),
            progress=False,
        )
    )
    out = tmp_path / "prefixed"
    config = _write_recipe(
        grpo_world,
        out,
        episodes=[{"data": "all", "max_steps": 3}],
        trainer={"num_generations": 4, "per_device_train_batch_size": 2},
        guidance={"mode": "gold_prefix", "trajectories": str(trajectories)},
        rollout={"max_new_tokens": 160, "max_turn_tokens": 8, "max_turns": 4},
    )
    process = _run(config, nproc=2)
    log = process.communicate(timeout=900)[0]
    assert process.returncode == 0, log[-3000:]
    rows = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    hops = [int(key[len("rollout/guided_hop") :]) for r in rows for key in r if key.startswith("rollout/guided_hop")]
    assert len(hops) == 3 and any(h > 1 for h in hops)  # each step: one group; multi-hop ones among them
    for row, h in zip(rows, hops):
        assert row["rollout/guided"] == row[f"rollout/guided_hop{h}"] == (1.0 if h > 1 else 0.0)
        assert ("rollout/prefix_correct" in row) == (h > 1)


def test_step_log_keeps_each_step_once_across_a_restart_and_a_resume(tmp_path):
    from kgreasoner.training.grpo_callbacks import StepLog

    log = StepLog(tmp_path / "steps.jsonl", episode=1)
    log.append(0, {"dev/hits1": 0.2})
    log.append(1, {"loss": 0.1})
    log.truncate_after(0)  # killed before the first checkpoint: a fresh start writes step 0 again
    assert (tmp_path / "steps.jsonl").read_text() == ""
    for step, row in (
        (0, {"dev/hits1": 0.2}),
        (1, {"loss": 0.1}),
        (2, {"loss": 0.2}),
        (2, {"dev/hits1": 0.3}),
        (3, {"loss": 0.3}),
    ):
        log.append(step, row)
    log.truncate_after(2)  # resumed from checkpoint-2
    rows = [json.loads(x) for x in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert [(r["step"], sorted(k for k in r if k not in ("episode", "step"))) for r in rows] == [
        (0, ["dev/hits1"]),
        (1, ["loss"]),
        (2, ["loss"]),
        (2, ["dev/hits1"]),
    ]
    StepLog(tmp_path / "steps.jsonl", episode=2).truncate_after(0)  # a later episode's fresh start keeps episode 1
    assert len((tmp_path / "steps.jsonl").read_text().splitlines()) == 4


def test_dev_evaluation_on_data_without_dev_questions_is_refused_naming_the_settings(tmp_path):
    """Without the refusal the run would draw no dev curve and keep its last weights, saying nothing."""
    from data_gen.synthetic import write_synthetic
    from kgreasoner.training.grpo import _questions
    from kgreasoner.training.grpo_recipe import DevEvaluation

    data = write_synthetic(tmp_path / "data", seed=0, num_entities=300, num_questions=60)
    rows = [json.loads(line) for line in (data / "questions.jsonl").read_text().splitlines()]
    no_dev = [{**row, "split": "train" if row["split"] == "dev" else row["split"]} for row in rows]
    (data / "questions.jsonl").write_text("".join(json.dumps(row) + "\n" for row in no_dev))
    recipe = GRPORecipe(model="m", dataset=str(data), run_dir=str(tmp_path / "o"), dev_eval=DevEvaluation(steps=5))
    with pytest.raises(ValueError) as refused:
        _questions(recipe)
    assert str(refused.value) == (
        f"dataset {str(data)!r} has no dev questions, which dev_eval measures on: give it a dev split, "
        "or set dev_eval.steps: 0 and dev_eval.choose_final: last"
    )
    train, _, dev, split = _questions(GRPORecipe(model="m", dataset=str(data), run_dir=str(tmp_path / "o")))
    assert len(train) == len([r for r in no_dev if r["split"] == "train"]) and dev == split == []
