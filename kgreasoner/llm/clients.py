"""`LLMClient`: the text-in, text-out LLM the pipeline baselines call, with call and token counts.

Clients:
- `HFClient`: a local transformers causal LM, greedy. Requests from many threads are gathered
  by one worker thread into batches (up to `batch_size`, waiting at most `max_wait` seconds for
  more), so a thread pool of questions turns into batched generation.
- `OpenAIClient`: an OpenAI-compatible chat-completions endpoint (vLLM, ...), one HTTP request
  per call; safe to call from many threads.
- `ScriptedLLM`: a test double. Its responses are chosen by rules from the prompt text; it
  runs no model. Tests use it to drive the baselines' control flow exactly.

`open_llm("hf:PATH" | "openai:URL[#MODEL]")` builds one from a spec. Every client counts calls
and prompt/completion tokens in `usage`; `metered()` gives a per-question view that counts the
same calls again in its own `usage` (how the harness attributes cost to one question).
"""

from __future__ import annotations

import abc
import concurrent.futures
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgreasoner.llm.spec import CLIENT_FORMS, LLMSpec, describe_forms, parse_llm_spec
from kgreasoner.records.http import JSONEndpoint


@dataclass(frozen=True)
class Completion:
    """One generated reply. `text` ends before the first stop string (which is not included)."""

    text: str
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str = "stop"


@dataclass
class Usage:
    """Calls and tokens, added to from many threads."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, completion: Completion) -> None:
        with self._lock:
            self.calls += 1
            self.prompt_tokens += completion.prompt_tokens
            self.completion_tokens += completion.completion_tokens

    def as_dict(self) -> dict[str, int]:
        return {
            "llm_calls": self.calls,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
        }


class LLMClient(abc.ABC):
    """Greedy text completion with usage counting.

    `concurrency` is how many questions the harness should run at once against this client
    (threads for HTTP endpoints, the batch size for a local model).
    """

    name: str = "llm"
    concurrency: int = 1

    def __init__(self, max_tokens: int = 256) -> None:
        if max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
        self.max_tokens = max_tokens
        self.usage = Usage()

    def complete(self, prompt: str, max_tokens: int | None = None, stop: Sequence[str] = ()) -> Completion:
        """One reply to `prompt` (at most `max_tokens`, default the client's), cut before any `stop`."""
        return self.complete_many([prompt], max_tokens, stop)[0]

    def complete_many(
        self, prompts: Sequence[str], max_tokens: int | None = None, stop: Sequence[str] = ()
    ) -> list[Completion]:
        """Replies to several prompts, in order (batched where the client can)."""
        completions = self._complete_many(list(prompts), max_tokens or self.max_tokens, tuple(stop))
        for completion in completions:
            self.usage.add(completion)
        return completions

    @abc.abstractmethod
    def _complete_many(self, prompts: list[str], max_tokens: int, stop: tuple[str, ...]) -> list[Completion]:
        """Generate; usage is counted by the caller."""

    def metered(self) -> MeteredLLM:
        """A view that also counts its own calls (one per question)."""
        return MeteredLLM(self)

    def close(self) -> None:  # noqa: B027 (optional: a client without workers or connections keeps it)
        """Stop workers or connections; the default has none."""


class MeteredLLM:
    """Forwards to a client and counts the calls made through it in its own `usage`."""

    def __init__(self, client: LLMClient) -> None:
        self.client = client
        self.usage = Usage()

    @property
    def name(self) -> str:
        return self.client.name

    def complete(self, prompt: str, max_tokens: int | None = None, stop: Sequence[str] = ()) -> Completion:
        return self.complete_many([prompt], max_tokens, stop)[0]

    def complete_many(
        self, prompts: Sequence[str], max_tokens: int | None = None, stop: Sequence[str] = ()
    ) -> list[Completion]:
        completions = self.client.complete_many(prompts, max_tokens, stop)
        for completion in completions:
            self.usage.add(completion)
        return completions


def cut_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Text before the earliest stop string, and whether one was found."""
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return (text, False) if cut < 0 else (text[:cut], True)


# --------------------------------------------------------------------------- scripted test double
Rule = Callable[[str], "str | None"]


class ScriptedLLM(LLMClient):
    """A TEST DOUBLE, not a model: each reply is chosen by rules from the prompt text.

    `rules` are tried in order; the first that returns a string gives the reply, else `default`.
    Token counts are whitespace-separated words (prompt and reply). Every prompt is recorded in
    `prompts` (thread-safe), so tests can assert exactly which LLM steps ran.
    """

    name = "scripted"

    def __init__(self, rules: Sequence[Rule], default: str = "", concurrency: int = 4, max_tokens: int = 256) -> None:
        super().__init__(max_tokens)
        self.rules = list(rules)
        self.default = default
        self.concurrency = concurrency
        self.prompts: list[str] = []
        self._lock = threading.Lock()

    def _complete_many(self, prompts: list[str], max_tokens: int, stop: tuple[str, ...]) -> list[Completion]:
        out = []
        for prompt in prompts:
            with self._lock:
                self.prompts.append(prompt)
            reply = next((r for r in (rule(prompt) for rule in self.rules) if r is not None), self.default)
            words = reply.split()
            if len(words) > max_tokens:
                reply, words = " ".join(words[:max_tokens]), words[:max_tokens]
            text, stopped = cut_at_stop(reply, stop)
            out.append(
                Completion(
                    text,
                    len(prompt.split()),
                    len(text.split()),
                    "stop" if stopped or len(words) < max_tokens else "length",
                )
            )
        return out


# --------------------------------------------------------------------------- local HF model
@dataclass
class _Request:
    prompt: str
    max_tokens: int
    stop: tuple[str, ...]
    future: concurrent.futures.Future


class HFClient(LLMClient):
    """A local causal LM, greedy decoding, with requests from all threads batched together.

    The prompt goes in as one user turn through the tokenizer's chat template when it has one
    (`chat=True`), else as plain text. Prompts longer than the model's context minus the reply
    budget keep their last tokens (the question and instructions of our prompts come last).
    """

    name = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_tokens: int = 256,
        batch_size: int = 8,
        chat: bool = True,
        max_wait: float = 0.02,
    ) -> None:
        super().__init__(max_tokens)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.concurrency = batch_size
        self.chat = chat and bool(getattr(tokenizer, "chat_template", None))
        self.max_wait = max_wait
        self.context = int(getattr(model.config, "max_position_embeddings", 0) or 4096)
        from kgreasoner.rollout.hf_backend import eos_token_ids

        self.eos_ids = set(eos_token_ids(model, tokenizer))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(self.eos_ids)
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._worker: threading.Thread | None = None
        self._start_lock = threading.Lock()

    @classmethod
    def load(cls, path: str | Path, device: str | None = None, **options: Any) -> HFClient:
        """Load a checkpoint on `device` (default: the GPU when there is one), in bfloat16 on a GPU and
        float32 on CPU (`models.inference_dtype`)."""
        from kgreasoner.models import default_device, inference_dtype, load_model_and_tokenizer

        device = device or default_device()
        model, tokenizer = load_model_and_tokenizer(
            path, dtype=inference_dtype(device), device=device, padding_side="left"
        )
        return cls(model, tokenizer, **options)

    def render(self, prompt: str) -> str:
        """The text the model actually sees for `prompt`."""
        return render_prompt(prompt, self.tokenizer, self.chat)

    def _complete_many(self, prompts: list[str], max_tokens: int, stop: tuple[str, ...]) -> list[Completion]:
        self._ensure_worker()
        futures = []
        for prompt in prompts:
            future: concurrent.futures.Future = concurrent.futures.Future()
            self._queue.put(_Request(prompt, max_tokens, stop, future))
            futures.append(future)
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._worker is not None:
            self._queue.put(None)
            self._worker.join()
            self._worker = None

    def _ensure_worker(self) -> None:
        with self._start_lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name="hf-llm", daemon=True)
                self._worker.start()

    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.monotonic() + self.max_wait
            while len(batch) < self.batch_size:
                try:
                    item = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    break
                if item is None:
                    self._queue.put(None)
                    break
                batch.append(item)
            try:
                for request, completion in zip(batch, self._generate(batch)):
                    request.future.set_result(completion)
            except Exception as err:  # hand the failure to the callers instead of killing the worker
                for request in batch:
                    if not request.future.done():
                        request.future.set_exception(err)

    def _generate(self, batch: list[_Request]) -> list[Completion]:
        import torch

        budget = max(r.max_tokens for r in batch)
        room = max(1, self.context - budget)
        encoded = [encode_prompt(r.prompt, self.tokenizer, self.chat)[-room:] for r in batch]
        width = max(len(ids) for ids in encoded)
        input_ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(batch), width), dtype=torch.long)
        for i, ids in enumerate(encoded):
            input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
            attention[i, width - len(ids) :] = 1
        stopper = _StopOnText(self.tokenizer, [r.stop for r in batch], [r.max_tokens for r in batch], width)
        device = next(self.model.parameters()).device
        with torch.no_grad():
            output = self.model.generate(
                input_ids=input_ids.to(device),
                attention_mask=attention.to(device),
                max_new_tokens=budget,
                do_sample=False,
                pad_token_id=self.pad_id,
                eos_token_id=sorted(self.eos_ids),
                stopping_criteria=[stopper],
            )
        completions = []
        for i, request in enumerate(batch):
            new = output[i, width:].tolist()[: request.max_tokens]
            end = next((j for j, t in enumerate(new) if t in self.eos_ids), None)
            kept = new if end is None else new[:end]
            text, stopped = cut_at_stop(self.tokenizer.decode(kept, skip_special_tokens=True), request.stop)
            if stopped:
                used = min(stopper.stopped_at.get(i, len(kept)), len(new))
            else:
                used = len(new) if end is None else end + 1  # the EOS token was generated too
            finish = "stop" if stopped or end is not None else "length"
            completions.append(Completion(text, len(encoded[i]), used, finish))
        return completions


class _StopOnText:
    """Stops a row once its new text holds one of its stop strings or it used its own token budget."""

    def __init__(self, tokenizer: Any, stops: list[tuple[str, ...]], budgets: list[int], prompt_width: int) -> None:
        self.tokenizer = tokenizer
        self.stops = stops
        self.budgets = budgets
        self.width = prompt_width
        self.stopped_at: dict[int, int] = {}

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        done = torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)
        produced = input_ids.shape[1] - self.width
        for i in range(input_ids.shape[0]):
            if i in self.stopped_at or produced >= self.budgets[i]:
                done[i] = True
                continue
            if self.stops[i]:
                text = self.tokenizer.decode(input_ids[i, self.width :].tolist(), skip_special_tokens=True)
                if cut_at_stop(text, self.stops[i])[1]:
                    self.stopped_at[i] = produced
                    done[i] = True
        return done


def render_prompt(prompt: str, tokenizer: Any, chat: bool = True) -> str:
    """`prompt` as one user turn through the tokenizer's chat template (ending where the reply
    starts), when `chat` and the tokenizer has a template; else the prompt itself."""
    if chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
        )
    return prompt


def encode_prompt(prompt: str, tokenizer: Any, chat: bool = True) -> list[int]:
    """The prompt token ids a local model is given (`HFClient`, and SFT data of pipeline steps, so
    that training and evaluation see the same tokens); the template already wrote any BOS."""
    return list(tokenizer(render_prompt(prompt, tokenizer, chat), add_special_tokens=False)["input_ids"])


# --------------------------------------------------------------------------- OpenAI-compatible
class OpenAIClient(LLMClient):
    """An OpenAI-compatible `/chat/completions` endpoint, greedy unless given a `temperature`.

    `base_url` ends before `/chat/completions` (e.g. `http://127.0.0.1:8000/v1`). Without
    `model`, the first id listed by `/models` is used. A key is read from the environment
    variable `api_key_env` when it is set (local vLLM needs none). Requests go through
    `kgreasoner.records.http.JSONEndpoint`: `timeout` seconds each, transient failures tried
    `retries` more times; failures are `EndpointError`s (RuntimeErrors) naming the URL.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        max_tokens: int = 256,
        workers: int = 8,
        timeout: float = 120.0,
        retries: int = 2,
        api_key_env: str = "OPENAI_API_KEY",
        temperature: float = 0.0,
        backoff: float = 0.5,
    ) -> None:
        super().__init__(max_tokens)
        self.endpoint = JSONEndpoint(base_url, api_key_env, timeout=timeout, retries=retries, backoff=backoff)
        self.base_url = self.endpoint.base_url
        self.temperature = temperature
        self.concurrency = workers
        self.model = model or self._first_model()

    @property
    def timeout(self) -> float:
        return self.endpoint.timeout

    def _complete_many(self, prompts: list[str], max_tokens: int, stop: tuple[str, ...]) -> list[Completion]:
        return [self._one(p, max_tokens, stop) for p in prompts]

    def _one(self, prompt: str, max_tokens: int, stop: tuple[str, ...]) -> Completion:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens,
            "temperature": self.temperature,
        }
        if stop:
            body["stop"] = list(stop)
        data = self.endpoint.post("/chat/completions", body)
        try:
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            usage = data.get("usage") or {}
        except (KeyError, IndexError, TypeError, AttributeError) as err:
            raise RuntimeError(f"{self.base_url}: unexpected chat completion response: {str(data)[:200]}") from err
        text, _ = cut_at_stop(text, stop)  # servers drop the stop string already; this keeps it so
        return Completion(
            text,
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            str(choice.get("finish_reason") or "stop"),
        )

    def _first_model(self) -> str:
        data = self.endpoint.get("/models")
        try:
            return str(data["data"][0]["id"])
        except (KeyError, IndexError, TypeError) as err:
            raise RuntimeError(f"{self.base_url}/models lists no model; name one with openai:URL#MODEL") from err

    def close(self) -> None:
        self.endpoint.close()


def open_llm(
    spec: str | LLMSpec, max_tokens: int = 256, batch_size: int = 8, workers: int = 8, timeout: float = 120.0
) -> LLMClient:
    """The text client a spec names: `HFClient` for hf:PATH, `OpenAIClient` for openai:URL[#MODEL]
    (`timeout`: seconds per request).

    vllm specs name rollout backends only (`kgreasoner.llm.open_backend`): a `vllm serve` endpoint
    speaks chat completions too, and reaches the pipeline baselines as openai:URL.
    """
    parsed = parse_llm_spec(spec)
    if parsed.scheme == "hf":
        return HFClient.load(parsed.target, max_tokens=max_tokens, batch_size=batch_size)
    if parsed.scheme == "openai":
        return OpenAIClient(parsed.target, parsed.model, max_tokens=max_tokens, workers=workers, timeout=timeout)
    raise ValueError(
        f"LLM spec {str(spec)!r} names a rollout backend, not a text client: "
        f"the pipeline methods take {describe_forms(CLIENT_FORMS)}"
    )
