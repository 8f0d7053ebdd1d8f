"""Any OpenAI-compatible `/v1/completions` endpoint as a text backend (hosted models in evaluation).

The engine sends prompt + trajectory so far as text with `stop=["</search>", "</answer>"]`; the
tool block is appended as text. OpenAI-style servers leave the matched stop string out of the
text, so it is put back: vLLM names it in `stop_reason`; otherwise an unclosed `<search>` (or
`<answer>`) at the end of a turn that finished with reason `stop` says which one it was.
Token fields of the trajectories stay empty (a text endpoint gives no ids to train on).

Requests of one turn run concurrently (`max_concurrency` threads) through one
`kgreasoner.records.http.JSONEndpoint` (a transient failure is tried `retries` more times); a request
that still fails ends its row with finish reason `error`, never an exception. The API key, if any,
is read from the environment variable named by `api_key_env`.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
from collections.abc import Callable, Sequence
from typing import TypeVar

from kgreasoner.protocol import ANSWER_CLOSE, ANSWER_OPEN, SEARCH_CLOSE, SEARCH_OPEN, STOP_TAGS
from kgreasoner.records.http import JSONEndpoint
from kgreasoner.rollout.types import SamplingParams, TextBackend, TextOutput

T = TypeVar("T")


def row_seed(sampling: SamplingParams, index: int, turn: int) -> int | None:
    """A distinct, reproducible seed per row and turn (None when sampling is unseeded)."""
    if sampling.seed is None:
        return None
    return (sampling.seed * 1_000_003 + index * 1_009 + turn) % (2**31 - 1)


def run_concurrently(jobs: Sequence[Callable[[], T]], workers: int) -> list[T]:
    """The jobs' results in order, at most `workers` at a time; each job runs in a copy of the caller's
    context, so a `kgreasoner.records.http.deadline` set around the call bounds its requests too."""
    if workers <= 1 or len(jobs) < 2:
        return [job() for job in jobs]
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        # one copy per job: a context cannot be entered by two threads at once
        futures = [pool.submit(contextvars.copy_context().run, job) for job in jobs]
        return [future.result() for future in futures]


JSONObject = dict[str, object]
"""A JSON object as `json.loads` gives it: values are read with isinstance checks."""


def first_choice(reply: JSONObject) -> JSONObject:
    """`reply["choices"][0]` of a completions reply; a KeyError or TypeError when it has none (the row's error)."""
    choices = reply["choices"]
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise TypeError(f"the reply's choices are not a list of objects: {str(choices)[:200]}")
    return choices[0]


def restore_stop(text: str, finish_reason: str | None, stop_reason: object) -> str:
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


class OpenAIBackend(TextBackend):
    """Text completions from an OpenAI-compatible server (`base_url` ends with `/v1`)."""

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

    def request_body(self, prompt: str, budget: int, sampling: SamplingParams, seed: int | None) -> JSONObject:
        body: JSONObject = {
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

    def parse(self, reply: JSONObject) -> TextOutput:
        choice = first_choice(reply)
        reason = choice.get("finish_reason")
        finish_reason = reason if isinstance(reason, str) else None
        written = choice.get("text")
        text = restore_stop(written if isinstance(written, str) else "", finish_reason, choice.get("stop_reason"))
        usage = reply.get("usage")
        count = usage.get("completion_tokens") if isinstance(usage, dict) else None
        tokens = int(count) if isinstance(count, (int, float)) else 0
        return TextOutput(text=text, finish_reason=finish_reason, num_tokens=tokens)

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
