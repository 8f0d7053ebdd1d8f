"""The `kgreasoner` method: our model writes its trajectory, calling the search tool inside it.

Batches of questions go through `RolloutEngine` with the hf backend (greedy by default); the
answers are the session-resolved ones (handles become labels). Costs per question:
`llm_calls` = model turns (tool calls + 1); `prompt_tokens` = prompt plus tool-inserted tokens
(what the model reads); `completion_tokens` = model-written tokens; `kg_queries` = tool calls.
Format-valid is the protocol's strict `check_format`. With an OpenAI-compatible endpoint the
text backend is used; it returns no token ids, so token counts stay 0 there. The trace is the
trajectory's summary with the search record the failure categories read (`failures.search_trace`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kgreasoner.baselines.base import Method, MethodResult
from kgreasoner.evaluation.failures import search_trace
from kgreasoner.llm import rollout_backend
from kgreasoner.llm.clients import MeteredLLM
from kgreasoner.protocol import check_format
from kgreasoner.records.schema import QAExample
from kgreasoner.retrieval.tool import KGSearchTool
from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams


class KGReasonerMethod(Method):
    name = "kgreasoner"
    batched = True
    uses_llm = False  # generation goes through the rollout engine, which reports its own usage

    def __init__(
        self,
        llm: Any,
        tool: KGSearchTool,
        rollout: RolloutConfig | None = None,
        sampling: SamplingParams | None = None,
        tokenizer: str | None = None,
    ) -> None:
        self.engine = RolloutEngine(rollout_backend(llm, tokenizer), tool, rollout or RolloutConfig())
        self.tool = tool
        self.kg = tool.kg
        self.sampling = sampling or SamplingParams(temperature=0.0, seed=0)

    def answer(self, example: QAExample, llm: MeteredLLM | None = None) -> MethodResult:
        return self.answer_batch([example])[0]

    def answer_batch(self, examples: Sequence[QAExample]) -> list[MethodResult]:
        results = []
        sessions = [self.tool.session(e.question, list(e.topic_entities), example_id=e.id) for e in examples]
        for trajectory in self.engine.run(list(examples), sessions=sessions, sampling=self.sampling):
            usage = {
                "llm_calls": trajectory.num_tool_calls + 1,
                "prompt_tokens": len(trajectory.prompt_ids) + trajectory.num_tool_tokens,
                "completion_tokens": trajectory.num_model_tokens,
            }
            results.append(
                MethodResult(
                    answers=list(trajectory.resolved_answers),
                    format_valid=check_format(trajectory.text, trajectory.tool_spans).valid,
                    trace=search_trace(
                        trajectory, sessions[trajectory.index], examples[trajectory.index].topic_entities
                    ),
                    kg_queries=trajectory.num_tool_calls,
                    usage=usage,
                )
            )
        return results
