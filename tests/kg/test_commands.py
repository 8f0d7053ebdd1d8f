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
    assert main(["kg", "load", str(small_kb.dir / "kb.tsv"), "--store", str(tmp_path / "s"), "--names", str(small_kb.dir / "names.tsv")]) == 0
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
    assert outputs[0] == outputs[1] == (
        "triples    15\n"
        "nodes      14\n"
        "relations  9\n"
        "top 2 nodes by degree:\n"
        "         8  e.utah  (Utah)\n"
        "         3  cvt.1\n"  # ties broken by id; an unnamed node shows no label
    )
