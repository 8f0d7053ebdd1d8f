"""Every model the project talks to, built from one spec grammar.

- `spec`: `parse_llm_spec("hf:PATH" | "vllm:PATH" | "vllm:URL[#MODEL]" | "openai:URL[#MODEL]")`.
- `clients`: text clients for the pipeline baselines (`HFClient`, `OpenAIClient`, the
  `ScriptedLLM` test double) and `open_llm(spec)`.
- `backends`: rollout backends for the kgreasoner method and the answer service,
  `open_backend(spec)`, and `rollout_backend(client)` over a client already open.

Sits above `kgreasoner.rollout`: it imports the rollout backends, never training, evaluation or
serving. The clients talk HTTP through `kgreasoner.records.http.JSONEndpoint`.
Its exports are imported on first use (`kgreasoner.lazy`): importing the package runs none of its modules.
"""

from typing import TYPE_CHECKING

from kgreasoner.lazy import exports

if TYPE_CHECKING:
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
else:
    __getattr__ = exports(
        __name__,
        {
            "CLIENT_FORMS": "kgreasoner.llm.spec",
            "SPEC_FORMS": "kgreasoner.llm.spec",
            "Completion": "kgreasoner.llm.clients",
            "HFClient": "kgreasoner.llm.clients",
            "LLMClient": "kgreasoner.llm.clients",
            "LLMSpec": "kgreasoner.llm.spec",
            "MeteredLLM": "kgreasoner.llm.clients",
            "OpenAIClient": "kgreasoner.llm.clients",
            "ScriptedLLM": "kgreasoner.llm.clients",
            "Usage": "kgreasoner.llm.clients",
            "check_backend_spec": "kgreasoner.llm.backends",
            "cut_at_stop": "kgreasoner.llm.clients",
            "describe_forms": "kgreasoner.llm.spec",
            "encode_prompt": "kgreasoner.llm.clients",
            "open_backend": "kgreasoner.llm.backends",
            "open_llm": "kgreasoner.llm.clients",
            "parse_llm_spec": "kgreasoner.llm.spec",
            "render_prompt": "kgreasoner.llm.clients",
            "rollout_backend": "kgreasoner.llm.backends",
        },
    )

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
