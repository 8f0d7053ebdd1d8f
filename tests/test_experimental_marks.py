"""Research scaffolding says so where a user meets it: in the field help `--help` prints and in the script's help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from data_gen.augment import AugmentConfig
from data_gen.warmup.config import WarmupConfig
from kgreasoner.config import describe
from kgreasoner.rollout.types import RolloutConfig

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("config", "name"),
    [
        (WarmupConfig, "lookup_drills"),
        (AugmentConfig, "name_dropout"),
        (RolloutConfig, "constrained_quotes"),
    ],
)
def test_experimental_settings_say_so_in_their_help(config, name):
    [row] = [line for line in describe(config).splitlines() if line.startswith(f"  {name} = ")]
    assert row.split(": ", 1)[1].startswith("[experimental] ")


def test_the_trace_counter_says_it_is_experimental():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "pathquestion_traces.py"), "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    assert "[experimental] How the grid's models carry out their plans" in done.stdout
