"""Embeddings made ahead: the texts a search encodes over a KG, written to the encoder's disk cache.

A search ranked by the GAT ranker (`CandidateScorer`) encodes the question and, of the graph: the
words of the searched entity's relations (relation first, at a hub); each candidate's relation
words (one relation, or two through a mediator: `relation_text`) and its target's label; and the
context edges of each scored candidate's target, as "relation neighbour" texts and relation words.
All but the question are fixed by the graph, so they can be embedded once, before training or
serving, and a first search in a new process then encodes nothing it can look up:

- `kg_texts`: every such text of a whole graph (a memory store), whatever is searched;
- `first_search_texts`: what the first search of given entities reads whatever the question, read
  through the backend a tool uses (so in its edge order): for the topic entities of a dataset's
  questions, which every rollout searches first, on a graph too large to embed whole;
- `embed_ahead`: encodes the texts a cache lacks, a chunk at a time, each chunk written as an
  `EmbeddingTable` when done (a killed run resumes where it stopped), then merges the tables.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.sparql import SparqlKG
from kgreasoner.records.edges import Edge
from kgreasoner.records.ids import is_literal_id
from kgreasoner.retrieval.candidates import (
    Candidate,
    edge_text,
    gather_candidates,
    group_candidates,
    relation_phrase,
    relation_words,
)
from kgreasoner.retrieval.encoder import CachedEncoder, EmbeddingTable, humanize_label

SIDES = ("out", "in")


def kg_texts(kg: MemoryKG, context_edges: int | None = None) -> Iterator[str]:
    """Every graph text a search of `kg` can encode (mediators expanded, as the tool does by default).

    The words of every relation both ways; through each mediator (an unnamed node with edges
    beyond), the two relations' words of each path across it; and for every node a search can show
    (all but those mediators, unless one lies beyond another): its label, and the texts of its edges
    as context, all of them or the first `context_edges` in the store's order (a search reads at
    most `max_context + 1`, in the order of the backend it runs on). Texts may repeat.
    """
    for relation in kg.relation_types:
        for side in SIDES:
            yield relation_words(relation, side)
    for node in kg.entities:
        edges = kg.neighbors(node, "both")
        if _is_mediator(kg, node) and len(edges) >= 2:
            yield from _paths_across(edges)
            if not any(_is_mediator(kg, edge.neighbor) for edge in edges):
                continue  # never shown: every search expands it
        yield humanize_label(kg.label(node))
        for edge in edges[:context_edges]:
            yield edge_text(edge)


def _is_mediator(kg: KnowledgeGraph, node: str) -> bool:
    return not is_literal_id(node) and kg.is_unnamed(node)


def _paths_across(edges: Sequence[Edge]) -> Iterator[str]:
    """`relation_text` of each two-edge candidate through the mediator whose edges these are: the
    edge in, read from its far end, then another edge out."""
    counts: dict[tuple[str, str], int] = {}
    for edge in edges:
        counts[(edge.relation, edge.direction)] = counts.get((edge.relation, edge.direction), 0) + 1
    for (relation_in, side_in), count in counts.items():
        words_in = relation_words(relation_in, "in" if side_in == "out" else "out")
        for relation_out, side_out in counts:
            if (relation_out, side_out) != (relation_in, side_in) or count >= 2:
                yield f"{words_in} {relation_words(relation_out, side_out)}"


def first_search_texts(
    kg: KnowledgeGraph,
    entities: Iterable[tuple[str, str | None]],
    *,
    max_context: int = 16,
    rerank_pool: int | None = 64,
    relation_first: int | None = 256,
    neighbor_limit: int | None = 10000,
    expand_mediators: bool = True,
) -> Iterator[str]:
    """The graph texts the first search of each (entity, example id) can encode, whatever the
    question, with the tool settings given (`ToolConfig`'s fields of the same names).

    It follows `CandidateScorer.rank` for the `gat` ranking: at a hub ranked relation first, the
    relations' words and the first `rerank_pool` edges of every relation (the best relations take
    the pool, and any may be best); elsewhere every candidate (at an exact-path hub any may enter
    the pool). Then each candidate's relation words and label, and the first `max_context + 1`
    edges of its target (the context, less the edge it came by). Texts may repeat.
    """
    for entity, example_id in entities:
        graph = kg.for_example(example_id)
        candidates, groups = _first_search_candidates(
            graph, entity, rerank_pool, relation_first, neighbor_limit, expand_mediators
        )
        for relation, side in groups:
            yield relation_words(relation, side)
        targets: dict[str, None] = {}
        for candidate in candidates:
            yield candidate.relation_text()
            yield humanize_label(candidate.target_label)
            targets[candidate.target] = None
        if max_context > 0 and targets:
            if isinstance(graph, SparqlKG):
                contexts = graph.neighbors_of_each(list(targets), max_context + 1)
            else:
                contexts = [graph.neighbors(target, "both", limit=max_context + 1) for target in targets]
            for edges in contexts:
                for edge in edges:
                    yield edge_text(edge)
                    yield relation_phrase(edge)


def _first_search_candidates(
    kg: KnowledgeGraph,
    entity: str,
    rerank_pool: int | None,
    relation_first: int | None,
    neighbor_limit: int | None,
    expand_mediators: bool,
) -> tuple[list[Candidate], list[tuple[str, str]]]:
    """(the candidates a first search of `entity` may score, the (relation, side) groups whose words it
    encodes), as `CandidateScorer._rank` chooses them."""
    if relation_first is None or rerank_pool is None:
        return gather_candidates(kg, entity, expand_mediators, neighbor_limit), []
    if isinstance(kg, MemoryKG) and kg.degree(entity) > relation_first:
        counts = kg.relation_counts(entity, "both")
        candidates = [
            c
            for relation, side, count in counts
            for c in group_candidates(
                kg, entity, relation, side, 0, min(count, rerank_pool), expand_mediators, neighbor_limit
            )
        ]
        return candidates, [(relation, side) for relation, side, _ in counts]
    candidates = gather_candidates(kg, entity, expand_mediators, neighbor_limit)
    by_group: dict[tuple[str, str], list[Candidate]] = {}
    for candidate in candidates:
        by_group.setdefault((candidate.edges[0].relation, candidate.edges[0].direction), []).append(candidate)
    first_edges = [len({c.edges[0] for c in members}) for members in by_group.values()]
    if sum(first_edges) > relation_first:
        pool = [c for members in by_group.values() for c in _first_edges_of(members, rerank_pool)]
        return pool, list(by_group)
    return candidates, []  # at an exact-path hub, the relation words of all of them pick the pool


def _first_edges_of(candidates: Sequence[Candidate], edges: int) -> list[Candidate]:
    """The candidates (in KG order) of the first `edges` distinct first edges."""
    seen: set[Edge] = set()
    out = []
    for candidate in candidates:
        if candidate.edges[0] not in seen:
            if len(seen) == edges:
                break
            seen.add(candidate.edges[0])
        out.append(candidate)
    return out


@dataclass
class EmbedReport:
    """What `embed_ahead` did."""

    texts: int
    """Distinct texts asked for."""
    cached: int
    """Of those, already in the cache (skipped)."""
    encoded: int
    seconds: float
    """Spent encoding and writing."""
    table: Path | None
    """The cache folder's one table after the merge."""
    table_texts: int
    table_bytes: int


def embed_ahead(
    encoder: CachedEncoder, texts: Iterable[str], batch: int = 128, chunk: int = 4096, progress: bool = True
) -> EmbedReport:
    """Encode those of `texts` that `encoder`'s cache lacks with its wrapped encoder, `batch` texts per
    call, into tables of `chunk` texts written as each fills; then merge the folder's tables into one.

    Texts are encoded shortest first, so that a batch's texts pad to about the same length. A
    progress bar (tqdm, on stderr) counts texts, those already cached included.
    """
    from tqdm import tqdm

    wanted = list(dict.fromkeys(texts))
    todo = encoder.missing(wanted)
    todo.sort(key=len)
    start = time.perf_counter()
    with tqdm(
        total=len(wanted),
        initial=len(wanted) - len(todo),
        unit="text",
        desc="kg embed",
        file=sys.stderr,
        disable=not progress,
        mininterval=1.0,
        smoothing=0.05,
    ) as bar:
        for lo in range(0, len(todo), chunk):
            part = todo[lo : lo + chunk]
            rows = []
            for b in range(0, len(part), batch):
                rows.append(encoder.encoder.encode(part[b : b + batch]))
                bar.update(len(rows[-1]))
            encoder.add_table(part, np.concatenate(rows))
    merged = encoder.merge_tables()
    seconds = time.perf_counter() - start
    table = EmbeddingTable(merged, encoder.dim) if merged else None
    return EmbedReport(
        texts=len(wanted),
        cached=len(wanted) - len(todo),
        encoded=len(todo),
        seconds=seconds,
        table=merged,
        table_texts=len(table) if table else 0,
        table_bytes=sum(path.stat().st_size for path in table.files) if table else 0,
    )
