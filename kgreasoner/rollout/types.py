"""The rollout engine's seams and data types.

Seams, what a new backend or search tool implements (`docs/architecture.md`, "where to add a backend"):
- `StepBackend`: runs its own batched decode loop and hands each sampled token to a `StepDriver`
  (the engine) (`hf_backend.HFBackend`);
- `TurnBackend`: generates one turn per row from token ids; the engine loops over turns (`vllm_backend.VLLMBackend`);
- `TextBackend`: generates one turn per row from text; trajectories carry no token ids
  (`openai_backend.OpenAIBackend`);
- `ToolSession`: one question's search tool, which the engine calls at every `</search>`
  (`retrieval.tool.SearchSession`), opened by a `SessionSource` (`retrieval.tool.KGSearchTool`).
The backends are abstract bases: the engine picks its loop by which one a backend derives from, and an
optional member has its default behaviour written in the base. `ToolSession` and `SessionSource` are
protocols, so the search tool (a lower layer) fits them without importing this module; subclass
`ToolSession` to inherit the defaults of its optional members.

Data types: the engine's config, sampling settings, the per-row state a step backend sees (`RowState`),
tool calls, trajectories, and what a turn or text backend returns per row (`TurnOutput`, `TextOutput`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, get_args

from kgreasoner.data.gold_chains import SearchStep
from kgreasoner.protocol import ToolResult, split_answers
from kgreasoner.records.schema import TopicEntity
from kgreasoner.rollout.constraints import RowConstraint

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from kgreasoner.records.edges import Edge

FINISH_REASONS = ("answer", "eos", "max_tokens", "max_turns", "error")
"""Why a row stopped: `</answer>` written; end-of-sequence token; a token limit (per turn or in
total); a `</search>` beyond `max_turns` tool calls; a malformed call, a bad prompt, a failing backend
or the caller's halt rule (`Trajectory.error_kind` says which)."""

ErrorKind = Literal["prompt", "backend", "halt", "format", "tool"]
"""What went wrong in a row, by whose fault (`Trajectory.error_kind`):
- `prompt`: the prompt could not be built or tokenised; the row never ran (empty completion);
- `backend`: a generation request failed, or the backend returned without finishing the row;
- `halt`: the caller's stop rule (`RolloutEngine.run(..., halt=...)`) ended the row;
- `format`: the model wrote a malformed call (`</search>` without `<search>` in its turn);
- `tool`: a tool call raised or timed out (`ToolCall.error` `tool_exception` / `tool_timeout`); the row
  went on with the error sentence in its block, so it may end in any way. The first four end the row
  with finish reason `error`; `tool` is reported only when none of them did."""
ERROR_KINDS: tuple[ErrorKind, ...] = get_args(ErrorKind)


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
    edges: tuple[Edge, ...] = ()
    """The triples the block shows, as the tool returned them; after a cut, those whose two ends'
    labels are both still in `text`."""
    labels: dict[str, str] = field(default_factory=dict)
    """Label by id of the searched entity (`ToolSession.label_of`) and of both ends of each of `edges`:
    what a caller reports of the call without asking the KG again."""

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
    error_kind: ErrorKind | None = None
    """What went wrong, by whose fault (`ErrorKind`); None when nothing did."""
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
    def search_record(self) -> list[SearchStep]:
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

    def summary(self) -> dict[str, object]:
        """JSON-friendly record for logs and evaluation traces."""
        return {
            "index": self.index,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "error": self.error,
            "error_kind": self.error_kind,
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


def trl_rollout_output(trajectories: list[Trajectory], end_token_id: int) -> dict[str, list[object]]:
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
    completion_ids: list[object] = []
    logprobs: list[object] = []
    env_mask: list[object] = []
    for t in trajectories:
        ended = t.finish_reason in ENDED_REASONS or not t.completion_ids
        tail = [end_token_id] if ended and t.completion_ids[-1:] != [end_token_id] else []
        completion_ids.append(t.completion_ids + tail)
        logprobs.append(t.logprobs + [0.0] * len(tail))
        env_mask.append(t.env_mask + [0] * len(tail))
    columns: dict[str, list[object]] = {
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
    return columns


@dataclass
class TurnOutput:
    """What a `TurnBackend` returns for one turn of one row."""

    token_ids: list[int]
    """The sampled ids, in order, the one that completed a stop tag included (and any after it)."""
    logprobs: list[float]
    """The logprob of each sampled id (same length as `token_ids`)."""
    error: str | None = None
    """A sentence saying why the request failed (the row ends with finish reason `error`); None if it ran."""


@dataclass
class TextOutput:
    """What a `TextBackend` returns for one turn of one row."""

    text: str
    """The generated text, ending with the stop tag hit (`</search>` or `</answer>`) when one was."""
    finish_reason: str | None
    """The server's reason: `length` (the budget ran out: the row ends with `max_tokens`), `stop`, ..."""
    num_tokens: int = 0
    """Tokens the turn generated (counted against `max_new_tokens`); 0 when the server does not say."""
    error: str | None = None
    """A sentence saying why the request failed (the row ends with finish reason `error`); None if it ran."""


# ----------------------------------------------------------------------------------------------- the search tool
class ToolSession(Protocol):
    """One question's search tool, as the engine drives it: the real one is `retrieval.tool.SearchSession`.

    The engine opens one per row (or takes the caller's), calls `call` at each `</search>` and
    `label_of` after it, reads `shown_entities` when constrained decoding opens a span, and
    `resolve_answer` once, on the row's first answer block. Any class with these four methods fits;
    one that subclasses `ToolSession` inherits the documented defaults of the last three and writes
    `call` only.
    """

    @abstractmethod
    def call(self, query: str) -> ToolResult:
        """Run `query`, the text the model wrote between `<search>` and `</search>`.

        Never raises: an unknown name, an empty query or a KG failure is a result whose `error` names the
        case and whose `text` tells the model what went wrong. The engine inserts `text` as the
        `<triples>` block, cut to `max_tool_tokens`, and records `ToolCall.entity`, `backtracked` and the
        ends of `edges` (`ToolCall.shown`). An exception is still caught and ends up as a
        `tool_exception` error text: it must not kill the batch.
        """

    def resolve_answer(self, text: str) -> list[str]:
        """`Trajectory.resolved_answers` of the answer block `text` (`A | B`): each part as the answer it
        names, e.g. a session handle (`E3`) as the entity's label. Default: the parts as written
        (`protocol.split_answers`), i.e. `Trajectory.answers`. An exception keeps those as well."""
        return split_answers(text)

    def shown_entities(self) -> list[tuple[str, str]]:
        """`(handle or "", label)` of every entity shown so far, topic entities first, in order: what
        constrained decoding lets a `<search>` or `<answer>` name besides the prompt's topic names.
        Default: none (only the topic names of a QA-example prompt are allowed)."""
        return []

    def label_of(self, entity: str) -> str | None:
        """The label the session knows `entity` by (a topic entity's given name, else as a call showed it):
        the searched entity's `ToolCall.labels` entry. Default: None (the entry is left out)."""
        return None


class SessionSource(Protocol):
    """Opens a `ToolSession` per question (`retrieval.tool.KGSearchTool`): what `RolloutEngine` takes as its
    tool, to open the sessions of QA-example prompts that `run` is not given sessions for."""

    def session(self, question: str, topic_entities: list[TopicEntity]) -> ToolSession:
        """A fresh session for one question, whose searches start at `topic_entities`."""
        ...


# ----------------------------------------------------------------------------------------------- rows
class RowState:
    """The growing rollout of one prompt while the engine runs: what a `StepBackend` sees of a row.

    A backend reads `index`, `prompt_ids`, `completion_ids`, `num_model_tokens` and `finished`, and
    changes a row only through its `StepDriver` (`accept`, `run_tools`).
    """

    def __init__(
        self,
        index: int,
        prompt_ids: list[int],
        prompt_text: str,
        session: ToolSession | None,
        constraint: RowConstraint | None,
    ) -> None:
        self.index = index
        """The prompt's position in `RolloutEngine.run`'s prompts (and its trajectory's `index`)."""
        self.prompt_ids = prompt_ids
        """The prompt's token ids; empty for text backends."""
        self.prompt_text = prompt_text
        """The prompt as text; "" for a prompt given as token ids."""
        self.session = session
        """The row's search session; None: every search answers that the tool is not available."""
        self.constraint = constraint
        """The row's constrained-decoding state; None when `constrained_decoding` is off."""
        self.completion_ids: list[int] = []
        """Every completion id so far: sampled tokens, given prefix turns and tool blocks."""
        self.env_mask: list[int] = []
        """1 for a token the model sampled, 0 for a tool-block or given-prefix token (one per completion id)."""
        self.logprobs: list[float] = []
        """The sampled token's logprob; 0.0 for a tool-block or given-prefix token (one per completion id)."""
        self.turn_ids: list[int] = []
        """Model-written ids since the last tool block (where stop tags and queries are read)."""
        self.text = ""
        """The completion text of text-only backends."""
        self.tool_ranges: list[tuple[int, int]] = []
        """Where each tool block sits: indices into `completion_ids`, or into `text` for text-only backends."""
        self.num_model_tokens = 0
        """Tokens counted against `max_new_tokens`: sampled ones and a given prefix's turns."""
        self.tool_calls: list[ToolCall] = []
        self.finish_reason: str | None = None
        """One of `FINISH_REASONS` once the row has ended; None while it runs."""
        self.error: str | None = None
        self.error_kind: ErrorKind | None = None
        """Set with finish reason `error`: whose fault it was."""
        self.ended_with_eos = False
        self.prefix_tokens = 0
        """Completion ids written from a given prefix (its turns and tool blocks), before any sampled one."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def finish(self, reason: str, error: str | None = None, kind: ErrorKind | None = None) -> None:
        """End the row (a second call changes nothing); `error` and `kind` go with finish reason `error`."""
        if self.finish_reason is None:
            self.finish_reason, self.error, self.error_kind = reason, error, kind


class StepDriver(Protocol):
    """What a `StepBackend` calls back into while it decodes: the `RolloutEngine` running it."""

    @property
    def config(self) -> RolloutConfig:
        """The engine's limits and options (a backend reads `compact_slack`, say)."""
        ...

    def accept(self, row: RowState, token: int, logprob: float) -> bool:
        """Append one sampled token and its logprob to `row`; True when the row wrote `</search>` and now
        waits for its tool call. Marks the row finished on `</answer>`, EOS, a token limit, a call beyond
        `max_turns` or the run's halt rule: call it only for rows that are not `finished`."""
        ...

    def run_tools(self, rows: Sequence[RowState]) -> dict[int, list[int]]:
        """Run the pending calls of `rows` (those `accept` said wait); append their tool blocks (env_mask 0)
        and return the inserted ids by row index, for the backend to feed to the model before it samples
        those rows' next token. A row without a block in the result has finished instead."""
        ...

    def allowed_tokens(self, row: RowState) -> list[int] | None:
        """The ids `row` may sample next under constrained decoding; None: any id."""
        ...


# ----------------------------------------------------------------------------------------------- backends
class TokenBackend(ABC):
    """What the step and turn backends share: they sample token ids of the model's own tokenizer."""

    tokenizer: PreTrainedTokenizerBase
    """The model's tokenizer: the engine builds prompts with its chat template, encodes prompts, tool
    blocks and given prefixes with it (`add_special_tokens=False`) and decodes sampled ids to find stop tags."""
    eos_token_ids: Sequence[int]
    """Ids that end a row with finish reason `eos` (a chat model has several: Qwen3's <|im_end|> and
    <|endoftext|>; `hf_backend.eos_token_ids` reads them)."""
    supports_constraints: bool = False
    """True when the backend honours `RolloutConfig.constrained_decoding` (a step backend masks with
    `StepDriver.allowed_tokens`, a turn backend takes `regexes`); the engine refuses the option otherwise."""


class StepBackend(TokenBackend):
    """A backend that owns the decode loop (`hf_backend.HFBackend`): batched, token by token, with the
    engine called back per token, so a tool block goes in the moment a row writes `</search>`."""

    @abstractmethod
    def generate(self, driver: StepDriver, rows: list[RowState], sampling: SamplingParams) -> None:
        """Run every row of `rows` to its finish, drawing tokens as `sampling` says.

        Each row starts from `prompt_ids + completion_ids` (the completion may hold a given prefix).
        Per step: sample one token for every row that is not `finished` (masked to
        `driver.allowed_tokens(row)` when that is not None), hand it to `driver.accept`, then pass the rows
        that now wait to `driver.run_tools` and feed the returned ids to the model before sampling those
        rows again. Return when every row is `finished`; a row left unfinished ends with finish reason
        `error`. Log-probabilities: `log_softmax(processed_logits / T)` of the sampled token, before any
        top-k/top-p cut (see `engine`).
        """


class TurnBackend(TokenBackend):
    """A backend that generates one turn per row and request from token ids (`vllm_backend.VLLMBackend`);
    the engine checks the stop tags, runs the tools and sends the next turn."""

    @abstractmethod
    def complete(
        self,
        prompts: Sequence[list[int]],
        budgets: Sequence[int],
        sampling: SamplingParams,
        turn: int,
        indices: Sequence[int],
        regexes: Sequence[str] | None = None,
    ) -> list[TurnOutput]:
        """One turn for each active row, in order.

        `prompts[i]`: the row's prompt ids followed by its completion ids so far (tool blocks included).
        `budgets[i]`: tokens the row may sample in this turn (0: return an empty output). `turn`: how many
        turns ran before this one, and `indices[i]` the row's index: seed each row's turn from both
        (`openai_backend.row_seed`) so a row's sample does not depend on its batch. `regexes[i]` (given only
        under constrained decoding): the structured-output pattern the turn must match
        (`constraints.turn_regex`). Stop after `</search>` or `</answer>` (stop strings, not stop ids) or an
        EOS id, and return every sampled id with its logprob; the engine cuts what follows a stop.
        A failed request is an output with `error` set, never an exception.
        """

    def group_active(self, active: bool) -> bool:
        """Whether to run another turn, given whether this process still has `active` rows.

        The engine turns while this is True, with no rows when it has none left. A backend shared by the
        ranks of a tensor-parallel group returns True while any rank has rows, so every rank makes the
        same generate calls. Default: `active` (a backend used by one process alone).
        """
        return active


class TextBackend(ABC):
    """A backend that generates one turn per row and request from text (`openai_backend.OpenAIBackend`);
    trajectories keep the text only (no ids, env_mask or logprobs): for evaluation and serving, not training."""

    tokenizer: PreTrainedTokenizerBase | None = None
    """The served model's tokenizer, for its chat template only (prompts built from QA examples or chat
    messages); None: QA-example prompts take the plain protocol layout and chat messages are refused."""

    @abstractmethod
    def complete_text(
        self,
        prompts: Sequence[str],
        budgets: Sequence[int],
        sampling: SamplingParams,
        turn: int,
        indices: Sequence[int],
    ) -> list[TextOutput]:
        """One turn for each active row, in order: `prompts[i]` is the prompt text followed by the row's
        completion so far; `budgets`, `turn` and `indices` as in `TurnBackend.complete`. Stop at
        `</search>` or `</answer>` and keep the tag in `TextOutput.text` (put it back if the server cut
        it). A failed request is an output with `error` set, never an exception."""


Backend = StepBackend | TurnBackend | TextBackend
"""What `RolloutEngine` runs on; it picks its loop by the base a backend derives from."""
