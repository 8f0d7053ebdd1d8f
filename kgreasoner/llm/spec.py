"""LLM specs: the one grammar `--llm` and `llm:` fields are written in, for eval, serve and answer.

    hf:PATH              a local checkpoint, run by transformers in this process
    vllm:PATH            a local checkpoint, run by an offline vLLM engine in this process
    vllm:URL[#MODEL]     a running `vllm serve` (token ids in and out); MODEL: its served name
    openai:URL[#MODEL]   any OpenAI-compatible server (text in and out); MODEL: its served name

URL is an http(s) base URL ending before `/chat/completions` (e.g. `http://127.0.0.1:8000/v1`);
without `#MODEL` the first model the server lists is used.
"""

from __future__ import annotations

from dataclasses import dataclass

SPEC_FORMS = ("hf:PATH", "vllm:PATH", "vllm:URL[#MODEL]", "openai:URL[#MODEL]")
"""Every form `parse_llm_spec` accepts."""
CLIENT_FORMS = ("hf:PATH", "openai:URL[#MODEL]")
"""The forms a text client (`open_llm`, what the pipeline baselines call) is built from."""
URL_PREFIXES = ("http://", "https://")


def describe_forms(forms: tuple[str, ...]) -> str:
    """`a, b or c`: the forms as a help or error text names them."""
    return forms[0] if len(forms) == 1 else ", ".join(forms[:-1]) + " or " + forms[-1]


@dataclass(frozen=True)
class LLMSpec:
    """A parsed spec: `scheme` (hf, vllm or openai), `target` (a path or a base URL) and, for a
    URL, the served `model` named after `#` (None: the server's first)."""

    scheme: str
    target: str
    model: str | None = None

    @property
    def is_url(self) -> bool:
        return self.target.startswith(URL_PREFIXES)

    def __str__(self) -> str:
        return f"{self.scheme}:{self.target}" + (f"#{self.model}" if self.model else "")


def parse_llm_spec(spec: str | LLMSpec) -> LLMSpec:
    """The `LLMSpec` of one of `SPEC_FORMS`; anything else is a ValueError naming them all."""
    if isinstance(spec, LLMSpec):
        return spec
    scheme, sep, target = spec.partition(":")
    url = target.startswith(URL_PREFIXES)
    accepted = {"hf": not url, "vllm": True, "openai": url}
    if not sep or not target or not accepted.get(scheme, False):
        raise ValueError(f"unknown LLM spec {spec!r}: expected {describe_forms(SPEC_FORMS)}")
    if not url:
        return LLMSpec(scheme, target)  # a path may hold a '#'; only URLs carry a model name
    base, _, model = target.partition("#")
    return LLMSpec(scheme, base, model or None)
