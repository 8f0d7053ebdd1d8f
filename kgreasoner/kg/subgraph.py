"""The `subgraph` backend: each question searches only its own subgraph, as RoG published them.

RoG's records (`kgreasoner.records.rog`) hold, per question, the Freebase triples within a few hops
of its topic entities. Searching that subgraph instead of all of Freebase is how WebQSP and CWQ
train and evaluate with no Freebase server (KG-R1 does the same). `SubgraphKG` holds every
question's graph in Arrow memory and `for_example(id)` gives that question's view: a `MemoryKG`
over its triples alone, built on first use and kept in a small LRU cache (the rollouts of one
question come together). Nodes are named by their labels; the mids RoG left for nodes with no
label are unnamed (mediator) nodes, so the tool expands them as it does CVTs.

Reading triples is per question only: `neighbors` and `degree` on the whole `SubgraphKG` raise,
so a code path that forgot to pass the example id fails loudly instead of showing a question
another question's triples.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path

from kgreasoner.kg.base import Direction, KGError, KnowledgeGraph
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.edges import Edge
from kgreasoner.records.ids import literal_value
from kgreasoner.records.rog import RogFile, is_mid, read_rog_file, rog_files


class SubgraphKG(KnowledgeGraph):
    """Every question's own subgraph; `for_example(example_id)` is the graph that question searches.

    Args:
        files: RoG files read with their `graph` column (`read_rog_file`).
        cache_size: question views kept built (each is a few thousand triples).
    """

    per_question = True

    def __init__(self, files: Sequence[RogFile], cache_size: int = 256) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {cache_size}")
        self.files = list(files)
        self.cache_size = cache_size
        self._rows: dict[str, tuple[int, int]] = {}
        for index, file in enumerate(self.files):
            for row, qid in enumerate(file.table.column("id").to_pylist()):
                if qid in self._rows:
                    other, other_row = self._rows[qid]
                    raise ValueError(
                        f"{file.where(row)}: question id {qid!r} also at {self.files[other].where(other_row)}"
                    )
                self._rows[qid] = (index, row)
        self._views: OrderedDict[str, MemoryKG] = OrderedDict()
        self._lock = threading.Lock()

    @classmethod
    def from_path(cls, path: str | Path, cache_size: int = 256) -> SubgraphKG:
        """Every RoG file at `path` (a .parquet / .jsonl file, or a folder of them)."""
        return cls([read_rog_file(f, ["graph"]) for f in rog_files(path)], cache_size)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, example_id: str) -> bool:
        return example_id in self._rows

    def for_example(self, example_id: str | None) -> MemoryKG:
        """The question's own subgraph; an id with no subgraph raises KeyError."""
        if example_id is None:
            raise ValueError(
                "a subgraph KG answers one question at a time: open the search session "
                "with the example's id (tool.session(question, topics, example_id=...))"
            )
        with self._lock:
            view = self._views.get(example_id)
            if view is not None:
                self._views.move_to_end(example_id)
                return view
        if example_id not in self._rows:
            where = ", ".join(str(f.path) for f in self.files)
            raise KeyError(f"question {example_id!r} has no subgraph in {where}")
        index, row = self._rows[example_id]
        triples = self.files[index].table.column("graph")[row].as_py()
        nodes = {node for head, _, tail in triples for node in (head, tail)}
        view = MemoryKG.from_triples(
            [tuple(t) for t in triples], names={node: node for node in nodes if not is_mid(node)}
        )
        with self._lock:
            self._views[example_id] = view
            while len(self._views) > self.cache_size:
                self._views.popitem(last=False)
        return view

    # --- the whole store: names only, never triples -------------------------------------------
    def neighbors(
        self,
        entity: str,
        direction: Direction = "out",
        relations: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Edge]:
        raise KGError(self._per_question("neighbors"))

    def degree(self, entity: str, direction: Direction = "both") -> int:
        raise KGError(self._per_question("degree"))

    def resolve(self, name: str) -> list[str]:
        raise KGError(self._per_question("resolve"))

    def label(self, entity: str) -> str:
        """A node's id is its label (RoG named nodes by label); a mid stays as it is."""
        return literal_value(entity)

    def is_unnamed(self, entity: str) -> bool:
        return is_mid(entity)

    @staticmethod
    def _per_question(method: str) -> str:
        return (
            f"SubgraphKG.{method}: every question has its own subgraph; "
            "call it on for_example(example_id), the question's view"
        )
