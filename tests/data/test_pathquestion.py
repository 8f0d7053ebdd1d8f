"""PathQuestion line parsing, and the key check: every gold path reproduces its answer set."""

import pytest

from kgreasoner.kg.base import execute_path
from kgreasoner.kg.memory import MemoryKG
from kgreasoner.records.pathquestion import (
    PATHQUESTION_FILES,
    load_pathquestion,
    parse_pathquestion_line,
    read_pathquestion,
)
from kgreasoner.records.schema import SchemaError

PQ_LINE = (
    "which nationality is frederica_of_mecklenburg-strelitz 's couple ?\tunited_kingdom(united_kingdom/)\t"
    "frederica_of_mecklenburg-strelitz#spouse#ernest_augustus_i_of_hanover#nationality#united_kingdom"
    "#<end>#united_kingdom\n"
)
# PQL: leading space, no <end>, several answers, names with parentheses, primary listed second.
PQL_LINE = (
    " what is the recordings of Hard_Times 's tracks ?\tHard_Times(Hard_Times_(live)/Hard_Times/)\t"
    "Hard_Times#__music__recording__tracks#Hard_Times#__music__composition__recordings#Hard_Times\n"
)


def test_pq_line_with_end_marker():
    example = parse_pathquestion_line(PQ_LINE, "PQ-2H", 123, "PQ-2H.txt")
    assert example.id == "PQ-2H-000123"
    assert example.question == "which nationality is frederica_of_mecklenburg-strelitz 's couple ?"
    assert [(t.id, t.name) for t in example.topic_entities] == [("frederica_of_mecklenburg-strelitz",) * 2]
    assert [(a.id, a.name) for a in example.answers] == [("united_kingdom", "united_kingdom")]
    assert example.gold_paths == (("spouse", "nationality"),)
    assert example.hops == 2 and example.source == "PQ-2H" and example.split == ""
    assert example.extra["path_entities"] == [
        "frederica_of_mecklenburg-strelitz",
        "ernest_augustus_i_of_hanover",
        "united_kingdom",
    ]


def test_pql_line_leading_space_and_multiple_answers():
    example = parse_pathquestion_line(PQL_LINE, "PQL-2H", 7)
    assert example.question.startswith("what is the recordings")
    assert example.topic_entities[0].id == "Hard_Times"
    assert [a.id for a in example.answers] == ["Hard_Times", "Hard_Times_(live)"]  # primary first
    assert example.gold_paths == (("__music__recording__tracks", "__music__composition__recordings"),)
    assert example.hops == 2


def test_three_hop_answer_with_parentheses():
    line = (
        " what is the rating of tracks of Earthquake 's tracks ?\tPG_(USA)(PG_(USA)/)\t"
        "Earthquake#__music__recording__tracks#Earthquake#__music__recording__tracks#Earthquake"
        "#__film__film__rating#PG_(USA)"
    )
    example = parse_pathquestion_line(line, "PQL-3H", 1)
    assert [a.id for a in example.answers] == ["PG_(USA)"]
    assert example.hops == 3 and example.gold_paths[0][-1] == "__film__film__rating"


@pytest.mark.parametrize(
    "line, message",
    [
        ("q ?\tx(x/)", "expected 3 tab-separated columns (question, answer, path), got 2"),
        (" \tx(x/)\ta#r#x", "column 'question' is empty"),
        ("q ?\tx(x/)\ta#r#b#x", "column 'path' must be 'topic#relation#entity#...#answer'"),
        ("q ?\tx(x/)\ta##x", "column 'path' must be"),
        ("q ?\tx\ta#r#x", "column 'answer' must be 'answer(answer1/answer2/.../)'"),
        ("q ?\tx(y/)\ta#r#x", "column 'answer' must be"),
        ("q ?\tx(x/)\ta#r#z#<end>#z", "column 'path' ends at 'z', which is not in the answer set ['x']"),
    ],
)
def test_malformed_line_names_file_line_and_column(line, message):
    with pytest.raises(SchemaError) as err:
        parse_pathquestion_line(line, "PQ-2H", 42, "data/PQ-2H.txt")
    assert str(err.value).startswith("data/PQ-2H.txt:42: ")
    assert message in str(err.value)


def test_read_file_numbers_ids_by_line_and_reports_the_bad_line(tmp_path):
    path = tmp_path / "PQ-2H.txt"
    path.write_text(PQ_LINE + "\n" + PQ_LINE, encoding="utf-8")
    assert [e.id for e in read_pathquestion(path, "PQ-2H")] == ["PQ-2H-000001", "PQ-2H-000003"]
    path.write_text(PQ_LINE + "broken line\n", encoding="utf-8")
    with pytest.raises(SchemaError, match=rf"^{path}:2: expected 3 tab-separated columns"):
        read_pathquestion(path, "PQ-2H")


def test_load_from_explicit_folder_and_unknown_set(tmp_path):
    (tmp_path / "PQ-2H.txt").write_text(PQ_LINE, encoding="utf-8")
    (tmp_path / "2H-kb.txt").write_text(
        "frederica_of_mecklenburg-strelitz\tspouse\ternest_augustus_i_of_hanover\n"
        "ernest_augustus_i_of_hanover\tnationality\tunited_kingdom\n",
        encoding="utf-8",
    )
    examples, kb_path = load_pathquestion("pq-2h", tmp_path)
    assert kb_path == tmp_path / "2H-kb.txt" and [e.source for e in examples] == ["PQ-2H"]
    with pytest.raises(FileNotFoundError, match=r"missing 3H-kb.txt \(needed by PQ-3H\)"):
        (tmp_path / "PQ-3H.txt").write_text(PQ_LINE, encoding="utf-8")
        load_pathquestion("PQ-3H", tmp_path)
    with pytest.raises(ValueError, match="unknown PathQuestion set 'PQ-4H'"):
        load_pathquestion("PQ-4H", tmp_path)


# set -> (questions, KB triples), as /work/shared/data/README.md states them.
SIZES = {
    "PQ-2H": (1908, 1211),
    "PQ-3H": (5198, 2839),
    "PQL-2H": (1594, 4247),
    "PQL-3H": (1031, 5597),
    "PQL-3H_more": (2062, 5597),
}


@pytest.mark.pathquestion
@pytest.mark.parametrize("name", list(PATHQUESTION_FILES))
def test_gold_paths_reproduce_answer_sets(pathquestion_dir, name):
    """THE key check of data and KG agreeing: walking each gold path from the topic entity on the
    set's own KB gives exactly the answer set (exact ids; measured 100% on every set)."""
    examples, kb_path = load_pathquestion(name, pathquestion_dir)
    kg = MemoryKG.from_file(kb_path)
    assert (len(examples), kg.num_triples) == SIZES[name]
    hops = 2 if "2H" in name else 3
    assert all(e.hops == hops and len(e.gold_paths) == 1 for e in examples)
    reproduced = broken_chains = 0
    for example in examples:
        reached = execute_path(kg, example.topic_entities[0].id, example.gold_paths[0])
        reproduced += reached == {a.id for a in example.answers}
        chain = example.extra["path_entities"]
        broken_chains += any(
            chain[i + 1] not in {edge.object for edge in kg.neighbors(chain[i], "out", relations=[rel])}
            for i, rel in enumerate(example.gold_paths[0])
        )
    share = reproduced / len(examples)
    print(f"{name}: gold path reproduces the answer set for {reproduced}/{len(examples)} = {share:.2%}")
    assert share == 1.0
    assert broken_chains == 0
