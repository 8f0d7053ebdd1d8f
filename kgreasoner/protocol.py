"""The trajectory protocol: tags, system prompt and parsing. The single source of truth.

Every piece of code that writes or reads these tags imports them from here.
"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
TRIPLES_OPEN, TRIPLES_CLOSE = "<triples>", "</triples>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

TAGS = (THINK_OPEN, THINK_CLOSE, SEARCH_OPEN, SEARCH_CLOSE, TRIPLES_OPEN, TRIPLES_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

BACKTRACK_MARK = "backtrack"
"""`<search>NAME | backtrack</search>` asks the tool to leave NAME for its parent's next candidates."""
QUERY_SEPARATOR = "|"
ANSWER_SEPARATOR = "|"
"""Several answers: `<answer>A | B</answer>`; Hits@1 scores the first."""

HANDLE_PREFIX = "E"
"""Entity handles (DESIGN.md): `E1`, `E2`, ... assigned per session in order of appearance."""
