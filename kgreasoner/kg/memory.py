"""The embedded default backend: the whole graph in numpy CSR arrays, both directions.

Nodes and relations are interned to integers once at load; `neighbors` is then two array
slices. Beside each direction's CSR arrays a relation index groups every node's edges by relation
(a permutation of the edge positions plus group boundaries), so the edges of one relation at a hub
and the per-relation counts of a node (`relation_counts`) cost the size of the answer, not the
node's degree. A name index maps labels (exact, and normalised on first use) to node ids.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TypeAlias

import numpy as np
import pandas as pd

from kgreasoner.kg.base import Direction, KnowledgeGraph, check_direction, check_limit
from kgreasoner.kg.kb_checks import (
    NAME_FIELDS,
    TRIPLE_FIELDS,
    KBFileError,
    bad_relation,
    check_header,
    check_id_triples,
    check_line_sizes,
    check_nul,
    literal_message,
    literal_problem,
    literal_subject,
    literal_subject_message,
    relation_message,
    repeated_id_message,
    warn_shared_labels,
)
from kgreasoner.kg.rdf import RDFS_LABEL, iter_ntriples_as_ids
from kgreasoner.records.edges import Edge
from kgreasoner.records.ids import is_literal_id, literal_value
from kgreasoner.records.normalize import normalize_answer

IdColumn: TypeAlias = "Sequence[str] | np.ndarray"
"""One field of every triple, in order: a list of ids, or the object array a TSV reader returns."""


class MemoryKG(KnowledgeGraph):
    """An in-memory graph built from (subject, relation, object) id triples (a repeated one counts once).

    Args:
        triples: the edges, as three equal-length sequences of strings or an iterable of tuples.
        names: optional id -> label map. When given, every non-literal node missing from it is
            an unnamed (mediator) node; without it, ids are their own labels.
    """

    def __init__(
        self,
        subjects: IdColumn,
        relations: IdColumn,
        objects: IdColumn,
        names: dict[str, str] | None = None,
    ) -> None:
        subject_ids = np.asarray(subjects, dtype=object)
        relation_ids = np.asarray(relations, dtype=object)
        object_ids = np.asarray(objects, dtype=object)
        if not (len(subject_ids) == len(relation_ids) == len(object_ids)):
            raise ValueError("subjects, relations and objects must have the same length")
        codes, nodes = pd.factorize(np.concatenate([subject_ids, object_ids]), sort=False)
        rel_codes, rels = pd.factorize(relation_ids, sort=False)
        n = len(subject_ids)
        src = codes[:n].astype(np.int64)
        dst = codes[n:].astype(np.int64)
        rel_codes = rel_codes.astype(np.int32)
        # A triple is a fact: a line repeated in the file is one edge, as in an RDF store.
        unique = ~pd.DataFrame({"s": src, "r": rel_codes, "o": dst}).duplicated().to_numpy()
        src, dst, rel_codes = src[unique], dst[unique], rel_codes[unique]

        self._nodes: list[str] = list(nodes)
        self._rels: list[str] = list(rels)
        self._node_index = {node: i for i, node in enumerate(self._nodes)}
        self._rel_index = {rel: i for i, rel in enumerate(self._rels)}
        num_nodes = len(self._nodes)
        self.num_triples = len(src)
        """Distinct triples."""

        self._out = _csr(src, dst, rel_codes, num_nodes)
        self._in = _csr(dst, src, rel_codes, num_nodes)
        self._out_groups = _relation_index(self._out[0], self._out[2], len(self._rels))
        self._in_groups = _relation_index(self._in[0], self._in[2], len(self._rels))

        self._is_literal = np.fromiter((is_literal_id(x) for x in self._nodes), dtype=bool, count=num_nodes)
        if names is None:
            self._labels = [literal_value(x) if lit else x for x, lit in zip(self._nodes, self._is_literal)]
            self._unnamed = np.zeros(num_nodes, dtype=bool)
        else:
            self._labels = []
            unnamed = np.zeros(num_nodes, dtype=bool)
            for i, (node, lit) in enumerate(zip(self._nodes, self._is_literal)):
                if lit:
                    self._labels.append(literal_value(node))
                elif node in names:
                    self._labels.append(names[node])
                else:
                    self._labels.append(node)
                    unnamed[i] = True
            self._unnamed = unnamed
        self._exact_index: dict[str, list[int]] | None = None
        self._norm_index: dict[str, list[int]] | None = None
        # Object arrays of the same lists, so that a hub's edges are gathered by array indexing
        # (one numpy take per field) rather than one Python lookup per edge and field.
        self._node_array = np.array(self._nodes, dtype=object)
        self._label_array = np.array(self._labels, dtype=object)
        self._rel_array = np.array(self._rels, dtype=object)

    # --- construction -------------------------------------------------------------------------
    @classmethod
    def from_triples(cls, triples: Iterable[tuple[str, str, str]], names: dict[str, str] | None = None) -> MemoryKG:
        rows = list(triples)
        if not rows:
            return cls([], [], [], names)
        s, r, o = zip(*rows)
        return cls(s, r, o, names)

    @classmethod
    def from_file(cls, path: str | Path, names: str | Path | dict[str, str] | None = None) -> MemoryKG:
        """Load TSV (`subject \\t relation \\t object`) or N-Triples (`.nt`), with optional names.

        For a TSV, `names` may be a `names.tsv` path (`id \\t label`); when omitted, a
        `names.tsv` next to the triples file is used if present. In N-Triples, `rdfs:label`
        triples become names instead of edges.
        """
        return cls(*read_kb_file(Path(path), names))

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
        node = self._node_index.get(entity)
        if node is None or limit == 0:
            return []
        rel_filter = None
        if relations is not None:
            rel_filter = np.array([self._rel_index[r] for r in relations if r in self._rel_index], dtype=np.int32)
            if rel_filter.size == 0:
                return []
        edges: list[Edge] = []
        for side in ("out", "in") if direction == "both" else (direction,):
            indptr, other, rel = self._out if side == "out" else self._in
            room = None if limit is None else limit - len(edges)
            if rel_filter is None:
                lo, hi = indptr[node], indptr[node + 1]
                stop = hi if room is None else min(hi, lo + room)
                others, rel_ids = other[lo:stop], rel[lo:stop]
            else:
                positions = self._relation_positions(side, node, rel_filter)[:room]
                others, rel_ids = other[positions], rel[positions]
            edges.extend(self._edges(node, rel_ids, others, side))
            if limit is not None and len(edges) >= limit:
                break
        return edges

    def _relation_positions(self, side: str, node: int, rel_filter: np.ndarray) -> np.ndarray:
        """Positions in the `side` CSR arrays of the node's edges by the relations in `rel_filter`, in
        file order: the index's groups of those relations, merged."""
        group_ptr, group_rel, group_start, perm = self._out_groups if side == "out" else self._in_groups
        g0, g1 = group_ptr[node], group_ptr[node + 1]
        chosen = np.flatnonzero(np.isin(group_rel[g0:g1], rel_filter)) + g0
        if chosen.size == 1:  # a group is already in file order (the index sort is stable)
            return perm[group_start[chosen[0]] : group_start[chosen[0] + 1]]
        if chosen.size == 0:
            return perm[:0]
        return np.sort(np.concatenate([perm[group_start[g] : group_start[g + 1]] for g in chosen]))

    def relation_counts(self, entity: str, direction: Direction = "both") -> list[tuple[str, str, int]]:
        """(relation, "out" or "in", edges) for each relation at `entity`, read from the relation index
        without touching the edges: outgoing first, each side in the order of the relation's first
        edge (the order `neighbors` lists them)."""
        check_direction(direction)
        node = self._node_index.get(entity)
        if node is None:
            return []
        counts = []
        for side in ("out", "in") if direction == "both" else (direction,):
            group_ptr, group_rel, group_start, perm = self._out_groups if side == "out" else self._in_groups
            g0, g1 = group_ptr[node], group_ptr[node + 1]
            starts = group_start[g0 : g1 + 1]
            for g in np.argsort(perm[starts[:-1]], kind="stable").tolist():
                counts.append((self._rels[group_rel[g0 + g]], side, int(starts[g + 1] - starts[g])))
        return counts

    def _edges(self, node: int, rel_ids: np.ndarray, others: np.ndarray, side: str) -> list[Edge]:
        """The Edges from `node` to `others` by `rel_ids`, every field gathered as one array slice."""
        n = len(others)
        if n == 0:
            return []
        relations = self._rel_array[rel_ids].tolist()
        other_ids, other_labels = self._node_array[others].tolist(), self._label_array[others].tolist()
        other_unnamed = self._unnamed[others].tolist()
        own = [self._nodes[node]] * n
        own_label = [self._labels[node]] * n
        own_unnamed = [bool(self._unnamed[node])] * n
        if side == "out":
            return list(
                map(
                    Edge,
                    own,
                    relations,
                    other_ids,
                    own_label,
                    other_labels,
                    ["out"] * n,
                    self._is_literal[others].tolist(),
                    own_unnamed,
                    other_unnamed,
                )
            )
        return list(
            map(
                Edge,
                other_ids,
                relations,
                own,
                other_labels,
                own_label,
                ["in"] * n,
                [bool(self._is_literal[node])] * n,
                other_unnamed,
                own_unnamed,
            )
        )

    def label(self, entity: str) -> str:
        node = self._node_index.get(entity)
        if node is None:
            return literal_value(entity)
        return self._labels[node]

    def resolve(self, name: str) -> list[str]:
        if self._exact_index is None:
            self._exact_index = defaultdict(list)
            for i, lab in enumerate(self._labels):
                if not self._unnamed[i]:
                    self._exact_index[lab].append(i)
        hits = list(self._exact_index.get(name, ()))
        if name in self._node_index and self._node_index[name] not in hits:
            hits.insert(0, self._node_index[name])
        if not hits:
            if self._norm_index is None:
                self._norm_index = defaultdict(list)
                for lab, ids in self._exact_index.items():
                    self._norm_index[normalize_answer(lab)].extend(ids)
            hits = list(self._norm_index.get(normalize_answer(name), ()))
        return [self._nodes[i] for i in hits]

    def degree(self, entity: str, direction: Direction = "both") -> int:
        check_direction(direction)
        node = self._node_index.get(entity)
        if node is None:
            return 0
        out = int(self._out[0][node + 1] - self._out[0][node])
        inc = int(self._in[0][node + 1] - self._in[0][node])
        return {"out": out, "in": inc, "both": out + inc}[direction]

    def is_unnamed(self, entity: str) -> bool:
        node = self._node_index.get(entity)
        return bool(self._unnamed[node]) if node is not None else False

    def __contains__(self, entity: str) -> bool:
        return entity in self._node_index

    @property
    def entities(self) -> list[str]:
        return self._nodes

    @property
    def relation_types(self) -> list[str]:
        return self._rels

    def triples(self) -> Iterable[tuple[str, str, str]]:
        """Every edge as (subject, relation, object) ids, grouped by subject."""
        indptr, other, rel = self._out
        subjects = np.repeat(np.arange(len(self._nodes)), np.diff(indptr))
        chunk = 1 << 16  # ids gathered by array indexing, a chunk at a time, so memory stays flat
        for lo in range(0, len(other), chunk):
            yield from zip(
                self._node_array[subjects[lo : lo + chunk]].tolist(),
                self._rel_array[rel[lo : lo + chunk]].tolist(),
                self._node_array[other[lo : lo + chunk]].tolist(),
            )

    def names(self) -> dict[str, str]:
        """id -> label of every named, non-literal node."""
        return {
            node: lab
            for node, lab, lit, un in zip(self._nodes, self._labels, self._is_literal, self._unnamed)
            if not lit and not un
        }


def _csr(src: np.ndarray, dst: np.ndarray, rel: np.ndarray, num_nodes: int):
    """Sort edges by source (stable, so file order is kept within a node) into CSR arrays."""
    order = np.argsort(src, kind="stable")
    counts = np.bincount(src, minlength=num_nodes)
    indptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    return indptr, dst[order], rel[order]


def _relation_index(indptr: np.ndarray, rel: np.ndarray, num_rels: int):
    """Each node's edges grouped by relation: (group_ptr, group_rel, group_start, perm).

    `perm` lists the CSR positions sorted by (node, relation), stably, so each group keeps file
    order; the groups of node n are group_ptr[n]:group_ptr[n + 1], group g has relation
    group_rel[g] and its positions are perm[group_start[g]:group_start[g + 1]].
    """
    num_nodes, num_edges = len(indptr) - 1, len(rel)
    position = np.int32 if num_edges < 2**31 else np.int64  # half the bytes up to two billion edges
    key = np.repeat(np.arange(num_nodes, dtype=np.int64), np.diff(indptr)) * max(num_rels, 1) + rel
    perm = np.argsort(key, kind="stable")
    key = key[perm]
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1]))) if num_edges else np.zeros(0, np.int64)
    group_node = key[starts] // max(num_rels, 1)
    group_ptr = np.zeros(num_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(group_node, minlength=num_nodes), out=group_ptr[1:])
    group_rel = (key[starts] % max(num_rels, 1)).astype(np.int32)
    group_start = np.append(starts, num_edges).astype(position)
    return group_ptr, group_rel, group_start, perm.astype(position)


_UTF8_BOM = b"\xef\xbb\xbf"


# A space (or vertical tab / form feed) at a field's edge: `Utah ` would be a second node beside `Utah`.
def _padded_field(data: bytes) -> int | None:
    """Offset of the first space (or vertical tab / form feed) at a field's edge, else None.

    Vectorised over the bytes: each space's neighbours are read by array indexing (a regex
    alternation anchored at every line start took seconds per million lines).
    """
    raw = np.frombuffer(data, dtype=np.uint8)
    spaces = np.flatnonzero((raw == 0x20) | (raw == 0x0B) | (raw == 0x0C))
    if spaces.size == 0:
        return None
    padded_raw = np.concatenate(([0x0A], raw, [0x0A]))  # a line break before the first and after the last byte
    before, after = padded_raw[spaces], padded_raw[spaces + 2]
    after_cr = padded_raw[np.minimum(spaces + 3, len(padded_raw) - 1)]
    at_start = (before == 0x09) | (before == 0x0A)
    at_end = (after == 0x09) | (after == 0x0A) | ((after == 0x0D) & (after_cr == 0x0A))
    hits = spaces[at_start | at_end]
    return int(hits[0]) if hits.size else None


def read_utf8(path: Path) -> bytes:
    """The file's bytes without a UTF-8 byte-order mark; bytes that are not UTF-8 raise a ValueError
    naming file, line and column."""
    data = path.read_bytes()
    if data.startswith(_UTF8_BOM):
        data = data[len(_UTF8_BOM) :]
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 (byte 0x{data[err.start]:02x} at column {column})") from None
    return data


def read_kb_file(
    path: Path, names: str | Path | dict[str, str] | None = None
) -> tuple[IdColumn, IdColumn, IdColumn, dict[str, str] | None]:
    """(subjects, relations, objects, names or None) of a KB file, as every store loads one.

    A TSV takes its names from `names` (a `names.tsv` path or a dict), else from a `names.tsv`
    beside it; N-Triples from `names` when given, else from its `rdfs:label` triples, which are
    names and not edges.
    """
    if not path.exists():
        raise FileNotFoundError(f"KG file not found: {path}")
    if path.suffix == ".nt":
        _check_nt_line_sizes(path)
        subjects: list[str] = []
        relations: list[str] = []
        objects: list[str] = []
        labels: dict[str, str] = {}
        for s, r, o in iter_ntriples_as_ids(path):
            if r == RDFS_LABEL:
                labels[s] = literal_value(o)
            else:
                subjects.append(s)
                relations.append(r)
                objects.append(o)
        check_id_triples(path, subjects, relations, objects)
        if names is None:
            names = labels or None
        columns: tuple[IdColumn, IdColumn, IdColumn] = (subjects, relations, objects)
    else:
        columns = read_tsv_triples(path)
        if names is None and (path.parent / "names.tsv").exists() and path.name != "names.tsv":
            names = path.parent / "names.tsv"
    named_in = Path(names) if isinstance(names, (str, Path)) else path
    if isinstance(names, (str, Path)):
        names = read_names(Path(names))
    if names:
        warn_shared_labels(named_in, names)
    return (*columns, names)


def _check_nt_line_sizes(path: Path) -> None:
    """`check_line_sizes` on an N-Triples file, mapped rather than read (it may be Freebase's)."""
    import mmap

    with open(path, "rb") as handle:
        if path.stat().st_size == 0:
            return
        with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            check_line_sizes(path, data)


def read_tsv_triples(path: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Read a 3-column TSV; a malformed line raises a ValueError naming file and line.

    Malformed: not UTF-8, not exactly three non-empty tab-separated fields, a field with
    spaces at its edge, or a literal (`"..."`) that is not valid N-Triples, or any case of
    `kgreasoner.kg.kb_checks` (a NUL byte, a header line, a `^relation`, an impossible date). An
    empty file is an error too: a KB with no triples is a mistake, not a graph.
    """
    data = read_utf8(path)
    check_line_sizes(path, data)
    check_nul(path, data, TRIPLE_FIELDS)
    padded = _padded_field(data)
    if padded is not None:
        line = data.count(b"\n", 0, padded) + 1
        raise ValueError(
            f"{path}:{line}: a field starts or ends with a space, which would make it a different id; remove the space"
        )
    try:
        frame = pd.read_csv(
            io.BytesIO(data),
            sep="\t",
            header=None,
            dtype=str,
            quoting=csv.QUOTE_NONE,
            keep_default_na=False,
            na_filter=False,
            engine="c",
            on_bad_lines="error",
            skip_blank_lines=True,
        )
    except pd.errors.EmptyDataError:
        raise ValueError(
            f"{path}: no triples (the file is empty); expected 'subject<TAB>relation<TAB>object' lines"
        ) from None
    except pd.errors.ParserError as err:
        raise _bad_line(path, data) from err
    # Columns come from the first line: a frame that is not 3 wide, or has an empty cell, has a bad line.
    if frame.shape[1] != 3 or (frame == "").to_numpy().any():
        raise _bad_line(path, data)
    check_header(path, _first_line_number(data), list(frame.iloc[0]), TRIPLE_FIELDS)
    subjects, relations, objects = (frame[c].to_numpy(object) for c in frame.columns)
    relation = bad_relation(relations)
    if relation is not None:
        raise KBFileError(f"{path}:{_line_of(data, relation, 1)}: {relation_message(relation)}")
    subject = literal_subject(subjects)
    if subject is not None:
        raise KBFileError(f"{path}:{_line_of(data, subject, 0)}: {literal_subject_message(subject)}")
    _check_literals(path, data, objects)
    return subjects, relations, objects


def _first_line_number(data: bytes) -> int:
    """1-based number of the first line with something on it."""
    text = data.lstrip(b"\r\n")
    return data[: len(data) - len(text)].count(b"\n") + 1


def _bad_line(path: Path, data: bytes) -> ValueError:
    """The error for the first line that is not three non-empty tab-separated fields."""
    for number, line in enumerate(data.decode("utf-8").split("\n"), start=1):
        line = line.removesuffix("\r")
        if not line:
            continue
        fields = line.split("\t")
        if len(fields) != 3 or not all(fields):
            return ValueError(
                f"{path}:{number}: expected 3 tab-separated non-empty fields (subject, relation, "
                f"object), got {len(fields)} field(s){'' if all(fields) else ', some empty'}"
            )
    return ValueError(f"{path}: malformed triples file; expected 'subject<TAB>relation<TAB>object' lines")


def _check_literals(path: Path, data: bytes, objects: np.ndarray) -> None:
    """Every literal id (an object: `read_tsv_triples` refused literal subjects) must parse as N-Triples, as
    `kg load` requires, and hold a value of its datatype (each distinct one is parsed once)."""
    for node in pd.unique(objects):
        if is_literal_id(node):
            try:
                problem = literal_problem(node)
            except (SyntaxError, ValueError) as err:
                line = _line_of(data, node)
                raise ValueError(f"{path}:{line}: {node!r} is not a valid N-Triples literal ({err})") from None
            if problem is not None:
                raise KBFileError(f"{path}:{_line_of(data, node, 2)}: {literal_message('object', node, problem)}")


def _line_of(data: bytes, field: str, column: int | None = None) -> int:
    """1-based number of the first line holding `field` as a whole tab-separated field (in `column`
    when given), else 0."""
    for number, line in enumerate(data.decode("utf-8").split("\n"), start=1):
        fields = line.removesuffix("\r").split("\t")
        if (field in fields) if column is None else (len(fields) > column and fields[column] == field):
            return number
    return 0


def read_names(path: Path) -> dict[str, str]:
    """Read `id \\t label` lines; a malformed line, a header line, a NUL byte or an id named twice
    raises a ValueError naming file and line."""
    names: dict[str, str] = {}
    lines: dict[str, int] = {}
    data = read_utf8(path)
    check_line_sizes(path, data)
    check_nul(path, data, NAME_FIELDS)
    for number, text in enumerate(data.decode("utf-8").split("\n"), start=1):
        text = text.removesuffix("\r")
        if not text:
            continue
        parts = text.split("\t")
        if not lines:
            check_header(path, number, parts, NAME_FIELDS)
        if len(parts) != 2 or not parts[0] or not parts[1]:
            raise ValueError(f"{path}:{number}: expected 'id<TAB>label'")
        if parts[0] != parts[0].strip(" \x0b\x0c"):  # as in kb.tsv: `Utah ` would name no node of the graph
            raise ValueError(
                f"{path}:{number}: the id starts or ends with a space, which would make it a different "
                "id; remove the space"
            )
        if parts[0] in lines:
            raise KBFileError(f"{path}:{number}: {repeated_id_message(parts[0], lines[parts[0]])}")
        names[parts[0]] = parts[1]
        lines[parts[0]] = number
    return names
