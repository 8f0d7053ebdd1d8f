"""Guided groups: where a question's rollouts hold no right answer, one row becomes its gold trajectory.

GRPO learns only from differences within a group. A question the policy never answers gives a
group of wrong answers, whose search and format parts alone set the advantages. With `guidance:
gold` such a group's last row is replaced by the question's warm-up trajectory (LUFFY, arXiv
2504.14945: an off-policy expert sample mixed into failing groups), so the group holds one right
answer and its advantage points at it. At most one row a group is replaced. The row trains with the recipe's
fixed `guidance.gold_advantage` and stays out of its group's mean and std (`trl_internals.GuidedRowAdvantages`, which
reads the rollout's `guided` column): left to std scaling, one gold row beside 7 tied rows got 7/sqrt(8) ~ 2.47
whatever the reward gap.

The gold row is the warm-up record exactly as SFT tokenises it (`warmup_data.encode_record`): its
completion ids are what follows the group's own prompt ids, each segment tokenised alone, ending
with the end-of-turn token; `env_mask` is 1 on the model-written segments and that token, 0 on the
tool blocks. Its searches are replayed in a fresh session of the question, so answers resolve
(handles to labels) and tool calls are counted as for any rollout; the inserted tool blocks are
the record's own. Its text and tool spans are decoded piece by piece as the engine decodes a
rollout, so the rewards read it as they read a rollout with those ids.

Logprobs of the gold row are NaN on its model-written tokens (0.0 on tool tokens, as for rollouts).
TRL 1.16 reads the rollout's logprobs only as the sampling distribution of vLLM's importance
correction (`vllm_importance_sampling_correction`, with `use_vllm`) and in the off-policy mask;
the PPO ratio's old log-probabilities are always the training policy's own (recomputed, or the
current ones detached). A NaN sampling logprob is TRL's mark of an unscored token: its correction
ratio is exactly 1 and it is left out of the `sampling/*` figures. Any finite stand-in would be
wrong: 0.0 (the expert's certainty) would scale the row by the policy's probability of the whole
gold trajectory, about 0, and the default `sequence_mask` mode would drop it. So the gold row
trains with the on-policy ratio, as if the current policy had sampled it.

With `guidance.mode: gold_prefix` (BREAD, arXiv 2506.17211) the planned row is instead rolled out again by the
policy from a prefix of the gold trajectory: its completion starts with the record's first h - 1 search
turns (h: the question's hop count) and the session's tool block after each, all with env_mask 0 (no
loss; logprob 0.0, which TRL masks out with them), and the model writes the rest with the real engine
and tool, so it takes only the last hop itself (`prefix`, `RolloutEngine.run(..., prefixes=...)`). The
prefix turns are the record's model-written segments, tokenised alone as SFT tokenises them; the tool
blocks are the training session's own output for those searches, exactly what the engine inserts after
those ids, not the record's stored blocks: the continuation must read what its session has shown (the
handles it resolves), and the two agree whenever the records were made with the training tool's
settings. The prefix's searches are the row's own for the rewards (the search reward counts them, as
they are part of its trajectory); the model's tokens are those after `Trajectory.prefix_tokens`. A
question whose prefix would be empty (1-hop, or a record with a single search) is not guided in this
mode: its row would be a plain fresh rollout. The prefix stops after at most `searches - 1` of the
record's turns, so the model always makes a search; a listing page (`E1 | relation`) is a turn too, so
where the record pages, h - 1 turns cover fewer than h - 1 hops. The planned rows are known only after
every rank's first pass, so they are generated in a second pass, which every rank enters, with its own
planned rows or none (`KGRollout.guide`).

Groups are whole only across the ranks: TRL repeats each prompt `num_generations` times in a row
and splits the generation batch over the processes in rank order, so a group can span two ranks.
Each row's verdict is gathered from every rank (`accelerate.utils.gather_object`), every rank
plans the same replacements over the whole batch (`plan`), and each replaces the planned rows it
holds. The same gather gives `rollout/answer_tied` (share of groups whose answer rewards are all
equal: all right or all wrong), by hop count, over the policy's own rollouts.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GUIDANCE = ("none", "gold", "gold_prefix")
"""What a group with no right answer gets: nothing, its question's gold trajectory as one row, or one row
rolled out again after the gold trajectory's first h - 1 search turns."""


@dataclass(frozen=True)
class RowVerdict:
    """What the plan needs of one row: its answer reward, its question's hop count, and whether
    its question has a gold trajectory."""

    correct: bool
    hops: int
    has_gold: bool


@dataclass(frozen=True)
class GroupPlan:
    """The rows to replace (indices into the whole generation batch) and the step's group figures."""

    guided: tuple[int, ...]
    figures: dict[str, float]


def plan(verdicts: Sequence[RowVerdict], num_generations: int, guide: bool) -> GroupPlan:
    """Over the whole generation batch (every rank's rows, in rank order): the last row of each group
    with no right answer whose question has a gold trajectory (when `guide`), and the group figures.

    `rollout/guided` and `rollout/guided_hop<h>`: share of groups (of that hop count) guided;
    `rollout/answer_tied` and `rollout/answer_tied_hop<h>`: share whose rollouts all got one answer reward.
    """
    if len(verdicts) % num_generations:
        raise ValueError(
            f"{len(verdicts)} rows do not make whole groups of {num_generations}: "
            "TRL's generation batch is a multiple of num_generations"
        )
    guided: list[int] = []
    counts: dict[int, list[int]] = {}  # hops -> [groups, guided, tied]
    for start in range(0, len(verdicts), num_generations):
        group = verdicts[start : start + num_generations]
        right = sum(v.correct for v in group)
        count = counts.setdefault(group[0].hops, [0, 0, 0])
        count[0] += 1
        count[2] += right in (0, len(group))
        if guide and right == 0 and group[-1].has_gold:
            guided.append(start + num_generations - 1)
            count[1] += 1
    groups = sum(c[0] for c in counts.values())
    figures = {
        "rollout/guided": sum(c[1] for c in counts.values()) / groups,
        "rollout/answer_tied": sum(c[2] for c in counts.values()) / groups,
    }
    for hops, (total, hits, tied) in sorted(counts.items()):
        figures[f"rollout/guided_hop{hops}"] = hits / total
        figures[f"rollout/answer_tied_hop{hops}"] = tied / total
    return GroupPlan(tuple(guided), figures)


def gathered_plan(local: Sequence[RowVerdict], num_generations: int, guide: bool, rank: int) -> tuple[GroupPlan, int]:
    """`plan` over every rank's rows, and where rank `rank`'s rows start in the whole batch.

    A collective: every rank calls it at every generation (without a process group it is local)."""
    from accelerate.utils import gather_object

    ranks = gather_object([list(local)])  # one list per rank, in rank order
    offset = sum(len(rows) for rows in ranks[:rank])
    return plan([v for rows in ranks for v in rows], num_generations, guide), offset


def held(guided: Sequence[int], offset: int, count: int) -> list[int]:
    """The guided rows among a rank's `count` rows starting at `offset` of the whole batch, as local indices."""
    return [position - offset for position in guided if offset <= position < offset + count]


class GoldTrajectories:
    """The warm-up records of a JSONL file by question id (a gold one first, else a correction), read
    once; `row` makes one question's gold row for TRL."""

    def __init__(self, path: str | Path) -> None:
        from kgreasoner.records.trajectories import read_warmup

        self.path = Path(path)
        if not self.path.is_file():
            raise ValueError(
                f"guidance.trajectories: {self.path} is not a file (warm-up records: "
                "`warmup/all.jsonl` of data_gen.warmup)"
            )
        self.records: dict[str, Any] = {}
        rank = {"gold": 0, "correction": 1}
        # A raw-prompt record is one pipeline step, not a trajectory of the protocol's prompt.
        for record in read_warmup(self.path):
            if record.kind in rank and record.prompt is None:
                held = self.records.get(record.id)
                if held is None or rank[record.kind] < rank[held.kind]:
                    self.records[record.id] = record

    def __contains__(self, question_id: str) -> bool:
        return question_id in self.records

    def prefix(self, question_id: str, hops: int, prompt: str, most: int) -> list[str]:
        """The gold-prefix turns of a question: the record's first `min(hops - 1, searches - 1, most)` search
        turns, each the model-written text up to its `</search>` (segments tokenised alone by the engine,
        as `encode_record` tokenises them); [] without a record. A `prompt` that opened the think block
        gets the first turn without its `<think>`, as `encode_record` does."""
        from kgreasoner.protocol import THINK_OPEN, opened_think

        record = self.records.get(question_id)
        if record is None:
            return []
        turns, text = [], ""
        for segment in record.segments:
            if segment.train:
                text += segment.text
            else:
                turns.append(text)
                text = ""
        turns = turns[: max(0, min(hops - 1, len(turns) - 1, most))]
        if turns and opened_think(prompt) and turns[0].startswith(THINK_OPEN):
            turns[0] = turns[0][len(THINK_OPEN) :].lstrip()
        return turns

    def row(self, example, prompt_ids: Sequence[int], tokenizer, session, index: int = 0):
        """The `Trajectory` of `example`'s gold record after `prompt_ids` (the group's own prompt).

        The record's question and topics are the example's, so the prompt is the group's even where the
        training data renamed a topic (`with_kg_names`); anything else that makes it differ is refused.
        """
        from kgreasoner.protocol import opened_think, parse_trajectory
        from kgreasoner.rollout.types import Trajectory
        from kgreasoner.training.warmup_data import encode_record

        record = dataclasses.replace(
            self.records[example.id], question=example.question, topic_entities=tuple(example.topic_entities)
        )
        encoded = encode_record(record, tokenizer)
        ids, mask = encoded["input_ids"], encoded["assistant_masks"]
        if ids[: len(prompt_ids)] != list(prompt_ids):
            raise ValueError(
                f"{self.path}: record {record.id!r} tokenises to a prompt other than the training "
                "prompt of its question; the rollout's prompt ids must be build_prompt's"
            )
        completion, env_mask = ids[len(prompt_ids) :], mask[len(prompt_ids) :]
        text, spans = _decode(tokenizer, completion, env_mask)
        lead = opened_think(tokenizer.decode(list(prompt_ids), skip_special_tokens=False))
        if lead:
            text, spans = lead + text, [(start + len(lead), end + len(lead)) for start, end in spans]
        blocks = [stop - start for start, stop in _pieces(completion, env_mask) if not env_mask[start]]
        calls = _replay(session, text, spans, blocks)
        parsed = parse_trajectory(text, spans)
        resolved = list(parsed.answers)
        if parsed.answer_text is not None and hasattr(session, "resolve_answer"):
            resolved = list(session.resolve_answer(parsed.answer_text))
        return Trajectory(
            index=index,
            prompt_ids=list(prompt_ids),
            completion_ids=completion,
            env_mask=env_mask,
            logprobs=[math.nan if m else 0.0 for m in env_mask],
            text=text,
            tool_calls=calls,
            finish_reason="answer" if parsed.answer_text is not None else "eos",
            answers=parsed.answers,
            resolved_answers=resolved,
            tool_spans=spans,
        )


def _pieces(ids: Sequence[int], mask: Sequence[int]) -> list[tuple[int, int]]:
    """`[start, stop)` runs of equal mask: model text and tool blocks in turn."""
    pieces, start = [], 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            pieces.append((start, i))
            start = i
    return pieces


def _decode(tokenizer, ids: Sequence[int], mask: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """Text and tool spans as the engine decodes a rollout: piece by piece (model text, tool block, ...),
    without the final end-of-turn id."""
    text, spans = "", []
    for start, stop in _pieces(ids, mask):
        piece = tokenizer.decode(
            list(ids[start : min(stop, len(ids) - 1)]), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        if not mask[start]:
            spans.append((len(text), len(text) + len(piece)))
        text += piece
    return text, spans


def _replay(session, text: str, spans: Sequence[tuple[int, int]], block_tokens: Sequence[int]):
    """The record's searches run again in `session`: each tool block follows the query before it."""
    from kgreasoner.protocol import last_open_search
    from kgreasoner.rollout.types import ToolCall

    calls, cursor = [], 0
    for (start, end), tokens in zip(spans, block_tokens):
        query = last_open_search(text[cursor:start]) or ""
        began = time.perf_counter()
        result = session.call(query)
        calls.append(
            ToolCall(
                query=query,
                text=result.text,
                error=result.error,
                entity=result.entity,
                backtracked=bool(result.backtracked),
                num_edges=len(result.edges),
                truncated=False,
                num_tokens=tokens,
                seconds=time.perf_counter() - began,
            )
        )
        cursor = end
    return calls
