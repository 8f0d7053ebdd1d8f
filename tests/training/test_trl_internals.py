"""TRL's private parts are reached through one module, which refuses a TRL it was not tested with."""

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOOR = REPO / "kgreasoner" / "training" / "trl_internals.py"
PRIVATE = [
    re.compile(r"\btrl(\.\w+)*\._\w+"),  # trl.trainer.utils._use_triton, trl.x._NAME
    re.compile(r"^\s*from trl(\.\w+)* import .*\b_\w+", re.M),  # a private name imported from TRL
    re.compile(r"^\s*(from|import) trl\.(trainer\.utils|kernels|generation|trainer\.grpo_trainer)\b", re.M),
    re.compile(r"\btrainer\._(?!_)\w+"),  # trainer._metrics, self.trainer._log_metric, ...
    re.compile(r"\bvllm_generation\b"),
    re.compile(r"\bdef _(compute_loss|get_per_token_logps_and_entropies|generate_and_score_completions)\b"),
]


def test_the_installed_trl_is_in_the_tested_range():
    from kgreasoner.training.trl_internals import TESTED_TRL, check_trl_version

    assert TESTED_TRL == (">=1.16", "<1.17")
    check_trl_version()
    check_trl_version("1.16.3")


@pytest.mark.parametrize("version", ["1.17.0", "1.15.2", "2.0.0.dev0"])
def test_a_trl_outside_the_tested_range_is_refused_naming_the_range(monkeypatch, version):
    import trl

    from kgreasoner.training.trl_internals import check_trl_version

    monkeypatch.setattr(trl, "__version__", version)
    with pytest.raises(ImportError, match=rf"trl>=1\.16,<1\.17, but trl {re.escape(version)} is installed"):
        check_trl_version()


def test_pyproject_pins_trl_to_the_tested_minor_and_vllm_to_what_it_supports():
    text = (REPO / "pyproject.toml").read_text()
    assert '"trl>=1.16,<1.17"' in text
    assert '"vllm>=0.22,<=0.31.0"' in text or '"vllm>=0.22.0,<=0.31.0"' in text
    constraints = (REPO / "constraints-gpu.txt").read_text()
    assert re.search(r"^trl==1\.16\.\d+$", constraints, re.M)
    assert "-c constraints-gpu.txt" in (REPO / "README.md").read_text()


def test_no_module_but_the_door_touches_a_trl_private():
    offenders = []
    for folder in ("kgreasoner", "bench", "train", "data_gen"):
        for path in sorted((REPO / folder).rglob("*.py")):
            if path == DOOR:
                continue
            text = path.read_text(encoding="utf-8")
            for pattern in PRIVATE:
                for match in pattern.finditer(text):
                    line = text.count("\n", 0, match.start()) + 1
                    offenders.append(f"{path.relative_to(REPO)}:{line}: {match.group(0).strip()}")
    assert offenders == []


def test_the_private_pattern_catches_what_the_trainer_used_to_do():
    before = (
        "        trainer._log_metric(name, value)\n"
        '        self.trainer._metrics["train"]["time/step_s"].append(step_s)\n'
        "    import trl.trainer.utils as trl_utils\n"
        "    from trl.trainer.utils import _CHUNKED_LOGPROB_CHUNK_SIZE\n"
        "            generation = trainer.vllm_generation\n"
        "        def _compute_loss(self, model, inputs):\n"
    )
    hits = {i for i, pattern in enumerate(PRIVATE) if pattern.search(before)}
    assert hits == {1, 2, 3, 4, 5}
