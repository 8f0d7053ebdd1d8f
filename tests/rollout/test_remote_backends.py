"""The vllm (server mode) and openai backends against a local HTTP stub, and their parsing.

The stub answers `/v1/completions` with the reply shape vLLM's OpenAI-compatible server documents
(choices[].text / token_ids / logprobs.token_logprobs / finish_reason / stop_reason), written by
hand from that API, not captured from a running vLLM (vLLM is not installed here).
"""

from __future__ import annotations

import re

import pytest

from kgreasoner.protocol import build_prompt, format_tool_block
from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams
from kgreasoner.rollout.constraints import turn_regex
from kgreasoner.rollout.openai_backend import OpenAIBackend, restore_stop
from kgreasoner.rollout.vllm_backend import VLLMBackend, sampling_kwargs

from .conftest import ScriptedSession

TABLE = {"Utah": ["(Utah, time zone, Mountain Time Zone)"]}
FIRST = "<think> look <search>Utah</search>"
SECOND = "so </think><answer>Mountain Time Zone</answer>"


def _vllm_reply(tokenizer, text, stop):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return {
        "id": "cmpl-1",
        "object": "text_completion",
        "model": "tiny",
        "choices": [
            {
                "index": 0,
                "text": text,
                "token_ids": ids,
                "logprobs": {
                    "tokens": [f"token_id:{i}" for i in ids],
                    "token_logprobs": [-0.25] * len(ids),
                    "text_offset": list(range(len(ids))),
                    "top_logprobs": None,
                },
                "finish_reason": "stop",
                "stop_reason": stop,
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": len(ids), "total_tokens": 10 + len(ids)},
    }


def test_vllm_server_mode_runs_the_engine_loop(stub, bpe_tokenizer):
    def reply(body):
        seen = bpe_tokenizer.decode(body["prompt"])
        if "(Utah, time zone" not in seen:
            return 200, _vllm_reply(bpe_tokenizer, FIRST, "</search>")
        return 200, _vllm_reply(bpe_tokenizer, SECOND, "</answer>")

    server = stub(reply)
    backend = VLLMBackend(bpe_tokenizer, base_url=server.base_url, model="tiny")
    engine = RolloutEngine(backend, None, RolloutConfig(max_turn_tokens=50))
    prompt = build_prompt("what timezone is utah in", ["Utah"])
    trajectories = engine.run(
        [prompt, prompt],
        [ScriptedSession(TABLE), ScriptedSession(TABLE)],
        SamplingParams(temperature=0.8, top_k=5, seed=1),
    )
    block = format_tool_block(TABLE["Utah"][0])
    for trajectory in trajectories:
        assert trajectory.finish_reason == "answer"
        assert trajectory.text == FIRST + block + SECOND
        model_ids = [t for t, m in zip(trajectory.completion_ids, trajectory.env_mask) if m]
        assert bpe_tokenizer.decode(model_ids) == FIRST + SECOND
        assert [lp for lp, m in zip(trajectory.logprobs, trajectory.env_mask) if m] == [-0.25] * len(model_ids)
    first = server.bodies[0]
    assert first["prompt"] == bpe_tokenizer(prompt, add_special_tokens=False)["input_ids"]
    assert first["stop"] == ["</search>", "</answer>"] and first["include_stop_str_in_output"] is True
    assert first["return_token_ids"] is True and first["logprobs"] == 0 and first["top_k"] == 5
    assert first["max_tokens"] == 50 and first["model"] == "tiny" and first["skip_special_tokens"] is False
    seeds = {body["seed"] for body in server.bodies}
    assert len(seeds) == 4  # two rows x two turns, each seeded differently


def test_vllm_reply_parsing_and_failures(stub, bpe_tokenizer):
    reply = _vllm_reply(bpe_tokenizer, "<think>", None)
    del reply["choices"][0]["token_ids"]  # older servers: ids only as "token_id:N" tokens
    parsed = VLLMBackend.parse(reply)
    assert parsed.token_ids == bpe_tokenizer("<think>", add_special_tokens=False)["input_ids"] and parsed.error is None
    reply["choices"][0]["logprobs"]["tokens"] = ["<", "think"]
    assert "no token ids" in VLLMBackend.parse(reply).error
    server = stub(lambda body: (500, {"error": "boom"}))
    url = server.base_url
    backend = VLLMBackend(bpe_tokenizer, base_url=url, model="tiny", retries=2, backoff=0.0)
    [trajectory] = RolloutEngine(backend, None).run(["question"], [ScriptedSession(TABLE)])
    assert trajectory.finish_reason == "error"
    assert (
        trajectory.error
        == f'vLLM request failed: {url}/completions failed after 3 attempts: HTTP 500: {{"error": "boom"}}'
    )
    assert len(server.bodies) == 3
    assert sampling_kwargs(SamplingParams(top_k=0), 7, 3)["top_k"] == -1
    with pytest.raises(ValueError, match="exactly one"):
        VLLMBackend(bpe_tokenizer)


def test_openai_backend_by_text(stub):
    def reply(body):
        # An OpenAI-style server: the stop string is cut from the text and not named.
        text = FIRST[: -len("</search>")] if "(Utah, time zone" not in body["prompt"] else SECOND[: -len("</answer>")]
        return 200, {"choices": [{"text": text, "finish_reason": "stop"}], "usage": {"completion_tokens": 7}}

    server = stub(reply)
    backend = OpenAIBackend(server.base_url, "hosted")
    engine = RolloutEngine(backend, None, RolloutConfig(max_turn_tokens=40))
    [trajectory] = engine.run(["Q: where? Assistant:"], [ScriptedSession(TABLE)], SamplingParams(temperature=0))
    assert trajectory.finish_reason == "answer"
    assert trajectory.text == FIRST + format_tool_block(TABLE["Utah"][0]) + SECOND
    assert trajectory.completion_ids == [] and trajectory.num_searches == 1
    assert server.bodies[1]["prompt"] == "Q: where? Assistant:" + FIRST + format_tool_block(TABLE["Utah"][0])
    assert server.bodies[0]["stop"] == ["</search>", "</answer>"] and server.bodies[0]["max_tokens"] == 40


def test_restore_stop():
    assert restore_stop("<search>Utah", "stop", None) == "<search>Utah</search>"
    assert restore_stop("<answer>X", "stop", None) == "<answer>X</answer>"
    assert restore_stop("a <answer>X", "stop", "</answer>") == "a <answer>X</answer>"
    assert restore_stop("<search>Utah", "length", None) == "<search>Utah"
    assert restore_stop("plain", "stop", None) == "plain"


def test_vllm_constrained_decoding_sends_each_turn_the_regex_of_the_shown_entities(stub, bpe_tokenizer):
    def reply(body):
        seen = bpe_tokenizer.decode(body["prompt"])
        text, stop = (FIRST, "</search>") if "(Utah, time zone" not in seen else (SECOND, "</answer>")
        # What the server's structured output enforces: the reply fits the turn's pattern.
        assert re.fullmatch(body["structured_outputs"]["regex"], text)
        return 200, _vllm_reply(bpe_tokenizer, text, stop)

    server = stub(reply)
    backend = VLLMBackend(bpe_tokenizer, base_url=server.base_url, model="tiny")
    engine = RolloutEngine(
        backend, config=RolloutConfig(max_turns=2, max_new_tokens=100, max_turn_tokens=50, constrained_decoding=True)
    )
    trajectory = engine.run([build_prompt("what timezone is utah in", ["Utah"])], [ScriptedSession(TABLE)])[0]
    assert trajectory.finish_reason == "answer" and trajectory.answers == ["Mountain Time Zone"]
    first, second = (body["structured_outputs"]["regex"] for body in server.bodies)
    # Turn 1 may name only the topic; turn 2 also what the tool showed, with or without a leading space.
    assert re.fullmatch(first, "<think> look <search>Utah | backtrack</search>")
    assert not re.fullmatch(first, "<think> look <search>Mountain Time Zone</search>")
    assert not re.fullmatch(first, "<think> look <answer>Ogden</answer>")
    assert re.fullmatch(second, "so </think><answer> Mountain Time Zone</answer>")
    assert re.fullmatch(second, "so it is")  # thinking that runs into the length cap stays allowed
    assert not re.fullmatch(second, "so </think><answer>Mountain Time Zone | Utah</answer>")
    assert not re.fullmatch(second, "so <triples>")


def test_turn_regex_escapes_names_and_allows_only_thinking_without_names():
    pattern = turn_regex(["E1", "a.b (c)", "E1", " "])
    # Only regex metacharacters are escaped, and no `(?:`: the syntax structured-output engines share.
    assert pattern == (
        r"([^<]|<think>|</think>)*(<search> ?(E1|a\.b \(c\))( \| backtrack| \| relations)?</search>"
        r"|<answer> ?(E1|a\.b \(c\))</answer>)?"
    )
    assert re.fullmatch(pattern, "<think> x <search>a.b (c)</search>")
    assert not re.fullmatch(pattern, "<think> x <search>aXb (c)</search>")
    assert re.fullmatch(turn_regex([]), "<think> nothing shown") and not re.fullmatch(
        turn_regex([]), "<search>E1</search>"
    )


def test_turn_regex_with_lines_lets_a_parenthesis_open_only_a_shown_line():
    pattern = turn_regex(["E1", "E2"], ["E1 Utah, capital, E2 Salt Lake City"])
    assert re.fullmatch(pattern, "<think> so (E1 Utah, capital, E2 Salt Lake City). <answer>E2</answer>")
    assert not re.fullmatch(pattern, "<think> so (E1 Utah, capital, E3 Ogden). <answer>E2</answer>")
    assert not re.fullmatch(pattern, "<think> so (E1 Utah, capital, E2 Salt Lake City")
    assert turn_regex(["E1"], []) == turn_regex(["E1"])  # nothing shown yet: parentheses stay free
    assert re.fullmatch(turn_regex(["E1"], []), "<think> (a guess) <search>E1</search>")


def test_openai_backend_does_not_retry_a_refused_request(stub):
    server = stub(lambda body: (400, {"error": "max_tokens too large"}))
    url = server.base_url
    backend = OpenAIBackend(url, "hosted", retries=3, backoff=0.0)
    [trajectory] = RolloutEngine(backend, None).run(["Q:"], [ScriptedSession(TABLE)])
    assert trajectory.finish_reason == "error"
    assert trajectory.error == (
        f"completion request failed: {url}/completions rejected the request: HTTP 400: "
        '{"error": "max_tokens too large"}'
    )
    assert len(server.bodies) == 1
