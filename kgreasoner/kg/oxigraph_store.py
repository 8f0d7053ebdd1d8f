"""The `oxigraph` backend: a pyoxigraph store on disk, bulk-loaded once and reopened read-only.

Layout of a store built by `OxigraphKG.build` (the same one `kgreasoner kg load` writes and
`kgreasoner kg serve` publishes over SPARQL):

- default graph: every edge, ids mapped to IRIs by `kgreasoner.kg.rdf` (literals stay literals),
  plus one `rdfs:label` triple per named node. This is all a plain SPARQL client sees.
- named graph `INDEX_GRAPH`: a lookup index for `resolve` — one IRI per exact label and one per
  normalised label (`normalize_answer`), each pointing at the nodes that carry it, and a marker
  that records whether names were given (then a node without a label is unnamed, a mediator).
  It lives outside the default graph so neighbour queries never see it.

The semantics are those of `MemoryKG` on the same input; only the order of edges within one
direction differs (store index order instead of file order).
"""

from __future__ import annotations

import io
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import pyoxigraph as ox
from tqdm import tqdm

from kgreasoner.kg.base import Direction, KnowledgeGraph, check_direction, check_limit
from kgreasoner.kg.kb_checks import KBFileError, literal_subject, literal_subject_message
from kgreasoner.kg.memory import IdColumn, read_kb_file, read_names
from kgreasoner.kg.rdf import RDFS_LABEL, RELATION_NS, id_to_term, term_to_id, to_iri
from kgreasoner.records.edges import Edge
from kgreasoner.records.ids import is_literal_id, literal_value
from kgreasoner.records.normalize import normalize_answer

INDEX_NS = "http://kgreasoner.local/index/"
INDEX_GRAPH = INDEX_NS + "graph"
INDEX_NODE = INDEX_NS + "node"  # predicate: label key -> node carrying that label
INDEX_STORE = INDEX_NS + "store"  # subject of the store-level facts below
INDEX_FORMAT = INDEX_NS + "format"
INDEX_HAS_NAMES = INDEX_NS + "hasNames"
STORE_FORMAT = "kgreasoner-oxigraph-1"
_CHUNK_LINES = 20_000


def exact_label_key(label: str) -> str:
    """The index IRI under which nodes labelled exactly `label` are listed."""
    return to_iri(label, INDEX_NS + "label/")


def normalized_label_key(label: str) -> str:
    """The index IRI under which nodes whose normalised label equals `normalize_answer(label)` are listed."""
    return to_iri(normalize_answer(label), INDEX_NS + "norm/")


class OxigraphKG(KnowledgeGraph):
    """A graph in an on-disk pyoxigraph store built by `OxigraphKG.build`.

    Args:
        store_dir: the store's directory. It is opened read-only, so several processes (and an
            `oxigraph serve-read-only`) may read it at once.
    """

    def __init__(self, store_dir: str | Path) -> None:
        self.store_dir = Path(store_dir)
        if not self.store_dir.is_dir() or not any(self.store_dir.iterdir()):
            raise FileNotFoundError(
                f"no oxigraph store at {self.store_dir}; "
                f"build one with `kgreasoner kg load INPUT --store {self.store_dir}`"
            )
        try:
            self._store = ox.Store.read_only(str(self.store_dir))
        except OSError as err:
            raise ValueError(f"{self.store_dir}: cannot open as an oxigraph store ({err})") from err
        self._init_from_store()

    @classmethod
    def _from_store(cls, store: ox.Store, store_dir: Path) -> OxigraphKG:
        kg = cls.__new__(cls)
        kg.store_dir = store_dir
        kg._store = store
        kg._init_from_store()
        return kg

    def _init_from_store(self) -> None:
        self._default = ox.DefaultGraph()
        self._index = ox.NamedNode(INDEX_GRAPH)
        self._label_pred = ox.NamedNode(RDFS_LABEL)
        self._index_pred = ox.NamedNode(INDEX_NODE)
        store_node = ox.NamedNode(INDEX_STORE)
        formats = [
            _value(q.object)
            for q in self._store.quads_for_pattern(store_node, ox.NamedNode(INDEX_FORMAT), None, self._index)
        ]
        if formats != [STORE_FORMAT]:
            raise ValueError(
                f"{self.store_dir}: not a kgreasoner store (format marker {formats or 'missing'}); "
                "build it with `kgreasoner kg load`"
            )
        flags = [
            _value(q.object)
            for q in self._store.quads_for_pattern(store_node, ox.NamedNode(INDEX_HAS_NAMES), None, self._index)
        ]
        self.has_names = flags == ["true"]
        self._relation_ids: dict[str, str] = {}  # relation IRI -> id, filled as relations are seen
        self.num_triples_loaded: int | None = None
        """Lines `build` handed to the store (a repeated line counted each time); None for a store opened from disk."""

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        triples: str | Path | Iterable[tuple[str, str, str]],
        store_dir: str | Path,
        names: str | Path | dict[str, str] | None = None,
        progress: bool = False,
    ) -> OxigraphKG:
        """Bulk-load triples into a new store at `store_dir` and return it opened.

        `triples` is a TSV file, an N-Triples file (`.nt`; `rdfs:label` triples become names),
        a dataset folder holding `kb.tsv` (and maybe `names.tsv`), or an iterable of id triples.
        `names` is a `names.tsv` path or an id -> label dict; for a TSV without it, a
        `names.tsv` beside the file is used, as `MemoryKG.from_file` does. `progress`: a tqdm bar
        of the triples handed to the store.

        The load is atomic: the store is written to a hidden folder beside `store_dir` and renamed to it once
        complete, so a load that fails (or is killed) leaves no store that opens as a whole one.
        """
        store_dir = Path(store_dir)
        if store_dir.exists() and (not store_dir.is_dir() or any(store_dir.iterdir())):
            raise ValueError(f"{store_dir}: store directory exists and is not empty; remove it or choose another")
        source, subjects, relations, objects, names = _read_input(triples, names)
        store_dir.parent.mkdir(parents=True, exist_ok=True)
        partial = Path(tempfile.mkdtemp(prefix=f".{store_dir.name}.", suffix=".partial", dir=store_dir.parent))
        try:
            with tqdm(
                total=len(subjects), desc="kg load", unit="triple", unit_scale=True, disable=not progress
            ) as bar:
                _write_store(partial, _nquads(source, subjects, relations, objects, names, bar.update))
            partial.replace(store_dir)  # onto an empty folder too (POSIX rename)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        kg = cls._from_store(ox.Store(str(store_dir)), store_dir)
        kg.num_triples_loaded = len(subjects)
        return kg

    # --- KnowledgeGraph -----------------------------------------------------------------------
    def neighbors(
        self,
        entity: str,
        direction: Direction = "out",
        relations: Sequence[str] | None = None,
        limit: int | None = None,
    ) -> list[Edge]:
        check_direction(direction)
        check_limit(limit)
        term = _term_or_none(entity)
        iris = None if relations is None else [i for i in map(_relation_iri, dict.fromkeys(relations)) if i]
        if term is None or limit == 0 or (iris is not None and len(iris) == 0):
            return []
        sides: tuple[str, ...] = ("out", "in") if direction == "both" else (direction,)
        if isinstance(term, ox.Literal):
            sides = tuple(side for side in sides if side == "in")  # a literal is never a subject
        own = self._term_label(term)
        values = ""
        if iris is not None:
            values = "VALUES ?r { " + " ".join(f"<{iri}>" for iri in iris) + " } "
        if len(sides) == 2 and limit is None:
            # One query for both sides, outgoing rows first (the UNION's left branch).
            pattern = f'{{ {term} ?r ?n BIND("out" AS ?d) }} UNION {{ ?n ?r {term} BIND("in" AS ?d) }}'
            both = self._edges(entity, term, own, self._solutions(values, pattern, None))
            return [e for e in both if e.direction == "out"] + [e for e in both if e.direction == "in"]
        edges: list[Edge] = []
        for side in sides:
            room = None if limit is None else limit - len(edges)
            pattern = (f"{term} ?r ?n" if side == "out" else f"?n ?r {term}") + f' BIND("{side}" AS ?d)'
            edges.extend(self._edges(entity, term, own, self._solutions(values, pattern, room)))
            if limit is not None and len(edges) >= limit:
                break
        return edges

    def _solutions(self, values: str, pattern: str, limit: int | None):
        """Rows (?d ?r ?n ?nl) of the edges matching `pattern`, with neighbour labels joined in Rust.

        An in-process SPARQL join is several times faster than one label lookup per edge.
        """
        query = (
            f"SELECT ?d ?r ?n ?nl WHERE {{ {values}{pattern} FILTER(?r != <{RDFS_LABEL}>) "
            f"OPTIONAL {{ ?n <{RDFS_LABEL}> ?nl }} }}" + ("" if limit is None else f" LIMIT {int(limit)}")
        )
        return self._store.query(query)

    def _edges(self, entity: str, term, own: tuple[str, bool], solutions) -> list[Edge]:
        own_label, own_unnamed = own
        entity_literal = isinstance(term, ox.Literal)
        relation_ids = self._relation_ids
        edges = []
        for side_term, predicate, node, node_label in solutions:
            relation = relation_ids.get(predicate.value)
            if relation is None:
                relation = relation_ids.setdefault(predicate.value, term_to_id(predicate, RELATION_NS))
            literal = isinstance(node, ox.Literal)
            if literal:
                label, unnamed = node.value, False
            elif node_label is not None:
                label, unnamed = node_label.value, False
            else:
                label, unnamed = term_to_id(node), self.has_names
            neighbor = term_to_id(node)
            if side_term.value == "out":
                edges.append(Edge(entity, relation, neighbor, own_label, label, "out", literal, own_unnamed, unnamed))
            else:
                edges.append(
                    Edge(neighbor, relation, entity, label, own_label, "in", entity_literal, unnamed, own_unnamed)
                )
        return edges

    def _side_quads(self, term, predicate, side: str) -> Iterator[ox.Quad]:
        if side == "out":
            return self._store.quads_for_pattern(term, predicate, None, self._default)
        return self._store.quads_for_pattern(None, predicate, term, self._default)

    def _term_label(self, term) -> tuple[str, bool]:
        """(label, unnamed) of a node term that is known to be in the graph."""
        if isinstance(term, ox.Literal):
            return term.value, False
        for quad in self._store.quads_for_pattern(term, self._label_pred, None, self._default):
            return _value(quad.object), False
        return term_to_id(term), self.has_names

    def label(self, entity: str) -> str:
        term = _term_or_none(entity)
        if term is None or not self._contains(term):
            return literal_value(entity)
        return self._term_label(term)[0]

    def resolve(self, name: str) -> list[str]:
        if not isinstance(name, str) or _relation_iri(name) is None:
            return []  # no label holds a lone surrogate
        hits = self._index_lookup(exact_label_key(name))
        term = _term_or_none(name)
        if term is not None and name not in hits and self._contains(term):
            hits.insert(0, name)
        if not hits:
            hits = self._index_lookup(normalized_label_key(name))
        return hits

    def _index_lookup(self, key: str) -> list[str]:
        quads = self._store.quads_for_pattern(ox.NamedNode(key), self._index_pred, None, self._index)
        return [term_to_id(q.object) for q in quads]

    def degree(self, entity: str, direction: Direction = "both") -> int:
        check_direction(direction)
        term = _term_or_none(entity)
        if term is None:
            return 0
        count = 0
        for side in ("out", "in") if direction == "both" else (direction,):
            if side == "out" and isinstance(term, ox.Literal):
                continue
            count += sum(1 for q in self._side_quads(term, None, side) if q.predicate != self._label_pred)
        return count

    def expresses(self, entity: str) -> bool:
        """False for an id no query can name (`_term_or_none`): empty, a blank node, a malformed literal, a lone
        surrogate. The store answers for it as for an id missing from the graph, as the memory store does."""
        return bool(entity) and _term_or_none(entity) is not None

    def relation_counts(self, entity: str, direction: Direction = "both") -> list[tuple[str, str, int]]:
        """(relation, "out" or "in", edges) for each relation at `entity`, counted in the store (one grouped
        query a side, without reading the edges out): outgoing first, each side by relation IRI."""
        check_direction(direction)
        term = _term_or_none(entity)
        if term is None:
            return []
        counts = []
        for side in ("out", "in") if direction == "both" else (direction,):
            if side == "out" and isinstance(term, ox.Literal):
                continue  # a literal is never a subject
            triple = f"{term} ?r ?n" if side == "out" else f"?n ?r {term}"
            rows = self._store.query(
                f"SELECT ?r (COUNT(*) AS ?c) WHERE {{ {triple} FILTER(?r != <{RDFS_LABEL}>) }} GROUP BY ?r ORDER BY ?r"
            )
            assert isinstance(rows, ox.QuerySolutions)  # what a SELECT gives
            for predicate, count in rows:
                relation = self._relation_ids.get(predicate.value)
                if relation is None:
                    relation = self._relation_ids.setdefault(predicate.value, term_to_id(predicate, RELATION_NS))
                counts.append((relation, side, int(count.value)))
        return counts

    def is_unnamed(self, entity: str) -> bool:
        term = _term_or_none(entity)
        if term is None or isinstance(term, ox.Literal) or not self._contains(term):
            return False
        return self._term_label(term)[1]

    def _contains(self, term) -> bool:
        """True when `term` is the subject or object of some edge (labels alone do not count)."""
        if not isinstance(term, ox.Literal):
            for quad in self._store.quads_for_pattern(term, None, None, self._default):
                if quad.predicate != self._label_pred:
                    return True
        for quad in self._store.quads_for_pattern(None, None, term, self._default):
            if quad.predicate != self._label_pred:
                return True
        return False

    def __contains__(self, entity: str) -> bool:
        term = _term_or_none(entity)
        return term is not None and self._contains(term)

    def query(self, sparql: str):
        """Run a read-only SPARQL query on the store (for statistics and debugging)."""
        return self._store.query(sparql)

    def close(self) -> None:
        # pyoxigraph closes the store when the last reference goes away.
        self._store = None  # type: ignore[assignment]


def _term_or_none(entity: str):
    """The RDF term of an id, or None when no node can have that id: a malformed literal, text with a lone
    surrogate, or a blank node (`_:b1`), which a query cannot name (written in one, it is a variable)."""
    if not isinstance(entity, str) or entity.startswith("_:"):
        return None
    try:
        return id_to_term(entity)
    except (SyntaxError, ValueError):
        return None


def _relation_iri(relation: str) -> str | None:
    """The IRI of a relation id; None for one no IRI can carry (a lone surrogate), which no edge has."""
    try:
        return to_iri(relation, RELATION_NS)
    except UnicodeEncodeError:
        return None


def _write_store(folder: Path, chunks: Iterator[bytes]) -> None:
    """Bulk-load N-Quads `chunks` into a new store in `folder` and close it (it is renamed next: an open store
    would go on writing under the old name)."""
    store = ox.Store(str(folder))
    try:
        store.bulk_load(
            input=io.BufferedReader(_ChunkReader(chunks)),
            format=ox.RdfFormat.N_QUADS,
            lenient=True,  # every term was built and validated by pyoxigraph already
        )
        store.flush()
        store.optimize()
    finally:
        del store  # the last reference: pyoxigraph closes the store (a traceback would keep it open otherwise)


def _read_input(
    triples: str | Path | Iterable[tuple[str, str, str]], names: str | Path | dict[str, str] | None
) -> tuple[str, IdColumn, IdColumn, IdColumn, dict[str, str] | None]:
    """(source description, subjects, relations, objects, names or None) from any accepted input."""
    if isinstance(triples, (str, Path)):
        path = Path(triples)
        if path.is_dir():
            kb = path / "kb.tsv"
            if not kb.exists():
                raise FileNotFoundError(f"{path}: dataset folder has no kb.tsv")
            path = kb
        return (str(path), *read_kb_file(path, names))
    rows = list(triples)
    subjects, relations, objects = (list(col) for col in zip(*rows)) if rows else ([], [], [])
    literal = literal_subject(subjects)
    if literal is not None:
        raise KBFileError(f"triple {subjects.index(literal) + 1}: {literal_subject_message(literal)}")
    if isinstance(names, (str, Path)):
        names = read_names(Path(names))
    return "triples", subjects, relations, objects, names


def _nquads(
    source: str,
    subjects: IdColumn,
    relations: IdColumn,
    objects: IdColumn,
    names: dict[str, str] | None,
    on_edges: Callable[[int], object],
) -> Iterator[bytes]:
    """The store's content as N-Quads, in chunks of lines (edges, labels, then the index graph);
    `on_edges(n)` is told of each chunk of n edges as it is handed on."""
    n = len(subjects)
    codes, nodes = pd.factorize(
        np.concatenate([np.asarray(subjects, dtype=object), np.asarray(objects, dtype=object)]), sort=False
    )
    rel_codes, rels = pd.factorize(np.asarray(relations, dtype=object), sort=False)
    node_terms = [_node_term(node, source) for node in nodes]
    rel_terms = [f"<{to_iri(r, RELATION_NS)}>" for r in rels]
    src, dst = codes[:n].tolist(), codes[n:].tolist()
    rel_list = rel_codes.tolist()
    for start in range(0, n, _CHUNK_LINES):
        stop = min(n, start + _CHUNK_LINES)
        yield "".join(
            f"{node_terms[src[i]]} {rel_terms[rel_list[i]]} {node_terms[dst[i]]} .\n" for i in range(start, stop)
        ).encode("utf-8")
        on_edges(stop - start)

    label_pred, index_pred, index_graph = f"<{RDFS_LABEL}>", f"<{INDEX_NODE}>", f"<{INDEX_GRAPH}>"
    lines: list[str] = []
    for node, term in zip(nodes, node_terms):
        if is_literal_id(node):
            label = literal_value(node)
        elif names is None:
            label = node
        elif node in names:
            label = names[node]
            lines.append(f"{term} {label_pred} {ox.Literal(label)} .\n")
        else:
            continue  # unnamed (mediator) node: no label, not resolvable by name
        lines.append(f"<{exact_label_key(label)}> {index_pred} {term} {index_graph} .\n")
        lines.append(f"<{normalized_label_key(label)}> {index_pred} {term} {index_graph} .\n")
        if len(lines) >= _CHUNK_LINES:
            yield "".join(lines).encode("utf-8")
            lines = []
    store = f"<{INDEX_STORE}>"
    lines.append(f'{store} <{INDEX_FORMAT}> "{STORE_FORMAT}" {index_graph} .\n')
    lines.append(f'{store} <{INDEX_HAS_NAMES}> "{"true" if names is not None else "false"}" {index_graph} .\n')
    yield "".join(lines).encode("utf-8")


def _value(term: ox.NamedNode | ox.BlankNode | ox.Literal | ox.Triple) -> str:
    """The lexical value of an object term; a quoted triple (RDF-star), which no store we build holds, as N-Triples."""
    return str(term) if isinstance(term, ox.Triple) else term.value


def _node_term(node: str, source: str) -> str:
    """A node id as an N-Triples term; a malformed literal raises a ValueError naming the source."""
    try:
        return str(id_to_term(node))
    except (SyntaxError, ValueError) as err:
        raise ValueError(f"{source}: cannot store node {node!r} ({err})") from err


class _ChunkReader(io.RawIOBase):
    """A binary stream over an iterator of byte chunks, so bulk_load never sees the whole input."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._chunks = chunks
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        size = min(len(buffer), len(self._pending))
        buffer[:size] = self._pending[:size]
        self._pending = self._pending[size:]
        return size
