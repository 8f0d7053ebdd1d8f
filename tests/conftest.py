"""Fixtures shared by every test directory."""

from __future__ import annotations

from pathlib import Path
from typing import Iterable

import pyoxigraph as ox
import pytest

from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.kg.server import OxigraphServer, start_oxigraph_server


@pytest.fixture(scope="session")
def oxigraph_server(tmp_path_factory):
    """A factory that starts a real `oxigraph serve-read-only` on a free 127.0.0.1 port.

    `oxigraph_server(triples, names=None)` loads triples (a TSV/NT path, a dataset folder or id
    tuples, as `OxigraphKG.build` takes them) into a fresh store; `oxigraph_server(
    raw_ntriples=TEXT)` loads N-Triples text as it is (for foreign vocabularies such as
    Freebase's `ns:`). Either way it waits until the server answers and returns the SPARQL query
    URL. Every server started is killed at the end of the session.
    """
    servers: list[OxigraphServer] = []

    def start(
        triples: str | Path | Iterable[tuple[str, str, str]] | None = None,
        names: str | Path | dict[str, str] | None = None,
        *,
        raw_ntriples: str | None = None,
    ) -> str:
        store_dir = tmp_path_factory.mktemp("oxigraph_server") / "store"
        if raw_ntriples is not None:
            store = ox.Store(str(store_dir))
            store.bulk_load(input=raw_ntriples.encode("utf-8"), format=ox.RdfFormat.N_TRIPLES)
            store.flush()
            del store  # closes it before the server opens the directory
        else:
            OxigraphKG.build(triples, store_dir, names=names).close()
        server = start_oxigraph_server(store_dir)
        servers.append(server)
        return server.url

    yield start
    for server in servers:
        server.stop()
