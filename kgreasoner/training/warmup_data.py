"""Warm-up trajectories as the SFT trainer reads them, and their tokenisation with a loss mask.

One record per JSONL line (written by `data_gen.warmup`):
`{"id", "question", "topic_entities": [{"id", "name"}], "segments": [{"text", "train"}], "kind",
"hops", "split"}`. The segments concatenated are the completion; `train` is true for what the
model writes and false for what the tool inserts (`<triples>` blocks).

Each segment is tokenised alone, exactly as the rollout engine appends tool text and as the model
emits its own spans, so the SFT sequences match what the model meets at rollout time.

Every encoded record ends with the chat template's end-of-turn token (`<|im_end|>` for Qwen3,
`<|eot_id|>` for Llama 3.1; `end_of_turn_id`), trained: a model that never saw its turn end after
`</answer>` goes on writing there until a token limit.

Chat templates that open the think block in the prompt (`protocol.opened_think`: the prompt ends in
`<think>\n`) get the completion without its own leading `<think>`, as the model writes it there.

Pipeline-step records (`data_gen/pipeline_sft.py`: one LLM step of ToG or SoG) carry an optional
raw `prompt`, used instead of the protocol prompt built from the question: it is rendered as one
user turn exactly as `HFClient` renders it at evaluation (`llm.encode_prompt`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from kgreasoner.data.schema import SchemaError, TopicEntity, iter_json_lines
from kgreasoner.llm import encode_prompt
from kgreasoner.protocol import THINK_OPEN, build_prompt, opened_think

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


def end_of_turn_id(tokenizer) -> int:
    """The token the chat template writes right after an assistant message's content (Qwen3
    `<|im_end|>` 151645, Llama 3.1 `<|eot_id|>` 128009); the eos token without a template."""
    if getattr(tokenizer, "chat_template", None):
        marker = "\x00reply\x00"
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}], tokenize=False)
        after = rendered[rendered.rindex(marker) + len(marker):]
        ids = tokenizer(after, add_special_tokens=False)["input_ids"]
        if ids:
            return int(ids[0])
    if tokenizer.eos_token_id is None:
        raise ValueError(f"tokenizer {tokenizer.name_or_path!r} has no chat template that ends a turn and no eos "
                         "token: SFT records need an end-of-turn token")
    return int(tokenizer.eos_token_id)


def encode_record(record: WarmupRecord, tokenizer) -> dict[str, list[int]]:
    """`input_ids` of prompt + completion + end of turn, and `assistant_masks` (1 on model-written tokens:
    the trained segments and the end-of-turn token)."""
    if record.prompt is None:
        prompt = build_prompt(record.question, list(record.topic_entities), tokenizer)
        input_ids = list(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    else:
        prompt = None
        input_ids = encode_prompt(record.prompt, tokenizer)
    segments = list(record.segments)
    if prompt is not None and opened_think(prompt) and segments[0].text.startswith(THINK_OPEN):
        # the prompt wrote `<think>\n`; the model starts with what follows it
        segments[0] = Segment(segments[0].text[len(THINK_OPEN):].lstrip(), segments[0].train)
    mask = [0] * len(input_ids)
    for segment in segments:
        ids = tokenizer(segment.text, add_special_tokens=False)["input_ids"]
        input_ids.extend(ids)
        mask.extend([int(segment.train)] * len(ids))
    input_ids.append(end_of_turn_id(tokenizer))
    mask.append(1)
    return {"input_ids": input_ids, "assistant_masks": mask}
