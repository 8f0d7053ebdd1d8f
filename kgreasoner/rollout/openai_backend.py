"""Any OpenAI-compatible `/v1/completions` endpoint as a text backend (hosted models in evaluation).

The engine sends prompt + trajectory so far as text with `stop=["</search>", "</answer>"]`; the
tool block is appended as text. OpenAI-style servers leave the matched stop string out of the
text, so it is put back: vLLM names it in `stop_reason`; otherwise an unclosed `<search>` (or
`<answer>`) at the end of a turn that finished with reason `stop` says which one it was.
Token fields of the trajectories stay empty (a text endpoint gives no ids to train on).

Requests of one turn run concurrently (`max_concurrency` threads) through one
`kgreasoner.llm.http.JSONEndpoint` (a transient failure is tried `retries` more times); a request
that still fails ends its row with finish reason `error`, never an exception. The API key, if any,
is read from the environment variable named by `api_key_env`.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kgreasoner.llm.http import JSONEndpoint
from kgreasoner.protocol import ANSWER_CLOSE, ANSWER_OPEN, SEARCH_CLOSE, SEARCH_OPEN, STOP_TAGS
from kgreasoner.rollout.types import SamplingParams, TextOutput

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def row_seed(sampling: SamplingParams, index: int, turn: int) -> int | None:
    """A distinct, reproducible seed per row and turn (None when sampling is unseeded)."""
    if sampling.seed is None:
        return None
    return (sampling.seed * 1_000_003 + index * 1_009 + turn) % (2**31 - 1)


def run_concurrently(jobs: Sequence[Callable[[], Any]], workers: int) -> list[Any]:
    if workers <= 1 or len(jobs) < 2:
        return [job() for job in jobs]
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda job: job(), jobs))


def restore_stop(text: str, finish_reason: str | None, stop_reason: Any) -> str:
    """Put back the stop tag an OpenAI-style server cut from the end of `text`."""
    if text.endswith(STOP_TAGS):
        return text
    if isinstance(stop_reason, str) and stop_reason in STOP_TAGS:
        return text + stop_reason
    if finish_reason == "stop":
        if text.rfind(SEARCH_OPEN) > text.rfind(SEARCH_CLOSE):
            return text + SEARCH_CLOSE
        if text.rfind(ANSWER_OPEN) > text.rfind(ANSWER_CLOSE):
            return text + ANSWER_CLOSE
    return text


class OpenAIBackend:
    """Text completions from an OpenAI-compatible server (`base_url` ends with `/v1`)."""

    kind = "text"
    supports_constraints = False
    tokenizer: PreTrainedTokenizerBase | None = None
    """The served model's tokenizer, whose chat template lays out prompts; None: the plain protocol layout."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 120.0,
        max_concurrency: int = 8,
        retries: int = 2,
        backoff: float = 0.5,
    ) -> None:
        self.endpoint = JSONEndpoint(base_url, api_key_env, timeout=timeout, retries=retries, backoff=backoff)
        self.url = self.endpoint.base_url + "/completions"
        self.model = model
        self.max_concurrency = max_concurrency

    @property
    def timeout(self) -> float:
        return self.endpoint.timeout

    def close(self) -> None:
        self.endpoint.close()

    def request_body(self, prompt: str, budget: int, sampling: SamplingParams, seed: int | None) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": budget,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stop": list(STOP_TAGS),
        }
        if seed is not None:
            body["seed"] = seed
        return body

    def parse(self, reply: dict[str, Any]) -> TextOutput:
        choice = reply["choices"][0]
        text = restore_stop(choice.get("text") or "", choice.get("finish_reason"), choice.get("stop_reason"))
        tokens = int((reply.get("usage") or {}).get("completion_tokens") or 0)
        return TextOutput(text=text, finish_reason=choice.get("finish_reason"), num_tokens=tokens)

    def complete_text(
        self,
        prompts: Sequence[str],
        budgets: Sequence[int],
        sampling: SamplingParams,
        turn: int,
        indices: Sequence[int],
    ) -> list[TextOutput]:
        def job(prompt: str, budget: int, index: int) -> Callable[[], TextOutput]:
            def run() -> TextOutput:
                if budget <= 0:
                    return TextOutput(text="", finish_reason="length")
                try:
                    body = self.request_body(prompt, budget, sampling, row_seed(sampling, index, turn))
                    return self.parse(self.endpoint.post("/completions", body))
                except Exception as err:  # a network or server fault ends this row, not the batch
                    return TextOutput(text="", finish_reason=None, error=f"completion request failed: {err}")

            return run

        return run_concurrently([job(p, b, i) for p, b, i in zip(prompts, budgets, indices)], self.max_concurrency)
