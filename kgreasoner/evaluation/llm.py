"""The text clients moved to `kgreasoner.llm`; this path stays importable for the code and scripts
that still name it."""

from kgreasoner.llm.clients import (  # noqa: F401
    Completion, HFClient, LLMClient, MeteredLLM, OpenAIClient, ScriptedLLM, Usage, cut_at_stop, encode_prompt,
    open_llm, render_prompt,
)
