"""Constrained decoding: after `<search>` or `<answer>`, only entities shown so far may follow.

When a row's own tokens end with the
token ids of `<search>` or `<answer>`, the row enters a constrained span: the next tokens must
spell one of the allowed entity strings, followed by the closing tag (`<search>` also allows
`NAME | backtrack`, `NAME | relations`, and `NAME | REL` for every relation REL a `more:` line of the
row's tool output has listed, `listed_relations`). Allowed strings are the topic entity names plus every
handle and label the session has shown (`SearchSession.shown_entities()`), read at the moment the
span starts.

Each allowed string is tokenised alone, with and without a leading space, and the closing tag
alone (its ids decode to the tag, so the engine's stop fires on them); the continuations form a
trie over token ids, and
`allowed()` lists the ids that keep the span inside the trie. Only one entity fits in a
constrained answer (Hits@1 scores the first anyway). The rollout engine applies the mask to the
logits before temperature, so sampled tokens and their logprobs come from the constrained
distribution.

Quotes (`constrained_quotes`, experimental, on top of the above): inside the thinking, a `(` token opens a quote
of a triple line, which must go on as one line the tool has shown in this row, verbatim, up to its
`)`. The model still chooses the line (its head and relation); the decoder then copies the rest,
tail entity included, so a wrong copy becomes impossible (a model that writes the followed line,
as `configs/tiny-cpu/templates-line.yaml` trains it to, has its lookup done by the decoder: report
it as such). Only a `(` the tokenizer spells alone opens a quote. Experimental: it exists for the
line-template study of `docs/cpu-training.md` and no shipped recipe turns it on.

`turn_regex` states the same constraints as one pattern per turn, for backends that take a
structured-output regex per request (vLLM): a turn ends at its one `</search>` or `</answer>`, and
only a tool call shows new entities or lines, so what is allowed cannot change within a turn.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kgreasoner.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    MARKS,
    QUERY_SEPARATOR,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    parse_listing,
)

_END = -1
"""Trie key marking that a complete continuation ends at this node."""

Trie = dict[int, "Trie"]
"""Token id -> the continuations after it; the key `_END` marks where a complete continuation ends."""

_FOLLOWING_PUNCTUATION = (".", ",", ";", ":", "?", "!")

QUOTE_OPEN, QUOTE_CLOSE = "(", ")"
"""How a tool block prints a triple line (`retrieval.tool.triple_line`), and so how a quote of one reads."""


def quoted_lines(tool_texts: Sequence[str]) -> list[str]:
    """The triple lines of tool outputs, without their parentheses: what a quote may spell."""
    return [
        line[len(QUOTE_OPEN) : -len(QUOTE_CLOSE)]
        for text in tool_texts
        for line in text.split("\n")
        if line.startswith(QUOTE_OPEN) and line.endswith(QUOTE_CLOSE) and len(line) > 2
    ]


def listed_relations(tool_texts: Sequence[str]) -> list[str]:
    """The relations the `more:` lines of tool outputs list (`more: plays_for (23), citizen_of (12)`), as a
    filter writes them, in order, once."""
    found: dict[str, None] = {}
    for text in tool_texts:
        for line in text.split("\n"):
            found.update(dict.fromkeys(name for name, _ in parse_listing(line)))
    return list(found)


class ConstraintVocabulary:
    """Token-id spellings of tags and entity names for one tokenizer, cached across rows."""

    def __init__(self, encode: Callable[[str], list[int]]) -> None:
        self._encode = encode
        self._cache: dict[str, tuple[int, ...]] = {}
        self.openers = {SEARCH_OPEN: self.variants(SEARCH_OPEN), ANSWER_OPEN: self.variants(ANSWER_OPEN)}
        self.search_tails = [self.ids(SEARCH_CLOSE)] + [
            self.ids(f" {QUERY_SEPARATOR} {mark}") + self.ids(SEARCH_CLOSE) for mark in MARKS
        ]
        self.answer_tails = [self.ids(ANSWER_CLOSE)]
        self.quote_openers = self.variants(QUOTE_OPEN)
        self.quote_tails = self.fused(QUOTE_CLOSE)

    def ids(self, text: str) -> tuple[int, ...]:
        if text not in self._cache:
            self._cache[text] = tuple(self._encode(text))
        return self._cache[text]

    def variants(self, text: str) -> list[tuple[int, ...]]:
        """`text` and `" " + text` tokenised alone, without duplicates or empties."""
        out = []
        for spelled in (self.ids(text), self.ids(" " + text)):
            if spelled and spelled not in out:
                out.append(spelled)
        return out

    def fused(self, text: str) -> list[tuple[int, ...]]:
        """`text` tokenised alone, plus each single token that fuses it with the punctuation after it.

        A word-level tokenizer spells `).` as one token; a quote forced to end with `)` alone would
        leave the model, which only ever wrote `).`, to write a second parenthesis.
        """
        out = [self.ids(text)]
        for spelled in (self.ids(text + mark) for mark in _FOLLOWING_PUNCTUATION):
            if len(spelled) == 1 and spelled not in out:
                out.append(spelled)
        return out

    def trie(self, names: Sequence[str], tails: Sequence[tuple[int, ...]]) -> Trie:
        root: Trie = {}
        for name in dict.fromkeys(n for n in names if n.strip()):
            for spelled in self.variants(name):
                for tail in tails:
                    node = root
                    for token in spelled + tail:
                        node = node.setdefault(token, {})
                    node[_END] = {}
        return root


class RowConstraint:
    """The constrained-span state of one row."""

    def __init__(
        self,
        vocabulary: ConstraintVocabulary,
        allowed_names: Callable[[], list[str]],
        allowed_lines: Callable[[], list[str]] | None = None,
        allowed_relations: Callable[[], list[str]] | None = None,
    ) -> None:
        self.vocabulary = vocabulary
        self.allowed_names = allowed_names
        self.allowed_lines = allowed_lines
        """Shown triple lines (`quoted_lines`) when quotes are constrained, else None."""
        self.allowed_relations = allowed_relations or (lambda: [])
        """Relations the row's `more:` lines listed (`listed_relations`): what a search's filter may name."""
        self.node: Trie | None = None

    @property
    def active(self) -> bool:
        return self.node is not None

    def allowed(self) -> list[int] | None:
        """Token ids allowed next, or None outside a constrained span."""
        if self.node is None:
            return None
        return [token for token in self.node if token != _END]

    def observe(self, turn_ids: Sequence[int]) -> None:
        """Advance with the last token the row wrote (`turn_ids[-1]`); open a span after a tag."""
        if self.node is not None:
            self.node = self.node.get(turn_ids[-1])
            if self.node is not None and len(self.node) == 1 and _END in self.node:
                self.node = None
            return
        search_tails = self.vocabulary.search_tails + [
            self.vocabulary.ids(f" {QUERY_SEPARATOR} {relation}") + self.vocabulary.ids(SEARCH_CLOSE)
            for relation in self.allowed_relations()
        ]
        spans = [
            (self.vocabulary.openers[SEARCH_OPEN], self.allowed_names, search_tails),
            (self.vocabulary.openers[ANSWER_OPEN], self.allowed_names, self.vocabulary.answer_tails),
        ]
        if self.allowed_lines is not None:
            spans.append((self.vocabulary.quote_openers, self.allowed_lines, self.vocabulary.quote_tails))
        for openers, allowed, tails in spans:
            for opener in openers:
                if len(turn_ids) >= len(opener) and tuple(turn_ids[-len(opener) :]) == opener:
                    self.node = self.vocabulary.trie(allowed(), tails) or None
                    return


_REGEX_SPECIAL = frozenset("\\.^$*+?()[]{}|")


def _literal(text: str) -> str:
    """`text` as a regex matching itself, escaping only the metacharacters every engine knows.

    `re.escape` also escapes spaces and other characters; structured-output engines (xgrammar,
    guidance) follow ECMAScript-like syntax, where such identity escapes are not all accepted.
    """
    return "".join(f"\\{c}" if c in _REGEX_SPECIAL else c for c in text)


def turn_regex(names: Sequence[str], lines: Sequence[str] | None = None, relations: Sequence[str] = ()) -> str:
    """One turn under constrained decoding, as a regex: free thinking (no `<` but the think tags), then
    optionally `<search>` or `<answer>` holding exactly one of `names` (a leading space allowed, as the
    token-level trie allows it; a search may add `| backtrack`, `| relations`, or `| REL` for one of `relations`) and
    its closing tag. With `lines`
    (constrained quotes, once a line has been shown), a `(` in the thinking must open one of them.

    The optional ending keeps EOS and the length cap where the token-level constraint leaves them: it
    constrains only what follows an opening tag. Plain groups, no `(?:`, for the same portability.
    """
    entity = "|".join(_literal(name) for name in dict.fromkeys(n for n in names if n.strip()))
    quotes = "|".join(_literal(line) for line in dict.fromkeys(lines or ()))
    if quotes:
        quote = f"{_literal(QUOTE_OPEN)} ?({quotes}){_literal(QUOTE_CLOSE)}"
        free = f"([^<{_literal(QUOTE_OPEN)}]|{_literal(THINK_OPEN)}|{_literal(THINK_CLOSE)}|{quote})*"
    else:
        free = f"([^<]|{_literal(THINK_OPEN)}|{_literal(THINK_CLOSE)})*"
    if not entity:  # nothing may be searched or answered yet: thinking only
        return free
    suffixes = "|".join(_literal(f" {QUERY_SEPARATOR} {tail}") for tail in dict.fromkeys([*MARKS, *relations]))
    search = f"{_literal(SEARCH_OPEN)} ?({entity})({suffixes})?{_literal(SEARCH_CLOSE)}"
    answer = f"{_literal(ANSWER_OPEN)} ?({entity}){_literal(ANSWER_CLOSE)}"
    return f"{free}({search}|{answer})?"
