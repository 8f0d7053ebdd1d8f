"""The per-question subgraphs that RoG (Luo et al., "Reasoning on Graphs", ICLR 2024) published
for WebQSP and CWQ (Hugging Face datasets `rmanluo/RoG-webqsp` and `rmanluo/RoG-cwq`).

Each record is `{id, question, answer: [name, ...], q_entity: [name, ...], a_entity: [...],
graph: [[head, relation, tail], ...]}`, as parquet (the published `train-*.parquet`,
`validation-*.parquet`, `test-*.parquet`) or as JSONL with the same fields. Nodes are named by
their Freebase label, so a node's id is its name; nodes with no label keep their mid (`m.0abc`)
and are the mediator (CVT) nodes. The split of each record comes from its file's name.

`read_rog_file` checks every field once, with Arrow's vectorised kernels (the published CWQ
training graphs hold tens of millions of triples), and keeps the table in Arrow memory; the
QA examples come from `rog_examples` and the graphs are served by `kgreasoner.kg.subgraph`.
The records name no relation path, so each question's hop count is read off its own graph
(`kgreasoner.records.hops`): loading reads the graphs too.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kgreasoner.records.hops import subgraph_hops
from kgreasoner.records.schema import Answer, DuplicateKeyError, QAExample, SchemaError, TopicEntity, loads_json
from kgreasoner.records.webqsp_cwq import split_from_filename

ROG_SUFFIXES = (".parquet", ".jsonl")
# The fields read; the published files also have `a_entity` and `choices`, which nothing here needs
# (`answer` holds the gold names, which are the answer nodes' ids in the graph).
SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("question", pa.string()),
        ("answer", pa.list_(pa.string())),
        ("q_entity", pa.list_(pa.string())),
        ("graph", pa.list_(pa.list_(pa.string()))),
    ]
)
# A Freebase mid: what RoG left as the id of a node with no name.
_MID = re.compile(r"[mg]\.[0-9a-z_]+")


def is_mid(node: str) -> bool:
    """True for a node RoG could not name (a mediator, or an entity without an English label)."""
    return _MID.fullmatch(node) is not None


@dataclass
class RogFile:
    """One file's records as an Arrow table (the SCHEMA columns), with where each row came from."""

    path: Path
    split: str
    table: pa.Table
    lines: list[int] | None = None  # JSONL: the line of each row; parquet: None

    def where(self, row: int) -> str:
        """`FILE:LINE` (JSONL) or `FILE: row N` (parquet), for error messages."""
        return f"{self.path}:{self.lines[row]}" if self.lines is not None else f"{self.path}: row {row}"

    def __len__(self) -> int:
        return self.table.num_rows


def rog_files(path: str | Path) -> list[Path]:
    """The record files at `path`: the file itself, or every .parquet / .jsonl file under a folder."""
    path = Path(path).expanduser()
    if path.is_file():
        if path.suffix not in ROG_SUFFIXES:
            raise ValueError(f"{path}: a RoG subgraph file is .parquet or .jsonl")
        return [path]
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such RoG subgraph file or folder")
    files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in ROG_SUFFIXES)
    if not files:
        raise FileNotFoundError(f"{path}: no .parquet or .jsonl RoG subgraph files under this folder")
    return files


def is_rog_record(record: object) -> bool:
    """True for a parsed JSON object shaped like a RoG record (it has a `graph` and `q_entity`)."""
    return isinstance(record, dict) and "graph" in record and "q_entity" in record


def read_rog_file(path: str | Path, columns: list[str] | None = None) -> RogFile:
    """One file, checked (see the module docstring); `columns` reads only those (always with `id`).

    A missing or mistyped field raises SchemaError naming the file, the row (parquet) or line
    (JSONL), and the field.
    """
    path = Path(path)
    split = split_from_filename(path)
    names = list(dict.fromkeys(["id", *(columns or SCHEMA.names)]))
    if path.suffix == ".parquet":
        table, lines = _read_parquet(path, names), None
    else:
        table, lines = _read_jsonl(path, names)
    rog = RogFile(path, split, table, lines)
    _check_values(rog)
    return rog


def rog_examples(rog: RogFile) -> list[QAExample]:
    """The file's records as QA examples (topic entities from `q_entity`, answers from `answer`,
    `hops` from the record's graph: `kgreasoner.records.hops`); `rog` must be read with every column."""
    examples = []
    table = rog.table
    columns = {name: table.column(name).to_pylist() for name in ("id", "question", "answer", "q_entity")}
    hops = subgraph_hops(table.column("graph"), table.column("q_entity"), table.column("answer"))
    for row, (qid, question, answers, topics) in enumerate(zip(*columns.values())):
        if not question.strip():
            raise SchemaError(f"{rog.where(row)}: field 'question' is empty")
        if not topics:
            raise SchemaError(f"{rog.where(row)}: field 'q_entity' is empty")
        if not answers:
            raise SchemaError(f"{rog.where(row)}: field 'answer' is empty")
        examples.append(
            QAExample(
                id=qid,
                question=question.strip(),
                topic_entities=tuple(TopicEntity(id=t, name=t) for t in dict.fromkeys(topics)),
                answers=tuple(Answer(id=a, name=a) for a in dict.fromkeys(answers)),
                hops=hops[row],
                source="RoG",
                split=rog.split,
            )
        )
    return examples


def load_rog(path: str | Path, split: str | None = None) -> list[QAExample]:
    """The QA examples of every RoG file at `path` (a file or a folder), in file order; with `split`,
    only the files of that split are read (a file's graphs take seconds to read and search)."""
    examples = []
    for file in rog_files(path):
        if split is None or split_from_filename(file) == split:
            examples.extend(rog_examples(read_rog_file(file)))
    return examples


def _read_parquet(path: Path, names: list[str]) -> pa.Table:
    present = set(pq.read_schema(path).names)
    missing = [n for n in names if n not in present]
    if missing:
        raise SchemaError(f"{path}: missing column '{missing[0]}' (a RoG file has {', '.join(SCHEMA.names)})")
    table = pq.read_table(path, columns=names)
    return pa.table({name: _cast(table.column(name), name, path) for name in names})


def _cast(column: pa.ChunkedArray, name: str, path: Path) -> pa.ChunkedArray:
    """The column as SCHEMA types it (large_string and the like cast); another type raises SchemaError."""
    wanted = SCHEMA.field(name).type
    try:
        return column.cast(wanted)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as err:
        raise SchemaError(f"{path}: column '{name}' has type {column.type}, expected {wanted}") from err


def _read_jsonl(path: Path, names: list[str]) -> tuple[pa.Table, list[int]]:
    rows: list[dict] = []
    lines: list[int] = []
    with open(path, encoding="utf-8") as handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = loads_json(text)
            except json.JSONDecodeError as err:
                raise SchemaError(f"{where}: not valid JSON ({err.msg})") from err
            except DuplicateKeyError as err:
                raise SchemaError(f"{where}: {err}") from None
            if not isinstance(record, dict):
                raise SchemaError(f"{where}: expected a JSON object, got {type(record).__name__}")
            for name in names:
                _check_json_field(record, name, where)
            rows.append({name: record[name] for name in names})
            lines.append(number)
    schema = pa.schema([SCHEMA.field(name) for name in names])
    return pa.Table.from_pylist(rows, schema=schema), lines


def _check_json_field(record: dict, name: str, where: str) -> None:
    if name not in record:
        raise SchemaError(f"{where}: missing field '{name}'")
    value = record[name]
    if name in ("id", "question"):
        ok = isinstance(value, str)
        expected = "a string"
    elif name == "graph":
        ok = isinstance(value, list) and all(isinstance(t, list) and all(isinstance(x, str) for x in t) for t in value)
        expected = "a list of [head, relation, tail] string lists"
    else:
        ok = isinstance(value, list) and all(isinstance(x, str) for x in value)
        expected = "a list of strings"
    if not ok:
        raise SchemaError(f"{where}: field '{name}' must be {expected}, got {json.dumps(value)[:80]}")


def _check_values(rog: RogFile) -> None:
    """No null or empty id, no duplicate id, and (when read) every triple three non-empty strings."""
    table = rog.table
    for name in table.column_names:
        column = table.column(name)
        if column.null_count:
            raise SchemaError(f"{rog.where(_first(pc.is_null(column)))}: field '{name}' is null")
    ids = table.column("id")
    empty = pc.equal(pc.utf8_length(ids), 0)
    if pc.any(empty).as_py():
        raise SchemaError(f"{rog.where(_first(empty))}: field 'id' is empty")
    if pc.count_distinct(ids).as_py() != len(ids):
        seen: dict[str, int] = {}
        for row, qid in enumerate(ids.to_pylist()):
            if qid in seen:
                raise SchemaError(f"{rog.where(row)}: field 'id' repeats {qid!r} (first at {rog.where(seen[qid])})")
            seen[qid] = row
    if "graph" in table.column_names:
        _check_triples(rog)


def _check_triples(rog: RogFile) -> None:
    graph = rog.table.column("graph").combine_chunks()
    triples = graph.flatten()
    values = triples.flatten()
    bad = pc.or_kleene(pc.not_equal(pc.list_value_length(triples), 3), pc.is_null(triples))
    bad_values = pc.or_kleene(pc.is_null(values), pc.equal(pc.utf8_length(values), 0))
    if pc.any(bad_values).as_py():
        owner = pc.list_parent_indices(triples).to_numpy()[_first(bad_values)]
        bad = pc.or_kleene(bad, pc.equal(pa.array(range(len(triples))), int(owner)))
    if not pc.any(bad).as_py():
        return
    index = _first(bad)
    row = int(pc.list_parent_indices(graph).to_numpy()[index])
    position = index - graph.offsets[row].as_py()
    raise SchemaError(
        f"{rog.where(row)}: field 'graph[{position}]' must be [head, relation, tail], "
        f"three non-empty strings; got {triples[index].as_py()!r}"
    )


def _first(mask: pa.Array | pa.ChunkedArray) -> int:
    """Index of the first true value of a boolean array."""
    found = pc.index(mask, True).as_py()
    assert found >= 0, "called only when some value is true"
    return found
