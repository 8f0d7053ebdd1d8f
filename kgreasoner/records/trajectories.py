"""Warm-up trajectories on disk: one SFT record per JSONL line, the format `data_gen` writes and SFT reads.

`{"id", "question", "topic_entities": [{"id", "name"}], "segments": [{"text", "train"}], "kind",
"hops", "split"}` and an optional raw `prompt` (pipeline-step records). The segments concatenated
are the completion; `train` is true for what the model writes and false for what the tool inserts
(`<triples>` blocks). Reading checks every field and names the file and line of a bad one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kgreasoner.records.schema import SchemaError, TopicEntity, iter_json_lines, write_jsonl

KINDS = ("gold", "correction", "drill")  # drill: data_gen/lookup_drill.py


@dataclass(frozen=True)
class Segment:
    text: str
    train: bool


@dataclass(frozen=True)
class WarmupRecord:
    """One SFT trajectory: the question and the completion split into trained / masked spans."""

    id: str
    question: str
    topic_entities: tuple[TopicEntity, ...]
    segments: tuple[Segment, ...]
    kind: str = "gold"
    hops: int = 0
    split: str = "train"
    prompt: str | None = None

    @property
    def completion(self) -> str:
        return "".join(s.text for s in self.segments)

    def to_dict(self) -> dict:
        return {
            "id": self.id,
            "question": self.question,
            "topic_entities": [{"id": t.id, "name": t.name} for t in self.topic_entities],
            "segments": [{"text": s.text, "train": s.train} for s in self.segments],
            "kind": self.kind,
            "hops": self.hops,
            "split": self.split,
            **({"prompt": self.prompt} if self.prompt is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: dict, where: str = "record") -> WarmupRecord:
        try:
            segments = tuple(Segment(str(s["text"]), bool(s["train"])) for s in data["segments"])
            topics = tuple(TopicEntity(str(t["id"]), str(t["name"])) for t in data["topic_entities"])
            record = cls(
                id=str(data["id"]),
                question=str(data["question"]),
                topic_entities=topics,
                segments=segments,
                kind=str(data.get("kind", "gold")),
                hops=int(data.get("hops", 0)),
                split=str(data.get("split", "train")),
                prompt=None if data.get("prompt") is None else str(data["prompt"]),
            )
        except KeyError as err:
            raise SchemaError(f"{where}: missing field {err.args[0]!r}") from err
        except (TypeError, ValueError) as err:
            raise SchemaError(f"{where}: {err}") from err
        if record.kind not in KINDS:
            raise SchemaError(f"{where}: field 'kind' must be one of {KINDS}, got {record.kind!r}")
        if not any(s.train for s in segments):
            raise SchemaError(f"{where}: field 'segments' has no trained span")
        return record


def read_warmup(path: str | Path) -> list[WarmupRecord]:
    return list(iter_warmup(path))


def iter_warmup(path: str | Path) -> Iterator[WarmupRecord]:
    for where, data in iter_json_lines(path):
        yield WarmupRecord.from_dict(data, where)


def write_warmup(records: Iterable[WarmupRecord], path: str | Path) -> Path:
    write_jsonl(records, path)
    return Path(path)
