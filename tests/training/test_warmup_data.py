import json

import pytest

from kgreasoner.models import load_model_and_tokenizer
from kgreasoner.protocol import build_prompt
from kgreasoner.records.schema import SchemaError
from kgreasoner.records.trajectories import read_warmup, write_warmup
from kgreasoner.training.warmup_data import encode_record


def test_mask_covers_exactly_the_model_written_spans(tiny_checkpoint, records, utah_triples):
    _, tokenizer = load_model_and_tokenizer(tiny_checkpoint)
    record = records[0]
    encoded = encode_record(record, tokenizer)
    ids, mask = encoded["input_ids"], encoded["assistant_masks"]
    assert len(ids) == len(mask)
    prompt = build_prompt(record.question, list(record.topic_entities), tokenizer)
    prompt_len = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    assert mask[:prompt_len] == [0] * prompt_len
    trained = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    masked_completion = tokenizer.decode([i for i, m in zip(ids[prompt_len:], mask[prompt_len:]) if not m])
    assert trained == record.segments[0].text + record.segments[2].text + "<|im_end|>"
    assert masked_completion == utah_triples
    assert tokenizer.decode(ids) == prompt + record.completion + "<|im_end|>"
    assert ids[-1] == tokenizer.convert_tokens_to_ids("<|im_end|>") and mask[-1] == 1


def test_round_trip_and_bad_lines(tmp_path, records):
    path = write_warmup(records, tmp_path / "w.jsonl")
    assert read_warmup(path) == records
    lines = path.read_text().splitlines()
    broken = json.loads(lines[1])
    del broken["segments"]
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n" + json.dumps(broken) + "\n")
    with pytest.raises(SchemaError, match=r"bad.jsonl:2: missing field 'segments'"):
        read_warmup(tmp_path / "bad.jsonl")
    untrained = json.loads(lines[0])
    for segment in untrained["segments"]:
        segment["train"] = False
    (tmp_path / "untrained.jsonl").write_text(json.dumps(untrained) + "\n")
    with pytest.raises(SchemaError, match=r"untrained.jsonl:1: field 'segments' has no trained span"):
        read_warmup(tmp_path / "untrained.jsonl")
