from dataclasses import dataclass, field

import pytest

from kgreasoner.config import ConfigError, load_config


@dataclass
class Inner:
    rate: float = field(default=0.1, metadata={"help": "a rate"})


@dataclass
class Recipe:
    name: str = field(default="tiny", metadata={"help": "run name"})
    steps: int = field(default=10, metadata={"help": "steps"})
    lr: float = field(default=1e-3, metadata={"help": "learning rate"})
    tags: list = field(default_factory=list, metadata={"help": "tags"})
    inner: Inner = field(default_factory=Inner, metadata={"help": "nested"})

    def __post_init__(self):
        if self.steps <= 0:
            raise ValueError("steps must be > 0")


def test_yaml_and_overrides(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("name: run\nsteps: 5\nlr: 1\ninner:\n  rate: 2\n")
    cfg = load_config(Recipe, path, ["steps=7", "inner.rate=0.5", "tags=[a, b]"])
    assert cfg == Recipe(name="run", steps=7, lr=1.0, tags=["a", "b"], inner=Inner(rate=0.5))
    assert isinstance(cfg.lr, float)
    # YAML 1.1 reads an exponent without a dot as a string.
    assert load_config(Recipe, None, ["lr=2e-3"]).lr == 0.002


def test_unknown_key_names_file_and_key(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("stepz: 5\n")
    with pytest.raises(ConfigError, match=r"r\.yaml: unknown key\(s\) \['stepz'\] for Recipe"):
        load_config(Recipe, path)


def test_wrong_type_and_validation(tmp_path):
    with pytest.raises(ConfigError, match="defaults: steps: expected int, got 'many'"):
        load_config(Recipe, None, ["steps=many"])
    with pytest.raises(ConfigError, match="defaults: lr: expected float, got 'fast'"):
        load_config(Recipe, None, ["lr=fast"])
    with pytest.raises(ConfigError, match="steps must be > 0"):
        load_config(Recipe, None, ["steps=0"])
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(Recipe, tmp_path / "missing.yaml")
