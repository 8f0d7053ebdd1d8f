"""SparqlKG (`sparql+freebase`) against a real Virtuoso on 127.0.0.1, over a Freebase-shaped KB.

The server (Debian package virtuoso-opensource, `.ci/run` installs it) runs from its own temp
folder and virtuoso.ini, on free ports, with ResultSetMaxRows = 100 so that the hub below (250
named neighbours) is cut by the server and must be paged. It starts once for this module.
"""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kgreasoner.baselines.sog import SoGMethod
from kgreasoner.baselines.tog import ToGConfig, ToGMethod
from kgreasoner.kg.base import KGQueryRejected
from kgreasoner.kg.open import open_kg
from kgreasoner.kg.server import LOOPBACK, free_port
from kgreasoner.kg.sparql import MAX_GET_QUERY_BYTES, SparqlKG
from kgreasoner.llm import ScriptedLLM
from kgreasoner.records.schema import QAExample, TopicEntity
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
from kgreasoner.serving.validation import kg_failure

NS = "http://rdf.freebase.com/ns/"
XSD = "http://www.w3.org/2001/XMLSchema#"
RESULT_SET_MAX_ROWS = 100
HUB_SIZE = 250
LONG_NAME = "Ünïcödé " * 500  # 15 KB percent-encoded: Virtuoso cuts a GET URL near 8 KB (then: a 400)

KB = (
    "\n".join(
        [
            f'<{NS}m.0utah> <{NS}type.object.name> "Utah"@en .',
            f'<{NS}m.0utah> <{NS}type.object.name> "Utah (État)"@fr .',
            f"<{NS}m.0utah> <{NS}type.object.type> <{NS}location.us_state> .",
            f"<{NS}m.0utah> <{NS}common.topic.notable_for> <{NS}g.1abc> .",
            f"<{NS}m.0utah> <http://www.w3.org/2002/07/owl#sameAs> <http://dbpedia.org/resource/Utah> .",
            f"<{NS}m.0utah> <{NS}location.location.time_zones> <{NS}m.0mtz> .",
            f"<{NS}m.0utah> <{NS}government.governmental_jurisdiction.governing_officials> <{NS}m.0cvt> .",
            f'<{NS}m.0utah> <{NS}location.statistical_region.population> "3271616"^^<{XSD}integer> .',
            # a CVT: no name of its own, a person and a date beyond it
            f"<{NS}m.0cvt> <{NS}government.government_position_held.office_holder> <{NS}m.0cox> .",
            f'<{NS}m.0cvt> <{NS}government.government_position_held.from> "2021-01-20"^^<{XSD}date> .',
            f'<{NS}m.0mtz> <{NS}type.object.name> "Mountain Time Zone"@en .',
            f'<{NS}m.0cox> <{NS}type.object.name> "Spencer Cox"@en .',
            f'<{NS}m.0idaho> <{NS}type.object.name> "Idaho"@en .',
            f"<{NS}m.0idaho> <{NS}location.location.time_zones> <{NS}m.0mtz> .",
            f'<{NS}m.0long> <{NS}type.object.name> "{LONG_NAME}"@en .',
            f"<{NS}m.0long> <{NS}location.location.time_zones> <{NS}m.0utc> .",
            f'<{NS}m.0hub> <{NS}type.object.name> "Hub County"@en .',
            f"<{NS}m.0utah> <{NS}location.location.contains> <{NS}m.0hub> .",
            *(
                f"<{NS}m.0hub> <{NS}location.location.contains> <{NS}m.0t{i:03d}> .\n"
                f'<{NS}m.0t{i:03d}> <{NS}type.object.name> "Town {i:03d}"@en .'
                for i in range(HUB_SIZE)
            ),
        ]
    )
    + "\n"
)

INI = """\
[Database]
DatabaseFile       = virtuoso.db
ErrorLogFile       = virtuoso.log
LockFile           = virtuoso.lck
TransactionFile    = virtuoso.trx
xa_persistent_file = virtuoso.pxa
TempStorage        = TempDatabase
[TempDatabase]
DatabaseFile       = virtuoso-temp.db
TransactionFile    = virtuoso-temp.trx
[Parameters]
ServerPort         = {host}:{sql_port}
DisableUnixSocket  = 1
; TTLP reads the KB file from the server's own folder
DirsAllowed        = .
; small buffers and one thread a query: a test server on a shared 2-core machine
NumberOfBuffers    = 10000
MaxDirtyBuffers    = 6000
ThreadsPerQuery    = 1
CheckpointInterval = 0
[HTTPServer]
ServerPort         = {host}:{http_port}
ServerThreads      = 4
[SPARQL]
ResultSetMaxRows      = {max_rows}
MaxQueryExecutionTime = 30
"""


def _isql(port: int, statement: str) -> str:
    done = subprocess.run(
        ["isql-vt", f"{LOOPBACK}:{port}", "dba", "dba", f"exec={statement}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0 or "*** Error" in done.stdout + done.stderr:
        raise RuntimeError(f"isql-vt failed on {statement!r}: {done.stdout}{done.stderr}")
    return done.stdout


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory):
    """The SPARQL URL of a fresh Virtuoso loaded with KB; the server is killed at teardown."""
    if shutil.which("virtuoso-t") is None or shutil.which("isql-vt") is None:
        pytest.skip("Virtuoso is not installed (Debian: apt-get install virtuoso-opensource; .ci/run does it)")
    folder: Path = tmp_path_factory.mktemp("virtuoso")
    sql_port, http_port = free_port(), free_port()
    (folder / "virtuoso.ini").write_text(
        INI.format(host=LOOPBACK, sql_port=sql_port, http_port=http_port, max_rows=RESULT_SET_MAX_ROWS)
    )
    (folder / "kb.nt").write_text(KB, encoding="utf-8")
    log = open(folder / "stdout.log", "wb")
    process = subprocess.Popen(
        ["virtuoso-t", "+foreground", "+configfile", "virtuoso.ini"], cwd=folder, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://{LOOPBACK}:{http_port}/sparql"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{url}?query=ASK%7B%7D", timeout=2).read()
                break
            except (urllib.error.URLError, ConnectionError) as error:
                if process.poll() is not None or time.monotonic() > deadline:
                    log = (folder / "stdout.log").read_text()[-2000:]
                    raise RuntimeError(f"Virtuoso did not start: {log}") from error
                time.sleep(0.2)
        _isql(sql_port, "DB.DBA.TTLP_MT(file_to_string_output('kb.nt'), '', 'http://kgreasoner.test/freebase', 0);")
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


@pytest.fixture(scope="module")
def kg(endpoint):
    return open_kg(f"sparql+freebase:{endpoint}", retries=3, backoff=0.01)


def test_neighbours_labels_mediators_and_typed_literals(kg):
    out = kg.neighbors("m.0utah", "out")
    assert sorted((e.relation, e.object, e.object_label, e.object_is_literal, e.object_unnamed) for e in out) == [
        ("government.governmental_jurisdiction.governing_officials", "m.0cvt", "m.0cvt", False, True),
        ("location.location.contains", "m.0hub", "Hub County", False, False),
        ("location.location.time_zones", "m.0mtz", "Mountain Time Zone", False, False),
        ("location.statistical_region.population", f'"3271616"^^<{XSD}integer>', "3271616", True, False),
    ]
    assert {e.subject_label for e in out} == {"Utah"}  # the English name, not the French one
    cvt = kg.neighbors("m.0cvt", "both")
    assert sorted((e.direction, e.relation, e.neighbor, e.neighbor_label) for e in cvt) == [
        ("in", "government.governmental_jurisdiction.governing_officials", "m.0utah", "Utah"),
        ("out", "government.government_position_held.from", f'"2021-01-20"^^<{XSD}date>', "2021-01-20"),
        ("out", "government.government_position_held.office_holder", "m.0cox", "Spencer Cox"),
    ]
    assert [e.direction for e in cvt] == ["out", "out", "in"]
    assert kg.is_unnamed("m.0cvt") and not kg.is_unnamed("m.0cox")
    assert kg.label("m.0cvt") == "m.0cvt" and kg.label("m.0utah") == "Utah" and kg.label("m.0nowhere") == "m.0nowhere"
    assert kg.resolve("Utah") == ["m.0utah"] and kg.resolve("Utah (État)") == [] and kg.resolve("utah") == []
    assert kg.resolve("m.0cox") == ["m.0cox"]
    assert kg.degree("m.0utah", "out") == 4 and kg.degree("m.0mtz", "in") == 2
    incoming = kg.neighbors("m.0mtz", "in", relations=["location.location.time_zones"], limit=1)
    assert len(incoming) == 1 and incoming[0].subject in {"m.0utah", "m.0idaho"}


def test_a_hub_cut_at_result_set_max_rows_is_paged_in_full(kg, endpoint):
    before = kg.queries_sent, kg.paged_results
    edges = kg.neighbors("m.0hub", "both")
    assert [e.direction for e in edges] == ["out"] * HUB_SIZE + ["in"]
    assert sorted(e.object_label for e in edges[:-1]) == [f"Town {i:03d}" for i in range(HUB_SIZE)]
    assert (edges[-1].subject, edges[-1].subject_label) == ("m.0utah", "Utah")
    assert len(set(edges)) == HUB_SIZE + 1
    # the cut result, then 3 ordered pages of 100 (the last one short)
    assert (kg.queries_sent - before[0], kg.paged_results - before[1]) == (1 + 3, 1)
    assert kg.degree("m.0hub", "out") == HUB_SIZE  # a count is one row: never cut
    # a limit above the cap is met by pages as well, and below it by one request
    assert len(kg.neighbors("m.0hub", "out", limit=150)) == 150
    assert len(kg.neighbors("m.0hub", "out", limit=40)) == 40
    # without paging (max_rows at the server's cap) the same call would have stopped at 100 rows
    capped = SparqlKG(endpoint, dialect="freebase", max_rows=RESULT_SET_MAX_ROWS)
    assert len(capped.neighbors("m.0hub", "out")) == RESULT_SET_MAX_ROWS and capped.paged_results == 0


def test_search_tool_session_over_virtuoso(kg):
    tool = KGSearchTool(kg, ToolConfig(top_k=20, entity_handles=True))
    session = tool.session("who governs utah?", [TopicEntity("m.0utah", "")])  # the name comes from the KG
    first = session.call("Utah")
    # Virtuoso's own edge order (ranking "none"); the CVT is shown through to what lies beyond it
    assert (first.error, first.text) == (
        None,
        "\n".join(
            [
                "(E1 Utah, location.location.contains, E2 Hub County)",
                "(E1 Utah, location.location.time_zones, E3 Mountain Time Zone)",
                "(E1 Utah, government.governmental_jurisdiction.governing_officials, E4 m.0cvt)",
                "(E4 m.0cvt, government.government_position_held.office_holder, E5 Spencer Cox)",
                "(E4 m.0cvt, government.government_position_held.from, E6 2021-01-20)",
                "(E1 Utah, location.statistical_region.population, E7 3271616)",
            ]
        ),
    )
    second = session.call("E3")  # resolved by its handle; the edge back to Utah was shown already
    assert (second.error, second.text) == (None, "(E8 Idaho, location.location.time_zones, E3 Mountain Time Zone)")
    hub = session.call("hub county")  # resolved by its normalised name; a paged hub, so in ORDER BY order
    assert (hub.error, hub.text.splitlines()) == (
        None,
        [
            *(f"(E2 Hub County, location.location.contains, E{9 + i} Town {i:03d})" for i in range(20)),
            "more: location.location.contains (230)",
        ],
    )  # counted on the server, past ResultSetMaxRows
    assert session.call("Town 001 | backtrack").text.splitlines()[0] == (
        "(E2 Hub County, location.location.contains, E29 Town 020)"
    )
    assert session.call("Nowhere").error == "unknown_entity"


def test_tog_and_sog_kg_calls_over_virtuoso(kg):
    example = QAExample.from_dict(
        {
            "id": "q1",
            "question": "What time zone is Utah in?",
            "topic_entities": [{"id": "m.0utah", "name": "Utah"}],
            "answers": [{"id": "m.0mtz", "name": "Mountain Time Zone"}],
        }
    )

    def tog_reply(prompt: str) -> str:
        end = prompt.rstrip().rsplit("\n", 1)[-1]
        if end == "Choices:":
            return "{location.location.time_zones} (score: 1.0)"
        if end == "Enough?":
            return "{Yes}."
        return "Answer: {Mountain Time Zone}"

    llm = ScriptedLLM([tog_reply])
    result = ToGMethod(kg, ToGConfig(mode="fixed", depth=1)).answer(example, llm)
    assert result.answers == ["Mountain Time Zone"]
    assert result.trace["triplets"] == [["Utah", "location.location.time_zones", "Mountain Time Zone"]]
    listed = llm.prompts[0].rsplit("Relations:\n", 1)[1].split("\nChoices:", 1)[0].splitlines()
    assert sorted(listed) == [
        "government.governmental_jurisdiction.governing_officials",
        "location.location.contains",
        "location.location.time_zones",
        "location.statistical_region.population",
    ]
    assert result.kg_queries == 3  # relations out, relations in, the tails of the chosen relation

    replies = [
        'Action: search("Hub County", "outgoing", [])',
        'Action: search("m.0hub", "outgoing", ["location.location.contains"])',
        "Final answer: {Town 007}",
    ]
    sog_llm = ScriptedLLM([lambda p: replies[min(p.count("\nObservation:\n"), 2)]])
    hub = QAExample.from_dict(
        {
            "id": "q2",
            "question": "Which towns are in Hub County?",
            "topic_entities": [{"id": "m.0hub", "name": "Hub County"}],
            "answers": [{"id": "m.0t007", "name": "Town 007"}],
        }
    )
    sog = SoGMethod(kg).answer(hub, sog_llm)
    assert sog.answers == ["Town 007"] and sog.kg_queries == 2
    distinct = sog_llm.prompts[1].rsplit("Observation:\n", 1)[1].rstrip("\n")
    assert distinct == (
        f"{HUB_SIZE} results, more than 50: only the distinct properties are listed. Search again with "
        "properties_to_filter_for.\n| property | propertyLabel |\n|---|---|\n"
        "| location.location.contains | location contains |"
    )
    table = sog_llm.prompts[2].rsplit("Observation:\n", 1)[1].rstrip("\n").splitlines()
    assert table[:2] == ["| property | propertyLabel | value | valueLabel |", "|---|---|---|---|"]
    assert sorted(table[2:]) == [
        f"| location.location.contains | location contains | m.0t{i:03d} | Town {i:03d} |" for i in range(HUB_SIZE)
    ]


def test_a_long_name_goes_by_post(kg):
    assert len(kg.resolve_query(LONG_NAME).encode()) > MAX_GET_QUERY_BYTES
    before = kg.queries_sent
    assert kg.resolve(LONG_NAME) == ["m.0long"]
    assert kg.queries_sent == before + 1
    assert [(e.subject_label, e.object) for e in kg.neighbors("m.0long", "out")] == [(LONG_NAME, "m.0utc")]


def test_a_4xx_from_virtuoso_is_a_rejection_not_retried_nor_an_outage(kg, endpoint):
    broken = SparqlKG(endpoint, dialect="freebase", retries=3, backoff=0.5)
    start = time.monotonic()
    with pytest.raises(
        KGQueryRejected, match=r"rejected a query: QueryBadFormed.*Virtuoso 37000 Error SP030: SPARQL compiler"
    ) as err:
        broken._select("SELECT ?s WHERE { ?s ?p ", None)  # Virtuoso: 400 Bad Request
    assert broken.queries_sent == 1 and time.monotonic() - start < 0.5
    failure = kg_failure("question", err.value)
    assert (failure.status, failure.kind) == (502, "kg_rejected")
    missing = SparqlKG(endpoint.replace("/sparql", "/no-such-service"), dialect="freebase", retries=3, backoff=0.5)
    with pytest.raises(KGQueryRejected, match=r"/no-such-service rejected a query: "):
        missing.neighbors("m.0utah")
    assert missing.queries_sent == 1
