"""Warm-up records, SFT masks, stops and format checks with the released tokenizers and templates."""

from __future__ import annotations

import pytest
from rollout.conftest import ScriptedLogits, ScriptedSession

from kgreasoner.protocol import build_prompt, check_format, format_tool_block, parse_trajectory
from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams
from kgreasoner.rollout.hf_backend import HFBackend
from kgreasoner.training.warmup_data import encode_record, end_of_turn_id

from .conftest import END_OF_TURN, QWEN3_THINK, QWEN3_THINK_END, tokenizer_of, warmup_records

# Random-weight models of the real architectures through whole stages: `make test` runs them,
# `make test-fast` does not.
pytestmark = pytest.mark.slow

TABLE = {"Utah": ["(Utah, time zone, Mountain Time Zone)"]}
TURNS = [
    "<think> I search Utah. <search>Utah</search>",
    "So it is Mountain Time Zone. </think>\n<answer>Mountain Time Zone</answer>",
]
BLOCK = format_tool_block(TABLE["Utah"][0])


def _ids(tokenizer, text):
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def thinking_template(tokenizer) -> str:
    """Qwen3's template with the generation prompt of the 2507 Thinking models: `assistant\\n<think>\\n`."""
    old = "{{- '<|im_start|>assistant\\n' }}"
    assert tokenizer.chat_template.count(old) == 1
    return tokenizer.chat_template.replace(old, "{{- '<|im_start|>assistant\\n<think>\\n' }}")


def test_records_are_the_template_prompt_then_the_trajectory_then_the_end_of_turn(arch, world):
    tokenizer = tokenizer_of(arch)
    token, token_id = END_OF_TURN[arch]
    assert end_of_turn_id(tokenizer) == token_id == tokenizer.convert_tokens_to_ids(token)
    record = warmup_records(world)[0]
    encoded = encode_record(record, tokenizer)
    prompt = _ids(tokenizer, build_prompt(record.question, list(record.topic_entities), tokenizer))
    think, tool, answer = (_ids(tokenizer, s.text) for s in record.segments)
    assert encoded["input_ids"] == prompt + think + tool + answer + [token_id]
    # loss on the model's spans and its end of turn; the prompt and the tool's block masked
    assert encoded["assistant_masks"] == [0] * len(prompt) + [1] * len(think) + [0] * len(tool) + [1] * len(answer) + [
        1
    ]
    if arch == "qwen3":
        assert think[0] == QWEN3_THINK and QWEN3_THINK_END in answer  # the model writes Qwen3's own think tokens
        assert tokenizer.decode(prompt).endswith("<|im_start|>assistant\n")
    else:
        assert tokenizer.decode(prompt).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")
        assert prompt[0] == 128000  # the template's own <|begin_of_text|>, once


def test_sft_trains_exactly_the_mask(arch, world, random_checkpoint, tmp_path, monkeypatch):
    """The batch TRL's SFTTrainer feeds the model: labels are the ids where the mask is 1, -100 elsewhere."""
    import trl

    from kgreasoner.records.trajectories import write_warmup
    from kgreasoner.training.sft import SFTRecipe, train_sft

    tokenizer = tokenizer_of(arch)
    records = warmup_records(world)
    batches = []

    def first_batch(trainer, **kwargs):
        batches.append(next(iter(trainer.get_train_dataloader())))

    monkeypatch.setattr(trl.SFTTrainer, "train", first_batch)
    path = write_warmup(records, tmp_path / "warmup.jsonl")
    train_sft(
        SFTRecipe(
            model=str(random_checkpoint),
            train_file=str(path),
            run_dir=str(tmp_path / "out"),
            trainer={
                "per_device_train_batch_size": 2,
                "report_to": [],
                "eval_steps": 0,
                "train_sampling_strategy": "random",
            },
        )
    )
    [batch] = batches
    expected = {}
    for record in records:
        encoded = encode_record(record, tokenizer)
        expected[tuple(encoded["input_ids"])] = [
            i if m else -100 for i, m in zip(encoded["input_ids"], encoded["assistant_masks"])
        ]
    for ids, attention, labels in zip(
        batch["input_ids"].tolist(), batch["attention_mask"].tolist(), batch["labels"].tolist()
    ):
        n = sum(attention)
        assert labels[:n] == expected[tuple(ids[:n])] and set(labels[n:]) <= {-100}
    assert len(batch["input_ids"]) == 2


def test_a_prompt_that_opens_the_think_block_trains_and_reads_the_rest(world):
    tokenizer = tokenizer_of("qwen3")
    tokenizer.chat_template = thinking_template(tokenizer)
    record = warmup_records(world)[0]
    prompt_text = build_prompt(record.question, list(record.topic_entities), tokenizer)
    assert prompt_text.endswith("<|im_start|>assistant\n<think>\n")
    encoded = encode_record(record, tokenizer)
    prompt = _ids(tokenizer, prompt_text)
    first = record.segments[0].text[len("<think>") :].lstrip()
    assert encoded["input_ids"][len(prompt) : len(prompt) + len(_ids(tokenizer, first))] == _ids(tokenizer, first)
    assert QWEN3_THINK not in encoded["input_ids"][len(prompt) :]  # the model does not open it a second time
    assert encoded["input_ids"][-1] == 151645


@pytest.mark.parametrize("mode", ["thinking", "enable_thinking_false", "think_in_prompt"])
def test_qwen3_stops_masks_parsing_and_format(mode, random_checkpoint_qwen3):
    """The engine on the real Qwen3 tokenizer: `<think>` is token 151667 and `</think>` 151668 whether
    the model writes them, writes them after a template's empty think block, or the prompt opened it."""
    model, tokenizer = random_checkpoint_qwen3
    messages = [{"role": "user", "content": "what time zone is utah in Topic Entity: Utah"}]
    turns = list(TURNS)
    if mode == "think_in_prompt":
        tokenizer = tokenizer_of("qwen3")
        tokenizer.chat_template = thinking_template(tokenizer)
        turns[0] = turns[0][len("<think> ") :]
    prompt = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=mode != "enable_thinking_false"
    )
    assert prompt.endswith(
        {
            "thinking": "assistant\n",
            "enable_thinking_false": "assistant\n<think>\n\n</think>\n\n",
            "think_in_prompt": "assistant\n<think>\n",
        }[mode]
    )
    script = _ids(tokenizer, turns[0]) + _ids(tokenizer, turns[1]) + _ids(tokenizer, " trailing words")
    engine = RolloutEngine(
        HFBackend(model, tokenizer, [ScriptedLogits({0: script})]),
        None,
        RolloutConfig(max_turn_tokens=48, max_tool_tokens=64),
    )
    [trajectory] = engine.run([prompt], [ScriptedSession(TABLE)], SamplingParams(temperature=1.0, seed=0))

    first, block, second = _ids(tokenizer, turns[0]), _ids(tokenizer, BLOCK), _ids(tokenizer, turns[1])
    assert trajectory.completion_ids == first + block + second  # stopped at </search>, then at </answer>
    assert trajectory.env_mask == [1] * len(first) + [0] * len(block) + [1] * len(second)
    assert (first[0] == QWEN3_THINK) == (mode != "think_in_prompt") and QWEN3_THINK_END in second
    lead = "<think>\n" if mode == "think_in_prompt" else ""
    assert trajectory.text == lead + turns[0] + BLOCK + turns[1]
    start = len(lead + turns[0])
    assert trajectory.tool_spans == [(start, start + len(BLOCK))]
    assert trajectory.finish_reason == "answer" and trajectory.answers == ["Mountain Time Zone"]
    assert [c.query for c in trajectory.tool_calls] == ["Utah"]
    assert check_format(trajectory.text, trajectory.tool_spans).valid
    assert parse_trajectory(trajectory.text, trajectory.tool_spans).thinks == [
        trajectory.text[len("<think>") : trajectory.text.index("</think>")]
    ]


@pytest.fixture(scope="module")
def random_checkpoint_qwen3(tmp_path_factory):
    from kgreasoner.models import load_model_and_tokenizer

    from .conftest import build_random_checkpoint

    return load_model_and_tokenizer(build_random_checkpoint("qwen3", tmp_path_factory.mktemp("qwen3-scripted")))
