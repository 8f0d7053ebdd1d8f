"""The synthetic dataset (small) and its KG, shared by the baseline tests."""

from __future__ import annotations

import pytest

from data_gen.synthetic import write_synthetic
from kgreasoner.data import load_dataset, open_dataset_kg


@pytest.fixture(scope="session")
def synthetic_data(tmp_path_factory):
    # Single-topic questions only: the pipeline baselines' gold LLMs follow one path (the oracle's multi-topic
    # walks are tested on their own KB).
    folder = write_synthetic(tmp_path_factory.mktemp("baselines_synthetic"), seed=0, num_entities=150, num_questions=60,
                             multi_topic_share=0.0)
    dataset = load_dataset(folder)
    return dataset, open_dataset_kg(dataset)
