"""The QA example schema and its JSONL reading and writing.

One example per line:
`{"id", "question", "topic_entities": [{"id", "name"}], "answers": [{"id", "name", "aliases"}],
"gold_paths": [[relation, ...]], "hops", "source", "split"}`.
A relation in a gold path starting with `^` is walked backwards (object to subject).
Gold paths are alternatives, each walked from a topic entity, unless `"intersect": true` (written
only then): a multi-topic question whose `gold_paths[i]` is walked from `topic_entities[i]` and whose
answers are the entities every one of those walks reaches ("which player of club X is from country Y").
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

SPLITS = ("train", "dev", "test", "")


class SchemaError(ValueError):
    """A QA record does not follow the schema; the message names the file, line and field."""


class DuplicateKeyError(ValueError):
    """A JSON object names one key twice; `json.loads` would keep the last value without a word."""

    def __init__(self, key: str) -> None:
        self.key = key
        super().__init__(f"key {key!r} appears twice in one object (a JSON reader keeps only the last value)")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for key, value in pairs:
        if key in record:
            raise DuplicateKeyError(key)
        record[key] = value
    return record


def loads_json(text: str | bytes) -> Any:
    """`json.loads`, refusing an object that names a key twice (`DuplicateKeyError`)."""
    return json.loads(text, object_pairs_hook=_unique_keys)


def load_json(handle) -> Any:
    """`json.load` of an open file, refusing an object that names a key twice (`DuplicateKeyError`)."""
    return json.load(handle, object_pairs_hook=_unique_keys)


MAX_LINE_BYTES = 1 << 20
"""The longest line (1 MiB, without its newline) a questions, trajectories or KB file may hold. Real lines are
far shorter (a question with hundreds of answers: tens of KB); a longer one is refused before anything reads
it whole (a tokenizer trained on a 100 MB question grew the demo to 6 GB)."""


def line_size_message(size: int) -> str:
    """What is wrong with a line of `size` bytes over `MAX_LINE_BYTES` (the caller adds `path:line: `)."""
    return (
        f"a line of {size:,} bytes, over the limit of {MAX_LINE_BYTES:,} bytes per line; "
        "no question, trajectory or triple is that long: is the file broken?"
    )


@dataclass(frozen=True)
class TopicEntity:
    id: str
    name: str


@dataclass(frozen=True)
class Answer:
    id: str
    name: str
    aliases: tuple[str, ...] = ()

    def surface_forms(self) -> list[str]:
        """Name, aliases and id: every string that counts as this answer."""
        forms = [self.name, *self.aliases]
        if self.id and self.id not in forms:
            forms.append(self.id)
        return forms


@dataclass(frozen=True)
class QAExample:
    """A question with its topic entities, gold answers and (optionally) gold relation paths."""

    id: str
    question: str
    topic_entities: tuple[TopicEntity, ...]
    answers: tuple[Answer, ...]
    gold_paths: tuple[tuple[str, ...], ...] = ()
    hops: int = 0
    source: str = ""
    split: str = ""
    intersect: bool = False
    """Multi-topic: the answers are what every gold path reaches, path i walked from topic entity i."""
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.id:
            raise SchemaError("field 'id': must be a non-empty string")
        if not self.question.strip():
            raise SchemaError(f"example {self.id}: field 'question' is empty")
        if not self.topic_entities:
            raise SchemaError(f"example {self.id}: field 'topic_entities' is empty")
        if not self.answers:
            raise SchemaError(f"example {self.id}: field 'answers' is empty")
        if self.split not in SPLITS:
            raise SchemaError(f"example {self.id}: field 'split' must be one of train/dev/test, got {self.split!r}")
        if self.hops < 0:
            raise SchemaError(f"example {self.id}: field 'hops' must be >= 0")
        if self.intersect and len(self.topic_entities) < 2:
            raise SchemaError(f"example {self.id}: 'intersect' needs two or more topic entities")
        # paths may be missing (a source without them gets them from path search), but never a few
        if self.intersect and self.gold_paths and len(self.gold_paths) != len(self.topic_entities):
            raise SchemaError(f"example {self.id}: 'intersect' needs one gold path per topic entity, two or more")

    @property
    def answer_names(self) -> list[str]:
        return [a.name for a in self.answers]

    def with_split(self, split: str) -> QAExample:
        return QAExample(**{**self.__dict__, "split": split})

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        # asdict keeps tuples; lists make the dict what from_dict and JSON expect.
        data["topic_entities"] = list(data["topic_entities"])
        data["answers"] = list(data["answers"])
        data["gold_paths"] = [list(p) for p in self.gold_paths]
        for answer in data["answers"]:
            answer["aliases"] = list(answer["aliases"])
        if not data["extra"]:
            del data["extra"]
        if not self.intersect:
            del data["intersect"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> QAExample:
        """Build from a parsed JSON object; a missing or mistyped field raises SchemaError."""
        if not isinstance(data, dict):
            raise SchemaError(f"expected a JSON object, got {type(data).__name__}")
        for name, kind in (("id", (str, int)), ("question", str), ("topic_entities", list), ("answers", list)):
            if name not in data:
                raise SchemaError(f"missing field '{name}'")
            if not isinstance(data[name], kind):
                raise SchemaError(f"field '{name}' has type {type(data[name]).__name__}")
        topics = tuple(_topic(t, i) for i, t in enumerate(data["topic_entities"]))
        answers = tuple(_answer(a, i) for i, a in enumerate(data["answers"]))
        paths = data.get("gold_paths") or []
        if not isinstance(paths, list) or not all(
            isinstance(p, list) and all(isinstance(r, str) and r for r in p) for p in paths
        ):
            raise SchemaError("field 'gold_paths' must be a list of lists of relation strings")
        intersect = data.get("intersect", False)
        hops = data.get("hops")
        if hops is None:  # the shortest alternative; all of an intersect question's walks are taken
            hops = (max if intersect is True else min)((len(p) for p in paths), default=0)
        if isinstance(hops, bool) or not isinstance(hops, int):
            raise SchemaError(f"field 'hops' has type {type(hops).__name__}")
        if not hops_fit(hops, paths, intersect is True):
            lengths = sorted({len(p) for p in paths})
            counted = " (an intersect question counts its longest)" if intersect is True else ""
            raise SchemaError(
                f"field 'hops' is {hops}, but the gold paths have {', '.join(map(str, lengths))} "
                f"relation(s){counted}; correct hops or the paths"
            )
        split = data.get("split")
        if split is not None and not isinstance(split, str):  # `0` or `false` must not read as "no split"
            raise SchemaError(f"field 'split' must be a string (train, dev or test), got {json.dumps(split)}")
        if not isinstance(intersect, bool):
            raise SchemaError(f"field 'intersect' must be true or false, got {json.dumps(intersect)}")
        known = {"id", "question", "topic_entities", "answers", "gold_paths", "hops", "source", "split", "intersect"}
        return cls(
            id=str(data["id"]),
            question=data["question"],
            topic_entities=topics,
            answers=answers,
            gold_paths=tuple(tuple(p) for p in paths),
            hops=hops,
            source=str(data.get("source", "")),
            split=split or "",
            intersect=intersect,
            extra=_extra(data, known),
        )


def hops_fit(hops: int, paths: Sequence[Sequence[str]], intersect: bool) -> bool:
    """True when `hops` (0: unknown) is what the gold paths walk: one alternative's length, or for an
    intersect question the longest walk. Without paths any count stands."""
    if hops == 0 or not paths:
        return True
    return hops == max(map(len, paths)) if intersect else hops in {len(p) for p in paths}


def _extra(data: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """Unknown top-level fields; an `extra` object (as `to_dict` writes it) is merged, not nested."""
    extra = {k: v for k, v in data.items() if k not in known and k != "extra"}
    nested = data.get("extra")
    if isinstance(nested, dict):
        extra = {**nested, **extra}
    elif nested is not None:
        extra["extra"] = nested
    return extra


def _topic(value: Any, index: int) -> TopicEntity:
    if not isinstance(value, dict) or not isinstance(value.get("id"), str) or not value["id"]:
        raise SchemaError(f"field 'topic_entities[{index}]' needs a string 'id'")
    return TopicEntity(id=value["id"], name=str(value.get("name") or value["id"]))


def _answer(value: Any, index: int) -> Answer:
    if isinstance(value, str):
        return Answer(id=value, name=value)
    if not isinstance(value, dict) or not (value.get("name") or value.get("id")):
        raise SchemaError(f"field 'answers[{index}]' needs an 'id' or a 'name'")
    aliases = value.get("aliases") or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise SchemaError(f"field 'answers[{index}].aliases' must be a list of strings")
    name = str(value.get("name") or value["id"])
    return Answer(id=str(value.get("id") or name), name=name, aliases=tuple(aliases))


def read_jsonl(path: str | Path) -> list[QAExample]:
    """Read QA examples; a bad line, a repeated id or an empty file raises SchemaError naming the file (and line)."""
    examples: list[QAExample] = []
    first_line: dict[str, str] = {}
    for where, data in iter_json_lines(path):
        try:
            example = QAExample.from_dict(data)
        except SchemaError as err:
            raise SchemaError(f"{where}: {err}") from err
        if example.id in first_line:
            raise SchemaError(f"{where}: duplicate id {example.id!r} (first at {first_line[example.id]})")
        first_line[example.id] = where
        examples.append(example)
    if not examples:
        raise SchemaError(f"{path}: no examples (the file is empty)")
    return examples


def iter_json_lines(path: str | Path) -> Iterator[tuple[str, Any]]:
    """`(where, value)` per non-blank line of a JSONL file; `where` is `path:line` for error messages.

    A UTF-8 byte-order mark is skipped; bytes that are not UTF-8, invalid JSON, an object naming a key
    twice, JSON nested past Python's recursion limit and a line over `MAX_LINE_BYTES` raise SchemaError
    naming the line.
    """
    path = Path(path)
    with open(path, "rb") as handle:
        # at most one byte past the limit is read: a longer line is measured, not held
        for number, raw in enumerate(iter(lambda: handle.readline(MAX_LINE_BYTES + 1), b""), start=1):
            if len(raw.removesuffix(b"\n")) > MAX_LINE_BYTES:
                raise SchemaError(f"{path}:{number}: {line_size_message(_rest_of_line(handle, len(raw)))}")
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise SchemaError(
                    f"{path}:{number}: not UTF-8 (byte 0x{raw[err.start]:02x} at column {err.start + 1})"
                ) from None
            if not line.strip():
                continue
            try:
                value = loads_json(line)
            except json.JSONDecodeError as err:
                raise SchemaError(f"{path}:{number}: not valid JSON ({err.msg})") from err
            except DuplicateKeyError as err:
                raise SchemaError(f"{path}:{number}: {err}") from None
            except RecursionError:
                raise SchemaError(f"{path}:{number}: JSON nested too deeply") from None
            yield f"{path}:{number}", value


def _rest_of_line(handle, read: int) -> int:
    """The size of a line of which `read` bytes are read, reading on to its newline (not counted)."""
    while True:
        chunk = handle.readline(MAX_LINE_BYTES)
        read += len(chunk)
        if not chunk or chunk.endswith(b"\n"):
            return read - chunk.endswith(b"\n")


def iter_jsonl(path: str | Path) -> Iterator[QAExample]:
    for where, data in iter_json_lines(path):
        try:
            yield QAExample.from_dict(data)
        except SchemaError as err:
            raise SchemaError(f"{where}: {err}") from err


class JsonRecord(Protocol):
    """What `write_jsonl` writes: QA examples, warm-up records, the ranker's labelled groups."""

    def to_dict(self) -> dict[str, Any]: ...


def write_jsonl(records: Iterable[JsonRecord], path: str | Path) -> int:
    """Write records one per line (`to_dict()` as JSON, non-ASCII kept), making the folder; returns how
    many were written."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
            count += 1
    return count
