"""Requests checked before they queue: the question, its topic entities (resolved in the KG), the
generation options (limits may only be lowered) and the request's deadline.

Every problem is a `RequestError` naming the field; a KG that fails while topic entities are
resolved gives 503 (unreachable) or 502 (it refused the query), `kg_failure`.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from kgreasoner.kg.base import KGError, KGQueryRejected, KnowledgeGraph
from kgreasoner.records.schema import TopicEntity
from kgreasoner.rollout import RolloutConfig, SamplingParams
from kgreasoner.serving.config import SEED_RANGE, ServeConfig

MIN_TEMPERATURE = 0.01
"""Smaller positive temperatures are raised to this (as vLLM does): dividing logits by 1e-300 in
float32 overflows to inf and the softmax gives NaN probabilities."""


class RequestError(ValueError):
    """A request the service refuses; `param` names the field, `status` is the HTTP code to send."""

    def __init__(
        self, param: str | None, message: str, status: int = 422, kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(f"{param}: {message}" if param else message)
        self.param = param
        self.message = str(self)
        self.status = status
        self.kind = kind


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
    warnings: tuple[str, ...] = ()
    """What the request said that was not used, e.g. a topic name the KG contradicts (the answer lists them)."""

    @property
    def batch_key(self) -> tuple:
        return (self.rollout.max_turns, self.rollout.max_new_tokens, dataclasses.astuple(self.sampling))


class RequestValidator:
    """Turns what a client sent into an `AnswerRequest` under the config's limits, or a `RequestError`."""

    def __init__(self, config: ServeConfig, kg: KnowledgeGraph) -> None:
        self.config = config
        self.kg = kg
        self._ids = itertools.count(1)

    def prepare(
        self, question: Any, topic_entities: Any, options: AnswerOptions | None = None, request_id: str | None = None
    ) -> AnswerRequest:
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
        warnings: list[str] = []
        topics = self.resolve_topics(topic_entities, warnings)  # last: it may query a remote KG
        now = time.monotonic()
        return AnswerRequest(
            id=request_id or f"q{next(self._ids)}",
            question=question,
            topic_entities=topics,
            rollout=rollout,
            sampling=sampling,
            deadline=now + config.request_timeout,
            arrived=now,
            warnings=tuple(warnings),
        )

    def resolve_topics(self, items: Any, warnings: list[str] | None = None) -> tuple[TopicEntity, ...]:
        """Topic entities given as names/ids (strings) or `{"id", "name"}` objects, checked in the KG.

        A string or a name-only object is looked up by label (then id). An object with an id must
        name an entity of the KG, and the prompt shows the KG's label: a `name` that is not one of the
        entity's names (a client's "France" for Utah's id) is not used, and a line saying so joins
        `warnings`. Only an entity the KG labels with its id alone takes the request's name. Among
        namesakes the KG's first match is taken.
        """
        if not isinstance(items, (list, tuple)):
            raise RequestError("topic_entities", f"must be a list, got {type(items).__name__}")
        if not items:
            raise RequestError("topic_entities", "is empty: name at least one topic entity")
        if len(items) > self.config.max_topic_entities:
            raise RequestError(
                "topic_entities", f"names {len(items)} entities; the limit is {self.config.max_topic_entities}"
            )
        topics = []
        for i, item in enumerate(items):
            where = f"topic_entities[{i}]"
            if isinstance(item, TopicEntity):
                item = {"id": item.id, "name": item.name}
            if isinstance(item, str):
                item = {"name": item}
            if not isinstance(item, dict):
                raise RequestError(
                    where, f"must be a string or an object with 'id' and/or 'name', got {type(item).__name__}"
                )
            entity_id, name = item.get("id"), item.get("name")
            for key, value in (("id", entity_id), ("name", name)):
                if value is not None and (not isinstance(value, str) or not value.strip()):
                    raise RequestError(f"{where}.{key}", "must be a non-empty string")
                if value is not None and len(value) > self.config.max_question_chars:
                    raise RequestError(f"{where}.{key}", f"is longer than {self.config.max_question_chars} characters")
                if value is not None:
                    check_unicode(f"{where}.{key}", value)
            try:
                if entity_id is not None:
                    entity_id = entity_id.strip()
                    if entity_id not in self.kg.resolve(entity_id):
                        raise RequestError(
                            f"{where}.id",
                            f"{entity_id!r} is not an entity of the knowledge graph",
                            kind="unknown_entity",
                        )
                    topics.append(TopicEntity(entity_id, self._topic_name(where, entity_id, name, warnings)))
                    continue
                if name is None:
                    raise RequestError(where, "needs an 'id' or a 'name'")
                hits = self.kg.resolve(name.strip())
            except KGError as err:
                raise kg_failure(where, err) from err
            if not hits:
                raise RequestError(
                    where, f"no entity named {name.strip()!r} in the knowledge graph", kind="unknown_entity"
                )
            topics.append(TopicEntity(hits[0], name.strip()))
        return tuple(topics)

    def _topic_name(self, where: str, entity_id: str, name: str | None, warnings: list[str] | None) -> str:
        """The name a topic given by id is shown with: the KG's label (see `resolve_topics`)."""
        label = self.kg.label(entity_id)
        given = (name or "").strip()
        if not given or given == label:
            return label
        if label == entity_id:  # no label beyond the id: the request's name contradicts nothing
            return given
        if entity_id not in self.kg.resolve(given) and warnings is not None:
            warnings.append(
                f"{where}.name: {given!r} is not a name of {entity_id!r} in the knowledge graph; "
                f"its label {label!r} is used"
            )
        return label


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
        raise RequestError(
            param, f"is not valid Unicode: a lone surrogate U+{ord(text[err.start]):04X} at position {err.start}"
        ) from None


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
