"""The KG search tool the model calls from inside its thinking, one session per question.

`<search>NAME</search>` shows NAME's best `top_k` neighbours whose triples this session has not shown yet, ranked for
the question; `<search>NAME | backtrack</search>` leaves NAME as a dead end and shows the
next-best unseen neighbours of its parent on the explored path, climbing further up while a
parent has none left (paper, Section 4.2.3). Names resolve only among the topic entities and the
entities this session has shown.

No relation hides behind a hub: when the searched entity keeps unseen neighbours after a call,
one line after the triples lists their relations with how many are left, the likeliest first (in
ranked order when a ranker runs, else the most neighbours first): `more: plays_for (23),
citizen_of (12)`. `<search>NAME | REL</search>` shows only NAME's unseen neighbours by relation REL,
ranked as usual, `top_k` at a time: calling it again gives the next page (whose listing names REL
first while it has more). A neighbour counts by the relation of the edge that leaves NAME (a
mediator's first edge), in either direction. REL is written as the listing prints it, which reads
back to exactly that relation (`protocol.relation_filter_text`: `=backtrack`, `="born \\| in"`), or as
its id or printed words. A listing that does not fit ends `and N more relations` (N not in the line),
and `<search>NAME | relations</search>` lists the relations no listing has named yet.

No text passes `max_chars`: a page, its listing and every error are built to fit (the listing keeps
at least a quarter of it), and a first candidate longer than the rest of the room is cut. A query
that is itself a shown name (a label holding ` | `) is a plain search of that name. Labels, literals and
relations print with their control characters escaped (`protocol.printable`), so no text of the KB can start a
line of a tool block; a name is accepted as stored or as printed. With
`entity_handles`, each entity gets a session-local handle (`E1`, `E2`, ... in order of appearance,
topic entities first) printed before its label; handles and names are both accepted. A name that several
shown entities bear is answered with each of them (`ambiguous_entity`), by handle or else by id, which the
model then searches by. Every problem
comes back as a `ToolResult` whose `text` is a short sentence and whose `error` names the case;
`SearchSession.call` never raises. An id the backend cannot express (`KnowledgeGraph.expresses`) has
no neighbours, as an id missing from the graph has none.
"""

from __future__ import annotations

import difflib
import itertools
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from kgreasoner.kg.base import KGError, KnowledgeGraph
from kgreasoner.protocol import (
    ANSWER_SEPARATOR,
    BACKTRACK_MARK,
    MORE_PREFIX,
    QUERY_SEPARATOR,
    ToolResult,
    is_handle,
    is_relations_request,
    listing_item,
    more_relations,
    nth_handle,
    printable,
    read_relation_filter,
    relation_filter_text,
    split_relation_filter,
    split_search_query,
)
from kgreasoner.records.edges import Edge
from kgreasoner.records.ids import INVERSE_PREFIX, literal_value
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import TopicEntity
from kgreasoner.retrieval.candidates import Candidate, RankedCandidates
from kgreasoner.retrieval.encoder import EncoderConfig, TextEncoder, build_encoder, saved_encoder_config
from kgreasoner.retrieval.ranker import GATRanker, load_ranker
from kgreasoner.retrieval.ranking import RANKING_METHODS, CandidateScorer, Timings

ERRORS = (
    "unknown_entity",
    "unknown_relation",
    "empty_query",
    "no_neighbors",
    "exhausted",
    "backtrack_at_root",
    "kg_error",
    "query_too_long",
    "ambiguous_entity",
)
MIN_MAX_CHARS = 64
"""The smallest `max_chars`: room for a cut line and a listing that only counts the relations."""
LISTING_SHARE = 4
"""A page keeps 1/LISTING_SHARE of `max_chars` (or what its listing needs, if less) for the listing."""
ECHO_CHARS = 80
"""Text the model wrote (a name, a relation) is quoted back in an error up to this many characters."""
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
    """One line of a tool block: `(subject, relation, object)`, the ends as the session displays them and the
    relation printable (`protocol.printable`)."""
    return f"({subject}, {printable(relation_display(relation, relation_format))}, {obj})"


def relation_key(relation: str, relation_format: str = "id") -> str:
    """How a thought names a relation (a plan, a hop): the last word its triple line prints.

    With `id` that is the id itself; with `words` the last namespace part, the word a question uses.
    A path relation walked backwards (`^rel`) keeps its `^` before the key.
    """
    inverse = relation.startswith(INVERSE_PREFIX)
    bare = relation[len(INVERSE_PREFIX) :] if inverse else relation
    return (INVERSE_PREFIX if inverse else "") + relation_display(bare, relation_format).split(" ")[-1]


def relation_filter_name(relation: str, relation_format: str = "id") -> str:
    """A relation as the `more:` listing prints it and `NAME | REL` names it: as its triple lines print
    it, escaped where the bare form would read as something else (`protocol.relation_filter_text`).
    A session prints the id instead where two relations of one entity print alike
    (`SearchSession.filter_name`)."""
    return relation_filter_text(relation_display(relation, relation_format))


@dataclass
class ToolConfig:
    """How the search tool ranks, caps and prints what it shows."""

    top_k: int = field(
        default=10, metadata={"help": "candidates shown per call (a mediator candidate prints 2 lines)"}
    )
    max_chars: int = field(
        default=2000,
        metadata={
            "help": "cap on the text of one call, listing and errors included (>= 64); the first candidate is "
            "always shown, cut if it alone is longer"
        },
    )
    ranking: str = field(
        default="none",
        metadata={"help": "gat (trained ranker), embedding (cosine of question and triple text) or none (KG order)"},
    )
    ranker_path: str | None = field(
        default=None,
        metadata={
            "help": "folder of a trained ranker (model.safetensors + ranker.json); needed by ranking=gat unless a "
            "ranker is passed"
        },
    )
    encoder: EncoderConfig = field(
        default_factory=EncoderConfig,
        metadata={"help": "text encoder for gat/embedding (a saved ranker's own encoder kind wins)"},
    )
    entity_handles: bool = field(
        default=False,
        metadata={
            "help": "print session-local handles (E1, E2, ...) before labels and accept them in search and answers"
        },
    )
    expand_mediators: bool = field(
        default=True,
        metadata={"help": "show what lies beyond unnamed (CVT-like) neighbours instead of the bare mediator"},
    )
    neighbor_limit: int | None = field(
        default=10000,
        metadata={
            "help": "edges fetched per node at once (bounds the work at hubs); a hub's other edges are counted by "
            "relation and read a relation at a time when a filter or a later page reaches them; None: all at once"
        },
    )
    max_context: int = field(default=16, metadata={"help": "context edges per candidate given to the gat ranker"})
    relation_first: int | None = field(
        default=256,
        metadata={
            "help": "entities with more edges than this are ranked relation first: their relations are scored by "
            "closeness to the question, only the first rerank_pool edges of the best ones are ranked by the ranker, "
            "the rest follow relation by relation (so a hub costs what a small entity does; see CandidateScorer); "
            "None: every entity exact"
        },
    )
    rerank_pool: int | None = field(
        default=64,
        metadata={
            "help": "at hubs, only the N candidates whose relation is closest to the question are scored by "
            "gat/embedding; None: all"
        },
    )
    fuzzy_cutoff: float = field(
        default=0.8, metadata={"help": "difflib similarity needed to accept a misspelt name (0-1)"}
    )
    suggestions: int = field(default=5, metadata={"help": "close names listed when a name is unknown"})
    max_query_chars: int | None = field(
        default=1000,
        metadata={
            "help": "longest search text (between the search tags) the tool reads; a longer one is answered with "
            "an error naming the limit, unread (no name or filter is that long); None: no limit"
        },
    )
    relation_format: str = field(
        default="id",
        metadata={
            "help": "how triple lines print relations: `id` as stored, or `words` (namespace parts as words: "
            "`__common__topic__notable_types` -> `common topic notable_types`, so the question's word for a "
            "relation is a token of its line)"
        },
    )

    def __post_init__(self) -> None:
        if self.relation_format not in RELATION_FORMATS:
            raise ValueError(f"relation_format must be one of {RELATION_FORMATS}, got {self.relation_format!r}")
        if self.ranking not in RANKING_METHODS:
            raise ValueError(f"ranking must be one of {RANKING_METHODS}, got {self.ranking!r}")
        if self.top_k < 1 or self.max_context < 0 or self.suggestions < 1:
            raise ValueError("top_k and suggestions must be >= 1; max_context >= 0")
        if self.max_chars < MIN_MAX_CHARS:
            raise ValueError(
                f"max_chars must be >= {MIN_MAX_CHARS} (room for a line and the relations listing), "
                f"got {self.max_chars}"
            )
        if not 0.0 < self.fuzzy_cutoff <= 1.0:
            raise ValueError(f"fuzzy_cutoff must be in (0, 1], got {self.fuzzy_cutoff}")
        if self.neighbor_limit is not None and self.neighbor_limit < 1:
            raise ValueError("neighbor_limit must be >= 1 or None")
        if self.rerank_pool is not None and self.rerank_pool < 1:
            raise ValueError("rerank_pool must be >= 1 or None")
        if self.max_query_chars is not None and self.max_query_chars < 1:
            raise ValueError(f"max_query_chars must be >= 1 or None, got {self.max_query_chars}")


class KGSearchTool:
    """Search sessions over one KG with one ranking backend (shared by all sessions)."""

    def __init__(
        self,
        kg: KnowledgeGraph,
        config: ToolConfig,
        ranker: GATRanker | None = None,
        encoder: TextEncoder | None = None,
    ) -> None:
        self.kg = kg
        self.config = config
        if config.ranking == "gat" and ranker is None:
            if not config.ranker_path:
                raise ValueError("ToolConfig.ranking='gat' needs ranker_path (or pass ranker=)")
            ranker, meta = load_ranker(config.ranker_path)
            saved = meta.get("encoder")
            if encoder is None and isinstance(saved, dict):
                encoder = build_encoder(saved_encoder_config(saved, config.encoder.cache_dir))
        if config.ranking != "none" and encoder is None:
            encoder = build_encoder(config.encoder)
        if config.ranking == "gat" and encoder is not None and ranker is not None and encoder.dim != ranker.config.dim:
            raise ValueError(
                f"the ranker expects {ranker.config.dim}-d embeddings but the encoder gives {encoder.dim}-d"
            )
        self.scorer = CandidateScorer(
            method=config.ranking,
            kg=kg,
            encoder=encoder if config.ranking != "none" else None,
            model=ranker if config.ranking == "gat" else None,
            max_context=config.max_context,
            rerank_pool=config.rerank_pool,
            relation_first=config.relation_first,
        )

    @property
    def timings(self) -> Timings:
        """Seconds in KG fetches, encoding and ranking, summed over every session's calls."""
        return self.scorer.timings

    def session(
        self, question: str, topic_entities: list[TopicEntity], example_id: str | None = None
    ) -> SearchSession:
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
    names: dict[str, str] | None = None
    """Each relation at the entity as its listing prints it (`SearchSession._names`)."""
    listed: set[str] = field(default_factory=set)
    """Relations a listing of this session has named (`NAME | relations` lists the others)."""


class SearchSession:
    """One question's searches: shown entities, handles and the explored-path tree."""

    def __init__(
        self, tool: KGSearchTool, question: str, topic_entities: list[TopicEntity], example_id: str | None = None
    ) -> None:
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
            self._register(topic.id, topic.name or self._label(topic.id), parent=None)
            self._topics.append(topic.id)

    # --- the contract ---------------------------------------------------------------------------
    def call(self, query: str) -> ToolResult:
        """Run the text written inside `<search>` tags; errors come back as results, never raised."""
        self.num_calls += 1
        limit = self._config.max_query_chars
        if limit is not None and len(query) > limit:
            return self._error(
                "query_too_long",
                f"Search too long: {len(query)} characters, over the limit of {limit}. Write one entity "
                f"between the search tags (`NAME`, `NAME {QUERY_SEPARATOR} relation` or "
                f"`NAME {QUERY_SEPARATOR} {BACKTRACK_MARK}`).",
            )
        name, backtrack = split_search_query(query)
        if not name:
            return self._error(
                "empty_query",
                "Empty search: write a topic entity or an entity shown above "
                f"between the search tags (or `NAME {QUERY_SEPARATOR} {BACKTRACK_MARK}`).",
                backtracked=backtrack,
            )
        relation = None
        found: list[str] = []
        written = name
        parts = None if backtrack else split_relation_filter(name)
        # a bar is a filter unless the whole text is a shown label or id as it stands (labels may hold one;
        # normalised, `Hub | ==` would read as `Hub`); a handle names only its own word, so `E1 | rel` is
        # E1's filtered page, not a search of E1
        if parts is not None and not self._is_shown_name(name):
            found = self._matches(parts[0], fuzzy=True)
            if found:
                written, relation = parts
        if not found:
            found = self._matches(name, fuzzy=False) or self._matches(name, fuzzy=True)
        if not found:
            return self._error("unknown_entity", self._unknown_text(name), backtracked=backtrack)
        if len(found) > 1:
            return self._ambiguous(written, found, backtrack)
        entity = found[0]
        try:
            if backtrack:
                self.num_backtracks += 1
                return self._backtrack(entity)
            if relation is not None and is_relations_request(relation):
                return self._relations_page(entity, relation)
            if relation is not None:
                return self._filtered(entity, relation)
            return self._search(entity)
        except (KGError, ValueError) as err:  # ValueError: a backend's own refusal of an argument
            return self._error("kg_error", f"The knowledge graph could not be queried: {err}", entity, backtrack)

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
        """(handle or "", label as printed) of every entity shown so far (topic entities first), in order."""
        return [(self._handles.get(e, ""), printable(label)) for e, label in self._labels.items()]

    def label_of(self, entity: str) -> str | None:
        """The entity's label in this session: a topic entity's given name, else as a call showed it;
        None when it was never shown."""
        return self._labels.get(entity)

    def handle_of(self, entity: str) -> str:
        """The entity's handle in this session ("" when handles are off or it was never shown)."""
        return self._handles.get(entity, "")

    def filter_name(self, entity: str, relation: str) -> str:
        """`relation` as the listings of `entity` print it (and so as `NAME | REL` writes it), once the
        entity has been searched; before that, as `relation_filter_name` prints it."""
        node = self._nodes.get(entity)
        if node is None or node.ranked is None:
            return relation_filter_name(relation, self._config.relation_format)
        return self._names(node).get(relation) or relation_filter_name(relation, self._config.relation_format)

    # --- searching ------------------------------------------------------------------------------
    def _search(self, entity: str) -> ToolResult:
        node = self._node(entity)
        first = node.ranked is None
        self._ranked(node)
        if self._has_unseen(node):
            return self._show(node, backtracked=False)
        return self._none_left(node, first)

    def _none_left(self, node: _Node, first: bool) -> ToolResult:
        """The error of a search that found no unseen neighbour."""
        assert node.ranked is not None
        label = self._display(node.entity)
        again = f"Search another entity or write `{label} {QUERY_SEPARATOR} {BACKTRACK_MARK}`."
        if not node.ranked:
            return self._error(
                "no_neighbors", f"{label} has no neighbours in the knowledge graph. {again}", node.entity
            )
        if first:
            return self._error(
                "no_neighbors", f"{label} has no neighbours besides the triples already shown. {again}", node.entity
            )
        return self._error(
            "exhausted", f"All {len(node.ranked)} neighbours of {label} have been shown. {again}", node.entity
        )

    def _filtered(self, entity: str, written: str) -> ToolResult:
        """A page of the entity's unseen neighbours by the relation `written` names."""
        node = self._node(entity)
        ranked = self._ranked(node)
        label = self._display(entity)
        named = read_relation_filter(written)
        wanted = _echo(named)
        relations = self._relations_named(node, named)
        if not relations:
            return self._unknown_relation(node, label, wanted)
        ranked.build_relations(relations)  # a hub's relation past the first fetch: its edges, and no other's
        if self._has_unseen(node, relations):
            return self._show(node, backtracked=False, relations=relations, written=written)
        totals = self._relation_totals(node)
        total = sum(totals[r] for r in relations)
        return self._error(
            "exhausted",
            f"All {total} neighbours of {label} by {wanted} have been shown. Search "
            f"another entity, another relation of {label}, or write "
            f"`{label} {QUERY_SEPARATOR} {BACKTRACK_MARK}`.",
            entity,
        )

    def _unknown_relation(self, node: _Node, label: str, wanted: str) -> ToolResult:
        """Every relation of the entity with its neighbours, the likeliest first, as many as fit."""
        totals = self._relation_totals(node)
        head = f'{label} has no relation "{wanted}". '
        if not totals:
            return self._error(
                "unknown_relation", f"{head}{label} has no neighbours in the knowledge graph.", node.entity
            )
        names = self._names(node)
        order = self._likeliest_first(totals)
        items = [f"{names[r]} ({totals[r]})" for r in order]
        room = self._config.max_chars - len(head) - len("Its relations: .") - len(more_relations(len(order)))
        picked = _pack(items, room)
        if not picked:
            return self._error("unknown_relation", f"{head}It has {len(order)} relations.", node.entity)
        text = ", ".join(items[i] for i in picked)
        if len(picked) < len(order):
            text += more_relations(len(order) - len(picked))
        return self._error("unknown_relation", f"{head}Its relations: {text}.", node.entity)

    def _relations_page(self, entity: str, written: str) -> ToolResult:
        """The listing of the entity's unseen neighbours' relations that no listing has named yet (all of them
        again once every one was named), with the whole of `max_chars`."""
        node = self._node(entity)
        first = node.ranked is None
        self._ranked(node)
        if not self._has_unseen(node):
            return self._none_left(node, first)
        text, more, unlisted = self._listing(node, self._config.max_chars, fresh=True)
        return ToolResult(text, [], None, entity, False, more, written, unlisted)

    def _backtrack(self, entity: str) -> ToolResult:
        label = self._display(entity)
        current = self._parent.get(entity)
        if current is None:
            return self._error(
                "backtrack_at_root",
                f"{label} is a topic entity: there is nothing to backtrack to. "
                "Search one of the entities shown so far.",
                entity,
                True,
            )
        while current is not None:
            node = self._node(current)
            self._ranked(node)
            if self._has_unseen(node):
                return self._show(node, backtracked=True)
            current = node.parent
        return self._error(
            "backtrack_at_root",
            f"Nothing left to backtrack to: every neighbour on the path from "
            f"{label} back to the topic entity has been shown. Search another entity shown above, "
            "or answer.",
            entity,
            True,
        )

    def _node(self, entity: str) -> _Node:
        if entity not in self._nodes:
            self._nodes[entity] = _Node(entity, self._parent.get(entity))
        return self._nodes[entity]

    def _ranked(self, node: _Node) -> RankedCandidates:
        if node.ranked is None:
            if not self._kg.expresses(node.entity):
                node.ranked = RankedCandidates(())
            else:
                node.ranked = self._tool.scorer.rank(
                    self.question, node.entity, self._kg, self._config.expand_mediators, self._config.neighbor_limit
                )
        return node.ranked

    def _has_unseen(self, node: _Node, relations: set[str] | None = None) -> bool:
        """Moves the node's cursor past candidates whose triples were all shown already; True when an
        unseen candidate (by one of `relations`, when given) is left."""
        assert node.ranked is not None
        while node.ranked.has(node.shown) and self._seen(node.ranked[node.shown]):
            node.shown += 1
        if relations is None:
            return node.ranked.has(node.shown)
        return any(c.edges[0].relation in relations and not self._seen(c) for c in self._built_after(node))

    @staticmethod
    def _built_after(node: _Node) -> Iterator[Candidate]:
        """The node's candidates built so far, from its cursor on (building no pending group)."""
        assert node.ranked is not None
        return itertools.islice(node.ranked.built, node.shown, None)

    def _seen(self, candidate: Candidate) -> bool:
        return all(edge.key() in self._shown_edges for edge in candidate.edges)

    def _show(
        self, node: _Node, backtracked: bool, relations: set[str] | None = None, written: str | None = None
    ) -> ToolResult:
        """The node's next unseen candidates (by one of `relations`, when given), up to top_k and max_chars
        (at least one), then the listing of the relations its unseen candidates still have.

        The lines leave the listing the room it needs, up to a 1/LISTING_SHARE of max_chars: a hub's page
        names its likeliest relations however long its lines are. A candidate counts as seen once all its
        triples were shown in this session, from any entity: the model has read them, so showing them
        again would only crowd out new ones.
        """
        assert node.ranked is not None
        limit = self._config.max_chars
        room = limit - min(self._listing_need(node), max(limit // LISTING_SHARE, _LISTING_FLOOR))
        lines: list[str] = []
        edges: list[Edge] = []
        size = shown = 0
        # a filtered page reads the built candidates only: its relations' groups were built (build_relations)
        source = node.ranked.after(node.shown) if relations is None else self._built_after(node)
        for candidate in source:
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
            if lines and size + extra > room:
                self._unregister(list(self._labels)[before:])
                break
            if extra > room:  # the first candidate alone is longer than the room: cut it
                new_lines = [_clip("\n".join(new_lines), room - 1)]
                extra = len(new_lines[0]) + 1
            lines.extend(new_lines)
            edges.extend(candidate.edges)
            self._shown_edges.update(edge.key() for edge in candidate.edges)
            size += extra
            shown += 1
        self._has_unseen(node)
        first = next(iter(relations)) if relations is not None and len(relations) == 1 else None
        listing, more, unlisted = self._listing(node, limit - size, first=first)
        if listing:
            lines.append(listing)
        return ToolResult("\n".join(lines), edges, None, node.entity, backtracked, more, written, unlisted)

    def _unseen_counts(self, node: _Node) -> dict[str, int]:
        """Unseen candidates of the node by the relation of their first edge, in ranked order.

        Relation groups of a hub that no page has reached yet count their edges, unbuilt: exact
        unless they lead to mediators or one of their lines was shown from its other end."""
        assert node.ranked is not None
        counts = Counter(c.edges[0].relation for c in node.ranked.built[node.shown :] if not self._seen(c))
        for relation, _, edges in node.ranked.pending_counts():
            counts[relation] += edges
        return dict(counts)

    def _relation_totals(self, node: _Node) -> dict[str, int]:
        """All the node's candidates (seen or not) by the relation of their first edge, in ranked order."""
        assert node.ranked is not None
        counts = Counter(c.edges[0].relation for c in node.ranked.built)
        for relation, _, edges in node.ranked.pending_counts():
            counts[relation] += edges
        return dict(counts)

    def _likeliest_first(self, counts: dict[str, int]) -> list[str]:
        """Relations in ranked order when a ranker ordered them, else the most neighbours first (ties in KG order)."""
        if self._config.ranking != "none":
            return list(counts)
        return sorted(counts, key=lambda r: -counts[r])

    def _listing_need(self, node: _Node) -> int:
        """Characters the node's whole listing takes now (a bound on it after a page), counted up to max_chars."""
        names = self._names(node)
        need = 0
        for relation, count in self._unseen_counts(node).items():
            need += len(names[relation]) + len(str(count)) + 5  # "name (count), "
            if need > self._config.max_chars:
                break
        return need + len(MORE_PREFIX) if need else 0

    def _listing(
        self, node: _Node, room: int, first: str | None = None, fresh: bool = False
    ) -> tuple[str, tuple[tuple[str, int], ...], int]:
        """(`more:` line, its (name, count) pairs, relations still unlisted) of the node's unseen neighbours'
        relations, within `room` characters: the likeliest first (`first` before them while it has
        unseen neighbours); with `fresh`, only those no listing has named yet, or all again when every one
        was. The line ends `and N more relations` when N of them are not in it; "" when none is unseen."""
        counts = self._unseen_counts(node)
        if not counts:
            return "", (), 0
        order = self._likeliest_first(counts)
        if first in counts:
            order.remove(first)
            order.insert(0, first)
        if fresh:
            order = [r for r in order if r not in node.listed] or order
            if order[0] in node.listed:
                node.listed.clear()
        names = self._names(node)
        items = [listing_item(names[r], counts[r]) for r in order]
        prefix = MORE_PREFIX + " "
        picked = list(range(len(items)))
        if len(prefix) + sum(len(item) + 2 for item in items) - 2 > room:
            picked = _pack(items, room - len(prefix) - len(more_relations(len(counts))))
        node.listed.update(order[i] for i in picked)
        unlisted = sum(1 for r in counts if r not in node.listed)
        more = tuple((names[order[i]], counts[order[i]]) for i in picked)
        if not picked:
            return f"{prefix}{len(counts)} relations", more, unlisted
        left = len(counts) - len(picked)
        return prefix + ", ".join(items[i] for i in picked) + (more_relations(left) if left else ""), more, unlisted

    def _names(self, node: _Node) -> dict[str, str]:
        """Each relation at the node as its listings print it: as its triple lines print it
        (`relation_filter_name`), or by its id where that form is shared with another relation of the
        node (two ids that print the same words), so that the filter reads it back to this relation alone."""
        if node.names is None:
            assert node.ranked is not None
            relations = dict.fromkeys(c.edges[0].relation for c in node.ranked.built)
            relations.update(dict.fromkeys(r for r, _, _ in node.ranked.pending_counts()))
            fmt = self._config.relation_format
            shown = {r: relation_display(r, fmt) for r in relations}
            uses = Counter(shown.values())
            node.names = {
                r: relation_filter_text(r if uses[d] > 1 or (d != r and d in relations) else d)
                for r, d in shown.items()
            }
        return node.names

    def _relations_named(self, node: _Node, wanted: str) -> set[str]:
        """The relations at the node a filter names (`wanted`, its text read by `read_relation_filter`): exactly
        (its id, or its printed form read back), else its id or printed words with case and spacing aside."""
        names = self._names(node)
        exact = {r for r in names if r == wanted} or {r for r, n in names.items() if read_relation_filter(n) == wanted}
        if exact:
            return exact
        fmt = self._config.relation_format
        words = _words(wanted)
        return {r for r in names if words in (_words(r), _words(relation_display(r, fmt)))}

    def _error(self, kind: str, text: str, entity: str | None = None, backtracked: bool = False) -> ToolResult:
        return ToolResult(
            text=_clip(text, self._config.max_chars), edges=[], error=kind, entity=entity, backtracked=backtracked
        )

    # --- names and handles ----------------------------------------------------------------------
    def _register(self, entity: str, label: str, parent: str | None) -> None:
        if entity in self._labels:
            return
        self._labels[entity] = label
        self._parent[entity] = parent
        if self._config.entity_handles:
            handle = nth_handle(len(self._handles) + 1)
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

    def _label(self, entity: str) -> str:
        """The KG's label of `entity`; an id the backend cannot express is shown as an unknown id is."""
        return self._kg.label(entity) if self._kg.expresses(entity) else literal_value(entity)

    def _display(self, entity: str) -> str:
        """The entity as tool text prints it: its handle, if any, and its label, printable (a label that holds
        a line break or an ANSI escape prints it escaped)."""
        label = printable(self._labels.get(entity) or self._label(entity))
        handle = self._handles.get(entity)
        return f"{handle} {label}" if handle else label

    def _line(self, edge: Edge) -> str:
        return triple_line(
            self._display(edge.subject), edge.relation, self._display(edge.object), self._config.relation_format
        )

    def _is_shown_name(self, name: str) -> bool:
        """True when `name` is exactly the id or label (as stored or as printed) of an entity shown so far."""
        return name in self._labels or any(name in (label, printable(label)) for label in self._labels.values())

    def _resolve(self, name: str, fuzzy: bool) -> str | None:
        """The shown entity `name` names (`_matches`); among namesakes the most recently shown, the one the
        model just read (an answer names a label, and namesakes share theirs)."""
        found = self._matches(name, fuzzy)
        return found[-1] if found else None

    def _matches(self, name: str, fuzzy: bool) -> list[str]:
        """The shown entities `name` names, in order of appearance: by handle (its first word), id, exact label
        (as stored or as printed), normalised label, then (if fuzzy) the closest normalised label by difflib.
        Several when they share that label: a search cannot choose among namesakes for the model."""
        name = name.strip()
        head = name.split(maxsplit=1)[0] if name else ""
        if head in self._by_handle and is_handle(head):
            return [self._by_handle[head]]
        if name in self._labels:
            return [name]
        found = [entity for entity, label in self._labels.items() if name in (label, printable(label))]
        wanted = normalize_answer(name)
        if found or not wanted:
            return found
        normalised = {entity: normalize_answer(label) for entity, label in self._labels.items()}
        found = [entity for entity, label in normalised.items() if label == wanted]
        if found or not fuzzy:
            return found
        close = difflib.get_close_matches(
            wanted, list(dict.fromkeys(normalised.values())), n=1, cutoff=self._config.fuzzy_cutoff
        )
        return [entity for entity, label in normalised.items() if close and label == close[0]]

    def _ambiguous(self, name: str, entities: list[str], backtracked: bool) -> ToolResult:
        """The error of a name that several shown entities bear: each of them, as the model can name it
        alone (its handle, else its id), as many as fit."""
        handles = self._config.entity_handles
        items = [
            self._display(entity) if handles else f"{printable(self._labels[entity])} (id {printable(entity)})"
            for entity in entities
        ]
        head = f'"{_echo(name)}" names {len(entities)} entities shown so far: '
        tail = f". Search one by its {'handle' if handles else 'id'}."
        room = self._config.max_chars - len(head) - len(tail) - len(f" and {len(items)} more")
        picked = _pack(items, room)
        listed = "; ".join(items[i] for i in picked)
        if len(picked) < len(items):
            listed += f" and {len(items) - len(picked)} more"
        return self._error("ambiguous_entity", head + listed + tail, backtracked=backtracked)

    def _unknown_text(self, name: str) -> str:
        by_norm: dict[str, str] = {}
        for entity, label in reversed(self._labels.items()):
            by_norm.setdefault(normalize_answer(label), entity)
        close = difflib.get_close_matches(
            normalize_answer(name), list(by_norm), n=self._config.suggestions, cutoff=0.4
        )
        name = _echo(name)
        if close:
            names = [_echo(self._display(by_norm[c])) for c in close]
            return (
                f'Unknown entity "{name}": it is not a topic entity or an entity shown so far. '
                f"Close names: {'; '.join(names)}."
            )
        names = [_echo(self._display(e)) for e in self._topics][: self._config.suggestions]
        return (
            f'Unknown entity "{name}": it is not a topic entity or an entity shown so far. '
            f"Search a topic entity ({'; '.join(names)}) or an entity from the triples above."
        )


_LISTING_FLOOR = len(f"{MORE_PREFIX} 1000000 relations")


def _pack(items: list[str], room: int) -> list[int]:
    """Indices of the items that fit `room` characters joined by ", ", taken in order, an item too long
    for what is left skipped (a shorter one after it may still fit)."""
    picked: list[int] = []
    size = -2
    for index, item in enumerate(items):
        if size + 2 + len(item) <= room:
            picked.append(index)
            size += 2 + len(item)
        elif size + 2 + 1 > room:
            break
    return picked


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def _echo(text: str) -> str:
    """Text the model wrote, as an error quotes it back: printable, its first ECHO_CHARS characters."""
    return _clip(printable(text), ECHO_CHARS)


def _words(text: str) -> str:
    """`text` lower-cased with its runs of spaces as one: how a filter's words are compared with a relation's."""
    return " ".join(text.split()).lower()
