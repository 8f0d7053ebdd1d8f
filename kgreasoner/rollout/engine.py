"""The multi-turn rollout engine: the model writes, `</search>` runs the tool, its block goes in.

`RolloutEngine(backend, tool_or_session_factory, config).run(prompts, sessions, sampling)` returns
one `Trajectory` per prompt. The engine owns everything that is the same for every backend:

- Stop matching on decoded text. Byte-level BPE merges a closing tag with the text before it
  (Qwen3 writes `D.C.</search>` as `.</` `search` `>`), so the tag's own token ids are not a
  reliable signal. A stop fires on the sampled token whose decoded text completes `</search>` or
  `</answer>` in the row's current turn; characters that token carries past the tag (Qwen3's
  `>\n`) stay in the model text, and the query is read up to the tag. Only the last few tokens
  of the turn are decoded (enough for a tag spread over one token per character, twice over),
  and only when the new token holds a tag's last character; a tag that is one added token is
  matched by its id alone. Sampled ids are kept as sampled, never re-tokenised.
- Tool calls: the query is the text after the turn's last `<search>`; the session's text is
  wrapped by `protocol.format_tool_block`, tokenised alone (`add_special_tokens=False`) and
  appended with `env_mask` 0 and logprob 0.0. `Trajectory.tool_spans` records where each block
  sits in the text, so answers, searches and the format check read model-written text only. Text
  longer than `max_tool_tokens` is cut at a line boundary with a closing note
  (`[N more lines cut: tool output limit]`); `ToolCall.truncated` says so. Tool calls of one step run
  concurrently when `tool_workers > 0`, each with a timeout.
- Limits and finish reasons: `answer` (`</answer>` written), `eos`, `max_tokens` (turn or total
  budget of model tokens), `max_turns` (a `</search>` beyond `max_turns` calls; the tool is not
  called), `error` (a `</search>` with no `<search>` in its turn, a bad prompt, a backend failure or
  the caller's stop rule). Malformed output ends a row with its reason; nothing the model writes raises.
  `Trajectory.error_kind` says whose fault an error was (`types.ErrorKind`), so a caller maps it to
  its own answer (a server's HTTP status) without wrapping the backend or the sessions.
- A bad prompt (one that cannot be built or tokenised) fails its own row: the row ends at once with
  finish reason `error`, error kind `prompt` and no completion, and the batch's other rows run.
- A caller's stop rule (`run(..., halt=...)`, e.g. a serving deadline): `halt(row_index)` is asked
  after every token a row is given (`step` and `turn` backends), when a `turn` or `text` backend's
  turn comes back (before its output or error is read: a turn that outlived the rule, or a request
  cut off by it, ends the row with the rule's message) and before each of its tool calls (every
  backend); a message it returns ends the row with finish reason `error` and that message.
- A given prefix (`run(..., prefixes=...)`, GRPO's gold-prefix rows): `prefixes[i]` lists search turns
  (text ending in a `</search>` call) that row i's completion starts with before the model writes. Each
  turn is tokenised alone and appended with `env_mask` 0 and logprob 0.0, like a tool block: the prefix
  is not the model's sample, so it trains nothing (TRL multiplies every per-token term, the importance
  correction and off-policy mask included, by the tool mask). Each turn's search is then run in the row's
  session through the same path as a sampled call, so the tool block after it is the session's own
  output, exactly what the engine inserts after those ids (cut to `max_tool_tokens` alike), and the session
  state (shown entities, handles, path) is what it would be had the model written the turns. The
  prefix's searches are the row's tool calls (the search reward counts them) and its text is model
  text (the format check and answer parser read it); only the tokens after `Trajectory.prefix_tokens`
  are sampled. Prefix text counts against `max_new_tokens`, so a row stays within
  `completion_tokens(config)`. Token backends only.

Logprobs: the log-probability of each sampled token under `log_softmax(processed_logits / T)`,
where processed logits are the model's logits after any test/user logits processors and the
constrained-decoding mask, and before top-k/top-p truncation. With no processors and constraints
off this is exactly what TRL's GRPOTrainer recomputes for the same tokens (it scales logits by its
`temperature` and applies no top-k/top-p), so old and new policy logprobs agree up to numerics.
vLLM servers should run with `--logprobs-mode processed_logprobs` for the same reason.

A backend derives from one of three bases (`kgreasoner.rollout.types`, where each member is documented):
- `StepBackend` (`HFBackend`): drives its own batched decode loop and calls `accept` per sampled token
  and `run_tools` for rows that paused (the engine is its `StepDriver`);
- `TurnBackend` (`VLLMBackend`): generates one turn per request from token ids; the engine loops;
- `TextBackend` (`OpenAIBackend`): generates one turn per request from text; token fields stay empty.
The search tool is a `SessionSource` and each row's session a `ToolSession`.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypedDict, runtime_checkable

from kgreasoner.protocol import (
    ANSWER_CLOSE,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    STOP_TAGS,
    THINK_OPEN,
    TRIPLES_CLOSE,
    ToolResult,
    build_prompt,
    format_tool_block,
    last_open_search,
    opened_think,
    parse_trajectory,
    printable,
    topic_names,
)
from kgreasoner.records.schema import TopicEntity
from kgreasoner.rollout.constraints import (
    ConstraintVocabulary,
    RowConstraint,
    listed_relations,
    quoted_lines,
    turn_regex,
)
from kgreasoner.rollout.types import (
    Backend,
    RolloutConfig,
    RowState,
    SamplingParams,
    SessionSource,
    StepBackend,
    TextBackend,
    TokenBackend,
    ToolCall,
    ToolSession,
    Trajectory,
    TurnBackend,
)

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

TRUNCATION_NOTE = "[{count} more lines cut: tool output limit]"
NO_SESSION_TEXT = "The search tool is not available in this rollout."
ENGINE_TOOL_ERRORS = ("tool_exception", "tool_timeout")
"""`ToolCall.error` of a call that raised or overran `tool_timeout`: the row's error kind is then `tool`."""


@runtime_checkable
class QuestionPrompt(Protocol):
    """A QA example as a prompt (`records.schema.QAExample`, a training record): its prompt is built with
    `protocol.build_prompt`, and its session opened with the engine's tool when `run` gets none."""

    @property
    def question(self) -> str: ...

    @property
    def topic_entities(self) -> Sequence[TopicEntity]: ...


class ExampleDict(TypedDict):
    """A QA example as a dict prompt (the serving path's requests)."""

    question: str
    topic_entities: Sequence[TopicEntity]


ChatMessage = Mapping[str, str]
"""`{"role": ..., "content": ...}`, rendered with the tokenizer's chat template."""
Prompt = str | Sequence[int] | Sequence[ChatMessage] | QuestionPrompt | ExampleDict
"""A prompt of `RolloutEngine.run`: text, token ids (token backends), chat messages or a QA example."""
ToolOutcome = tuple[ToolResult | None, float, tuple[str, str] | None]
"""(result, seconds, failure) of one tool call; failure = (error kind, text) when there is no result."""


class RolloutEngine:
    """Multi-turn generation with KG tool calls over a step, turn or text backend."""

    def __init__(
        self, backend: Backend, tool: SessionSource | None = None, config: RolloutConfig | None = None
    ) -> None:
        """`tool` opens the sessions of QA-example prompts that `run` is given no sessions for."""
        if not isinstance(backend, (StepBackend, TurnBackend, TextBackend)):
            raise TypeError(
                f"backend {type(backend).__name__} must derive from StepBackend, TurnBackend or TextBackend "
                "(kgreasoner.rollout.types)"
            )
        self.backend = backend
        self.config = config or RolloutConfig()
        self.tool = tool
        self._halt: Callable[[int], str | None] | None = None  # the running `run`'s stop rule
        self.text_only = isinstance(backend, TextBackend)
        """True for a text backend: rows keep text, no token ids."""
        if self.config.constrained_decoding and not (
            isinstance(backend, TokenBackend) and backend.supports_constraints
        ):
            raise ValueError(f"constrained_decoding is not supported by the {type(backend).__name__} backend")
        self.tokenizer: PreTrainedTokenizerBase | None = backend.tokenizer
        self._vocabulary: ConstraintVocabulary | None = None
        if isinstance(backend, TokenBackend):
            if backend.tokenizer is None:
                raise ValueError(f"backend {type(backend).__name__} needs a tokenizer")
            self._stop_tokens = {ids[0]: tag for tag in STOP_TAGS if len(ids := self.encode(tag)) == 1}
            self._stop_window = 2 * max(len(tag) for tag in STOP_TAGS)
            self._tag_enders = {tag[-1] for tag in STOP_TAGS}
            self._may_end_tag: dict[int, bool] = {}
            self.eos_token_ids = frozenset(backend.eos_token_ids)
            if self.config.constrained_decoding:
                self._vocabulary = ConstraintVocabulary(self.encode)

    # ----------------------------------------------------------------- public API
    def run(
        self,
        prompts: Sequence[Prompt],
        sessions: Sequence[ToolSession | None] | None = None,
        sampling: SamplingParams | None = None,
        halt: Callable[[int], str | None] | None = None,
        prefixes: Sequence[Sequence[str]] | None = None,
    ) -> list[Trajectory]:
        """Roll out every prompt; one trajectory per prompt, in order.

        A prompt is a prompt string, a list of prompt token ids, a chat message list, or a
        QA example (`QAExample`, or a dict with `question` and `topic_entities`) whose prompt is
        built with `protocol.build_prompt`. `sessions[i]` is the search session of prompt i;
        without `sessions`, sessions are opened from QA examples with the engine's tool.
        `halt(i)`, when given, may stop row i early (see the module docstring).
        `prefixes[i]`, when given, are the search turns row i starts with, written for the model with
        env_mask 0 and replayed in its session (see the module docstring); an empty one is a plain rollout.
        """
        if sessions is not None and len(sessions) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(sessions)} sessions")
        if prefixes is not None:
            self._check_prefixes(prefixes, len(prompts))
        sampling = sampling or SamplingParams()
        rows = [self._new_row(i, p, None if sessions is None else sessions[i]) for i, p in enumerate(prompts)]
        runnable = [row for row in rows if row.error_kind != "prompt"]
        self._halt = halt
        try:
            for row, turns in zip(rows, prefixes or ()):
                if row.error_kind != "prompt":
                    self._write_prefix(row, turns)
            # a turn backend shared by a tensor-parallel group joins the group's turns even with no rows
            if isinstance(self.backend, TurnBackend):
                self._turn_loop(self.backend, runnable, sampling)
            elif runnable and isinstance(self.backend, StepBackend):
                self.backend.generate(self, runnable, sampling)
            elif runnable and isinstance(self.backend, TextBackend):
                self._text_loop(self.backend, runnable, sampling)
        finally:
            self._halt = None
        return [self._trajectory(row) for row in rows]

    def encode(self, text: str) -> list[int]:
        return [int(token) for token in self._token_tokenizer()(text, add_special_tokens=False)["input_ids"]]

    def decode(self, ids: Sequence[int]) -> str:
        text = self._token_tokenizer().decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if not isinstance(text, str):  # one sequence of ids decodes to one string
            raise TypeError(f"the tokenizer decoded one sequence to {type(text).__name__}")
        return text

    def _token_tokenizer(self) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise ValueError(f"the {type(self.backend).__name__} backend has no tokenizer to encode or decode with")
        return self.tokenizer

    def accept(self, row: RowState, token: int, logprob: float) -> bool:
        """Append one sampled token; True when the row now waits for a tool call.

        Marks the row finished on `</answer>`, EOS, a token limit, a call beyond `max_turns` or the
        run's `halt`.
        """
        waiting = self._append_token(row, token, logprob)
        if not row.finished and self._halted(row):
            return False
        return waiting

    def _append_token(self, row: RowState, token: int, logprob: float) -> bool:
        row.completion_ids.append(token)
        row.env_mask.append(1)
        row.logprobs.append(logprob)
        row.turn_ids.append(token)
        row.num_model_tokens += 1
        if row.constraint is not None:
            row.constraint.observe(row.turn_ids)
        stop = self._stop_tag(row.turn_ids)
        if stop == ANSWER_CLOSE:
            row.finish("answer")
        elif stop == SEARCH_CLOSE:
            if len(row.tool_calls) >= self.config.max_turns:
                row.finish("max_turns")
            else:
                return True
        elif token in self.eos_token_ids:
            row.ended_with_eos = True
            row.finish("eos")
        elif row.num_model_tokens >= self.config.max_new_tokens or len(row.turn_ids) >= self.config.max_turn_tokens:
            row.finish("max_tokens")
        return False

    def allowed_tokens(self, row: RowState) -> list[int] | None:
        """Token ids the row may write next under constrained decoding (None: unconstrained)."""
        return None if row.constraint is None else row.constraint.allowed()

    def turn_budget(self, row: RowState) -> int:
        """Model tokens the row may still write in this turn."""
        return max(
            0, min(self.config.max_turn_tokens - len(row.turn_ids), self.config.max_new_tokens - row.num_model_tokens)
        )

    def run_tools(self, rows: Sequence[RowState]) -> dict[int, list[int]]:
        """Run the pending calls of `rows`; append their blocks; return the inserted ids per row index.

        A row whose turn has no `<search>` ends with finish reason `error` instead; a row the run's
        `halt` stops is left out.
        """
        calls: list[tuple[RowState, str]] = []
        for row in rows:
            if self._halted(row):
                continue
            query = last_open_search(self._turn_text(row))
            if query is None:
                row.finish("error", f"{SEARCH_CLOSE} without a {SEARCH_OPEN} in the same turn", "format")
            else:
                calls.append((row, query))
        results = self._call_tools(calls)
        inserted: dict[int, list[int]] = {}
        for (row, query), (result, seconds, failure) in zip(calls, results):
            ends: list[tuple[str, str]] = []
            error: str | None
            if result is None:
                error, text = failure or ("tool_exception", "The search failed.")
                entity, backtracked, edges = None, False, []
            else:
                text, error, entity = result.text, result.error, result.entity
                backtracked, edges = bool(result.backtracked), list(result.edges)
                ends = [end for e in edges for end in ((e.subject, e.subject_label), (e.object, e.object_label))]
            ids: list[int] = []
            if self.text_only:
                block, truncated = format_tool_block(text), False
                row.tool_ranges.append((len(row.text), len(row.text) + len(block)))
                row.text += block
            else:
                ids, text, truncated = self._tool_block_ids(text)
                row.tool_ranges.append((len(row.completion_ids), len(row.completion_ids) + len(ids)))
                row.completion_ids.extend(ids)
                row.env_mask.extend([0] * len(ids))
                row.logprobs.extend([0.0] * len(ids))
                inserted[row.index] = ids
            row.turn_ids = []
            # After a cut, an entity counts as shown only while its label is still in the block.
            shown = tuple(dict.fromkeys(e for e, label in ends if not truncated or printable(label) in text))
            num_edges = len(edges)
            if truncated:
                edges = [e for e in edges if printable(e.subject_label) in text and printable(e.object_label) in text]
            label = None if entity is None or row.session is None else row.session.label_of(entity)
            labels = {} if label is None or entity is None else {entity: label}
            for e in edges:
                labels.setdefault(e.subject, e.subject_label)
                labels.setdefault(e.object, e.object_label)
            row.tool_calls.append(
                ToolCall(
                    query=query,
                    text=text,
                    error=error,
                    entity=entity,
                    backtracked=backtracked,
                    num_edges=num_edges,
                    truncated=truncated,
                    num_tokens=len(ids),
                    seconds=seconds,
                    shown=shown,
                    edges=tuple(edges),
                    labels=labels,
                )
            )
        return inserted

    def prompt_of(self, prompt: Prompt) -> tuple[str, list[int]]:
        """(prompt text, prompt ids) as `run` builds them for one prompt; raises what the tokenizer raises."""
        example = _example_fields(prompt)
        if example is not None:
            text = build_prompt(example[0], example[1], self.tokenizer)
        elif isinstance(prompt, str):
            text = prompt
        elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, Mapping) for m in prompt):
            if self.tokenizer is None:
                raise ValueError(f"chat-message prompts need a tokenizer; the {type(self.backend).__name__} has none")
            rendered = self.tokenizer.apply_chat_template(
                [dict(m) for m in prompt], tokenize=False, add_generation_prompt=True
            )
            if not isinstance(rendered, str):
                raise TypeError(f"the chat template rendered {type(rendered).__name__}, not text")
            text = rendered
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            if self.text_only:
                raise ValueError("the text backend needs prompt strings, not token ids")
            return "", [int(t) for t in prompt]
        else:
            raise ValueError(f"unsupported prompt type {type(prompt).__name__}")
        if self.text_only:
            return text, []
        ids = self.encode(text)
        if not ids:
            raise ValueError(f"prompt {text!r} tokenises to nothing")
        return text, ids

    # ----------------------------------------------------------------- rows
    def _new_row(self, index: int, prompt: Prompt, session: ToolSession | None) -> RowState:
        try:
            prompt_text, prompt_ids = self.prompt_of(prompt)
        except Exception as err:  # a tokenizer may raise anything on text it refuses; the prompt is at fault
            row = RowState(index, [], "", session, None)
            row.finish(
                "error", f"the prompt cannot be built or tokenised ({type(err).__name__}: {str(err)[:200]})", "prompt"
            )
            return row
        example = _example_fields(prompt)
        if session is None and self.tool is not None and example is not None:
            session = self.tool.session(example[0], example[1])
        row = RowState(index, prompt_ids, prompt_text, session, None)
        if self._vocabulary is not None:
            lines = _shown_lines(row) if self.config.constrained_quotes else None
            topics = topic_names(example[1]) if example is not None else []
            row.constraint = RowConstraint(self._vocabulary, _allowed_names(topics, session), lines, _listed(row))
        return row

    def _check_prefixes(self, prefixes: Sequence[Sequence[str]], count: int) -> None:
        if self.text_only:
            raise ValueError("prefixes need a token backend (hf or vllm): the text backend counts no prefix tokens")
        if len(prefixes) != count:
            raise ValueError(f"got {count} prompts but {len(prefixes)} prefixes")
        for i, turns in enumerate(prefixes):
            if isinstance(turns, str):
                raise ValueError(f"prefix {i} must be a list of turns, not one string")
            if len(turns) > self.config.max_turns:
                raise ValueError(f"prefix {i} has {len(turns)} search turns but max_turns is {self.config.max_turns}")
            for k, turn in enumerate(turns):
                if not turn.rstrip().endswith(SEARCH_CLOSE) or last_open_search(turn) is None:
                    raise ValueError(
                        f"prefix {i}, turn {k} must end with a {SEARCH_OPEN}...{SEARCH_CLOSE} call, got {turn[-80:]!r}"
                    )

    def _write_prefix(self, row: RowState, turns: Sequence[str]) -> None:
        """Append each turn with env_mask 0 and run its search as a sampled call would run."""
        for turn in turns:
            if row.finished:
                break
            ids = self.encode(turn)
            row.completion_ids.extend(ids)
            row.env_mask.extend([0] * len(ids))
            row.logprobs.extend([0.0] * len(ids))
            row.num_model_tokens += len(ids)
            row.turn_ids = list(ids)  # the query is read from these ids decoded, as for a sampled turn
            self.run_tools([row])
        row.prefix_tokens = len(row.completion_ids)
        if not row.finished and row.num_model_tokens >= self.config.max_new_tokens:
            row.finish("max_tokens")

    def _halted(self, row: RowState) -> bool:
        if self._halt is None:
            return False
        message = self._halt(row.index)
        if message is None:
            return False
        row.finish("error", message, "halt")
        return True

    def _trajectory(self, row: RowState) -> Trajectory:
        if row.finish_reason is None:
            row.finish("error", "the backend returned without finishing this row", "backend")
        finish_reason = row.finish_reason or "error"
        error_kind = row.error_kind
        if error_kind is None and any(call.error in ENGINE_TOOL_ERRORS for call in row.tool_calls):
            error_kind = "tool"
        if self.text_only:
            text, spans = row.text, list(row.tool_ranges)
        else:
            text, spans = self._text_and_spans(row)
        # A prompt that opened the think block (thinking-only chat templates) wrote the trajectory's
        # first tag: the text starts with it, so the parser and the format check read a whole trajectory.
        lead = self._opened_think(row)
        if lead:
            text, spans = lead + text, [(start + len(lead), end + len(lead)) for start, end in spans]
        parsed = parse_trajectory(text, spans)
        resolved = list(parsed.answers)
        if parsed.answer_text is not None and row.session is not None:
            try:
                resolved = list(row.session.resolve_answer(parsed.answer_text))
            except Exception:  # a resolver bug must not lose the rollout; the raw answers stand
                resolved = list(parsed.answers)
        return Trajectory(
            index=row.index,
            prompt_ids=row.prompt_ids,
            completion_ids=row.completion_ids,
            env_mask=row.env_mask,
            logprobs=row.logprobs,
            text=text,
            tool_calls=row.tool_calls,
            finish_reason=finish_reason,
            error=row.error,
            error_kind=error_kind,
            answers=parsed.answers,
            resolved_answers=resolved,
            tool_spans=spans,
            prefix_tokens=row.prefix_tokens,
        )

    def _opened_think(self, row: RowState) -> str:
        if row.prompt_text:
            return opened_think(row.prompt_text)
        # a prompt given as ids: its last few tokens hold the tag if it is there
        return opened_think(self.decode(row.prompt_ids[-len(THINK_OPEN) - 4 :]))

    def _text_and_spans(self, row: RowState) -> tuple[str, list[tuple[int, int]]]:
        """The completion decoded piece by piece (model text, tool block, ...), so each tool block's
        character span is exact by construction; without a final EOS token."""
        end = len(row.completion_ids) - 1 if row.ended_with_eos else len(row.completion_ids)
        pieces: list[str] = []
        spans: list[tuple[int, int]] = []
        length = cursor = 0
        for start, stop in row.tool_ranges:
            model_text = self.decode(row.completion_ids[cursor:start])
            block = self.decode(row.completion_ids[start:stop])
            pieces += [model_text, block]
            length += len(model_text)
            spans.append((length, length + len(block)))
            length += len(block)
            cursor = stop
        pieces.append(self.decode(row.completion_ids[cursor:end]))
        return "".join(pieces), spans

    # ----------------------------------------------------------------- stop tags and tool text
    def _stop_tag(self, turn_ids: list[int]) -> str | None:
        """The stop tag the turn's last token completes, if any (the earlier-ending one if two).

        A turn holds no earlier stop tag (the first one ends the turn or the row), so a tag found
        in the decoded tail is the one this token completed.
        """
        token = turn_ids[-1]
        tag = self._stop_tokens.get(token)
        if tag is not None:
            return tag
        may_end = self._may_end_tag.get(token)
        if may_end is None:
            may_end = self._may_end_tag[token] = not self._tag_enders.isdisjoint(self.decode([token]))
        if not may_end:
            return None
        tail = self.decode(turn_ids[-self._stop_window :])
        ends = [(at + len(tag), tag) for tag in STOP_TAGS if (at := tail.find(tag)) >= 0]
        return min(ends)[1] if ends else None

    def _turn_text(self, row: RowState) -> str:
        if self.text_only:
            end = row.text.rfind(TRIPLES_CLOSE)
            return row.text if end < 0 else row.text[end + len(TRIPLES_CLOSE) :]
        return self.decode(row.turn_ids)

    def _tool_block_ids(self, text: str) -> tuple[list[int], str, bool]:
        """Token ids of the tool block, cutting whole lines (then characters) to fit the limit."""
        limit = self.config.max_tool_tokens
        ids = self.encode(format_tool_block(text))
        if len(ids) <= limit:
            return ids, text, False
        lines = text.split("\n")

        def cut(kept: int) -> str:
            return "\n".join(lines[:kept] + [TRUNCATION_NOTE.format(count=len(lines) - kept)])

        low, high = 0, len(lines) - 1  # the largest number of whole lines that fits
        while low < high:
            mid = (low + high + 1) // 2
            if len(self.encode(format_tool_block(cut(mid)))) <= limit:
                low = mid
            else:
                high = mid - 1
        shown = cut(low)
        if low == 0:  # not even one line fits: keep as many characters of the first line as fit
            first, note = lines[0], TRUNCATION_NOTE.format(count=len(lines))
            lo, hi = 0, len(first)
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if len(self.encode(format_tool_block(first[:mid] + "\n" + note))) <= limit:
                    lo = mid
                else:
                    hi = mid - 1
            shown = (first[:lo] + "\n" + note) if lo else note
        ids = self.encode(format_tool_block(shown))
        return ids[:limit], shown, True

    def _call_tools(self, calls: list[tuple[RowState, str]]) -> list[ToolOutcome]:
        """(result, seconds, failure) per call; failure = (error kind, text) when there is no result."""

        def one(row: RowState, query: str) -> ToolOutcome:
            start = time.perf_counter()
            if row.session is None:
                return None, 0.0, ("no_session", NO_SESSION_TEXT)
            try:
                result = row.session.call(query)
            except Exception as err:  # the contract says call() never raises; a bug must not kill the batch
                return (
                    None,
                    time.perf_counter() - start,
                    ("tool_exception", f"The search failed: {type(err).__name__}."),
                )
            return result, time.perf_counter() - start, None

        if self.config.tool_workers == 0 or not calls:
            return [one(row, query) for row, query in calls]
        results: list[ToolOutcome] = []
        # No `with`: its exit would wait for a call that overran its timeout.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.config.tool_workers)
        futures = [pool.submit(one, row, query) for row, query in calls]
        deadline = time.perf_counter() + (self.config.tool_timeout or 0)
        for future in futures:
            timeout = None if self.config.tool_timeout is None else max(0.0, deadline - time.perf_counter())
            try:
                results.append(future.result(timeout=timeout))
            except concurrent.futures.TimeoutError:
                waited = float(self.config.tool_timeout or 0.0)
                results.append((None, waited, ("tool_timeout", "The search timed out.")))
        pool.shutdown(wait=False, cancel_futures=True)
        return results

    # ----------------------------------------------------------------- turn and text loops
    def _turn_loop(self, backend: TurnBackend, rows: list[RowState], sampling: SamplingParams) -> None:
        """One backend call per turn for all active rows, from their token ids (vLLM)."""
        turn = 0
        active = [row for row in rows if not row.finished]
        # a backend shared by a tensor-parallel group turns while any rank of the group has rows
        while backend.group_active(bool(active)):
            budgets = [self.turn_budget(row) for row in active]
            regexes = None
            if self.config.constrained_decoding:
                regexes = [_turn_regex(row.constraint) for row in active if row.constraint is not None]
            outputs = backend.complete(
                [row.prompt_ids + row.completion_ids for row in active],
                budgets,
                sampling,
                turn,
                [row.index for row in active],
                regexes,
            )
            waiting: list[RowState] = []
            for row, budget, output in zip(active, budgets, outputs):
                if self._halted(row):
                    continue
                if output.error is not None:
                    row.finish("error", output.error, "backend")
                    continue
                for token, logprob in zip(output.token_ids, output.logprobs):
                    if self.accept(row, token, logprob):
                        waiting.append(row)
                        break
                    if row.finished:
                        break
                else:
                    if not row.finished:  # the backend stopped on its own: its EOS or the length cap
                        row.finish("max_tokens" if len(output.token_ids) >= budget else "eos")
            self.run_tools(waiting)
            active = [row for row in rows if not row.finished]
            turn += 1

    def _text_loop(self, backend: TextBackend, rows: list[RowState], sampling: SamplingParams) -> None:
        """One backend call per turn for all active rows, by text (OpenAI-compatible endpoints)."""
        turn = 0
        active = [row for row in rows if not row.finished]
        while active:
            budgets = [self.turn_budget(row) for row in active]
            outputs = backend.complete_text(
                [row.prompt_text + row.text for row in active], budgets, sampling, turn, [row.index for row in active]
            )
            waiting: list[RowState] = []
            for row, output in zip(active, outputs):
                if self._halted(row):
                    continue
                if output.error is not None:
                    row.finish("error", output.error, "backend")
                    continue
                text, stop = _cut_at_stop(output.text)
                row.text += text
                row.num_model_tokens += output.num_tokens
                if stop == ANSWER_CLOSE:
                    row.finish("answer")
                elif stop == SEARCH_CLOSE:
                    if len(row.tool_calls) >= self.config.max_turns:
                        row.finish("max_turns")
                    else:
                        waiting.append(row)
                elif output.finish_reason == "length" or row.num_model_tokens >= self.config.max_new_tokens:
                    row.finish("max_tokens")
                else:
                    row.finish("eos")
            self.run_tools(waiting)
            active = [row for row in rows if not row.finished]
            turn += 1


def _cut_at_stop(text: str) -> tuple[str, str | None]:
    """Text up to and including the first stop tag, and that tag (None when there is none)."""
    hits = [(text.find(tag), tag) for tag in (SEARCH_CLOSE, ANSWER_CLOSE) if tag in text]
    if not hits:
        return text, None
    start, tag = min(hits)
    return text[: start + len(tag)], tag


def _example_fields(prompt: Prompt) -> tuple[str, list[TopicEntity]] | None:
    """(question, topic entities) of a QA-example prompt; None for any other prompt."""
    if isinstance(prompt, Mapping):
        if "question" in prompt and "topic_entities" in prompt:
            return prompt["question"], list(prompt["topic_entities"])
        return None
    if isinstance(prompt, QuestionPrompt):
        return prompt.question, list(prompt.topic_entities)
    return None


def _turn_regex(constraint: RowConstraint) -> str:
    """The structured-output pattern of a row's next turn (`constraints.turn_regex`)."""
    lines = constraint.allowed_lines() if constraint.allowed_lines is not None else None
    return turn_regex(constraint.allowed_names(), lines, constraint.allowed_relations())


def _shown_lines(row: RowState) -> Callable[[], list[str]]:
    """The triple lines the row's tool calls have printed so far, read when a quote opens."""
    return lambda: quoted_lines([call.text for call in row.tool_calls])


def _listed(row: RowState) -> Callable[[], list[str]]:
    """The relations the row's tool calls have listed in `more:` lines so far: what a search filter may name."""
    return lambda: listed_relations([call.text for call in row.tool_calls])


def _allowed_names(topics: list[str], session: ToolSession | None) -> Callable[[], list[str]]:
    """Topic names plus every handle and label the session has shown, read when a span opens."""

    def names() -> list[str]:
        shown: list[str] = list(topics)
        if session is not None:
            for handle, label in session.shown_entities():
                shown.extend(x for x in (handle, label) if x)
        return shown

    return names
