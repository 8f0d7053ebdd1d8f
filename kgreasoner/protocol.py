"""The trajectory protocol: tags, system prompt and parsing. The single source of truth.

Every piece of code that writes or reads these tags imports them from here.

A trajectory (what the model writes, with the tool's blocks inserted)::

    <think> I need Utah's time zone. <search>Utah</search>
    <triples>
    (Utah, time zone, Mountain Time Zone)
    </triples>
    Utah is in the Mountain Time Zone. </think>
    <answer>Mountain Time Zone</answer>

- `build_prompt` writes the paper's prompt (its Appendix C) with the question and topic entities;
  the prompt ends where the assistant starts, so the model's first word is `<think>`. Some chat
  templates (Qwen3-2507 Thinking) open the think block in the prompt itself (`...assistant\n<think>\n`);
  `opened_think` returns that tail, and the rollout engine puts it before the completion's text,
  so what the format check and the parser read is still a whole trajectory.
- `format_tool_block` wraps the tool's text; `parse_trajectory` reads searches, tool blocks,
  answers and thoughts back; `check_format` is the strict checker behind the format reward.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from kgreasoner.records.edges import Edge

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
SEARCH_OPEN, SEARCH_CLOSE = "<search>", "</search>"
TRIPLES_OPEN, TRIPLES_CLOSE = "<triples>", "</triples>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"

TAGS = (THINK_OPEN, THINK_CLOSE, SEARCH_OPEN, SEARCH_CLOSE, TRIPLES_OPEN, TRIPLES_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

BACKTRACK_MARK = "backtrack"
"""`<search>NAME | backtrack</search>` asks the tool to leave NAME for its parent's next candidates."""
RELATIONS_MARK = "relations"
"""`<search>NAME | relations</search>` lists the relations of NAME's unseen triples that no listing has named
yet (a listing that leaves some out ends `and N more relations`); asked again once all were named, it starts over."""
QUERY_SEPARATOR = "|"
RELATION_ESCAPE = "="
"""`<search>NAME | REL</search>` pages through NAME's unseen triples by relation REL, written as the tool's
`more:` listing prints it (`relation_filter_text`). A relation printed as a mark (`backtrack`, `relations`)
or starting with `=` is written `=REL`; one the bare form cannot carry (a bar, a quote, a backslash, a
comma or parenthesis of the listing, spaces at its ends, a line break, a protocol tag) is written quoted,
`="..."`, with `\\\\`, `\\"`, `\\|` and `\\uXXXX` escapes (the last for `<` and line breaks). After the bar
alone a mark always means the mark."""
RELATION_QUOTE = '"'
MARKS = (BACKTRACK_MARK, RELATIONS_MARK)
ANSWER_SEPARATOR = "|"
"""Several answers: `<answer>A | B</answer>`; Hits@1 scores the first."""

HANDLE_PREFIX = "E"
"""Entity handles: `E1`, `E2`, ... assigned per session in order of appearance."""
HANDLE_PATTERN = re.escape(HANDLE_PREFIX) + "[1-9][0-9]*"
"""A handle as a regular expression, for patterns that read handles inside longer text (a triple line)."""

MORE_PREFIX = "more:"
"""Starts the line after a call's triples that lists the relations of the searched entity's unseen triples, each
as a filter writes it (`relation_filter_text`) with how many are left, the likeliest first:
`more: plays_for (23), ="born \\| in" (2) and 3 more relations` (`listing_item`, `more_relations`)."""
LISTING_SEPARATOR = ", "

STOP_TAGS = (SEARCH_CLOSE, ANSWER_CLOSE)
"""Where generation pauses (`</search>`: run the tool) or ends (`</answer>`)."""

TOPIC_SEPARATOR = ", "
"""Joins several topic entity names in the prompt."""

INSTRUCTIONS = (
    "The User asks a question, and the Assistant solves it. The Assistant first thinks about the "
    "reasoning process in the mind and then provides the User with the final answer. The output "
    "format of reasoning process and final answer are enclosed within <think> </think> and "
    '<answer> </answer> tags, respectively, i.e., "<think> reasoning process here </think> '
    '<answer> final answer here </answer>". During the thinking process, the Assistant can '
    "perform searching for uncertain knowledge from a knowledge graph if necessary with the format "
    'of "<search> search query (only one entity) </search>". The entity must be involved in the '
    "searched triples or topic entities. Then, the system will provide the Assistant with helpful "
    'information with the format of "<triples> ...search results... </triples>". If a searched '
    'entity turns out to be a dead end, the Assistant can write "<search> entity | backtrack '
    '</search>" to return to the previous entity and see its next candidate triples. When the '
    'triples end with a line "more: relation (count), ...", the entity has more triples by those '
    'relations, and "<search> entity | relation </search>" shows the next ones by that relation. When the line '
    'ends "and N more relations", "<search> entity | relations </search>" lists the others.'
)
"""The paper's system prompt (Appendix C) plus one sentence for backtracking and two for relation filters."""

TOPIC_MARKER = "Topic Entity:"
"""Introduces the topic entities after the question in the user turn."""

PROMPT_TEMPLATE = INSTRUCTIONS + " User: {question} " + TOPIC_MARKER + " {topics} Assistant:"
"""The whole prompt as plain text, for tokenizers without a chat template (paper's layout)."""

USER_TEMPLATE = "{question} " + TOPIC_MARKER + " {topics}"
"""The user turn when the tokenizer has a chat template; INSTRUCTIONS go in the system turn."""


@runtime_checkable
class NamedTopic(Protocol):
    """A topic entity as an object (`records.schema.TopicEntity`): its name, else its id, is printed."""

    @property
    def id(self) -> str: ...

    @property
    def name(self) -> str: ...


Topic = NamedTopic | Mapping[str, object] | str
"""A topic entity as `topic_names` reads it: an object with `id` and `name`, an `{"id", "name"}` dict, a name."""


def topic_names(topic_entities: Sequence[Topic]) -> list[str]:
    """Names of topic entities given as `TopicEntity`, `{"id", "name"}` dicts or plain strings."""
    names = []
    for topic in topic_entities:
        if isinstance(topic, str):
            names.append(topic)
        elif isinstance(topic, Mapping):
            names.append(str(topic.get("name") or topic.get("id") or ""))
        else:
            names.append(str(topic.name or topic.id))
    return [n for n in names if n]


def build_prompt(
    question: str, topic_entities: Sequence[Topic], tokenizer: PreTrainedTokenizerBase | None = None
) -> str:
    """The prompt text, ending where the assistant's first token (`<think>`) goes.

    With a tokenizer that has a chat template: a system turn with INSTRUCTIONS and a user turn
    with the question and topic entities, rendered with `add_generation_prompt=True`. Otherwise
    (no tokenizer, or no template) the paper's plain layout `... User: Q Topic Entity: T Assistant:`.
    Tokenise the result with `add_special_tokens=False`: the template already wrote any BOS.
    """
    topics = TOPIC_SEPARATOR.join(topic_names(topic_entities))
    if tokenizer is not None and tokenizer.chat_template:
        messages = [
            {"role": "system", "content": INSTRUCTIONS},
            {"role": "user", "content": USER_TEMPLATE.format(question=question, topics=topics)},
        ]
        rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        if not isinstance(rendered, str):
            raise TypeError(f"the chat template rendered {type(rendered).__name__}, not text")
        return rendered
    return PROMPT_TEMPLATE.format(question=question, topics=topics)


def split_user_turn(content: str) -> tuple[str, str] | None:
    """A user turn in `USER_TEMPLATE`'s layout -> (question, topic names as written), both stripped; None
    without the marker or with an empty part. The last marker counts: a question may quote the phrase."""
    question, marker, topics = content.rpartition(TOPIC_MARKER)
    if not marker or not question.strip() or not topics.strip():
        return None
    return question.strip(), topics.strip()


def opened_think(prompt: str) -> str:
    """The tail of `prompt` from a final `<think>` on (`"<think>\\n"`), when the prompt itself opened the
    think block (chat templates of thinking-only models do); else "".

    The model's completion then starts inside the think block, and reads as a trajectory only with
    this tail before it. A prompt whose think block is already closed (Qwen3 with
    `enable_thinking=False` ends in `<think>\\n\\n</think>\\n\\n`) opened nothing.
    """
    body = prompt.rstrip()
    return prompt[len(body) - len(THINK_OPEN) :] if body.endswith(THINK_OPEN) else ""


def format_tool_block(text: str) -> str:
    """The tool's text as it is inserted after `</search>`: `\\n<triples>\\n{text}\\n</triples>\\n`."""
    return f"\n{TRIPLES_OPEN}\n{text}\n{TRIPLES_CLOSE}\n"


def printable(text: str) -> str:
    """`text` as tool text prints it (a label, a literal, a relation): control characters and line or paragraph
    separators escaped, `\\n`, `\\r` and `\\t` as such and the others as `\\uXXXX` (an ANSI escape prints
    `\\u001b`), so that nothing a KB holds can start a line of a tool block (a fake triple, a fake `more:`
    line) or drive a terminal. Other text, backslashes included, is printed as it is."""
    if _UNPRINTABLE.search(text) is None:
        return text
    return _UNPRINTABLE.sub(lambda match: _PRINTED.get(match.group(), f"\\u{ord(match.group()):04x}"), text)


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")
"""Unicode's control characters (category Cc) and its line and paragraph separators (Zl, Zp)."""
_PRINTED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def split_search_query(query: str) -> tuple[str, bool]:
    """`"NAME | backtrack"` -> `("NAME", True)`; `" NAME "` -> `("NAME", False)`.

    A relation filter stays in the name part (`"NAME | REL"` -> `("NAME | REL", False)`): only the
    session knows whether a bar belongs to a shown label or starts a filter (`split_relation_filter`).
    """
    parts = _split_at_last_bar(query)
    if parts is not None and parts[1].strip().lower() == BACKTRACK_MARK:
        return parts[0].strip(), True
    return query.strip(), False


def split_relation_filter(name: str) -> tuple[str, str] | None:
    """`NAME | REL` -> (NAME, REL as written), both stripped; None without a bar or with an empty part.

    The split is at the last bar that is not escaped (`\\|`, which only a quoted relation holds), so a name may
    hold bars and a quoted relation may too. A session reads a search this way only when the whole text
    names no shown entity (a label may hold a bar).
    """
    parts = _split_at_last_bar(name)
    if parts is None or not parts[0].strip() or not parts[1].strip():
        return None
    return parts[0].strip(), parts[1].strip()


def is_relations_request(written: str) -> bool:
    """True when the text after the bar asks for the listing's next relations (`NAME | relations`)."""
    return written.strip().lower() == RELATIONS_MARK


def relation_filter_text(relation: str) -> str:
    """How a filter writes `relation` (as the tool prints it) and the `more:` listing lists it:
    `read_relation_filter` gives `relation` back for every string."""
    if _needs_quotes(relation):
        body = "".join(_QUOTED_ESCAPES.get(c) or _escape_char(c) for c in relation)
        return RELATION_ESCAPE + RELATION_QUOTE + body + RELATION_QUOTE
    if relation.startswith(RELATION_ESCAPE) or relation.lower() in MARKS:
        return RELATION_ESCAPE + relation
    return relation


def read_relation_filter(written: str) -> str:
    """The relation a filter's text (after the bar) names: `="..."` unquoted, `=REL` without its `=`,
    anything else as it is; surrounding spaces dropped. A quote left open or a bad escape is read as it
    stands, so a near miss still matches a relation by its words."""
    text = written.strip()
    if not text.startswith(RELATION_ESCAPE):
        return text
    rest = text[len(RELATION_ESCAPE) :]
    if len(rest) >= 2 and rest.startswith(RELATION_QUOTE) and rest.endswith(RELATION_QUOTE):
        unquoted = _unquote(rest[1:-1])
        if unquoted is not None:
            return unquoted
    return rest.strip()


def _split_at_last_bar(text: str) -> tuple[str, str] | None:
    position = _unescaped(text).rfind(QUERY_SEPARATOR)
    if position < 0:
        return None
    return text[:position], text[position + len(QUERY_SEPARATOR) :]


def _unescaped(text: str) -> str:
    """`text` of the same length with every escaped backslash and escaped bar blanked, so that a bar left in
    it is a bar that splits. A bar is escaped after an odd run of backslashes; pairing a run's backslashes
    from its start (what `str.replace` does, left to right) leaves one before the bar exactly then. Whole-text
    replacements keep this linear: walking back over the backslashes before each bar is not, on `\\|\\|...`."""
    if "\\" not in text:
        return text
    return text.replace("\\\\", "  ").replace("\\" + QUERY_SEPARATOR, "  ")


_QUOTED_ESCAPES = {"\\": "\\\\", RELATION_QUOTE: "\\" + RELATION_QUOTE, QUERY_SEPARATOR: "\\" + QUERY_SEPARATOR}
_BARE_FORBIDDEN = frozenset('|\\",()')


def _needs_quotes(relation: str) -> bool:
    return (
        not relation
        or relation != relation.strip()
        or any(c in _BARE_FORBIDDEN for c in relation)
        or any(_is_line_breaking(c) for c in relation)
        or any(tag in relation for tag in TAGS)
    )


def _is_line_breaking(char: str) -> bool:
    """Control characters and line or paragraph separators: what would break a listing's line."""
    return unicodedata.category(char) in ("Cc", "Zl", "Zp")


def _escape_char(char: str) -> str:
    """`<` (a protocol tag inside a quoted relation must not read as a tag) and line breaks as `\\uXXXX`."""
    return f"\\u{ord(char):04x}" if char == "<" or _is_line_breaking(char) else char


def _unquote(body: str) -> str | None:
    """The text of a quoted relation, or None when an escape is malformed or a quote or bar is bare.

    Whole-text operations only (one pass each), so a body of a million escapes reads in milliseconds: an
    escaped backslash becomes the `\\u005c` escape (pairing each run of backslashes from its start, as
    reading left to right does), after which every backslash left opens an escape of its own."""
    text = body.replace("\\\\", "\\u005c")
    if _BAD_ESCAPE.search(text):
        return None
    if text.count(RELATION_QUOTE) != text.count("\\" + RELATION_QUOTE):
        return None
    if text.count(QUERY_SEPARATOR) != text.count("\\" + QUERY_SEPARATOR):
        return None
    text = text.replace("\\" + RELATION_QUOTE, RELATION_QUOTE).replace("\\" + QUERY_SEPARATOR, QUERY_SEPARATOR)
    if "\\" not in text:
        return text
    # every backslash left opens a `\\uXXXX`, which raw-unicode-escape decodes and nothing else; it writes
    # other characters as themselves or as escapes that it reads back unchanged
    return text.encode("raw_unicode_escape").decode("raw_unicode_escape")


_BAD_ESCAPE = re.compile(r'\\(?![|"]|u[0-9a-fA-F]{4})')


def nth_handle(number: int) -> str:
    """The session's `number`-th handle (from 1): `E1`, `E2`, ..."""
    return f"{HANDLE_PREFIX}{number}"


def is_handle(text: str) -> bool:
    """True when the whole of `text` is a handle (`E12`; not `E0`, `E01` or `e1`)."""
    return _HANDLE.fullmatch(text) is not None


_HANDLE = re.compile(HANDLE_PATTERN)


def listing_item(name: str, count: int) -> str:
    """One relation of a `more:` line: its filter text and how many of its triples are unseen, `name (count)`."""
    return f"{name} ({count})"


def more_relations(count: int) -> str:
    """What ends a listing that leaves `count` relations out: ` and 3 more relations`."""
    return f" and {count} more relation{'' if count == 1 else 's'}"


def parse_listing(line: str) -> list[tuple[str, int]]:
    """The (relation as written, count) pairs of a `more:` line, in order; [] for any other line."""
    if not line.startswith(MORE_PREFIX):
        return []
    return [(match.group(1), int(match.group(2))) for match in _LISTED.finditer(line, len(MORE_PREFIX))]


def _any_but(chars: Iterable[str]) -> str:
    return "[^" + "".join(re.escape(c) for c in sorted(chars)) + "]"


_ESCAPE = "\\"
"""Opens an escape inside a quoted relation (`_QUOTED_ESCAPES`, `\\uXXXX`)."""
_LISTED_NAME = (
    re.escape(RELATION_ESCAPE)
    + "(?:"
    + re.escape(RELATION_QUOTE)
    + f"(?:{_any_but({RELATION_QUOTE, _ESCAPE})}|{re.escape(_ESCAPE)}.)*"
    + re.escape(RELATION_QUOTE)
    + f"|{_any_but(_BARE_FORBIDDEN)}+)"
    + f"|{_any_but(_BARE_FORBIDDEN | {RELATION_ESCAPE})}{_any_but(_BARE_FORBIDDEN)}*"
)
"""A relation as `relation_filter_text` writes it: `="..."` (any character but a bare quote or backslash inside),
`=REL`, or a bare name that starts with no `=`; the bare forms hold none of `_BARE_FORBIDDEN`."""
_LISTED = re.compile(rf"[ ,]\s*({_LISTED_NAME}) \((\d+)\)(?=,|$| and )")
"""An item of a `more:` line after the prefix or a separator: group 1 the name, group 2 its count."""


def split_answers(text: str) -> list[str]:
    """`"A | B"` -> `["A", "B"]`; empty parts are dropped."""
    return [part.strip() for part in text.split(ANSWER_SEPARATOR) if part.strip()]


@dataclass(frozen=True)
class SearchCall:
    """One `<search>` block: the raw text inside the tags, the entity part and the backtrack flag."""

    raw: str
    query: str
    is_backtrack: bool


@dataclass
class ToolResult:
    """What one `<search>` call returns: the text inserted in the tool block, the triples it shows, and what the
    call did. `error` names what went wrong (the search tool's `ERRORS`), None for a page of triples."""

    text: str
    edges: list[Edge]
    error: str | None
    entity: str | None
    backtracked: bool
    more: tuple[tuple[str, int], ...] = ()
    """The listing line's (relation as a filter names it, unseen neighbours) pairs, in its order."""
    relation: str | None = None
    """The relation filter of the call (as written after the bar), if any."""
    unlisted: int = 0
    """Relations of the entity's unseen neighbours that no listing of the session has named yet
    (`NAME | relations` lists them)."""


@dataclass
class ParsedTrajectory:
    """What `parse_trajectory` finds, in order of appearance."""

    searches: list[SearchCall] = field(default_factory=list)
    triples: list[str] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)
    thinks: list[str] = field(default_factory=list)
    answer_text: str | None = None
    """The raw content of the first closed `<answer>` block (None when there is none)."""

    @property
    def first_answer(self) -> str | None:
        return self.answers[0] if self.answers else None


ToolSpans = Sequence[Sequence[int]]
"""Character spans `(start, end)` of the tool-inserted blocks in a completion text, in order."""

_TAG_RE = re.compile("|".join(re.escape(t) for t in sorted(TAGS, key=len, reverse=True)))
TagEvent = tuple[str, int, int, bool]
"""A tag occurrence: (tag, start, end, written by the tool)."""


def tag_events(text: str, tool_spans: ToolSpans | None) -> Iterator[TagEvent]:
    """The tags of `text` in order; with `tool_spans`, each tool block is one opaque triples block.

    Tags never overlap (each holds exactly one `<` and one `>`), so one left-to-right scan finds
    every occurrence of every tag. A tool block yields its own `<triples>` and its last
    `</triples>` and nothing in between: whatever the tool printed (a KG label holding
    `</triples><answer>X</answer>`) is text, not protocol. A model tag cut by a span boundary is
    not a tag.
    """
    if tool_spans is None:
        for match in _TAG_RE.finditer(text):
            yield match.group(), match.start(), match.end(), False
        return
    position = 0
    for span_start, span_end in sorted((int(s), int(e)) for s, e in tool_spans):
        span_start, span_end = max(span_start, position), min(span_end, len(text))
        if span_start >= span_end:
            continue
        for match in _TAG_RE.finditer(text, position, span_start):
            yield match.group(), match.start(), match.end(), False
        opening = text.find(TRIPLES_OPEN, span_start, span_end)
        open_end = span_start if opening < 0 else opening + len(TRIPLES_OPEN)
        closing = text.rfind(TRIPLES_CLOSE, open_end, span_end)
        yield TRIPLES_OPEN, span_start if opening < 0 else opening, open_end, True
        yield (
            TRIPLES_CLOSE,
            span_end if closing < 0 else closing,
            span_end if closing < 0 else closing + len(TRIPLES_CLOSE),
            True,
        )
        position = span_end
    for match in _TAG_RE.finditer(text, position):
        yield match.group(), match.start(), match.end(), False


def parse_trajectory(text: str, tool_spans: ToolSpans | None = None) -> ParsedTrajectory:
    """Searches (in order, with backtracks), tool blocks, answers of the first answer block, thoughts.

    Lenient: it reads whatever closed blocks exist; `check_format` judges the layout. A search
    block's text stops at the first `</search>`, so a nested `<search>` stays inside the raw text;
    a think block without `</think>` runs to the end. One pass over the tags: linear in the text.

    `tool_spans` (the rollout engine's `Trajectory.tool_spans`): searches, answers and thoughts are
    read from model-written text only, `triples` are the tool blocks, and an `<answer>` still open
    when a tool block starts is dropped (its text would hold tool output). Without it every tag
    counts, except that an answer is read only outside every tool block, closed or not
    (`model_tail`): the model answers after every block, and whatever a KG label printed
    (`</triples><answer>X`) is inside one.
    """
    parsed = ParsedTrajectory()
    spans_known = tool_spans is not None
    answers_from, answers_until = (0, len(text)) if spans_known else model_tail(text)
    search_at = triples_at = answer_at = think_at = None
    for tag, start, end, by_tool in tag_events(text, tool_spans):
        if tag == SEARCH_OPEN:
            if search_at is None:
                search_at = end
        elif tag == SEARCH_CLOSE:
            if search_at is not None:
                query, backtrack = split_search_query(text[search_at:start])
                parsed.searches.append(SearchCall(raw=text[search_at:start], query=query, is_backtrack=backtrack))
                search_at = None
        elif tag == TRIPLES_OPEN:
            if by_tool:
                search_at = answer_at = None
                triples_at = end
            elif not spans_known and triples_at is None:
                triples_at = end
        elif tag == TRIPLES_CLOSE:
            if triples_at is not None and by_tool == spans_known:
                parsed.triples.append(text[triples_at:start].strip("\n"))
                triples_at = None
        elif tag == ANSWER_OPEN:
            if answer_at is None and parsed.answer_text is None and answers_from <= start and end <= answers_until:
                answer_at = end
        elif tag == ANSWER_CLOSE:
            if answer_at is not None and end <= answers_until:
                parsed.answer_text = text[answer_at:start]
                parsed.answers = split_answers(parsed.answer_text)
                answer_at = None
        elif tag == THINK_OPEN:
            if think_at is None:
                think_at = end
        elif tag == THINK_CLOSE and think_at is not None:
            parsed.thinks.append(text[think_at:start])
            think_at = None
    if think_at is not None:
        parsed.thinks.append(text[think_at:])
    return parsed


def model_tail(text: str) -> tuple[int, int]:
    """`[start, end)` of the text after the last tool block, where a trajectory read without tool spans
    has its answer; empty when the text ends inside a tool block.

    A block ends where the tool closes it, `</triples>` on a line of its own (`format_tool_block`). Tool
    text does not write that line: labels are printable (no line breaks) and the tool prints each beside
    its own words (`(`, `has no neighbours`, ...), so a `</triples>` a label printed shares its line. A
    `<triples>` after the last such close opens a block the text ends in (cut before its close, as a
    length limit cuts a rollout): nothing after it is the model's answer.
    """
    position, start = len(text), 0
    while (at := text.rfind(TRIPLES_CLOSE, 0, position)) >= 0:
        end = at + len(TRIPLES_CLOSE)
        if text[at - 1 : at] == "\n" and text[end : end + 1] in ("\n", ""):
            start = end
            break
        position = at
    opening = text.find(TRIPLES_OPEN, start)
    return start, len(text) if opening < 0 else opening


def last_open_search(turn_text: str) -> str | None:
    """The query of a turn that stopped at `</search>`: the text after the last `<search>` before
    the turn's last `</search>` (characters the stop token carried past the tag are not part of it).

    None when there is no `<search>` before that closing tag (a malformed call).
    """
    close = turn_text.rfind(SEARCH_CLOSE)
    body = turn_text if close < 0 else turn_text[:close]
    start = body.rfind(SEARCH_OPEN)
    if start < 0:
        return None
    return body[start + len(SEARCH_OPEN) :]


@dataclass(frozen=True)
class FormatReport:
    """`valid` is True when `errors` is empty; each error is one short sentence."""

    valid: bool
    errors: list[str]


def check_format(text: str, tool_spans: ToolSpans | None = None) -> FormatReport:
    """The strict layout check behind the format reward.

    Valid means: `<think>` first (only whitespace before it); one think block; every `<search>`
    inside the think block, non-empty, closed, and followed (after whitespace) by exactly one
    `<triples>` block; no `<triples>` block without a search; `</think>` before `<answer>`; exactly
    one non-empty answer block after `</think>`, separated from it by whitespace only; nothing but
    whitespace after `</answer>`. Plain text is allowed inside think and triples blocks only.

    With `tool_spans` the tool blocks are opaque (tags the tool printed are text) and the block
    after a `</search>` must be one the tool inserted, not one the model wrote.
    """
    errors: list[str] = []
    state = "start"
    position = 0
    search_start = 0
    spans_known = tool_spans is not None
    for tag, start, end, by_tool in tag_events(text, tool_spans):
        between = text[position:start]
        position = end
        if state == "start":
            if between.strip():
                errors.append("text before <think>")
            if tag != THINK_OPEN:
                errors.append(f"the trajectory must start with {THINK_OPEN}, found {tag}")
                return FormatReport(False, errors)
            state = "think"
        elif state == "think":
            if tag == SEARCH_OPEN:
                state, search_start = "search", end
            elif tag == THINK_CLOSE:
                state = "after_think"
            elif tag == TRIPLES_OPEN:
                errors.append(f"{TRIPLES_OPEN} block without a preceding search")
                state = "triples"
            elif tag == ANSWER_OPEN:
                errors.append(f"{ANSWER_OPEN} before {THINK_CLOSE}")
                state = "answer"
            else:
                errors.append(f"unexpected {tag} inside the think block")
        elif state == "search":
            if tag != SEARCH_CLOSE:
                errors.append(f"unclosed {SEARCH_OPEN}: found {tag} before {SEARCH_CLOSE}")
                return FormatReport(False, errors)
            if not split_search_query(text[search_start:start])[0]:
                errors.append(f"empty {SEARCH_OPEN}")
            state = "after_search"
        elif state == "after_search":
            if between.strip() or tag != TRIPLES_OPEN or by_tool != spans_known:
                errors.append(f"{SEARCH_CLOSE} not followed by a {TRIPLES_OPEN} block")
                return FormatReport(False, errors)
            state = "triples"
        elif state == "triples":
            if tag != TRIPLES_CLOSE:
                errors.append(f"unclosed {TRIPLES_OPEN}: found {tag} before {TRIPLES_CLOSE}")
                return FormatReport(False, errors)
            state = "think"
        elif state == "after_think":
            if tag == ANSWER_OPEN:
                if between.strip():
                    errors.append(f"text between {THINK_CLOSE} and {ANSWER_OPEN}")
                state = "answer"
            elif tag == SEARCH_OPEN:
                errors.append(f"{SEARCH_OPEN} after {THINK_CLOSE}")
                return FormatReport(False, errors)
            else:
                errors.append(f"unexpected {tag} after {THINK_CLOSE}")
                return FormatReport(False, errors)
        elif state == "answer":
            if tag != ANSWER_CLOSE:
                errors.append(f"unclosed {ANSWER_OPEN}: found {tag} before {ANSWER_CLOSE}")
                return FormatReport(False, errors)
            if not split_answers(between):
                errors.append(f"empty {ANSWER_OPEN}")
            state = "done"
        elif state == "done":
            errors.append(f"{tag} after {ANSWER_CLOSE}")
            return FormatReport(False, errors)
    rest = text[position:]
    ending = {
        "start": f"no {THINK_OPEN}",
        "think": f"unclosed {THINK_OPEN}",
        "search": f"unclosed {SEARCH_OPEN}",
        "after_search": f"{SEARCH_CLOSE} not followed by a {TRIPLES_OPEN} block",
        "triples": f"unclosed {TRIPLES_OPEN}",
        "after_think": f"no {ANSWER_OPEN} block",
        "answer": f"unclosed {ANSWER_OPEN}",
    }
    if state in ending:
        errors.append(ending[state])
    elif rest.strip():
        errors.append(f"text after {ANSWER_CLOSE}")
    return FormatReport(not errors, errors)
