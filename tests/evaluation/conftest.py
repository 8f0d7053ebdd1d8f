"""A small synthetic dataset and a tiny untrained HF checkpoint, built once per session."""

from __future__ import annotations

import dataclasses

import pytest

from data_gen.synthetic import write_synthetic
from kgreasoner.data import load_dataset
from kgreasoner.models import TinyModelConfig, build_tiny
from kgreasoner.tokenizer import TokenizerConfig, read_training_texts


@pytest.fixture(scope="session")
def synthetic_dir(tmp_path_factory):
    return write_synthetic(tmp_path_factory.mktemp("eval_synthetic"), seed=0, num_entities=150, num_questions=60)


@pytest.fixture(scope="session")
def synthetic(synthetic_dir):
    return load_dataset(synthetic_dir)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory, synthetic_dir):
    """An untrained tiny Qwen3 (word-level tokenizer over the synthetic texts); it answers wrongly."""
    config = dataclasses.replace(
        TinyModelConfig(), hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32,
        intermediate_size=128, max_position_embeddings=2048, tokenizer=TokenizerConfig(num_handles=32))
    out = tmp_path_factory.mktemp("tiny_eval_model")
    texts = read_training_texts([synthetic_dir / "questions.jsonl", synthetic_dir / "names.tsv"])
    build_tiny(config, texts, out)
    return out
