"""The engine's seams: backends and a search session written only against `rollout.types` drive it end to end.

Each backend here is a real, if small, backend of its base: it writes scripted turns with the real BPE
tokenizer, which is what a new backend author would start from. The session subclasses `ToolSession`
and writes `call` only, so the documented defaults of `resolve_answer` and `shown_entities` are what runs.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kgreasoner.protocol import ToolResult, format_tool_block
from kgreasoner.records.edges import Edge
from kgreasoner.rollout import (
    RolloutConfig,
    RolloutEngine,
    RowState,
    SamplingParams,
    StepBackend,
    StepDriver,
    TextBackend,
    TextOutput,
    ToolSession,
    TurnBackend,
    TurnOutput,
)

TURNS = ["<think> <search>Utah</search>", "</think>\n<answer>e1 | Salt Lake City</answer>"]


class _OneFactSession(ToolSession):
    """A session that knows one triple; everything but `call` is `ToolSession`'s default."""

    def __init__(self) -> None:
        self.queries: list[str] = []

    def call(self, query: str) -> ToolResult:
        self.queries.append(query)
        edge = Edge("Utah", "capital", "SLC", "Utah", "Salt Lake City", "out")
        return ToolResult("(Utah, capital, Salt Lake City)", [edge], None, "Utah", False)


class _ScriptedTurns(TurnBackend):
    """A turn backend: row i writes TURNS[turn] as token ids, each with logprob -0.5."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = [tokenizer.eos_token_id]
        self.group_calls: list[bool] = []

    def complete(
        self,
        prompts: Sequence[list[int]],
        budgets: Sequence[int],
        sampling: SamplingParams,
        turn: int,
        indices: Sequence[int],
        regexes: Sequence[str] | None = None,
    ) -> list[TurnOutput]:
        ids = self.tokenizer(TURNS[turn], add_special_tokens=False)["input_ids"]
        return [TurnOutput(list(ids), [-0.5] * len(ids)) for _ in prompts]

    def group_active(self, active: bool) -> bool:
        self.group_calls.append(active)
        return super().group_active(active)


class _ScriptedSteps(StepBackend):
    """A step backend: its own loop feeds TURNS' ids one token at a time through the `StepDriver`."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.eos_token_ids = [tokenizer.eos_token_id]

    def generate(self, driver: StepDriver, rows: list[RowState], sampling: SamplingParams) -> None:
        script = [self.tokenizer(turn, add_special_tokens=False)["input_ids"] for turn in TURNS]
        for row in rows:
            for ids in script:
                for token in ids:
                    if row.finished:
                        return
                    if driver.accept(row, token, -0.5):
                        assert driver.run_tools([row])[row.index]  # the block's ids, to feed a model
                        break


class _ScriptedText(TextBackend):
    """A text backend: every row writes TURNS[turn]."""

    def complete_text(
        self,
        prompts: Sequence[str],
        budgets: Sequence[int],
        sampling: SamplingParams,
        turn: int,
        indices: Sequence[int],
    ) -> list[TextOutput]:
        return [TextOutput(TURNS[turn], "stop", num_tokens=4) for _ in prompts]


@pytest.mark.parametrize("backend_class", [_ScriptedTurns, _ScriptedSteps])
def test_a_token_backend_written_against_the_seams_runs_end_to_end(bpe_tokenizer, backend_class):
    backend = backend_class(bpe_tokenizer)
    session = _OneFactSession()
    [trajectory] = RolloutEngine(backend, None, RolloutConfig(max_turns=2)).run(["Q: where?"], [session])
    block = format_tool_block("(Utah, capital, Salt Lake City)")
    assert session.queries == ["Utah"]
    assert trajectory.finish_reason == "answer"
    assert trajectory.text == TURNS[0] + block + TURNS[1]
    assert trajectory.tool_spans == [(len(TURNS[0]), len(TURNS[0]) + len(block))]
    first = len(bpe_tokenizer(TURNS[0], add_special_tokens=False)["input_ids"])
    inserted = len(bpe_tokenizer(block, add_special_tokens=False)["input_ids"])
    assert trajectory.env_mask[:first] == [1] * first
    assert trajectory.env_mask[first : first + inserted] == [0] * inserted  # 0 for the tool block
    assert set(trajectory.env_mask[first + inserted :]) == {1}
    assert trajectory.logprobs[first : first + inserted] == [0.0] * inserted
    assert trajectory.tool_calls[0].shown == ("Utah", "SLC")
    # `ToolSession.resolve_answer`'s default: the answer's parts as written
    assert trajectory.answers == trajectory.resolved_answers == ["e1", "Salt Lake City"]


def test_a_turn_backend_turns_by_its_group_active_even_with_no_rows(bpe_tokenizer):
    backend = _ScriptedTurns(bpe_tokenizer)
    assert RolloutEngine(backend).run([]) == []
    assert backend.group_calls == [False]  # asked once, with no rows: the default says stop
    RolloutEngine(backend, None, RolloutConfig(max_turns=2)).run(["Q:"], [_OneFactSession()])
    assert backend.group_calls[1:] == [True, True, False]


def test_a_text_backend_keeps_text_only():
    [trajectory] = RolloutEngine(_ScriptedText(), None).run(["Q: where?"], [_OneFactSession()])
    assert trajectory.finish_reason == "answer" and trajectory.completion_ids == []
    assert trajectory.text == TURNS[0] + format_tool_block("(Utah, capital, Salt Lake City)") + TURNS[1]
    assert trajectory.resolved_answers == ["e1", "Salt Lake City"]


def test_the_engine_refuses_what_derives_from_no_backend_base(bpe_tokenizer):
    class Shaped:
        """Has a turn backend's members but derives from no base: a `kind` string no longer makes a backend."""

        kind = "turn"
        tokenizer = bpe_tokenizer
        eos_token_ids = [0]

        def complete(self, *args):
            raise AssertionError("never called")

    with pytest.raises(TypeError, match="must derive from StepBackend, TurnBackend or TextBackend"):
        RolloutEngine(Shaped())


def test_a_backend_that_misses_its_abstract_method_cannot_be_built(bpe_tokenizer):
    class Unfinished(TurnBackend):
        pass

    with pytest.raises(TypeError, match="abstract method complete"):
        Unfinished()


def test_a_session_that_misses_call_cannot_be_built():
    class Unfinished(ToolSession):
        pass

    with pytest.raises(TypeError, match="abstract method call"):
        Unfinished()
    assert _OneFactSession().shown_entities() == []  # the documented default


def test_constrained_decoding_is_refused_by_a_backend_that_does_not_say_it_supports_it(bpe_tokenizer):
    with pytest.raises(ValueError, match="constrained_decoding is not supported by the _ScriptedTurns backend"):
        RolloutEngine(_ScriptedTurns(bpe_tokenizer), None, RolloutConfig(constrained_decoding=True))
