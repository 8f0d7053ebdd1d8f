"""A tiny real model and a few hand-written warm-up trajectories for the training tests."""

from __future__ import annotations

import pytest

from kgreasoner.data.schema import TopicEntity
from kgreasoner.models import TinyModelConfig, build_tiny
from kgreasoner.tokenizer import TokenizerConfig
from kgreasoner.training.warmup_data import Segment, WarmupRecord

TRIPLES_UTAH = "\n<triples>\n(E1 Utah, time_zone, E2 Mountain_Time_Zone)\n(E1 Utah, capital, E3 Salt_Lake_City)\n</triples>\n"
TRIPLES_FRANCE = "\n<triples>\n(E1 France, capital, E2 Paris)\n(E1 France, currency, E3 Euro)\n</triples>\n"


def make_records() -> list[WarmupRecord]:
    utah = WarmupRecord(
        id="q1",
        question="what time zone is utah in",
        topic_entities=(TopicEntity("Utah", "Utah"),),
        segments=(
            Segment("<think> I need the time zone of Utah. <search>E1</search>", True),
            Segment(TRIPLES_UTAH, False),
            Segment("Utah is in E2. </think>\n<answer>E2</answer>", True),
        ),
        hops=1,
    )
    france = WarmupRecord(
        id="q2",
        question="what is the capital of france",
        topic_entities=(TopicEntity("France", "France"),),
        segments=(
            Segment("<think> I need the capital of France. <search>E1</search>", True),
            Segment(TRIPLES_FRANCE, False),
            Segment("The capital is E2. </think>\n<answer>E2</answer>", True),
        ),
        hops=2,
    )
    return [utah, france]


@pytest.fixture
def records() -> list[WarmupRecord]:
    return make_records()


@pytest.fixture
def utah_triples() -> str:
    return TRIPLES_UTAH


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory):
    texts = []
    for record in make_records():
        texts.append(record.question)
        texts.extend(s.text for s in record.segments)
    config = TinyModelConfig(
        hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32, intermediate_size=128,
        max_position_embeddings=1024, tokenizer=TokenizerConfig(num_handles=8),
    )
    out = tmp_path_factory.mktemp("tiny")
    build_tiny(config, texts, out)
    return out
