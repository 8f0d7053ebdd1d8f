"""Small hand-built graphs for the retrieval tests."""

from __future__ import annotations

import pytest

from kgreasoner.kg.memory import MemoryKG


@pytest.fixture
def path_kg() -> MemoryKG:
    """The paper's backtracking example: topic 1, explored path 1 -> 2 -> 4 -> 5, with alternatives."""
    return MemoryKG.from_triples(
        [
            ("1", "a", "2"),
            ("1", "b", "3"),
            ("2", "c", "4"),
            ("2", "d", "6"),
            ("4", "e", "5"),
            ("4", "f", "7"),
            ("5", "g", "8"),
        ]
    )


@pytest.fixture
def utah_kg() -> MemoryKG:
    """Named entities, a literal, a namesake and a mediator node (m.cvt has no name)."""
    triples = [
        ("m.utah", "location.location.time_zones", "m.mtz"),
        ("m.utah", "location.us_state.capital", "m.slc"),
        ("m.utah", "location.location.contains", "m.provo"),
        ("m.slc", "location.location.containedby", "m.utah"),
        ("m.utah", "government.governmental_jurisdiction.governing_officials", "m.cvt"),
        ("m.cvt", "government.government_position_held.office_holder", "m.cox"),
        ("m.cvt", "government.government_position_held.from", '"2021-01-04"'),
        ("m.provo2", "location.location.containedby", "m.texas"),
        ("m.mtz", "common.topic.alias", '"MST"'),
    ]
    names = {
        "m.utah": "Utah",
        "m.mtz": "Mountain Time Zone",
        "m.slc": "Salt Lake City",
        "m.provo": "Provo",
        "m.provo2": "Provo",
        "m.texas": "Texas",
        "m.cox": "Spencer Cox",
    }
    return MemoryKG.from_triples(triples, names)
