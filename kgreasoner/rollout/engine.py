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
  sits in the text, so answers, searches and the format check read model-written text only. Text longer than `max_tool_tokens` is cut at a line
  boundary with a closing note (`[N more lines cut: tool output limit]`); `ToolCall.truncated`
  says so. Tool calls of one step run concurrently when `tool_workers > 0`, each with a timeout.
- Limits and finish reasons: `answer` (`</answer>` written), `eos`, `max_tokens` (turn or total
  budget of model tokens), `max_turns` (a `</search>` beyond `max_turns` calls; the tool is not
  called), `error` (a `</search>` with no `<search>` in its turn, a backend or tool failure).
  Malformed output ends a row with its reason; nothing the model writes raises.
- A caller's stop rule (`run(..., halt=...)`, e.g. a serving deadline): `halt(row_index)` is asked
  after every token a row is given (`step` and `turn` backends) and before each of its tool calls
  (every backend); a message it returns ends the row with finish reason `error` and that message.
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

Backends have one of three kinds (`backend.kind`):
- `step` (`HFBackend`): drives its own batched decode loop and calls `accept` per sampled token
  and `run_tools` for rows that paused;
- `turn` (`VLLMBackend`): generates one turn per request from token ids; the engine loops;
- `text` (`OpenAIBackend`): generates one turn per request from text; token fields stay empty.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Sequence
from typing import Any

from kgreasoner.protocol import (
    ANSWER_CLOSE,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    STOP_TAGS,
    THINK_OPEN,
    TRIPLES_CLOSE,
    build_prompt,
    format_tool_block,
    last_open_search,
    opened_think,
    parse_trajectory,
    topic_names,
)
from kgreasoner.rollout.constraints import (
    ConstraintVocabulary,
    RowConstraint,
    listed_relations,
    quoted_lines,
    turn_regex,
)
from kgreasoner.rollout.types import RolloutConfig, SamplingParams, ToolCall, Trajectory

TRUNCATION_NOTE = "[{count} more lines cut: tool output limit]"
NO_SESSION_TEXT = "The search tool is not available in this rollout."


class RowState:
    """The growing rollout of one prompt while the engine runs."""

    def __init__(
        self, index: int, prompt_ids: list[int], prompt_text: str, session: Any, constraint: RowConstraint | None
    ) -> None:
        self.index = index
        self.prompt_ids = prompt_ids
        self.prompt_text = prompt_text
        self.session = session
        self.constraint = constraint
        self.completion_ids: list[int] = []
        self.env_mask: list[int] = []
        self.logprobs: list[float] = []
        self.turn_ids: list[int] = []
        """Model-written ids since the last tool block (where stop tags and queries are read)."""
        self.text = ""
        """The completion text of text-only backends."""
        self.tool_ranges: list[tuple[int, int]] = []
        """Where each tool block sits: indices into `completion_ids`, or into `text` for text-only backends."""
        self.num_model_tokens = 0
        self.tool_calls: list[ToolCall] = []
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.ended_with_eos = False
        self.prefix_tokens = 0
        """Completion ids written from a given prefix (its turns and tool blocks), before any sampled one."""

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def finish(self, reason: str, error: str | None = None) -> None:
        if self.finish_reason is None:
            self.finish_reason, self.error = reason, error


class RolloutEngine:
    """Multi-turn generation with KG tool calls over a step, turn or text backend."""

    def __init__(self, backend: Any, tool_or_session_factory: Any = None, config: RolloutConfig | None = None) -> None:
        self.backend = backend
        self.config = config or RolloutConfig()
        self._session_factory = _session_factory(tool_or_session_factory)
        self._halt: Callable[[int], str | None] | None = None  # the running `run`'s stop rule
        self.kind = getattr(backend, "kind", None)
        if self.kind not in ("step", "turn", "text"):
            raise ValueError(f"backend {type(backend).__name__} must have kind 'step', 'turn' or 'text'")
        if self.config.constrained_decoding and not getattr(backend, "supports_constraints", False):
            raise ValueError(f"constrained_decoding is not supported by the {type(backend).__name__} backend")
        self.tokenizer = getattr(backend, "tokenizer", None)
        if self.kind != "text":
            if self.tokenizer is None:
                raise ValueError(f"backend {type(backend).__name__} needs a tokenizer")
            self._stop_tokens = {ids[0]: tag for tag in STOP_TAGS if len(ids := self.encode(tag)) == 1}
            self._stop_window = 2 * max(len(tag) for tag in STOP_TAGS)
            self._tag_enders = {tag[-1] for tag in STOP_TAGS}
            self._may_end_tag: dict[int, bool] = {}
            self.eos_token_ids = frozenset(backend.eos_token_ids)
            self._vocabulary = ConstraintVocabulary(self.encode) if self.config.constrained_decoding else None

    # ----------------------------------------------------------------- public API
    def run(
        self,
        prompts: Sequence[Any],
        sessions: Sequence[Any] | None = None,
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
        self._halt = halt
        try:
            for row, turns in zip(rows, prefixes or ()):
                self._write_prefix(row, turns)
            # a turn backend shared by a tensor-parallel group joins the group's turns even with no rows
            if rows or self.kind == "turn":
                if self.kind == "step":
                    self.backend.generate(self, rows, sampling)
                elif self.kind == "turn":
                    self._turn_loop(rows, sampling)
                else:
                    self._text_loop(rows, sampling)
        finally:
            self._halt = None
        return [self._trajectory(row) for row in rows]

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

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
                row.finish("error", f"{SEARCH_CLOSE} without a {SEARCH_OPEN} in the same turn")
            else:
                calls.append((row, query))
        results = self._call_tools(calls)
        inserted: dict[int, list[int]] = {}
        for (row, query), (result, seconds, failure) in zip(calls, results):
            if failure is not None:
                text, error, entity, backtracked, edges, ends = failure[1], failure[0], None, False, 0, []
            else:
                text, error, entity = result.text, result.error, result.entity
                backtracked, edges = bool(result.backtracked), len(result.edges)
                ends = [
                    end for e in result.edges for end in ((e.subject, e.subject_label), (e.object, e.object_label))
                ]
            if self.kind == "text":
                block, truncated, ids = format_tool_block(text), False, []
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
            shown = tuple(dict.fromkeys(e for e, label in ends if not truncated or label in text))
            row.tool_calls.append(
                ToolCall(
                    query=query,
                    text=text,
                    error=error,
                    entity=entity,
                    backtracked=backtracked,
                    num_edges=edges,
                    truncated=truncated,
                    num_tokens=len(ids),
                    seconds=seconds,
                    shown=shown,
                )
            )
        return inserted

    def prompt_of(self, prompt: Any) -> tuple[str, list[int]]:
        """(prompt text, prompt ids) as `run` builds them for one prompt; raises what the tokenizer raises."""
        if _is_example(prompt):
            question, topics = _example_fields(prompt)
            text = build_prompt(question, topics, self.tokenizer)
        elif isinstance(prompt, str):
            text = prompt
        elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            text = self.tokenizer.apply_chat_template(list(prompt), tokenize=False, add_generation_prompt=True)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
            if self.kind == "text":
                raise ValueError("the text backend needs prompt strings, not token ids")
            return "", list(prompt)
        else:
            raise ValueError(f"unsupported prompt type {type(prompt).__name__}")
        if self.kind == "text":
            return text, []
        ids = self.encode(text)
        if not ids:
            raise ValueError(f"prompt {text!r} tokenises to nothing")
        return text, ids

    # ----------------------------------------------------------------- rows
    def _new_row(self, index: int, prompt: Any, session: Any) -> RowState:
        prompt_text, prompt_ids = self.prompt_of(prompt)
        if session is None and self._session_factory is not None and _is_example(prompt):
            question, topics = _example_fields(prompt)
            session = self._session_factory(question, topics)
        row = RowState(index, prompt_ids, prompt_text, session, None)
        if self.config.constrained_decoding:
            lines = _shown_lines(row) if self.config.constrained_quotes else None
            row.constraint = RowConstraint(self._vocabulary, _allowed_names(prompt, session), lines, _listed(row))
        return row

    def _check_prefixes(self, prefixes: Sequence[Sequence[str]], count: int) -> None:
        if self.kind == "text":
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
        row.finish("error", message)
        return True

    def _trajectory(self, row: RowState) -> Trajectory:
        if not row.finished:
            row.finish("error", "the backend returned without finishing this row")
        if self.kind == "text":
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
        if parsed.answer_text is not None and row.session is not None and hasattr(row.session, "resolve_answer"):
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
            finish_reason=row.finish_reason,
            error=row.error,
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
        if self.kind == "text":
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

    def _call_tools(self, calls: list[tuple[RowState, str]]) -> list[tuple[Any, float, tuple[str, str] | None]]:
        """(result, seconds, failure) per call; failure = (error kind, text) when there is no result."""

        def one(row: RowState, query: str):
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
        results = []
        # No `with`: its exit would wait for a call that overran its timeout.
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.config.tool_workers)
        futures = [pool.submit(one, row, query) for row, query in calls]
        deadline = time.perf_counter() + (self.config.tool_timeout or 0)
        for future in futures:
            timeout = None if self.config.tool_timeout is None else max(0.0, deadline - time.perf_counter())
            try:
                results.append(future.result(timeout=timeout))
            except concurrent.futures.TimeoutError:
                results.append((None, float(self.config.tool_timeout), ("tool_timeout", "The search timed out.")))
        pool.shutdown(wait=False, cancel_futures=True)
        return results

    # ----------------------------------------------------------------- turn and text loops
    def _turn_loop(self, rows: list[RowState], sampling: SamplingParams) -> None:
        """One backend call per turn for all active rows, from their token ids (vLLM)."""
        turn = 0
        active = [row for row in rows if not row.finished]
        # a backend shared by a tensor-parallel group turns while any rank of the group has rows
        group_active = getattr(self.backend, "group_active", bool)
        while group_active(bool(active)):
            budgets = [self.turn_budget(row) for row in active]
            extra = {}
            if self.config.constrained_decoding:
                extra["regexes"] = [
                    turn_regex(
                        row.constraint.allowed_names(),
                        row.constraint.allowed_lines and row.constraint.allowed_lines(),
                        row.constraint.allowed_relations(),
                    )
                    for row in active
                ]
            outputs = self.backend.complete(
                [row.prompt_ids + row.completion_ids for row in active],
                budgets,
                sampling,
                turn,
                [row.index for row in active],
                **extra,
            )
            waiting = []
            for row, budget, output in zip(active, budgets, outputs):
                if output.error is not None:
                    row.finish("error", output.error)
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

    def _text_loop(self, rows: list[RowState], sampling: SamplingParams) -> None:
        """One backend call per turn for all active rows, by text (OpenAI-compatible endpoints)."""
        turn = 0
        active = list(rows)
        while active:
            budgets = [self.turn_budget(row) for row in active]
            outputs = self.backend.complete_text(
                [row.prompt_text + row.text for row in active], budgets, sampling, turn, [row.index for row in active]
            )
            waiting = []
            for row, output in zip(active, outputs):
                if output.error is not None:
                    row.finish("error", output.error)
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


def _is_example(prompt: Any) -> bool:
    if isinstance(prompt, dict):
        return "question" in prompt and "topic_entities" in prompt
    return hasattr(prompt, "question") and hasattr(prompt, "topic_entities")


def _example_fields(prompt: Any) -> tuple[str, list]:
    if isinstance(prompt, dict):
        return prompt["question"], list(prompt["topic_entities"])
    return prompt.question, list(prompt.topic_entities)


def _session_factory(tool_or_factory: Any) -> Callable[[str, list], Any] | None:
    if tool_or_factory is None:
        return None
    if hasattr(tool_or_factory, "session"):
        return tool_or_factory.session
    if callable(tool_or_factory):
        return tool_or_factory
    raise ValueError("tool_or_session_factory must have a .session(question, topic_entities) method or be callable")


def _shown_lines(row: RowState) -> Callable[[], list[str]]:
    """The triple lines the row's tool calls have printed so far, read when a quote opens."""
    return lambda: quoted_lines([call.text for call in row.tool_calls])


def _listed(row: RowState) -> Callable[[], list[str]]:
    """The relations the row's tool calls have listed in `more:` lines so far: what a search filter may name."""
    return lambda: listed_relations([call.text for call in row.tool_calls])


def _allowed_names(prompt: Any, session: Any) -> Callable[[], list[str]]:
    """Topic names plus every handle and label the session has shown, read when a span opens."""
    topics = topic_names(_example_fields(prompt)[1]) if _is_example(prompt) else []
    if not topics and session is not None:
        topics = topic_names(getattr(session, "topic_entities", []) or [])

    def names() -> list[str]:
        shown: list[str] = list(topics)
        if session is not None and hasattr(session, "shown_entities"):
            for handle, label in session.shown_entities():
                shown.extend(x for x in (handle, label) if x)
        return shown

    return names
