"""Warm-up trajectories as the SFT trainer reads them, and their tokenisation with a loss mask.

One record per JSONL line (written by `data_gen/warmup.py`):
`{"id", "question", "topic_entities": [{"id", "name"}], "segments": [{"text", "train"}], "kind",
"hops", "split"}`. The segments concatenated are the completion; `train` is true for what the
model writes and false for what the tool inserts (`<triples>` blocks).

Each segment is tokenised alone, exactly as the rollout engine appends tool text and as the model
emits its own spans, so the SFT sequences match what the model meets at rollout time.

Pipeline-step records (`data_gen/pipeline_sft.py`: one LLM step of ToG or SoG) carry an optional
raw `prompt`, used instead of the protocol prompt built from the question: it is rendered as one
user turn exactly as `HFClient` renders it at evaluation (`evaluation.llm.encode_prompt`), and the
reply (the segments) ends with the tokenizer's eos token, trained, where the client's generation
stops. Records without `prompt` are written and encoded as before.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from kgreasoner.data.schema import SchemaError, TopicEntity, iter_json_lines
from kgreasoner.evaluation.llm import encode_prompt
from kgreasoner.protocol import build_prompt

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
    def from_dict(cls, data: dict, where: str = "record") -> "WarmupRecord":
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


def write_warmup(records, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record.to_dict(), ensure_ascii=False) + "\n")
    return path


def encode_record(record: WarmupRecord, tokenizer) -> dict[str, list[int]]:
    """`input_ids` of prompt + completion and `assistant_masks` (1 on model-written tokens)."""
    if record.prompt is None:
        prompt = build_prompt(record.question, list(record.topic_entities), tokenizer)
        input_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    else:
        input_ids = encode_prompt(record.prompt, tokenizer)
    mask = [0] * len(input_ids)
    for segment in record.segments:
        ids = tokenizer(segment.text, add_special_tokens=False)["input_ids"]
        input_ids.extend(ids)
        mask.extend([int(segment.train)] * len(ids))
    if record.prompt is not None:
        if tokenizer.eos_token_id is None:
            raise ValueError(f"record {record.id}: a pipeline-step record needs a tokenizer with an eos token")
        input_ids.append(tokenizer.eos_token_id)
        mask.append(1)
    return {"input_ids": input_ids, "assistant_masks": mask}
