"""Every model the project talks to, built from one spec grammar.

- `spec`: `parse_llm_spec("hf:PATH" | "vllm:PATH" | "vllm:URL[#MODEL]" | "openai:URL[#MODEL]")`.
- `clients`: text clients for the pipeline baselines (`HFClient`, `OpenAIClient`, the
  `ScriptedLLM` test double) and `open_llm(spec)`.
- `http`: `JSONEndpoint`, the one HTTP transport of every endpoint client (httpx; transient
  failures retried with tenacity, a 4xx never), used by the rollout backends and judges too.
- `backends`: rollout backends for the kgreasoner method and the answer service,
  `open_backend(spec)`, and `rollout_backend(client)` over a client already open.

Sits beside `kgreasoner.rollout`: it imports the rollout backends, never training, evaluation or
serving. Importing it loads neither torch nor vLLM.
"""

from kgreasoner.llm.backends import check_backend_spec, open_backend, rollout_backend
from kgreasoner.llm.clients import (
    Completion,
    HFClient,
    LLMClient,
    MeteredLLM,
    OpenAIClient,
    ScriptedLLM,
    Usage,
    cut_at_stop,
    encode_prompt,
    open_llm,
    render_prompt,
)
from kgreasoner.llm.spec import CLIENT_FORMS, SPEC_FORMS, LLMSpec, describe_forms, parse_llm_spec

__all__ = [
    "CLIENT_FORMS",
    "SPEC_FORMS",
    "Completion",
    "HFClient",
    "LLMClient",
    "LLMSpec",
    "MeteredLLM",
    "OpenAIClient",
    "ScriptedLLM",
    "Usage",
    "check_backend_spec",
    "cut_at_stop",
    "describe_forms",
    "encode_prompt",
    "open_backend",
    "open_llm",
    "parse_llm_spec",
    "render_prompt",
    "rollout_backend",
]
