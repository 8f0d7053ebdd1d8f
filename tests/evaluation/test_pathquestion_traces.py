"""bench/pathquestion_traces.py counts exact plans and copied triple lines in hand-made evaluation traces."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kgreasoner.records.schema import Answer, QAExample, TopicEntity, write_jsonl

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "pathquestion_traces.py"
PATH = ("__people__person__spouse", "__people__person__place_of_birth")


def example(qid: str, topic: str) -> QAExample:
    return QAExample(
        id=qid,
        question=f"where was {topic} 's spouse born ?",
        topic_entities=(TopicEntity(topic, topic),),
        answers=(Answer("Paris", "Paris"),),
        gold_paths=(PATH,),
        hops=2,
        split="test",
    )


# an exact plan, both lines copied with their handles and labels; the answer is right
RIGHT = (
    "<think> Path: spouse , place_of_birth. I search E1. <search>E1</search>\n<triples>\n"
    "(E1 Ada, people person spouse, E2 Bob)\n(E1 Ada, people person nationality, E3 Utopia)\n</triples>\n"
    "(E1 Ada, people person spouse, E2 Bob). Next I search E2. <search>E2</search>\n<triples>\n"
    "(E2 Bob, people person place_of_birth, E4 Paris, Texas)\n</triples>\n"
    "(E2 Bob, people person place_of_birth, E4 Paris, Texas). So the answer is E4. </think>\n<answer>E4</answer>"
)
# an exact plan, then the tail handle of another relation's line; a line whose head was never shown is not counted
WRONG_TAIL = (
    "<think> Path: spouse , place_of_birth. I search E1. <search>E1</search>\n<triples>\n"
    "(E1 Cy, people person spouse, E2 Dee)\n(E1 Cy, people person parents, E3 Fay)\n</triples>\n"
    "(E1 Cy, people person spouse, E3 Fay). (E9 Zed, people person spouse, E2 Dee). "
    "So the answer is E3. </think>\n<answer>E3</answer>"
)
# a wrong plan; the right tail handle with another entity's label
WRONG_PLAN = (
    "<think> Path: nationality. I search E1. <search>E1</search>\n<triples>\n"
    "(E1 Eve, people person nationality, E2 Utopia)\n</triples>\n"
    "(E1 Eve, people person nationality, E2 Atlantis). So the answer is E2. </think>\n<answer>E2</answer>"
)


def make_evaluation(tmp_path: Path) -> Path:
    questions = tmp_path / "questions.jsonl"
    write_jsonl([example("q1", "Ada"), example("q2", "Cy"), example("q3", "Eve")], questions)
    folder = tmp_path / "eval-off"
    folder.mkdir()
    (folder / "run.json").write_text(
        json.dumps({"dataset": str(questions), "split": "test", "split_scheme": "given", "seed": None})
    )
    records = [
        {"id": qid, "hits1": hits, "trace": {"text": text}}
        for qid, hits, text in (("q1", 1.0, RIGHT), ("q2", 0.0, WRONG_TAIL), ("q3", 0.0, WRONG_PLAN))
    ]
    (folder / "kgreasoner.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return folder


def run(*folders: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, folders)], capture_output=True, text=True, timeout=60, cwd=ROOT
    )


@pytest.mark.slow
def test_plans_and_written_lines_are_counted(tmp_path):
    folder = make_evaluation(tmp_path)
    done = run(folder)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "| evaluation | questions | Hits@1 | plan exact | wrong after an exact plan | written lines "
        "| tail right | label right |"
    )
    assert lines[2:] == [f"| {folder} | 3 | 0.333 | 2 | 1 | 4 | 3 (0.750) | 2 |"]


@pytest.mark.slow
def test_a_malformed_record_is_named_by_file_and_line(tmp_path):
    folder = make_evaluation(tmp_path)
    with open(folder / "kgreasoner.jsonl", "a") as records:
        records.write('{"id": "q1"}\n')
    done = run(folder)
    assert done.returncode == 1
    assert f"{folder / 'kgreasoner.jsonl'}:4: not an evaluation record ('hits1')" in done.stderr


@pytest.mark.slow
def test_a_question_outside_the_split_is_named(tmp_path):
    folder = make_evaluation(tmp_path)
    with open(folder / "kgreasoner.jsonl", "a") as records:
        records.write(json.dumps({"id": "q9", "hits1": 0.0}) + "\n")
    done = run(folder)
    assert done.returncode == 1
    assert f"{folder / 'kgreasoner.jsonl'}:4: question 'q9' is not in " in done.stderr
