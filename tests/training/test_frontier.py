"""The frontier episode: group rows recorded while episode 1 trains, and the questions chosen from them."""

import json
from pathlib import Path

import pytest

from kgreasoner.training.frontier import GroupLog, group_rows, read_groups, select_frontier


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _groups(tmp_path: Path) -> Path:
    rows = [
        {"step": 1, "id": "a", "hops": 1, "right": 4, "of": 4},
        {"step": 1, "id": "b", "hops": 2, "right": 2, "of": 4},
        {"step": 2, "id": "c", "hops": 3, "right": 0, "of": 4},
        {"step": 2, "id": "d", "hops": 2, "right": 1, "of": 4},
        {"step": 3, "id": "e", "hops": 1, "right": 4, "of": 4},
        {"step": 3, "id": "f", "hops": 3, "right": 3, "of": 4},
        # seen again later: the last count stands (b leaves the frontier, c joins it)
        {"step": 4, "id": "b", "hops": 2, "right": 4, "of": 4},
        {"step": 4, "id": "c", "hops": 3, "right": 1, "of": 4},
    ]
    rows += [{"step": 5, "id": f"z{i}", "hops": 1 + i % 3, "right": 0 if i % 2 else 4, "of": 4} for i in range(10)]
    return _write(tmp_path / "groups.jsonl", rows)


def test_the_frontier_is_every_question_with_some_but_not_all_right_by_its_last_count(tmp_path):
    selection = select_frontier(_groups(tmp_path), replay_share=0.25, seed=0)
    assert selection.frontier == ["c", "d", "f"]
    # 3 frontier questions are 75% of the episode: one replayed question, drawn from the 13 others
    assert selection.replay == ["z3"]
    assert selection.summary() == {
        "frontier": 3,
        "replay": 1,
        "frontier_by_hops": {"2": 1, "3": 2},
        "replay_by_hops": {"1": 1},
    }
    assert select_frontier(_groups(tmp_path), replay_share=0.25, seed=1).replay == ["e"]
    assert select_frontier(_groups(tmp_path), replay_share=0.0, seed=0).replay == []


def test_the_replay_share_is_of_the_episode_and_capped_by_the_rest(tmp_path):
    half = select_frontier(_groups(tmp_path), replay_share=0.5, seed=0)
    assert len(half.replay) == 3 and set(half.replay) <= {"a", "b", "e"} | {f"z{i}" for i in range(10)}
    most = select_frontier(_groups(tmp_path), replay_share=0.9, seed=0)
    assert len(most.replay) == 13  # 27 wanted, 13 there
    assert most.ids() == set(read_groups(tmp_path / "groups.jsonl"))
    # topped up so the episode fills a generation batch
    assert len(select_frontier(_groups(tmp_path), replay_share=0.25, seed=0, minimum=6).replay) == 3


def test_a_bad_group_row_names_its_file_and_line(tmp_path):
    path = _write(
        tmp_path / "groups.jsonl",
        [{"step": 1, "id": "a", "hops": 1, "right": 1, "of": 2}, {"step": 1, "id": "b", "hops": 1}],
    )
    with pytest.raises(ValueError, match=r"groups.jsonl:2: not a group row \{id, hops, right, of\}"):
        select_frontier(path, 0.25, 0)


def test_rollouts_gathered_in_rank_order_make_one_row_per_group_even_across_ranks():
    # two ranks of three rollouts each, groups of two: the middle group lies on both ranks
    rank0 = [("q1", 1, 1.0), ("q1", 1, 0.0), ("q2", 3, 1.0)]
    rank1 = [("q2", 3, 1.0), ("q3", 2, 0.0), ("q3", 2, 0.0)]
    assert group_rows(rank0 + rank1, 2, step=7) == [
        {"step": 7, "id": "q1", "hops": 1, "right": 1, "of": 2},
        {"step": 7, "id": "q2", "hops": 3, "right": 2, "of": 2},
        {"step": 7, "id": "q3", "hops": 2, "right": 0, "of": 2},
    ]
    with pytest.raises(RuntimeError, match=r"a rollout group holds several questions: \['q1', 'q2'\]"):
        group_rows(rank0[:1] + rank0[2:] + rank0[1:2] + rank1, 2, step=1)


def test_group_log_drops_the_rows_after_a_resumed_step_and_all_on_a_fresh_start(tmp_path):
    path = _write(
        tmp_path / "groups.jsonl", [{"step": s, "id": f"q{s}", "hops": 1, "right": 0, "of": 2} for s in (1, 2, 3)]
    )
    log = GroupLog(path, 2)
    log.truncate_after(2)
    assert [json.loads(x)["step"] for x in path.read_text().splitlines()] == [1, 2]
    log.truncate_after(0)
    assert path.read_text() == ""


@pytest.mark.slow
def test_one_grpo_step_records_each_groups_right_answers_as_the_answer_reward_scored_them(warm_policy, tmp_path):
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.records.sampling import hop_count
    from kgreasoner.retrieval.tool import KGSearchTool
    from kgreasoner.rollout.types import RolloutConfig
    from kgreasoner.training.grpo import Episode, GRPORecipe, build_trainer

    model, data, tool_config = warm_policy
    recipe = GRPORecipe(
        model=str(model),
        dataset=str(data),
        run_dir=str(tmp_path / "run"),
        tool=tool_config,
        rollout=RolloutConfig(max_new_tokens=96, max_turn_tokens=48, max_turns=3),
        episodes=[Episode("all", max_steps=1)],
        trainer={
            "num_generations": 4,
            "per_device_train_batch_size": 32,
            "learning_rate": 1e-3,
            "report_to": [],
            "save_steps": 1,
            "beta": 0.0,
        },
    )
    dataset = load_dataset(str(data))
    tool = KGSearchTool(open_dataset_kg(dataset), tool_config)
    # 1-hop questions, which the warm policy answers right in some rollouts
    questions = [e for e in dataset.split("train") if hop_count(e) == 1][:8]
    trainer = build_trainer(recipe, 1, recipe.episodes[0], questions, str(model), tool)
    scored = []
    answer = trainer.reward_funcs[2]

    def keep(*args, **kwargs):  # the real answer reward; its verdicts are kept to compare
        rewards = answer(*args, **kwargs)
        scored.extend(zip(kwargs["id"], rewards))
        return rewards

    keep.__name__ = answer.__name__
    trainer.reward_funcs[2] = keep
    trainer.train()
    rows = [json.loads(x) for x in (tmp_path / "run" / "episode-1" / "groups.jsonl").read_text().splitlines()]
    expected = [
        {"step": 1, "id": scored[i][0], "hops": 1, "right": sum(r > 0 for _, r in scored[i : i + 4]), "of": 4}
        for i in range(0, 32, 4)
    ]
    assert len(scored) == 32 and rows == expected
    assert all(len({q for q, _ in scored[i : i + 4]}) == 1 for i in range(0, 32, 4))
    assert {r["id"] for r in rows} == {e.id for e in questions}
    assert any(r["right"] > 0 for r in rows), "the warm policy answered nothing: the check proves little"


@pytest.mark.slow
def test_a_frontier_episode_after_episode_one_and_the_best_dev_checkpoint_as_the_final_model(warm_policy, tmp_path):
    from safetensors.torch import load_file

    from kgreasoner.rollout.types import RolloutConfig
    from kgreasoner.training.checkpoint_choice import choose
    from kgreasoner.training.grpo import Episode, GRPORecipe, train_grpo
    from kgreasoner.training.grpo_recipe import DevEvaluation

    model, data, tool_config = warm_policy
    out = tmp_path / "run"
    recipe = GRPORecipe(
        model=str(model),
        dataset=str(data),
        run_dir=str(out),
        tool=tool_config,
        rollout=RolloutConfig(max_new_tokens=96, max_turn_tokens=48, max_turns=3),
        episodes=[Episode("all", max_steps=3), Episode("frontier", max_steps=2)],
        max_questions=24,
        dev_eval=DevEvaluation(steps=2, questions=12),
        frontier_replay=0.25,
        trainer={
            "num_generations": 4,
            "per_device_train_batch_size": 16,
            "learning_rate": 1e-3,
            "report_to": [],
            "save_steps": 2,
            "save_total_limit": 1,
            "beta": 0.0,
        },
    )
    final = train_grpo(recipe)
    groups = read_groups(out / "episode-1" / "groups.jsonl")
    assert len(groups) == 12  # 3 steps of 4 questions, each once
    # 4 questions a step: the frontier topped up with replay to at least that
    selection = select_frontier(out / "episode-1" / "groups.jsonl", 0.25, 0, minimum=4)
    assert len(selection.ids()) >= 4
    assert selection.frontier, "episode 1 left no question on the frontier"
    summary = json.loads((out / "episode-2" / "frontier.json").read_text())
    assert summary == selection.summary()
    trained = {json.loads(x)["id"] for x in (out / "episode-2" / "groups.jsonl").read_text().splitlines()}
    assert trained <= selection.ids() and trained & set(selection.frontier)

    steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
    # dev Hits@1 every 2 steps and at every save, which includes each episode's last step
    assert [(r["episode"], r["step"], "checkpoint" in r) for r in steps if "dev/hits1" in r] == [
        (1, 0, False),
        (1, 2, True),
        (1, 3, True),
        (2, 0, False),
        (2, 2, True),
    ]
    chosen = json.loads((out / "chosen.json").read_text())
    best = choose(steps)
    assert (chosen["episode"], chosen["step"]) == (best["episode"], best["step"])
    assert chosen["dev_hits1"] == best["dev_split/hits1"]
    source = {
        (1, 0): Path(model),
        (1, 3): out / "episode-1" / "final",
        (2, 2): out / "episode-2" / "checkpoint-2",
        (1, 2): out / "best",
    }[(chosen["episode"], chosen["step"])]
    weights, kept = load_file(final / "model.safetensors"), load_file(source / "model.safetensors")
    assert final == out / "episode-2" / "final" and all((weights[k] == kept[k]).all() for k in weights)


def test_an_episode_with_fewer_questions_than_a_generation_batch_is_refused(tiny_checkpoint, synthetic_dir, tmp_path):
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
    from kgreasoner.training.grpo import Episode, GRPORecipe, build_trainer

    recipe = GRPORecipe(
        model=str(tiny_checkpoint),
        dataset=str(synthetic_dir),
        run_dir=str(tmp_path / "run"),
        episodes=[Episode("all"), Episode("frontier")],
        trainer={"num_generations": 4, "per_device_train_batch_size": 16, "report_to": []},
    )
    dataset = load_dataset(str(synthetic_dir))
    tool = KGSearchTool(open_dataset_kg(dataset), ToolConfig())
    with pytest.raises(ValueError, match="episode 2: 3 questions, fewer than the 4 one generation batch takes"):
        build_trainer(recipe, 2, recipe.episodes[1], dataset.split("train")[:3], str(tiny_checkpoint), tool)
