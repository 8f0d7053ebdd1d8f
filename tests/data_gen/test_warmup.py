"""Warm-up trajectories: made by the real tool, replayable, format-valid, ending at gold answers."""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from data_gen.synthetic import write_synthetic
from data_gen.warmup import (
    DEFAULT_TEMPLATES,
    Teacher,
    WarmupConfig,
    WarmupGenerator,
    generate_records,
    load_templates,
    main,
    register,
    replay_tool_blocks,
    run,
)
from data_gen.warmup.writer import Skip
from kgreasoner.config import ConfigError, load_config
from kgreasoner.data import load_dataset, open_dataset_kg
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.protocol import SEARCH_CLOSE, TRIPLES_CLOSE, TRIPLES_OPEN, check_format, parse_trajectory
from kgreasoner.records.normalize import normalize_answer
from kgreasoner.records.schema import Answer, QAExample, TopicEntity
from kgreasoner.records.trajectories import read_warmup
from kgreasoner.retrieval.tool import KGSearchTool

HANDLE = re.compile(r"^E[1-9][0-9]*$")
HANDLE_TOKEN = re.compile(r"\bE[1-9][0-9]*\b")
LABELLED = re.compile(
    r"(E\d+) ([^,()]+?)[,)]"
)  # a handle and the label after it in a triple (no commas in synthetic labels)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> Path:
    return write_synthetic(
        tmp_path_factory.mktemp("warmup") / "synthetic", seed=0, num_entities=200, num_questions=150
    )


def make_config(dataset: Path | str, out: Path, *overrides: str) -> WarmupConfig:
    return load_config(WarmupConfig, None, [f"dataset={dataset}", f"output={out}", "progress=false", *overrides])


@pytest.fixture(scope="module", params=[True, False], ids=["handles", "names"])
def generated(request, synthetic, tmp_path_factory):
    """Every training (and dev) question of the synthetic set, 30% corrections; with and without handles."""
    out = tmp_path_factory.mktemp("out") / "warmup.jsonl"
    config = make_config(
        synthetic, out, "num_examples=all", "dev_examples=all", f"tool.entity_handles={str(request.param).lower()}"
    )
    summary = run(config)
    dataset = load_dataset(synthetic)
    kg = open_dataset_kg(dataset)
    return {
        "config": config,
        "summary": summary,
        "records": read_warmup(out),
        "out": out,
        "tool": KGSearchTool(kg, config.tool),
        "examples": {e.id: e for e in dataset.examples},
    }


def gold_forms(example: QAExample) -> set[str]:
    return {normalize_answer(f) for a in example.answers for f in a.surface_forms()}


def test_every_record_is_format_valid_with_masks_on_tool_blocks_only(generated):
    records = generated["records"]
    assert len(records) >= 100
    for record in records:
        assert check_format(record.completion).valid, (record.id, check_format(record.completion).errors)
        segments = record.segments
        assert segments[0].train and segments[-1].train and segments[-1].text.endswith("</answer>")
        for index, segment in enumerate(segments):
            if segment.train:
                assert TRIPLES_OPEN not in segment.text and TRIPLES_CLOSE not in segment.text
                assert index == len(segments) - 1 or segment.text.endswith(SEARCH_CLOSE)
            else:
                assert segment.text.startswith(f"\n{TRIPLES_OPEN}\n") and segment.text.endswith(f"\n{TRIPLES_CLOSE}\n")
                assert segment.text.count(TRIPLES_OPEN) == 1 and segments[index - 1].train
        # trained and masked spans alternate: one tool block per search
        assert [s.train for s in segments] == [True, False] * len(parse_trajectory(record.completion).searches) + [
            True
        ]


def test_replaying_the_searches_reproduces_every_tool_block(generated):
    for record in generated["records"]:
        masked = [s.text for s in record.segments if not s.train]
        assert replay_tool_blocks(record, generated["tool"]) == masked, record.id


def test_answers_resolve_to_gold_and_corrections_backtrack_once(generated):
    tool, examples = generated["tool"], generated["examples"]
    kinds = Counter()
    for record in generated["records"]:
        example = examples[record.id]
        parsed = parse_trajectory(record.completion)
        session = tool.session(record.question, list(record.topic_entities))
        for search in parsed.searches:
            session.call(search.raw)
        answers = session.resolve_answer(parsed.answer_text)
        assert answers and normalize_answer(answers[0]) in gold_forms(example), record.id
        backtracks = [i for i, s in enumerate(parsed.searches) if s.is_backtrack]
        kinds[record.kind] += 1
        if record.kind == "gold":
            assert backtracks == []
        else:
            assert len(backtracks) == 1
            wrong = parsed.searches[backtracks[0] - 1]
            # the backtrack leaves the entity searched just before it, which is no gold answer
            assert not wrong.is_backtrack and wrong.query == parsed.searches[backtracks[0]].query
            assert normalize_answer(session.resolve_answer(wrong.query)[0]) not in gold_forms(example)
        assert record.hops == example.hops and record.split == example.split
    assert kinds["gold"] > 0 and kinds["correction"] > 0


def test_correction_share_and_counts_match_the_summary(generated):
    records, summary = generated["records"], generated["summary"]
    share = sum(r.kind == "correction" for r in records) / len(records)
    assert abs(share - 0.3) <= 0.05
    assert summary["records"] == len(records)
    assert summary["by_kind"] == dict(Counter(r.kind for r in records))
    assert summary["by_split"] == dict(Counter(r.split for r in records))
    assert set(summary["by_split"]) == {"train", "dev"}
    dataset_train = sum(1 for e in generated["examples"].values() if e.split == "train")
    assert summary["by_split"]["train"] + sum(summary["skipped"]["train"].values()) == dataset_train
    assert json.loads(generated["config"].summary_path.read_text()) == summary
    # most backtracks show the next candidates of the entity the detour left
    outcomes = {k: v for k, v in summary["notes"].items() if k.startswith("backtrack_output:")}
    assert sum(outcomes.values()) == summary["by_kind"]["correction"]
    assert outcomes["backtrack_output:parent"] > summary["by_kind"]["correction"] / 2


def test_handles_or_names_in_searches_and_answers(generated):
    handles = generated["config"].tool.entity_handles
    for record in generated["records"]:
        parsed = parse_trajectory(record.completion)
        queries = [s.query.split(" | ")[0] for s in parsed.searches] + parsed.answers  # a filter's entity part
        assert all(bool(HANDLE.match(q)) == handles for q in queries), (record.id, queries)
        if handles:
            assert parsed.searches[0].query == "E1"
        else:
            assert parsed.searches[0].query == record.topic_entities[0].name


def test_same_seed_same_bytes_other_seed_other_records(synthetic, tmp_path):
    paths = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        config = make_config(
            synthetic,
            tmp_path / f"{name}.jsonl",
            "num_examples=40",
            "dev_examples=0",
            f"seed={seed}",
            "tool.entity_handles=true",
        )
        run(config)
        paths.append(tmp_path / f"{name}.jsonl")
    assert paths[0].read_bytes() == paths[1].read_bytes()
    assert paths[0].read_bytes() != paths[2].read_bytes()
    assert len(read_warmup(paths[0])) == 40


def test_correction_share_zero_and_one(synthetic, tmp_path):
    none = run(
        make_config(synthetic, tmp_path / "none.jsonl", "num_examples=30", "dev_examples=0", "correction_share=0")
    )
    assert none["by_kind"] == {"gold": 30}
    every = run(
        make_config(
            synthetic,
            tmp_path / "all.jsonl",
            "num_examples=30",
            "dev_examples=0",
            "correction_share=1",
            "tool.entity_handles=true",
        )
    )
    # questions where no hop allows a detour stay gold (and are counted)
    assert every["by_kind"].get("correction", 0) >= 20
    assert every["by_kind"].get("gold", 0) == every["notes"].get("correction_fell_back_to_gold", 0)


# --- a hand-made graph with a mediator hop: exact trajectories ---------------------------------------
ONE_TEMPLATE = {
    "start": "I need {need}.",
    "fact": "Here {fact}.",
    "next": "Next I need {need}.",
    "again": "Again {entity} for {need}.",
    "final": "The answer is {answer}.",
    "detour": "Maybe {wrong}.",
    "notice_relation": "{wrong} is {wrong_relation}, not {need}.",
    "notice_dead_end": "{wrong} has no {next_relation}.",
    "notice_empty": "{wrong} leads nowhere.",
    "recover": "Back at {entity}: {fact}.",
    "list": "List {entity} for {need}.",
}


@pytest.fixture
def tiny_kg() -> MemoryKG:
    triples = [
        ("ann", "people.person.spouse_s", "m1"),
        ("m1", "people.marriage.spouse", "bob"),
        ("m1", "people.marriage.spouse", "ann"),
        ("ann", "people.person.profession", "chef"),
        ("bob", "people.person.nationality", "france"),
        ("bob", "people.person.profession", "chef"),
        ("dan", "people.person.profession", "chef"),
    ]
    names = {"ann": "Ann", "bob": "Bob", "chef": "Chef", "france": "France", "dan": "Dan"}
    return MemoryKG(*zip(*triples), names=names)


@pytest.fixture
def templates_file(tmp_path) -> Path:
    path = tmp_path / "templates.yaml"
    path.write_text(json.dumps({group: [text] for group, text in ONE_TEMPLATE.items()}), encoding="utf-8")
    return path


def spouse_question(
    path=("people.person.spouse_s", "people.marriage.spouse", "people.person.nationality"),
) -> QAExample:
    return QAExample(
        id="q1",
        question="what is the nationality of ann's spouse",
        topic_entities=(TopicEntity("ann", "Ann"),),
        answers=(Answer("france", "France"),),
        gold_paths=(path,),
        hops=len(path),
        split="train",
    )


def tiny_generator(kg, templates_file, *overrides):
    config = make_config("unused", Path("unused.jsonl"), f"templates={templates_file}", *overrides)
    return WarmupGenerator(kg, KGSearchTool(kg, config.tool), config, load_templates(config.templates))


def test_mediator_hop_is_one_search_with_exact_text(tiny_kg, templates_file):
    generator = tiny_generator(tiny_kg, templates_file, "tool.entity_handles=true")
    record = generator.make(spouse_question(), correction=False)
    assert record.completion == (
        "<think> I need the person spouse s / marriage spouse of E1. <search>E1</search>\n<triples>\n"
        "(E1 Ann, people.person.spouse_s, E2 m1)\n(E2 m1, people.marriage.spouse, E3 Bob)\n"
        "(E2 m1, people.marriage.spouse, E1 Ann)\n"
        "(E1 Ann, people.person.profession, E4 Chef)\n</triples>\n"
        "Here E1 has person spouse s / marriage spouse E3. Next I need the person nationality of E3. "
        "<search>E3</search>\n"
        "<triples>\n(E3 Bob, people.person.nationality, E5 France)\n(E3 Bob, people.person.profession, E4 "
        "Chef)\n</triples>\n"
        "Here E3 has person nationality E5. The answer is E5. </think>\n<answer>E5</answer>"
    )
    assert record.kind == "gold" and record.hops == 3


def test_correction_searches_a_shown_wrong_entity_and_backtracks(tiny_kg, templates_file):
    generator = tiny_generator(tiny_kg, templates_file, "tool.entity_handles=false")
    record = generator.make(spouse_question(), correction=True)
    assert record.kind == "correction"
    searches = [s.raw for s in parse_trajectory(record.completion).searches]
    # Chef is the only shown entity off the gold path (at the first hop; at the second it was searched already)
    assert searches == ["Ann", "Chef", "Chef | backtrack", "Bob"]
    assert "Chef is person profession, not the person spouse s / marriage spouse of Ann." in record.completion
    assert "Back at Ann: Ann has person spouse s / marriage spouse Bob." in record.completion
    assert record.completion.endswith("<answer>France</answer>")
    # every neighbour of Ann was shown in the first block: the tool has nothing left to offer
    assert (
        "<search>Chef | backtrack</search>\n<triples>\nNothing left to backtrack to: every neighbour on the path from "
        "Chef back to the topic entity has been shown. Search another entity shown above, or answer.\n</triples>\n"
        in record.completion
    )
    assert generator.stats["backtrack_output:error:backtrack_at_root"] == 1


def test_skips_are_counted_by_reason(tiny_kg, templates_file):
    generator = tiny_generator(tiny_kg, templates_file, "tool.top_k=1", "max_repeats=0")  # no filtered page allowed
    examples = [
        spouse_question(),  # top_k=1 shows the mediator pair, then Bob's nationality first: fine
        QAExample(
            id="q2",
            question="who",
            topic_entities=(TopicEntity("ann", "Ann"),),
            answers=(Answer("france", "France"),),
            split="train",
        ),
        spouse_question(("people.person.profession",)),  # Chef is not France
        QAExample(
            id="q4",
            question="what is dan's nationality via his profession",
            topic_entities=(TopicEntity("dan", "Dan"),),
            answers=(Answer("france", "France"),),
            split="train",
            gold_paths=(("people.person.profession", "^people.person.profession", "people.person.nationality"),),
        ),
    ]
    examples[2] = QAExample(**{**examples[2].__dict__, "id": "q3"})
    records, skipped = generate_records(generator, examples, None)
    assert [r.id for r in records] == ["q1"]
    # q4: Dan -> Chef -> (Bob shown only after Ann, top_k=1, no repeats allowed)
    assert skipped == Counter({"no_gold_path": 1, "gold_path_misses_answers": 1, "gold_not_shown:max_repeats": 1})


def test_the_relation_filter_pages_when_the_page_cut_the_gold_entity(tiny_kg, templates_file):
    generator = tiny_generator(tiny_kg, templates_file, "tool.top_k=1", "max_repeats=2", "tool.entity_handles=true")
    example = QAExample(
        id="q4",
        question="what is the nationality of someone with dan's profession",
        topic_entities=(TopicEntity("dan", "Dan"),),
        answers=(Answer("france", "France"),),
        split="train",
        gold_paths=(("people.person.profession", "^people.person.profession", "people.person.nationality"),),
    )
    record = generator.make(example, correction=False)
    # Chef's first page shows Ann (no nationality) and lists one more profession line: the filter shows Bob.
    assert record.completion == (
        "<think> I need the person profession of E1. <search>E1</search>\n<triples>\n"
        "(E1 Dan, people.person.profession, E2 Chef)\n</triples>\n"
        "Here E1 has person profession E2. Next I need what has person profession E2. <search>E2</search>\n<triples>\n"
        "(E3 Ann, people.person.profession, E2 Chef)\nmore: people.person.profession (1)\n</triples>\n"
        "Again E2 for what has person profession E2. <search>E2 | people.person.profession</search>\n<triples>\n"
        "(E4 Bob, people.person.profession, E2 Chef)\n</triples>\n"
        "Here E4 has person profession E2. Next I need the person nationality of E4. <search>E4</search>\n<triples>\n"
        "(E4 Bob, people.person.nationality, E5 France)\nmore: people.marriage.spouse (2)\n</triples>\n"
        "Here E4 has person nationality E5. The answer is E5. </think>\n<answer>E5</answer>"
    )
    assert generator.stats["repeated_searches"] == 1
    assert replay_tool_blocks(record, generator.tool) == [s.text for s in record.segments if not s.train]


def test_answer_mode_all_lists_every_shown_gold_answer(templates_file):
    kg = MemoryKG(["a", "a", "a"], ["r", "r", "s"], ["x", "y", "z"], names={"a": "A", "x": "X", "y": "Y", "z": "Z"})
    example = QAExample(
        id="q",
        question="what r does a have",
        topic_entities=(TopicEntity("a", "A"),),
        answers=(Answer("y", "Y"), Answer("x", "X")),
        gold_paths=(("r",),),
        hops=1,
        split="train",
    )
    first = tiny_generator(kg, templates_file).make(example, correction=False)
    every = tiny_generator(kg, templates_file, "answer_mode=all").make(example, correction=False)
    assert first.completion.endswith("<answer>X</answer>")
    assert every.completion.endswith("The answer is X | Y. </think>\n<answer>X | Y</answer>")


# --- templates, teacher, CLI -------------------------------------------------------------------------
def test_template_files_are_checked(tmp_path):
    bad_group = tmp_path / "g.yaml"
    bad_group.write_text("opening: ['x']\n")
    with pytest.raises(ConfigError, match=r"g\.yaml: unknown template group 'opening'"):
        load_templates(bad_group)
    bad_slot = tmp_path / "s.yaml"
    bad_slot.write_text("final: ['The answer is {answr}.']\n")
    with pytest.raises(ConfigError, match=r"template final\[0\] .*bad slot 'answr'"):
        load_templates(bad_slot)
    tags = tmp_path / "t.yaml"
    tags.write_text("final: ['<answer>{answer}</answer>']\n")
    with pytest.raises(ConfigError, match="contains a protocol tag"):
        load_templates(tags)
    good = tmp_path / "ok.yaml"
    good.write_text("final: ['Answer: {answer}.']\n")
    loaded = load_templates(good)
    assert loaded["final"] == ("Answer: {answer}.",) and loaded["start"] == DEFAULT_TEMPLATES["start"]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_unreachable_teacher_falls_back_to_templates_and_is_counted(synthetic, tmp_path):
    plain = run(make_config(synthetic, tmp_path / "plain.jsonl", "num_examples=10", "dev_examples=0"))
    taught = run(
        make_config(
            synthetic,
            tmp_path / "taught.jsonl",
            "num_examples=10",
            "dev_examples=0",
            "teacher.enabled=true",
            f"teacher.base_url=http://127.0.0.1:{closed_port()}/v1",
            "teacher.model=m",
            "teacher.max_consecutive_failures=3",
        )
    )
    assert (tmp_path / "plain.jsonl").read_bytes() == (tmp_path / "taught.jsonl").read_bytes()
    thoughts = sum(sum(s.train for s in r.segments) for r in read_warmup(tmp_path / "taught.jsonl"))
    teacher = taught["teacher"]
    assert teacher["calls"] == 3 and teacher["used"] == 0
    assert teacher["fallbacks"] == thoughts
    assert teacher["failures"]["endpoint:EndpointUnavailable"] == 3 and teacher["failures"]["gave_up"] == thoughts - 3
    assert plain["records"] == taught["records"] == 10


def test_teacher_writes_the_thinking_and_replies_with_tags_are_rejected(tiny_kg, templates_file, openai_server):
    said = ["  I think\nabout it.  "]  # what the teacher endpoint says to every request
    teacher = openai_server(lambda request: (200, {"choices": [{"message": {"content": said[0]}}]}))
    generator = tiny_generator(
        tiny_kg, templates_file, "teacher.enabled=true", f"teacher.base_url={teacher.base_url}", "teacher.model=m"
    )
    generator.teacher = Teacher(generator.config.teacher)
    record = generator.make(spouse_question(), correction=False)
    assert [s.text for s in record.segments if s.train] == [
        "<think> I think about it. <search>Ann</search>",
        "I think about it. <search>Bob</search>",
        "I think about it. </think>\n<answer>France</answer>",
    ]
    prompt = teacher.bodies[-1]["messages"][0]["content"]
    assert "The next thought must convey: Here Bob has person nationality France. The answer is France." in prompt
    assert "The assistant's next action is: answer France" in prompt
    said[0] = "<search>Bob</search>"
    record = generator.make(spouse_question(), correction=False)
    assert (
        record.segments[0].text == "<think> I need the person spouse s / marriage spouse of Ann. <search>Ann</search>"
    )
    assert generator.teacher.stats() == {"calls": 6, "used": 3, "fallbacks": 3, "failures": {"has_tags": 3}}


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="correction_share must be in"):
        load_config(WarmupConfig, None, ["dataset=d", "output=o", "correction_share=1.5"])
    with pytest.raises(ConfigError, match="num_examples must be a non-negative integer, `all` or null, got 'some'"):
        load_config(WarmupConfig, None, ["dataset=d", "output=o", "num_examples=some"])
    with pytest.raises(ConfigError, match="teacher.enabled needs teacher.base_url"):
        load_config(WarmupConfig, None, ["dataset=d", "output=o", "teacher.enabled=true"])
    assert load_config(WarmupConfig, None, ["dataset=d", "output=o.jsonl", "num_examples=all"]).num_examples is None
    assert load_config(WarmupConfig, None, ["dataset=d", "output=a/o.jsonl"]).summary_path == Path("a/o.summary.json")


def test_command_line_and_subcommand(synthetic, tmp_path, capsys):
    out = tmp_path / "cli.jsonl"
    assert (
        main(
            [
                "--config",
                "configs/tiny-cpu/warmup.yaml",
                "--set",
                f"dataset={synthetic}",
                "--set",
                f"output={out}",
                "--set",
                "num_examples=5",
                "--set",
                "dev_examples=2",
                "--set",
                "progress=false",
            ]
        )
        == 0
    )
    assert len(read_warmup(out)) == 7 and (tmp_path / "cli.summary.json").is_file()
    assert f"wrote {out}" in capsys.readouterr().out
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["warmup", "--config", "configs/warmup.yaml", "--set", "dataset=/nowhere"])
    assert args.func is not None
    assert main(["--set", "dataset=/nowhere", "--set", f"output={out}"]) == 1
    assert "'/nowhere' is neither a known dataset" in capsys.readouterr().err


def test_python_dash_m_runs_the_package_command_line(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "data_gen.warmup",
            "--set",
            "dataset=/nowhere",
            "--set",
            f"output={tmp_path / 'o.jsonl'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("warmup: error: ") and "'/nowhere' is neither a known dataset" in done.stderr


def test_pathquestion_trajectories_reach_gold_answers(tmp_path):
    try:
        dataset = load_dataset("PQ-2H", split_scheme="random", seed=0)
    except FileNotFoundError as err:
        pytest.skip(f"PathQuestion is not installed (looked in $KGREASONER_DATA and ../shared/data): {err}")
    kg = open_dataset_kg(dataset)
    config = make_config("PQ-2H", tmp_path / "pq.jsonl", "tool.entity_handles=true")
    tool = KGSearchTool(kg, config.tool)
    generator = WarmupGenerator(kg, tool, config)
    records, skipped = generate_records(generator, dataset.split("train"), 50)
    assert len(records) == 50 and not skipped
    assert 10 <= sum(r.kind == "correction" for r in records) <= 20
    examples = {e.id: e for e in dataset.examples}
    for record in records:
        assert check_format(record.completion).valid
        assert replay_tool_blocks(record, tool) == [s.text for s in record.segments if not s.train]
        session = tool.session(record.question, list(record.topic_entities))
        parsed = parse_trajectory(record.completion)
        for search in parsed.searches:
            session.call(search.raw)
        assert normalize_answer(session.resolve_answer(parsed.answer_text)[0]) in gold_forms(examples[record.id])


def test_shuffled_blocks_keep_the_triples_and_renumber_handles_in_order(synthetic, tmp_path):
    records = {}
    for shuffle in ("false", "true"):
        run(
            make_config(
                synthetic,
                tmp_path / f"{shuffle}.jsonl",
                "num_examples=40",
                "dev_examples=0",
                "tool.entity_handles=true",
                f"shuffle_triples={shuffle}",
            )
        )
        records[shuffle] = read_warmup(tmp_path / f"{shuffle}.jsonl")
    assert [r.id for r in records["false"]] == [r.id for r in records["true"]]
    changed = 0
    for plain, shuffled in zip(records["false"], records["true"]):
        assert check_format(shuffled.completion).valid and shuffled.kind == plain.kind
        topics = len(shuffled.topic_entities)  # E1.. keep their numbers; a second topic may appear late
        first_seen = [h for h in dict.fromkeys(HANDLE_TOKEN.findall(shuffled.completion)) if int(h[1:]) > topics]
        assert first_seen == [f"E{i}" for i in range(topics + 1, topics + len(first_seen) + 1)]
        assert len(plain.segments) == len(shuffled.segments)
        for a, b in zip(plain.segments, shuffled.segments):
            assert a.train == b.train
            if a.train:  # the same text up to handle numbers
                assert HANDLE_TOKEN.sub("E#", a.text) == HANDLE_TOKEN.sub("E#", b.text)
            else:  # the same triples, maybe in another order
                assert sorted(HANDLE_TOKEN.sub("E#", a.text).split("\n")) == sorted(
                    HANDLE_TOKEN.sub("E#", b.text).split("\n")
                )
        answers = [parse_trajectory(r.completion).first_answer for r in (plain, shuffled)]
        assert (
            dict(LABELLED.findall(plain.completion))[answers[0]]
            == dict(LABELLED.findall(shuffled.completion))[answers[1]]
        )
        changed += plain.completion != shuffled.completion
    assert changed > len(records["true"]) / 2


def test_random_handle_numbers_copy_each_training_record_with_its_own_numbers(synthetic, tmp_path):
    run(
        make_config(
            synthetic, tmp_path / "plain.jsonl", "num_examples=30", "dev_examples=5", "tool.entity_handles=true"
        )
    )
    run(
        make_config(
            synthetic,
            tmp_path / "random.jsonl",
            "num_examples=30",
            "dev_examples=5",
            "tool.entity_handles=true",
            "handle_numbers=random",
            "copies=3",
            "handle_pool=64",
        )
    )
    plain, numbered = read_warmup(tmp_path / "plain.jsonl"), read_warmup(tmp_path / "random.jsonl")
    train = [r for r in plain if r.split == "train"]
    assert [r.id for r in numbered] == [r.id for r in train for _ in range(3)] + [
        r.id for r in plain if r.split == "dev"
    ]
    assert [r.completion for r in numbered if r.split == "dev"] == [r.completion for r in plain if r.split == "dev"]
    for index, record in enumerate(train):
        copies = numbered[3 * index : 3 * index + 3]
        assert len({c.completion for c in copies}) == 3  # each copy numbers its handles anew
        for copy in copies:
            assert check_format(copy.completion).valid and copy.kind == record.kind
            numbers = [int(t[1:]) for t in HANDLE_TOKEN.findall(copy.completion)]
            assert max(numbers) <= 64
            assert HANDLE_TOKEN.findall(copy.segments[0].text)[0] == "E1"  # the topic entity keeps its handle
            # one consistent mapping: the same text up to handle numbers, the same labels behind the answer
            assert HANDLE_TOKEN.sub("E#", copy.completion) == HANDLE_TOKEN.sub("E#", record.completion)
            pairs = set(zip(HANDLE_TOKEN.findall(record.completion), HANDLE_TOKEN.findall(copy.completion)))
            assert len(pairs) == len({a for a, _ in pairs}) == len({b for _, b in pairs})
            answers = [parse_trajectory(r.completion).first_answer for r in (record, copy)]
            assert (
                dict(LABELLED.findall(record.completion))[answers[0]]
                == dict(LABELLED.findall(copy.completion))[answers[1]]
            )


def test_random_handle_numbers_skip_a_record_the_pool_cannot_number(synthetic, tmp_path):
    summary = run(
        make_config(
            synthetic,
            tmp_path / "w.jsonl",
            "num_examples=10",
            "dev_examples=0",
            "tool.entity_handles=true",
            "handle_numbers=random",
            "handle_pool=2",
        )
    )
    assert summary["records"] == 0 and summary["skipped"]["train"]["handle_pool_too_small"] > 0


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["copies=2"], "copies > 1 repeats identical records unless handle_numbers is `random`"),
        (["handle_numbers=shuffled"], "handle_numbers must be one of ('appearance', 'random')"),
        (["handle_numbers=random", "copies=0"], "copies and handle_pool must be >= 1"),
    ],
)
def test_handle_number_settings_are_checked(overrides, message, tmp_path):
    with pytest.raises(ValueError, match=re.escape(message)):
        make_config("PQ-2H", tmp_path / "w.jsonl", *overrides)


def test_summary_reports_mean_tokens_with_a_tokenizer(synthetic, tmp_path):
    from kgreasoner.tokenizer import TokenizerConfig, read_training_texts, train_tokenizer

    tokenizer = train_tokenizer(
        read_training_texts([synthetic / "questions.jsonl", synthetic / "names.tsv"]), TokenizerConfig(num_handles=64)
    )
    tokenizer.save_pretrained(tmp_path / "tok")
    summary = run(
        make_config(
            synthetic,
            tmp_path / "t.jsonl",
            "num_examples=8",
            "dev_examples=0",
            "tool.entity_handles=true",
            f"tokenizer={tmp_path / 'tok'}",
        )
    )
    records = read_warmup(tmp_path / "t.jsonl")
    counts = [[len(tokenizer(s.text, add_special_tokens=False)["input_ids"]) for s in r.segments] for r in records]
    assert summary["mean_completion_tokens"] == round(sum(map(sum, counts)) / 8, 1)
    trained = sum(n for r, c in zip(records, counts) for s, n in zip(r.segments, c) if s.train)
    assert summary["mean_trained_tokens"] == round(trained / 8, 1) < summary["mean_completion_tokens"]


def test_templates_that_name_no_relation_before_the_triples(tiny_kg, tmp_path):
    copy = dict(ONE_TEMPLATE, start="I search {entity}.", fact="{fact}.", next="Next I search {entity}.")
    path = tmp_path / "copy.yaml"
    path.write_text(json.dumps({group: [text] for group, text in copy.items()}), encoding="utf-8")
    generator = tiny_generator(tiny_kg, path, "tool.entity_handles=true")
    thoughts = [s.text for s in generator.make(spouse_question(), correction=False).segments if s.train]
    assert thoughts == [
        "<think> I search E1. <search>E1</search>",
        "E1 has person spouse s / marriage spouse E3. Next I search E3. <search>E3</search>",
        "E3 has person nationality E5. The answer is E5. </think>\n<answer>E5</answer>",
    ]


def test_plan_and_hop_slots_write_relation_ids_as_the_triples_print_them(tiny_kg, tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        json.dumps(
            {
                "start": ["Path: {plan}. I search {entity}."],
                "fact": ["{hop}."],
                "next": ["Next I search {entity}."],
                "final": ["So the answer is {answer}."],
            }
        )
    )
    record = tiny_generator(tiny_kg, plan, "tool.entity_handles=true").make(spouse_question(), correction=False)
    thoughts = [s.text.split("</triples>\n")[-1].split("<search>")[0] for s in record.segments if s.train]
    assert thoughts == [
        "<think> Path: people.person.spouse_s , people.marriage.spouse , people.person.nationality. I search E1. ",
        "E1 people.person.spouse_s people.marriage.spouse E3. Next I search E3. ",
        "E3 people.person.nationality E5. So the answer is E5. </think>\n<answer>E5</answer>",
    ]


def test_plan_and_hop_slots_write_the_last_word_of_relations_printed_as_words(tiny_kg, tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        json.dumps(
            {
                "start": ["Path: {plan}. I search {entity}."],
                "fact": ["{hop}."],
                "next": ["Next I search {entity}."],
                "final": ["So the answer is {answer}."],
            }
        )
    )
    generator = tiny_generator(tiny_kg, plan, "tool.entity_handles=true", "tool.relation_format=words")
    record = generator.make(spouse_question(), correction=False)
    thoughts = [s.text.split("</triples>\n")[-1].split("<search>")[0] for s in record.segments if s.train]
    assert thoughts == [
        "<think> Path: spouse_s , spouse , nationality. I search E1. ",
        "E1 spouse_s spouse E3. Next I search E3. ",
        "E3 nationality E5. So the answer is E5. </think>\n<answer>E5</answer>",
    ]
    blocks = [s.text for s in record.segments if not s.train]
    assert "(E1 Ann, people person spouse_s, E2 m1)" in blocks[0] and "people.person" not in "".join(blocks)


def test_line_slot_repeats_the_followed_triple_line_as_the_tool_printed_it(tiny_kg, tmp_path):
    lines = tmp_path / "line.yaml"
    lines.write_text(
        json.dumps(
            {
                "start": ["I search {entity}."],
                "fact": ["{line}."],
                "next": ["Next I search {entity}."],
                "final": ["So the answer is {answer}."],
            }
        )
    )
    generator = tiny_generator(tiny_kg, lines, "tool.entity_handles=true")
    record = generator.make(spouse_question(), correction=False)
    thoughts = [s.text.split("</triples>\n")[-1].split("<search>")[0] for s in record.segments if s.train]
    assert thoughts == [
        "<think> I search E1. ",
        "E1 people.person.spouse_s people.marriage.spouse E3. Next I search E3. ",  # through a mediator: as `hop`
        "(E3 Bob, people.person.nationality, E5 France). So the answer is E5. </think>\n<answer>E5</answer>",
    ]
    assert "(E3 Bob, people.person.nationality, E5 France)\n" in "".join(
        s.text for s in record.segments if not s.train
    )
    backwards = QAExample(
        id="q2",
        question="who is from france",
        topic_entities=(TopicEntity("france", "France"),),
        answers=(Answer("bob", "Bob"),),
        gold_paths=(("^people.person.nationality",),),
        hops=1,
        split="train",
    )
    record = tiny_generator(tiny_kg, lines, "tool.entity_handles=true", "tool.relation_format=words").make(
        backwards, correction=False
    )
    assert [s.text for s in record.segments if s.train][-1].startswith(
        "(E2 Bob, people person nationality, E1 France). So"
    )


def test_first_shown_pick_searches_a_dead_end_sibling_and_backtracks(tmp_path):
    # "born here" questions about a village in two regions: the first one shown has nobody born there
    kg = MemoryKG(
        *zip(
            *[
                ("vil", "containedby", "india"),
                ("vil", "containedby", "kerala"),
                ("kerala", "people_born_here", "ravi"),
                ("india", "capital", "delhi"),
            ]
        )
    )
    example = QAExample(
        id="q1",
        question="what is the people_born_here of vil 's containedby",
        split="train",
        topic_entities=(TopicEntity("vil", "vil"),),
        answers=(Answer("ravi", "ravi"),),
        gold_paths=(("containedby", "people_born_here"),),
        hops=2,
        extra={"path_entities": ["kerala"]},
    )
    plan = tmp_path / "plan.yaml"
    plan.write_text((Path(__file__).parents[2] / "configs/tiny-cpu/templates-plan.yaml").read_text())
    witness = tiny_generator(kg, plan, "tool.entity_handles=true").make(example, correction=False)
    assert "backtrack" not in witness.completion and "E1 containedby E3." in witness.completion
    generator = tiny_generator(kg, plan, "tool.entity_handles=true", "pick=first_shown")
    first = generator.make(example, correction=False)
    assert generator.stats["first_shown_dead_ends"] == 1
    thoughts = [s.text.split("</triples>\n")[-1] for s in first.segments if s.train]
    assert thoughts == [
        "<think> Path: containedby , people_born_here. I search E1. <search>E1</search>",
        "E1 containedby E2. Next I search E2. <search>E2</search>",
        "E2 has no people_born_here. I go back. <search>E2 | backtrack</search>",
        "Back at E1: E1 containedby E3. Next I search E3. <search>E3</search>",
        "E3 people_born_here E5. So the answer is E5. </think>\n<answer>E5</answer>",
    ]
    assert first.kind == "gold"
    with pytest.raises(ValueError, match="pick must be one of"):
        make_config("unused", Path("unused.jsonl"), "pick=random")


def test_lookup_drills_follow_each_training_record_and_leave_trajectories_unchanged(synthetic, tmp_path):
    plain = run(
        make_config(
            synthetic, tmp_path / "plain.jsonl", "num_examples=20", "dev_examples=5", "tool.entity_handles=true"
        )
    )
    drilled = run(
        make_config(
            synthetic,
            tmp_path / "drill.jsonl",
            "num_examples=20",
            "dev_examples=5",
            "tool.entity_handles=true",
            "lookup_drills=2",
        )
    )
    records = read_warmup(tmp_path / "drill.jsonl")
    trajectories = [r for r in records if r.kind != "drill"]
    assert [r.to_dict() for r in trajectories] == [r.to_dict() for r in read_warmup(tmp_path / "plain.jsonl")]
    drills = [r for r in records if r.kind == "drill"]
    assert drills and {r.split for r in drills} == {"train"}
    assert drilled["by_kind"]["drill"] == len(drills) and drilled["correction_share"] == plain["correction_share"]
    by_id = {r.id: r for r in trajectories}
    for drill in drills:
        source = by_id[drill.id.split("#drill")[0]]
        block = int(drill.id.split("#drill")[1])
        assert [s.text for s in drill.segments[: block + 1]] == [s.text for s in source.segments[: block + 1]]
        for segment in drill.segments[block + 1 :]:
            if segment.train:  # the tail of a line of that block
                assert any(line.endswith(", " + segment.text) for line in source.segments[block].text.split("\n"))
    with pytest.raises(ValueError, match="lookup_drills probe handles: it needs tool.entity_handles true"):
        make_config(synthetic, tmp_path / "x.jsonl", "lookup_drills=1", "tool.entity_handles=false")


def test_multi_topic_question_searches_each_topic_and_answers_what_both_showed(templates_file):
    triples = [(f"q{i}", "plays_for", "rovers") for i in range(4)]
    triples += [("p0", "citizen_of", "fr"), ("p1", "citizen_of", "fr"), ("q2", "citizen_of", "fr")]
    names = {
        "rovers": "Rovers",
        "fr": "Freedonia",
        "p0": "Pat",
        "p1": "Kim",
        **{f"q{i}": f"Rover {i}" for i in range(4)},
    }
    kg = MemoryKG(*zip(*triples), names=names)
    generator = tiny_generator(kg, templates_file, "tool.top_k=2", "tool.entity_handles=false")
    example = QAExample(
        id="j",
        question="which player of Rovers is from Freedonia",
        split="train",
        topic_entities=(TopicEntity("rovers", "Rovers"), TopicEntity("fr", "Freedonia")),
        answers=(Answer("q2", "Rover 2"),),
        gold_paths=(("^plays_for",), ("^citizen_of",)),
        hops=1,
        intersect=True,
    )
    record = generator.make(example, correction=False)
    # Each topic's first page misses Rover 2; each filtered page shows it; the answer is the one both showed.
    assert record.completion == (
        "<think> I need what has plays for Rovers. <search>Rovers</search>\n<triples>\n"
        "(Rover 0, plays_for, Rovers)\n(Rover 1, plays_for, Rovers)\nmore: plays_for (2)\n</triples>\n"
        "Again Rovers for what has plays for Rovers. <search>Rovers | plays_for</search>\n<triples>\n"
        "(Rover 2, plays_for, Rovers)\n(Rover 3, plays_for, Rovers)\n</triples>\n"
        "Here Rover 2 has plays for Rovers. Now the other topic, Freedonia: I need what has citizen of Freedonia. "
        "<search>Freedonia</search>\n<triples>\n(Pat, citizen_of, Freedonia)\n(Kim, citizen_of, Freedonia)\n"
        "more: citizen_of (1)\n</triples>\n"
        "Again Freedonia for what has citizen of Freedonia. <search>Freedonia | citizen_of</search>\n<triples>\n"
        "(Rover 2, citizen_of, Freedonia)\n</triples>\n"
        "Here Rover 2 has citizen of Freedonia. Rover 2 is in both results. The answer is Rover 2. </think>\n"
        "<answer>Rover 2</answer>"
    )
    assert generator.stats["repeated_searches"] == 2


def test_multi_topic_synthetic_questions_get_trajectories(generated):
    multi = [r for r in generated["records"] if len(r.topic_entities) == 2]
    assert multi, "the synthetic set's multi-topic questions yield records"
    for record in multi:
        searched = [s.query.split(" | ")[0] for s in parse_trajectory(record.completion).searches]
        handles = generated["config"].tool.entity_handles
        assert ("E2" if handles else record.topic_entities[1].name) in searched


def test_a_hub_s_relations_are_listed_until_the_gold_one_is_named(templates_file):
    triples = [("hub", f"rel_{r:02d}", f"n{r}_{i}") for r in range(30) for i in range(3)]
    triples += [("hub", "zz_gold", "mid"), ("mid", "leads_to", "end")]
    kg = MemoryKG(*zip(*triples), names={"hub": "Hub", "mid": "Mid", "end": "End"})
    generator = tiny_generator(
        kg, templates_file, "tool.top_k=2", "tool.max_chars=200", "tool.entity_handles=false", "max_repeats=4"
    )
    example = QAExample(
        id="h",
        question="what does the hub's gold lead to",
        split="train",
        topic_entities=(TopicEntity("hub", "Hub"),),
        answers=(Answer("end", "End"),),
        gold_paths=(("zz_gold", "leads_to"),),
        hops=2,
    )
    record = generator.make(example, correction=False)
    searches = [s.raw for s in parse_trajectory(record.completion).searches]
    assert searches == ["Hub", "Hub | relations", "Hub | relations", "Hub | zz_gold", "Mid"]
    blocks = [s.text for s in record.segments if not s.train]
    assert all(len(block) <= 200 + len("\n<triples>\n\n</triples>\n") for block in blocks)
    # The first listing and the next name 25 relations by count; the third names the rest, the gold one last.
    assert blocks[1] == (
        "\n<triples>\nmore: "
        + ", ".join(f"rel_{r:02d} (3)" for r in range(12, 26))
        + " and 17 more relations\n</triples>\n"
    )
    assert blocks[2] == (
        "\n<triples>\nmore: rel_26 (3), rel_27 (3), rel_28 (3), rel_29 (3), rel_00 (1), zz_gold (1) "
        "and 25 more relations\n</triples>\n"
    )
    assert "List Hub for the zz gold of Hub." in record.completion
    assert generator.stats["repeated_searches"] == 3
    few = tiny_generator(
        kg, templates_file, "tool.top_k=2", "tool.max_chars=200", "tool.entity_handles=false", "max_repeats=2"
    )
    with pytest.raises(Skip, match="gold_not_shown:max_repeats"):
        few.make(example, correction=False)
