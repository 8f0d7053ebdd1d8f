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
from kgreasoner.training.grpo import Episode, GRPORecipe
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
    assert whole.figures == {"rollout/guided": 1 / 3, "rollout/answer_tied": 2 / 3,
                             "rollout/guided_hop1": 0.0, "rollout/answer_tied_hop1": 0.0,
                             "rollout/guided_hop2": 1.0, "rollout/answer_tied_hop2": 1.0,
                             "rollout/guided_hop3": 0.0, "rollout/answer_tied_hop3": 1.0}
    assert plan(rank0 + rank1, 4, guide=False).guided == ()
    all_right = plan([_v(True, 1)] * 4, 4, guide=True)
    assert all_right.guided == () and all_right.figures["rollout/answer_tied"] == 1.0


def test_rows_that_are_not_whole_groups_are_refused():
    with pytest.raises(ValueError, match="5 rows do not make whole groups of 4"):
        plan([_v(False, 1)] * 5, 4, guide=True)


# ----------------------------------------------------------------- recipe options


def test_guidance_options_are_checked_with_what_to_do():
    base = ["model=m", "dataset=d", "output_dir=o"]
    with pytest.raises(ConfigError, match="guidance must be one of \\('none', 'gold'\\), got 'expert'"):
        load_config(GRPORecipe, None, [*base, "guidance=expert"])
    with pytest.raises(ConfigError, match="guidance: gold needs the gold trajectories: set guidance_trajectories"):
        load_config(GRPORecipe, None, [*base, "guidance=gold"])
    assert load_config(GRPORecipe, None, base).guidance == "none"  # off unless an ablation shows it earns its place
    hard = load_config(GRPORecipe, None, [*base, "guidance=gold", "hard_case_trajectories=w.jsonl"])
    assert hard.gold_trajectories == "w.jsonl"
    own = load_config(GRPORecipe, None, [*base, "guidance=gold", "hard_case_trajectories=w.jsonl",
                                         "guidance_trajectories=g.jsonl"])
    assert own.gold_trajectories == "g.jsonl"


def test_a_missing_trajectory_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=f"guidance_trajectories: {tmp_path / 'none.jsonl'} is not a file"):
        GoldTrajectories(tmp_path / "none.jsonl")


@pytest.mark.parametrize("path", ["configs/demo/quick.yaml", "configs/demo/full.yaml"])
def test_the_demo_trains_with_guided_groups_from_every_training_questions_trajectory(path, tmp_path):
    from kgreasoner.demo import Demo, DemoConfig

    demo = Demo(load_config(DemoConfig, ROOT / path), tmp_path / "out")
    recipe = demo.grpo[0]
    assert recipe.guidance == "gold"
    assert recipe.gold_trajectories == demo.warmup_all_file == str(tmp_path / "out" / "warmup" / "all.jsonl")


# ----------------------------------------------------------------- the gold row


@pytest.fixture(scope="module")
def warmup_file(synthetic_dir, tmp_path_factory) -> Path:
    from data_gen.warmup import WarmupConfig, run

    path = tmp_path_factory.mktemp("guidance") / "all.jsonl"
    run(WarmupConfig(dataset=str(synthetic_dir), output=str(path), num_examples=None, dev_examples=0, tool=TOOL,
                     progress=False))
    return path


def _tool(dataset_dir):
    from kgreasoner.data import load_dataset, open_dataset_kg
    from kgreasoner.retrieval.tool import KGSearchTool

    dataset = load_dataset(str(dataset_dir), scheme="grouped", seed=0)
    return dataset, KGSearchTool(open_dataset_kg(dataset), TOOL)


def _tokenizer(name: str, tiny_checkpoint):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(QWEN3 if name == "qwen3" else tiny_checkpoint))


@pytest.mark.parametrize("name", ["qwen3", "tiny"])
def test_the_gold_row_trl_gets_is_the_record_as_sft_tokenises_it(name, tiny_checkpoint, synthetic_dir, warmup_file):
    from kgreasoner.data.trajectories import read_warmup
    from kgreasoner.protocol import build_prompt, format_tool_block
    from kgreasoner.rewards import answer_reward, format_reward
    from kgreasoner.training.warmup_data import encode_record

    tokenizer = _tokenizer(name, tiny_checkpoint)
    dataset, tool = _tool(synthetic_dir)
    examples = {e.id: e for e in dataset.split("train")}
    gold = GoldTrajectories(warmup_file)
    # a multi-hop question: several tool blocks between model-written turns
    record = next(r for r in read_warmup(warmup_file)
                  if r.id in examples and r.kind == "gold" and sum(not s.train for s in r.segments) >= 2)
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
        assert [text[a:b].split() for a, b in out["tool_spans"][0]] == [format_tool_block(t).split() for t in
                                                                        [c.text for c in row.tool_calls]]
    assert out["num_searches"] == [len(blocks)] and out["finish_reason"] == ["answer"]
    assert [c.num_tokens for c in row.tool_calls] == [len(tokenizer(b, add_special_tokens=False)["input_ids"])
                                                      for b in blocks]
    kwargs = {k: out[k] for k in ("completion_text", "tool_spans", "resolved_answers")}
    assert answer_reward(out["completion_text"], answers=[example.answers], **kwargs) == [1.0]
    assert format_reward(out["completion_text"], **kwargs) == [0.5]


# ----------------------------------------------------------------- a real GRPO step of the demo's recipe


@pytest.mark.slow
def test_a_group_the_model_cannot_answer_trains_on_its_gold_row(tiny_checkpoint, synthetic_dir, warmup_file,
                                                               tmp_path):
    """The demo's recipe (guidance on) with the untrained tiny model, which answers nothing: every group of the
    step is guided, and the ids TRL scores the loss on hold each group's gold row, exactly, with a positive
    advantage. Switching guided groups off in the demo's recipe fails this test."""
    from kgreasoner.demo import Demo, DemoConfig
    from kgreasoner.protocol import build_prompt
    from kgreasoner.training.grpo import build_trainer
    from kgreasoner.training.warmup_data import encode_record

    demo = Demo(load_config(DemoConfig, ROOT / "configs/demo/quick.yaml"), tmp_path / "demo").grpo[0]
    recipe = GRPORecipe(model=str(tiny_checkpoint), dataset=str(synthetic_dir), output_dir=str(tmp_path / "run"),
                        tool=TOOL, rollout=RolloutConfig(max_new_tokens=24, max_turn_tokens=12, max_turns=2),
                        episodes=[Episode("all", max_steps=1)], num_generations=demo.num_generations,
                        per_device_train_batch_size=2 * demo.num_generations, learning_rate=1e-3, report_to=[],
                        beta=0.0, search_reward=demo.search_reward, guidance=demo.guidance,
                        guidance_trajectories=str(warmup_file))
    dataset, tool = _tool(synthetic_dir)
    gold = GoldTrajectories(warmup_file)
    examples = [e for e in dataset.split("train") if e.id in gold][:4]
    trainer = build_trainer(recipe, 1, recipe.episodes[0], examples, str(tiny_checkpoint), tool)
    trained = []
    compute_loss = trainer._compute_loss

    def recording(model, inputs):
        trained.append({k: v.detach().clone() for k, v in inputs.items() if hasattr(v, "detach")})
        return compute_loss(model, inputs)

    with mock.patch.object(trainer, "_compute_loss", recording):
        trainer.train()
    logged = trainer.state.log_history[0]
    assert logged["rollout/guided"] == 1.0 and logged["rollout/answer_tied"] == 1.0
    assert logged["rewards/answer_reward/mean"] == pytest.approx(1 / demo.num_generations)
    [batch] = trained
    by_question = {build_prompt(e.question, list(e.topic_entities), trainer.processing_class): e for e in examples}
    rows = []
    for i in range(batch["completion_ids"].size(0)):
        prompt = batch["prompt_ids"][i][batch["prompt_mask"][i].bool()].tolist()
        completion = batch["completion_ids"][i][batch["completion_mask"][i].bool()].tolist()
        mask = batch["tool_mask"][i][batch["completion_mask"][i].bool()].tolist()
        rows.append((prompt, completion, mask, float(batch["advantages"][i])))
    golds = []
    for question, example in by_question.items():
        encoded = encode_record(gold.records[example.id], trainer.processing_class)
        golds.append((encoded["input_ids"], encoded["assistant_masks"]))
    guided = [(p + c, [0] * len(p) + m) for p, c, m, _ in rows if (p + c, [0] * len(p) + m) in golds]
    assert len(guided) == len(rows) // demo.num_generations  # one gold row a group
    assert all(a > 0 for p, c, m, a in rows if (p + c, [0] * len(p) + m) in golds)


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
