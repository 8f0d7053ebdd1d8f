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
  line offers (`NAME | REL`: its next page of unseen lines by the gold relation), after listing
  the entity's other relations (`NAME | relations`) while the `more:` line does not name the gold
  one, up to `max_repeats` calls in all; a question is skipped (and counted) only when no listed
  page is left;
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

Output: the JSONL (`kgreasoner.records.trajectories` format: trained segments are the model's
text, masked segments exactly the tool blocks) and a summary JSON beside it: counts by kind, hops
and split, skipped questions by reason, notes (repeated searches, backtrack outputs, corrections
that fell back to gold and why), teacher calls and fallbacks, and mean tokens with `tokenizer`.

    python -m data_gen.warmup --config configs/warmup.yaml [--set key=value ...]
    kgreasoner warmup --config configs/warmup.yaml

The package, one job per module (each imports only the ones above it):
- `config`: `WarmupConfig` and the teacher's `TeacherConfig`;
- `templates`: the built-in template thoughts, their slots, `load_templates`;
- `teacher`: the OpenAI-compatible teacher (`Teacher`);
- `writer`: one trajectory against a live session (`TrajectoryWriter`), `Route`, `Step`, `Skip`,
  and rewrites of a finished record (`shuffle_blocks`, `renumber_handles`);
- `walk`: `WarmupGenerator`, which walks a question's gold path(s) into one verified record;
- `records`: the whole set (`generate_records`), its summary, the SFT sample, `run`;
- `cli`: `python -m data_gen.warmup` and the `kgreasoner warmup` subcommand.
"""

from __future__ import annotations

from data_gen.warmup.cli import main, register, run_command
from data_gen.warmup.config import (
    ANSWER_MODES,
    HANDLE_NUMBERS,
    PICKS,
    WARMUP_PROMPT,
    TeacherConfig,
    WarmupConfig,
)
from data_gen.warmup.records import generate_records, replay_tool_blocks, run, sample_records, summarize
from data_gen.warmup.teacher import Teacher
from data_gen.warmup.templates import DEFAULT_TEMPLATES, PLAN_SEPARATOR, SLOTS, load_templates
from data_gen.warmup.walk import WarmupGenerator
from data_gen.warmup.writer import (
    Route,
    Skip,
    Step,
    TrajectoryWriter,
    relation_words,
    renumber_handles,
    shuffle_blocks,
)

__all__ = [
    "ANSWER_MODES",
    "HANDLE_NUMBERS",
    "PICKS",
    "WARMUP_PROMPT",
    "TeacherConfig",
    "WarmupConfig",
    "DEFAULT_TEMPLATES",
    "PLAN_SEPARATOR",
    "SLOTS",
    "load_templates",
    "Teacher",
    "Route",
    "Skip",
    "Step",
    "TrajectoryWriter",
    "relation_words",
    "renumber_handles",
    "shuffle_blocks",
    "WarmupGenerator",
    "generate_records",
    "replay_tool_blocks",
    "run",
    "sample_records",
    "summarize",
    "main",
    "register",
    "run_command",
]
