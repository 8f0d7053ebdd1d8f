"""Multi-turn generation with KG tool calls: the engine and its hf, vllm and openai backends.

`RolloutEngine(backend, tool, RolloutConfig(...)).run(prompts, sessions, SamplingParams(...))`
returns `Trajectory` objects; `trl_rollout_output` turns them into what TRL's GRPO `rollout_func`
returns. A backend derives from `StepBackend`, `TurnBackend` or `TextBackend` and a search session
fits `ToolSession` (all in `kgreasoner.rollout.types`). Backends are imported from their modules
(`kgreasoner.rollout.hf_backend.HFBackend`, `...vllm_backend.VLLMBackend`,
`...openai_backend.OpenAIBackend`) so that importing this package loads no vLLM.
"""

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
