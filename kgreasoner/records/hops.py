"""Hop counts of questions that come with their own subgraph (RoG's records) and no relation path.

A question's hop count is how many edges lie between its topic entities and its answers in its
subgraph: for each topic entity, the shortest path (edges walked either way, mediator nodes
counted as nodes, as WebQSP's inferential chains count them) to the nearest answer; then the
largest of those over the topic entities that reach an answer. The largest, because every topic
entity is a constraint the answer must meet: in "Justin Bieber's brother who is male" the
constraint Male sits one edge from the answer, while the question needs the two edges from
Justin Bieber through the sibling mediator. A question none of whose topic entities reaches an
answer (or whose topic entity is itself the answer) gets 0, the schema's "unknown".

The search runs for a batch of records at once with Arrow's and numpy's vectorised kernels: the
published CWQ training records hold tens of millions of triples, far too many for a Python loop
per edge. Each row's nodes are numbered apart from every other row's, so one breadth-first
search from all answers of a batch's rows is many independent searches.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

# A batch of rows is searched at once, in a distance array of (rows x distinct names) entries:
# rows are added to a batch while rows x triples stays under this (a row alone always fits).
BATCH_CELLS = 1 << 22


def subgraph_hops(
    graph: pa.ChunkedArray, topics: pa.ChunkedArray, answers: pa.ChunkedArray, batch_cells: int = BATCH_CELLS
) -> list[int]:
    """Each row's hop count (module docstring), from its `graph` ([[head, relation, tail], ...]),
    its topic entities and its answers (node names), columns of the same table."""
    hops: list[int] = []
    for start, stop in _batches(pc.list_value_length(graph).to_numpy(zero_copy_only=False), batch_cells):
        hops.extend(
            _batch_hops(*(column.slice(start, stop - start).combine_chunks() for column in (graph, topics, answers)))
        )
    return hops


def _batches(triples_per_row: np.ndarray, batch_cells: int) -> list[tuple[int, int]]:
    """(start, stop) row ranges: small batches keep the name hash table in cache and the distances dense."""
    batches, start, triples = [], 0, 0
    for row, count in enumerate(triples_per_row.tolist()):
        if row > start and (row + 1 - start) * (triples + count) > batch_cells:
            batches.append((start, row))
            start, triples = row, 0
        triples += count
    if len(triples_per_row):
        batches.append((start, len(triples_per_row)))
    return batches


def _batch_hops(graph: pa.ListArray, topics: pa.ListArray, answers: pa.ListArray) -> list[int]:
    values = graph.flatten().flatten()  # head, relation, tail of each triple in turn (the reader checked there are 3)
    ends = values.take(pa.array(np.arange(len(values)).reshape(-1, 3)[:, [0, 2]].ravel()))
    names = pc.dictionary_encode(pa.concat_arrays([ends, topics.flatten(), answers.flatten()]))
    # Node (row, name) is row * distinct names + name: the same name in two rows is two nodes. A topic
    # entity or answer missing from its graph is a node without edges.
    stride = len(names.dictionary)
    codes = names.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    rows = [
        np.repeat(pc.list_parent_indices(graph).to_numpy(), 2),
        pc.list_parent_indices(topics).to_numpy(),
        pc.list_parent_indices(answers).to_numpy(),
    ]
    nodes = np.concatenate(rows) * stride + codes
    ends, topic, answer = np.split(nodes, np.cumsum([len(ends), len(topics.flatten())]))
    distance = _distances(ends[0::2], ends[1::2], answer, topic, len(graph) * stride)
    reached = distance[topic] >= 0
    hops = np.zeros(len(graph), dtype=np.int64)
    np.maximum.at(hops, rows[1][reached], distance[topic][reached])
    return hops.tolist()


def _distances(
    head: np.ndarray, tail: np.ndarray, sources: np.ndarray, targets: np.ndarray, num_nodes: int
) -> np.ndarray:
    """Edges from `sources` to every node (-1: unreached), walking edges both ways, level by level
    until every target is reached or nothing new is."""
    distance = np.full(num_nodes, -1, dtype=np.int32)
    distance[sources] = 0
    level = 0
    while not (distance[targets] >= 0).all():
        at_head, at_tail = distance[head], distance[tail]
        # An edge with both ends reached can reach nothing new: later levels skip it.
        open_edges = (at_head < 0) | (at_tail < 0)
        head, tail, at_head, at_tail = head[open_edges], tail[open_edges], at_head[open_edges], at_tail[open_edges]
        found = np.concatenate([tail[at_head == level], head[at_tail == level]])
        found = found[distance[found] < 0]
        if not len(found):
            break
        level += 1
        distance[found] = level
    return distance
