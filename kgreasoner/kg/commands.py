"""`kgreasoner kg load | serve | stats`: build a disk store, publish it over SPARQL, describe a KG."""

from __future__ import annotations

import argparse
import ipaddress
import signal
import sys
import time
from pathlib import Path

from kgreasoner.kg.base import KGError, KnowledgeGraph
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.kg.open import open_kg
from kgreasoner.kg.oxigraph_store import OxigraphKG
from kgreasoner.kg.rdf import RDFS_LABEL, term_to_id
from kgreasoner.kg.server import LOOPBACK, start_oxigraph_server
from kgreasoner.terminal import printable

DEFAULT_PORT = 7878  # oxigraph's own default


def register(subparsers) -> argparse._SubParsersAction:
    """Add `kg load | serve | stats`; returns the `kg` command's subparsers, for commands of upper layers."""
    kg = subparsers.add_parser("kg", help="build, serve, inspect and embed knowledge-graph stores")
    kg.set_defaults(func=lambda args: _print_help(kg))
    commands = kg.add_subparsers(dest="kg_command", metavar="KG_COMMAND")

    load = commands.add_parser("load", help="bulk-load TSV / N-Triples / a dataset folder into an oxigraph store")
    load.add_argument("input", type=Path, help="kb.tsv, a .nt file, or a dataset folder holding kb.tsv [+ names.tsv]")
    load.add_argument("--store", type=Path, required=True, help="new store directory (must not exist or be empty)")
    load.add_argument(
        "--names", type=Path, default=None, help="names.tsv (id<TAB>label); default: the one beside INPUT"
    )
    load.set_defaults(func=run_load)

    serve = commands.add_parser("serve", help="serve a store read-only over SPARQL with `oxigraph serve-read-only`")
    serve.add_argument("--store", type=Path, required=True, help="a store written by `kgreasoner kg load`")
    serve.add_argument("--host", default=LOOPBACK, help=f"address to bind (default {LOOPBACK}: this machine only)")
    serve.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 picks a free one)"
    )
    serve.add_argument("--timeout-s", type=int, default=None, help="the server's per-query timeout in seconds")
    serve.set_defaults(func=run_serve)

    stats = commands.add_parser(
        "stats", help="triples, nodes, relations and top-degree nodes of a memory or oxigraph KG"
    )
    stats.add_argument("spec", help="memory:PATH, oxigraph:DIR or a bare path")
    stats.add_argument("--top", type=int, default=10, help="how many top-degree nodes to list")
    stats.set_defaults(func=run_stats)
    return commands


def _print_help(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2


def run_load(args: argparse.Namespace) -> int:
    print(f"kg load: {args.input} -> {args.store}", flush=True)
    start = time.perf_counter()
    kg = OxigraphKG.build(args.input, args.store, names=args.names, progress=True)
    seconds = time.perf_counter() - start
    lines = kg.num_triples_loaded
    assert lines is not None  # build counts what it loads
    triples = store_triples(kg)  # the store keeps a repeated line once: report what it holds, as MemoryKG counts
    kg.close()
    rate = lines / seconds if seconds > 0 else float("inf")
    repeated = f" ({lines - triples} repeated lines counted once)" if lines != triples else ""
    print(f"kg load: {triples} triples{repeated} into {args.store} in {seconds:.1f} s ({rate:,.0f} triples/s)")
    print(
        f"kg load: open it with --kg oxigraph:{args.store}, "
        f"or serve it with `kgreasoner kg serve --store {args.store}`"
    )
    return 0


def run_serve(args: argparse.Namespace) -> int:
    if not _is_loopback(args.host):
        print(f"kg serve: warning: binding {args.host} exposes the store beyond this machine", file=sys.stderr)
    try:
        server = start_oxigraph_server(
            args.store,
            host=args.host,
            port=None if args.port == 0 else args.port,
            timeout_s=args.timeout_s,
            capture_output=False,
        )
    except KGError as err:
        print(f"kgreasoner kg serve: error: {err}", file=sys.stderr)
        return 1
    print(f"kg serve: SPARQL endpoint {server.url}  (use --kg sparql:{server.url}); Ctrl-C stops it", flush=True)

    def forward(signum, _frame):
        server.process.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        code = server.process.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.stop()
    # A server stopped by our forwarded signal ended normally.
    return 0 if code in (0, -signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP) else code


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run_stats(args: argparse.Namespace) -> int:
    kg = open_kg(args.spec)
    try:
        stats = graph_stats(kg, args.top)
    finally:
        kg.close()
    print(f"triples    {stats['triples']}")
    print(f"nodes      {stats['nodes']}")
    print(f"relations  {stats['relations']}")
    print(f"top {len(stats['top'])} nodes by degree:")
    for node, degree, label in stats["top"]:
        print(f"  {degree:>8}  {printable(node)}" + (f"  ({printable(label)})" if label != node else ""))
    return 0


def store_triples(kg: OxigraphKG) -> int:
    """Distinct edges in the store (labels and the index graph left out)."""
    (row,) = list(kg.query(f"SELECT (COUNT(*) AS ?n) WHERE {{ ?s ?p ?o . FILTER(?p != <{RDFS_LABEL}>) }}"))
    return int(row["n"].value)


def graph_stats(kg: KnowledgeGraph, top: int = 10) -> dict:
    """Counts and top-degree nodes; for memory and oxigraph graphs (a SPARQL scan of a full
    Freebase would take hours, so remote endpoints are refused)."""
    if isinstance(kg, MemoryKG):
        degrees = sorted(((kg.degree(node), node) for node in kg.entities), key=lambda x: (-x[0], x[1]))[:top]
        return {
            "triples": kg.num_triples,
            "nodes": len(kg.entities),
            "relations": len(kg.relation_types),
            "top": [(node, degree, kg.label(node)) for degree, node in degrees],
        }
    if isinstance(kg, OxigraphKG):
        edges = f"?s ?p ?o . FILTER(?p != <{RDFS_LABEL}>)"

        def count(expression: str) -> int:
            (row,) = list(kg.query(f"SELECT ({expression} AS ?n) WHERE {{ {edges} }}"))
            return int(row["n"].value)

        nodes = list(
            kg.query(
                f"SELECT (COUNT(DISTINCT ?x) AS ?n) WHERE "
                f"{{ {{ {edges} BIND(?s AS ?x) }} UNION {{ {edges} BIND(?o AS ?x) }} }}"
            )
        )
        ranked = kg.query(
            f"SELECT ?x (COUNT(*) AS ?d) WHERE {{ {{ {edges} BIND(?s AS ?x) }} UNION {{ {edges} BIND(?o AS ?x) }} }} "
            f"GROUP BY ?x ORDER BY DESC(?d) STR(?x) LIMIT {int(top)}"
        )
        top_nodes = []
        for row in ranked:
            node = term_to_id(row["x"])
            top_nodes.append((node, int(row["d"].value), kg.label(node)))
        return {
            "triples": store_triples(kg),
            "nodes": int(nodes[0]["n"].value),
            "relations": count("COUNT(DISTINCT ?p)"),
            "top": top_nodes,
        }
    raise ValueError(f"kg stats supports memory and oxigraph graphs, not {type(kg).__name__}")
