"""Multi-turn generation with KG tool calls: the engine and its hf, vllm and openai backends.

`RolloutEngine(backend, tool, RolloutConfig(...)).run(prompts, sessions, SamplingParams(...))`
returns `Trajectory` objects; `trl_rollout_output` turns them into what TRL's GRPO `rollout_func`
returns. A backend derives from `StepBackend`, `TurnBackend` or `TextBackend` and a search session
fits `ToolSession` (all in `kgreasoner.rollout.types`). Backends are imported from their modules
(`kgreasoner.rollout.hf_backend.HFBackend`, `...vllm_backend.VLLMBackend`,
`...openai_backend.OpenAIBackend`); the exports here are imported on first use (`kgreasoner.lazy`), so
importing this package runs none of its modules.
"""

from typing import TYPE_CHECKING

from kgreasoner.lazy import exports

if TYPE_CHECKING:
    from kgreasoner.rollout.engine import RolloutEngine
    from kgreasoner.rollout.types import (
        ENDED_REASONS,
        ERROR_KINDS,
        FINISH_REASONS,
        Backend,
        ErrorKind,
        RolloutConfig,
        RowState,
        SamplingParams,
        SessionSource,
        StepBackend,
        StepDriver,
        TextBackend,
        TextOutput,
        TokenBackend,
        ToolCall,
        ToolSession,
        Trajectory,
        TurnBackend,
        TurnOutput,
        completion_tokens,
        sequence_tokens,
        trl_rollout_output,
    )
else:
    __getattr__ = exports(
        __name__,
        {
            "ENDED_REASONS": "kgreasoner.rollout.types",
            "ERROR_KINDS": "kgreasoner.rollout.types",
            "ErrorKind": "kgreasoner.rollout.types",
            "FINISH_REASONS": "kgreasoner.rollout.types",
            "Backend": "kgreasoner.rollout.types",
            "RolloutConfig": "kgreasoner.rollout.types",
            "RolloutEngine": "kgreasoner.rollout.engine",
            "RowState": "kgreasoner.rollout.types",
            "SamplingParams": "kgreasoner.rollout.types",
            "SessionSource": "kgreasoner.rollout.types",
            "StepBackend": "kgreasoner.rollout.types",
            "StepDriver": "kgreasoner.rollout.types",
            "TextBackend": "kgreasoner.rollout.types",
            "TextOutput": "kgreasoner.rollout.types",
            "TokenBackend": "kgreasoner.rollout.types",
            "ToolCall": "kgreasoner.rollout.types",
            "ToolSession": "kgreasoner.rollout.types",
            "Trajectory": "kgreasoner.rollout.types",
            "TurnBackend": "kgreasoner.rollout.types",
            "TurnOutput": "kgreasoner.rollout.types",
            "completion_tokens": "kgreasoner.rollout.types",
            "sequence_tokens": "kgreasoner.rollout.types",
            "trl_rollout_output": "kgreasoner.rollout.types",
        },
    )

__all__ = [
    "ENDED_REASONS",
    "ERROR_KINDS",
    "FINISH_REASONS",
    "Backend",
    "ErrorKind",
    "RolloutConfig",
    "RolloutEngine",
    "RowState",
    "SamplingParams",
    "SessionSource",
    "StepBackend",
    "StepDriver",
    "TextBackend",
    "TextOutput",
    "TokenBackend",
    "ToolCall",
    "ToolSession",
    "Trajectory",
    "TurnBackend",
    "TurnOutput",
    "completion_tokens",
    "sequence_tokens",
    "trl_rollout_output",
]
