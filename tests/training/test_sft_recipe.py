"""SFTRecipe's `trainer` mapping, and the order that lets ZeRO-3 partition the model as it loads."""

from pathlib import Path

import pytest

from kgreasoner.config import ConfigError, load_config
from kgreasoner.training.sft import SFTRecipe

ZERO3 = Path(__file__).resolve().parents[2] / "configs" / "deepspeed" / "zero3.json"


def _recipe(tmp_path, **fields):
    base = {"model": "m", "train_file": "t.jsonl", "run_dir": str(tmp_path / "out")}
    return SFTRecipe(**{**base, **fields})


def test_trainer_must_be_a_mapping():
    with pytest.raises(ConfigError, match="trainer must be a mapping of SFTConfig field names"):
        load_config(SFTRecipe, None, ["model=m", "train_file=t", "run_dir=o", "trainer=[1]"])


def test_the_zero3_config_is_live_when_the_model_loads(tiny_checkpoint, records, tmp_path, monkeypatch):
    """`from_pretrained` partitions the weights as it loads (`zero.Init`) only when a ZeRO-3
    TrainingArguments already exists: the SFTConfig must be built before the model is loaded."""
    from transformers import AutoModelForCausalLM
    from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled

    from kgreasoner.records.trajectories import write_warmup
    from kgreasoner.training.sft import train_sft

    seen = []

    class Loaded(Exception):
        pass

    def spy(*args, **kwargs):
        seen.append(is_deepspeed_zero3_enabled())
        raise Loaded

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    path = write_warmup(records, tmp_path / "w.jsonl")
    with pytest.raises(Loaded):
        train_sft(
            _recipe(tmp_path, model=str(tiny_checkpoint), train_file=str(path), trainer={"deepspeed": str(ZERO3)})
        )
    assert seen == [True]
