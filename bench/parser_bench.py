"""Parser speed on 1 MB adversarial outputs: parse, format check, search count, query read.

    python -m bench.parser_bench [--size 1000000] [--repeats 3]

Every reader of a completion (`protocol.parse_trajectory`, `protocol.check_format`,
`protocol.last_open_search`, `rewards.count_searches`) makes one pass over the tags, so a
policy that writes tag soup cannot stall a training step. Shapes, each cut to `--size`
characters:

- `close-open`: `</search><triples>` repeated (a lazy `<triples>(.*?)</triples>` regex with no
  close scans to the end from every opening: quadratic);
- `unclosed-search`: 16,000 `<search>` without a close, spread over the text;
- `unclosed-answer`: the same with `<answer>`;
- `blank-lines`: newlines then `(` (a multiline `^\\s*\\(` regex backtracks over every line);
- `valid`: a format-valid trajectory with as many search/triples rounds as fit (the checker's
  full pass), read with its tool spans;
- `plain`: prose without a tag.

Prints the best of `--repeats` runs per reader and shape, in milliseconds. Target: < 50 ms each.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

from kgreasoner.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TRIPLES_OPEN,
    check_format,
    format_tool_block,
    last_open_search,
    parse_trajectory,
)
from kgreasoner.rewards import count_searches

UNCLOSED = 16_000


def _spread(tag: str, size: int) -> str:
    filler = "x" * max(0, size // UNCLOSED - len(tag))
    return ((tag + filler) * UNCLOSED)[:size]


def _valid(size: int) -> tuple[str, list[tuple[int, int]]]:
    block = format_tool_block("(Utah, time zone, Mountain Time Zone)\n(Utah, capital, Salt Lake City)")
    text, spans = THINK_OPEN + " start", []
    closing = f" done {THINK_CLOSE}\n{ANSWER_OPEN}Mountain Time Zone{ANSWER_CLOSE}"
    while len(text) + len(block) + 40 + len(closing) < size:
        text += f" then {SEARCH_OPEN}Utah{SEARCH_CLOSE}"
        spans.append((len(text), len(text) + len(block)))
        text += block
    return text + closing, spans


def shapes(size: int) -> dict[str, tuple[str, list[tuple[int, int]] | None]]:
    valid, spans = _valid(size)
    return {
        "close-open": (((SEARCH_CLOSE + TRIPLES_OPEN) * (size // 18 + 1))[:size], None),
        "unclosed-search": (_spread(SEARCH_OPEN, size), None),
        "unclosed-answer": (_spread(ANSWER_OPEN, size), None),
        "blank-lines": ("\n" * (size - 1) + "(", None),
        "valid": (valid, spans),
        "plain": (("The quick brown fox jumps over the lazy dog. " * (size // 45 + 1))[:size], None),
    }


def best_ms(run: Callable[[], object], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=1_000_000, help="characters per crafted output")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    readers = {
        "parse_trajectory": lambda text, spans: parse_trajectory(text, spans),
        "check_format": lambda text, spans: check_format(text, spans),
        "count_searches": lambda text, spans: count_searches(text, spans),
        "last_open_search": lambda text, spans: last_open_search(text),
    }
    print(
        f"{'shape':<16} {'chars':>9} " + " ".join(f"{name:>17}" for name in readers) + "   (ms, best of "
        f"{args.repeats})"
    )
    worst = 0.0
    for name, (text, spans) in shapes(args.size).items():
        times = [best_ms(partial(read, text, spans), args.repeats) for read in readers.values()]
        worst = max(worst, *times)
        print(f"{name:<16} {len(text):>9} " + " ".join(f"{t:>17.1f}" for t in times))
    print(f"slowest: {worst:.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
