"""The KG search tool the model calls from inside its thinking, one session per question.

`<search>NAME</search>` shows NAME's best `top_k` neighbours whose triples this session has not shown yet, ranked for
the question; `<search>NAME | backtrack</search>` leaves NAME as a dead end and shows the
next-best unseen neighbours of its parent on the explored path, climbing further up while a
parent has none left (paper, Section 4.2.3). Names resolve only among the topic entities and the
entities this session has shown.

No relation hides behind a hub: when the searched entity keeps unseen neighbours after a call,
one line after the triples lists their relations with how many are left, in ranked order
(`more: plays_for (23), citizen_of (12)`), and `<search>NAME | REL</search>` shows only NAME's
unseen neighbours by relation REL (as the triple lines and that listing print it, or its id),
ranked as usual, `top_k` at a time: calling it again gives the next page. A neighbour counts by
the relation of the edge that leaves NAME (a mediator's first edge), in either direction. After
the bar, `backtrack` always means backtracking; a relation printed `backtrack` is listed and
filtered as `=backtrack` (`NAME | =REL` always filters). A query that is itself a shown name
(a label holding ` | `) is a plain search of that name. With `entity_handles`, each entity gets a session-local handle
(`E1`, `E2`, ... in order of appearance, topic entities first) printed before its label; handles
and names are both accepted. Every problem comes back as a `ToolResult` whose `text` is a short
sentence and whose `error` names the case; `SearchSession.call` never raises.
"""

from __future__ import annotations

import difflib
import re
from collections import Counter
from dataclasses import dataclass, field

from kgreasoner.data.normalize import normalize_answer
from kgreasoner.data.schema import TopicEntity
from kgreasoner.kg.base import INVERSE_PREFIX, Edge, KGError, KnowledgeGraph
from kgreasoner.protocol import ANSWER_SEPARATOR, BACKTRACK_MARK, HANDLE_PREFIX, QUERY_SEPARATOR, RELATION_ESCAPE
from kgreasoner.retrieval.candidates import Candidate, RankedCandidates
from kgreasoner.retrieval.encoder import EncoderConfig, TextEncoder, build_encoder
from kgreasoner.retrieval.ranker import GATRanker, load_ranker
from kgreasoner.retrieval.ranking import RANKING_METHODS, CandidateScorer, Timings

ERRORS = ("unknown_entity", "unknown_relation", "empty_query", "no_neighbors", "exhausted", "backtrack_at_root", "kg_error")
MORE_PREFIX = "more:"
"""Starts the line after a call's triples that lists the relations of the entity's unseen neighbours."""
RELATION_FORMATS = ("id", "words")
_NAMESPACE_SEPARATOR = re.compile(r"\.|__")


def relation_display(relation: str, relation_format: str = "id") -> str:
    """A relation as a triple line prints it: its id, or (`words`) its namespace parts as words.

    `words` keeps a URI's last path or fragment part, splits at the separators KG ids put between
    namespace parts (`.` and `__`) and keeps single underscores: `film.film.rating` prints
    `film film rating`, PathQuestion's `__common__topic__notable_types` prints
    `common topic notable_types`. A question that names the relation by its last part
    (`notable_types`) then shares that word's token with the line, so a model can match the
    line by copying rather than by a mapping it learned per relation id.
    """
    if relation_format == "id":
        return relation
    if relation_format != "words":
        raise ValueError(f"relation_format must be one of {RELATION_FORMATS}, got {relation_format!r}")
    text = relation.strip("<>")
    if "/" in text or "#" in text:
        text = re.split(r"[/#]", text.rstrip("/#"))[-1]
    return " ".join(part for part in _NAMESPACE_SEPARATOR.split(text) if part) or relation


def triple_line(subject: str, relation: str, obj: str, relation_format: str = "id") -> str:
    """One line of a tool block: `(subject, relation, object)`, the ends as the session displays them."""
    return f"({subject}, {relation_display(relation, relation_format)}, {obj})"


def relation_key(relation: str, relation_format: str = "id") -> str:
    """How a thought names a relation (a plan, a hop): the last word its triple line prints.

    With `id` that is the id itself; with `words` the last namespace part, the word a question uses.
    A path relation walked backwards (`^rel`) keeps its `^` before the key.
    """
    inverse = relation.startswith(INVERSE_PREFIX)
    bare = relation[len(INVERSE_PREFIX):] if inverse else relation
    return (INVERSE_PREFIX if inverse else "") + relation_display(bare, relation_format).split(" ")[-1]


def relation_filter_name(relation: str, relation_format: str = "id") -> str:
    """A relation as the `more:` listing prints it and `NAME | REL` names it: as its triple lines print
    it, escaped (`=backtrack`) where it reads as the backtrack mark."""
    name = relation_display(relation, relation_format)
    return RELATION_ESCAPE + name if name.strip().lower() == BACKTRACK_MARK else name


@dataclass
class ToolConfig:
    """How the search tool ranks, caps and prints what it shows."""

    top_k: int = field(default=10, metadata={"help": "candidates shown per call (a mediator candidate prints 2 lines)"})
    max_chars: int = field(default=2000, metadata={"help": "cap on the text of one call; the first candidate is always shown"})
    ranking: str = field(default="none", metadata={"help": "gat (trained ranker), embedding (cosine of question and triple text) or none (KG order)"})
    ranker_path: str | None = field(default=None, metadata={"help": "folder of a trained ranker (model.safetensors + ranker.json); needed by ranking=gat unless a ranker is passed"})
    encoder: EncoderConfig = field(default_factory=EncoderConfig, metadata={"help": "text encoder for gat/embedding (a saved ranker's own encoder kind wins)"})
    entity_handles: bool = field(default=False, metadata={"help": "print session-local handles (E1, E2, ...) before labels and accept them in search and answers"})
    expand_mediators: bool = field(default=True, metadata={"help": "show what lies beyond unnamed (CVT-like) neighbours instead of the bare mediator"})
    neighbor_limit: int | None = field(default=10000, metadata={"help": "edges fetched per node (bounds the work at hubs); None: all"})
    max_context: int = field(default=16, metadata={"help": "context edges per candidate given to the gat ranker"})
    relation_first: int | None = field(default=256, metadata={"help": "entities with more edges than this are ranked relation first: their relations are scored by closeness to the question, only the first rerank_pool edges of the best ones are ranked by the ranker, the rest follow relation by relation (so a hub costs what a small entity does; see CandidateScorer); None: every entity exact"})
    rerank_pool: int | None = field(default=64, metadata={"help": "at hubs, only the N candidates whose relation is closest to the question are scored by gat/embedding; None: all"})
    fuzzy_cutoff: float = field(default=0.8, metadata={"help": "difflib similarity needed to accept a misspelt name (0-1)"})
    suggestions: int = field(default=5, metadata={"help": "close names listed when a name is unknown"})
    relation_format: str = field(default="id", metadata={"help": "how triple lines print relations: `id` as stored, or `words` (namespace parts as words: `__common__topic__notable_types` -> `common topic notable_types`, so the question's word for a relation is a token of its line)"})

    def __post_init__(self) -> None:
        if self.relation_format not in RELATION_FORMATS:
            raise ValueError(f"relation_format must be one of {RELATION_FORMATS}, got {self.relation_format!r}")
        if self.ranking not in RANKING_METHODS:
            raise ValueError(f"ranking must be one of {RANKING_METHODS}, got {self.ranking!r}")
        if self.top_k < 1 or self.max_chars < 1 or self.max_context < 0 or self.suggestions < 1:
            raise ValueError("top_k, max_chars and suggestions must be >= 1; max_context >= 0")
        if not 0.0 < self.fuzzy_cutoff <= 1.0:
            raise ValueError(f"fuzzy_cutoff must be in (0, 1], got {self.fuzzy_cutoff}")
        if self.neighbor_limit is not None and self.neighbor_limit < 1:
            raise ValueError("neighbor_limit must be >= 1 or None")
        if self.rerank_pool is not None and self.rerank_pool < 1:
            raise ValueError("rerank_pool must be >= 1 or None")


@dataclass
class ToolResult:
    """What one `<search>` call returns."""

    text: str
    edges: list[Edge]
    error: str | None
    entity: str | None
    backtracked: bool
    more: tuple[tuple[str, int], ...] = ()
    """The listing line's (relation as a filter names it, unseen neighbours) pairs, in its order."""
    relation: str | None = None
    """The relation filter of the call (as written after the bar), if any."""


class KGSearchTool:
    """Search sessions over one KG with one ranking backend (shared by all sessions)."""

    def __init__(self, kg: KnowledgeGraph, config: ToolConfig, ranker: GATRanker | None = None,
                 encoder: TextEncoder | None = None) -> None:
        self.kg = kg
        self.config = config
        if config.ranking == "gat" and ranker is None:
            if not config.ranker_path:
                raise ValueError("ToolConfig.ranking='gat' needs ranker_path (or pass ranker=)")
            ranker, meta = load_ranker(config.ranker_path)
            if encoder is None and isinstance(meta.get("encoder"), dict):
                encoder = build_encoder(EncoderConfig(**{**meta["encoder"], "cache_dir": config.encoder.cache_dir}))
        if config.ranking != "none" and encoder is None:
            encoder = build_encoder(config.encoder)
        if config.ranking == "gat" and encoder is not None and ranker is not None and encoder.dim != ranker.config.dim:
            raise ValueError(f"the ranker expects {ranker.config.dim}-d embeddings but the encoder gives {encoder.dim}-d")
        self.scorer = CandidateScorer(
            method=config.ranking, kg=kg, encoder=encoder if config.ranking != "none" else None,
            model=ranker if config.ranking == "gat" else None,
            max_context=config.max_context, rerank_pool=config.rerank_pool, relation_first=config.relation_first,
        )

    @property
    def timings(self) -> Timings:
        """Seconds in KG fetches, encoding and ranking, summed over every session's calls."""
        return self.scorer.timings

    def session(self, question: str, topic_entities: list[TopicEntity], example_id: str | None = None) -> "SearchSession":
        """A fresh session for one question; `example_id` picks the question's own graph in a
        per-question KG (`subgraph`), and is not needed with any other."""
        return SearchSession(self, question, topic_entities, example_id)


@dataclass
class _Node:
    """An entity on the explored tree: its ranked candidates and how many were shown."""

    entity: str
    parent: str | None
    ranked: RankedCandidates | None = None
    shown: int = 0


class SearchSession:
    """One question's searches: shown entities, handles and the explored-path tree."""

    def __init__(self, tool: KGSearchTool, question: str, topic_entities: list[TopicEntity],
                 example_id: str | None = None) -> None:
        self.question = question
        self.num_calls = 0
        self.num_backtracks = 0
        self._tool = tool
        self._kg = tool.kg.for_example(example_id)
        self._config = tool.config
        self._labels: dict[str, str] = {}  # id -> label, in order of appearance
        self._handles: dict[str, str] = {}
        self._by_handle: dict[str, str] = {}
        self._parent: dict[str, str | None] = {}
        self._nodes: dict[str, _Node] = {}
        self._topics: list[str] = []
        self._shown_edges: set[tuple[str, str, str]] = set()
        for topic in topic_entities:
            self._register(topic.id, topic.name or self._kg.label(topic.id), parent=None)
            self._topics.append(topic.id)

    # --- the contract ---------------------------------------------------------------------------
    def call(self, query: str) -> ToolResult:
        """Run the text written inside `<search>` tags; errors come back as results, never raised."""
        self.num_calls += 1
        name, backtrack = parse_query(query)
        if not name:
            return _error("empty_query", "Empty search: write a topic entity or an entity shown above "
                          f"between the search tags (or `NAME {QUERY_SEPARATOR} {BACKTRACK_MARK}`).", backtracked=backtrack)
        relation = entity = None
        parts = None if backtrack else split_relation_filter(name)
        # a bar is a filter unless the whole text is a shown label (labels may hold one); a handle
        # names only its own word, so `E1 | rel` is E1's filtered page, not a search of E1
        if parts is not None and self._resolve(name, fuzzy=False, by_handle=False) is None:
            entity = self._resolve(parts[0], fuzzy=True)
            relation = parts[1] if entity is not None else None
        if entity is None:
            entity = self._resolve(name, fuzzy=False) or self._resolve(name, fuzzy=True)
        if entity is None:
            return _error("unknown_entity", self._unknown_text(name), backtracked=backtrack)
        try:
            if backtrack:
                self.num_backtracks += 1
                return self._backtrack(entity)
            if relation is not None:
                return self._filtered(entity, relation)
            return self._search(entity)
        except (KGError, ValueError) as err:  # ValueError: an id this backend cannot express (a SPARQL dialect's)
            return _error("kg_error", f"The knowledge graph could not be queried: {err}", entity, backtrack)

    def resolve_answer(self, text: str) -> list[str]:
        """Answer text (`A | B`, names or handles) as labels; text that names no shown entity is kept as is."""
        answers = []
        for part in text.split(ANSWER_SEPARATOR):
            part = part.strip()
            if part:
                entity = self._resolve(part, fuzzy=False)
                answers.append(self._labels[entity] if entity is not None else part)
        return answers

    def shown_entities(self) -> list[tuple[str, str]]:
        """(handle or "", label) of every entity shown so far (topic entities first), in order."""
        return [(self._handles.get(e, ""), label) for e, label in self._labels.items()]

    def handle_of(self, entity: str) -> str:
        """The entity's handle in this session ("" when handles are off or it was never shown)."""
        return self._handles.get(entity, "")

    # --- searching ------------------------------------------------------------------------------
    def _search(self, entity: str) -> ToolResult:
        node = self._node(entity)
        first = node.ranked is None
        ranked = self._ranked(node)
        label = self._display(entity)
        if self._has_unseen(node):
            return self._show(node, backtracked=False)
        again = f"Search another entity or write `{label} {QUERY_SEPARATOR} {BACKTRACK_MARK}`."
        if not ranked:
            return _error("no_neighbors", f"{label} has no neighbours in the knowledge graph. {again}", entity)
        if first:
            return _error("no_neighbors", f"{label} has no neighbours besides the triples already shown. {again}", entity)
        return _error("exhausted", f"All {len(ranked)} neighbours of {label} have been shown. {again}", entity)

    def _filtered(self, entity: str, written: str) -> ToolResult:
        """A page of the entity's unseen neighbours by the relation `written` names."""
        node = self._node(entity)
        ranked = self._ranked(node)
        label = self._display(entity)
        wanted = written[len(RELATION_ESCAPE):].strip() if written.startswith(RELATION_ESCAPE) else written
        relations = {c.edges[0].relation for c in ranked if _names_relation(wanted, c.edges[0].relation, self._config.relation_format)}
        if not relations:
            known = Counter(self._filter_name(c) for c in ranked)
            listed = ", ".join(f"{r} ({n})" for r, n in known.items())
            its = f"Its relations: {listed}." if listed else f"{label} has no neighbours in the knowledge graph."
            return _error("unknown_relation", f"{label} has no relation \"{wanted}\". {its}", entity)
        if self._has_unseen(node, relations):
            return self._show(node, backtracked=False, relations=relations, written=written)
        total = sum(1 for c in ranked if c.edges[0].relation in relations)
        return _error("exhausted", f"All {total} neighbours of {label} by {wanted} have been shown. Search another "
                      f"entity, another relation of {label}, or write `{label} {QUERY_SEPARATOR} {BACKTRACK_MARK}`.", entity)

    def _backtrack(self, entity: str) -> ToolResult:
        label = self._display(entity)
        current = self._parent.get(entity)
        if current is None:
            return _error("backtrack_at_root", f"{label} is a topic entity: there is nothing to backtrack to. "
                          "Search one of the entities shown so far.", entity, True)
        while current is not None:
            node = self._node(current)
            self._ranked(node)
            if self._has_unseen(node):
                return self._show(node, backtracked=True)
            current = node.parent
        return _error("backtrack_at_root", f"Nothing left to backtrack to: every neighbour on the path from {label} "
                      "back to the topic entity has been shown. Search another entity shown above, or answer.", entity, True)

    def _node(self, entity: str) -> _Node:
        if entity not in self._nodes:
            self._nodes[entity] = _Node(entity, self._parent.get(entity))
        return self._nodes[entity]

    def _ranked(self, node: _Node) -> RankedCandidates:
        if node.ranked is None:
            node.ranked = self._tool.scorer.rank(self.question, node.entity, self._kg, self._config.expand_mediators,
                                                 self._config.neighbor_limit)
        return node.ranked

    def _has_unseen(self, node: _Node, relations: set[str] | None = None) -> bool:
        """Moves the node's cursor past candidates whose triples were all shown already; True when an
        unseen candidate (by one of `relations`, when given) is left."""
        assert node.ranked is not None
        while node.ranked.has(node.shown) and self._seen(node.ranked[node.shown]):
            node.shown += 1
        if relations is None:
            return node.ranked.has(node.shown)
        return any(c.edges[0].relation in relations and not self._seen(c) for c in node.ranked.after(node.shown))

    def _seen(self, candidate: Candidate) -> bool:
        return all(edge.key() in self._shown_edges for edge in candidate.edges)

    def _show(self, node: _Node, backtracked: bool, relations: set[str] | None = None, written: str | None = None) -> ToolResult:
        """The node's next unseen candidates (by one of `relations`, when given), up to top_k and max_chars
        (at least one), then the listing of the relations its unseen candidates still have.

        A candidate counts as seen once all its triples were shown in this session, from any
        entity: the model has read them, so showing them again would only crowd out new ones.
        """
        assert node.ranked is not None
        lines: list[str] = []
        edges: list[Edge] = []
        size = shown = 0
        for candidate in node.ranked.after(node.shown):
            if shown >= self._config.top_k:
                break
            if self._seen(candidate) or (relations is not None and candidate.edges[0].relation not in relations):
                continue
            before = len(self._labels)
            new_lines = []
            for edge in candidate.edges:
                for entity, label in ((edge.subject, edge.subject_label), (edge.object, edge.object_label)):
                    self._register(entity, label, parent=node.entity)
                line = self._line(edge)
                if line not in lines and line not in new_lines:
                    new_lines.append(line)
            extra = sum(len(line) + 1 for line in new_lines)
            if lines and size + extra > self._config.max_chars:
                self._unregister(list(self._labels)[before:])
                break
            lines.extend(new_lines)
            edges.extend(candidate.edges)
            self._shown_edges.update(edge.key() for edge in candidate.edges)
            size += extra
            shown += 1
        self._has_unseen(node)
        more = self._unseen_relations(node)
        if more:
            lines.append(MORE_PREFIX + " " + ", ".join(f"{name} ({count})" for name, count in more))
        return ToolResult("\n".join(lines), edges, None, node.entity, backtracked, tuple(more), written)

    def _unseen_relations(self, node: _Node) -> list[tuple[str, int]]:
        """(relation as a filter names it, unseen candidates by it) for the node, in ranked order.

        Relation groups of a hub that no page has reached yet count their edges, unbuilt: exact
        unless they lead to mediators or one of their lines was shown from its other end."""
        assert node.ranked is not None
        counts = Counter(self._filter_name(c) for c in node.ranked.built[node.shown:] if not self._seen(c))
        for relation, _, edges in node.ranked.pending_counts():
            counts[relation_filter_name(relation, self._config.relation_format)] += edges
        return list(counts.items())

    def _filter_name(self, candidate: Candidate) -> str:
        return relation_filter_name(candidate.edges[0].relation, self._config.relation_format)

    # --- names and handles ----------------------------------------------------------------------
    def _register(self, entity: str, label: str, parent: str | None) -> None:
        if entity in self._labels:
            return
        self._labels[entity] = label
        self._parent[entity] = parent
        if self._config.entity_handles:
            handle = f"{HANDLE_PREFIX}{len(self._handles) + 1}"
            self._handles[entity] = handle
            self._by_handle[handle] = entity

    def _unregister(self, entities: list[str]) -> None:
        """Forget entities registered for a candidate that did not fit (handles stay gap-free)."""
        for entity in entities:
            del self._labels[entity]
            del self._parent[entity]
            handle = self._handles.pop(entity, None)
            if handle is not None:
                del self._by_handle[handle]

    def _display(self, entity: str) -> str:
        label = self._labels.get(entity) or self._kg.label(entity)
        handle = self._handles.get(entity)
        return f"{handle} {label}" if handle else label

    def _line(self, edge: Edge) -> str:
        return triple_line(self._display(edge.subject), edge.relation, self._display(edge.object), self._config.relation_format)

    def _resolve(self, name: str, fuzzy: bool, by_handle: bool = True) -> str | None:
        """A shown entity's id: by handle (its first word), id, exact label, normalised label, then
        (if fuzzy) difflib.

        Among namesakes the most recently shown wins: it is the one the model just read.
        """
        name = name.strip()
        head = name.split(maxsplit=1)[0] if name else ""
        if by_handle and head in self._by_handle and _HANDLE.fullmatch(head):
            return self._by_handle[head]
        if name in self._labels:
            return name
        recent = list(reversed(self._labels.items()))
        for entity, label in recent:
            if label == name:
                return entity
        wanted = normalize_answer(name)
        if wanted:
            for entity, label in recent:
                if normalize_answer(label) == wanted:
                    return entity
        if fuzzy and wanted:
            by_norm: dict[str, str] = {}
            for entity, label in recent:
                by_norm.setdefault(normalize_answer(label), entity)
            close = difflib.get_close_matches(wanted, list(by_norm), n=1, cutoff=self._config.fuzzy_cutoff)
            if close:
                return by_norm[close[0]]
        return None

    def _unknown_text(self, name: str) -> str:
        by_norm: dict[str, str] = {}
        for entity, label in reversed(self._labels.items()):
            by_norm.setdefault(normalize_answer(label), entity)
        close = difflib.get_close_matches(normalize_answer(name), list(by_norm), n=self._config.suggestions, cutoff=0.4)
        if close:
            names = [self._display(by_norm[c]) for c in close]
            return f"Unknown entity \"{name}\": it is not a topic entity or an entity shown so far. Close names: {'; '.join(names)}."
        names = [self._display(e) for e in self._topics][: self._config.suggestions]
        return (f"Unknown entity \"{name}\": it is not a topic entity or an entity shown so far. "
                f"Search a topic entity ({'; '.join(names)}) or an entity from the triples above.")


_HANDLE = re.compile(re.escape(HANDLE_PREFIX) + r"[1-9][0-9]*")
_BACKTRACK_SUFFIX = re.compile(r"\s*" + re.escape(QUERY_SEPARATOR) + r"\s*" + re.escape(BACKTRACK_MARK) + r"\s*$", re.IGNORECASE)


def parse_query(query: str) -> tuple[str, bool]:
    """`NAME | backtrack` -> (NAME, True); `NAME` -> (NAME, False); surrounding spaces dropped."""
    text = query.strip()
    match = _BACKTRACK_SUFFIX.search(text)
    if match:
        return text[: match.start()].strip(), True
    return text, False


def split_relation_filter(name: str) -> tuple[str, str] | None:
    """`NAME | REL` -> (NAME, REL), split at the last bar, both parts stripped; None without a bar or with an empty
    part.

    A session reads a search this way only when the whole text names no shown entity (a label may hold a bar).
    """
    head, sep, tail = name.rpartition(QUERY_SEPARATOR)
    if sep and head.strip() and tail.strip():
        return head.strip(), tail.strip()
    return None


def _names_relation(written: str, relation: str, relation_format: str) -> bool:
    """True when a filter's text names `relation`: its id or its printed form, case and spacing aside."""
    wanted = " ".join(written.split()).lower()
    return wanted in (relation.lower(), " ".join(relation_display(relation, relation_format).split()).lower())


def _error(kind: str, text: str, entity: str | None = None, backtracked: bool = False) -> ToolResult:
    return ToolResult(text=text, edges=[], error=kind, entity=entity, backtracked=backtracked)
