"""The small synthetic dataset, loaded once per session (its folder and the tiny checkpoint are the
shared `synthetic_dir` and `tiny_checkpoint` of tests/conftest.py)."""

from __future__ import annotations

import pytest

from kgreasoner.data import load_dataset


@pytest.fixture(scope="session")
def synthetic(synthetic_dir):
    return load_dataset(synthetic_dir)
