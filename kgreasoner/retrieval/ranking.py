"""Ordering candidates for a question: `gat` (the ranker), `embedding` (cosine), `none` (KG order).

Also turns (question, candidates) groups into `RankerInputs`: texts are collected into a
`TextTable`, encoded once, and each group keeps row numbers into it, so training encodes every
distinct text once and inference encodes only what a call needs (the encoder's cache does the rest).
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections import Counter, OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import torch

from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.sparql import SparqlKG
from kgreasoner.records.edges import Edge
from kgreasoner.retrieval.candidates import (
    Candidate,
    PendingGroup,
    RankedCandidates,
    edge_text,
    gather_candidates,
    group_candidates,
    relation_phrase,
    relation_words,
)
from kgreasoner.retrieval.encoder import TextEncoder, humanize_label
from kgreasoner.retrieval.ranker import GATRanker, RankerInputs

RANKING_METHODS = ("gat", "embedding", "none")

_Ranking = tuple[list[Candidate], tuple[PendingGroup, ...], Callable[[PendingGroup], list[Candidate]] | None]
"""What `RankedCandidates` is built from: the ranked candidates, pending groups and their build."""


class TextTable:
    """Distinct texts in first-seen order, each with a row number."""

    def __init__(self) -> None:
        self.rows: dict[str, int] = {}

    def row(self, text: str) -> int:
        return self.rows.setdefault(text, len(self.rows))

    def embed(self, encoder: TextEncoder) -> torch.Tensor:
        if not self.rows:
            return torch.zeros((0, encoder.dim))
        return torch.from_numpy(np.ascontiguousarray(encoder.encode(list(self.rows))))


@dataclass
class GroupRows:
    """One question's candidates as row numbers into a TextTable (see RankerInputs)."""

    question: int
    cand_relation: np.ndarray
    cand_entity: np.ndarray
    ctx_value: np.ndarray
    ctx_relation: np.ndarray
    ctx_target: np.ndarray

    @property
    def num_candidates(self) -> int:
        return len(self.cand_relation)


def group_rows(
    table: TextTable, question: str, candidates: Sequence[Candidate], contexts: Sequence[Sequence[Edge]]
) -> GroupRows:
    """Rows for a question, its candidates and each candidate's context edges."""
    return group_rows_of_texts(
        table, question, candidates, [[context_texts(edge) for edge in context] for context in contexts]
    )


def context_texts(edge: Edge) -> tuple[str, str]:
    """The two texts the ranker reads of a context edge: "relation neighbour" and the relation."""
    # A graph has few relations: one string per phrase serves every cached context edge.
    return edge_text(edge), sys.intern(relation_phrase(edge))


def group_rows_of_texts(
    table: TextTable, question: str, candidates: Sequence[Candidate], contexts: Sequence[Sequence[tuple[str, str]]]
) -> GroupRows:
    """`group_rows` with each context edge given by its `context_texts`."""
    row = table.row
    ctx_value, ctx_relation, ctx_target = [], [], []
    for index, context in enumerate(contexts):
        for value, relation in context:
            ctx_value.append(row(value))
            ctx_relation.append(row(relation))
        ctx_target.extend([index] * len(context))
    return GroupRows(
        question=row(question),
        cand_relation=np.array([row(c.relation_text()) for c in candidates], dtype=np.int64),
        cand_entity=np.array([row(humanize_label(c.target_label)) for c in candidates], dtype=np.int64),
        ctx_value=np.array(ctx_value, dtype=np.int64),
        ctx_relation=np.array(ctx_relation, dtype=np.int64),
        ctx_target=np.array(ctx_target, dtype=np.int64),
    )


def collate(groups: Sequence[GroupRows], embeddings: torch.Tensor) -> RankerInputs:
    """Stack groups into one batch; context targets are shifted to the batch's candidate numbering."""
    offsets = np.cumsum([0] + [g.num_candidates for g in groups])
    cat = np.concatenate

    def rows(values: list[np.ndarray]) -> torch.Tensor:
        index = torch.from_numpy(cat(values)) if values else torch.zeros(0, dtype=torch.long)
        return embeddings[index]

    return RankerInputs(
        question=embeddings[torch.tensor([g.question for g in groups], dtype=torch.long)],
        cand_question=torch.from_numpy(
            cat([np.full(g.num_candidates, i, dtype=np.int64) for i, g in enumerate(groups)])
        ),
        cand_relation=rows([g.cand_relation for g in groups]),
        cand_entity=rows([g.cand_entity for g in groups]),
        ctx_value=rows([g.ctx_value for g in groups]),
        ctx_relation=rows([g.ctx_relation for g in groups]),
        ctx_target=torch.from_numpy(cat([g.ctx_target + offsets[i] for i, g in enumerate(groups)])),
    )


@dataclass
class Timings:
    """Seconds spent, summed over calls: fetching context from the KG, encoding texts, scoring."""

    fetch: float = 0.0
    encode: float = 0.0
    rank: float = 0.0
    cached: int = 0
    """Calls of `rank` answered from its cache."""

    def reset(self) -> None:
        self.fetch = self.encode = self.rank = 0.0
        self.cached = 0


@dataclass
class CandidateScorer:
    """Scores candidates for a question with one of RANKING_METHODS.

    At a hub (more than `rerank_pool` candidates) `embedding` and `gat` score only the
    `rerank_pool` candidates whose relation text is closest to the question (a hub has thousands
    of neighbours but few distinct relations, so this costs a few encodings); the rest follow
    below them in that order. This bounds the text encoding and KG fetches of one call.

    `rank` goes further at an entity with more than `relation_first` edges: it scores the entity's
    few relations first (cosine of the question and each relation's words, one text per relation
    and direction), takes the candidates of the first `rerank_pool` edges of the best relations
    only, and lets `order` (the ranker) order those; the other edges follow, relation by relation in
    that relation order and in KG order within one. A store with a relation index (the memory
    store, and the per-question views of `subgraph`) fetches only the pool's edges and builds the
    rest when a later page reads it, so a hub costs what an entity of `rerank_pool` edges does;
    other backends fetch the entity's edges whole, as the exact path does (up to `neighbor_limit`),
    and are spared the ranking of all of them. The approximation: a relation whose words are far
    from the question cannot place an entity in the first page however well the ranker would score
    it, and a mediator's second relation does not count in the relation order. Smaller entities
    (and `relation_first=None`) take the exact path.

    The exact path reads an entity's first `neighbor_limit` edges at once; when that cut some off, the
    store's per-relation counts (`relation_counts`) turn the rest into pending groups after the ranked
    candidates, so a relation past the cut is still listed at its true count, paged to, and built at
    once by a filter that names it (`RankedCandidates.build_relations`).

    Three caches per graph make repeated work free; none changes a result (the graph, the encoder
    and the ranker are read-only here), each drops its least recently used entries first. Rankings,
    per entity, question and fetch settings, up to `rank_cache` candidates in all: the rollouts of
    one GRPO group search the same entities for the same question; each call still gets its own
    `RankedCandidates`, so sessions share no state. An entity's candidates on the exact path, up to
    `candidate_cache` in all: another question searching it skips the fetch (over SPARQL, a
    request). The edges the ranker reads as a candidate's context, for `context_cache` nodes,
    reused by later searches of other entities and questions.
    """

    method: str
    kg: KnowledgeGraph
    encoder: TextEncoder | None = None
    model: GATRanker | None = None
    max_context: int = 16
    rerank_pool: int | None = 64
    relation_first: int | None = 256
    rank_cache: int = 200_000
    candidate_cache: int = 200_000
    context_cache: int = 16384
    timings: Timings = field(default_factory=Timings)
    _caches: weakref.WeakKeyDictionary[KnowledgeGraph, _GraphCache] = field(
        default_factory=weakref.WeakKeyDictionary, init=False, repr=False
    )
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.method not in RANKING_METHODS:
            raise ValueError(f"ranking method must be one of {RANKING_METHODS}, got {self.method!r}")
        if self.method in ("gat", "embedding") and self.encoder is None:
            raise ValueError(f"ranking method {self.method!r} needs a text encoder")
        if self.method == "gat" and self.model is None:
            raise ValueError("ranking method 'gat' needs a trained ranker (ToolConfig.ranker_path)")

    def rank(
        self,
        question: str,
        entity: str,
        kg: KnowledgeGraph | None = None,
        expand_mediators: bool = True,
        neighbor_limit: int | None = None,
    ) -> RankedCandidates:
        """The candidates of `entity` best first (see the class docstring for when relation first).

        `neighbor_limit` caps the edges fetched per node: the entity's own on the exact path, each
        mediator's on both paths (relation first reaches all of a hub's edges, a relation at a time).
        """
        kg = kg or self.kg
        key = (entity, question, expand_mediators, neighbor_limit)
        cache = self._cache(kg)
        hit = cache.rankings.get(key)
        if hit is not None:
            self.timings.cached += 1
            return RankedCandidates(*hit)
        ranked = self._rank(question, entity, kg, expand_mediators, neighbor_limit)
        cache.rankings.put(key, ranked, self.rank_cache, weight=len(ranked[0]) + 1)
        return RankedCandidates(*ranked)

    def _rank(
        self, question: str, entity: str, kg: KnowledgeGraph, expand_mediators: bool, neighbor_limit: int | None
    ) -> _Ranking:
        """What `RankedCandidates` is built from: the ranked candidates, pending groups and their build."""
        start = time.perf_counter()
        relation_first = self._relation_first_degree()
        if relation_first is not None and isinstance(kg, MemoryKG) and kg.degree(entity) > relation_first:
            return self._rank_relation_first(question, entity, kg, expand_mediators, neighbor_limit, start)
        cache = self._cache(kg)
        key = (entity, expand_mediators, neighbor_limit)
        fetched = cache.candidates.get(key)
        if fetched is None:
            candidates = gather_candidates(kg, entity, expand_mediators, neighbor_limit)
            fetched = candidates, _unfetched(kg, entity, candidates, neighbor_limit)
            cache.candidates.put(key, fetched, self.candidate_cache, weight=len(candidates) + len(fetched[1]) + 1)
        candidates, unfetched = fetched
        self.timings.fetch += time.perf_counter() - start
        build = _builder(kg, entity, expand_mediators, neighbor_limit, whole=True) if unfetched else None
        if relation_first is not None:
            groups: dict[tuple[str, str], list[Candidate]] = {}
            for candidate in candidates:
                groups.setdefault((candidate.edges[0].relation, candidate.edges[0].direction), []).append(candidate)
            edges = [_first_edges(members) for members in groups.values()]
            if sum(edges) > relation_first:  # as the memory store's path, over candidates fetched whole
                return self._relation_first_fetched(question, kg, groups, edges), unfetched, build
        return [candidates[i] for i in self.order(question, candidates, kg)], unfetched, build

    def _relation_first_degree(self) -> int | None:
        """The degree above which an entity is ranked relation first; None: never (no pool, or no ranking)."""
        if self.rerank_pool is None or self.method == "none":
            return None
        return self.relation_first

    def _relation_order(self, question: str, groups: Sequence[tuple[str, str]]) -> list[int]:
        """Indices of (relation, direction) groups, the relation whose words are closest to the question first."""
        closeness = self._cosine(question, [relation_words(relation, side) for relation, side in groups])
        return sorted(range(len(groups)), key=lambda g: (-closeness[g], g))

    def _relation_first_fetched(
        self, question: str, kg: KnowledgeGraph, groups: dict[tuple[str, str], list[Candidate]], edges: list[int]
    ) -> list[Candidate]:
        """Relation first over candidates already fetched (a backend without a relation index)."""
        assert self.rerank_pool is not None
        members = list(groups.values())
        budget = self.rerank_pool
        pool: list[Candidate] = []
        rest: list[Candidate] = []
        for g in self._relation_order(question, list(groups)):
            split = _after_first_edges(members[g], budget)
            budget -= min(edges[g], budget)
            pool.extend(members[g][:split])
            rest.extend(members[g][split:])
        return [pool[i] for i in self.order(question, pool, kg)] + rest

    def _rank_relation_first(
        self,
        question: str,
        entity: str,
        kg: KnowledgeGraph,
        expand_mediators: bool,
        neighbor_limit: int | None,
        start: float,
    ) -> _Ranking:
        assert self.rerank_pool is not None
        groups = kg.relation_counts(entity, "both")
        self.timings.fetch += time.perf_counter() - start
        best_first = self._relation_order(question, [(relation, side) for relation, side, _ in groups])
        start = time.perf_counter()
        pool: list[Candidate] = []
        pending: list[PendingGroup] = []
        budget = self.rerank_pool  # edges, whatever number of candidates their mediators expand to
        for g in best_first:
            relation, side, count = groups[g]
            taken = min(count, budget)
            budget -= taken
            if taken:
                pool.extend(group_candidates(kg, entity, relation, side, 0, taken, expand_mediators, neighbor_limit))
            if taken < count:
                pending.append(PendingGroup(relation, side, taken, count))
        self.timings.fetch += time.perf_counter() - start
        build = _builder(kg, entity, expand_mediators, neighbor_limit, whole=False)
        return [pool[i] for i in self.order(question, pool, kg)], tuple(pending), build

    def forget_rankings(self) -> None:
        """Empty the ranking cache (candidates and context edges stay): the next searches rank again."""
        with self._lock:
            for cache in self._caches.values():
                cache.rankings.clear()

    def _cache(self, kg: KnowledgeGraph) -> _GraphCache:
        with self._lock:
            cache = self._caches.get(kg)
            if cache is None:
                cache = self._caches[kg] = _GraphCache()
            return cache

    def _contexts(self, kg: KnowledgeGraph, candidates: Sequence[Candidate]) -> list[list[tuple[str, str]]]:
        """Each candidate's context edges (`candidate_context`) as their `context_texts`. A target's
        edges are read once per graph and cached with their keys and texts, as searches of other
        entities and questions read them again; the targets not cached yet are read together (over
        SPARQL, in one request rather than one each)."""
        if self.max_context <= 0:
            return [[] for _ in candidates]
        start = time.perf_counter()
        cache = self._cache(kg)
        edges_of = {c.target: cache.contexts.get(c.target) for c in candidates}
        missing = [target for target, edges in edges_of.items() if edges is None]
        if missing:
            limit = self.max_context + 1
            if isinstance(kg, SparqlKG):
                fetched = kg.neighbors_of_each(missing, limit)
            else:
                fetched = [kg.neighbors(target, "both", limit=limit) for target in missing]
            for target, edges in zip(missing, fetched):
                keyed = [(edge.key(), context_texts(edge)) for edge in edges]
                edges_of[target] = keyed
                cache.contexts.put(target, keyed, self.context_cache)
        contexts = []
        for candidate in candidates:
            came_by = candidate.edges[-1].key()  # as `context_from`: all but the edge back, then the first max_context
            known = edges_of[candidate.target]
            assert known is not None  # every missing target was fetched above
            contexts.append([texts for key, texts in known if key != came_by][: self.max_context])
        self.timings.fetch += time.perf_counter() - start
        return contexts

    def order(self, question: str, candidates: Sequence[Candidate], kg: KnowledgeGraph | None = None) -> list[int]:
        """Candidate indices, best first; ties keep KG order, so the result is deterministic.

        `kg` is the graph the candidates came from when it is not `self.kg` (a question's own
        subgraph): the gat ranker reads each candidate's context edges there.
        """
        scores = self.scores(question, candidates, kg)
        return sorted(range(len(candidates)), key=lambda i: (-scores[i], i))

    def scores(self, question: str, candidates: Sequence[Candidate], kg: KnowledgeGraph | None = None) -> np.ndarray:
        """Higher is better. `none` gives decreasing scores in KG order."""
        n = len(candidates)
        if n == 0 or self.method == "none":
            return -np.arange(n, dtype=np.float64)
        pool = list(range(n))
        out = np.zeros(n, dtype=np.float64)
        if self.rerank_pool is not None and n > self.rerank_pool:  # a hub: its pool by relation first
            relation = self._cosine(question, [c.relation_text() for c in candidates])
            pool = sorted(pool, key=lambda i: (-relation[i], i))[: self.rerank_pool]
            # Scored candidates (cosine >= -1, GAT in (0, 1)) stay above the rest (<= -2).
            out = relation - 3.0
        chosen = [candidates[i] for i in pool]
        if self.method == "embedding":
            out[pool] = self._cosine(question, [c.text() for c in chosen])
            return out
        contexts = self._contexts(kg or self.kg, chosen)
        table = TextTable()
        out[pool] = self._gat(table, group_rows_of_texts(table, question, chosen, contexts))
        return out

    def _gat(self, table: TextTable, rows: GroupRows) -> np.ndarray:
        assert self.model is not None and self.encoder is not None
        start = time.perf_counter()
        embeddings = table.embed(self.encoder)
        self.timings.encode += time.perf_counter() - start
        start = time.perf_counter()
        scores = self.model.score(collate([rows], embeddings)).numpy().astype(np.float64)
        self.timings.rank += time.perf_counter() - start
        return scores

    def _cosine(self, question: str, texts: Sequence[str]) -> np.ndarray:
        """Cosine of the question and each text (each distinct text encoded once)."""
        assert self.encoder is not None
        start = time.perf_counter()
        table = TextTable()
        rows = [table.row(t) for t in [question, *texts]]
        vectors = self.encoder.encode(list(table.rows))[rows]
        self.timings.encode += time.perf_counter() - start
        return np.asarray(vectors[1:] @ vectors[0], dtype=np.float64)


def _unfetched(
    kg: KnowledgeGraph, entity: str, candidates: Sequence[Candidate], neighbor_limit: int | None
) -> tuple[PendingGroup, ...]:
    """The edges of `entity` that a fetch of its first `neighbor_limit` edges (`candidates`) left out, as
    pending groups, one per relation and direction and per `neighbor_limit` edges of it: a hub's every
    relation stays reachable (by a filter, or by paging on) and counted at its true size. () when the fetch
    was whole (fewer edges than the limit)."""
    firsts = {(c.edges[0].key(), c.edges[0].direction) for c in candidates}
    if neighbor_limit is None or len(firsts) < neighbor_limit:
        return ()
    fetched: Counter[tuple[str, str]] = Counter((key[1], side) for key, side in firsts)
    groups = []
    for relation, side, count in kg.relation_counts(entity, "both"):
        for start in range(fetched[(relation, side)], count, neighbor_limit):
            groups.append(PendingGroup(relation, side, start, min(count, start + neighbor_limit)))
    return tuple(groups)


def _builder(
    kg: KnowledgeGraph, entity: str, expand_mediators: bool, neighbor_limit: int | None, whole: bool
) -> Callable[[PendingGroup], list[Candidate]]:
    """What builds a pending group of `entity`'s edges: its edges `start:count`, or with `whole` all of the
    relation's first `count` (the ranking drops those it holds already). `whole` is for groups that follow a
    fetch of all relations at once, whose order within one relation a store need not keep when asked for
    that relation alone; a store with a relation index (the memory store) keeps it, and reads only the group.
    """
    graph = weakref.ref(kg)  # a cached ranking must not keep a question's own graph alive

    def build(group: PendingGroup) -> list[Candidate]:
        alive = graph()
        if alive is None:
            raise RuntimeError(
                f"the graph {entity} was ranked in is gone: read a ranking's later candidates while its graph lives"
            )
        start = 0 if whole and not isinstance(alive, MemoryKG) else group.start
        return group_candidates(
            alive, entity, group.relation, group.direction, start, group.count, expand_mediators, neighbor_limit
        )

    return build


def _first_edges(candidates: Sequence[Candidate]) -> int:
    """Distinct first edges of candidates in KG order (a mediator's candidates share theirs, in a row)."""
    return sum(1 for i, c in enumerate(candidates) if i == 0 or c.edges[0] != candidates[i - 1].edges[0])


def _after_first_edges(candidates: Sequence[Candidate], edges: int) -> int:
    """How many of the candidates (in KG order) the first `edges` distinct first edges cover."""
    seen = 0
    for i, candidate in enumerate(candidates):
        if i == 0 or candidate.edges[0] != candidates[i - 1].edges[0]:
            if seen == edges:
                return i
            seen += 1
    return len(candidates)


_Key = TypeVar("_Key", bound=Hashable)
_Value = TypeVar("_Value")


class _LRUMap(Generic[_Key, _Value]):
    """A map whose entries weigh (candidates held, or 1) up to a capacity, the least recently used
    dropped first. Thread-safe: tool calls of one step may run in threads."""

    def __init__(self) -> None:
        self._items: OrderedDict[_Key, _Value] = OrderedDict()
        self._weights: dict[_Key, int] = {}
        self._total = 0
        self._lock = threading.Lock()

    def get(self, key: _Key) -> _Value | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: _Key, value: _Value, capacity: int, weight: int = 1) -> None:
        if weight > capacity:
            return
        with self._lock:
            self._total += weight - self._weights.get(key, 0)
            self._weights[key] = weight
            self._items[key] = value
            self._items.move_to_end(key)
            while self._total > capacity:
                old, _ = self._items.popitem(last=False)
                self._total -= self._weights.pop(old)

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._weights.clear()
            self._total = 0


class _GraphCache:
    """One graph's rankings (by entity, question, expand_mediators, neighbor_limit), candidates (by
    entity, expand_mediators, neighbor_limit) and context edges (by node, each edge with its key and
    `context_texts`)."""

    def __init__(self) -> None:
        self.rankings: _LRUMap[tuple[str, str, bool, int | None], _Ranking] = _LRUMap()
        self.candidates: _LRUMap[tuple[str, bool, int | None], tuple[list[Candidate], tuple[PendingGroup, ...]]] = (
            _LRUMap()
        )
        self.contexts: _LRUMap[str, list[tuple[tuple[str, str, str], tuple[str, str]]]] = _LRUMap()
