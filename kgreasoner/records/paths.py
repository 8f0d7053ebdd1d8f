"""Where benchmark data lives on this machine.

Benchmarks are not committed to the project. A data folder is looked up, in order, in an
explicit path, in `$KGREASONER_DATA`, and in `../shared/data` seen from the current directory and
from the repository root (a fresh clone sits next to `shared/`, so `<clone>/../shared/data`).
"""

from __future__ import annotations

import os
from pathlib import Path

DATA_ENV = "KGREASONER_DATA"

# Where to get each data folder we know, for the error message when it is missing.
SOURCES: dict[str, str] = {
    "pathquestion": (
        "PathQuestion comes from the IRN authors' public repository https://github.com/zmtkeke/IRN "
        "(folder PathQuestion/); cite Zhou, Huang and Zhu, 'An Interpretable Reasoning Network for "
        "Multi-Relation Question Answering', COLING 2018. The repository has no license file: keep "
        "the data outside this project."
    ),
    "tog": (
        "The ToG benchmark files (cwq.json, WebQSP.json, grailqa.json, SimpleQA.json) come from the "
        "data/ folder of https://github.com/IDEA-FinAI/ToG; cite Sun et al., 'Think-on-Graph', "
        "ICLR 2024, and the original datasets."
    ),
    "webqsp-official": (
        "WebQSP (WebQSP.train.json, WebQSP.test.json) is Microsoft's release "
        "https://www.microsoft.com/en-us/download/details.aspx?id=52763 (folder data/ of the zip); "
        "cite Yih et al., ACL 2016. See docs/datasets.md."
    ),
    "cwq-official": (
        "ComplexWebQuestions (ComplexWebQuestions_train.json, _dev.json, _test.json) is released at "
        "https://allenai.org/data/complexwebquestions; cite Talmor and Berant, NAACL 2018. See docs/datasets.md."
    ),
    "rog-webqsp": (
        "RoG's WebQSP subgraphs are the Hugging Face dataset rmanluo/RoG-webqsp (its data/*.parquet files); "
        "cite Luo et al., 'Reasoning on Graphs', ICLR 2024, and WebQSP. See docs/datasets.md."
    ),
    "rog-cwq": (
        "RoG's CWQ subgraphs are the Hugging Face dataset rmanluo/RoG-cwq (its data/*.parquet files); "
        "cite Luo et al., 'Reasoning on Graphs', ICLR 2024, and CWQ. See docs/datasets.md."
    ),
}


def repo_root() -> Path:
    """The folder above the `kgreasoner` package (the clone's root when installed editable)."""
    return Path(__file__).resolve().parents[2]


def data_roots() -> list[Path]:
    """The folders that may hold data folders, in lookup order (explicit paths come first)."""
    roots: list[Path] = []
    env = os.environ.get(DATA_ENV)
    if env:
        roots.append(Path(env).expanduser())
    roots.append(Path.cwd() / ".." / "shared" / "data")
    roots.append(repo_root().parent / "shared" / "data")
    # The current directory is often the repository root: report each folder once.
    unique: dict[Path, Path] = {}
    for root in roots:
        unique.setdefault(root.resolve(), root)
    return list(unique.values())


def find_data_dir(name: str, path: str | Path | None = None) -> Path:
    """The folder holding data set `name` (e.g. `pathquestion`).

    `path`, when given, is either that folder itself or a data root containing `name/`; it is then
    the only place looked at, so an explicit path never silently falls back to other data.
    Raises FileNotFoundError listing the places tried and where to get the data.
    """
    if path is not None:
        tried = [Path(path).expanduser() / name, Path(path).expanduser()]
    else:
        tried = [root / name for root in data_roots()]
    for candidate in tried:
        if candidate.is_dir():
            return candidate.resolve()
    where = "\n  ".join(str(p) for p in tried)
    how = SOURCES.get(name, f"Put the '{name}' folder under ${DATA_ENV} or ../shared/data.")
    hint = "" if path is not None else f" Set ${DATA_ENV} to a folder containing '{name}/' or pass a path."
    raise FileNotFoundError(f"data folder '{name}' not found; looked in:\n  {where}\n{how}{hint}")
