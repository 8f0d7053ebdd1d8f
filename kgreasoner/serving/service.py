"""The answer service: one model backend, one KG search tool, requests validated and batched.

`AnswerService` is what both `kgreasoner answer` (synchronously, `answer(requests)`) and the HTTP
app (`submit(request)` -> future, from a batching worker thread) run:

- `prepare(question, topic_entities, options)` checks a request against the config's limits and
  resolves its topic entities in the KG; every problem is a `RequestError` naming the field.
- Each request gets its own `SearchSession` (handles, explored tree, shown triples), created for
  it and dropped with it, so concurrent requests never see each other's searches.
- The worker takes the first waiting request, waits `batch_wait` seconds for more, and runs up to
  `max_batch_size` requests with the same limits and sampling settings as one rollout batch.
  Greedy results do not depend on the batch; seeded sampling draws from one generator per batch,
  so a sampled answer depends on which requests shared its batch.
- Timeouts: each request has a deadline (arrival + `request_timeout`). The engine stops a row
  whose deadline passed (per token for hf and vllm, per turn for openai) and the request is
  reported as timed out; the rest of its batch goes on.
- Backend failures (an unreachable generation server) are told apart from malformed model output:
  the first is the server's fault (HTTP 502), the second a normal answer with finish reason `error`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from kgreasoner.data.schema import TopicEntity
from kgreasoner.kg.base import KGError, KGQueryRejected, KnowledgeGraph
from kgreasoner.llm.spec import SPEC_FORMS, describe_forms, parse_llm_spec
from kgreasoner.retrieval.tool import KGSearchTool
from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams, Trajectory
from kgreasoner.serving.config import SEED_RANGE, ServeConfig

logger = logging.getLogger(__name__)

TIMEOUT_ERROR = "generation stopped: the request timeout ({seconds:g} s) passed"
MIN_TEMPERATURE = 0.01
"""Smaller positive temperatures are raised to this (as vLLM does): dividing logits by 1e-300 in
float32 overflows to inf and the softmax gives NaN probabilities."""
ENGINE_CACHE = 8
"""Rollout engines kept for distinct (max_turns, max_new_tokens) requests; building one is cheap."""


class RequestError(ValueError):
    """A request the service refuses; `param` names the field, `status` is the HTTP code to send."""

    def __init__(self, param: str | None, message: str, status: int = 422, kind: str = "invalid_request_error") -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param
        self.message = str(self)
        self.status = status
        self.kind = kind


class ServiceBusy(RuntimeError):
    """The queue is full or the service is closing (HTTP 503)."""


@dataclass
class AnswerOptions:
    """Per-request settings; None takes the server's default. Limits may only be lowered."""

    max_turns: int | None = None
    max_new_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None


@dataclass
class AnswerRequest:
    """A validated request: the question, its resolved topic entities and its generation settings."""

    id: str
    question: str
    topic_entities: tuple[TopicEntity, ...]
    rollout: RolloutConfig
    sampling: SamplingParams
    deadline: float | None = None
    """`time.monotonic()` past which generation stops (None: no timeout)."""
    arrived: float = field(default_factory=time.monotonic)

    @property
    def batch_key(self) -> tuple:
        return (self.rollout.max_turns, self.rollout.max_new_tokens, dataclasses.astuple(self.sampling))


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
    """Set when the request was refused on its own in the worker (its prompt could not be tokenised)."""


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


class _RecordingBackend:
    """Passes every call to the real backend and notes which rows' generation requests failed."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.failures: dict[int, str] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def complete(self, prompts, budgets, sampling, turn, indices, **constraints):
        return self._note(indices, self._inner.complete(prompts, budgets, sampling, turn, indices, **constraints))

    def complete_text(self, prompts, budgets, sampling, turn, indices):
        return self._note(indices, self._inner.complete_text(prompts, budgets, sampling, turn, indices))

    def _note(self, indices: Sequence[int], outputs: list) -> list:
        for index, output in zip(indices, outputs):
            if output.error is not None:
                self.failures[index] = output.error
        return outputs


class _ServingEngine(RolloutEngine):
    """The rollout engine plus per-row deadlines (row index -> `time.monotonic()` limit)."""

    def __init__(self, backend: Any, tool: Any, config: RolloutConfig, timeout: float) -> None:
        super().__init__(backend, tool, config)
        self.deadlines: dict[int, float] = {}
        self.timed_out: set[int] = set()
        self._timeout_text = TIMEOUT_ERROR.format(seconds=timeout)

    def _late(self, row: Any) -> bool:
        deadline = self.deadlines.get(row.index)
        if deadline is None or time.monotonic() <= deadline:
            return False
        row.finish("error", self._timeout_text)
        self.timed_out.add(row.index)
        return True

    def accept(self, row: Any, token: int, logprob: float) -> bool:
        waiting = super().accept(row, token, logprob)
        if not row.finished and self._late(row):
            return False
        return waiting

    def run_tools(self, rows: Sequence[Any]) -> dict[int, list[int]]:
        return super().run_tools([row for row in rows if not self._late(row)])

    def tokenize_prompt(self, question: str, topic_entities: Sequence[TopicEntity]) -> None:
        """Build and tokenise one request's prompt as `run` will; raises what the tokenizer raises.

        It costs one more tokenisation of the prompt per request, small beside its generation.
        """
        self._prompt({"question": question, "topic_entities": list(topic_entities)})


class AnswerService:
    """Answers questions with one backend and one KG tool; see the module docstring."""

    def __init__(self, config: ServeConfig, backend: Any, kg: KnowledgeGraph, tool: KGSearchTool | None = None,
                 model_name: str = "kgreasoner", close: Callable[[], None] | None = None,
                 on_batch: Callable[[int, float], None] | None = None) -> None:
        self.config = config
        self.kg = kg
        self.tool = tool or KGSearchTool(kg, config.tool)
        self.model_name = config.model_name or model_name
        self.kind = backend.kind
        self._backend = _RecordingBackend(backend)
        self._close_backend = close
        self._on_batch = on_batch
        self._engines: collections.OrderedDict[tuple[int, int], _ServingEngine] = collections.OrderedDict()
        self._run_lock = threading.Lock()  # one rollout batch at a time on the model
        self._cond = threading.Condition()
        self._queue: collections.deque[tuple[AnswerRequest, concurrent.futures.Future]] = collections.deque()
        self._worker: threading.Thread | None = None
        self._closed = False
        self._ids = itertools.count(1)

    @classmethod
    def open(cls, config: ServeConfig, **kwargs: Any) -> "AnswerService":
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
    def prepare(self, question: Any, topic_entities: Any, options: AnswerOptions | None = None,
                request_id: str | None = None) -> AnswerRequest:
        """A validated request; raises `RequestError` naming the first bad field."""
        config = self.config
        if not isinstance(question, str):
            raise RequestError("question", f"must be a string, got {type(question).__name__}")
        check_unicode("question", question)
        question = question.strip()
        if not question:
            raise RequestError("question", "is empty")
        if len(question) > config.max_question_chars:
            raise RequestError("question", f"has {len(question)} characters; the limit is {config.max_question_chars}")
        options = options or AnswerOptions()
        rollout = dataclasses.replace(
            config.rollout,
            max_turns=_capped("options.max_turns", options.max_turns, 0, config.rollout.max_turns),
            max_new_tokens=_capped("options.max_new_tokens", options.max_new_tokens, 1, config.rollout.max_new_tokens),
        )
        temperature = config.temperature if options.temperature is None else options.temperature
        if isinstance(temperature, (int, float)) and 0 < temperature < MIN_TEMPERATURE:
            temperature = MIN_TEMPERATURE
        seed = config.seed if options.seed is None else options.seed
        if isinstance(seed, int) and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
            raise RequestError("options.seed", f"must be in [{SEED_RANGE[0]}, {SEED_RANGE[1]}], got {seed}")
        try:
            sampling = SamplingParams(
                temperature=temperature,
                top_p=1.0 if options.top_p is None else options.top_p,
                top_k=0 if options.top_k is None else options.top_k,
                seed=seed,
            )
        except ValueError as err:
            raise RequestError("options", str(err)) from err
        topics = self.resolve_topics(topic_entities)  # last: it may query a remote KG
        now = time.monotonic()
        return AnswerRequest(id=request_id or f"q{next(self._ids)}", question=question, topic_entities=topics,
                             rollout=rollout, sampling=sampling, deadline=now + config.request_timeout, arrived=now)

    def resolve_topics(self, items: Any) -> tuple[TopicEntity, ...]:
        """Topic entities given as names/ids (strings) or `{"id", "name"}` objects, checked in the KG.

        A string or a name-only object is looked up by label (then id); an object with an id must
        name an entity of the KG and keeps its own name when it gives one. Among namesakes the
        KG's first match is taken.
        """
        if not isinstance(items, (list, tuple)):
            raise RequestError("topic_entities", f"must be a list, got {type(items).__name__}")
        if not items:
            raise RequestError("topic_entities", "is empty: name at least one topic entity")
        if len(items) > self.config.max_topic_entities:
            raise RequestError("topic_entities", f"names {len(items)} entities; the limit is {self.config.max_topic_entities}")
        topics = []
        for i, item in enumerate(items):
            where = f"topic_entities[{i}]"
            if isinstance(item, TopicEntity):
                item = {"id": item.id, "name": item.name}
            if isinstance(item, str):
                item = {"name": item}
            if not isinstance(item, dict):
                raise RequestError(where, f"must be a string or an object with 'id' and/or 'name', got {type(item).__name__}")
            entity_id, name = item.get("id"), item.get("name")
            for key, value in (("id", entity_id), ("name", name)):
                if value is not None and (not isinstance(value, str) or not value.strip()):
                    raise RequestError(f"{where}.{key}", "must be a non-empty string")
                if value is not None and len(value) > self.config.max_question_chars:
                    raise RequestError(f"{where}.{key}", f"is longer than {self.config.max_question_chars} characters")
                if value is not None:
                    check_unicode(f"{where}.{key}", value)
            if entity_id is None and name is None:
                raise RequestError(where, "needs an 'id' or a 'name'")
            try:
                if entity_id is not None:
                    entity_id = entity_id.strip()
                    if entity_id not in self.kg.resolve(entity_id):
                        raise RequestError(f"{where}.id", f"{entity_id!r} is not an entity of the knowledge graph",
                                           kind="unknown_entity")
                    topics.append(TopicEntity(entity_id, (name or "").strip() or self.kg.label(entity_id)))
                    continue
                hits = self.kg.resolve(name.strip())
            except KGError as err:
                raise kg_failure(where, err) from err
            if not hits:
                raise RequestError(where, f"no entity named {name.strip()!r} in the knowledge graph", kind="unknown_entity")
            topics.append(TopicEntity(hits[0], name.strip()))
        return tuple(topics)

    # ----------------------------------------------------------------- running
    def answer(self, requests: Sequence[AnswerRequest]) -> list[Answered]:
        """Answer in the calling thread, in batches of `max_batch_size` (the command line's path)."""
        step = self.config.max_batch_size
        groups: dict[tuple, list[int]] = {}
        for i, request in enumerate(requests):
            groups.setdefault(request.batch_key, []).append(i)
        results: dict[int, Answered] = {}
        for indices in groups.values():
            for start in range(0, len(indices), step):
                chunk = indices[start:start + step]
                results.update(zip(chunk, self._run_batch([requests[i] for i in chunk])))
        return [results[i] for i in range(len(requests))]

    def submit(self, request: AnswerRequest) -> concurrent.futures.Future:
        """Queue a request for the batching worker; the future gives its `Answered`."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._cond:
            if self._closed:
                raise ServiceBusy("the service is shutting down")
            if len(self._queue) >= self.config.max_queue:
                raise ServiceBusy(f"{len(self._queue)} requests are waiting (max_queue); retry later")
            if self._worker is None:
                self._worker = threading.Thread(target=self._serve, name="kgreasoner-batcher", daemon=True)
                self._worker.start()
            self._queue.append((request, future))
            self._cond.notify()
        return future

    @property
    def queue_depth(self) -> int:
        with self._cond:
            return len(self._queue)

    def close(self) -> None:
        """Stop the worker (after the batch it is running), fail queued requests, release KG and model."""
        with self._cond:
            self._closed = True
            pending = list(self._queue)
            self._queue.clear()
            self._cond.notify_all()
        for _, future in pending:
            if future.set_running_or_notify_cancel():
                future.set_exception(ServiceBusy("the service shut down before this request ran"))
        if self._worker is not None:
            self._worker.join()
            self._worker = None
        if self._close_backend is not None:
            self._close_backend()
        self.kg.close()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                end = time.monotonic() + self.config.batch_wait
                while len(self._queue) < self.config.max_batch_size and not self._closed:
                    left = end - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
                batch = self._take_batch()
            live = [(request, future) for request, future in batch if future.set_running_or_notify_cancel()]
            if not live:
                continue
            try:
                results = self._run_batch([request for request, _ in live])
            except Exception as err:  # a model/backend crash fails this batch, not the service
                logger.exception("rollout batch of %d requests failed", len(live))
                for _, future in live:
                    future.set_exception(err)
                continue
            for (_, future), answered in zip(live, results):
                future.set_result(answered)

    def _take_batch(self) -> list[tuple[AnswerRequest, concurrent.futures.Future]]:
        """The oldest request and the next ones with the same batch key, up to max_batch_size."""
        first = self._queue.popleft()
        batch, rest = [first], collections.deque()
        while self._queue:
            item = self._queue.popleft()
            if len(batch) < self.config.max_batch_size and item[0].batch_key == first[0].batch_key:
                batch.append(item)
            else:
                rest.append(item)
        self._queue.extend(rest)
        return batch

    def _engine(self, rollout: RolloutConfig) -> _ServingEngine:
        key = (rollout.max_turns, rollout.max_new_tokens)
        engine = self._engines.get(key)
        if engine is None:
            engine = _ServingEngine(self._backend, self.tool, rollout, self.config.request_timeout)
            self._engines[key] = engine
            while len(self._engines) > ENGINE_CACHE:
                self._engines.popitem(last=False)
        self._engines.move_to_end(key)
        return engine

    def _run_batch(self, requests: Sequence[AnswerRequest]) -> list[Answered]:
        """One rollout batch of requests that share their batch key; late requests are not started."""
        start = time.monotonic()
        results: list[Answered | None] = [None] * len(requests)
        todo = []
        for i, request in enumerate(requests):
            if request.deadline is not None and start > request.deadline:
                results[i] = Answered(request, None, start - request.arrived, timed_out=True)
            else:
                todo.append(i)
        if todo:
            with self._run_lock:
                engine = self._engine(requests[todo[0]].rollout)
                todo = [i for i in todo if not self._refuse_untokenisable(engine, requests[i], results, i)]
                examples = [{"question": requests[i].question, "topic_entities": list(requests[i].topic_entities)}
                            for i in todo]
                # A fresh session per request: its handles, explored tree and shown triples are its own.
                sessions = [self.tool.session(e["question"], e["topic_entities"]) for e in examples]
                engine.deadlines = {row: requests[i].deadline for row, i in enumerate(todo)
                                    if requests[i].deadline is not None}
                engine.timed_out = set()
                self._backend.failures = {}
                trajectories = engine.run(examples, sessions, requests[todo[0]].sampling) if todo else []
                timed_out, failures = set(engine.timed_out), dict(self._backend.failures)
            end = time.monotonic()
            for row, (i, trajectory) in enumerate(zip(todo, trajectories)):
                results[i] = Answered(requests[i], trajectory, end - requests[i].arrived, timed_out=row in timed_out,
                                      backend_error=failures.get(row), batch_size=len(todo))
            if self._on_batch is not None and todo:
                self._on_batch(len(todo), end - start)
        return [r for r in results if r is not None]

    def _refuse_untokenisable(self, engine: _ServingEngine, request: AnswerRequest, results: list, i: int) -> bool:
        """Tokenise one request's prompt alone; a failure refuses that request instead of failing its batch.

        `prepare` already rejects text that is not valid Unicode; this catches whatever else a
        tokenizer refuses, so one request never takes down the rest of its batch.
        """
        try:
            engine.tokenize_prompt(request.question, request.topic_entities)
            return False
        except Exception as err:  # any tokenizer error: this request's text is at fault, not the batch
            field = "question"
            for j, topic in enumerate(request.topic_entities):
                try:
                    engine.encode(topic.name)
                except Exception:
                    field = f"topic_entities[{j}].name"
                    break
            logger.warning("request %s refused: its prompt could not be tokenised (%s)", request.id, err)
            results[i] = Answered(request, None, time.monotonic() - request.arrived, refused=RequestError(
                field, f"cannot be tokenised by the model's tokenizer ({type(err).__name__}: {str(err)[:200]})"))
            return True

    # ----------------------------------------------------------------- output
    def record(self, answered: Answered) -> dict[str, Any]:
        """The JSON answer of one request (the `/v1/answer` body and a `kgreasoner answer --json` line)."""
        request, trajectory = answered.request, answered.trajectory
        record: dict[str, Any] = {
            "id": request.id,
            "question": request.question,
            "topic_entities": [{"id": t.id, "name": t.name} for t in request.topic_entities],
            "model": self.model_name,
        }
        if trajectory is None:
            error = str(answered.refused) if answered.refused else TIMEOUT_ERROR.format(seconds=self.config.request_timeout)
            record.update({"answers": [], "finish_reason": "error", "error": error, "trajectory": None, "searches": [],
                "usage": {"seconds": round(answered.seconds, 6)}})
            return record
        tokens = self.kind != "text"  # text backends return no token ids to count
        names = {t.id: t.name for t in request.topic_entities}
        record.update({
            "answers": list(trajectory.resolved_answers),
            "raw_answers": list(trajectory.answers),
            "finish_reason": trajectory.finish_reason,
            "error": trajectory.error,
            "trajectory": trajectory.text,
            "searches": [self._search_record(call, names) for call in trajectory.tool_calls],
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
        })
        return record

    def _label(self, entity: str | None, names: dict[str, str]) -> str | None:
        """A searched entity's label: the request's own name for a topic, else the KG's.

        The trajectory is finished by now; a KG that went down after generation costs the
        record this label (None, logged), never the trajectory.
        """
        if entity is None:
            return None
        if entity in names:
            return names[entity]
        try:
            return self.kg.label(entity)
        except KGError as err:
            logger.warning("label of %r left out of a finished answer: %s", entity, err)
            return None

    def _search_record(self, call: Any, names: dict[str, str]) -> dict[str, Any]:
        return {
            "query": call.query,
            "entity": call.entity,
            "label": self._label(call.entity, names),
            "backtrack": call.backtracked,
            "error": call.error,
            "num_triples": call.num_edges,
            "truncated": call.truncated,
            "text": call.text,
            "seconds": round(call.seconds, 6),
        }


def kg_failure(param: str | None, err: KGError) -> RequestError:
    """What a request gets when the KG fails on it: 503 while the KG cannot be reached (the client
    should retry), 502 when the KG endpoint refused the query (an HTTP 4xx: retrying will not help)."""
    if isinstance(err, KGQueryRejected):
        return RequestError(param, f"the knowledge graph refused the query: {err}", status=502, kind="kg_rejected")
    return RequestError(param, f"the knowledge graph could not be queried: {err}", status=503, kind="kg_unavailable")


def check_unicode(param: str, text: str) -> None:
    """Refuse text holding a lone surrogate: JSON can carry one, but no tokenizer, UTF-8 or RDF can."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        raise RequestError(param, f"is not valid Unicode: a lone surrogate U+{ord(text[err.start]):04X} at "
                           f"position {err.start}") from None


def _capped(name: str, value: Any, low: int, cap: int) -> int:
    if value is None:
        return cap
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(name, f"must be an integer, got {value!r}")
    if value < low:
        raise RequestError(name, f"must be >= {low}, got {value}")
    if value > cap:
        raise RequestError(name, f"{value} is above this server's limit of {cap}")
    return value
