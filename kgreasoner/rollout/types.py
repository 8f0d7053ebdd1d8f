"""Data types of the rollout engine: its config, sampling settings, tool calls and trajectories."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

FINISH_REASONS = ("answer", "eos", "max_tokens", "max_turns", "error")
"""Why a row stopped: `</answer>` written; end-of-sequence token; a token limit (per turn or in
total); a `</search>` beyond `max_turns` tool calls; a malformed call or a failing backend/tool."""


@dataclass
class RolloutConfig:
    """Limits and options of one rollout engine (YAML section `rollout` of eval/GRPO configs)."""

    max_turns: int = field(
        default=8,
        metadata={"help": "tool calls per row; a further </search> ends the row with finish reason max_turns"},
    )
    max_new_tokens: int = field(
        default=1024,
        metadata={
            "help": "model-written tokens per row in total (tool tokens not counted; a given prefix's text counts)"
        },
    )
    max_turn_tokens: int = field(
        default=256, metadata={"help": "model-written tokens per turn, i.e. between two tool blocks"}
    )
    max_tool_tokens: int = field(
        default=384,
        metadata={
            "help": "tokens of one inserted <triples> block, tags included; longer tool text is cut at a "
            "line boundary and ends with a note saying how many lines were cut"
        },
    )
    constrained_decoding: bool = field(
        default=False,
        metadata={
            "help": "hf backend: right after <search> or <answer>, allow only names/handles shown so far "
            "(topic entities and tool output). Changes the sampling distribution; logprobs then "
            "come from the constrained one, so keep it off for GRPO unless that is intended"
        },
    )
    constrained_quotes: bool = field(
        default=False,
        metadata={
            "help": "[experimental] with constrained_decoding: a `(` in the thinking must go on as a triple line "
            "the tool has shown, verbatim, to its `)`; the decoder then copies the line's tail for the model "
            "(for models trained to quote the followed line; report results as such)"
        },
    )
    tool_workers: int = field(
        default=0,
        metadata={"help": "threads running the tool calls of one step concurrently (0: in the calling thread)"},
    )
    tool_timeout: float | None = field(
        default=60.0,
        metadata={"help": "seconds one tool call may take with tool_workers > 0; a late call becomes an error text"},
    )
    compact_slack: int = field(
        default=64,
        metadata={
            "help": "hf backend: KV-cache columns left unused by paused/inserted rows before the cache is "
            "compacted (speed only, results are unchanged)"
        },
    )

    def __post_init__(self) -> None:
        for name in ("max_new_tokens", "max_turn_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.max_turns < 0:
            raise ValueError(f"max_turns must be >= 0, got {self.max_turns}")
        if self.max_tool_tokens < 16:
            raise ValueError(f"max_tool_tokens must be >= 16 (room for the tags), got {self.max_tool_tokens}")
        if self.tool_workers < 0:
            raise ValueError(f"tool_workers must be >= 0, got {self.tool_workers}")
        if self.tool_timeout is not None and self.tool_timeout <= 0:
            raise ValueError(f"tool_timeout must be > 0 or None, got {self.tool_timeout}")
        if self.compact_slack < 1:
            raise ValueError(f"compact_slack must be >= 1, got {self.compact_slack}")
        if self.constrained_quotes and not self.constrained_decoding:
            raise ValueError("constrained_quotes needs constrained_decoding: true")


@dataclass
class SamplingParams:
    """How the next token is drawn. temperature 0 means greedy."""

    temperature: float = field(default=1.0, metadata={"help": "softmax temperature; 0 = greedy"})
    top_p: float = field(default=1.0, metadata={"help": "nucleus sampling mass (1.0: off)"})
    top_k: int = field(default=0, metadata={"help": "keep the k most likely tokens (0: off)"})
    seed: int | None = field(default=0, metadata={"help": "seed of the sampling generator (None: unseeded)"})

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")


@dataclass
class ToolCall:
    """One executed `<search>` call."""

    query: str
    """The raw text between `<search>` and `</search>`."""
    text: str
    """The text placed inside the `<triples>` block (after any cut)."""
    error: str | None
    """None, or the tool's error kind (`unknown_entity`, ...), `tool_exception` or `tool_timeout`."""
    entity: str | None
    backtracked: bool
    num_edges: int
    truncated: bool
    """True when the tool text was cut to fit `max_tool_tokens`."""
    num_tokens: int
    """Tokens inserted for this call (the whole block); 0 for text-only backends."""
    seconds: float
    shown: tuple[str, ...] = ()
    """Ids of the entities in the triples the block shows (both ends of each edge, mediators too);
    after a cut, only those whose label is still in `text`."""

    @property
    def returned_triples(self) -> bool:
        """A successful retrieval: no error and at least one triple shown."""
        return self.error is None and self.num_edges > 0


@dataclass
class Trajectory:
    """One rollout. Token fields are what TRL's GRPO `rollout_func` returns, row by row.

    `completion_ids`, `env_mask` and `logprobs` have the same length: `env_mask` is 1 on tokens the
    model sampled and 0 on tool-inserted tokens; `logprobs` holds the sampled token's log
    probability (see `kgreasoner.rollout.engine` for which distribution) and 0.0 on tool tokens.
    Text-only backends (openai) leave the token fields empty and fill `text`.
    """

    index: int
    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float]
    text: str
    """The completion as text: the model's tokens and the tool blocks, without a final EOS token.
    When the prompt itself ended by opening the think block (`protocol.opened_think`), the text
    starts with that tag (`<think>\\n`), which is not among `completion_ids`; `tool_spans` index this text."""
    tool_calls: list[ToolCall]
    finish_reason: str
    error: str | None = None
    """A sentence saying what went wrong when finish_reason is `error`."""
    answers: list[str] = field(default_factory=list)
    """The parts of the first model-written `<answer>` block (`A | B` -> [A, B])."""
    resolved_answers: list[str] = field(default_factory=list)
    """Answers resolved by the session (handles -> labels); `answers` when no session resolves."""
    tool_spans: list[tuple[int, int]] = field(default_factory=list)
    """Character spans `[start, end)` of the tool-inserted blocks in `text`, in order. Pass them to
    `protocol.parse_trajectory` / `check_format` so that tags the tool printed (a KG label holding
    `</triples><answer>X</answer>`) are read as text, not as the model's answer or searches."""
    prefix_tokens: int = 0
    """`completion_ids[:prefix_tokens]` were given, not sampled: a prefix's turns and their tool blocks
    (`RolloutEngine.run(..., prefixes=...)`), all with env_mask 0; 0 for a plain rollout."""

    @property
    def num_tool_calls(self) -> int:
        return len(self.tool_calls)

    @property
    def num_searches(self) -> int:
        """Retrieval actions that returned triples (what the search reward counts)."""
        return sum(call.returned_triples for call in self.tool_calls)

    @property
    def search_record(self) -> list[dict[str, Any]]:
        """The successful searches in order, `{"entity": id searched, "shown": [ids shown]}` each: what
        the `path` search reward reads (`kgreasoner.data.gold_chains.chain_progress`)."""
        return [
            {"entity": call.entity, "shown": list(call.shown)} for call in self.tool_calls if call.returned_triples
        ]

    @property
    def num_backtracks(self) -> int:
        return sum(call.backtracked for call in self.tool_calls)

    @property
    def num_model_tokens(self) -> int:
        return sum(self.env_mask)

    @property
    def num_tool_tokens(self) -> int:
        return len(self.env_mask) - sum(self.env_mask)

    def summary(self) -> dict[str, Any]:
        """JSON-friendly record for logs and evaluation traces."""
        return {
            "index": self.index,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "answers": self.answers,
            "resolved_answers": self.resolved_answers,
            "tool_spans": [list(span) for span in self.tool_spans],
            "num_searches": self.num_searches,
            "num_tool_calls": self.num_tool_calls,
            "num_backtracks": self.num_backtracks,
            "num_model_tokens": self.num_model_tokens,
            "num_tool_tokens": self.num_tool_tokens,
            "tool_calls": [
                {
                    "query": c.query,
                    "error": c.error,
                    "entity": c.entity,
                    "backtracked": c.backtracked,
                    "num_edges": c.num_edges,
                    "truncated": c.truncated,
                    "seconds": round(c.seconds, 6),
                }
                for c in self.tool_calls
            ],
        }


ENDED_REASONS = ("answer", "eos", "error")
"""Finish reasons of a row that ended rather than ran into a limit (`max_tokens`, `max_turns`)."""


def completion_tokens(config: RolloutConfig) -> int:
    """The most tokens one row's completion can hold as TRL gets it: every model token, every tool
    block, and the end-of-sequence id `trl_rollout_output` may append."""
    return config.max_new_tokens + config.max_turns * config.max_tool_tokens + 1


def sequence_tokens(config: RolloutConfig, prompt_tokens: int) -> int:
    """The longest prompt + completion of one row: what vLLM must hold (`vllm_max_model_length`) and
    what one training row can be, for prompts of at most `prompt_tokens` tokens."""
    return prompt_tokens + completion_tokens(config)


def trl_rollout_output(trajectories: list[Trajectory], end_token_id: int) -> dict[str, list]:
    """The dict TRL's GRPOTrainer expects from `rollout_func`, plus per-row extras for rewards.

    Required: `prompt_ids`, `completion_ids`, `logprobs`; `env_mask` becomes the trainer's tool mask.
    A row that ended (`ENDED_REASONS`) and does not end with `end_token_id` already gets it
    appended, with env_mask 0 and logprob 0.0: TRL counts a completion whose last id
    is not an end-of-sequence (or pad) id as clipped (`completions/clipped_ratio`, and masked with
    `mask_truncated_completions`), and reads that last id, so a row that failed before writing a
    token must not hand TRL an empty completion. The appended id carries no loss (env_mask 0)
    and is not in `completion_text`. Rows cut by a limit end as they are: they were clipped.
    Extras (forwarded to reward functions as kwargs): `completion_text` (our decoding, which keeps
    the tags even where the tokenizer marks them special), `tool_spans` (where the tool blocks sit
    in `completion_text`, so rewards read model-written text only), `num_searches`,
    `num_tool_calls`, `num_backtracks`, `finish_reason`, `resolved_answers`, `search_record`.
    """
    completion_ids, logprobs, env_mask = [], [], []
    for t in trajectories:
        ended = t.finish_reason in ENDED_REASONS or not t.completion_ids
        tail = [end_token_id] if ended and t.completion_ids[-1:] != [end_token_id] else []
        completion_ids.append(t.completion_ids + tail)
        logprobs.append(t.logprobs + [0.0] * len(tail))
        env_mask.append(t.env_mask + [0] * len(tail))
    return {
        "prompt_ids": [t.prompt_ids for t in trajectories],
        "completion_ids": completion_ids,
        "logprobs": logprobs,
        "env_mask": env_mask,
        "completion_text": [t.text for t in trajectories],
        "tool_spans": [[list(span) for span in t.tool_spans] for t in trajectories],
        "num_searches": [t.num_searches for t in trajectories],
        "num_tool_calls": [t.num_tool_calls for t in trajectories],
        "num_backtracks": [t.num_backtracks for t in trajectories],
        "finish_reason": [t.finish_reason for t in trajectories],
        "resolved_answers": [t.resolved_answers for t in trajectories],
        "search_record": [t.search_record for t in trajectories],
    }


@dataclass
class TurnOutput:
    """What a token backend returns for one turn of one row."""

    token_ids: list[int]
    logprobs: list[float]
    error: str | None = None


@dataclass
class TextOutput:
    """What a text backend returns for one turn of one row (`text` ends with the stop tag hit)."""

    text: str
    finish_reason: str | None
    num_tokens: int = 0
    error: str | None = None
