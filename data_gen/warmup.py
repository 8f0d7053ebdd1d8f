"""Warm-up SFT trajectories made by running the real search tool along gold relation paths.

For each question the generator walks one gold path (the first (path, topic) pair whose
execution reaches a gold answer) hop by hop with a real `SearchSession`:

- before each `<search>` the thinking names what is needed next (several templates, seeded
  choice; or an OpenAI-compatible teacher, see `TeacherConfig`);
- the query is the entity's handle when the tool prints handles, else its label as the tool
  printed it;
- the text after `</search>` is exactly `format_tool_block(result.text)`, a masked segment;
- the next hop's entity is one the tool really showed: it must be reached from the searched
  entity by triples shown in this session along the gold relations (through unnamed mediator
  nodes, which the tool expands into two-line candidates, so a mediator hop consumes two
  relations in one search) and must still reach a gold answer by the rest of the path. When
  the page left it out, the entity is searched again with the relation filter the tool's `more:`
  line offers (`NAME | REL`: its next page of unseen lines by the gold relation) up to
  `max_repeats` times; a question is skipped (and counted) only when no listed page is left;
- a multi-topic question (`intersect`) walks each topic entity's path in turn; the last search
  of every path but the first must show an answer an earlier one showed, and that entity,
  shown by both, is the answer;
- the answer is the gold answer the walk arrived at (`answer_mode: first`) or every gold answer
  the last hop showed, the arrived-at one first (`all`, written `A | B`).

Error-correction trajectories (`correction_share`): at one hop the walk searches a WRONG entity
the tool showed (a same-relation sibling that dead-ends, else one of the top-shown neighbours
by another relation), the thinking after its triples says why it does not fit the question,
`<search>WRONG | backtrack</search>` returns the tool's real backtrack output, and the walk
goes on along the gold path. Every record is verified (format check, the answer resolves in the
session to a gold answer, exactly one backtrack in corrections); failures are dropped and
counted. A question yields one record (gold or correction), with the question's id (`copies`
of it with `handle_numbers: random`). Where the
first search already showed all of an entity's neighbours (small KGs such as PathQuestion's), the
backtrack output is the tool's "nothing left to backtrack to" sentence; the summary counts the
backtrack outputs by kind. Optionally (`shuffle_triples`) each tool block's candidates are shuffled
and handles renumbered in order of appearance, against position shortcuts; with
`handle_numbers: random` training records number handles at random, against counting them.

Output: the JSONL (`kgreasoner.training.warmup_data` format: trained segments are the model's
text, masked segments exactly the tool blocks) and a summary JSON beside it: counts by kind, hops
and split, skipped questions by reason, notes (repeated searches, backtrack outputs, corrections
that fell back to gold and why), teacher calls and fallbacks, and mean tokens with `tokenizer`.

    python -m data_gen.warmup --config configs/warmup.yaml [--set key=value ...]
    kgreasoner warmup --config configs/warmup.yaml
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import yaml
from tqdm import tqdm

from data_gen.augment import AugmentConfig, QuestionAugmenter
from data_gen.lookup_drill import lookup_drills
from kgreasoner.config import ConfigError, add_config_arguments, describe, load_config
from kgreasoner.data.normalize import normalize_answer
from kgreasoner.data.path_search import with_derived_paths
from kgreasoner.data.sampling import stratified_order
from kgreasoner.data.schema import QAExample, TopicEntity
from kgreasoner.kg.base import INVERSE_PREFIX, KnowledgeGraph, execute_path, follow, is_literal_id
from kgreasoner.llm import OpenAIClient
from kgreasoner.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    ANSWER_SEPARATOR,
    BACKTRACK_MARK,
    HANDLE_PREFIX,
    QUERY_SEPARATOR,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    TAGS,
    THINK_CLOSE,
    THINK_OPEN,
    TOPIC_SEPARATOR,
    check_format,
    format_tool_block,
    parse_trajectory,
    topic_names,
)
from kgreasoner.retrieval.encoder import humanize_relation
from kgreasoner.retrieval.tool import (
    MORE_PREFIX,
    KGSearchTool,
    SearchSession,
    ToolConfig,
    ToolResult,
    relation_filter_name,
    relation_key,
    triple_line,
)
from kgreasoner.training.warmup_data import Segment, WarmupRecord, write_warmup

ANSWER_MODES = ("first", "all")
SPLIT_SCHEMES = ("random", "grouped")
PLAN_SEPARATOR = ","
PICKS = ("witness", "first_shown")
HANDLE_NUMBERS = ("appearance", "random")

# Template groups and the slots they may use (every slot is filled in every call; unused ones are ignored).
# `fact` reads a step as words ("E1 has spouse E2"); `hop` writes it with each relation's key, the last word
# its triple line prints (the id itself, or with `tool.relation_format: words` its last namespace part):
# "E1 spouse E2"; `plan` is the whole gold relation path in those keys ("spouse , parents"), so a template
# set can have the model plan once and then copy tokens it has seen; `next_key` is the relation a dead end
# lacks, written the same way; `line` is the followed triple line verbatim ("(E1 ada, spouse, E2 bob)"), so
# the handle to search continues a span copied from the block instead of being looked up two tokens away.
SLOTS = ("entity", "need", "fact", "hop", "line", "plan", "answer", "wrong", "wrong_fact", "wrong_hop", "wrong_line",
         "wrong_relation",
         "next_relation", "next_key", "question", "relation")
DEFAULT_TEMPLATES: dict[str, tuple[str, ...]] = {
    # before the first search of the topic entity
    "start": (
        "I need {need}.",
        "To answer this I first need {need}.",
        "The question starts from {entity}, so I look for {need}.",
        "First I search {entity} for {need}.",
    ),
    # what the last search showed (the step just taken)
    "fact": (
        "The triples show that {fact}.",
        "Here {fact}.",
        "From these triples, {fact}.",
    ),
    # before the search of the next hop's entity (slots: need, entity = that entity)
    "next": (
        "Next I need {need}.",
        "Now I look for {need}.",
        "So the next step is {need}.",
    ),
    # the gold continuation was not shown: the next page of the entity's lines by the relation (slot
    # `relation`: the relation as the `more:` line lists it and the filter names it)
    "again": (
        "The triples do not show {need} yet, and {entity} has more {relation} lines, so I search those.",
        "Nothing here gives {need}; I look through more {relation} lines of {entity}.",
    ),
    # a multi-topic question: the last route's end was reached, the next topic entity comes next
    "joint": (
        "The question also names {entity}, so I look for {need}.",
        "Now the other topic, {entity}: I need {need}.",
    ),
    # ... and before its answer, which every route reached
    "common": (
        "{answer} is in both results.",
        "Only {answer} fits both.",
    ),
    # before the answer
    "final": (
        "So the answer is {answer}.",
        "Therefore the answer is {answer}.",
        "This gives the answer: {answer}.",
    ),
    # a correction trajectory takes the wrong entity
    "detour": (
        "The triples show that {wrong_fact}. I check {wrong}.",
        "Here {wrong_fact}; {wrong} might lead on, so I search it.",
    ),
    # after the wrong entity's triples, when it came by another relation than the question needs
    "notice_relation": (
        "But {wrong} is linked by {wrong_relation}, and the question needs {need}. {wrong} is a dead end.",
        "{wrong} does not fit: the question asks for {need}, not {wrong_relation}. I go back.",
    ),
    # ... when it came by the right relation but does not continue the path
    "notice_dead_end": (
        "{wrong} has no {next_relation} here, so it does not lead to the answer. I go back.",
        "These triples give no {next_relation} for {wrong}; it is a dead end.",
    ),
    # ... when searching it returned no triples
    "notice_empty": (
        "{wrong} leads nowhere. I go back.",
        "Nothing useful comes from {wrong}; it is a dead end.",
    ),
    # after the backtrack output
    "recover": (
        "Back at {entity}: {fact}.",
        "Going back to {entity}, the triples show that {fact}.",
        "Back on the path: {fact}.",
    ),
}

WARMUP_PROMPT = (
    "You write the hidden thinking of an assistant that answers a question by searching a knowledge "
    "graph from inside its reasoning. The tool returns triples inside <triples> tags.\n"
    "Question: {question}\nTopic entity: {topics}\n"
    "The reasoning so far:\n{trajectory}\n"
    "The assistant's next action is: {action}\n"
    "The next thought must convey: {hint}\n"
    "Write only that next thought: one to three short sentences that lead to the action, naming "
    "entities exactly as the triples write them{handle_note}. Do not write any tags and do not "
    "write the action itself."
)
"""The teacher's warm-up prompt. Written here in the paper's spirit (its exact text is not in this
repository); replace it with `teacher.prompt`. Slots: question, topics, trajectory, action, hint,
handle_note."""


@dataclass
class TeacherConfig:
    """An OpenAI-compatible chat endpoint that writes the thinking text (off by default)."""

    enabled: bool = field(default=False, metadata={"help": "ask the teacher for each thought; templates are the fallback"})
    base_url: str | None = field(default=None, metadata={"help": "endpoint base, e.g. http://127.0.0.1:8000/v1 (`/chat/completions` is appended)"})
    model: str = field(default="", metadata={"help": "model name sent to the endpoint"})
    api_key_env: str = field(default="OPENAI_API_KEY", metadata={"help": "environment variable holding the API key (sent only if set)"})
    prompt: str = field(default=WARMUP_PROMPT, metadata={"help": "the warm-up prompt (slots: question, topics, trajectory, action, hint, handle_note)"})
    temperature: float = field(default=0.0, metadata={"help": "sampling temperature"})
    max_tokens: int = field(default=128, metadata={"help": "cap on the tokens of one thought"})
    max_chars: int = field(default=600, metadata={"help": "a longer reply is rejected (template used instead)"})
    timeout: float = field(default=30.0, metadata={"help": "seconds per request"})
    max_consecutive_failures: int = field(default=5, metadata={"help": "after this many failures in a row the teacher is not asked again (every later thought counts as a fallback)"})

    def __post_init__(self) -> None:
        if self.enabled and (not self.base_url or not self.model):
            raise ValueError("teacher.enabled needs teacher.base_url and teacher.model")
        if self.max_tokens < 1 or self.max_chars < 1 or self.timeout <= 0 or self.max_consecutive_failures < 1:
            raise ValueError("teacher.max_tokens, max_chars and max_consecutive_failures must be >= 1 and timeout > 0")


@dataclass
class WarmupConfig:
    """What `data_gen/warmup.py` generates, from which data, and where it goes."""

    dataset: str = field(metadata={"help": "dataset folder (kb.tsv + questions.jsonl) or a set name (PQ-2H, PQL-3H, ...)"})
    output: str = field(metadata={"help": "JSONL of WarmupRecord to write"})
    data_root: str | None = field(default=None, metadata={"help": "data root for named benchmarks (default: $KGREASONER_DATA, then ../shared/data)"})
    split_scheme: str = field(default="random", metadata={"help": "split of datasets that have none: random or grouped (must match training and evaluation)"})
    split_seed: int = field(default=0, metadata={"help": "seed of that split"})
    tool: ToolConfig = field(default_factory=ToolConfig, metadata={"help": "the search tool (handles, ranking, top_k): use the one the model will meet"})
    num_examples: int | str | None = field(default=500, metadata={"help": "trajectories from train-split questions (the paper used ~500); `all` or null: one per training question (for hard-case mining)"})
    sample_size: int | None = field(default=None, metadata={"help": "with sample_output: how many training questions the SFT sample holds"})
    sample_output: str | None = field(default=None, metadata={"help": "also write the records of the first `sample_size` training questions (in `sample` order) and every dev record here: a small SFT warm-up beside the full set that hard-case mining scores"})
    sample: str = field(default="shuffled", metadata={"help": "which training questions the first `num_examples` are: `shuffled` (a seeded shuffle) or `stratified` (hop counts take turns, and relation paths within a hop count, so a small warm-up covers every hop count and as many paths as fit)"})
    dev_examples: int | str | None = field(default=50, metadata={"help": "trajectories from dev-split questions, for early stopping of SFT (`all`/null: every one; 0: none)"})
    correction_share: float = field(default=0.3, metadata={"help": "share of records that are error-correction trajectories (0-1)"})
    answer_mode: str = field(default="first", metadata={"help": "first: answer the gold answer the walk reached; all: every gold answer the last search showed (`A | B`)"})
    shuffle_triples: bool = field(default=False, metadata={"help": "shuffle the candidates in each tool block (a mediator's lines stay together) and renumber handles in order of appearance, so that handle numbers and line positions do not predict the relation; such records no longer replay verbatim"})
    handle_numbers: str = field(default="appearance", metadata={"help": "`appearance`: handles numbered in order of appearance, as the tool numbers them; `random`: training records give every non-topic handle a random unused number up to `handle_pool`, so no handle can be predicted by counting and the model must copy it from the line that holds it; dev records keep the tool's numbers"})
    handle_pool: int = field(default=64, metadata={"help": "highest handle number `handle_numbers: random` draws (at most the tokenizer's `num_handles`)"})
    copies: int = field(default=1, metadata={"help": "records per training question; with `handle_numbers: random` each copy numbers its handles anew (a fresh numbering per epoch, as it were)"})
    lookup_drills: int = field(default=0, metadata={"help": "drill records per training record (data_gen/lookup_drill.py): the trajectory up to one of its tool blocks, masked, then that block's lines probed in random order, each line's tail handle and label trained; 0: none"})
    thought_names: bool = field(default=False, metadata={"help": "with handles, also write labels after handles in the thinking (tiny models copy handles more easily than names)"})
    pick: str = field(default="witness", metadata={"help": "which shown entity a walk follows when several carry the gold relation: `witness` (the one on the question's own gold path, else the first shown) or `first_shown` (the first shown that reaches a gold answer; a first-shown one that dead-ends in the KB is searched first and backtracked from, as a model that takes the first matching line must do)"})
    augment: AugmentConfig = field(default_factory=AugmentConfig, metadata={"help": "training-question rewrites before their trajectories are made: paraphrase mixing, name dropout (data_gen/augment.py)"})
    max_repeats: int = field(default=3, metadata={"help": "filtered pages (`NAME | REL`) of one entity when the gold continuation was not shown yet; beyond them the question is skipped (gold_not_shown:max_repeats)"})
    seed: int = field(default=0, metadata={"help": "seed of question order, template choice and error placement"})
    templates: str | None = field(default=None, metadata={"help": "YAML mapping template group -> list of strings, replacing the built-in groups it names"})
    teacher: TeacherConfig = field(default_factory=TeacherConfig, metadata={"help": "optional LLM that writes the thinking text"})
    tokenizer: str | None = field(default=None, metadata={"help": "tokenizer (path or hub name) to report mean token counts in the summary"})
    summary: str | None = field(default=None, metadata={"help": "summary JSON path (default: the output path with .summary.json)"})
    progress: bool = field(default=True, metadata={"help": "show a progress bar"})

    def __post_init__(self) -> None:
        if self.split_scheme not in SPLIT_SCHEMES:
            raise ValueError(f"split_scheme must be one of {SPLIT_SCHEMES}, got {self.split_scheme!r}")
        if self.answer_mode not in ANSWER_MODES:
            raise ValueError(f"answer_mode must be one of {ANSWER_MODES}, got {self.answer_mode!r}")
        if not 0.0 <= self.correction_share <= 1.0:
            raise ValueError(f"correction_share must be in [0, 1], got {self.correction_share}")
        if self.pick not in PICKS:
            raise ValueError(f"pick must be one of {PICKS}, got {self.pick!r}")
        if self.sample not in ("shuffled", "stratified"):
            raise ValueError(f"sample must be shuffled or stratified, got {self.sample!r}")
        if (self.sample_output is None) != (self.sample_size is None) or (self.sample_size or 1) < 1:
            raise ValueError("sample_output and sample_size (>= 1) go together")
        if self.handle_numbers not in HANDLE_NUMBERS:
            raise ValueError(f"handle_numbers must be one of {HANDLE_NUMBERS}, got {self.handle_numbers!r}")
        if self.copies < 1 or self.handle_pool < 1:
            raise ValueError(f"copies and handle_pool must be >= 1, got {self.copies} and {self.handle_pool}")
        if self.copies > 1 and self.handle_numbers != "random":
            raise ValueError("copies > 1 repeats identical records unless handle_numbers is `random`")
        if self.lookup_drills < 0:
            raise ValueError(f"lookup_drills must be >= 0, got {self.lookup_drills}")
        if self.lookup_drills and not self.tool.entity_handles:
            raise ValueError("lookup_drills probe handles: it needs tool.entity_handles true")
        if self.max_repeats < 0:
            raise ValueError(f"max_repeats must be >= 0, got {self.max_repeats}")
        self.num_examples = _count(self.num_examples, "num_examples")
        self.dev_examples = _count(self.dev_examples, "dev_examples")

    @property
    def summary_path(self) -> Path:
        if self.summary:
            return Path(self.summary)
        out = Path(self.output)
        return out.with_name(out.name.removesuffix(".jsonl") + ".summary.json")


def _count(value: int | str | None, name: str) -> int | None:
    """`all`/None -> None (every question); a non-negative int stays."""
    if value is None or (isinstance(value, str) and value.strip().lower() == "all"):
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, `all` or null, got {value!r}")
    return value


def load_templates(path: str | Path | None) -> dict[str, tuple[str, ...]]:
    """The built-in templates, with the groups a YAML file names replaced; bad files raise naming the group."""
    templates = dict(DEFAULT_TEMPLATES)
    if path is None:
        return templates
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"templates file not found: {path}")
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must map template groups to lists of strings")
    for group, values in data.items():
        if group not in DEFAULT_TEMPLATES:
            raise ConfigError(f"{path}: unknown template group {group!r}; known: {sorted(DEFAULT_TEMPLATES)}")
        if not isinstance(values, list) or not values or not all(isinstance(v, str) and v.strip() for v in values):
            raise ConfigError(f"{path}: group {group!r} must be a non-empty list of non-empty strings")
        templates[group] = tuple(values)
    for group, values in templates.items():
        for index, text in enumerate(values):
            try:
                text.format(**{slot: "x" for slot in SLOTS})
            except (KeyError, IndexError, ValueError) as err:
                raise ConfigError(f"{path}: template {group}[{index}] {text!r}: bad slot {err}; slots: {', '.join(SLOTS)}") from err
            if any(tag in text for tag in TAGS):
                raise ConfigError(f"{path}: template {group}[{index}] contains a protocol tag")
    return templates


# --- the teacher -----------------------------------------------------------------------------------
class Teacher:
    """Asks an OpenAI-compatible endpoint for one thought; None (and a counted failure) on any problem."""

    def __init__(self, config: TeacherConfig) -> None:
        self.config = config
        self.client = OpenAIClient(config.base_url or "", config.model, max_tokens=config.max_tokens,
                                   timeout=config.timeout, api_key_env=config.api_key_env,
                                   temperature=config.temperature)
        self.calls = 0
        self.used = 0
        self.failures: Counter[str] = Counter()
        self._consecutive = 0

    @property
    def fallbacks(self) -> int:
        return sum(self.failures.values())

    def thought(self, slots: dict[str, str]) -> str | None:
        if self._consecutive >= self.config.max_consecutive_failures:
            self.failures["gave_up"] += 1
            return None
        self.calls += 1
        try:
            reply = self._ask(self.config.prompt.format(**slots))
        except Exception as err:  # any endpoint problem means: use the template
            return self._fail(f"endpoint:{type(err).__name__}")
        text = " ".join(reply.split())
        if not text:
            return self._fail("empty")
        if len(text) > self.config.max_chars:
            return self._fail("too_long")
        if any(tag in text for tag in TAGS):
            return self._fail("has_tags")
        self._consecutive = 0
        self.used += 1
        return text

    def _fail(self, reason: str) -> None:
        self._consecutive += 1
        self.failures[reason] += 1
        return None

    def _ask(self, prompt: str) -> str:
        return self.client.complete(prompt).text

    def stats(self) -> dict[str, Any]:
        return {"calls": self.calls, "used": self.used, "fallbacks": self.fallbacks, "failures": dict(self.failures)}


# --- one trajectory --------------------------------------------------------------------------------
class Skip(Exception):
    """The question yields no trajectory; `reason` is counted in the summary."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Route:
    """The gold path walked: from which topic entity, along which relations."""

    topic: TopicEntity
    path: tuple[str, ...]


@dataclass(frozen=True)
class Step:
    """A move the shown triples support: from `source` along `relations` (1, or 2 through a mediator) to `target`."""

    source: str
    relations: tuple[str, ...]
    target: str


class _Writer:
    """Builds one trajectory against a live session: trained text, tool blocks, what was shown."""

    def __init__(self, generator: "WarmupGenerator", example: QAExample, route: Route, rng: random.Random) -> None:
        self.g = generator
        self.example = example
        self.route = route
        self.allowed: set[str] | None = None  # the answers an earlier route of a multi-topic question showed
        self.rng = rng
        self.kg = generator.kg.for_example(example.id)  # the question's own subgraph in a per-question KG
        self.session: SearchSession = generator.tool.session(example.question, list(example.topic_entities),
                                                             example_id=example.id)
        self.segments: list[Segment] = []
        self.buffer = THINK_OPEN + " "
        self.labels: dict[str, str] = {t.id: t.name or self.kg.label(t.id) for t in example.topic_entities}
        self.forward: dict[tuple[str, str], list[str]] = {}  # (node, path relation) -> nodes, in shown order
        self.searched: set[str] = set()
        self.repeats = 0
        self.backtracks = 0
        self.dead_ends = 0  # first-shown entities searched and backtracked from (pick: first_shown)
        self.picks = 0  # points where the walk chose the next entity (or the answer)
        self.backtrack_outcome = ""  # parent / ancestor / error:KIND, after a detour
        # tool block index -> its lines by candidate and its listing line (shuffle_triples)
        self.units: dict[int, tuple[list[list[str]], list[str]]] = {}
        # (trained segment index, offset of the thought in it, template text, action) per thought
        self.thoughts: list[tuple[int, int, str, str]] = []

    # --- names ---
    def query(self, entity: str) -> str:
        """What goes inside `<search>`/`<answer>`: the handle, else the label as the tool showed it."""
        return self.session.handle_of(entity) or self.labels[entity]

    def ref(self, entity: str) -> str:
        """How the thinking names an entity."""
        handle = self.session.handle_of(entity)
        if handle and self.g.config.thought_names:
            return f"{handle} {self.labels[entity]}"
        return handle or self.labels[entity]

    def unique_label(self, entity: str) -> bool:
        """True when no other shown entity has the same label (searching by name finds this one)."""
        wanted = normalize_answer(self.labels[entity])
        return sum(1 for other, label in self.labels.items() if normalize_answer(label) == wanted) == 1

    # --- text ---
    def template(self, group: str, **slots: str) -> str:
        values = {slot: "" for slot in SLOTS}
        plan = f" {PLAN_SEPARATOR} ".join(self.relation_key(r) for r in self.route.path)
        values.update(question=self.example.question, plan=plan, **slots)
        return self.rng.choice(self.g.templates[group]).format(**values)

    def think(self, hint: str, action: str) -> None:
        """Append the template thought before `action` (one per trained segment; a teacher may rewrite it later)."""
        self.thoughts.append((len(self.segments), len(self.buffer), hint, action))
        self.buffer += hint + " "

    def search(self, query: str) -> ToolResult:
        self.buffer += f"{SEARCH_OPEN}{query}{SEARCH_CLOSE}"
        self.segments.append(Segment(self.buffer, True))
        result = self.session.call(query)
        self.segments.append(Segment(format_tool_block(result.text), False))
        self.buffer = ""
        for edge in result.edges:
            for node, label in ((edge.subject, edge.subject_label), (edge.object, edge.object_label)):
                self.labels.setdefault(node, label)
            self.forward.setdefault((edge.subject, edge.relation), []).append(edge.object)
            self.forward.setdefault((edge.object, INVERSE_PREFIX + edge.relation), []).append(edge.subject)
        if self.g.config.shuffle_triples and result.edges:
            self.note_units(result)
        return result

    def note_units(self, result: ToolResult) -> None:
        """Remember the last block's lines grouped by candidate (a mediator's lines stay with its first edge),
        and its `more:` line, which stays last.

        A candidate's first edge is queried from the shown entity, a second one from the mediator.
        The block is left out of shuffling (and counted) if the lines rebuilt here differ from the tool's.
        """
        units: dict[str, list[str]] = {}
        unit: list[str] | None = None
        seen: set[str] = set()
        for edge in result.edges:
            line = triple_line(self.display(edge.subject), edge.relation, self.display(edge.object),
                               self.g.config.tool.relation_format)
            if (edge.subject if edge.direction == "out" else edge.object) == result.entity:
                unit = units.setdefault(line, [])
            if unit is not None and line not in seen:
                seen.add(line)
                unit.append(line)
        lines = result.text.split("\n")
        listing = [line for line in lines if line.startswith(MORE_PREFIX)]
        if sorted(seen) == sorted(line for line in lines if line not in listing) and sum(map(len, units.values())) == len(seen):
            self.units[len(self.segments) - 1] = ([u for u in units.values() if u], listing)
        else:
            self.g.stats["shuffle_block_kept"] += 1

    def display(self, entity: str) -> str:
        handle = self.session.handle_of(entity)
        return f"{handle} {self.labels[entity]}" if handle else self.labels[entity]

    def search_entity(self, entity: str, backtrack: bool = False, relation: str | None = None) -> ToolResult:
        """Search `entity` (its next page by `relation` when given, as the listing names it), or backtrack from it."""
        query = self.query(entity)
        if relation is not None:
            query = f"{query} {QUERY_SEPARATOR} {relation}"
        if backtrack:
            query = f"{query} {QUERY_SEPARATOR} {BACKTRACK_MARK}"
            self.backtracks += 1
        result = self.search(query)
        if result.entity != entity and not backtrack:
            raise Skip("name_resolves_elsewhere")
        self.searched.add(entity)
        return result

    def finish(self, answers: list[str]) -> None:
        answer = f" {ANSWER_SEPARATOR} ".join(self.query(a) for a in answers)
        self.buffer = self.buffer.rstrip() + f" {THINK_CLOSE}\n{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"
        self.segments.append(Segment(self.buffer, True))
        self.buffer = ""

    # --- the graph as shown ---
    def steps(self, source: str, hop: int) -> list[Step]:
        """Moves from `source` along the gold path at `hop` that the shown triples support and that still reach an answer."""
        path = self.route.path
        found: list[Step] = []
        frontier = [(source, ())]
        while frontier:
            node, taken = frontier.pop(0)
            relation = path[hop + len(taken)]
            for target in dict.fromkeys(self.forward.get((node, relation), [])):
                relations = taken + (relation,)
                end = hop + len(relations)
                through = self.kg.is_unnamed(target) and not is_literal_id(target) and end < len(path)
                if through and self.forward_from(target, path[end]):
                    frontier.append((target, relations))
                    continue
                if end == len(path) and self.allowed is not None and target not in self.allowed:
                    continue
                if self.g.reaches_gold(self.example, target, path[end:]):
                    found.append(Step(source, relations, target))
        # Moves that end at a named node first: searching a bare mediator is the fallback.
        found.sort(key=lambda s: self.kg.is_unnamed(s.target) and not is_literal_id(s.target))
        return list(dict.fromkeys(found))

    def forward_from(self, node: str, relation: str) -> bool:
        return bool(self.forward.get((node, relation)))

    def neighbours(self, source: str) -> list[Step]:
        """Every move from `source` the shown triples support (any relation, mediators passed through), in shown order."""
        moves: list[Step] = []
        for (node, relation), targets in self.forward.items():
            if node != source:
                continue
            for target in targets:
                if self.kg.is_unnamed(target) and not is_literal_id(target):
                    for (mid, second), beyond in self.forward.items():
                        if mid == target:
                            moves.extend(Step(source, (relation, second), b) for b in beyond if b != source)
                else:
                    moves.append(Step(source, (relation,), target))
        return list(dict.fromkeys(moves))

    def step_relations(self, source: str, hop: int) -> tuple[str, ...]:
        """The relations the next search from `source` covers: one, or more through unnamed nodes."""
        path = self.route.path
        nodes = follow(self.kg, [source], path[hop])
        end = hop + 1
        while end < len(path) and nodes and all(self.kg.is_unnamed(n) and not is_literal_id(n) for n in nodes):
            nodes = follow(self.kg, nodes, path[end])
            end += 1
        return tuple(path[hop:end])

    # --- phrases ---
    def need(self, source: str, relations: Sequence[str]) -> str:
        if all(r.startswith(INVERSE_PREFIX) for r in relations):
            return f"what has {relation_words(relations[::-1])} {self.ref(source)}"
        return f"the {relation_words(relations)} of {self.ref(source)}"

    def fact(self, step: Step) -> str:
        """The step as a sentence read along the triples (a backwards step from its far end)."""
        if all(r.startswith(INVERSE_PREFIX) for r in step.relations):
            return f"{self.ref(step.target)} has {relation_words(step.relations[::-1])} {self.ref(step.source)}"
        return f"{self.ref(step.source)} has {relation_words(step.relations)} {self.ref(step.target)}"

    def hop(self, step: Step) -> str:
        """The step along the path with each relation's key as the triples print it (`^` marks an incoming edge)."""
        return " ".join([self.ref(step.source), *map(self.relation_key, step.relations), self.ref(step.target)])

    def line(self, step: Step) -> str:
        """The triple line the step follows, exactly as the tool printed it; a step through a mediator as `hop`."""
        if len(step.relations) != 1:
            return self.hop(step)
        relation = step.relations[0]
        ends = (step.target, step.source) if relation.startswith(INVERSE_PREFIX) else (step.source, step.target)
        return triple_line(self.display(ends[0]), relation.removeprefix(INVERSE_PREFIX), self.display(ends[1]),
                           self.g.config.tool.relation_format)

    def relation_key(self, path_relation: str) -> str:
        """A path relation (`^rel` backwards) as plans and hops write it: the last word its triple line prints."""
        return relation_key(path_relation, self.g.config.tool.relation_format)


_HANDLE_TOKEN = re.compile(r"\b" + re.escape(HANDLE_PREFIX) + r"[1-9][0-9]*\b")


def shuffle_blocks(record: WarmupRecord, units: dict[int, tuple[list[list[str]], list[str]]], rng: random.Random,
                   handles: set[str]) -> WarmupRecord:
    """The record with each noted tool block's candidates in a random order (its `more:` line last) and handles renumbered.

    Handles (only tokens in `handles`, the ones the session gave out) are renumbered in order of
    first appearance over the whole completion, topic entities keeping E1.., so the record reads
    as if a tool that showed the candidates in this order had made it.
    """
    segments = list(record.segments)
    for index, (groups, listing) in units.items():
        order = list(groups)
        rng.shuffle(order)
        segments[index] = Segment(format_tool_block("\n".join([line for unit in order for line in unit] + listing)), False)
    mapping = {f"{HANDLE_PREFIX}{i}": f"{HANDLE_PREFIX}{i}" for i in range(1, len(record.topic_entities) + 1)}
    for segment in segments:
        for token in _HANDLE_TOKEN.findall(segment.text):
            if token in handles and token not in mapping:
                mapping[token] = f"{HANDLE_PREFIX}{len(mapping) + 1}"
    renamed = tuple(Segment(_HANDLE_TOKEN.sub(lambda m: mapping.get(m.group(0), m.group(0)), s.text), s.train) for s in segments)
    return WarmupRecord(**{**record.__dict__, "segments": renamed})


def renumber_handles(record: WarmupRecord, rng: random.Random, pool: int) -> WarmupRecord:
    """The record with every handle but the topic entities' (E1..) given a random unused number <= `pool`.

    The handles are the ones the tool blocks print; one mapping serves the whole record, so each
    search, step and answer still names the entity its line shows.
    """
    fixed = len(record.topic_entities)
    shown = sorted({t for s in record.segments if not s.train for t in _HANDLE_TOKEN.findall(s.text)
                    if int(t[len(HANDLE_PREFIX):]) > fixed}, key=lambda t: int(t[len(HANDLE_PREFIX):]))
    if len(shown) > pool - fixed:
        raise Skip("handle_pool_too_small")
    numbers = rng.sample(range(fixed + 1, pool + 1), len(shown))
    mapping = {t: f"{HANDLE_PREFIX}{n}" for t, n in zip(shown, numbers)}
    renamed = tuple(Segment(_HANDLE_TOKEN.sub(lambda m: mapping.get(m.group(0), m.group(0)), s.text), s.train)
                    for s in record.segments)
    return WarmupRecord(**{**record.__dict__, "segments": renamed})


def relation_words(relations: Sequence[str]) -> str:
    """Relations as words for the thinking text; a mediator step joins its two with ` / `."""
    return " / ".join(humanize_relation(r) for r in relations)


class WarmupGenerator:
    """Makes verified warm-up records for QA examples over one KG with one tool configuration.

    Each question is walked on `kg.for_example(example.id)`: the KG itself, or in a per-question
    KG (RoG's subgraphs) the question's own subgraph.
    """

    def __init__(self, kg: KnowledgeGraph, tool: KGSearchTool, config: WarmupConfig,
                 templates: dict[str, tuple[str, ...]] | None = None, teacher: Teacher | None = None) -> None:
        self.kg = kg
        self.tool = tool
        self.config = config
        self.templates = templates or dict(DEFAULT_TEMPLATES)
        self.teacher = teacher
        self.stats: Counter[str] = Counter()
        self._gold_cache: dict[str, tuple[set[str], set[str]]] = {}
        self._reach_cache: dict[tuple[str, str, tuple[str, ...]], bool] = {}

    # --- gold answers ---
    def gold(self, example: QAExample) -> tuple[set[str], set[str]]:
        """(answer ids, normalised answer names/aliases/ids) of an example."""
        if example.id not in self._gold_cache:
            ids = {a.id for a in example.answers}
            forms = {normalize_answer(f) for a in example.answers for f in a.surface_forms()}
            self._gold_cache[example.id] = (ids, {f for f in forms if f})
        return self._gold_cache[example.id]

    def is_gold(self, example: QAExample, entity: str) -> bool:
        ids, forms = self.gold(example)
        return entity in ids or normalize_answer(self.kg.for_example(example.id).label(entity)) in forms

    def reaches_gold(self, example: QAExample, entity: str, rest: Sequence[str]) -> bool:
        """True when following `rest` from `entity` gives a gold answer (cached per question)."""
        if not rest:
            return self.is_gold(example, entity)
        key = (example.id, entity, tuple(rest))
        if key not in self._reach_cache:
            reached = execute_path(self.kg.for_example(example.id), entity, rest)
            self._reach_cache[key] = any(self.is_gold(example, e) for e in reached)
        return self._reach_cache[key]

    def route(self, example: QAExample) -> tuple[Route, ...]:
        """The route(s) to walk: one gold path from a topic entity, or for a multi-topic question
        (`intersect`) each topic entity's own path, in order."""
        if not example.gold_paths:
            raise Skip("no_gold_path")
        if example.intersect:
            routes = tuple(Route(t, tuple(p)) for t, p in zip(example.topic_entities, example.gold_paths))
            if not all(r.path and self.reaches_gold(example, r.topic.id, r.path) for r in routes):
                raise Skip("gold_path_misses_answers")
            return routes
        for path in example.gold_paths:
            for topic in example.topic_entities:
                if path and self.reaches_gold(example, topic.id, path):
                    return (Route(topic, tuple(path)),)
        raise Skip("gold_path_misses_answers")

    # --- records ---
    def make(self, example: QAExample, correction: bool) -> WarmupRecord:
        """One verified record; a correction when asked and possible (else gold, counted). Raises Skip."""
        route = self.route(example)
        rng = random.Random(f"{self.config.seed}|{example.id}|gold")
        gold_writer = self.walk(example, route, rng, detour_at=None)
        made = self.correction(example, route, gold_writer.picks) if correction else None
        record, writer = made or (self.verify(example, gold_writer, "gold"), gold_writer)
        self.stats["repeated_searches"] += writer.repeats
        self.stats["first_shown_dead_ends"] += writer.dead_ends
        if writer.backtrack_outcome:
            self.stats[f"backtrack_output:{writer.backtrack_outcome}"] += 1
        if self.teacher is not None:
            record = self.teach(example, record, writer)
        if self.config.shuffle_triples:
            record = shuffle_blocks(record, writer.units, random.Random(f"{self.config.seed}|{example.id}|shuffle"),
                                    {h for h, _ in writer.session.shown_entities() if h})
        return record

    def teach(self, example: QAExample, record: WarmupRecord, writer: _Writer) -> WarmupRecord:
        """The record with each template thought replaced by the teacher's, where the teacher gave one.

        Thoughts never change what is searched, so they are written after the walk, only for the
        record that is kept; a rewritten record that fails verification keeps its templates.
        """
        assert self.teacher is not None
        segments = list(record.segments)
        handle_note = " (write the handle, e.g. E3, for an entity that has one)" if self.tool.config.entity_handles else ""
        for index, offset, hint, action in writer.thoughts:
            text = segments[index].text
            written = self.teacher.thought({
                "question": example.question,
                "topics": TOPIC_SEPARATOR.join(topic_names(example.topic_entities)),
                "trajectory": "".join(s.text for s in segments[:index]) + text[:offset],
                "action": action, "hint": hint, "handle_note": handle_note,
            })
            if written is not None:
                segments[index] = Segment(text[:offset] + written + text[offset + len(hint):], True)
        taught = WarmupRecord(**{**record.__dict__, "segments": tuple(segments)})
        try:
            return self.verify(example, writer, record.kind, taught.segments)
        except Skip:
            self.stats["teacher_record_rejected"] += 1
            return record

    def correction(self, example: QAExample, route: tuple[Route, ...], places: int) -> tuple[WarmupRecord, _Writer] | None:
        """A verified correction record, or None (counted) when no hop allows one.

        Hops are tried in a seeded order; the first whose backtrack shows new triples of the
        entity the detour left wins. Without one, the first that worked at all is used: in small
        KGs the entity's neighbours were all shown already, so the tool climbs to an ancestor or
        says nothing is left — real outputs the model also meets.
        """
        order = list(range(places))
        random.Random(f"{self.config.seed}|{example.id}|places").shuffle(order)
        reasons: list[str] = []
        fallback: tuple[WarmupRecord, _Writer] | None = None
        for attempt, place in enumerate(order):
            try:
                writer = self.walk(example, route, random.Random(f"{self.config.seed}|{example.id}|fix|{attempt}"), detour_at=place)
                record = self.verify(example, writer, "correction")
            except Skip as skip:
                reasons.append(skip.reason)
                continue
            if writer.backtrack_outcome == "parent":
                fallback = (record, writer)
                break
            fallback = fallback or (record, writer)
        if fallback is None:
            self.stats["correction_fell_back_to_gold"] += 1
            for reason in sorted(set(reasons)):
                self.stats[f"correction_failed:{reason}"] += 1
            return None
        return fallback

    def walk(self, example: QAExample, routes: tuple[Route, ...], rng: random.Random, detour_at: int | None) -> _Writer:
        """Search along the route(s); with `detour_at`, take a wrong entity at that step and backtrack.

        Where the gold continuation is not among the triples shown, the entity is searched again with
        the relation filter (`NAME | REL`, the relation its `more:` line lists) for its next page.
        A multi-topic question walks each topic's route in turn; every route but the first must end
        at an answer an earlier route's last search showed, and that shared entity is the answer.
        """
        w = _Writer(self, example, routes[0], rng)
        step_index = 0
        shared: set[str] | None = None
        current = routes[0].topic.id
        w.think(w.template("start", entity=w.ref(current), need=w.need(current, w.step_relations(current, 0))),
                f"search {w.query(current)}")
        result = w.search_entity(current)
        for number, route in enumerate(routes):
            w.route, w.allowed = route, shared
            path = route.path
            current, hop = route.topic.id, 0
            while True:
                options = w.steps(current, hop)
                while not options:
                    result = self.page(w, current, hop, result)
                    options = w.steps(current, hop)
                chosen = self.choose(w, options)
                w.picks += 1
                lead = ""
                dead_end = self.first_shown_dead_end(w, current, hop, options)
                if dead_end is not None:
                    w.dead_ends += 1
                    lead = self.detour(w, current, hop, options, chosen, pick=dead_end)
                    options = w.steps(current, hop)
                    chosen = self.choose(w, options)
                elif detour_at == step_index:
                    lead = self.detour(w, current, hop, options, chosen)
                    options = w.steps(current, hop)  # the backtrack may have shown more; the chosen one stays valid
                hop_after = hop + len(chosen.relations)
                fact = w.fact(chosen)
                hop_text = w.hop(chosen)
                line = w.line(chosen)
                first = (w.template("recover", entity=w.ref(current), fact=fact, hop=hop_text, line=line) if lead
                         else w.template("fact", fact=fact, hop=hop_text, line=line))
                step_index += 1
                if hop_after == len(path) and number + 1 < len(routes):
                    finals = {s.target for s in options if hop + len(s.relations) == len(path)}
                    shared = finals if shared is None else shared & finals
                    topic = routes[number + 1].topic.id
                    w.route = routes[number + 1]
                    hint = first + " " + w.template("joint", entity=w.ref(topic), need=w.need(topic, w.step_relations(topic, 0)))
                    w.think(hint, f"search {w.query(topic)}")
                    result = w.search_entity(topic)
                    break
                if hop_after == len(path):
                    answers = [chosen.target]
                    if self.config.answer_mode == "all":
                        answers = list(dict.fromkeys(answers + [s.target for s in options if hop + len(s.relations) == len(path)]))
                    answer_text = f" {ANSWER_SEPARATOR} ".join(w.ref(a) for a in answers)
                    final = w.template("final", answer=answer_text)
                    if len(routes) > 1:
                        final = w.template("common", answer=answer_text) + " " + final
                    w.think(first + " " + final, f"answer {answer_text}")
                    w.finish(answers)
                    break
                next_relations = w.step_relations(chosen.target, hop_after)
                hint = first + " " + w.template("next", entity=w.ref(chosen.target), need=w.need(chosen.target, next_relations))
                w.think(hint, f"search {w.query(chosen.target)}")
                result = w.search_entity(chosen.target)
                current, hop = chosen.target, hop_after
        if detour_at is not None and w.backtracks == w.dead_ends:
            raise Skip("detour_not_taken")
        return w

    def page(self, w: _Writer, current: str, hop: int, result: ToolResult) -> ToolResult:
        """The next page of `current`'s lines by the hop's relation (`NAME | REL`), when its last result lists
        unseen ones by it and `max_repeats` allows; else Skip."""
        if result.error is not None:
            raise Skip(f"gold_not_shown:{result.error}")
        relation = w.route.path[hop]
        wanted = relation_filter_name(relation.removeprefix(INVERSE_PREFIX), self.tool.config.relation_format)
        if wanted not in dict(result.more):
            raise Skip("gold_not_shown")
        if w.repeats >= self.config.max_repeats:
            raise Skip("gold_not_shown:max_repeats")
        w.repeats += 1
        need = w.need(current, w.step_relations(current, hop))
        hint = w.template("again", entity=w.ref(current), need=need, relation=wanted)
        w.think(hint, f"search {w.query(current)} {QUERY_SEPARATOR} {wanted}")
        return w.search_entity(current, relation=wanted)

    def choose(self, w: _Writer, options: list[Step]) -> Step:
        """The question's own witness entity if shown, else the first shown; by name only an unambiguous one."""
        if not self.tool.config.entity_handles:
            options = [s for s in options if w.unique_label(s.target)]
            if not options:
                raise Skip("namesakes_shown")
        if self.config.pick == "first_shown":
            return options[0]
        witness = set(w.example.extra.get("path_entities") or [])
        return next((s for s in options if s.target in witness), options[0])

    def first_shown_dead_end(self, w: _Writer, current: str, hop: int, options: list[Step]) -> Step | None:
        """With `pick: first_shown`, the first entity shown by the gold relation from `current` when it
        reaches no answer because it lacks the next gold relation in the KB (not merely another answer),
        is named and was not searched yet; else None."""
        path = w.route.path
        if self.config.pick != "first_shown" or hop + 1 >= len(path):
            return None
        shown = list(dict.fromkeys(w.forward.get((current, path[hop]), [])))
        if not shown or shown[0] in {s.target for s in options}:
            return None
        first = shown[0]
        if (first in w.searched or is_literal_id(first) or w.kg.is_unnamed(first) or self.is_gold(w.example, first)
                or follow(w.kg, [first], path[hop + 1])):
            return None
        return Step(current, (path[hop],), first)

    def detour(self, w: _Writer, current: str, hop: int, options: list[Step], chosen: Step,
               pick: Step | None = None) -> str:
        """Search a wrong shown entity (`pick`, else one chosen here), say why it does not fit, backtrack;
        returns the text so far."""
        path = w.route.path
        first_shown = pick is not None
        if first_shown:
            siblings = [pick]
        else:
            valid = {s.target for s in options}
            wrong = [s for s in w.neighbours(current)
                     if s.target not in valid and s.target not in w.searched and s.target != current
                     and not is_literal_id(s.target) and not w.kg.is_unnamed(s.target)
                     and not self.is_gold(w.example, s.target)
                     and (self.tool.config.entity_handles or w.unique_label(s.target))]
            if not wrong:
                raise Skip("no_wrong_entity")
            # A sibling by the same relation that does not continue the path is the most plausible mistake.
            siblings = [s for s in wrong if s.relations == chosen.relations]
            pick = siblings[0] if siblings else w.rng.choice(wrong[:3])
        need = w.need(current, chosen.relations)
        rest = hop + len(chosen.relations)
        if first_shown:
            # Following the first matching line is the policy, not a mistake: the thought is the one of any hop.
            ahead = w.template("next", entity=w.ref(pick.target), need=w.need(pick.target, path[rest:rest + 1]))
            thought = w.template("fact", fact=w.fact(pick), hop=w.hop(pick), line=w.line(pick)) + " " + ahead
        else:
            thought = w.template("detour", wrong=w.ref(pick.target), wrong_fact=w.fact(pick), wrong_hop=w.hop(pick),
                                 wrong_line=w.line(pick))
        w.think(thought, f"search {w.query(pick.target)}")
        result = w.search_entity(pick.target)
        if result.error is not None:
            notice = w.template("notice_empty", wrong=w.ref(pick.target))
        elif siblings and rest < len(path):
            if w.steps(pick.target, rest):
                raise Skip("sibling_continues")
            notice = w.template("notice_dead_end", wrong=w.ref(pick.target), next_relation=relation_words(path[rest:rest + 1]),
                                next_key=w.relation_key(path[rest]))
        else:
            notice = w.template("notice_relation", wrong=w.ref(pick.target), wrong_relation=relation_words(pick.relations),
                                need=need, entity=w.ref(current))
        w.think(notice, f"search {w.query(pick.target)} {QUERY_SEPARATOR} {BACKTRACK_MARK}")
        back = w.search_entity(pick.target, backtrack=True)
        if back.error is not None:
            w.backtrack_outcome = f"error:{back.error}"
        else:
            w.backtrack_outcome = "parent" if back.entity == current else "ancestor"
        return notice

    def verify(self, example: QAExample, writer: _Writer, kind: str,
               segments: Sequence[Segment] | None = None) -> WarmupRecord:
        """The record of `writer` (or `segments` written in its session), if its format is valid, its answers
        resolve in that session to gold answers and it holds exactly the backtracks the walk made (one
        when a correction, plus one per `first_shown` dead end); else Skip."""
        segments = writer.segments if segments is None else segments
        session = writer.session
        record = WarmupRecord(id=example.id, question=example.question, topic_entities=tuple(example.topic_entities),
                              segments=tuple(segments), kind=kind, hops=example.hops, split=example.split)
        completion = record.completion
        report = check_format(completion)
        if not report.valid:
            raise Skip(f"invalid_format:{report.errors[0]}")
        parsed = parse_trajectory(completion)
        if parsed.answer_text is None:
            raise Skip("no_answer")
        _, forms = self.gold(example)
        answers = session.resolve_answer(parsed.answer_text)
        if not answers or not all(normalize_answer(a) in forms for a in answers):
            raise Skip("answer_not_gold")
        backtracks = sum(1 for s in parsed.searches if s.is_backtrack)
        if backtracks != writer.backtracks or backtracks != writer.dead_ends + (kind == "correction"):
            raise Skip("backtrack_count")
        return record


# --- the whole set ---------------------------------------------------------------------------------
def generate_records(generator: WarmupGenerator, examples: Sequence[QAExample], limit: int | None,
                     progress: bool = False, label: str = "warm-up") -> tuple[list[WarmupRecord], Counter[str]]:
    """Records for up to `limit` examples (None: all), in a seeded order; skipped questions are counted by reason.

    Corrections are scheduled so that the running share stays at `correction_share`: a question
    that cannot take a detour becomes a gold record and the next one is asked again.

    Questions of a per-question KG without gold paths get them derived on their own subgraph
    (`with_derived_paths`): all first where the order (stratified by hops) or paraphrase mixing
    (questions paired by path) needs them, else each when the loop reaches it.
    """
    config = generator.config
    upfront = config.sample == "stratified" or config.augment.paraphrase_mixing > 0
    if upfront:
        examples = [with_derived_paths(e, generator.kg) for e in examples]
    augment = QuestionAugmenter(examples, config.augment, config.seed)
    if config.sample == "stratified":
        order = stratified_order(examples, config.seed)
    else:
        order = list(examples)
        random.Random(f"{config.seed}|order").shuffle(order)
    records: list[WarmupRecord] = []
    skipped: Counter[str] = Counter()
    corrections = made = 0
    bar = tqdm(total=limit if limit is not None else len(order), desc=label, unit="question", disable=not progress)
    for example in order:
        if limit is not None and made >= limit:
            break
        want_correction = corrections < round(config.correction_share * (made + 1))
        if not upfront:
            example = with_derived_paths(example, generator.kg)
        try:
            record = _make_augmented(generator, augment(example), example, want_correction)
        except Skip as skip:
            skipped[skip.reason] += 1
            continue
        if example.split == "train" and config.handle_numbers == "random":
            try:
                copies = [renumber_handles(record, random.Random(f"{config.seed}|{example.id}|handles|{copy}"),
                                           config.handle_pool) for copy in range(config.copies)]
            except Skip as skip:
                skipped[skip.reason] += 1
                continue
        else:
            copies = [record]
        corrections += record.kind == "correction"
        made += 1
        records.extend(copies)
        if example.split == "train" and config.lookup_drills:
            for number, copy in enumerate(copies):
                rng = random.Random(f"{config.seed}|{example.id}|drill|{number}")
                records.extend(lookup_drills(copy, rng, config.lookup_drills))
        bar.update(1)
    bar.close()
    generator.stats.update(augment.stats)
    return records, skipped


def _make_augmented(generator: WarmupGenerator, augmented: QAExample, example: QAExample, correction: bool) -> WarmupRecord:
    """The record of the rewritten question, else (its answer was the renamed topic, say) of the original one."""
    if augmented is example:
        return generator.make(example, correction)
    try:
        return generator.make(augmented, correction)
    except Skip:
        generator.stats["augment_fell_back"] += 1
        return generator.make(example, correction)


def summarize(records: Sequence[WarmupRecord], skipped: dict[str, Counter[str]], generator: WarmupGenerator,
              config: WarmupConfig, tokenizer: Any = None, seconds: float = 0.0) -> dict[str, Any]:
    """Counts by kind, hops and split, skips by reason, mean searches and characters (and tokens)."""
    parsed = [parse_trajectory(r.completion) for r in records]
    summary: dict[str, Any] = {
        "dataset": config.dataset,
        "split_scheme": config.split_scheme,
        "split_seed": config.split_seed,
        "seed": config.seed,
        "entity_handles": generator.tool.config.entity_handles,
        "ranking": generator.tool.config.ranking,
        "top_k": generator.tool.config.top_k,
        "answer_mode": config.answer_mode,
        "records": len(records),
        "by_kind": dict(sorted(Counter(r.kind for r in records).items())),
        "by_hops": {str(k): v for k, v in sorted(Counter(r.hops for r in records).items())},
        "by_split": dict(sorted(Counter(r.split for r in records).items())),
        "correction_share": round(sum(r.kind == "correction" for r in records)
                                  / max(1, sum(r.kind != "drill" for r in records)), 4),
        "skipped": {split: dict(sorted(c.items())) for split, c in skipped.items()},
        "notes": dict(sorted(generator.stats.items())),
        "mean_searches": round(sum(len(p.searches) for p in parsed) / max(1, len(parsed)), 3),
        "mean_chars": round(sum(len(r.completion) for r in records) / max(1, len(records)), 1),
        "seconds": round(seconds, 2),
    }
    if generator.teacher is not None:
        summary["teacher"] = generator.teacher.stats()
    if tokenizer is not None and records:
        total = trained = 0
        for record in records:
            for segment in record.segments:
                n = len(tokenizer(segment.text, add_special_tokens=False)["input_ids"])
                total += n
                trained += n if segment.train else 0
        summary["mean_completion_tokens"] = round(total / len(records), 1)
        summary["mean_trained_tokens"] = round(trained / len(records), 1)
    return summary


def sample_records(records: Sequence[WarmupRecord], size: int) -> list[WarmupRecord]:
    """The records of the first `size` training questions (in the order made) and every dev record."""
    first: set[str] = set()
    for record in records:
        if record.split == "train" and len(first) < size:
            first.add(record.id)
    return [r for r in records if r.split != "train" or r.id in first]


def run(config: WarmupConfig) -> dict[str, Any]:
    """Load the data, generate train (and dev) records, write the JSONL and the summary; returns the summary."""
    from kgreasoner.data import load_dataset, open_dataset_kg

    started = time.perf_counter()
    dataset = load_dataset(config.dataset, scheme=config.split_scheme, seed=config.split_seed, root=config.data_root)
    kg = open_dataset_kg(dataset)
    teacher = Teacher(config.teacher) if config.teacher.enabled else None
    generator = WarmupGenerator(kg, KGSearchTool(kg, config.tool), config, load_templates(config.templates), teacher)
    records: list[WarmupRecord] = []
    skipped: dict[str, Counter[str]] = {}
    for split, limit in (("train", config.num_examples), ("dev", config.dev_examples)):
        if limit == 0:
            continue
        made, skipped[split] = generate_records(generator, dataset.split(split), limit, config.progress, f"warm-up {split}")
        records.extend(made)
    write_warmup(records, config.output)
    if config.sample_output:
        write_warmup(sample_records(records, config.sample_size), config.sample_output)
    tokenizer = None
    if config.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(config.tokenizer)
    summary = summarize(records, skipped, generator, config, tokenizer, time.perf_counter() - started)
    summary["dataset_name"] = dataset.name
    summary["output"] = str(config.output)
    path = config.summary_path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    return summary


def replay_tool_blocks(record: WarmupRecord, tool: KGSearchTool) -> list[str]:
    """Re-run the record's searches in a fresh session; the tool blocks it gets, in order.

    Equal to the record's masked segments when the record was made with this tool and KG.
    """
    session = tool.session(record.question, list(record.topic_entities), example_id=record.id)
    return [format_tool_block(session.call(search.raw).text) for search in parse_trajectory(record.completion).searches]


# --- command line ----------------------------------------------------------------------------------
def register(subparsers: argparse._SubParsersAction) -> None:
    """The `warmup` subcommand of `kgreasoner`."""
    parser = subparsers.add_parser("warmup", help=_HELP, description=_description(),
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    parser.set_defaults(func=run_command)


_HELP = "generate warm-up SFT trajectories (with error correction) by running the search tool along gold paths"


def _description() -> str:
    return f"{_HELP}.\n\nFields of the --config YAML (WarmupConfig):\n{describe(WarmupConfig)}"


def run_command(args: argparse.Namespace) -> int:
    config = load_config(WarmupConfig, args.config, args.overrides)
    summary = run(config)
    print(json.dumps({k: summary[k] for k in ("dataset_name", "records", "by_kind", "by_hops", "by_split", "skipped")}, indent=2))
    print(f"wrote {summary['output']} and {config.summary_path} in {summary['seconds']}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m data_gen.warmup", description=_description(),
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_command(args)
    except (FileNotFoundError, ValueError) as err:
        print(f"warmup: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
