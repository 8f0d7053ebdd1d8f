"""Failure categories on hand-made traces: scripted model turns through the real rollout engine,
search tool and harness record, over a small in-memory KG."""

import pytest

from kgreasoner.evaluation.failures import classify_failure, has_search_record, search_trace, summarize_failures
from kgreasoner.evaluation.harness import evaluate_method, make_record
from kgreasoner.evaluation.report import RunInfo, render_markdown, summarize
from kgreasoner.evaluation.rollout_method import KGReasonerMethod
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.schema import QAExample
from kgreasoner.retrieval.tool import KGSearchTool, ToolConfig
from kgreasoner.rollout import RolloutConfig, ToolCall, Trajectory
from kgreasoner.rollout.types import TextBackend, TextOutput

TRIPLES = [
    ("m.utah", "contains", "m.provo"),
    ("m.utah", "capital", "m.slc"),
    ("m.utah", "largest_city", "m.slc"),
    ("m.utah", "governing", "m.cvt"),
    ("m.cvt", "office_holder", "m.cox"),
    ("m.cvt", "from", '"2021-01-04"'),
    ("m.provo", "mayor", "m.kaufusi"),
    ("m.slc", "mayor", "m.erin"),
    ("m.slc", "founded_by", "m.brigham"),
    ("m.slc", "sister_city", "m.provo_tx"),
    ("m.provo_tx", "mayor", "m.fry"),
    ("m.provo_tx", "state", "m.texas"),
    ("m.brigham", "child", "m.brigham_jr"),
    ("m.brigham", "child", "m.john"),
]
NAMES = {
    "m.utah": "Utah",
    "m.provo": "Provo",
    "m.slc": "Salt Lake City",
    "m.cox": "Spencer Cox",
    "m.kaufusi": "Michelle Kaufusi",
    "m.erin": "Erin Mendenhall",
    "m.brigham": "Brigham Young",
    "m.provo_tx": "Provo",
    "m.fry": "Tom Fry",
    "m.texas": "Texas",
    "m.brigham_jr": "Brigham Young Jr",
    "m.john": "John Young",
}
KG = MemoryKG.from_triples(TRIPLES, NAMES)
NEAR_NAMESAKES = MemoryKG.from_triples(TRIPLES, {**NAMES, "m.provo_tx": "PROVO"})
"""The Texan Provo spelt otherwise: a search of `PROVO` finds it alone, though normalised it names both."""
UTAH = {"id": "m.utah", "name": "Utah"}


def example(gold_paths, answer, topic=UTAH, qid="q"):
    return QAExample.from_dict(
        {"id": qid, "question": "a question", "topic_entities": [topic], "answers": [answer], "gold_paths": gold_paths}
    )


MAYOR = example([["capital", "mayor"]], {"id": "m.erin", "name": "Erin Mendenhall"})
CAPITAL = example([["capital"]], {"id": "m.slc", "name": "Salt Lake City"})
FOUNDER = example([["largest_city", "founded_by"]], {"id": "m.brigham", "name": "Brigham Young"})
GOVERNOR = example([["governing", "office_holder"]], {"id": "m.cox", "name": "Spencer Cox"})
PROVO_MAYOR = example([["contains", "mayor"]], {"id": "m.kaufusi", "name": "Michelle Kaufusi"})
SISTER_STATE = example([["capital", "sister_city", "state"]], {"id": "m.texas", "name": "Texas"})
CHILD = example(
    [["child"]], {"id": "m.brigham_jr", "name": "Brigham Young Jr"}, topic={"id": "m.brigham", "name": "Brigham Young"}
)


class ScriptedText(TextBackend):
    """Stands for the model behind a text endpoint: row i writes turns[i][turn], then stops.

    A turn is text (finish reason `stop`) or (text, finish reason), or an Exception for a failed request.
    """

    def __init__(self, turns):
        self.turns = turns

    def complete_text(self, prompts, budgets, sampling, turn, indices):
        outputs = []
        for index in indices:
            turns = self.turns[index]
            step = turns[turn] if turn < len(turns) else ("", "length")
            if isinstance(step, Exception):
                outputs.append(TextOutput(text="", finish_reason=None, error=str(step)))
                continue
            text, reason = step if isinstance(step, tuple) else (step, "stop")
            outputs.append(TextOutput(text=text, finish_reason=reason, num_tokens=len(text.split())))
        return outputs


def method(turns, handles=False, top_k=10, max_turns=8, kg=KG):
    tool = KGSearchTool(kg, ToolConfig(entity_handles=handles, top_k=top_k))
    return KGReasonerMethod(ScriptedText(turns), tool, RolloutConfig(max_turns=max_turns))


def record(qa, *turns, **options):
    """The harness record of one scripted trajectory."""
    ours = method({0: list(turns)}, **options)
    result = ours.answer(qa)
    return make_record(ours.name, qa, result, result.usage, 0.0, ours.kg)


def failure(qa, *turns, **options):
    return record(qa, *turns, **options)["failure"]


S = "<search>{}</search>"
A = "</think>\n<answer>{}</answer>"


def test_correct_answers_get_no_category():
    rec = record(MAYOR, "<think> " + S.format("Utah"), S.format("Salt Lake City"), A.format("Erin Mendenhall"))
    assert rec["hits1"] == 1.0 and rec["failure"] is None
    trace = rec["trace"]
    assert has_search_record(trace)
    assert trace["tool_calls"][1]["shown"] == [
        ["m.slc", "mayor", "m.erin"],
        ["m.slc", "founded_by", "m.brigham"],
        ["m.slc", "sister_city", "m.provo_tx"],
    ]
    assert trace["entities"][:3] == [["m.utah", "", "Utah"], ["m.provo", "", "Provo"], ["m.slc", "", "Salt Lake City"]]
    # Through a mediator: one search step, two relations.
    assert failure(GOVERNOR, "<think> " + S.format("Utah"), A.format("Spencer Cox")) is None


def test_wrong_relation_at_each_hop():
    assert failure(MAYOR, "<think> " + S.format("Utah"), S.format("Provo"), A.format("Michelle Kaufusi")) == {
        "category": "wrong_relation",
        "detail": {
            "hop": 1,
            "taken": "contains",
            "gold": ["capital"],
            "path": ["contains", "mayor"],
            "entities": ["Utah", "Provo", "Michelle Kaufusi"],
            "gold_shown": True,
        },
    }
    assert failure(MAYOR, "<think> " + S.format("Utah"), S.format("Salt Lake City"), A.format("Brigham Young")) == {
        "category": "wrong_relation",
        "detail": {
            "hop": 2,
            "taken": "founded_by",
            "gold": ["mayor"],
            "path": ["capital", "founded_by"],
            "entities": ["Utah", "Salt Lake City", "Brigham Young"],
            "gold_shown": True,
        },
    }
    # Several gold paths: hop 1 may take either relation; hop 2 is judged against those that agree so far.
    two = example([["capital", "mayor"], ["largest_city", "mayor"]], {"id": "m.erin", "name": "Erin Mendenhall"})
    assert failure(two, "<think> " + S.format("Utah"), S.format("Provo"), A.format("Michelle Kaufusi"))["detail"] == {
        "hop": 1,
        "taken": "contains",
        "gold": ["capital", "largest_city"],
        "path": ["contains", "mayor"],
        "entities": ["Utah", "Provo", "Michelle Kaufusi"],
        "gold_shown": True,
    }
    assert failure(two, "<think> " + S.format("Utah"), S.format("Salt Lake City"), A.format("Brigham Young"))[
        "detail"
    ]["gold"] == ["mayor"]
    # The second relation of a mediator candidate.
    assert failure(GOVERNOR, "<think> " + S.format("Utah"), A.format("2021-01-04")) == {
        "category": "wrong_relation",
        "detail": {
            "hop": 2,
            "taken": "from",
            "gold": ["office_holder"],
            "path": ["governing", "from"],
            "entities": ["Utah", "2021-01-04"],
            "gold_shown": True,
        },
    }


def test_wrong_relation_stopping_early_going_past_and_without_search():
    assert failure(MAYOR, "<think> " + S.format("Utah"), A.format("Salt Lake City"))["detail"] == {
        "hop": 2,
        "taken": None,
        "gold": ["mayor"],
        "path": ["capital"],
        "entities": ["Utah", "Salt Lake City"],
        "gold_shown": False,
    }
    assert failure(
        CAPITAL, "<think> " + S.format("Utah"), S.format("Salt Lake City"), A.format("Erin Mendenhall")
    ) == {
        "category": "wrong_relation",
        "detail": {
            "hop": 2,
            "taken": "mayor",
            "gold": [],
            "path": ["capital", "mayor"],
            "entities": ["Utah", "Salt Lake City", "Erin Mendenhall"],
            "gold_shown": False,
        },
    }
    # No search at all, the topic entity as the answer: the model answered before hop 1.
    assert failure(MAYOR, "<think> easy " + A.format("Utah")) == {
        "category": "wrong_relation",
        "detail": {
            "hop": 1,
            "taken": None,
            "gold": ["capital"],
            "path": [],
            "entities": ["Utah"],
            "gold_shown": False,
        },
    }


def test_gold_shown_tells_a_wrong_choice_from_a_line_the_tool_never_showed():
    # top_k 1: Utah's page holds only (Utah, contains, Provo); the capital line was never offered.
    rec = record(MAYOR, "<think> " + S.format("Utah"), S.format("Provo"), A.format("Michelle Kaufusi"), top_k=1)
    assert rec["trace"]["tool_calls"][0]["shown"] == [["m.utah", "contains", "m.provo"]]
    assert rec["failure"]["detail"]["hop"] == 1 and rec["failure"]["detail"]["gold_shown"] is False
    # The same walk with the whole page shown: the capital line was there and the model took another.
    assert (
        failure(MAYOR, "<think> " + S.format("Utah"), S.format("Provo"), A.format("Michelle Kaufusi"))["detail"][
            "gold_shown"
        ]
        is True
    )
    # Leaving the gold path inside a mediator step: the office holder's line was shown from the mediator.
    assert failure(GOVERNOR, "<think> " + S.format("Utah"), A.format("2021-01-04"))["detail"]["gold_shown"] is True


def test_parallel_triples_are_read_as_the_gold_one():
    # (Utah, capital, SLC) and (Utah, largest_city, SLC) both link the walk; hop 1 agrees with gold.
    assert failure(
        FOUNDER, "<think> " + S.format("Utah"), S.format("Salt Lake City"), A.format("Erin Mendenhall")
    ) == {
        "category": "wrong_relation",
        "detail": {
            "hop": 2,
            "taken": "mayor",
            "gold": ["founded_by"],
            "path": ["largest_city", "mayor"],
            "entities": ["Utah", "Salt Lake City", "Erin Mendenhall"],
            "gold_shown": True,
        },
    }


def test_backtrack_returns_the_walk_to_the_parent():
    # top_k 2: Utah's first page shows Provo and the capital; the backtrack from Provo shows the rest.
    rec = record(
        MAYOR,
        "<think> " + S.format("Utah"),
        S.format("Provo"),
        S.format("Provo | backtrack"),
        A.format("Spencer Cox"),
        top_k=2,
    )
    calls = rec["trace"]["tool_calls"]
    assert [(c["entity"], c["backtracked"], c["error"]) for c in calls] == [
        ("m.utah", False, None),
        ("m.provo", False, None),
        ("m.utah", True, None),
    ]
    assert calls[2]["shown"] == [
        ["m.utah", "largest_city", "m.slc"],
        ["m.utah", "governing", "m.cvt"],
        ["m.cvt", "office_holder", "m.cox"],
    ]
    assert rec["failure"] == {
        "category": "wrong_relation",
        "detail": {
            "hop": 1,
            "taken": "governing",
            "gold": ["capital"],
            "path": ["governing", "office_holder"],
            "entities": ["Utah", "Spencer Cox"],
            "gold_shown": True,
        },
    }


def test_copy_failure_by_name_and_by_handle():
    assert failure(MAYOR, "<think> " + S.format("Utah"), S.format("Salt Lake"), A.format("Erin")) == {
        "category": "copy_failure",
        "detail": {"call": 2, "query": "Salt Lake"},
    }
    # E1 is Utah; E9 was never shown (Utah's page has handles E2-E6).
    rec = record(MAYOR, "<think> " + S.format("E1"), S.format("E9"), A.format("E3"), handles=True)
    assert rec["trace"]["entities"][-1] == ['"2021-01-04"', "E6", "2021-01-04"]
    assert rec["failure"] == {"category": "copy_failure", "detail": {"call": 2, "query": "E9"}}
    # A copy failure the model recovered from is no failure when the answer is right.
    assert (
        failure(
            MAYOR,
            "<think> " + S.format("Denver"),
            S.format("Utah"),
            S.format("Salt Lake City"),
            A.format("Erin Mendenhall"),
        )
        is None
    )


def test_loop_and_limits():
    looping = ["<think> " + S.format("Utah")] + [S.format("Utah")] * 3
    assert failure(MAYOR, *looping, max_turns=2) == {
        "category": "loop_or_turn_limit",
        "detail": {"finish_reason": "max_turns", "tool_calls": 2, "repeated": {"query": "Utah", "times": 2}},
    }
    assert failure(MAYOR, "<think> " + S.format("Utah"), ("I keep thinking", "length")) == {
        "category": "loop_or_turn_limit",
        "detail": {"finish_reason": "max_tokens", "tool_calls": 1, "repeated": None},
    }
    # The memorised name that led to the loop is the root cause.
    assert failure(
        MAYOR,
        "<think> " + S.format("Erin Mendenhall"),
        S.format("Erin Mendenhall"),
        S.format("Erin Mendenhall"),
        max_turns=2,
    ) == {"category": "copy_failure", "detail": {"call": 1, "query": "Erin Mendenhall"}}


def test_invalid_format():
    assert failure(MAYOR, "<think> I do not know. </think>") == {
        "category": "invalid_format",
        "detail": {"finish_reason": "eos", "errors": ["no <answer> block"]},
    }
    assert failure(MAYOR, "<think> Utah</search>") == {
        "category": "invalid_format",
        "detail": {
            "finish_reason": "error",
            "errors": ["unexpected </search> inside the think block", "unclosed <think>"],
        },
    }
    assert failure(MAYOR, "<think> " + S.format("Utah"), A.format(" ")) == {
        "category": "invalid_format",
        "detail": {"finish_reason": "answer", "errors": ["empty <answer>"]},
    }
    # Out of tokens without ever opening the think block: not a loop, the protocol never started.
    assert failure(MAYOR, ("\n\n\n", "length")) == {
        "category": "invalid_format",
        "detail": {"finish_reason": "max_tokens", "errors": ["no <think>"]},
    }
    # An answered trajectory with a bad layout is judged on its answer.
    rec = record(MAYOR, "<think> " + S.format("Utah"), " <answer>Provo</answer>")
    assert rec["format_valid"] is False and rec["failure"]["category"] == "wrong_relation"


def test_answer_not_in_context_and_rollout_errors():
    assert failure(MAYOR, "<think> I remember it. " + A.format("Jenny Wilson")) == {
        "category": "answer_not_in_context",
        "detail": {"answer": "Jenny Wilson"},
    }
    assert failure(MAYOR, "<think> " + S.format("Utah"), A.format("E2"), handles=True)["category"] == "wrong_relation"
    assert failure(MAYOR, "<think> " + S.format("Utah"), A.format("E20"), handles=True) == {
        "category": "answer_not_in_context",
        "detail": {"answer": "E20"},
    }
    assert failure(MAYOR, "<think> " + S.format("Utah"), RuntimeError("connection refused")) == {
        "category": "other",
        "detail": {"reason": "rollout_error", "error": "connection refused"},
    }
    no_gold = example([], {"id": "m.erin", "name": "Erin Mendenhall"})
    assert failure(no_gold, "<think> " + S.format("Utah"), A.format("Provo")) == {
        "category": "other",
        "detail": {"reason": "no_gold_path"},
    }


def test_data_ambiguity_other_object_checked_on_the_kg():
    assert failure(CHILD, "<think> " + S.format("Brigham Young"), A.format("John Young")) == {
        "category": "data_ambiguity",
        "detail": {
            "kind": "other_object",
            "path": ["child"],
            "answer": "John Young",
            "answer_id": "m.john",
            "gold_path_reaches": 2,
            "reached_by_gold_path": True,
        },
    }
    # Without a KG there is no reach check.
    rec = record(CHILD, "<think> " + S.format("Brigham Young"), A.format("John Young"))
    assert classify_failure(CHILD, rec["trace"], correct=False) == {
        "category": "data_ambiguity",
        "detail": {"kind": "other_object", "path": ["child"], "answer": "John Young", "answer_id": "m.john"},
    }
    # The gold entity reached, but the data names it otherwise than the KG.
    renamed = example([["capital", "mayor"]], {"id": "m.erin", "name": "Mayor Mendenhall"})
    assert failure(
        renamed, "<think> " + S.format("Utah"), S.format("Salt Lake City"), A.format("Erin Mendenhall")
    ) == {
        "category": "data_ambiguity",
        "detail": {
            "kind": "gold_label",
            "path": ["capital", "mayor"],
            "answer": "Erin Mendenhall",
            "answer_id": "m.erin",
            "gold_path_reaches": 1,
            "reached_by_gold_path": True,
        },
    }


def test_namesakes_are_named_by_id_or_handle_and_a_near_namesake_is_blamed():
    # SLC's page shows a second "Provo"; searched by name, the tool lists both, and the model picks one by id.
    start = ["<think> " + S.format("Utah"), S.format("Salt Lake City")]
    rec = record(PROVO_MAYOR, *start, S.format("Provo"), S.format("m.provo_tx"), A.format("Tom Fry"))
    ambiguous = rec["trace"]["tool_calls"][2]
    assert (ambiguous["entity"], ambiguous["error"]) == (None, "ambiguous_entity")
    assert rec["trace"]["tool_calls"][3]["entity"] == "m.provo_tx"
    assert rec["failure"]["category"] == "wrong_relation"
    # The Texan one spelt "PROVO": the search finds it alone, and the Utah one would have agreed with gold.
    turns = [*start, S.format("PROVO"), A.format("Tom Fry")]
    rec = record(PROVO_MAYOR, *turns, kg=NEAR_NAMESAKES)
    assert rec["trace"]["tool_calls"][2]["entity"] == "m.provo_tx"
    assert rec["failure"] == {
        "category": "data_ambiguity",
        "detail": {
            "kind": "namesake",
            "call": 3,
            "query": "PROVO",
            "chosen": "m.provo_tx",
            "namesake": "m.provo",
            "path": ["capital", "sister_city", "mayor"],
            "path_with_namesake": ["contains", "mayor"],
        },
    }
    # A near namesake that did not divert the walk: the other would agree less with gold.
    assert failure(SISTER_STATE, *turns, kg=NEAR_NAMESAKES) == {
        "category": "wrong_relation",
        "detail": {
            "hop": 3,
            "taken": "mayor",
            "gold": ["state"],
            "path": ["capital", "sister_city", "mayor"],
            "entities": ["Utah", "Salt Lake City", "PROVO", "Tom Fry"],
            "gold_shown": True,
        },
    }
    # With handles the model names which Provo it means: choosing the Texan one is its own relation error.
    by_handle = record(
        PROVO_MAYOR, "<think> " + S.format("E1"), S.format("E3"), S.format("E9"), A.format("Tom Fry"), handles=True
    )
    assert by_handle["trace"]["tool_calls"][2]["entity"] == "m.provo_tx"
    assert by_handle["failure"] == {
        "category": "wrong_relation",
        "detail": {
            "hop": 1,
            "taken": "capital",
            "gold": ["contains"],
            "path": ["capital", "sister_city", "mayor"],
            "entities": ["Utah", "Salt Lake City", "Provo", "Tom Fry"],
            "gold_shown": True,
        },
    }


def test_a_filtered_search_is_judged_by_its_name_part():
    """`NAME | REL` names its entity by NAME alone: a handle or an id there leaves no namesake to blame."""
    wrong_relation = {
        "category": "wrong_relation",
        "detail": {
            "hop": 1,
            "taken": "capital",
            "gold": ["contains"],
            "path": ["capital", "sister_city", "mayor"],
            "entities": ["Utah", "Salt Lake City", "Provo", "Tom Fry"],
            "gold_shown": True,
        },
    }
    by_handle = record(
        PROVO_MAYOR,
        "<think> " + S.format("E1"),
        S.format("E3"),
        S.format("E9|mayor"),
        A.format("Tom Fry"),
        handles=True,
    )
    call = by_handle["trace"]["tool_calls"][2]
    assert (call["query"], call["entity"], call["shown"]) == (
        "E9|mayor",
        "m.provo_tx",
        [["m.provo_tx", "mayor", "m.fry"]],
    )
    assert by_handle["failure"] == wrong_relation
    by_id = record(
        PROVO_MAYOR,
        "<think> " + S.format("Utah"),
        S.format("Salt Lake City"),
        S.format("m.provo_tx | mayor"),
        A.format("Tom Fry"),
    )
    assert by_id["trace"]["tool_calls"][2]["entity"] == "m.provo_tx"
    assert by_id["failure"] == wrong_relation
    # Written as a name, the filtered search is as ambiguous as the plain one.
    assert (
        record(PROVO_MAYOR, "<think> " + S.format("Utah"), S.format("Salt Lake City"), S.format("Provo | mayor"))[
            "trace"
        ]["tool_calls"][2]["error"]
        == "ambiguous_entity"
    )
    by_name = record(
        PROVO_MAYOR,
        "<think> " + S.format("Utah"),
        S.format("Salt Lake City"),
        S.format("PROVO | mayor"),
        A.format("Tom Fry"),
        kg=NEAR_NAMESAKES,
    )
    assert by_name["failure"] == {
        "category": "data_ambiguity",
        "detail": {
            "kind": "namesake",
            "call": 3,
            "query": "PROVO | mayor",
            "chosen": "m.provo_tx",
            "namesake": "m.provo",
            "path": ["capital", "sister_city", "mayor"],
            "path_with_namesake": ["contains", "mayor"],
        },
    }


def test_a_cut_tool_block_counts_only_the_triples_its_call_kept():
    """The trace reads what each call showed from its `ToolCall`: after a cut, the one triple the block kept."""
    tool = KGSearchTool(KG, ToolConfig())
    session = tool.session(MAYOR.question, list(MAYOR.topic_entities))
    result = session.call("Utah")
    first_line = result.text.split("\n")[0]
    assert first_line == "(Utah, contains, Provo)" and len(result.edges) == 7
    cut = first_line + "\n[4 more lines cut: tool output limit]"
    text = "<think> " + S.format("Utah") + f"\n<triples>\n{cut}\n</triples>\n" + A.format("Salt Lake City")
    kept = result.edges[0]
    call = ToolCall(
        "Utah",
        cut,
        None,
        "m.utah",
        False,
        len(result.edges),
        True,
        0,
        0.0,
        shown=("m.utah", "m.provo"),
        edges=(kept,),
        labels={"m.utah": "Utah", "m.provo": "Provo"},
    )
    trajectory = Trajectory(
        index=0,
        prompt_ids=[],
        completion_ids=[],
        env_mask=[],
        logprobs=[],
        text=text,
        tool_calls=[call],
        finish_reason="answer",
        answers=["Salt Lake City"],
        resolved_answers=["Salt Lake City"],
    )
    trace = search_trace(trajectory, session, MAYOR.topic_entities)
    assert trace["tool_calls"][0]["shown"] == [["m.utah", "contains", "m.provo"]]
    assert trace["entities"] == [["m.utah", "", "Utah"], ["m.provo", "", "Provo"]]
    assert classify_failure(MAYOR, trace, correct=False, kg=KG) == {
        "category": "answer_not_in_context",
        "detail": {"answer": "Salt Lake City"},
    }


def test_untraced_methods_are_uncategorised():
    assert classify_failure(MAYOR, {"prompt": "x", "reply": "y"}, correct=False) is None
    assert classify_failure(MAYOR, None, correct=False) is None


def test_counts_in_the_summary_and_the_report(tmp_path):
    examples = [
        example([["capital", "mayor"]], {"id": "m.erin", "name": "Erin Mendenhall"}, qid=f"q{i}") for i in range(5)
    ]
    turns = {
        0: ["<think> " + S.format("Utah"), S.format("Salt Lake City"), A.format("Erin Mendenhall")],
        1: ["<think> " + S.format("Utah"), S.format("Salt Lake City"), A.format("Brigham Young")],
        2: ["<think> " + S.format("Utah"), S.format("Provo"), A.format("Michelle Kaufusi")],
        3: ["<think> " + S.format("Salt Lake"), A.format("Salt Lake")],
        4: ["<think> " + S.format("Utah"), A.format("Salt Lake City")],  # stops before searching the mayor's city
    }
    records = evaluate_method(method(turns), examples, tmp_path / "kgreasoner.jsonl", batch_size=5, progress=False)
    assert [r["failure"] and r["failure"]["category"] for r in records] == [
        None,
        "wrong_relation",
        "wrong_relation",
        "copy_failure",
        "wrong_relation",
    ]
    untraced = {
        "hops": 2,
        "hits1": 0.0,
        "f1": 0.0,
        "em": 0.0,
        "format_valid": True,
        "error": None,
        "llm_calls": 1,
        "prompt_tokens": 1,
        "completion_tokens": 1,
        "kg_queries": 0,
        "wall_time": 0.1,
        "trace": None,
    }
    ours, io = summarize(records), summarize([untraced])
    assert ours["failures"] == {
        "counts": {
            "wrong_relation": 3,
            "copy_failure": 1,
            "data_ambiguity": 0,
            "loop_or_turn_limit": 0,
            "invalid_format": 0,
            "answer_not_in_context": 0,
            "other": 0,
        },
        "uncategorised": 0,
        "wrong_relation_by_hop": {"1": 1, "2": 2},
        "wrong_relation_gold_not_shown": 1,
    }
    assert io["failures"]["uncategorised"] == 1 and sum(io["failures"]["counts"].values()) == 0
    md = render_markdown(RunInfo("toy", "test", "given"), {"kgreasoner": ours, "io": io})
    assert (
        "| method | wrong | wrong relation | copy failure | data ambiguity | loop / turn limit | invalid format | "
        "answer not in context | other | uncategorised |"
    ) in md
    assert "| kgreasoner | 4 | 3 (hop 1: 1, hop 2: 2; gold not shown: 1) | 1 | 0 | 0 | 0 | 0 | 0 | 0 |" in md
    assert "| io | 1 | 0 | 0 | 0 | 0 | 0 | 0 | 0 | 1 |" in md
    assert render_markdown(RunInfo("toy", "test", "given"), {"io": io}).count("failure category") == 0
    assert summarize_failures([]) == {
        "counts": dict.fromkeys(ours["failures"]["counts"], 0),
        "uncategorised": 0,
        "wrong_relation_by_hop": {},
        "wrong_relation_gold_not_shown": 0,
    }


@pytest.mark.parametrize("handles", [False, True])
def test_the_same_walk_by_names_or_by_handles(handles):
    first = "E1" if handles else "Utah"
    rec = record(MAYOR, "<think> " + S.format(first), A.format("E2" if handles else "Provo"), handles=handles)
    assert rec["answers"] == ["Provo"]
    assert rec["failure"] == {
        "category": "wrong_relation",
        "detail": {
            "hop": 1,
            "taken": "contains",
            "gold": ["capital"],
            "path": ["contains"],
            "entities": ["Utah", "Provo"],
            "gold_shown": True,
        },
    }
