"""Rollout backends from specs: what the kgreasoner method (eval) and the answer service run.

- `open_backend(spec, tokenizer=...)`: (backend, model name, close) for any of `SPEC_FORMS`:
  hf:PATH -> `HFBackend`; vllm:PATH -> an offline `VLLMBackend`; vllm:URL -> a `VLLMBackend`
  on a `vllm serve` endpoint (token ids, so it needs the served model's tokenizer);
  openai:URL -> `OpenAIBackend` (text).
- `rollout_backend(client, tokenizer)`: the backend over a text client already open, so the
  evaluation's kgreasoner method shares the baselines' loaded model.

hf and openai go through the text clients (`open_llm`), so `kgreasoner answer`, `kgreasoner serve`
and `kgreasoner eval` load and reach models the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from kgreasoner.llm.clients import HFClient, OpenAIClient, open_llm
from kgreasoner.llm.spec import LLMSpec, parse_llm_spec

VLLM_URL_NEEDS_TOKENIZER = "vllm:URL sends token ids and needs `tokenizer` (the served model's tokenizer directory)"


def check_backend_spec(spec: str | LLMSpec, tokenizer: str | None = None) -> LLMSpec:
    """The parsed spec, refused (ValueError) where a backend could not be built from it and `tokenizer`."""
    parsed = parse_llm_spec(spec)
    if parsed.scheme == "vllm" and parsed.is_url and not tokenizer:
        raise ValueError(VLLM_URL_NEEDS_TOKENIZER)
    return parsed


def open_backend(
    spec: str | LLMSpec, tokenizer: str | None = None, workers: int = 16, timeout: float = 120.0
) -> tuple[Any, str, Callable[[], None]]:
    """(rollout backend, model name, close function) for a spec.

    `tokenizer`: the served model's tokenizer directory, for URLs (vllm:URL needs it; openai uses
    its chat template to render prompts, as hf does with the checkpoint's own). `workers` and
    `timeout`: concurrent requests and seconds per request to a server. A server that cannot
    list its models is a RuntimeError; a missing checkpoint directory a FileNotFoundError.
    """
    parsed = check_backend_spec(spec, tokenizer)
    if parsed.scheme == "vllm":
        from transformers import AutoTokenizer

        from kgreasoner.rollout.vllm_backend import VLLMBackend

        if parsed.is_url:
            lister = OpenAIClient(
                parsed.target, parsed.model, timeout=timeout
            )  # the first served model when none is named
            model = lister.model
            lister.close()
            backend = VLLMBackend(
                AutoTokenizer.from_pretrained(tokenizer),
                base_url=parsed.target,
                model=model,
                timeout=timeout,
                max_concurrency=workers,
            )
            return backend, model, _nothing
        _require_checkpoint(parsed.target)
        backend = VLLMBackend.offline(parsed.target, AutoTokenizer.from_pretrained(tokenizer or parsed.target))
        return backend, Path(parsed.target).name, _nothing
    if parsed.scheme == "hf":
        _require_checkpoint(parsed.target)
    llm = open_llm(parsed, workers=workers, timeout=timeout)
    backend = rollout_backend(llm, tokenizer)
    if isinstance(llm, OpenAIClient):

        def close() -> None:
            backend.close()
            llm.close()

        return backend, llm.model, close
    return backend, Path(parsed.target).resolve().name, llm.close


def rollout_backend(llm: Any, tokenizer: str | None = None) -> Any:
    """The rollout backend serving the same model as a text client (a rollout backend as it is).

    A text endpoint has no tokenizer of its own: without `tokenizer` (the model's, for its chat
    template) prompts take the plain protocol layout, which a chat-trained model never saw.
    """
    from kgreasoner.rollout.types import StepBackend, TextBackend, TurnBackend

    if isinstance(llm, (StepBackend, TurnBackend, TextBackend)):
        return llm
    if isinstance(llm, HFClient):
        from kgreasoner.rollout.hf_backend import HFBackend

        return HFBackend(llm.model, llm.tokenizer)
    if isinstance(llm, OpenAIClient):
        from kgreasoner.rollout.openai_backend import OpenAIBackend

        backend = OpenAIBackend(
            llm.base_url,
            llm.model,
            timeout=llm.timeout,
            max_concurrency=llm.concurrency,
            retries=llm.endpoint.retries,
            backoff=llm.endpoint.backoff,
        )
        if tokenizer:
            from transformers import AutoTokenizer

            backend.tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        return backend
    raise ValueError(f"the kgreasoner method needs --llm hf:PATH or openai:URL[#MODEL]; got {type(llm).__name__}")


def _require_checkpoint(path: str) -> None:
    """A checkpoint directory whose weight files load (`models.check_weights`), before an engine reads it."""
    from kgreasoner.models import check_weights

    if not Path(path).is_dir():
        raise FileNotFoundError(f"{path} is not a checkpoint directory")
    check_weights(path)


def _nothing() -> None:
    """The close function of a backend holding nothing to release here."""
