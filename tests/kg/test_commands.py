"""`kgreasoner kg load | serve | stats` end to end: load a store, serve it in a subprocess, query, stop."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys

import pytest

from kgreasoner.cli import main
from kgreasoner.kg import KGError, SparqlKG


@pytest.fixture(scope="module")
def store(small_kb, tmp_path_factory):
    path = tmp_path_factory.mktemp("commands") / "store"
    assert main(["kg", "load", str(small_kb.dir), "--store", str(path)]) == 0
    return path


def read_line(process: subprocess.Popen, timeout: float) -> str:
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    if not selector.select(timeout):
        raise AssertionError(f"no output from `kg serve` within {timeout} s")
    return process.stdout.readline()


def test_load_prints_timing_and_builds_a_store(small_kb, tmp_path, capsys):
    assert (
        main(
            [
                "kg",
                "load",
                str(small_kb.dir / "kb.tsv"),
                "--store",
                str(tmp_path / "s"),
                "--names",
                str(small_kb.dir / "names.tsv"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"kg load: {small_kb.dir / 'kb.tsv'} -> {tmp_path / 's'}"
    assert out[1].startswith(f"kg load: 15 triples into {tmp_path / 's'} in ") and out[1].endswith(" triples/s)")
    assert main(["kg", "load", str(small_kb.dir), "--store", str(tmp_path / "s")]) == 1
    assert "store directory exists and is not empty" in capsys.readouterr().err


def test_serve_answers_sparql_and_stops_on_signal(store):
    process = subprocess.Popen(
        [sys.executable, "-m", "kgreasoner.cli", "kg", "serve", "--store", str(store), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,  # so that a failed test can stop the server with its parent
    )
    try:
        line = read_line(process, 30)
        assert line.startswith("kg serve: SPARQL endpoint http://127.0.0.1:"), line
        url = line.split()[4]
        kg = SparqlKG(url, retries=0)
        assert {e.object_label for e in kg.neighbors("e.utah", relations=["time_zone", "capital"])} == {
            "Mountain Time Zone",
            "Salt Lake City",
        }
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
        with pytest.raises(KGError, match="failed after 1 attempts"):
            kg.neighbors("e.utah")  # the oxigraph child went down with it
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def test_serve_missing_store_fails_clearly(tmp_path, capsys):
    assert main(["kg", "serve", "--store", str(tmp_path / "none"), "--port", "0"]) == 1
    assert f"no oxigraph store at {tmp_path / 'none'}" in capsys.readouterr().err


def test_stats_agree_for_memory_and_oxigraph(small_kb, store, capsys):
    outputs = []
    for spec in (str(small_kb.dir), f"oxigraph:{store}"):
        assert main(["kg", "stats", spec, "--top", "2"]) == 0
        outputs.append(capsys.readouterr().out)
    assert (
        outputs[0]
        == outputs[1]
        == (
            "triples    15\n"
            "nodes      14\n"
            "relations  9\n"
            "top 2 nodes by degree:\n"
            "         8  e.utah  (Utah)\n"
            "         3  cvt.1\n"  # ties broken by id; an unnamed node shows no label
        )
    )


DATE = '"1815-13-45"^^<http://www.w3.org/2001/XMLSchema#date>'
# (files of a dataset folder, the file and line at fault, the rest of the message): each case parses,
# and each was loaded without a word before.
LONG = "x" * (3 << 20)  # a 3 MiB value
BAD_KBS = {
    "nul_in_relation": (
        {"kb.tsv": "e.a\tr\te.b\ne.w\tbo\x00rn\te.x\n"},
        "kb.tsv:2",
        "field 'relation' holds a NUL byte (column 7); ids and labels cannot contain one",
    ),
    "nul_in_label": (
        {"kb.tsv": "e.a\tr\te.b\n", "names.tsv": "e.a\tA\ne.b\tB\x00\n"},
        "names.tsv:2",
        "field 'label' holds a NUL byte (column 6); ids and labels cannot contain one",
    ),
    "impossible_date": (
        {"kb.tsv": f"e.a\tr\te.b\ne.w\tborn_on\t{DATE}\n"},
        "kb.tsv:2",
        f"field 'object' is {DATE}, which is not a valid xsd:date (month 13 does not exist)",
    ),
    "repeated_name": (
        {"kb.tsv": "e.a\tr\te.b\n", "names.tsv": "e.a\tA\ne.b\tB\ne.a\tA again\n"},
        "names.tsv:3",
        "field 'id': 'e.a' is named again (first at line 1); give each id one label, or the earlier one "
        "stops resolving",
    ),
    "header_line": (
        {"kb.tsv": "subject\trelation\tobject\ne.a\tr\te.b\n"},
        "kb.tsv:1",
        "a header line ('subject relation object') would be loaded as a triple; the file has no header: "
        "remove the line",
    ),
    "names_header_line": (
        {"kb.tsv": "e.a\tr\te.b\n", "names.tsv": "id\tlabel\ne.a\tA\n"},
        "names.tsv:1",
        "a header line ('id label') would be loaded as a name; the file has no header: remove the line",
    ),
    "long_line": (
        {"kb.tsv": f'e.a\tr\te.b\ne.w\tmotto\t"{LONG}"\ne.b\tr\te.a\n'},
        "kb.tsv:2",
        f"a line of {len(LONG) + 12:,} bytes, over the limit of 1,048,576 bytes per line; no question, trajectory "
        "or triple is that long: is the file broken?",
    ),
    "long_name": (
        {"kb.tsv": "e.a\tr\te.b\n", "names.tsv": f"e.a\tA\ne.b\t{LONG}\n"},
        "names.tsv:2",
        f"a line of {len(LONG) + 4:,} bytes, over the limit of 1,048,576 bytes per line; no question, trajectory "
        "or triple is that long: is the file broken?",
    ),
    "literal_subject": (
        {"kb.tsv": 'e.a\tr\te.b\n"1815"\tyear_of\te.w\n'},
        "kb.tsv:2",
        "field 'subject' is the literal \"1815\"; in RDF only an object can be a literal, so no store can hold "
        "this triple: make the subject an id, or write the triple the other way round with an inverse relation",
    ),
    "inverse_relation": (
        {"kb.tsv": "e.a\tr\te.b\ne.w\t^born_in\te.x\n"},
        "kb.tsv:2",
        "field 'relation' is '^born_in': a leading '^' means 'walked backwards' in gold paths, so no "
        "path could name this relation; rename it",
    ),
}


@pytest.mark.parametrize("case", list(BAD_KBS))
@pytest.mark.parametrize("command", ["load", "stats"])
def test_kb_files_that_parse_but_cannot_work_are_refused_naming_file_line_and_field(case, command, tmp_path, capsys):
    files, where, message = BAD_KBS[case]
    folder = tmp_path / "d"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")
    args = ["load", str(folder), "--store", str(tmp_path / "store")] if command == "load" else ["stats", str(folder)]
    assert main(["kg", *args]) == 1
    assert capsys.readouterr().err == f"kgreasoner kg: error: {folder / where}: {message}\n"
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (
            "<http://x/a> <http://kgreasoner.local/relation/%5Eborn_in> <http://x/b> .",
            "field 'relation' is '^born_in': a leading '^' means 'walked backwards' in gold paths, so no path could "
            "name this relation; rename it",
        ),
        (
            f'<http://x/a> <http://x/motto> "{LONG}" .',
            f"a line of {len(LONG) + 34:,} bytes, over the limit of 1,048,576 bytes per line; no question, "
            "trajectory or triple is that long: is the file broken?",
        ),
        (
            f"<http://x/a> <http://x/born_on> {DATE} .",
            f"field 'object' is {DATE}, which is not a valid xsd:date (month 13 does not exist)",
        ),
    ],
)
def test_n_triples_are_held_to_the_same_rules(line, message, tmp_path, capsys):
    path = tmp_path / "kb.nt"
    path.write_text(f"<http://x/a> <http://x/r> <http://x/b> .\n{line}\n", encoding="utf-8")
    for args in (["stats", str(path)], ["load", str(path), "--store", str(tmp_path / "store")]):
        assert main(["kg", *args]) == 1
        assert capsys.readouterr().err == f"kgreasoner kg: error: {path}:2: {message}\n"


@pytest.mark.parametrize(
    ("value", "datatype"),
    [
        ("1815-06-18", "date"),
        ("2000-02-29", "date"),
        ("1815-06-18T24:00:00Z", "dateTime"),
        ("-0044", "gYear"),
        ("1815-06", "gYearMonth"),
        ("-12", "integer"),
        ("1.5e3", "double"),
        ("true", "boolean"),
        ("13-45", "string"),
    ],
)
def test_valid_typed_literals_still_load(value, datatype, tmp_path, capsys):
    path = tmp_path / "kb.tsv"
    path.write_text(f'e.a\tr\t"{value}"^^<http://www.w3.org/2001/XMLSchema#{datatype}>\n', encoding="utf-8")
    assert main(["kg", "stats", str(path)]) == 0
    assert "triples    1" in capsys.readouterr().out


def test_stats_and_errors_show_a_label_s_control_characters_as_escapes(tmp_path, capsys):
    folder = tmp_path / "d"
    folder.mkdir()
    (folder / "kb.tsv").write_text("e.a\tr\te.b\ne.a\tr\te.c\n", encoding="utf-8")
    (folder / "names.tsv").write_text("e.a\tA\x1b[2J\x1b]0;pwned\x07\ne.b\tB\u202e\ne.c\tC\x9b1m\n", encoding="utf-8")
    assert main(["kg", "stats", str(folder), "--top", "3"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-3:] == [
        "         2  e.a  (A\\x1b[2J\\x1b]0;pwned\\x07)",
        "         1  e.b  (B\\u202e)",
        "         1  e.c  (C\\x9b1m)",
    ]
    (folder / "kb.tsv").write_text('e.a\tr\te.b\n"\x1b[2J"\tr\te.c\n', encoding="utf-8")
    assert main(["kg", "stats", str(folder)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"kgreasoner kg: error: {folder / 'kb.tsv'}:2: field 'subject' is the literal \"\\x1b[2J\";")
    assert "\x1b" not in err
