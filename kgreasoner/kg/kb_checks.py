"""What a KB or names file may not hold, though it parses: the checks every loader of them runs.

`kg load`, `kg stats`, `prepare-data` and the dataset loaders all read KB files through
`kgreasoner.kg.memory` (`read_tsv_triples`, `read_names`) or `kgreasoner.kg.rdf` (N-Triples), and
those readers call these checks, so each case below is refused the same way everywhere, with the
file, line and field:

- a line longer than `MAX_LINE_BYTES` (1 MiB; a broken or hostile file, refused before it is parsed);
- a NUL byte in any field (an id no one can type, and a C string ends there);
- a header line (`subject relation object`, `id label`): its words would become nodes and a relation;
- a relation whose name starts with `^`, which in a gold path means "walked backwards";
- a literal as a triple's subject (`"1815"<TAB>born_in<TAB>Paris`): RDF has literals as objects only, so no
  store could hold the triple;
- a typed literal its datatype cannot hold (`"1815-13-45"^^xsd:date`, see `kgreasoner.kg.xsd`);
- in names.tsv, an id named twice (the last label would win, so the first no longer resolves).

One case loads with a warning (`warn_shared_labels`): a label that several entities bear. A KB may well
hold two cities of one name; a search by that name then lists them all, for the model to pick one by
handle or id, and a topic given by name takes the first.
"""

from __future__ import annotations

import logging
import mmap
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from kgreasoner.kg.rdf import id_to_term
from kgreasoner.kg.xsd import invalid_reason
from kgreasoner.protocol import printable
from kgreasoner.records.ids import INVERSE_PREFIX, is_literal_id
from kgreasoner.records.schema import MAX_LINE_BYTES, line_size_message

log = logging.getLogger(__name__)

TRIPLE_FIELDS = ("subject", "relation", "object")
NAME_FIELDS = ("id", "label")
# Column names a header line uses, by position: a first line made of these is a header, not a triple.
_TRIPLE_HEADER_WORDS = (
    {"subject", "head", "source", "src", "s", "h", "from", "entity", "subj"},
    {"relation", "predicate", "property", "rel", "r", "p", "edge", "pred", "relation_type"},
    {"object", "tail", "target", "dst", "o", "t", "to", "value", "obj"},
)
_NAMES_HEADER_WORDS = ({"id", "entity", "node", "mid", "qid", "entity_id"}, {"label", "name", "names", "title"})


class KBFileError(ValueError):
    """A KB or names file holds something no loader accepts; the message names the file, line and field."""


def check_line_sizes(path: Path, data: bytes | mmap.mmap) -> None:
    """Refuse a line of `data` (the file's bytes, or the file mapped) longer than `MAX_LINE_BYTES`, naming its
    number and size.

    Only one byte in every `MAX_LINE_BYTES // 2` is a start of a search: a line over the limit holds a whole
    block of that size with no newline, and each block of an ordinary file has one within its first line.
    """
    step = MAX_LINE_BYTES // 2
    for block in range(0, len(data), step):
        if data.find(b"\n", block, block + step) >= 0:
            continue
        start = data.rfind(b"\n", 0, block) + 1
        end = data.find(b"\n", block)
        size = (len(data) if end < 0 else end) - start
        if size > MAX_LINE_BYTES:
            chunks = range(0, start, 1 << 24)
            line = 1 + sum(data[i : min(i + (1 << 24), start)].count(b"\n") for i in chunks)
            raise KBFileError(f"{path}:{line}: {line_size_message(size)}")


def check_header(path: Path, line: int, first_line: Sequence[str], fields: Sequence[str]) -> None:
    """Refuse a first line whose every field is a column name (`subject relation object`, `id label`)."""
    words = _TRIPLE_HEADER_WORDS if fields == TRIPLE_FIELDS else _NAMES_HEADER_WORDS
    if len(first_line) == len(words) and all(f.strip().lower() in w for f, w in zip(first_line, words)):
        kind = "triple" if fields == TRIPLE_FIELDS else "name"
        raise KBFileError(
            f"{path}:{line}: a header line ({' '.join(first_line)!r}) would be loaded as a {kind}; "
            "the file has no header: remove the line"
        )


def check_nul(path: Path, data: bytes, fields: Sequence[str]) -> None:
    """Refuse a NUL byte anywhere in the file, naming the line and the field that holds it."""
    at = data.find(b"\x00")
    if at < 0:
        return
    line_start = data.rfind(b"\n", 0, at) + 1
    index = data.count(b"\t", line_start, at)
    field = fields[index] if index < len(fields) else f"field {index + 1}"
    line = data.count(b"\n", 0, at) + 1
    raise KBFileError(
        f"{path}:{line}: field '{field}' holds a NUL byte (column {at - line_start + 1}); "
        "ids and labels cannot contain one"
    )


def bad_relation(relations: Sequence[str]) -> str | None:
    """The first relation name no path could walk (a leading `^`), else None."""
    unique = pd.unique(np.asarray(relations, dtype=object))
    starts = [r for r in unique if r.startswith(INVERSE_PREFIX)]
    return starts[0] if starts else None


def relation_message(relation: str) -> str:
    return (
        f"field 'relation' is {relation!r}: a leading '{INVERSE_PREFIX}' means 'walked backwards' in gold paths, "
        "so no path could name this relation; rename it"
    )


def literal_subject(subjects: Sequence[str]) -> str | None:
    """The first distinct subject that is a literal, else None."""
    literals = [s for s in pd.unique(np.asarray(subjects, dtype=object)) if is_literal_id(s)]
    return literals[0] if literals else None


def literal_subject_message(literal: str) -> str:
    return (
        f"field 'subject' is the literal {literal}; in RDF only an object can be a literal, so no store can hold "
        "this triple: make the subject an id, or write the triple the other way round with an inverse relation"
    )


def literal_problem(node: str) -> str | None:
    """Why a literal id (already valid N-Triples) holds no value of its datatype, else None."""
    term = id_to_term(node)
    datatype = getattr(term, "datatype", None)
    return None if datatype is None else invalid_reason(term.value, datatype.value)


def bad_literal(nodes: Sequence[str]) -> tuple[str, str] | None:
    """(literal id, reason) of the first distinct literal whose datatype cannot hold its text, else None."""
    for node in pd.unique(np.asarray(nodes, dtype=object)):
        if is_literal_id(node):
            reason = literal_problem(node)
            if reason is not None:
                return node, reason
    return None


def literal_message(field: str, literal: str, reason: str) -> str:
    datatype = literal.rpartition("^^<")[2][:-1].replace("http://www.w3.org/2001/XMLSchema#", "xsd:")
    return f"field '{field}' is {literal}, which is not a valid {datatype} ({reason})"


def repeated_id_message(identifier: str, first_line: int) -> str:
    return (
        f"field 'id': {identifier!r} is named again (first at line {first_line}); give each id one label, "
        "or the earlier one stops resolving"
    )


def check_id_triples(path: Path, subjects: Sequence[str], relations: Sequence[str], objects: Sequence[str]) -> None:
    """The checks above on triples already read as ids (N-Triples), each error naming the first line
    whose text holds the offending term."""
    from kgreasoner.kg.rdf import RELATION_NS, to_iri

    for field, values in zip(TRIPLE_FIELDS, (subjects, relations, objects)):
        held = [v for v in pd.unique(np.asarray(values, dtype=object)) if "\x00" in v]
        if held:
            raise KBFileError(
                f"{path}:{_nt_line(path, held[0])}: field '{field}' holds a NUL byte ({held[0]!r}); "
                "ids and labels cannot contain one"
            )
    relation = bad_relation(relations)
    if relation is not None:
        line = _nt_line(path, to_iri(relation, RELATION_NS), relation)
        raise KBFileError(f"{path}:{line}: {relation_message(relation)}")
    found = bad_literal(objects)
    if found is not None:
        node, reason = found
        line = _nt_line(path, str(id_to_term(node)), node)
        raise KBFileError(f"{path}:{line}: {literal_message('object', node, reason)}")


def _nt_line(path: Path, *needles: str) -> int:
    """1-based number of the first line of `path` holding one of `needles` as text (0 when none does)."""
    with open(path, encoding="utf-8", errors="replace") as handle:
        for number, line in enumerate(handle, start=1):
            if any(needle in line for needle in needles):
                return number
    return 0


SHARED_LABELS_SHOWN = 5
"""Shared labels a load's warning names (the most shared first); it counts the rest."""


def shared_labels(names: Mapping[str, str]) -> list[tuple[str, int]]:
    """(label, entities that bear it) of every label of `names` borne by more than one entity, the most
    shared first (ties by label)."""
    counts = Counter(names.values())
    return sorted(((label, n) for label, n in counts.items() if n > 1), key=lambda item: (-item[1], item[0]))


def warn_shared_labels(path: Path, names: Mapping[str, str]) -> None:
    """Log one warning for the KB at `path` when several of its entities share a label, naming the
    SHARED_LABELS_SHOWN most shared labels with their counts and counting the others."""
    shared = shared_labels(names)
    if not shared:
        return
    listed = ", ".join(f'"{printable(label)}" ({n} entities)' for label, n in shared[:SHARED_LABELS_SHOWN])
    rest = len(shared) - SHARED_LABELS_SHOWN
    more = f" and {rest} more label{'s' if rest > 1 else ''}" if rest > 0 else ""
    log.warning(
        "%s: %d label%s borne by several entities: %s%s; a search by such a name lists every entity that "
        "bears it (the model picks one by handle or id), and a topic given by that name takes the first",
        path,
        len(shared),
        " is" if len(shared) == 1 else "s are",
        listed,
        more,
    )
