"""The engine with the real `KGSearchTool` over a small MemoryKG, and constrained decoding."""

from __future__ import annotations

import torch

from kgreasoner.kg.memory import MemoryKG
from kgreasoner.protocol import ANSWER_OPEN, SEARCH_OPEN, format_tool_block, parse_trajectory
from kgreasoner.records.schema import QAExample
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
from kgreasoner.rollout import RolloutConfig, RolloutEngine, SamplingParams
from kgreasoner.rollout.hf_backend import HFBackend

from .conftest import ScriptedLogits

TRIPLES = [
    ("m.utah", "time_zone", "m.mtz"),
    ("m.utah", "capital", "m.slc"),
    ("m.slc", "mayor", "m.erin"),
    ("m.mtz", "offset", "m.minus7"),
    ("m.colorado", "time_zone", "m.mtz"),
]
NAMES = {
    "m.utah": "Utah",
    "m.mtz": "Mountain Time Zone",
    "m.slc": "Salt Lake City",
    "m.erin": "Erin",
    "m.minus7": "UTC-7",
    "m.colorado": "Colorado",
}
EXAMPLE = QAExample.from_dict(
    {
        "id": "q1",
        "question": "what timezone is utah in",
        "topic_entities": [{"id": "m.utah", "name": "Utah"}],
        "answers": [{"id": "m.mtz", "name": "Mountain Time Zone"}],
    }
)


def _tool(handles: bool) -> KGSearchTool:
    return KGSearchTool(MemoryKG.from_triples(TRIPLES, NAMES), ToolConfig(entity_handles=handles))


def _encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_real_tool_blocks_and_handle_answers(special_tokenizer, tiny_model):
    model = tiny_model(special_tokenizer)
    tool = _tool(handles=True)
    reference = tool.session(EXAMPLE.question, list(EXAMPLE.topic_entities))
    first = reference.call("E1")
    second = reference.call("Salt Lake City")
    assert first.error is None and "E2 Mountain Time Zone" in first.text
    script = "<think> <search>E1</search>" + "<search>Salt Lake City</search>" + "</think><answer>E2</answer>"
    engine = RolloutEngine(
        HFBackend(model, special_tokenizer, [ScriptedLogits({0: _encode(special_tokenizer, script)})]),
        tool,
        RolloutConfig(max_turn_tokens=64),
    )
    [trajectory] = engine.run([EXAMPLE])  # sessions opened by the engine from the example
    assert trajectory.finish_reason == "answer"
    tool_ids = [t for t, m in zip(trajectory.completion_ids, trajectory.env_mask) if m == 0]
    assert special_tokenizer.decode(tool_ids) == format_tool_block(first.text) + format_tool_block(second.text)
    assert [c.query for c in trajectory.tool_calls] == ["E1", "Salt Lake City"]
    assert trajectory.num_searches == 2 and trajectory.tool_calls[0].entity == "m.utah"
    assert trajectory.answers == ["E2"] and trajectory.resolved_answers == ["Mountain Time Zone"]


class _OpenTagBias:
    """Test-only processor: pushes the model to open `<search>`/`<answer>` often (random model)."""

    def __init__(self, tokenizer) -> None:
        self.ids = [tokenizer.convert_tokens_to_ids(SEARCH_OPEN), tokenizer.convert_tokens_to_ids(ANSWER_OPEN)]

    def __call__(self, rows, logits):
        logits = logits.clone()
        logits[:, self.ids[0]] += 7.0
        logits[:, self.ids[1]] += 5.5
        return logits


def test_constrained_decoding_never_emits_an_unseen_entity(special_tokenizer, tiny_model):
    model = tiny_model(special_tokenizer)
    tool = _tool(handles=True)
    sessions = [tool.session(EXAMPLE.question, list(EXAMPLE.topic_entities)) for _ in range(8)]
    config = RolloutConfig(constrained_decoding=True, max_turns=6, max_new_tokens=120, max_turn_tokens=60)
    engine = RolloutEngine(HFBackend(model, special_tokenizer, [_OpenTagBias(special_tokenizer)]), tool, config)
    trajectories = engine.run([EXAMPLE] * 8, sessions, SamplingParams(temperature=1.0, seed=5))
    searched = answered = 0
    for trajectory in trajectories:
        fresh = tool.session(EXAMPLE.question, list(EXAMPLE.topic_entities))
        allowed = {x for pair in fresh.shown_entities() for x in pair if x}  # the topic: E1 and Utah
        parsed = parse_trajectory(trajectory.text)
        for call, block in zip(trajectory.tool_calls, parsed.triples):
            name = call.query.strip().removesuffix("| backtrack").removesuffix("| relations").strip()
            assert name in allowed, call.query
            searched += 1
            for handle, label in sessions[trajectory.index].shown_entities():
                if handle in block or label in block:
                    allowed.update(x for x in (handle, label) if x)
        if parsed.answers:
            answered += 1
            shown = {x for pair in sessions[trajectory.index].shown_entities() for x in pair if x}
            assert parsed.answers[0] in shown
    assert searched >= 8 and answered >= 1


def test_constrained_logprobs_come_from_the_constrained_distribution(special_tokenizer, tiny_model):
    model = tiny_model(special_tokenizer)
    tool = _tool(handles=False)
    script = _encode(special_tokenizer, "<think> <search>")
    engine = RolloutEngine(
        HFBackend(model, special_tokenizer, [ScriptedLogits({0: script})]),
        tool,
        RolloutConfig(constrained_decoding=True, max_turns=0, max_turn_tokens=40),
    )
    [trajectory] = engine.run([EXAMPLE], sampling=SamplingParams(seed=2))
    assert trajectory.finish_reason == "max_turns"  # the constrained search closed; no call allowed
    assert trajectory.text in (
        "<think> <search>Utah</search>",
        "<think> <search> Utah</search>",
        "<think> <search>Utah | backtrack</search>",
        "<think> <search> Utah | backtrack</search>",
    )
    constrained = trajectory.logprobs[len(script) :]
    assert all(lp <= 0.0 for lp in constrained)
    assert sum(torch.tensor(constrained).exp() > 0.999) >= 1  # e.g. the forced tag tokens


def _quote_engine(special_tokenizer, tiny_model, script: str) -> tuple[RolloutEngine, KGSearchTool]:
    tool = _tool(handles=True)
    config = RolloutConfig(constrained_decoding=True, constrained_quotes=True, max_turns=1, max_turn_tokens=40)
    backend = HFBackend(
        tiny_model(special_tokenizer),
        special_tokenizer,
        [ScriptedLogits({i: _encode(special_tokenizer, script) for i in range(6)})],
    )
    return RolloutEngine(backend, tool, config), tool


def test_constrained_quotes_spell_a_shown_line_verbatim(special_tokenizer, tiny_model):
    engine, tool = _quote_engine(special_tokenizer, tiny_model, "<think> <search>E1</search>(")
    shown = tool.session(EXAMPLE.question, list(EXAMPLE.topic_entities)).call("E1").text.split("\n")
    assert "(E1 Utah, time_zone, E2 Mountain Time Zone)" in shown
    trajectories = engine.run([EXAMPLE] * 6, sampling=SamplingParams(temperature=1.0, seed=3))
    for trajectory in trajectories:
        after = trajectory.text.split("</triples>\n", 1)[1]
        quote = after[: after.index(")") + 1]  # the random model must close the quote with a whole line
        assert quote.replace("( ", "(") in shown, after
    assert len({t.text.split("</triples>\n", 1)[1].split(")")[0] for t in trajectories}) >= 2  # lines vary


def test_constrained_quotes_copy_the_tail_of_the_chosen_line(special_tokenizer, tiny_model):
    engine, _ = _quote_engine(special_tokenizer, tiny_model, "<think> <search>E1</search>(E1 Utah, capital")
    [trajectory] = engine.run([EXAMPLE], sampling=SamplingParams(temperature=1.0, seed=0))
    assert "</triples>\n(E1 Utah, capital, E3 Salt Lake City)" in trajectory.text


def test_a_call_records_the_entities_its_block_shows_and_none_a_cut_removed(special_tokenizer, tiny_model):
    many = MemoryKG.from_triples(
        [("m.utah", "county", f"m.c{i}") for i in range(30)],
        {"m.utah": "Utah", **{f"m.c{i}": f"County{i}x" for i in range(30)}},
    )
    script = _encode(special_tokenizer, "<think> <search>Utah</search>")
    config = RolloutConfig(max_turns=1, max_turn_tokens=64, max_tool_tokens=120)
    engine = RolloutEngine(
        HFBackend(tiny_model(special_tokenizer), special_tokenizer, [ScriptedLogits({0: script})]),
        KGSearchTool(many, ToolConfig(top_k=30)),
        config,
    )
    [trajectory] = engine.run([EXAMPLE])
    [call] = trajectory.tool_calls
    kept = [line for line in call.text.split("\n") if line.startswith("(")]
    assert call.truncated and 0 < len(kept) < 30
    assert call.shown == ("m.utah", *(f"m.c{i}" for i in range(len(kept))))
    assert trajectory.search_record == [{"entity": "m.utah", "shown": list(call.shown)}]


def test_a_call_carries_the_edges_and_labels_it_showed(special_tokenizer, tiny_model):
    tool = _tool(handles=True)
    reference = tool.session(EXAMPLE.question, list(EXAMPLE.topic_entities)).call("E1")
    script = "<think> <search>E1</search><search>Utah</search><search>Erin</search></think><answer>E2</answer>"
    engine = RolloutEngine(
        HFBackend(
            tiny_model(special_tokenizer), special_tokenizer, [ScriptedLogits({0: _encode(special_tokenizer, script)})]
        ),
        tool,
        RolloutConfig(max_turn_tokens=64),
    )
    [trajectory] = engine.run([EXAMPLE])
    shown, exhausted, unknown = trajectory.tool_calls
    assert shown.edges == tuple(reference.edges) and len(shown.edges) == 2
    assert shown.labels == {"m.utah": "Utah", "m.mtz": "Mountain Time Zone", "m.slc": "Salt Lake City"}
    # a call that showed no triple still names the entity it searched, by the session's label
    assert (exhausted.error, exhausted.edges, exhausted.labels) == ("exhausted", (), {"m.utah": "Utah"})
    assert (unknown.error, unknown.entity, unknown.edges, unknown.labels) == ("unknown_entity", None, (), {})


def test_a_cut_block_carries_the_edges_whose_lines_it_kept(special_tokenizer, tiny_model):
    many = MemoryKG.from_triples(
        [("m.utah", "county", f"m.c{i}") for i in range(30)],
        {"m.utah": "Utah", **{f"m.c{i}": f"County{i}x" for i in range(30)}},
    )
    script = _encode(special_tokenizer, "<think> <search>Utah</search>")
    engine = RolloutEngine(
        HFBackend(tiny_model(special_tokenizer), special_tokenizer, [ScriptedLogits({0: script})]),
        KGSearchTool(many, ToolConfig(top_k=30)),
        RolloutConfig(max_turns=1, max_turn_tokens=64, max_tool_tokens=120),
    )
    [call] = engine.run([EXAMPLE])[0].tool_calls
    kept = [line for line in call.text.split("\n") if line.startswith("(")]
    assert call.truncated and call.num_edges == 30 and 0 < len(kept) < 30
    assert [(e.subject, e.relation, e.object) for e in call.edges] == [
        ("m.utah", "county", f"m.c{i}") for i in range(len(kept))
    ]
    assert call.labels == {"m.utah": "Utah", **{f"m.c{i}": f"County{i}x" for i in range(len(kept))}}
