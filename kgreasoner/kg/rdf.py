"""How our string ids map to RDF terms, shared by the N-Triples reader, oxigraph and SPARQL.

An id becomes an IRI by percent-encoding it under a namespace, so any id — quotes, braces,
spaces, newlines included — is a valid IRI that cannot break out of `<...>` in a query.
Literal ids are N-Triples literals already (see `kgreasoner.kg.base`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

import pyoxigraph as ox

from kgreasoner.records.ids import is_literal_id

ENTITY_NS = "http://kgreasoner.local/entity/"
RELATION_NS = "http://kgreasoner.local/relation/"
RDFS_LABEL = "http://www.w3.org/2000/01/rdf-schema#label"


def to_iri(identifier: str, namespace: str) -> str:
    """The IRI of an id under `namespace`; every character outside [A-Za-z0-9_.~-] is escaped."""
    return namespace + quote(identifier, safe="")


def from_iri(iri: str, namespace: str) -> str:
    """The id of an IRI built by `to_iri`; an IRI outside `namespace` is its own id."""
    if iri.startswith(namespace):
        return unquote(iri[len(namespace) :])
    return iri


def term_to_id(term, entity_ns: str = ENTITY_NS) -> str:
    """A pyoxigraph term as our id: IRIs under the namespace unquoted, literals in N-Triples form."""
    if isinstance(term, ox.NamedNode):
        return from_iri(term.value, entity_ns)
    if isinstance(term, ox.BlankNode):
        return "_:" + term.value
    return str(term)


def id_to_term(identifier: str, entity_ns: str = ENTITY_NS):
    """Our id as a pyoxigraph term (the inverse of `term_to_id`)."""
    if is_literal_id(identifier):
        return _parse_literal(identifier)
    if identifier.startswith("_:"):
        return ox.BlankNode(identifier[2:])
    return ox.NamedNode(to_iri(identifier, entity_ns))


def _parse_literal(text: str) -> ox.Literal:
    quad = next(iter(ox.parse(input=f"<urn:s> <urn:p> {text} .\n", format=ox.RdfFormat.N_TRIPLES)))
    return quad.object


def iter_ntriples_as_ids(
    path: str | Path, entity_ns: str = ENTITY_NS, relation_ns: str = RELATION_NS
) -> Iterator[tuple[str, str, str]]:
    """Triples of an N-Triples file as (subject, relation, object) ids."""
    try:
        for triple in ox.parse(path=str(path), format=ox.RdfFormat.N_TRIPLES):
            yield (
                term_to_id(triple.subject, entity_ns),
                from_iri(triple.predicate.value, relation_ns),
                term_to_id(triple.object, entity_ns),
            )
    except SyntaxError as err:
        raise ValueError(f"{path}: not valid N-Triples ({err})") from err
