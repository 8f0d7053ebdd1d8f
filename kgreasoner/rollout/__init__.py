"""Multi-turn generation with KG tool calls: the engine and its hf, vllm and openai backends.

`RolloutEngine(backend, tool, RolloutConfig(...)).run(prompts, sessions, SamplingParams(...))`
returns `Trajectory` objects; `trl_rollout_output` turns them into what TRL's GRPO `rollout_func`
returns. Backends are imported from their modules (`kgreasoner.rollout.hf_backend.HFBackend`,
`...vllm_backend.VLLMBackend`, `...openai_backend.OpenAIBackend`) so that importing this package
loads neither torch nor vLLM.
"""

from kgreasoner.rollout.engine import RolloutEngine, RowState
from kgreasoner.rollout.types import (
    ENDED_REASONS,
    FINISH_REASONS,
    RolloutConfig,
    SamplingParams,
    ToolCall,
    Trajectory,
    completion_tokens,
    sequence_tokens,
    trl_rollout_output,
)

__all__ = [
    "ENDED_REASONS",
    "FINISH_REASONS",
    "RolloutConfig",
    "RolloutEngine",
    "RowState",
    "SamplingParams",
    "ToolCall",
    "Trajectory",
    "completion_tokens",
    "sequence_tokens",
    "trl_rollout_output",
]
