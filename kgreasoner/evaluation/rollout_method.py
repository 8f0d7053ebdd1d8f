"""The `kgreasoner` method: our model writes its trajectory, calling the search tool inside it.

Batches of questions go through `RolloutEngine` with the hf backend (greedy by default); the
answers are the session-resolved ones (handles become labels). Costs per question:
`llm_calls` = model turns (tool calls + 1); `prompt_tokens` = prompt plus tool-inserted tokens
(what the model reads); `completion_tokens` = model-written tokens; `kg_queries` = tool calls.
Format-valid is the protocol's strict `check_format`. With an OpenAI-compatible endpoint the
text backend is used; it returns no token ids, so token counts stay 0 there. The trace is the
trajectory's summary with the search record the failure categories read (`failures.RecordingSession`).
"""

from __future__ import annotations

from typing import Any, Sequence

from kgreasoner.baselines.base import Method, MethodResult
from kgreasoner.data.schema import QAExample
from kgreasoner.evaluation.failures import RecordingSession
from kgreasoner.protocol import check_format
from kgreasoner.retrieval.tool import KGSearchTool
from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams


class KGReasonerMethod(Method):
    name = "kgreasoner"
    batched = True
    uses_llm = False  # generation goes through the rollout engine, which reports its own usage

    def __init__(self, llm: Any, tool: KGSearchTool, rollout: RolloutConfig | None = None,
                 sampling: SamplingParams | None = None, tokenizer: str | None = None) -> None:
        self.engine = RolloutEngine(rollout_backend(llm, tokenizer), tool, rollout or RolloutConfig())
        self.tool = tool
        self.kg = tool.kg
        self.sampling = sampling or SamplingParams(temperature=0.0, seed=0)

    def answer(self, example: QAExample, llm: Any = None) -> MethodResult:
        return self.answer_batch([example])[0]

    def answer_batch(self, examples: Sequence[QAExample]) -> list[MethodResult]:
        results = []
        sessions = [RecordingSession(self.tool, e.question, e.topic_entities, e.id) for e in examples]
        for trajectory in self.engine.run(list(examples), sessions=sessions, sampling=self.sampling):
            usage = {"llm_calls": trajectory.num_tool_calls + 1,
                     "prompt_tokens": len(trajectory.prompt_ids) + trajectory.num_tool_tokens,
                     "completion_tokens": trajectory.num_model_tokens}
            results.append(MethodResult(
                answers=list(trajectory.resolved_answers), format_valid=check_format(trajectory.text, trajectory.tool_spans).valid,
                trace=sessions[trajectory.index].trace(trajectory), kg_queries=trajectory.num_tool_calls, usage=usage,
            ))
        return results


def rollout_backend(llm: Any, tokenizer: str | None = None) -> Any:
    """The rollout backend serving the same model as the eval's LLM client (a rollout backend as it is).

    A text endpoint has no tokenizer of its own: without `tokenizer` (the model's, for its chat
    template) prompts take the plain protocol layout, which a chat-trained model never saw.
    """
    from kgreasoner.evaluation.llm import HFClient, OpenAIClient

    if hasattr(llm, "kind"):
        return llm
    if isinstance(llm, HFClient):
        from kgreasoner.rollout.hf_backend import HFBackend

        return HFBackend(llm.model, llm.tokenizer)
    if isinstance(llm, OpenAIClient):
        from kgreasoner.rollout.openai_backend import OpenAIBackend

        backend = OpenAIBackend(llm.base_url, llm.model, timeout=llm.timeout, max_concurrency=llm.concurrency)
        if tokenizer:
            from transformers import AutoTokenizer

            backend.tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        return backend
    raise ValueError("the kgreasoner method needs --llm hf:PATH or openai:URL[#MODEL]; "
                     f"got {type(llm).__name__}")
