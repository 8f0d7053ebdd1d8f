"""Rows that start from a given prefix of search turns (GRPO's gold-prefix rows): the prefix's ids carry no
loss, its searches are replayed in the row's session, and the model writes on from there.

The tool is the real `KGSearchTool` over a small MemoryKG with entity handles, so a handle the prefix's
tool block showed resolves only if the session ran the prefix's search. Tokenizers: the tiny byte-level
BPE (tags several tokens, and tags as single special tokens) and the real Qwen3 one. What the model
"chooses" to write is forced with `ScriptedLogits` where a test needs a given continuation; the free row
samples from the tiny random model.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kgreasoner.kg.memory import MemoryKG
from kgreasoner.protocol import build_prompt, format_tool_block, opened_think
from kgreasoner.records.schema import QAExample
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams, trl_rollout_output
from kgreasoner.rollout.hf_backend import HFBackend
from kgreasoner.rollout.vllm_backend import VLLMBackend

from .conftest import RecordingLogits, ScriptedLogits, build_model

QWEN3 = Path("/work/shared/models/qwen3")
TRIPLES = [("m.utah", "time_zone", "m.mtz"), ("m.utah", "capital", "m.slc"), ("m.slc", "mayor", "m.erin")]
NAMES = {"m.utah": "Utah", "m.mtz": "Mountain Time Zone", "m.slc": "Salt Lake City", "m.erin": "Erin"}
EXAMPLE = QAExample.from_dict(
    {
        "id": "q1",
        "question": "who is the mayor of the capital of utah",
        "topic_entities": [{"id": "m.utah", "name": "Utah"}],
        "answers": [{"id": "m.erin", "name": "Erin"}],
    }
)
PREFIX = ["<think> I need the capital of Utah. <search>E1</search>"]
# E3 (Salt Lake City) is a handle only the prefix's tool block shows; E4 (Erin) only the continuation's.
CONTINUATION = ["The capital is E3. <search>E3</search>", "The mayor is E4. </think>\n<answer>E4</answer>"]


def _tool() -> KGSearchTool:
    return KGSearchTool(MemoryKG.from_triples(TRIPLES, NAMES), ToolConfig(entity_handles=True))


def _session(tool):
    return tool.session(EXAMPLE.question, list(EXAMPLE.topic_entities))


def _encode(tokenizer, text):
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _decode(tokenizer, ids):
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.fixture(params=["bpe_tokenizer", "special_tokenizer", "qwen3"])
def tokenizer_and_model(request, tiny_model):
    if request.param == "qwen3":
        if not (QWEN3 / "tokenizer.json").is_file():
            pytest.skip("the shared Qwen3 tokenizer is not on this machine")
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(QWEN3)
        return tokenizer, build_model(tokenizer)
    tokenizer = request.getfixturevalue(request.param)
    return tokenizer, tiny_model(tokenizer)


def test_a_row_starts_from_its_prefix_with_no_loss_and_the_session_replayed(tokenizer_and_model):
    tokenizer, model = tokenizer_and_model
    tool = _tool()
    reference = _session(tool)
    first, second = reference.call("E1"), reference.call("E3")
    assert "E3 Salt Lake City" in first.text and second.entity == "m.slc" and "E4 Erin" in second.text
    prefix_ids = _encode(tokenizer, PREFIX[0]) + _encode(tokenizer, format_tool_block(first.text))
    turns = [_encode(tokenizer, t) for t in CONTINUATION]
    plain = _encode(tokenizer, "<think> <search>E1</search>") + _encode(tokenizer, "</think>\n<answer>E2</answer>")
    # ScriptedLogits indexes a row's model text, which counts the prefix's text (what max_new_tokens limits)
    scripts = {0: _encode(tokenizer, PREFIX[0]) + turns[0] + turns[1], 1: plain}
    recorder = RecordingLogits()
    backend = HFBackend(model, tokenizer, logits_processors=[recorder, ScriptedLogits(scripts)])
    config = RolloutConfig(max_turns=3, max_new_tokens=96, max_turn_tokens=64, max_tool_tokens=160)
    engine = RolloutEngine(backend, tool, config)
    # row 0 scripted after its prefix, row 1 a plain rollout in the same batch, row 2 samples freely after its prefix
    rows = engine.run([EXAMPLE] * 3, sampling=SamplingParams(temperature=0.8, seed=4), prefixes=[PREFIX, [], PREFIX])

    row = rows[0]
    assert row.prefix_tokens == len(prefix_ids)
    assert row.completion_ids[: row.prefix_tokens] == prefix_ids
    assert row.env_mask[: row.prefix_tokens] == [0] * len(prefix_ids)
    assert row.logprobs[: row.prefix_tokens] == [0.0] * len(prefix_ids)
    assert [t for t, m in zip(row.completion_ids, row.env_mask) if m] == turns[0] + turns[1]
    assert [(c.query, c.entity, c.error) for c in row.tool_calls] == [("E1", "m.utah", None), ("E3", "m.slc", None)]
    assert [c.text for c in row.tool_calls] == [first.text, second.text]
    lead = opened_think(build_prompt(EXAMPLE.question, list(EXAMPLE.topic_entities), tokenizer))
    blocks = [format_tool_block(first.text), format_tool_block(second.text)]
    assert row.text == lead + _decode(tokenizer, row.completion_ids)
    assert [row.text[a:b] for a, b in row.tool_spans] == [_decode(tokenizer, _encode(tokenizer, b)) for b in blocks]
    assert row.finish_reason == "answer" and row.answers == ["E4"] and row.resolved_answers == ["Erin"]
    assert row.num_searches == 2 and row.num_model_tokens == len(turns[0]) + len(turns[1])
    assert row.search_record[0] == {"entity": "m.utah", "shown": list(row.tool_calls[0].shown)}

    assert rows[1].prefix_tokens == 0 and rows[1].env_mask[0] == 1
    assert [c.query for c in rows[1].tool_calls] == ["E1"] and rows[1].resolved_answers == ["Mountain Time Zone"]

    # the free row: its prefix as row 0's, then tokens the model sampled, scored in the prefix's context
    free = rows[2]
    assert free.completion_ids[: free.prefix_tokens] == prefix_ids and free.tool_calls[0].query == "E1"
    assert sum(free.env_mask) > 0 and free.env_mask[free.prefix_tokens] == 1
    full = torch.tensor([free.prompt_ids + free.completion_ids])
    with torch.no_grad():
        logits = model(full).logits[0].float()
    start, text_tokens = len(free.prompt_ids), len(_encode(tokenizer, PREFIX[0]))
    sampled = [k for k, m in enumerate(free.env_mask) if m]
    for number, k in enumerate(sampled):
        torch.testing.assert_close(
            recorder.seen[(2, text_tokens + number)].float(), logits[start + k - 1], atol=2e-4, rtol=1e-4
        )
        expected = torch.log_softmax(logits[start + k - 1] / 0.8, dim=-1)[free.completion_ids[k]].item()
        assert free.logprobs[k] == pytest.approx(expected, abs=1e-4)

    out = trl_rollout_output(rows, tokenizer.eos_token_id)
    assert out["env_mask"][0][: len(prefix_ids)] == [0] * len(prefix_ids)
    assert out["num_searches"] == [2, 1, free.num_searches]


def test_prefix_text_counts_against_the_token_budget(special_tokenizer, tiny_model):
    tool = _tool()
    text_tokens = len(_encode(special_tokenizer, PREFIX[0]))
    engine = RolloutEngine(
        HFBackend(tiny_model(special_tokenizer), special_tokenizer),
        tool,
        RolloutConfig(max_new_tokens=text_tokens, max_turn_tokens=64),
    )
    [row] = engine.run([EXAMPLE], prefixes=[PREFIX])
    assert row.finish_reason == "max_tokens" and row.num_model_tokens == 0
    assert [c.query for c in row.tool_calls] == ["E1"] and len(row.completion_ids) == row.prefix_tokens


def test_bad_prefixes_are_refused_with_what_is_wrong(special_tokenizer, tiny_model):
    engine = RolloutEngine(
        HFBackend(tiny_model(special_tokenizer), special_tokenizer), _tool(), RolloutConfig(max_turns=1)
    )
    with pytest.raises(ValueError, match="got 2 prompts but 1 prefixes"):
        engine.run([EXAMPLE, EXAMPLE], prefixes=[PREFIX])
    with pytest.raises(ValueError, match="prefix 0, turn 0 must end with a <search>...</search> call"):
        engine.run([EXAMPLE], prefixes=[["<think> no call yet"]])
    with pytest.raises(ValueError, match="prefix 0 has 2 search turns but max_turns is 1"):
        engine.run([EXAMPLE], prefixes=[PREFIX * 2])
    with pytest.raises(ValueError, match="prefix 0 must be a list of turns, not one string"):
        engine.run([EXAMPLE], prefixes=[PREFIX[0]])


def test_vllm_turns_send_the_prefix_and_join_with_no_rows(special_tokenizer, stub):
    """The turn backend (a stub server standing in for vLLM) is asked to continue prompt + prefix ids."""
    tool = _tool()
    answer = _encode(special_tokenizer, "</think><answer>E3</answer>")

    def reply(body):
        return 200, {
            "choices": [
                {
                    "index": 0,
                    "text": "",
                    "token_ids": answer,
                    "finish_reason": "stop",
                    "logprobs": {"tokens": [f"token_id:{i}" for i in answer], "token_logprobs": [-0.5] * len(answer)},
                }
            ]
        }

    server = stub(reply)
    engine = RolloutEngine(
        VLLMBackend(special_tokenizer, base_url=server.base_url, model="stub"), tool, RolloutConfig(max_turn_tokens=64)
    )
    [row] = engine.run([EXAMPLE], prefixes=[PREFIX])
    [body] = server.bodies
    assert body["prompt"] == row.prompt_ids + row.completion_ids[: row.prefix_tokens]
    assert row.completion_ids[row.prefix_tokens :] == answer
    assert row.logprobs[row.prefix_tokens :] == [-0.5] * len(answer)
    assert row.resolved_answers == ["Salt Lake City"]
    assert engine.run([], prefixes=[]) == [] and len(server.bodies) == 1
