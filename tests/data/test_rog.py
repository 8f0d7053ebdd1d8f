"""RoG's per-question subgraph records, as JSONL (tests/data/fixtures) and as the published parquet."""

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kgreasoner.data import load_dataset
from kgreasoner.records.rog import load_rog, read_rog_file, rog_examples
from kgreasoner.records.schema import Answer, SchemaError, TopicEntity

FIXTURES = Path(__file__).parent / "fixtures"
# The columns and types of the published files (rmanluo/RoG-webqsp, data/*.parquet).
PUBLISHED = pa.schema(
    [
        ("id", pa.string()),
        ("question", pa.string()),
        ("answer", pa.list_(pa.string())),
        ("q_entity", pa.list_(pa.string())),
        ("a_entity", pa.list_(pa.string())),
        ("graph", pa.list_(pa.list_(pa.string()))),
        ("choices", pa.list_(pa.string())),
    ]
)


def records(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_parquet(rows: list[dict], path: Path, schema: pa.Schema = PUBLISHED) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path


def test_jsonl_records_become_examples():
    examples = load_rog(FIXTURES / "rog-webqsp" / "train.jsonl")
    assert [e.id for e in examples] == ["WebQTrn-0", "WebQTrn-1"]
    portman = examples[1]
    assert portman.question == "what character did natalie portman play in star wars"
    assert portman.topic_entities == (
        TopicEntity("Natalie Portman", "Natalie Portman"),
        TopicEntity("Star Wars", "Star Wars"),
    )
    assert portman.answers == (Answer("Padmé Amidala", "Padmé Amidala"),)
    assert (portman.gold_paths, portman.hops, portman.source, portman.split) == ((), 2, "RoG", "train")


def test_parquet_as_published(tmp_path):
    rows = records(FIXTURES / "rog-webqsp" / "train.jsonl")
    path = write_parquet(rows, tmp_path / "data" / "train-00000-of-00001.parquet")
    assert load_rog(path) == load_rog(FIXTURES / "rog-webqsp" / "train.jsonl")
    # Large string types (as other writers store them) read the same.
    large = pa.schema([(f.name, _large(f.type)) for f in PUBLISHED])
    write_parquet(rows, tmp_path / "large" / "train.parquet", large)
    assert load_rog(tmp_path / "large") == load_rog(path)


def _large(kind: pa.DataType) -> pa.DataType:
    if pa.types.is_list(kind):
        return pa.large_list(_large(kind.value_type))
    return pa.large_string()


def test_folder_names_the_split_of_each_file(tmp_path):
    dataset = load_dataset("rog-cwq", root=FIXTURES)
    assert dataset.name == "RoG-CWQ"
    assert dataset.kg_spec == f"subgraph:{(FIXTURES / 'rog-cwq').resolve()}"
    assert [(e.id[:10], e.split) for e in dataset] == [
        ("WebQTest-7", "test"),
        ("WebQTrn-0_", "train"),
        ("WebQTrn-2_", "dev"),
    ]
    assert [t.id for t in dataset.split("train")[0].topic_entities] == ["Justin Bieber", "Male"]
    # A JSONL file with RoG's fields is RoG's, not our schema; parquet is always RoG's.
    assert load_dataset(FIXTURES / "rog-webqsp" / "test.jsonl").kg_spec.startswith("subgraph:")
    parquet = write_parquet(records(FIXTURES / "rog-webqsp" / "test.jsonl"), tmp_path / "test-0.parquet")
    assert [e.id for e in load_dataset(parquet)] == ["WebQTest-0"]
    # A folder of RoG files (a clone of the published dataset) with no questions.jsonl is RoG's too.
    published = load_dataset(tmp_path)
    assert (published.name, published.kg_spec, [e.id for e in published]) == (
        tmp_path.name,
        f"subgraph:{tmp_path.resolve()}",
        ["WebQTest-0"],
    )


def _bad_jsonl(tmp_path: Path, change) -> Path:
    rows = records(FIXTURES / "rog-webqsp" / "train.jsonl")
    change(rows[1])
    path = tmp_path / "train.jsonl"
    path.write_text("\n" + "\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")  # line 1 is blank
    return path


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda r: r.pop("graph"), ":3: missing field 'graph'"),
        (
            lambda r: r.update(q_entity="Natalie Portman"),
            ":3: field 'q_entity' must be a list of strings, got \"Natalie Portman\"",
        ),
        (
            lambda r: r.update(graph=[["a", "b", 3]]),
            ':3: field \'graph\' must be a list of [head, relation, tail] string lists, got [["a", "b", 3]]',
        ),
        (
            lambda r: r["graph"].append(["Israel", "location.country.capital"]),
            ":3: field 'graph[5]' must be [head, relation, tail], three non-empty strings; got ['Israel', "
            "'location.country.capital']",
        ),
        (
            lambda r: r["graph"].insert(1, ["Israel", "", "Jerusalem"]),
            ":3: field 'graph[1]' must be [head, relation, tail], three non-empty strings; got ['Israel', '', "
            "'Jerusalem']",
        ),
        (lambda r: r.update(id="WebQTrn-0"), ":3: field 'id' repeats 'WebQTrn-0' (first at {path}:2)"),
        (lambda r: r.update(id=""), ":3: field 'id' is empty"),
    ],
)
def test_jsonl_errors_name_file_line_and_field(tmp_path, change, message):
    path = _bad_jsonl(tmp_path, change)
    with pytest.raises(SchemaError) as err:
        read_rog_file(path)
    assert str(err.value) == f"{path}{message.format(path=path)}"


@pytest.mark.parametrize(
    "change, message",
    [
        (
            lambda r: r["graph"].append(["Israel"]),
            ": row 1: field 'graph[5]' must be [head, relation, tail], three non-empty strings; got ['Israel']",
        ),
        (
            lambda r: r["graph"].insert(2, ["Israel", "r", None]),
            ": row 1: field 'graph[2]' must be [head, relation, tail], three non-empty strings; got ['Israel', 'r', "
            "None]",
        ),
        (lambda r: r.update(question=None), ": row 1: field 'question' is null"),
    ],
)
def test_parquet_errors_name_file_row_and_field(tmp_path, change, message):
    rows = records(FIXTURES / "rog-webqsp" / "train.jsonl")
    change(rows[1])
    path = write_parquet(rows, tmp_path / "train.parquet")
    with pytest.raises(SchemaError) as err:
        read_rog_file(path)
    assert str(err.value) == f"{path}{message}"


def test_parquet_column_missing_or_of_another_type(tmp_path):
    rows = records(FIXTURES / "rog-webqsp" / "train.jsonl")
    path = write_parquet(
        [{k: v for k, v in r.items() if k != "q_entity"} for r in rows],
        tmp_path / "train.parquet",
        pa.schema([f for f in PUBLISHED if f.name != "q_entity"]),
    )
    with pytest.raises(SchemaError) as err:
        read_rog_file(path)
    assert (
        str(err.value) == f"{path}: missing column 'q_entity' (a RoG file has id, question, answer, q_entity, graph)"
    )
    flat = pa.schema([("graph", pa.string()) if f.name == "graph" else f for f in PUBLISHED])
    path = write_parquet([{**r, "graph": json.dumps(r["graph"])} for r in rows], tmp_path / "test.parquet", flat)
    with pytest.raises(SchemaError) as err:
        read_rog_file(path)
    assert str(err.value) == f"{path}: column 'graph' has type string, expected list<item: list<item: string>>"


def test_empty_answer_or_topic_list(tmp_path):
    path = _bad_jsonl(tmp_path, lambda r: r.update(answer=[]))
    with pytest.raises(SchemaError) as err:
        rog_examples(read_rog_file(path))
    assert str(err.value) == f"{path}:3: field 'answer' is empty"


def test_folder_without_record_files(tmp_path):
    (tmp_path / "rog-cwq").mkdir()
    shutil.copy(FIXTURES / "webqsp-official" / "WebQSP.test.json", tmp_path / "rog-cwq")
    with pytest.raises(
        FileNotFoundError, match=r"rog-cwq: no .parquet or .jsonl RoG subgraph files under this folder$"
    ):
        load_dataset("rog-cwq", root=tmp_path)
