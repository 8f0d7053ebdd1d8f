"""What a GPU run of GRPO relies on, checked on CPU with real TRL trainers and tiny models: lengths from the
recipe's budget, settings that cannot work refused, a failed generation ending its row and not the run,
LoRA across episodes, hard cases mined from episode 1's groups with no model alive, and each episode's trainer
released before the next."""

from __future__ import annotations

import gc
import json
import weakref
from pathlib import Path
from unittest import mock

import pytest

from kgreasoner.config import ConfigError, load_config
from kgreasoner.rollout.types import RolloutConfig, Trajectory, completion_tokens, sequence_tokens, trl_rollout_output
from kgreasoner.training.common import LoraSettings
from kgreasoner.training.grpo import Episode, GRPORecipe
from kgreasoner.training.grpo_recipe import DevEvaluation

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
EOS = 7


def _trajectory(ids, mask, reason) -> Trajectory:
    return Trajectory(
        index=0,
        prompt_ids=[1, 2],
        completion_ids=list(ids),
        env_mask=list(mask),
        logprobs=[-0.5 if m else 0.0 for m in mask],
        text="",
        tool_calls=[],
        finish_reason=reason,
    )


def test_vllm_context_and_completion_length_come_from_the_recipe_budget(tmp_path):
    from kgreasoner.training.grpo import grpo_config

    recipe = load_config(
        GRPORecipe, CONFIGS / "llama3.1-8b" / "grpo.yaml", [f"run_dir={tmp_path}", "trainer.deepspeed=null"]
    )
    args = grpo_config(recipe, tmp_path / "episode-1", recipe.episodes[0])
    # 512 prompt + 4096 model tokens + 8 tool blocks of 384 + the end-of-sequence id the rollout may append
    assert args.vllm_max_model_length == 512 + 4096 + 8 * 384 + 1 == sequence_tokens(recipe.rollout, 512)
    assert args.max_completion_length == 4096 + 8 * 384 + 1 == completion_tokens(recipe.rollout)
    shorter = load_config(
        GRPORecipe,
        CONFIGS / "llama3.1-8b" / "grpo.yaml",
        [f"run_dir={tmp_path}", "trainer.deepspeed=null", "max_prompt_tokens=256"],
    )
    assert grpo_config(shorter, tmp_path / "e", shorter.episodes[0]).vllm_max_model_length == 256 + 4096 + 3072 + 1


def test_the_recipe_sets_the_lengths_itself():
    with pytest.raises(ValueError, match="trainer: max_completion_length is set by kgreasoner from the rollout's"):
        GRPORecipe(model="m", dataset="d", run_dir="o", trainer={"max_completion_length": 64})


def test_sleep_mode_is_refused_with_what_to_do():
    message = (
        "trainer: vllm_enable_sleep_mode: True is not supported: the multi-turn rollout calls the "
        "engine's generate itself.*lower vllm_gpu_memory_utilization"
    )
    with pytest.raises(ConfigError, match=message):
        load_config(
            GRPORecipe,
            None,
            ["model=m", "dataset=d", "run_dir=o", "rollout_backend=vllm", "trainer.vllm_enable_sleep_mode=true"],
        )
    load_config(GRPORecipe, None, ["model=m", "dataset=d", "run_dir=o", "trainer.vllm_enable_sleep_mode=false"])


@pytest.mark.parametrize("name", ["vllm_mode", "vllm_server_base_url"])
def test_server_mode_fields_are_gone(name):
    with pytest.raises(ConfigError, match=name):
        load_config(GRPORecipe, None, ["model=m", "dataset=d", "run_dir=o", f"{name}=colocate"])


def test_rows_that_ended_hand_trl_an_end_of_sequence_id_and_no_row_is_empty():
    rows = [
        _trajectory([10, 11, 12], [1, 0, 1], "answer"),  # </answer>: ended, no EOS written
        _trajectory([10, EOS], [1, 1], "eos"),  # the model wrote EOS itself
        _trajectory([10, 11], [1, 1], "max_tokens"),  # cut by a limit: clipped, left as it is
        _trajectory([10, 11], [1, 0], "max_turns"),
        _trajectory([], [], "error"),  # generate failed before the first token
        _trajectory([10], [1], "error"),
    ]
    out = trl_rollout_output(rows, EOS)
    assert out["completion_ids"] == [[10, 11, 12, EOS], [10, EOS], [10, 11], [10, 11], [EOS], [10, EOS]]
    assert out["env_mask"] == [[1, 0, 1, 0], [1, 1], [1, 1], [1, 0], [0], [1, 0]]
    assert out["logprobs"] == [[-0.5, 0.0, -0.5, 0.0], [-0.5, -0.5], [-0.5, -0.5], [-0.5, 0.0], [0.0], [-0.5, 0.0]]
    assert [len(i) == len(m) == len(p) for i, m, p in zip(out["completion_ids"], out["env_mask"], out["logprobs"])]
    assert rows[0].completion_ids == [10, 11, 12]  # the trajectories themselves are left alone
    # what TRL 1.16 counts as clipped: the last id is neither an EOS nor the pad id
    assert [ids[-1] != EOS for ids in out["completion_ids"]] == [False, False, True, True, False, False]


# ----------------------------------------------------------------- real trainers on the tiny model


def _recipe(tiny_checkpoint, synthetic_dir, out: Path, **overrides) -> GRPORecipe:
    from kgreasoner.retrieval.tool import ToolConfig

    fields = dict(
        model=str(tiny_checkpoint),
        dataset=str(synthetic_dir),
        run_dir=str(out),
        tool=ToolConfig(entity_handles=True, top_k=5),
        rollout=RolloutConfig(max_new_tokens=24, max_turn_tokens=12, max_turns=2),
        episodes=[Episode("all", max_steps=1)],
        max_questions=8,
        trainer={
            "num_generations": 2,
            "per_device_train_batch_size": 4,
            "learning_rate": 1e-3,
            "report_to": [],
            "save_steps": 10,
            "beta": 0.0,
        },
    )
    fields.update(overrides, trainer={**fields["trainer"], **overrides.get("trainer", {})})
    return GRPORecipe(**fields)


def _tool(recipe):
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.retrieval.tool import KGSearchTool

    dataset = load_dataset(recipe.dataset, split_scheme=recipe.split_scheme, seed=recipe.split_seed)
    return dataset, KGSearchTool(open_dataset_kg(dataset), recipe.tool)


@pytest.mark.slow
def test_a_failed_generate_ends_its_rows_and_the_step_trains_on(tiny_checkpoint, synthetic_dir, tmp_path):
    """vLLM cannot run here: the stand-in is the state `VLLMBackend` leaves rows in when `llm.generate`
    raises (every row of the turn finished with reason `error` before its first token), applied to half
    the rows; the other half is rolled out for real by the hf backend."""
    from kgreasoner.rollout.hf_backend import HFBackend
    from kgreasoner.training.grpo import build_trainer

    recipe = _recipe(tiny_checkpoint, synthetic_dir, tmp_path / "run")
    dataset, tool = _tool(recipe)
    trainer = build_trainer(recipe, 1, recipe.episodes[0], dataset.split("train")[:8], str(tiny_checkpoint), tool)
    real_generate = HFBackend.generate

    def half_failing(self, engine, rows, sampling):
        for row in rows[::2]:
            row.finish("error", "vLLM generate failed: CUDA error: an illegal memory access")
        real_generate(self, engine, rows[1::2], sampling)

    returned = []
    rollout = trainer.rollout_func

    def recording(prompts, trainer):
        returned.append(rollout(prompts, trainer))
        return returned[-1]

    trainer.rollout_func = recording
    with mock.patch.object(HFBackend, "generate", half_failing):
        trainer.train()
    assert trainer.state.global_step == 1
    [out] = returned
    failed = [i for i, reason in enumerate(out["finish_reason"]) if reason == "error"]
    assert failed == [0, 2]
    for i in failed:
        assert out["completion_ids"][i] == [trainer.processing_class.eos_token_id] and out["env_mask"][i] == [0]
    logged = trainer.state.log_history[0]
    clipped = sum(r in ("max_tokens", "max_turns") for r in out["finish_reason"]) / len(out["finish_reason"])
    assert logged["completions/clipped_ratio"] == pytest.approx(clipped)
    assert logged["rewards/answer_reward/mean"] >= 0.0 and logged["loss"] == logged["loss"]  # not NaN


@pytest.mark.slow
def test_the_rollout_returns_the_converters_dict_itself(tiny_checkpoint, synthetic_dir, tmp_path):
    import kgreasoner.rollout.types as types
    from kgreasoner.training.grpo import build_trainer

    recipe = _recipe(tiny_checkpoint, synthetic_dir, tmp_path / "run")
    dataset, tool = _tool(recipe)
    trainer = build_trainer(recipe, 1, recipe.episodes[0], dataset.split("train")[:4], str(tiny_checkpoint), tool)
    built, original = [], types.trl_rollout_output

    def converter(trajectories, end_token_id):
        built.append(original(trajectories, end_token_id))
        return built[-1]

    prompts = [trainer.train_dataset["prompt"][0]] * recipe.setting(
        "num_generations"
    )  # one group, as TRL's sampler gives it
    with mock.patch.object(types, "trl_rollout_output", converter):
        out = trainer.rollout_func(prompts, trainer)
    assert len(built) == 1 and out is built[0]


def _weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


@pytest.mark.slow
def test_lora_episode_two_starts_from_episode_ones_merged_weights(tiny_checkpoint, synthetic_dir, tmp_path):
    import torch

    import kgreasoner.training.grpo as grpo

    out = tmp_path / "lora"
    recipe = _recipe(
        tiny_checkpoint,
        synthetic_dir,
        out,
        episodes=[Episode("all", max_steps=1), Episode("hard", max_steps=1)],
        lora=LoraSettings(enabled=True, r=4, alpha=8, dropout=0.0, target_modules=["q_proj", "v_proj"]),
    )
    started = []
    build = grpo.build_trainer

    def recording(recipe, number, episode, examples, model_path, *args):
        trainer = build(recipe, number, episode, examples, model_path, *args)
        merged = {
            name.removeprefix("base_model.model.").replace(".base_layer", ""): p.detach().clone()
            for name, p in trainer.model.named_parameters()
            if "lora_" not in name
        }
        started.append((model_path, merged))
        return trainer

    # The untrained model earns no reward, so no advantage and no update: adapters that start random
    # (PEFT's B is zero by default) make episode 1's merged weights differ from the base all the same.
    peft_config = LoraSettings.peft_config

    def random_adapters(settings):
        config = peft_config(settings)
        config.init_lora_weights = False
        return config

    with (
        mock.patch.object(grpo, "build_trainer", recording),
        mock.patch.object(LoraSettings, "peft_config", random_adapters),
    ):
        final = grpo.train_grpo(recipe)
    assert final == out / "episode-2" / "final"
    assert [path for path, _ in started] == [str(tiny_checkpoint), str(out / "episode-1" / "final")]
    first = _weights(out / "episode-1" / "final")
    base = _weights(tiny_checkpoint)
    assert (out / "episode-1" / "final-adapter" / "adapter_config.json").is_file()
    changed = [k for k in base if not torch.equal(base[k], first[k])]
    assert changed and all(("q_proj" in k or "v_proj" in k) for k in changed), changed
    for name, value in started[1][1].items():  # episode 2's policy before its first step: episode 1's merge
        assert torch.equal(value, first[name]), name
    assert (final / "config.json").is_file() and (final / "model.safetensors").is_file()


@pytest.mark.slow
def test_hard_cases_are_mined_with_no_trainer_alive_and_each_trainer_is_released(
    tiny_checkpoint, synthetic_dir, tmp_path
):
    import kgreasoner.training.grpo as grpo

    out = tmp_path / "two"
    recipe = _recipe(
        tiny_checkpoint,
        synthetic_dir,
        out,
        episodes=[Episode("all", max_steps=1), Episode("hard", max_steps=1)],
        max_questions=None,
    )
    events, models = [], []
    build, mine = grpo.build_trainer, grpo.hard_examples

    def recording_build(recipe, number, *args):
        # what is alive when an episode's trainer is built: nothing of an earlier episode's trainer
        gc.collect()
        events.append((f"build {number}", [ref() is None for ref in models]))
        trainer = build(recipe, number, *args)
        models.append(weakref.ref(trainer.model))
        return trainer

    def recording_mine(*args):
        gc.collect()
        events.append(("mine", [ref() is None for ref in models]))
        return mine(*args)

    with (
        mock.patch.object(grpo, "build_trainer", recording_build),
        mock.patch.object(grpo, "hard_examples", recording_mine),
    ):
        grpo.train_grpo(recipe)
    assert events == [("build 1", []), ("mine", [True]), ("build 2", [True])]
    gc.collect()
    assert all(ref() is None for ref in models)
    hard = out / "episode-2" / "hard_cases.jsonl"
    assert hard.is_file() and (out / "episode-2" / "final" / "config.json").is_file()


# ----------------------------------------------------------------- the dev evaluation on two ranks


def _dev_eval_rank(rank: int, port: int, recipe: GRPORecipe, queue) -> None:
    """One of two gloo ranks: a real trainer, then the dev evaluation before step 1.

    ZeRO-3 cannot run here (no GPU): a stand-in gives the model its contract. Outside TRL's generation
    context every decoder layer's forward is a collective (ZeRO-3 fetches the layer's shards from every
    rank); entering and leaving the context are collectives too (the whole model gathered, then freed),
    and inside it a forward needs no other rank. A rank that evaluates alone therefore blocks the others.
    """
    import os
    from contextlib import contextmanager

    try:
        os.environ.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
            }
        )
        import torch
        import torch.distributed as dist
        import trl.models

        from kgreasoner.training.grpo import build_trainer
        from kgreasoner.training.grpo_callbacks import DevEval

        dataset, tool = _tool(recipe)
        trainer = build_trainer(
            recipe, 1, recipe.episodes[0], dataset.split("train")[:8], recipe.model, tool, dataset.split("dev")[:3]
        )
        gathered, rows = [], []

        def shard_fetch(module, args, kwargs):
            if not gathered:
                dist.all_reduce(torch.zeros(1))
            rows.append(kwargs["hidden_states"].size(0) if "hidden_states" in kwargs else args[0].size(0))

        for layer in trainer.model.model.layers:
            layer.register_forward_pre_hook(shard_fetch, with_kwargs=True)
        real = trl.models.unwrap_model_for_generation

        entered = []

        @contextmanager
        def zero3_generation(model, accelerator, **kwargs):
            dist.all_reduce(torch.zeros(1))
            entered.append(True)
            gathered.append(True)
            with real(model, accelerator, **kwargs) as unwrapped:
                yield unwrapped
            gathered.pop()
            dist.all_reduce(torch.zeros(1))

        trl.models.unwrap_model_for_generation = zero3_generation
        [dev] = [c for c in trainer.callback_handler.callbacks if isinstance(c, DevEval)]
        trainer.state.global_step = 0
        dev._evaluate(trainer.state)
        logs = [None, None]
        dist.all_gather_object(logs, {name: list(values) for name, values in trainer._metrics["train"].items()})
        queue.put((rank, logs, max(rows) if rows else 0, len(entered)))
        dist.destroy_process_group()
    except BaseException as err:  # report it to the parent instead of dying silently
        queue.put((rank, "error", repr(err)))


@pytest.mark.slow
@pytest.mark.parametrize("batch, rows, calls", [(32, (2, 1), (1, 1)), (1, (1, 1), (2, 2))])
def test_every_rank_takes_part_in_the_dev_evaluation(tiny_checkpoint, synthetic_dir, tmp_path, batch, rows, calls):
    """Three questions on two ranks: shares of two and one. In batches of one, rank 1 joins rank 0's second
    generation context with an empty batch."""
    import multiprocessing
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    recipe = _recipe(
        tiny_checkpoint,
        synthetic_dir,
        tmp_path / "dev",
        dev_eval=DevEvaluation(steps=1, questions=3, batch_size=batch),
        trainer={"ddp_timeout": 60},
    )
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_dev_eval_rank, args=(rank, port, recipe, queue)) for rank in (0, 1)]
    for process in processes:
        process.start()
    try:  # a rank left waiting in a collective never reports: that is the failure this test is for
        results = dict((r[0], r[1:]) for r in (queue.get(timeout=240) for _ in processes))
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    assert all(result[0] != "error" for result in results.values()), results
    logs = results[0][0]
    assert logs[0] == logs[1] == results[1][0][0], "the ranks logged different dev figures"
    assert set(logs[0]) >= {"dev/hits1", "dev/searches"}
    # each rank rolled out its own share of the three questions (two and one rows), in as many calls
    assert (results[0][1], results[1][1]) == rows
    assert (results[0][2], results[1][2]) == calls
    rows = [json.loads(line) for line in (tmp_path / "dev" / "steps.jsonl").read_text().splitlines()]
    assert [(r["step"], "dev/hits1" in r) for r in rows] == [(0, True)]


@pytest.mark.slow
def test_the_next_episode_drives_the_same_colocated_vllm_engine(tiny_checkpoint, synthetic_dir, tmp_path, monkeypatch):
    """vLLM cannot run here: `engine` stands in for the `vllm.LLM` TRL built for episode 1 (only its
    identity matters: no second engine may be started in the process). Each trainer's weight sync reads
    its weights through `vllm_named_weights` (fused MoE experts go out unfused)."""
    from types import SimpleNamespace

    import trl.trainer.grpo_trainer as grpo_trainer

    import kgreasoner.training.vllm_weights as vllm_weights

    synced = []

    def recording(weights, model_type):
        synced.append(model_type)
        yield from weights

    monkeypatch.setattr(vllm_weights, "vllm_named_weights", recording)

    from kgreasoner.training.grpo import build_trainer
    from kgreasoner.training.trl_internals import release_trainer, vllm_engine

    stock = grpo_trainer.VLLMGeneration
    recipe = _recipe(tiny_checkpoint, synthetic_dir, tmp_path / "vllm", rollout_backend="vllm")
    dataset, tool = _tool(recipe)
    examples = dataset.split("train")[:4]
    engine = SimpleNamespace(name="episode 1's vllm.LLM")
    started = SimpleNamespace(use_vllm=True, vllm_generation=SimpleNamespace(mode="colocate", llm=engine))
    first = build_trainer(recipe, 1, recipe.episodes[0], examples, str(tiny_checkpoint), tool, (), started)
    release_trainer(first)
    assert first.vllm_generation.model is None and first.model is None
    second = build_trainer(recipe, 2, recipe.episodes[0], examples, str(tiny_checkpoint), tool, (), first)
    assert vllm_engine(second) == (engine, None)
    assert second.vllm_generation.model is second.model and second.vllm_generation.accelerator is second.accelerator
    assert grpo_trainer.VLLMGeneration is stock
    names = [name for name, _ in second.vllm_generation._iter_named_params()]
    assert synced == [second.model.config.model_type]
    assert "model.embed_tokens.weight" in names


# ----------------------------------------------------------------- the process group's timeout


class Built(Exception):
    """Raised where episode 1's trainer would be built: this test reads the process group the run opened, not a
    run."""


def _timeout_rank(rank: int, port: int, recipe: GRPORecipe, queue) -> None:
    """One of two gloo ranks: `train_grpo` up to building episode 1's trainer, then the timeout torch gives
    the default group's backend."""
    import os

    try:
        os.environ.update(
            {
                "RANK": str(rank),
                "LOCAL_RANK": str(rank),
                "WORLD_SIZE": "2",
                "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": "1",
            }
        )
        import torch
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

        import kgreasoner.training.grpo as grpo

        def build_trainer(*args):
            backend = distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
            raise Built(backend.options._timeout.total_seconds())

        grpo.build_trainer = build_trainer
        try:
            grpo.train_grpo(recipe)
        except Built as built:
            queue.put((rank, built.args[0], dist.get_world_size()))
        dist.destroy_process_group()
    except BaseException as err:  # report it to the parent instead of dying silently
        queue.put((rank, "error", repr(err)))


@pytest.mark.slow
def test_the_process_group_has_the_recipes_timeout_before_any_trainer(tiny_checkpoint, synthetic_dir, tmp_path):
    """The run opens the process group before anything else: when episode 1's trainer is about to be built,
    the group has the recipe's `ddp_timeout`, as torch reports it (two real gloo ranks)."""
    import multiprocessing
    import socket

    recipe = _recipe(
        tiny_checkpoint,
        synthetic_dir,
        tmp_path / "run",
        trainer={"ddp_timeout": 1234},
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_timeout_rank, args=(rank, port, recipe, queue)) for rank in (0, 1)]
    for process in processes:
        process.start()
    try:
        results = dict((r[0], r[1:]) for r in (queue.get(timeout=240) for _ in processes))
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    assert results == {0: (1234.0, 2), 1: (1234.0, 2)}


# ----------------------------------------------------------------- the dev evaluation's batches and backend


def test_every_rank_runs_as_many_dev_batches_of_at_most_the_batch_size():
    from kgreasoner.training.grpo_rollout import dev_batches

    assert dev_batches(5, 0, 1, 2) == [[0, 1], [2, 3], [4]]
    # seven questions on three ranks: shares of 3, 2 and 2, each in two calls, the smaller ones' last empty
    assert [dev_batches(7, rank, 3, 2) for rank in range(3)] == [[[0, 3], [6]], [[1, 4], []], [[2, 5], []]]
    assert dev_batches(2, 3, 4, 32) == [[]]  # a rank with no question still joins the one call
    with pytest.raises(ValueError, match="dev_eval.batch_size must be >= 1, got 0"):
        DevEvaluation(batch_size=0)


def _dev_trainer(recipe, count: int, kind=None):
    """A real trainer whose dev curve's sample and whole dev split are the first `count` dev questions, and its
    callback of `kind` (the dev curve's, `DevEval`, by default)."""
    from kgreasoner.training.grpo import build_trainer
    from kgreasoner.training.grpo_callbacks import DevEval

    dataset, tool = _tool(recipe)
    dev = dataset.split("dev")[:count]
    started = None
    if recipe.rollout_backend == "vllm":  # TRL takes this engine over instead of starting one (vLLM cannot run)
        from types import SimpleNamespace

        started = SimpleNamespace(use_vllm=True, vllm_generation=SimpleNamespace(mode="colocate", llm=None))
    trainer = build_trainer(
        recipe, 1, recipe.episodes[0], dataset.split("train")[:8], recipe.model, tool, dev, started, dev
    )
    [callback] = [c for c in trainer.callback_handler.callbacks if isinstance(c, kind or DevEval)]
    return trainer, callback, dev


@pytest.mark.slow
def test_the_dev_evaluation_rolls_out_in_calls_of_at_most_its_batch_size(tiny_checkpoint, synthetic_dir, tmp_path):
    """The hf backend on the real tiny policy: five dev questions in batches of two are three engine calls,
    greedy, each decoded in eval mode, and every question is scored."""
    from kgreasoner.rollout.engine import RolloutEngine
    from kgreasoner.rollout.hf_backend import HFBackend

    recipe = _recipe(tiny_checkpoint, synthetic_dir, tmp_path / "run", dev_eval=DevEvaluation(steps=1, batch_size=2))
    trainer, dev, examples = _dev_trainer(recipe, 5)
    calls, modes, real_run, real_generate = [], [], RolloutEngine.run, HFBackend._generate

    def recording(engine, prompts, sessions=None, sampling=None, halt=None, prefixes=None):
        calls.append(([p.id for p in prompts], sampling.temperature))
        return real_run(engine, prompts, sessions, sampling, halt, prefixes)

    def decoding(backend, *args):
        modes.append(backend.model.training)
        return real_generate(backend, *args)

    trainer.state.global_step = 0
    trainer.model.train()  # as TRL leaves it between steps
    with mock.patch.object(RolloutEngine, "run", recording), mock.patch.object(HFBackend, "_generate", decoding):
        dev._evaluate(trainer.state)
    ids = [e.id for e in examples]
    assert calls == [(ids[0:2], 0.0), (ids[2:4], 0.0), (ids[4:5], 0.0)]
    assert modes == [False, False, False]
    assert trainer.model.training  # put back after each call
    assert trainer._metrics["train"]["dev/hits1"] == [dev.latest[1]]


@pytest.mark.slow
def test_the_whole_dev_splits_measurement_rolls_out_in_calls_of_the_dev_batch_size(
    tiny_checkpoint, synthetic_dir, tmp_path
):
    """dev_eval.choose_final: best_dev measures a save on the whole dev split through the run's rollouts in calls
    of dev_eval.batch_size rows: five questions in batches of two are three greedy engine calls, each question
    scored once in the candidate row."""
    from kgreasoner.rollout.engine import RolloutEngine
    from kgreasoner.training.checkpoint_choice import HITS, BestKeeper, candidates, read_rows

    recipe = _recipe(tiny_checkpoint, synthetic_dir, tmp_path / "run", dev_eval=DevEvaluation(steps=1, batch_size=2))
    trainer, keeper, examples = _dev_trainer(recipe, 5, BestKeeper)
    calls, real_run = [], RolloutEngine.run

    def recording(engine, prompts, sessions=None, sampling=None, halt=None, prefixes=None):
        calls.append(([p.id for p in prompts], sampling.temperature))
        return real_run(engine, prompts, sessions, sampling, halt, prefixes)

    trainer.state.global_step = 0
    with mock.patch.object(RolloutEngine, "run", recording):
        keeper._measure(trainer.state)
    ids = [e.id for e in examples]
    assert calls == [(ids[0:2], 0.0), (ids[2:4], 0.0), (ids[4:5], 0.0)]
    [row] = candidates(read_rows(tmp_path / "run" / "steps.jsonl"))
    assert sum(v for k, v in row.items() if k.startswith("dev_split/questions_hop")) == 5
    assert 0.0 <= row[HITS] <= 1.0


class StandInVLLM:
    """vLLM cannot run here: a stand-in for the colocated `vllm.LLM` TRL drives. `generate` answers every
    request in one turn; `load_weights` (TRL's colocated weight sync) and `reset_prefix_cache` are recorded."""

    REPLY = "<think> I know it. </think>\n<answer>nobody</answer>"

    def __init__(self, tokenizer) -> None:
        from types import SimpleNamespace

        self.reply = tokenizer(self.REPLY, add_special_tokens=False)["input_ids"]
        self.events: list[tuple] = []
        runner = SimpleNamespace(model=SimpleNamespace(load_weights=lambda weights: self.events.append(("load",))))
        self.llm_engine = SimpleNamespace(
            model_executor=SimpleNamespace(driver_worker=SimpleNamespace(model_runner=runner))
        )

    def reset_prefix_cache(self) -> None:
        self.events.append(("reset",))

    def generate(self, prompts, params, use_tqdm=False):
        from types import SimpleNamespace

        self.events.append(("generate", len(prompts), sorted({p["temperature"] for p in params})))
        logprobs = [{token: SimpleNamespace(logprob=-0.5)} for token in self.reply]
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=self.reply, logprobs=logprobs)]) for _ in prompts]


@pytest.mark.slow
def test_with_vllm_the_dev_evaluation_runs_on_the_engine_with_this_steps_weights(
    tiny_checkpoint, synthetic_dir, tmp_path, monkeypatch
):
    """vLLM cannot run here: `StandInVLLM` stands in for the engine and small modules for `vllm`'s
    `SamplingParams` and `TokensPrompt`. The hf generation context must not be entered: under ZeRO-3 it
    would gather the whole model beside vLLM's copy, neither for the dev curve nor for the whole dev split's
    measurement of a save (`dev_eval.choose_final: best_dev`), which both roll out on the engine in calls of
    dev_eval.batch_size rows."""
    import sys
    import types

    import trl.models

    from kgreasoner.training.checkpoint_choice import BestKeeper

    recipe = _recipe(
        tiny_checkpoint,
        synthetic_dir,
        tmp_path / "run",
        dev_eval=DevEvaluation(steps=1, batch_size=2),
        rollout_backend="vllm",
    )
    trainer, dev, _ = _dev_trainer(recipe, 3)
    engine = StandInVLLM(trainer.processing_class)
    trainer.vllm_generation.llm = engine
    vllm, inputs = types.ModuleType("vllm"), types.ModuleType("vllm.inputs")
    vllm.SamplingParams = lambda **kwargs: kwargs
    inputs.TokensPrompt = lambda prompt_token_ids: {"prompt_token_ids": prompt_token_ids}
    monkeypatch.setitem(sys.modules, "vllm", vllm)
    monkeypatch.setitem(sys.modules, "vllm.inputs", inputs)

    def hf_generation(*args, **kwargs):
        raise AssertionError("the dev evaluation entered the hf generation context")

    monkeypatch.setattr(trl.models, "unwrap_model_for_generation", hf_generation)
    weights = len(list(trainer.vllm_generation._iter_named_params()))
    trainer.state.global_step = 3  # after a step TRL has not generated for yet
    dev._evaluate(trainer.state)
    assert engine.events == [("load",)] * weights + [("reset",), ("generate", 2, [0.0]), ("generate", 1, [0.0])]
    assert trainer._last_loaded_step == 3  # TRL's next generation of step 3 loads nothing again
    assert dev.latest == (3, 0.0)
    engine.events.clear()
    dev._evaluate(trainer.state)
    assert engine.events == [("generate", 2, [0.0]), ("generate", 1, [0.0])]
    [keeper] = [c for c in trainer.callback_handler.callbacks if isinstance(c, BestKeeper)]
    engine.events.clear()
    keeper._measure(trainer.state)  # the whole dev split's measurement of a save: on the engine too
    assert engine.events == [("generate", 2, [0.0]), ("generate", 1, [0.0])]


def _tiny_moe(tiny_checkpoint, out: Path) -> Path:
    """The tiny model's tokenizer and sizes as a Qwen3-MoE (4 experts, 2 a token), random weights."""
    import shutil

    from transformers import AutoConfig, AutoModelForCausalLM, Qwen3MoeConfig

    dense = AutoConfig.from_pretrained(tiny_checkpoint).to_dict()
    keep = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")
    config = Qwen3MoeConfig(
        **{k: dense[k] for k in keep},
        moe_intermediate_size=32,
        num_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=dense["max_position_embeddings"],
        bos_token_id=dense.get("bos_token_id"),
        eos_token_id=dense.get("eos_token_id"),
        pad_token_id=dense.get("pad_token_id"),
    )
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    for path in tiny_checkpoint.iterdir():
        if "token" in path.name or path.name == "generation_config.json":
            shutil.copy(path, out / path.name)
    return out


@pytest.mark.slow
def test_the_engine_trl_starts_runs_a_moe_models_experts_on_tritons_kernels(
    tiny_checkpoint, synthetic_dir, tmp_path, monkeypatch
):
    """vLLM cannot run here: `StartedLLM` stands in for `vllm.LLM` where TRL's `VLLMGeneration._init_vllm` starts
    the colocated engine, and records the engine arguments. FlashInfer's CUTLASS/TRTLLM MoE kernels lay the experts
    out anew after vLLM loads them, so every weight sync would corrupt them: a MoE model's engine asks for Triton's
    (`moe_backend`), a dense model's asks for nothing more than TRL's."""
    import trl.generation.vllm_generation as vllm_generation

    from kgreasoner.training.grpo import build_trainer

    started: list[dict] = []

    class StartedLLM:
        def __init__(self, **kwargs):
            started.append(kwargs)

    monkeypatch.setattr(vllm_generation, "is_vllm_available", lambda: True)
    monkeypatch.setattr(vllm_generation, "LLM", StartedLLM, raising=False)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):  # TRL sets them for vLLM
        monkeypatch.delenv(name, raising=False)
    moe = _tiny_moe(tiny_checkpoint, tmp_path / "moe")
    for model, backend in ((moe, {"moe_backend": "triton"}), (tiny_checkpoint, {})):
        recipe = _recipe(
            tiny_checkpoint, synthetic_dir, tmp_path / model.name, rollout_backend="vllm", model=str(model)
        )
        dataset, tool = _tool(recipe)
        build_trainer(recipe, 1, recipe.episodes[0], dataset.split("train")[:8], str(model), tool)
        kwargs = started.pop()
        assert kwargs["model"] == str(model) and kwargs["distributed_executor_backend"] == "external_launcher"
        assert {k: v for k, v in kwargs.items() if k == "moe_backend"} == backend
    assert vllm_generation.LLM is StartedLLM  # put back after the trainer is built
