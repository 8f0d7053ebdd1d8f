"""SparqlKG against a live `oxigraph serve`: parity with MemoryKG, injection safety, retries, dialects."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pyoxigraph as ox
import pytest

from kgreasoner.kg import sparql as sparql_module
from kgreasoner.kg.base import KGError, KGQueryRejected
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.rdf import ENTITY_NS, RDFS_LABEL, RELATION_NS, to_iri
from kgreasoner.kg.server import free_port
from kgreasoner.kg.sparql import MAX_GET_QUERY_BYTES, SparqlKG
from kgreasoner.records.schema import TopicEntity
from kgreasoner.retrieval.tool import ERRORS, KGSearchTool, ToolConfig

HOSTILE = [
    'x" } ; DROP ALL ; SELECT * WHERE { ?s ?p ?o } #',
    "a>b <c",
    "line\nbreak\r\n} INSERT DATA { <urn:a> <urn:b> <urn:c> }",
    "back\\slash\\\" '''",
    "{ } ; DROP ALL",
]


@pytest.fixture(scope="module")
def url(oxigraph_server, small_kb):
    return oxigraph_server(small_kb.dir)


@pytest.fixture(scope="module")
def kg(url):
    return SparqlKG(url)


def count_triples(kg: SparqlKG) -> int:
    rows = kg._select("SELECT (COUNT(*) AS ?n) WHERE { ?s ?p ?o } LIMIT 1", 1)
    return int(rows[0]["n"]["value"])


def test_same_graph_as_memory(kg, small_kb, same_graph):
    same_graph(MemoryKG.from_file(small_kb.dir / "kb.tsv"), kg)


def test_one_request_per_call_with_labels(kg):
    kg._unnamed_without_label()  # the one-off names probe is not part of a neighbour call
    before = kg.queries_sent
    edges = kg.neighbors("e.utah", "out")
    assert kg.queries_sent == before + 1
    assert {e.object_label for e in edges} >= {"Mountain Time Zone", "Salt Lake City", "cvt.1", "3271616"}
    kg.neighbors("e.mtz", "both")
    assert kg.queries_sent == before + 2
    kg.neighbors("e.utah", "both", limit=7)  # the limit is met by outgoing edges alone
    assert kg.queries_sent == before + 3
    kg.neighbors("e.utah", "both", limit=8)  # a limit needs one request per side, outgoing first
    assert kg.queries_sent == before + 5


def test_both_directions_fall_back_per_side_when_max_rows_is_hit(url):
    exact = SparqlKG(url, max_rows=8)  # e.utah: 7 outgoing + 1 incoming edges fill the UNION
    edges = exact.neighbors("e.utah", "both")
    assert exact.queries_sent == 1 + 2 + 1  # UNION, then per side, and the names probe
    assert [e.direction for e in edges] == ["out"] * 7 + ["in"]
    roomy = SparqlKG(url, max_rows=9)
    assert set(roomy.neighbors("e.utah", "both")) == set(edges)
    assert roomy.queries_sent == 1 + 1


def test_every_query_is_distinct_and_limited(kg, small_kb):
    queries = [
        kg.neighbors_query("e.utah", "out"),
        kg.neighbors_query("e.utah", "in", relations=["capital"], limit=3),
        kg.resolve_query("Utah"),
        kg.degree_query("e.utah", "in"),
        kg.label_query(small_kb.date),
    ]
    for query in queries:
        assert "SELECT DISTINCT" in query and query.rstrip().rsplit("\n", 1)[-1].startswith("} LIMIT "), query
    assert queries[1].endswith("} LIMIT 3")


def test_hostile_names_cannot_change_the_query(kg):
    triples = count_triples(kg)
    for hostile in HOSTILE:
        assert kg.neighbors(hostile, "both") == []
        assert kg.neighbors("e.utah", "both", relations=[hostile]) == []
        assert kg.degree(hostile) == 0
        assert kg.resolve(hostile) == []
        assert kg.label(hostile) == hostile
        query = kg.neighbors_query(hostile, "out", relations=[hostile])
        assert hostile not in query and "DROP" not in query.replace("DROP%20ALL", "")
    # a label full of query syntax is data: it resolves to its node, exactly
    assert kg.resolve('Say "hi" {x} } ; DROP ALL >') == ["e.odd"]
    assert count_triples(kg) == triples


@pytest.mark.parametrize("dialect", ["freebase", "wikidata"])
def test_strict_dialects_send_no_query_for_hostile_ids_and_the_builders_name_the_field(url, dialect):
    kg = SparqlKG(url, dialect=dialect)
    good = "m.07srw" if dialect == "freebase" else "Q30"
    for hostile in HOSTILE + ["m.07srw>", "Q1 }", "http://x/a>b", "m.07SRW"]:
        # an id no term can name is no node: answered as one missing from the graph, with no query sent
        assert not kg.expresses(hostile)
        assert (kg.neighbors(hostile, "both"), kg.degree(hostile), kg.label(hostile)) == ([], 0, hostile)
        assert kg.neighbors(good, "out", relations=[hostile]) == []
        with pytest.raises(ValueError, match=r"^entity: "):
            kg.neighbors_query(hostile, "both")
        with pytest.raises(ValueError, match=r"^relation: "):
            kg.neighbors_query(good, "out", relations=[hostile])
    assert kg.queries_sent == 0


@pytest.mark.parametrize("dialect", ["generic", "freebase", "wikidata"])
def test_hostile_name_reaches_resolve_only_as_one_escaped_literal(url, dialect):
    kg = SparqlKG(url, dialect=dialect)
    template = kg.resolve_query("PLACEHOLDER")
    for hostile in HOSTILE:
        query = kg.resolve_query(hostile)
        literal = kg.dialect.name_literal(hostile)
        if dialect == "generic":  # the index IRI and the id IRI are percent-encoded
            from kgreasoner.kg.oxigraph_store import exact_label_key
            from kgreasoner.kg.rdf import ENTITY_NS, to_iri

            expected = (
                template.replace('"PLACEHOLDER"', literal)
                .replace(exact_label_key("PLACEHOLDER"), exact_label_key(hostile))
                .replace(to_iri("PLACEHOLDER", ENTITY_NS), to_iri(hostile, ENTITY_NS))
            )
        else:
            placeholder = kg.dialect.name_literal("PLACEHOLDER")
            expected = template.replace(placeholder, literal)
        assert query == expected
        parsed = next(iter(ox.parse(input=f"<urn:s> <urn:p> {literal} .", format=ox.RdfFormat.N_TRIPLES))).object
        assert parsed.value == hostile


def test_unreachable_endpoint_retries_with_backoff_then_names_it():
    endpoint = f"http://127.0.0.1:{free_port()}/query"
    kg = SparqlKG(endpoint, retries=2, backoff=0.02)
    start = time.monotonic()
    with pytest.raises(KGError, match=rf"^SPARQL endpoint {endpoint} failed after 3 attempts: "):
        kg.neighbors("e.utah")
    assert time.monotonic() - start >= 0.02 + 0.04
    assert kg.queries_sent == 3


def test_silent_endpoint_times_out():
    with socket.socket() as listener:  # accepts connections (backlog) but never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        endpoint = f"http://127.0.0.1:{listener.getsockname()[1]}/query"
        kg = SparqlKG(endpoint, timeout=0.2, retries=1, backoff=0.01)
        start = time.monotonic()
        with pytest.raises(KGError, match=rf"{endpoint} failed after 2 attempts"):
            kg.resolve("Utah")
        assert 0.4 <= time.monotonic() - start < 5


def test_rejected_query_is_not_retried(url):
    kg = SparqlKG(url.replace("/query", "/no-such-service"), retries=3, backoff=0.01)
    with pytest.raises(KGError, match=r"rejected a query"):
        kg.neighbors("e.utah")
    assert kg.queries_sent == 1


def test_bad_arguments(kg):
    with pytest.raises(ValueError, match="limit: expected a non-negative int or None, got -1"):
        kg.neighbors("e.utah", limit=-1)
    with pytest.raises(ValueError, match="limit: expected a non-negative int or None, got True"):
        kg.neighbors("e.utah", limit=True)
    with pytest.raises(ValueError, match="limit: expected a non-negative int, got None"):
        kg.neighbors_of_each(["e.utah"], limit=None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="offset: expected a non-negative int or None, got -3"):
        kg.neighbors_query("e.utah", "out", offset=-3)
    with pytest.raises(ValueError, match="limit: expected a non-negative int or None, got '3 } DROP ALL'"):
        kg.neighbors_query("e.utah", "out", limit="3 } DROP ALL")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="side: expected 'out', 'in' or 'both', got 'x\"'"):
        kg.neighbors_query("e.utah", 'x"')
    with pytest.raises(ValueError, match="dialect: unknown SPARQL dialect 'dbpedia'"):
        SparqlKG("http://127.0.0.1:1/query", dialect="dbpedia")
    with pytest.raises(ValueError, match="endpoint: expected an http"):
        SparqlKG("ftp://example.org/sparql")


NS = "http://rdf.freebase.com/ns/"
XSD_DATE = "http://www.w3.org/2001/XMLSchema#date"
FREEBASE_TRIPLES = f"""
<{NS}m.0utah> <{NS}type.object.name> "Utah"@en .
<{NS}m.0utah> <{NS}type.object.name> "Utah (fr)"@fr .
<{NS}m.0utah> <{NS}type.object.type> <{NS}location.us_state> .
<{NS}m.0utah> <{NS}common.topic.notable_for> <{NS}g.1abc> .
<{NS}m.0utah> <http://www.w3.org/2002/07/owl#sameAs> <http://dbpedia.org/resource/Utah> .
<{NS}m.0utah> <{NS}location.location.time_zones> <{NS}m.0mtz> .
<{NS}m.0utah> <{NS}government.governmental_jurisdiction.governing_officials> <{NS}m.0cvt> .
<{NS}m.0cvt> <{NS}government.government_position_held.office_holder> <{NS}m.0cox> .
<{NS}m.0cvt> <{NS}government.government_position_held.from> "2021-01-20"^^<{XSD_DATE}> .
<{NS}m.0mtz> <{NS}type.object.name> "Mountain Time Zone"@en .
<{NS}m.0cox> <{NS}type.object.name> "Spencer Cox"@en .
<{NS}m.0idaho> <{NS}type.object.name> "Idaho"@en .
<{NS}m.0idaho> <{NS}location.location.time_zones> <{NS}m.0mtz> .
"""


@pytest.fixture(scope="module")
def freebase(oxigraph_server):
    return SparqlKG(oxigraph_server(raw_ntriples=FREEBASE_TRIPLES), dialect="freebase")


def test_freebase_dialect_neighbours_mediators_and_filtered_relations(freebase):
    out = freebase.neighbors("m.0utah", "out")
    assert sorted((e.relation, e.object, e.object_label, e.object_unnamed) for e in out) == [
        ("government.governmental_jurisdiction.governing_officials", "m.0cvt", "m.0cvt", True),
        ("location.location.time_zones", "m.0mtz", "Mountain Time Zone", False),
    ]
    assert {e.subject_label for e in out} == {"Utah"}  # the English name, not the French one
    cvt = freebase.neighbors("m.0cvt", "out")
    assert sorted((e.relation, e.object, e.object_label, e.object_is_literal) for e in cvt) == [
        ("government.government_position_held.from", f'"2021-01-20"^^<{XSD_DATE}>', "2021-01-20", True),
        ("government.government_position_held.office_holder", "m.0cox", "Spencer Cox", False),
    ]
    assert all(e.subject_unnamed for e in cvt) and freebase.is_unnamed("m.0cvt")
    incoming = freebase.neighbors("m.0mtz", "in", relations=["location.location.time_zones"], limit=5)
    assert sorted(e.subject_label for e in incoming) == ["Idaho", "Utah"]
    assert len(freebase.neighbors("m.0mtz", "in", limit=1)) == 1
    assert freebase.degree("m.0utah", "out") == 2


def test_freebase_dialect_resolve_label_and_query_shape(freebase):
    assert freebase.resolve("Utah") == ["m.0utah"]
    assert freebase.resolve("m.0cox") == ["m.0cox"]
    assert freebase.resolve("utah") == []  # exact names only at Freebase scale
    assert freebase.label("m.0cox") == "Spencer Cox" and freebase.label("m.0nothing") == "m.0nothing"
    query = freebase.neighbors_query("m.0utah", "out", relations=["location.location.time_zones"])
    assert f"<{NS}m.0utah> ?r ?n ." in query and f"VALUES ?r {{ <{NS}location.location.time_zones> }}" in query
    assert f'!STRSTARTS(STR(?r), "{NS}common.")' in query
    name_filter = 'FILTER(LANGMATCHES(LANG(?nl), "en") || LANG(?nl) = "")'
    assert f"OPTIONAL {{ ?n <{NS}type.object.name> ?nl . {name_filter} }}" in query
    with pytest.raises(ValueError, match="excluded_relation_prefixes: 'common\\.\"' is not"):
        SparqlKG(freebase.endpoint, dialect="freebase", excluded_relation_prefixes=['common."'])
    keep_all = SparqlKG(freebase.endpoint, dialect="freebase", excluded_relation_prefixes=())
    assert len(keep_all.neighbors("m.0utah", "out")) == 6  # names and types are edges then


WIKIDATA_TRIPLES = """
<http://www.wikidata.org/entity/Q829> <http://www.w3.org/2000/01/rdf-schema#label> "Utah"@en .
<http://www.wikidata.org/entity/Q829> <http://www.w3.org/2000/01/rdf-schema#label> "Utah"@de .
<http://www.wikidata.org/entity/Q829> <http://www.wikidata.org/prop/direct/P421> <http://www.wikidata.org/entity/Q3134> .
<http://www.wikidata.org/entity/Q829> <http://www.wikidata.org/prop/P421> <http://www.wikidata.org/entity/statement/X1> .
<http://www.wikidata.org/entity/Q3134> <http://www.w3.org/2000/01/rdf-schema#label> "Mountain Time Zone"@en .
"""  # noqa: E501 (N-Triples: one triple a line)


def test_wikidata_dialect_truthy_claims_and_english_labels(oxigraph_server):
    kg = SparqlKG(oxigraph_server(raw_ntriples=WIKIDATA_TRIPLES), dialect="wikidata")
    out = kg.neighbors("Q829", "both")
    assert [(e.subject, e.relation, e.object, e.subject_label, e.object_label) for e in out] == [
        ("Q829", "P421", "Q3134", "Utah", "Mountain Time Zone")
    ]
    assert kg.resolve("Utah") == ["Q829"]
    query = kg.neighbors_query("Q829", "out", relations=["P421"])
    assert "<http://www.wikidata.org/entity/Q829> ?r ?n ." in query
    assert "VALUES ?r { <http://www.wikidata.org/prop/direct/P421> }" in query


def test_a_long_non_ascii_name_is_sent_by_post_and_resolves(oxigraph_server, url):
    long_name = "ü" * 1000  # 12,000 bytes percent-encoded: more than oxigraph takes in a URL
    assert len(SparqlKG(url).resolve_query(long_name).encode()) > MAX_GET_QUERY_BYTES
    kg = SparqlKG(oxigraph_server([("e.long", "next_to", "e.short")], names={"e.long": long_name, "e.short": "Short"}))
    assert kg.resolve(long_name) == ["e.long"]
    assert kg.neighbors("e.long", "out")[0].subject_label == long_name
    absent = SparqlKG(url, retries=3, backoff=0.01)
    assert absent.resolve("é" * 1000) == []  # as MemoryKG answers: no such name
    assert absent.queries_sent == 2  # the exact query, then the normalised one: nothing refused or retried


def test_an_endpoint_4xx_is_a_rejection_never_retried(url):
    kg = SparqlKG(url.replace("/query", "/update"), retries=3, backoff=0.01)  # read-only: 403 Forbidden
    with pytest.raises(KGQueryRejected, match=r"/update rejected a query: HTTP 403"):
        kg.resolve("Utah")
    assert kg.queries_sent == 1


@pytest.mark.parametrize("dialect", ["generic", "freebase", "wikidata"])
def test_lone_surrogates_match_nothing_and_name_the_field(url, dialect):
    kg = SparqlKG(url, dialect=dialect)
    assert kg.resolve("\ud800") == [] and kg.resolve("Utah\udfff") == []
    assert kg.queries_sent == 0  # no label can hold one: nothing to ask
    good = {"generic": "e.utah", "freebase": "m.0utah", "wikidata": "Q829"}[dialect]
    assert kg.neighbors("\ud800x", "both") == [] and kg.neighbors(good, "out", relations=["r\udc00"]) == []
    assert kg.queries_sent == 0
    with pytest.raises(ValueError, match=r"^entity: '\\ud800x' is not valid Unicode \(it holds a lone surrogate\)$"):
        kg.neighbors_query("\ud800x", "both")
    with pytest.raises(ValueError, match=r"^relation: 'r\\udc00' is not valid Unicode"):
        kg.neighbors_query(good, "out", relations=["r\udc00"])


HOSTILE_FRAGMENTS = [
    '"',
    "'",
    "\\",
    "\n",
    "\r\n",
    ">",
    "<",
    "\ud800",
    "\udfff",
    "\x00",
    "x" * 10_000,
    " ",
    "{}",
    "#",
    '"x"^^<bad iri>',
    '"unterminated',
    "http://a b",
    "_:b0",
    '"x"@',
    "%00",
    "é" * 1000,
]
HOSTILE_IDS = sorted(
    {p + f for f in HOSTILE_FRAGMENTS for p in ("", "e.utah", "m.0utah", "Q829", '"lit')}
    | {f + p for f in HOSTILE_FRAGMENTS for p in ("", "e.utah", "m.0utah", "Q829", '"lit')}
)


@pytest.mark.parametrize("dialect", ["generic", "freebase"])
def test_search_session_never_raises_on_hostile_topic_ids(url, dialect):
    assert len(HOSTILE_IDS) == 189
    tool = KGSearchTool(SparqlKG(url, dialect=dialect, retries=0), ToolConfig(entity_handles=True))
    errors = []
    for entity in HOSTILE_IDS:
        session = tool.session("q?", [TopicEntity(entity, "Topic")])
        for query in ("Topic", "E1 | backtrack", entity):
            result = session.call(query)
            assert result.error is None or result.error in ERRORS
            errors.append(result.error)
    # an id the dialect cannot express names no node: no neighbours, never a "could not be queried"
    assert len(errors) == 3 * 189 and "kg_error" not in errors and "no_neighbors" in errors


class _Flaky(BaseHTTPRequestHandler):
    """Answers the first `server.failures` requests with `server.status`, then passes requests on to the
    real endpoint `server.upstream`; counts every request in `server.seen`."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self.server.seen += 1
        if self.server.seen <= self.server.failures:
            status, headers, content = self.server.status, {"Content-Type": "text/plain"}, b"try later"
        else:
            reply = httpx.get(
                self.server.upstream + self.path[len("/query") :], headers={"Accept": self.headers["Accept"]}
            )
            status, headers, content = (
                reply.status_code,
                {"Content-Type": reply.headers["content-type"]},
                reply.content,
            )
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args):
        pass


@pytest.fixture
def flaky(url):
    servers = []

    def start(status: int, failures: int) -> ThreadingHTTPServer:
        server = ThreadingHTTPServer(("127.0.0.1", 0), _Flaky)
        server.status, server.failures, server.seen, server.upstream = status, failures, 0, url
        server.endpoint = f"http://127.0.0.1:{server.server_address[1]}/query"
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("status", [500, 503, 429])
def test_a_5xx_or_429_is_retried_and_the_answer_arrives(flaky, kg, status):
    server = flaky(status, failures=2)
    retried = SparqlKG(server.endpoint, retries=2, backoff=0.0)
    direct = SparqlKG(kg.endpoint)
    assert retried.neighbors("e.utah") == direct.neighbors("e.utah")
    assert server.seen == retried.queries_sent == direct.queries_sent + 2  # the first query was sent 3 times


@pytest.mark.parametrize("status", [503, 429])
def test_a_lasting_5xx_or_429_is_an_outage_naming_the_endpoint_after_the_configured_attempts(flaky, status):
    server = flaky(status, failures=100)
    kg = SparqlKG(server.endpoint, retries=3, backoff=0.0)
    with pytest.raises(KGError) as caught:
        kg.resolve("Utah")
    assert not isinstance(caught.value, KGQueryRejected)
    assert str(caught.value).startswith(
        f"SPARQL endpoint {server.endpoint} failed after 4 attempts: <HTTPError {status}"
    )
    assert server.seen == kg.queries_sent == 4


@pytest.mark.parametrize("status", [400, 403, 404])
def test_a_4xx_from_a_stand_in_is_rejected_after_one_request(flaky, status):
    server = flaky(status, failures=100)
    kg = SparqlKG(server.endpoint, retries=3, backoff=0.0)
    with pytest.raises(KGQueryRejected, match=rf"^SPARQL endpoint {server.endpoint} rejected a query: "):
        kg.resolve("Utah")
    assert server.seen == kg.queries_sent == 1


def all_nodes(small_kb) -> list[str]:
    return list(dict.fromkeys(node for s, _, o in small_kb.triples for node in (s, o))) + ["e.unknown"]


def test_the_context_edges_of_many_entities_come_in_one_request_as_neighbors_gives_them(url, small_kb):
    """Every node of the graph (literals, the mediator, an unknown id, one twice), at limits that cut
    outgoing edges, stop right after them, or reach into incoming ones."""
    entities = all_nodes(small_kb) + ["e.utah"]
    kg = SparqlKG(url)
    kg._unnamed_without_label()
    for limit in (1, 3, 7, 8, 17):
        each = [kg.neighbors(entity, "both", limit=limit) for entity in entities]
        before = kg.queries_sent
        assert kg.neighbors_of_each(entities, limit) == each, limit
        assert kg.queries_sent == before + 1
    assert kg.neighbors_of_each(entities, 0) == [[] for _ in entities]
    assert kg.neighbors_of_each([], 5) == []


def test_context_edges_where_a_neighbour_has_two_labels_match_neighbors(oxigraph_server):
    """A node with two labels gives two rows for one edge: `neighbors` fills the incoming side's
    room with rows, not edges, and so must the batch."""

    def iri(node: str) -> str:
        return f"<{to_iri(node, ENTITY_NS)}>"

    labels = {"e.d": ["Dee", "D"], "e.e": ["Ee", "E"], "e.c": ["Cee"]}
    text = "".join(f'{iri(node)} <{RDFS_LABEL}> "{label}" .\n' for node, names in labels.items() for label in names)
    text += "".join(
        f"{iri(s)} <{to_iri(r, RELATION_NS)}> {iri(o)} .\n"
        for s, r, o in [("e.a", "knows", "e.c"), ("e.d", "knows", "e.a"), ("e.e", "knows", "e.a")]
    )
    kg = SparqlKG(oxigraph_server(raw_ntriples=text))
    entities = ["e.a", "e.c", "e.d", "e.e"]
    for limit in (1, 2, 3, 4):
        assert kg.neighbors_of_each(entities, limit) == [kg.neighbors(e, "both", limit=limit) for e in entities], limit
    # at limit 3 the incoming side's room of two rows holds the two labels of one neighbour
    assert len(kg.neighbors("e.a", "both", limit=3)) == 2


def test_a_context_batch_is_built_from_escaped_ids_only(kg):
    triples = count_triples(kg)
    query = kg.context_query(HOSTILE + ["e.utah"], 4)
    assert all(hostile not in query for hostile in HOSTILE) and "DROP" not in query.replace("DROP%20ALL", "")
    assert query.startswith("SELECT DISTINCT") and query.endswith(f"}} LIMIT {2 * 6 * 4}")
    assert kg.neighbors_of_each(HOSTILE, 4) == [[] for _ in HOSTILE]
    assert count_triples(kg) == triples
    assert kg.neighbors_of_each(["e.utah", "_:b0", ""], 4) == [kg.neighbors("e.utah", "both", limit=4), [], []]
    with pytest.raises(ValueError, match="entity: blank node"):
        kg.context_query(["e.utah", "_:b0"], 4)


class _Capped(BaseHTTPRequestHandler):
    """Passes GET and POST queries on to `server.upstream` and, as Virtuoso does at ResultSetMaxRows,
    answers at most `server.cap` rows, naming the cap in X-SPARQL-MaxRows when a result reaches it."""

    def do_GET(self):  # noqa: N802 (http.server's name)
        self._answer(
            httpx.get(self.server.upstream + self.path[len("/query") :], headers={"Accept": self.headers["Accept"]})
        )

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(
            httpx.post(
                self.server.upstream,
                content=body,
                headers={"Accept": self.headers["Accept"], "Content-Type": self.headers["Content-Type"]},
            )
        )

    def _answer(self, reply: httpx.Response) -> None:
        self.server.seen += 1
        result = reply.json()
        rows = result["results"]["bindings"]
        reached = len(rows) >= self.server.cap
        result["results"]["bindings"] = rows[: self.server.cap]
        content = json.dumps(result).encode()
        self.send_response(reply.status_code)
        self.send_header("Content-Type", "application/sparql-results+json")
        if reached:
            self.send_header("X-SPARQL-MaxRows", str(self.server.cap))
        self.send_header("Content-Length", str(len(content)))
        self.end_headers()
        self.wfile.write(content)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize("cap", [5, 12, 25])
def test_a_context_batch_cut_at_the_row_cap_is_asked_again_in_batches_under_it(url, small_kb, cap):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Capped)
    server.cap, server.seen, server.upstream = cap, 0, url
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        capped, direct = SparqlKG(f"http://127.0.0.1:{server.server_address[1]}/query"), SparqlKG(url)
        capped._unnamed_without_label()
        entities, limit = all_nodes(small_kb), 3
        assert len(direct._run(direct.context_query(entities, limit))[0]["results"]["bindings"]) == 26  # over each cap
        each = [direct.neighbors(e, "both", limit=limit) for e in entities]
        for _ in range(2):
            first = server.seen
            assert capped.neighbors_of_each(entities, limit) == each
        per_batch = (cap - 1) // (2 * limit)
        # the cap is remembered: later batches fit under it; at cap 5 not one entity's rows do, and
        # each entity is asked as `neighbors` asks it, a side at a time (only "in" for a literal)
        asked_each = sum(
            1 if e.startswith('"') or len(direct.neighbors(e, "out", limit=limit)) == limit else 2 for e in entities
        )
        assert server.seen - first == (-(-len(entities) // per_batch) if per_batch else asked_each)
    finally:
        server.shutdown()
        server.server_close()


def test_many_entities_are_asked_in_requests_of_context_batch_entities(url, small_kb, monkeypatch):
    monkeypatch.setattr(sparql_module, "CONTEXT_BATCH", 4)
    kg, reference = SparqlKG(url), SparqlKG(url)
    kg._unnamed_without_label()
    entities = all_nodes(small_kb)
    assert len(entities) == 15
    assert kg.neighbors_of_each(entities, 2) == [reference.neighbors(e, "both", limit=2) for e in entities]
    assert kg.queries_sent == 1 + 4


INVALID_IDS = ["", "\ud800", "e.utah\udfff", "_:b0", '"unterminated', '"x"^^<bad iri>', '"x"@', '"lit\n']


@pytest.mark.parametrize("dialect", ["generic", "freebase"])
def test_an_empty_or_invalid_topic_id_is_answered_as_the_memory_store_answers_it(url, small_kb, dialect):
    """An id the endpoint cannot express names no node: the same errors as an id missing from the memory
    store (no_neighbors, empty_query, ...), never kg_error (which reads like an outage) or an exception."""
    memory = KGSearchTool(MemoryKG.from_file(small_kb.dir / "kb.tsv"), ToolConfig(entity_handles=True))
    sparql = KGSearchTool(SparqlKG(url, dialect=dialect, retries=0), ToolConfig(entity_handles=True))
    for entity in INVALID_IDS:
        for name in ("Topic", ""):
            answers = []
            for tool in (memory, sparql):
                session = tool.session("q?", [TopicEntity(entity, name)])
                answers.append(
                    [
                        (r.error, r.text)
                        for r in map(session.call, ("E1", "E1 | backtrack", "E1 | r", "E1 | relations", entity))
                    ]
                )
            assert answers[0] == answers[1], (entity, name)
            assert all(error != "kg_error" for error, _ in answers[1])
    empty = sparql.session("q?", [TopicEntity("", "")])
    assert empty.call("").error == "empty_query" and empty.call("E1").error == "no_neighbors"
    assert not sparql.kg.expresses("") and not sparql.kg.expresses("_:b0") and sparql.kg.expresses('"x"')
