"""The template thoughts of warm-up trajectories: the built-in groups, their slots, and `load_templates`,
which replaces groups from a YAML file."""

from __future__ import annotations

from pathlib import Path

import yaml

from kgreasoner.config import ConfigError, resolve_recipe
from kgreasoner.protocol import TAGS

PLAN_SEPARATOR = ","
"""Joins the relation keys of the `plan` slot."""

# Template groups and the slots they may use (every slot is filled in every call; unused ones are ignored).
# `fact` reads a step as words ("E1 has spouse E2"); `hop` writes it with each relation's key, the last word
# its triple line prints (the id itself, or with `tool.relation_format: words` its last namespace part):
# "E1 spouse E2"; `plan` is the whole gold relation path in those keys ("spouse , parents"), so a template
# set can have the model plan once and then copy tokens it has seen; `next_key` is the relation a dead end
# lacks, written the same way; `line` is the followed triple line verbatim ("(E1 ada, spouse, E2 bob)"), so
# the handle to search continues a span copied from the block instead of being looked up two tokens away.
SLOTS = (
    "entity",
    "need",
    "fact",
    "hop",
    "line",
    "plan",
    "answer",
    "wrong",
    "wrong_fact",
    "wrong_hop",
    "wrong_line",
    "wrong_relation",
    "next_relation",
    "next_key",
    "question",
    "relation",
)
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
    # ... and the listing does not name the relation it needs but says more relations are left: the next
    # listing of the entity's relations (`NAME | relations`)
    "list": (
        "The listing of {entity} names no relation for {need}, and {entity} has more relations, so I list them.",
        "{entity} has more relations than the listing shows; I list the others to find {need}.",
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


def load_templates(path: str | Path | None) -> dict[str, tuple[str, ...]]:
    """The built-in templates, with the groups a YAML file names replaced; bad files raise naming the group."""
    templates = dict(DEFAULT_TEMPLATES)
    if path is None:
        return templates
    try:
        path = Path(resolve_recipe(path))  # `configs/...` from the package's own recipes when not here
    except FileNotFoundError:
        raise FileNotFoundError(f"templates file not found: {path}") from None
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
                raise ConfigError(
                    f"{path}: template {group}[{index}] {text!r}: bad slot {err}; slots: {', '.join(SLOTS)}"
                ) from err
            if any(tag in text for tag in TAGS):
                raise ConfigError(f"{path}: template {group}[{index}] contains a protocol tag")
    return templates
