"""The `sparql` backend: any SPARQL 1.1 endpoint through SPARQLWrapper (JSON results).

Dialects say how our string ids become RDF terms and which triples count as edges:

- `generic`: the IRIs of `kgreasoner.kg.rdf` (ids percent-encoded under kgreasoner.local) and
  `rdfs:label`, i.e. a store written by `kgreasoner kg load` and published by `kg serve`.
- `freebase`: ids are Freebase mids (`m.07srw`) in the `ns:` namespace (written as full IRIs:
  Oxigraph 0.5 rejects prefixed names with two dots, like `ns:type.object.name`); names are English
  `ns:type.object.name`; a node without a name is a mediator (CVT); relations outside `ns:` and
  those starting with `type.object.`, `common.` or `freebase.` are filtered by default. This is
  the vocabulary ToG queries on a Virtuoso Freebase.
- `wikidata`: items `Q123` and truthy claims `wdt:P31`; English `rdfs:label`.

Safety: an id reaches a query only as a term built here — a percent-encoded IRI (generic), an
IRI whose local part matched a strict pattern or that pyoxigraph validated, or a literal that
pyoxigraph parsed and re-serialised with escapes. An id no such term can be built for (empty, a
blank node, a malformed literal, a lone surrogate) reaches no query: it names no node, and the store
answers for it as for an id missing from the graph, as the memory store does (no edges, degree 0, its own
text as its label); a query builder given one raises a ValueError naming the field. Names in `resolve`
are always escaped literals. Every query is SELECT DISTINCT … LIMIT;
a long one (a long non-ASCII name, say) is sent by POST, as servers cap the length of a URL.

Virtuoso answers at most `ResultSetMaxRows` rows whatever the LIMIT, and says so only in an
`X-SPARQL-MaxRows` response header: a neighbour or resolve result cut there is fetched again in
pages of that size (ORDER BY … OFFSET … LIMIT: without an order, OFFSET pages need not partition
the result), so a hub's edges are never silently dropped.

Each neighbour query fetches the labels of the queried node and of its neighbours in the same
request (OPTIONAL patterns); both directions go in one UNION unless a limit asks for outgoing
edges first, so a call usually costs one round trip. `neighbors_of_each` asks the same per-side
queries of many entities (the context edges of a search's candidates) as subqueries of one request
per `CONTEXT_BATCH` entities; `labels` asks for the names of `LABEL_BATCH` entities a request.
"""

from __future__ import annotations

import http.client
import json
import logging
import re
import socket
import urllib.error
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pyoxigraph as ox
import tenacity
from SPARQLWrapper import JSON, POST, SPARQLWrapper
from SPARQLWrapper.SPARQLExceptions import EndPointInternalError, SPARQLWrapperException

from kgreasoner.kg.base import Direction, KGError, KGQueryRejected, KnowledgeGraph, check_direction, check_limit
from kgreasoner.kg.oxigraph_store import (
    INDEX_GRAPH,
    INDEX_HAS_NAMES,
    INDEX_NODE,
    INDEX_STORE,
    exact_label_key,
    normalized_label_key,
)
from kgreasoner.kg.rdf import ENTITY_NS, RDFS_LABEL, RELATION_NS, from_iri, id_to_term, to_iri
from kgreasoner.records.edges import Edge
from kgreasoner.records.ids import is_literal_id, literal_value

log = logging.getLogger(__name__)

DIALECTS = ("generic", "freebase", "wikidata")
FREEBASE_NS = "http://rdf.freebase.com/ns/"
FREEBASE_EXCLUDED_RELATIONS = ("type.object.", "common.", "freebase.")
WIKIDATA_ENTITY_NS = "http://www.wikidata.org/entity/"
WIKIDATA_DIRECT_NS = "http://www.wikidata.org/prop/direct/"
_ABSOLUTE_IRI = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:\S+$")
# Errors worth another attempt: the endpoint was unreachable, slow, overloaded (429) or failed on its
# side (HTTP errors are sorted by status first: another 4xx is the endpoint refusing this query, not an outage).
_TRANSIENT = (
    urllib.error.URLError,
    socket.timeout,
    TimeoutError,
    ConnectionError,
    http.client.HTTPException,
    EndPointInternalError,
)
TOO_MANY_REQUESTS = 429
MAX_ROWS_HEADER = "X-SPARQL-MaxRows"
"""Virtuoso's response header naming the row cap (ResultSetMaxRows) a result reached."""
CONTEXT_BATCH = 16
"""Entities per `neighbors_of_each` request: oxigraph's time to plan a query grows faster than the
number of its UNION branches (63 entities took ten times as long as 10, and 63 ids that match
nothing nearly as long), so a larger search is sent as a few requests of this size."""
LABEL_BATCH = 100
"""Entities per `labels` request (one VALUES row each)."""
MAX_GET_QUERY_BYTES = 2000
"""Longer URL-encoded queries go by POST: servers cap a request's URL or headers (oxigraph at 8 KB,
others at 2-8 KB), and percent-encoded non-ASCII names take 6-12 bytes a character."""


@dataclass(frozen=True)
class Dialect:
    """How ids map to RDF terms and which predicates are edges, for one family of endpoints."""

    name: str
    label_predicate: str  # SPARQL term of the naming predicate
    label_languages: tuple[str, ...]  # accepted label languages; "" = no language tag
    entity_ns: str = ENTITY_NS  # generic: where any id is percent-encoded; strict: of ids that match entity_pattern
    entity_pattern: re.Pattern | None = None
    relation_ns: str = RELATION_NS
    relation_pattern: re.Pattern | None = None
    excluded_relation_prefixes: tuple[str, ...] = ()

    # --- ids -> SPARQL terms ------------------------------------------------------------------
    def entity_term(self, entity: str) -> str:
        if not isinstance(entity, str) or not entity:
            raise ValueError(f"entity: expected a non-empty id string, got {entity!r}")
        _check_unicode("entity", entity)
        if is_literal_id(entity):
            try:
                return str(id_to_term(entity))
            except (SyntaxError, ValueError) as err:
                raise ValueError(f"entity: {entity!r} is not a valid N-Triples literal ({err})") from err
        if self.entity_pattern is None:  # generic: percent-encoding makes any id a safe IRI
            if entity.startswith("_:"):
                raise ValueError(f"entity: blank node {entity!r} cannot be queried over SPARQL")
            return f"<{to_iri(entity, self.entity_ns)}>"
        if self.entity_pattern.fullmatch(entity):
            return f"<{self.entity_ns}{entity}>"
        return _validated_iri(entity, "entity", self.name)

    def relation_term(self, relation: str) -> str:
        if not isinstance(relation, str) or not relation:
            raise ValueError(f"relation: expected a non-empty relation string, got {relation!r}")
        _check_unicode("relation", relation)
        if self.relation_pattern is None:
            return f"<{to_iri(relation, RELATION_NS)}>"
        if self.relation_pattern.fullmatch(relation):
            return f"<{self.relation_ns}{relation}>"
        return _validated_iri(relation, "relation", self.name)

    def name_literal(self, name: str) -> str:
        """`name` as an escaped literal in the dialect's label language."""
        language = self.label_languages[0] if self.label_languages else ""
        return str(ox.Literal(name, language=language) if language else ox.Literal(name))

    # --- JSON bindings -> ids -----------------------------------------------------------------
    def node_id(self, binding: dict) -> str:
        kind, value = binding["type"], binding["value"]
        if kind == "uri":
            if self.entity_pattern is None:
                return from_iri(value, self.entity_ns)
            local = value[len(self.entity_ns) :] if value.startswith(self.entity_ns) else None
            return local if local is not None and self.entity_pattern.fullmatch(local) else value
        if kind == "bnode":
            return "_:" + value
        return _literal_id(binding)

    def relation_id(self, iri: str) -> str:
        if self.relation_pattern is None:
            return from_iri(iri, RELATION_NS)
        local = iri[len(self.relation_ns) :] if iri.startswith(self.relation_ns) else None
        return local if local is not None and self.relation_pattern.fullmatch(local) else iri

    # --- query pieces -------------------------------------------------------------------------
    def edge_filter(self, var: str) -> str:
        """FILTERs that keep only edges of this dialect (labels and excluded relations dropped)."""
        if self.relation_pattern is None:
            return f"FILTER({var} != {self.label_predicate})"
        conditions = [f'STRSTARTS(STR({var}), "{self.relation_ns}")']
        conditions += [f'!STRSTARTS(STR({var}), "{self.relation_ns}{p}")' for p in self.excluded_relation_prefixes]
        return "FILTER(" + " && ".join(conditions) + ")"

    def label_pattern(self, node: str, var: str) -> str:
        """An OPTIONAL pattern binding `var` to a label of `node` in an accepted language."""
        return f"OPTIONAL {{ {node} {self.label_predicate} {var} .{self.label_filter(var)} }}"

    def label_filter(self, var: str) -> str:
        """` FILTER(...)` keeping labels `var` in an accepted language; "" where any label counts."""
        if not self.label_languages:
            return ""
        langs = " || ".join(
            f'LANG({var}) = ""' if lang == "" else f'LANGMATCHES(LANG({var}), "{lang}")'
            for lang in self.label_languages
        )
        return f" FILTER({langs})"

    def label_rank(self, binding: dict) -> int:
        """Position of a label binding's language among the accepted ones (0: the preferred language)."""
        tag = binding.get("xml:lang", "").lower()
        for rank, lang in enumerate(self.label_languages):
            if tag == lang or (lang and tag.startswith(lang + "-")):
                return rank
        return len(self.label_languages)


def _check_unicode(field: str, text: str) -> None:
    """RDF terms are Unicode scalar values: text holding a lone surrogate can name no node or relation."""
    if not _is_unicode(text):
        raise ValueError(f"{field}: {text!r} is not valid Unicode (it holds a lone surrogate)")


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _usage(entity: str, node: str) -> str:
    """A pattern matching any triple that uses `node` (only as object for a literal)."""
    if is_literal_id(entity):
        return f"?o ?p {node} ."
    return f"{{ {node} ?p ?o }} UNION {{ ?o ?p {node} }}"


def _validated_iri(value: str, field: str, dialect: str) -> str:
    """`<value>` when value is an absolute IRI pyoxigraph accepts (no `>`, quotes, spaces, braces)."""
    if _ABSOLUTE_IRI.match(value):
        try:
            return str(ox.NamedNode(value))
        except ValueError:
            pass
    raise ValueError(f"{field}: {value!r} is not a valid {dialect} {field} id")


def _literal_id(binding: dict) -> str:
    """A JSON literal binding in the N-Triples form our ids use."""
    datatype = binding.get("datatype")
    language = binding.get("xml:lang")
    if language:
        return str(ox.Literal(binding["value"], language=language))
    if datatype:
        return str(ox.Literal(binding["value"], datatype=ox.NamedNode(datatype)))
    return str(ox.Literal(binding["value"]))


def make_dialect(name: str, excluded_relation_prefixes: Sequence[str] | None = None, language: str = "en") -> Dialect:
    """The dialect called `name`; freebase's relation filter can be replaced (`()` keeps all)."""
    if name == "generic":
        return Dialect(name, label_predicate=f"<{RDFS_LABEL}>", label_languages=())
    if name == "freebase":
        excluded = (
            FREEBASE_EXCLUDED_RELATIONS if excluded_relation_prefixes is None else tuple(excluded_relation_prefixes)
        )
        for prefix in excluded:  # they are written into queries
            if not re.fullmatch(r"[a-z0-9_.]+", prefix):
                raise ValueError(f"excluded_relation_prefixes: {prefix!r} is not a Freebase relation prefix")
        return Dialect(
            name,
            label_predicate=f"<{FREEBASE_NS}type.object.name>",
            label_languages=(language, ""),
            entity_ns=FREEBASE_NS,
            entity_pattern=re.compile(r"[mg]\.[0-9a-z_]+"),
            relation_ns=FREEBASE_NS,
            relation_pattern=re.compile(r"[a-z0-9_]+(?:\.[a-z0-9_]+)+"),
            excluded_relation_prefixes=excluded,
        )
    if name == "wikidata":
        return Dialect(
            name,
            label_predicate=f"<{RDFS_LABEL}>",
            label_languages=(language,),
            entity_ns=WIKIDATA_ENTITY_NS,
            entity_pattern=re.compile(r"Q[1-9][0-9]*"),
            relation_ns=WIKIDATA_DIRECT_NS,
            relation_pattern=re.compile(r"P[1-9][0-9]*"),
        )
    raise ValueError(f"dialect: unknown SPARQL dialect {name!r}; choose one of {DIALECTS}")


class SparqlKG(KnowledgeGraph):
    """A knowledge graph behind a SPARQL endpoint.

    Args:
        endpoint: the query URL (e.g. `http://127.0.0.1:7878/query`, `http://localhost:8890/sparql`).
        dialect: "generic", "freebase" or "wikidata" (see the module docstring).
        timeout: seconds per HTTP request.
        retries: further attempts after a transient failure (unreachable, timeout, HTTP 5xx or 429);
            another HTTP 4xx is the endpoint refusing that query and raises `KGQueryRejected` at once.
        backoff: seconds before the first retry; doubled before each next one.
        max_rows: the LIMIT of queries that have no caller-given limit (a warning is logged when
            a result reaches it, as the answer may then be truncated).
        excluded_relation_prefixes: freebase only; relation prefixes dropped from neighbours.
        language: the label language of the freebase and wikidata dialects.
    """

    def __init__(
        self,
        endpoint: str,
        dialect: str = "generic",
        timeout: float = 30.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_rows: int = 10_000,
        excluded_relation_prefixes: Sequence[str] | None = None,
        language: str = "en",
    ) -> None:
        if not re.match(r"^https?://", endpoint):
            raise ValueError(f"endpoint: expected an http(s) URL, got {endpoint!r}")
        if retries < 0 or backoff < 0 or timeout <= 0 or max_rows <= 0:
            raise ValueError("retries and backoff must be >= 0, timeout and max_rows > 0")
        self.endpoint = endpoint
        self.dialect = make_dialect(dialect, excluded_relation_prefixes, language)
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.max_rows = max_rows
        self._has_names: bool | None = None
        self.queries_sent = 0
        self.paged_results = 0
        """Results the endpoint cut at its own row cap and that were fetched again in pages."""
        self._row_cap: int | None = None  # the endpoint's row cap, once a batched context result met it

    # --- query building (public so that tests and users can inspect the exact text) ----------
    def neighbors_query(
        self,
        entity: str,
        side: str,
        relations: Sequence[str] | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> str:
        """The SELECT for the edges of `entity` on `side` ("out", "in", or "both" as one UNION,
        with `?d` telling the direction of each row), with the labels of both ends; with `offset`,
        one page of the ordered result."""
        if side not in ("out", "in", "both"):
            raise ValueError(f"side: expected 'out', 'in' or 'both', got {side!r}")
        d = self.dialect
        node = d.entity_term(entity)
        rel_terms = None if relations is None else [d.relation_term(r) for r in relations]
        if side == "both":
            pattern = f'{{ {node} ?r ?n . BIND("out" AS ?d) }} UNION {{ ?n ?r {node} . BIND("in" AS ?d) }}'
        else:
            pattern = (f"{node} ?r ?n ." if side == "out" else f"?n ?r {node} .") + f' BIND("{side}" AS ?d)'
        values = f"VALUES ?r {{ {' '.join(rel_terms)} }}\n  " if rel_terms is not None else ""
        return (
            f"SELECT DISTINCT ?d ?r ?n ?nl ?sl WHERE {{\n"
            f"  {values}{pattern}\n"
            f"  {d.edge_filter('?r')}\n"
            f"  {d.label_pattern('?n', '?nl')}\n"
            f"  {self._own_label(entity, node)}\n"
            f"}}{_page(offset, '?d ?r ?n ?nl ?sl')} LIMIT {self._limit(limit)}"
        )

    def resolve_query(self, name: str, limit: int | None = None, offset: int | None = None) -> str:
        """The SELECT for nodes whose label is exactly `name` (and the node whose id is `name`);
        with `offset`, one page of the ordered result."""
        d = self.dialect
        branches = [f"{{ ?n {d.label_predicate} {d.name_literal(name)} . BIND(1 AS ?rank) }}"]
        if d.entity_pattern is None:
            branches.append(
                f"{{ GRAPH <{INDEX_GRAPH}> {{ <{exact_label_key(name)}> <{INDEX_NODE}> ?n }} BIND(1 AS ?rank) }}"
            )
        try:
            node = d.entity_term(name)
        except ValueError:
            node = None  # not an id in this dialect: match by label only
        if node is not None:
            branches.append(
                f"{{ {{ SELECT ?n WHERE {{ {_usage(name, node)} {d.edge_filter('?p')} "
                f"BIND({node} AS ?n) }} LIMIT 1 }} BIND(0 AS ?rank) }}"
            )
        return (
            "SELECT DISTINCT ?n ?rank WHERE {\n  "
            + "\n  UNION\n  ".join(branches)
            + f"\n}}{_page(offset, '?rank ?n')} LIMIT {self._limit(limit)}"
        )

    def degree_query(self, entity: str, side: str) -> str:
        d = self.dialect
        node = d.entity_term(entity)
        triple = f"{node} ?r ?n ." if side == "out" else f"?n ?r {node} ."
        return (
            f"SELECT DISTINCT (COUNT(*) AS ?count) WHERE {{\n"
            f"  SELECT DISTINCT ?r ?n WHERE {{ {triple} {d.edge_filter('?r')} }}\n"
            f"}} LIMIT 1"
        )

    def relation_counts_query(self, entity: str, side: str, limit: int | None = None, offset: int = 0) -> str:
        """The SELECT for the relations of `entity` on `side` ("out" or "in") with their edges (`?r`, `?count`),
        by relation IRI, `limit` rows from `offset`."""
        d = self.dialect
        node = d.entity_term(entity)
        triple = f"{node} ?r ?n ." if side == "out" else f"?n ?r {node} ."
        return (
            f"SELECT ?r (COUNT(DISTINCT ?n) AS ?count) WHERE {{ {triple} {d.edge_filter('?r')} }}\n"
            f"GROUP BY ?r ORDER BY ?r OFFSET {check_limit(offset, 'offset')} LIMIT {self._limit(limit)}"
        )

    def label_query(self, entity: str) -> str:
        d = self.dialect
        node = d.entity_term(entity)
        return (
            f"SELECT DISTINCT ?sl ?used WHERE {{\n"
            f"  {{ SELECT ?used WHERE {{ {_usage(entity, node)} {d.edge_filter('?p')} BIND(1 AS ?used) }} LIMIT 1 }}\n"
            f"  {self._own_label(entity, node)}\n"
            f"}} LIMIT 1"
        )

    def labels_query(self, entities: Sequence[str]) -> str:
        """The SELECT for the labels in accepted languages of `entities` (no literal among them), `?n`
        the entity and `?l` a label."""
        d = self.dialect
        nodes = " ".join(d.entity_term(entity) for entity in entities)
        return (
            f"SELECT DISTINCT ?n ?l WHERE {{ VALUES ?n {{ {nodes} }} "
            f"?n {d.label_predicate} ?l .{d.label_filter('?l')} }} LIMIT {self.max_rows}"
        )

    def _own_label(self, entity: str, node: str) -> str:
        """The OPTIONAL label pattern of the queried node (none for a literal: it is its own label)."""
        return "" if is_literal_id(entity) else self.dialect.label_pattern(node, "?sl")

    def _limit(self, limit: int | None) -> int:
        checked = check_limit(limit)
        return self.max_rows if checked is None else min(checked, self.max_rows)

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
        if relations is not None:  # a relation no term can name has no edges, as one missing from the graph
            relations = [r for r in relations if self._names_relation(r)]
        if limit == 0 or (relations is not None and len(relations) == 0) or not self.expresses(entity):
            return []
        if is_literal_id(entity):  # a literal is never a subject
            if direction == "out":
                return []
            direction = "in"
        if direction == "both" and limit is None:
            # One request for both sides; if it hit max_rows, one side may be cut: ask per side.
            rows = self._select_pages(
                lambda offset, size: self.neighbors_query(entity, "both", relations, size, offset), None
            )
            if len(rows) < self.max_rows:
                both = self._edges(entity, rows)
                return [e for e in both if e.direction == "out"] + [e for e in both if e.direction == "in"]
        edges: list[Edge] = []
        for side in ("out", "in") if direction == "both" else (direction,):
            room = None if limit is None else limit - len(edges)
            rows = self._select_pages(
                lambda offset, size: self.neighbors_query(entity, side, relations, size, offset),  # noqa: B023 (called at once)
                room,
            )
            edges.extend(self._edges(entity, rows))
            if limit is not None and len(edges) >= limit:
                return edges[:limit]
        return edges

    def context_query(self, entities: Sequence[str], limit: int) -> str:
        """One SELECT holding, for each entity and side, the query `neighbors(entity, "both", limit=limit)`
        sends for that side (same pattern, same LIMIT) as a subquery, `?i` its position in `entities`.

        A VALUES list of the entities would not do: SPARQL 1.1 has no LIMIT per VALUES row, and a
        hub among them would bring all its edges. A literal is never a subject: "in" only."""
        branches = []
        for i, entity in enumerate(entities):
            for side in ("in",) if is_literal_id(entity) else ("out", "in"):
                branches.append(f"{{ {{ {self.neighbors_query(entity, side, limit=limit)} }} BIND({i} AS ?i) }}")
        return (
            "SELECT DISTINCT ?i ?d ?r ?n ?nl ?sl WHERE {\n  "
            + "\n  UNION\n  ".join(branches)
            + f"\n}} LIMIT {len(branches) * self._limit(limit)}"
        )

    def neighbors_of_each(self, entities: Sequence[str], limit: int) -> list[list[Edge]]:
        """`neighbors(entity, "both", limit=limit)` of each entity, in one request per `CONTEXT_BATCH`
        entities where the endpoint's row cap allows (the ranker reads the context edges of a search's
        candidates this way).

        Each entity's rows are read as `neighbors` reads its two requests: its first `limit` outgoing
        edges, then the first rows of the incoming ones up to what the outgoing left of `limit`.
        A batch cut at the endpoint's row cap (Virtuoso's ResultSetMaxRows) is asked again in
        batches whose rows fit under it; where not one entity's fit, `neighbors` pages each entity.
        """
        if check_limit(limit) is None:
            raise ValueError("limit: expected a non-negative int, got None")
        if limit == 0:
            return [[] for _ in entities]
        distinct = [entity for entity in dict.fromkeys(entities) if self.expresses(entity)]
        found = dict(zip(distinct, self._contexts_fitting(distinct, limit)))
        return [found.get(entity, []) for entity in entities]

    def _contexts_fitting(self, entities: list[str], limit: int) -> list[list[Edge]]:
        # An entity brings at most `limit` rows a side; a batch's rows stay under the cap seen so far.
        room = self.max_rows if self._row_cap is None else min(self.max_rows, self._row_cap - 1)
        per_batch = min(CONTEXT_BATCH, room // (2 * limit))
        if per_batch < 1:
            return [self.neighbors(entity, "both", limit=limit) for entity in entities]
        out: list[list[Edge]] = []
        for start in range(0, len(entities), per_batch):
            batch = entities[start : start + per_batch]
            result, cap = self._run(self.context_query(batch, limit))
            rows = result["results"]["bindings"]
            if cap is not None and cap <= len(rows):
                self._row_cap = cap
                out.extend(self._contexts_fitting(batch, limit))
                continue
            by_side: dict[tuple[int, str], list[dict]] = {}
            for row in rows:
                by_side.setdefault((int(row["i"]["value"]), row["d"]["value"]), []).append(row)
            for i, entity in enumerate(batch):
                edges = self._edges(entity, by_side.get((i, "out"), []))
                if len(edges) < limit:
                    edges += self._edges(entity, by_side.get((i, "in"), [])[: limit - len(edges)])
                out.append(edges[:limit])
        return out

    def _edges(self, entity: str, rows: list[dict]) -> list[Edge]:
        """Edges from result rows; a node with several labels yields several rows, keep the first."""
        d = self.dialect
        entity_literal = is_literal_id(entity)
        seen: set[tuple[str, str, str]] = set()
        edges = []
        for row in rows:
            side = row["d"]["value"]
            relation = d.relation_id(row["r"]["value"])
            neighbor = d.node_id(row["n"])
            if (side, relation, neighbor) in seen:
                continue
            seen.add((side, relation, neighbor))
            n_literal = row["n"]["type"] in ("literal", "typed-literal")  # the latter from older Virtuosos
            n_label, n_unnamed = self._label_from(neighbor, n_literal, row.get("nl"))
            e_label, e_unnamed = self._label_from(entity, entity_literal, row.get("sl"))
            if side == "out":
                edges.append(
                    Edge(entity, relation, neighbor, e_label, n_label, "out", n_literal, e_unnamed, n_unnamed)
                )
            else:
                edges.append(
                    Edge(neighbor, relation, entity, n_label, e_label, "in", entity_literal, n_unnamed, e_unnamed)
                )
        return edges

    def _label_from(self, node: str, literal: bool, label_binding: dict | None) -> tuple[str, bool]:
        if literal:
            return literal_value(node), False
        if label_binding is not None:
            return label_binding["value"], False
        return node, self._unnamed_without_label()

    def _unnamed_without_label(self) -> bool:
        """Whether a labelless node is a mediator: always for Freebase/Wikidata; for a generic store,
        when it was loaded with names (our store records it; otherwise: it has any rdfs:label)."""
        if self.dialect.name != "generic":
            return True
        if self._has_names is None:
            rows = self._select(
                f"SELECT DISTINCT ?flag WHERE "
                f"{{ GRAPH <{INDEX_GRAPH}> {{ <{INDEX_STORE}> <{INDEX_HAS_NAMES}> ?flag }} }} LIMIT 1",
                1,
            )
            if rows:
                self._has_names = rows[0]["flag"]["value"] == "true"
            else:
                self._has_names = bool(self._select(f"SELECT DISTINCT ?s WHERE {{ ?s <{RDFS_LABEL}> ?l }} LIMIT 1", 1))
        return self._has_names

    def expresses(self, entity: str) -> bool:
        """False for an id the dialect builds no term for (empty, a blank node, a malformed literal, a lone
        surrogate, an IRI it refuses): the store then answers as for an id missing from the graph, as the
        memory store does (no edges, degree 0, its own text as its label), and sends no query."""
        try:
            self.dialect.entity_term(entity)
        except ValueError:
            return False
        return True

    def _names_relation(self, relation: str) -> bool:
        try:
            self.dialect.relation_term(relation)
        except ValueError:
            return False
        return True

    def label(self, entity: str) -> str:
        if not self.expresses(entity):
            return literal_value(entity)
        rows = self._select(self.label_query(entity), 1)
        if not rows:  # not in the graph
            return literal_value(entity)
        return self._label_from(entity, is_literal_id(entity), rows[0].get("sl"))[0]

    def labels(self, entities: Sequence[str]) -> dict[str, str]:
        """Each entity's label in the preferred accepted language (Freebase: its English
        `type.object.name`), `LABEL_BATCH` entities a request; an entity without one keeps its id,
        a literal its value (an id no term can name, its own text)."""
        nodes = [entity for entity in dict.fromkeys(entities) if not is_literal_id(entity) and self.expresses(entity)]
        best: dict[str, tuple[int, str]] = {}
        for start in range(0, len(nodes), LABEL_BATCH):
            for row in self._select(self.labels_query(nodes[start : start + LABEL_BATCH]), None):
                node = self.dialect.node_id(row["n"])
                # Several names of one node: the preferred language's, then the smallest, whatever the row order.
                candidate = (self.dialect.label_rank(row["l"]), row["l"]["value"])
                if node not in best or candidate < best[node]:
                    best[node] = candidate
        return {entity: best[entity][1] if entity in best else literal_value(entity) for entity in entities}

    def is_unnamed(self, entity: str) -> bool:
        if is_literal_id(entity) or not self.expresses(entity):
            return False
        rows = self._select(self.label_query(entity), 1)
        return bool(rows) and self._label_from(entity, False, rows[0].get("sl"))[1]

    def resolve(self, name: str) -> list[str]:
        """Exact label (and id) matches; then, on a store built by `kg load`, normalised ones.

        Freebase and Wikidata have no normalised-name index, so only exact names match there.
        """
        if not _is_unicode(name):
            return []  # no RDF label holds a lone surrogate
        rows = self._select_pages(lambda offset, size: self.resolve_query(name, size, offset), None)
        ranked = sorted(((int(r["rank"]["value"]), self.dialect.node_id(r["n"])) for r in rows), key=lambda x: x[0])
        hits = list(dict.fromkeys(node for _, node in ranked))
        if not hits and self.dialect.entity_pattern is None:
            rows = self._select(
                f"SELECT DISTINCT ?n WHERE "
                f"{{ GRAPH <{INDEX_GRAPH}> {{ <{normalized_label_key(name)}> <{INDEX_NODE}> ?n }} }} "
                f"LIMIT {self.max_rows}",
                None,
            )
            hits = [self.dialect.node_id(r["n"]) for r in rows]
        return hits

    def degree(self, entity: str, direction: Direction = "both") -> int:
        check_direction(direction)
        if not self.expresses(entity):
            return 0
        total = 0
        for side in ("out", "in") if direction == "both" else (direction,):
            if side == "out" and is_literal_id(entity):
                continue
            rows = self._select(self.degree_query(entity, side), 1)
            total += int(rows[0]["count"]["value"]) if rows else 0
        return total

    def relation_counts(self, entity: str, direction: Direction = "both") -> list[tuple[str, str, int]]:
        """(relation, "out" or "in", edges) for each relation at `entity`, counted by the endpoint (grouped
        queries, in pages of `max_rows` relations): outgoing first, each side by relation IRI."""
        check_direction(direction)
        if not self.expresses(entity):
            return []
        counts = []
        for side in ("out", "in") if direction == "both" else (direction,):
            if side == "out" and is_literal_id(entity):
                continue
            rows: list[dict] = []
            while True:
                page = self._select_pages(
                    lambda offset, size: self.relation_counts_query(entity, side, size, len(rows) + (offset or 0)),  # noqa: B023 (called at once)
                    self.max_rows,
                )
                rows.extend(page)
                if len(page) < self.max_rows:
                    break
            counts += [(self.dialect.relation_id(r["r"]["value"]), side, int(r["count"]["value"])) for r in rows]
        return counts

    # --- transport ----------------------------------------------------------------------------
    def _select(self, query: str, limit: int | None) -> list[dict]:
        """Run a SELECT with retries; the JSON result rows."""
        rows = self._run(query)[0]["results"]["bindings"]
        self._warn_if_full(rows, limit)
        return rows

    def _select_pages(self, build: Callable[[int | None, int], str], limit: int | None) -> list[dict]:
        """The rows of `build(None, n)` (n: `limit`, capped at max_rows); when the endpoint cut the
        result at its own row cap, all of them again from `build(offset, cap)` pages."""
        want = self._limit(limit)
        result, cap = self._run(build(None, want))
        rows = result["results"]["bindings"]
        if cap is not None and cap <= len(rows) < want:
            self.paged_results += 1
            rows = []
            while len(rows) < want:
                size = min(cap, want - len(rows))
                page = self._run(build(len(rows), size))[0]["results"]["bindings"]
                rows.extend(page)
                if len(page) < size:
                    break
        self._warn_if_full(rows, limit)
        return rows

    def _warn_if_full(self, rows: list[dict], limit: int | None) -> None:
        if limit is None and len(rows) >= self.max_rows:
            log.warning("SPARQL result from %s reached max_rows=%d and may be truncated", self.endpoint, self.max_rows)

    def _run(self, query: str) -> tuple[dict, int | None]:
        """The JSON result and the row cap the endpoint says it reached (Virtuoso's header), if any;
        transient failures are tried `retries` more times, `backoff` seconds apart and doubling."""
        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self.retries + 1),
            wait=tenacity.wait_exponential(multiplier=self.backoff),
            retry=tenacity.retry_if_exception_type(_TRANSIENT),
            before_sleep=tenacity.before_sleep_log(log, logging.WARNING),
            reraise=True,
        )
        try:
            return retrying(self._query_once, query)
        except _TRANSIENT as err:
            raise KGError(
                f"SPARQL endpoint {self.endpoint} failed after {self.retries + 1} attempts: {_short(err)}"
            ) from err

    def check(self, timeout: float) -> None:
        """One trivial query (`SELECT (1 AS ?up) WHERE {}`), tried once within `timeout` seconds: a KGError
        when the endpoint does not answer it (unreachable, timed out, refusing)."""
        try:
            self._query_once("SELECT (1 AS ?up) WHERE {}", timeout)
        except _TRANSIENT as err:
            raise KGError(f"SPARQL endpoint {self.endpoint} did not answer: {_short(err)}") from err

    def _query_once(self, query: str, timeout: float | None = None) -> tuple[dict, int | None]:
        """One request (within `timeout` seconds, default the KG's); a transient failure is raised as it came
        (one of `_TRANSIENT`), a refusal or a malformed reply as a KGError."""
        wrapper = SPARQLWrapper(self.endpoint)
        wrapper.setQuery(query)
        wrapper.setReturnFormat(JSON)
        if len(urllib.parse.quote(query)) > MAX_GET_QUERY_BYTES:
            wrapper.setMethod(POST)  # a form-encoded body, which SPARQL 1.1 endpoints must accept
        # setTimeout() truncates to int (0.5 s would mean "no timeout"); urlopen takes floats.
        wrapper.timeout = timeout or self.timeout  # type: ignore[assignment]  # typed int, read as a float
        self.queries_sent += 1
        try:
            response = wrapper.query()
            # info() lowercases names and only [] looks them up case-insensitively (not .get)
            cap = response.info().get(MAX_ROWS_HEADER.lower())
            result = response.convert()
        except urllib.error.HTTPError as err:  # statuses SPARQLWrapper does not map to its own errors
            if err.code < 500 and err.code != TOO_MANY_REQUESTS:
                raise KGQueryRejected(
                    f"SPARQL endpoint {self.endpoint} rejected a query: HTTP {err.code} {_short(str(err.reason))}"
                ) from err
            raise
        except _TRANSIENT:
            raise
        except SPARQLWrapperException as err:  # 400, 401, 404, 414: the endpoint refused this query
            raise KGQueryRejected(f"SPARQL endpoint {self.endpoint} rejected a query: {_short(err)}") from err
        except ValueError as err:  # the body was not JSON
            raise KGError(f"SPARQL endpoint {self.endpoint} returned malformed JSON: {_short(err)}") from err
        if not isinstance(result, dict) or "results" not in result:
            raise KGError(f"SPARQL endpoint {self.endpoint} returned no JSON result rows: {_short(result)}")
        return result, int(cap) if cap is not None and cap.strip().isdigit() and int(cap) > 0 else None


def _page(offset: int | None, order: str) -> str:
    """` ORDER BY … OFFSET n` for one page of a result (nothing for the whole result)."""
    return "" if offset is None else f" ORDER BY {order} OFFSET {check_limit(offset, 'offset')}"


def _short(thing) -> str:
    text = thing if isinstance(thing, str) else (json.dumps(thing)[:300] if isinstance(thing, dict) else repr(thing))
    return text[:300]
