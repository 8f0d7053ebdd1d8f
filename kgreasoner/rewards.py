"""The composite GRPO reward (paper, Section 4.3) as TRL reward callables.

Each function has TRL's signature `f(completions, **kwargs) -> list[float]`:

- `search_reward`: `min(0.5 * n, 0.8)` with n the retrieval actions that returned triples (the paper's
  form; `shaped_search_reward` gives the others of `SEARCH_FORMS`, such as `0.8 * min(n, h) / h`).
  A failed search (unknown or empty name, nothing left to backtrack to, no neighbours) does not
  count: rewarding it would pay the policy for spamming names it has not seen. n comes from the
  rollout's `num_searches` column when present (the engine counts calls whose result had no error
  and at least one triple), else from the text: `</search>` tags followed by a `<triples>` block
  holding at least one triple line `(...)`.
- `format_reward`: 0.5 when `protocol.check_format` accepts the completion, else 0.
- `answer_reward`: 1 when the FIRST answer, normalised with `kgreasoner.data.normalize_answer`,
  equals a normalised gold answer name, alias or id; else 0.
  The first answer is taken from `resolved_answers` (session-resolved labels, so `E5` counts as
  the entity it names) when the column is given (a row without answers scores 0: the text is not
  parsed again), else from the text.
- `total_reward`: the sum of the three.

Completions may be strings or chat message lists; when the rollout provides `completion_text`
(the engine's own decoding, which keeps tags that a tokenizer marks special) it is used instead.
With the rollout's `tool_spans` column (where the tool's blocks sit in `completion_text`),
answers, searches and the layout are read from model-written text only: a KG label that prints
`</triples><answer>X</answer>` inside a tool block is text, not an answer. Without it, an answer is
still read only outside every tool block, closed or cut short (`protocol.model_tail`).
Gold answers come from the `answers` column (strings, `{"name", "aliases", "id"}` dicts or
`Answer` objects) and an optional `answer_aliases` column (a list of strings per row).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kgreasoner.data.gold_chains import SearchStep, chain_progress
from kgreasoner.protocol import (
    SEARCH_CLOSE,
    TRIPLES_CLOSE,
    TRIPLES_OPEN,
    ToolSpans,
    check_format,
    parse_trajectory,
    tag_events,
)
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import Answer

SEARCH_STEP = 0.5
SEARCH_CAP = 0.8
FORMAT_SCORE = 0.5
ANSWER_SCORE = 1.0


def completion_texts(completions: Sequence[object], completion_text: Sequence[str] | None = None) -> list[str]:
    """Plain text per completion: the rollout's own text if given, else the completion itself (TRL's text, or
    the completion's chat messages, whose assistant contents are joined; anything else as `str` gives it)."""
    if completion_text is not None:
        return [str(t) for t in completion_text]
    texts = []
    for completion in completions:
        if isinstance(completion, str):
            texts.append(completion)
        elif isinstance(completion, (list, tuple)):
            texts.append(
                "".join(
                    str(m.get("content", ""))
                    for m in completion
                    if isinstance(m, dict) and m.get("role", "assistant") == "assistant"
                )
            )
        else:
            texts.append(str(completion))
    return texts


def count_searches(text: str, tool_spans: ToolSpans | None = None) -> int:
    """Searches whose tool block shows at least one triple line (the text-only fallback for n).

    A `</search>` counts when the next tag is `<triples>` with only whitespace between, and the
    text up to the first `</triples>` after it holds a triple line; with `tool_spans` that block
    must be one the tool inserted. One pass over the tags: linear in the text.
    """
    count = 0
    search_end = block_start = None
    for tag, start, end, by_tool in tag_events(text, tool_spans):
        if block_start is not None:
            if tag == TRIPLES_CLOSE:
                count += _has_triple_line(text[block_start:start])
                block_start = None
            continue
        if (
            search_end is not None
            and tag == TRIPLES_OPEN
            and not text[search_end:start].strip()
            and by_tool == (tool_spans is not None)
        ):
            block_start = end
        search_end = end if tag == SEARCH_CLOSE else None
    return count


def _has_triple_line(block: str) -> bool:
    """A line that is `(...)` with something inside, give or take surrounding whitespace."""
    for line in block.split("\n"):
        line = line.strip()
        if len(line) > 2 and line[0] == "(" and line[-1] == ")":
            return True
    return False


def _spans(tool_spans: Sequence[ToolSpans | None] | None, i: int) -> ToolSpans | None:
    return None if tool_spans is None else tool_spans[i]


def search_reward(
    completions: Sequence[object],
    num_searches: Sequence[int] | None = None,
    completion_text: Sequence[str] | None = None,
    tool_spans: Sequence[ToolSpans | None] | None = None,
    **kwargs: object,
) -> list[float]:
    texts = completion_texts(completions, completion_text)
    counts = (
        list(num_searches)
        if num_searches is not None
        else [count_searches(t, _spans(tool_spans, i)) for i, t in enumerate(texts)]
    )
    return [paper_value(int(n)) for n in counts]


def paper_value(searches: int) -> float:
    """The paper's search reward for `searches` successful searches: `min(0.5 n, 0.8)`."""
    return min(SEARCH_STEP * searches, SEARCH_CAP)


def hop_share(searches: int, hops: int) -> float:
    """The `hops` form's value: `0.8 * min(n, h) / h`, the cap shared out over the question's h searches."""
    return SEARCH_CAP * (min(searches, hops) / hops)  # the share first: all h searches pay the cap exactly


def format_reward(
    completions: Sequence[object],
    completion_text: Sequence[str] | None = None,
    tool_spans: Sequence[ToolSpans | None] | None = None,
    **kwargs: object,
) -> list[float]:
    texts = completion_texts(completions, completion_text)
    return [FORMAT_SCORE if check_format(t, _spans(tool_spans, i)).valid else 0.0 for i, t in enumerate(texts)]


def gold_forms(answers: object, aliases: Sequence[str] | None = None) -> set[str]:
    """Normalised surface forms of one row's gold answers (names, aliases, ids)."""
    forms: list[str] = []
    items = answers if isinstance(answers, (list, tuple)) else [answers]
    for item in items:
        if item is None:
            continue
        if isinstance(item, str):
            forms.append(item)
        elif isinstance(item, dict):
            forms.extend(str(item[k]) for k in ("name", "id") if item.get(k))
            forms.extend(str(a) for a in item.get("aliases") or [])
        elif isinstance(item, Answer):
            forms.extend(item.surface_forms())
        else:
            forms.append(str(item))
    forms.extend(aliases or [])
    return {normalize_answer(f) for f in forms if normalize_answer(f)}


def first_answer(text: str, resolved: Sequence[str] | None = None, tool_spans: ToolSpans | None = None) -> str | None:
    """The answer Hits@1 scores: the first resolved answer when the rollout gave them (None when it
    found no answer: the full text, tool blocks included, must not be searched for one), else the
    first answer in the text's model-written part (without `tool_spans`: after its last tool block, and
    none when the text ends inside one, `protocol.model_tail`)."""
    if resolved is not None:
        return str(resolved[0]) if resolved else None
    return parse_trajectory(text, tool_spans).first_answer


def answer_reward(
    completions: Sequence[object],
    answers: Sequence[object] | None = None,
    answer_aliases: Sequence[Sequence[str]] | None = None,
    resolved_answers: Sequence[Sequence[str]] | None = None,
    completion_text: Sequence[str] | None = None,
    tool_spans: Sequence[ToolSpans | None] | None = None,
    **kwargs: object,
) -> list[float]:
    texts = completion_texts(completions, completion_text)
    if answers is None:
        raise ValueError("answer_reward needs the gold answers: a dataset column named 'answers'")
    return [
        ANSWER_SCORE
        if is_right(
            text,
            answers[i],
            resolved_answers[i] if resolved_answers is not None else None,
            _spans(tool_spans, i),
            answer_aliases[i] if answer_aliases is not None else None,
        )
        else 0.0
        for i, text in enumerate(texts)
    ]


def is_right(
    text: str,
    answers: object,
    resolved: Sequence[str] | None = None,
    tool_spans: ToolSpans | None = None,
    aliases: Sequence[str] | None = None,
) -> bool:
    """Whether a completion answers right: its first answer (`first_answer`), normalised, is one of the gold
    answers' normalised names, aliases or ids (`gold_forms`). The answer reward, the rollout figures and the
    dev evaluation all judge with it."""
    prediction = first_answer(text, resolved, tool_spans)
    return prediction is not None and normalize_answer(prediction) in gold_forms(answers, aliases)


def total_reward(
    completions: Sequence[object],
    answers: Sequence[object] | None = None,
    answer_aliases: Sequence[Sequence[str]] | None = None,
    resolved_answers: Sequence[Sequence[str]] | None = None,
    num_searches: Sequence[int] | None = None,
    completion_text: Sequence[str] | None = None,
    tool_spans: Sequence[ToolSpans | None] | None = None,
    **kwargs: object,
) -> list[float]:
    parts = (
        search_reward(completions, num_searches, completion_text, tool_spans),
        format_reward(completions, completion_text, tool_spans),
        answer_reward(completions, answers, answer_aliases, resolved_answers, completion_text, tool_spans),
    )
    return [sum(values) for values in zip(*parts)]


SEARCH_FORMS = ("paper", "hops", "correct", "correct_hops", "path")
"""How the search reward counts (`search_form`):

- `paper`: `min(0.5 n, 0.8)` whatever the question needs. It pays a second search on a 1-hop
  question, and a policy trained on it learned exactly that (searches per question 1.5 -> 3.4, 2-hop
  answers lost).
- `hops`: `0.8 * min(n, h) / h` with h the question's hop count (the `hops` column): each search up
  to the hop count earns an equal share of the cap, so a 3-hop question pays its third search
  (0.267, 0.533, 0.8) and a 1-hop question its first (0.8), while a needless search earns nothing.
  A question of unknown hops (0, or no `hops` column) is paid the paper's form.
- `correct`: the paper's value, paid only when the answer is right, so searching is rewarded as the
  way to a right answer rather than for itself.
- `correct_hops`: the `hops` value, paid only when the answer is right.
- `path`: progress along the gold path, `SEARCH_CAP * depth / h` (`path_search_reward`): a rollout that
  searched its way along the whole path, or was shown the answer, gets what the paper's form pays
  at its cap; one that searched the topic entity of a 3-hop question a third of it.
"""


def shaped_search_reward(form: str = "paper") -> Callable[..., list[float]]:
    """The search reward of one of SEARCH_FORMS as a TRL reward callable named `search_reward`."""
    if form not in SEARCH_FORMS:
        raise ValueError(f"search reward form must be one of {SEARCH_FORMS}, got {form!r}")
    if form == "paper":
        return search_reward
    if form == "path":
        return path_search_reward

    def shaped(
        completions: Sequence[object],
        num_searches: Sequence[int] | None = None,
        completion_text: Sequence[str] | None = None,
        hops: Sequence[int] | None = None,
        tool_spans: Sequence[ToolSpans | None] | None = None,
        answers: Sequence[object] | None = None,
        answer_aliases: Sequence[Sequence[str]] | None = None,
        resolved_answers: Sequence[Sequence[str]] | None = None,
        **kwargs: object,
    ) -> list[float]:
        texts = completion_texts(completions, completion_text)
        spans = list(tool_spans) if tool_spans is not None else [None] * len(texts)
        counts = (
            [int(n) for n in num_searches]
            if num_searches is not None
            else [count_searches(t, s) for t, s in zip(texts, spans)]
        )
        if form in ("hops", "correct_hops") and hops is not None:
            values = [hop_share(n, int(h)) if h else paper_value(n) for n, h in zip(counts, hops)]
        else:
            values = [paper_value(n) for n in counts]
        if form in ("correct", "correct_hops"):
            right = answer_reward(completions, answers, answer_aliases, resolved_answers, completion_text, tool_spans)
            values = [v if r > 0 else 0.0 for v, r in zip(values, right)]
        return values

    shaped.__name__ = "search_reward"
    return shaped


def path_search_reward(
    completions: Sequence[object],
    gold_chains: Sequence[str] | None = None,
    search_record: Sequence[Sequence[SearchStep]] | None = None,
    hops: Sequence[int] | None = None,
    **kwargs: object,
) -> list[float]:
    """The `path` form: `SEARCH_CAP` times the rollout's progress along its question's gold path.

    Progress (`kgreasoner.data.gold_chains.chain_progress`) is the deepest level of the gold path
    that the rollout's successful searches reached in order, or the whole path once an answer entity
    was shown in a tool block (a shortcut included), divided by the hops: the best alternative path,
    the mean over the topic entities of an `intersect` question. Failed searches (unknown entity, no
    triples) reach nothing. Scaled by `SEARCH_CAP` (0.8) so a full path pays what the paper's form
    pays at its cap and the reward keeps its range beside the format and answer parts.

    `gold_chains` is the dataset's column (`GoldChains`, one JSON string per row), `search_record`
    the rollout's (`Trajectory.search_record`). A question without a gold path (its chains `[]`) is
    scored by the `hops` form instead, so it keeps a search signal rather than none.
    """
    if gold_chains is None or search_record is None:
        missing = [
            name for name, value in (("gold_chains", gold_chains), ("search_record", search_record)) if value is None
        ]
        raise ValueError(
            f"search reward form 'path' needs the columns {missing}: the GRPO dataset's gold_chains "
            "(kgreasoner.data.gold_chains.GoldChains) and the rollout's search_record"
        )
    progress = list(map(chain_progress, gold_chains, search_record))
    if all(p is not None for p in progress):
        return [SEARCH_CAP * p for p in progress if p is not None]
    counted = shaped_search_reward("hops")(completions, hops=hops, **kwargs)
    return [counted[i] if p is None else SEARCH_CAP * p for i, p in enumerate(progress)]


path_search_reward.__name__ = "search_reward"  # TRL logs a reward under its function's name


def reward_functions(search_form: str = "paper") -> list[Callable[..., list[float]]]:
    """The three components for TRL's `reward_funcs` (summed by the trainer)."""
    return [shaped_search_reward(search_form), format_reward, answer_reward]
