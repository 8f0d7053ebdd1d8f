"""Guided groups: the plan over whole groups (split across ranks), the gold row exactly as SFT tokenises its
record (the real Qwen3 tokenizer and the tiny one), and a real GRPO step of the demo's recipe training on it."""

from __future__ import annotations

import math
from pathlib import Path
from unittest import mock

import pytest

from kgreasoner.config import ConfigError, load_config
from kgreasoner.retrieval.tool import ToolConfig
from kgreasoner.rollout.types import RolloutConfig, trl_rollout_output
from kgreasoner.training.grpo_recipe import Episode, GRPORecipe, Guidance, Rewards
from kgreasoner.training.guidance import GoldTrajectories, RowVerdict, held, plan

ROOT = Path(__file__).resolve().parents[2]
QWEN3 = Path("/work/shared/models/qwen3")
TOOL = ToolConfig(entity_handles=True, top_k=5)


def _v(correct: bool, hops: int, has_gold: bool = True) -> RowVerdict:
    return RowVerdict(correct, hops, has_gold)


# ----------------------------------------------------------------- the plan


def test_each_all_wrong_group_loses_its_last_row_once_even_when_it_spans_two_ranks():
    # three groups of four over two ranks of six rows: group 2 (rows 4-7) is rows 4, 5 of rank 0 and 0, 1 of rank 1
    rank0 = [_v(True, 1), _v(False, 1), _v(False, 1), _v(False, 1), _v(False, 2), _v(False, 2)]
    rank1 = [_v(False, 2), _v(False, 2), _v(False, 3), _v(False, 3), _v(False, 3), _v(False, 3, has_gold=False)]
    whole = plan(rank0 + rank1, num_generations=4, guide=True)
    assert whole.guided == (7,)  # group 1 has a right answer; group 3's question has no gold trajectory
    assert held(whole.guided, 0, 6) == [] and held(whole.guided, 6, 6) == [1]
    assert whole.figures == {
        "rollout/guided": 1 / 3,
        "rollout/answer_tied": 2 / 3,
        "rollout/guided_hop1": 0.0,
        "rollout/answer_tied_hop1": 0.0,
        "rollout/guided_hop2": 1.0,
        "rollout/answer_tied_hop2": 1.0,
        "rollout/guided_hop3": 0.0,
        "rollout/answer_tied_hop3": 1.0,
    }
    assert plan(rank0 + rank1, 4, guide=False).guided == ()
    all_right = plan([_v(True, 1)] * 4, 4, guide=True)
    assert all_right.guided == () and all_right.figures["rollout/answer_tied"] == 1.0


def test_rows_that_are_not_whole_groups_are_refused():
    with pytest.raises(ValueError, match="5 rows do not make whole groups of 4"):
        plan([_v(False, 1)] * 5, 4, guide=True)


# ----------------------------------------------------------------- recipe options


def test_guidance_options_are_checked_with_what_to_do():
    base = ["model=m", "dataset=d", "run_dir=o"]
    with pytest.raises(
        ConfigError, match="guidance.mode must be one of \\('none', 'gold', 'gold_prefix'\\), got 'expert'"
    ):
        load_config(GRPORecipe, None, [*base, "guidance.mode=expert"])
    for mode in ("gold", "gold_prefix"):
        with pytest.raises(ConfigError, match=f"guidance.mode: {mode} needs the gold trajectories: set guidance.traj"):
            load_config(GRPORecipe, None, [*base, f"guidance.mode={mode}"])
    assert (
        load_config(GRPORecipe, None, base).guidance.mode == "none"
    )  # off unless an ablation shows it earns its place
    chosen = load_config(GRPORecipe, None, [*base, "guidance.mode=gold", "guidance.trajectories=g.jsonl"])
    assert chosen.guidance.mode == "gold"


def test_gold_advantage_is_a_finite_number_at_least_zero():
    base = ["model=m", "dataset=d", "run_dir=o"]
    assert load_config(GRPORecipe, None, base).guidance.gold_advantage == 1.0
    for bad in ("-0.5", ".inf"):
        with pytest.raises(ConfigError, match="guidance.gold_advantage must be a finite number >= 0, got"):
            load_config(GRPORecipe, None, [*base, f"guidance.gold_advantage={bad}"])


def test_a_missing_trajectory_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=f"guidance.trajectories: {tmp_path / 'none.jsonl'} is not a file"):
        GoldTrajectories(tmp_path / "none.jsonl")


@pytest.mark.parametrize("path", ["configs/demo/quick.yaml", "configs/demo/full.yaml"])
def test_the_demo_trains_with_guided_groups_from_every_training_questions_trajectory(path, tmp_path):
    from kgreasoner.demo import Demo, DemoConfig

    demo = Demo(load_config(DemoConfig, ROOT / path), tmp_path / "out")
    recipe = demo.grpo.config
    assert recipe.guidance.mode == "gold"
    assert recipe.guidance.trajectories == demo.warmup_all_file == str(tmp_path / "out" / "warmup" / "all.jsonl")


# ----------------------------------------------------------------- the gold row


@pytest.fixture(scope="module")
def warmup_file(synthetic_dir, tmp_path_factory) -> Path:
    from data_gen.warmup import WarmupConfig, run

    path = tmp_path_factory.mktemp("guidance") / "all.jsonl"
    run(
        WarmupConfig(
            dataset=str(synthetic_dir), output=str(path), num_examples=None, dev_examples=0, tool=TOOL, progress=False
        )
    )
    return path


def _tool(dataset_dir):
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.retrieval.tool import KGSearchTool

    dataset = load_dataset(str(dataset_dir), split_scheme="grouped", seed=0)
    return dataset, KGSearchTool(open_dataset_kg(dataset), TOOL)


def _tokenizer(name: str, tiny_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(QWEN3 if name == "qwen3" else tiny_checkpoint))


@pytest.mark.parametrize("name", ["qwen3", "tiny"])
def test_the_gold_row_trl_gets_is_the_record_as_sft_tokenises_it(name, tiny_checkpoint, synthetic_dir, warmup_file):
    from kgreasoner.protocol import build_prompt, format_tool_block
    from kgreasoner.records.trajectories import read_warmup
    from kgreasoner.rewards import answer_reward, format_reward
    from kgreasoner.training.warmup_data import encode_record

    tokenizer = _tokenizer(name, tiny_checkpoint)
    dataset, tool = _tool(synthetic_dir)
    examples = {e.id: e for e in dataset.split("train")}
    gold = GoldTrajectories(warmup_file)
    # a multi-hop question: several tool blocks between model-written turns
    record = next(
        r
        for r in read_warmup(warmup_file)
        if r.id in examples and r.kind == "gold" and sum(not s.train for s in r.segments) >= 2
    )
    assert gold.records[record.id] == record
    example = examples[record.id]
    prompt = build_prompt(example.question, list(example.topic_entities), tokenizer)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    row = gold.row(example, prompt_ids, tokenizer, tool.session(example.question, list(example.topic_entities)))
    out = trl_rollout_output([row], tokenizer.eos_token_id)
    encoded = encode_record(record, tokenizer)
    assert prompt_ids + out["completion_ids"][0] == encoded["input_ids"]
    assert [0] * len(prompt_ids) + out["env_mask"][0] == encoded["assistant_masks"]
    assert out["prompt_ids"][0] == prompt_ids
    logprobs = out["logprobs"][0]  # NaN: TRL's unscored sampling logprob, importance ratio 1
    assert [math.isnan(p) for p in logprobs] == [bool(m) for m in out["env_mask"][0]]
    assert all(p == 0.0 for p, m in zip(logprobs, out["env_mask"][0]) if not m)
    blocks = [s.text for s in record.segments if not s.train]
    text = out["completion_text"][0]
    if name == "qwen3":  # byte-level BPE decodes back to the text itself
        assert [text[a:b] for a, b in out["tool_spans"][0]] == blocks
        assert text.endswith(record.completion)
    else:
        assert [text[a:b].split() for a, b in out["tool_spans"][0]] == [
            format_tool_block(t).split() for t in [c.text for c in row.tool_calls]
        ]
    assert out["num_searches"] == [len(blocks)] and out["finish_reason"] == ["answer"]
    assert [c.num_tokens for c in row.tool_calls] == [
        len(tokenizer(b, add_special_tokens=False)["input_ids"]) for b in blocks
    ]
    kwargs = {k: out[k] for k in ("completion_text", "tool_spans", "resolved_answers")}
    assert answer_reward(out["completion_text"], answers=[example.answers], **kwargs) == [1.0]
    assert format_reward(out["completion_text"], **kwargs) == [0.5]


# ----------------------------------------------------------------- the gold prefix


def _model(name: str, tokenizer, tiny_checkpoint):
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    if name != "qwen3":
        return AutoModelForCausalLM.from_pretrained(str(tiny_checkpoint))
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return Qwen3ForCausalLM(config).eval()


def _gold_record(gold, examples, hops: int):
    from kgreasoner.records.sampling import hop_count

    return next(
        r
        for r in gold.records.values()
        if r.id in examples
        and r.kind == "gold"
        and hop_count(examples[r.id]) == hops
        and sum(not s.train for s in r.segments) >= hops
    )


@pytest.mark.parametrize("name", ["qwen3", "tiny"])
def test_a_gold_prefix_row_starts_with_the_records_first_h_minus_1_turns_as_sft_tokenises_them(
    name, tiny_checkpoint, synthetic_dir, warmup_file
):
    """The engine given a question's gold prefix writes exactly the record's first h - 1 search turns and
    tool blocks (the ids `encode_record` gives those segments; env_mask 0), its searches replayed, and
    samples on from there."""
    import dataclasses

    from kgreasoner.protocol import build_prompt, format_tool_block
    from kgreasoner.rollout import RolloutEngine, SamplingParams
    from kgreasoner.rollout.hf_backend import HFBackend
    from kgreasoner.training.warmup_data import encode_record

    tokenizer = _tokenizer(name, tiny_checkpoint)
    model = _model(name, tokenizer, tiny_checkpoint)
    dataset, tool = _tool(synthetic_dir)
    examples = {e.id: e for e in dataset.split("train")}
    gold = GoldTrajectories(warmup_file)
    for hops in (2, 3):
        record = _gold_record(gold, examples, hops)
        example = examples[record.id]
        prompt = build_prompt(example.question, list(example.topic_entities), tokenizer)
        turns = gold.prefix(record.id, hops, prompt, most=8)
        assert len(turns) == hops - 1 and turns == [s.text for s in record.segments[: 2 * (hops - 1) : 2]]
        text_tokens = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in turns)
        config = RolloutConfig(max_new_tokens=text_tokens + 3, max_turn_tokens=3, max_tool_tokens=4096)
        engine = RolloutEngine(HFBackend(model, tokenizer), None, config)
        [row] = engine.run(
            [prompt],
            [tool.session(example.question, list(example.topic_entities))],
            SamplingParams(seed=0),
            prefixes=[turns],
        )
        head = dataclasses.replace(record, segments=record.segments[: 2 * (hops - 1)])
        expected = encode_record(head, tokenizer)["input_ids"][:-1]  # without the end-of-turn id
        assert row.prompt_ids + row.completion_ids[: row.prefix_tokens] == expected
        assert row.env_mask[: row.prefix_tokens] == [0] * row.prefix_tokens
        assert [format_tool_block(c.text) for c in row.tool_calls[: hops - 1]] == [
            s.text for s in record.segments[1 : 2 * (hops - 1) : 2]
        ]  # the session's blocks are the record's
        assert all(c.error is None for c in row.tool_calls[: hops - 1])
        assert 1 <= sum(row.env_mask) <= 3 and row.env_mask[row.prefix_tokens] == 1  # then the model samples

    one_hop = _gold_record(gold, examples, 1)
    assert gold.prefix(one_hop.id, 1, "", most=8) == []  # a 1-hop question has no gold prefix: not guided
    three = _gold_record(gold, examples, 3)
    assert len(gold.prefix(three.id, 3, "", most=1)) == 1  # at most max_turns turns
    searches = sum(not s.train for s in three.segments)
    assert len(gold.prefix(three.id, 99, "", most=99)) == searches - 1  # the model always makes a search
    assert gold.prefix("no such question", 3, "", most=8) == []


# ----------------------------------------------------------------- a real GRPO step of the demo's recipe


@pytest.mark.slow
def test_a_group_the_model_cannot_answer_trains_on_its_gold_row(tiny_checkpoint, synthetic_dir, warmup_file, tmp_path):
    """The demo's recipe (guidance on) with the untrained tiny model, which answers nothing: every group of the
    step is guided, and the ids TRL scores the loss on hold each group's gold row, exactly, with the recipe's
    gold_advantage as its advantage. The logged answer reward is the policy's own (0), the gold rows' apart.
    Switching guided groups off in the demo's recipe fails this test."""
    from kgreasoner.demo import Demo, DemoConfig
    from kgreasoner.protocol import build_prompt
    from kgreasoner.training.grpo import build_trainer
    from kgreasoner.training.warmup_data import encode_record

    demo = Demo(load_config(DemoConfig, ROOT / "configs/demo/quick.yaml"), tmp_path / "demo").grpo.config
    group = demo.setting("num_generations")
    recipe = GRPORecipe(
        model=str(tiny_checkpoint),
        dataset=str(synthetic_dir),
        run_dir=str(tmp_path / "run"),
        tool=TOOL,
        rollout=RolloutConfig(max_new_tokens=24, max_turn_tokens=12, max_turns=2),
        episodes=[Episode("all", max_steps=1)],
        rewards=demo.rewards,
        # gold_advantage not the default: the row's advantage is this setting, whatever the group
        guidance=Guidance(demo.guidance.mode, str(warmup_file), gold_advantage=0.75),
        trainer={
            "num_generations": group,
            "per_device_train_batch_size": 2 * group,
            "learning_rate": 1e-3,
            "report_to": [],
            "beta": 0.0,
        },
    )
    dataset, tool = _tool(synthetic_dir)
    gold = GoldTrajectories(warmup_file)
    examples = [e for e in dataset.split("train") if e.id in gold][:4]
    trainer = build_trainer(recipe, 1, recipe.episodes[0], examples, str(tiny_checkpoint), tool)
    trained = _train_recording(trainer)
    logged = trainer.state.log_history[0]
    assert logged["rollout/guided"] == 1.0 and logged["rollout/answer_tied"] == 1.0
    assert logged["rewards/answer_reward/mean"] == 0.0  # the policy's rows: none answers
    assert logged["guidance/gold_rows"] == 2 and logged["guidance/gold_answer_reward"] == 1.0  # the step's 2 groups
    [batch] = trained
    by_question = {build_prompt(e.question, list(e.topic_entities), trainer.processing_class): e for e in examples}
    rows = []
    for i in range(batch["completion_ids"].size(0)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        completion = batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist()
        mask = batch["tool_mask"][i][batch["completion_mask"][i].bool()].tolist()
        rows.append((prompt, completion, mask, float(batch["advantages"][i])))
    golds = []
    for example in by_question.values():
        encoded = encode_record(gold.records[example.id], trainer.processing_class)
        golds.append((encoded["input_ids"], encoded["assistant_masks"]))
    guided = [(p + c, [0] * len(p) + m) for p, c, m, _ in rows if (p + c, [0] * len(p) + m) in golds]
    assert len(guided) == len(rows) // group  # one gold row a group
    assert [a for p, c, m, a in rows if (p + c, [0] * len(p) + m) in golds] == [0.75] * len(guided)


@pytest.mark.slow
def test_gold_rows_train_with_gold_advantage_and_the_policys_rows_with_trls_advantages_over_their_own(
    warm_policy, warm_policy_records, tmp_path
):
    """A real GRPO step from the warm policy on 1- and 3-hop questions, so some groups hold a right answer and
    others are guided. Each row's rewards are recomputed here from the columns TRL gave the reward functions:
    a gold row's advantage is gold_advantage exactly; a policy row's is TRL's group advantage over the policy's
    rows of its group, (r - mean) / (std + 1e-4) with Bessel's std; the logged reward figures are the policy
    rows' means and the gold rows' are logged apart."""
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.records.sampling import hop_count
    from kgreasoner.retrieval.tool import KGSearchTool
    from kgreasoner.rewards import reward_functions
    from kgreasoner.training.grpo import build_trainer

    model, data, tool_config = warm_policy
    warmup = warm_policy_records
    group = 8
    recipe = GRPORecipe(
        model=str(model),
        dataset=str(data),
        run_dir=str(tmp_path / "run"),
        tool=tool_config,
        rollout=RolloutConfig(max_new_tokens=96, max_turn_tokens=48, max_turns=3),
        episodes=[Episode("all", max_steps=1)],
        rewards=Rewards(search_form="hops"),
        guidance=Guidance("gold", str(warmup), gold_advantage=1.25),
        trainer={
            "num_generations": group,
            "per_device_train_batch_size": 4 * group,
            "learning_rate": 1e-4,
            "report_to": [],
            "beta": 0.0,
        },
    )
    dataset = load_dataset(str(data), split_scheme=recipe.split_scheme, seed=recipe.split_seed)
    tool = KGSearchTool(open_dataset_kg(dataset), tool_config)
    gold = GoldTrajectories(warmup)
    train = [e for e in dataset.split("train") if e.id in gold]
    examples = [e for e in train if hop_count(e) == 1][:2] + [e for e in train if hop_count(e) == 3][:2]
    trainer = build_trainer(recipe, 1, recipe.episodes[0], examples, str(model), tool)
    scored = []
    generate = trainer._generate_and_score_completions

    def recording(inputs):
        output = generate(inputs)  # TRL merges the rollout's columns into `inputs` for the reward functions
        scored.append((inputs, output["advantages"].tolist()))
        return output

    with mock.patch.object(trainer, "_generate_and_score_completions", recording):
        trainer.train()
    [(rows, advantages)] = scored
    columns = {key: [row[key] for row in rows] for key in rows[0] if key != "prompt"}
    rewards = {f.__name__: f(columns["completion_text"], **columns) for f in reward_functions("hops")}
    total = [sum(parts) for parts in zip(*rewards.values())]  # the recipe's reward weights are all 1
    guided = columns["guided"]
    expected = []
    for start in range(0, len(rows), group):
        own = [total[i] for i in range(start, start + group) if not guided[i]]
        mean = sum(own) / len(own)
        std = math.sqrt(sum((r - mean) ** 2 for r in own) / (len(own) - 1))
        for i in range(start, start + group):
            expected.append(1.25 * rewards["answer_reward"][i] if guided[i] else (total[i] - mean) / (std + 1e-4))
    assert advantages == pytest.approx(expected, abs=2e-3)  # float32 group means against float64 ones
    assert any(guided) and any(a != 0 for a, g in zip(advantages, guided) if not g), (
        "the step needs guided groups and policy rows with a reward signal"
    )
    assert [a for a, g in zip(advantages, guided) if g] == [1.25] * sum(guided)

    [logged] = [row for row in trainer.state.log_history if "guidance/gold_rows" in row]
    policy = [i for i, g in enumerate(guided) if not g]
    assert logged["guidance/gold_rows"] == sum(guided)
    for name, values in rewards.items():
        assert logged[f"rewards/{name}/mean"] == pytest.approx(sum(values[i] for i in policy) / len(policy))
        assert logged[f"guidance/gold_{name}"] == pytest.approx(
            sum(v for v, g in zip(values, guided) if g) / sum(guided)
        )
    assert logged["reward"] == pytest.approx(sum(total[i] for i in policy) / len(policy))
    # the completions table (TRL's `log_completions`) shows every row's own rewards and advantage
    for name, values in rewards.items():
        assert list(trainer._logs["rewards"][name]) == pytest.approx(values)
    assert list(trainer._logs["advantages"]) == pytest.approx(advantages)


@pytest.mark.slow
def test_a_group_the_model_cannot_answer_trains_on_a_rollout_after_its_gold_prefix(
    tiny_checkpoint, synthetic_dir, warmup_file, tmp_path
):
    """`guidance.mode: gold_prefix` with the untrained tiny model, which answers nothing: the 3-hop group's last row is
    rolled out again after its gold record's first two search turns, and TRL trains on it with tool_mask 0 on
    those turns and their blocks and 1 on what the model sampled after them. The 1-hop group is not guided."""
    import dataclasses

    from kgreasoner.protocol import build_prompt
    from kgreasoner.training.grpo import build_trainer
    from kgreasoner.training.warmup_data import encode_record

    generations = 4
    recipe = GRPORecipe(
        model=str(tiny_checkpoint),
        dataset=str(synthetic_dir),
        run_dir=str(tmp_path / "run"),
        tool=TOOL,
        rollout=RolloutConfig(max_new_tokens=256, max_turn_tokens=8, max_turns=4, max_tool_tokens=4096),
        episodes=[Episode("all", max_steps=1)],
        guidance=Guidance("gold_prefix", str(warmup_file)),
        trainer={
            "num_generations": generations,
            "per_device_train_batch_size": 2 * generations,
            "learning_rate": 1e-3,
            "report_to": [],
            "beta": 0.0,
        },
    )
    dataset, tool = _tool(synthetic_dir)
    gold = GoldTrajectories(warmup_file)
    train = {e.id: e for e in dataset.split("train")}
    examples = [train[_gold_record(gold, train, hops).id] for hops in (1, 3)]
    trainer = build_trainer(recipe, 1, recipe.episodes[0], examples, str(tiny_checkpoint), tool)
    trained = _train_recording(trainer)
    logged = trainer.state.log_history[0]
    assert logged["rollout/guided"] == 0.5
    assert logged["rollout/guided_hop1"] == 0.0 and logged["rollout/guided_hop3"] == 1.0
    assert logged["rollout/prefix_correct"] == 0.0  # its last hop is still the untrained model's
    [batch] = trained
    rows = []
    for i in range(batch["completion_ids"].size(0)):
        keep = batch["completion_mask"][i].bool()
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        rows.append((prompt, batch["completion_ids"][i][keep].tolist(), batch["tool_mask"][i][keep].tolist()))
    three = examples[1]
    record = gold.records[three.id]
    tokenizer = trainer.processing_class
    prompt = build_prompt(three.question, list(three.topic_entities), tokenizer)
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    head = encode_record(dataclasses.replace(record, segments=record.segments[:4]), tokenizer)
    prefix = head["input_ids"][len(prompt_ids) : -1]  # two search turns and their tool blocks
    assert sum(not m for m in head["assistant_masks"][len(prompt_ids) : -1]) > 0
    prefixed = [(c, m) for p, c, m in rows if p == prompt_ids and c[: len(prefix)] == prefix]
    assert len(prefixed) == 1  # one row of the 3-hop group, none of the 1-hop group
    [(completion, mask)] = prefixed
    assert (
        mask[: len(prefix)] == [0] * len(prefix) and mask[len(prefix)] == 1
    )  # no loss on the prefix; the model's own
    assert all(c[: len(prefix)] != prefix for p, c, _ in rows if p != prompt_ids)


# ----------------------------------------------------------------- the curves


def test_the_curves_draw_tied_groups_by_hops_beside_the_guided_share(tmp_path):
    import json
    import re

    from kgreasoner.training.plots import PANELS, _short, plot_runs

    keys = ["rollout/answer_tied", "rollout/answer_tied_hop1", "rollout/answer_tied_hop3", "rollout/guided"]
    [(title, pattern, _)] = [panel for panel in PANELS if re.fullmatch(panel[1], "rollout/answer_tied")]
    assert title == "groups with one answer reward, by hops; guided"
    assert all(re.fullmatch(pattern, key) for key in keys) and not re.fullmatch(pattern, "rollout/guided_hop1")
    assert [_short(key) for key in keys] == ["all", "hop1", "hop3", "guided"]
    rows = [{"episode": 1, "step": step, "loss": 0.1, **{key: step / 4 for key in keys}} for step in (1, 2, 3)]
    (tmp_path / "steps.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    assert plot_runs([tmp_path], tmp_path / "curves.png").stat().st_size > 10_000


def _train_recording(trainer) -> list[dict]:
    """Train, and return the tensors of every batch the loss was computed on (what TRL trained on)."""
    trained = []
    compute_loss = trainer._compute_loss

    def recording(model, inputs):
        trained.append({k: v.detach().clone() for k, v in inputs.items() if hasattr(v, "detach")})
        return compute_loss(model, inputs)

    with mock.patch.object(trainer, "_compute_loss", recording):
        trainer.train()
    return trained
