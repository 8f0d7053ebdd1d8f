"""The synthetic dataset (small), its KG and the gold-path teacher as an LLM, shared by the baseline tests."""

from __future__ import annotations

import pytest

from data_gen.synthetic import write_synthetic
from kgreasoner.baselines.gold_teacher import GoldTeacher
from kgreasoner.data import load_dataset, open_dataset_kg
from kgreasoner.kg.base import KnowledgeGraph
from kgreasoner.llm import ScriptedLLM
from kgreasoner.records.schema import QAExample


def gold_llm(kg: KnowledgeGraph, examples: list[QAExample], method: str, **options) -> ScriptedLLM:
    """A `ScriptedLLM` replying as the gold-path teacher to `method`'s prompts (`(no rule)` where it has none)."""
    script = GoldTeacher(kg, examples, **options)
    return ScriptedLLM([getattr(script, method)], default="(no rule)")


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory):
    # Single-topic questions only: the pipeline baselines' gold LLMs follow one path (the oracle's multi-topic
    # walks are tested on their own KB).
    folder = write_synthetic(
        tmp_path_factory.mktemp("baselines_synthetic"),
        seed=0,
        num_entities=150,
        num_questions=60,
        multi_topic_share=0.0,
    )
    dataset = load_dataset(folder)
    return dataset, open_dataset_kg(dataset)
