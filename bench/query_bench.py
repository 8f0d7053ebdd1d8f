"""Search-query speed from 1 KB to 1 MB: the parser and the search tool on queries made of escapes.

    python -m bench.query_bench [--max-size 1000000] [--repeats 3]

A policy (or an upstream that ignores `max_tokens`) can write one `<search>` of any length. Shapes, each a
whole `<think> <search>...</search>` of about the size given:

- `escaped-bars`: `Hub | ="\\|\\|..."`, a quoted relation of escaped bars (finding the last bar that splits by
  walking back over the backslashes before each bar, and reading the quote by slices, made both quadratic);
- `escaped-backslashes`: `Hub | ="\\\\\\\\..."`;
- `unicode-escapes`: `Hub | ="\\u003c\\u003c..."`;
- `bare-escapes`: `Hub | \\|\\|...`, escaped bars outside quotes.

Columns, in milliseconds (best of `--repeats`): `parse` is `parse_trajectory` on the whole text; `search` is
`SearchSession.call` with the default `ToolConfig` (a query over `max_query_chars` is refused unread);
`search, no limit` is the same call with `max_query_chars=None`, which reads the filter in full and answers
that the relation is unknown. Sizes double from `--min-size`, so linear growth doubles each row's time.
Target: parse and search under 100 ms at 1 MB.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

from kgreasoner.kg.memory import MemoryKG
from kgreasoner.protocol import SEARCH_CLOSE, SEARCH_OPEN, THINK_OPEN, parse_trajectory
from kgreasoner.records.schema import TopicEntity
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig

HUB = [TopicEntity("h", "Hub")]
SHAPES: dict[str, Callable[[int], str]] = {
    "escaped-bars": lambda size: 'Hub | ="' + "\\|" * (size // 2) + '"',
    "escaped-backslashes": lambda size: 'Hub | ="' + "\\\\" * (size // 2) + '"',
    "unicode-escapes": lambda size: 'Hub | ="' + "\\u003c" * (size // 6) + '"',
    "bare-escapes": lambda size: "Hub | " + "\\|" * (size // 2),
}


def best_ms(run: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def _search(tool: KGSearchTool, query: str) -> object:
    return tool.session("q", HUB).call(query)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--min-size", type=int, default=1000, help="characters of the smallest query")
    parser.add_argument("--max-size", type=int, default=1_000_000, help="characters of the largest query")
    parser.add_argument("--repeats", type=int, default=3, help="runs per figure; the best is printed")
    args = parser.parse_args(argv)
    kg = MemoryKG.from_triples([("h", f"r{i}", f"n{i}") for i in range(20)], {"h": "Hub"})
    limited, unlimited = KGSearchTool(kg, ToolConfig()), KGSearchTool(kg, ToolConfig(max_query_chars=None))
    sizes = []
    size = args.min_size
    while size < args.max_size:
        sizes.append(size)
        size *= 2
    sizes.append(args.max_size)
    print(f"| shape | chars | parse ms | search ms | search, no limit ms |  (best of {args.repeats})")
    print("|---|---:|---:|---:|---:|")
    slowest = 0.0
    for name, shape in SHAPES.items():
        for size in sizes:
            query = shape(size)
            text = f"{THINK_OPEN} {SEARCH_OPEN}{query}{SEARCH_CLOSE}"
            [search] = parse_trajectory(text).searches
            limit = limited.config.max_query_chars or len(query)
            expected = "query_too_long" if len(query) > limit else "unknown_relation"
            assert limited.session("q", HUB).call(search.query).error == expected, (name, size)
            assert unlimited.session("q", HUB).call(search.query).error == "unknown_relation", (name, size)
            parse = best_ms(partial(parse_trajectory, text), args.repeats)
            search_ms = best_ms(partial(_search, limited, search.query), args.repeats)
            full = best_ms(partial(_search, unlimited, search.query), args.repeats)
            slowest = max(slowest, parse, search_ms)
            print(f"| {name} | {len(text)} | {parse:.2f} | {search_ms:.3f} | {full:.2f} |")
    print(f"slowest parse or search: {slowest:.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
