"""Prompts of the ToG baseline (Think-on-Graph, Sun et al., ICLR 2024), all in one place.

Written for this project following the paper's four LLM steps (relation pruning, entity
scoring, sufficiency check, answer); not ToG's own prompt text. Every prompt has a
`Question:` line, and each step asks for a reply format its parser below reads:
- relation pruning: lines `{relation} (score: 0.6)`;
- entity scoring: lines `{entity} (score: 0.6)`;
- sufficiency: `{Yes}` or `{No}` first;
- answer: `Answer: {A | B}`.
Relation pruning and entity scoring carry one worked example each (`few_shot`), for a prompted
model; `ToGConfig.few_shot` leaves it out for a model fine-tuned on these prompts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from kgreasoner.baselines.base import braced_answers, first_line_answer

RELATION_PROMPT = """You are walking a knowledge graph to answer a question. Below are the relations \
attached to one entity. Choose at most {width} of them that are the most likely to lead towards the \
answer, and give each a score between 0 and 1 (the scores of your choices add up to 1).
Write one line per chosen relation, exactly as: {{relation}} (score: 0.5)

{example}Question: {question}
Entity: {entity}
Relations:
{relations}
Choices:
"""

RELATION_EXAMPLE = """Example.
Question: Which currency is used in the country where the Danube ends?
Entity: Danube
Relations:
geography.river.mouth
geography.river.length
geography.river.basin_countries
Choices:
{geography.river.mouth} (score: 0.7)
{geography.river.basin_countries} (score: 0.3)

"""

ENTITY_PROMPT = """You are walking a knowledge graph to answer a question. Following the relation below \
from the entity below reaches the candidate entities listed. Score how useful each candidate is for \
answering the question, between 0 and 1 (the scores add up to 1).
Write one line per candidate, exactly as: {{candidate}} (score: 0.5)

{example}Question: {question}
Entity: {entity}
Relation: {relation}
Candidates:
{candidates}
Scores:
"""

ENTITY_EXAMPLE = """Example.
Question: Which currency is used in the country where the Danube ends?
Entity: Danube
Relation: geography.river.mouth
Candidates:
Black Sea
Danube Delta
Scores:
{Black Sea} (score: 0.8)
{Danube Delta} (score: 0.2)

"""

SUFFICIENCY_PROMPT = """Decide whether the knowledge triplets below, together with what you know, are \
enough to answer the question. Start your reply with {{Yes}} or {{No}}, then give one sentence of reasons.

Question: {question}
Knowledge triplets:
{triplets}
Enough?
"""

ANSWER_PROMPT = """Answer the question using the knowledge triplets below (if any) and what you know. \
Reason briefly, then end with the answer in braces after "Answer:", separating several answers with |, \
as in Answer: {{first | second}}.

Question: {question}
Knowledge triplets:
{triplets}
Reply:
"""

NO_TRIPLETS = "(none found)"
_SCORED_LINE = re.compile(r"\{([^{}]+)\}\s*\(\s*score\s*:\s*([0-9]*\.?[0-9]+)\s*\)", re.IGNORECASE)
_YES_NO = re.compile(r"\{\s*(yes|no)\s*\}", re.IGNORECASE)


def relation_prompt(question: str, entity: str, relations: Sequence[str], width: int, few_shot: bool = True) -> str:
    return RELATION_PROMPT.format(
        question=question,
        entity=entity,
        relations="\n".join(relations),
        width=width,
        example=RELATION_EXAMPLE if few_shot else "",
    )


def entity_prompt(question: str, entity: str, relation: str, candidates: Sequence[str], few_shot: bool = True) -> str:
    return ENTITY_PROMPT.format(
        question=question,
        entity=entity,
        relation=relation,
        candidates="\n".join(candidates),
        example=ENTITY_EXAMPLE if few_shot else "",
    )


def format_triplets(triplets: Sequence[tuple[str, str, str]]) -> str:
    return "\n".join(f"({h}, {r}, {t})" for h, r, t in triplets) or NO_TRIPLETS


def sufficiency_prompt(question: str, triplets: Sequence[tuple[str, str, str]]) -> str:
    return SUFFICIENCY_PROMPT.format(question=question, triplets=format_triplets(triplets))


def answer_prompt(question: str, triplets: Sequence[tuple[str, str, str]]) -> str:
    return ANSWER_PROMPT.format(question=question, triplets=format_triplets(triplets))


def parse_scored(reply: str, options: Sequence[str]) -> list[tuple[str, float]]:
    """(option, score) for each `{option} (score: x)` line naming one of `options`, in reply order.

    Options match exactly, else case-insensitively; unknown names and repeats are dropped.
    """
    by_lower = {o.lower(): o for o in options}
    known = set(options)
    picked: dict[str, float] = {}
    for name, score in _SCORED_LINE.findall(reply):
        name = name.strip()
        option = name if name in known else by_lower.get(name.lower())
        if option is not None and option not in picked:
            picked[option] = float(score)
    return list(picked.items())


def parse_sufficient(reply: str) -> bool | None:
    """True for `{Yes}`, False for `{No}` (the first one written), None when neither is there."""
    match = _YES_NO.search(reply)
    return None if match is None else match.group(1).lower() == "yes"


def parse_answer(reply: str) -> tuple[list[str], bool]:
    """(answers, format valid): `Answer: {A | B}`, else the lenient first-line reading."""
    answers = braced_answers(reply)
    if answers:
        return answers, True
    return first_line_answer(reply), False
