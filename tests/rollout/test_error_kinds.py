"""`Trajectory.error_kind`: whose fault a row's failure was, and a bad prompt failing its own row only.

Real parts: the real `KGSearchTool` over a MemoryKG, a real BPE tokenizer, a tiny real Qwen3 model driven
by `ScriptedLogits`, and the vllm backend against the local HTTP stub (vLLM itself cannot run here).
"""

from __future__ import annotations

from kgreasoner.kg.memory import MemoryKG
from kgreasoner.protocol import build_prompt
from kgreasoner.records.schema import QAExample
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams, trl_rollout_output
from kgreasoner.rollout.hf_backend import HFBackend
from kgreasoner.rollout.vllm_backend import VLLMBackend

from .conftest import ScriptedLogits, ScriptedSession
from .test_real_tool import EXAMPLE, NAMES, TRIPLES

SEARCH_AND_ANSWER = "<think> <search>Utah</search></think><answer>Mountain Time Zone</answer>"
BAD_QUESTION = QAExample.from_dict(
    {
        "id": "bad",
        "question": "what timezone is \ud800 in",  # a lone surrogate: the tokenizer refuses the text
        "topic_entities": [{"id": "m.utah", "name": "Utah"}],
        "answers": [{"id": "m.mtz", "name": "Mountain Time Zone"}],
    }
)
COLORADO = QAExample.from_dict(
    {
        "id": "q2",
        "question": "what timezone is colorado in",
        "topic_entities": [{"id": "m.colorado", "name": "Colorado"}],
        "answers": [{"id": "m.mtz", "name": "Mountain Time Zone"}],
    }
)


def _ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _engine(tokenizer, model, scripts, kg=None, **config):
    tool = KGSearchTool(kg or MemoryKG.from_triples(TRIPLES, NAMES), ToolConfig())
    backend = HFBackend(model, tokenizer, [ScriptedLogits({i: _ids(tokenizer, s) for i, s in scripts.items()})])
    return RolloutEngine(backend, tool, RolloutConfig(max_turn_tokens=64, **config))


def test_a_bad_prompt_fails_its_own_row_and_the_others_run(special_tokenizer, tiny_model):
    model = tiny_model(special_tokenizer)
    colorado = SEARCH_AND_ANSWER.replace("Utah", "Colorado")
    alone = _engine(special_tokenizer, model, {0: SEARCH_AND_ANSWER, 1: colorado}).run(
        [EXAMPLE, COLORADO], sampling=SamplingParams(temperature=0.0)
    )
    engine = _engine(special_tokenizer, model, {0: SEARCH_AND_ANSWER, 2: colorado})
    good, bad, other = engine.run([EXAMPLE, BAD_QUESTION, COLORADO], sampling=SamplingParams(temperature=0.0))

    assert bad.finish_reason == "error" and bad.error_kind == "prompt"
    assert bad.error is not None and bad.error.startswith(
        "the prompt cannot be built or tokenised (TypeError: TextEncodeInput must be Union"
    )
    assert (bad.prompt_ids, bad.completion_ids, bad.text, bad.tool_calls) == ([], [], "", [])
    for row, reference in ((good, alone[0]), (other, alone[1])):
        assert row.finish_reason == "answer" and row.error_kind is None and row.error is None
        assert row.resolved_answers == ["Mountain Time Zone"] and row.num_searches == 1
        assert (row.text, row.completion_ids) == (reference.text, reference.completion_ids)
    # TRL still gets a row for the failed prompt: the end-of-sequence id alone, with no loss on it
    columns = trl_rollout_output([good, bad, other], special_tokenizer.eos_token_id)
    assert columns["completion_ids"][1] == [special_tokenizer.eos_token_id] and columns["env_mask"][1] == [0]


def test_the_halt_rule_and_a_malformed_call_name_their_kind(special_tokenizer, tiny_model):
    model = tiny_model(special_tokenizer)
    scripts = {0: SEARCH_AND_ANSWER, 1: SEARCH_AND_ANSWER, 2: "<think> Utah</search>"}
    engine = _engine(special_tokenizer, model, scripts)
    answered, halted, malformed = engine.run(
        [EXAMPLE, EXAMPLE, EXAMPLE],
        sampling=SamplingParams(temperature=0.0),
        halt=lambda row: "stopped by the caller" if row == 1 else None,
    )
    assert (answered.finish_reason, answered.error_kind) == ("answer", None)
    assert (halted.finish_reason, halted.error, halted.error_kind) == ("error", "stopped by the caller", "halt")
    assert (malformed.finish_reason, malformed.error_kind) == ("error", "format")
    assert malformed.error == "</search> without a <search> in the same turn"


class _BrokenKG(MemoryKG):
    """A MemoryKG whose neighbour fetch fails with an error the tool does not expect (a driver bug)."""

    def neighbors(self, *args, **kwargs):
        raise RuntimeError("driver bug")


def test_a_tool_call_that_raises_marks_the_row_and_the_row_goes_on(special_tokenizer, tiny_model):
    kg = _BrokenKG.from_triples(TRIPLES, NAMES)
    engine = _engine(special_tokenizer, tiny_model(special_tokenizer), {0: SEARCH_AND_ANSWER}, kg=kg)
    [trajectory] = engine.run([EXAMPLE], sampling=SamplingParams(temperature=0.0))
    assert [call.error for call in trajectory.tool_calls] == ["tool_exception"]
    assert trajectory.tool_calls[0].text == "The search failed: RuntimeError."
    assert (trajectory.finish_reason, trajectory.error, trajectory.error_kind) == ("answer", None, "tool")


def test_a_failed_generation_request_is_the_backend_s_fault(stub, bpe_tokenizer):
    server = stub(lambda body: (500, {"error": "boom"}))
    backend = VLLMBackend(bpe_tokenizer, base_url=server.base_url, model="tiny", retries=0, backoff=0.0)
    [trajectory] = RolloutEngine(backend, None).run(
        [build_prompt("what timezone is utah in", ["Utah"])], [ScriptedSession({})]
    )
    assert (trajectory.finish_reason, trajectory.error_kind) == ("error", "backend")
    assert (
        trajectory.error
        == f'vLLM request failed: {server.base_url}/completions failed after 1 attempt: HTTP 500: {{"error": "boom"}}'
    )
