"""Warm-up trajectories tokenised for SFT, with a loss mask.

The records are `kgreasoner.records.trajectories`' (written by `data_gen.warmup`): the segments
concatenated are the completion; `train` is true for what the model writes and false for what the
tool inserts (`<triples>` blocks).

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

from kgreasoner.llm import encode_prompt
from kgreasoner.protocol import THINK_OPEN, build_prompt, opened_think
from kgreasoner.records.trajectories import Segment, WarmupRecord


def end_of_turn_id(tokenizer) -> int:
    """The token the chat template writes right after an assistant message's content (Qwen3
    `<|im_end|>` 151645, Llama 3.1 `<|eot_id|>` 128009); the eos token without a template."""
    if getattr(tokenizer, "chat_template", None):
        marker = "\x00reply\x00"
        rendered = tokenizer.apply_chat_template(
            [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}], tokenize=False
        )
        after = rendered[rendered.rindex(marker) + len(marker) :]
        ids = tokenizer(after, add_special_tokens=False)["input_ids"]
        if ids:
            return int(ids[0])
    if tokenizer.eos_token_id is None:
        raise ValueError(
            f"tokenizer {tokenizer.name_or_path!r} has no chat template that ends a turn and no eos "
            "token: SFT records need an end-of-turn token"
        )
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
        segments[0] = Segment(segments[0].text[len(THINK_OPEN) :].lstrip(), segments[0].train)
    mask = [0] * len(input_ids)
    for segment in segments:
        ids = tokenizer(segment.text, add_special_tokens=False)["input_ids"]
        input_ids.extend(ids)
        mask.extend([int(segment.train)] * len(ids))
    input_ids.append(end_of_turn_id(tokenizer))
    mask.append(1)
    return {"input_ids": input_ids, "assistant_masks": mask}
