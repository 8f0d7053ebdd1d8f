"""Constrained decoding pieces that need no model: shown lines, config checks."""

from __future__ import annotations

import pytest

from kgreasoner.rollout import RolloutConfig
from kgreasoner.rollout.constraints import quoted_lines


def test_quoted_lines_are_the_triple_lines_without_parentheses():
    blocks = ["(E1 Utah, capital, E2 Salt Lake City)\n(E3 Colorado, time_zone, E4 Mountain Time Zone)",
              'Unknown entity "E9": it is not a topic entity or an entity shown so far.',
              "(E2 Salt Lake City, mayor, E5 Erin)\n[2 more lines cut: tool output limit]\n()"]
    assert quoted_lines(blocks) == ["E1 Utah, capital, E2 Salt Lake City", "E3 Colorado, time_zone, E4 Mountain Time Zone",
                                    "E2 Salt Lake City, mayor, E5 Erin"]


def test_constrained_quotes_need_constrained_decoding():
    with pytest.raises(ValueError, match="constrained_quotes needs constrained_decoding: true"):
        RolloutConfig(constrained_quotes=True)
    assert RolloutConfig(constrained_decoding=True, constrained_quotes=True).constrained_quotes
