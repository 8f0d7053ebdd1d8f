"""Shared fixtures: the PathQuestion folder (tests that need it skip, saying why, without it)."""

import pytest

from kgreasoner.records.paths import find_data_dir


@pytest.fixture(scope="session")
def pathquestion_dir():
    try:
        return find_data_dir("pathquestion")
    except FileNotFoundError as err:
        pytest.skip(f"PathQuestion data not available: {err}")
