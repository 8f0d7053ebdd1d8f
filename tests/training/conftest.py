"""A few hand-written warm-up trajectories and a warm policy for the training tests (the tiny untrained
model is the shared `tiny_checkpoint` of tests/conftest.py)."""

from __future__ import annotations

import pytest

from kgreasoner.models import TinyModelConfig, build_tiny
from kgreasoner.records.schema import TopicEntity
from kgreasoner.records.trajectories import Segment, WarmupRecord
from kgreasoner.tokenizer import TokenizerConfig

TRIPLES_UTAH = (
    "\n<triples>\n(E1 Utah, time_zone, E2 Mountain_Time_Zone)\n(E1 Utah, capital, E3 Salt_Lake_City)\n</triples>\n"
)
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
def warm_policy(tmp_path_factory):
    """A tiny model SFT-trained for 300 steps (~3 CPU minutes) on real warm-up trajectories of the synthetic set.

    Returns (model directory, dataset folder, tool config of the trajectories). Shared by the SFT-quality and GRPO
    tests: GRPO needs a policy that already writes the format, or every reward is 0 and nothing is learned.
    """
    from data_gen.synthetic import write_synthetic
    from data_gen.warmup import WarmupConfig, run
    from kgreasoner.retrieval.tool import ToolConfig
    from kgreasoner.tokenizer import read_training_texts
    from kgreasoner.training.sft import SFTRecipe, train_sft

    tool = ToolConfig(entity_handles=True, top_k=5)
    root = tmp_path_factory.mktemp("warm")
    data = write_synthetic(root / "data", seed=0, num_entities=300, num_questions=400)
    warmup = root / "warmup.jsonl"
    run(
        WarmupConfig(
            dataset=str(data), output=str(warmup), num_examples=None, dev_examples=0, tool=tool, progress=False
        )
    )
    config = TinyModelConfig(
        hidden_size=128,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=32,
        intermediate_size=256,
        max_position_embeddings=2048,
        tokenizer=TokenizerConfig(num_handles=32),
    )
    build_tiny(config, read_training_texts([data / "kb.tsv", warmup]), root / "tiny")
    final = train_sft(
        SFTRecipe(
            model=str(root / "tiny"),
            train_file=str(warmup),
            run_dir=str(root / "sft"),
            trainer={
                "learning_rate": 3e-3,
                "max_steps": 300,
                "per_device_train_batch_size": 8,
                "warmup_steps": 0.0,
                "eval_steps": 0,
                "save_steps": 300,
                "logging_steps": 20,
                "report_to": [],
            },
        )
    )
    return final, data, tool


@pytest.fixture(scope="session")
def warm_policy_records(warm_policy):
    """The warm-up records (`data_gen.warmup`'s JSONL) the warm policy was trained on."""
    return warm_policy[0].parents[1] / "warmup.jsonl"
