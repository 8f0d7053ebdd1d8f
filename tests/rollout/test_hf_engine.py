"""The engine with the hf backend: masks, turns, logprobs and KV-cache splicing, limits."""

from __future__ import annotations

import pytest
import torch

from kgreasoner.protocol import build_prompt, check_format, format_tool_block
from kgreasoner.rollout import FINISH_REASONS, RolloutConfig, RolloutEngine, SamplingParams, trl_rollout_output
from kgreasoner.rollout.hf_backend import HFBackend

from .conftest import RecordingLogits, ScriptedLogits, ScriptedSession

TABLE = {
    "Utah": ["(Utah, time zone, Mountain Time Zone)", "(Utah, capital, Salt Lake City)"],
    "Salt Lake City": ["(Salt Lake City, time zone, Mountain Time Zone)"],
    "Mountain Time Zone": ["(Denver, time zone, Mountain Time Zone)", "(Colorado, time zone, Mountain Time Zone)"],
}

# Model-written segments per row; a tool block follows every segment but the last.
SEGMENTS = [
    ["<think> direct </think>\n<answer>Utah</answer>"],
    ["<think> I need <search>Utah</search>", "Utah is in it. </think>\n<answer>Mountain Time Zone</answer>"],
    [
        "<think> a <search> Utah </search>",
        "then <search>Salt Lake City</search>",
        "done </think>\n<answer>Mountain Time Zone | MST</answer>",
    ],
    [
        "<think> <search>Utah</search>",
        "<search>Salt Lake City</search>",
        "<search>Mountain Time Zone</search>",
        "so </think>\n<answer>Denver</answer>",
    ],
]


def _encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _engine(tokenizer, model, scripts, config=None, extra=()):
    backend = HFBackend(model, tokenizer, logits_processors=[*extra, ScriptedLogits(scripts)])
    return RolloutEngine(backend, None, config or RolloutConfig(max_turns=4, max_turn_tokens=64))


def _prompts(n):
    return [build_prompt(f"question {i}", ["Utah"]) for i in range(n)]


@pytest.mark.parametrize("kind", ["bpe_tokenizer", "special_tokenizer"])
def test_masks_line_up_with_tokens_and_rows_finish_at_different_turns(kind, request, tiny_model):
    tokenizer = request.getfixturevalue(kind)
    model = tiny_model(tokenizer)
    if kind == "bpe_tokenizer":
        assert len(_encode(tokenizer, "</search>")) > 1 and len(_encode(tokenizer, "<answer>")) > 1
    else:
        assert len(_encode(tokenizer, "</search>")) == 1
    scripts = {i: sum((_encode(tokenizer, s) for s in segs), []) for i, segs in enumerate(SEGMENTS)}
    sessions = [ScriptedSession(TABLE) for _ in SEGMENTS]
    recorder = RecordingLogits()
    config = RolloutConfig(max_turns=4, max_turn_tokens=64, compact_slack=1)  # repack at every chance
    trajectories = _engine(tokenizer, model, scripts, config, extra=[recorder]).run(
        _prompts(len(SEGMENTS)), sessions, SamplingParams(temperature=0.7, seed=3)
    )

    for trajectory, segments, session in zip(trajectories, SEGMENTS, sessions):
        assert trajectory.finish_reason == "answer"
        ids, mask = trajectory.completion_ids, trajectory.env_mask
        assert len(ids) == len(mask) == len(trajectory.logprobs)
        model_ids = [t for t, m in zip(ids, mask) if m == 1]
        tool_ids = [t for t, m in zip(ids, mask) if m == 0]
        assert model_ids == scripts[trajectory.index]
        assert tokenizer.decode(model_ids, skip_special_tokens=False) == "".join(segments)
        blocks = [format_tool_block("\n".join(TABLE[q.strip()])) for q in session.queries]
        assert tokenizer.decode(tool_ids, skip_special_tokens=False) == "".join(blocks)
        expected_text = "".join(s + (blocks[k] if k < len(blocks) else "") for k, s in enumerate(segments))
        assert trajectory.text == expected_text
        assert check_format(trajectory.text).valid, check_format(trajectory.text).errors
        assert trajectory.num_tool_calls == trajectory.num_searches == len(segments) - 1
        assert all(lp == 0.0 for lp, m in zip(trajectory.logprobs, mask) if m == 0)
        assert all(lp == 0.0 for lp, m in zip(trajectory.logprobs, mask) if m == 1)  # forced tokens: p = 1
        assert trajectory.prompt_ids == _encode(tokenizer, _prompts(4)[trajectory.index])
    assert [t.answers for t in trajectories][2] == ["Mountain Time Zone", "MST"]
    assert trajectories[2].resolved_answers == ["MOUNTAIN TIME ZONE", "MST"]

    # The logits seen while decoding (after splicing tool blocks, holes and repacks) are the
    # logits of one plain forward pass over the final sequence, at every model-written token.
    for trajectory in trajectories:
        full = torch.tensor([trajectory.prompt_ids + trajectory.completion_ids])
        with torch.no_grad():
            logits = model(full).logits[0]
        start = len(trajectory.prompt_ids)
        model_positions = [start + k for k, m in enumerate(trajectory.env_mask) if m == 1]
        for number, position in enumerate(model_positions):
            torch.testing.assert_close(
                recorder.seen[(trajectory.index, number)], logits[position - 1], atol=2e-4, rtol=1e-4
            )

    output = trl_rollout_output(trajectories, tokenizer.eos_token_id)
    # every row ended at </answer>: TRL gets the end-of-sequence id after it, carrying no loss
    assert output["env_mask"][1] == trajectories[1].env_mask + [0]
    assert output["completion_ids"][1] == trajectories[1].completion_ids + [tokenizer.eos_token_id]
    assert output["num_searches"] == [0, 1, 2, 3]


def test_sampled_logprobs_are_temperature_scaled_model_logprobs(bpe_tokenizer, tiny_model):
    model = tiny_model(bpe_tokenizer)
    engine = RolloutEngine(HFBackend(model, bpe_tokenizer), None, RolloutConfig(max_new_tokens=12, max_turn_tokens=12))
    trajectories = engine.run(
        _prompts(3), [ScriptedSession(TABLE) for _ in range(3)], SamplingParams(temperature=0.5, top_k=20, seed=1)
    )
    for trajectory in trajectories:
        assert trajectory.finish_reason in FINISH_REASONS
        full = torch.tensor([trajectory.prompt_ids + trajectory.completion_ids])
        with torch.no_grad():
            logprobs = torch.log_softmax(model(full).logits[0].float() / 0.5, dim=-1)
        start = len(trajectory.prompt_ids)
        for k, (token, mask, lp) in enumerate(
            zip(trajectory.completion_ids, trajectory.env_mask, trajectory.logprobs)
        ):
            if mask:
                assert lp == pytest.approx(logprobs[start + k - 1, token].item(), abs=1e-4)


def test_seeded_sampling_is_reproducible(bpe_tokenizer, tiny_model):
    model = tiny_model(bpe_tokenizer)
    engine = RolloutEngine(HFBackend(model, bpe_tokenizer), None, RolloutConfig(max_new_tokens=16))
    first = engine.run(_prompts(4), [ScriptedSession(TABLE) for _ in range(4)], SamplingParams(seed=7))
    again = engine.run(_prompts(4), [ScriptedSession(TABLE) for _ in range(4)], SamplingParams(seed=7))
    model.train()  # a trainer's model: sampled in eval mode, handed back in train mode
    other = engine.run(_prompts(4), [ScriptedSession(TABLE) for _ in range(4)], SamplingParams(seed=8))
    assert model.training
    model.eval()
    assert [t.completion_ids for t in first] == [t.completion_ids for t in again]
    assert [t.completion_ids for t in first] != [t.completion_ids for t in other]
    greedy = RolloutEngine(HFBackend(model, bpe_tokenizer), None, RolloutConfig(max_new_tokens=8)).run(
        _prompts(1), sampling=SamplingParams(temperature=0)
    )
    with torch.no_grad():
        expected = model.generate(
            torch.tensor([greedy[0].prompt_ids]),
            max_new_tokens=8,
            do_sample=False,
            eos_token_id=None,
            pad_token_id=bpe_tokenizer.pad_token_id,
        )[0]
    assert greedy[0].completion_ids == expected[len(greedy[0].prompt_ids) :].tolist()[: len(greedy[0].completion_ids)]


MALFORMED = {
    "unclosed search": ("<think> <search>Utah<|endoftext|>", "eos"),
    "search after answer": ("<think> x </think><answer>A</answer> <search>Utah</search>", "answer"),
    "empty search": ("<think> <search></search>", None),
    "long search": ("<think> <search>" + "x" * 10_000, "max_tokens"),
    "no answer": ("<think> nothing to say<|endoftext|>", "eos"),
    "answer without think": ("<answer>A</answer>", "answer"),
    "close without open": ("<think> oops </search>", "error"),
    "too many searches": ("<think>" + " <search>Utah</search>" * 3, "max_turns"),
}


def test_malformed_outputs_never_raise(bpe_tokenizer, tiny_model):
    model = tiny_model(bpe_tokenizer)
    names = list(MALFORMED)
    scripts = {i: _encode(bpe_tokenizer, MALFORMED[name][0]) for i, name in enumerate(names)}
    config = RolloutConfig(max_turns=2, max_turn_tokens=64, max_new_tokens=200)
    sessions = [ScriptedSession(TABLE) for _ in names]
    trajectories = _engine(bpe_tokenizer, model, scripts, config).run(_prompts(len(names)), sessions)
    by_name = dict(zip(names, trajectories))
    for name, trajectory in by_name.items():
        expected = MALFORMED[name][1]
        if expected is not None:
            assert trajectory.finish_reason == expected, name
        assert trajectory.finish_reason in FINISH_REASONS
    assert by_name["search after answer"].text == "<think> x </think><answer>A</answer>"
    assert by_name["search after answer"].num_tool_calls == 0
    assert by_name["unclosed search"].text == "<think> <search>Utah"  # the EOS token is not text
    assert not check_format(by_name["unclosed search"].text).valid
    empty = by_name["empty search"]
    assert empty.tool_calls[0].query == "" and empty.tool_calls[0].error == "empty_query"
    assert empty.num_searches == 0 and "The search query is empty." in empty.text
    assert by_name["long search"].num_model_tokens == 64 and by_name["long search"].num_tool_calls == 0
    assert by_name["close without open"].error == "</search> without a <search> in the same turn"
    assert by_name["too many searches"].num_tool_calls == 2
    assert check_format(by_name["answer without think"].text).errors == [
        "the trajectory must start with <think>, found <answer>"
    ]


def test_free_garbage_from_many_rows_never_raises(special_tokenizer, tiny_model):
    model = tiny_model(special_tokenizer)
    engine = RolloutEngine(
        HFBackend(model, special_tokenizer),
        None,
        RolloutConfig(max_turns=2, max_new_tokens=40, max_turn_tokens=30, compact_slack=2),
    )
    trajectories = engine.run(
        _prompts(12), [ScriptedSession(TABLE) for _ in range(12)], SamplingParams(temperature=1.5, seed=11)
    )
    assert all(t.finish_reason in FINISH_REASONS for t in trajectories)
    assert all(t.num_model_tokens <= 40 for t in trajectories)


def test_long_tool_output_is_cut_at_lines_with_a_note(bpe_tokenizer, tiny_model):
    model = tiny_model(bpe_tokenizer)
    table = {"Utah": [f"(Utah, relation {i}, Thing {i})" for i in range(40)]}
    scripts = {0: _encode(bpe_tokenizer, "<think> <search>Utah</search>")}
    config = RolloutConfig(max_turns=1, max_turn_tokens=64, max_new_tokens=70, max_tool_tokens=80)
    [trajectory] = _engine(bpe_tokenizer, model, scripts, config).run(_prompts(1), [ScriptedSession(table)])
    call = trajectory.tool_calls[0]
    assert call.truncated and call.num_tokens <= 80
    kept = call.text.split("\n")
    assert kept[-1] == f"[{40 - (len(kept) - 1)} more lines cut: tool output limit]"
    assert kept[:-1] == table["Utah"][: len(kept) - 1] and len(kept) > 1
    tool_ids = [t for t, m in zip(trajectory.completion_ids, trajectory.env_mask) if m == 0]
    assert bpe_tokenizer.decode(tool_ids) == format_tool_block(call.text)


class _SlowSession(ScriptedSession):
    """The scripted session, but every call takes 5 s (a stuck SPARQL endpoint)."""

    def call(self, query):
        import time

        time.sleep(5)
        return super().call(query)


def test_tool_calls_run_concurrently_with_a_timeout(bpe_tokenizer, tiny_model):
    import time

    model = tiny_model(bpe_tokenizer)
    script = _encode(bpe_tokenizer, "<think> <search>Utah</search>")
    config = RolloutConfig(
        max_turns=1, max_turn_tokens=len(script) + 4, max_new_tokens=len(script) + 4, tool_workers=2, tool_timeout=0.5
    )
    engine = _engine(bpe_tokenizer, model, {0: script, 1: script}, config)
    spent = []
    run_tools = engine.run_tools

    def timed(rows):
        start = time.perf_counter()
        try:
            return run_tools(rows)
        finally:
            spent.append(time.perf_counter() - start)

    engine.run_tools = timed
    slow, fast = engine.run(_prompts(2), [_SlowSession(TABLE), ScriptedSession(TABLE)])
    assert len(spent) == 1 and spent[0] < 2.0  # the 5 s call was abandoned after 0.5 s
    assert slow.tool_calls[0].error == "tool_timeout" and "The search timed out." in slow.text
    assert fast.tool_calls[0].error is None and fast.num_searches == 1
