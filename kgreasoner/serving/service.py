"""The answer service: one model backend, one KG search tool, requests validated and batched.

`AnswerService` is what both `kgreasoner answer` (synchronously, `answer(requests)`) and the HTTP
app (`submit(request)` -> future, from a batching worker thread) run. Its jobs live in modules of
their own:

- `validation`: `prepare(question, topic_entities, options)` checks a request against the config's
  limits and resolves its topic entities in the KG; every problem is a `RequestError` naming the field.
- `batching`: the queue and the workers that run requests with the same limits and sampling
  settings as one rollout batch: one batch at a time for a model in this process, each request
  on its own for a generation server (`remote`; why: `batching`'s docstring).
- `deadlines`: each request's deadline, the rollout engine's stop rule for its row; a request
  past it is reported as timed out, the rest of its batch goes on. On a generation server the
  deadline also bounds each upstream call (`kgreasoner.records.http.deadline`): a call still
  running when it passes is abandoned and its connection closed, not waited for.
- here: each request gets its own `SearchSession` (handles, explored tree, shown triples), created
  for it and dropped with it, so concurrent requests never see each other's searches. A failed row
  is told apart by its trajectory's `error_kind`: a prompt the tokenizer refuses is that request's
  fault (HTTP 422, naming the field), a backend failure (an unreachable generation server) the
  server's (HTTP 502), the deadline's stop rule a timeout (HTTP 504), and malformed model output a
  normal answer with finish reason `error`. Each request of a batch fails on its own; the rest run.
  The backend comes from `kgreasoner.llm.open_backend`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.llm.spec import SPEC_FORMS, describe_forms, parse_llm_spec
from kgreasoner.records import http
from kgreasoner.records.schema import TopicEntity
from kgreasoner.retrieval.tool import KGSearchTool
from kgreasoner.rollout import Backend, RolloutConfig, RolloutEngine, TextBackend, ToolCall, Trajectory, TurnBackend
from kgreasoner.rollout.engine import ExampleDict
from kgreasoner.serving.batching import Batcher
from kgreasoner.serving.config import ServeConfig
from kgreasoner.serving.deadlines import TIMEOUT_ERROR, Deadlines
from kgreasoner.serving.validation import AnswerOptions, AnswerRequest, RequestError, RequestValidator

logger = logging.getLogger(__name__)

ENGINE_CACHE = 8
"""Rollout engines kept per worker thread for distinct (max_turns, max_new_tokens) requests; building one is cheap."""


@dataclass
class Answered:
    """The outcome of one request."""

    request: AnswerRequest
    trajectory: Trajectory | None
    seconds: float
    timed_out: bool = False
    backend_error: str | None = None
    batch_size: int = 1
    refused: RequestError | None = None
    """Set when the request was refused on its own in the worker (its prompt could not be tokenised);
    the trajectory is then None."""


def open_backend(config: ServeConfig) -> tuple[Any, str, Callable[[], None]]:
    """(rollout backend, model name, close function) for `config.llm` (`kgreasoner.llm.open_backend`)."""
    if not config.llm:
        raise ValueError(f"llm: name the model: {describe_forms(SPEC_FORMS)}")
    from kgreasoner.llm import open_backend as open_llm_backend

    spec = parse_llm_spec(config.llm)
    if spec.scheme == "hf" and config.torch_threads is not None:
        import torch

        torch.set_num_threads(config.torch_threads)
    try:
        return open_llm_backend(spec, config.tokenizer, workers=config.backend_workers, timeout=config.backend_timeout)
    except RuntimeError as err:  # a server that cannot list its models
        raise ValueError(f"llm: {err}") from err
    except FileNotFoundError as err:
        raise FileNotFoundError(f"llm: {err}") from err


def backend_kind(backend: Backend) -> str:
    """The backend's kind as the server reports it: step, turn or text."""
    return "text" if isinstance(backend, TextBackend) else "turn" if isinstance(backend, TurnBackend) else "step"


def is_remote(backend: Backend) -> bool:
    """Whether the backend sends each row's turns to a generation server (openai:URL, vllm:URL): one
    HTTP request per row and turn, through its `endpoint`; hf and offline vLLM have none."""
    return isinstance(getattr(backend, "endpoint", None), http.JSONEndpoint)


class _Runner:
    """One thread's rollout engines.

    An engine holds the stop rule of the batch it runs, so concurrent batches (a generation
    server's requests run side by side) each need their own: every worker thread has a runner.
    """

    def __init__(self, backend: Backend, tool: KGSearchTool) -> None:
        self._backend = backend
        self._tool = tool
        self._engines: collections.OrderedDict[tuple[int, int], RolloutEngine] = collections.OrderedDict()

    def engine(self, rollout: RolloutConfig) -> RolloutEngine:
        key = (rollout.max_turns, rollout.max_new_tokens)
        engine = self._engines.get(key)
        if engine is None:
            engine = RolloutEngine(self._backend, self._tool, rollout)
            self._engines[key] = engine
            while len(self._engines) > ENGINE_CACHE:
                self._engines.popitem(last=False)
        self._engines.move_to_end(key)
        return engine


class AnswerService:
    """Answers questions with one backend and one KG tool; see the module docstring."""

    def __init__(
        self,
        config: ServeConfig,
        backend: Backend,
        kg: KnowledgeGraph,
        tool: KGSearchTool | None = None,
        model_name: str = "kgreasoner",
        close: Callable[[], None] | None = None,
        on_batch: Callable[[int, float], None] | None = None,
    ) -> None:
        self.config = config
        self.kg = kg
        self.tool = tool or KGSearchTool(kg, config.tool)
        self.model_name = config.model_name or model_name
        self.kind = backend_kind(backend)
        self.text_only = isinstance(backend, TextBackend)
        self.validator = RequestValidator(config, kg)
        self.remote = is_remote(backend)
        self._backend = backend
        self._runners = threading.local()
        self._close_backend = close
        self._on_batch = on_batch
        self._closed = False
        if self.remote:
            # each request its own rollout, side by side: the server batches them (see `batching`)
            self._run_lock: contextlib.AbstractContextManager = contextlib.nullcontext()
            self._batcher = Batcher(
                self._run_batch, config.max_queue, 1, 0.0, workers=config.backend_workers, detach=True
            )
        else:
            self._run_lock = threading.Lock()  # one rollout batch at a time on the model
            self._batcher = Batcher(self._run_batch, config.max_queue, config.max_batch_size, config.batch_wait)

    @classmethod
    def open(cls, config: ServeConfig, **kwargs: Any) -> AnswerService:
        """Open the KG named by `config.kg` and the backend named by `config.llm`."""
        from kgreasoner.kg.open import open_kg

        if not config.kg:
            raise ValueError("kg: name the knowledge graph (a KG spec or path)")
        kg = open_kg(config.kg)
        try:
            backend, name, close = open_backend(config)
        except BaseException:
            kg.close()
            raise
        return cls(config, backend, kg, model_name=name, close=close, **kwargs)

    # ----------------------------------------------------------------- requests
    def prepare(
        self, question: Any, topic_entities: Any, options: AnswerOptions | None = None, request_id: str | None = None
    ) -> AnswerRequest:
        """A validated request; raises `RequestError` naming the first bad field (`RequestValidator.prepare`)."""
        return self.validator.prepare(question, topic_entities, options, request_id)

    def resolve_topics(self, items: Any) -> tuple[TopicEntity, ...]:
        """Topic entities checked in the KG (`RequestValidator.resolve_topics`)."""
        return self.validator.resolve_topics(items)

    # ----------------------------------------------------------------- running
    def answer(self, requests: Sequence[AnswerRequest]) -> list[Answered]:
        """Answer in the calling thread, in batches of `max_batch_size` (the command line's path); on a
        generation server, each request on its own, `backend_workers` at a time, as `submit` runs them."""
        if self.remote:
            with concurrent.futures.ThreadPoolExecutor(self.config.backend_workers) as pool:
                return list(pool.map(lambda request: self._run_batch([request])[0], requests))
        step = self.config.max_batch_size
        groups: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(request.batch_key, []).append(i)
        results: dict[int, Answered] = {}
        for indices in groups.values():
            for start in range(0, len(indices), step):
                chunk = indices[start : start + step]
                results.update(zip(chunk, self._run_batch([requests[i] for i in chunk])))
        return [results[i] for i in range(len(requests))]

    def submit(self, request: AnswerRequest) -> concurrent.futures.Future:
        """Queue a request for the batching worker; the future gives its `Answered`."""
        return self._batcher.submit(request)

    @property
    def queue_depth(self) -> int:
        return self._batcher.queue_depth

    def stop(self) -> None:
        """Take no more requests and fail the queued ones (503). Running requests: a model in this
        process finishes its batch first; on a generation server they are answered 503 at once and
        their workers left to end at their deadlines, so an upstream that stalls never holds a shutdown."""
        self._batcher.close()

    def close(self) -> None:
        """`stop`, then release KG and model (once; a second call does nothing)."""
        if self._closed:
            return
        self._closed = True
        self.stop()
        if self._close_backend is not None:
            self._close_backend()
        self.kg.close()

    def _runner(self) -> _Runner:
        runner = getattr(self._runners, "runner", None)
        if runner is None:
            runner = self._runners.runner = _Runner(self._backend, self.tool)
        return runner

    def _engine(self, rollout: RolloutConfig) -> RolloutEngine:
        """This thread's engine for requests with `rollout`'s limits."""
        return self._runner().engine(rollout)

    def _run_batch(self, requests: Sequence[AnswerRequest]) -> list[Answered]:
        """One rollout batch of requests that share their batch key; late requests are not started.

        On a generation server a batch is one request (`answer`, `submit`), and its deadline bounds
        every upstream call made for it: a call still running when it passes is abandoned, and the
        engine's stop rule reports the request as timed out.
        """
        start = time.monotonic()
        results: list[Answered | None] = [None] * len(requests)
        todo = []
        for i, request in enumerate(requests):
            if request.deadline is not None and start > request.deadline:
                results[i] = Answered(request, None, start - request.arrived, timed_out=True)
            else:
                todo.append(i)
        if todo:
            runner = self._runner()
            limit = requests[todo[0]].deadline if self.remote and len(todo) == 1 else None
            with self._run_lock, http.deadline(limit):
                engine = runner.engine(requests[todo[0]].rollout)
                examples: list[ExampleDict] = [
                    {"question": requests[i].question, "topic_entities": list(requests[i].topic_entities)}
                    for i in todo
                ]
                # A fresh session per request: its handles, explored tree and shown triples are its own.
                sessions = [self.tool.session(e["question"], list(e["topic_entities"])) for e in examples]
                deadlines = Deadlines(
                    {row: deadline for row, i in enumerate(todo) if (deadline := requests[i].deadline) is not None},
                    self.config.request_timeout,
                )
                trajectories = engine.run(examples, sessions, requests[todo[0]].sampling, halt=deadlines)
            end = time.monotonic()
            ran = sum(t.error_kind != "prompt" for t in trajectories)
            for i, trajectory in zip(todo, trajectories):
                request = requests[i]
                if trajectory.error_kind == "prompt":
                    refusal = _refusal(engine, request, trajectory)
                    logger.warning("request %s refused: its prompt could not be tokenised (%s)", request.id, refusal)
                    results[i] = Answered(request, None, end - request.arrived, refused=refusal)
                    continue
                results[i] = Answered(
                    request,
                    trajectory,
                    end - request.arrived,
                    timed_out=trajectory.error_kind == "halt",
                    backend_error=trajectory.error if trajectory.error_kind == "backend" else None,
                    batch_size=ran,
                )
            if self._on_batch is not None and ran:
                self._on_batch(ran, end - start)
        return [r for r in results if r is not None]

    # ----------------------------------------------------------------- output
    def record(self, answered: Answered) -> dict[str, Any]:
        """The JSON answer of one request (the `/v1/answer` body and a `kgreasoner answer --json` line)."""
        request, trajectory = answered.request, answered.trajectory
        record: dict[str, Any] = {
            "id": request.id,
            "question": request.question,
            "topic_entities": [{"id": t.id, "name": t.name} for t in request.topic_entities],
            "model": self.model_name,
            "warnings": list(request.warnings),
        }
        if trajectory is None:
            error = (
                str(answered.refused)
                if answered.refused
                else TIMEOUT_ERROR.format(seconds=self.config.request_timeout)
            )
            record.update(
                {
                    "answers": [],
                    "finish_reason": "error",
                    "error": error,
                    "trajectory": None,
                    "searches": [],
                    "usage": {"seconds": round(answered.seconds, 6)},
                }
            )
            return record
        tokens = not self.text_only  # text backends return no token ids to count
        record.update(
            {
                "answers": list(trajectory.resolved_answers),
                "raw_answers": list(trajectory.answers),
                "finish_reason": trajectory.finish_reason,
                "error": trajectory.error,
                "trajectory": trajectory.text,
                "searches": [_search_record(call) for call in trajectory.tool_calls],
                "usage": {
                    "prompt_tokens": len(trajectory.prompt_ids) if tokens else None,
                    "completion_tokens": trajectory.num_model_tokens if tokens else None,
                    "tool_tokens": trajectory.num_tool_tokens if tokens else None,
                    "tool_calls": trajectory.num_tool_calls,
                    "searches": trajectory.num_searches,
                    "backtracks": trajectory.num_backtracks,
                    "batch_size": answered.batch_size,
                    "seconds": round(answered.seconds, 6),
                },
            }
        )
        return record


def _search_record(call: ToolCall) -> dict[str, Any]:
    """One search of an answer's `searches`; the searched entity's label is the one the call carried
    (a topic entity's name as the request gave it), so a KG that went down after generation costs nothing."""
    return {
        "query": call.query,
        "entity": call.entity,
        "label": None if call.entity is None else call.labels.get(call.entity),
        "backtrack": call.backtracked,
        "error": call.error,
        "num_triples": call.num_edges,
        "truncated": call.truncated,
        "text": call.text,
        "seconds": round(call.seconds, 6),
    }


def _refusal(engine: RolloutEngine, request: AnswerRequest, trajectory: Trajectory) -> RequestError:
    """The refusal of a request whose prompt the engine could not tokenise, naming the field at fault.

    Only a failed prompt is tokenised again, field by field: `prepare` already rejects text that is
    not valid Unicode, so this names whatever else the tokenizer refuses.
    """
    fields = [("question", request.question)]
    fields += [(f"topic_entities[{j}].name", topic.name) for j, topic in enumerate(request.topic_entities)]
    for field, text in fields:
        try:
            engine.encode(text)
        except Exception as err:  # any tokenizer error: this field's text is at fault
            return RequestError(
                field, f"cannot be tokenised by the model's tokenizer ({type(err).__name__}: {str(err)[:200]})"
            )
    return RequestError("question", str(trajectory.error))
