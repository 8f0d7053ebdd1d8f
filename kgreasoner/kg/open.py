"""`open_kg(spec)`: one string names any knowledge graph, for configs and the command line.

Specs:
    memory:PATH                 kb.tsv / .nt file, or a dataset folder with kb.tsv (+ names.tsv)
    PATH                        the same as memory:PATH
    oxigraph:STORE_DIR          a store written by `kgreasoner kg load`
    subgraph:PATH               RoG's per-question subgraphs (a .parquet / .jsonl file or a folder)
    sparql:URL                  a SPARQL endpoint with our IRIs (e.g. `kgreasoner kg serve`)
    sparql+freebase:URL         a Freebase endpoint (Virtuoso, QLever), ToG's `ns:` vocabulary
    sparql+wikidata:URL         a Wikidata endpoint (truthy `wdt:` claims)
"""

from __future__ import annotations

import re
from pathlib import Path

from kgreasoner.kg.base import KnowledgeGraph

SCHEMES = ("memory", "oxigraph", "subgraph", "sparql", "sparql+freebase", "sparql+wikidata")
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]+):")


def parse_spec(spec: str) -> tuple[str, str]:
    """(scheme, target) of a spec; a bare path is `memory`. Unknown schemes raise ValueError."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"KG spec must be a non-empty string, got {spec!r}")
    match = _SCHEME.match(spec)
    if match is None:
        return "memory", spec
    scheme, target = match.group(1), spec[match.end() :]
    if scheme not in SCHEMES:
        hint = f" (for an endpoint write sparql:{spec})" if scheme in ("http", "https") else ""
        raise ValueError(
            f"unknown KG spec scheme {scheme!r} in {spec!r}{hint}; use one of {', '.join(SCHEMES)} or a path"
        )
    if not target:
        raise ValueError(f"KG spec {spec!r} names no path or URL after '{scheme}:'")
    return scheme, target


def open_kg(spec: str, **options) -> KnowledgeGraph:
    """Open the knowledge graph that `spec` names.

    `options` go to the backend: `names` (a names.tsv path or dict) for memory; `cache_size`
    (question views kept built) for subgraph; `timeout`,
    `retries`, `backoff`, `max_rows`, `excluded_relation_prefixes`, `language` for sparql.
    """
    scheme, target = parse_spec(spec)
    if scheme == "memory":
        from kgreasoner.kg.memory import MemoryKG

        _check_options(spec, options, {"names"})
        path = Path(target)
        if path.is_dir():
            if not (path / "kb.tsv").exists():
                raise FileNotFoundError(f"{path}: dataset folder has no kb.tsv")
            path = path / "kb.tsv"
        return MemoryKG.from_file(path, names=options.get("names"))
    if scheme == "oxigraph":
        from kgreasoner.kg.oxigraph_store import OxigraphKG

        _check_options(spec, options, set())
        return OxigraphKG(target)
    if scheme == "subgraph":
        from kgreasoner.kg.subgraph import SubgraphKG

        _check_options(spec, options, {"cache_size"})
        return SubgraphKG.from_path(target, **options)
    from kgreasoner.kg.sparql import SparqlKG

    _check_options(
        spec, options, {"timeout", "retries", "backoff", "max_rows", "excluded_relation_prefixes", "language"}
    )
    dialect = scheme.partition("+")[2] or "generic"
    return SparqlKG(target, dialect=dialect, **options)


def _check_options(spec: str, options: dict, allowed: set[str]) -> None:
    unknown = sorted(set(options) - allowed)
    if unknown:
        raise ValueError(
            f"KG spec {spec!r} does not take option(s) {', '.join(unknown)} "
            f"(it takes: {', '.join(sorted(allowed)) or 'none'})"
        )
