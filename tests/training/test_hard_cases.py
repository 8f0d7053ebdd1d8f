"""Hard cases mined from the policy: episode 1's recorded groups (the policy's own rollouts, gold rows not
counted, every hop count eligible), the set saved in the run and reused on resume, the same on two ranks;
and the replay share of every batch of the hard episode, hop counts in turn."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from unittest import mock

import pytest

from kgreasoner.retrieval.tool import ToolConfig
from kgreasoner.rollout.types import RolloutConfig
from kgreasoner.training.frontier import GroupLog, read_groups
from kgreasoner.training.grpo_recipe import Episode, GRPORecipe, Guidance, HardCases
from kgreasoner.training.hard_cases import hard_examples, replay_order, replay_slots, select_hard

TOOL = ToolConfig(entity_handles=True, top_k=5)


def _recipe(tiny_checkpoint, synthetic_dir, run_dir: Path, **fields) -> GRPORecipe:
    settings = dict(
        model=str(tiny_checkpoint),
        dataset=str(synthetic_dir),
        run_dir=str(run_dir),
        tool=TOOL,
        rollout=RolloutConfig(max_new_tokens=24, max_turn_tokens=12, max_turns=2),
        episodes=[Episode("all", max_steps=2), Episode("hard", max_steps=1)],
        trainer={
            "num_generations": 4,
            "per_device_train_batch_size": 16,
            "learning_rate": 1e-3,
            "report_to": [],
            "save_steps": 1,
            "beta": 0.0,
        },
    )
    return GRPORecipe(**{**settings, **fields})


def _question(id: str, hops: int):
    from kgreasoner.records.schema import Answer, QAExample, TopicEntity

    return QAExample(id, "?", (TopicEntity("t", "t"),), (Answer("x", "x"),), hops=hops)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_the_hard_set_is_every_question_below_the_threshold_by_its_last_group():
    groups = {
        "a": {"hops": 1, "right": 4, "of": 4},
        "b": {"hops": 1, "right": 3, "of": 4},
        "c": {"hops": 2, "right": 2, "of": 4},
        "d": {"hops": 3, "right": 0, "of": 4},
    }
    assert select_hard(groups, 1.0) == ["b", "c", "d"]  # any wrong rollout
    assert select_hard(groups, 0.5) == ["d"]  # right in fewer than half: 2 of 4 is not
    assert select_hard(groups, 0.75) == ["c", "d"]


def test_hard_cases_are_mined_from_the_groups_the_policy_rollouts_recorded(tiny_checkpoint, synthetic_dir, tmp_path):
    """The recording function of a real trainer fed known answers, one generation batch of four groups of four
    at step 1 and one at step 3: the hard set is exactly the questions whose last group had a wrong rollout, of
    every hop count; a question never sampled is not hard."""
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.records.sampling import hop_count
    from kgreasoner.retrieval.tool import KGSearchTool
    from kgreasoner.training.grpo import build_trainer

    recipe = _recipe(tiny_checkpoint, synthetic_dir, tmp_path / "run")
    dataset = load_dataset(str(synthetic_dir))
    train = dataset.split("train")
    by_hops = {h: [e for e in train if hop_count(e) == h] for h in (1, 2, 3)}
    one, one_b, two, three, three_b = by_hops[1][0], by_hops[1][1], by_hops[2][0], by_hops[3][0], by_hops[3][1]
    tool = KGSearchTool(open_dataset_kg(dataset), TOOL)
    trainer = build_trainer(recipe, 1, recipe.episodes[0], train, str(tiny_checkpoint), tool)
    log = next(c for c in trainer.callback_handler.callbacks if isinstance(c, GroupLog))

    def answers(*rights: int) -> list[float]:
        return [1.0 if i < r else 0.0 for r in rights for i in range(4)]

    # step 1: 4 of 4, 3 of 4, 0 of 4, 4 of 4
    log.record(trainer, [e for e in (one, one_b, two, three) for _ in range(4)], answers(4, 3, 0, 4))
    trainer.state.global_step = 2  # step 3: the 3-hop question again, now 1 of 4; the 1-hop one again, 4 of 4
    log.record(trainer, [e for e in (three, one) for _ in range(4)], answers(1, 4))
    groups = read_groups(tmp_path / "run" / "episode-1" / "groups.jsonl")
    assert groups[three.id] == {"hops": 3, "right": 1, "of": 4} and len(groups) == 4

    hard, rest = hard_examples(tmp_path / "run", 2, train, 1.0)
    assert [e.id for e in hard] == [e.id for e in train if e.id in {one_b.id, two.id, three.id}]
    assert {hop_count(e) for e in hard} == {1, 2, 3}
    assert [e.id for e in rest] == [e.id for e in train if e.id not in {one_b.id, two.id, three.id}]
    assert three_b in rest  # never sampled: not hard
    folder = tmp_path / "run" / "episode-2"
    assert _rows(folder / "hard_cases.jsonl") == [
        {"id": i, "hops": groups[i]["hops"], "right": groups[i]["right"], "of": 4}
        for i in sorted({one_b.id, two.id, three.id})
    ]
    summary = json.loads((folder / "hard_cases.json").read_text())
    assert summary["threshold"] == 1.0 and summary["sampled"] == 4 and summary["hard"] == 3
    assert summary["hard_by_hops"] == {"1": 1, "2": 1, "3": 1}
    assert summary["never_sampled"] == len(train) - 4


def test_a_missing_groups_file_and_a_changed_threshold_are_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match=r"episode 2 trains on hard cases, but .*episode-1/groups.jsonl is missing"):
        hard_examples(tmp_path, 2, [], 1.0)
    (tmp_path / "episode-2").mkdir()
    (tmp_path / "episode-2" / "hard_cases.jsonl").write_text('{"id": "q"}\n')
    (tmp_path / "episode-2" / "hard_cases.json").write_text('{"threshold": 0.5}\n')
    with pytest.raises(
        ValueError, match=r"hard_cases.jsonl was mined with hard_cases.threshold 0.5, the recipe says 1.0"
    ):
        hard_examples(tmp_path, 2, [], 1.0)


def test_no_question_below_the_threshold_trains_the_episode_on_every_question(tmp_path):
    train = [_question(f"q{i}", 1) for i in range(3)]
    (tmp_path / "episode-1").mkdir()
    (tmp_path / "episode-1" / "groups.jsonl").write_text(
        "".join(json.dumps({"step": 1, "id": e.id, "hops": 1, "right": 2, "of": 2}) + "\n" for e in train)
    )
    hard, rest = hard_examples(tmp_path, 2, train, 1.0)
    assert (hard, rest) == (train, [])
    assert json.loads((tmp_path / "episode-2" / "hard_cases.json").read_text())["fallback"] == "all"


# ----------------------------------------------------------------- the settings of warm-up-model mining


@pytest.mark.parametrize(
    ("key", "value", "also"),
    [
        ("hard_case_trajectories", "all.jsonl", "guided groups take their gold rows from guidance.trajectories"),
        ("hard_case_quantile", 0.5, ""),
    ],
)
def test_the_settings_of_warm_up_model_mining_are_refused_naming_the_new_ones(key, value, also, tmp_path):
    from kgreasoner.config import ConfigError, load_config

    path = tmp_path / "grpo.yaml"
    path.write_text(f"model: m\ndataset: d\nrun_dir: o\n{key}: {value}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(GRPORecipe, path)
    assert str(refused.value) == (
        f"{path}: {key} is no longer a setting: hard cases are mined from the policy's own groups in episode 1, "
        "not from the warm-up model: set hard_cases.threshold (a question is hard below this success rate) and "
        "hard_cases.replay (the share of every batch from the other questions)" + (f"; {also}" if also else "")
    )


def test_a_hard_cases_file_is_refused_naming_the_groups_settings(tmp_path):
    """`hard_cases:` once named a file of mined questions; it is now the group of the mining's settings."""
    from kgreasoner.config import ConfigError, load_config

    path = tmp_path / "grpo.yaml"
    path.write_text("model: m\ndataset: d\nrun_dir: o\nhard_cases: hard.jsonl\n")
    with pytest.raises(ConfigError) as refused:
        load_config(GRPORecipe, path)
    assert str(refused.value) == (
        f"{path}: hard_cases is now a mapping ({{threshold, replay}}), no longer a file: hard cases are mined from "
        "the policy's own groups in episode 1, not from the warm-up model: set hard_cases.threshold (a question is "
        "hard below this success rate) and hard_cases.replay (the share of every batch from the other questions); "
        "the mined set is saved in episode-<k>/hard_cases.jsonl"
    )


def test_the_demos_hard_stage_is_refused_naming_the_grpo_settings(tmp_path):
    from kgreasoner.config import ConfigError, load_config
    from kgreasoner.demo import Demo, DemoConfig

    with pytest.raises(ConfigError) as refused:
        load_config(DemoConfig, None, ["hard.set.quantile=0.5"])
    assert str(refused.value) == (
        "defaults: hard is no longer a stage: GRPO mines its hard cases from episode 1's own groups; set "
        "grpo.set.hard_cases.threshold and grpo.set.hard_cases.replay"
    )
    config = load_config(DemoConfig, None, ["grpo.set.hard_case_quantile=0.5"])  # checked with the stage's recipe
    with pytest.raises(
        ConfigError, match="demo stage grpo: .*hard_case_quantile is no longer a setting: .*set hard_cases.thr"
    ):
        Demo(config, tmp_path / "out")


# ----------------------------------------------------------------- the replay share of every batch


def test_replay_slots_are_the_share_of_a_batch_to_the_nearest_at_least_one_and_never_all():
    assert [replay_slots(n, 0.25) for n in (2, 3, 4, 8, 16)] == [1, 1, 1, 2, 4]
    assert replay_slots(4, 0.9) == 3 and replay_slots(8, 0.0) == 0 and replay_slots(1, 0.0) == 0
    with pytest.raises(
        ValueError, match="hard_cases.replay 0.25 needs at least 2 questions a generation batch, it takes 1"
    ):
        replay_slots(1, 0.25)


def test_every_batch_holds_its_replay_share_with_hop_counts_in_turn():
    hard = [_question("h0", 3), _question("h1", 2), _question("h2", 3), _question("h3", 1), _question("h4", 2)]
    rest = [_question(f"r1{c}", 1) for c in "abc"] + [_question(f"r2{c}", 2) for c in "ab"] + [_question("r3a", 3)]

    def batches(order, size):
        return [[e.id for e in order[i : i + size]] for i in range(0, len(order), size)]

    # batches of 4, half replay: 2 hard questions (the last batch starts the hard list over), then 2 replayed,
    # hop counts 1, 2, 3 in turn from batch to batch; the one 3-hop question comes back once used
    order = replay_order(hard, rest, 4, 0.5, seed=0)
    assert batches(order, 4) == [
        ["h0", "h1", "r1a", "r2a"],
        ["h2", "h3", "r3a", "r1b"],
        ["h4", "h0", "r2b", "r3a"],
    ]
    assert replay_order(hard, rest, 4, 0.5, seed=0) == order
    other = replay_order(hard, rest, 4, 0.5, seed=1)
    assert other != order and [e.hops for e in other] == [e.hops for e in order]
    # as many slots as hop counts or more: every batch replays each hop count
    wide = replay_order(hard, rest, 8, 0.5, seed=0)
    assert batches(wide, 8) == [
        ["h0", "h1", "h2", "h3", "r1a", "r2a", "r3a", "r1b"],
        ["h4", "h0", "h1", "h2", "r2b", "r3a", "r1c", "r2a"],
    ]
    # no share: the hard questions alone, in whole batches
    assert [e.id for e in replay_order(hard, rest, 4, 0.0, seed=0)] == ["h0", "h1", "h2", "h3", "h4", "h0", "h1", "h2"]


def test_a_batch_too_small_for_the_replay_share_is_refused_before_episode_one(
    tiny_checkpoint, synthetic_dir, tmp_path
):
    from kgreasoner.training.grpo import train_grpo

    # one question a generation batch: no room for a hard case beside a replayed one
    trainer = {"num_generations": 2, "per_device_train_batch_size": 2, "report_to": [], "beta": 0.0}
    recipe = _recipe(tiny_checkpoint, synthetic_dir, tmp_path / "run", trainer=trainer)
    with pytest.raises(
        ValueError, match="hard_cases.replay 0.25 needs at least 2 questions a generation batch, it takes 1"
    ):
        train_grpo(recipe)
    assert not (tmp_path / "run" / "episode-1").exists()
    train_grpo(
        _recipe(
            tiny_checkpoint, synthetic_dir, tmp_path / "hard only", trainer=trainer, hard_cases=HardCases(replay=0.0)
        )
    )
    assert (tmp_path / "hard only" / "episode-2" / "final" / "config.json").is_file()


@pytest.mark.parametrize("order", ["stratified", "shuffled"])
def test_trls_sampler_hands_the_hard_episode_its_batches(order, tiny_checkpoint, synthetic_dir, tmp_path):
    """A real trainer of a hard episode: the questions TRL's sampler hands each generation, in its groups,
    are the replay order's batches (no shuffle of TRL's own undoes them), whatever the recipe's order."""
    import random

    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.records.sampling import balanced_order, hop_count
    from kgreasoner.retrieval.tool import KGSearchTool
    from kgreasoner.training.grpo import build_trainer

    recipe = _recipe(
        tiny_checkpoint,
        synthetic_dir,
        tmp_path / "run",
        order=order,
        hard_cases=HardCases(replay=0.5),
        trainer={"num_generations": 2, "per_device_train_batch_size": 8, "report_to": [], "beta": 0.0},
    )
    dataset = load_dataset(str(synthetic_dir))
    train = dataset.split("train")
    hard, rest = train[:5], train[5:]
    tool = KGSearchTool(open_dataset_kg(dataset), TOOL)
    trainer = build_trainer(recipe, 2, recipe.episodes[1], hard, str(tiny_checkpoint), tool, (), None, (), rest)
    handed = list(trainer._get_train_sampler())
    assert handed[::2] == handed[1::2]  # each question twice in a row: one group
    ids = [trainer.train_dataset[i]["id"] for i in handed[::2]]
    arranged = list(hard)  # the hard questions in the recipe's order: balanced, or shuffled once (seeded)
    if order == "stratified":
        arranged = balanced_order(hard, 0)
    else:
        random.Random("0|hard").shuffle(arranged)
    assert ids == [e.id for e in replay_order(arranged, rest, 4, 0.5, seed=0)]
    by_id = {e.id: e for e in train}
    hard_ids = {e.id for e in hard}
    for start in range(0, len(ids), 4):
        batch = ids[start : start + 4]
        assert [i in hard_ids for i in batch] == [True, True, False, False]
        turn = start // 4 * 2
        assert [hop_count(by_id[i]) for i in batch[2:]] == [1 + turn % 3, 1 + (turn + 1) % 3]


# ----------------------------------------------------------------- a real run: guided groups, resume


@pytest.fixture(scope="module")
def guided_run(tiny_checkpoint, synthetic_dir, tmp_path_factory):
    """Two episodes of the untrained tiny model (it answers nothing) with guided groups: every group of
    episode 1 trains on a gold row, which answers right."""
    from data_gen.warmup import WarmupConfig, run
    from kgreasoner.training.grpo import train_grpo

    root = tmp_path_factory.mktemp("hard")
    trajectories = root / "all.jsonl"
    run(
        WarmupConfig(
            dataset=str(synthetic_dir),
            output=str(trajectories),
            num_examples=None,
            dev_examples=0,
            tool=TOOL,
            progress=False,
        )
    )
    fields = {"guidance": Guidance("gold", str(trajectories))}
    train_grpo(_recipe(tiny_checkpoint, synthetic_dir, root / "run", **fields))
    return root / "run", fields


def test_a_real_episode_one_mines_the_questions_its_policy_rollouts_missed_not_its_gold_rows(guided_run):
    run, _ = guided_run
    steps = [json.loads(line) for line in (run / "steps.jsonl").read_text().splitlines()]
    first = [r for r in steps if r["episode"] == 1 and "loss" in r]
    # every group of episode 1 trained on a gold row, right by construction ...
    assert len(first) == 2 and all(r["rollout/guided"] == 1.0 for r in first)
    # the gold rows are logged apart from the policy's, whose answer reward is its own: none right
    assert all(r["guidance/gold_answer_reward"] == 1.0 for r in first)
    assert all(r["rewards/answer_reward/mean"] == 0.0 for r in first)
    # ... and the groups recorded the policy's own rollouts
    groups = _rows(run / "episode-1" / "groups.jsonl")
    assert len(groups) == 8 and all(g["right"] == 0 for g in groups)
    hard = _rows(run / "episode-2" / "hard_cases.jsonl")
    assert [h["id"] for h in hard] == sorted(g["id"] for g in groups)
    assert {h["hops"] for h in hard} == {1, 2, 3}  # every hop count eligible
    # episode 2's one batch of four: three hard questions, then one replayed, the fewest hops first
    trained = _rows(run / "episode-2" / "groups.jsonl")
    ids = {h["id"] for h in hard}
    assert [g["id"] in ids for g in trained] == [True, True, True, False] and trained[3]["hops"] == 1


def test_a_resumed_run_trains_the_hard_cases_it_saved(guided_run, tiny_checkpoint, synthetic_dir, tmp_path):
    """Killed in episode 2 after its checkpoint: the resumed run reads the saved set, although episode 1's
    groups would now give another (here every question answered: no hard case at all)."""
    import kgreasoner.training.grpo as grpo

    run = tmp_path / "run"
    shutil.copytree(guided_run[0], run)
    shutil.rmtree(run / "episode-2" / "final")
    saved = _rows(run / "episode-2" / "hard_cases.jsonl")
    groups = run / "episode-1" / "groups.jsonl"
    groups.write_text("".join(json.dumps({**g, "right": g["of"]}) + "\n" for g in _rows(groups)))
    handed = []
    build = grpo.build_trainer

    def recording(recipe, number, episode, examples, *rest):
        handed.append((number, sorted(e.id for e in examples)))
        return build(recipe, number, episode, examples, *rest)

    with mock.patch.object(grpo, "build_trainer", recording):
        final = grpo.train_grpo(_recipe(tiny_checkpoint, synthetic_dir, run, **guided_run[1]), resume=True)
    assert handed == [(2, [h["id"] for h in saved])]
    assert _rows(run / "episode-2" / "hard_cases.jsonl") == saved
    assert final == run / "episode-2" / "final" and (final / "config.json").is_file()


# ----------------------------------------------------------------- two ranks


def _rank(rank: int, port: int, root: str, queue) -> None:
    """One of two gloo ranks: its share of a generation batch recorded (the group in the middle lies on both
    ranks), then the hard set mined; the trainer's parts the recording reads are accelerate's and
    transformers' own (no model is needed to gather counts)."""
    import os
    import types

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
        import torch.distributed as dist
        from accelerate import Accelerator
        from transformers import TrainerState

        dist.init_process_group("gloo")
        train = [_question(f"q{i}", 1 + i) for i in range(3)]
        trainer = types.SimpleNamespace(accelerator=Accelerator(cpu=True), state=TrainerState())
        # groups of two: q0 (1 of 2) on rank 0; q1 on both ranks (rank 0 wrong, rank 1 right); q2 (2 of 2) on rank 1
        share = (
            [(train[0], 1.0), (train[0], 0.0), (train[1], 0.0)]
            if rank == 0
            else [
                (train[1], 1.0),
                (train[2], 1.0),
                (train[2], 1.0),
            ]
        )
        GroupLog(Path(root) / "episode-1" / "groups.jsonl", 2).record(
            trainer, [e for e, _ in share], [r for _, r in share]
        )
        hard, rest = hard_examples(Path(root), 2, train, 1.0)
        queue.put((rank, [e.id for e in hard], [e.id for e in rest]))
        dist.destroy_process_group()
    except BaseException as err:  # report it to the parent instead of dying silently
        queue.put((rank, "error", repr(err)))


@pytest.mark.slow
def test_two_ranks_gather_their_groups_and_mine_one_hard_set(tmp_path):
    import multiprocessing
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=_rank, args=(rank, port, str(tmp_path), queue)) for rank in (0, 1)]
    for process in processes:
        process.start()
    try:
        results = dict((r[0], r[1:]) for r in (queue.get(timeout=240) for _ in processes))
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    assert results == {0: (["q0", "q1"], ["q2"]), 1: (["q0", "q1"], ["q2"])}
    assert _rows(tmp_path / "episode-1" / "groups.jsonl") == [
        {"step": 1, "id": "q0", "hops": 1, "right": 1, "of": 2},
        {"step": 1, "id": "q1", "hops": 2, "right": 1, "of": 2},
        {"step": 1, "id": "q2", "hops": 3, "right": 2, "of": 2},
    ]
